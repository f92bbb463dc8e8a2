//! What the journal records about an execution and about a stopped pack:
//! the typed values its records carry (docs/design.md habit 14).

use std::fmt;

/// The result of one execution attempt, as the journal keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// It ran and succeeded.
    Succeeded,
    /// It ran (or was tried) and failed.
    Failed,
    /// It was started (journalled) but never touched the device (withdrawn,
    /// or too late): after a restart it may fire again.
    NotRun,
}

/// Why a stored pack version stopped for good.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StopReason {
    /// An instruction gave up (retries exhausted, or a missed one-shot).
    GiveUp,
    /// The pack was cancelled.
    Cancel,
    /// The pack's controller lease ran out (`lease` in the pack): it stays
    /// stopped across restarts until a higher version arrives, so that a
    /// reboot does not revive a pack its controller could not reach.
    LeaseLost,
    /// The clock lost sync past the agent's limit and the pack asked for
    /// its safe state then (`on_clock_loss: safe_state`); durable for the
    /// same reason as a lease loss.
    ClockLost,
}

impl StopReason {
    /// The word used in logs and feedback: `give_up`, `cancel` or
    /// `lease_lost`.
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::GiveUp => "give_up",
            StopReason::Cancel => "cancel",
            StopReason::LeaseLost => "lease_lost",
            StopReason::ClockLost => "clock_lost",
        }
    }
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
