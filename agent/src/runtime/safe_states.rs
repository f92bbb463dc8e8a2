//! What the control loop owes and did about safe states: the table the
//! panic hook reads, the last-resort driver, which packs' safe state was
//! driven in this run, and how the way out went (a degraded exit, a hung
//! chip). One owner, so whether a pack is still owed its safe state is
//! asked here, not read from a set any file may change.

use std::collections::HashSet;
use std::sync::Arc;

use baton_gpio::LineHandle;
use baton_sched::PackKey;

use super::error::RuntimeError;
use super::safety::{SafeDriver, SharedSafeTable};
use super::stop::StopCause;

/// The control loop's safe-state book.
pub(super) struct SafeStates {
    /// The levels each held pack's safe state writes (the panic hook's).
    table: SharedSafeTable,
    /// Writes the safe state without the dispatcher (the last resort);
    /// `None` where the device has no thread to be stuck.
    driver: Option<Arc<SafeDriver>>,
    /// Packs whose safe state was driven in this run.
    done: HashSet<PackKey>,
    /// Set when the way out had to bypass a stuck dispatcher: the stop is
    /// then a fault whatever asked for it.
    degraded: Option<String>,
    /// The direct writes did not land either: the chip is hung.
    hung: bool,
}

impl SafeStates {
    /// Nothing driven yet.
    pub(super) fn new(table: SharedSafeTable, driver: Option<Arc<SafeDriver>>) -> Self {
        SafeStates {
            table,
            driver,
            done: HashSet::new(),
            degraded: None,
            hung: false,
        }
    }

    /// A pack is held: the panic hook writes `writes` for it.
    pub(super) fn hold(&self, key: PackKey, writes: Vec<(LineHandle, u8)>) {
        self.table
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .set(key, writes);
    }

    /// A pack is no longer held: the panic hook leaves its lines alone.
    pub(super) fn forget(&self, key: &PackKey) {
        self.table
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }

    /// The pack's safe state was driven in this run.
    pub(super) fn driven(&mut self, key: &PackKey) {
        self.done.insert(key.clone());
    }

    /// Whether the pack's safe state was driven in this run.
    pub(super) fn is_driven(&self, key: &PackKey) -> bool {
        self.done.contains(key)
    }

    /// A new version runs: its safe state is owed again.
    pub(super) fn owed_again(&mut self, key: &PackKey) {
        self.done.remove(key);
    }

    /// The last-resort driver, if the device has one.
    pub(super) fn driver(&self) -> Option<Arc<SafeDriver>> {
        self.driver.clone()
    }

    /// The way out bypassed the dispatcher (`why`: how it went).
    pub(super) fn degraded(&mut self, why: String) {
        self.degraded = Some(why);
    }

    /// Neither the dispatcher's nor the direct writes completed.
    pub(super) fn hung(&mut self, why: String) {
        self.hung = true;
        self.degraded = Some(why);
    }

    /// Why the loop stopped, once the way out is done: a hung chip or a
    /// degraded exit makes any stop a fault.
    pub(super) fn exit_cause(&mut self, cause: StopCause) -> StopCause {
        if self.hung {
            let why = self.degraded.take().unwrap_or_default();
            return StopCause::Fault(RuntimeError::gpio_hung(why));
        }
        match (self.degraded.take(), cause) {
            (Some(why), StopCause::Requested(_) | StopCause::Idle | StopCause::Update(_)) => {
                StopCause::Fault(RuntimeError::Degraded { why, cause: None })
            }
            (Some(why), StopCause::Fault(e)) => StopCause::Fault(RuntimeError::Degraded {
                why,
                cause: Some(Box::new(e)),
            }),
            (None, cause) => cause,
        }
    }
}
