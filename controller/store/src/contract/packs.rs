//! The contract on packs: versions, cancels, reconciles.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::collections::BTreeMap;

use baton_model::RefTime;
use baton_model::planner::{self, Action};

use crate::*;

use super::fixtures::*;

// ---------------------------------------------------------------------------
// Packs.

/// Versions: stored, unchanged, taken, older; read back; listed; a push
/// does not plan by itself.
pub async fn put_pack_versions(s: &dyn Store, _: Binding) {
    let k = key("t", "p");
    let v2 = PackVersionRow {
        yaml: "a".into(),
        ..pack("t", "p", 2, to_labels(&[("line", "3")]))
    };
    assert_eq!(s.put_pack(v2.clone()).await.unwrap(), PutPack::Stored);
    assert_eq!(s.put_pack(v2.clone()).await.unwrap(), PutPack::Unchanged);
    let r = s
        .put_pack(PackVersionRow {
            yaml: "b".into(),
            ..v2.clone()
        })
        .await;
    assert!(
        matches!(&r, Err(StoreError::VersionTaken { tenant, pack, version: 2 }) if tenant == "t" && pack == "p"),
        "{r:?}"
    );
    let r = s.put_pack(pack("t", "p", 1, TargetsRow::Nobody)).await;
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
    let v5 = pack("t", "p", 5, to_ids(&["b1", "b2"]));
    assert_eq!(s.put_pack(v5.clone()).await.unwrap(), PutPack::Stored);
    // Lower than the newest, though never stored: refused.
    let r = s.put_pack(pack("t", "p", 3, TargetsRow::Nobody)).await;
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

    assert_eq!(s.pack_version(&k, None).await.unwrap(), Some(v5.clone()));
    assert_eq!(s.pack_version(&k, Some(2)).await.unwrap(), Some(v2.clone()));
    assert_eq!(s.pack_version(&k, Some(3)).await.unwrap(), None);
    assert_eq!(s.pack_version(&k, Some(u64::MAX)).await.unwrap(), None);
    assert_eq!(s.pack_version(&key("t", "nope"), None).await.unwrap(), None);
    assert_eq!(s.pack_version(&key("u", "p"), Some(5)).await.unwrap(), None);
    // The list: newest first, bounded, without the texts, one pack only.
    let listed = s.pack_versions(&k, 10).await.unwrap();
    let summary = |p: &PackVersionRow| (p.version, p.pushed.as_nanos(), p.yaml.clone());
    assert_eq!(
        listed.iter().map(summary).collect::<Vec<_>>(),
        [
            (5, v5.pushed.as_nanos(), String::new()),
            (2, v2.pushed.as_nanos(), String::new())
        ]
    );
    assert_eq!(listed[0].targets, v5.targets);
    assert_eq!(s.pack_versions(&k, 1).await.unwrap().len(), 1);
    assert!(
        s.pack_versions(&key("u", "p"), 10)
            .await
            .unwrap()
            .is_empty()
    );

    // Every kind of targets round-trips.
    for (i, targets) in [
        TargetsRow::Nobody,
        to_ids(&["b1", "b2"]),
        to_labels(&[("line", "3"), ("site", "n")]),
        TargetsRow::Labels(BTreeMap::new()),
    ]
    .into_iter()
    .enumerate()
    {
        let p = pack("u", &format!("k{i}"), 1, targets);
        s.put_pack(p.clone()).await.unwrap();
        assert_eq!(s.pack_version(&p.key(), None).await.unwrap(), Some(p));
    }

    // A push does not plan: reconcile_pack does.
    s.agent_hello(hello_in("a1", &["t"], &[], 1)).await.unwrap();
    s.put_pack(pack("t", "n", 1, to_ids(&["a1"])))
        .await
        .unwrap();
    assert_eq!(rows_of(s, "a1").await, []);
    assert_eq!(
        s.deliveries_of_pack(&key("t", "n"), None, None, 0)
            .await
            .unwrap(),
        []
    );
    let changed = s
        .reconcile_pack(&key("t", "n"), RefTime::from_nanos(2))
        .await
        .unwrap();
    assert_eq!(brief(&changed), [b("a1", "t/n", 1, Hold, Pending)]);

    // Listed by tenant then id, latest version, without YAML.
    let all = s.packs(None).await.unwrap();
    let got: Vec<(String, u64)> = all
        .iter()
        .map(|p| (format!("{}/{}", p.tenant, p.pack), p.latest))
        .collect();
    let want: Vec<(String, u64)> = [
        ("t/n", 1),
        ("t/p", 5),
        ("u/k0", 1),
        ("u/k1", 1),
        ("u/k2", 1),
        ("u/k3", 1),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), *v))
    .collect();
    assert_eq!(got, want);
    let p = &all[1];
    assert_eq!(
        *p,
        PackSummaryRow {
            tenant: "t".into(),
            pack: "p".into(),
            latest: 5,
            targets: v5.targets.clone(),
            pushed: RefTime::from_nanos(v5.pushed.as_nanos()),
            cancelled: None,
            acked: 0,
            nacked: 0,
            pending: 0,
            ahead: 0,
        }
    );
    assert_eq!(all[0].pending, 1);
    assert_eq!(s.packs(Some("t")).await.unwrap(), all[..2]);
    assert_eq!(s.packs(Some("none")).await.unwrap(), []);
}

