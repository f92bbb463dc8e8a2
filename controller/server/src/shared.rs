//! What every stream and call shares: the application, the shutdown
//! signal, the revoked serials, the admission rate; and who a caller is.

use std::collections::HashSet;
use std::sync::Arc;

use tokio::sync::watch;
use tonic::Status;

use crate::config::ServerConfig;
use crate::tls;
use baton_app::App;
use baton_pki::identity::Identity;

/// What every stream and call shares.
#[derive(Debug)]
pub struct Shared {
    /// The application.
    pub app: Arc<App>,
    /// Set once to stop.
    pub shutdown: watch::Receiver<bool>,
    /// Configuration.
    pub cfg: ServerConfig,
    /// Serials of revoked certificates (empty without TLS).
    pub revoked: watch::Sender<Arc<HashSet<String>>>,
    /// The admission rate (see [`ServerConfig::admit`]).
    pub(crate) admit: Option<std::sync::Mutex<baton_app::pace::Admission>>,
}

impl Shared {
    /// Shared state over `app` (made with [`ServerConfig::app_config`]).
    pub fn new(app: Arc<App>, cfg: ServerConfig, shutdown: watch::Receiver<bool>) -> Arc<Shared> {
        Arc::new(Shared {
            app,
            shutdown,
            revoked: watch::Sender::new(Arc::new(HashSet::new())),
            admit: cfg.admit.map(|p| {
                std::sync::Mutex::new(baton_app::pace::Admission::new(
                    p,
                    tokio::time::Instant::now().into_std(),
                ))
            }),
            cfg,
        })
    }

    /// Who is calling: [`Identity::Insecure`] on a plaintext controller;
    /// on a TLS one, the identity of the peer's certificate, refused if it
    /// has none or is revoked. Returns the certificate's serial too.
    pub fn peer(&self, ext: &tonic::Extensions) -> Result<(Identity, Option<String>), Status> {
        if self.cfg.tls.is_none() {
            return Ok((Identity::Insecure, None));
        }
        let Some(peer) = ext.get::<tls::Peer>() else {
            return Err(Status::unauthenticated("no client certificate"));
        };
        let cert = match &peer.cert {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(remote = %peer.remote, "refused: {e}");
                return Err(Status::permission_denied(format!(
                    "client certificate refused: {e}"
                )));
            }
        };
        if self.revoked.borrow().contains(&cert.serial) {
            tracing::warn!(remote = %peer.remote, serial = %cert.serial, "refused: revoked certificate of {}", cert.identity);
            return Err(Status::permission_denied(format!(
                "certificate {} ({}) is revoked",
                cert.serial, cert.identity
            )));
        }
        Ok((cert.identity.clone(), Some(cert.serial.clone())))
    }

    /// The caller must be an operator (or anyone, without TLS); with its
    /// certificate's serial.
    pub fn operator(&self, ext: &tonic::Extensions) -> Result<(Identity, Option<String>), Status> {
        let (who, serial) = self.peer(ext)?;
        match who {
            Identity::Operator { .. } | Identity::Insecure => Ok((who, serial)),
            Identity::Agent { .. } => {
                tracing::warn!("refused: {who} called the operators' API");
                Err(Status::permission_denied(format!(
                    "{who}: an agent certificate cannot use the operators' API"
                )))
            }
        }
    }
}
