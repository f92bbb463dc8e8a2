//! mTLS for the listener: the server configuration read from a CA
//! directory (made by `baton-controller ca`), re-read when its files change,
//! and our own accept loop, so that
//!
//! - a handshake that does not finish within a timeout is dropped (a
//!   half-open handshake cannot hold a slot), and at most
//!   [`MAX_HANDSHAKES`] run at once, [`MAX_HANDSHAKES_PER_SOURCE`] of them
//!   from one IP address (one noisy or hostile host cannot take every
//!   slot from the rest of the fleet);
//! - every connection carries its peer's [`Peer`] (identity and serial,
//!   read once from the verified client certificate) into each request's
//!   extensions, through tonic's [`Connected`];
//! - a failed handshake (another CA, expired, no client certificate,
//!   plaintext or garbage) is logged with the peer's address and never
//!   reaches tonic.
//!
//! Client certificates are required and verified against `DIR/ca.pem`
//! (rustls/webpki: chain, validity period, `clientAuth` usage).
//! Revocation (`DIR/revoked.txt`) is checked per request by the services,
//! and on live link streams whenever the list changes.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::Connected;

use crate::ca::{self, CaDir};
use crate::identity::{self, PeerCert};

/// Handshakes in progress at once; more connections are dropped (agents
/// reconnect with backoff).
pub const MAX_HANDSHAKES: usize = 256;
/// Handshakes in progress at once from one IP address.
pub const MAX_HANDSHAKES_PER_SOURCE: usize = 64;

/// Handshakes in progress per source address, bounded (sans IO: no
/// sockets, no clock).
#[derive(Debug)]
pub struct PerSource {
    limit: usize,
    counts: Mutex<HashMap<IpAddr, usize>>,
}

/// One handshake's place in [`PerSource`]; given back when dropped.
#[derive(Debug)]
pub struct SourceSlot {
    owner: Arc<PerSource>,
    ip: IpAddr,
}

impl PerSource {
    /// At most `limit` at once per address.
    pub fn new(limit: usize) -> Arc<PerSource> {
        Arc::new(PerSource {
            limit,
            counts: Mutex::new(HashMap::new()),
        })
    }

    /// A slot for a handshake from `ip`, unless it has `limit` already.
    pub fn try_enter(self: &Arc<Self>, ip: IpAddr) -> Option<SourceSlot> {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let n = c.entry(ip).or_insert(0);
        if *n >= self.limit {
            return None;
        }
        *n += 1;
        Some(SourceSlot {
            owner: self.clone(),
            ip,
        })
    }

    /// Handshakes in progress from `ip`.
    pub fn in_progress(&self, ip: IpAddr) -> usize {
        let c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        c.get(&ip).copied().unwrap_or(0)
    }
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        let mut c = self.owner.counts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = c.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.remove(&self.ip);
            }
        }
    }
}

/// How the listener does TLS.
#[derive(Clone, Debug)]
pub struct TlsOptions {
    /// The CA directory (`server.pem`, `server-key.pem`, `ca.pem`,
    /// `revoked.txt`).
    pub dir: std::path::PathBuf,
    /// A handshake not done by then is dropped.
    pub handshake_timeout: Duration,
    /// How often the files are looked at for changes.
    pub reload_every: Duration,
}

impl TlsOptions {
    /// Defaults: 10 s handshake timeout, files looked at every second.
    pub fn new(dir: impl Into<std::path::PathBuf>) -> TlsOptions {
        TlsOptions {
            dir: dir.into(),
            handshake_timeout: Duration::from_secs(10),
            reload_every: Duration::from_secs(1),
        }
    }
}

/// The TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file is missing or unreadable.
    #[error("{path}: {message}")]
    File {
        /// The file.
        path: String,
        /// Why.
        message: String,
    },
    /// The files do not make a configuration.
    #[error("TLS configuration from {dir}: {message}")]
    Config {
        /// The CA directory.
        dir: String,
        /// Why.
        message: String,
    },
}

/// The peer of one TLS connection, in every request's extensions.
#[derive(Clone, Debug)]
pub struct Peer {
    /// Its address.
    pub remote: SocketAddr,
    /// Who its (verified) certificate says it is, or why that cannot be
    /// read.
    pub cert: Result<PeerCert, String>,
}

