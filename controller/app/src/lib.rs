//! The controller's application: what operators and agents can make it do,
//! as domain operations with domain types and typed errors, apart from any
//! transport. gRPC (`server::admin`, `server::session`) and, later, HTTP
//! map their requests onto these and [`AppError`] onto their own errors;
//! no rule lives in a handler.
//!
//! Parts, each with one job:
//! - [`caller`]: who may see and do what (tenants, roles);
//! - [`actions`]: an operator's push, cancel and grant, audited and
//!   announced to open pages, whichever door they came through;
//! - [`packs`]: push, cancel, the packs list and deliveries;
//! - [`agents`]: the agents list, labels, grants, forget, clock history;
//! - [`feedback`]: stored feedback, paged; lateness figures;
//! - [`fleet`]: the fleet filtered and counted by the store (dashboard);
//! - [`audit`]: the audit log;
//! - [`events`]: what watchers are told, and who may see it;
//! - [`heap`]: freed memory given back after a burst;
//! - [`hub`]: the live agent streams and what the rest asks of them;
//! - [`pace`]: pacing of pushes (token bucket, sans-IO);
//! - [`metrics`]: the counters behind `/metrics`;
//! - [`retention`]: what grows is deleted when it is old enough;
//! - [`rollouts`]: the rollout driver, status and operator commands;
//! - [`rollout_view`]: a rollout's stages and members as an operator
//!   reads them (who blocks a stage, and why);
//! - [`sessions`]: dashboard sessions and log-in throttling, in the store
//!   (replicas share them).

#![forbid(unsafe_code)]

pub mod actions;
pub mod agents;
mod answers;
mod app;
pub mod audit;
pub mod caller;
pub mod events;
pub mod feedback;
pub mod fleet;
pub mod follow;
pub mod heap;
pub mod hub;
pub mod link;
pub mod login_throttle;
pub mod metrics;
pub mod pace;
pub mod packs;
pub mod retention;
pub mod revocations;
pub mod rollout_view;
pub mod rollouts;
pub mod sessions;
pub mod stream_health;
mod tally;
pub mod texts;
pub mod updates;

#[cfg(test)]
mod tests;

pub use app::{
    App, AppConfig, AppError, AppResult, INGEST_AT_ONCE, RELAY_DEPTH, Recent, now, now_ns,
};
pub use caller::Caller;
