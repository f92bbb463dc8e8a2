//! The contract on deliveries: held sets, answers, paging, pushes to many, counts.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use baton_model::planner::{self, Action};

use crate::*;

use super::fixtures::*;

// ---------------------------------------------------------------------------
// Deliveries.

/// What an agent says it holds: acked at the wanted version, nacked when
/// newer than the store knows (counted `ahead`), stopped recorded, local
/// packs kept apart, the held set replaced as a whole.
pub async fn agent_held_rules(s: &dyn Store, _: Binding) {
    let k = key("t", "p");
    s.agent_hello(hello_in("a1", &["t"], &[], 10))
        .await
        .unwrap();
    push(s, pack("t", "p", 2, to_ids(&["a1"])), 20).await;

    let changed = s
        .agent_held("a1", 1, vec![held("t", "p", 2)], RefTime::from_nanos(30))
        .await
        .unwrap();
    assert_eq!(brief(&changed), [b("a1", "t/p", 2, Hold, Acked)]);
    assert_eq!(
        changed[0].held,
        Some(Held {
            version: 2,
            stopped: false
        })
    );
    assert_eq!(changed[0].updated.as_nanos(), 30);
    assert_eq!(
        s.agent_held("a1", 1, vec![held("t", "p", 2)], RefTime::from_nanos(31))
            .await
            .unwrap(),
        []
    );

    // Newer than the store knows: nacked with the reason, never pushed.
    let changed = s
        .agent_held("a1", 1, vec![held("t", "p", 3)], RefTime::from_nanos(40))
        .await
        .unwrap();
    assert_eq!(brief(&changed), [b("a1", "t/p", 2, Hold, Nacked)]);
    assert!(changed[0].reason.contains("v3"), "{}", changed[0].reason);
    assert_eq!(planner::action(&changed[0]), None);
    let p = &s.packs(None).await.unwrap()[0];
    assert_eq!((p.acked, p.nacked, p.pending, p.ahead), (0, 1, 0, 1));

    // Stopped: recorded; still the version wanted.
    let stopped = HeldPackRow {
        stopped: true,
        ..held("t", "p", 2)
    };
    let changed = s
        .agent_held("a1", 1, vec![stopped.clone()], RefTime::from_nanos(50))
        .await
        .unwrap();
    assert_eq!(brief(&changed), [b("a1", "t/p", 2, Hold, Acked)]);
    assert_eq!(
        changed[0].held,
        Some(Held {
            version: 2,
            stopped: true
        })
    );

    // A pack of its own: local, not a delivery.
    let changed = s
        .agent_held(
            "a1",
            1,
            vec![stopped, held("t", "loc", 1)],
            RefTime::from_nanos(60),
        )
        .await
        .unwrap();
    assert_eq!(
        brief(&changed),
        [b("a1", "t/loc", 1, Local, DeliveryState::Local)]
    );
    assert_eq!(
        s.deliveries_of_pack(&key("t", "loc"), None, None, 0)
            .await
            .unwrap(),
        []
    );
    assert_eq!(s.packs(None).await.unwrap().len(), 1);
    assert_eq!(s.delivery_counts().await.unwrap(), [(Acked, 1)]);

    // Nothing held now: the local row stays (holding nothing: late
    // feedback of it is still the agent's), the pack is pending again.
    let changed = s
        .agent_held("a1", 1, Vec::new(), RefTime::from_nanos(70))
        .await
        .unwrap();
    assert_eq!(
        brief(&changed),
        [
            b("a1", "t/loc", 1, Local, DeliveryState::Local),
            b("a1", "t/p", 2, Hold, Pending)
        ]
    );
    assert!(changed.iter().all(|r| r.held.is_none()));
    assert_eq!(
        brief(&rows_of(s, "a1").await),
        [
            b("a1", "t/loc", 1, Local, DeliveryState::Local),
            b("a1", "t/p", 2, Hold, Pending)
        ]
    );
    assert_eq!(
        planner::action(&row(s, "a1", &k).await),
        Some(Action::Push(2))
    );

    assert!(
        s.agent_held("ghost", 1, Vec::new(), RefTime::from_nanos(80))
            .await
            .is_err()
    );
    assert_eq!(s.agent("ghost").await.unwrap(), None);
}

