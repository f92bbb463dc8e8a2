//! A fleet against the real controller: 1 000 simulated agents, each on
//! its own TCP connection and Link stream, in this process; the controller
//! (`target/release/baton-controller`, built here first) in its own
//! process, so its memory is read from `/proc/PID/status` and is its own.
//!
//! Figures:
//! - **A**: controller RSS per connected agent, (RSS with every agent
//!   welcomed − RSS before any agent) / agents, read 13 s after the last
//!   welcome (past the runtime's blocking-pool keep-alive; the reading 1 s
//!   after is printed too); **A'** is the same once the rounds are done,
//!   agents still connected: what a fleet that talks costs;
//! - **B**: push → acked latency per agent, from just before the Admin
//!   `Push` call to the delivery's `updated_ns` (the controller's clock, on
//!   this machine, stamped when it handled the agent's ack), p50 / p99 /
//!   max; the agents' own send instant of their ack is shown beside it;
//! - **C**: feedback rows stored per second, every agent sending batches
//!   of 64 rows (at most [`WINDOW`] unacknowledged) until its last
//!   cumulative ack, beside bare batched SQLite inserts of the same rows
//!   (`common::Bare`, shared with `store_ingest`) in the same run.
//!
//! The push and ingest phases run [`ROUNDS`] times; best and median are
//! reported, as a Markdown table and one JSON line.
//!
//! `cargo bench -p baton-controller --bench fleet`. Knobs (environment):
//! `FLEET_AGENTS` (1000), `FLEET_BATCHES` (batches per agent per round,
//! 4), `FLEET_WINDOW` (4), `FLEET_ROUNDS` (3), `FLEET_CONTROLLER` (a
//! controller binary, or a wrapper script that `exec`s one, to use instead
//! of building one: for experiments and profilers), `FLEET_HOLD_S` (after
//! the rounds, keep every agent connected this long and print the
//! controller's pid: time to attach gdb, perf or a heap profiler),
//! `FLEET_TOP_STATEMENTS` (with PostgreSQL: the statements that took
//! the most server time in each push round),
//! `FLEET_MODES` (`plain,tls`: the whole bench once per mode, in this
//! order, each with a fresh controller; `tls` is mTLS with certificates
//! from the controller's own CA code, one per agent, and a table of the
//! modes side by side at the end; `pg` is plaintext with the store in
//! PostgreSQL, a cluster this bench starts with the server's durable
//! defaults (`fsync`, `synchronous_commit` on), `baton_testpg`; the
//! statements it is sent are counted by the server, `pg_stat_statements`).
//!
//! Two modes end with a **failover** (D, `failover.rs`) and a push round
//! after it, both with the serve defaults' admission bound (500 sessions
//! a second, burst 100) where the other modes serve unbounded:
//! `single` is one controller on SQLite, killed with `kill -9` and started
//! again at once on the same address and store (a supervisor's restart);
//! `replicas` is three replicas on one PostgreSQL database
//! (`--replica-id r0..r2`), the agents spread over them (`sim-N` homed on
//! replica N mod 3), pushes through r0, r2 killed and its agents moving to
//! the survivors. `FLEET_MODES=single,replicas` compares the two.
//!
//! The simulated agents are `agents.rs`: they answer as an agent does,
//! and dial again with the agent's own failover rules when their
//! controller goes away; the figures are the controllers'.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use baton_proto::wire::{self, admin_client::AdminClient, agent_message::Body as In};
use baton_server::convert;
use baton_store::FeedbackRow;
use tokio::sync::oneshot;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use agents::{
    Batches, Cmd, Fleet, agent_id, entry, journal_id, msg, now_ns, pack_yaml, unexpected,
};
use controller::{Controller, Cpu, Serve, build_controller, loadavg, smaps, status_of};
use failover::FailoverFig;
use statements::Statements;

mod agents;
#[path = "../common/mod.rs"]
mod common;
mod controller;
mod failover;
mod statements;

/// Simulated agents.
const AGENTS: usize = 1_000;
/// Entries per feedback batch.
const ROWS_PER_BATCH: usize = 64;
/// Batches per agent per ingest round (1 000 × 4 × 64 = 256 000 rows).
const BATCHES: usize = 4;
/// Unacknowledged batches an agent may have out.
const WINDOW: usize = 4;
/// Push and ingest rounds.
const ROUNDS: usize = 3;
/// Agents connecting at once (a fleet coming up, not a SYN flood).
pub const CONNECTING: usize = 64;
/// Largest message either side accepts (the controller's own limit).
pub const MAX_MESSAGE: usize = 16 * 1024 * 1024;
/// Any single wait of the bench (a connect, a phase) longer than this is
/// a failure, not a figure.
pub const PHASE_TIMEOUT: Duration = Duration::from_secs(300);
/// Scheduled instant of the first feedback entry (ns since the epoch):
/// when the bench started, as an agent's entries are scheduled about
/// now (so on PostgreSQL they land in today's partition, as a site's).
pub fn t_base() -> i64 {
    static BASE: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    *BASE.get_or_init(now_ns)
}

const TARGET_RSS_KB: f64 = 100.0;
const TARGET_P99_MS: f64 = 1000.0;
const TARGET_ROWS_S: f64 = 50_000.0;

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fleet bench failed: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Knobs {
    agents: usize,
    batches: usize,
    window: usize,
    rounds: usize,
}

