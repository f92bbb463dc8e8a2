//! The dashboard's accept loop: TLS (the controller's own certificate,
//! no client certificate asked: browsers log in with a token) or
//! plaintext, then HTTP/1.1 or HTTP/2 as the client speaks (ALPN over
//! TLS, the preface in plaintext). Connections are capped and a TLS
//! handshake has a deadline, so a crowd of idle sockets cannot take the
//! controller's descriptors.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

use crate::ca::CaDir;
use crate::server::tls::TlsError;

/// Most dashboard connections at once (HTTP/2 carries a browser's tabs
/// on one).
pub const MAX_CONNECTIONS: usize = 512;

/// How long a TLS handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The HTTPS configuration: the server certificate of the CA directory,
/// no client authentication, `h2` then `http/1.1`.
pub fn tls_config(dir: &CaDir) -> Result<rustls::ServerConfig, TlsError> {
    let (certs, key) = crate::server::tls::server_identity(dir)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .and_then(|b| b.with_no_client_auth().with_single_cert(certs, key))
        .map_err(|e| TlsError::Config {
            dir: dir.dir.display().to_string(),
            message: e.to_string(),
        })?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(cfg)
}

/// Serve `router` on `listener` until `stop` turns true. `keep_alive`:
/// HTTP/1.1 connections stay open for more requests (a scraper's
/// one-shot connection is closed after its answer instead).
pub async fn serve(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    router: Router,
    keep_alive: bool,
    mut stop: watch::Receiver<bool>,
) {
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
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
        let service = TowerToHyperService::new(router.clone());
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let mut builder = auto::Builder::new(TokioExecutor::new());
            builder.http1().keep_alive(keep_alive);
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
