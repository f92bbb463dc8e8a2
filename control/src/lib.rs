//! The agent's control plane as values, sans IO (docs: ARCHITECTURE.md
//! "Crates and layers").
//!
//! The rules of the controller session (which controller may command the
//! box, what feedback may be on the wire, when a pack's lease runs out,
//! when the clock is reported) take events, the time and the journal's
//! facts, and return commands; the agent's control thread carries them out
//! (journal, link, core) and nothing here touches a file, a socket or a
//! clock. The tests drive the rules with plain calls and property tests
//! over event orders, without an agent or a controller.
//!
//! This crate cannot import the agent, the journal or the link: Cargo
//! holds the layer.

#![forbid(unsafe_code)]

pub mod admission;
pub mod clock_watch;
pub mod held;
pub mod session;
pub mod staging;

pub use session::{Cmd, Facts, Input, Session};
