//! `kill -9` at random moments: nothing fires twice, and every firing that
//! was armed when the agent died is resolved after the restart from the
//! dispatch ledger (README, "Guarantees"): it ran (its outcome reported) or
//! it did not (it fires late, within `max_lateness`). The only unknown left
//! is a firing the kill caught inside its device call (a write(2) to the
//! sim log, a few microseconds), which the agent names in its log.
//!
//! The power-cut case loses the page cache, and with it the ledger (a
//! tmpfs file); emulated here by deleting the ledger between the kill and
//! the restart (and, as root, dropping the page cache, which on its own
//! loses nothing: the kernel only drops clean pages). Then the journal alone
//! decides, and the documented bound on `outcome unknown` per crash holds:
//! the firings armed within one `arm-horizon` after it plus the results
//! not yet written within one results window (the horizon, at most 50 ms,
//! at least 10 ms) before it.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use baton_e2e::{Lcg, bin, lines, wait_exit};

const COUNT: usize = 400;
const SPACING_MS: i64 = 5;
/// `DEFAULT_ARM_HORIZON` in agentconfig/src/lib.rs.
const DEFAULT_HORIZON_MS: i64 = 150;

/// The bound on `outcome unknown` per `kill -9` without the ledger, for
/// firings `SPACING_MS` apart: those armed ahead (due within one horizon
/// after the crash) and those whose results were not yet written (within
/// one results window before it: the horizon, at most 50 ms and at least
/// 10 ms; `runtime::results_window`). The page cache survives a `kill -9`:
/// a result written but not yet synced counts as known here (a power cut
/// loses it too: the README's bound is a horizon on both sides).
fn unknown_per_crash_without_ledger(horizon_ms: i64) -> usize {
    let results_ms = horizon_ms.clamp(10, 50);
    ((horizon_ms + results_ms) as u64).div_ceil(SPACING_MS as u64) as usize + 1
}

/// The ledger kept across each kill: zero unknowns but the firings caught
/// inside their device call (at most one per kill, named by the agent).
#[test]
fn kill_9_resolves_every_armed_firing_and_never_fires_twice() {
    let r = kill_9_at_random(false);
    assert!(
        r.interrupted.len() <= r.kills,
        "more firings caught inside their device call than kills: {:?}",
        r.interrupted
    );
    let unexplained: Vec<&String> = r.unknown.difference(&r.interrupted).collect();
    assert!(
        unexplained.is_empty(),
        "outcome unknown although the ledger knew: {unexplained:?}"
    );
}

/// The power cut: the ledger lost at each crash. The journal's bound holds.
#[test]
fn a_lost_ledger_leaves_at_most_the_documented_unknowns() {
    let r = kill_9_at_random(true);
    let per = unknown_per_crash_without_ledger(DEFAULT_HORIZON_MS);
    assert!(
        r.unknown.len() <= r.kills * per + r.catch_up,
        "{} outcome-unknown reports for {} crashes (at most {per} each, plus {} armed together by restarts' first passes): {:?}\n{}",
        r.unknown.len(),
        r.kills,
        r.catch_up,
        r.unknown,
        r.lives.join("\n")
    );
}

struct Run {
    kills: usize,
    /// Instructions reported `outcome unknown`.
    unknown: HashSet<String>,
    /// Instructions the agent said were inside their device call.
    interrupted: HashSet<String>,
    /// Each life's log (stderr: its start, restore, ledger verdict), with
    /// its spawn and kill, in ms since the run began: a failure's evidence.
    lives: Vec<String>,
    /// What the killed lives' first passes armed together that had come
    /// due while the agent was down (the README's power-cut row: beyond
    /// the horizon's worth, a restart's catch-up is one batch). A life
    /// killed before its first pass said so counts every shot due by its
    /// kill (plus a horizon) that had not fired before it started.
    catch_up: usize,
}

/// The catch-up a life's first pass armed, from its log line (`None`: the
/// line is not that one).
fn catch_up_armed(line: &str) -> Option<usize> {
    if !line.contains("first pass:") {
        return None;
    }
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("overdue="))
        .and_then(|n| n.parse().ok())
}

/// The instruction of an execution id (`default/shots/v1/s12/…/a1`).
fn instruction(id: &str) -> Option<String> {
    id.split('/').nth(3).map(str::to_string)
}