fn env_or(name: &str, default: usize) -> Result<usize> {
    match std::env::var(name) {
        Ok(v) => v.parse().with_context(|| format!("{name}={v}")),
        Err(_) => Ok(default),
    }
}

fn run() -> Result<()> {
    let k = Knobs {
        agents: fleet_size(env_or("FLEET_AGENTS", AGENTS)?)?,
        batches: env_or("FLEET_BATCHES", BATCHES)?.max(1),
        window: env_or("FLEET_WINDOW", WINDOW)?.max(1),
        rounds: env_or("FLEET_ROUNDS", ROUNDS)?.max(1),
    };
    let modes = modes()?;
    let exe = match std::env::var_os("FLEET_CONTROLLER") {
        Some(p) => PathBuf::from(p),
        None => build_controller()?,
    };
    // On the target's disk, not a tmpfs: fsync has to cost what it costs.
    let base = Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(base)?;
    let ca_dir = tempfile::tempdir_in(base)?;
    let tls = if modes.contains(&Mode::Tls) {
        let t0 = Instant::now();
        let t = Arc::new(Tls::make(ca_dir.path(), k.agents)?);
        println!(
            "mTLS: a CA and {} agent certificates in {:.1} s",
            k.agents,
            t0.elapsed().as_secs_f64()
        );
        Some(t)
    } else {
        None
    };
    let mut done = Vec::new();
    for mode in modes {
        let tls = if mode == Mode::Tls { tls.clone() } else { None };
        let store = match mode.postgres() {
            true => Some(baton_testpg::durable_database(base).with_context(|| {
                format!(
                    "FLEET_MODES {} needs PostgreSQL (Debian's postgresql)",
                    mode.name()
                )
            })?),
            false => None,
        };
        let (report, summary) = run_mode(k, mode, &exe, base, tls, store.as_deref())?;
        println!("{report}");
        done.push((mode, summary));
    }
    if done.len() > 1 {
        println!("{}", compare(k, &done));
    }
    Ok(())
}

/// `asked` agents, if this process may hold their connections: each is
/// a file descriptor here (and one in the controller, whose limit is the
/// same), so the open-files limit bounds the fleet (`ulimit -n`).
fn fleet_size(asked: usize) -> Result<usize> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit(2) writes the struct we pass and nothing else.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        bail!("getrlimit: {}", std::io::Error::last_os_error());
    }
    // Descriptors besides the agents': the runtime, logs, the store.
    let most = usize::try_from(lim.rlim_cur)
        .unwrap_or(usize::MAX)
        .saturating_sub(512);
    if asked > most {
        bail!(
            "FLEET_AGENTS={asked}: this process may open {} files, so at most {most} agents (raise `ulimit -n`)",
            lim.rlim_cur
        );
    }
    Ok(asked.max(1))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Plain,
    Tls,
    Postgres,
    /// One controller on SQLite, admission bound, a failover by restart.
    Single,
    /// Three replicas on PostgreSQL, admission bound, a failover.
    Replicas,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Plain => "plaintext",
            Mode::Tls => "mTLS",
            Mode::Postgres => "plaintext, store in PostgreSQL",
            Mode::Single => "one controller on SQLite, restarted",
            Mode::Replicas => "three replicas on PostgreSQL, one killed",
        }
    }

    /// Whether the mode's store is in PostgreSQL.
    fn postgres(self) -> bool {
        matches!(self, Mode::Postgres | Mode::Replicas)
    }

    /// How many controllers serve the fleet.
    fn controllers(self) -> usize {
        if self == Mode::Replicas { 3 } else { 1 }
    }

    /// Whether the mode ends with a failover (and serves with the
    /// admission bound a failover meets).
    fn failover(self) -> bool {
        matches!(self, Mode::Single | Mode::Replicas)
    }
}

fn modes() -> Result<Vec<Mode>> {
    let v = std::env::var("FLEET_MODES").unwrap_or_else(|_| "plain,tls".into());
    v.split(',')
        .map(|m| match m.trim() {
            "plain" => Ok(Mode::Plain),
            "tls" => Ok(Mode::Tls),
            "pg" => Ok(Mode::Postgres),
            "single" => Ok(Mode::Single),
            "replicas" => Ok(Mode::Replicas),
            other => bail!("FLEET_MODES: `{other}` is not plain, tls, pg, single or replicas"),
        })
        .collect()
}

/// One mode's figures for the comparison.
#[derive(Clone, Debug)]
struct Summary {
    p99: (f64, f64),
    p50: (f64, f64),
    rows: (f64, f64),
    /// CPU seconds (controllers and database) per 1 000 rows stored,
    /// best and median.
    cpu_per_k: (f64, f64),
    rss_per_agent: f64,
    connect_s: f64,
    /// Statements per agent in a push, per feedback batch (PostgreSQL).
    statements: (Option<f64>, Option<f64>),
    /// The failover, and the push after it.
    failover: Option<(FailoverFig, PushFig)>,
}

