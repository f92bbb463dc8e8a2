//! baton-model: the controller's pure layer — its records ([`records`],
//! re-exported here), the planner that decides which version of which pack
//! each agent should hold ([`planner`]), the rollout machine ([`rollout`]),
//! identities as values ([`identity`]) and the words operators read
//! ([`display`]). No tokio, no IO: every rule in it is a function the tests
//! call with values, and every layer above (store, application, adapters)
//! speaks in its types.

#![forbid(unsafe_code)]

pub mod display;
mod gate;
pub mod identity;
pub mod planner;
mod queries;
pub mod records;
mod releases;
pub mod rollout;
mod rollout_rows;
pub mod time;

pub use gate::{Gate, GateRow};
pub use queries::*;
pub use records::*;
pub use releases::*;
pub use rollout_rows::*;
pub use time::{RefTime, SignedDuration, SpanNanos};
