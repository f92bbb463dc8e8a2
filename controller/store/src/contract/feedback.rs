//! The contract on feedback: stored once, drops, all or nothing, retention, paging.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use baton_model::RefTime;
use baton_proto::wire;

use crate::*;

use super::fixtures::*;

// ---------------------------------------------------------------------------
// Feedback.

/// Stored once per (agent, journal, seq); duplicates counted, the first
/// copy kept; the acked seq is the journal's highest; ids grow in storage
/// order.
pub async fn feedback_stored_once(s: &dyn Store, _: Binding) {
    let rows = |r: std::ops::RangeInclusive<u64>| -> Vec<FeedbackRow> {
        r.map(|q| fb("a1", "j1", q, 100 + i64::try_from(q).unwrap()))
            .collect()
    };
    let stored = |inserted, duplicates, acked_seq| FeedbackStored {
        inserted,
        duplicates,
        acked_seq,
    };
    assert_eq!(s.feedback_acked("a1", "j1").await.unwrap(), 0);
    assert_eq!(
        s.put_feedback(1, rows(1..=5)).await.unwrap(),
        stored(5, 0, 5)
    );
    // A re-send after a lost ack.
    assert_eq!(
        s.put_feedback(1, rows(1..=5)).await.unwrap(),
        stored(0, 5, 5)
    );
    // Overlapping, with a duplicate inside the call itself.
    let mut overlap = rows(4..=8);
    overlap.push(fb("a1", "j1", 8, 999));
    assert_eq!(s.put_feedback(1, overlap).await.unwrap(), stored(3, 3, 8));
    // The stored copy is the first one.
    let mut changed = fb("a1", "j1", 1, 101);
    changed.detail = "changed".into();
    assert_eq!(
        s.put_feedback(1, vec![changed]).await.unwrap(),
        stored(0, 1, 8)
    );
    assert_eq!(
        s.put_feedback(1, Vec::new()).await.unwrap(),
        FeedbackStored::default()
    );

    // Journals count apart.
    let j2 = vec![fb("a1", "j2", 100, 200)];
    assert_eq!(s.put_feedback(1, j2).await.unwrap(), stored(1, 0, 100));
    assert_eq!(
        s.put_feedback(1, vec![fb("b2", "j1", 50, 210)])
            .await
            .unwrap(),
        stored(1, 0, 50)
    );
    assert_eq!(s.feedback_acked("a1", "j1").await.unwrap(), 8);
    assert_eq!(s.feedback_acked("a1", "j2").await.unwrap(), 100);
    assert_eq!(s.feedback_acked("b2", "j1").await.unwrap(), 50);
    assert_eq!(s.feedback_acked("b2", "j2").await.unwrap(), 0);

    let all = all_feedback(s).await;
    let mut want: Vec<(String, String, u64)> = (1..=8).map(|q| sq("a1", "j1", q)).collect();
    want.push(sq("a1", "j2", 100));
    want.push(sq("b2", "j1", 50));
    assert_eq!(seqs(&all), want);
    assert!(all.windows(2).all(|w| w[0].id < w[1].id), "ids grow");
    assert!(all.iter().all(|r| r.id > 0));
    let first = FeedbackRow {
        id: all[0].id,
        ..fb("a1", "j1", 1, 101)
    };
    assert_eq!(all[0], first, "the first copy, whole");
    assert_eq!(all[7].received.as_nanos(), 108, "not the in-call duplicate");
}

/// A re-sent entry may carry a count of drops the agent made after it was
/// first sent: the stored row keeps the count (and nothing else of the
/// copy), and a smaller count never replaces a larger one.
pub async fn feedback_drops_on_a_resent_entry(s: &dyn Store, _: Binding) {
    // Seqs 3..=9 never arrived: seven entries are missing before 10.
    let rows: Vec<FeedbackRow> = [1, 2, 10].map(|q| fb("a1", "j1", q, 10)).into();
    s.put_feedback(1, rows).await.unwrap();
    let mut carrier = fb("a1", "j1", 10, 99);
    carrier.dropped_before = 5;
    carrier.detail = "not stored".into();
    let stored = s.put_feedback(1, vec![carrier.clone()]).await.unwrap();
    assert_eq!((stored.inserted, stored.duplicates), (0, 1));
    // A smaller count later changes nothing; a larger one is held to the
    // seven entries missing before it.
    carrier.dropped_before = 3;
    s.put_feedback(1, vec![carrier.clone()]).await.unwrap();
    carrier.dropped_before = 9;
    s.put_feedback(1, vec![carrier]).await.unwrap();
    // An entry stored right after the one before it missed nothing,
    // whatever it carries when it comes back.
    let mut two = fb("a1", "j1", 2, 99);
    two.dropped_before = 4;
    s.put_feedback(1, vec![two]).await.unwrap();
    let all = all_feedback(s).await;
    let ten = all.iter().find(|r| r.seq == 10).unwrap();
    assert_eq!(
        (
            ten.dropped_before,
            ten.detail.as_str(),
            ten.received.as_nanos()
        ),
        (7, "", 10)
    );
    assert!(
        all.iter()
            .filter(|r| r.seq != 10)
            .all(|r| r.dropped_before == 0)
    );
}

