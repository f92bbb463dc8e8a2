//! Figures of an agent update on the box (issue 39), in one run of the
//! real binary (this bench's release build) against a fake controller in
//! this process:
//!
//! 1. the download's effect on a 1 kHz pack's lateness: the lateness the
//!    agent reports for each firing over a window before the download,
//!    over the download of a release (the same build stamped with another
//!    version) at `update.download-rate` (`FIGURES_RATE`, default the
//!    agent's default), and over a window after it (A B A), as ratios of
//!    the p99s — the windows without a download are the peers;
//! 2. the pause in firings around the restart into it: with a 1 s pack
//!    (a 1 kHz pack never leaves the box quiet, so it is cancelled first),
//!    the time from the box saying it restarts to the new version's Hello,
//!    and the largest gap between firings in the sim GPIO log against the
//!    period.
//!
//! Run: `cargo bench -p baton-agent --bench update_figures` (as root for
//! the dispatcher's SCHED_FIFO, as on a box). Prints a Markdown table.

#[path = "../tests/rig/fake.rs"]
#[allow(dead_code)]
mod fake;
#[path = "../tests/rig/update_site.rs"]
#[allow(dead_code)]
mod update_site;

use std::time::{Duration, Instant};

use baton_proto::wire::{self, update_state::Phase};
use update_site::{Controller, Seen, Site, cancel, push};

const AGENT: &str = env!("CARGO_BIN_EXE_baton-agent");

const FAST: &str = "pack: fast\nversion: 1\nsafe_state:\n  - {action: gpio.write, params: {line: 7, value: 0}}\ninstructions:\n  - {id: on, action: gpio.write, params: {line: 7, value: 1}, every: 1ms}\n";
const SLOW: &str = "pack: slow\nversion: 1\nsafe_state:\n  - {action: gpio.write, params: {line: 8, value: 0}}\ninstructions:\n  - {id: tick, action: gpio.write, params: {line: 8, value: 1}, every: 1s}\n";

/// Lateness percentiles (µs) of the successful firings among `f`.
fn lateness<'a>(f: impl Iterator<Item = &'a wire::Feedback>) -> (usize, f64, f64, f64) {
    let mut l: Vec<i64> = f
        .filter(|f| f.instruction == "on" && f.outcome == wire::Outcome::Ok as i32)
        .map(|f| f.lateness_ns)
        .collect();
    l.sort_unstable();
    let at = |q: f64| {
        let i = ((l.len() as f64 * q).ceil() as usize).clamp(1, l.len().max(1)) - 1;
        l.get(i).copied().unwrap_or(0) as f64 / 1000.0
    };
    (l.len(), at(0.5), at(0.99), at(1.0))
}

/// Waits until the feedback holds `n` more entries than `from`.
fn until_seq(c: &mut Controller, site: &Site, seq: u64) {
    while c.last_seq() < seq {
        let _ = c.next(&site.fake);
    }
}

