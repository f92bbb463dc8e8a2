//! [`SqliteStore`]: the store contract on real files, then what only this
//! backend has: durability settings, schema versions and the migration of
//! a v4 database, read-only readers, the writer's group commit (a
//! savepoint per command, one answer per caller whatever the commit
//! does), closing, dropping, restarting, and rows that do not decode.
//!
//! These live beside the implementation (not in `tests/`) so they can
//! drive the writer directly: hold it inside a batch to queue commands
//! deterministically, or run SQL that makes a commit fail.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use baton_model::{RefTime, SpanNanos};
use baton_proto::wire;
use tempfile::TempDir;
use tokio::sync::oneshot;

use super::conn::Context;
use super::*;
use crate::sql::db::{col, query_all};
use baton_store::StoreOps;
use baton_store::contract::{
    ack, audit_row, clock, fb, held, hello_in, key, labels, pack, push, refusal, refuse, to_ids,
    to_labels,
};
use baton_store::{
    AgentFilter, DeliveryRow, DeliveryState, ErrorRow, FeedbackFilter, FeedbackRow, Held,
    HeldPackRow, Intent, PutPack, Refusal, Store, TargetsRow,
};

fn open_store(binding: Binding) -> (SqliteStore, TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path(), binding).unwrap();
    (store, dir)
}

baton_store::contract_suite!(open_store);

fn open() -> (TempDir, SqliteStore) {
    let (store, dir) = open_store(Binding::Tenants);
    (dir, store)
}

fn fbs(agent: &str, seqs: std::ops::RangeInclusive<u64>) -> Vec<FeedbackRow> {
    seqs.map(|s| fb(agent, "j1", s, 1_000 + i64::try_from(s).unwrap()))
        .collect()
}

async fn all_feedback(store: &SqliteStore) -> Vec<FeedbackRow> {
    store.feedback(FeedbackFilter::default()).await.unwrap()
}

/// Failed, saying `needle`.
fn is_backend<T: fmt::Debug>(r: &StoreResult<T>, needle: &str) -> bool {
    r.as_ref().is_err_and(|e| e.to_string().contains(needle))
}

/// Failed on a stored value that does not read back, naming `what`.
fn is_corrupt<T: fmt::Debug>(r: &StoreResult<T>, what: &str) -> bool {
    matches!(r, Err(StoreError::Corrupt { what: w, .. }) if w.contains(what))
}

/// Runs SQL on the writer (inside a batch, as a command).
async fn exec(store: &SqliteStore, sql: &'static str) -> StoreResult<()> {
    store
        .write_raw(move |conn| conn.execute_batch(sql).ctx("test SQL"))
        .await
}

/// One integer from a reader.
async fn scalar(store: &SqliteStore, sql: &'static str) -> i64 {
    store
        .read_raw(move |conn| conn.query_row(sql, [], |r| r.get(0)).ctx("test query"))
        .await
        .unwrap()
}

/// Parks the writer inside a batch; everything sent meanwhile queues up
/// and goes into the next batch. Release by sending on (or dropping) the
/// returned sender.
async fn hold_writer(
    store: &SqliteStore,
) -> (
    std::sync::mpsc::Sender<()>,
    tokio::task::JoinHandle<StoreResult<()>>,
) {
    let (release, wait) = std::sync::mpsc::channel::<()>();
    let (inside, is_inside) = oneshot::channel::<()>();
    let mut inside = Some(inside);
    let s = store.clone();
    let task = tokio::spawn(async move {
        s.write(move |_| {
            if let Some(inside) = inside.take() {
                let _ = inside.send(());
            }
            let _ = wait.recv();
            Ok(())
        })
        .await
    });
    is_inside.await.unwrap();
    (release, task)
}

/// Yields until `n` commands wait in the writer's queue.
async fn until_queued(store: &SqliteStore, n: usize) {
    while store.queued() < n {
        tokio::task::yield_now().await;
    }
}

// ---------------------------------------------------------------------------
// Opening.

#[tokio::test]
async fn open_sets_durability_pragmas_and_reopen_is_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    let nested = dir.path().join("nested");
    let store = SqliteStore::open(&nested, Binding::Tenants).unwrap();
    assert!(nested.join(DB_FILE).exists());
    let (mode, sync, fk) = store
        .write_raw(|conn| {
            let get = |p: &str| -> StoreResult<String> {
                conn.query_row(&format!("PRAGMA {p}"), [], |r| {
                    r.get::<_, rusqlite::types::Value>(0)
                })
                .map(|v| match v {
                    rusqlite::types::Value::Text(t) => t,
                    rusqlite::types::Value::Integer(i) => i.to_string(),
                    other => format!("{other:?}"),
                })
                .ctx("pragma")
            };
            Ok((
                get("journal_mode")?,
                get("synchronous")?,
                get("foreign_keys")?,
            ))
        })
        .await
        .unwrap();
    // synchronous=2 is FULL: every commit is fsynced.
    assert_eq!(
        (mode.as_str(), sync.as_str(), fk.as_str()),
        ("wal", "2", "1")
    );
    assert_eq!(scalar(&store, "PRAGMA query_only").await, 1, "readers");
    drop(store);

    let all: Vec<i64> = crate::migrations::MIGRATIONS
        .iter()
        .map(|m| m.version)
        .collect();
    assert_eq!(
        all,
        [
            1, 2, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22
        ]
    );
    for _ in 0..2 {
        let store = SqliteStore::open(&nested, Binding::Tenants).unwrap();
        let versions = store
            .read(|conn| {
                query_all(
                    conn,
                    "SELECT version FROM schema_migrations ORDER BY version",
                    &[],
                    |r| col::<i64>(r, "version"),
                )
            })
            .await
            .unwrap();
        assert_eq!(versions, all);
    }
}

