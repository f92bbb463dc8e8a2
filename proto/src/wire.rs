//! The gRPC protocol between agent and controller, generated from
//! `proto/baton/v1/link.proto` at build time.

#[allow(
    missing_docs,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic
)]
mod generated {
    tonic::include_proto!("baton.v1");
}

pub use generated::*;