/// An agent's answers: an ack, a final refusal (nacked, its errors kept),
/// a retryable one (pending, retried), one about an older version, and a
/// refusal that counts for its version only.
pub async fn answers(s: &dyn Store, _: Binding) {
    let k = key("t", "p");
    s.agent_hello(hello_in("a1", &["t"], &[], 10))
        .await
        .unwrap();
    push(s, pack("t", "p", 1, to_ids(&["a1"])), 20).await;

    let r = s
        .answer(AnswerRow {
            attempts: 2,
            ..ack("a1", &k, 1, 30)
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        brief(std::slice::from_ref(&r)),
        [b("a1", "t/p", 1, Hold, Acked)]
    );
    assert_eq!((r.attempts, r.updated.as_nanos()), (2, 30));
    assert_eq!(r.held.map(|h| h.version), Some(1));
    assert_eq!(row(s, "a1", &k).await, r);
    // The same answer again changes nothing.
    assert_eq!(s.answer(ack("a1", &k, 1, 35)).await.unwrap(), Some(r));

    // Refused for good, with its errors.
    push(s, pack("t", "p", 2, to_ids(&["a1"])), 40).await;
    let errors = vec![ErrorRow {
        line: 3,
        column: 7,
        instruction: "blink".into(),
        message: "unknown line".into(),
    }];
    let final_no = Refusal {
        errors: errors.clone(),
        ..refusal(2, true, "invalid pack")
    };
    let r = s
        .answer(refuse("a1", &k, final_no.clone(), 50))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        brief(std::slice::from_ref(&r)),
        [b("a1", "t/p", 2, Hold, Nacked)]
    );
    assert_eq!(r.reason, "invalid pack");
    assert_eq!(r.errors(), errors);
    assert_eq!(r.refusal, Some(final_no));
    assert_eq!(r.held.map(|h| h.version), Some(1), "still holds v1");
    assert_eq!(planner::action(&r), None);
    assert_eq!(row(s, "a1", &k).await, r);
    let p = &s.packs(None).await.unwrap()[0];
    assert_eq!((p.acked, p.nacked, p.pending), (0, 1, 0));

    // The refusal counts for v2 only: v3 is pushed.
    let changed = push(s, pack("t", "p", 3, to_ids(&["a1"])), 60).await;
    assert_eq!(brief(&changed), [b("a1", "t/p", 3, Hold, Pending)]);
    assert_eq!(changed[0].refusal, None);
    assert_eq!(changed[0].errors(), []);
    assert_eq!(planner::action(&changed[0]), Some(Action::Push(3)));

    // Refused for now: pending, retried, the reason says why.
    let r = s
        .answer(refuse("a1", &k, refusal(3, false, "clock not synced"), 70))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        brief(std::slice::from_ref(&r)),
        [b("a1", "t/p", 3, Hold, Pending)]
    );
    assert!(r.reason.contains("clock not synced"), "{}", r.reason);
    assert_eq!(planner::action(&r), Some(Action::Push(3)));

    // About an older version: a refusal changes nothing, an ack says
    // what is held.
    assert_eq!(
        s.answer(refuse("a1", &k, refusal(2, true, "late"), 80))
            .await
            .unwrap(),
        Some(r.clone())
    );
    let r = s.answer(ack("a1", &k, 2, 90)).await.unwrap().unwrap();
    assert_eq!(
        brief(std::slice::from_ref(&r)),
        [b("a1", "t/p", 3, Hold, Pending)]
    );
    assert_eq!(r.held.map(|h| h.version), Some(2));
    assert_eq!(planner::action(&r), Some(Action::Push(3)));
    let r = s.answer(ack("a1", &k, 3, 100)).await.unwrap().unwrap();
    assert_eq!(
        brief(std::slice::from_ref(&r)),
        [b("a1", "t/p", 3, Hold, Acked)]
    );
    assert_eq!(r.refusal, None);
    assert_eq!(r.reason, "");

    // No such row.
    assert_eq!(
        s.answer(ack("a1", &key("t", "none"), 1, 110))
            .await
            .unwrap(),
        None
    );
    assert_eq!(s.answer(ack("ghost", &k, 3, 110)).await.unwrap(), None);
    assert_eq!(rows_of(s, "ghost").await, []);
}

