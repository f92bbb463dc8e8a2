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

use crate::ca::CaDir;
use crate::server::tls::{Stamp, TlsError, stamp};

/// Most dashboard connections at once (HTTP/2 carries a browser's tabs
/// on one).
pub const MAX_CONNECTIONS: usize = 512;

/// How long a TLS handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a request's headers may take (and an idle HTTP/1.1
/// connection may wait for its next request).
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

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

/// The HTTPS configuration in force, re-read when the certificate or its
/// key changes on disk (looked at no more than once a second, at a new
/// connection); a change that does not load keeps the previous one, as
/// the gRPC side does.
#[derive(Debug)]
pub struct WebTls {
    dir: CaDir,
    check_every: Duration,
    state: std::sync::Mutex<(std::time::Instant, Stamp, Arc<rustls::ServerConfig>)>,
}

impl WebTls {
    /// Read once; errors name the file.
    pub fn load(dir: CaDir) -> Result<WebTls, TlsError> {
        let stamp = stamp(&[dir.server_cert(), dir.server_key()]);
        let cfg = Arc::new(tls_config(&dir)?);
        Ok(WebTls {
            dir,
            check_every: Duration::from_secs(1),
            state: std::sync::Mutex::new((std::time::Instant::now(), stamp, cfg)),
        })
    }

    /// The configuration for the next handshake.
    pub fn current(&self) -> Arc<rustls::ServerConfig> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.0.elapsed() >= self.check_every {
            s.0 = std::time::Instant::now();
            let now = stamp(&[self.dir.server_cert(), self.dir.server_key()]);
            if now != s.1 {
                s.1 = now;
                match tls_config(&self.dir) {
                    Ok(c) => {
                        tracing::info!("dashboard: server certificate re-read");
                        s.2 = Arc::new(c);
                    }
                    Err(e) => tracing::warn!("dashboard: certificate change not taken: {e}"),
                }
            }
        }
        s.2.clone()
    }
}

/// Serve `router` on `listener` until `stop` turns true. `keep_alive`:
/// HTTP/1.1 connections stay open for more requests (a scraper's
/// one-shot connection is closed after its answer instead).
pub async fn serve(
    listener: TcpListener,
    tls: Option<Arc<WebTls>>,
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
        let service = TowerToHyperService::new(router.clone());
        let acceptor = tls
            .as_ref()
            .map(|t| tokio_rustls::TlsAcceptor::from(t.current()));
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // a failed unwrap is a failed test
    use super::*;

    #[test]
    fn a_new_certificate_is_taken_and_a_broken_one_is_not() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let now = time::OffsetDateTime::now_utc();
        let (ca_a, ca_b) = (CaDir::new(a.path()), CaDir::new(b.path()));
        crate::ca::init(&ca_a, &[], now).unwrap();
        crate::ca::init(&ca_b, &["other.example".into()], now).unwrap();
        let mut tls = WebTls::load(ca_a.clone()).unwrap();
        tls.check_every = Duration::ZERO;
        let first = tls.current();
        assert!(
            Arc::ptr_eq(&first, &tls.current()),
            "unchanged files: the same"
        );
        std::fs::copy(ca_b.server_cert(), ca_a.server_cert()).unwrap();
        std::fs::copy(ca_b.server_key(), ca_a.server_key()).unwrap();
        let second = tls.current();
        assert!(
            !Arc::ptr_eq(&first, &second),
            "the new certificate is taken"
        );
        std::fs::write(
            ca_a.server_key(),
            "not a key, and longer than the one before it",
        )
        .unwrap();
        assert!(
            Arc::ptr_eq(&second, &tls.current()),
            "a broken change keeps the last good one"
        );
    }
}
