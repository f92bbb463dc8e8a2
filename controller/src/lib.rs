//! baton-controller: the fleet's side.
//!
//! - [`model`]: the records the controller keeps and speaks about;
//! - [`app`]: what operators and agents can make it do, apart from any
//!   transport;
//! - [`planner`]: which version of which pack each agent should hold (pure);
//! - [`store`]: everything durable, behind the [`store::Store`] trait
//!   (SQLite embedded by default, in memory for tests);
//! - [`server`]: the Link service agents dial, the Admin service operators
//!   call, gRPC health and reflection;
//! - [`ops`]: operator subcommands that talk to a running controller;
//! - [`cli`]: offline commands (`validate`, `plan`, `schema`);
//! - [`ca`]: the fleet's certificate authority (`ca` subcommands);
//! - [`identity`]: who a peer is (agent, operator), from its certificate;
//! - [`tokens`]: operator tokens bound to certificates (dashboard log-in);
//! - [`web`]: the web dashboard and `/metrics` over HTTP.

#![forbid(unsafe_code)]

pub mod app;
pub mod ca;
pub mod cli;
pub mod identity;
pub mod model;
pub mod ops;
pub mod planner;
pub mod rollout;
pub mod server;
pub mod store;
pub mod tokens;
pub mod web;