/// Cancelling a known pack withdraws it from every agent with a row (a
/// holder is told to cancel); cancelling again keeps the first instant; a
/// re-push of the same version leaves it cancelled, a higher one makes it
/// live again.
pub async fn cancel_known_pack(s: &dyn Store, _: Binding) {
    let k = key("t", "p");
    s.agent_hello(hello_in("a1", &["t"], &[], 10))
        .await
        .unwrap();
    s.agent_hello(hello_in("a2", &["t"], &[], 20))
        .await
        .unwrap();
    push(s, pack("t", "p", 1, to_ids(&["a1", "a2"])), 30).await;
    s.answer(ack("a1", &k, 1, 40)).await.unwrap();
    let other = push(s, pack("t", "o", 1, to_ids(&["a1"])), 45).await;

    let changed = s.cancel_pack(&k, RefTime::from_nanos(50)).await.unwrap();
    assert_eq!(
        brief(&changed),
        [
            b("a1", "t/p", 1, Withdraw, Cancelled),
            b("a2", "t/p", 1, Withdraw, Cancelled)
        ]
    );
    assert!(changed.iter().all(|r| r.updated.as_nanos() == 50));
    let a1 = row(s, "a1", &k).await;
    assert_eq!(
        planner::action(&a1),
        Some(Action::Cancel(1)),
        "a holder is told"
    );
    assert_eq!(planner::action(&row(s, "a2", &k).await), None);
    let listed = || async move {
        s.packs(Some("t"))
            .await
            .unwrap()
            .into_iter()
            .find(|p| p.pack == "p")
            .unwrap()
    };
    assert_eq!(listed().await.cancelled.map(RefTime::as_nanos), Some(50));

    // Again: the first instant stays, nothing changes.
    assert_eq!(
        s.cancel_pack(&k, RefTime::from_nanos(60)).await.unwrap(),
        []
    );
    assert_eq!(listed().await.cancelled.map(RefTime::as_nanos), Some(50));
    assert_eq!(
        s.reconcile_pack(&k, RefTime::from_nanos(61)).await.unwrap(),
        []
    );
    // Another pack is not touched.
    assert_eq!(row(s, "a1", &key("t", "o")).await, other[0]);

    // The holder dropped it: the withdrawal stays on record.
    let changed = s
        .agent_held("a1", 1, Vec::new(), RefTime::from_nanos(70))
        .await
        .unwrap();
    assert_eq!(brief(&changed), [b("a1", "t/p", 1, Withdraw, Cancelled)]);
    assert_eq!(changed[0].held, None);
    assert_eq!(planner::action(&changed[0]), None);

    // The same version again: unchanged, still cancelled.
    assert_eq!(
        s.put_pack(pack("t", "p", 1, to_ids(&["a1", "a2"])))
            .await
            .unwrap(),
        PutPack::Unchanged
    );
    assert_eq!(listed().await.cancelled.map(RefTime::as_nanos), Some(50));
    assert_eq!(
        s.reconcile_pack(&k, RefTime::from_nanos(75)).await.unwrap(),
        []
    );

    // A higher one: live again.
    let changed = push(s, pack("t", "p", 2, to_ids(&["a1", "a2"])), 80).await;
    assert_eq!(
        brief(&changed),
        [
            b("a1", "t/p", 2, Hold, Pending),
            b("a2", "t/p", 2, Hold, Pending)
        ]
    );
    let p = listed().await;
    assert_eq!(
        (p.latest, p.cancelled.map(RefTime::as_nanos), p.pending),
        (2, None, 2)
    );
}

