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
//! `FLEET_MODES` (`plain,tls`: the whole bench once per mode, in this
//! order, each with a fresh controller; `tls` is mTLS with certificates
//! from the controller's own CA code, one per agent, and a table of the
//! modes side by side at the end; `pg` is plaintext with the store in
//! PostgreSQL, a cluster this bench starts with the server's durable
//! defaults (`fsync`, `synchronous_commit` on), `baton_testpg`).
//!
//! The agents answer pings, ack every push and then send `Held` (as the
//! protocol asks of an agent whose held set changed; without it the
//! controller re-pushes at every 30 s resync). They do not validate or
//! journal packs: the figures are the controller's.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use baton_controller::server::convert;
use baton_controller::store::FeedbackRow;
use baton_proto::wire::{
    self, admin_client::AdminClient, agent_message::Body as In, controller_message::Body as Out,
    link_client::LinkClient,
};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

mod common;

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
const CONNECTING: usize = 64;
/// Largest message either side accepts (the controller's own limit).
const MAX_MESSAGE: usize = 16 * 1024 * 1024;
/// Any single wait of the bench (a connect, a phase) longer than this is
/// a failure, not a figure.
const PHASE_TIMEOUT: Duration = Duration::from_secs(300);
/// Scheduled instant of the first feedback entry (ns since the epoch).
const T_BASE: i64 = 1_764_530_000_000_000_000;

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
        agents: env_or("FLEET_AGENTS", AGENTS)?.clamp(1, 9999),
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
        let (tls, store) = match mode {
            Mode::Plain => (None, None),
            Mode::Tls => (tls.clone(), None),
            Mode::Postgres => (
                None,
                Some(
                    baton_testpg::durable_database(base)
                        .context("FLEET_MODES=pg needs PostgreSQL (Debian's postgresql)")?,
                ),
            ),
        };
        let (report, summary) = run_mode(k, &exe, base, tls, store.as_deref())?;
        println!("{report}");
        done.push((mode, summary));
    }
    if done.len() > 1 {
        println!("{}", compare(k, &done));
    }
    Ok(())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Plain,
    Tls,
    Postgres,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Plain => "plaintext",
            Mode::Tls => "mTLS",
            Mode::Postgres => "plaintext, store in PostgreSQL",
        }
    }
}

fn modes() -> Result<Vec<Mode>> {
    let v = std::env::var("FLEET_MODES").unwrap_or_else(|_| "plain,tls".into());
    v.split(',')
        .map(|m| match m.trim() {
            "plain" => Ok(Mode::Plain),
            "tls" => Ok(Mode::Tls),
            "pg" => Ok(Mode::Postgres),
            other => bail!("FLEET_MODES: `{other}` is not plain, tls or pg"),
        })
        .collect()
}

/// One mode's figures for the comparison.
#[derive(Clone, Copy, Debug)]
struct Summary {
    p99: (f64, f64),
    p50: (f64, f64),
    rows: (f64, f64),
    rss_per_agent: f64,
    connect_s: f64,
}

/// The bench against a fresh controller, plaintext or mTLS.
fn run_mode(
    k: Knobs,
    exe: &Path,
    base: &Path,
    tls: Option<Arc<Tls>>,
    store: Option<&str>,
) -> Result<(String, Summary)> {
    // Spawned from this (the main) thread: the child's parent-death signal
    // follows the thread that forked it.
    let controller = Controller::start(exe, base, tls.as_deref(), store)?;
    let bare_dir = tempfile::tempdir_in(base)?;
    println!(
        "fleet ({}{}): {} agents, controller {} (pid {}), data under {}, load {}",
        if tls.is_some() { "mTLS" } else { "plaintext" },
        if store.is_some() {
            ", store in PostgreSQL"
        } else {
            ""
        },
        k.agents,
        exe.display(),
        controller.pid,
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
            r = bench(k, &controller, bare_dir.path(), tls) => r,
            _ = tokio::signal::ctrl_c() => Err(anyhow!("interrupted")),
        }
    });
    // Agents first (their tasks end with the runtime), then the controller,
    // then its directory (dropped after it is dead).
    rt.shutdown_timeout(Duration::from_secs(2));
    let log = controller.log();
    let stopped = controller.stop();
    drop(bare_dir);
    let report = r?;
    let stopped = stopped?;
    let noisy: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .collect();
    println!(
        "controller: {stopped}; {} warning/error lines in its log{}",
        noisy.len(),
        noisy
            .iter()
            .take(5)
            .map(|l| format!("\n  {l}"))
            .collect::<String>()
    );
    Ok(report)
}

