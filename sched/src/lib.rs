//! baton-sched: the scheduler core of the agent, as a pure state machine.
//!
//! It is fed `now` (reference time) and events — packs, attempt results,
//! lease loss, shutdown — and returns [`Output`]s: attempts to fire, aborts,
//! `on_failure` and safe-state actions, and feedback events. It never reads a
//! clock, sleeps, or touches a device (docs/design.md principle 1), so every rule
//! is tested on simulated time, and `baton-agent simulate` runs the very
//! same code an agent runs.
//!
//! Guarantees the runtime builds on:
//! - every attempt has a deterministic [`ExecutionId`]; an id the core was
//!   told ran before (the journal's record) or has fired in this run is
//!   never fired again;
//! - every fired occurrence ends in exactly one of ok, give-up or skip;
//! - a give-up in a pack whose instruction does not say
//!   `on_give_up: continue` is followed by the pack's safe state, and
//!   nothing more of that pack fires.

// No unsafe code in the core, its unit tests included (the counting
// allocators of the memory tests live in `tests/`, separate crates).
#![forbid(unsafe_code)]

mod catchup;
mod id;
mod once;
mod output;
mod outputs;
mod scheduler;
pub mod sim;
pub mod timing;

pub use id::{ExecutionId, PackKey};
pub use once::{OnceKey, OnceKind, Prior, PriorOutcome};
pub use output::{Event, EventKind, Firing, Output, Reason, SafeReason, Withdrawal};
pub use outputs::{Outputs, WithOutputs};
pub use scheduler::{AcceptError, Accepted, AttemptResult, Config, Scheduler};
