//! `baton-agent`: the edge agent. Exit codes: 0 success, 1 invalid input or
//! runtime failure (with a message naming the file / instruction), 2 usage.

#![forbid(unsafe_code)]

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use std::sync::Arc;

use anyhow::Context;
use baton_agent::config::{self, Overrides};
use baton_agent::live::{LiveLayer, LiveView};
use baton_agent::runtime::{Agent, RuntimeError, StopCause, StopFlag};
use baton_agent::simulate::{self, FailSpec, SimOptions};
use baton_proto::pack::read_pack_file;
use baton_proto::time::parse_instant_arg;
use baton_service::log::LogFormat;
use clap::{Parser, Subcommand};
use nix::sys::signal::{SigSet, Signal};

#[derive(Parser, Debug)]
#[command(name = "baton-agent", version = baton_agent::version::version(), about = "baton edge agent")]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the agent: journal, scheduler core, dispatcher, GPIO.
    Run(Box<RunArgs>),
    /// Run the agent version this box settled on, or the one on trial
    /// after an update, or this binary: what systemd starts. Takes `run`'s
    /// flags and hands them on; a trial that ends before it confirmed
    /// itself healthy is rolled back at the next start.
    Launch(Box<RunArgs>),
    /// Remove a pack from this agent after driving its safe state, whether
    /// the agent is running (it is asked through its data directory) or not.
    Cancel {
        /// Pack id.
        pack: String,
        /// Tenant of the pack.
        #[arg(long, default_value = "default")]
        tenant: String,
        /// Config file (YAML); optional.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Journal directory.
        #[arg(long)]
        data: Option<PathBuf>,
        /// GPIO backend (used when no agent is running): sim:FILE, cdev or sysfs.
        #[arg(long)]
        gpio: Option<String>,
    },
    /// Check a config file (and the packs it names) without running.
    CheckConfig {
        /// Config file (YAML).
        file: PathBuf,
    },
    /// Measure firing lateness: N gpio.write firings on the sim backend.
    BenchLatency {
        /// How many firings.
        #[arg(long, default_value_t = 10_000)]
        count: u64,
        /// Interval between firings (e.g. 1ms).
        #[arg(long, default_value = "1ms")]
        interval: String,
        /// CPU to pin the dispatcher to.
        #[arg(long)]
        cpu: Option<usize>,
        /// The dispatcher's spin budget (as `realtime.spin-budget`, e.g.
        /// `0.5%`); default the agent's default.
        #[arg(long)]
        spin_budget: Option<String>,
        /// The CPU idle latency the agent holds (as
        /// `realtime.idle-latency`: `0us`, `50us`, `off`); default the
        /// agent's default.
        #[arg(long)]
        idle_latency: Option<String>,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Run a pack through the scheduler core on simulated time.
    Simulate {
        /// Pack file (YAML).
        file: PathBuf,
        /// Acceptance instant (RFC 3339).
        #[arg(long)]
        from: String,
        /// Simulate up to this instant (RFC 3339, inclusive).
        #[arg(long)]
        until: String,
        /// ID[:N]: the first N attempts of instruction ID fail (all without :N).
        #[arg(long)]
        fail: Vec<FailSpec>,
        /// Seed of the retry-jitter RNG.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
        /// Stop after this many events.
        #[arg(long, default_value_t = 1_000_000)]
        max_events: usize,
    },
}

/// `run`'s flags (and `launch`'s, which hands them on).
#[derive(clap::Args, Debug)]
struct RunArgs {
    #[command(flatten)]
    common: CommonFlags,
    /// Exit (after the safe state) once nothing is left to do.
    #[arg(long)]
    exit_when_idle: bool,
    /// Only notes and the final summary, no line per firing.
    #[arg(long)]
    quiet: bool,
    #[command(flatten)]
    faults: FaultFlags,
}

