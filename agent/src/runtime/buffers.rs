//! Output buffers reused pass after pass: a pass's outputs (an instant's
//! firings and their events, a few hundred bytes each) no longer grow a
//! new vector a handful of reallocations at a time; and what one batch of
//! outputs carries between its steps.

use std::collections::VecDeque;

use baton_sched::{ExecutionId, OnceKey, Output, Reason};

use crate::ledger::Slot;

/// Outputs a reused buffer may hold room for; a burst's larger buffer is
/// freed instead of kept.
const KEEP_OUTPUTS: usize = 128;
/// Buffers kept: a pass nests at most a few (its outputs, what their
/// results lead to, what those lead to).
const SPARE_OUTPUTS: usize = 4;

/// The emptied buffers kept for the next pass.
#[derive(Debug, Default)]
pub(super) struct OutputBufs {
    spare: Vec<Vec<Output>>,
}

impl OutputBufs {
    /// An empty output buffer, from those kept.
    pub(super) fn take(&mut self) -> Vec<Output> {
        self.spare.pop().unwrap_or_default()
    }

    /// Keep an emptied buffer for later, unless a burst made it large.
    pub(super) fn give_back(&mut self, mut buf: Vec<Output>) {
        buf.clear();
        if buf.capacity() <= KEEP_OUTPUTS && self.spare.len() < SPARE_OUTPUTS {
            self.spare.push(buf);
        }
    }
}

/// What one batch of outputs carries between its steps; only performing
/// outputs touches it.
#[derive(Debug, Default)]
pub(super) struct Batch {
    /// Ledger slots armed for a batch's firings before their start record,
    /// taken in order as the firings are performed; kept only for its
    /// capacity between batches (see `process_in`).
    pub(super) slots: VecDeque<Slot>,
    /// Attempts the core asked back in the batch being performed.
    pub(super) asked_back: Vec<(ExecutionId, Reason)>,
    /// Once keys of the batch's reports, journalled after all of them (see
    /// `Agent::events`).
    pub(super) keys: Vec<OnceKey>,
}
