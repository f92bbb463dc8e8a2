//! The journal's state survives reopen: every record kind, typed outcomes
//! and stop reasons, once-only keys, pack replacement and removal, the
//! outbox cap and its drop count, seqs, compaction and its trigger.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use baton_journal::{
    Journal, JournalConfig, JournalError, LOG_FILE, Origin, Outcome, StopReason, StoredPack,
};

fn cfg(dir: &Path) -> JournalConfig {
    JournalConfig {
        outbox_cap: 1000,
        ..JournalConfig::new(dir)
    }
}

fn pack(name: &str, version: u64) -> StoredPack {
    StoredPack {
        tenant: "plant-a".into(),
        pack: name.into(),
        version,
        yaml: format!("pack: {name}\nversion: {version}\n"),
        accepted_ns: 1_000 + version as i64,
        stopped: None,
    }
}

fn set(ids: &[&str]) -> HashSet<String> {
    ids.iter().map(|s| (*s).to_owned()).collect()
}

fn attempts(ids: &[(&str, Option<Outcome>)]) -> HashMap<String, Option<Outcome>> {
    ids.iter().map(|(s, o)| ((*s).to_owned(), *o)).collect()
}

/// The whole outbox, read back from disk.
fn outbox(j: &mut Journal) -> Vec<(u64, Vec<u8>)> {
    j.outbox_page(0, usize::MAX).expect("outbox page")
}

fn seqs(outbox: &[(u64, Vec<u8>)]) -> Vec<u64> {
    outbox.iter().map(|(s, _)| *s).collect()
}

#[test]
fn journal_round_trip_of_every_record_kind() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("nested/journal");
    {
        let (mut j, rec) = Journal::open(cfg(&dir)).expect("open fresh");
        assert_eq!(rec, Default::default(), "a fresh journal recovers nothing");
        j.put_pack(&pack("line3", 1)).expect("put");
        j.put_pack(&pack("line4", 1)).expect("put");
        j.put_pack(&pack("line3", 2)).expect("replace");
        j.put_pack(&pack("gone", 5)).expect("put");
        j.remove_pack("plant-a", "gone").expect("remove");
        j.remove_pack("plant-a", "never-there").expect("no-op");
        j.record_started(&[("ex-a", 10), ("ex-b", 11)])
            .expect("started");
        j.record_started(&[("ex-c", 12)]).expect("started");
        assert_eq!(j.push_feedback(b"{\"r\":1}").expect("push"), 1);
        assert_eq!(j.push_feedback(b"{\"r\":2}").expect("push"), 2);
        assert_eq!(j.push_feedback(b"{\"r\":3}").expect("push"), 3);
        j.record_finished("ex-a", Outcome::Succeeded)
            .expect("finished");
        j.record_finished("ex-b", Outcome::Failed)
            .expect("finished");
        j.record_started(&[("ex-d", 13)]).expect("started");
        j.record_finished("ex-d", Outcome::NotRun)
            .expect("finished");
        assert!(j.record_once("on_failure/ex-b", 11).expect("once"));
        assert!(!j.record_once("on_failure/ex-b", 11).expect("once again"));
        j.ack_feedback(1).expect("ack");
        let _ = j.heartbeat(99).expect("heartbeat");
        let _ = j.heartbeat(100).expect("heartbeat");
        assert!(j.is_started("ex-b") && !j.is_started("ex-z"));
        assert_eq!(j.outcome("ex-a"), Some(Outcome::Succeeded));
        assert_eq!(j.outcome("ex-c"), None);
        assert!(j.is_once_recorded("on_failure/ex-b"));
        // No sync(): a clean drop must not be needed for kill -9 safety,
        // but nothing here is lost by dropping either.
    }
    let (mut j, rec) = Journal::open(cfg(&dir)).expect("reopen");
    assert_eq!(rec.packs, vec![pack("line3", 2), pack("line4", 1)]);
    assert_eq!(
        rec.attempts,
        attempts(&[
            ("ex-a", Some(Outcome::Succeeded)),
            ("ex-b", Some(Outcome::Failed)),
            ("ex-c", None),
            ("ex-d", Some(Outcome::NotRun)),
        ])
    );
    assert_eq!(rec.once, set(&["on_failure/ex-b"]));
    assert_eq!(rec.outbox_len, 2);
    assert_eq!(
        outbox(&mut j),
        vec![(2, b"{\"r\":2}".to_vec()), (3, b"{\"r\":3}".to_vec())]
    );
    assert_eq!(rec.dropped, 0);
    assert_eq!(rec.last_alive_ns, Some(100));
    assert_eq!(rec.truncated_bytes, 0);
    assert_eq!(rec.origin, Origin::Existing);
    assert!(
        !j.record_once("on_failure/ex-b", 11).expect("once"),
        "a once key survives a restart"
    );
    assert_eq!(j.push_feedback(b"{}").expect("push"), 4, "seqs continue");
    assert_eq!(seqs(&outbox(&mut j)), [2, 3, 4]);
    assert_eq!(j.outbox_range(), Some((2, 4)));
    assert_eq!(seqs(&j.outbox_page(3, 1).expect("page")), [3]);
    assert_eq!(seqs(&j.outbox_page(5, 10).expect("page")), [0u64; 0]);
}