#[tokio::test]
async fn a_newer_schema_is_refused() {
    let (dir, store) = open();
    exec(
        &store,
        "INSERT INTO schema_migrations (version) VALUES (99)",
    )
    .await
    .unwrap();
    drop(store);
    let r = SqliteStore::open(dir.path(), Binding::Tenants);
    assert!(is_backend(&r, "newer than this controller"), "{r:?}");
}

#[tokio::test]
async fn readers_cannot_write() {
    let (_dir, store) = open();
    store
        .agent_hello(hello_in("a1", &["t"], &[], 1))
        .await
        .unwrap();
    let r = store
        .read_raw(|conn| {
            conn.execute("DELETE FROM agents", [])
                .ctx("delete from a reader")
        })
        .await;
    assert!(is_backend(&r, "delete from a reader"), "{r:?}");
    assert!(store.agent("a1").await.unwrap().is_some());
}

// ---------------------------------------------------------------------------
// The writer: batching, failures, shutdown.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_are_all_committed() {
    let (_dir, store) = open();
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let agent = format!("agent{i:02}");
                let mut stored = 0;
                for chunk in [1..=10, 11..=20] {
                    stored += store
                        .put_feedback(1, fbs(&agent, chunk))
                        .await
                        .unwrap()
                        .inserted;
                }
                stored
            })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap(), 20);
    }
    let mut all = Vec::new();
    let mut after_id = 0;
    loop {
        let page = store
            .feedback(FeedbackFilter {
                after_id,
                ..Default::default()
            })
            .await
            .unwrap();
        let Some(last) = page.last() else { break };
        after_id = last.id;
        all.extend(page);
    }
    assert_eq!(all.len(), 1_000);
    for i in 0..50 {
        let agent = format!("agent{i:02}");
        assert_eq!(store.feedback_acked(&agent, "j1").await.unwrap(), 20);
        let seqs: Vec<u64> = all
            .iter()
            .filter(|r| r.agent_id == agent)
            .map(|r| r.seq)
            .collect();
        assert_eq!(seqs, (1..=20).collect::<Vec<_>>(), "one agent's order");
    }
    let stats = store.stats();
    assert_eq!(stats.commands, 100);
    assert!(stats.batches >= 1 && stats.batches <= 100, "{stats:?}");
}

/// Retention's deletes ride the commits of other writes: queued beside
/// ingest they add no commit (no fsync); alone they run after a short
/// wait.
#[tokio::test]
async fn background_deletes_ride_other_commits() {
    let (_dir, store) = open();
    let old: Vec<_> = (1..=10).map(|q| fb("old", "j", q, 5)).collect();
    store.put_feedback(1, old).await.unwrap();
    let before = store.stats();
    let (release, holding) = hold_writer(&store).await;
    let sweep = {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .delete_feedback_before(RefTime::from_nanos(100), 500)
                .await
        })
    };
    let writes: Vec<_> = (0..5)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move { store.put_feedback(1, fbs(&format!("a{i}"), 1..=2)).await })
        })
        .collect();
    until_queued(&store, 6).await;
    release.send(()).unwrap();
    holding.await.unwrap().unwrap();
    assert_eq!(sweep.await.unwrap().unwrap(), 10);
    for w in writes {
        w.await.unwrap().unwrap();
    }
    let after = store.stats();
    assert_eq!(
        after.batches - before.batches,
        2,
        "the hold, then the five writes with the delete among them"
    );
    // Alone, it does not wait for company for ever.
    let t0 = std::time::Instant::now();
    assert_eq!(
        store
            .delete_feedback_before(RefTime::from_nanos(0), 500)
            .await
            .unwrap(),
        0
    );
    assert!(t0.elapsed() >= BACKGROUND_WAIT, "{:?}", t0.elapsed());
}

#[tokio::test]
async fn queued_writes_share_one_transaction() {
    let (_dir, store) = open();
    let before = store.stats();
    let (release, holding) = hold_writer(&store).await;
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move { store.put_feedback(1, fbs(&format!("a{i}"), 1..=4)).await })
        })
        .collect();
    until_queued(&store, 50).await;
    release.send(()).unwrap();
    holding.await.unwrap().unwrap();
    for t in tasks {
        assert_eq!(t.await.unwrap().unwrap().inserted, 4);
    }
    let after = store.stats();
    assert_eq!(after.commands - before.commands, 51);
    assert_eq!(
        after.batches - before.batches,
        2,
        "the hold, then all 50 at once"
    );
    assert_eq!(all_feedback(&store).await.len(), 200);
}