/// A pack the store does not know: the agents' own (local), until an
/// operator cancels it by name, which withdraws it from every holder;
/// nobody holding it is [`StoreError::NoSuchPack`]. Later pushes of it
/// work.
/// A pack withdrawn from chosen agents: their rows withdraw it (the
/// holder told to cancel), the others keep it; a reconnect, a reconcile
/// or a re-push of the same version does not send it back; a newer
/// version reaches them again. Unknown packs are refused, a cancelled one
/// changes nothing.
pub async fn withdraw_from_chosen_agents(s: &dyn Store, _: Binding) {
    let k = key("t", "p");
    for (i, id) in ["a1", "a2", "a3"].into_iter().enumerate() {
        s.agent_hello(hello_in(id, &["t"], &[], 10 + i as i64))
            .await
            .unwrap();
    }
    push(s, pack("t", "p", 1, to_ids(&["a1", "a2", "a3"])), 20).await;
    s.answer(ack("a1", &k, 1, 30)).await.unwrap();
    s.answer(ack("a3", &k, 1, 31)).await.unwrap();

    let chosen = ["a1".to_string(), "a2".to_string()];
    let changed = sorted(
        s.withdraw_from(&k, &chosen, RefTime::from_nanos(40))
            .await
            .unwrap(),
    );
    assert_eq!(
        brief(&changed),
        [
            b("a1", "t/p", 1, Withdraw, Cancelled),
            b("a2", "t/p", 1, Withdraw, Cancelled)
        ]
    );
    assert_eq!(planner::action(&changed[0]), Some(Action::Cancel(1)));
    assert_eq!(planner::action(&changed[1]), None, "a2 never held it");
    let a3 = row(s, "a3", &k).await;
    assert_eq!((a3.intent, a3.state), (Hold, Acked), "the others keep it");
    assert_eq!(
        s.withdrawn_from(&k).await.unwrap(),
        BTreeMap::from([("a1".to_string(), 1), ("a2".to_string(), 1)])
    );

    // The holder dropped it, then reconnects: nothing is sent back.
    s.agent_held("a1", 1, Vec::new(), RefTime::from_nanos(50))
        .await
        .unwrap();
    let (_, rows) = s
        .agent_hello(hello_in("a1", &["t"], &[], 60))
        .await
        .unwrap();
    assert!(
        rows.iter().all(|r| planner::action(r).is_none()),
        "{rows:?}"
    );
    assert_eq!(
        s.reconcile_pack(&k, RefTime::from_nanos(61)).await.unwrap(),
        []
    );
    assert_eq!(
        s.put_pack(pack("t", "p", 1, to_ids(&["a1", "a2", "a3"])))
            .await
            .unwrap(),
        PutPack::Unchanged
    );
    assert_eq!(
        s.reconcile_pack(&k, RefTime::from_nanos(62)).await.unwrap(),
        []
    );

    // A newer version reaches every target again; the stop stays on record
    // for v1.
    let v2 = sorted(push(s, pack("t", "p", 2, to_ids(&["a1", "a2", "a3"])), 70).await);
    let actions: Vec<Option<Action>> = v2.iter().map(planner::action).collect();
    assert_eq!(
        actions,
        [
            Some(Action::Push(2)),
            Some(Action::Push(2)),
            Some(Action::Push(2))
        ]
    );
    assert_eq!(s.withdrawn_from(&k).await.unwrap().get("a1"), Some(&1));

    // Unknown: refused; cancelled: nothing to do.
    let r = s
        .withdraw_from(&key("t", "none"), &chosen, RefTime::from_nanos(80))
        .await;
    assert!(matches!(r, Err(StoreError::NoSuchPack { .. })), "{r:?}");
    assert_eq!(
        s.withdrawn_from(&key("t", "none")).await.unwrap(),
        BTreeMap::new()
    );
    s.cancel_pack(&k, RefTime::from_nanos(90)).await.unwrap();
    assert_eq!(
        s.withdraw_from(&k, &chosen, RefTime::from_nanos(91))
            .await
            .unwrap(),
        []
    );
}