/// Fire 400 one-shots 5 ms apart at the default horizon, killing the agent
/// five times at random moments; with `lose_ledger`, the ledger is deleted
/// before each restart. The pack's instants pass while the agent is down,
/// so on a loaded machine (slow restarts) it may finish all 400 before the
/// fifth kill: such a run's checks still hold, and a new run (new pack,
/// other moments) is made, three at most.
fn kill_9_at_random(lose_ledger: bool) -> Run {
    let mut runs = Vec::new();
    for attempt in 0..3 {
        let r = one_run(lose_ledger, attempt);
        if r.kills == 5 {
            return r;
        }
        runs.push(r.kills);
    }
    panic!("the agent finished before five kills in every run (kills: {runs:?})");
}

fn one_run(lose_ledger: bool, attempt: u64) -> Run {
    // Built (if it must be) before the pack's instants are chosen.
    let agent = bin("baton-agent");
    let dir = tempfile::tempdir().expect("tempdir");
    let ledger = dir.path().join("dispatch.ledger");
    let config = dir.path().join("agent.yaml");
    std::fs::write(&config, format!("ledger: {}\n", ledger.display())).expect("write config");
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

    let mut rng = Lcg(0x5eed_ba70 ^ u64::from(lose_ledger) ^ (attempt << 8));
    let mut unknown: HashSet<String> = HashSet::new();
    let mut interrupted: HashSet<String> = HashSet::new();
    let mut kills = 0;
    let mut lives: Vec<String> = Vec::new();
    // Per killed life: (started, killed, what its first pass said it armed).
    let mut killed_lives: Vec<(jiff::Timestamp, jiff::Timestamp, Option<usize>)> = Vec::new();
    let began = Instant::now();
    let since = move || began.elapsed().as_millis();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        assert!(Instant::now() < deadline, "did not finish in time");
        if lose_ledger && kills > 0 {
            power_cut(&ledger);
        }
        let spawned = jiff::Timestamp::now();
        let mut child = Command::new(&agent)
            .args([
                "run",
                "--system-clock",
                "reference",
                "--exit-when-idle",
                "--id",
                "crash",
                "--config",
            ])
            .arg(&config)
            .arg("--data")
            .arg(dir.path().join("data"))
            .arg("--gpio")
            .arg(format!("sim:{}", log.display()))
            .arg("--pack")
            .arg(&pack)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn agent");
        // `outcome_unknown` reports from the live view; the agent's own
        // word on firings caught inside their device call from its log.
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
        lives.push(format!("+{}ms: life {kills} spawned", since()));
        let stderr = child.stderr.take().expect("stderr");
        let log_reader = std::thread::spawn(move || {
            let (mut ids, mut log, mut armed) = (Vec::new(), Vec::new(), None);
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                armed = armed.or(catch_up_armed(&line));
                log.push(format!("+{}ms: life {kills}: {line}", since()));
                if line.contains("inside its device call")
                    && let Some(id) = line
                        .split(|c: char| c.is_whitespace() || c == '=')
                        .find(|w| w.starts_with("default/shots/"))
                {
                    ids.push(id.to_string());
                }
            }
            (ids, log, armed)
        });
        let done = if kills < 5 {
            // Let it fire for a random while; `wait_exit` then kills it with
            // SIGKILL (`Child::kill`), i.e. kill -9.
            wait_exit(&mut child, Duration::from_millis(100 + rng.next(250)))
        } else {
            wait_exit(&mut child, Duration::from_secs(60))
        };
        unknown.extend(
            reader
                .join()
                .expect("reader")
                .iter()
                .filter_map(|i| instruction(i)),
        );
        let (ids, log, armed) = log_reader.join().expect("log reader");
        interrupted.extend(ids.iter().filter_map(|i| instruction(i)));
        lives.extend(log);
        match done {
            Some(status) => {
                assert!(status.success(), "agent failed: {status:?}");
                break;
            }
            None => {
                killed_lives.push((spawned, jiff::Timestamp::now(), armed));
                lives.push(format!("+{}ms: life {kills} killed", since()));
                kills += 1;
            }
        }
    }

    // Every line change in the sim log, by execution id.
    let mut seen: HashMap<String, usize> = HashMap::new();
    // When each instruction's write reached the sim chip (reference ns).
    let mut written: HashMap<String, i64> = HashMap::new();
    for l in lines(&log) {
        let v: serde_json::Value = serde_json::from_str(&l).expect("json");
        let id = v["execution_id"].as_str().expect("id").to_string();
        if id.starts_with("default/shots/") {
            if let (Some(i), Some(t)) = (instruction(&id), v["t"].as_i64()) {
                written.insert(i, t);
            }
            *seen.entry(id).or_default() += 1;
        }
    }
    let due_by = |i: usize| start + jiff::SignedDuration::from_millis(i as i64 * SPACING_MS);
    let catch_up = killed_lives
        .iter()
        .map(|&(spawned, killed, armed)| {
            armed.unwrap_or_else(|| {
                let by = killed + jiff::SignedDuration::from_millis(DEFAULT_HORIZON_MS);
                let before = spawned.as_nanosecond() as i64;
                (0..COUNT)
                    .filter(|&i| due_by(i) <= by)
                    .filter(|i| written.get(&format!("s{i}")).is_none_or(|&t| t >= before))
                    .count()
            })
        })
        .sum();
    let twice: Vec<&String> = seen
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(k, _)| k)
        .collect();
    assert!(twice.is_empty(), "fired twice: {twice:?}");
    let fired: HashMap<String, usize> =
        seen.keys()
            .filter_map(|id| instruction(id))
            .fold(HashMap::new(), |mut m, i| {
                *m.entry(i).or_default() += 1;
                m
            });
    let again: Vec<&String> = fired
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(i, _)| i)
        .collect();
    assert!(
        again.is_empty(),
        "an instruction fired under two ids: {again:?}"
    );
    // The agent's own record of what it reported: a report journalled
    // just before a kill -9 can miss its live-view line.
    unknown.extend(unknown_in_outbox(&dir.path().join("data")));
    let missing: Vec<String> = (0..COUNT)
        .map(|i| format!("s{i}"))
        .filter(|s| !fired.contains_key(s))
        .collect();
    for m in &missing {
        assert!(
            unknown.contains(m),
            "{m} never fired and was not reported as outcome unknown (unknown: {unknown:?})\n{}",
            lives.join("\n")
        );
    }
    assert!(
        !ledger.exists(),
        "a clean stop removes the ledger (everything it knew is journalled)"
    );
    eprintln!(
        "{kills} kills{}, {} fired once each, {} missing, {} reported outcome unknown ({} caught inside their device call; {catch_up} armed together by restarts' first passes)",
        if lose_ledger {
            " (ledger lost each time)"
        } else {
            ""
        },
        seen.len(),
        missing.len(),
        unknown.len(),
        interrupted.len(),
    );
    Run {
        kills,
        unknown,
        interrupted,
        lives,
        catch_up,
    }
}