/// Build the server configuration from the CA directory.
pub fn load_config(dir: &CaDir) -> Result<rustls::ServerConfig, TlsError> {
    let file = |p: &std::path::Path, e: &dyn std::fmt::Display| TlsError::File {
        path: p.display().to_string(),
        message: e.to_string(),
    };
    let config = |e: &dyn std::fmt::Display| TlsError::Config {
        dir: dir.dir.display().to_string(),
        message: e.to_string(),
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let ca_path = dir.ca_cert();
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(&ca_path).map_err(|e| file(&ca_path, &e))? {
        let c = c.map_err(|e| file(&ca_path, &e))?;
        roots.add(c).map_err(|e| file(&ca_path, &e))?;
    }
    if roots.is_empty() {
        return Err(file(&ca_path, &"no certificate in it"));
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| file(&ca_path, &e))?;
    let cert_path = dir.server_cert();
    let certs = CertificateDer::pem_file_iter(&cert_path)
        .map_err(|e| file(&cert_path, &e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file(&cert_path, &e))?;
    let key_path = dir.server_key();
    let key = PrivateKeyDer::from_pem_file(&key_path).map_err(|e| file(&key_path, &e))?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| config(&e))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .map_err(|e| config(&e))?;
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(cfg)
}

/// Size and modification time of each watched file (`None`: absent).
type Stamp = Vec<Option<(u64, SystemTime)>>;

fn stamp(paths: &[std::path::PathBuf]) -> Stamp {
    paths
        .iter()
        .map(|p| {
            std::fs::metadata(p)
                .ok()
                .and_then(|m| Some((m.len(), m.modified().ok()?)))
        })
        .collect()
}

/// The live TLS state: the configuration new handshakes use, and the
/// revoked serials.
#[derive(Debug)]
pub struct TlsState {
    dir: CaDir,
    config: RwLock<Arc<rustls::ServerConfig>>,
    revoked: watch::Sender<Arc<HashSet<String>>>,
    stamps: Mutex<(Stamp, Stamp)>,
}

impl TlsState {
    /// Read everything once; errors name the file.
    pub fn load(
        dir: CaDir,
        revoked: watch::Sender<Arc<HashSet<String>>>,
    ) -> Result<TlsState, TlsError> {
        let cert_files = [dir.server_cert(), dir.server_key(), dir.ca_cert()];
        let cert_stamp = stamp(&cert_files);
        let revoked_stamp = stamp(&[dir.revoked()]);
        let config = load_config(&dir)?;
        let list = ca::read_revoked(&dir.revoked()).map_err(|e| TlsError::File {
            path: dir.revoked().display().to_string(),
            message: e.to_string(),
        })?;
        revoked.send_replace(Arc::new(list));
        Ok(TlsState {
            dir,
            config: RwLock::new(Arc::new(config)),
            revoked,
            stamps: Mutex::new((cert_stamp, revoked_stamp)),
        })
    }

    /// The configuration for the next handshake.
    pub fn current(&self) -> Arc<rustls::ServerConfig> {
        self.config
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Re-read what changed on disk. A file that fails to load leaves the
    /// previous state in force (logged; tried again when it changes).
    pub fn reload_changed(&self) {
        let cert_stamp = stamp(&[
            self.dir.server_cert(),
            self.dir.server_key(),
            self.dir.ca_cert(),
        ]);
        let revoked_stamp = stamp(&[self.dir.revoked()]);
        let (certs_changed, revoked_changed) = {
            let mut s = self.stamps.lock().unwrap_or_else(|p| p.into_inner());
            let c = s.0 != cert_stamp;
            let r = s.1 != revoked_stamp;
            *s = (cert_stamp, revoked_stamp);
            (c, r)
        };
        if certs_changed {
            match load_config(&self.dir) {
                Ok(cfg) => {
                    *self.config.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(cfg);
                    tracing::info!(dir = %self.dir.dir.display(), "TLS certificates re-read; new connections use them");
                }
                Err(e) => tracing::error!(
                    "TLS certificates changed but cannot be used (the previous ones stay in force): {e}"
                ),
            }
        }
        if revoked_changed {
            match ca::read_revoked(&self.dir.revoked()) {
                Ok(list) => {
                    tracing::info!(revoked = list.len(), "revocation list re-read");
                    self.revoked.send_replace(Arc::new(list));
                }
                Err(e) => tracing::error!(
                    "revocation list changed but cannot be read (the previous one stays in force): {e}"
                ),
            }
        }
    }
}

/// Look at the files every `every` until `stop`.
pub async fn watch_files(state: Arc<TlsState>, every: Duration, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let s = state.clone();
                // File IO off the async workers.
                let _ = tokio::task::spawn_blocking(move || s.reload_changed()).await;
            }
            _ = stop.changed() => return,
        }
    }
}

/// One accepted, handshaken connection.
#[derive(Debug)]
pub struct TlsConn {
    io: tokio_rustls::server::TlsStream<TcpStream>,
    peer: Peer,
}

impl Connected for TlsConn {
    type ConnectInfo = Peer;

    fn connect_info(&self) -> Peer {
        self.peer.clone()
    }
}

