//! mTLS for the listener: the server configuration read from a CA
//! directory (made by `baton-controller ca`), re-read when its files
//! change, and the [`Peer`] each connection carries.
//!
//! The accept loop that uses it is [`super::accept`]: handshakes bounded
//! in number (overall and per source) and in time, refusals the client can
//! read, each connection's [`Peer`] (identity and serial, read once from the
//! verified client certificate) in every request's extensions through
//! tonic's `Connected`; a failed handshake (another CA, expired, no client
//! certificate, garbage) is logged with the peer's address and never
//! reaches tonic.
//!
//! Client certificates are required and verified against `DIR/ca.pem`
//! (rustls/webpki: chain, validity period, `clientAuth` usage).
//! Revocation (`DIR/revoked.txt`) is checked per request by the services,
//! and on live link streams whenever the list changes.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::sync::watch;

use baton_pki::ca::{self, CaDir};
use baton_pki::identity::PeerCert;

/// How the listener does TLS.
#[derive(Clone, Debug)]
pub struct TlsOptions {
    /// The CA directory (`server.pem`, `server-key.pem`, `ca.pem`,
    /// `revoked.txt`).
    pub dir: std::path::PathBuf,
    /// How often the files are looked at for changes.
    pub reload_every: Duration,
}

impl TlsOptions {
    /// Defaults: files looked at every second.
    pub fn new(dir: impl Into<std::path::PathBuf>) -> TlsOptions {
        TlsOptions {
            dir: dir.into(),
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
    let (certs, key) = server_identity(dir)?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| config(&e))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .map_err(|e| config(&e))?;
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(cfg)
}

/// The dashboard's HTTPS configuration: the same server certificate, no
/// client authentication (browsers log in with a token), `h2` then
/// `http/1.1`.
pub fn web_config(dir: &CaDir) -> Result<rustls::ServerConfig, TlsError> {
    let (certs, key) = server_identity(dir)?;
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

/// The controller's certificate chain and key (`DIR/server.pem`,
/// `DIR/server-key.pem`): what the gRPC listener and the dashboard's
/// HTTPS present.
pub fn server_identity(
    dir: &CaDir,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TlsError> {
    let file = |p: &std::path::Path, e: &dyn std::fmt::Display| TlsError::File {
        path: p.display().to_string(),
        message: e.to_string(),
    };
    let cert_path = dir.server_cert();
    let certs = CertificateDer::pem_file_iter(&cert_path)
        .map_err(|e| file(&cert_path, &e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file(&cert_path, &e))?;
    let key_path = dir.server_key();
    let key = PrivateKeyDer::from_pem_file(&key_path).map_err(|e| file(&key_path, &e))?;
    Ok((certs, key))
}

/// Size and modification time of each watched file (`None`: absent).
pub(crate) type Stamp = Vec<Option<(u64, SystemTime)>>;

pub(crate) fn stamp(paths: &[std::path::PathBuf]) -> Stamp {
    paths
        .iter()
        .map(|p| {
            std::fs::metadata(p)
                .ok()
                .and_then(|m| Some((m.len(), m.modified().ok()?)))
        })
        .collect()
}

/// The live TLS state: the configurations new handshakes use (the gRPC
/// listener's, asking for a client certificate, and the dashboard's, from
/// the same files and re-read with them), and the revoked serials.
#[derive(Debug)]
pub struct TlsState {
    dir: CaDir,
    configs: RwLock<Configs>,
    revoked: watch::Sender<Arc<HashSet<String>>>,
    /// The serials of `revoked.txt`, and those other replicas recorded
    /// (the store's): `revoked` is their union.
    lists: Mutex<(HashSet<String>, HashSet<String>)>,
    stamps: Mutex<(Stamp, Stamp)>,
}

/// The two server configurations built from one reading of the files.
#[derive(Debug)]
struct Configs {
    grpc: Arc<rustls::ServerConfig>,
    web: Arc<rustls::ServerConfig>,
}

impl Configs {
    fn load(dir: &CaDir) -> Result<Configs, TlsError> {
        Ok(Configs {
            grpc: Arc::new(load_config(dir)?),
            web: Arc::new(web_config(dir)?),
        })
    }
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
        let configs = Configs::load(&dir)?;
        let list = ca::read_revoked(&dir.revoked()).map_err(|e| TlsError::File {
            path: dir.revoked().display().to_string(),
            message: e.to_string(),
        })?;
        revoked.send_replace(Arc::new(list.clone()));
        Ok(TlsState {
            dir,
            configs: RwLock::new(configs),
            revoked,
            lists: Mutex::new((list, HashSet::new())),
            stamps: Mutex::new((cert_stamp, revoked_stamp)),
        })
    }

    /// The configuration for the next gRPC handshake.
    pub fn current(&self) -> Arc<rustls::ServerConfig> {
        self.configs
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .grpc
            .clone()
    }

    /// The configuration for the next dashboard (HTTPS) handshake.
    pub fn current_web(&self) -> Arc<rustls::ServerConfig> {
        self.configs
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .web
            .clone()
    }

    /// The serials the store says are revoked (any replica recorded them)
    /// now; the list in force changes only if that adds or removes one.
    pub fn set_shared_revoked(&self, serials: HashSet<String>) {
        let mut lists = self.lists.lock().unwrap_or_else(|p| p.into_inner());
        if lists.1 != serials {
            lists.1 = serials;
            self.publish(&lists);
        }
    }

    fn publish(&self, lists: &(HashSet<String>, HashSet<String>)) {
        let all: HashSet<String> = lists.0.union(&lists.1).cloned().collect();
        self.revoked.send_if_modified(|cur| {
            if **cur == all {
                return false;
            }
            *cur = Arc::new(all);
            true
        });
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
            match Configs::load(&self.dir) {
                Ok(cfgs) => {
                    *self.configs.write().unwrap_or_else(|p| p.into_inner()) = cfgs;
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
                    let mut lists = self.lists.lock().unwrap_or_else(|p| p.into_inner());
                    lists.0 = list;
                    self.publish(&lists);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changed_files_are_re_read_and_a_broken_change_keeps_the_previous_state() {
        let tmp = tempfile::tempdir().expect("tmp");
        let now = jiff::Timestamp::now();
        let ca = CaDir::new(tmp.path().join("ca"));
        ca::init(&ca, &[], now).expect("init");
        let other = CaDir::new(tmp.path().join("other"));
        ca::init(&other, &["ctl.example".into()], now).expect("init other");
        let (tx, rx) = watch::channel(Arc::new(HashSet::new()));
        let state = TlsState::load(ca.clone(), tx).expect("load");
        let first = state.current();
        let first_web = state.current_web();
        state.reload_changed();
        assert!(Arc::ptr_eq(&first, &state.current()), "nothing changed");
        assert!(Arc::ptr_eq(&first_web, &state.current_web()));

        // A renewed server certificate: new handshakes use it.
        for (from, to) in [
            (other.server_cert(), ca.server_cert()),
            (other.server_key(), ca.server_key()),
        ] {
            std::fs::copy(from, to).expect("copy");
        }
        state.reload_changed();
        let second = state.current();
        let second_web = state.current_web();
        assert!(!Arc::ptr_eq(&first, &second), "not re-read");
        assert!(
            !Arc::ptr_eq(&first_web, &second_web),
            "the dashboard takes the new certificate too"
        );

        // A broken key: logged, the previous configurations stay.
        std::fs::write(ca.server_key(), "not a key").expect("write");
        state.reload_changed();
        assert!(Arc::ptr_eq(&second, &state.current()));
        assert!(Arc::ptr_eq(&second_web, &state.current_web()));

        // A revocation is published.
        let serial = "0abc".to_string();
        std::fs::write(ca.revoked(), format!("{serial} agent a1\n")).expect("write");
        state.reload_changed();
        assert!(rx.borrow().contains(&serial));
    }

    #[test]
    fn the_serials_in_force_are_the_file_and_the_other_replicas() {
        let tmp = tempfile::tempdir().expect("tmp");
        let ca = CaDir::new(tmp.path().join("ca"));
        ca::init(&ca, &[], jiff::Timestamp::now()).expect("init");
        std::fs::write(ca.revoked(), "0a agent a1\n").expect("write");
        let (tx, rx) = watch::channel(Arc::new(HashSet::new()));
        let state = TlsState::load(ca.clone(), tx).expect("load");
        let now = |rx: &watch::Receiver<Arc<HashSet<String>>>| {
            let mut v: Vec<String> = rx.borrow().iter().cloned().collect();
            v.sort();
            v
        };
        assert_eq!(now(&rx), ["0a"]);
        state.set_shared_revoked(["0b".to_string()].into());
        assert_eq!(now(&rx), ["0a", "0b"]);
        // The file re-read keeps the other replicas' serials in force.
        std::fs::write(ca.revoked(), "0c agent a3\n").expect("write");
        state.reload_changed();
        assert_eq!(now(&rx), ["0b", "0c"]);
        let mut seen = rx.clone();
        seen.mark_unchanged();
        state.set_shared_revoked(["0b".to_string()].into());
        assert!(
            !seen.has_changed().expect("open"),
            "nothing new, nothing sent"
        );
        state.set_shared_revoked(HashSet::new());
        assert_eq!(now(&rx), ["0c"]);
    }

    #[test]
    fn missing_files_are_named() {
        let tmp = tempfile::tempdir().expect("tmp");
        let e = load_config(&CaDir::new(tmp.path())).expect_err("empty dir");
        assert!(e.to_string().contains("ca.pem"), "{e}");
    }
}
