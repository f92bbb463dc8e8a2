//! The dashboard's accept loop: TLS (the controller's own certificate,
//! no client certificate asked: browsers log in with a token) or
//! plaintext, then HTTP/1.1 or HTTP/2 as the client speaks (ALPN over
//! TLS, the preface in plaintext). Connections are capped, in all and per
//! source (an IPv4 address, an IPv6 /64), and a TLS handshake and a
//! request's headers have deadlines, so a crowd of idle sockets cannot
//! take the controller's descriptors, nor one address every slot.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::accept::limits::{HandshakeBudget, HandshakeLimits, HandshakeRefusal, Source};
use crate::tls::TlsState;

/// Most dashboard connections at once (HTTP/2 carries a browser's tabs
/// on one).
pub const MAX_CONNECTIONS: usize = 512;

/// Most dashboard connections at once from one source: a browser opens
/// one (HTTP/2) or six (HTTP/1.1) and a live page one more per stream, so
/// a few dozen operators behind one address fit, and one client holding
/// idle sockets leaves the other 448 slots to everyone else. (Operators
/// behind one reverse proxy share it: a judgement call, written down.)
pub const MAX_PER_SOURCE: usize = 64;

/// How long a TLS handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a request's headers may take (and an idle HTTP/1.1
/// connection may wait for its next request).
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Serve `router` on `listener` until `stop` turns true. `keep_alive`:
/// HTTP/1.1 connections stay open for more requests (a scraper's
/// one-shot connection is closed after its answer instead).
pub async fn serve(
    listener: TcpListener,
    tls: Option<Arc<TlsState>>,
    router: Router,
    keep_alive: bool,
    mut stop: watch::Receiver<bool>,
) {
    let slots = Arc::new(Slots(Mutex::new(HandshakeBudget::new(HandshakeLimits {
        total: MAX_CONNECTIONS,
        per_source: MAX_PER_SOURCE,
        ..HandshakeLimits::default()
    }))));
    loop {
        let (tcp, remote) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // Out of descriptors, say: do not spin on it.
                    tracing::warn!("dashboard: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        let slot = match slots.take(remote.ip()) {
            Ok(s) => s,
            Err(HandshakeRefusal::Full { total }) => {
                tracing::warn!(%remote, "dashboard: {total} connections open; closing a new one");
                continue;
            }
            Err(_) => {
                // This source's share (or, crowded, its two): at debug,
                // per connection, since the one flooding is the one who
                // would fill the log.
                tracing::debug!(%remote, "dashboard: this source holds its share of the connections; closing a new one");
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        // Each request knows its peer (failed log-ins are counted per
        // address).
        let service = TowerToHyperService::new(
            router
                .clone()
                .layer(axum::Extension(super::auth::Peer(remote))),
        );
        let acceptor = tls
            .as_ref()
            .map(|t| tokio_rustls::TlsAcceptor::from(t.current_web()));
        tokio::spawn(async move {
            let _slot = slot;
            // Without a timer hyper enforces no deadline: an idle socket
            // would hold a slot for ever. Headers must come within 10 s
            // (of the connection, and of each next request on it); an
            // HTTP/2 peer that stops answering pings is dropped.
            let mut builder = auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .keep_alive(keep_alive);
            builder
                .http2()
                .timer(TokioTimer::new())
                .keep_alive_interval(Some(Duration::from_secs(20)))
                .keep_alive_timeout(Duration::from_secs(10));
            let served = match acceptor {
                Some(a) => match tokio::time::timeout(HANDSHAKE_TIMEOUT, a.accept(tcp)).await {
                    Ok(Ok(s)) => {
                        builder
                            .serve_connection_with_upgrades(TokioIo::new(s), service)
                            .await
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(%remote, "dashboard: TLS handshake failed: {e}");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(%remote, "dashboard: TLS handshake timed out");
                        return;
                    }
                },
                None => {
                    builder
                        .serve_connection_with_upgrades(TokioIo::new(tcp), service)
                        .await
                }
            };
            if let Err(e) = served {
                tracing::debug!(%remote, "dashboard: connection ended: {e}");
            }
        });
    }
}

/// The dashboard's connection slots: in all and per source.
#[derive(Debug)]
struct Slots(Mutex<HandshakeBudget>);

/// One connection's slot; given back when dropped (however the
/// connection's task ends).
#[derive(Debug)]
struct Slot {
    slots: Arc<Slots>,
    source: Source,
}

impl Slots {
    fn take(self: &Arc<Self>, ip: std::net::IpAddr) -> Result<Slot, HandshakeRefusal> {
        let source = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .try_enter(ip)?;
        Ok(Slot {
            slots: self.clone(),
            source,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .leave(self.source);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// One GET from `from` (a loopback address of its own), its answer.
    async fn get(from: &str, to: std::net::SocketAddr) -> std::io::Result<String> {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind(format!("{from}:0").parse().expect("address"))?;
        let mut s = socket.connect(to).await?;
        s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            .await?;
        let mut out = String::new();
        s.read_to_string(&mut out).await?;
        Ok(out)
    }

    /// Issue 36's hole: 530 idle sockets from one address held the 512
    /// slots and the real requests were reset. One source holds at most
    /// its share now; another address's page loads at once, and a source
    /// gets its slots back as its connections close.
    #[tokio::test]
    async fn idle_sockets_from_one_address_leave_the_others_their_slots() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let (stop_tx, stop) = watch::channel(false);
        let router = Router::new().route("/", axum::routing::get(|| async { "ok" }));
        tokio::spawn(serve(listener, None, router, true, stop));
        let mut idle = Vec::new();
        for _ in 0..600 {
            idle.push(tokio::net::TcpStream::connect(addr).await.expect("connect"));
        }
        let page = tokio::time::timeout(Duration::from_secs(1), get("127.0.0.2", addr))
            .await
            .expect("another address's page within 1 s")
            .expect("answered");
        assert!(page.starts_with("HTTP/1.1 200"), "{page}");
        // The flooding address itself is refused meanwhile ...
        let refused = get("127.0.0.1", addr).await.unwrap_or_default();
        assert!(refused.is_empty(), "{refused}");
        // ... and served again once its sockets are gone.
        drop(idle);
        let mut served = String::new();
        for _ in 0..200 {
            served = get("127.0.0.1", addr).await.unwrap_or_default();
            if !served.is_empty() {
                break;
            }
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(served.starts_with("HTTP/1.1 200"), "{served:?}");
        let _ = stop_tx.send(true);
    }
}