impl AsyncRead for TlsConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// Accept on `listener`, handshake each connection (bounded in time and
/// number), and yield the ones that succeed. The accept loop ends when the
/// returned stream is dropped (at its next connection) or the task is
/// aborted.
pub fn incoming(
    listener: TcpListener,
    state: Arc<TlsState>,
    handshake_timeout: Duration,
) -> (
    ReceiverStream<Result<TlsConn, std::io::Error>>,
    tokio::task::JoinHandle<()>,
) {
    let (tx, rx) = mpsc::channel(64);
    let slots = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    let per_source = PerSource::new(MAX_HANDSHAKES_PER_SOURCE);
    let task = tokio::spawn(async move {
        loop {
            let (tcp, remote) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    // Out of descriptors and the like: the backlog keeps
                    // the connection; try again shortly.
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            if tx.is_closed() {
                return;
            }
            let Some(source_slot) = per_source.try_enter(remote.ip()) else {
                tracing::warn!(%remote, "{MAX_HANDSHAKES_PER_SOURCE} TLS handshakes in progress from this address; connection dropped");
                continue;
            };
            let Ok(permit) = slots.clone().try_acquire_owned() else {
                tracing::warn!(%remote, "{MAX_HANDSHAKES} TLS handshakes in progress; connection dropped");
                continue;
            };
            let _ = tcp.set_nodelay(true);
            let acceptor = tokio_rustls::TlsAcceptor::from(state.current());
            let tx = tx.clone();
            tokio::spawn(async move {
                let done = tokio::time::timeout(handshake_timeout, acceptor.accept(tcp)).await;
                drop(permit);
                drop(source_slot);
                let io = match done {
                    Ok(Ok(io)) => io,
                    Ok(Err(e)) => {
                        tracing::warn!(%remote, "TLS handshake refused: {e}");
                        return;
                    }
                    Err(_) => {
                        tracing::warn!(%remote, "TLS handshake not done within {handshake_timeout:?}; connection closed");
                        return;
                    }
                };
                let cert = match io.get_ref().1.peer_certificates().and_then(|c| c.first()) {
                    Some(c) => identity::from_cert_der(c).map_err(|e| e.0),
                    None => Err("no client certificate".to_string()),
                };
                if let Err(e) = &cert {
                    tracing::warn!(%remote, "client certificate without a usable identity: {e}");
                }
                let _ = tx
                    .send(Ok(TlsConn {
                        io,
                        peer: Peer { remote, cert },
                    }))
                    .await;
            });
        }
    });
    (ReceiverStream::new(rx), task)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handshakes_are_bounded_per_source_address() {
        let p = PerSource::new(2);
        let a: IpAddr = "10.0.0.1".parse().expect("ip");
        let b: IpAddr = "10.0.0.2".parse().expect("ip");
        let s1 = p.try_enter(a).expect("first");
        let _s2 = p.try_enter(a).expect("second");
        assert!(p.try_enter(a).is_none(), "a third from the same address");
        // Another address is not affected.
        let _t = p.try_enter(b).expect("other address");
        drop(s1);
        assert_eq!(p.in_progress(a), 1);
        let _s3 = p.try_enter(a).expect("a slot came back");
        assert!(p.try_enter(a).is_none());
    }

    #[test]
    fn changed_files_are_re_read_and_a_broken_change_keeps_the_previous_state() {
        let tmp = tempfile::tempdir().expect("tmp");
        let now = time::OffsetDateTime::now_utc();
        let ca = CaDir::new(tmp.path().join("ca"));
        ca::init(&ca, &[], now).expect("init");
        let other = CaDir::new(tmp.path().join("other"));
        ca::init(&other, &["ctl.example".into()], now).expect("init other");
        let (tx, rx) = watch::channel(Arc::new(HashSet::new()));
        let state = TlsState::load(ca.clone(), tx).expect("load");
        let first = state.current();
        state.reload_changed();
        assert!(Arc::ptr_eq(&first, &state.current()), "nothing changed");

        // A renewed server certificate: new handshakes use it.
        for (from, to) in [
            (other.server_cert(), ca.server_cert()),
            (other.server_key(), ca.server_key()),
        ] {
            std::fs::copy(from, to).expect("copy");
        }
        state.reload_changed();
        let second = state.current();
        assert!(!Arc::ptr_eq(&first, &second), "not re-read");

        // A broken key: logged, the previous configuration stays.
        std::fs::write(ca.server_key(), "not a key").expect("write");
        state.reload_changed();
        assert!(Arc::ptr_eq(&second, &state.current()));

        // A revocation is published.
        let serial = "0abc".to_string();
        std::fs::write(ca.revoked(), format!("{serial} agent a1\n")).expect("write");
        state.reload_changed();
        assert!(rx.borrow().contains(&serial));
    }

    #[test]
    fn missing_files_are_named() {
        let tmp = tempfile::tempdir().expect("tmp");
        let e = load_config(&CaDir::new(tmp.path())).expect_err("empty dir");
        assert!(e.to_string().contains("ca.pem"), "{e}");
    }
}
