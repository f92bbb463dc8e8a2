//! `kill -9` at random moments: nothing fires twice, and nothing is missing
//! except what the agent reported as `outcome unknown` (the start record is
//! durable before the device is touched) — at most the firings due within
//! one `arm-horizon` either side of a kill (README, "Guarantees"): one per
//! kill when firings are further apart than that.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use baton_e2e::{Lcg, bin, lines, wait_exit};

const COUNT: usize = 200;
const SPACING_MS: i64 = 20;
/// `DEFAULT_ARM_HORIZON` in agent/src/config.rs.
const DEFAULT_HORIZON_MS: i64 = 50;

/// The documented bound on `outcome unknown` per kill for firings
/// `SPACING_MS` apart: those armed ahead (due within one horizon after the
/// kill) and those whose successes were left for the next pass (fired
/// within one horizon, at least 10 ms, before it), or just the one in
/// flight when firings are further apart than those two windows.
fn unknown_per_kill(horizon_ms: i64) -> usize {
    if horizon_ms + horizon_ms.max(10) < SPACING_MS {
        1
    } else {
        (2 * horizon_ms as u64).div_ceil(SPACING_MS as u64) as usize + 1
    }
}

#[test]
fn kill_9_at_the_default_horizon_never_fires_twice_and_loses_only_reported_unknowns() {
    kill_9_at_random(None, unknown_per_kill(DEFAULT_HORIZON_MS));
}

/// Firings further apart than the horizon: one unknown per kill at most.
#[test]
fn kill_9_at_a_short_horizon_loses_at_most_one_per_kill() {
    kill_9_at_random(Some(5), unknown_per_kill(5));
}

/// Kill the agent five times at random moments while it fires 200
/// one-shots, with `horizon_ms` as its `arm-horizon` (`None`: the default).
fn kill_9_at_random(horizon_ms: Option<i64>, per_kill: usize) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config_args = Vec::new();
    if let Some(h) = horizon_ms {
        let config = dir.path().join("agent.yaml");
        std::fs::write(&config, format!("arm-horizon: {h}ms\n")).expect("write config");
        config_args = vec!["--config".into(), config];
    }
    let log = dir.path().join("gpio.jsonl");
    let pack = dir.path().join("shots.yaml");
    let start = jiff::Timestamp::now() + jiff::SignedDuration::from_millis(500);
    let mut y =
        String::from("pack: shots\nversion: 1\ndefaults: {max_lateness: 1h}\ninstructions:\n");
    for i in 0..COUNT {
        let at = start + jiff::SignedDuration::from_millis(i as i64 * SPACING_MS);
        y.push_str(&format!(
            "  - {{id: s{i}, action: gpio.write, params: {{line: {}, value: 1}}, at: {at:.9}}}\n",
            i % 8
        ));
    }
    std::fs::write(&pack, y).expect("write pack");

    let mut rng = Lcg(0x5eed_ba70);
    let mut unknown: HashSet<String> = HashSet::new();
    let mut kills = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        assert!(Instant::now() < deadline, "did not finish in time");
        let mut child = Command::new(bin("baton-agent"))
            .args([
                "run",
                "--system-clock",
                "reference",
                "--exit-when-idle",
                "--id",
                "crash",
            ])
            .args(&config_args)
            .arg("--data")
            .arg(dir.path().join("data"))
            .arg("--gpio")
            .arg(format!("sim:{}", log.display()))
            .arg("--pack")
            .arg(&pack)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn agent");
        // Collect `outcome_unknown` reports from the live view.
        let stdout = child.stdout.take().expect("stdout");
        let reader = std::thread::spawn(move || {
            let mut ids = Vec::new();
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.contains("outcome_unknown")
                    && let Some(id) = line
                        .split_whitespace()
                        .find(|w| w.starts_with("default/shots/"))
                {
                    ids.push(id.trim_end_matches(':').to_string());
                }
            }
            ids
        });
        let done = if kills < 5 {
            // Let it fire for a random while; `wait_exit` then kills it with
            // SIGKILL (`Child::kill`), i.e. kill -9.
            wait_exit(&mut child, Duration::from_millis(150 + rng.next(700)))
        } else {
            wait_exit(&mut child, Duration::from_secs(60))
        };
        match done {
            Some(status) => {
                assert!(status.success(), "agent failed: {status:?}");
                unknown.extend(reader.join().expect("reader"));
                break;
            }
            None => {
                kills += 1;
                unknown.extend(reader.join().expect("reader"));
            }
        }
    }
    assert!(
        kills >= 3,
        "the agent finished before enough kills ({kills}); make the pack longer"
    );

    // Every line change in the sim log, by execution id.
    let mut seen: HashMap<String, usize> = HashMap::new();
    for l in lines(&log) {
        let v: serde_json::Value = serde_json::from_str(&l).expect("json");
        let id = v["execution_id"].as_str().expect("id").to_string();
        if id.starts_with("default/shots/") {
            *seen.entry(id).or_default() += 1;
        }
    }
    let twice: Vec<&String> = seen
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(k, _)| k)
        .collect();
    assert!(twice.is_empty(), "fired twice: {twice:?}");
    let fired: HashSet<String> = seen
        .keys()
        .filter_map(|id| id.split('/').nth(3).map(str::to_string))
        .collect();
    let missing: Vec<String> = (0..COUNT)
        .map(|i| format!("s{i}"))
        .filter(|s| !fired.contains(s))
        .collect();
    let unknown_ins: HashSet<String> = unknown
        .iter()
        .filter_map(|id| id.split('/').nth(3).map(str::to_string))
        .collect();
    for m in &missing {
        assert!(
            unknown_ins.contains(m),
            "{m} never fired and was not reported as outcome unknown (unknown: {unknown_ins:?})"
        );
    }
    eprintln!(
        "{kills} kills, {} fired once each, {} missing, {} reported outcome unknown",
        seen.len(),
        missing.len(),
        unknown_ins.len()
    );
    assert!(
        unknown_ins.len() <= kills * per_kill,
        "{} outcome-unknown reports for {kills} kills (at most {per_kill} each): {unknown_ins:?}",
        unknown_ins.len()
    );
}
