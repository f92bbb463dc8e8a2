//! `baton-controller serve`: logging, the runtime, signals, the store.

use std::path::PathBuf;

use baton_app::App;
use baton_app::pace::Pace;
use baton_server::{self as server, ServerConfig};
use baton_sql::postgres::{LeaseConfig, PgStore, Target};
use baton_sql::sqlite::SqliteStore;
use baton_store::Store;

use crate::args::ServeArgs;

/// `serve` flags.
#[derive(Debug)]
pub struct Opts {
    pub listen: std::net::SocketAddr,
    pub data: PathBuf,
    pub store: Option<String>,
    pub store_ca: Option<PathBuf>,
    pub replica_id: Option<String>,
    pub lease: String,
    pub store_readers: usize,
    pub store_read_connections: usize,
    pub admit_rate: f64,
    pub admit_burst: f64,
    pub insecure: bool,
    pub insecure_any: bool,
    pub tls_dir: Option<PathBuf>,
    pub tls_handshake_timeout: String,
    pub tls_handshake_timeout_crowded: String,
    pub max_connections: usize,
    pub max_handshakes: usize,
    pub max_handshakes_per_source: usize,
    pub push_rate: f64,
    pub push_burst: f64,
    pub ping_interval: String,
    pub log_format: baton_service::log::LogFormat,
    pub metrics: Option<std::net::SocketAddr>,
    pub http: Option<std::net::SocketAddr>,
    pub retention: baton_app::retention::Retention,
    pub max_held: usize,
    pub trust_chain: Option<PathBuf>,
}

impl From<ServeArgs> for Opts {
    /// The flags as the server takes them (counts as `usize`, the three
    /// retention flags as one policy).
    fn from(a: ServeArgs) -> Opts {
        let ServeArgs {
            listen,
            data,
            store,
            store_ca,
            replica_id,
            lease,
            store_readers,
            store_read_connections,
            admit_rate,
            admit_burst,
            tls_dir,
            insecure,
            insecure_any,
            tls_handshake_timeout,
            tls_handshake_timeout_crowded,
            max_connections,
            max_handshakes,
            max_handshakes_per_source,
            push_rate,
            push_burst,
            ping_interval,
            log_format,
            metrics,
            http,
            retain_feedback,
            retain_clock,
            retain_audit,
            max_held_packs,
            trust_chain,
        } = a;
        Opts {
            listen,
            data,
            store,
            store_ca,
            replica_id,
            lease,
            store_readers,
            store_read_connections,
            admit_rate,
            admit_burst,
            insecure,
            insecure_any,
            tls_dir,
            tls_handshake_timeout,
            tls_handshake_timeout_crowded,
            max_connections: max_connections as usize,
            max_handshakes: max_handshakes as usize,
            max_handshakes_per_source: max_handshakes_per_source as usize,
            push_rate,
            push_burst,
            ping_interval,
            log_format,
            metrics,
            http,
            retention: baton_app::retention::Retention {
                feedback: retain_feedback.0,
                clock: retain_clock.0,
                audit: retain_audit.0,
                ..Default::default()
            },
            max_held: max_held_packs as usize,
            trust_chain,
        }
    }
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

/// The flags' values checked (in the order they are reported): the
/// handshake budget, the connection cap against the open-files limit,
/// the push and admission rates, the ping interval.
fn check_flags(
    o: &Opts,
) -> anyhow::Result<(server::accept::limits::HandshakeLimits, std::time::Duration)> {
    let duration = |flag: &str, v: &str| {
        baton_proto::time::parse_duration(v).map_err(|e| anyhow::anyhow!("{flag} {v}: {e}"))
    };
    let handshakes = server::accept::limits::HandshakeLimits {
        total: o.max_handshakes,
        per_source: o.max_handshakes_per_source,
        timeout: duration("--tls-handshake-timeout", &o.tls_handshake_timeout)?,
        crowded_timeout: duration(
            "--tls-handshake-timeout-crowded",
            &o.tls_handshake_timeout_crowded,
        )?,
    };
    handshakes.check().map_err(anyhow::Error::msg)?;
    if o.max_connections == 0 {
        anyhow::bail!("--max-connections must be at least 1");
    }
    check_nofile(o.max_connections);
    if !(o.push_rate > 0.0 && o.push_rate.is_finite() && o.push_burst >= 1.0) {
        anyhow::bail!("--push-rate must be > 0 and --push-burst >= 1");
    }
    if !(o.admit_rate >= 0.0 && o.admit_rate.is_finite() && o.admit_burst >= 1.0) {
        anyhow::bail!("--admit-rate must be >= 0 (0: no bound) and --admit-burst >= 1");
    }
    let ping_interval = baton_proto::time::parse_duration(&o.ping_interval)
        .map_err(|e| anyhow::anyhow!("--ping-interval {}: {e}", o.ping_interval))?;
    if ping_interval.is_zero() {
        anyhow::bail!("--ping-interval must be > 0");
    }
    Ok((handshakes, ping_interval))
}

/// `--trust-chain FILE`: a chain of signed trust lists, its form checked
/// (the controller holds no root: the agents verify the signatures).
fn read_trust_chain(path: &std::path::Path) -> anyhow::Result<std::sync::Arc<str>> {
    let text = read_chain_text(path)?;
    check_trust_chain(path, &text)?;
    Ok(std::sync::Arc::from(text))
}

/// `--trust-chain`'s text, unchecked.
fn read_chain_text(path: &std::path::Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("--trust-chain {}: cannot read: {e}", path.display()))
}

