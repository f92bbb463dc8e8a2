//! baton-proto: what the controller and the agent must agree on.
//!
//! - [`pack`]: the pack language (YAML schema, validation, DAG, the pure
//!   occurrence maths) — both ends validate every pack with the same code.
//! - [`plan`]: the next firings of a pack, for operators.
//! - [`time`]: reference-time types and duration literals.
//! - [`yaml`]: the position-carrying YAML tree under the pack decoder.
//! - [`wire`]: the gRPC protocol between agent and controller.

pub mod pack;
pub mod plan;
pub mod time;
pub mod wire;
pub mod yaml;

pub use pack::{Pack, PackError, PackErrors, parse_pack};
pub use time::RefTime;
