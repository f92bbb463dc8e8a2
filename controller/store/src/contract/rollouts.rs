//! The rollout part of the contract: a rollout gates its version in the
//! same transaction as the push, its changes are compare-and-set, and the
//! gate decides who holds what through every planning path (push, hello,
//! answer).

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::collections::BTreeMap;

use baton_model::RefTime;

use crate::*;

use super::fixtures::*;

fn with_rollout(p: PackVersionRow) -> PackVersionRow {
    PackVersionRow { rollout: true, ..p }
}

fn versions(rows: &[DeliveryRow]) -> BTreeMap<String, (u64, Intent)> {
    rows.iter()
        .map(|r| (r.agent_id.clone(), (r.version, r.intent)))
        .collect()
}

async fn stored(s: &dyn Store, k: &PackKey) -> BTreeMap<String, (u64, Intent)> {
    versions(&s.deliveries_of_pack(k, None, None, 0).await.unwrap())
}

fn hold(v: u64) -> (u64, Intent) {
    (v, Intent::Hold)
}

/// Three agents hold v1; v2 comes with a rollout.
async fn three_on_v1(s: &dyn Store) -> PackKey {
    let k = key("t", "p");
    for id in ["a1", "a2", "a3"] {
        s.agent_hello(hello_in(id, &["t"], &[], 10)).await.unwrap();
    }
    push(s, pack("t", "p", 1, to_ids(&["a1", "a2", "a3"])), 20).await;
    for id in ["a1", "a2", "a3"] {
        s.answer(ack(id, &k, 1, 21)).await.unwrap();
    }
    k
}

/// A push with a rollout gates its version: nobody gets it until the
/// rollout admits them, the others keep what they hold, through every
/// planning path; a change computed from a stale rev is refused whole.
pub async fn a_rollout_gates_its_version(s: &dyn Store, _binding: Binding) {
    let k = three_on_v1(s).await;
    let changed = push(
        s,
        with_rollout(pack("t", "p", 2, to_ids(&["a1", "a2", "a3"]))),
        30,
    )
    .await;
    assert!(changed.is_empty(), "nobody admitted yet: {changed:?}");
    assert_eq!(
        stored(s, &k).await,
        [("a1", hold(1)), ("a2", hold(1)), ("a3", hold(1))]
            .map(|(a, v)| (a.to_string(), v))
            .into()
    );
    let r = s.rollout(&k, None).await.unwrap().expect("a rollout");
    assert_eq!(
        (r.version, r.from, r.state, r.rev),
        (2, Some(1), RolloutState::WaitingWindow, 0)
    );
    assert!(r.members.is_empty());

    // Stage 1 admits a1.
    let mut next = r.clone();
    next.state = RolloutState::Running;
    next.stage_started = Some(RefTime::from_nanos(40));
    let member = Member {
        stage: 0,
        skipped: false,
    };
    let change = RolloutChange {
        row: next.clone(),
        admit: vec![("a1".into(), member)],
        skip: Vec::new(),
        republish: None,
        gate: next.gate(false),
    };
    let rows = s
        .advance_rollout(change.clone(), RefTime::from_nanos(40))
        .await
        .unwrap()
        .expect("applied");
    assert_eq!(versions(&rows), [("a1".to_string(), hold(2))].into());
    // The same change again was computed from rev 0: refused, nothing
    // written.
    assert_eq!(
        s.advance_rollout(change, RefTime::from_nanos(41))
            .await
            .unwrap(),
        None
    );
    let r = s.rollout(&k, Some(2)).await.unwrap().unwrap();
    assert_eq!((r.rev, r.state), (1, RolloutState::Running));
    assert_eq!(r.members, [("a1".to_string(), member)].into());

    // A hello plans each agent alone: the gate holds there too.
    let (_, a1) = s
        .agent_hello(hello_in("a1", &["t"], &[], 50))
        .await
        .unwrap();
    let (_, a2) = s
        .agent_hello(hello_in("a2", &["t"], &[], 50))
        .await
        .unwrap();
    assert_eq!(versions(&a1)["a1"], hold(2));
    assert_eq!(versions(&a2)["a2"], hold(1));
    // An answer re-plans one pair: an outsider's ack of v1 keeps v1.
    let a3 = s.answer(ack("a3", &k, 1, 51)).await.unwrap().unwrap();
    assert_eq!((a3.version, a3.state), (1, DeliveryState::Acked));
    // a1's new stream (generation 2) hears its ack.
    s.answer(AnswerRow {
        session_gen: 2,
        ..ack("a1", &k, 2, 52)
    })
    .await
    .unwrap();

    // Abort with a rollback: v3 (v1's content) for the cohort only.
    let mut aborted = r.clone();
    aborted.state = RolloutState::Aborted;
    aborted.rollback = Some(3);
    let republish = PackVersionRow {
        yaml: "pack: p\nversion: 3\n# v1 again\n".into(),
        ..pack("t", "p", 3, to_ids(&["a1", "a2", "a3"]))
    };
    let rows = s
        .advance_rollout(
            RolloutChange {
                row: aborted.clone(),
                admit: Vec::new(),
                skip: Vec::new(),
                republish: Some(republish),
                gate: aborted.gate(false),
            },
            RefTime::from_nanos(60),
        )
        .await
        .unwrap()
        .expect("applied");
    assert_eq!(versions(&rows), [("a1".to_string(), hold(3))].into());
    assert_eq!(
        s.pack_version(&k, None).await.unwrap().unwrap().version,
        3,
        "the rollback is the latest"
    );
    assert_eq!(stored(s, &k).await["a2"], hold(1));
    assert!(
        s.rollouts(Some("t"), true).await.unwrap().is_empty(),
        "aborted is final"
    );
    assert_eq!(s.rollouts(Some("t"), false).await.unwrap().len(), 1);
    assert!(s.rollouts(Some("u"), false).await.unwrap().is_empty());

    // A push without a rollout goes to everyone; the aborted rollout
    // stays aborted.
    push(s, pack("t", "p", 4, to_ids(&["a1", "a2", "a3"])), 70).await;
    assert!(stored(s, &k).await.values().all(|v| *v == hold(4)));
    let r = s.rollout(&k, None).await.unwrap().unwrap();
    assert_eq!(r.state, RolloutState::Aborted);
}