/// What a power cut does to the ledger: a tmpfs file, gone. As root the
/// page cache is dropped too (clean pages only: it loses nothing written,
/// so on its own it would leave the ledger intact).
fn power_cut(ledger: &Path) {
    let _ = std::fs::remove_file(ledger);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let _ = std::fs::write("/proc/sys/vm/drop_caches", "1\n");
    }
}

/// The instructions the agent's outbox (feedback not yet sent: there is no
/// controller here) reports `outcome unknown`: the journal's record of
/// each report, where the live view on stdout can miss the last lines
/// written before a kill -9. Read after a clean exit; an unreadable
/// journal adds nothing (the live view's word stands alone then).
fn unknown_in_outbox(data: &std::path::Path) -> HashSet<String> {
    use baton_agent::outbox::{Decoded, decode};
    use baton_proto::feedback::Event;
    let mut out = HashSet::new();
    let Ok((mut journal, _)) =
        baton_journal::Journal::open(baton_journal::JournalConfig::new(data))
    else {
        return out;
    };
    let mut from = 0;
    while let Ok(page) = journal.outbox_page(from, 512) {
        let Some(&(last, _)) = page.last() else {
            break;
        };
        for (_, bytes) in &page {
            if let Decoded::Record(r) = decode(bytes)
                && r.event == Event::OutcomeUnknown
            {
                out.insert(r.instruction.clone());
            }
        }
        from = last + 1;
    }
    out
}