/// Commands refused or failing inside a batch leave no trace (their
/// savepoint is rolled back, even after they wrote) and do not disturb
/// the others.
#[tokio::test]
async fn a_refused_command_does_not_disturb_its_batch() {
    let (_dir, store) = open();
    store
        .put_pack(pack("t", "p", 2, TargetsRow::Nobody))
        .await
        .unwrap();
    let before = store.stats();
    let (release, holding) = hold_writer(&store).await;
    let s = store.clone();
    let good1 = tokio::spawn(async move { s.put_feedback(1, fbs("a1", 1..=3)).await });
    until_queued(&store, 1).await;
    let s = store.clone();
    let older =
        tokio::spawn(async move { s.put_pack(pack("t", "p", 1, TargetsRow::Nobody)).await });
    until_queued(&store, 2).await;
    // Writes its agent, then fails on the held version: all undone.
    let s = store.clone();
    let half = tokio::spawn(async move {
        let mut h = hello_in("a9", &["t"], &[("line", "3")], 5);
        h.held = vec![held("t", "x", u64::MAX)];
        s.agent_hello(h).await
    });
    until_queued(&store, 3).await;
    let s = store.clone();
    let good2 =
        tokio::spawn(async move { s.put_pack(pack("t", "p", 3, TargetsRow::Nobody)).await });
    until_queued(&store, 4).await;
    release.send(()).unwrap();
    holding.await.unwrap().unwrap();
    assert_eq!(good1.await.unwrap().unwrap().inserted, 3);
    let r = older.await.unwrap();
    assert!(
        matches!(r, Err(StoreError::VersionOlder { latest: 2, .. })),
        "{r:?}"
    );
    let r = half.await.unwrap();
    assert!(is_backend(&r, "held version"), "{r:?}");
    assert_eq!(good2.await.unwrap().unwrap(), PutPack::Stored);
    // The hold's batch, then the four together.
    assert_eq!(store.stats().batches - before.batches, 2);
    assert_eq!(store.packs(None).await.unwrap()[0].latest, 3);
    assert_eq!(store.agent("a9").await.unwrap(), None);
    assert_eq!(
        scalar(&store, "SELECT COUNT(*) FROM agent_own_labels").await,
        0
    );
    assert_eq!(
        scalar(&store, "SELECT COUNT(*) FROM agent_tenants").await,
        0
    );
}

#[tokio::test]
async fn a_failed_commit_answers_every_caller_of_its_batch() {
    let (_dir, store) = open();
    let (release, holding) = hold_writer(&store).await;
    let mut tasks = Vec::new();
    for i in 0..3 {
        let s = store.clone();
        tasks.push(tokio::spawn(async move {
            s.put_feedback(1, fbs(&format!("a{i}"), 1..=2))
                .await
                .map(drop)
        }));
        until_queued(&store, i + 1).await;
    }
    let s = store.clone();
    tasks.push(tokio::spawn(async move {
        s.agent_hello(hello_in("a9", &["t"], &[], 1))
            .await
            .map(drop)
    }));
    until_queued(&store, 4).await;
    // A deferred foreign-key violation passes every statement and fails
    // only the COMMIT.
    let s = store.clone();
    tasks.push(tokio::spawn(async move {
        exec(
            &s,
            "PRAGMA defer_foreign_keys = ON; \
             INSERT INTO agent_labels (agent_id, tenant, key, value) \
             VALUES ('nobody', 't', 'k', 'v')",
        )
        .await
    }));
    until_queued(&store, 5).await;
    release.send(()).unwrap();
    holding.await.unwrap().unwrap();
    for t in tasks {
        let r = t.await.unwrap();
        assert!(is_backend(&r, "not committed (COMMIT)"), "{r:?}");
    }
    assert_eq!(all_feedback(&store).await, []);
    assert_eq!(store.agent("a9").await.unwrap(), None);
    // The writer rolled back and goes on.
    assert_eq!(
        store
            .put_feedback(1, fbs("a0", 1..=2))
            .await
            .unwrap()
            .inserted,
        2
    );
    assert_eq!(store.feedback_acked("a0", "j1").await.unwrap(), 2);
}

#[tokio::test]
async fn a_write_error_reaches_the_caller() {
    let (_dir, store) = open();
    store.put_feedback(1, fbs("a1", 1..=2)).await.unwrap();
    // No room to grow the file: the next big insert fails for want of space.
    store
        .write_raw(|conn| {
            let pages: i64 = conn
                .query_row("PRAGMA page_count", [], |r| r.get(0))
                .ctx("t")?;
            conn.pragma_update(None, "max_page_count", pages).ctx("t")?;
            Ok(())
        })
        .await
        .unwrap();
    let mut big = fbs("a1", 3..=2_000);
    for r in &mut big {
        r.detail = "x".repeat(200);
    }
    let r = store.put_feedback(1, big).await;
    assert!(is_backend(&r, "full"), "{r:?}");
    assert_eq!(store.feedback_acked("a1", "j1").await.unwrap(), 2);

    // Room again: the store was not left broken.
    store
        .write_raw(|conn| {
            conn.pragma_update(None, "max_page_count", 1_000_000_i64)
                .ctx("t")
        })
        .await
        .unwrap();
    assert_eq!(
        store
            .put_feedback(1, fbs("a1", 3..=4))
            .await
            .unwrap()
            .inserted,
        2
    );
}

#[tokio::test]
async fn close_refuses_later_writes_and_keeps_reads() {
    let (_dir, store) = open();
    let other = store.clone();
    store.put_feedback(1, fbs("a1", 1..=2)).await.unwrap();
    store.close().await;
    let r = other.put_feedback(1, fbs("a1", 3..=3)).await;
    assert!(matches!(r, Err(StoreError::Closed)), "{r:?}");
    let r = store.agent_hello(hello_in("a1", &["t"], &[], 1)).await;
    assert!(matches!(r, Err(StoreError::Closed)), "{r:?}");
    let r = store
        .reconcile_pack(&key("t", "p"), RefTime::from_nanos(1))
        .await;
    assert!(matches!(r, Err(StoreError::Closed)), "{r:?}");
    assert_eq!(all_feedback(&other).await.len(), 2);
    store.close().await; // twice is harmless
}