/// A new push ends an open rollout (superseded) and a cancel does too;
/// the superseding rollout's outsiders keep what they hold; an abort with
/// `on_abort: safe_state` withdraws the version from the cohort.
pub async fn a_push_or_cancel_supersedes_a_rollout(s: &dyn Store, _binding: Binding) {
    let k = three_on_v1(s).await;
    push(
        s,
        with_rollout(pack("t", "p", 2, to_ids(&["a1", "a2", "a3"]))),
        30,
    )
    .await;
    let r = s.rollout(&k, None).await.unwrap().unwrap();
    let mut next = r.clone();
    next.state = RolloutState::Running;
    let change = RolloutChange {
        row: next.clone(),
        admit: vec![(
            "a1".into(),
            Member {
                stage: 0,
                skipped: false,
            },
        )],
        skip: Vec::new(),
        republish: None,
        gate: next.gate(false),
    };
    s.advance_rollout(change, RefTime::from_nanos(31))
        .await
        .unwrap()
        .unwrap();
    s.answer(ack("a1", &k, 2, 32)).await.unwrap();

    push(
        s,
        with_rollout(pack("t", "p", 3, to_ids(&["a1", "a2", "a3"]))),
        40,
    )
    .await;
    let old = s.rollout(&k, Some(2)).await.unwrap().unwrap();
    assert_eq!(old.state, RolloutState::Superseded);
    assert_eq!(old.reason, "v3 pushed");
    let new = s.rollout(&k, None).await.unwrap().unwrap();
    assert_eq!(
        (new.version, new.from),
        (3, Some(1)),
        "its outsiders keep v1"
    );
    assert_eq!(
        stored(s, &k).await,
        [("a1", hold(2)), ("a2", hold(1)), ("a3", hold(1))]
            .map(|(a, v)| (a.to_string(), v))
            .into(),
        "a1 keeps v2 rather than be sent back"
    );

    // Safe-state abort of the v3 rollout after admitting a2.
    let mut next = new.clone();
    next.state = RolloutState::Running;
    let change = RolloutChange {
        row: next.clone(),
        admit: vec![(
            "a2".into(),
            Member {
                stage: 0,
                skipped: false,
            },
        )],
        skip: Vec::new(),
        republish: None,
        gate: next.gate(false),
    };
    s.advance_rollout(change, RefTime::from_nanos(41))
        .await
        .unwrap()
        .unwrap();
    s.answer(ack("a2", &k, 3, 42)).await.unwrap();
    let r = s.rollout(&k, None).await.unwrap().unwrap();
    let mut aborted = r.clone();
    aborted.state = RolloutState::Aborted;
    let rows = s
        .advance_rollout(
            RolloutChange {
                row: aborted.clone(),
                admit: Vec::new(),
                skip: Vec::new(),
                republish: None,
                gate: aborted.gate(true),
            },
            RefTime::from_nanos(43),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        versions(&rows),
        [("a2".to_string(), (3, Intent::Withdraw))].into(),
        "the cohort's copy is withdrawn"
    );

    // A cancel ends an open rollout.
    push(
        s,
        with_rollout(pack("t", "p", 5, to_ids(&["a1", "a2", "a3"]))),
        50,
    )
    .await;
    s.cancel_pack(&k, RefTime::from_nanos(51)).await.unwrap();
    let r = s.rollout(&k, None).await.unwrap().unwrap();
    assert_eq!(
        (r.version, r.state, r.reason.as_str()),
        (5, RolloutState::Superseded, "the pack was cancelled")
    );
}

