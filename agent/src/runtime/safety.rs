//! The last resort: driving safe states when the process is about to die.
//!
//! The control loop's one exit path (`Agent::run`) drives every pack's safe
//! state through the dispatcher, whatever ended the loop. A *panic* may not
//! reach that path (release builds abort), so a panic hook drives the
//! `gpio.write` actions of every held pack's safe state directly through
//! the backend, before the process dies. The hook cannot run programs
//! (`exec`) or time pulses: it writes levels, which is what a safe state
//! should be made of. If the dispatcher thread itself panicked while
//! holding the backend, the hook cannot take it and says so.
//!
//! The way out uses the same direct writes when the dispatcher's own
//! safe-state writes did not land (it is stalled or starved), after
//! fencing it so nothing it still holds lands afterwards. A dispatcher
//! hung inside a GPIO call holds the backend: nothing can write then.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton_sched::PackKey;

use crate::dispatcher::{EmergencyGpio, Fence};
use crate::gpio::LineHandle;

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

/// How long the hook tries to take the backend before giving up.
const HOOK_WAIT: Duration = Duration::from_millis(200);

/// Drive every safe-state write now, straight through the backend, each
/// labelled `label` (the sim backend logs it as the execution id). Returns
/// how many writes succeeded and what failed.
pub fn drive_now(
    table: &Mutex<SafeTable>,
    gpio: &EmergencyGpio,
    label: &str,
) -> (usize, Vec<String>) {
    let start = Instant::now();
    let table = loop {
        match table.try_lock() {
            Ok(t) => break t,
            Err(std::sync::TryLockError::Poisoned(p)) => break p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) if start.elapsed() < HOOK_WAIT => {
                std::thread::yield_now()
            }
            Err(std::sync::TryLockError::WouldBlock) => {
                return (0, vec!["the safe-state table stayed locked".into()]);
            }
        }
    };
    let mut g = loop {
        match gpio.try_lock() {
            Ok(g) => break g,
            Err(std::sync::TryLockError::Poisoned(p)) => break p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) if start.elapsed() < HOOK_WAIT => {
                std::thread::yield_now()
            }
            Err(std::sync::TryLockError::WouldBlock) => {
                return (0, vec!["the GPIO backend stayed locked".into()]);
            }
        }
    };
    let now_ns = crate::clock::clock_ns(nix::time::ClockId::CLOCK_REALTIME);
    let mut ok = 0;
    let mut failed = Vec::new();
    for (pack, h, v) in table.writes() {
        match g.write(h, v, now_ns, label) {
            Ok(()) => ok += 1,
            Err(e) => failed.push(format!("{pack}: {e}")),
        }
    }
    (ok, failed)
}

/// Install a panic hook that fences the dispatcher (jobs armed ahead never
/// land after the safe state), drives the safe state, then reports the
/// panic as the previous hook would.
pub fn install_panic_hook(table: SharedSafeTable, gpio: EmergencyGpio, fence: Fence) {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        fence.close();
        let (ok, failed) = drive_now(&table, &gpio, "panic-safe-state");
        tracing::error!(
            writes = ok,
            failures = ?failed,
            "panic: safe state driven through the backend before exiting"
        );
        previous(info);
    }));
}