#[test]
fn journal_outbox_cap_drops_oldest_and_counts_across_reopen() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let c = JournalConfig {
        outbox_cap: 5,
        ..JournalConfig::new(tmp.path())
    };
    {
        let (mut j, _) = Journal::open(c.clone()).expect("open");
        for i in 1..=8u64 {
            assert_eq!(
                j.push_feedback(format!("f{i}").as_bytes()).expect("push"),
                i
            );
        }
        assert_eq!(j.dropped(), 3);
        assert_eq!(j.outbox_len(), 5);
    }
    {
        let (mut j, rec) = Journal::open(c.clone()).expect("reopen");
        assert_eq!(rec.dropped, 3, "drop count is persisted");
        let held = outbox(&mut j);
        assert_eq!(seqs(&held), [4, 5, 6, 7, 8], "the oldest went");
        assert_eq!(held[0].1, b"f4");
        j.ack_feedback(6).expect("ack");
        assert_eq!(j.outbox_len(), 2);
        j.ack_feedback(3).expect("stale ack is harmless");
        assert_eq!(j.outbox_len(), 2);
        j.reset_dropped(2).expect("reported 2");
        assert_eq!(j.dropped(), 1, "only what was reported is subtracted");
    }
    {
        let (mut j, rec) = Journal::open(c.clone()).expect("reopen");
        assert_eq!(seqs(&outbox(&mut j)), [7, 8]);
        assert_eq!(rec.dropped, 1);
        assert_eq!(j.push_feedback(b"f9").expect("push"), 9);
        j.ack_feedback(1_000).expect("ack beyond the last seq");
        assert_eq!(j.outbox_len(), 0);
        assert_eq!(j.push_feedback(b"f10").expect("push"), 10);
        assert_eq!(j.push_feedback(b"f11").expect("push"), 11);
    }
    // A lower cap on the next start drops (and counts) the excess at once.
    let lower = JournalConfig {
        outbox_cap: 1,
        ..c.clone()
    };
    {
        let (mut j, rec) = Journal::open(lower.clone()).expect("reopen, lower cap");
        assert_eq!(seqs(&outbox(&mut j)), [11]);
        assert_eq!(rec.dropped, 2);
        assert_eq!(j.dropped(), 2);
    }
    let (mut j, rec) = Journal::open(c).expect("reopen");
    assert_eq!((seqs(&outbox(&mut j)), rec.dropped), (vec![11], 2));
    assert_eq!(j.push_feedback(b"f12").expect("push"), 12);
}

#[test]
fn journal_seqs_stay_monotonic_after_everything_is_acked_and_compacted() {
    let tmp = tempfile::tempdir().expect("tempdir");
    {
        let (mut j, _) = Journal::open(cfg(tmp.path())).expect("open");
        for _ in 0..3 {
            j.push_feedback(b"x").expect("push");
        }
        j.ack_feedback(3).expect("ack");
        j.compact().expect("compact");
    }
    let (mut j, rec) = Journal::open(cfg(tmp.path())).expect("reopen");
    assert_eq!(rec.outbox_len, 0);
    assert_eq!(j.push_feedback(b"y").expect("push"), 4);
}

