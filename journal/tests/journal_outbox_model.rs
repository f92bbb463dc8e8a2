//! The outbox against a model, over random sequences of calls: pushes
//! (batched into one record per pass), acks, results, flushes,
//! compactions and reopens, with a cap small enough to drop. Whatever the
//! order, the journal holds what the model holds — the same seqs, the
//! same bytes, the same drop count — before and after a reopen.

use std::collections::VecDeque;

use baton_journal::{Journal, JournalConfig, Outcome};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Call {
    /// A feedback record of this many bytes (its seq written into it).
    Push(usize),
    /// Acknowledge up to this many entries past the front.
    Ack(u64),
    Finish,
    Flush,
    Compact,
    Reopen,
}

fn calls() -> impl Strategy<Value = Vec<Call>> {
    prop::collection::vec(
        prop_oneof![
            8 => (0usize..120).prop_map(Call::Push),
            2 => (0u64..6).prop_map(Call::Ack),
            2 => Just(Call::Finish),
            1 => Just(Call::Flush),
            1 => Just(Call::Compact),
            1 => Just(Call::Reopen),
        ],
        1..80,
    )
}

/// What the outbox must hold: entries (seq, bytes), the next seq, drops.
#[derive(Default)]
struct Model {
    held: VecDeque<(u64, Vec<u8>)>,
    next_seq: u64,
    dropped: u64,
}

fn record(seq: u64, len: usize) -> Vec<u8> {
    let mut r = format!("feedback {seq} ").into_bytes();
    r.resize(len.max(r.len()), b'x');
    r
}

fn agrees(j: &mut Journal, m: &Model) -> Result<(), TestCaseError> {
    let page = j.outbox_page(0, usize::MAX).expect("page");
    prop_assert_eq!(page, m.held.iter().cloned().collect::<Vec<_>>());
    prop_assert_eq!(j.dropped(), m.dropped);
    prop_assert_eq!(j.next_seq(), m.next_seq);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn the_outbox_holds_what_the_model_holds_across_batches_and_reopens(calls in calls()) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let cfg = JournalConfig {
            outbox_cap: 7,
            ..JournalConfig::new(tmp.path())
        };
        let (mut j, _) = Journal::open(cfg.clone()).expect("open");
        let mut m = Model { next_seq: 1, ..Model::default() };
        let mut fired = 0u64;
        for call in calls {
            match call {
                Call::Push(len) => {
                    let r = record(m.next_seq, len);
                    prop_assert_eq!(j.push_feedback(&r).expect("push"), m.next_seq);
                    if m.held.len() == 7 {
                        m.held.pop_front();
                        m.dropped += 1;
                    }
                    m.held.push_back((m.next_seq, r));
                    m.next_seq += 1;
                }
                Call::Ack(k) => {
                    // Only what was sent can be acknowledged: read first.
                    agrees(&mut j, &m)?;
                    if let Some(&(front, _)) = m.held.front() {
                        let up_to = front + k;
                        j.ack_feedback(up_to).expect("ack");
                        m.held.retain(|(s, _)| *s > up_to);
                    }
                }
                Call::Finish => {
                    fired += 1;
                    let id = format!("t/p/v1/i/{fired}/a1");
                    j.record_started(&[(&id, fired as i64)]).expect("start");
                    j.record_finished(&id, Outcome::Succeeded).expect("finish");
                }
                Call::Flush => j.flush().expect("flush"),
                Call::Compact => j.compact().expect("compact"),
                Call::Reopen => {
                    drop(j);
                    j = Journal::open(cfg.clone()).expect("reopen").0;
                }
            }
        }
        agrees(&mut j, &m)?;
        drop(j);
        let (mut j, rec) = Journal::open(cfg).expect("reopen at the end");
        prop_assert_eq!(rec.outbox_len, m.held.len());
        agrees(&mut j, &m)?;
    }
}

/// A long run of pushes in one pass is cut into records of at most
/// `MAX_ENTRIES` (4 096): replay refuses a record claiming more, so a
/// longer one would make the journal unreadable at the next open.
#[test]
fn a_long_run_of_pushes_reopens_whole() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cfg = JournalConfig::new(tmp.path());
    let (mut j, _) = Journal::open(cfg.clone()).expect("open");
    for seq in 1..=10_000u64 {
        assert_eq!(j.push_feedback(&[seq as u8]).expect("push"), seq);
    }
    j.flush().expect("flush");
    drop(j);
    let (mut j, rec) = Journal::open(cfg.clone()).expect("reopen");
    assert_eq!(rec.outbox_len, 10_000);
    let page = j.outbox_page(4_090, 20).expect("page");
    assert_eq!(page.first(), Some(&(4_090, vec![4_090u64 as u8])));
    assert_eq!(page.len(), 20);
    // Compaction batches the outbox again, within the same bound.
    j.compact().expect("compact");
    drop(j);
    let (_, rec) = Journal::open(cfg).expect("reopen after compaction");
    assert_eq!(rec.outbox_len, 10_000);
}