/// `text` (of `path`) is a chain of signed trust lists.
fn check_trust_chain(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    let lists: Vec<baton_trust::SignedList> = serde_json::from_str(text).map_err(|e| {
        anyhow::anyhow!(
            "--trust-chain {}: not a chain of signed trust lists (keys sign-list makes one): {e}",
            path.display()
        )
    })?;
    tracing::info!(lists = lists.len(), file = %path.display(), "trust lists relayed to agents");
    Ok(())
}

/// How often `--trust-chain`'s file is looked at for a change.
const TRUST_CHAIN_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Re-reads `--trust-chain` each [`TRUST_CHAIN_EVERY`] and hands a new
/// chain to the server, which relays it to every stream open:
/// `keys sign-list` on the controller's host reaches the boxes without a
/// restart. The text itself is compared (a few KB), not the file's time
/// or length: a write caught half-way is read again whole the next time.
/// A text that is no chain is said once, and the chain before stays
/// relayed.
async fn watch_trust_chain(
    path: PathBuf,
    chain: tokio::sync::watch::Sender<Option<std::sync::Arc<str>>>,
) {
    let mut tick = tokio::time::interval(TRUST_CHAIN_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut refused: Option<String> = None;
    loop {
        tick.tick().await;
        let p = path.clone();
        let Ok(text) = tokio::task::spawn_blocking(move || read_chain_text(&p)).await else {
            continue;
        };
        let text = match text {
            Ok(t) => t,
            Err(e) => {
                let why = format!("{e:#}");
                if refused.as_deref() != Some(why.as_str()) {
                    tracing::error!("{why} (the chain before stays relayed)");
                    refused = Some(why);
                }
                continue;
            }
        };
        let relayed = chain.borrow().as_deref() == Some(text.as_str());
        if relayed || refused.as_deref() == Some(text.as_str()) {
            continue;
        }
        match check_trust_chain(&path, &text) {
            Ok(()) => {
                refused = None;
                chain.send_replace(Some(std::sync::Arc::from(text)));
            }
            Err(e) => {
                tracing::error!("{e:#} (the chain before stays relayed)");
                refused = Some(text);
            }
        }
    }
}

fn serve(o: Opts) -> anyhow::Result<()> {
    check_transport(&o)?;
    let (handshakes, ping_interval) = check_flags(&o)?;
    std::fs::create_dir_all(&o.data)
        .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", o.data.display()))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        // The store's reads run here (`spawn_blocking`): a few at once is
        // what SQLite and two cores can use; more threads would each get
        // an allocator arena and a stack for a thousand agents' hellos.
        .max_blocking_threads(16)
        .thread_name("baton-ctl")
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let mut cfg = ServerConfig::new(o.listen, o.data.clone()).with_tls(
            o.tls_dir
                .as_ref()
                .map(|d| server::tls::TlsOptions::new(d.clone())),
        );
        let (store, lease_lost) = open_store(&o, cfg.binding()).await?;
        cfg.pace = Pace {
            rate: o.push_rate,
            burst: o.push_burst,
        };
        cfg.ping_interval = ping_interval;
        cfg.metrics = o.metrics;
        cfg.http = o.http;
        cfg.retention = o.retention;
        cfg.max_held = o.max_held;
        let (chain_tx, chain_rx) = tokio::sync::watch::channel(match &o.trust_chain {
            Some(path) => Some(read_trust_chain(path)?),
            None => None,
        });
        cfg.trust_chain = chain_rx;
        if let Some(path) = o.trust_chain.clone() {
            tokio::spawn(watch_trust_chain(path, chain_tx));
        }
        cfg.accept = server::accept::AcceptOptions {
            max_connections: o.max_connections,
            handshakes,
        };
        cfg.admit = (o.admit_rate > 0.0).then_some(Pace {
            rate: o.admit_rate,
            burst: o.admit_burst,
        });
        let lost = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop = stop_signal();
        let lost_flag = lost.clone();
        let stopping = async move {
            let Some(mut lease_lost) = lease_lost else {
                return stop.await;
            };
            tokio::select! {
                () = stop => {}
                _ = lease_lost.wait_for(|lost| *lost) => {
                    lost_flag.store(true, std::sync::atomic::Ordering::SeqCst);
                }
            }
        };
        let app = App::new(store, cfg.app_config());
        server::serve(app, cfg, stopping).await?;
        if lost.load(std::sync::atomic::Ordering::SeqCst) {
            // Its agents reconnect to the other replicas; a supervisor
            // (systemd's Restart=) starts it again under a new epoch.
            anyhow::bail!(
                "this replica's lease on the store ran out (paused, or cut off from the database, for longer than the lease): it stopped serving so that it cannot write for agents other replicas now own"
            );
        }
        Ok(())
    })
}

