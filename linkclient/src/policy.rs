//! The endpoint's settings: one set of values for every client of a
//! controller.

use std::time::Duration;

use tonic::transport::Endpoint;

/// A connection attempt (TCP and the HTTP/2 handshake) gives up after this
/// long: a controller that takes longer is as good as down, and the agent
/// has other addresses to try.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// HTTP/2 keep-alive ping interval: a peer gone without a FIN (a cut cable,
/// a NAT that forgot the flow) is noticed within this plus
/// [`KEEP_ALIVE_TIMEOUT`], well before TCP's own hours.
pub const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(10);

/// How long a keep-alive ping may go unanswered before the connection is
/// dropped: as long as the interval, so a controller busy for a moment is
/// not taken for dead.
pub const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest message either end accepts, the same on both (the controller's
/// server uses it too), so neither sends what the other refuses.
pub const MAX_MESSAGE_BYTES: usize = baton_proto::wire::MAX_MESSAGE_BYTES;

/// How one kind of client tunes its endpoint. The values are the
/// constants above; what differs between the agent and the CLI is named
/// here rather than left to two copies that drift.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndpointPolicy {
    /// Keep-alive pings also while no call is open. The agent holds one
    /// long stream and must notice a dead peer even when quiet; an
    /// operator's command is short and has no idle connection to watch
    /// (and never had these pings).
    pub keep_alive_while_idle: bool,
}

impl EndpointPolicy {
    /// The agent's link: one stream kept for days.
    pub const AGENT: EndpointPolicy = EndpointPolicy {
        keep_alive_while_idle: true,
    };

    /// The operator CLI: a few calls, then exit.
    pub const OPERATOR: EndpointPolicy = EndpointPolicy {
        keep_alive_while_idle: false,
    };

    /// `endpoint` with the keep-alives and `TCP_NODELAY` (small messages
    /// go out at once). The connect timeout is separate
    /// ([`EndpointPolicy::with_connect_timeout`]): a caller with its own
    /// connector times each of its steps itself.
    pub fn tune(&self, endpoint: Endpoint) -> Endpoint {
        let e = endpoint
            .tcp_nodelay(true)
            .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
            .keep_alive_timeout(KEEP_ALIVE_TIMEOUT);
        if self.keep_alive_while_idle {
            e.keep_alive_while_idle(true)
        } else {
            e
        }
    }

    /// [`EndpointPolicy::tune`], and tonic's own connector given up after
    /// [`CONNECT_TIMEOUT`].
    pub fn with_connect_timeout(&self, endpoint: Endpoint) -> Endpoint {
        self.tune(endpoint.connect_timeout(CONNECT_TIMEOUT))
    }
}

// The agent must notice a dead controller on a quiet stream; the CLI kept
// its behaviour of no pings without a call (checked when compiling).
const _: () = assert!(EndpointPolicy::AGENT.keep_alive_while_idle);
const _: () = assert!(!EndpointPolicy::OPERATOR.keep_alive_while_idle);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_is_the_wire_cap() {
        assert_eq!(MAX_MESSAGE_BYTES, 16 << 20);
    }
}
