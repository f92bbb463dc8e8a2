//! The agent's control thread: the thin IO shell around the scheduler core.
//!
//! Parts, each with one job:
//! - [`admission`]: whether a pack may run here, which lines it owns;
//! - [`arming`]: core outputs on their way to the device (credits,
//!   tickets, exec firings waiting for their instant, withdrawal);
//! - [`feedback`]: every result and event to the journal's outbox and to
//!   `tracing` (the live view is a tracing layer, `crate::live`);
//! - [`safety`]: the panic hook's safe state; `safe_states`: the loop's
//!   own book of it (what was driven, how the way out went);
//! - `clock_loss`: what the loop does with the clock's health (the
//!   verdicts, like the held packs' and the staged versions', are
//!   `baton_control`'s);
//! - `accept`: taking packs (files, restored, pushed); `restart`: what a
//!   start learns of the previous run (its dispatch ledger);
//! - `uplink`: the control side of the controller link (hello, pushes,
//!   cancels, feedback, clock reports, pack leases), when a controller is
//!   configured, carrying out the session's commands; the link's IO runs
//!   on its own thread (`crate::link`), its state is `link_state`;
//! - [`error`]: why the runtime failed, as a value ([`RuntimeError`]);
//! - `agent`: the control loop, a loop over events (core outputs, device
//!   results, exec results, time) with **one way out**: [`Agent::run`]
//!   always ends in `Agent::wind_down`, which drives every held pack's
//!   safe state through the device before it touches the journal,
//!   whatever ended the loop (a stop request, a journal error, a full
//!   disk). `Agent` holds its state grouped by job (`ports`, `firing`,
//!   `plane`, `upkeep`); the other files are its methods by subject, each
//!   importing from the files below it, none from the one above;
//! - this module only declares them.
//!
//! Firings are *armed* a short horizon ahead: their start records are made
//! durable in one batch, then they go to the dispatcher, which fires each
//! at its exact instant. So the start record is always on disk before the
//! device is touched (docs/design.md principle 4).
//!
//! Clock, journal, device and exec pool are handed in ([`Parts`]), so tests
//! drive the whole loop on a [`ports::ManualClock`] and an in-memory device.

mod accept;
mod admit;
mod agent;
pub mod arming;
pub mod breakdown;
mod buffers;
mod build;
pub mod cancel;
pub mod check;
mod clock_loss;
pub mod error;
mod exit;
pub mod feedback;
mod firing;
mod heap_trim;
mod link_state;
mod metrics;
mod outputs;
mod parts;
mod plane;
pub mod ports;
pub mod record;
mod restart;
mod results;
mod safe_states;
pub mod safety;
mod stop;
mod systemd;
mod trust;
pub use trust::newest_list;
mod update;
mod upkeep;
mod uplink;

pub use agent::Agent;
#[cfg(feature = "fault-injection")]
pub use agent::inject_panic_after;
/// Admission's rules are the control plane's (`baton_control`).
pub use baton_control::admission;
pub use build::real_parts;
pub use error::{AcceptError, RuntimeError};
pub use parts::Parts;
pub use stop::{StopCause, StopFlag};
