//! Replay of arbitrary bytes as a journal log: refused or recovered, never a
//! panic — the quick, always-run companion of the `journal_replay` fuzz
//! target. Inputs are raw bytes, logs of well-framed records with random
//! payloads (so the decoder and the fold see checksum-valid nonsense), and
//! mutations of a real log.

use std::sync::OnceLock;

use baton_journal::{
    FORMAT_VERSION, Journal, JournalConfig, JournalError, LOG_FILE, Outcome, StopReason,
    StoredPack, check_log_bytes,
};
use proptest::prelude::*;

const HEADER_LEN: usize = 20;

fn header(salt: u32) -> Vec<u8> {
    let mut h = b"BATONJNL".to_vec();
    h.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    h.extend_from_slice(&salt.to_le_bytes());
    let crc = crc32fast::hash(&h);
    h.extend_from_slice(&crc.to_le_bytes());
    h
}

/// Frames `payload` as the journal does: len, CRC seeded with the salt over
/// the len bytes and the payload, payload.
fn frame(out: &mut Vec<u8>, salt: u32, payload: &[u8]) {
    let len = (payload.len() as u32).to_le_bytes();
    let mut h = crc32fast::Hasher::new_with_initial(salt);
    h.update(&len);
    h.update(payload);
    out.extend_from_slice(&len);
    out.extend_from_slice(&h.finalize().to_le_bytes());
    out.extend_from_slice(payload);
}

/// A real log holding every record kind.
fn real_log() -> &'static [u8] {
    static LOG: OnceLock<Vec<u8>> = OnceLock::new();
    LOG.get_or_init(|| {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (mut j, _) = Journal::open(JournalConfig::new(tmp.path())).expect("open");
        j.put_pack(&StoredPack {
            tenant: "t".into(),
            pack: "p".into(),
            version: 2,
            yaml: "pack: p\nversion: 2\n".into(),
            accepted_ns: 7,
            stopped: None,
        })
        .expect("put");
        j.record_started(&[("a", 1), ("b", 2)]).expect("started");
        j.record_finished("a", Outcome::Failed).expect("finished");
        assert!(j.record_once("k", 3).expect("once"));
        for n in 0..4u8 {
            j.push_feedback(&[b'f', n]).expect("push");
        }
        j.ack_feedback(1).expect("ack");
        j.reset_dropped(0).expect("noop");
        let _ = j.heartbeat(9).expect("heartbeat");
        j.compact().expect("compact");
        j.record_started(&[("c", 4)]).expect("started");
        j.stop_pack("t", "p", 2, StopReason::Cancel).expect("stop");
        j.push_feedback(b"late").expect("push");
        j.remove_pack("t", "p").expect("remove");
        drop(j);
        std::fs::read(tmp.path().join(LOG_FILE)).expect("read")
    })
}

/// Payloads that start with a plausible record kind.
fn payloads() -> impl Strategy<Value = Vec<Vec<u8>>> {
    prop::collection::vec(
        (0u8..=14, prop::collection::vec(any::<u8>(), 0..48)).prop_map(|(k, mut rest)| {
            rest.insert(0, k);
            rest
        }),
        0..12,
    )
}

/// `open` on the same bytes agrees with `check_log_bytes`.
fn open_agrees(bytes: &[u8], checked: &Result<baton_journal::LogSummary, JournalError>) {
    let tmp = tempfile::tempdir().expect("tempdir");
    std::fs::write(tmp.path().join(LOG_FILE), bytes).expect("write");
    let opened = Journal::open(JournalConfig::new(tmp.path()));
    match (checked, &opened) {
        (Ok(s), Ok((_, rec))) => {
            assert_eq!(s.truncated_bytes, rec.truncated_bytes);
            assert_eq!(s.outbox_len, rec.outbox_len);
            assert_eq!(s.packs, rec.packs.len());
        }
        (Err(_), Err(_)) => {}
        _ => panic!(
            "check_log_bytes {checked:?} but open {:?}",
            opened.map(|o| o.1)
        ),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = check_log_bytes(&bytes);
        // And behind a valid header.
        let mut log = header(1);
        log.extend_from_slice(&bytes);
        let _ = check_log_bytes(&log);
    }

    #[test]
    fn framed_random_records_never_panic(
        salt in any::<u32>(),
        records in payloads(),
        tail in prop::collection::vec(any::<u8>(), 0..16),
    ) {
        let mut log = header(salt);
        for p in &records {
            frame(&mut log, salt, p);
        }
        log.extend_from_slice(&tail);
        if let Ok(s) = check_log_bytes(&log) {
            prop_assert!(s.valid_bytes as usize + s.truncated_bytes as usize == log.len());
            prop_assert!(s.valid_bytes as usize >= HEADER_LEN);
        }
    }

    #[test]
    fn every_prefix_of_a_real_log_recovers(cut in HEADER_LEN..=4096usize) {
        let log = real_log();
        let cut = cut.min(log.len());
        let s = check_log_bytes(&log[..cut]).expect("a prefix is a torn tail, never corrupt");
        prop_assert!(s.valid_bytes as usize <= cut);
    }

    #[test]
    fn mutated_real_logs_never_panic(
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        insert in prop::option::of((any::<prop::sample::Index>(), prop::collection::vec(any::<u8>(), 1..16))),
    ) {
        let mut log = real_log().to_vec();
        for (at, x) in &flips {
            let i = at.index(log.len());
            log[i] ^= x;
        }
        if let Some((at, bytes)) = &insert {
            let i = at.index(log.len());
            log.splice(i..i, bytes.iter().copied());
        }
        let _ = check_log_bytes(&log);
    }
}

proptest! {
    // Each case creates files: fewer cases.
    #![proptest_config(ProptestConfig { cases: 150, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn open_agrees_with_check_log_bytes(
        salt in any::<u32>(),
        records in payloads(),
        flip in prop::option::of((any::<prop::sample::Index>(), 1u8..=255)),
        real in any::<bool>(),
    ) {
        let mut log = if real {
            real_log().to_vec()
        } else {
            let mut log = header(salt);
            for p in &records {
                frame(&mut log, salt, p);
            }
            log
        };
        if let Some((at, x)) = flip {
            let i = at.index(log.len());
            log[i] ^= x;
        }
        let checked = check_log_bytes(&log);
        open_agrees(&log, &checked);
    }
}

#[test]
fn the_real_log_replays_to_what_was_written() {
    let s = check_log_bytes(real_log()).expect("valid");
    assert_eq!((s.packs, s.attempts, s.unfinished, s.once), (0, 3, 2, 1));
    assert_eq!((s.outbox_len, s.next_seq), (4, 6));
    assert_eq!(s.truncated_bytes, 0);
}
