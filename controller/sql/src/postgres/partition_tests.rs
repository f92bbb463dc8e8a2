//! Day partitions on a real PostgreSQL (a throwaway cluster): made once
//! by replicas racing, rows moved into a day made late, the re-send key,
//! retention by whole days, and the migration of stored rows.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::collections::BTreeSet;

use super::partitions::{self, DAY_NS, Parted, day_of};
use super::*;
use baton_store::contract::{clock, fb, hello};
use baton_store::{FeedbackFilter, Grows, RefTime, Store, StoreOps};

fn available() -> bool {
    std::thread::spawn(baton_testpg::available)
        .join()
        .unwrap_or(false)
}

/// A store on a fresh database, and where it is.
fn open() -> (PgStore, Target) {
    std::thread::spawn(move || {
        let url = baton_testpg::fresh_database().expect("a test database");
        let target = Target::new(&url, None).unwrap();
        (PgStore::open(&target, Binding::Open).unwrap(), target)
    })
    .join()
    .expect("open thread")
}

/// `f` on a connection of its own, on a thread of its own (the sync
/// client's runtime may not run inside the test's).
fn raw<T: Send + 'static>(target: &Target, f: impl FnOnce(&mut Client) -> T + Send + 'static) -> T {
    let target = target.clone();
    std::thread::spawn(move || f(&mut connect(&target).unwrap()))
        .join()
        .expect("raw thread")
}

