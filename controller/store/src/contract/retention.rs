//! The contract on retention, the audit log and page limits.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use baton_model::RefTime;

use crate::*;

use super::fixtures::*;

// ---------------------------------------------------------------------------
// Retention and audit.

/// Retention deletes at most `max` rows before the cutoff, oldest first,
/// never one at or after it: feedback (by instant stored), clock history
/// (by instant measured; the agents' latest stay) and audit.
pub async fn retention_oldest_first(s: &dyn Store, _: Binding) {
    // Feedback, stored out of instant order.
    for (agent, received) in [("a1", 30), ("b2", 10), ("c3", 20), ("d4", 10)] {
        s.put_feedback(1, vec![fb(agent, "j1", 1, received)])
            .await
            .unwrap();
    }
    s.put_feedback(1, vec![fb("a1", "j1", 2, 40)])
        .await
        .unwrap();
    let left = || async move {
        s.feedback(FeedbackFilter::default())
            .await
            .unwrap()
            .into_iter()
            .map(|r| (r.agent_id, r.received.as_nanos()))
            .collect::<Vec<_>>()
    };
    let fl = |kv: &[(&str, i64)]| -> Vec<(String, i64)> {
        kv.iter().map(|(a, t)| ((*a).to_owned(), *t)).collect()
    };
    assert_eq!(
        s.delete_feedback_before(RefTime::from_nanos(35), 0)
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        s.delete_feedback_before(RefTime::from_nanos(35), 1)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        left().await,
        fl(&[("a1", 30), ("c3", 20), ("d4", 10), ("a1", 40)]),
        "the oldest, the first stored of a tie"
    );
    assert_eq!(
        s.delete_feedback_before(RefTime::from_nanos(35), 2)
            .await
            .unwrap(),
        2
    );
    assert_eq!(left().await, fl(&[("a1", 30), ("a1", 40)]));
    assert_eq!(
        s.delete_feedback_before(RefTime::from_nanos(35), 10)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        s.delete_feedback_before(RefTime::from_nanos(40), 10)
            .await
            .unwrap(),
        0
    );
    assert_eq!(left().await, fl(&[("a1", 40)]));

    // Clock history.
    s.agent_hello(hello("a1", 1)).await.unwrap();
    s.agent_hello(hello("b2", 1)).await.unwrap();
    for (agent, at) in [("a1", 10), ("b2", 5), ("a1", 30), ("b2", 20), ("b2", 10)] {
        s.record_clock(agent, 1, clock(at)).await.unwrap();
    }
    let history = |id: &'static str| async move {
        s.clock_history(id, RefTime::from_nanos(0), 0)
            .await
            .unwrap()
            .into_iter()
            .map(|c| c.at.as_nanos())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        s.delete_clock_before(RefTime::from_nanos(25), 2)
            .await
            .unwrap(),
        2
    );
    assert_eq!(history("a1").await, [30], "b2@5, then a1@10 of the tie");
    assert_eq!(history("b2").await, [10, 20]);
    assert_eq!(
        s.delete_clock_before(RefTime::from_nanos(25), 10)
            .await
            .unwrap(),
        2
    );
    assert_eq!(
        s.delete_clock_before(RefTime::from_nanos(30), 10)
            .await
            .unwrap(),
        0
    );
    assert_eq!(history("b2").await, Vec::<i64>::new());
    assert_eq!(history("a1").await, [30]);
    assert_eq!(s.agent("b2").await.unwrap().unwrap().clock, Some(clock(20)));
    assert_eq!(s.agent("a1").await.unwrap().unwrap().clock, Some(clock(30)));

    // Audit.
    for (at, tenant, target) in [
        (30, "t", "x1"),
        (10, "t", "x2"),
        (40, "u", "x3"),
        (20, "t", "x4"),
        (10, "u", "x5"),
    ] {
        s.put_audit(audit_row(at, tenant, target)).await.unwrap();
    }
    let targets = || async move {
        s.audit(None, RefTime::from_nanos(0), 0)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.target)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        s.delete_audit_before(RefTime::from_nanos(35), 1)
            .await
            .unwrap(),
        1
    );
    assert_eq!(targets().await, ["x5", "x4", "x1", "x3"]);
    assert_eq!(
        s.delete_audit_before(RefTime::from_nanos(35), 10)
            .await
            .unwrap(),
        3
    );
    assert_eq!(
        s.delete_audit_before(RefTime::from_nanos(40), 10)
            .await
            .unwrap(),
        0
    );
    assert_eq!(targets().await, ["x3"]);
}