#[test]
fn journal_compaction_keeps_exactly_the_live_state_and_shrinks_the_file() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let day = 86_400_000_000_000i64;
    let c = JournalConfig {
        outbox_cap: 10,
        retention_ns: 7 * day,
        ..JournalConfig::new(tmp.path())
    };
    let now = 100 * day;
    let (before, size_before) = {
        let (mut j, _) = Journal::open(c.clone()).expect("open");
        for v in 1..=50 {
            j.put_pack(&pack("line3", v)).expect("put");
        }
        j.put_pack(&pack("temp", 1)).expect("put");
        j.remove_pack("plant-a", "temp").expect("remove");
        // Old executions (beyond the horizon) and recent ones.
        for i in 0..200i64 {
            let id = format!("old-{i}");
            j.record_started(&[(&id, now - 8 * day - i)])
                .expect("started");
            j.record_finished(&id, Outcome::Succeeded)
                .expect("finished");
            j.record_once(&format!("once-{id}"), now - 8 * day)
                .expect("once");
        }
        for i in 0..20i64 {
            let id = format!("new-{i}");
            j.record_started(&[(&id, now - 6 * day + i)])
                .expect("started");
            if i % 2 == 0 {
                j.record_finished(&id, Outcome::Failed).expect("finished");
            }
        }
        for i in 0..25 {
            j.push_feedback(format!("fb{i}").as_bytes()).expect("push");
        }
        j.ack_feedback(17).expect("ack");
        j.record_once("give_up/new", now - day).expect("once");
        let _ = j.heartbeat(now).expect("heartbeat");
        let size_before = j.log_bytes();
        j.compact().expect("compact");
        assert!(
            j.log_bytes() < size_before / 4,
            "compaction shrank {size_before} only to {}",
            j.log_bytes()
        );
        let on_disk = std::fs::metadata(tmp.path().join(LOG_FILE))
            .expect("stat")
            .len();
        assert_eq!(on_disk, j.log_bytes());
        assert!(!j.is_started("old-0"), "beyond the horizon: forgotten");
        assert!(j.is_started("new-0"));
        // The journal keeps working on the new file.
        j.record_started(&[("after", now)]).expect("started");
        (seqs(&outbox(&mut j)), size_before)
    };
    assert!(size_before > 0);
    let (mut j, rec) = Journal::open(c).expect("reopen");
    assert_eq!(rec.packs, vec![pack("line3", 50)]);
    let mut want: HashMap<String, Option<Outcome>> = (0..20)
        .map(|i| {
            let o = (i % 2 == 0).then_some(Outcome::Failed);
            (format!("new-{i}"), o)
        })
        .collect();
    want.insert("after".into(), None);
    assert_eq!(rec.attempts, want);
    assert_eq!(rec.once, set(&["give_up/new"]));
    let held = outbox(&mut j);
    assert_eq!(seqs(&held), before);
    assert_eq!(seqs(&held), [18, 19, 20, 21, 22, 23, 24, 25]);
    assert_eq!(held[0].1, b"fb17");
    assert_eq!(rec.dropped, 15, "25 pushed into a cap of 10");
    assert_eq!(rec.last_alive_ns, Some(now));
    assert_eq!(j.push_feedback(b"z").expect("push"), 26);
}

