//! Why the control loop stopped, and how it is asked to.

use std::sync::atomic::{AtomicI32, Ordering};

use super::error::RuntimeError;

/// Why the control loop stopped.
#[derive(Debug)]
pub enum StopCause {
    /// A stop was requested (the signal number, 0 if not by a signal).
    Requested(i32),
    /// `--exit-when-idle` and nothing is left to do.
    Idle,
    /// Something failed; the safe state ran on the way out.
    Fault(RuntimeError),
    /// A new agent version is installed and on trial: the way out ran at a
    /// quiet moment, and the launcher starts the new version next.
    Update(String),
}

impl StopCause {
    /// Whether the agent should exit non-zero.
    pub fn is_fault(&self) -> bool {
        matches!(self, StopCause::Fault(_))
    }
}

/// Set (by a signal thread, or a test) to ask the loop to stop; holds the
/// signal number (or −1 for a plain request).
#[derive(Debug, Default)]
pub struct StopFlag(AtomicI32);

impl StopFlag {
    /// Ask for a stop, naming the signal (0 if none).
    pub fn request(&self, signal: i32) {
        let v = if signal == 0 { -1 } else { signal };
        let _ = self
            .0
            .compare_exchange(0, v, Ordering::AcqRel, Ordering::Acquire);
    }

    /// The request, if any (the signal number, 0 if not by a signal).
    pub fn requested(&self) -> Option<i32> {
        match self.0.load(Ordering::Acquire) {
            0 => None,
            -1 => Some(0),
            s => Some(s),
        }
    }
}
