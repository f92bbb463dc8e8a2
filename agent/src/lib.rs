//! baton-agent
pub mod bench;
pub mod clock;
pub mod config;
pub mod dispatcher;
pub mod exec;
pub mod gpio;
pub mod journal;
pub mod link;
pub mod live;
pub mod metrics;
pub mod rt;
pub mod runtime;
pub mod simulate;