#[test]
fn journal_compacts_automatically_by_size() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let c = JournalConfig {
        max_log_bytes: 4096,
        outbox_cap: 100,
        ..JournalConfig::new(tmp.path())
    };
    let (mut j, _) = Journal::open(c.clone()).expect("open");
    let mut max_len = 0;
    for i in 0..2_000i64 {
        let seq = j
            .push_feedback(b"{\"result\":\"ok\",\"lateness_ns\":1234}")
            .expect("push");
        j.ack_feedback(seq).expect("ack");
        let beat = j.heartbeat(i).expect("heartbeat");
        assert!(beat.compaction_error.is_none());
        max_len = max_len.max(j.log_bytes());
    }
    assert!(j.take_compaction_error().is_none());
    assert!(
        max_len <= 4096 + 128,
        "log grew to {max_len} despite automatic compaction"
    );
    drop(j);
    let (mut j, rec) = Journal::open(c).expect("reopen");
    assert_eq!(rec.outbox_len, 0);
    assert_eq!(rec.last_alive_ns, Some(1_999));
    assert_eq!(j.push_feedback(b"next").expect("push"), 2_001);
}

#[test]
fn journal_live_state_above_budget_does_not_compact_on_every_append() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let c = JournalConfig {
        max_log_bytes: 4096,
        ..JournalConfig::new(tmp.path())
    };
    let (mut j, _) = Journal::open(c.clone()).expect("open");
    // Every compaction renames a new file into place: count inode changes.
    let inode = || {
        std::fs::metadata(tmp.path().join(LOG_FILE))
            .expect("stat")
            .ino()
    };
    let mut compactions = 0;
    let mut last = inode();
    // 2 000 retained ids (~80 KB live) against a 4 KiB budget.
    for i in 0..2_000i64 {
        let id = format!("pack/7/instr/{i:06}");
        j.record_finished(&id, Outcome::Succeeded)
            .expect("finished");
        if inode() != last {
            compactions += 1;
            last = inode();
        }
    }
    assert!(
        (1..=12).contains(&compactions),
        "{compactions} compactions for 2000 appends: the trigger must grow with the live state"
    );
    drop(j);
    let (_, rec) = Journal::open(c).expect("reopen");
    assert_eq!(rec.attempts.len(), 2_000);
}

#[test]
fn journal_refuses_a_second_writer_and_oversized_records() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (mut j, _) = Journal::open(cfg(tmp.path())).expect("open");
    let second = Journal::open(cfg(tmp.path()));
    assert!(
        matches!(second, Err(JournalError::Locked { .. })),
        "{second:?}"
    );
    let huge = vec![b'x'; 17 << 20];
    let err = j.push_feedback(&huge).expect_err("too large");
    assert!(matches!(err, JournalError::TooLarge { .. }), "{err}");
    // The journal is still usable, and the refused record left no trace.
    assert_eq!(j.push_feedback(b"ok").expect("push"), 1);
    drop(j);
    let (mut j, _) = Journal::open(cfg(tmp.path())).expect("lock released on drop");
    assert_eq!(seqs(&outbox(&mut j)), [1]);
}

#[test]
fn journal_rejects_a_config_that_cannot_work() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let c = JournalConfig {
        outbox_cap: 0,
        ..JournalConfig::new(tmp.path())
    };
    assert!(matches!(
        Journal::open(c),
        Err(JournalError::InvalidConfig(_))
    ));
}

#[test]
fn a_stopped_pack_stays_stopped_across_reopen_and_compaction_until_replaced() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = || JournalConfig::new(dir.path());
    {
        let (mut j, _) = Journal::open(cfg()).expect("open");
        j.put_pack(&pack("press", 1)).expect("put");
        j.put_pack(&pack("other", 1)).expect("put");
        j.put_pack(&pack("leased", 3)).expect("put");
        j.stop_pack("plant-a", "press", 1, StopReason::GiveUp)
            .expect("stop");
        j.stop_pack("plant-a", "leased", 3, StopReason::LeaseLost)
            .expect("stop");
        // A stop for a version that is not stored changes nothing.
        j.stop_pack("plant-a", "other", 9, StopReason::Cancel)
            .expect("stop");
    }
    let (mut j, rec) = Journal::open(cfg()).expect("reopen");
    let stopped: Vec<(String, Option<StopReason>)> = rec
        .packs
        .iter()
        .map(|p| (p.pack.clone(), p.stopped))
        .collect();
    assert!(
        stopped.contains(&("press".into(), Some(StopReason::GiveUp))),
        "{stopped:?}"
    );
    assert!(stopped.contains(&("other".into(), None)), "{stopped:?}");
    assert!(
        stopped.contains(&("leased".into(), Some(StopReason::LeaseLost))),
        "{stopped:?}"
    );
    j.compact().expect("compact");
    drop(j);
    let (mut j, rec) = Journal::open(cfg()).expect("reopen after compaction");
    assert!(
        rec.packs
            .iter()
            .any(|p| p.pack == "press" && p.stopped == Some(StopReason::GiveUp))
    );
    assert!(
        rec.packs
            .iter()
            .any(|p| p.pack == "leased" && p.stopped == Some(StopReason::LeaseLost))
    );
    // A higher version replaces it, running.
    j.put_pack(&pack("press", 2)).expect("put v2");
    drop(j);
    let (_, rec) = Journal::open(cfg()).expect("reopen");
    assert!(
        rec.packs
            .iter()
            .any(|p| p.pack == "press" && p.version == 2 && p.stopped.is_none())
    );
}

