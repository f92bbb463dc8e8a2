//! [`SqliteStore`] against the [`Store`] contract, on real files.
//!
//! These live beside the implementation (not in `tests/`) so they can
//! drive the writer directly: hold it inside a batch to queue commands
//! deterministically, or run SQL that makes a commit fail.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use tempfile::TempDir;
use tokio::sync::oneshot;

use super::*;

fn open() -> (TempDir, SqliteStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path()).unwrap();
    (dir, store)
}

fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
    kv.iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn clock(at_ns: i64) -> ClockRow {
    ClockRow {
        source: "ptp".into(),
        state: "locked".into(),
        offset_ns: -12,
        jitter_ns: 3,
        uncertainty_ns: 250,
        frequency_ppm: 1.25,
        at_ns,
    }
}

fn agent(id: &str) -> AgentRow {
    AgentRow {
        id: id.into(),
        labels: labels(&[("site", "north"), ("role", "pump")]),
        agent_version: "0.1.0".into(),
        journal_id: "j1".into(),
        connected: true,
        last_seen_ns: 100,
        held: vec![HeldPackRow {
            tenant: "t".into(),
            pack: "p".into(),
            version: 3,
            stopped: false,
        }],
        clock: None,
        overrides: Default::default(),
    }
}

fn pv(tenant: &str, pack: &str, version: u64, yaml: &str) -> PackVersionRow {
    PackVersionRow {
        tenant: tenant.into(),
        pack: pack.into(),
        version,
        yaml: yaml.into(),
        targets: TargetsRow::Labels(labels(&[("site", "north")])),
        pushed_ns: 1_000 + i64::try_from(version).unwrap_or(0),
    }
}

fn delivery(agent_id: &str, pack: &str, version: u64, state: DeliveryState) -> DeliveryRow {
    DeliveryRow {
        agent_id: agent_id.into(),
        tenant: "t".into(),
        pack: pack.into(),
        version,
        state,
        reason: "offline".into(),
        errors: Vec::new(),
        updated_ns: 5,
        attempts: 1,
    }
}

fn fb(agent: &str, seq: u64) -> FeedbackRow {
    FeedbackRow {
        agent_id: agent.into(),
        journal_id: "j1".into(),
        seq,
        execution_id: format!("e{seq}"),
        tenant: "t".into(),
        pack: "p".into(),
        version: 1,
        instruction: "blink".into(),
        attempt: 1,
        scheduled_ns: 10,
        actual_ns: 11,
        lateness_ns: 1,
        outcome: "ok".into(),
        event: "executed".into(),
        action: "gpio.write".into(),
        detail: String::new(),
        value: Some(1),
        dropped_before: 0,
        uncertainty_ns: 100,
        received_ns: 1_000 + i64::try_from(seq).unwrap(),
    }
}

fn fbs(agent: &str, seqs: std::ops::RangeInclusive<u64>) -> Vec<FeedbackRow> {
    seqs.map(|s| fb(agent, s)).collect()
}

async fn all_feedback(store: &SqliteStore) -> Vec<FeedbackRow> {
    store.feedback(FeedbackFilter::default()).await.unwrap()
}

fn keys(rows: &[FeedbackRow]) -> Vec<(String, u64)> {
    rows.iter().map(|r| (r.agent_id.clone(), r.seq)).collect()
}