fn main() {
    let rate: u64 = std::env::var("FIGURES_RATE")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(baton_agent::config::DEFAULT_DOWNLOAD_RATE);
    let baseline_s: u64 = std::env::var("FIGURES_BASELINE_S")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(20);
    let site = Site::new(
        AGENT,
        &format!("{{download-rate: {rate}, quiet-margin: 100ms}}"),
    );
    let release = baton_agent::version::stamp(&std::fs::read(AGENT).expect("agent"), "9.9.9")
        .expect("one version slot");
    let mut c = Controller::new(release.clone());
    let agent = site.launch_with(&[]);
    c.hello(&site.fake);
    push(&c, "fast", 1, FAST);
    // Warm-up: 10 s of firings, then the baseline window.
    until_seq(&mut c, &site, 10_000);
    let a = c.last_seq();
    until_seq(&mut c, &site, a + baseline_s * 1_000);
    let b = c.last_seq();
    let offered = Instant::now();
    c.send(site.offer("9.9.9", &release));
    c.update(&site.fake, Phase::Installed);
    let download = offered.elapsed();
    let d = c.last_seq();
    // After: installed, waiting for a quiet moment the 1 kHz pack never
    // leaves.
    until_seq(&mut c, &site, d + baseline_s * 1_000);
    let e = c.last_seq();
    let (n0, p50_0, p99_0, max_0) = lateness(c.feedback_between(a, b));
    let (n1, p50_1, p99_1, max_1) = lateness(c.feedback_between(b, d));
    let (n2, p50_2, p99_2, max_2) = lateness(c.feedback_between(d, e));

    // The restart: only once the box is quiet.
    cancel(&c, "fast", 1);
    push(&c, "slow", 1, SLOW);
    // The new version's Hello (the box's RESTARTING state is said on the
    // way out and may not leave before the link stops: not waited for).
    let hello = loop {
        if let Seen::Hello(h) = c.next(&site.fake) {
            break h;
        }
    };
    let hello_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_nanos() as i64;
    assert_eq!(hello.agent_version, "9.9.9");
    let after = c.last_seq();
    // Three firings of the new version.
    let end = Instant::now() + Duration::from_secs(30);
    while c
        .feedback_between(after, u64::MAX)
        .filter(|f| f.instruction == "tick" && f.outcome == wire::Outcome::Ok as i32)
        .count()
        < 3
    {
        assert!(Instant::now() < end, "the new version does not fire");
        let _ = c.next(&site.fake);
    }
    agent.stop();
    let line8: Vec<(i64, i64)> = std::fs::read_to_string(site.path("gpio.jsonl"))
        .expect("sim log")
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("json"))
        .filter(|w| w["line"] == 8)
        .filter_map(|w| Some((w["t"].as_i64()?, w["value"].as_i64()?)))
        .collect();
    let ticks: Vec<i64> = line8.iter().filter(|w| w.1 == 1).map(|w| w.0).collect();
    // The way out's safe-state write (the sim log's clock is the system
    // clock, as this process's) to the new version's Hello.
    let safe_at = line8
        .iter()
        .filter(|w| w.1 == 0 && w.0 < hello_ns)
        .map(|w| w.0)
        .max()
        .expect("the safe state written at the restart");
    let pause_ms = (hello_ns - safe_at) as f64 / 1e6;
    let gap = ticks.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
    let not_run = c
        .feedback_between(0, u64::MAX)
        .filter(|f| f.instruction == "tick" && f.outcome != wire::Outcome::Ok as i32)
        .count();

    let mb = release.len() as f64 / 1e6;
    println!("| window | firings | lateness p50 | p99 | max |");
    println!("|---|---|---|---|---|");
    println!(
        "| 1 kHz pack, baseline ({baseline_s} s) | {n0} | {p50_0:.1} µs | {p99_0:.1} µs | {max_0:.1} µs |"
    );
    println!(
        "| 1 kHz pack, during the download ({mb:.1} MB at {} KiB/s: {:.1} s) | {n1} | {p50_1:.1} µs | {p99_1:.1} µs | {max_1:.1} µs |",
        rate / 1024,
        download.as_secs_f64()
    );
    println!(
        "| 1 kHz pack, after ({baseline_s} s) | {n2} | {p50_2:.1} µs | {p99_2:.1} µs | {max_2:.1} µs |"
    );
    let ratio = |x: f64, y: f64| if y > 0.0 { x / y } else { f64::NAN };
    println!(
        "\np99 during / before: **{:.2}×**; during / after: **{:.2}×**",
        ratio(p99_1, p99_0),
        ratio(p99_1, p99_2)
    );
    println!(
        "\nrestart (1 s pack): the safe state written on the way out → the new version's Hello: **{pause_ms:.0} ms**; largest gap between firings in the sim log: {} ms (period 1000 ms); firings of the 1 s pack not run: {not_run}",
        gap / 1_000_000
    );
}
