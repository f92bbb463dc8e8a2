//! A reconnection storm: what a replica sees when another one dies and a
//! share of the fleet arrives at once, with and without `--admit-rate`.
//!
//! `STORM_AGENTS` (3 000) simulated agents, each on its own TCP connection,
//! open their Link stream at the same instant against a controller served
//! in this process (plaintext, SQLite in a temp dir). A refused stream
//! (UNAVAILABLE: over the admission rate) is tried again as each run says
//! (`baton_agent::link::backoff`: full jitter, 0.5 s doubling to 30 s).
//! Knobs: `STORM_AGENTS`, `STORM_RATE` (500), `STORM_BURST` (100). Four
//! runs side by side, in this order, each on a fresh controller:
//!
//! - **unbounded**: no admission bound: every hello reaches the store at
//!   once (a refusal here is a reset connection: the listen backlog
//!   overflowed);
//! - **admit, agents wait for their slot**: `--admit-rate 500
//!   --admit-burst 100` (the defaults); a refused agent comes back at the
//!   slot the controller handed it (`retry-after-ms`), as the agent's link
//!   does;
//! - **admit, jittered backoff only**: the same bound, the agents ignoring
//!   the slot (what an older agent does);
//! - **admit, backoff without jitter**: the same, the agents retrying
//!   after the backoff's ceiling itself (what full jitter is there to
//!   avoid).
//!
//! Figures per run: time until every agent is welcomed, refused attempts,
//! and per agent the time from the storm's start to its welcome (p50,
//! p99) and from its admitted stream's open to the welcome (the hello's
//! cost at the controller: p50, p99). `cargo bench -p baton-controller
//! --bench storm`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use baton_agent::link::backoff::{Backoff, BackoffConfig};
use baton_app::App;
use baton_app::pace::Pace;
use baton_model::Binding;
use baton_proto::wire::{
    self, agent_message::Body as In, controller_message::Body as Out, link_client::LinkClient,
};
use baton_server::{self as server, ServerConfig};
use baton_sql::sqlite::SqliteStore;
use tokio::sync::{Barrier, mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;

/// A wait longer than this is a failure, not a figure.
const TIMEOUT: Duration = Duration::from_secs(300);

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("storm: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// How a refused agent waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Retry {
    /// For the slot the controller handed it (`retry-after-ms`), plus up
    /// to a tenth: what the agent's link does.
    Slot,
    /// Its backoff with full jitter, ignoring the slot.
    Jitter,
    /// The backoff's ceiling itself, ignoring the slot.
    Ceiling,
}

/// How one run admits and how its agents retry.
#[derive(Clone, Copy, Debug)]
struct Setting {
    name: &'static str,
    admit: Option<Pace>,
    retry: Retry,
}

/// What one agent saw.
#[derive(Clone, Copy, Debug)]
struct Arrival {
    /// From the storm's start to its welcome.
    total: Duration,
    /// From its admitted stream's open to the welcome.
    hello: Duration,
    /// Attempts refused (over the rate) or failed (reset) before.
    refused: u32,
}

fn run() -> Result<()> {
    let agents: usize = std::env::var("STORM_AGENTS")
        .ok()
        .map(|v| v.parse())
        .transpose()
        .context("STORM_AGENTS")?
        .unwrap_or(3_000);
    let knob = |name: &str, default: f64| -> Result<f64> {
        Ok(std::env::var(name)
            .ok()
            .map(|v| v.parse())
            .transpose()
            .with_context(|| name.to_owned())?
            .unwrap_or(default))
    };
    let admit = Pace {
        rate: knob("STORM_RATE", 500.0)?,
        burst: knob("STORM_BURST", 100.0)?,
    };
    let settings = [
        Setting {
            name: "unbounded",
            admit: None,
            retry: Retry::Jitter,
        },
        Setting {
            name: "admit, agents wait for their slot",
            admit: Some(admit),
            retry: Retry::Slot,
        },
        Setting {
            name: "admit, jittered backoff only",
            admit: Some(admit),
            retry: Retry::Jitter,
        },
        Setting {
            name: "admit, backoff without jitter",
            admit: Some(admit),
            retry: Retry::Ceiling,
        },
    ];
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    println!(
        "{agents} agents at once; admission {} /s, burst {}; backoff 0.5 s doubling to 30 s\n",
        admit.rate, admit.burst
    );
    println!(
        "| run | all welcomed | refused or reset attempts | to welcome p50 / p99 | hello p50 / p99 |"
    );
    println!("|---|---|---|---|---|");
    for s in settings {
        let (wall, mut arrivals) = rt.block_on(storm(agents, s))?;
        arrivals.sort_by_key(|a| a.total);
        let totals: Vec<Duration> = arrivals.iter().map(|a| a.total).collect();
        let mut hellos: Vec<Duration> = arrivals.iter().map(|a| a.hello).collect();
        hellos.sort();
        let refused: u64 = arrivals.iter().map(|a| u64::from(a.refused)).sum();
        println!(
            "| {} | {:.2} s | {refused} | {:.0} / {:.0} ms | {:.1} / {:.1} ms |",
            s.name,
            wall.as_secs_f64(),
            ms(pct(&totals, 0.50)),
            ms(pct(&totals, 0.99)),
            ms(pct(&hellos, 0.50)),
            ms(pct(&hellos, 0.99)),
        );
    }
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn pct(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// One run: a fresh controller, every agent at once; the wall time until
/// the last welcome, and each agent's arrival.
async fn storm(agents: usize, s: Setting) -> Result<(Duration, Vec<Arrival>)> {
    let dir = tempfile::tempdir()?;
    let store = SqliteStore::open(dir.path(), Binding::Open)?;
    let mut cfg = ServerConfig::new("127.0.0.1:0".parse()?, dir.path().to_path_buf());
    cfg.admit = s.admit;
    cfg.accept.max_connections = agents * 2 + 64;
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let app = App::new(Arc::new(store), cfg.app_config());
    let server = tokio::spawn(server::serve(app, cfg, async {
        let _ = stop_rx.await;
    }));
    let addr = loop {
        if let Ok(a) = std::fs::read_to_string(dir.path().join("listen.addr")) {
            break a.trim().to_owned();
        }
        if server.is_finished() {
            bail!("the controller stopped before listening");
        }
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let url = format!("http://{addr}");
    let start = Arc::new(Barrier::new(agents + 1));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut held = Vec::with_capacity(agents);
    for ix in 0..agents {
        let (url, start, tx) = (url.clone(), start.clone(), tx.clone());
        held.push(tokio::spawn(async move {
            let r = agent(ix, &url, s.retry, start).await;
            let _ = tx.send(r.as_ref().map(|(a, _)| *a).map_err(|e| format!("{e:#}")));
            // Keep the stream open until the run ends.
            r.map(|(_, link)| link)
        }));
    }
    drop(tx);
    start.wait().await;
    let t0 = Instant::now();
    let mut arrivals = Vec::with_capacity(agents);
    for _ in 0..agents {
        let r = tokio::time::timeout(TIMEOUT, rx.recv())
            .await
            .context("an agent not welcomed in time")?
            .ok_or_else(|| anyhow!("agents gone"))?;
        arrivals.push(r.map_err(|e| anyhow!("an agent failed: {e}"))?);
    }
    let wall = t0.elapsed();
    for h in held {
        h.abort();
    }
    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), server).await;
    Ok((wall, arrivals))
}

/// An agent's open stream (kept so the controller keeps it).
struct Link {
    _tx: mpsc::Sender<wire::AgentMessage>,
    _rx: tonic::Streaming<wire::ControllerMessage>,
}

/// Dial and say hello until welcomed, backing off after each refusal.
async fn agent(ix: usize, url: &str, retry: Retry, start: Arc<Barrier>) -> Result<(Arrival, Link)> {
    let channel = tonic::transport::Endpoint::from_shared(url.to_owned())?
        .connect_timeout(Duration::from_secs(30))
        .connect_lazy();
    let mut backoff = Backoff::new(BackoffConfig::default());
    // Seeded per agent: runs are comparable, agents still independent.
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(ix as u64);
    start.wait().await;
    let t0 = Instant::now();
    let mut refused = 0u32;
    loop {
        let opened = Instant::now();
        match hello(ix, channel.clone()).await {
            Ok(link) => {
                return Ok((
                    Arrival {
                        total: t0.elapsed(),
                        hello: opened.elapsed(),
                        refused,
                    },
                    link,
                ));
            }
            // Refused over the rate (UNAVAILABLE), or the connection
            // itself failed (a listen backlog overflowing resets it): a
            // real agent backs off from both alike.
            Err(status)
                if matches!(
                    status.code(),
                    tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled
                ) =>
            {
                refused += 1;
                let slot = status
                    .metadata()
                    .get(baton_server::RETRY_AFTER_MS)
                    .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
                    .map(Duration::from_millis);
                let wait = match (retry, slot) {
                    (Retry::Slot, Some(h)) => {
                        let spread = (h / 10).min(Duration::from_secs(1));
                        h + spread.mul_f64(rand::Rng::random::<f64>(&mut rng))
                    }
                    (Retry::Ceiling, _) => {
                        let ceiling = backoff.ceiling();
                        backoff.next_delay(t0.elapsed(), &mut rng);
                        ceiling
                    }
                    _ => backoff.next_delay(t0.elapsed(), &mut rng),
                };
                tokio::time::sleep(wait).await;
            }
            Err(status) => bail!("agent {ix}: {status}"),
        }
    }
}

async fn hello(ix: usize, channel: tonic::transport::Channel) -> Result<Link, tonic::Status> {
    let mut client = LinkClient::new(channel);
    let (tx, rx) = mpsc::channel(8);
    let hello = wire::Hello {
        agent_id: format!("storm-{ix:05}"),
        journal_id: format!("journal-{ix:05}"),
        agent_version: "storm-bench".into(),
        ..Default::default()
    };
    let _ = tx
        .send(wire::AgentMessage {
            body: Some(In::Hello(hello)),
        })
        .await;
    let mut rx = client.connect(ReceiverStream::new(rx)).await?.into_inner();
    loop {
        match rx.message().await? {
            Some(wire::ControllerMessage {
                body: Some(Out::Welcome(_)),
            }) => return Ok(Link { _tx: tx, _rx: rx }),
            Some(wire::ControllerMessage {
                body: Some(Out::Ping(p)),
            }) => {
                let _ = tx
                    .send(wire::AgentMessage {
                        body: Some(In::Pong(wire::Pong { id: p.id })),
                    })
                    .await;
            }
            Some(_) => {}
            None => return Err(tonic::Status::unavailable("stream ended before a welcome")),
        }
    }
}
