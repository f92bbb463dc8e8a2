//! The dashboard's accept loop: TLS (the controller's own certificate,
//! no client certificate asked: browsers log in with a token) or
//! plaintext, then HTTP/1.1 or HTTP/2 as the client speaks (ALPN over
//! TLS, the preface in plaintext). Connections are capped and a TLS
//! handshake has a deadline, so a crowd of idle sockets cannot take the
//! controller's descriptors.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

use crate::tls::TlsState;

/// Most dashboard connections at once (HTTP/2 carries a browser's tabs
/// on one).
pub const MAX_CONNECTIONS: usize = 512;

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
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
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
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::warn!(%remote, "dashboard: {MAX_CONNECTIONS} connections open; closing a new one");
            continue;
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