/// The fleet's certificates (made once, used by every mTLS run): the
/// controller's CA directory, an admin operator, one agent each.
struct Tls {
    dir: PathBuf,
    ca_pem: Vec<u8>,
    admin: (Vec<u8>, Vec<u8>),
    agents: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Tls {
    fn make(dir: &Path, agents: usize) -> Result<Tls> {
        use baton_controller::ca::{self, CaDir, Validity};
        let ca = CaDir::new(dir);
        let now = time::OffsetDateTime::now_utc();
        ca::init(&ca, &[], now)?;
        let read = |(c, k): (PathBuf, PathBuf)| -> Result<(Vec<u8>, Vec<u8>)> {
            Ok((std::fs::read(c)?, std::fs::read(k)?))
        };
        let valid = Validity::days(now, 1);
        let admin = read(ca::issue(
            &ca,
            &baton_controller::identity::Identity::Operator {
                name: "bench".into(),
                tenant: "default".into(),
                role: baton_controller::identity::Role::Admin,
            },
            valid,
        )?)?;
        let agents = (0..agents)
            .map(|ix| {
                read(ca::issue(
                    &ca,
                    &baton_controller::identity::Identity::Agent {
                        id: agent_id(ix),
                        tenants: Vec::new(),
                    },
                    valid,
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

    fn client(&self, (cert, key): &(Vec<u8>, Vec<u8>)) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca_pem))
            .identity(Identity::from_pem(cert, key))
    }
}

/// An endpoint to the controller, over mTLS as `who` when given.
fn endpoint(url: &str, tls: Option<ClientTlsConfig>) -> Result<Endpoint> {
    let e = Endpoint::from_shared(url.to_string())?;
    Ok(match tls {
        Some(t) => e.tls_config(t)?,
        None => e,
    })
}

/// Plaintext against mTLS, as a Markdown table.
fn compare(k: Knobs, done: &[(Mode, Summary)]) -> String {
    let mut s = format!(
        "\n### the modes side by side: {} agents, {} rounds per mode, in this order: {}\n\n| mode | push → acked p50 (best / median) | p99 (best / median) | feedback rows/s (best / median) | RSS per agent | connect all |\n|---|---|---|---|---|---|\n",
        k.agents,
        k.rounds,
        done.iter()
            .map(|(m, _)| m.name())
            .collect::<Vec<_>>()
            .join(", ")
    );
    for (m, x) in done {
        s.push_str(&format!(
            "| {} | {:.0} / {:.0} ms | {:.0} / {:.0} ms | {:.0} / {:.0} | {:.1} KB | {:.2} s |\n",
            m.name(),
            x.p50.0,
            x.p50.1,
            x.p99.0,
            x.p99.1,
            x.rows.0,
            x.rows.1,
            x.rss_per_agent,
            x.connect_s
        ));
    }
    let json: Vec<serde_json::Value> = done
        .iter()
        .map(|(m, x)| {
            serde_json::json!({
                "mode": m.name(), "p50_ms": [x.p50.0, x.p50.1], "p99_ms": [x.p99.0, x.p99.1],
                "rows_s": [x.rows.0.round(), x.rows.1.round()],
                "rss_per_agent_kb": x.rss_per_agent, "connect_s": x.connect_s,
            })
        })
        .collect();
    s.push_str(&format!(
        "\n{}",
        serde_json::json!({"bench": "fleet-modes", "modes": json})
    ));
    s
}

// ---------------------------------------------------------------------------
// The controller process.

/// `cargo build --release -p baton-controller` into this bench's target
/// directory; the binary's path as cargo reports it.
fn build_controller() -> Result<PathBuf> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    // target/release/deps/fleet-HASH
    let me = std::env::current_exe()?;
    let target = me
        .parent()
        .and_then(Path::parent)
        .and_then(Path::parent)
        .context("bench executable not in TARGET/PROFILE/deps")?;
    let out = Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "build",
            "--release",
            "-p",
            "baton-controller",
            "--bin",
            "baton-controller",
            "--message-format=json-render-diagnostics",
        ])
        .arg("--target-dir")
        .arg(target)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .context("running cargo build --release")?;
    if !out.status.success() {
        bail!("cargo build --release -p baton-controller: {}", out.status);
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["reason"] == "compiler-artifact" && v["target"]["name"] == "baton-controller")
        .find_map(|v| v["executable"].as_str().map(PathBuf::from))
        .context("cargo reported no baton-controller executable")
}