fn is_backend<T: fmt::Debug>(r: &StoreResult<T>, needle: &str) -> bool {
    matches!(r, Err(StoreError::Backend(m)) if m.contains(needle))
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
    let s = store.clone();
    let task = tokio::spawn(async move {
        s.write(move |_, _| {
            let _ = inside.send(());
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
    let store = SqliteStore::open(&dir.path().join("nested")).unwrap();
    assert!(dir.path().join("nested").join(DB_FILE).exists());
    let (mode, sync, fk) = store
        .write(|conn, _| {
            let mode: String = conn
                .query_row("PRAGMA journal_mode", [], |r| r.get(0))
                .unwrap();
            let sync: i64 = conn
                .query_row("PRAGMA synchronous", [], |r| r.get(0))
                .unwrap();
            let fk: i64 = conn
                .query_row("PRAGMA foreign_keys", [], |r| r.get(0))
                .unwrap();
            Ok((mode, sync, fk))
        })
        .await
        .unwrap();
    assert_eq!((mode.as_str(), sync, fk), ("wal", 2, 1));
    drop(store);

    for _ in 0..2 {
        let store = SqliteStore::open(&dir.path().join("nested")).unwrap();
        let versions = store
            .read(|conn| {
                query_all(
                    conn,
                    "SELECT version FROM schema_migrations ORDER BY version",
                    [],
                    |r| col::<i64>(r, "version"),
                )
            })
            .await
            .unwrap();
        let all: Vec<i64> = crate::store::migrations::MIGRATIONS
            .iter()
            .map(|m| m.version)
            .collect();
        assert_eq!(versions, all);
        assert!(all.len() >= 2, "the audit migration is there");
    }
}

#[tokio::test]
async fn a_newer_schema_is_refused() {
    let (dir, store) = open();
    store
        .write(|conn, _| {
            conn.execute("INSERT INTO schema_migrations (version) VALUES (99)", [])
                .ctx("test")?;
            Ok(())
        })
        .await
        .unwrap();
    drop(store);
    let r = SqliteStore::open(dir.path());
    assert!(is_backend(&r, "newer than this controller"), "{r:?}");
}

#[tokio::test]
async fn readers_cannot_write() {
    let (_dir, store) = open();
    let r = store
        .read(|conn| {
            conn.execute("DELETE FROM agents", [])
                .ctx("delete from a reader")
        })
        .await;
    assert!(is_backend(&r, "delete from a reader"), "{r:?}");
}

// ---------------------------------------------------------------------------
// Agents and clocks.

#[tokio::test]
async fn agents_hello_seen_held_and_disconnected() {
    let (_dir, store) = open();
    assert_eq!(store.agent("a1").await.unwrap(), None);
    store.agent_hello(agent("b2")).await.unwrap();
    let mut a1 = agent("a1");
    a1.connected = false; // a hello is a connection, whatever the row says
    store.agent_hello(a1.clone()).await.unwrap();

    let got = store.agent("a1").await.unwrap().unwrap();
    assert_eq!(
        got,
        AgentRow {
            connected: true,
            ..a1.clone()
        }
    );
    let ids: Vec<String> = store
        .agents()
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.id)
        .collect();
    assert_eq!(ids, ["a1", "b2"]);

    store.agent_seen("a1", false, 200).await.unwrap();
    let got = store.agent("a1").await.unwrap().unwrap();
    assert!(!got.connected);
    assert_eq!(got.last_seen_ns, 200);

    let held = vec![
        HeldPackRow {
            tenant: "t".into(),
            pack: "p".into(),
            version: 4,
            stopped: true,
        },
        HeldPackRow {
            tenant: "t".into(),
            pack: "q".into(),
            version: u64::MAX, // JSON, not BIGINT: any u64 round-trips
            stopped: false,
        },
    ];
    store.agent_held("a1", held.clone()).await.unwrap();
    assert_eq!(store.agent("a1").await.unwrap().unwrap().held, held);

    // A second hello updates labels, version, journal; keeps the clock.
    store.record_clock("a1", clock(50)).await.unwrap();
    let mut again = agent("a1");
    again.labels = labels(&[("site", "south")]);
    again.agent_version = "0.2.0".into();
    again.journal_id = "j2".into();
    again.last_seen_ns = 300;
    store.agent_hello(again.clone()).await.unwrap();
    let got = store.agent("a1").await.unwrap().unwrap();
    assert_eq!(
        got,
        AgentRow {
            clock: Some(clock(50)),
            ..again
        }
    );

    store.all_disconnected(400).await.unwrap();
    for a in store.agents().await.unwrap() {
        assert!(!a.connected, "{} still connected", a.id);
    }
    // Last seen stays the last message received.
    assert_eq!(store.agent("a1").await.unwrap().unwrap().last_seen_ns, 300);
}

#[tokio::test]
async fn updates_to_an_unknown_agent_are_refused() {
    let (_dir, store) = open();
    let r = store.agent_seen("ghost", true, 1).await;
    assert!(is_backend(&r, "no agent ghost"), "{r:?}");
    let r = store.agent_held("ghost", Vec::new()).await;
    assert!(is_backend(&r, "no agent ghost"), "{r:?}");
    let r = store.record_clock("ghost", clock(1)).await;
    assert!(is_backend(&r, "no agent ghost"), "{r:?}");
    assert!(store.agents().await.unwrap().is_empty());
    assert!(store.clock_history("ghost", 0).await.unwrap().is_empty());
}

#[tokio::test]
async fn operator_labels_outlive_hellos_and_forget_removes_the_agent() {
    let (_dir, store) = open();
    let r = store
        .label_agent("ghost", "t", BTreeMap::new(), Vec::new())
        .await;
    assert!(matches!(r, Err(StoreError::NoSuchAgent { .. })), "{r:?}");
    store.agent_hello(agent("a1")).await.unwrap();
    store.agent_hello(agent("b2")).await.unwrap();
    let set: LabelOverrides = [
        ("site".to_string(), Some("south".to_string())),
        ("role".to_string(), None),
        ("line".to_string(), Some("4".to_string())),
    ]
    .into();
    let a = store.label_agent("a1", "t", set, Vec::new()).await.unwrap();
    assert_eq!(
        *a.labels_for("t"),
        labels(&[("site", "south"), ("line", "4")])
    );
    // Another tenant sees the agent's own labels.
    assert_eq!(
        *a.labels_for("u"),
        labels(&[("site", "north"), ("role", "pump")])
    );
    // Kept across a hello; reset goes back to the agent's own.
    store.agent_hello(agent("a1")).await.unwrap();
    let a = store
        .label_agent("a1", "t", BTreeMap::new(), vec!["site".into()])
        .await
        .unwrap();
    assert_eq!(
        *a.labels_for("t"),
        labels(&[("site", "north"), ("line", "4")])
    );
    let listed = store.agents().await.unwrap();
    assert_eq!(listed[0].overrides, a.overrides);
    assert!(listed[1].overrides.is_empty());
    store
        .label_agent(
            "a1",
            "u",
            [("x".to_string(), Some("1".to_string()))].into(),
            Vec::new(),
        )
        .await
        .unwrap();

    // A tenant's forget: its deliveries and labels only.
    store.put_pack(pv("t", "p", 1, "pack: p")).await.unwrap();
    store
        .put_delivery(delivery("a1", "p", 1, DeliveryState::Acked))
        .await
        .unwrap();
    store.record_clock("a1", clock(5)).await.unwrap();
    assert!(store.forget_agent("a1", Some("t")).await.unwrap());
    let a = store.agent("a1").await.unwrap().unwrap();
    assert_eq!(a.overrides.keys().collect::<Vec<_>>(), ["u"]);
    assert!(store.deliveries_of_agent("a1").await.unwrap().is_empty());
    // The whole record.
    assert!(store.forget_agent("a1", None).await.unwrap());
    assert_eq!(store.agent("a1").await.unwrap(), None);
    assert!(store.clock_history("a1", 0).await.unwrap().is_empty());
    assert!(!store.forget_agent("a1", None).await.unwrap());
    // It may say hello again, as new.
    store.agent_hello(agent("a1")).await.unwrap();
    assert!(
        store
            .agent("a1")
            .await
            .unwrap()
            .unwrap()
            .overrides
            .is_empty()
    );
}

#[tokio::test]
async fn clock_reports_keep_latest_and_history() {
    let (_dir, store) = open();
    let mut a = agent("a1");
    a.clock = Some(clock(10)); // a hello's clock is a report too
    store.agent_hello(a).await.unwrap();
    store.record_clock("a1", clock(30)).await.unwrap();
    // Late and re-sent reports join the history once; the latest stays.
    store.record_clock("a1", clock(20)).await.unwrap();
    store.record_clock("a1", clock(30)).await.unwrap();

    let latest = store.agent("a1").await.unwrap().unwrap().clock;
    assert_eq!(latest, Some(clock(30)));
    let at: Vec<i64> = store
        .clock_history("a1", 0)
        .await
        .unwrap()
        .iter()
        .map(|c| c.at_ns)
        .collect();
    assert_eq!(at, [10, 20, 30]);
    let since = store.clock_history("a1", 20).await.unwrap();
    assert_eq!(since, vec![clock(20), clock(30)]);
}

// ---------------------------------------------------------------------------
// Packs.

#[tokio::test]
async fn put_pack_stores_refuses_and_recognises() {
    let (_dir, store) = open();
    assert_eq!(
        store.put_pack(pv("t", "p", 2, "a")).await.unwrap(),
        PutPack::Stored
    );
    assert_eq!(
        store.put_pack(pv("t", "p", 2, "a")).await.unwrap(),
        PutPack::Unchanged
    );
    let r = store.put_pack(pv("t", "p", 2, "b")).await;
    assert!(
        matches!(&r, Err(StoreError::VersionTaken { tenant, pack, version: 2 }) if tenant == "t" && pack == "p"),
        "{r:?}"
    );
    let r = store.put_pack(pv("t", "p", 1, "a")).await;
    assert!(
        matches!(
            &r,
            Err(StoreError::VersionOlder {
                version: 1,
                latest: 2,
                ..
            })
        ),
        "{r:?}"
    );
    assert_eq!(
        store.put_pack(pv("t", "p", 5, "c")).await.unwrap(),
        PutPack::Stored
    );
    // Lower than the newest, even if never stored: refused.
    let r = store.put_pack(pv("t", "p", 3, "x")).await;
    assert!(
        matches!(
            &r,
            Err(StoreError::VersionOlder {
                version: 3,
                latest: 5,
                ..
            })
        ),
        "{r:?}"
    );

    assert_eq!(
        store.pack_version("t", "p", None).await.unwrap(),
        Some(pv("t", "p", 5, "c"))
    );
    assert_eq!(
        store.pack_version("t", "p", Some(2)).await.unwrap(),
        Some(pv("t", "p", 2, "a"))
    );
    assert_eq!(store.pack_version("t", "p", Some(3)).await.unwrap(), None);
    assert_eq!(store.pack_version("t", "nope", None).await.unwrap(), None);
    assert_eq!(
        store.pack_version("t", "p", Some(u64::MAX)).await.unwrap(),
        None
    );
}

#[tokio::test]
async fn targets_round_trip() {
    let (_dir, store) = open();
    let kinds = [
        TargetsRow::Nobody,
        TargetsRow::Agents(vec!["a1".into(), "b2".into()]),
        TargetsRow::Labels(labels(&[("site", "north")])),
    ];
    for (i, targets) in kinds.iter().enumerate() {
        let name = format!("p{i}");
        let mut p = pv("t", &name, 1, "y");
        p.targets = targets.clone();
        store.put_pack(p.clone()).await.unwrap();
        assert_eq!(store.pack_version("t", &name, None).await.unwrap(), Some(p));
    }
}

#[tokio::test]
async fn packs_lists_latest_by_tenant_then_id() {
    let (_dir, store) = open();
    for (t, p, v) in [("u", "a", 1), ("t", "b", 1), ("t", "a", 1), ("t", "a", 2)] {
        store
            .put_pack(pv(t, p, v, &format!("{t}{p}{v}")))
            .await
            .unwrap();
    }
    let all = store.packs(None).await.unwrap();
    let got: Vec<(String, String, u64)> = all
        .iter()
        .map(|r| {
            (
                r.latest.tenant.clone(),
                r.latest.pack.clone(),
                r.latest.version,
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("t".into(), "a".into(), 2),
            ("t".into(), "b".into(), 1),
            ("u".into(), "a".into(), 1)
        ]
    );
    assert_eq!(all[0].latest.yaml, "ta2");
    assert!(all.iter().all(|r| r.cancelled_ns.is_none()));
    let only_u = store.packs(Some("u")).await.unwrap();
    assert_eq!(only_u.len(), 1);
    assert_eq!(only_u[0].latest, pv("u", "a", 1, "ua1"));
    assert!(store.packs(Some("none")).await.unwrap().is_empty());
}

#[tokio::test]
async fn cancel_withdraws_the_pack_and_its_live_deliveries() {
    let (_dir, store) = open();
    let r = store.cancel_pack("t", "p", 1).await;
    assert!(
        matches!(&r, Err(StoreError::NoSuchPack { tenant, pack }) if tenant == "t" && pack == "p"),
        "{r:?}"
    );

    store.put_pack(pv("t", "p", 1, "a")).await.unwrap();
    store.put_pack(pv("t", "p", 2, "b")).await.unwrap();
    store.put_pack(pv("t", "other", 1, "o")).await.unwrap();
    store
        .put_delivery(delivery("a1", "p", 1, DeliveryState::Acked))
        .await
        .unwrap();
    store
        .put_delivery(delivery("a1", "p", 2, DeliveryState::Pending))
        .await
        .unwrap();
    store
        .put_delivery(delivery("b2", "p", 2, DeliveryState::Nacked))
        .await
        .unwrap();
    store
        .put_delivery(delivery("a1", "other", 1, DeliveryState::Pending))
        .await
        .unwrap();

    let now = store.cancel_pack("t", "p", 77).await.unwrap();
    assert_eq!(now.cancelled_ns, Some(77));
    assert_eq!(now.latest, pv("t", "p", 2, "b"));

    let states: Vec<(String, String, u64, DeliveryState, i64)> = store
        .deliveries_of_agent("a1")
        .await
        .unwrap()
        .into_iter()
        .map(|d| (d.agent_id, d.pack, d.version, d.state, d.updated_ns))
        .collect();
    assert_eq!(
        states,
        [
            ("a1".into(), "other".into(), 1, DeliveryState::Pending, 5),
            ("a1".into(), "p".into(), 1, DeliveryState::Cancelled, 77),
            ("a1".into(), "p".into(), 2, DeliveryState::Cancelled, 77),
        ]
    );
    let nacked = store.deliveries_of_pack("t", "p", 2).await.unwrap();
    assert_eq!(nacked[1].agent_id, "b2");
    assert_eq!(nacked[1].state, DeliveryState::Nacked);

    // Cancelling again keeps the first instant.
    let again = store.cancel_pack("t", "p", 99).await.unwrap();
    assert_eq!(again.cancelled_ns, Some(77));
    // The same version again changes nothing; a new version revives it.
    assert_eq!(
        store.put_pack(pv("t", "p", 2, "b")).await.unwrap(),
        PutPack::Unchanged
    );
    assert_eq!(
        store.packs(Some("t")).await.unwrap()[1].cancelled_ns,
        Some(77)
    );
    assert_eq!(
        store.put_pack(pv("t", "p", 3, "c")).await.unwrap(),
        PutPack::Stored
    );
    let live = store.packs(Some("t")).await.unwrap();
    assert_eq!(live[1].cancelled_ns, None);
    assert_eq!(live[1].latest.version, 3);
}

// ---------------------------------------------------------------------------
// Deliveries.

#[tokio::test]
async fn deliveries_are_created_replaced_and_listed() {
    let (_dir, store) = open();
    store.put_pack(pv("t", "p", 1, "a")).await.unwrap();
    store.put_pack(pv("t", "q", 1, "a")).await.unwrap();
    store
        .put_delivery(delivery("c3", "p", 1, DeliveryState::Pending))
        .await
        .unwrap();
    store
        .put_delivery(delivery("a1", "q", 1, DeliveryState::Pending))
        .await
        .unwrap();
    store
        .put_delivery(delivery("a1", "p", 1, DeliveryState::Pending))
        .await
        .unwrap();
    let mut nack = delivery("a1", "p", 1, DeliveryState::Nacked);
    nack.reason = "invalid".into();
    nack.attempts = u32::MAX;
    nack.updated_ns = 9;
    nack.errors = vec![ErrorRow {
        line: 3,
        column: 7,
        instruction: "blink".into(),
        message: "unknown pin".into(),
    }];
    store.put_delivery(nack.clone()).await.unwrap();

    let of_pack = store.deliveries_of_pack("t", "p", 1).await.unwrap();
    assert_eq!(of_pack.len(), 2);
    assert_eq!(of_pack[0], nack);
    assert_eq!(of_pack[1].agent_id, "c3");
    let of_agent: Vec<String> = store
        .deliveries_of_agent("a1")
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.pack)
        .collect();
    assert_eq!(of_agent, ["p", "q"]);
    assert!(
        store
            .deliveries_of_pack("t", "p", 2)
            .await
            .unwrap()
            .is_empty()
    );

    // A delivery of a version that is not stored is refused.
    let r = store
        .put_delivery(delivery("a1", "p", 9, DeliveryState::Pending))
        .await;
    assert!(is_backend(&r, "FOREIGN KEY"), "{r:?}");
}

// ---------------------------------------------------------------------------
// Feedback.

#[tokio::test]
async fn feedback_is_stored_once() {
    let (_dir, store) = open();
    let first = store.put_feedback(fbs("a1", 1..=5)).await.unwrap();
    assert_eq!(
        first,
        FeedbackStored {
            inserted: 5,
            duplicates: 0
        }
    );
    // The same batch again: a re-send after a lost ack.
    let again = store.put_feedback(fbs("a1", 1..=5)).await.unwrap();
    assert_eq!(
        again,
        FeedbackStored {
            inserted: 0,
            duplicates: 5
        }
    );
    // Overlapping, with a duplicate inside the batch itself.
    let mut overlap = fbs("a1", 4..=8);
    overlap.push(fb("a1", 8));
    let r = store.put_feedback(overlap).await.unwrap();
    assert_eq!(
        r,
        FeedbackStored {
            inserted: 3,
            duplicates: 3
        }
    );
    // The stored copy is the first one.
    let mut changed = fb("a1", 1);
    changed.detail = "changed".into();
    store.put_feedback(vec![changed]).await.unwrap();

    let rows = all_feedback(&store).await;
    assert_eq!(rows.len(), 8);
    assert_eq!(rows[0], fb("a1", 1));
    assert_eq!(
        store.put_feedback(Vec::new()).await.unwrap(),
        FeedbackStored::default()
    );
}

#[tokio::test]
async fn feedback_acked_is_the_highest_seq_per_journal() {
    let (_dir, store) = open();
    assert_eq!(store.feedback_acked("a1", "j1").await.unwrap(), 0);
    store
        .put_feedback(vec![fb("a1", 7), fb("a1", 3)])
        .await
        .unwrap();
    let mut other_journal = fb("a1", 100);
    other_journal.journal_id = "j2".into();
    store
        .put_feedback(vec![other_journal, fb("b2", 50)])
        .await
        .unwrap();
    assert_eq!(store.feedback_acked("a1", "j1").await.unwrap(), 7);
    assert_eq!(store.feedback_acked("a1", "j2").await.unwrap(), 100);
    assert_eq!(store.feedback_acked("b2", "j1").await.unwrap(), 50);
    assert_eq!(store.feedback_acked("b2", "j2").await.unwrap(), 0);
}

#[tokio::test]
async fn feedback_filters_and_storage_order() {
    let (_dir, store) = open();
    // Stored out of seq order and interleaved across agents: the reading
    // order is the storing order, not (agent, seq).
    let mut b_other_pack = fb("b2", 1);
    b_other_pack.pack = "q".into();
    b_other_pack.received_ns = 5_000;
    let mut c_other_tenant = fb("c3", 1);
    c_other_tenant.tenant = "u".into();
    store
        .put_feedback(vec![fb("a1", 9), b_other_pack])
        .await
        .unwrap();
    store
        .put_feedback(vec![fb("a1", 2), c_other_tenant])
        .await
        .unwrap();
    store.put_feedback(vec![fb("b2", 7)]).await.unwrap();

    let order = |rows: Vec<FeedbackRow>| keys(&rows);
    let k = |a: &str, s: u64| (a.to_owned(), s);
    assert_eq!(
        order(all_feedback(&store).await),
        [k("a1", 9), k("b2", 1), k("a1", 2), k("c3", 1), k("b2", 7)]
    );
    let filter = |f: FeedbackFilter| {
        let store = store.clone();
        async move { order(store.feedback(f).await.unwrap()) }
    };
    assert_eq!(
        filter(FeedbackFilter {
            tenant: Some("t".into()),
            ..Default::default()
        })
        .await,
        [k("a1", 9), k("b2", 1), k("a1", 2), k("b2", 7)]
    );
    assert_eq!(
        filter(FeedbackFilter {
            tenant: Some("t".into()),
            pack: Some("p".into()),
            ..Default::default()
        })
        .await,
        [k("a1", 9), k("a1", 2), k("b2", 7)]
    );
    assert_eq!(
        filter(FeedbackFilter {
            pack: Some("q".into()),
            ..Default::default()
        })
        .await,
        [k("b2", 1)]
    );
    assert_eq!(
        filter(FeedbackFilter {
            agent_id: Some("b2".into()),
            ..Default::default()
        })
        .await,
        [k("b2", 1), k("b2", 7)]
    );
    // received_ns: a1#9 1009, b2#1 5000, a1#2 1002, c3#1 1001, b2#7 1007.
    assert_eq!(
        filter(FeedbackFilter {
            since_ns: Some(1_007),
            ..Default::default()
        })
        .await,
        [k("a1", 9), k("b2", 1), k("b2", 7)]
    );
    assert_eq!(
        filter(FeedbackFilter {
            limit: Some(2),
            ..Default::default()
        })
        .await,
        [k("a1", 9), k("b2", 1)]
    );
    assert_eq!(
        filter(FeedbackFilter {
            tenant: Some("t".into()),
            pack: Some("p".into()),
            agent_id: Some("a1".into()),
            since_ns: Some(1_005),
            limit: Some(1),
        })
        .await,
        [k("a1", 9)]
    );
    assert!(
        filter(FeedbackFilter {
            limit: Some(0),
            ..Default::default()
        })
        .await
        .is_empty()
    );
}

#[tokio::test]
async fn values_past_i64_max_are_refused_not_wrapped() {
    let (_dir, store) = open();
    let too_big = u64::try_from(i64::MAX).unwrap() + 1;

    let mut seq = fb("a1", 1);
    seq.seq = too_big;
    let r = store.put_feedback(vec![fb("a1", 2), seq]).await;
    assert!(is_backend(&r, "feedback seq 9223372036854775808"), "{r:?}");
    let mut version = fb("a1", 3);
    version.version = too_big;
    let r = store.put_feedback(vec![version]).await;
    assert!(is_backend(&r, "feedback pack version"), "{r:?}");
    let mut dropped = fb("a1", 4);
    dropped.dropped_before = u64::MAX;
    let r = store.put_feedback(vec![dropped]).await;
    assert!(is_backend(&r, "dropped_before"), "{r:?}");
    // All or nothing: the good row of the first batch was not kept.
    assert!(all_feedback(&store).await.is_empty());

    let r = store.put_pack(pv("t", "p", too_big, "a")).await;
    assert!(is_backend(&r, "pack version"), "{r:?}");
    assert!(store.packs(None).await.unwrap().is_empty());
    store.put_pack(pv("t", "p", 1, "a")).await.unwrap();
    let r = store
        .put_delivery(delivery("a1", "p", too_big, DeliveryState::Pending))
        .await;
    assert!(is_backend(&r, "delivery version"), "{r:?}");

    // i64::MAX itself is fine.
    let mut max = fb("a1", 1);
    max.seq = too_big - 1;
    max.dropped_before = too_big - 1;
    store.put_feedback(vec![max.clone()]).await.unwrap();
    assert_eq!(all_feedback(&store).await, vec![max]);
    assert_eq!(store.feedback_acked("a1", "j1").await.unwrap(), too_big - 1);
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
                        .put_feedback(fbs(&agent, chunk))
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
    assert_eq!(all_feedback(&store).await.len(), 1_000);
    for i in 0..50 {
        let agent = format!("agent{i:02}");
        assert_eq!(store.feedback_acked(&agent, "j1").await.unwrap(), 20);
        let mine = store
            .feedback(FeedbackFilter {
                agent_id: Some(agent),
                ..Default::default()
            })
            .await
            .unwrap();
        let seqs: Vec<u64> = mine.iter().map(|r| r.seq).collect();
        assert_eq!(seqs, (1..=20).collect::<Vec<_>>(), "one agent's order");
    }
    let stats = store.stats();
    assert_eq!(stats.commands, 100);
    assert!(stats.batches >= 1 && stats.batches <= 100, "{stats:?}");
}

#[tokio::test]
async fn queued_writes_share_one_transaction() {
    let (_dir, store) = open();
    let before = store.stats();
    let (release, held) = hold_writer(&store).await;
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move { store.put_feedback(fbs(&format!("a{i}"), 1..=4)).await })
        })
        .collect();
    until_queued(&store, 50).await;
    release.send(()).unwrap();
    held.await.unwrap().unwrap();
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

#[tokio::test]
async fn a_refused_command_does_not_disturb_its_batch() {
    let (_dir, store) = open();
    store.put_pack(pv("t", "p", 2, "a")).await.unwrap();
    let before = store.stats();
    let (release, held) = hold_writer(&store).await;
    let s = store.clone();
    let good1 = tokio::spawn(async move { s.put_feedback(fbs("a1", 1..=3)).await });
    until_queued(&store, 1).await;
    let s = store.clone();
    let refused = tokio::spawn(async move { s.put_pack(pv("t", "p", 1, "old")).await });
    until_queued(&store, 2).await;
    let s = store.clone();
    let good2 = tokio::spawn(async move { s.put_pack(pv("t", "p", 3, "new")).await });
    until_queued(&store, 3).await;
    release.send(()).unwrap();
    held.await.unwrap().unwrap();
    assert_eq!(good1.await.unwrap().unwrap().inserted, 3);
    assert!(matches!(
        refused.await.unwrap(),
        Err(StoreError::VersionOlder { latest: 2, .. })
    ));
    assert_eq!(good2.await.unwrap().unwrap(), PutPack::Stored);
    // The hold's batch, then the three together.
    assert_eq!(store.stats().batches - before.batches, 2);
    assert_eq!(store.packs(None).await.unwrap()[0].latest.yaml, "new");
}

#[tokio::test]
async fn a_failed_commit_answers_every_caller_of_its_batch() {
    let (_dir, store) = open();
    let (release, held) = hold_writer(&store).await;
    let mut tasks = Vec::new();
    for i in 0..3 {
        let s = store.clone();
        tasks.push(tokio::spawn(async move {
            s.put_feedback(fbs(&format!("a{i}"), 1..=2)).await.map(drop)
        }));
    }
    // A deferred foreign-key violation passes every statement and fails
    // only the COMMIT.
    let s = store.clone();
    tasks.push(tokio::spawn(async move {
        s.write(|conn, _| {
            conn.execute_batch(
                "PRAGMA defer_foreign_keys = ON; \
                 INSERT INTO deliveries (agent_id, tenant, pack, version, state, reason, \
                 errors, updated_ns, attempts) \
                 VALUES ('a', 't', 'missing', 1, 'pending', '', '[]', 0, 0)",
            )
            .ctx("poison")
        })
        .await
    }));
    until_queued(&store, 4).await;
    release.send(()).unwrap();
    held.await.unwrap().unwrap();
    for t in tasks {
        let r = t.await.unwrap();
        assert!(is_backend(&r, "not committed (COMMIT)"), "{r:?}");
    }
    assert!(all_feedback(&store).await.is_empty());
    // The writer rolled back and goes on.
    assert_eq!(
        store.put_feedback(fbs("a0", 1..=2)).await.unwrap().inserted,
        2
    );
    assert_eq!(all_feedback(&store).await.len(), 2);
}

#[tokio::test]
async fn a_write_error_reaches_the_caller() {
    let (_dir, store) = open();
    store.put_feedback(fbs("a1", 1..=2)).await.unwrap();
    // No room to grow the file: the next big insert fails for want of space.
    store
        .write(|conn, _| {
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
    let r = store.put_feedback(big).await;
    assert!(is_backend(&r, "full"), "{r:?}");
    assert_eq!(store.feedback_acked("a1", "j1").await.unwrap(), 2);

    // Room again: the store was not left broken.
    store
        .write(|conn, _| {
            conn.pragma_update(None, "max_page_count", 1_000_000_i64)
                .ctx("t")
        })
        .await
        .unwrap();
    assert_eq!(
        store.put_feedback(fbs("a1", 3..=4)).await.unwrap().inserted,
        2
    );
}

#[tokio::test]
async fn close_refuses_later_writes_and_keeps_reads() {
    let (_dir, store) = open();
    let other = store.clone();
    store.put_feedback(fbs("a1", 1..=2)).await.unwrap();
    store.close().await;
    let r = other.put_feedback(fbs("a1", 3..=3)).await;
    assert!(matches!(r, Err(StoreError::Closed)), "{r:?}");
    let r = store.agent_hello(agent("a1")).await;
    assert!(matches!(r, Err(StoreError::Closed)), "{r:?}");
    assert_eq!(all_feedback(&other).await.len(), 2);
    store.close().await; // twice is harmless
}

#[tokio::test]
async fn writes_queued_before_close_are_committed() {
    let (_dir, store) = open();
    let (release, held) = hold_writer(&store).await;
    let s = store.clone();
    let before = tokio::spawn(async move { s.put_feedback(fbs("a1", 1..=2)).await });
    until_queued(&store, 1).await;
    let s = store.clone();
    let closing = tokio::spawn(async move { s.close().await });
    until_queued(&store, 2).await;
    let s = store.clone();
    let after = tokio::spawn(async move { s.put_feedback(fbs("a1", 3..=4)).await });
    until_queued(&store, 3).await;
    release.send(()).unwrap();
    held.await.unwrap().unwrap();
    closing.await.unwrap();
    assert_eq!(before.await.unwrap().unwrap().inserted, 2);
    assert!(matches!(after.await.unwrap(), Err(StoreError::Closed)));
    assert_eq!(store.feedback_acked("a1", "j1").await.unwrap(), 2);
}

#[tokio::test]
async fn dropping_the_last_handle_stops_the_writer() {
    let (dir, store) = open();
    let clone = store.clone();
    store.put_feedback(fbs("a1", 1..=2)).await.unwrap();
    drop(store);
    // Another handle still works.
    clone.put_feedback(fbs("a1", 3..=3)).await.unwrap();
    assert!(dir.path().join(format!("{DB_FILE}-wal")).exists());
    drop(clone);
    // Every connection closed (the writer was joined, not left running):
    // the last one to close checkpoints and removes the WAL.
    assert!(!dir.path().join(format!("{DB_FILE}-wal")).exists());
}

#[tokio::test]
async fn everything_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut a1 = agent("a1");
    a1.clock = Some(clock(10));
    let mut nack = delivery("a1", "p", 1, DeliveryState::Nacked);
    nack.errors = vec![ErrorRow {
        line: 1,
        column: 2,
        instruction: String::new(),
        message: "bad".into(),
    }];
    {
        let store = SqliteStore::open(dir.path()).unwrap();
        store.agent_hello(a1.clone()).await.unwrap();
        store.record_clock("a1", clock(20)).await.unwrap();
        store.put_pack(pv("t", "p", 1, "a")).await.unwrap();
        store.put_pack(pv("t", "q", 1, "a")).await.unwrap();
        store.cancel_pack("t", "q", 42).await.unwrap();
        store.put_delivery(nack.clone()).await.unwrap();
        store.put_feedback(fbs("b2", 1..=3)).await.unwrap();
        store.put_feedback(fbs("a1", 1..=3)).await.unwrap();
    }
    let store = SqliteStore::open(dir.path()).unwrap();
    assert_eq!(
        store.agent("a1").await.unwrap(),
        Some(AgentRow {
            clock: Some(clock(20)),
            ..a1
        })
    );
    assert_eq!(store.clock_history("a1", 0).await.unwrap().len(), 2);
    let packs = store.packs(None).await.unwrap();
    assert_eq!(packs.len(), 2);
    assert_eq!(packs[1].cancelled_ns, Some(42));
    assert_eq!(store.deliveries_of_agent("a1").await.unwrap(), vec![nack]);
    assert_eq!(store.feedback_acked("a1", "j1").await.unwrap(), 3);
    // Re-sent after the restart: recognised; new rows are stored after
    // the old ones.
    let r = store.put_feedback(fbs("b2", 3..=4)).await.unwrap();
    assert_eq!(
        r,
        FeedbackStored {
            inserted: 1,
            duplicates: 1
        }
    );
    let k = |a: &str, s: u64| (a.to_owned(), s);
    assert_eq!(
        keys(&all_feedback(&store).await),
        [
            k("b2", 1),
            k("b2", 2),
            k("b2", 3),
            k("a1", 1),
            k("a1", 2),
            k("a1", 3),
            k("b2", 4)
        ]
    );
}

#[tokio::test]
async fn a_row_that_does_not_decode_is_an_error() {
    let (_dir, store) = open();
    store.agent_hello(agent("a1")).await.unwrap();
    store.put_feedback(fbs("a1", 1..=1)).await.unwrap();
    store
        .write(|conn, _| {
            conn.execute_batch(
                "UPDATE agents SET labels = 'not json'; UPDATE feedback SET attempt = -1",
            )
            .ctx("t")
        })
        .await
        .unwrap();
    let r = store.agents().await;
    assert!(is_backend(&r, "agent a1: decode stored labels"), "{r:?}");
    let r = store.agent("a1").await;
    assert!(is_backend(&r, "agent a1"), "{r:?}");
    let r = store.feedback(FeedbackFilter::default()).await;
    assert!(is_backend(&r, "feedback a1/j1#1: stored attempt"), "{r:?}");
}

#[tokio::test]
async fn audit_records_are_kept_filtered_by_tenant_and_limited_to_the_newest() {
    let (dir, store) = open();
    let row = |at: i64, tenant: &str, result: &str| AuditRow {
        at_ns: at,
        who: "ann".into(),
        tenant: tenant.into(),
        role: "operator".into(),
        action: "push".into(),
        target: format!("{tenant}/p v1"),
        result: result.into(),
    };
    for (at, t, r) in [
        (1, "a", "ok"),
        (2, "b", "ok"),
        (3, "a", "PermissionDenied: no"),
        (4, "a", "ok"),
    ] {
        store.put_audit(row(at, t, r)).await.unwrap();
    }
    let all = store.audit(None, 0, None).await.unwrap();
    assert_eq!(
        all.iter().map(|r| r.at_ns).collect::<Vec<_>>(),
        [1, 2, 3, 4]
    );
    let a = store.audit(Some("a"), 2, None).await.unwrap();
    assert_eq!(a.iter().map(|r| r.at_ns).collect::<Vec<_>>(), [3, 4]);
    assert_eq!(a[0].result, "PermissionDenied: no");
    let newest = store.audit(Some("a"), 0, Some(2)).await.unwrap();
    assert_eq!(newest.iter().map(|r| r.at_ns).collect::<Vec<_>>(), [3, 4]);
    // Durable across a reopen.
    drop(store);
    let store = SqliteStore::open(dir.path()).unwrap();
    assert_eq!(store.audit(None, 0, None).await.unwrap().len(), 4);
}
