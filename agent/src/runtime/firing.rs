//! The firing side of the loop's state: what is armed, what was tallied,
//! the buffers reused pass after pass.

use baton_proto::RefTime;

use super::arming::Arming;
use super::buffers::{Batch, OutputBufs};
use super::feedback::Tally;

/// The loop's firing state.
#[derive(Debug)]
pub(super) struct Firing {
    /// Core outputs on their way to the device.
    pub(super) arming: Arming,
    /// Outcomes counted, lateness recorded.
    pub(super) tally: Tally,
    /// The entry a pass last ran for inside its lead (see `Agent::wait`).
    pub(super) lead_pass_for: Option<RefTime>,
    /// Output buffers, reused pass after pass.
    pub(super) bufs: OutputBufs,
    /// What a batch of outputs carries between its steps.
    pub(super) batch: Batch,
    /// No pass has run yet in this process: the first one arms, in one
    /// batch, whatever came due while the agent was down (said in the
    /// log).
    pub(super) first_pass: bool,
    /// Stop (as `--exit-when-idle` does) once this many attempts ended
    /// (ran or not): `bench-latency`'s pack runs on any clock, without
    /// `until`.
    pub(super) exit_after: Option<u64>,
}
