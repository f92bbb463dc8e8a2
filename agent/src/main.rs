//! `baton-agent`: the edge agent. Exit codes: 0 success, 1 invalid input or
//! runtime failure (with a message naming the file / instruction), 2 usage.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::Context;
use baton_agent::config::{self, Overrides};
use baton_agent::live::LiveView;
use baton_agent::runtime::Agent;
use baton_agent::simulate::{self, FailSpec, SimOptions};
use baton_proto::pack::read_pack_file;
use baton_proto::time::parse_instant_arg;
use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(name = "baton-agent", version, about = "baton edge agent")]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the agent: journal, scheduler core, dispatcher, GPIO.
    Run {
        #[command(flatten)]
        common: CommonFlags,
        /// Exit (after the safe state) once nothing is left to do.
        #[arg(long)]
        exit_when_idle: bool,
        /// Only notes and summaries, no line per firing.
        #[arg(long)]
        quiet: bool,
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

/// Flags shared by `run` (each overrides the config file).
#[derive(clap::Args, Debug)]
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
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = match args.command {
        Command::Run {
            common,
            exit_when_idle,
            quiet,
        } => run_agent(common, exit_when_idle, quiet).map_err(|e| (1, format!("error: {e:#}"))),
        Command::CheckConfig { file } => check_config(&file).map_err(|e| (1, format!("{e:#}"))),
        Command::BenchLatency {
            count,
            interval,
            cpu,
            json,
        } => baton_agent::bench::latency(count, &interval, cpu, json)
            .map_err(|e| (1, format!("error: {e:#}"))),
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
            eprintln!("{msg}");
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

fn run_agent(f: CommonFlags, exit_when_idle: bool, quiet: bool) -> anyhow::Result<()> {
    let file = match &f.config {
        Some(p) => config::read_file(p)?,
        None => config::ConfigFile::default(),
    };
    let cfg = config::resolve(
        file,
        Overrides {
            id: f.id,
            data_dir: f.data,
            gpio: f.gpio,
            packs: f.pack,
            no_rt: f.no_rt,
        },
    )?;
    // SIGTERM / SIGINT: stop the loop; the agent then enters the safe state,
    // flushes the journal and exits 0.
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    let mut view = LiveView::new(quiet);
    let mut agent = Agent::start(cfg, &mut view)?;
    agent.run(&stop, exit_when_idle, &mut view)?;
    println!();
    println!("summary: {}", baton_agent::live::summary(agent.histogram()));
    Ok(())
}

fn check_config(path: &std::path::Path) -> anyhow::Result<()> {
    let file = config::read_file(path)?;
    let cfg = config::resolve(file, Overrides::default())?;
    let mut bad = Vec::new();
    for p in &cfg.packs {
        if let Err(e) = read_pack_file(p) {
            bad.push(e);
        }
    }
    if !bad.is_empty() {
        anyhow::bail!("{}", bad.join("\n"));
    }
    println!(
        "{}: ok (agent {}, gpio {}, {} pack(s), journal in {})",
        path.display(),
        cfg.id,
        cfg.gpio,
        cfg.packs.len(),
        cfg.data_dir.display()
    );
    Ok(())
}
