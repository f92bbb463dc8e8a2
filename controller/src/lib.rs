//! baton-controller: the operator's side.
//!
//! Today: the commands that make the pack language usable before any device
//! is involved (`validate`, `plan`, `schema`). The agent link server, pack
//! store and agent registry come with the controller-link work and will
//! live beside these modules.

#![forbid(unsafe_code)]

pub mod cli;
pub mod ops;
pub mod server;
pub mod store;
