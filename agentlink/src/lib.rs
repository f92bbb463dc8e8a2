//! baton-agent-link: the agent's side of the controller link, below its
//! control loop.
//!
//! - [`link`]: the thread that holds the stream (its own small tokio
//!   runtime), the session protocol on the wire, reconnects with backoff
//!   and failover, the dead-peer watchdog, outbox pages into
//!   `wire::Feedback`;
//! - [`outbox`]: the bytes of one feedback record in the journal's outbox
//!   (binary, and the JSON of agents before it).
//!
//! A crate of its own so that Cargo holds the layer: the link talks to the
//! control thread through channels only and cannot import it (docs:
//! ARCHITECTURE, "Crates").

#![forbid(unsafe_code)]

pub mod link;
pub mod outbox;
