//! Crash points that `tests/tests/crash.rs` hits under load (slow restarts:
//! an agent killed before its first heartbeat, or while it writes its
//! `outcome unknown` reports), each made deterministic: nothing armed is
//! left unreported, nothing due is silently settled.

mod rig;

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use baton_agent::config::{ConfigFile, Overrides};
use baton_agent::outbox::{Decoded, decode};
use baton_agent::runtime::ports::{Clock, ManualClock};
use baton_journal::{Journal, JournalConfig};
use baton_proto::feedback::Event;
use baton_proto::parse_pack;
use rig::*;

const SHOTS: i64 = 3;

/// A once-only report (`outcome unknown` after a power cut) is never lost
/// to a crash, nor are the reports that come with it (its dependents
/// skipped): whatever prefix of the journal a crash leaves, each once key
/// it holds (the core's word that the reports were made, so never made
/// again) comes with them in the outbox. The crash points are every byte
/// length the journal's log had while the reports were written.
#[test]
fn no_crash_point_leaves_an_outcome_unknown_key_without_its_report() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(t(0)));
    clock.set_uncertainty(20_000);
    let new_agent = || {
        let cfg = config(dir.path(), ConfigFile::default(), Overrides::default());
        build_with(dir.path(), clock.clone(), cfg)
    };
    // One-shots at 100, 110, 120 ms, armed ahead (start records durable)
    // by a pass at 98 ms (a lead before the first); the agent dies before
    // any is due. Each has a
    // dependent, skipped when its upstream's outcome is unknown.
    let mut shots = String::from("instructions:\n");
    for i in 0..SHOTS {
        shots.push_str(&format!(
            "  - {{id: s{i}, action: gpio.write, params: {{line: {i}, value: 1}}, at: {}}}\n  - {{id: d{i}, action: gpio.write, params: {{line: {}, value: 1}}, after: [s{i}]}}\n",
            t(100 + 10 * i),
            10 + i
        ));
    }
    let y = pack("shots", 1, &shots);
    {
        let mut a = new_agent();
        a.accept(y.clone(), parse_pack(&y).expect("pack"))
            .expect("accepted");
        clock.set(t(98));
        a.step().expect("step");
    }
    let data = dir.path().join("data");
    let (_, rec) = Journal::open(JournalConfig::new(&data)).expect("journal");
    let open = rec.attempts.values().filter(|o| o.is_none()).count();
    assert_eq!(open, SHOTS as usize, "armed, no result: {:?}", rec.attempts);
    drop(rec);
    // The power cut: the dispatch ledger is lost, the journal alone decides.
    std::fs::remove_file(dir.path().join("dispatch.ledger")).expect("ledger");
    let before = log_len(&data);
    clock.set(t(200));
    {
        let mut a = new_agent();
        a.step().expect("step");
        a.step().expect("step");
    }
    let after = log_len(&data);
    let (keys, reports) = keys_and_reports(&data, None);
    assert_eq!(keys.len(), SHOTS as usize, "{keys:?}");
    let due = |keys: &HashSet<String>| -> HashSet<String> {
        keys.iter()
            .flat_map(|s| [format!("OutcomeUnknown {s}"), format!("Skip d{}", &s[1..])])
            .collect()
    };
    assert_eq!(reports, due(&keys), "every shot and its dependent reported");
    for cut in before..=after {
        let (keys, reports) = keys_and_reports(&data, Some(cut));
        let lost: Vec<_> = due(&keys).difference(&reports).cloned().collect();
        assert!(
            lost.is_empty(),
            "a crash at {cut} B of the log ({before}..{after}) keeps once keys without their reports {lost:?}: never made"
        );
    }
}

/// Runs that all died before their first heartbeat leave the journal no
/// last-alive instant: one-shots that came due meanwhile were never armed
/// (no start record) and are missed, not settled as handled.
#[test]
fn one_shots_due_before_any_heartbeat_are_missed_not_settled() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(t(0)));
    clock.set_uncertainty(20_000);
    let new_agent = || {
        let cfg = config(dir.path(), ConfigFile::default(), Overrides::default());
        build_with(dir.path(), clock.clone(), cfg)
    };
    let mut shots = String::from("defaults: {max_lateness: 1h}\ninstructions:\n");
    for i in 0..SHOTS {
        shots.push_str(&format!(
            "  - {{id: s{i}, action: gpio.write, params: {{line: {i}, value: 1}}, at: {}}}\n",
            t(100 + 10 * i)
        ));
    }
    let y = pack("shots", 1, &shots);
    {
        // Killed right after accepting the pack: no pass, no heartbeat.
        let mut a = new_agent();
        a.accept(y.clone(), parse_pack(&y).expect("pack"))
            .expect("accepted");
    }
    let (_, rec) = Journal::open(JournalConfig::new(dir.path().join("data"))).expect("journal");
    assert_eq!(rec.last_alive_ns, None, "no heartbeat was written");
    assert!(
        rec.attempts.is_empty(),
        "nothing was armed: {:?}",
        rec.attempts
    );
    drop(rec);
    clock.set(t(300));
    let mut a = new_agent();
    while clock.now() < t(320) {
        a.step().expect("step");
        clock.advance(Duration::from_millis(1));
    }
    a.wind_down();
    let log = std::fs::read_to_string(dir.path().join("gpio.jsonl")).unwrap_or_default();
    for i in 0..SHOTS {
        let fired = log
            .lines()
            .filter(|l| l.contains(&format!("/s{i}/")))
            .count();
        assert_eq!(fired, 1, "s{i} fires late once (max_lateness 1h):\n{log}");
    }
}

fn log_len(data: &Path) -> u64 {
    std::fs::metadata(data.join("journal.log"))
        .expect("log")
        .len()
}

/// The instructions with an `outcome_unknown` once key, and the outbox's
/// `outcome unknown` and skip reports (`OutcomeUnknown s0`, `Skip d0`), in
/// the journal in `data` (cut to its first `cut` bytes, as a crash leaves
/// it, in a copy).
fn keys_and_reports(data: &Path, cut: Option<u64>) -> (HashSet<String>, HashSet<String>) {
    let copy = tempfile::tempdir().expect("tempdir");
    for e in std::fs::read_dir(data).expect("data dir") {
        let e = e.expect("entry");
        if e.file_type().expect("type").is_file() {
            std::fs::copy(e.path(), copy.path().join(e.file_name())).expect("copy");
        }
    }
    if let Some(n) = cut {
        std::fs::OpenOptions::new()
            .write(true)
            .open(copy.path().join("journal.log"))
            .and_then(|f| f.set_len(n))
            .expect("cut");
    }
    let (mut journal, rec) = Journal::open(JournalConfig::new(copy.path())).expect("journal");
    let keys = rec
        .once
        .iter()
        .filter(|k| k.ends_with("/outcome_unknown"))
        .filter_map(|k| k.split('/').nth(3).map(str::to_string))
        .collect();
    let mut reports = HashSet::new();
    let mut from = 0;
    loop {
        let page = journal.outbox_page(from, 512).expect("outbox");
        let Some(&(last, _)) = page.last() else {
            break;
        };
        for (_, bytes) in &page {
            if let Decoded::Record(r) = decode(bytes)
                && matches!(r.event, Event::OutcomeUnknown | Event::Skip)
            {
                reports.insert(format!("{:?} {}", r.event, r.instruction));
            }
        }
        from = last + 1;
    }
    (keys, reports)
}
