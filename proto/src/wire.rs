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

/// Largest message either end accepts, the same on both so neither sends
/// what the other refuses: a pack is at most 1 MiB of YAML, a feedback
/// batch a few hundred records.
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;

/// `e: cause: cause`, for transport errors whose top line says little (a
/// TLS refusal, say, is only in the causes); a cause the text already
/// shows is not repeated.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let text = c.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        cur = c.source();
    }
    s
}

/// Whether `host` (from a URL: a name, an IPv4 address, or an IPv6 address
/// in brackets) is this machine's loopback. Plaintext is refused toward
/// anything else unless the operator says `--insecure-any`: a name that is
/// not `localhost` may resolve anywhere.
pub fn is_loopback_host(host: &str) -> bool {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    h.eq_ignore_ascii_case("localhost")
        || h.parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::is_loopback_host;

    #[test]
    fn loopback_hosts() {
        for h in [
            "localhost",
            "127.0.0.1",
            "127.1.2.3",
            "[::1]",
            "::1",
            "LOCALHOST",
        ] {
            assert!(is_loopback_host(h), "{h}");
        }
        for h in [
            "10.0.0.5",
            "ctl.example",
            "0.0.0.0",
            "[2001:db8::1]",
            "localhost.evil",
        ] {
            assert!(!is_loopback_host(h), "{h}");
        }
    }
}
