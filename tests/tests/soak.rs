//! Soak: steady firing with random `kill -9` and restarts. No execution id
//! runs twice across all runs, every instruction keeps firing after each
//! restart, and resident memory stays flat while the agent runs.
//!
//! The CI variant is short (debug build, 2 000 firings/s, 3 kills). The
//! long one is for a release build and a quiet machine:
//!
//! ```sh
//! cargo build --release -p baton-agent
//! BATON_SOAK_SECS=600 BATON_SOAK_RATE=10000 BATON_AGENT=target/release/baton-agent \
//!     cargo test -p baton-e2e --test soak -- --nocapture
//! ```

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use baton_e2e::{Lcg, Running, bin, lines, signal, wait_exit, wait_until};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn rss_kb(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn agent_bin() -> PathBuf {
    std::env::var_os("BATON_AGENT")
        .map(PathBuf::from)
        .unwrap_or_else(|| bin("baton-agent"))
}

fn start(dir: &Path, pack: &Path) -> Running {
    Running(
        Command::new(agent_bin())
            .args(["run", "--system-clock", "reference", "--quiet", "--no-rt"])
            .arg("--data")
            .arg(dir.join("data"))
            .arg("--gpio")
            .arg(format!("sim:{}", dir.join("gpio.jsonl").display()))
            .arg("--pack")
            .arg(pack)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn agent"),
    )
}

#[test]
fn steady_firing_with_random_kills_never_repeats_and_stays_flat() {
    let secs = env_u64("BATON_SOAK_SECS", 8);
    let rate = env_u64("BATON_SOAK_RATE", 2000);
    let kills = env_u64("BATON_SOAK_KILLS", 3);
    let instructions = (rate / 100).max(1);
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let pack = dir.join("soak.yaml");
    let mut y = String::from(
        "pack: soak\nversion: 1\nsafe_state:\n  - {action: gpio.write, params: {line: 0, value: 0}}\ninstructions:\n",
    );
    for i in 0..instructions {
        y.push_str(&format!(
            "  - {{id: s{i}, action: gpio.toggle, params: {{line: {i}}}, every: 10ms}}\n"
        ));
    }
    std::fs::write(&pack, y).expect("pack");
    let log = dir.join("gpio.jsonl");
    let mut rng = Lcg(0x5eed);
    let run_for = Duration::from_secs(secs) / (kills as u32 + 1);
    let mut samples: Vec<u64> = Vec::new();
    for round in 0..=kills {
        let mut child = start(dir, &pack);
        let before = lines(&log).len();
        assert!(
            wait_until(Duration::from_secs(30), || lines(&log).len() > before + 100),
            "round {round}: the agent did not fire"
        );
        let last_round = round == kills;
        let end = Instant::now() + run_for.mul_f64(0.5 + rng.next(100) as f64 / 100.0);
        while Instant::now() < end {
            if last_round && let Some(kb) = rss_kb(child.id()) {
                samples.push(kb);
            }
            // Sampling RSS a few times a second; the agent fires meanwhile.
            std::thread::park_timeout(Duration::from_millis(200));
        }
        if last_round {
            signal(&child, libc::SIGTERM);
            let status = wait_exit(&mut child, Duration::from_secs(30)).expect("exits");
            assert!(status.success(), "{status:?}");
        } else {
            child.kill().expect("kill -9");
            let _ = child.wait();
        }
    }
    // No execution id twice, across every run and kill.
    let mut seen: HashSet<String> = HashSet::new();
    let mut per_instr: HashMap<String, usize> = HashMap::new();
    for l in lines(&log) {
        let v: serde_json::Value = match serde_json::from_str(&l) {
            Ok(v) => v,
            Err(_) => continue, // a line torn by kill -9
        };
        let Some(id) = v["execution_id"].as_str() else {
            continue;
        };
        if id.contains("safe_state") {
            continue;
        }
        assert!(seen.insert(id.to_string()), "{id} ran twice");
        if let Some(instr) = id.split('/').nth(3) {
            *per_instr.entry(instr.to_string()).or_default() += 1;
        }
    }
    assert_eq!(
        per_instr.len() as u64,
        instructions,
        "every instruction fired"
    );
    // Resident memory flat over the last run: its second half no higher
    // than its first half's peak plus 25 % (allocator noise).
    if samples.len() >= 6 {
        let (a, b) = samples.split_at(samples.len() / 2);
        let peak_a = a.iter().copied().max().unwrap_or(0);
        let peak_b = b.iter().copied().max().unwrap_or(0);
        eprintln!(
            "soak: {} ids, RSS first half peak {peak_a} kB, second half peak {peak_b} kB",
            seen.len()
        );
        assert!(
            peak_b <= peak_a + peak_a / 4,
            "RSS grew: {peak_a} kB -> {peak_b} kB"
        );
    }
}