/// The store `--store` names (PostgreSQL), else the embedded one in
/// `--data`. Opened off the async threads: both block, and the
/// PostgreSQL client runs a small runtime of its own.
/// With PostgreSQL, also the replica's lease: it turns `true` when lost.
async fn open_store(
    o: &Opts,
    binding: baton_model::Binding,
) -> anyhow::Result<(std::sync::Arc<dyn Store>, Option<LeaseLost>)> {
    let data = o.data.clone();
    let url = o.store.clone();
    let ca = o.store_ca.clone();
    let readers = o.store_readers;
    let read_connections = o.store_read_connections;
    let mut lease = LeaseConfig::new(o.replica_id.clone().unwrap_or_else(LeaseConfig::unique_id));
    lease.ttl = baton_proto::time::parse_duration(&o.lease)
        .map_err(|e| anyhow::anyhow!("--lease {}: {e}", o.lease))?;
    lease.renew_every = lease.ttl / 10;
    lease
        .check()
        .map_err(|e| anyhow::anyhow!("--replica-id / --lease: {e}"))?;
    tokio::task::spawn_blocking(move || match url {
        Some(url) => Target::new(&url, ca.as_deref())
            .map(|t| t.readers(readers).read_connections(read_connections))
            .and_then(|t| PgStore::open_replica(&t, binding, lease))
            .map(|s| {
                let (replica, epoch) = s.replica();
                tracing::info!(%replica, epoch, "serving as a replica on PostgreSQL");
                let lost = s.lease_lost();
                (
                    std::sync::Arc::new(s) as std::sync::Arc<dyn Store>,
                    Some(lost),
                )
            })
            // The URL may hold a password: never in a message.
            .map_err(|e| anyhow::anyhow!("store in PostgreSQL (--store): {e}")),
        None => SqliteStore::open(&data, binding)
            .map(|s| (std::sync::Arc::new(s) as std::sync::Arc<dyn Store>, None))
            .map_err(|e| anyhow::anyhow!("store in {}: {e}", data.display())),
    })
    .await?
}

type LeaseLost = tokio::sync::watch::Receiver<bool>;

/// Warn when the process may run out of file descriptors before
/// `--max-connections` (one per connection, plus refusals being served and
/// the store's and runtime's own): accepts then fail with EMFILE and wait
/// in the backlog instead of being told the controller is full. Read from
/// /proc (no unsafe code here); nothing said if it cannot be read.
fn check_nofile(max_connections: usize) {
    let Some(soft) = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|t| nofile_soft(&t))
    else {
        return;
    };
    let needed = max_connections + server::accept::MAX_REFUSALS + 64;
    if soft < needed as u64 {
        tracing::warn!(
            "RLIMIT_NOFILE is {soft} but --max-connections {max_connections} needs about {needed} file descriptors: once they run out, accepts fail (EMFILE) and new clients wait unanswered instead of being told the controller is full; raise LimitNOFILE (the unit sets 65536) or lower --max-connections"
        );
    }
}

/// The soft limit on open files from `/proc/self/limits` (`None`:
/// unlimited or unreadable).
fn nofile_soft(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
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
    if let Some(h) = o.http
        && o.insecure
        && !h.ip().is_loopback()
        && !o.insecure_any
    {
        anyhow::bail!(
            "--http {h} with --insecure: a plaintext dashboard is refused on a non-loopback address (anyone reaching it acts for every tenant); use --tls-dir DIR for HTTPS with log-in, or add --insecure-any on a network you trust"
        );
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

#[cfg(test)]
mod tests {
    #[test]
    fn the_open_files_limit_is_read_from_proc() {
        let text = "Limit                     Soft Limit           Hard Limit           Units     \n\
                    Max processes             63432                63432                processes \n\
                    Max open files            1024                 524288               files     \n";
        assert_eq!(super::nofile_soft(text), Some(1024));
        assert_eq!(
            super::nofile_soft(
                "Max open files            unlimited            unlimited            files\n"
            ),
            None
        );
        assert_eq!(super::nofile_soft(""), None);
    }
}
