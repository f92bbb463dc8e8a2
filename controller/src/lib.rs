//! baton-controller: the fleet's side.
//!
//! - [`server`]: the Link service agents dial, the Admin service operators
//!   call, gRPC health and reflection;
//! - [`store`]: everything durable, behind the [`store::Store`] trait
//!   (SQLite embedded by default);
//! - [`ops`]: operator subcommands that talk to a running controller;
//! - [`cli`]: offline commands (`validate`, `plan`, `schema`);
//! - [`ca`]: the fleet's certificate authority (`ca` subcommands);
//! - [`identity`]: who a peer is (agent, operator), from its certificate.

#![forbid(unsafe_code)]

pub mod ca;
pub mod cli;
pub mod identity;
pub mod ops;
pub mod server;
pub mod store;
