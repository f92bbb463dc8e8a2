//! Every gap is visible (issue 26): feedback an agent had to drop (its
//! outbox full while the controller was away) is accounted for entry by
//! entry in what the controller stores and shows; and a jittery link
//! (half a second of delay, with stalls) neither makes the link clock
//! step nor a pack that needs no absolute time skip a firing.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use baton_e2e::fleet::{json_lines, start_agent_clock, start_controller};
use baton_e2e::wait_until;

const WAIT: Duration = Duration::from_secs(30);

fn text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn entries_dropped_at_a_full_outbox_are_accounted_for() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut c = start_controller(&dir.path().join("ctl"), "127.0.0.1:0");
    let cfg = dir.path().join("agent.yaml");
    std::fs::write(&cfg, "outbox-cap: 40\n").expect("config");
    let a = start_agent_clock(
        &dir.path().join("a1"),
        "a1",
        &c.url,
        &["--config", cfg.to_str().expect("utf-8")],
    );
    assert!(wait_until(WAIT, || c.connected("a1")), "{}", a.log());
    let pack = dir.path().join("p.yaml");
    std::fs::write(
        &pack,
        "pack: p\nversion: 1\ntargets: {agents: [a1]}\ninstructions:\n  \
         - {id: tick, action: gpio.toggle, params: {line: 1}, every: 20ms}\n",
    )
    .expect("pack");
    let o = c.ctl(&["push", pack.to_str().expect("utf-8")]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        wait_until(WAIT, || c.feedback("p").len() > 20),
        "no feedback"
    );

    // The controller away while about 150 entries are made: the outbox
    // keeps the newest 40.
    c.kill9();
    let fired = a.writes().len();
    assert!(
        wait_until(WAIT, || a.writes().len() > fired + 150),
        "{}",
        a.log()
    );
    c.restart();
    assert!(wait_until(WAIT, || c.connected("a1")), "{}", a.log());

    // Stored seqs have holes; each is exactly what the next stored entry
    // says was dropped before it.
    let accounted = || {
        let rows = c.feedback("p");
        let mut seqs: Vec<(u64, u64)> = rows
            .iter()
            .map(|r| {
                (
                    r["seq"].as_u64().expect("seq"),
                    r["dropped_before"].as_u64().expect("dropped_before"),
                )
            })
            .collect();
        seqs.sort_unstable();
        let mut missing = 0;
        let mut told = 0;
        for w in seqs.windows(2) {
            missing += w[1].0 - w[0].0 - 1;
            told += w[1].1;
        }
        (missing, told)
    };
    assert!(
        wait_until(WAIT, || {
            let (missing, told) = accounted();
            missing > 0 && missing == told
        }),
        "holes and drops disagree: {:?}\n{}",
        accounted(),
        c.log()
    );
    let o = c.ctl(&["feedback", "--pack", "p"]);
    assert!(
        text(&o).contains("entries dropped at the agent a1 (outbox full)"),
        "{}",
        text(&o)
    );
    assert!(
        c.log().contains("dropped at the agent (outbox full)"),
        "{}",
        c.log()
    );
}

/// A TCP relay that delays each chunk by `delay` ± `jitter` (order kept)
/// and, every `stall_every`, holds everything for `stall`.
fn relay(
    to: String,
    delay: Duration,
    jitter: Duration,
    stall_every: Duration,
    stall: Duration,
) -> (String, Arc<AtomicBool>) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    let start = Instant::now();
    std::thread::spawn(move || {
        for c in l.incoming() {
            if stopped.load(Ordering::Relaxed) {
                return;
            }
            let Ok(client) = c else { continue };
            let Ok(server) = TcpStream::connect(&to) else {
                continue;
            };
            for (from, into) in [
                (client.try_clone(), server.try_clone()),
                (server.try_clone(), client.try_clone()),
            ] {
                let (Ok(from), Ok(into)) = (from, into) else {
                    continue;
                };
                pump(from, into, delay, jitter, stall_every, stall, start);
            }
        }
    });
    (addr, stop)
}