/// The controller process, killed (and its data directory removed) when
/// dropped, whatever happened.
struct Controller {
    child: Child,
    pid: u32,
    data: tempfile::TempDir,
    url: String,
    /// `--store`: its PostgreSQL database (else the store is in `data`).
    store: Option<String>,
}

impl Controller {
    fn start(
        exe: &Path,
        base: &Path,
        tls: Option<&Tls>,
        store: Option<&str>,
    ) -> Result<Controller> {
        let data = tempfile::tempdir_in(base)?;
        let log = std::fs::File::create(data.path().join("controller.log"))?;
        let mut cmd = Command::new(exe);
        cmd.arg("serve");
        match tls {
            // Every simulated agent dials from 127.0.0.1, CONNECTING at
            // once: one source, where a real fleet is many.
            Some(t) => cmd
                .arg("--tls-dir")
                .arg(&t.dir)
                .args(["--max-handshakes-per-source", &CONNECTING.to_string()]),
            None => cmd.arg("--insecure"),
        };
        let scheme = if tls.is_some() { "https" } else { "http" };
        // No admission bound: these agents come up as fast as the bench
        // dials them and do not retry (the figures here are memory, push
        // and ingest; a storm against the bound is `benches/storm.rs`).
        cmd.args(["--admit-rate", "0"]);
        cmd.args(["--listen", "127.0.0.1:0", "--data"])
            .arg(data.path())
            .args(store.map(|url| ["--store", url]).into_iter().flatten())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        #[cfg(target_os = "linux")]
        {
            use std::os::unix::process::CommandExt;
            // SAFETY: between fork and exec the closure only calls prctl(2),
            // which is async-signal-safe and touches no memory of ours. It
            // makes the kernel kill the controller if this bench dies
            // without running its destructors (SIGKILL, abort).
            unsafe {
                cmd.pre_exec(|| {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("spawn {}", exe.display()))?;
        let pid = child.id();
        let mut c = Controller {
            child,
            pid,
            data,
            url: String::new(),
            store: store.map(str::to_owned),
        };
        let addr_file = c.data.path().join("listen.addr");
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(s) = std::fs::read_to_string(&addr_file)
                && !s.trim().is_empty()
            {
                c.url = format!("{scheme}://{}", s.trim());
                return Ok(c);
            }
            if let Some(status) = c.child.try_wait()? {
                bail!(
                    "controller exited ({status}) before listening:\n{}",
                    c.log()
                );
            }
            if Instant::now() > end {
                bail!("controller not listening after 30 s:\n{}", c.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.data.path().join("controller.log")).unwrap_or_default()
    }

    /// Feedback rows the controller has stored, read from its store.
    async fn stored_feedback(&self) -> Result<i64> {
        let dir = self.data.path().to_path_buf();
        let store = self.store.clone();
        // Both clients block (PostgreSQL's runs a runtime of its own).
        tokio::task::spawn_blocking(move || match store {
            None => common::count(&dir).map_err(|e| anyhow!(e)),
            Some(url) => {
                let mut c = postgres::Client::connect(&url, postgres::NoTls)?;
                Ok(c.query_one("SELECT COUNT(*) FROM feedback", &[])?
                    .try_get(0)?)
            }
        })
        .await?
    }

    /// SIGTERM, and how it ended (SIGKILL after 10 s).
    fn stop(mut self) -> Result<String> {
        if let Some(s) = self.child.try_wait()? {
            bail!("controller had already exited: {s}");
        }
        // SAFETY: kill(2) on our own child, which has not been reaped
        // (try_wait just said it is running), so the pid is still ours.
        unsafe {
            libc::kill(self.pid as i32, libc::SIGTERM);
        }
        let end = Instant::now() + Duration::from_secs(10);
        let t0 = Instant::now();
        while Instant::now() < end {
            if let Some(s) = self.child.try_wait()? {
                return Ok(format!("stopped on SIGTERM in {:?} ({s})", t0.elapsed()));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.child.kill()?;
        self.child.wait()?;
        Ok("did not stop within 10 s of SIGTERM; killed".into())
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        // `data` is removed after this, with the process gone.
    }
}

/// VmRSS, VmHWM (kB) and threads of a process.
fn proc_status(pid: u32) -> Result<(u64, u64, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> Result<u64> {
        s.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("{name} in /proc/{pid}/status"))
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?, field("Threads:")?))
}

/// Where a process's resident memory is: anonymous (heap, stacks) and
/// file-backed (code, mapped files), from `/proc/PID/smaps_rollup`.
fn smaps(pid: u32) -> String {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")) else {
        return "no smaps_rollup".into();
    };
    let field = |name: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .unwrap_or("?")
            .to_string()
    };
    format!(
        "anonymous {} kB, file {} kB",
        field("Anonymous:"),
        field("Pss_File:")
    )
}

/// CPU time (user + system) of a process so far.
fn cpu_time(pid: u32) -> Result<Duration> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces): state is 3rd.
    let rest = s
        .rsplit_once(')')
        .map(|(_, r)| r)
        .context("/proc/PID/stat")?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> Result<u64> {
        f.get(i)
            .and_then(|v| v.parse().ok())
            .context("utime/stime in /proc/PID/stat")
    };
    // utime and stime are fields 14 and 15; `rest` starts at field 3.
    let t = ticks(11)? + ticks(12)?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Ok(Duration::from_secs_f64(t as f64 / hz as f64))
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// CPU seconds of the controller and of this bench over a phase.
struct Cpu {
    pid: u32,
    ctl: Duration,
    me: Duration,
}

impl Cpu {
    fn start(pid: u32) -> Result<Cpu> {
        Ok(Cpu {
            pid,
            ctl: cpu_time(pid)?,
            me: cpu_time(std::process::id())?,
        })
    }

