//! Recovery from damaged logs: a torn tail (crash mid-write) is cut off and
//! reported, damage in the middle is a clear error naming the offset, a
//! log of another format version is refused, a lost log is refused unless
//! reset on purpose.

use std::fs;
use std::path::{Path, PathBuf};

use baton_journal::{
    DISCARDED_FILE, Journal, JournalConfig, JournalError, LOCK_FILE, LOG_FILE, Origin, Outcome,
    StoredPack, TMP_FILE,
};

fn cfg(dir: &Path) -> JournalConfig {
    JournalConfig::new(dir)
}

fn log(dir: &Path) -> PathBuf {
    dir.join(LOG_FILE)
}

/// Writes a journal whose last record is `record_started("last")`; returns
/// the whole log image and the byte range of that last record.
fn journal_with_last_start(dir: &Path) -> (Vec<u8>, u64, u64) {
    let (mut j, _) = Journal::open(cfg(dir)).expect("open");
    j.put_pack(&StoredPack {
        tenant: "t".into(),
        pack: "p".into(),
        version: 3,
        yaml: "pack: p\n".into(),
        accepted_ns: 5,
        stopped: None,
    })
    .expect("put");
    j.record_started(&[("first", 1), ("second", 2)])
        .expect("started");
    j.push_feedback(b"{\"ok\":true}").expect("push");
    j.record_finished("first", Outcome::Failed)
        .expect("finished");
    let start = j.log_bytes();
    j.record_started(&[("last", 3)]).expect("started");
    let end = j.log_bytes();
    drop(j);
    (fs::read(log(dir)).expect("read log"), start, end)
}

fn assert_prefix_recovered(dir: &Path, with_last: bool) -> u64 {
    let (mut j, rec) = Journal::open(cfg(dir)).expect("reopen after a torn write");
    assert_eq!(rec.packs.len(), 1);
    assert_eq!(rec.attempts.get("first"), Some(&Some(Outcome::Failed)));
    assert_eq!(rec.attempts.get("second"), Some(&None));
    assert_eq!(rec.outbox_len, 1);
    assert_eq!(
        j.outbox_page(0, 10).expect("page"),
        [(1, b"{\"ok\":true}".to_vec())]
    );
    assert_eq!(rec.attempts.contains_key("last"), with_last);
    // The truncated log accepts appends that survive the next reopen.
    j.record_started(&[("again", 4)])
        .expect("append after recovery");
    drop(j);
    let (_, rec2) = Journal::open(cfg(dir)).expect("reopen again");
    assert!(rec2.attempts.contains_key("again"));
    assert_eq!(rec2.truncated_bytes, 0, "recovery left a clean log");
    rec.truncated_bytes
}

#[test]
fn journal_torn_tail_at_every_byte_of_the_last_record() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let (image, start, end) = journal_with_last_start(dir);
    assert_eq!(image.len() as u64, end);
    for cut in start..=end {
        fs::write(log(dir), &image[..cut as usize]).expect("write torn log");
        let truncated = assert_prefix_recovered(dir, cut == end);
        let expect = if cut == end { 0 } else { cut - start };
        assert_eq!(truncated, expect, "cut at byte {cut}");
    }
}

#[test]
fn journal_torn_tail_of_garbage_or_zeros_is_truncated() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let (image, start, end) = journal_with_last_start(dir);
    // The file size was extended but the data never reached the disk.
    let mut zeros = image.clone();
    zeros[start as usize..].fill(0);
    zeros.extend_from_slice(&[0; 4096]);
    fs::write(log(dir), &zeros).expect("write");
    assert_eq!(
        assert_prefix_recovered(dir, false),
        zeros.len() as u64 - start
    );
    // Random bytes after the last intact record.
    let mut junk = image[..end as usize].to_vec();
    let mut x = 0x2545_f491_u32;
    for _ in 0..1000 {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        junk.push(x as u8);
    }
    fs::write(log(dir), &junk).expect("write");
    assert_eq!(assert_prefix_recovered(dir, true), 1000);
}

