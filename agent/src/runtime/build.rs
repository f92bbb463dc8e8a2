//! The real parts of a running agent.

use std::sync::{Arc, Mutex};

use baton_journal::Journal;

use super::agent::{JOURNAL_RETENTION, keep_large_allocations_returnable, results_window};
use super::error::RuntimeError;
use super::parts::Parts;
use super::safety::{self, SafeTable, SharedSafeTable};
use crate::config::AgentConfig;
use crate::exec::ExecPool;

/// Build the real parts: journal, GPIO backend in the dispatcher thread,
/// exec pool, the system clock; and install the panic hook.
pub fn real_parts(cfg: &AgentConfig) -> Result<Parts, RuntimeError> {
    // A process-wide allocator tunable: once, for the real agent.
    keep_large_allocations_returnable();
    let clock = Arc::new(baton_clock::driver::EstimatedClock::new(&cfg.clock));
    if !cfg.clock.ntp_servers.is_empty() {
        let ntp = baton_clock::ntp::spawn(&cfg.clock.ntp_servers, clock.sender())
            .map_err(|e| RuntimeError::start("starting the NTP client", e))?;
        clock.keep_source(Box::new(ntp));
    }
    if let Some(ptp) = &cfg.clock.ptp {
        let h = baton_clock::ptp::spawn(ptp, clock.sender()).map_err(|e| {
            RuntimeError::start(format!("starting the PTP slave on {}", ptp.interface), e)
        })?;
        clock.keep_source(Box::new(h));
    }
    let mut jcfg = baton_journal::JournalConfig::new(&cfg.data_dir);
    jcfg.outbox_cap = cfg.outbox_cap;
    jcfg.reset = cfg.reset_journal;
    jcfg.retention_ns = JOURNAL_RETENTION.as_nanos() as i64;
    let (journal, recovered) = Journal::open(jcfg).map_err(|e| {
        RuntimeError::start(
            format!("opening the journal in {}", cfg.data_dir.display()),
            e,
        )
    })?;
    let gpio = baton_gpio::open_backend(&cfg.gpio, cfg.allowed_lines.clone())
        .map_err(|e| RuntimeError::start(format!("opening the GPIO backend `{}`", cfg.gpio), e))?;
    let (dispatcher, direct) =
        crate::dispatcher::Dispatcher::start(gpio, clock.shared(), cfg.rt, std::thread::current())
            .map_err(|e| RuntimeError::start("starting the dispatcher thread", e))?;
    // Under a dense load the loop's passes are a results window apart
    // (arming passes a horizon apart, see `next_pass`): successes wait for
    // them rather than waking the loop per instant.
    dispatcher.defer_results_within(results_window(cfg.arm_horizon));
    // The dispatcher's CPU is its own: move this thread (and the exec
    // workers it spawns next) elsewhere.
    if let Some(cpu) = cfg.rt.cpu
        && let Err(e) = crate::rt::avoid_cpu(cpu)
    {
        tracing::warn!("could not keep the control thread off CPU {cpu}: {e}");
    }
    if let Some(w) = dispatcher.rt_status().warning() {
        tracing::warn!("{w}");
    }
    let safe_table: SharedSafeTable = Arc::new(Mutex::new(SafeTable::default()));
    let safe_driver = Arc::new(
        safety::SafeDriver::start(safe_table.clone(), direct)
            .map_err(|e| RuntimeError::start("starting the safe-state driver thread", e))?,
    );
    safety::install_panic_hook(
        safe_driver.clone(),
        dispatcher.fence_handle(),
        cfg.data_dir.clone(),
    );
    let (tx, exec_rx) = std::sync::mpsc::channel();
    // Each result wakes the control loop at once (no polling interval).
    let control = std::thread::current();
    let notify: crate::exec::Notify = Arc::new(move || control.unpark());
    let exec = ExecPool::new(cfg.exec_workers, cfg.exec_allowlist.clone(), tx, notify);
    Ok(Parts {
        clock,
        journal,
        recovered,
        device: Box::new(dispatcher),
        exec,
        exec_rx,
        safe_table,
        safe_driver: Some(safe_driver),
        ledger: Some(cfg.ledger.clone()),
    })
}