    fn done(&self) -> Result<(f64, f64)> {
        Ok((
            (cpu_time(self.pid)? - self.ctl).as_secs_f64(),
            (cpu_time(std::process::id())? - self.me).as_secs_f64(),
        ))
    }
}

// ---------------------------------------------------------------------------
// Simulated agents.

fn now_ns() -> i64 {
    baton_controller::server::now_ns()
}

fn msg(body: In) -> wire::AgentMessage {
    wire::AgentMessage { body: Some(body) }
}

fn agent_id(ix: usize) -> String {
    format!("sim-{:04}", ix + 1)
}

fn journal_id(ix: usize) -> String {
    format!("journal-{}-0b6f3c", agent_id(ix))
}

fn pack_ref(version: u64) -> wire::PackRef {
    wire::PackRef {
        tenant: "default".into(),
        pack: "bench".into(),
        version,
    }
}

fn pack_yaml(version: u64) -> String {
    format!(
        "pack: bench\nversion: {version}\ntargets: {{labels: {{bench: \"1\"}}}}\n\
         description: fleet bench, one toggle a second\n\
         safe_state:\n  - {{action: gpio.write, params: {{line: 4, value: 0}}}}\n\
         instructions:\n  - {{id: tick, action: gpio.toggle, params: {{line: 4}}, every: 1s}}\n"
    )
}

/// One feedback entry as an agent running `pack_yaml(version)` sends it.
fn entry(ix: usize, seq: u64, version: u64) -> wire::Feedback {
    let scheduled = T_BASE + i64::try_from(seq).unwrap_or(i64::MAX / 2) * 1_000_000_000;
    let lateness = 15_000 + ((seq as i64 * 7919 + ix as i64 * 104_729) % 20_000);
    wire::Feedback {
        seq,
        execution_id: format!("default/bench/v{version}/tick/{scheduled}/a1"),
        pack: Some(pack_ref(version)),
        instruction: "tick".into(),
        attempt: 1,
        scheduled_ns: scheduled,
        actual_ns: scheduled + lateness,
        lateness_ns: lateness,
        outcome: wire::Outcome::Ok as i32,
        detail: String::new(),
        value: None,
        dropped_before: 0,
        event: "executed".into(),
        action: "gpio.toggle".into(),
        uncertainty_ns: 1_500,
        ..Default::default()
    }
}

/// An agent's feedback batches for one round, each with its last seq.
type Batches = Vec<(u64, wire::AgentMessage)>;

/// What the bench asks of an agent.
enum Cmd {
    /// Send these batches (last seq of each with it), at most `window`
    /// unacknowledged; answer when the last one is acknowledged.
    Ingest {
        batches: Batches,
        window: usize,
        done: oneshot::Sender<Instant>,
    },
}

/// What an agent tells the bench.
enum Event {
    /// A push arrived and was acknowledged.
    PackAcked {
        version: u64,
        /// When the push arrived, and when the ack was handed to the link.
        acked_ns: i64,
    },
    /// The agent's stream failed.
    Failed { agent: usize, error: String },
}

/// An agent's open stream.
struct Link {
    tx: mpsc::Sender<wire::AgentMessage>,
    rx: tonic::Streaming<wire::ControllerMessage>,
    /// Held for the stream's life (its own TCP connection).
    _channel: Channel,
}

impl Link {
    /// Half-close, then read until the controller ends the stream too (a
    /// clean end on both sides, as an agent going away politely).
    async fn close(self) -> Result<()> {
        let Link {
            tx,
            mut rx,
            _channel,
        } = self;
        drop(tx);
        let end = async {
            loop {
                match rx.message().await {
                    Ok(Some(_)) => {}
                    Ok(None) => return Ok(()),
                    Err(s) => bail!("stream ended with {s}"),
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(10), end)
            .await
            .context("controller did not end the stream within 10 s")?
    }

    async fn send(&self, body: In) -> Result<()> {
        self.tx
            .send(msg(body))
            .await
            .map_err(|_| anyhow!("link stream closed"))
    }
}

/// Dial (a connection of its own), hello, wait for the welcome.
async fn connect(ix: usize, url: &str, tls: Option<&Tls>) -> Result<Link> {
    let channel = endpoint(url, tls.map(|t| t.client(&t.agents[ix])))?
        .connect_timeout(Duration::from_secs(10))
        .tcp_nodelay(true)
        .connect()
        .await
        .context("connect")?;
    let mut client = LinkClient::new(channel.clone())
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE);
    let (tx, rx) = mpsc::channel(32);
    let mut labels = std::collections::HashMap::new();
    labels.insert("bench".to_string(), "1".to_string());
    tx.send(msg(In::Hello(wire::Hello {
        agent_id: agent_id(ix),
        labels,
        agent_version: "fleet-bench".into(),
        capabilities: Vec::new(),
        packs: Vec::new(),
        journal_id: journal_id(ix),
        feedback_first_seq: 0,
        feedback_last_seq: 0,
        max_packs: 0,
        session_gen: 0,
    })))
    .await
    .map_err(|_| anyhow!("hello not queued"))?;
    let rx = client
        .connect(ReceiverStream::new(rx))
        .await
        .context("open Link.Connect")?
        .into_inner();
    let mut link = Link {
        tx,
        rx,
        _channel: channel,
    };
    loop {
        match link.rx.message().await.context("waiting for welcome")? {
            Some(wire::ControllerMessage {
                body: Some(Out::Welcome(w)),
            }) => {
                if w.agent_id != agent_id(ix) || w.feedback_acked_seq != 0 {
                    bail!("unexpected welcome {w:?}");
                }
                return Ok(link);
            }
            Some(wire::ControllerMessage {
                body: Some(Out::Ping(p)),
            }) => link.send(In::Pong(wire::Pong { id: p.id })).await?,
            other => bail!("expected welcome, got {other:?}"),
        }
    }
}

/// An ingest in progress on one agent.
struct Ingest {
    queue: VecDeque<(u64, wire::AgentMessage)>,
    in_flight: VecDeque<u64>,
    window: usize,
    done: Option<oneshot::Sender<Instant>>,
}

/// Serve one agent's stream until the bench drops its command sender.
async fn agent(
    mut link: Link,
    mut cmds: mpsc::UnboundedReceiver<Cmd>,
    events: mpsc::UnboundedSender<Event>,
) -> Result<()> {
    let mut ingest: Option<Ingest> = None;
    loop {
        tokio::select! {
            m = link.rx.message() => {
                let m = m.context("link stream")?.context("link stream closed by the controller")?;
                match m.body {
                    Some(Out::Ping(p)) => link.send(In::Pong(wire::Pong { id: p.id })).await?,
                    Some(Out::PackPush(p)) => {
                        let r = p.pack.context("push without a pack reference")?;
                        let version = r.version;
                        link.send(In::PackAck(wire::PackAck {
                            pack: Some(r.clone()),
                            unchanged: false,
                        }))
                        .await?;
                        let acked_ns = now_ns();
                        // As a real agent does when the set it holds changes.
                        link.send(In::Held(wire::Held {
                            packs: vec![wire::HeldPack {
                                pack: Some(r),
                                stopped: false,
                            }],
                        }))
                        .await?;
                        let _ = events.send(Event::PackAcked {
                            version,
                            acked_ns,
                        });
                    }
                    Some(Out::FeedbackAck(a)) => {
                        let Some(ing) = ingest.as_mut() else {
                            bail!("feedback ack {} with nothing sent", a.seq);
                        };
                        while ing.in_flight.front().is_some_and(|&s| s <= a.seq) {
                            ing.in_flight.pop_front();
                        }
                        top_up(&link, ing).await?;
                        if ing.in_flight.is_empty()
                            && ing.queue.is_empty()
                            && let Some(done) = ing.done.take()
                        {
                            let _ = done.send(Instant::now());
                        }
                    }
                    Some(Out::Welcome(_)) => bail!("a second welcome"),
                    Some(Out::TimeReply(r)) => bail!("a time reply {r:?} to no request"),
                    Some(Out::PackCancel(c)) => bail!("unexpected cancel {c:?}"),
                    Some(Out::TimeExchangeRequest(t)) => {
                        let now = now_ns();
                        link.send(In::TimeExchangeReply(wire::TimeExchangeReply {
                            id: t.id,
                            t1_ns: t.t1_ns,
                            t2_ns: now,
                            t3_ns: now,
                        }))
                        .await?;
                    }
                    None => bail!("empty controller message"),
                }
            }
            c = cmds.recv() => match c {
                Some(Cmd::Ingest { batches, window, done }) => {
                    let mut ing = Ingest {
                        queue: batches.into(),
                        in_flight: VecDeque::new(),
                        window,
                        done: Some(done),
                    };
                    top_up(&link, &mut ing).await?;
                    ingest = Some(ing);
                }
                // The bench is done with this agent: close the stream.
                None => return link.close().await,
            },
        }
    }
}

async fn top_up(link: &Link, ing: &mut Ingest) -> Result<()> {
    while ing.in_flight.len() < ing.window {
        let Some((last, m)) = ing.queue.pop_front() else {
            break;
        };
        link.tx
            .send(m)
            .await
            .map_err(|_| anyhow!("link stream closed"))?;
        ing.in_flight.push_back(last);
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Phases.

struct Fleet {
    cmds: Vec<mpsc::UnboundedSender<Cmd>>,
    events: mpsc::UnboundedReceiver<Event>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Fleet {
    /// Connect every agent (at most [`CONNECTING`] at once) and wait for
    /// every welcome.
    async fn connect(url: &str, agents: usize, tls: Option<Arc<Tls>>) -> Result<Fleet> {
        let gate = Arc::new(Semaphore::new(CONNECTING));
        let (ev_tx, events) = mpsc::unbounded_channel();
        let mut cmds = Vec::with_capacity(agents);
        let mut welcomed = Vec::with_capacity(agents);
        let mut tasks = Vec::with_capacity(agents);
        for ix in 0..agents {
            let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
            let (w_tx, w_rx) = oneshot::channel::<Result<()>>();
            cmds.push(cmd_tx);
            welcomed.push(w_rx);
            let (gate, url, ev_tx) = (gate.clone(), url.to_string(), ev_tx.clone());
            let tls = tls.clone();
            tasks.push(tokio::spawn(async move {
                let link = {
                    let Ok(_permit) = gate.acquire().await else {
                        return;
                    };
                    match connect(ix, &url, tls.as_deref()).await {
                        Ok(l) => l,
                        Err(e) => {
                            let _ = w_tx.send(Err(e.context(agent_id(ix))));
                            return;
                        }
                    }
                };
                let _ = w_tx.send(Ok(()));
                if let Err(e) = agent(link, cmd_rx, ev_tx.clone()).await {
                    let _ = ev_tx.send(Event::Failed {
                        agent: ix,
                        error: format!("{e:#}"),
                    });
                }
            }));
        }
        for w in welcomed {
            tokio::time::timeout(PHASE_TIMEOUT, w)
                .await
                .context("agents not welcomed in time")?
                .context("agent task gone")??;
        }
        Ok(Fleet {
            cmds,
            events,
            tasks,
        })
    }

    /// Every agent closes its stream; how many did not end cleanly.
    async fn close(self) -> Result<usize> {
        let Fleet {
            cmds,
            mut events,
            tasks,
        } = self;
        drop(cmds);
        for t in tasks {
            tokio::time::timeout(Duration::from_secs(30), t)
                .await
                .context("agents still closing after 30 s")??;
        }
        let mut failed = 0;
        while let Ok(ev) = events.try_recv() {
            if let Event::Failed { agent, error } = ev {
                if failed < 3 {
                    eprintln!("closing {}: {error}", agent_id(agent));
                }
                failed += 1;
            }
        }
        Ok(failed)
    }

    /// The next event, failing on an agent's failure.
    async fn next_event(&mut self, until: Instant) -> Result<(u64, i64)> {
        let ev = tokio::time::timeout_at(until.into(), self.events.recv())
            .await
            .context("timed out waiting for the agents")?
            .context("every agent task ended")?;
        match ev {
            Event::PackAcked { version, acked_ns } => Ok((version, acked_ns)),
            Event::Failed { agent, error } => bail!("agent {}: {error}", agent_id(agent)),
        }
    }

    /// Any agent failure so far.
    fn check(&mut self) -> Result<()> {
        while let Ok(ev) = self.events.try_recv() {
            if let Event::Failed { agent, error } = ev {
                bail!("agent {}: {error}", agent_id(agent));
            }
        }
        Ok(())
    }
}

fn ms(ns: i64) -> f64 {
    ns as f64 / 1e6
}

/// Nearest-rank percentile of sorted values.
fn pct(sorted: &[i64], q: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
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
    /// The Push call itself (ms).
    call: f64,
    /// Until Deliveries showed every ack stored (ms).
    all_stored: f64,
    ctl_cpu: f64,
    bench_cpu: f64,
}

async fn push_round(
    admin: &mut AdminClient<Channel>,
    fleet: &mut Fleet,
    ctl: &Controller,
    agents: usize,
    version: u64,
) -> Result<PushFig> {
    let cpu = Cpu::start(ctl.pid)?;
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
    while agent_lat.len() < agents {
        let (v, acked_ns) = fleet.next_event(until).await?;
        if v != version {
            bail!("agent acked v{v} during the push of v{version}");
        }
        agent_lat.push(acked_ns - t0_ns);
    }
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
        call: call.as_secs_f64() * 1e3,
        all_stored: all_stored.as_secs_f64() * 1e3,
        ctl_cpu,
        bench_cpu,
    })
}

#[derive(Clone, Copy, Debug, Default)]
struct IngestFig {
    rows_s: f64,
    bare_rows_s: f64,
    ctl_cpu: f64,
    bench_cpu: f64,
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
    ctl: &Controller,
    bare: &mut Option<common::Bare>,
    k: Knobs,
    round: usize,
    version: u64,
) -> Result<IngestFig> {
    let (msgs, rows) = workload(k, round, version)?;
    let total = rows.len();
    fleet.check()?;
    let cpu = Cpu::start(ctl.pid)?;
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
                Some(Event::Failed { agent, error }) => bail!("agent {}: {error}", agent_id(agent)),
                _ => bail!("unexpected agent event during ingest"),
            },
        };
        last = last.max(t);
    }
    let took = last - start;
    let (ctl_cpu, bench_cpu) = cpu.done()?;
    let stored = ctl.stored_feedback().await?;
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
        bench_cpu,
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
    ctl: &Controller,
    bare_dir: &Path,
    tls: Option<Arc<Tls>>,
) -> Result<(String, Summary)> {
    let admin_ch = endpoint(&ctl.url, tls.as_ref().map(|t| t.client(&t.admin)))?
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
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut mem = Memory {
        rss_before_kb: proc_status(ctl.pid)?.0,
        ..Memory::default()
    };

    let t0 = Instant::now();
    let mut fleet = Fleet::connect(&ctl.url, k.agents, tls).await?;
    mem.connect_s = t0.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(1)).await;
    fleet.check()?;
    let (rss, _, threads) = proc_status(ctl.pid)?;
    mem.rss_connected_kb = rss;
    mem.threads_connected = threads;
    // Past the runtime's blocking-pool keep-alive (10 s): what stays.
    tokio::time::sleep(Duration::from_secs(12)).await;
    fleet.check()?;
    let (rss, _, threads) = proc_status(ctl.pid)?;
    mem.rss_settled_kb = rss;
    mem.threads_settled = threads;
    let per_agent = |rss: u64| (rss as f64 - mem.rss_before_kb as f64) / k.agents as f64;
    println!(
        "connect: {} agents welcomed in {:.2} s | controller RSS {} kB before, {} kB connected (+1 s, {} threads), {} kB settled (+13 s, {} threads; {}) | {:.1} / {:.1} kB per agent",
        k.agents,
        mem.connect_s,
        mem.rss_before_kb,
        mem.rss_connected_kb,
        mem.threads_connected,
        mem.rss_settled_kb,
        mem.threads_settled,
        smaps(ctl.pid),
        per_agent(mem.rss_connected_kb),
        per_agent(mem.rss_settled_kb),
    );

    let mut bare = Some(common::Bare::open(bare_dir).map_err(|e| anyhow!(e))?);
    let total = k.agents * k.batches * ROWS_PER_BATCH;
    let mut pushes = Vec::new();
    let mut ingests = Vec::new();
    for round in 1..=k.rounds {
        let version = round as u64;
        let p = push_round(&mut admin, &mut fleet, ctl, k.agents, version).await?;
        println!(
            "round {round} push v{version}: acked (controller stamp) p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms | agent send p50 {:.1} / p99 {:.1} / max {:.1} ms | Push call {:.1} ms, all stored visible {:.1} ms | CPU controller {:.2} s, bench {:.2} s",
            p.p50,
            p.p99,
            p.max,
            p.agent_p50,
            p.agent_p99,
            p.agent_max,
            p.call,
            p.all_stored,
            p.ctl_cpu,
            p.bench_cpu
        );
        pushes.push(p);
        let i = ingest_round(&mut fleet, ctl, &mut bare, k, round, version).await?;
        println!(
            "round {round} ingest: {total} rows, controller {:.0} rows/s | bare sqlite {:.0} rows/s | controller/bare {:.2} | CPU controller {:.2} s, bench {:.2} s",
            i.rows_s,
            i.bare_rows_s,
            i.rows_s / i.bare_rows_s,
            i.ctl_cpu,
            i.bench_cpu
        );
        ingests.push(i);
    }
    fleet.check()?;
    let (rss_hot, _, _) = proc_status(ctl.pid)?;
    // Settled, as A is: past the controller's quiet moment after a burst
    // (it gives freed heap back then) and the runtime's thread keep-alive.
    tokio::time::sleep(Duration::from_secs(13)).await;
    fleet.check()?;
    let (rss, hwm, _) = proc_status(ctl.pid)?;
    println!("after the rounds: controller RSS {rss_hot} kB at once, {rss} kB settled (+13 s)");
    mem.rss_end_kb = rss;
    mem.hwm_end_kb = hwm;
    if let Ok(h) = std::env::var("FLEET_HOLD_S") {
        println!("holding {h} s (pid {})", ctl.pid);
        tokio::time::sleep(Duration::from_secs(h.parse()?)).await;
        println!("after hold: RSS {} kB", proc_status(ctl.pid)?.0);
    }
    let unclean = fleet.close().await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_closed = proc_status(ctl.pid)?.0;
    println!(
        "end: controller RSS {} kB with {} agents connected after the rounds ({}), peak {} kB; {} kB once they closed ({} streams did not end cleanly)",
        mem.rss_end_kb,
        k.agents,
        smaps(ctl.pid),
        mem.hwm_end_kb,
        rss_closed,
        unclean
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
        rss_per_agent: (mem.rss_settled_kb as f64 - mem.rss_before_kb as f64) / k.agents as f64,
        connect_s: mem.connect_s,
    };
    Ok((report(k, &mem, &pushes, &ingests), summary))
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

fn report(k: Knobs, mem: &Memory, pushes: &[PushFig], ingests: &[IngestFig]) -> String {
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
    });
    s.push_str(&format!("\n{json}"));
    s
}
