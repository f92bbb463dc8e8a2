//! `baton-agent bench-latency`: the whole firing path (core, journal,
//! dispatcher, sim GPIO) driven by a pack of N gpio.write firings, with the
//! lateness distribution and the CPU it cost. docs/bench/latency.md compares
//! it with `cyclictest` run side by side (scripts/bench-latency.sh).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use anyhow::Context;
use baton_proto::time::parse_duration;

use crate::config::{self, ConfigFile, Overrides};
use crate::runtime::feedback::Tally;
use crate::runtime::{Agent, StopFlag};

fn cpu_ns() -> i64 {
    baton_clock::clock_ns(nix::time::ClockId::CLOCK_PROCESS_CPUTIME_ID)
}

/// CPU time of this process's `baton-dispatch` thread so far, ns (the
/// first field of its /proc schedstat; 0 if unreadable).
fn dispatch_cpu_ns() -> i64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    for t in tasks.flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim() == "baton-dispatch" {
            return std::fs::read_to_string(t.path().join("schedstat"))
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse().ok())
                .unwrap_or(0);
        }
    }
    0
}

/// What the run cost, ns, and what arrived late at the dispatcher.
struct Cost {
    /// Wall time of the run.
    wall: i64,
    /// CPU of the whole process.
    cpu: i64,
    /// CPU of the dispatcher thread.
    dispatch_cpu: i64,
    /// Time the dispatcher spun before deadlines.
    spin: i64,
    /// Jobs that reached the dispatcher past their deadline.
    arrived_late: u64,
    /// The CPU wake-up latency in force during the run, µs (`None`: not
    /// readable, e.g. not root).
    idle_latency_us: Option<i32>,
}

/// The bench's `realtime:` settings, as the flags give them (`None`: the
/// agent's default).
#[derive(Clone, Debug, Default)]
pub struct Realtime {
    /// CPU to pin the dispatcher to.
    pub cpu: Option<usize>,
    /// `realtime.spin-budget`.
    pub spin_budget: Option<String>,
    /// `realtime.idle-latency`.
    pub idle_latency: Option<String>,
}

/// Run the benchmark and print the figures.
pub fn latency(count: u64, interval: &str, realtime: Realtime, json: bool) -> anyhow::Result<()> {
    let period = parse_duration(interval).map_err(|e| anyhow::anyhow!("--interval: {e}"))?;
    if count == 0 || period < Duration::from_micros(100) {
        anyhow::bail!("--count must be ≥ 1 and --interval ≥ 100us");
    }
    let dir = std::env::temp_dir().join(format!("baton-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut agent = bench_agent(&dir, interval, realtime)?;
    agent.exit_after(count);
    agent.measure_breakdown();
    // The CPUs' wake-up bound while the agent runs (its dispatcher holds
    // the request): what the figures were measured under.
    let idle_latency_us = crate::rt::idle_latency_in_force();
    let expected = period.saturating_mul(u32::try_from(count).unwrap_or(u32::MAX));
    let (finished, dispatch_seen) = watch_progress(expected);
    let cpu0 = cpu_ns();
    let dispatch0 = dispatch_cpu_ns();
    let wall0 = baton_clock::mono_now().as_nanos();
    let stop = StopFlag::default();
    if let crate::runtime::StopCause::Fault(e) = agent.run(&stop, true) {
        return Err(e.into());
    }
    finished.store(true, Ordering::Release);
    let wall = baton_clock::mono_now().as_nanos() - wall0;
    let cpu = cpu_ns() - cpu0;
    let dispatch_cpu = (dispatch_seen.load(Ordering::Acquire) - dispatch0).max(0);
    let stats = agent
        .dispatcher_stats()
        .context("the bench runs the real dispatcher")?;
    let cost = Cost {
        wall,
        cpu,
        dispatch_cpu,
        spin: stats.spin_ns.load(Ordering::Relaxed) as i64,
        arrived_late: stats.arrived_late.load(Ordering::Relaxed),
        idle_latency_us,
    };
    let tally = agent.tally();
    let _ = std::fs::remove_dir_all(&dir);
    if json {
        print_json(tally, period, &cost);
    } else {
        print_text(tally, interval, &cost);
    }
    Ok(())
}

/// An agent in `dir` loaded with the bench pack: `gpio.write` every
/// `interval` on the sim backend.
fn bench_agent(dir: &Path, interval: &str, realtime: Realtime) -> anyhow::Result<Agent> {
    // Intervals only (no `start_at`, no `until`): a pack of plain `every`
    // runs on any clock, so a box whose clock nothing synchronises yet (the
    // first thing one tries on a new box) measures at once instead of
    // waiting for absolute time. Lateness is measured on the monotonic
    // clock; the run ends after `count` firings.
    let pack = format!(
        "pack: bench-latency\nversion: 1\ninstructions:\n  - {{id: w, action: gpio.write, params: {{line: 0, value: 1}}, every: {interval}, max_lateness: 1s}}\n"
    );
    let pack_path = dir.join("pack.yaml");
    std::fs::write(&pack_path, pack).context("writing the bench pack")?;
    // The agent's defaults (its arming horizon keeps the journal's fsyncs
    // off the firing path), but for what the flags set.
    let mut file = ConfigFile::default();
    file.realtime.cpu = realtime.cpu;
    file.realtime.spin_budget = realtime.spin_budget;
    file.realtime.idle_latency = realtime.idle_latency;
    let cfg = config::resolve(
        file,
        Overrides {
            id: Some("bench".into()),
            data_dir: Some(dir.join("data")),
            // The sim backend logging to /dev/null: a write(2) to a real
            // file can block behind the journal's fsync on the same file
            // system, which would measure the disk, not the dispatcher.
            gpio: Some("sim:/dev/null".into()),
            packs: vec![pack_path],
            no_rt: false,
            ..Overrides::default()
        },
    )?;
    let parts = crate::runtime::real_parts(&cfg)?;
    let mut agent = Agent::new(cfg, parts)?;
    if let Err(e) = agent.load_configured() {
        agent.wind_down();
        return Err(e.into());
    }
    Ok(agent)
}

/// A thread that samples the dispatcher thread's CPU while it runs (it is
/// gone once the run returns) and, never a silent wait, warns if the run
/// takes far longer than `expected`, until the flag returned is set.
fn watch_progress(expected: Duration) -> (Arc<AtomicBool>, Arc<AtomicI64>) {
    let finished = Arc::new(AtomicBool::new(false));
    let watch = finished.clone();
    let dispatch_seen = Arc::new(AtomicI64::new(0));
    let seen = dispatch_seen.clone();
    std::thread::spawn(move || {
        let mut waited = Duration::ZERO;
        let step = expected + Duration::from_secs(5);
        while !watch.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(100));
            let d = dispatch_cpu_ns();
            if d > 0 {
                seen.store(d, Ordering::Release);
            }
            waited += Duration::from_millis(100);
            if waited >= step && !watch.load(Ordering::Acquire) {
                tracing::warn!(
                    "bench-latency: still running after {:.1}s (expected ~{:.1}s): the firings are not keeping up; see the agent's log lines above",
                    waited.as_secs_f64(),
                    expected.as_secs_f64()
                );
                waited = Duration::ZERO;
            }
        }
    });
    (finished, dispatch_seen)
}

