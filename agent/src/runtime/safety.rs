//! The last resort: the safe state without the dispatcher.
//!
//! The control loop's one exit path (`Agent::run`) drives every pack's safe
//! state through the dispatcher, whatever ended the loop. When that cannot
//! work — the dispatcher thread is stuck (inside a GPIO call that never
//! returns, starved of CPU) or the process is panicking — the safe state's
//! `gpio.write` levels are written another way, by a thread of their own
//! ([`SafeDriver`], `baton-safe`):
//!
//! - without the dispatcher thread and without the backend object it owns:
//!   each output line's [`baton_gpio::DirectLine`] is its own handle on the
//!   kernel's line (cdev: the line request's descriptor; sysfs: the value
//!   file; sim: the log), so a lock a stuck call holds is never in the way;
//! - after the dispatcher is fenced ([`Fence`]): none of its jobs touches a
//!   line from then on, and a device call of it still in progress is waited
//!   for (bounded) — the kernel orders a direct write on a line after a
//!   call on that line still inside the driver;
//! - with a bounded wait ([`SafeDriver::drive`]): the caller never hangs.
//!   Writes that do not complete in time mean the chip itself is hung: the
//!   agent says so, leaves a marker ([`OWED_MARKER`]) in its data directory,
//!   and exits with [`EXIT_GPIO_HUNG`] so that systemd restarts it; the next
//!   start drives every journalled pack's safe state first thing, before
//!   arming anything.
//!
//! The driver writes levels only (it cannot run programs or time pulses):
//! what a safe state should be made of.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton_sched::PackKey;

use crate::dispatcher::Fence;
use baton_gpio::{DirectLines, LineHandle};

/// Exit status when the GPIO chip is hung (the safe state's direct writes
/// did not complete): systemd restarts the agent, which drives the safe
/// states first thing (see the module docs). EX_TEMPFAIL.
pub const EXIT_GPIO_HUNG: u8 = 75;

/// The marker a hung chip leaves in the data directory: the next start
/// owes every journalled pack's safe state before anything else.
pub const OWED_MARKER: &str = "safe-state-owed";

/// The GPIO chip did not take the safe-state writes (see the module docs):
/// exit with [`EXIT_GPIO_HUNG`].
#[derive(Debug, thiserror::Error)]
#[error(
    "the GPIO chip is hung: its safe-state writes did not complete; restart (exit {EXIT_GPIO_HUNG}): the next start drives every journalled pack's safe state before arming anything"
)]
pub struct GpioHung;

/// How long the way out and the panic hook wait for a device call of the
/// fenced dispatcher to return before writing directly anyway.
pub const QUIET_WAIT: Duration = Duration::from_millis(100);

/// How long the direct writes may take before the chip counts as hung.
pub const DIRECT_WAIT: Duration = Duration::from_millis(500);

/// Per held pack: the levels its safe state writes, in order.
#[derive(Debug, Default)]
pub struct SafeTable {
    packs: BTreeMap<PackKey, Vec<(LineHandle, u8)>>,
}

/// Shared between the control thread and the panic hook.
pub type SharedSafeTable = Arc<Mutex<SafeTable>>;

impl SafeTable {
    /// The safe-state writes of a (new version of a) pack.
    pub fn set(&mut self, pack: PackKey, writes: Vec<(LineHandle, u8)>) {
        self.packs.insert(pack, writes);
    }

    /// A pack is gone.
    pub fn remove(&mut self, pack: &PackKey) {
        self.packs.remove(pack);
    }

    /// Every write, pack by pack.
    pub fn writes(&self) -> impl Iterator<Item = (&PackKey, LineHandle, u8)> {
        self.packs
            .iter()
            .flat_map(|(k, w)| w.iter().map(move |(h, v)| (k, *h, *v)))
    }
}

/// How long the driver tries to take the safe-state table.
const TABLE_WAIT: Duration = Duration::from_millis(200);

/// Drive every safe-state write now through the lines' direct writers,
/// each labelled `label` (the sim backend logs it as the execution id).
/// Returns how many writes succeeded and what failed.
pub fn drive_now(
    table: &Mutex<SafeTable>,
    lines: &DirectLines,
    label: &str,
) -> (usize, Vec<String>) {
    let start = Instant::now();
    let table = loop {
        match table.try_lock() {
            Ok(t) => break t,
            Err(std::sync::TryLockError::Poisoned(p)) => break p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) if start.elapsed() < TABLE_WAIT => {
                std::thread::yield_now()
            }
            Err(std::sync::TryLockError::WouldBlock) => {
                return (0, vec!["the safe-state table stayed locked".into()]);
            }
        }
    };
    let writes: Vec<(String, LineHandle, u8)> = table
        .writes()
        .map(|(k, h, v)| (k.to_string(), h, v))
        .collect();
    drop(table);
    let now_ns = baton_clock::clock_ns(nix::time::ClockId::CLOCK_REALTIME);
    let mut ok = 0;
    let mut failed = Vec::new();
    for (pack, h, v) in writes {
        let Some(line) = lines.get(h) else {
            failed.push(format!("{pack}: line handle {} has no direct writer", h.0));
            continue;
        };
        match line.write(v, now_ns, label) {
            Ok(()) => ok += 1,
            Err(e) => failed.push(format!("{pack}: {e}")),
        }
    }
    (ok, failed)
}