#[test]
fn journal_compaction_trigger_survives_a_restart() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let c = JournalConfig {
        max_log_bytes: 4096,
        ..JournalConfig::new(tmp.path())
    };
    let inode = || {
        std::fs::metadata(tmp.path().join(LOG_FILE))
            .expect("stat")
            .ino()
    };
    let live = {
        let (mut j, _) = Journal::open(c.clone()).expect("open");
        // ~40 KB of live ids against a 4 KiB budget (batched: fewer fsyncs).
        let ids: Vec<String> = (0..1_000).map(|i| format!("pack/7/instr/{i:06}")).collect();
        for chunk in ids.chunks(50) {
            let batch: Vec<(&str, i64)> = chunk.iter().map(|s| (s.as_str(), 1)).collect();
            j.record_started(&batch).expect("started");
        }
        j.compact().expect("compact");
        j.log_bytes()
    };
    assert!(
        live > 4 * 4096,
        "live state {live} B must exceed the budget"
    );
    for restart in 0..3 {
        let before = inode();
        let (mut j, _) = Journal::open(c.clone()).expect("reopen");
        j.record_started(&[(&format!("after-{restart}"), 2_000)])
            .expect("started");
        assert_eq!(
            inode(),
            before,
            "restart {restart}: compacted again although the log is far below 2 x live"
        );
    }
    // The trigger is still 2 x live: growing past it compacts.
    let (mut j, _) = Journal::open(c).expect("reopen");
    let before = inode();
    let mut i = 0;
    while inode() == before {
        let ids: Vec<String> = (0..20).map(|k| format!("grow-{i:06}-{k:02}")).collect();
        let batch: Vec<(&str, i64)> = ids.iter().map(|s| (s.as_str(), 3_000)).collect();
        j.record_started(&batch).expect("started");
        i += 1;
        assert!(
            j.log_bytes() <= 2 * live + 64,
            "no compaction past 2 x live"
        );
    }
}

#[test]
fn journal_small_retention_forgets_ids_in_memory_on_heartbeats() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let sec = 1_000_000_000i64;
    let c = JournalConfig {
        retention_ns: 2 * sec,
        max_log_bytes: u64::MAX,
        ..JournalConfig::new(tmp.path())
    };
    let (mut j, _) = Journal::open(c.clone()).expect("open");
    let mut peak = 0;
    // 100 firings and 10 once keys per second of reference time, 30 s.
    for t in 0..300i64 {
        let now = t * sec / 10;
        let ids: Vec<String> = (0..10).map(|k| format!("ex-{t}-{k}")).collect();
        let batch: Vec<(&str, i64)> = ids.iter().map(|s| (s.as_str(), now)).collect();
        j.record_started(&batch).expect("started");
        for id in &ids {
            j.record_finished(id, Outcome::Succeeded).expect("finished");
        }
        j.record_once(&format!("report-{t}"), now).expect("once");
        let _ = j.heartbeat(now).expect("heartbeat");
        let held = j.held();
        peak = peak.max(held.attempts + held.once);
    }
    // Within 2 s retention plus at most a quarter of it more: 2.5 s of ids.
    assert!(
        peak <= 25 * 11 + 11,
        "held {peak} ids and keys with a 2 s retention"
    );
    assert!(!j.is_started("ex-0-0") && !j.is_once_recorded("report-0"));
    assert!(j.is_started("ex-299-9") && j.is_once_recorded("report-299"));
    let bytes = j.log_bytes();
    drop(j);
    // Replay prunes too: a restart does not bring back a minute of ids.
    let (j, rec) = Journal::open(c).expect("reopen");
    assert_eq!(j.log_bytes(), bytes, "no compaction was needed for that");
    assert!(rec.attempts.len() <= 25 * 10 + 10, "{}", rec.attempts.len());
    assert!(rec.once.len() <= 25 + 1, "{}", rec.once.len());
}

