//! baton-controller: the binary's library (the operator CLI's commands
//! and the offline ones), over the controller's crates, which Cargo holds
//! to their layers (each may import only those below it):
//!
//! - `baton-model`: records, the planner, the rollout machine (pure);
//! - `baton-store`: the storage interface, the memory store and the
//!   contract suite every backend runs;
//! - `baton-sql`: SQLite and PostgreSQL behind that interface;
//! - `baton-app`: every rule (tenants, targeting, gaps, retries, pacing,
//!   rollouts, the link session);
//! - `baton-pki`: the CA, identities from certificates, operator tokens;
//! - `baton-server`: the gRPC and HTTP adapters, calling the application
//!   only (it does not depend on the store);
//! - this crate: `serve` (wires them), [`ops`] (operator subcommands that
//!   talk to a running controller) and [`cli`] (`validate`, `plan`,
//!   `schema`).

#![forbid(unsafe_code)]

pub mod cli;
pub mod ops;
