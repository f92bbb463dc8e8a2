//! `baton-controller serve`: the gRPC adapters over the application
//! ([`baton_app`]): the Link service agents dial, the Admin service
//! operators call, gRPC health and reflection; mTLS, revocations and
//! `/metrics` around them.
//!
//! Parts, each with one job:
//! - [`session`]: one agent's stream (hello, acks, feedback, clock);
//! - [`admin`]: the operators' API, a thin mapping onto [`baton_app`];
//! - [`convert`]: wire messages to records and back, with every check;
//! - [`accept`]: one accept loop, plaintext or mTLS (failed accepts back
//!   off, connections capped with a refusal clients read, TLS handshakes
//!   budgeted per source);
//! - [`tls`]: the TLS configuration, re-read on change, and the peer's
//!   identity;
//! - [`revocations`]: revocations the controller picks up, into the audit log;
//! - [`metrics`]: binding `serve --metrics` (served by [`crate::web`]).

#![forbid(unsafe_code)]

pub mod accept;
pub mod admin;
mod config;
pub mod convert;
mod link;
pub mod metrics;
pub mod releases;
pub mod revocations;
pub mod rollouts;
mod serve;
pub mod session;
mod shared;
pub mod tls;
pub mod web;

pub use baton_app::now_ns;
pub use baton_proto::wire::MAX_MESSAGE_BYTES;
pub use config::{RETRY_AFTER_MS, ServerConfig};
pub use link::LinkService;
pub use serve::serve;
pub use shared::Shared;