pub async fn cancel_unknown_pack(s: &dyn Store, _: Binding) {
    let k = key("t", "x");
    let mut h = hello_in("a1", &["t"], &[], 10);
    h.held = vec![held("t", "x", 3)];
    let (_, rows) = s.agent_hello(h.clone()).await.unwrap();
    assert_eq!(
        brief(&rows),
        [b("a1", "t/x", 3, Local, DeliveryState::Local)]
    );
    assert_eq!(planner::action(&rows[0]), None, "left alone");
    let mut h2 = hello_in("a2", &["t"], &[], 20);
    h2.held = vec![HeldPackRow {
        stopped: true,
        ..held("t", "x", 5)
    }];
    s.agent_hello(h2).await.unwrap();
    s.agent_hello(hello_in("a3", &["t"], &[], 25))
        .await
        .unwrap();
    assert_eq!(s.deliveries_of_pack(&k, None, None, 0).await.unwrap(), []);
    assert_eq!(s.packs(None).await.unwrap(), []);
    assert_eq!(s.delivery_counts().await.unwrap(), []);

    for nobody in [key("t", "nothing"), key("u", "x")] {
        let r = s.cancel_pack(&nobody, RefTime::from_nanos(30)).await;
        assert!(
            matches!(&r, Err(StoreError::NoSuchPack { tenant, pack }) if *tenant == nobody.tenant && *pack == nobody.pack),
            "{r:?}"
        );
    }
    assert_eq!(s.packs(None).await.unwrap(), []);

    let changed = sorted(s.cancel_pack(&k, RefTime::from_nanos(40)).await.unwrap());
    assert_eq!(
        brief(&changed),
        [
            b("a1", "t/x", 3, Withdraw, Cancelled),
            b("a2", "t/x", 5, Withdraw, Cancelled)
        ]
    );
    let actions: Vec<Option<Action>> = changed.iter().map(planner::action).collect();
    assert_eq!(actions, [Some(Action::Cancel(3)), Some(Action::Cancel(5))]);
    let listed = s.packs(None).await.unwrap();
    assert_eq!(listed.len(), 1);
    let p = &listed[0];
    assert_eq!(
        (p.latest, &p.targets, p.cancelled.map(RefTime::as_nanos)),
        (5, &TargetsRow::Nobody, Some(40))
    );
    assert_eq!(s.pack_version(&k, None).await.unwrap(), None, "no text");
    assert_eq!(
        s.cancel_pack(&k, RefTime::from_nanos(45)).await.unwrap(),
        []
    );

    // A holder that says hello still holding it is told again.
    h.at = RefTime::from_nanos(50);
    let (_, rows) = s.agent_hello(h).await.unwrap();
    assert_eq!(planner::action(&rows[0]), Some(Action::Cancel(3)));

    // Later pushes work (from the newest version held).
    let r = s.put_pack(pack("t", "x", 4, to_ids(&["a1"]))).await;
    assert!(
        matches!(
            &r,
            Err(StoreError::VersionOlder {
                version: 4,
                latest: 5,
                ..
            })
        ),
        "{r:?}"
    );
    let changed = push(s, pack("t", "x", 5, to_ids(&["a1", "a3"])), 60).await;
    assert_eq!(
        brief(&changed),
        [
            b("a1", "t/x", 5, Hold, Pending),
            b("a3", "t/x", 5, Hold, Pending)
        ]
    );
    assert_eq!(
        planner::action(&row(s, "a1", &k).await),
        Some(Action::Push(5))
    );
    assert_eq!(
        s.pack_version(&k, None).await.unwrap(),
        Some(pack("t", "x", 5, to_ids(&["a1", "a3"])))
    );
    assert_eq!(
        s.packs(None).await.unwrap()[0]
            .cancelled
            .map(RefTime::as_nanos),
        None
    );
    // a2 holds v5, stopped, untargeted: still withdrawn.
    assert_eq!(
        brief(&[row(s, "a2", &k).await]),
        [b("a2", "t/x", 5, Withdraw, Cancelled)]
    );
    let changed = push(s, pack("t", "x", 6, to_ids(&["a1", "a2", "a3"])), 70).await;
    assert_eq!(
        brief(&changed),
        [
            b("a1", "t/x", 6, Hold, Pending),
            b("a2", "t/x", 6, Hold, Pending),
            b("a3", "t/x", 6, Hold, Pending)
        ]
    );
}