/// Flags shared by `run` (each overrides the config file).
#[derive(clap::Args, Debug, Clone)]
struct CommonFlags {
    /// Config file (YAML); optional.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Agent id.
    #[arg(long)]
    id: Option<String>,
    /// Journal directory.
    #[arg(long)]
    data: Option<PathBuf>,
    /// GPIO backend: sim:FILE, cdev or sysfs.
    #[arg(long)]
    gpio: Option<String>,
    /// Load a pack from a file (repeatable).
    #[arg(long)]
    pack: Vec<PathBuf>,
    /// Do not try SCHED_FIFO / mlockall.
    #[arg(long)]
    no_rt: bool,
    /// Start with an empty journal even though the data directory shows
    /// one existed (its log is missing): accepted packs are forgotten.
    #[arg(long)]
    reset_journal: bool,
    /// The controller to dial: https://HOST:PORT (mTLS, with --cert,
    /// --key, --ca), or http://HOST:PORT with --insecure. Repeatable:
    /// replicas, dialled in turn when one is lost (replaces the config
    /// file's list).
    #[arg(long, value_name = "URL")]
    controller: Vec<String>,
    /// Allow a plaintext (http://) controller link (loopback only, unless
    /// --insecure-any).
    #[arg(long)]
    insecure: bool,
    /// Allow --insecure toward a non-loopback controller.
    #[arg(long)]
    insecure_any: bool,
    /// This agent's certificate (made by `baton-controller ca issue-agent`).
    #[arg(long, value_name = "FILE")]
    cert: Option<PathBuf>,
    /// Its private key.
    #[arg(long, value_name = "FILE")]
    key: Option<PathBuf>,
    /// The fleet's CA certificate.
    #[arg(long, value_name = "FILE")]
    ca: Option<PathBuf>,
    /// A label the controller picks agents by (repeatable; overrides the
    /// config file's label of the same key).
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = config::parse_label_arg)]
    labels: Vec<(String, String)>,
    /// Be a PTP slave (statime) on this interface.
    #[arg(long, value_name = "IFACE")]
    ptp_interface: Option<String>,
    /// An NTP server (repeatable; replaces the config file's list).
    #[arg(long = "ntp-server", value_name = "HOST[:PORT]")]
    ntp_servers: Vec<String>,
    /// Refuse packs that need absolute time while the clock's uncertainty
    /// exceeds this (default 10ms).
    #[arg(long, value_name = "DURATION")]
    clock_limit: Option<String>,
    /// `kernel` (default): trust the system clock as far as the kernel
    /// says it is synchronised; `reference`: it is reference time.
    /// `untrusted`: never a source.
    #[arg(long, value_name = "kernel|reference|untrusted")]
    system_clock: Option<String>,
    /// Log output on stderr: `auto` (journald's format when stderr is the
    /// journal, else text), `text`, `json` (one object per line) or
    /// `journald` (`<N>`-prefixed plain lines).
    #[arg(long, value_name = "auto|text|json|journald")]
    log_format: Option<String>,
    /// Serve Prometheus metrics at http://ADDR/metrics (IP:PORT; plaintext
    /// and unauthenticated, read-only).
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    /// The fleet's trust (root.pub, trust.json): packs must pass its
    /// newest trust list (signatures where a tenant requires them).
    #[arg(long, value_name = "DIR")]
    trust_dir: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = match args.command {
        Command::Run(run) => run_agent(*run),
        Command::Launch(run) => launch_agent(*run),
        Command::Cancel {
            pack,
            tenant,
            config,
            data,
            gpio,
        } => {
            cancel_pack(pack, tenant, config, data, gpio).map_err(|e| (1, format!("error: {e:#}")))
        }
        Command::CheckConfig { file } => check_config(&file).map_err(|e| (1, format!("{e:#}"))),
        Command::BenchLatency {
            count,
            interval,
            cpu,
            spin_budget,
            idle_latency,
            json,
        } => {
            // The agent's own warnings (and the bench's "still running")
            // on stderr; the figures alone on stdout.
            init_tracing(None, LogFormat::Auto);
            let realtime = baton_agent::bench::Realtime {
                cpu,
                spin_budget,
                idle_latency,
            };
            baton_agent::bench::latency(count, &interval, realtime, json)
                .map_err(|e| (1, format!("error: {e:#}")))
        }
        Command::Simulate {
            file,
            from,
            until,
            fail,
            seed,
            json,
            max_events,
        } => run_simulate(file, &from, &until, fail, seed, json, max_events),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err((code, msg)) => {
            // Under journald each line is an entry: mark them errors.
            let prefix = if baton_service::log::stderr_is_journal() {
                "<3>"
            } else {
                ""
            };
            let mut err = std::io::stderr().lock();
            for line in msg.lines() {
                // A closed stderr must not turn an error exit into a panic.
                let _ = writeln!(err, "{prefix}{line}");
            }
            ExitCode::from(code)
        }
    }
}