#[test]
fn journal_flipped_byte_in_the_middle_is_an_error_naming_the_offset() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let (mut j, _) = Journal::open(cfg(dir)).expect("open");
    j.record_started(&[("a", 1)]).expect("started");
    let middle = j.log_bytes();
    j.record_started(&[("b", 2)]).expect("started");
    let after_middle = j.log_bytes();
    j.record_started(&[("c", 3)]).expect("started");
    drop(j);
    let image = fs::read(log(dir)).expect("read");
    // Every byte of the middle record: its length, checksum and payload.
    for at in middle..after_middle {
        let mut bad = image.clone();
        bad[at as usize] ^= 0x40;
        fs::write(log(dir), &bad).expect("write");
        match Journal::open(cfg(dir)) {
            Err(JournalError::Corrupt { offset, path, .. }) => {
                assert_eq!(offset, middle, "flip at {at}");
                assert_eq!(path, log(dir));
            }
            other => panic!("flip at {at}: expected Corrupt, got {other:?}"),
        }
        assert_eq!(
            fs::read(log(dir)).expect("read"),
            bad,
            "a corrupt log is never rewritten"
        );
    }
    let mut bad = image.clone();
    bad[middle as usize + 9] ^= 1;
    fs::write(log(dir), &bad).expect("write");
    let msg = Journal::open(cfg(dir)).expect_err("corrupt").to_string();
    assert!(
        msg.contains(&format!("offset {middle}")) && msg.contains(LOG_FILE),
        "{msg}"
    );
}

#[test]
fn journal_damaged_header_or_unknown_version_is_refused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    drop(Journal::open(cfg(dir)).expect("open"));
    let image = fs::read(log(dir)).expect("read");

    let mut bad = image.clone();
    bad[0] = b'X';
    fs::write(log(dir), &bad).expect("write");
    assert!(matches!(
        Journal::open(cfg(dir)),
        Err(JournalError::Corrupt { offset: 0, .. })
    ));

    fs::write(log(dir), &image[..7]).expect("write");
    assert!(matches!(
        Journal::open(cfg(dir)),
        Err(JournalError::Corrupt { offset: 0, .. })
    ));

    // A version from the future, and version 1 (the untyped format of
    // before `Outcome`), each with a valid header checksum: refused, and
    // the file is left as it was.
    for version in [baton_journal::FORMAT_VERSION + 1, 1] {
        let mut other = image.clone();
        other[8..12].copy_from_slice(&version.to_le_bytes());
        let crc = crc32fast::hash(&other[..16]);
        other[16..20].copy_from_slice(&crc.to_le_bytes());
        fs::write(log(dir), &other).expect("write");
        match Journal::open(cfg(dir)) {
            Err(e @ JournalError::UnsupportedVersion { .. }) => {
                let msg = e.to_string();
                assert!(
                    msg.contains(&format!("format version {version}"))
                        && msg.contains("reads versions 2 to 3"),
                    "{msg}"
                );
            }
            other => panic!("version {version}: expected UnsupportedVersion, got {other:?}"),
        }
        assert_eq!(fs::read(log(dir)).expect("read"), other);
    }
}

#[test]
fn journal_leftover_tmp_from_an_interrupted_compaction_is_ignored() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    {
        let (mut j, _) = Journal::open(cfg(dir)).expect("open");
        j.record_started(&[("kept", 1)]).expect("started");
    }
    // A compaction killed before its rename leaves a partial tmp file.
    fs::write(dir.join(TMP_FILE), b"BATONJNL partial").expect("write tmp");
    let (mut j, rec) = Journal::open(cfg(dir)).expect("reopen");
    assert!(rec.attempts.contains_key("kept"));
    assert!(!dir.join(TMP_FILE).exists());
    j.compact().expect("compact after cleanup");
}