#[tokio::test]
async fn writes_queued_before_close_are_committed() {
    let (_dir, store) = open();
    let (release, holding) = hold_writer(&store).await;
    let s = store.clone();
    let before = tokio::spawn(async move { s.put_feedback(1, fbs("a1", 1..=2)).await });
    until_queued(&store, 1).await;
    let s = store.clone();
    let closing = tokio::spawn(async move { s.close().await });
    until_queued(&store, 2).await;
    let s = store.clone();
    let after = tokio::spawn(async move { s.put_feedback(1, fbs("a1", 3..=4)).await });
    until_queued(&store, 3).await;
    release.send(()).unwrap();
    holding.await.unwrap().unwrap();
    closing.await.unwrap();
    assert_eq!(before.await.unwrap().unwrap().inserted, 2);
    assert!(matches!(after.await.unwrap(), Err(StoreError::Closed)));
    assert_eq!(store.feedback_acked("a1", "j1").await.unwrap(), 2);
}

#[tokio::test]
async fn dropping_the_last_handle_stops_the_writer() {
    let (dir, store) = open();
    let clone = store.clone();
    store.put_feedback(1, fbs("a1", 1..=2)).await.unwrap();
    drop(store);
    // Another handle still works.
    clone.put_feedback(1, fbs("a1", 3..=3)).await.unwrap();
    assert!(dir.path().join(format!("{DB_FILE}-wal")).exists());
    drop(clone);
    // Every connection closed (the writer was joined, not left running):
    // the last one to close checkpoints and removes the WAL.
    assert!(!dir.path().join(format!("{DB_FILE}-wal")).exists());
}

// ---------------------------------------------------------------------------
// Restarts and bad rows.

#[tokio::test]
async fn everything_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let k = key("t", "p");
    let errors = vec![ErrorRow {
        line: 1,
        column: 2,
        instruction: String::new(),
        message: "bad".into(),
    }];
    let (agents, rows, packs, history, audit, feedback, max_id) = {
        let store = SqliteStore::open(dir.path(), Binding::Tenants).unwrap();
        let mut h = hello_in("a1", &["t"], &[("line", "3")], 10);
        h.held = vec![
            HeldPackRow {
                stopped: true,
                ..held("t", "q", 1)
            },
            held("t", "loc", 4),
        ];
        store.agent_hello(h).await.unwrap();
        store
            .agent_hello(hello_in("b2", &["t"], &[], 11))
            .await
            .unwrap();
        store
            .grant("a1", "u", true, RefTime::from_nanos(12))
            .await
            .unwrap();
        store
            .label_agent(
                "a1",
                "t",
                [("site".into(), None)].into(),
                Vec::new(),
                RefTime::from_nanos(13),
            )
            .await
            .unwrap();
        store.record_clock("a1", 1, clock(20)).await.unwrap();
        store.record_clock("a1", 1, clock(30)).await.unwrap();
        push(&store, pack("t", "p", 1, to_labels(&[("line", "3")])), 40).await;
        push(&store, pack("t", "q", 1, to_ids(&["a1", "b2"])), 41).await;
        push(&store, pack("u", "r", 1, to_ids(&["a1"])), 42).await;
        store
            .answer(refuse(
                "a1",
                &k,
                Refusal {
                    errors: errors.clone(),
                    ..refusal(1, true, "invalid")
                },
                50,
            ))
            .await
            .unwrap();
        store
            .cancel_pack(&key("u", "r"), RefTime::from_nanos(60))
            .await
            .unwrap();
        store.put_feedback(1, fbs("b2", 1..=3)).await.unwrap();
        store.put_feedback(1, fbs("a1", 1..=3)).await.unwrap();
        store.put_audit(audit_row(70, "t", "p")).await.unwrap();
        let max_id = all_feedback(&store).await.last().unwrap().id;
        // Every row goes: ids must still not start again after a restart.
        store
            .delete_feedback_before(RefTime::from_nanos(i64::MAX), 100)
            .await
            .unwrap();
        let mut rows = store.deliveries_of_agent("a1").await.unwrap();
        rows.extend(store.deliveries_of_agent("b2").await.unwrap());
        (
            store.agents(AgentFilter::default()).await.unwrap(),
            rows,
            store.packs(None).await.unwrap(),
            store
                .clock_history("a1", RefTime::from_nanos(0), 0)
                .await
                .unwrap(),
            store.audit(None, RefTime::from_nanos(0), 0).await.unwrap(),
            all_feedback(&store).await,
            max_id,
        )
    };
    assert_eq!(agents.len(), 2);
    assert_eq!(agents[0].tenants.len(), 2);
    assert!(!agents[0].overrides.is_empty());
    assert_eq!(rows.len(), 5, "{rows:#?}");
    assert!(rows.iter().any(|r| r.errors() == errors));
    assert!(rows.iter().any(|r| r.held
        == Some(Held {
            version: 1,
            stopped: true
        })));
    assert!(rows.iter().any(|r| r.state == DeliveryState::Local));
    assert_eq!(packs.len(), 3);
    assert_eq!(history.len(), 2);
    assert_eq!(feedback, []);

    let store = SqliteStore::open(dir.path(), Binding::Tenants).unwrap();
    assert_eq!(store.agents(AgentFilter::default()).await.unwrap(), agents);
    let mut again = store.deliveries_of_agent("a1").await.unwrap();
    again.extend(store.deliveries_of_agent("b2").await.unwrap());
    assert_eq!(again, rows);
    assert_eq!(store.packs(None).await.unwrap(), packs);
    assert_eq!(
        store.packs(None).await.unwrap()[2]
            .cancelled
            .map(RefTime::as_nanos),
        Some(60)
    );
    assert_eq!(
        store
            .clock_history("a1", RefTime::from_nanos(0), 0)
            .await
            .unwrap(),
        history
    );
    assert_eq!(
        store.audit(None, RefTime::from_nanos(0), 0).await.unwrap(),
        audit
    );
    assert_eq!(
        store.pack_version(&k, None).await.unwrap(),
        Some(pack("t", "p", 1, to_labels(&[("line", "3")])))
    );
    // Acked seqs kept: a re-send is recognised; new rows come after every
    // id handed out before.
    assert_eq!(store.feedback_acked("a1", "j1").await.unwrap(), 3);
    let r = store.put_feedback(1, fbs("b2", 3..=4)).await.unwrap();
    assert_eq!((r.inserted, r.duplicates, r.acked_seq), (1, 1, 4));
    let got = all_feedback(&store).await;
    assert_eq!(got.len(), 1);
    assert!(got[0].id > max_id, "{} after {max_id}", got[0].id);
    // Decisions go on from what was stored: an ack of the refused v1.
    let r = store.answer(ack("a1", &k, 1, 80)).await.unwrap().unwrap();
    assert_eq!((r.state, r.refusal), (DeliveryState::Acked, None));
}