fn run_simulate(
    file: PathBuf,
    from: &str,
    until: &str,
    fail: Vec<FailSpec>,
    seed: u64,
    json: bool,
    max_events: usize,
) -> Result<(), (u8, String)> {
    let from = parse_instant_arg("--from", from).map_err(|e| (2, format!("error: {e}")))?;
    let until = parse_instant_arg("--until", until).map_err(|e| (2, format!("error: {e}")))?;
    if until < from {
        return Err((2, "error: --until is before --from".into()));
    }
    let (_, pack) = read_pack_file(&file).map_err(|e| (1, e))?;
    let opts = SimOptions {
        from,
        until,
        fail,
        seed,
        max_events,
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut io_err = None;
    let complete = simulate::simulate(pack, &opts, |e| {
        if io_err.is_none() {
            io_err = simulate::write_event(&mut out, e, json).err();
        }
    })
    .map_err(|e| (1, format!("error: {e}")))?;
    let _ = out.flush();
    if let Some(e) = io_err
        && e.kind() != std::io::ErrorKind::BrokenPipe
    {
        return Err((1, format!("error: writing output: {e}")));
    }
    if !complete {
        return Err((
            1,
            format!(
                "error: stopped after {max_events} events (--max-events); narrow --from/--until"
            ),
        ));
    }
    Ok(())
}

/// Signals that stop the agent through its one way out (safe state,
/// journal flushed). None of them kills it without the safe state.
const STOP_SIGNALS: [Signal; 6] = [
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
];

/// Logs to stderr through `tracing` (`RUST_LOG` filters; default `info`)
/// in `format` (`baton_service::log`); with a live view, firings go to it
/// instead, and so do core events when the log is text for a person. For
/// journald or JSON, core events stay log lines: their levels (a safe
/// state is a warning) then reach the journal, and stdout stays quiet.
fn init_tracing(live: Option<LiveLayer>, format: LogFormat) {
    use tracing_subscriber::prelude::*;
    let out = format.resolve(baton_service::log::stderr_is_journal());
    let events_to_live = out == baton_service::log::Output::Text;
    let default = match (&live, events_to_live) {
        (Some(_), true) => "info,baton::firing=off,baton::event=off",
        // Retries and skips (info) can come once per firing under
        // overload: not for the journal; feedback carries each of them.
        (Some(_), false) => "info,baton::firing=off,baton::event=warn",
        (None, _) => "info",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let fmt = baton_service::log::layer(out, std::io::stderr().is_terminal()).with_filter(filter);
    let live = live.map(|l| {
        // Quiet: not even subscribed to firings, so they cost nothing.
        let firings = if l.0.quiet() {
            tracing_subscriber::filter::LevelFilter::OFF
        } else {
            tracing_subscriber::filter::LevelFilter::TRACE
        };
        let events = if events_to_live && l.0.quiet() {
            // Quiet: retries, skips, failures and safe states; not the
            // `fire` of every attempt (a write per firing otherwise).
            tracing_subscriber::filter::LevelFilter::INFO
        } else if events_to_live {
            tracing_subscriber::filter::LevelFilter::TRACE
        } else {
            tracing_subscriber::filter::LevelFilter::OFF
        };
        l.with_filter(
            tracing_subscriber::filter::Targets::new()
                .with_target("baton::firing", firings)
                .with_target("baton::event", events),
        )
    });
    let _ = tracing_subscriber::registry()
        .with(fmt)
        .with(live)
        .try_init();
}

/// The hidden test hooks of `run`: compiled in only with the
/// `fault-injection` feature (the end-to-end tests' builds), so a shipped
/// agent neither accepts these flags nor checks for them.
#[cfg(feature = "fault-injection")]
#[derive(Debug, clap::Args)]
struct FaultFlags {
    /// Test hook: panic after this many executed attempts (to test the
    /// panic hook's safe state). Hidden.
    #[arg(long, hide = true)]
    inject_panic_after: Option<u64>,
    /// Test hook: the dispatcher thread hangs for good after this many
    /// executed jobs (to test that the systemd watchdog pings stop).
    /// Hidden.
    #[arg(long, hide = true)]
    inject_dispatcher_stall_after: Option<u64>,
    /// Test hook (sim backend): after this many writes the next one never
    /// returns, inside the dispatcher's GPIO call. Hidden.
    #[arg(long, hide = true)]
    inject_gpio_hang_after: Option<u64>,
    /// Test hook: with `--inject-gpio-hang-after`, the direct writes of
    /// the safe state hang too (the chip itself is hung). Hidden.
    #[arg(long, hide = true)]
    inject_gpio_hang_all: bool,
}

/// Without the `fault-injection` feature: no flags, no hooks.
#[cfg(not(feature = "fault-injection"))]
#[derive(Debug, clap::Args)]
struct FaultFlags {}

impl FaultFlags {
    /// Arms the hooks that act from the start (before the agent is built).
    #[cfg(feature = "fault-injection")]
    fn arm_early(&self) {
        if let Some(n) = self.inject_dispatcher_stall_after {
            baton_agent::dispatcher::inject_stall_after(n);
        }
        if let Some(n) = self.inject_gpio_hang_after {
            baton_gpio::sim::inject_hang(n, self.inject_gpio_hang_all);
        }
    }

    /// Arms the panic hook, once the configured packs are loaded.
    #[cfg(feature = "fault-injection")]
    fn arm_late(&self) {
        if let Some(n) = self.inject_panic_after {
            baton_agent::runtime::inject_panic_after(n);
        }
    }

    #[cfg(not(feature = "fault-injection"))]
    fn arm_early(&self) {}

    #[cfg(not(feature = "fault-injection"))]
    fn arm_late(&self) {}
}

/// Why `run` could not start (the configuration, the signal thread), as
/// its exit status and message.
fn fault(e: anyhow::Error) -> (u8, String) {
    (1, format!("error: {e:#}"))
}

/// Why the runtime failed, as `run`'s exit status and message. A hung GPIO
/// chip has its own status: systemd restarts the agent, which then drives
/// the safe states first.
fn runtime_fault(e: RuntimeError) -> (u8, String) {
    let code = if e.is_gpio_hung() {
        baton_agent::runtime::safety::EXIT_GPIO_HUNG
    } else {
        1
    };
    (code, format!("error: {:#}", anyhow::Error::from(e)))
}

/// The configuration of `run`: the file if one is named, the flags over it.
fn run_config(f: CommonFlags) -> Result<config::AgentConfig, (u8, String)> {
    let file = match &f.config {
        Some(p) => config::read_file(p).map_err(|e| fault(e.into()))?,
        None => config::ConfigFile::default(),
    };
    config::resolve(
        file,
        Overrides {
            id: f.id,
            data_dir: f.data,
            gpio: f.gpio,
            packs: f.pack,
            no_rt: f.no_rt,
            reset_journal: f.reset_journal,
            controllers: f.controller,
            insecure: f.insecure,
            insecure_any: f.insecure_any,
            cert: f.cert,
            key: f.key,
            ca: f.ca,
            labels: f.labels,
            ptp_interface: f.ptp_interface,
            ntp_servers: f.ntp_servers,
            clock_limit: f.clock_limit,
            system_clock: f.system_clock,
            log_format: f.log_format,
            metrics: f.metrics,
            trust_dir: f.trust_dir,
        },
    )
    .map_err(|e| fault(e.into()))
}

/// Serve `/metrics` on `addr` if one is configured: where the agent
/// publishes its snapshots.
fn serve_metrics(
    addr: Option<std::net::SocketAddr>,
) -> Result<Option<Arc<baton_agent::metrics::Published>>, (u8, String)> {
    let Some(addr) = addr else {
        return Ok(None);
    };
    let (published, bound) = baton_agent::metrics::serve(addr)
        .with_context(|| format!("metrics: cannot listen on {addr}"))
        .map_err(fault)?;
    tracing::info!("metrics on http://{bound}/metrics");
    Ok(Some(published))
}

/// The signal that asks the signal thread to replace the process (an
/// update's restart): one no one sends an agent, numbered above every stop
/// signal, so a stop already pending is taken first (`sigwait` returns the
/// lowest pending signal).
const EXEC_REQUEST: Signal = Signal::SIGURG;

/// The stop signals' thread (`baton-signals`). The stop signals are
/// blocked in every thread (the mask is set here, before any other thread
/// exists, and inherited) and taken by this one with `sigwait`, so a stop
/// is never handled by a thread that is about to vanish: an update's
/// restart `execve`s from this thread ([`SignalWatch::exec`]), after any
/// stop pending, and a stop that comes later stays pending across the exec
/// for the new image, which blocks and takes them the same way (the
/// children the agent starts get an empty mask from `std::process`).
struct SignalWatch {
    thread: std::thread::JoinHandle<Option<String>>,
    pthread: nix::sys::pthread::Pthread,
    exec: ExecSlot,
}

/// The binary and arguments the signal thread is asked to `execve`.
type ExecSlot = Arc<std::sync::Mutex<Option<(PathBuf, Vec<std::ffi::CString>)>>>;

fn watch_signals(stop: &Arc<StopFlag>) -> Result<SignalWatch, (u8, String)> {
    let mut set = SigSet::empty();
    for s in STOP_SIGNALS {
        set.add(s);
    }
    set.add(EXEC_REQUEST);
    set.thread_block()
        .context("blocking the stop signals")
        .map_err(fault)?;
    let control = std::thread::current();
    let sig_stop = stop.clone();
    let exec: ExecSlot = Arc::default();
    let plan = exec.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let thread = std::thread::Builder::new()
        .name("baton-signals".into())
        .spawn(move || {
            let _ = tx.send(nix::sys::pthread::pthread_self());
            loop {
                let Ok(sig) = set.wait() else { continue };
                if sig == EXEC_REQUEST {
                    let Some((binary, argv)) = plan.lock().ok().and_then(|mut p| p.take()) else {
                        continue;
                    };
                    if sig_stop.requested().is_some() {
                        return None;
                    }
                    return Some(baton_agent::launch::exec(&binary, &argv, &binary).why);
                }
                tracing::info!(signal = sig as i32, "stop requested by signal");
                sig_stop.request(sig as i32);
                control.unpark();
            }
        })
        .context("starting the signal thread")
        .map_err(fault)?;
    let pthread = rx
        .recv()
        .context("starting the signal thread")
        .map_err(fault)?;
    Ok(SignalWatch {
        thread,
        pthread,
        exec,
    })
}

impl SignalWatch {
    /// Replaces this process with `binary` and `argv` from the signal
    /// thread, unless a stop came first: `Ok(())` for that stop, the
    /// reason when the exec failed.
    fn exec(self, binary: PathBuf, argv: Vec<std::ffi::CString>) -> Result<(), String> {
        if let Ok(mut p) = self.exec.lock() {
            *p = Some((binary, argv));
        }
        nix::sys::pthread::pthread_kill(self.pthread, EXEC_REQUEST)
            .map_err(|e| format!("asking the signal thread to restart: {e}"))?;
        match self.thread.join() {
            Ok(None) => Ok(()),
            Ok(Some(why)) => Err(why),
            Err(_) => Err("the signal thread panicked".into()),
        }
    }
}

/// Lock the agent's memory (`realtime.mlockall`), warning if refused.
fn lock_memory() {
    let mut st = baton_agent::rt::RtStatus::default();
    baton_agent::rt::lock_memory(&mut st);
    if let Some(w) = st.warning() {
        tracing::warn!("{w}");
    }
}

/// `run`'s exit from why the loop ended.
fn exit_for(cause: StopCause) -> Result<(), (u8, String)> {
    match cause {
        StopCause::Fault(e) if e.is_gpio_hung() => Err(runtime_fault(e)),
        StopCause::Fault(e) => Err((
            1,
            format!("error: {:#} (safe state entered)", anyhow::Error::from(e)),
        )),
        _ => Ok(()),
    }
}

/// `launch`: the binary this start runs ([`baton_agent::launch`]), then
/// `run` in this process or in its place. The launcher's own lines go to
/// stderr as `run`'s do; a configuration that cannot be read is `run`'s to
/// report.
fn launch_agent(run: RunArgs) -> Result<(), (u8, String)> {
    use baton_agent::launch::{self, Target};
    let Ok(cfg) = run_config(run.common.clone()) else {
        return run_agent(run);
    };
    let log = || {
        use tracing_subscriber::prelude::*;
        let out = cfg
            .log_format
            .resolve(baton_service::log::stderr_is_journal());
        tracing_subscriber::registry().with(baton_service::log::layer(
            out,
            std::io::stderr().is_terminal(),
        ))
    };
    let trust_dir = cfg.trust_dir.as_deref();
    let mut target =
        tracing::subscriber::with_default(log(), || launch::decide(&cfg.data_dir, trust_dir));
    // At most a trial, then the version settled before it.
    for _ in 0..2 {
        let Target::Installed { version, binary } = target else {
            break;
        };
        let why = match launch::run_argv(&binary, launch::launch_args()) {
            // This process is the launcher: the version is told so.
            Ok(argv) => match std::env::current_exe() {
                Ok(me) => launch::exec(&binary, &argv, &me),
                Err(e) => launch::ExecError::new(format!("this launcher's own path: {e}")),
            },
            Err(e) => launch::ExecError::new(e),
        };
        target = tracing::subscriber::with_default(log(), || {
            launch::exec_failed(&cfg.data_dir, trust_dir, &version, &why)
        });
    }
    run_agent(run)
}

fn run_agent(run: RunArgs) -> Result<(), (u8, String)> {
    let RunArgs {
        common,
        exit_when_idle,
        quiet,
        faults,
    } = run;
    let cfg = run_config(common)?;
    let view = Arc::new(LiveView::new(quiet));
    init_tracing(Some(LiveLayer(view.clone())), cfg.log_format);
    // First: the signals' mask is inherited by every thread started after.
    let stop = Arc::new(StopFlag::default());
    let signals = watch_signals(&stop)?;
    // Bound before anything is armed: a busy or bad address is an error
    // with nothing to undo.
    let metrics = serve_metrics(cfg.metrics)?;
    let mlock = cfg.rt.mlockall;
    let parts = baton_agent::runtime::real_parts(&cfg).map_err(runtime_fault)?;
    faults.arm_early();
    let mut agent = Agent::new(cfg, parts).map_err(runtime_fault)?;
    if let Some(p) = metrics {
        agent.publish_metrics_to(p);
    }
    // READY=1 once the loop runs, WATCHDOG=1 while it and the dispatcher
    // do, STOPPING=1 on the way out; nothing without NOTIFY_SOCKET.
    agent.notify_systemd(
        baton_service::notify::Notifier::from_env(),
        baton_service::watchdog::period_from_env(),
    );
    if let Err(e) = agent.load_configured() {
        agent.wind_down();
        return Err(runtime_fault(e));
    }
    if mlock {
        lock_memory();
    }
    faults.arm_late();
    let cause = agent.run(&stop, exit_when_idle);
    view.finish(&agent.tally().hist);
    if let StopCause::Update(version) = cause {
        // The way out ran (safe states driven, the journal flushed, the
        // threads stopped); the files it held close with the exec.
        drop(agent);
        return restart_into(&version, signals);
    }
    exit_for(cause)
}

/// Hands over to the launcher, which starts `version` on trial; returns
/// only if that failed (exit 1: systemd's restart runs the launcher).
fn restart_into(version: &str, signals: SignalWatch) -> Result<(), (u8, String)> {
    use baton_agent::launch;
    let launcher = launch::launcher();
    let why = match launch::launch_argv(&launcher, std::env::args_os().skip(2).collect()) {
        // A stop asked for before the exec wins (the signal thread takes
        // it first): the version on trial runs at the next start.
        Ok(argv) => match signals.exec(launcher.clone(), argv) {
            Ok(()) => {
                tracing::info!("stopped before restarting into agent version {version}");
                return Ok(());
            }
            Err(why) => why,
        },
        Err(e) => e,
    };
    Err((
        1,
        format!(
            "error: agent update: restarting into version {version} through the launcher {}: {why}",
            launcher.display()
        ),
    ))
}

fn cancel_pack(
    pack: String,
    tenant: String,
    config_file: Option<PathBuf>,
    data: Option<PathBuf>,
    gpio: Option<String>,
) -> anyhow::Result<()> {
    init_tracing(None, LogFormat::Auto);
    let file = match &config_file {
        Some(p) => config::read_file(p)?,
        None => config::ConfigFile::default(),
    };
    let cfg = config::resolve(
        file,
        Overrides {
            data_dir: data,
            gpio,
            no_rt: true,
            ..Overrides::default()
        },
    )?;
    let key = baton_sched::PackKey { tenant, pack };
    let msg = baton_agent::runtime::cancel::cancel(&cfg, &key, std::time::Duration::from_secs(10))?;
    let _ = writeln!(std::io::stdout(), "{msg}");
    Ok(())
}

fn check_config(path: &std::path::Path) -> anyhow::Result<()> {
    let file = config::read_file(path)?;
    let cfg = config::resolve(file, Overrides::default())?;
    let bad = baton_agent::runtime::check::check(&cfg);
    if !bad.is_empty() {
        anyhow::bail!("{}", bad.join("\n"));
    }
    let link = match (cfg.controllers.as_slice(), cfg.tls.is_some()) {
        ([], _) => "no controller".to_string(),
        ([url], true) => format!("controller {url} (mTLS)"),
        ([url], false) => format!("controller {url} (plaintext)"),
        (urls, true) => format!("controllers {} (mTLS)", urls.join(", ")),
        (urls, false) => format!("controllers {} (plaintext)", urls.join(", ")),
    };
    let _ = writeln!(
        std::io::stdout(),
        "{}: ok (agent {}, gpio {}, {} pack(s), journal in {}, {link})",
        path.display(),
        cfg.id,
        cfg.gpio,
        cfg.packs.len(),
        cfg.data_dir.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shipped agent (built without `fault-injection`) refuses the
    /// hidden fault flags as unknown; the tests' build takes them.
    #[test]
    fn the_fault_flags_exist_only_in_the_tests_build() {
        for flag in [
            "--inject-panic-after=1",
            "--inject-dispatcher-stall-after=1",
            "--inject-gpio-hang-after=1",
            "--inject-gpio-hang-all",
        ] {
            let unknown = Args::try_parse_from(["baton-agent", "run", flag])
                .err()
                .is_some_and(|e| e.kind() == clap::error::ErrorKind::UnknownArgument);
            assert_eq!(unknown, !cfg!(feature = "fault-injection"), "{flag}");
        }
    }
}