/// A pack is planned for the agents its targets match (all labels, or the
/// ids) among those serving its tenant; retargeting withdraws; agents of
/// other tenants are untouched under [`Binding::Tenants`].
pub async fn reconcile_pack_targets(s: &dyn Store, binding: Binding) {
    let open = binding == Binding::Open;
    let k = key("t", "p");
    s.agent_hello(hello_in("a1", &["t"], &[("line", "3")], 1))
        .await
        .unwrap();
    s.agent_hello(hello_in("a2", &["t"], &[("line", "4")], 1))
        .await
        .unwrap();
    s.agent_hello(hello_in("a3", &["u"], &[("line", "3")], 1))
        .await
        .unwrap();
    s.agent_hello(hello_in("a4", &["t"], &[("line", "3"), ("zone", "z")], 1))
        .await
        .unwrap();

    let changed = push(s, pack("t", "p", 1, to_labels(&[("line", "3")])), 10).await;
    let mut want = vec![b("a1", "t/p", 1, Hold, Pending)];
    if open {
        want.push(b("a3", "t/p", 1, Hold, Pending));
    }
    want.push(b("a4", "t/p", 1, Hold, Pending));
    assert_eq!(brief(&changed), want);
    assert!(
        changed
            .iter()
            .all(|r| r.updated.as_nanos() == 10 && r.attempts == 0)
    );
    s.answer(ack("a1", &k, 1, 11)).await.unwrap();
    assert_eq!(
        s.reconcile_pack(&k, RefTime::from_nanos(12)).await.unwrap(),
        [],
        "twice: nothing"
    );

    // Every label must match.
    let changed = sorted(
        push(
            s,
            pack("t", "p", 2, to_labels(&[("line", "3"), ("zone", "z")])),
            20,
        )
        .await,
    );
    let mut want = vec![b("a1", "t/p", 1, Withdraw, Cancelled)];
    if open {
        want.push(b("a3", "t/p", 1, Withdraw, Cancelled));
    }
    want.push(b("a4", "t/p", 2, Hold, Pending));
    assert_eq!(brief(&changed), want);
    // The one that held it is told to cancel it.
    assert_eq!(planner::action(&changed[0]), Some(Action::Cancel(1)));

    // Ids; unknown ones are nobody.
    let changed = push(s, pack("t", "p", 3, to_ids(&["a2", "a3", "ghost"])), 30).await;
    let mut want = vec![b("a2", "t/p", 3, Hold, Pending)];
    if open {
        want.push(b("a3", "t/p", 3, Hold, Pending));
    }
    want.push(b("a4", "t/p", 2, Withdraw, Cancelled));
    assert_eq!(brief(&changed), want);
    if !open {
        assert_eq!(rows_of(s, "a3").await, [], "another tenant's agent");
    }
    let all = s.deliveries_of_pack(&k, None, None, 0).await.unwrap();
    assert_eq!(
        all.iter().map(|r| r.agent_id.as_str()).collect::<Vec<_>>(),
        if open {
            vec!["a1", "a2", "a3", "a4"]
        } else {
            vec!["a1", "a2", "a4"]
        }
    );

    // Nobody.
    let changed = push(s, pack("t", "p", 4, TargetsRow::Nobody), 40).await;
    let mut want = vec![b("a2", "t/p", 3, Withdraw, Cancelled)];
    if open {
        want.push(b("a3", "t/p", 3, Withdraw, Cancelled));
    }
    assert_eq!(brief(&changed), want);

    // Labels matched through a tenant's operator labels.
    s.label_agent(
        "a2",
        "t",
        [("zone".into(), Some("z".into()))].into(),
        Vec::new(),
        RefTime::from_nanos(45),
    )
    .await
    .unwrap();
    let changed = push(s, pack("t", "p", 5, to_labels(&[("zone", "z")])), 50).await;
    assert_eq!(
        brief(&changed),
        [
            b("a2", "t/p", 5, Hold, Pending),
            b("a4", "t/p", 5, Hold, Pending)
        ]
    );

    assert_eq!(
        s.reconcile_pack(&key("t", "none"), RefTime::from_nanos(60))
            .await
            .unwrap(),
        []
    );
}
