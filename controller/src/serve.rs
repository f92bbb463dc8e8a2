//! `baton-controller serve`: logging, the runtime, signals, the store.

use std::path::PathBuf;

use baton_controller::app::pace::Pace;
use baton_controller::server::{self, ServerConfig};
use baton_controller::store::sqlite::SqliteStore;

/// `serve` flags.
#[derive(Debug)]
pub struct Opts {
    pub listen: std::net::SocketAddr,
    pub data: PathBuf,
    pub insecure: bool,
    pub insecure_any: bool,
    pub tls_dir: Option<PathBuf>,
    pub tls_handshake_timeout: String,
    pub push_rate: f64,
    pub push_burst: f64,
    pub ping_interval: String,
    pub log_format: baton_service::log::LogFormat,
    pub metrics: Option<std::net::SocketAddr>,
    pub retention: baton_controller::app::retention::Retention,
    pub max_held: usize,
}

/// Run until SIGTERM / SIGINT; exit code.
pub fn run(o: Opts) -> i32 {
    init_logging(o.log_format);
    match serve(o) {
        Ok(()) => 0,
        Err(e) => {
            tracing::error!("{e:#}");
            1
        }
    }
}

/// Logs to stderr (`RUST_LOG` filters; default `info`) in `format`: the
/// same choice as the agent's (`baton_service::log`; `auto` is journald's
/// format when stderr is the journal).
fn init_logging(format: baton_service::log::LogFormat) {
    use tracing_subscriber::EnvFilter;
    use tracing_subscriber::prelude::*;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let out = format.resolve(baton_service::log::stderr_is_journal());
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::registry()
        .with(baton_service::log::layer(out, ansi).with_filter(filter))
        .try_init();
}

fn serve(o: Opts) -> anyhow::Result<()> {
    check_transport(&o)?;
    let handshake_timeout = baton_proto::time::parse_duration(&o.tls_handshake_timeout)
        .map_err(|e| anyhow::anyhow!("--tls-handshake-timeout {}: {e}", o.tls_handshake_timeout))?;
    if handshake_timeout.is_zero() {
        anyhow::bail!("--tls-handshake-timeout must be > 0");
    }
    if !(o.push_rate > 0.0 && o.push_rate.is_finite() && o.push_burst >= 1.0) {
        anyhow::bail!("--push-rate must be > 0 and --push-burst >= 1");
    }
    let ping_interval = baton_proto::time::parse_duration(&o.ping_interval)
        .map_err(|e| anyhow::anyhow!("--ping-interval {}: {e}", o.ping_interval))?;
    if ping_interval.is_zero() {
        anyhow::bail!("--ping-interval must be > 0");
    }
    std::fs::create_dir_all(&o.data)
        .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", o.data.display()))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("baton-ctl")
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let mut cfg =
            ServerConfig::new(o.listen, o.data.clone()).with_tls(o.tls_dir.as_ref().map(|d| {
                let mut t = server::tls::TlsOptions::new(d.clone());
                t.handshake_timeout = handshake_timeout;
                t
            }));
        let store = SqliteStore::open(&o.data, cfg.binding())
            .map_err(|e| anyhow::anyhow!("store in {}: {e}", o.data.display()))?;
        cfg.pace = Pace {
            rate: o.push_rate,
            burst: o.push_burst,
        };
        cfg.ping_interval = ping_interval;
        cfg.metrics = o.metrics;
        cfg.retention = o.retention;
        cfg.max_held = o.max_held;
        server::serve(std::sync::Arc::new(store), cfg, stop_signal()).await
    })
}

/// mTLS with `--tls-dir`, or plaintext with `--insecure`, and plaintext
/// only on loopback unless `--insecure-any` says so too.
fn check_transport(o: &Opts) -> anyhow::Result<()> {
    match (&o.tls_dir, o.insecure) {
        (Some(d), true) => anyhow::bail!(
            "--tls-dir {} and --insecure: choose one (mTLS or plaintext)",
            d.display()
        ),
        (None, false) => anyhow::bail!(
            "no transport: pass --tls-dir DIR (certificates made by `baton-controller ca init --dir DIR`) for mTLS, or --insecure for plaintext on loopback"
        ),
        (Some(_), false) => {}
        (None, true) => {
            if !o.listen.ip().is_loopback() && !o.insecure_any {
                anyhow::bail!(
                    "--insecure on {}: plaintext is refused on a non-loopback address, because anyone who reaches it could push to agents, read their feedback or speak as one; use --tls-dir DIR, or add --insecure-any to accept that on a network you trust",
                    o.listen
                );
            }
        }
    }
    if o.insecure_any && !o.insecure {
        anyhow::bail!("--insecure-any only makes sense with --insecure");
    }
    Ok(())
}

/// SIGTERM, SIGINT or SIGHUP: stop cleanly (the store is consistent at every
/// commit; streams are closed so agents reconnect later). The handlers are
/// installed by this call, not when the future is first polled: the server
/// says READY to systemd before it awaits the future, and a stop that comes
/// right after must still be a clean one (not the default action of
/// SIGTERM). Must be called within the runtime.
fn stop_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{SignalKind, signal};
    let handlers = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    );
    async move {
        match handlers {
            (Ok(mut term), Ok(mut int), Ok(mut hup)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                    _ = hup.recv() => {}
                }
            }
            _ => {
                tracing::warn!("cannot watch SIGTERM/SIGHUP; stopping on Ctrl-C only");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
}