#[test]
fn journal_deleted_log_is_refused_and_reset_starts_fresh_on_purpose() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    {
        let (mut j, rec) = Journal::open(cfg(dir)).expect("open");
        assert_eq!(rec.origin, Origin::Created);
        j.put_pack(&StoredPack {
            tenant: "t".into(),
            pack: "p".into(),
            version: 1,
            yaml: "pack: p\n".into(),
            accepted_ns: 1,
            stopped: None,
        })
        .expect("put");
    }
    fs::remove_file(log(dir)).expect("delete the log");
    let err = Journal::open(cfg(dir)).expect_err("a lost log is refused");
    assert!(matches!(err, JournalError::LogMissing { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains(&log(dir).display().to_string())
            && msg.contains(LOCK_FILE)
            && msg.contains("--reset-journal"),
        "{msg}"
    );
    assert!(!log(dir).exists(), "refusing creates nothing");
    // Still refused the second time: nothing was "fixed" by the refusal.
    assert!(matches!(
        Journal::open(cfg(dir)),
        Err(JournalError::LogMissing { .. })
    ));

    let reset = JournalConfig {
        reset: true,
        ..cfg(dir)
    };
    let (mut j, rec) = Journal::open(reset.clone()).expect("reset");
    assert_eq!(rec.origin, Origin::Reset { previous: None });
    assert!(rec.packs.is_empty());
    j.record_started(&[("after-reset", 1)]).expect("started");
    drop(j);
    let (_, rec) = Journal::open(cfg(dir)).expect("reopen after reset");
    assert_eq!(rec.origin, Origin::Existing);
    assert!(rec.attempts.contains_key("after-reset"));

    // A reset with a log present moves it aside, never deletes it.
    let before = fs::read(log(dir)).expect("read");
    let (_, rec) = Journal::open(reset).expect("reset again");
    assert_eq!(
        rec.origin,
        Origin::Reset {
            previous: Some(dir.join(DISCARDED_FILE))
        }
    );
    assert!(rec.attempts.is_empty());
    assert_eq!(fs::read(dir.join(DISCARDED_FILE)).expect("read"), before);
}

#[test]
fn journal_new_or_half_created_directory_starts_fresh() {
    let tmp = tempfile::tempdir().expect("tempdir");
    // A brand-new (even existing but empty) directory.
    let (_, rec) = Journal::open(cfg(tmp.path())).expect("open empty dir");
    assert_eq!(rec.origin, Origin::Created);
    // A first creation killed before its log was in place leaves an empty
    // lock file (and maybe a partial tmp): nothing was accepted, start fresh.
    let dir = tmp.path().join("half");
    fs::create_dir(&dir).expect("mkdir");
    fs::write(dir.join(LOCK_FILE), b"").expect("lock");
    fs::write(dir.join(TMP_FILE), b"BATONJNL partial").expect("tmp");
    let (_, rec) = Journal::open(cfg(&dir)).expect("open half-created");
    assert_eq!(rec.origin, Origin::Created);
    assert!(!dir.join(TMP_FILE).exists());
}

#[test]
fn journal_missing_log_with_a_complete_compaction_snapshot_is_completed() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    {
        let (mut j, _) = Journal::open(cfg(dir)).expect("open");
        j.record_started(&[("a", 1), ("b", 2)]).expect("started");
        j.record_finished("a", Outcome::Succeeded)
            .expect("finished");
        j.push_feedback(b"fb").expect("push");
        j.compact().expect("compact");
    }
    // A compaction whose snapshot was complete and fsynced, killed before
    // its rename — and the log gone since.
    let snapshot = fs::read(log(dir)).expect("read");
    fs::remove_file(log(dir)).expect("rm");
    // A snapshot cut short is not complete: refused.
    fs::write(dir.join(TMP_FILE), &snapshot[..snapshot.len() - 1]).expect("tmp");
    assert!(matches!(
        Journal::open(cfg(dir)),
        Err(JournalError::LogMissing { .. })
    ));
    fs::write(dir.join(TMP_FILE), &snapshot).expect("tmp");
    let (mut j, rec) = Journal::open(cfg(dir)).expect("open from the snapshot");
    assert_eq!(rec.origin, Origin::CompletedCompaction);
    assert_eq!(rec.attempts.get("a"), Some(&Some(Outcome::Succeeded)));
    assert_eq!(rec.attempts.get("b"), Some(&None));
    assert_eq!(j.outbox_page(0, 9).expect("page"), [(1, b"fb".to_vec())]);
    assert!(!dir.join(TMP_FILE).exists() && log(dir).exists());
}

#[test]
fn journal_outbox_record_damaged_after_it_was_written_is_reported() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let (mut j, _) = Journal::open(cfg(dir)).expect("open");
    let at = j.log_bytes();
    j.push_feedback(b"payload").expect("push");
    // Lazy records reach the file at the next flush.
    j.flush().expect("flush");
    // Flip a payload byte of the record on disk behind the journal's back.
    let mut image = fs::read(log(dir)).expect("read");
    let last = image.len() - 1;
    image[last] ^= 1;
    fs::write(log(dir), &image).expect("write");
    match j.outbox_page(0, 10) {
        Err(JournalError::Corrupt { offset, .. }) => assert_eq!(offset, at),
        other => panic!("expected Corrupt, got {other:?}"),
    }
}