/// After a rollout aborted (its version withdrawn), the next rollout's
/// outsiders keep the version before it, and one still holding the aborted
/// version has it withdrawn; after a cancel, a new rollout's outsiders get
/// nothing and keep nothing of the cancelled pack.
pub async fn outsiders_never_get_an_aborted_or_cancelled_version_back(
    s: &dyn Store,
    _binding: Binding,
) {
    let k = three_on_v1(s).await;
    // v2's rollout admits a1 and a2, then aborts with its version
    // withdrawn; a2 never heard the withdrawal (it still holds v2).
    push(
        s,
        with_rollout(pack("t", "p", 2, to_ids(&["a1", "a2", "a3"]))),
        30,
    )
    .await;
    let r = s.rollout(&k, None).await.unwrap().unwrap();
    let mut running = r.clone();
    running.state = RolloutState::Running;
    let member = Member {
        stage: 0,
        skipped: false,
    };
    s.advance_rollout(
        RolloutChange {
            row: running.clone(),
            admit: vec![("a1".into(), member), ("a2".into(), member)],
            skip: Vec::new(),
            republish: None,
            gate: running.gate(false),
        },
        RefTime::from_nanos(31),
    )
    .await
    .unwrap()
    .unwrap();
    s.answer(ack("a2", &k, 2, 32)).await.unwrap();
    let r = s.rollout(&k, None).await.unwrap().unwrap();
    let mut aborted = r.clone();
    aborted.state = RolloutState::Aborted;
    s.advance_rollout(
        RolloutChange {
            row: aborted.clone(),
            admit: Vec::new(),
            skip: Vec::new(),
            republish: None,
            gate: aborted.gate(true),
        },
        RefTime::from_nanos(33),
    )
    .await
    .unwrap()
    .unwrap();
    // v3 with a rollout, nobody admitted yet.
    push(
        s,
        with_rollout(pack("t", "p", 3, to_ids(&["a1", "a2", "a3"]))),
        40,
    )
    .await;
    let r = s.rollout(&k, None).await.unwrap().unwrap();
    assert_eq!((r.from, r.banned.as_slice()), (Some(1), &[2][..]), "{r:?}");
    let rows = stored(s, &k).await;
    assert_eq!(rows["a3"], hold(1), "an outsider keeps v1, never gets v2");
    assert_eq!(
        rows["a2"],
        (2, Intent::Withdraw),
        "the aborted v2 is withdrawn"
    );

    // A cancel, a4 offline still holding the cancelled v3 ...
    s.agent_hello(hello_in("a4", &["t"], &[], 41))
        .await
        .unwrap();
    s.cancel_pack(&k, RefTime::from_nanos(42)).await.unwrap();
    // ... then v4 with a rollout: outsiders get nothing and keep nothing.
    push(
        s,
        with_rollout(pack("t", "p", 4, to_ids(&["a1", "a2", "a3", "a4"]))),
        50,
    )
    .await;
    let r = s.rollout(&k, None).await.unwrap().unwrap();
    assert_eq!((r.from, r.keep_above), (None, Some(3)), "{r:?}");
    let (_, rows) = s
        .agent_hello(HelloRow {
            held: vec![held("t", "p", 3)],
            ..hello_in("a4", &["t"], &[], 51)
        })
        .await
        .unwrap();
    let a4 = versions(&rows);
    assert_eq!(
        a4["a4"],
        (3, Intent::Withdraw),
        "the cancelled v3 stays withdrawn"
    );
}
