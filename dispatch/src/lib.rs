//! baton-dispatch: the agent's firing path, below its control loop.
//!
//! - [`dispatcher`]: the thread that owns the device, sleeps to each
//!   firing's deadline and performs it, never waiting on the control
//!   thread;
//! - [`rt`]: its real-time set-up (SCHED_FIFO, affinity, memory lock, the
//!   CPU idle-latency request) and the futex it sleeps on;
//! - [`ledger`]: the shared-memory record of every armed firing's fate,
//!   which lets a restart after `kill -9` know what each became.
//!
//! A crate of its own so that Cargo holds the layer: nothing here can
//! reach the control plane, the journal or the link (docs: ARCHITECTURE,
//! "Layers").

#![forbid(unsafe_code)]

pub mod dispatcher;
pub mod ledger;
pub mod rt;