/// The bench against fresh controllers, as `mode` says.
fn run_mode(
    k: Knobs,
    mode: Mode,
    exe: &Path,
    base: &Path,
    tls: Option<Arc<Tls>>,
    store: Option<&str>,
) -> Result<(String, Summary)> {
    // Spawned from this (the main) thread: the child's parent-death signal
    // follows the thread that forked it. A failover's restart is spawned
    // from the runtime's thread: it outlives that thread only as long as
    // the runtime, which ends before this function does.
    let n = mode.controllers();
    let mut ctls = (0..n)
        .map(|i| {
            let serve = Serve {
                store: store.map(str::to_owned),
                replica: (n > 1).then(|| format!("r{i}")),
                admit: mode.failover(),
                // Every agent may end up on one controller (a failover).
                max_connections: k.agents + 256,
            };
            Controller::start(exe, base, tls.as_deref(), serve)
        })
        .collect::<Result<Vec<_>>>()?;
    let bare_dir = tempfile::tempdir_in(base)?;
    println!(
        "fleet ({}): {} agents, {} controller(s) {} (pids {:?}), data under {}, load {}",
        mode.name(),
        k.agents,
        n,
        exe.display(),
        ctls.iter().map(|c| c.pid).collect::<Vec<_>>(),
        base.display(),
        loadavg()
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("fleet")
        .enable_all()
        .build()?;
    let r = rt.block_on(async {
        tokio::select! {
            r = bench(k, mode, &mut ctls, bare_dir.path(), tls) => r,
            _ = tokio::signal::ctrl_c() => Err(anyhow!("interrupted")),
        }
    });
    // Agents first (their tasks end with the runtime), then the
    // controllers, then their directories (dropped after they are dead).
    rt.shutdown_timeout(Duration::from_secs(2));
    let mut ended = Vec::new();
    for (i, c) in ctls.into_iter().enumerate() {
        let log = c.log();
        let stopped = c.stop();
        let noisy: Vec<String> = log
            .lines()
            .filter(|l| l.contains("WARN") || l.contains("ERROR"))
            .map(str::to_owned)
            .collect();
        ended.push((i, stopped, noisy));
    }
    drop(bare_dir);
    if r.is_err() {
        // What the controllers said before their directories go: the
        // first lines (what went wrong first) and the last (the agents'
        // streams ending as the bench stops is only the aftermath).
        for (i, _, noisy) in &ended {
            let first = noisy.len().min(10);
            for l in &noisy[..first] {
                eprintln!("controller {i}: {l}");
            }
            if noisy.len() > first {
                eprintln!("controller {i}: … {} more, the last:", noisy.len() - first);
                let last = noisy.len().saturating_sub(5).max(first);
                for l in &noisy[last..] {
                    eprintln!("controller {i}: {l}");
                }
            }
        }
    }
    let report = r?;
    for (i, stopped, noisy) in ended {
        println!(
            "controller {i}: {}; {} warning/error lines in its log{}",
            stopped?,
            noisy.len(),
            noisy
                .iter()
                .take(5)
                .map(|l| format!("\n  {l}"))
                .collect::<String>()
        );
    }
    Ok(report)
}

/// The fleet's certificates (made once, used by every mTLS run): the
/// controller's CA directory, an admin operator, one agent each.
pub(crate) struct Tls {
    pub dir: PathBuf,
    ca_pem: Vec<u8>,
    admin: (Vec<u8>, Vec<u8>),
    pub agents: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Tls {
    fn make(dir: &Path, agents: usize) -> Result<Tls> {
        use baton_pki::ca::{self, CaDir, Validity};
        let ca = CaDir::new(dir);
        let now = jiff::Timestamp::now();
        ca::init(&ca, &[], now)?;
        let read = |i: ca::Issued| -> Result<(Vec<u8>, Vec<u8>)> {
            Ok((std::fs::read(i.cert)?, std::fs::read(i.key)?))
        };
        let valid = Validity::days(now, 1);
        let admin = read(ca::issue(
            &ca,
            &baton_pki::identity::Identity::Operator {
                name: "bench".into(),
                tenant: "default".into(),
                role: baton_pki::identity::Role::Admin,
            },
            valid,
            ca::Existing::Refuse,
        )?)?;
        let agents = (0..agents)
            .map(|ix| {
                read(ca::issue(
                    &ca,
                    &baton_pki::identity::Identity::Agent {
                        id: agent_id(ix),
                        tenants: Vec::new(),
                    },
                    valid,
                    ca::Existing::Refuse,
                )?)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Tls {
            dir: dir.to_path_buf(),
            ca_pem: std::fs::read(ca.ca_cert())?,
            admin,
            agents,
        })
    }

    pub fn client(&self, (cert, key): &(Vec<u8>, Vec<u8>)) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca_pem))
            .identity(Identity::from_pem(cert, key))
    }
}

/// An endpoint to the controller, over mTLS as `who` when given.
pub fn endpoint(url: &str, tls: Option<ClientTlsConfig>) -> Result<Endpoint> {
    let e = Endpoint::from_shared(url.to_string())?;
    Ok(match tls {
        Some(t) => e.tls_config(t)?,
        None => e,
    })
}