#[tokio::test]
async fn a_row_that_does_not_decode_is_an_error() {
    let (_dir, store) = open();
    store
        .agent_hello(hello_in("a1", &["t"], &[], 1))
        .await
        .unwrap();
    push(&store, pack("t", "p", 1, to_ids(&["a1"])), 2).await;
    store
        .answer(refuse("a1", &key("t", "p"), refusal(1, true, "no"), 3))
        .await
        .unwrap();
    store.put_feedback(1, fbs("a1", 1..=1)).await.unwrap();
    exec(
        &store,
        "UPDATE agents SET labels = 'not json'; \
         UPDATE feedback SET attempt = -1; \
         UPDATE deliveries SET refused_errors = '{'; \
         UPDATE packs SET targets = '{\"kind\":\"everybody\"}'",
    )
    .await
    .unwrap();
    let r = store.agents(AgentFilter::default()).await;
    assert!(is_corrupt(&r, "agent a1: decode stored labels"), "{r:?}");
    let r = store.agent("a1").await;
    assert!(is_corrupt(&r, "agent a1"), "{r:?}");
    let r = store.feedback(FeedbackFilter::default()).await;
    assert!(is_corrupt(&r, "feedback a1/j1#1: attempt"), "{r:?}");
    let r = store.deliveries_of_agent("a1").await;
    assert!(is_corrupt(&r, "delivery of t/p to a1"), "{r:?}");
    let r = store.packs(None).await;
    assert!(is_corrupt(&r, "pack t/p: decode stored targets"), "{r:?}");
    // A decision that reads them fails, changing nothing.
    let r = store
        .reconcile_pack(&key("t", "p"), RefTime::from_nanos(4))
        .await;
    assert!(r.is_err(), "{r:?}");
}

// ---------------------------------------------------------------------------
// Migrating a v4 database.

/// A v4 database as the previous controller left it: agents with their
/// held packs as JSON, operator labels, per-version deliveries (acked,
/// pending, nacked with errors, cancelled), feedback with word outcomes
/// (attempts not run folded into `skipped` with their word leading
/// `detail`) and ids from the writer's memory, the audit log.
const V4_DATA: &str = r#"
INSERT INTO agents (id, labels, agent_version, journal_id, connected, last_seen_ns, held,
    clock_source, clock_state, clock_offset_ns, clock_jitter_ns, clock_uncertainty_ns,
    clock_frequency_ppm, clock_at_ns) VALUES
  ('a1', '{"line":"3","site":"n"}', '0.9.0', 'j1', 1, 900,
   '[{"tenant":"t","pack":"p","version":1,"stopped":false}]',
   'ptp', 'locked', -12, 3, 250, 1.25, 20),
  ('a2', '{"line":"4"}', '0.9.0', 'j9', 0, 800, '[]',
   NULL, NULL, NULL, NULL, NULL, NULL, NULL);
INSERT INTO clock_reports (agent_id, at_ns, source, state, offset_ns, jitter_ns,
    uncertainty_ns, frequency_ppm) VALUES
  ('a1', 10, 'ptp', 'locked', -12, 3, 250, 1.25),
  ('a1', 20, 'ptp', 'locked', -12, 3, 250, 1.25);
INSERT INTO agent_labels (agent_id, tenant, key, value) VALUES
  ('a1', 't', 'zone', 'z'),
  ('a2', 't', 'line', NULL);