#[test]
fn journal_failed_automatic_compaction_is_reported_by_the_next_heartbeat() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let c = JournalConfig {
        max_log_bytes: 4096,
        ..JournalConfig::new(tmp.path())
    };
    let (mut j, _) = Journal::open(c).expect("open");
    // A directory where the snapshot file must go: every compaction fails.
    std::fs::create_dir(tmp.path().join(baton_journal::TMP_FILE)).expect("mkdir");
    let mut i = 0;
    let err = loop {
        j.record_started(&[(&format!("id-{i:06}"), i)])
            .expect("appends still work");
        let beat = j.heartbeat(i).expect("heartbeat still works");
        if let Some(e) = beat.compaction_error {
            break e;
        }
        i += 1;
        assert!(i < 1_000, "no compaction error surfaced");
    };
    assert!(err.to_string().contains("journal.log.tmp"), "{err}");
    assert!(j.take_compaction_error().is_none(), "handed out once");
    assert!(j.is_started("id-000000"));
}

#[test]
fn journal_id_survives_reopen_and_compaction_and_is_new_after_a_reset_or_a_wipe() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("j");
    let id = {
        let (mut j, _) = Journal::open(cfg(&dir)).expect("open fresh");
        let id = j.id().to_string();
        assert_eq!(id.len(), 32, "128 bits in hex: {id}");
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
        j.push_feedback(b"a").expect("push");
        j.compact().expect("compact");
        assert_eq!(j.id(), id, "a compaction renews the salt, not the id");
        id
    };
    {
        let (mut j, _) = Journal::open(cfg(&dir)).expect("reopen after compaction");
        assert_eq!(j.id(), id);
        j.push_feedback(b"b").expect("push");
    }
    let bytes = std::fs::read(dir.join(LOG_FILE)).expect("read log");
    let summary = baton_journal::check_log_bytes(&bytes).expect("replays");
    assert_eq!(summary.journal_id.as_deref(), Some(id.as_str()));
    let (j, _) = Journal::open(cfg(&dir)).expect("reopen");
    assert_eq!(j.id(), id, "kept across restarts");
    drop(j);

    // --reset-journal: a new journal, a new id.
    let reset = JournalConfig {
        reset: true,
        ..cfg(&dir)
    };
    let (j, _) = Journal::open(reset).expect("reset");
    let after_reset = j.id().to_string();
    assert_ne!(after_reset, id);
    assert_eq!(after_reset.len(), 32);
    drop(j);

    // A wiped data directory: a new id too.
    std::fs::remove_dir_all(&dir).expect("wipe");
    let (j, _) = Journal::open(cfg(&dir)).expect("open wiped");
    assert_ne!(j.id(), id);
    assert_ne!(j.id(), after_reset);
}