/// Plaintext against mTLS, as a Markdown table.
fn compare(k: Knobs, done: &[(Mode, Summary)]) -> String {
    let mut s = format!(
        "\n### the modes side by side: {} agents, {} rounds per mode, in this order: {}\n\n| mode | push → acked p50 (best / median) | p99 (best / median) | feedback rows/s (best / median) | CPU s per 1 000 rows, controllers + database (best / median) | RSS per agent | connect all | statements per agent pushed / per feedback batch | failover: moved agents welcomed p50 / p99 / all | push after it p50 / p99 |\n|---|---|---|---|---|---|---|---|---|---|\n",
        k.agents,
        k.rounds,
        done.iter()
            .map(|(m, _)| m.name())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let opt = |x: Option<f64>| x.map_or_else(|| "—".to_string(), |v| format!("{v:.2}"));
    for (m, x) in done {
        let (failover, after) = match &x.failover {
            Some((f, p)) => (
                format!(
                    "{} agents: {:.2} / {:.2} / {:.2} s",
                    f.moved, f.p50, f.p99, f.all
                ),
                format!("{:.0} / {:.0} ms", p.p50, p.p99),
            ),
            None => ("—".into(), "—".into()),
        };
        s.push_str(&format!(
            "| {} | {:.0} / {:.0} ms | {:.0} / {:.0} ms | {:.0} / {:.0} | {:.4} / {:.4} | {:.1} KB | {:.2} s | {} / {} | {failover} | {after} |\n",
            m.name(),
            x.p50.0,
            x.p50.1,
            x.p99.0,
            x.p99.1,
            x.rows.0,
            x.rows.1,
            x.cpu_per_k.0,
            x.cpu_per_k.1,
            x.rss_per_agent,
            x.connect_s,
            opt(x.statements.0),
            opt(x.statements.1),
        ));
    }
    let json: Vec<serde_json::Value> = done
        .iter()
        .map(|(m, x)| {
            serde_json::json!({
                "mode": m.name(), "p50_ms": [x.p50.0, x.p50.1], "p99_ms": [x.p99.0, x.p99.1],
                "rows_s": [x.rows.0.round(), x.rows.1.round()],
                "cpu_s_per_1000_rows": [x.cpu_per_k.0, x.cpu_per_k.1],
                "rss_per_agent_kb": x.rss_per_agent, "connect_s": x.connect_s,
                "statements_per_push_agent": x.statements.0,
                "statements_per_feedback_batch": x.statements.1,
                "failover_all_s": x.failover.as_ref().map(|(f, _)| f.all),
            })
        })
        .collect();
    s.push_str(&format!(
        "\n{}",
        serde_json::json!({"bench": "fleet-modes", "modes": json})
    ));
    s
}

fn ms(ns: i64) -> f64 {
    ns as f64 / 1e6
}

/// Nearest-rank percentile of sorted values.
fn pct(sorted: &[i64], q: f64) -> i64 {
    pct_of(sorted, q).unwrap_or(0)
}

/// [`pct`] of durations.
pub fn pct_d(sorted: &[Duration], q: f64) -> Duration {
    pct_of(sorted, q).unwrap_or_default()
}

/// Nearest rank; `None` of nothing.
fn pct_of<T: Copy>(sorted: &[T], q: f64) -> Option<T> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

#[derive(Clone, Copy, Debug, Default)]
struct PushFig {
    /// Controller-stamped ack instant − just before Push (ms).
    p50: f64,
    p99: f64,
    max: f64,
    /// Agent's ack send instant − just before Push (ms).
    agent_p50: f64,
    agent_p99: f64,
    agent_max: f64,
    /// With replicas, the agents' send p50 and p99 (ms): those of the
    /// replica pushed through, then the others'.
    by_replica: Option<[(f64, f64); 2]>,
    /// The Push call itself (ms).
    call: f64,
    /// Until Deliveries showed every ack stored (ms).
    all_stored: f64,
    ctl_cpu: f64,
    bench_cpu: f64,
    /// Statements PostgreSQL ran per agent (its ack and its held), the
    /// push's own included.
    statements: Option<f64>,
}

async fn push_round(
    admin: &mut AdminClient<Channel>,
    fleet: &mut Fleet,
    ctls: &[Controller],
    agents: usize,
    version: u64,
    stmts: Option<&Statements>,
) -> Result<PushFig> {
    if let Some(s) = stmts {
        s.reset().await?;
    }
    let cpu = Cpu::start(ctls)?;
    fleet.check()?;
    let t0_ns = now_ns();
    let t0 = Instant::now();
    let reply = admin
        .push(wire::PushRequest {
            yaml: pack_yaml(version),
            source_name: "bench.yaml".into(),
        })
        .await
        .context("Admin.Push")?
        .into_inner();
    let call = t0.elapsed();
    if reply.unchanged || reply.agents.len() != agents {
        bail!(
            "push v{version}: unchanged={} for {} agents, expected {agents}",
            reply.unchanged,
            reply.agents.len()
        );
    }
    let until = Instant::now() + PHASE_TIMEOUT;
    let mut agent_lat = Vec::with_capacity(agents);
    // The agents of the replica pushed through, and the others'.
    let (mut here, mut elsewhere) = (Vec::new(), Vec::new());
    while agent_lat.len() < agents {
        let (v, acked_ns, via) = fleet.next_event(until).await?;
        if v != version {
            bail!("agent acked v{v} during the push of v{version}");
        }
        agent_lat.push(acked_ns - t0_ns);
        match via {
            0 => here.push(acked_ns - t0_ns),
            _ => elsewhere.push(acked_ns - t0_ns),
        }
    }
    here.sort_unstable();
    elsewhere.sort_unstable();
    // Every agent has sent its ack: wait until the controller stored them.
    let (ds, all_stored) = loop {
        let mut ds = Vec::with_capacity(agents);
        let mut after = String::new();
        loop {
            let page = admin
                .deliveries(wire::DeliveriesRequest {
                    tenant: "default".into(),
                    pack: "bench".into(),
                    version,
                    after: after.clone(),
                    limit: 0,
                })
                .await
                .context("Admin.Deliveries")?
                .into_inner();
            ds.extend(page.deliveries);
            if page.next.is_empty() {
                break;
            }
            after = page.next;
        }
        let acked = ds
            .iter()
            .filter(|d| d.state == wire::DeliveryState::Acked as i32)
            .count();
        if acked == agents {
            break (ds, t0.elapsed());
        }
        if Instant::now() > until {
            bail!("only {acked} of {agents} deliveries acked");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let (ctl_cpu, bench_cpu) = cpu.done()?;
    let statements = match stmts {
        Some(s) => Some(s.count().await? as f64 / agents as f64),
        None => None,
    };
    if let Some(s) = stmts.filter(|_| std::env::var_os("FLEET_TOP_STATEMENTS").is_some()) {
        for (calls, ms, q) in s.top(12).await? {
            println!("  push v{version}: {calls:>6} calls {ms:>9.1} ms  {q}");
        }
    }
    let mut lat: Vec<i64> = ds.iter().map(|d| d.updated_ns - t0_ns).collect();
    lat.sort_unstable();
    agent_lat.sort_unstable();
    Ok(PushFig {
        p50: ms(pct(&lat, 0.50)),
        p99: ms(pct(&lat, 0.99)),
        max: ms(pct(&lat, 1.0)),
        agent_p50: ms(pct(&agent_lat, 0.50)),
        agent_p99: ms(pct(&agent_lat, 0.99)),
        agent_max: ms(pct(&agent_lat, 1.0)),
        by_replica: (!elsewhere.is_empty())
            .then(|| [&here, &elsewhere].map(|l| (ms(pct(l, 0.50)), ms(pct(l, 0.99))))),
        call: call.as_secs_f64() * 1e3,
        all_stored: all_stored.as_secs_f64() * 1e3,
        ctl_cpu,
        bench_cpu,
        statements,
    })
}

#[derive(Clone, Copy, Debug, Default)]
struct IngestFig {
    rows_s: f64,
    bare_rows_s: f64,
    ctl_cpu: f64,
    /// The database server's, where there is one.
    db_cpu: Option<f64>,
    bench_cpu: f64,
    /// Statements PostgreSQL ran per feedback batch (64 rows).
    statements: Option<f64>,
}

/// Per agent, this round's batches (with each one's last seq), and the
/// rows the controller stores for them, batch-major across agents (the
/// order they arrive in) for the bare baseline.
fn workload(k: Knobs, round: usize, version: u64) -> Result<(Vec<Batches>, Vec<FeedbackRow>)> {
    let received = now_ns();
    let per_agent = (k.batches * ROWS_PER_BATCH) as u64;
    let first = (round as u64 - 1) * per_agent + 1;
    let mut msgs = Vec::with_capacity(k.agents);
    let mut rows = vec![Vec::with_capacity(k.agents); k.batches];
    for ix in 0..k.agents {
        let (id, journal) = (agent_id(ix), journal_id(ix));
        let mut batches = Vec::with_capacity(k.batches);
        for (b, rows_b) in rows.iter_mut().enumerate() {
            let lo = first + (b * ROWS_PER_BATCH) as u64;
            let entries: Vec<wire::Feedback> = (lo..lo + ROWS_PER_BATCH as u64)
                .map(|s| entry(ix, s, version))
                .collect();
            for e in &entries {
                rows_b.push(
                    convert::feedback(&id, &journal, e, received)
                        .map_err(|e| anyhow!("bench row refused: {e}"))?,
                );
            }
            let last = lo + ROWS_PER_BATCH as u64 - 1;
            batches.push((last, msg(In::Feedback(wire::FeedbackBatch { entries }))));
        }
        msgs.push(batches);
    }
    Ok((msgs, rows.into_iter().flatten().collect()))
}

async fn ingest_round(
    fleet: &mut Fleet,
    ctls: &[Controller],
    bare: &mut Option<common::Bare>,
    k: Knobs,
    round: usize,
    version: u64,
    stmts: Option<&Statements>,
) -> Result<IngestFig> {
    let (msgs, rows) = workload(k, round, version)?;
    let total = rows.len();
    fleet.check()?;
    if let Some(s) = stmts {
        s.reset().await?;
    }
    let cpu = Cpu::start(ctls)?;
    let db0 = stmts.map(Statements::server_cpu).transpose()?;
    let mut done = Vec::with_capacity(k.agents);
    let start = Instant::now();
    for (tx, batches) in fleet.cmds.iter().zip(msgs) {
        let (d_tx, d_rx) = oneshot::channel();
        tx.send(Cmd::Ingest {
            batches,
            window: k.window,
            done: d_tx,
        })
        .map_err(|_| anyhow!("an agent task is gone"))?;
        done.push(d_rx);
    }
    let until = Instant::now() + PHASE_TIMEOUT;
    let mut last = start;
    for d in done {
        let t = tokio::select! {
            t = tokio::time::timeout_at(until.into(), d) => t
                .context("timed out waiting for feedback acks")?
                .map_err(|_| anyhow!("an agent task ended during ingest"))?,
            // An agent that failed never answers: say why now.
            ev = fleet.events.recv() => match ev {
                Some(ev) => return Err(unexpected(ev)),
                None => bail!("every agent task ended"),
            },
        };
        last = last.max(t);
    }
    let took = last - start;
    let (ctl_cpu, bench_cpu) = cpu.done()?;
    let db_cpu = match (stmts, db0) {
        (Some(s), Some(t0)) => Some((s.server_cpu()? - t0).as_secs_f64()),
        _ => None,
    };
    let statements = match stmts {
        Some(s) => Some(s.count().await? as f64 / (k.agents * k.batches) as f64),
        None => None,
    };
    let stored = ctls[0].stored_feedback().await?;
    let want = (round * total) as i64;
    if stored != want {
        bail!("controller stored {stored} feedback rows, expected {want}");
    }

    // The same rows, bare, while the controller idles.
    let mut b = match bare.take() {
        Some(b) => b,
        None => bail!("bare baseline not open"),
    };
    let (b, bare_took) = tokio::task::spawn_blocking(move || {
        let r = b.insert(rows.iter()).map_err(|e| anyhow!(e));
        (b, r)
    })
    .await?;
    *bare = Some(b);
    let bare_took = bare_took?;
    Ok(IngestFig {
        rows_s: total as f64 / took.as_secs_f64(),
        bare_rows_s: total as f64 / bare_took.as_secs_f64(),
        ctl_cpu,
        db_cpu,
        bench_cpu,
        statements,
    })
}

#[derive(Clone, Copy, Debug, Default)]
struct Memory {
    rss_before_kb: u64,
    rss_connected_kb: u64,
    rss_settled_kb: u64,
    rss_end_kb: u64,
    hwm_end_kb: u64,
    threads_connected: u64,
    threads_settled: u64,
    connect_s: f64,
}

async fn bench(
    k: Knobs,
    mode: Mode,
    ctls: &mut [Controller],
    bare_dir: &Path,
    tls: Option<Arc<Tls>>,
) -> Result<(String, Summary)> {
    let admin_ch = endpoint(&ctls[0].url, tls.as_ref().map(|t| t.client(&t.admin)))?
        .connect()
        .await
        .context("admin connection")?;
    let mut admin = AdminClient::new(admin_ch)
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE);
    admin
        .list_agents(wire::ListAgentsRequest::default())
        .await
        .context("Admin.ListAgents")?;
    let stmts = match ctls[0].store() {
        Some(url) => Some(Statements::open(url).await?),
        None => None,
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut mem = Memory {
        rss_before_kb: status_of(ctls)?.0,
        ..Memory::default()
    };

    let t0 = Instant::now();
    let urls: Vec<String> = ctls.iter().map(|c| c.url.clone()).collect();
    let mut fleet = Fleet::connect(&urls, k.agents, tls).await?;
    mem.connect_s = t0.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(1)).await;
    fleet.check()?;
    let (rss, _, threads) = status_of(ctls)?;
    mem.rss_connected_kb = rss;
    mem.threads_connected = threads;
    // Past the runtime's blocking-pool keep-alive (10 s): what stays.
    tokio::time::sleep(Duration::from_secs(12)).await;
    fleet.check()?;
    let (rss, _, threads) = status_of(ctls)?;
    mem.rss_settled_kb = rss;
    mem.threads_settled = threads;
    let per_agent = |rss: u64| (rss as f64 - mem.rss_before_kb as f64) / k.agents as f64;
    println!(
        "connect: {} agents welcomed in {:.2} s | controllers' RSS {} kB before, {} kB connected (+1 s, {} threads), {} kB settled (+13 s, {} threads; first: {}) | {:.1} / {:.1} kB per agent",
        k.agents,
        mem.connect_s,
        mem.rss_before_kb,
        mem.rss_connected_kb,
        mem.threads_connected,
        mem.rss_settled_kb,
        mem.threads_settled,
        smaps(ctls[0].pid),
        per_agent(mem.rss_connected_kb),
        per_agent(mem.rss_settled_kb),
    );

    let mut bare = Some(common::Bare::open(bare_dir).map_err(|e| anyhow!(e))?);
    let total = k.agents * k.batches * ROWS_PER_BATCH;
    let mut pushes = Vec::new();
    let mut ingests = Vec::new();
    for round in 1..=k.rounds {
        let version = round as u64;
        let p = push_round(
            &mut admin,
            &mut fleet,
            ctls,
            k.agents,
            version,
            stmts.as_ref(),
        )
        .await?;
        println!("round {round} push v{version}: {}", p.line());
        pushes.push(p);
        let i = ingest_round(
            &mut fleet,
            ctls,
            &mut bare,
            k,
            round,
            version,
            stmts.as_ref(),
        )
        .await?;
        println!(
            "round {round} ingest: {total} rows, controller {:.0} rows/s | bare sqlite {:.0} rows/s | controller/bare {:.2} | CPU controllers {:.2} s{}, bench {:.2} s | CPU s per 1 000 rows stored: {:.4}{}",
            i.rows_s,
            i.bare_rows_s,
            i.rows_s / i.bare_rows_s,
            i.ctl_cpu,
            i.db_cpu
                .map(|d| format!(", database {d:.2} s"))
                .unwrap_or_default(),
            i.bench_cpu,
            (i.ctl_cpu + i.db_cpu.unwrap_or(0.0)) * 1000.0 / total as f64,
            per_event(i.statements, "feedback batch")
        );
        ingests.push(i);
    }
    fleet.check()?;
    let (rss_hot, _, _) = status_of(ctls)?;
    // Settled, as A is: past the controller's quiet moment after a burst
    // (it gives freed heap back then) and the runtime's thread keep-alive.
    tokio::time::sleep(Duration::from_secs(13)).await;
    fleet.check()?;
    let (rss, hwm, _) = status_of(ctls)?;
    println!("after the rounds: controllers' RSS {rss_hot} kB at once, {rss} kB settled (+13 s)");
    mem.rss_end_kb = rss;
    mem.hwm_end_kb = hwm;
    if let Ok(h) = std::env::var("FLEET_HOLD_S") {
        println!(
            "holding {h} s (pids {:?})",
            ctls.iter().map(|c| c.pid).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_secs(h.parse()?)).await;
        println!("after hold: RSS {} kB", status_of(ctls)?.0);
    }

    let mut after = None;
    if mode.failover() {
        let f = failover::failover(&mut fleet, ctls, k.agents, stmts.as_ref(), &mut admin).await?;
        println!("failover: {}", f.line());
        // The fleet whole again: one more push to every agent, through the
        // first controller (a survivor, or the one restarted).
        let version = k.rounds as u64 + 1;
        let p = push_round(
            &mut admin,
            &mut fleet,
            ctls,
            k.agents,
            version,
            stmts.as_ref(),
        )
        .await?;
        println!("push v{version} after the failover: {}", p.line());
        after = Some((f, p));
    }

    let unclean = fleet.close().await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_closed = status_of(ctls)?.0;
    println!(
        "end: controllers' RSS {} kB with {} agents connected after the rounds, peak {} kB; {} kB once they closed ({} streams did not end cleanly)",
        mem.rss_end_kb, k.agents, mem.hwm_end_kb, rss_closed, unclean
    );
    if unclean > 0 {
        bail!("{unclean} agents' streams did not end cleanly");
    }
    let stored = common::count(bare_dir).map_err(|e| anyhow!(e))?;
    if stored != (k.rounds * total) as i64 {
        bail!("bare baseline stored {stored} rows");
    }
    let p = |f: fn(&PushFig) -> f64| best_median(pushes.iter().map(f), true);
    let summary = Summary {
        p50: p(|x| x.p50),
        p99: p(|x| x.p99),
        rows: best_median(ingests.iter().map(|x| x.rows_s), false),
        cpu_per_k: best_median(
            ingests
                .iter()
                .map(|x| (x.ctl_cpu + x.db_cpu.unwrap_or(0.0)) * 1000.0 / total as f64),
            true,
        ),
        rss_per_agent: (mem.rss_settled_kb as f64 - mem.rss_before_kb as f64) / k.agents as f64,
        connect_s: mem.connect_s,
        statements: (
            pushes.iter().filter_map(|x| x.statements).reduce(f64::min),
            ingests.iter().filter_map(|x| x.statements).reduce(f64::min),
        ),
        failover: after.clone(),
    };
    Ok((report(k, &mem, &pushes, &ingests, after.as_ref()), summary))
}

/// ", N statements per EVENT" when PostgreSQL counted them.
fn per_event(statements: Option<f64>, event: &str) -> String {
    statements.map_or_else(String::new, |s| format!(" | {s:.2} statements per {event}"))
}

impl PushFig {
    fn line(&self) -> String {
        format!(
            "acked (controller stamp) p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms | agent send p50 {:.1} / p99 {:.1} / max {:.1} ms{} | Push call {:.1} ms, all stored visible {:.1} ms | CPU controllers {:.2} s, bench {:.2} s{}",
            self.p50,
            self.p99,
            self.max,
            self.agent_p50,
            self.agent_p99,
            self.agent_max,
            self.by_replica.map_or_else(String::new, |[(h50, h99), (e50, e99)]| format!(
                " (the replica pushed through: p50 {h50:.1} / p99 {h99:.1}; the others: {e50:.1} / {e99:.1})"
            )),
            self.call,
            self.all_stored,
            self.ctl_cpu,
            self.bench_cpu,
            per_event(self.statements, "agent")
        )
    }
}

impl FailoverFig {
    fn line(&self) -> String {
        format!(
            "{} agents moved: welcomed p50 {:.2} s, p99 {:.2} s, all {:.2} s after the kill{}; the store showing every agent connected to a live controller {:.2} s; {} refused or failed attempts; {} pushes re-sent{}",
            self.moved,
            self.p50,
            self.p99,
            self.all,
            self.restart
                .map_or_else(String::new, |r| format!(" (restarted, listening {r:.2} s)")),
            self.recorded,
            self.refused,
            self.repushed,
            per_event(self.statements_per_agent, "moved agent")
        )
    }
}

// ---------------------------------------------------------------------------
// Report.

/// Best (by `better`) and median of a figure over the rounds.
fn best_median(xs: impl Iterator<Item = f64>, lower_is_better: bool) -> (f64, f64) {
    let mut v: Vec<f64> = xs.collect();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return (0.0, 0.0);
    }
    let best = if lower_is_better {
        v[0]
    } else {
        v[v.len() - 1]
    };
    (best, v[v.len() / 2])
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "MISSED" }
}