/// The figures as one JSON object (`--json`).
fn print_json(tally: &Tally, period: Duration, c: &Cost) {
    let h = &tally.hist;
    let q = |p: f64| h.value_at_quantile(p);
    let breakdown: serde_json::Map<String, serde_json::Value> = tally
        .breakdown
        .iter()
        .flat_map(|b| b.rows())
        .map(|(name, v)| (name.to_string(), serde_json::json!(v)))
        .collect();
    println!(
        "{}",
        serde_json::json!({
            "count": h.len(), "interval_ns": period.as_nanos() as u64,
            "p50_ns": q(0.5), "p99_ns": q(0.99), "p999_ns": q(0.999), "max_ns": h.max(),
            "early": tally.early, "failed": tally.failed, "arrived_late": c.arrived_late,
            "spin_cpu_pct": 100.0 * c.spin as f64 / c.wall as f64,
            "dispatch_cpu_pct": 100.0 * c.dispatch_cpu as f64 / c.wall as f64,
            "process_cpu_pct": 100.0 * c.cpu as f64 / c.wall as f64,
            "idle_latency_us": c.idle_latency_us,
            "breakdown_ns": breakdown,
        })
    );
}

/// The figures as text.
fn print_text(tally: &Tally, interval: &str, c: &Cost) {
    let h = &tally.hist;
    let q = |p: f64| h.value_at_quantile(p);
    println!(
        "firings      {} every {interval} (early: {}, failed: {})",
        h.len(),
        tally.early,
        tally.failed
    );
    println!(
        "lateness ns  p50 {}  p99 {}  p99.9 {}  max {}",
        q(0.5),
        q(0.99),
        q(0.999),
        h.max()
    );
    println!(
        "cpu          spinning {:.2}% of one core, dispatcher thread {:.2}%, whole process {:.2}%",
        100.0 * c.spin as f64 / c.wall as f64,
        100.0 * c.dispatch_cpu as f64 / c.wall as f64,
        100.0 * c.cpu as f64 / c.wall as f64
    );
    match c.idle_latency_us {
        Some(us) => println!("cpu idle     wake-up latency bound {us} µs in force"),
        None => println!("cpu idle     wake-up latency bound not readable (not root?)"),
    }
    if let Some(b) = &tally.breakdown {
        println!(
            "breakdown ns (p50 p99 max; {} job(s) reached the dispatcher late)",
            b.arrived_late
        );
        for (name, [a, b, c]) in b.rows() {
            println!("  {name:<36} {a:>10} {b:>10} {c:>10}");
        }
    }
}