/// Issue 26.8: drops at the outbox cap reach the controller as one count
/// on one entry, survive restarts, and are reported once that entry is
/// acknowledged; drops that happen later ride on a later entry.
#[test]
fn journal_drop_count_rides_on_one_entry_until_acknowledged() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let c = JournalConfig {
        outbox_cap: 3,
        ..JournalConfig::new(tmp.path())
    };
    {
        let (mut j, _) = Journal::open(c.clone()).expect("open");
        for i in 1..=5u64 {
            j.push_feedback(format!("f{i}").as_bytes()).expect("push");
        }
        assert_eq!((j.dropped(), j.outbox_range()), (2, Some((3, 5))));
        assert_eq!(j.dropped_before(3), 0, "nothing sent yet");
        assert_eq!(j.carry_drops(3).expect("carry"), 2, "the first entry sent");
        assert_eq!(j.carry_drops(3).expect("again"), 2, "the same on a re-send");
        assert_eq!(j.carry_drops(4).expect("other"), 0, "one carrier only");
        assert_eq!(j.dropped_before(4), 0);
    }
    {
        // A restart: the same entry carries the same count.
        let (mut j, rec) = Journal::open(c.clone()).expect("reopen");
        assert_eq!(rec.dropped, 2);
        assert_eq!(j.dropped_before(3), 2);
        assert_eq!(j.carry_drops(3).expect("carry"), 2);
        // An acknowledgement below the carrier reports nothing.
        j.ack_feedback(2).expect("stale ack");
        assert_eq!(j.dropped(), 2);
        // Acknowledged: reported, never sent again.
        j.ack_feedback(3).expect("ack");
        assert_eq!((j.dropped(), j.dropped_before(3)), (0, 0));
        assert_eq!(j.carry_drops(4).expect("nothing left"), 0);
    }
    {
        let (mut j, rec) = Journal::open(c.clone()).expect("reopen");
        assert_eq!(rec.dropped, 0, "the report survives a restart");
        assert_eq!(j.carry_drops(4).expect("carry"), 0);
        // More drops; the carrier itself is dropped before it is
        // acknowledged: its count rides on a later entry, with the new drops.
        for i in 6..=7u64 {
            j.push_feedback(format!("f{i}").as_bytes()).expect("push");
        }
        assert_eq!((j.dropped(), j.outbox_range()), (1, Some((5, 7))));
        assert_eq!(j.carry_drops(5).expect("carry"), 1);
        j.push_feedback(b"f8").expect("push");
        assert_eq!(j.outbox_range(), Some((6, 8)), "the carrier went");
        assert_eq!((j.dropped(), j.dropped_before(5)), (2, 0));
        j.compact().expect("compact");
        assert_eq!(j.carry_drops(6).expect("carry"), 2, "both drops, once");
        j.compact().expect("the carrier survives compaction");
        assert_eq!(j.dropped_before(6), 2);
        j.ack_feedback(8).expect("ack");
        assert_eq!(j.dropped(), 0);
    }
}

/// A batch's once keys in one durable write: the new ones recorded, those
/// recorded before skipped, one fdatasync for all, durable across a
/// reopen, and each after the feedback pushed before it.
#[test]
fn a_batch_of_once_keys_is_one_sync_and_survives_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let (mut j, _) = Journal::open(cfg(dir.path())).expect("open");
        assert!(j.record_once("outcome_unknown/a", 1).expect("once"));
        j.push_feedback(b"{\"r\":\"b\"}").expect("push");
        j.push_feedback(b"{\"r\":\"c\"}").expect("push");
        let syncs = j.syncs();
        let new = j
            .record_once_all([
                ("outcome_unknown/a", 1),
                ("outcome_unknown/b", 2),
                ("upstream_unknown/c", 2),
            ])
            .expect("once all");
        assert_eq!(new, 2, "the key recorded before is skipped");
        assert_eq!(j.syncs(), syncs + 1, "one fdatasync for the batch");
        assert_eq!(j.record_once_all([]).expect("none"), 0);
        assert_eq!(j.syncs(), syncs + 1, "nothing new, no sync");
    }
    let (mut j, rec) = Journal::open(cfg(dir.path())).expect("reopen");
    assert_eq!(
        rec.once,
        set(&[
            "outcome_unknown/a",
            "outcome_unknown/b",
            "upstream_unknown/c"
        ])
    );
    assert_eq!(rec.outbox_len, 2, "the reports came with their keys");
    assert!(!j.record_once("outcome_unknown/b", 2).expect("once"));
}