INSERT INTO packs (tenant, pack, latest_version, cancelled_ns) VALUES
  ('t', 'p', 2, NULL), ('t', 'q', 1, 500), ('u', 'r', 1, NULL);
INSERT INTO pack_versions (tenant, pack, version, yaml, targets, pushed_ns) VALUES
  ('t', 'p', 1, 'p1', '{"kind":"labels","labels":{"line":"3"}}', 100),
  ('t', 'p', 2, 'p2', '{"kind":"labels","labels":{"line":"3"}}', 190),
  ('t', 'q', 1, 'q1', '{"kind":"agents","ids":["a1","a2"]}', 110),
  ('u', 'r', 1, 'r1', '{"kind":"nobody"}', 120);
INSERT INTO deliveries (agent_id, tenant, pack, version, state, reason, errors, updated_ns,
    attempts) VALUES
  ('a1', 't', 'p', 1, 'acked', '', '[]', 150, 1),
  ('a1', 't', 'p', 2, 'pending', 'sent, waiting for the agent', '[]', 200, 2),
  ('a2', 't', 'p', 1, 'nacked', 'invalid',
   '[{"line":3,"column":7,"instruction":"blink","message":"unknown line"}]', 160, 1),
  ('a1', 't', 'q', 1, 'cancelled', '', '[]', 500, 1),
  ('a2', 'u', 'r', 1, 'acked', '', '[]', 250, 3);
INSERT INTO feedback (id, agent_id, journal_id, seq, execution_id, tenant, pack, version,
    instruction, attempt, scheduled_ns, actual_ns, lateness_ns, outcome, event, action, detail,
    value, dropped_before, uncertainty_ns, received_ns) VALUES
  (7, 'a1', 'j1', 1, 't/p/v1/blink/1000/a1', 't', 'p', 1, 'blink', 1, 1000, 1001, 1, 'ok',
   'executed', 'gpio.write', '', 1, 0, 250, 5000),
  (9, 'a1', 'j1', 2, 't/p/v1/blink/2000/a1', 't', 'p', 1, 'blink', 1, 2000, 2900, 900,
   'skipped', 'executed', 'gpio.write', 'late: reached after its max_lateness', NULL, 0, 250,
   5001),
  (10, 'a2', 'j9', 5, 't/p/v1/blink/2000/a1', 't', 'p', 1, 'blink', 1, 2000, 2000, 0,
   'skipped', 'executed', 'gpio.write', 'withdrawn', NULL, 2, 250, 5002),
  (12, 'a1', 'j1', 3, 't/p/v1/blink/3000/a1', 't', 'p', 1, 'blink', 1, 3000, 3000, 0,
   'skipped', 'executed', 'gpio.write', 'stopped: the agent stopped first', NULL, 0, 250, 5003),
  (13, 'a1', 'j1', 4, '', 't', 'p', 1, 'blink', 0, 4000, 4000, 0, 'skipped', 'skip', '',
   'late start: catch_up none', NULL, 0, 250, 5004),
  (14, 'a1', 'j1', 6, '', 't', 'p', 1, 'blink', 0, 5000, 5500, 0, 'give_up', 'give_up', '',
   'missed: late by 500ms', NULL, 0, 250, 5005),
  (15, 'a2', 'j9', 6, '', 't', 'p', 1, 'safe_state', 0, 6000, 6000, 0, 'safe_state',
   'safe_state', 'gpio.write', 'cancel', NULL, 0, 250, 5006),
  (16, 'a1', 'j1', 7, '', 't', 'p', 1, 'blink', 0, 7000, 7000, 0, 'weird', 'odd', '', '', NULL,
   0, 250, 5007);
INSERT INTO audit (id, at_ns, who, tenant, role, action, target, result) VALUES
  (1, 10, 'ann', 't', 'operator', 'push', 't/p v1', 'ok'),
  (2, 20, 'bob', 'u', 'admin', 'push', 'u/r v1', 'ok'),
  (5, 30, 'ann', 't', 'operator', 'cancel', 't/q', 'PermissionDenied: no'),
  (6, 40, 'ca', 't', 'ca', 'revoke', 'agent a1 (serial 0f)', 'ok'),
  (7, 40, 'ca', 'u', 'ca', 'revoke', 'agent a1 (serial 0f)', 'ok'),
  (8, 50, 'ca', '', 'ca', 'revoke', 'certificate (serial 1a)', 'ok');
"#;

/// A v4 database at `dir`.
fn v4_database(dir: &std::path::Path) {
    let mut conn = rusqlite::Connection::open(dir.join(DB_FILE)).unwrap();
    configure_writer(&conn).unwrap();
    migrate_to(&mut conn, 4).unwrap();
    let versions: Vec<i64> = query_all(
        &conn,
        "SELECT version FROM schema_migrations ORDER BY version",
        &[],
        |r| col(r, "version"),
    )
    .unwrap();
    assert_eq!(versions, [1, 2, 4]);
    conn.execute_batch(V4_DATA).unwrap();
}

