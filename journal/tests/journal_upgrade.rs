//! A journal written by the agent before format 3 (version 2: fixed-width
//! fields, one result per record, JSON feedback in the outbox) is read by
//! this agent, rewritten in format 3 at open, and its outbox drains: the
//! JSON records come back byte for byte for the link to convert.

use baton_journal::{FORMAT_VERSION, Journal, JournalConfig, LOG_FILE, Outcome};

const V2: u32 = 2;

fn header(salt: u32) -> Vec<u8> {
    let mut h = b"BATONJNL".to_vec();
    h.extend_from_slice(&V2.to_le_bytes());
    h.extend_from_slice(&salt.to_le_bytes());
    let crc = crc32fast::hash(&h);
    h.extend_from_slice(&crc.to_le_bytes());
    h
}

fn frame(out: &mut Vec<u8>, salt: u32, payload: &[u8]) {
    let len = (payload.len() as u32).to_le_bytes();
    let mut h = crc32fast::Hasher::new_with_initial(salt);
    h.update(&len);
    h.update(payload);
    out.extend_from_slice(&len);
    out.extend_from_slice(&h.finalize().to_le_bytes());
    out.extend_from_slice(payload);
}

fn str2(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

const ID_A: &str = "default/press/v1/stamp/1796000000000000000/a1";
const ID_B: &str = "default/press/v1/stamp/1796000000100000000/a1";
const JSON_1: &[u8] = br#"{"event":"executed","execution_id":"default/press/v1/stamp/1796000000000000000/a1","pack":"default/press","instruction":"stamp","action":"gpio.write","scheduled_ns":1796000000000000000,"actual_ns":1796000000000050000,"lateness_ns":50000,"result":"ok","value":null,"uncertainty_ns":1000}"#;
const JSON_2: &[u8] = br#"{"event":"skip","t_ns":1796000000200000000,"pack":"default/press","version":1,"instruction":"stamp","execution_id":null,"occurrence_ns":1796000000200000000,"uncertainty_ns":1000,"detail":"missed 1 occurrence(s)"}"#;

/// A version-2 log as agents before format 3 wrote it: a snapshot (id,
/// meta), then a pass's records (started, results, feedback with a drop at
/// the cap, an ack, a heartbeat).
fn v2_log(salt: u32) -> Vec<u8> {
    let mut log = header(salt);
    let mut p = vec![13u8]; // JournalId
    str2(&mut p, "0123456789abcdef0123456789abcdef");
    frame(&mut log, salt, &p);
    let mut p = vec![9u8]; // Meta: next_seq 1, dropped 0, no alive
    p.extend_from_slice(&1u64.to_le_bytes());
    p.extend_from_slice(&0u64.to_le_bytes());
    p.push(0);
    p.extend_from_slice(&0i64.to_le_bytes());
    frame(&mut log, salt, &p);
    let mut p = vec![3u8]; // Started
    p.extend_from_slice(&2u32.to_le_bytes());
    for (id, ns) in [
        (ID_A, 1_796_000_000_000_000_000i64),
        (ID_B, 1_796_000_000_100_000_000),
    ] {
        str2(&mut p, id);
        p.extend_from_slice(&ns.to_le_bytes());
    }
    frame(&mut log, salt, &p);
    for (seq, dropped_through, rec) in [
        (1u64, 0u64, &b"{\"old\":1}"[..]),
        (2, 0, JSON_1),
        (3, 1, JSON_2),
    ] {
        let mut p = vec![5u8]; // Push
        p.extend_from_slice(&seq.to_le_bytes());
        p.extend_from_slice(&dropped_through.to_le_bytes());
        p.extend_from_slice(&(rec.len() as u32).to_le_bytes());
        p.extend_from_slice(rec);
        frame(&mut log, salt, &p);
    }
    let mut p = vec![4u8]; // Finished: one result per record
    str2(&mut p, ID_A);
    p.extend_from_slice(&1_796_000_000_000_000_000i64.to_le_bytes());
    p.push(1);
    frame(&mut log, salt, &p);
    let mut p = vec![7u8]; // Alive
    p.extend_from_slice(&1_796_000_000_300_000_000i64.to_le_bytes());
    frame(&mut log, salt, &p);
    log
}

#[test]
fn a_version_2_journal_is_read_rewritten_and_its_json_outbox_drains() {
    let tmp = tempfile::tempdir().expect("tempdir");
    std::fs::write(tmp.path().join(LOG_FILE), v2_log(0x5eed)).expect("write");
    let (mut j, rec) = Journal::open(JournalConfig::new(tmp.path())).expect("open a v2 log");
    assert_eq!(
        j.id(),
        "0123456789abcdef0123456789abcdef",
        "its identity kept"
    );
    assert_eq!(rec.attempts.get(ID_A), Some(&Some(Outcome::Succeeded)));
    assert_eq!(
        rec.attempts.get(ID_B),
        Some(&None),
        "started, no result: unknown"
    );
    assert_eq!(
        (rec.outbox_len, rec.dropped),
        (2, 1),
        "seq 1 was dropped at the cap"
    );
    assert_eq!(rec.last_alive_ns, Some(1_796_000_000_300_000_000));
    let page = j.outbox_page(0, 10).expect("page");
    assert_eq!(
        page,
        [(2, JSON_1.to_vec()), (3, JSON_2.to_vec())],
        "byte for byte"
    );
    // Rewritten in this format at open.
    let bytes = std::fs::read(tmp.path().join(LOG_FILE)).expect("read");
    assert_eq!(bytes[8..12], FORMAT_VERSION.to_le_bytes());
    // The old drop is reported on the first entry sent.
    assert_eq!(j.carry_drops(2).expect("carry"), 1);
    assert_eq!(j.push_feedback(b"\xb1new").expect("push"), 4, "seqs go on");
    j.record_finished(ID_B, Outcome::Failed).expect("finished");
    drop(j);
    let (mut j, rec) = Journal::open(JournalConfig::new(tmp.path())).expect("reopen");
    assert_eq!(rec.attempts.get(ID_B), Some(&Some(Outcome::Failed)));
    assert_eq!(j.dropped_before(2), 1);
    let page = j.outbox_page(0, 10).expect("page");
    assert_eq!(page.len(), 3);
    assert_eq!(page[0], (2, JSON_1.to_vec()));
    j.ack_feedback(4).expect("ack");
    assert_eq!((j.outbox_len(), j.dropped()), (0, 0));
}