/// Audit records of a tenant (or all) at or after an instant, oldest
/// first, the newest `limit`.
pub async fn audit_newest_oldest_first(s: &dyn Store, _: Binding) {
    let mut refused = audit_row(3, "a", "p3");
    refused.result = "PermissionDenied: no".into();
    refused.role = "viewer".into();
    for r in [
        audit_row(1, "a", "p1"),
        audit_row(2, "b", "p2"),
        refused.clone(),
        audit_row(4, "a", "p4"),
    ] {
        s.put_audit(r).await.unwrap();
    }
    let at = |rows: Vec<AuditRow>| {
        rows.into_iter()
            .map(|r| r.at.as_nanos())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        at(s.audit(None, RefTime::from_nanos(0), 0).await.unwrap()),
        [1, 2, 3, 4]
    );
    let of_a = s.audit(Some("a"), RefTime::from_nanos(2), 0).await.unwrap();
    assert_eq!(of_a, [refused, audit_row(4, "a", "p4")]);
    assert_eq!(
        at(s.audit(Some("a"), RefTime::from_nanos(0), 2).await.unwrap()),
        [3, 4]
    );
    assert_eq!(
        at(s.audit(None, RefTime::from_nanos(0), 1).await.unwrap()),
        [4]
    );
    assert_eq!(
        s.audit(Some("none"), RefTime::from_nanos(0), 0)
            .await
            .unwrap(),
        []
    );

    // Stored out of instant order: listed by instant, ties in storage
    // order; the newest are the last of that list.
    for (at, target) in [(10, "x1"), (6, "x2"), (10, "x3")] {
        s.put_audit(audit_row(at, "c", target)).await.unwrap();
    }
    let targets = |rows: Vec<AuditRow>| rows.into_iter().map(|r| r.target).collect::<Vec<_>>();
    assert_eq!(
        targets(s.audit(Some("c"), RefTime::from_nanos(0), 0).await.unwrap()),
        ["x2", "x1", "x3"]
    );
    assert_eq!(
        targets(s.audit(Some("c"), RefTime::from_nanos(0), 2).await.unwrap()),
        ["x1", "x3"]
    );
    assert_eq!(
        targets(s.audit(Some("c"), RefTime::from_nanos(0), 1).await.unwrap()),
        ["x3"]
    );
    assert_eq!(
        targets(s.audit(Some("c"), RefTime::from_nanos(7), 0).await.unwrap()),
        ["x1", "x3"]
    );
    assert_eq!(
        targets(s.audit(None, RefTime::from_nanos(4), 3).await.unwrap()),
        ["x2", "x1", "x3"]
    );
}

// ---------------------------------------------------------------------------
// Limits.

/// No page is larger than [`MAX_PAGE`], whatever is asked.
pub async fn pages_capped(s: &dyn Store, _: Binding) {
    let n = MAX_PAGE as usize + 1;
    let names: Vec<String> = (0..n).map(|i| format!("a{i:04}")).collect();
    let hellos = join_all(
        names
            .iter()
            .map(|id| s.agent_hello(hello_in(id, &["t"], &[("fleet", "all")], 1))),
    )
    .await;
    assert!(hellos.iter().all(Result::is_ok));
    let count = |f: AgentFilter| async move { s.agents(f).await.unwrap().len() };
    assert_eq!(count(AgentFilter::default()).await, MAX_PAGE as usize);
    let big = AgentFilter {
        limit: MAX_PAGE * 3,
        ..Default::default()
    };
    assert_eq!(count(big).await, MAX_PAGE as usize);
    let rest = AgentFilter {
        after_id: Some(names[n - 2].clone()),
        ..Default::default()
    };
    assert_eq!(count(rest).await, 1);

    let changed = push(s, pack("t", "p", 1, to_labels(&[("fleet", "all")])), 2).await;
    assert_eq!(changed.len(), n);
    let k = key("t", "p");
    let rows = s.deliveries_of_pack(&k, None, None, 0).await.unwrap();
    assert_eq!(rows.len(), MAX_PAGE as usize);
    let rows = s
        .deliveries_of_pack(&k, None, None, MAX_PAGE * 3)
        .await
        .unwrap();
    assert_eq!(rows.len(), MAX_PAGE as usize);
    let last = &rows[rows.len() - 1].agent_id;
    let rest = s.deliveries_of_pack(&k, None, Some(last), 0).await.unwrap();
    assert_eq!(brief(&rest), [b(&names[n - 1], "t/p", 1, Hold, Pending)]);

    let rows: Vec<FeedbackRow> = (1..=n as u64).map(|q| fb("a0000", "j1", q, 5)).collect();
    assert_eq!(s.put_feedback(1, rows).await.unwrap().inserted, n);
    let page = s
        .feedback(FeedbackFilter {
            limit: MAX_PAGE * 3,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(page.len(), MAX_PAGE as usize);
    assert_eq!(all_feedback(s).await.len(), MAX_PAGE as usize);
}

/// Values a database column cannot hold (past `i64::MAX`) are refused,
/// never wrapped, and the refused command leaves nothing behind.
pub async fn values_past_i64_max_refused(s: &dyn Store, _: Binding) {
    let r = s
        .put_pack(pack("t", "p", TOO_BIG, TargetsRow::Nobody))
        .await;
    assert!(matches!(r, Err(StoreError::OutOfRange { .. })), "{r:?}");
    assert_eq!(s.packs(None).await.unwrap(), []);

    let mut h = hello_in("a1", &["t"], &[], 10);
    h.held = vec![held("t", "x", TOO_BIG)];
    assert!(s.agent_hello(h).await.is_err());
    assert_eq!(s.agent("a1").await.unwrap(), None);

    s.agent_hello(hello_in("a1", &["t"], &[], 20))
        .await
        .unwrap();
    assert!(
        s.agent_held(
            "a1",
            1,
            vec![held("t", "x", TOO_BIG)],
            RefTime::from_nanos(30)
        )
        .await
        .is_err()
    );
    assert_eq!(rows_of(s, "a1").await, []);

    let k = key("t", "p");
    push(s, pack("t", "p", 1, to_ids(&["a1"])), 40).await;
    let before = rows_of(s, "a1").await;
    assert!(s.answer(ack("a1", &k, TOO_BIG, 50)).await.is_err());
    assert_eq!(rows_of(s, "a1").await, before);

    // i64::MAX itself is a version like any other.
    let max = TOO_BIG - 1;
    let changed = push(s, pack("t", "p", max, to_ids(&["a1"])), 60).await;
    assert_eq!(brief(&changed), [b("a1", "t/p", max, Hold, Pending)]);
    let r = s.answer(ack("a1", &k, max, 70)).await.unwrap().unwrap();
    assert_eq!(r.state, Acked);
}
