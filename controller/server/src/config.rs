//! How the server runs: its settings, and the application settings they
//! decide.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::{accept, tls};
use baton_app::{AppConfig, pace::Pace, retention::Retention};
use baton_model::Binding;

/// The metadata key of a refused stream's slot, in milliseconds (the
/// agent's link reads it).
pub const RETRY_AFTER_MS: &str = "retry-after-ms";

/// How the server runs.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Where to listen (port 0: any free port, written to `DATA/listen.addr`).
    pub listen: SocketAddr,
    /// Directory of the store and `listen.addr`.
    pub data_dir: PathBuf,
    /// Pacing of pushes.
    pub pace: Pace,
    /// How often each stream is pinged; three silent intervals end it.
    pub ping_interval: Duration,
    /// How long a new stream may take to say hello.
    pub hello_timeout: Duration,
    /// mTLS (`None`: plaintext, `--insecure`).
    pub tls: Option<tls::TlsOptions>,
    /// Where `/metrics` is served (`None`: not served; port 0: any free
    /// port, written to `DATA/metrics.addr`).
    pub metrics: Option<SocketAddr>,
    /// Where the web dashboard is served (`None`: not served; port 0: any
    /// free port, written to `DATA/http.addr`): HTTPS when `tls` is set.
    pub http: Option<SocketAddr>,
    /// Most packs an agent's Hello or Held may list.
    pub max_held: usize,
    /// What is deleted when, and how.
    pub retention: Retention,
    /// Live connections and TLS handshakes at most.
    pub accept: accept::AcceptOptions,
    /// New agent streams admitted per second, and at once (`None`: no
    /// bound). When a replica dies a third of its fleet arrives at the
    /// others within seconds: past the rate a stream is refused
    /// UNAVAILABLE and the agent comes back after its jittered backoff,
    /// instead of every hello hitting the store at once.
    pub admit: Option<Pace>,
    /// Whether agents belong to tenants: set with `tls` by
    /// [`ServerConfig::with_tls`] (identities make tenants bindable).
    pub binding: Binding,
    /// The fleet's trust lists relayed to every agent after its Welcome
    /// (`--trust-chain`; `None`: none), as they are now: a new chain is
    /// relayed at once to every stream open (a revocation reaches the
    /// boxes without a restart of anything).
    pub trust_chain: tokio::sync::watch::Receiver<Option<std::sync::Arc<str>>>,
}

impl ServerConfig {
    /// Defaults for `listen` and `data_dir`.
    pub fn new(listen: SocketAddr, data_dir: PathBuf) -> ServerConfig {
        ServerConfig {
            listen,
            data_dir,
            pace: Pace::default(),
            ping_interval: Duration::from_secs(10),
            hello_timeout: Duration::from_secs(10),
            tls: None,
            metrics: None,
            http: None,
            max_held: 1024,
            retention: Retention::default(),
            accept: accept::AcceptOptions::default(),
            admit: None,
            binding: Binding::Open,
            trust_chain: tokio::sync::watch::Sender::new(None).subscribe(),
        }
    }

    /// mTLS: agents have identities, and so belong to tenants.
    pub fn with_tls(mut self, tls: Option<tls::TlsOptions>) -> ServerConfig {
        self.binding = if tls.is_some() {
            Binding::Tenants
        } else {
            Binding::Open
        };
        self.tls = tls;
        self
    }

    /// Whether agents belong to tenants.
    pub fn binding(&self) -> Binding {
        self.binding
    }

    /// The application's settings that the server's decide.
    pub fn app_config(&self) -> AppConfig {
        let mut app_cfg = AppConfig::new(self.binding());
        app_cfg.pace = self.pace;
        app_cfg.max_held = self.max_held;
        app_cfg
    }
}