/// Answers of several agents decided in one transaction: in order (a
/// later answer about a pair sees what an earlier one made of it), each
/// with its own outcome (a stale stream's refused alone, an unknown
/// agent's `None`), and stored as one by one would store them.
pub async fn answers_together(s: &dyn Store, _: Binding) {
    let k = key("t", "p");
    for id in ["a1", "a2", "a3"] {
        s.agent_hello(hello_in(id, &["t"], &[], 10)).await.unwrap();
    }
    push(s, pack("t", "p", 1, to_ids(&["a1", "a2", "a3"])), 20).await;
    // a3 said hello again: its first stream's answers are stale.
    let stale = ack("a3", &k, 1, 30);
    let (a3, _) = s
        .agent_hello(hello_in("a3", &["t"], &[], 25))
        .await
        .unwrap();
    assert!(a3.session_gen > stale.session_gen);
    let out = s
        .answers(vec![
            ack("a1", &k, 1, 30),
            refuse("a2", &k, refusal(1, false, "clock not synced"), 31),
            ack("a2", &k, 1, 32),
            stale,
            ack("ghost", &k, 1, 33),
        ])
        .await
        .unwrap();
    assert_eq!(out.len(), 5);
    let a1 = out[0].as_ref().unwrap().clone().unwrap();
    assert_eq!(
        brief(std::slice::from_ref(&a1)),
        [b("a1", "t/p", 1, Hold, Acked)]
    );
    let a2_first = out[1].as_ref().unwrap().clone().unwrap();
    assert_eq!(
        brief(std::slice::from_ref(&a2_first)),
        [b("a2", "t/p", 1, Hold, Pending)]
    );
    let a2 = out[2].as_ref().unwrap().clone().unwrap();
    assert_eq!(
        brief(std::slice::from_ref(&a2)),
        [b("a2", "t/p", 1, Hold, Acked)]
    );
    assert_eq!(a2.updated.as_nanos(), 32);
    assert!(
        matches!(out[3], Err(StoreError::Fenced { .. })),
        "{:?}",
        out[3]
    );
    assert_eq!(out[4].as_ref().unwrap(), &None);
    assert_eq!(row(s, "a1", &k).await, a1);
    assert_eq!(row(s, "a2", &k).await, a2);
    assert_eq!(
        brief(&[row(s, "a3", &k).await]),
        [b("a3", "t/p", 1, Hold, Pending)],
        "the stale answer changed nothing"
    );
    assert!(s.answers(Vec::new()).await.unwrap().is_empty());
}

/// One pack's deliveries, by agent, a page at a time, of one version or
/// any; local rows are not deliveries.
/// A push to more agents than one statement loads or writes (the
/// planner's agents are read and its rows written several per
/// statement): each agent is planned once, on its own labels, its
/// operator labels for the pack's tenant and its tenants.
pub async fn a_push_to_many_agents_plans_each(s: &dyn Store, binding: Binding) {
    let ids: Vec<String> = (0..150).map(|i| format!("m{i:03}")).collect();
    for (i, id) in ids.iter().enumerate() {
        // Every fifth agent serves only another tenant.
        let tenants: &[&str] = if i % 5 == 0 { &["u"] } else { &["t", "u"] };
        s.agent_hello(hello_in(id, tenants, &[("line", "1")], 10))
            .await
            .unwrap();
        if i % 2 == 0 {
            // Even agents are on line 2 for tenant t's operators.
            s.label_agent(
                id,
                "t",
                [("line".into(), Some("2".into()))].into(),
                Vec::new(),
                RefTime::from_nanos(11),
            )
            .await
            .unwrap();
        }
    }
    let want: Vec<&str> = ids
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 2 == 1 && (binding == Binding::Open || i % 5 != 0))
        .map(|(_, id)| id.as_str())
        .collect();
    let changed = push(s, pack("t", "p", 1, to_labels(&[("line", "1")])), 20).await;
    let mut got: Vec<&str> = changed.iter().map(|r| r.agent_id.as_str()).collect();
    got.sort_unstable();
    assert_eq!(got, want, "the agents the push planned");
    assert!(changed.iter().all(|r| r.version == 1 && r.state == Pending));
    let stored = s
        .deliveries_of_pack(&key("t", "p"), None, None, 0)
        .await
        .unwrap();
    assert_eq!(
        stored,
        sorted(changed),
        "the rows stored are the rows planned"
    );
}

/// The rows of named (agent, pack) pairs: those stored, each once, what
/// `deliveries_of_agent` says of them; a pair without a row is left out.
pub async fn deliveries_of_pairs(s: &dyn Store, _: Binding) {
    let ids: Vec<String> = (0..70).map(|i| format!("d{i:02}")).collect();
    for id in &ids {
        s.agent_hello(hello_in(id, &["t"], &[], 1)).await.unwrap();
    }
    let all: Vec<&str> = ids.iter().map(String::as_str).collect();
    push(s, pack("t", "p", 1, to_ids(&all)), 10).await;
    push(s, pack("t", "q", 1, to_ids(&all[..3])), 10).await;
    s.answer(ack("d01", &key("t", "p"), 1, 20)).await.unwrap();

    let mut pairs: Vec<(String, PackKey)> =
        ids.iter().map(|id| (id.clone(), key("t", "p"))).collect();
    pairs.push(("d01".into(), key("t", "q")));
    pairs.push(("d01".into(), key("t", "p"))); // twice
    pairs.push(("d69".into(), key("t", "q"))); // no row
    pairs.push(("nobody".into(), key("t", "p"))); // no agent
    let mut got = s.deliveries_of(&pairs).await.unwrap();
    got.sort_by(|a, b| (&a.agent_id, a.key()).cmp(&(&b.agent_id, b.key())));
    let mut want = Vec::new();
    for id in &ids {
        for r in s.deliveries_of_agent(id).await.unwrap() {
            if r.key() == key("t", "p") || (id == "d01" && r.key() == key("t", "q")) {
                want.push(r);
            }
        }
    }
    assert_eq!(got.len(), 71);
    assert_eq!(got, want);
    assert_eq!(s.deliveries_of(&[]).await.unwrap(), []);
}

