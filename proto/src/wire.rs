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

/// The encoded `FileDescriptorSet` of the protocol: what gRPC server
/// reflection serves, so `grpcurl` and other tools need no `.proto` file.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/baton_descriptor.bin"));