fn report(
    k: Knobs,
    mem: &Memory,
    pushes: &[PushFig],
    ingests: &[IngestFig],
    after: Option<&(FailoverFig, PushFig)>,
) -> String {
    let per_agent = (mem.rss_settled_kb as f64 - mem.rss_before_kb as f64) / k.agents as f64;
    let per_agent_hot = (mem.rss_connected_kb as f64 - mem.rss_before_kb as f64) / k.agents as f64;
    let p = |f: fn(&PushFig) -> f64| best_median(pushes.iter().map(f), true);
    let (p50, p99, max) = (p(|x| x.p50), p(|x| x.p99), p(|x| x.max));
    let (a50, a99, amax) = (p(|x| x.agent_p50), p(|x| x.agent_p99), p(|x| x.agent_max));
    let i = |f: fn(&IngestFig) -> f64| best_median(ingests.iter().map(f), false);
    let (rows, bare) = (i(|x| x.rows_s), i(|x| x.bare_rows_s));
    let ratio = i(|x| x.rows_s / x.bare_rows_s);
    let rows_total = k.agents * k.batches * ROWS_PER_BATCH;
    let mut s = String::new();
    s.push_str(&format!(
        "\n### fleet bench: {} agents, {} rounds (machine: 2 cores, shared with other builds; load at end {})\n\n",
        k.agents,
        k.rounds,
        loadavg()
    ));
    s.push_str("| figure | target | best | median | |\n|---|---|---|---|---|\n");
    s.push_str(&format!(
        "| A: controller RSS per connected agent | < {TARGET_RSS_KB:.0} KB | {per_agent:.1} KB | — | {} (settled; {per_agent_hot:.1} KB 1 s after the last welcome; RSS {} → {} kB, {} kB after the rounds, peak {} kB) |\n",
        verdict(per_agent < TARGET_RSS_KB),
        mem.rss_before_kb,
        mem.rss_settled_kb,
        mem.rss_end_kb,
        mem.hwm_end_kb
    ));
    s.push_str(&format!(
        "| A': the same, after the rounds (still connected) | | {:.1} KB | — | RSS {} kB |\n",
        (mem.rss_end_kb as f64 - mem.rss_before_kb as f64) / k.agents as f64,
        mem.rss_end_kb
    ));
    s.push_str(&format!(
        "| B: push → acked p50 / p99 / max (controller stamp) | p99 < {TARGET_P99_MS:.0} ms | {:.0} / {:.0} / {:.0} ms | {:.0} / {:.0} / {:.0} ms | {} |\n",
        p50.0,
        p99.0,
        max.0,
        p50.1,
        p99.1,
        max.1,
        verdict(p99.0 < TARGET_P99_MS)
    ));
    s.push_str(&format!(
        "| B': push → ack sent by agent p50 / p99 / max | | {:.0} / {:.0} / {:.0} ms | {:.0} / {:.0} / {:.0} ms | |\n",
        a50.0, a99.0, amax.0, a50.1, a99.1, amax.1
    ));
    s.push_str(&format!(
        "| C: feedback rows stored per second ({rows_total} rows/round, batches of {ROWS_PER_BATCH}, window {}) | ≥ {TARGET_ROWS_S:.0} | {:.0} | {:.0} | {} |\n",
        k.window,
        rows.0,
        rows.1,
        verdict(rows.0 >= TARGET_ROWS_S)
    ));
    s.push_str(&format!(
        "| C': bare SQLite, same rows (WAL, synchronous=FULL, {} rows/tx) | | {:.0} | {:.0} | controller/bare {:.2} best, {:.2} median |\n",
        common::BARE_TX_ROWS,
        bare.0,
        bare.1,
        ratio.0,
        ratio.1
    ));
    if let Some((f, p)) = after {
        s.push_str(&format!(
            "| D: failover, `kill -9` → each of the {} moved agents welcomed again p50 / p99 / all | | {:.2} / {:.2} / {:.2} s | — | the store shows every agent connected to a live controller at {:.2} s; {} refused or failed attempts; {} re-pushes |\n",
            f.moved, f.p50, f.p99, f.all, f.recorded, f.refused, f.repushed
        ));
        s.push_str(&format!(
            "| D': push → acked after the failover p50 / p99 / max | | {:.0} / {:.0} / {:.0} ms | — | |\n",
            p.p50, p.p99, p.max
        ));
    }
    let failover = after.map(|(f, p)| {
        serde_json::json!({
            "moved": f.moved, "welcomed_s": {"p50": f.p50, "p99": f.p99, "all": f.all},
            "recorded_s": f.recorded, "refused": f.refused, "repushed": f.repushed,
            "restart_s": f.restart, "statements_per_moved_agent": f.statements_per_agent,
            "push_after_ms": {"p50": p.p50, "p99": p.p99, "max": p.max},
        })
    });
    let json = serde_json::json!({
        "bench": "fleet",
        "agents": k.agents,
        "rounds": k.rounds,
        "machine": "2 cores, shared",
        "rss_before_kb": mem.rss_before_kb,
        "rss_connected_kb": mem.rss_settled_kb,
        "rss_per_agent_kb": (per_agent * 10.0).round() / 10.0,
        "rss_after_rounds_kb": mem.rss_end_kb,
        "push_ack_ms": {
            "p50": {"best": p50.0, "median": p50.1},
            "p99": {"best": p99.0, "median": p99.1},
            "max": {"best": max.0, "median": max.1},
        },
        "push_ack_agent_ms": {
            "p50": {"best": a50.0, "median": a50.1},
            "p99": {"best": a99.0, "median": a99.1},
            "max": {"best": amax.0, "median": amax.1},
        },
        "ingest_rows_s": {"best": rows.0.round(), "median": rows.1.round()},
        "bare_rows_s": {"best": bare.0.round(), "median": bare.1.round()},
        "ingest_over_bare": {"best": ratio.0, "median": ratio.1},
        "statements_per_push_agent": pushes.iter().filter_map(|x| x.statements).collect::<Vec<_>>(),
        "statements_per_feedback_batch": ingests.iter().filter_map(|x| x.statements).collect::<Vec<_>>(),
        "failover": failover,
    });
    s.push_str(&format!("\n{json}"));
    s
}
