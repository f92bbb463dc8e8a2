//! `kill -9` at random moments: nothing fires twice, and nothing is missing
//! except what the agent reported as `outcome unknown` — at most one per kill
//! (the start record is durable before the device is touched).

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use baton_e2e::{Lcg, bin, lines, wait_exit};

const COUNT: usize = 200;
const SPACING_MS: i64 = 20;

#[test]
fn kill_9_never_fires_twice_and_loses_only_reported_unknowns() {
    let dir = tempfile::tempdir().expect("tempdir");
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
        unknown_ins.len() <= kills,
        "{} outcome-unknown reports for {kills} kills: {unknown_ins:?}",
        unknown_ins.len()
    );
}