/// A call is all or nothing: a value past `i64::MAX` or rows of two
/// journals store nothing; `i64::MAX` itself is fine.
pub async fn feedback_all_or_nothing(s: &dyn Store, _: Binding) {
    let mut seq = fb("a1", "j1", 1, 10);
    seq.seq = TOO_BIG;
    assert!(
        s.put_feedback(1, vec![fb("a1", "j1", 2, 10), seq])
            .await
            .is_err()
    );
    let mut version = fb("a1", "j1", 3, 10);
    version.version = TOO_BIG;
    assert!(
        s.put_feedback(1, vec![fb("a1", "j1", 4, 10), version])
            .await
            .is_err()
    );
    let mut dropped = fb("a1", "j1", 5, 10);
    dropped.dropped_before = u64::MAX;
    assert!(
        s.put_feedback(1, vec![fb("a1", "j1", 6, 10), dropped])
            .await
            .is_err()
    );
    // One journal per call.
    assert!(
        s.put_feedback(1, vec![fb("a1", "j1", 7, 10), fb("a1", "j2", 8, 10)])
            .await
            .is_err()
    );
    assert!(
        s.put_feedback(1, vec![fb("a1", "j1", 7, 10), fb("b2", "j1", 8, 10)])
            .await
            .is_err()
    );
    assert_eq!(all_feedback(s).await, []);
    assert_eq!(s.feedback_acked("a1", "j1").await.unwrap(), 0);
    assert_eq!(s.feedback_acked("a1", "j2").await.unwrap(), 0);

    let mut max = fb("a1", "j1", 1, 10);
    max.seq = TOO_BIG - 1;
    max.version = TOO_BIG - 1;
    max.dropped_before = TOO_BIG - 1;
    max.attempt = u32::MAX;
    max.value = Some(u32::MAX);
    let stored = s.put_feedback(1, vec![max.clone()]).await.unwrap();
    assert_eq!((stored.inserted, stored.acked_seq), (1, TOO_BIG - 1));
    let got = all_feedback(s).await;
    assert_eq!(
        got,
        [FeedbackRow {
            id: got[0].id,
            ..max
        }]
    );
    assert_eq!(s.feedback_acked("a1", "j1").await.unwrap(), TOO_BIG - 1);
}