/// One direction: chunks read as they come, written when their delay is
/// over (never before an earlier chunk).
fn pump(
    mut from: TcpStream,
    mut into: TcpStream,
    delay: Duration,
    jitter: Duration,
    stall_every: Duration,
    stall: Duration,
    start: Instant,
) {
    let (tx, rx) = std::sync::mpsc::channel::<(Instant, Vec<u8>)>();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        let mut n_chunk = 0u64;
        let mut last = Instant::now();
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            n_chunk += 1;
            // A deterministic jitter: an offset in [0, jitter) per chunk,
            // around `delay`.
            let j = jitter.mul_f64(((n_chunk * 7919) % 1000) as f64 / 1000.0);
            let mut at = Instant::now() + delay.saturating_sub(jitter / 2) + j;
            let since = at.duration_since(start);
            let phase = Duration::from_nanos((since.as_nanos() % stall_every.as_nanos()) as u64);
            if phase < stall {
                at += stall - phase;
            }
            at = at.max(last);
            last = at;
            if tx.send((at, buf[..n].to_vec())).is_err() {
                return;
            }
        }
    });
    std::thread::spawn(move || {
        for (at, bytes) in rx {
            let now = Instant::now();
            if at > now {
                // The relay's own pacing (a network's delay), not a test
                // waiting for an event.
                std::thread::sleep(at - now);
            }
            if into.write_all(&bytes).is_err() {
                return;
            }
        }
    });
}

#[test]
fn a_jittery_link_neither_steps_the_clock_nor_skips_a_periodic_firing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = start_controller(&dir.path().join("ctl"), "127.0.0.1:0");
    // 250 ms each way ± 100 ms, and every 7 s nothing for 1.5 s.
    let (addr, stop) = relay(
        c.addr.clone(),
        Duration::from_millis(250),
        Duration::from_millis(200),
        Duration::from_secs(7),
        Duration::from_millis(1500),
    );
    // The agent's only clock is the link's (its system clock untrusted).
    let a = start_agent_clock(
        &dir.path().join("a1"),
        "a1",
        &format!("http://{addr}"),
        &["--system-clock", "untrusted"],
    );
    assert!(wait_until(WAIT, || c.connected("a1")), "{}", a.log());
    let pack = dir.path().join("p.yaml");
    std::fs::write(
        &pack,
        "pack: p\nversion: 1\ntargets: {agents: [a1]}\ninstructions:\n  \
         - {id: tick, action: gpio.toggle, params: {line: 1}, every: 50ms}\n",
    )
    .expect("pack");
    let o = c.ctl(&["push", "--wait", "60s", pack.to_str().expect("utf-8")]);
    assert!(o.status.success(), "{}", text(&o));
    let started = Instant::now();
    let fired = a.writes().len();
    // Half a minute of firings through delays and stalls.
    assert!(
        wait_until(Duration::from_secs(60), || started.elapsed()
            > Duration::from_secs(30)
            && a.writes().len() > fired + 500),
        "{}",
        a.log()
    );
    stop.store(true, Ordering::Relaxed);
    let skipped: Vec<serde_json::Value> = {
        let o = c.ctl(&["feedback", "--pack", "p", "--json"]);
        json_lines(&o.stdout)
            .into_iter()
            .filter(|r| r["outcome"] == "skipped")
            .collect()
    };
    assert!(skipped.is_empty(), "skipped firings: {skipped:?}");
    // The first lock may step the estimate once; a jittery link after it
    // must not.
    let steps = a
        .log()
        .lines()
        .filter(|l| l.contains("clock step detected"))
        .count();
    assert!(
        steps <= 1,
        "the link clock stepped {steps} times:\n{}",
        a.log()
    );
    // Every 50 ms, none missing: the executions' scheduled instants (on
    // the reference timescale the link gives) follow one another by
    // exactly one period.
    let o = c.ctl(&["feedback", "--pack", "p", "--json"]);
    let mut at: Vec<i64> = json_lines(&o.stdout)
        .iter()
        .filter(|r| r["instruction"] == "tick" && r["outcome"] == "ok")
        .filter_map(|r| r["scheduled_ns"].as_i64())
        .collect();
    at.sort_unstable();
    assert!(at.len() > 300, "{} executions stored", at.len());
    let off: Vec<i64> = at
        .windows(2)
        .map(|p| p[1] - p[0])
        .filter(|d| *d != 50_000_000)
        .collect();
    assert!(off.is_empty(), "occurrences not 50 ms apart: {off:?}");
}