/// Which partition each stored row of `table` is in, by its key.
fn placed(target: &Target, table: &'static str, key: &'static str) -> Vec<(i64, String)> {
    raw(target, move |c| {
        c.query(
            &format!("SELECT {key}, tableoid::regclass::text FROM {table} ORDER BY {key}"),
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
    })
}

fn today() -> i64 {
    day_of(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as i64,
    )
}

#[test]
fn partition_names_round_trip_to_their_day() {
    for day in [0, 1, 20_428, 20_793, 40_000] {
        for t in Parted::ALL {
            assert_eq!(t.day_of_partition(&t.partition(day)), Some(day));
        }
    }
    assert_eq!(Parted::Feedback.partition(20_793), "feedback_p20261206");
    assert_eq!(Parted::Feedback.day_of_partition("feedback_default"), None);
    assert_eq!(Parted::Feedback.day_of_partition("feedback_p2026120"), None);
    assert_eq!(Parted::Clock.day_of_partition("feedback_p20261207"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_days_around_now_are_made_at_open_and_racing_replicas_make_each_once() {
    if !available() {
        return;
    }
    let (store, target) = open();
    let now = today();
    for t in Parted::ALL {
        let made: Vec<i64> = raw(&target, move |c| partitions::days(c, t).unwrap())
            .into_iter()
            .map(|d| d.0)
            .collect();
        assert_eq!(
            made,
            (now - 1..=now + partitions::AHEAD_DAYS).collect::<Vec<_>>()
        );
    }

    // Four replicas make the same days a month on at once.
    let later = (now + 30 - 1..=now + 30 + partitions::AHEAD_DAYS).collect::<Vec<_>>();
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(4));
    let racers: Vec<_> = (0..4)
        .map(|_| {
            let (target, barrier) = (target.clone(), std::sync::Arc::clone(&barrier));
            std::thread::spawn(move || {
                let mut c = connect(&target).unwrap();
                barrier.wait();
                partitions::make_ahead(&mut c, (now + 30) * DAY_NS).unwrap()
            })
        })
        .collect();
    let mut made: Vec<String> = racers
        .into_iter()
        .flat_map(|r| r.join().expect("racer"))
        .collect();
    made.sort();
    let mut want: Vec<String> = Parted::ALL
        .iter()
        .flat_map(|t| later.iter().map(|d| t.partition(*d)))
        .collect();
    want.sort();
    assert_eq!(made, want, "each day made by exactly one replica");
    drop(store);
}

/// Migration 17: feedback's followers' marks and each day's
/// `received_ns` as block-range summaries; the DEFAULT partition, swept a
/// batch at a time oldest first, keeps its btree. A day made later (a
/// month on) gets its summary too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feedback_keeps_btrees_only_where_a_sweep_needs_order() {
    if !available() {
        return;
    }
    let (store, target) = open();
    let now = today();
    let defs = raw(&target, move |c| {
        partitions::make_ahead(c, (now + 30) * DAY_NS).unwrap();
        c.query(
            "SELECT tablename::text, indexdef FROM pg_indexes WHERE tablename LIKE 'feedback%' \
             AND (indexdef LIKE '%received_ns%' OR indexdef LIKE '%txid%')",
            &[],
        )
        .unwrap()
        .into_iter()
        .map(|r| (r.get::<_, String>(0), r.get::<_, String>(1)))
        .collect::<Vec<_>>()
    });
    let on = |table: &str| -> Vec<&str> {
        defs.iter()
            .filter(|(t, _)| t == table)
            .map(|(_, d)| d.as_str())
            .collect()
    };
    assert!(
        on("feedback")
            .iter()
            .any(|d| d.contains("USING brin (txid)")),
        "{defs:?}"
    );
    assert!(
        !defs.iter().any(|(_, d)| d.contains("btree (txid")),
        "no btree on txid: {defs:?}"
    );
    assert!(
        on("feedback_default")
            .iter()
            .any(|d| d.contains("USING btree (received_ns)")),
        "{defs:?}"
    );
    for day in [now, now + 30] {
        let name = Parted::Feedback.partition(day);
        assert!(
            on(&name)
                .iter()
                .any(|d| d.contains("USING brin (received_ns)")),
            "{name}: {defs:?}"
        );
        assert!(
            !on(&name).iter().any(|d| d.contains("btree (received_ns)")),
            "{name}: {defs:?}"
        );
    }
    drop(store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_of_a_day_not_made_yet_moves_into_it_and_a_resend_meets_its_first_copy() {
    if !available() {
        return;
    }
    let (store, target) = open();
    // A clock ten days ahead: no day made for it yet.
    let ahead = (today() + 10) * DAY_NS + 5;
    let mut row = fb("a1", "j1", 1, ahead);
    row.scheduled = RefTime::from_nanos(ahead);
    store.put_feedback(1, vec![row.clone()]).await.unwrap();
    assert_eq!(
        placed(&target, "feedback", "scheduled_ns"),
        vec![(ahead, "feedback_default".to_string())]
    );

    let made = raw(&target, move |c| {
        partitions::make_days(c, day_of(ahead)..=day_of(ahead)).unwrap()
    });
    assert!(made.contains(&Parted::Feedback.partition(day_of(ahead))));
    assert_eq!(
        placed(&target, "feedback", "scheduled_ns"),
        vec![(ahead, Parted::Feedback.partition(day_of(ahead)))],
        "moved out of the default partition into its day"
    );
    let stored = store.feedback(FeedbackFilter::default()).await.unwrap();
    assert_eq!(stored.len(), 1);

    // The same entry again (a re-send, the acked seq not looked at): the
    // unique key holds, because its day is in it.
    let dup = raw(&target, |c| {
        c.execute(
            "INSERT INTO feedback (journal, seq, tenant, pack, version, instruction, attempt, \
             scheduled_ns, actual_ns, lateness_ns, outcome, reason, event, action, detail, \
             dropped_before, uncertainty_ns, clock_source, clock_state, received_ns) \
             SELECT journal, seq, tenant, pack, version, instruction, attempt, scheduled_ns, \
             actual_ns, lateness_ns, outcome, reason, event, action, detail, dropped_before, \
             uncertainty_ns, clock_source, clock_state, received_ns + 1 FROM feedback",
            &[],
        )
        .map_err(|e| e.code().cloned())
    });
    assert_eq!(dup, Err(Some(postgres::error::SqlState::UNIQUE_VIOLATION)));
    // And through the store: counted a duplicate, stored once.
    let again = store.put_feedback(1, vec![row]).await.unwrap();
    assert_eq!((again.inserted, again.duplicates), (0, 1));
    assert_eq!(
        store
            .feedback(FeedbackFilter::default())
            .await
            .unwrap()
            .len(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_drops_days_wholly_past_keeps_a_day_a_late_row_is_in_and_sweeps_the_default() {
    if !available() {
        return;
    }
    let (store, target) = open();
    let (old, older) = (today() - 100, today() - 99);
    raw(&target, move |c| {
        partitions::make_days(c, old..=older).unwrap()
    });
    let at = |day: i64, n: i64| day * DAY_NS + n;
    let row = |seq: u64, scheduled: i64, received: i64| {
        let mut r = fb("a1", "j1", seq, received);
        r.scheduled = RefTime::from_nanos(scheduled);
        r
    };
    let now_ns = at(today(), 0);
    store
        .put_feedback(
            1,
            vec![
                // Day `old`, stored that day.
                row(1, at(old, 1), at(old, 2)),
                row(2, at(old, 3), at(old, 4)),
                // Day `older`: one stored then, one re-sent today.
                row(3, at(older, 1), at(older, 2)),
                row(4, at(older, 3), now_ns),
                // Before every day: the default partition.
                row(5, at(old - 900, 0), at(old - 900, 1)),
                row(6, at(old - 900, 2), now_ns),
            ],
        )
        .await
        .unwrap();
    let (a, _) = store.agent_hello(hello("c1", 100)).await.unwrap();
    for measured in [at(old, 7), at(older, 7), at(old - 900, 7), now_ns] {
        store
            .record_clock("c1", a.session_gen, clock(measured))
            .await
            .unwrap();
    }

    let before = RefTime::from_nanos(at(today() - 50, 0));
    let dropped = Store::drop_partitions_before(&store, Grows::Feedback, before)
        .await
        .unwrap();
    assert_eq!(dropped, 2, "day `old`, whole");
    assert_eq!(
        store.delete_feedback_before(before, 100).await.unwrap(),
        1,
        "in the default partition, the row stored long ago only"
    );
    let left: BTreeSet<u64> = store
        .feedback(FeedbackFilter::default())
        .await
        .unwrap()
        .iter()
        .map(|r| r.seq)
        .collect();
    assert_eq!(
        left,
        BTreeSet::from([3, 4, 6]),
        "the late row keeps its day"
    );
    let days: Vec<i64> = raw(&target, |c| partitions::days(c, Parted::Feedback).unwrap())
        .into_iter()
        .map(|d| d.0)
        .collect();
    assert!(!days.contains(&old) && days.contains(&older));

    // Clock history goes by its key alone: both past days, and the
    // default partition's old report row by row.
    assert_eq!(
        Store::drop_partitions_before(&store, Grows::Clock, before)
            .await
            .unwrap(),
        2
    );
    assert_eq!(store.delete_clock_before(before, 100).await.unwrap(), 1);
    let clocks = store
        .clock_history("c1", RefTime::from_nanos(0), 100)
        .await
        .unwrap();
    assert_eq!(
        clocks.iter().map(|c| c.at.as_nanos()).collect::<Vec<_>>(),
        vec![now_ns]
    );
    // Nothing more to drop: a second sweep is a no-op.
    assert_eq!(
        Store::drop_partitions_before(&store, Grows::Clock, before)
            .await
            .unwrap(),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drop_waits_for_its_lock_no_longer_than_its_bound_and_leaves_the_day() {
    if !available() {
        return;
    }
    let (store, target) = open();
    let old = today() - 100;
    raw(&target, move |c| {
        partitions::make_days(c, old..=old).unwrap()
    });
    let mut r = fb("a1", "j1", 1, old * DAY_NS + 2);
    r.scheduled = RefTime::from_nanos(old * DAY_NS + 1);
    store.put_feedback(1, vec![r]).await.unwrap();

    // A long reader holds the table (a big dashboard query).
    let (steps, answers) = super::tests::raw_session(&target);
    steps.send("BEGIN".into()).unwrap();
    answers.recv().unwrap().unwrap();
    steps.send("SELECT count(*) FROM feedback".into()).unwrap();
    answers.recv().unwrap().unwrap();
    let before = RefTime::from_nanos((old + 10) * DAY_NS);
    let t0 = std::time::Instant::now();
    assert_eq!(
        Store::drop_partitions_before(&store, Grows::Feedback, before)
            .await
            .unwrap(),
        0
    );
    assert!(t0.elapsed() < std::time::Duration::from_secs(5));
    assert_eq!(
        store
            .feedback(FeedbackFilter::default())
            .await
            .unwrap()
            .len(),
        1
    );
    steps.send("COMMIT".into()).unwrap();
    answers.recv().unwrap().unwrap();
    assert_eq!(
        Store::drop_partitions_before(&store, Grows::Feedback, before)
            .await
            .unwrap(),
        1
    );
    assert!(
        store
            .feedback(FeedbackFilter::default())
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_15_keeps_every_stored_row_and_numbers_new_ones_after_them() {
    if !available() {
        return;
    }
    let target = std::thread::spawn(|| {
        let url = baton_testpg::fresh_database().expect("a test database");
        Target::new(&url, None).unwrap()
    })
    .join()
    .unwrap();
    let now_ns = today() * DAY_NS + 1_000;
    // The schema before partitions, with rows in it: one of today (moved
    // into today's partition when it is made), one long ago (left in the
    // default partition).
    let t = target.clone();
    std::thread::spawn(move || {
        let conn = PgConn::new(connect(&t).unwrap());
        migrate_up_to(&conn, 14).unwrap();
        conn.batch(&format!(
            "INSERT INTO agents (id, labels, agent_version, journal_id, connected, last_seen_ns) \
               VALUES ('c1', '{{}}', '1', 'j', 0, 0); \
             INSERT INTO journals (id, agent_id, journal_id, acked_seq) VALUES (7, 'a1', 'j1', 2); \
             INSERT INTO feedback (id, journal, seq, tenant, pack, version, instruction, attempt, \
               scheduled_ns, actual_ns, lateness_ns, outcome, reason, event, action, detail, \
               dropped_before, uncertainty_ns, clock_source, clock_state, received_ns) VALUES \
               (41, 7, 1, 't', 'p', 1, 'blink', 1, 5, 5, 0, 1, 0, 'executed', 'gpio.write', '', \
                0, 0, 0, 0, 6), \
               (42, 7, 2, 't', 'p', 1, 'blink', 1, {now_ns}, {now_ns}, 0, 1, 0, 'executed', \
                'gpio.write', '', 0, 0, 0, 0, {now_ns}); \
             INSERT INTO clock_reports (agent_id, at_ns, source, state, offset_ns, jitter_ns, \
               uncertainty_ns, frequency_ppm) VALUES ('c1', 9, 'ptp', 'locked', 0, 0, 0, 0), \
               ('c1', {now_ns}, 'ptp', 'locked', 0, 0, 0, 0)"
        ))
        .unwrap();
    })
    .join()
    .unwrap();
    let store = {
        let t = target.clone();
        std::thread::spawn(move || PgStore::open(&t, Binding::Open).unwrap())
            .join()
            .unwrap()
    };
    let rows = store.feedback(FeedbackFilter::default()).await.unwrap();
    assert_eq!(
        rows.iter().map(|r| (r.id, r.seq)).collect::<Vec<_>>(),
        vec![(41, 1), (42, 2)]
    );
    assert_eq!(
        placed(&target, "feedback", "scheduled_ns"),
        vec![
            (5, "feedback_default".to_string()),
            (now_ns, Parted::Feedback.partition(today()))
        ]
    );
    assert_eq!(
        placed(&target, "clock_reports", "at_ns"),
        vec![
            (9, "clock_reports_default".to_string()),
            (now_ns, Parted::Clock.partition(today()))
        ]
    );
    // The next row is numbered after the copied ones.
    let mut next = fb("a1", "j1", 3, now_ns);
    next.scheduled = RefTime::from_nanos(now_ns);
    store.put_feedback(1, vec![next]).await.unwrap();
    let ids: Vec<u64> = store
        .feedback(FeedbackFilter::default())
        .await
        .unwrap()
        .iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(ids.len(), 3);
    assert!(ids[2] > 42, "{ids:?}");
}