/// Retention deletes rows, not what was acknowledged: the acked seq stays,
/// a re-send of deleted rows is a duplicate, and ids are never handed out
/// twice, even after every row went.
pub async fn feedback_through_retention(s: &dyn Store, _: Binding) {
    let rows = |r: std::ops::RangeInclusive<u64>| -> Vec<FeedbackRow> {
        r.map(|q| fb("a1", "j1", q, 10 * i64::try_from(q).unwrap()))
            .collect()
    };
    s.put_feedback(1, rows(1..=4)).await.unwrap();
    let max_id = all_feedback(s).await.last().unwrap().id;
    assert_eq!(
        s.delete_feedback_before(RefTime::from_nanos(i64::MAX), 100)
            .await
            .unwrap(),
        4
    );
    assert_eq!(all_feedback(s).await, []);
    assert_eq!(s.feedback_acked("a1", "j1").await.unwrap(), 4);
    let again = s.put_feedback(1, rows(1..=4)).await.unwrap();
    assert_eq!(
        (again.inserted, again.duplicates, again.acked_seq),
        (0, 4, 4)
    );
    assert_eq!(all_feedback(s).await, []);

    let more = s.put_feedback(1, rows(3..=6)).await.unwrap();
    assert_eq!((more.inserted, more.duplicates, more.acked_seq), (2, 2, 6));
    let got = all_feedback(s).await;
    assert_eq!(seqs(&got), [sq("a1", "j1", 5), sq("a1", "j1", 6)]);
    assert!(got[0].id > max_id, "{} after {max_id}", got[0].id);
    // A reader's cursor from before sees them as new.
    let after = s
        .feedback(FeedbackFilter {
            after_id: max_id,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(after, got);
}

/// Pages of feedback in storage order, after an id, by every filter; each
/// row read back whole.
pub async fn feedback_pages_and_filters(s: &dyn Store, _: Binding) {
    // Canonical id (rebuilt from the row), none (a pack-wide event), and
    // one of its own.
    let a1_1 = fb("a1", "j1", 1, 100);
    let mut b2_1 = fb("b2", "j1", 1, 500);
    b2_1.pack = "q".into();
    b2_1.execution_id = String::new();
    b2_1.occurrence = None;
    b2_1.instruction = String::new();
    b2_1.outcome = wire::Outcome::SafeState;
    b2_1.reason = wire::Reason::Cancel;
    b2_1.event = "safe_state".into();
    b2_1.value = None;
    b2_1.clock_source = wire::ClockSource::Unspecified;
    b2_1.clock_state = wire::ClockState::Unspecified;
    let mut a1_2 = fb("a1", "j1", 2, 200);
    a1_2.execution_id = "t/p/v1/blink/7/a1-custom".into();
    a1_2.outcome = wire::Outcome::Skipped;
    a1_2.reason = wire::Reason::Late;
    a1_2.detail = "reached after its max_lateness".into();
    a1_2.dropped_before = 3;
    a1_2.clock_source = wire::ClockSource::Ntp;
    a1_2.clock_state = wire::ClockState::Holdover;
    let mut c3_1 = fb("c3", "j1", 1, 150);
    c3_1.tenant = "u".into();
    c3_1.execution_id = c3_1.execution_id.replacen("t/", "u/", 1);
    let b2_7 = fb("b2", "j1", 7, 300);
    let put = [&a1_1, &b2_1, &a1_2, &c3_1, &b2_7];
    for r in put {
        s.put_feedback(1, vec![r.clone()]).await.unwrap();
    }
    let all = all_feedback(s).await;
    assert_eq!(all.len(), 5);
    for (got, want) in all.iter().zip(put) {
        assert_eq!(
            *got,
            FeedbackRow {
                id: got.id,
                ..want.clone()
            }
        );
    }
    let id = |i: usize| all[i].id;

    let get = |f: FeedbackFilter| async move { seqs(&s.feedback(f).await.unwrap()) };
    let a1 = |q| sq("a1", "j1", q);
    let b2 = |q| sq("b2", "j1", q);
    let c3 = |q| sq("c3", "j1", q);
    let f = FeedbackFilter::default;
    assert_eq!(get(f()).await, [a1(1), b2(1), a1(2), c3(1), b2(7)]);
    assert_eq!(
        get(FeedbackFilter {
            tenant: Some("t".into()),
            ..f()
        })
        .await,
        [a1(1), b2(1), a1(2), b2(7)]
    );
    assert_eq!(
        get(FeedbackFilter {
            tenant: Some("t".into()),
            pack: Some("p".into()),
            ..f()
        })
        .await,
        [a1(1), a1(2), b2(7)]
    );
    assert_eq!(
        get(FeedbackFilter {
            pack: Some("p".into()),
            ..f()
        })
        .await,
        [a1(1), a1(2), c3(1), b2(7)]
    );
    assert_eq!(
        get(FeedbackFilter {
            agent_id: Some("b2".into()),
            ..f()
        })
        .await,
        [b2(1), b2(7)]
    );
    assert_eq!(
        get(FeedbackFilter {
            since: Some(RefTime::from_nanos(200)),
            ..f()
        })
        .await,
        [b2(1), a1(2), b2(7)]
    );
    assert_eq!(
        get(FeedbackFilter {
            tenant: Some("t".into()),
            pack: Some("p".into()),
            agent_id: Some("a1".into()),
            since: Some(RefTime::from_nanos(150)),
            after_id: 0,
            limit: 1,
        })
        .await,
        [a1(2)]
    );
    // Pages.
    let page = |after_id, limit| FeedbackFilter {
        after_id,
        limit,
        ..f()
    };
    assert_eq!(get(page(0, 2)).await, [a1(1), b2(1)]);
    assert_eq!(get(page(id(1), 2)).await, [a1(2), c3(1)]);
    assert_eq!(get(page(id(3), 2)).await, [b2(7)]);
    assert_eq!(get(page(id(4), 2)).await, []);
    assert_eq!(get(page(0, 0)).await.len(), 5, "0: unset");
    assert_eq!(get(page(u64::MAX, 0)).await, []);
    assert_eq!(
        get(FeedbackFilter {
            agent_id: Some("b2".into()),
            after_id: id(1),
            ..f()
        })
        .await,
        [b2(7)]
    );
    assert_eq!(
        get(FeedbackFilter {
            agent_id: Some("nobody".into()),
            ..f()
        })
        .await,
        []
    );
}

/// A pack's window is followed by [`Mark`] like the whole table: from any
/// mark only that pack's rows received since the window's start, each
/// once, in pages; rows stored after the end are read from the mark the
/// last read left.
pub async fn feedback_of_a_pack_followed_by_mark(s: &dyn Store, _: Binding) {
    let (_, start) = s.high_water().await.unwrap();
    let of = |agent: &str, pack: &str, seq: u64, received_ns: i64| FeedbackRow {
        pack: pack.into(),
        ..fb(agent, "j1", seq, received_ns)
    };
    // The window: pack p from 150 on.
    let key = PackKey {
        tenant: "t".into(),
        pack: "p".into(),
    };
    let scope = FeedbackScope::Pack {
        key: &key,
        since: RefTime::from_nanos(150),
    };
    for put in [
        vec![of("a1", "p", 1, 100), of("a1", "p", 2, 150)],
        vec![of("b2", "q", 1, 200)],
        vec![of("a1", "p", 3, 210), of("a1", "p", 4, 220)],
    ] {
        s.put_feedback(1, put).await.unwrap();
    }
    let seqs = |rows: &[FeedbackRow]| -> Vec<(String, String, u64)> {
        rows.iter()
            .map(|r| (r.agent_id.clone(), r.pack.clone(), r.seq))
            .collect()
    };
    let want = |v: &[u64]| -> Vec<(String, String, u64)> {
        v.iter().map(|&q| ("a1".into(), "p".into(), q)).collect()
    };
    let (all, end) = followed(3, || s.feedback_after(start, scope, 0)).await;
    assert_eq!(seqs(&all), want(&[2, 3, 4]), "the window's rows, in order");
    // From the window's own start mark: the same rows.
    let at = s.feedback_mark_at(RefTime::from_nanos(150)).await.unwrap();
    let (from_at, _) = followed(3, || s.feedback_after(at, scope, 0)).await;
    assert_eq!(seqs(&from_at), want(&[2, 3, 4]));
    // A window with no rows yet starts past every row stored.
    let later = s
        .feedback_mark_at(RefTime::from_nanos(1_000))
        .await
        .unwrap();
    assert_eq!(
        s.feedback_after(later, FeedbackScope::All, 0)
            .await
            .unwrap()
            .0,
        []
    );
    let (first, m1) = s.feedback_after(start, scope, 2).await.unwrap();
    assert_eq!(seqs(&first), want(&[2, 3]));
    let (second, _) = s.feedback_after(m1, scope, 2).await.unwrap();
    assert_eq!(seqs(&second), want(&[4]));
    assert_eq!(s.feedback_after(end, scope, 0).await.unwrap().0, []);
    // Another pack's rows later move nothing; the window's next one is
    // read from the end, once.
    s.put_feedback(1, vec![of("b2", "q", 2, 300)])
        .await
        .unwrap();
    s.put_feedback(1, vec![of("a1", "p", 5, 310)])
        .await
        .unwrap();
    let (more, end2) = followed(1, || s.feedback_after(end, scope, 0)).await;
    assert_eq!(seqs(&more), want(&[5]));
    let later_scope = FeedbackScope::Pack {
        key: &key,
        since: RefTime::from_nanos(1_000),
    };
    assert_eq!(
        s.feedback_after(later, later_scope, 0).await.unwrap().0,
        [],
        "received before the later window"
    );
    let (all_later, _) = followed(2, || s.feedback_after(later, FeedbackScope::All, 0)).await;
    assert_eq!(all_later.len(), 2, "stored after the later window's mark");
    assert_eq!(s.feedback_after(end2, scope, 0).await.unwrap().0, []);
    // The whole table is still there for a follower of everything.
    let (every, _) = followed(7, || s.feedback_after(start, FeedbackScope::All, 0)).await;
    assert_eq!(every.len(), 7);
}