pub async fn deliveries_of_pack_paging(s: &dyn Store, _: Binding) {
    let k = key("t", "p");
    let agents = ["a1", "a2", "a3", "a4", "a5"];
    for a in agents {
        s.agent_hello(hello_in(a, &["t"], &[], 1)).await.unwrap();
    }
    push(s, pack("t", "p", 1, to_ids(&agents)), 10).await;
    push(s, pack("t", "q", 1, to_ids(&["a1"])), 10).await;
    for a in ["a1", "a2", "a3"] {
        s.answer(ack(a, &k, 1, 20)).await.unwrap();
    }
    push(s, pack("t", "p", 2, to_ids(&["a3", "a4", "a5"])), 30).await;

    let kr = &k;
    let page = |version: Option<u64>, after: Option<&'static str>, limit: u32| async move {
        s.deliveries_of_pack(kr, version, after, limit)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.agent_id)
            .collect::<Vec<_>>()
    };
    assert_eq!(page(None, None, 0).await, agents);
    assert_eq!(page(Some(1), None, 0).await, ["a1", "a2"]);
    assert_eq!(page(Some(2), None, 0).await, ["a3", "a4", "a5"]);
    assert_eq!(page(Some(9), None, 0).await, Vec::<String>::new());
    assert_eq!(page(None, None, 2).await, ["a1", "a2"]);
    assert_eq!(page(None, Some("a2"), 2).await, ["a3", "a4"]);
    assert_eq!(page(None, Some("a4"), 2).await, ["a5"]);
    assert_eq!(page(None, Some("a5"), 2).await, Vec::<String>::new());
    assert_eq!(page(Some(2), Some("a3"), 1).await, ["a4"]);
    let rows = s.deliveries_of_pack(&k, None, None, 0).await.unwrap();
    assert_eq!(
        brief(&rows),
        [
            b("a1", "t/p", 1, Withdraw, Cancelled),
            b("a2", "t/p", 1, Withdraw, Cancelled),
            b("a3", "t/p", 2, Hold, Pending),
            b("a4", "t/p", 2, Hold, Pending),
            b("a5", "t/p", 2, Hold, Pending),
        ]
    );
    for r in rows {
        assert_eq!(row(s, &r.agent_id, &k).await, r);
    }

    let mut h = hello_in("a6", &["t"], &[], 40);
    h.held = vec![held("t", "loc", 1)];
    s.agent_hello(h).await.unwrap();
    assert_eq!(
        s.deliveries_of_pack(&key("t", "loc"), None, None, 0)
            .await
            .unwrap(),
        []
    );
    assert_eq!(
        s.deliveries_of_pack(&key("t", "none"), None, None, 0)
            .await
            .unwrap(),
        []
    );
    assert_eq!(
        s.deliveries_of_pack(&k, Some(u64::MAX), None, 0)
            .await
            .unwrap(),
        []
    );
}

/// Deliveries by state, local packs left out, in state order.
pub async fn delivery_counts(s: &dyn Store, _: Binding) {
    assert_eq!(s.delivery_counts().await.unwrap(), []);
    let k = key("t", "p");
    for a in ["a1", "a2", "a3", "a4"] {
        s.agent_hello(hello_in(a, &["t"], &[], 1)).await.unwrap();
    }
    push(s, pack("t", "p", 1, to_ids(&["a1", "a2", "a3", "a4"])), 10).await;
    s.answer(ack("a1", &k, 1, 20)).await.unwrap();
    s.answer(refuse("a2", &k, refusal(1, true, "no"), 20))
        .await
        .unwrap();
    push(s, pack("t", "q", 1, to_ids(&["a3"])), 30).await;
    s.cancel_pack(&key("t", "q"), RefTime::from_nanos(40))
        .await
        .unwrap();
    let mut h = hello_in("a5", &["t"], &[], 50);
    h.held = vec![held("t", "loc", 1)];
    s.agent_hello(h).await.unwrap();
    assert_eq!(
        s.delivery_counts().await.unwrap(),
        [(Pending, 2), (Acked, 1), (Nacked, 1), (Cancelled, 1)]
    );
}
