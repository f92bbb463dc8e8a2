//! `baton-agent`: the edge agent. Exit codes: 0 success, 1 invalid input or
//! runtime failure (with a message naming the file / instruction), 2 usage.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use baton_agent::simulate::{self, FailSpec, SimOptions};
use baton_proto::pack::parse_pack_bytes;
use baton_proto::RefTime;
use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(name = "baton-agent", version, about = "baton edge agent")]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
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

fn instant(flag: &str, text: &str) -> Result<RefTime, String> {
    text.parse::<jiff::Timestamp>()
        .ok()
        .and_then(RefTime::from_timestamp)
        .ok_or_else(|| format!("{flag} `{text}` is not an RFC 3339 instant (e.g. 2026-12-01T10:00:00Z)"))
}

fn load(file: &PathBuf) -> Result<baton_proto::Pack, String> {
    let name = file.display().to_string();
    let bytes = std::fs::read(file).map_err(|e| format!("{name}:1:1: cannot read the file: {e}"))?;
    parse_pack_bytes(&bytes).map_err(|e| e.render(&name).trim_end().to_string())
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = match args.command {
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
    let from = instant("--from", from).map_err(|e| (2, format!("error: {e}")))?;
    let until = instant("--until", until).map_err(|e| (2, format!("error: {e}")))?;
    if until < from {
        return Err((2, "error: --until is before --from".into()));
    }
    let pack = load(&file).map_err(|e| (1, e))?;
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
    if let Some(e) = io_err {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            return Err((1, format!("error: writing output: {e}")));
        }
    }
    if !complete {
        return Err((1, format!("error: stopped after {max_events} events (--max-events); narrow --from/--until")));
    }
    Ok(())
}