/// What [`SafeDriver::drive`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Driven {
    /// Every write returned: this many landed, these failed.
    Done {
        /// Writes that succeeded.
        ok: usize,
        /// What failed, in words.
        failed: Vec<String>,
    },
    /// The writes did not all return within the wait: the chip is hung.
    Hung,
}

type Request = (String, SyncSender<(usize, Vec<String>)>);

/// A thread of its own that writes the safe-state levels directly, so the
/// caller's wait is bounded (see the module docs).
#[derive(Debug)]
pub struct SafeDriver {
    tx: SyncSender<Request>,
}

impl SafeDriver {
    /// Start the thread (`baton-safe`), idle until asked.
    pub fn start(table: SharedSafeTable, lines: Arc<DirectLines>) -> std::io::Result<SafeDriver> {
        let (tx, rx): (SyncSender<Request>, Receiver<Request>) = sync_channel(1);
        std::thread::Builder::new()
            .name("baton-safe".into())
            .stack_size(128 * 1024)
            .spawn(move || {
                while let Ok((label, done)) = rx.recv() {
                    let r = drive_now(&table, &lines, &label);
                    let _ = done.try_send(r);
                }
            })?;
        Ok(SafeDriver { tx })
    }

    /// Write every held pack's safe-state levels directly, waiting at most
    /// `timeout`. Never hangs: a driver stuck in an earlier call (a hung
    /// chip) answers [`Driven::Hung`].
    pub fn drive(&self, label: &str, timeout: Duration) -> Driven {
        let end = Instant::now() + timeout;
        let (done_tx, done_rx) = sync_channel(1);
        let mut req = (label.to_string(), done_tx);
        loop {
            match self.tx.try_send(req) {
                Ok(()) => break,
                Err(TrySendError::Full(r)) if Instant::now() < end => {
                    req = r;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(_) => return Driven::Hung,
            }
        }
        match done_rx.recv_timeout(end.saturating_duration_since(Instant::now())) {
            Ok((ok, failed)) => Driven::Done { ok, failed },
            Err(_) => Driven::Hung,
        }
    }
}

/// The dispatcher is fenced and whatever it was doing is over (or stuck):
/// write the safe state directly. Leaves the marker when the chip is hung.
pub fn last_resort(fence_quiet: bool, driver: &SafeDriver, label: &str, data_dir: &Path) -> Driven {
    if !fence_quiet {
        tracing::error!(
            "the dispatcher thread is inside a GPIO call that has not returned: writing the safe state directly (the kernel orders it after that call)"
        );
    }
    let r = driver.drive(label, DIRECT_WAIT);
    if r == Driven::Hung {
        leave_marker(data_dir);
    }
    r
}

/// The chip is hung: the next start owes the safe states (best effort;
/// fsynced so a power cycle keeps it).
pub fn leave_marker(data_dir: &Path) {
    let path = marker(data_dir);
    let text = "the GPIO chip did not take the safe-state writes: the next start drives every journalled pack's safe state before arming anything\n";
    let written = std::fs::File::create(&path).and_then(|mut f| {
        std::io::Write::write_all(&mut f, text.as_bytes())?;
        f.sync_all()
    });
    if let Err(e) = written {
        tracing::error!("could not leave {}: {e}", path.display());
    }
}

/// The marker's path in `data_dir`.
pub fn marker(data_dir: &Path) -> PathBuf {
    data_dir.join(OWED_MARKER)
}

/// Install a panic hook that fences the dispatcher (jobs armed ahead never
/// land after the safe state), waits (bounded) for a device call in
/// progress, drives the safe state directly (bounded), then reports the
/// panic as the previous hook would.
pub fn install_panic_hook(driver: Arc<SafeDriver>, fence: Fence, data_dir: PathBuf) {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        fence.close();
        let quiet = fence.quiet_within(QUIET_WAIT);
        match last_resort(quiet, &driver, "panic-safe-state", &data_dir) {
            Driven::Done { ok, failed } => tracing::error!(
                writes = ok,
                failures = ?failed,
                "panic: safe state driven directly before exiting"
            ),
            Driven::Hung => tracing::error!(
                "panic: the GPIO chip did not take the safe-state writes within {DIRECT_WAIT:?} (hung); the next start drives them first"
            ),
        }
        previous(info);
    }));
}