#[tokio::test]
async fn a_v4_database_is_migrated() {
    let dir = tempfile::tempdir().unwrap();
    v4_database(dir.path());
    let store = SqliteStore::open(dir.path(), Binding::Open).unwrap();
    assert_eq!(
        scalar(&store, "SELECT MAX(version) FROM schema_migrations").await,
        22
    );
    // The feedback's (txid, id) index is PostgreSQL's (replicas) alone.
    assert_eq!(
        scalar(
            &store,
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND name = 'feedback_by_mark'"
        )
        .await,
        0
    );
    // Revocations audited before v8 are known as revoked (and so not
    // audited again).
    let revoked = store.revocations().await.unwrap();
    let got: Vec<(&str, &str, &str, i64)> = revoked
        .iter()
        .map(|r| {
            (
                r.serial.as_str(),
                r.kind.as_str(),
                r.name.as_str(),
                r.at.as_nanos(),
            )
        })
        .collect();
    assert_eq!(got, [("0f", "agent", "a1", 40), ("1a", "", "", 50)]);

    // Agents: records, operator labels and clocks kept; tenants come with
    // their next hello.
    let a1 = store.agent("a1").await.unwrap().unwrap();
    assert_eq!(a1.labels, labels(&[("line", "3"), ("site", "n")]));
    assert_eq!(
        (a1.agent_version.as_str(), a1.journal_id.as_str()),
        ("0.9.0", "j1")
    );
    assert_eq!((a1.connected, a1.last_seen.as_nanos()), (true, 900));
    assert_eq!(a1.clock, Some(clock(20)));
    assert_eq!(a1.overrides["t"]["zone"], Some("z".into()));
    assert!(a1.tenants.is_empty());
    assert_eq!(a1.trust, None, "its trust unsaid until its next hello");
    let a2 = store.agent("a2").await.unwrap().unwrap();
    assert_eq!(a2.overrides["t"]["line"], None);
    assert_eq!(
        store
            .clock_history("a1", RefTime::from_nanos(0), 0)
            .await
            .unwrap()
            .len(),
        2
    );

    // Deliveries: the newest per (agent, pack), as a desired state.
    #[allow(clippy::too_many_arguments)]
    fn d(
        agent: &str,
        k: &str,
        version: u64,
        intent: Intent,
        held: Option<u64>,
        refusal: Option<Refusal>,
        state: DeliveryState,
        reason: &str,
        attempts: u32,
        updated_ns: i64,
    ) -> DeliveryRow {
        let (tenant, pack) = k.split_once('/').unwrap();
        DeliveryRow {
            agent_id: agent.into(),
            tenant: tenant.into(),
            pack: pack.into(),
            version,
            intent,
            held: held.map(|version| Held {
                version,
                stopped: false,
            }),
            refusal,
            state,
            reason: reason.into(),
            attempts,
            updated: RefTime::from_nanos(updated_ns),
            activate: Default::default(),
            staged: None,
        }
    }
    let unknown_line = vec![ErrorRow {
        line: 3,
        column: 7,
        instruction: "blink".into(),
        message: "unknown line".into(),
    }];
    assert_eq!(
        store.deliveries_of_agent("a1").await.unwrap(),
        [
            d(
                "a1",
                "t/p",
                2,
                Intent::Hold,
                None,
                None,
                DeliveryState::Pending,
                "sent, waiting for the agent",
                2,
                200
            ),
            d(
                "a1",
                "t/q",
                1,
                Intent::Withdraw,
                None,
                None,
                DeliveryState::Cancelled,
                "",
                1,
                500
            ),
        ]
    );
    let a2_rows = store.deliveries_of_agent("a2").await.unwrap();
    assert_eq!(
        a2_rows,
        [
            d(
                "a2",
                "t/p",
                1,
                Intent::Hold,
                None,
                Some(Refusal {
                    errors: unknown_line.clone(),
                    ..refusal(1, true, "invalid")
                }),
                DeliveryState::Nacked,
                "invalid",
                1,
                160
            ),
            d(
                "a2",
                "u/r",
                1,
                Intent::Hold,
                Some(1),
                None,
                DeliveryState::Acked,
                "",
                3,
                250
            ),
        ]
    );
    assert_eq!(a2_rows[0].errors(), unknown_line);

    // Packs: targets and push instant on the pack.
    let packs = store.packs(None).await.unwrap();
    let got: Vec<(String, u64, TargetsRow, i64, Option<i64>, u32)> = packs
        .iter()
        .map(|p| {
            (
                format!("{}/{}", p.tenant, p.pack),
                p.latest,
                p.targets.clone(),
                p.pushed.as_nanos(),
                p.cancelled.map(RefTime::as_nanos),
                p.pending,
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("t/p".into(), 2, to_labels(&[("line", "3")]), 190, None, 1),
            ("t/q".into(), 1, to_ids(&["a1", "a2"]), 110, Some(500), 0),
            ("u/r".into(), 1, TargetsRow::Nobody, 120, None, 0),
        ]
    );
    assert_eq!(
        store
            .pack_version(&key("t", "p"), Some(1))
            .await
            .unwrap()
            .map(|p| p.yaml),
        Some("p1".into())
    );

    // Feedback: ids and order kept, journals' acked seqs, outcomes and the
    // reasons folded into `detail` typed, the words taken off.
    let all = store.feedback(FeedbackFilter::default()).await.unwrap();
    let got: Vec<(u64, &str, u64, wire::Outcome, wire::Reason, &str, &str)> = all
        .iter()
        .map(|r| {
            (
                r.id,
                r.journal_id.as_str(),
                r.seq,
                r.outcome,
                r.reason,
                r.detail.as_str(),
                r.execution_id.as_str(),
            )
        })
        .collect();
    use wire::{Outcome as O, Reason as R};
    assert_eq!(
        got,
        [
            (
                7,
                "j1",
                1,
                O::Ok,
                R::Unspecified,
                "",
                "t/p/v1/blink/1000/a1"
            ),
            (
                9,
                "j1",
                2,
                O::Skipped,
                R::Late,
                "reached after its max_lateness",
                "t/p/v1/blink/2000/a1"
            ),
            (
                10,
                "j9",
                5,
                O::Skipped,
                R::Withdrawn,
                "",
                "t/p/v1/blink/2000/a1"
            ),
            (
                12,
                "j1",
                3,
                O::Skipped,
                R::Shutdown,
                "the agent stopped first",
                "t/p/v1/blink/3000/a1"
            ),
            (
                13,
                "j1",
                4,
                O::Skipped,
                R::Unspecified,
                "late start: catch_up none",
                ""
            ),
            (
                14,
                "j1",
                6,
                O::GiveUp,
                R::Unspecified,
                "missed: late by 500ms",
                ""
            ),
            (15, "j9", 6, O::SafeState, R::Unspecified, "cancel", ""),
            (16, "j1", 7, O::Unspecified, R::Unspecified, "", ""),
        ]
    );
    let late = &all[1];
    assert_eq!(
        (
            late.agent_id.as_str(),
            late.lateness.nanos(),
            late.value,
            late.occurrence.map(RefTime::as_nanos)
        ),
        ("a1", 900, None, None)
    );
    assert_eq!(all[0].value, Some(1));
    assert_eq!(all[2].dropped_before, 2);
    assert_eq!(store.feedback_acked("a1", "j1").await.unwrap(), 7);
    assert_eq!(store.feedback_acked("a2", "j9").await.unwrap(), 6);
    // Agents stored before fencing are at generation 0 until their next
    // hello: no stream of theirs is live.
    assert!(store.put_feedback(1, fbs("a1", 6..=8)).await.is_err());
    let r = store.put_feedback(0, fbs("a1", 6..=8)).await.unwrap();
    assert_eq!((r.inserted, r.duplicates, r.acked_seq), (1, 2, 8));
    let last = store
        .feedback(FeedbackFilter {
            after_id: 16,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(last.len(), 1);
    assert_eq!((last[0].id, last[0].seq), (17, 8));

    // Audit: kept; new ids after the old ones, even once they are all
    // deleted.
    let audit = store.audit(None, RefTime::from_nanos(0), 0).await.unwrap();
    assert_eq!(
        audit.iter().map(|r| r.target.as_str()).collect::<Vec<_>>(),
        [
            "t/p v1",
            "u/r v1",
            "t/q",
            "agent a1 (serial 0f)",
            "agent a1 (serial 0f)",
            "certificate (serial 1a)"
        ]
    );
    assert_eq!(audit[2].result, "PermissionDenied: no");
    store
        .delete_audit_before(RefTime::from_nanos(i64::MAX), 100)
        .await
        .unwrap();
    store.put_audit(audit_row(40, "t", "new")).await.unwrap();
    assert_eq!(scalar(&store, "SELECT MAX(id) FROM audit").await, 9);

    // Decisions go on from the migrated rows: a label push finds the
    // agents stored before v5 by their own labels; the agent's next hello
    // tells what it holds.
    let changed = push(&store, pack("u", "m", 1, to_labels(&[("line", "4")])), 600).await;
    assert_eq!(
        changed
            .iter()
            .map(|r| r.agent_id.as_str())
            .collect::<Vec<_>>(),
        ["a2"]
    );
    let changed = push(&store, pack("t", "n", 1, to_labels(&[("site", "n")])), 610).await;
    assert_eq!(
        changed
            .iter()
            .map(|r| r.agent_id.as_str())
            .collect::<Vec<_>>(),
        ["a1"]
    );
    let mut h = hello_in("a1", &["t"], &[("line", "3"), ("site", "n")], 700);
    h.journal_id = "j1".into();
    h.held = vec![held("t", "p", 2)];
    let (_, rows) = store.agent_hello(h).await.unwrap();
    let p = rows.iter().find(|r| r.pack == "p").unwrap();
    assert_eq!((p.state, p.attempts), (DeliveryState::Acked, 2));
}

/// An event of a kind this build does not know (a newer replica's, during
/// a rolling upgrade) is passed over: the events around it are read and
/// the follower's mark moves past it, so following goes on.
#[tokio::test]
async fn an_event_of_an_unknown_kind_is_passed_over() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path(), Binding::Open).unwrap();
    exec(
        &store,
        "INSERT INTO events (replica, kind, agent_id, tenant, pack, detail, at_ns) VALUES \
         ('r1', 'clock', 'a1', '', '', '', 1), ('r2', 'from-the-future', 'a1', '', '', '', 2), \
         ('r1', 'connected', 'a2', '', '', '', 3)",
    )
    .await
    .unwrap();
    let (rows, mark) = store
        .events_after(baton_store::Mark::default(), 10)
        .await
        .unwrap();
    let got: Vec<(&str, baton_store::EventKind)> =
        rows.iter().map(|e| (e.agent_id.as_str(), e.kind)).collect();
    assert_eq!(
        got,
        [
            ("a1", baton_store::EventKind::Clock),
            ("a2", baton_store::EventKind::Connected)
        ]
    );
    assert_eq!(mark.id, 3, "past every row read");
    let (more, _) = store.events_after(mark, 10).await.unwrap();
    assert!(more.is_empty());
}
