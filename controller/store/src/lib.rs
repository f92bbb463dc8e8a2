//! baton-store: the controller's durable state behind one interface.
//!
//! Everything the controller must not forget lives in a store: agents
//! (labels, tenants, last seen, clock), packs and all their versions, the
//! desired state per (agent, pack) and how far it got, rollouts, feedback,
//! clock history, events between replicas and the audit log. A pushed
//! pack is stored before the operator gets an answer, and feedback is
//! stored before it is acknowledged to the agent.
//!
//! - [`Store`]: what a backend implements — reads, one query each, and
//!   transactions of [`Tx`] primitives (rows by key, the planner's
//!   candidate queries, conditional writes, appends);
//! - [`decide`]: every decision, once for every backend: which (agent,
//!   pack) pairs a change can affect, planned by
//!   [`baton_model::planner`]; what a new version does to a rollout;
//!   fencing of streams that lost their agent;
//! - [`StoreOps`]: the operations the application calls, each one
//!   transaction;
//! - [`memory::MemoryStore`]: the reference backend, written to be
//!   obviously right, and the store of the layers' unit tests;
//! - `contract` (feature `contract`): the conformance suite every
//!   backend runs, with its random-equivalence oracle
//!   ([`contract_suite!`]), as object_store's backends run its
//!   integration suite. baton-sql runs it against SQLite and PostgreSQL.

#![forbid(unsafe_code)]

#[cfg(any(test, feature = "contract"))]
pub mod contract;
pub mod decide;
mod error;
pub mod memory;
mod ops;
mod store;
mod tx;

pub use baton_model::*;
pub use error::{StoreError, StoreResult, fits};
pub use ops::StoreOps;
pub use store::{
    Store, TxJob, append_in_transaction, clock_in_transaction, seen_in_transaction, transact,
    transact_background,
};
pub use tx::{Grows, PackHead, Tx};
