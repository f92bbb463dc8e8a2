//! The planner's rules, one unit test each (in the order of the module
//! doc), then property tests: `wanted` against a brute-force oracle
//! written here from the rules' words, and the guarantees the sessions
//! rely on (never a push of a version the agent holds or passed, a cancel
//! reaches every holder, a refusal counts for its version only), for
//! random fleets, labels, targets, tenants and histories.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use crate::time::RefTime;
use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use proptest::sample::select;

use super::*;
use crate::records::{Activation, ErrorRow, LabelOverrides, StagedRow, TargetsRow};

fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
    kv.iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Agent `id` serving `tenants`, with its own labels.
fn agent(id: &str, tenants: &[&str], own: &[(&str, &str)]) -> AgentRow {
    let mut a = AgentRow::new(id, "j1");
    a.labels = labels(own);
    a.tenants = tenants.iter().map(|t| (*t).to_owned()).collect();
    a
}

fn pack(tenant: &str, latest: u64, targets: TargetsRow) -> PackTargets {
    PackTargets {
        tenant: tenant.into(),
        pack: "p".into(),
        latest,
        targets,
        cancelled: None,
        gate: None,
        stopped: BTreeMap::new(),
    }
}

fn cancelled(p: PackTargets) -> PackTargets {
    PackTargets {
        cancelled: Some(RefTime::from_nanos(5)),
        ..p
    }
}

fn ids(ids: &[&str]) -> TargetsRow {
    TargetsRow::Agents(ids.iter().map(|s| (*s).to_owned()).collect())
}

fn on(kv: &[(&str, &str)]) -> TargetsRow {
    TargetsRow::Labels(labels(kv))
}

fn key(tenant: &str) -> PackKey {
    PackKey::new(tenant, "p")
}

fn h(version: u64) -> Option<Held> {
    Some(Held {
        version,
        stopped: false,
    })
}

fn refusal(version: u64, last: bool) -> Refusal {
    Refusal {
        version,
        last,
        message: format!("no to v{version}"),
        errors: vec![ErrorRow {
            line: 2,
            column: 3,
            instruction: "i".into(),
            message: "bad".into(),
        }],
    }
}

/// `plan` from nothing: no row before.
fn fresh(
    a: &AgentRow,
    p: Option<&PackTargets>,
    held: Option<Held>,
    b: Binding,
) -> Option<DeliveryRow> {
    let k = p.map_or_else(|| key("t"), |p| PackKey::new(&p.tenant, &p.pack));
    plan(a, &k, p, None, held, b, RefTime::from_nanos(10))
}

/// A row wanting `version` of t/p with the agent's `refusal` of it.
fn refused(a: &AgentRow, p: &PackTargets, r: Refusal) -> DeliveryRow {
    let row = fresh(a, Some(p), None, Binding::Tenants).unwrap();
    answered(
        a,
        Some(p),
        &row,
        r.version,
        &Answer::Refused(r),
        1,
        Binding::Tenants,
        RefTime::from_nanos(20),
    )
    .unwrap()
}

// ---------------------------------------------------------------------------
// wanted: targets, labels, tenants, cancels.

#[test]
fn a_live_pack_targeting_a_served_agent_is_wanted_at_its_latest() {
    let a = agent("a1", &["t"], &[("line", "3")]);
    for targets in [ids(&["a0", "a1"]), on(&[("line", "3")]), on(&[])] {
        assert_eq!(
            wanted(&a, &pack("t", 4, targets), None, Binding::Tenants),
            Some(4)
        );
    }
    for targets in [
        TargetsRow::Nobody,
        ids(&[]),
        ids(&["a0"]),
        on(&[("line", "4")]),
        on(&[("line", "3"), ("zone", "z")]),
    ] {
        assert_eq!(
            wanted(&a, &pack("t", 4, targets), None, Binding::Tenants),
            None
        );
    }
}

/// `p` gated by a rollout of v`rollout` from `from`, `admitted` in its
/// cohort.
fn gated(
    p: PackTargets,
    rollout: u64,
    from: Option<u64>,
    hold: bool,
    admitted: &[&str],
) -> PackTargets {
    PackTargets {
        gate: Some(crate::gate::Gate {
            row: crate::gate::GateRow {
                rollout,
                from,
                members_hold: hold,
                keep_above: None,
                banned: Vec::new(),
                together: false,
                switch_at: None,
                held_back: Vec::new(),
            },
            admitted: admitted.iter().map(|s| (*s).to_owned()).collect(),
        }),
        ..p
    }
}

fn held_v(version: u64) -> Option<Held> {
    Some(Held {
        version,
        stopped: false,
    })
}

#[test]
fn a_pack_withdrawn_from_chosen_agents_stays_away_from_them_until_a_newer_version() {
    let (a1, a2) = (agent("a1", &["t"], &[]), agent("a2", &["t"], &[]));
    let k = PackKey::new("t", "p");
    let b = Binding::Tenants;
    let mut p = pack("t", 3, ids(&["a1", "a2"]));
    p.stopped.insert("a1".into(), 3);
    assert_eq!(wanted(&a1, &p, held_v(3), b), None, "withdrawn here");
    assert_eq!(wanted(&a2, &p, held_v(3), b), Some(3), "the others keep it");
    // The holder is told to cancel; once it dropped it, the row stays a
    // withdrawal (it is not pushed v3 again on the next re-plan).
    let row = plan(
        &a1,
        &k,
        Some(&p),
        None,
        held_v(3),
        b,
        RefTime::from_nanos(10),
    )
    .unwrap();
    assert_eq!(action(&row), Some(Action::Cancel(3)));
    let gone = plan(
        &a1,
        &k,
        Some(&p),
        Some(&row),
        None,
        b,
        RefTime::from_nanos(20),
    )
    .unwrap();
    assert_eq!((gone.intent, action(&gone)), (Intent::Withdraw, None));
    // A rollout of v4 does not hand the stopped agent its `from` (v3) back
    // while it waits outside the cohort; admitted, it gets v4.
    let newer = PackTargets { latest: 4, ..p };
    let waiting = gated(newer.clone(), 4, Some(3), true, &["a2"]);
    assert_eq!(wanted(&a1, &waiting, None, b), None);
    assert_eq!(wanted(&a2, &waiting, held_v(3), b), Some(4));
    let admitted = gated(newer.clone(), 4, Some(3), true, &["a1", "a2"]);
    assert_eq!(wanted(&a1, &admitted, None, b), Some(4));
    // Without a rollout, v4 goes to it at once.
    let next = plan(
        &a1,
        &k,
        Some(&newer),
        Some(&gone),
        None,
        b,
        RefTime::from_nanos(30),
    )
    .unwrap();
    assert_eq!(action(&next), Some(Action::Push(4)));
}

#[test]
fn a_rollout_gate_lets_its_cohort_onto_the_latest_and_keeps_the_others_where_they_are() {
    let (a1, a2) = (agent("a1", &["t"], &[]), agent("a2", &["t"], &[]));
    let p = gated(pack("t", 4, ids(&["a1", "a2"])), 4, Some(2), true, &["a1"]);
    let b = Binding::Tenants;
    assert_eq!(wanted(&a1, &p, held_v(2), b), Some(4), "a member");
    assert_eq!(
        wanted(&a2, &p, held_v(2), b),
        Some(2),
        "an outsider keeps v2"
    );
    assert_eq!(
        wanted(&a2, &p, None, b),
        Some(2),
        "an outsider with nothing gets from"
    );
    assert_eq!(
        wanted(&a2, &p, held_v(1), b),
        Some(2),
        "an outsider below from gets from"
    );
    assert_eq!(
        wanted(&a2, &p, held_v(3), b),
        Some(3),
        "an outsider of a superseded rollout keeps its newer copy"
    );
    assert_eq!(
        wanted(&a2, &p, held_v(9), b),
        Some(4),
        "never above the latest"
    );
    // A new pack: outsiders get nothing until admitted.
    let new = gated(pack("t", 1, ids(&["a1", "a2"])), 1, None, true, &["a1"]);
    assert_eq!(wanted(&a1, &new, None, b), Some(1));
    assert_eq!(wanted(&a2, &new, None, b), None);
    // An abort with `on_abort: safe_state`: the cohort's copy is withdrawn.
    let withdrawn = gated(pack("t", 4, ids(&["a1", "a2"])), 4, Some(2), false, &["a1"]);
    assert_eq!(wanted(&a1, &withdrawn, held_v(4), b), None);
    let row = plan(
        &a1,
        &PackKey::new("t", "p"),
        Some(&withdrawn),
        None,
        held_v(4),
        b,
        RefTime::from_nanos(9),
    )
    .unwrap();
    assert_eq!(
        (row.intent, action(&row)),
        (Intent::Withdraw, Some(Action::Cancel(4)))
    );
    // A version that must not run again is withdrawn from outsiders: an
    // aborted rollout's, or a cancelled pack's.
    let mut after_abort = gated(pack("t", 6, ids(&["a1", "a2"])), 6, Some(2), true, &["a1"]);
    if let Some(g) = after_abort.gate.as_mut() {
        g.row.banned = vec![4];
    }
    assert_eq!(wanted(&a2, &after_abort, held_v(4), b), None);
    assert_eq!(
        wanted(&a2, &after_abort, held_v(5), b),
        Some(5),
        "a rollback kept"
    );
    let mut after_cancel = gated(pack("t", 6, ids(&["a1", "a2"])), 6, None, true, &["a1"]);
    if let Some(g) = after_cancel.gate.as_mut() {
        g.row.keep_above = Some(5);
    }
    assert_eq!(wanted(&a2, &after_cancel, held_v(5), b), None);
    assert_eq!(wanted(&a2, &after_cancel, held_v(3), b), None);
    assert_eq!(wanted(&a2, &after_cancel, None, b), None);
    // The gate never reaches past targeting.
    let a3 = agent("a3", &["t"], &[]);
    assert_eq!(wanted(&a3, &p, held_v(2), b), None);
}

/// A member of a stage that switches together is staged first (asked
/// once per version), then named the instant (asked once per instant);
/// a held-back member stays staged; once it holds the version, nothing.
#[test]
fn a_together_member_is_staged_then_switched_at_the_instant() {
    let a1 = agent("a1", &["t"], &[]);
    let b = Binding::Tenants;
    let k = PackKey::new("t", "p");
    let mut p = gated(pack("t", 4, ids(&["a1"])), 4, Some(2), true, &["a1"]);
    p.gate.as_mut().unwrap().row.together = true;
    let row = plan(
        &a1,
        &k,
        Some(&p),
        None,
        held_v(2),
        b,
        RefTime::from_nanos(1),
    )
    .unwrap();
    assert_eq!(
        (row.activate, action(&row)),
        (Activation::Staged, Some(Action::Stage(4)))
    );
    assert_eq!(row.reason, "to be staged");
    let staged = answered(
        &a1,
        Some(&p),
        &row,
        4,
        &Answer::Staged(RefTime::from_nanos(0)),
        1,
        b,
        RefTime::from_nanos(2),
    )
    .unwrap();
    assert_eq!(
        staged.staged,
        Some(StagedRow {
            version: 4,
            at: RefTime::from_nanos(0)
        })
    );
    assert_eq!(action(&staged), None, "staged once");
    assert_eq!(staged.reason, "staged, waiting for the stage's instant");
    p.gate.as_mut().unwrap().row.switch_at = Some(RefTime::from_nanos(99));
    let named = plan(
        &a1,
        &k,
        Some(&p),
        Some(&staged),
        held_v(2),
        b,
        RefTime::from_nanos(3),
    )
    .unwrap();
    assert_eq!(
        action(&named),
        Some(Action::Switch(4, RefTime::from_nanos(99)))
    );
    let told = answered(
        &a1,
        Some(&p),
        &named,
        4,
        &Answer::Staged(RefTime::from_nanos(99)),
        1,
        b,
        RefTime::from_nanos(4),
    )
    .unwrap();
    assert_eq!(action(&told), None, "named once");
    let switched = answered(
        &a1,
        Some(&p),
        &told,
        4,
        &Answer::Acked,
        1,
        b,
        RefTime::from_nanos(5),
    )
    .unwrap();
    assert_eq!(
        (switched.state, switched.activate, switched.staged),
        (DeliveryState::Acked, Activation::OnArrival, None)
    );
    // Held back: staged, never named.
    p.gate.as_mut().unwrap().row.held_back = vec!["a1".into()];
    let back = plan(
        &a1,
        &k,
        Some(&p),
        Some(&staged),
        held_v(2),
        b,
        RefTime::from_nanos(6),
    )
    .unwrap();
    assert_eq!((back.activate, action(&back)), (Activation::Staged, None));
}

/// A member told its instant, then the rollout aborted (nothing to roll
/// back to) or superseded by a plain push: its staged copy would switch in
/// at the instant, so it is first staged again without one (disarmed),
/// and only then withdrawn or replaced.
#[test]
fn an_armed_copy_nobody_wants_is_disarmed_before_anything_else() {
    let a1 = agent("a1", &["t"], &[]);
    let b = Binding::Tenants;
    let k = PackKey::new("t", "p");
    let mut p = gated(pack("t", 4, ids(&["a1"])), 4, None, true, &["a1"]);
    p.gate.as_mut().unwrap().row.together = true;
    p.gate.as_mut().unwrap().row.switch_at = Some(RefTime::from_nanos(99));
    let row = plan(&a1, &k, Some(&p), None, None, b, RefTime::from_nanos(1)).unwrap();
    let told = answered(
        &a1,
        Some(&p),
        &row,
        4,
        &Answer::Staged(RefTime::from_nanos(99)),
        1,
        b,
        RefTime::from_nanos(2),
    )
    .unwrap();
    assert_eq!(action(&told), None);
    // Aborted, on_abort withdraws (no earlier version): nobody wants v4.
    let mut aborted = gated(pack("t", 4, ids(&["a1"])), 4, None, false, &["a1"]);
    aborted.gate.as_mut().unwrap().row.members_hold = false;
    let after = plan(
        &a1,
        &k,
        Some(&aborted),
        Some(&told),
        None,
        b,
        RefTime::from_nanos(3),
    )
    .unwrap();
    assert_eq!(after.intent, Intent::Withdraw);
    assert_eq!(action(&after), Some(Action::Stage(4)), "disarmed first");
    let disarmed = answered(
        &a1,
        Some(&aborted),
        &after,
        4,
        &Answer::Staged(RefTime::from_nanos(0)),
        1,
        b,
        RefTime::from_nanos(4),
    )
    .unwrap();
    assert_eq!((disarmed.staged, action(&disarmed)), (None, None));
    // Superseded by v5 pushed on arrival: disarmed, then v5 pushed.
    let v5 = pack("t", 5, ids(&["a1"]));
    let after = plan(
        &a1,
        &k,
        Some(&v5),
        Some(&told),
        None,
        b,
        RefTime::from_nanos(5),
    )
    .unwrap();
    assert_eq!(action(&after), Some(Action::Stage(4)));
    let disarmed = answered(
        &a1,
        Some(&v5),
        &after,
        4,
        &Answer::Staged(RefTime::from_nanos(0)),
        1,
        b,
        RefTime::from_nanos(6),
    )
    .unwrap();
    assert_eq!(action(&disarmed), Some(Action::Push(5)));
    // A refused disarm: the agent dropped its copy (a new staging always
    // replaces the old one), so nothing is asked again.
    let refused = answered(
        &a1,
        Some(&v5),
        &after,
        4,
        &Answer::Refused(refusal(4, false)),
        1,
        b,
        RefTime::from_nanos(6),
    )
    .unwrap();
    assert_eq!(action(&refused), Some(Action::Push(5)));
    // Switched already (it holds v4): nothing to disarm.
    let holds = plan(
        &a1,
        &k,
        Some(&aborted),
        Some(&told),
        held_v(4),
        b,
        RefTime::from_nanos(7),
    )
    .unwrap();
    assert_eq!(action(&holds), Some(Action::Cancel(4)));
}

#[test]
fn a_cancelled_pack_is_wanted_by_nobody() {
    let a = agent("a1", &["t"], &[]);
    let p = cancelled(pack("t", 4, ids(&["a1"])));
    assert_eq!(wanted(&a, &p, None, Binding::Tenants), None);
    assert_eq!(wanted(&a, &p, None, Binding::Open), None);
}

#[test]
fn tenants_bind_only_under_binding_tenants() {
    let a = agent("a1", &["u"], &[]);
    let p = pack("t", 4, ids(&["a1"]));
    assert_eq!(wanted(&a, &p, None, Binding::Tenants), None);
    assert_eq!(wanted(&a, &p, None, Binding::Open), Some(4));
}

#[test]
fn operator_labels_apply_to_their_tenants_packs_only() {
    let mut a = agent("a1", &["t", "u"], &[("line", "3"), ("site", "n")]);
    let o: LabelOverrides = [
        ("line".to_string(), Some("4".to_string())),
        ("site".to_string(), None),
    ]
    .into();
    a.overrides.insert("t".into(), o);
    let b = Binding::Tenants;
    assert_eq!(
        wanted(&a, &pack("t", 1, on(&[("line", "4")])), None, b),
        Some(1)
    );
    assert_eq!(
        wanted(&a, &pack("t", 1, on(&[("line", "3")])), None, b),
        None
    );
    assert_eq!(
        wanted(&a, &pack("t", 1, on(&[("site", "n")])), None, b),
        None,
        "hidden"
    );
    assert_eq!(
        wanted(
            &a,
            &pack("u", 1, on(&[("line", "3"), ("site", "n")])),
            None,
            b
        ),
        Some(1)
    );
    assert_eq!(
        wanted(&a, &pack("u", 1, on(&[("line", "4")])), None, b),
        None
    );
}

// ---------------------------------------------------------------------------
// plan: wanted.

#[test]
fn wanted_and_not_held_is_pushed() {
    let a = agent("a1", &["t"], &[]);
    let p = pack("t", 3, ids(&["a1"]));
    for held in [None, h(1), h(2)] {
        let r = fresh(&a, Some(&p), held, Binding::Tenants).unwrap();
        assert_eq!(
            (r.intent, r.version, r.state, r.held),
            (Intent::Hold, 3, DeliveryState::Pending, held)
        );
        assert_eq!(action(&r), Some(Action::Push(3)));
        assert_eq!(
            (r.reason.as_str(), r.attempts, r.updated.as_nanos()),
            ("", 0, 10)
        );
    }
}

#[test]
fn wanted_and_held_is_acked_stopped_or_not() {
    let a = agent("a1", &["t"], &[]);
    let p = pack("t", 3, ids(&["a1"]));
    for stopped in [false, true] {
        let held = Some(Held {
            version: 3,
            stopped,
        });
        let r = fresh(&a, Some(&p), held, Binding::Tenants).unwrap();
        assert_eq!(
            (r.intent, r.state, r.held),
            (Intent::Hold, DeliveryState::Acked, held)
        );
        assert_eq!(action(&r), None);
    }
}

#[test]
fn a_final_refusal_is_nacked_and_not_pushed_again() {
    let a = agent("a1", &["t"], &[]);
    let p = pack("t", 3, ids(&["a1"]));
    let r = refused(&a, &p, refusal(3, true));
    assert_eq!(
        (r.state, r.reason.as_str()),
        (DeliveryState::Nacked, "no to v3")
    );
    assert_eq!(r.errors(), refusal(3, true).errors);
    assert_eq!(action(&r), None);
    // Planned again (a hello, a reconcile): still nacked.
    let again = plan(
        &a,
        &key("t"),
        Some(&p),
        Some(&r),
        None,
        Binding::Tenants,
        RefTime::from_nanos(30),
    )
    .unwrap();
    assert_eq!(again, r);
}

#[test]
fn a_retryable_refusal_is_pending_and_pushed_again() {
    let a = agent("a1", &["t"], &[]);
    let p = pack("t", 3, ids(&["a1"]));
    let r = refused(&a, &p, refusal(3, false));
    assert_eq!(r.state, DeliveryState::Pending);
    assert!(
        r.reason.contains("no to v3") && r.reason.contains("retrying"),
        "{}",
        r.reason
    );
    assert_eq!(r.errors(), refusal(3, false).errors);
    assert_eq!(action(&r), Some(Action::Push(3)));
}

#[test]
fn holding_a_newer_version_is_nacked_with_the_reason_and_never_pushed() {
    let a = agent("a1", &["t"], &[]);
    let p = pack("t", 3, ids(&["a1"]));
    let r = fresh(&a, Some(&p), h(5), Binding::Tenants).unwrap();
    assert_eq!(
        (r.intent, r.version, r.state),
        (Intent::Hold, 3, DeliveryState::Nacked)
    );
    assert!(
        r.reason.contains("v5") && r.reason.contains("v6"),
        "{}",
        r.reason
    );
    assert_eq!(action(&r), None);
}

// ---------------------------------------------------------------------------
// plan: withdrawn.

#[test]
fn a_known_pack_held_but_not_wanted_is_withdrawn_at_the_version_held() {
    let a = agent("a1", &["t"], &[("line", "3")]);
    for p in [
        cancelled(pack("t", 3, ids(&["a1"]))),
        pack("t", 3, on(&[("line", "4")])),
        pack("t", 3, TargetsRow::Nobody),
    ] {
        let r = fresh(&a, Some(&p), h(2), Binding::Tenants).unwrap();
        assert_eq!(
            (r.intent, r.version, r.state),
            (Intent::Withdraw, 2, DeliveryState::Cancelled)
        );
        assert_eq!(action(&r), Some(Action::Cancel(2)));
    }
    // Another tenant's, under Binding::Tenants.
    let other = agent("a1", &["u"], &[]);
    let r = fresh(
        &other,
        Some(&pack("t", 3, ids(&["a1"]))),
        h(3),
        Binding::Tenants,
    )
    .unwrap();
    assert_eq!(action(&r), Some(Action::Cancel(3)));
    assert_eq!(r.intent, Intent::Withdraw);
}

#[test]
fn a_withdrawal_stays_on_record_after_the_agent_dropped_it() {
    let a = agent("a1", &["t"], &[]);
    let p = pack("t", 3, ids(&["a1"]));
    let wanted_row = fresh(&a, Some(&p), None, Binding::Tenants).unwrap();
    let gone = cancelled(p.clone());
    let r = plan(
        &a,
        &key("t"),
        Some(&gone),
        Some(&wanted_row),
        None,
        Binding::Tenants,
        RefTime::from_nanos(20),
    )
    .unwrap();
    assert_eq!(
        (r.intent, r.version, r.state, r.updated.as_nanos()),
        (Intent::Withdraw, 3, DeliveryState::Cancelled, 20)
    );
    assert_eq!(action(&r), None, "nothing held: nothing to cancel");
    // Never targeted, nothing held: no row at all.
    assert_eq!(fresh(&a, Some(&gone), None, Binding::Tenants), None);
    assert_eq!(
        fresh(
            &a,
            Some(&pack("t", 3, ids(&["a2"]))),
            None,
            Binding::Tenants
        ),
        None
    );
}

// ---------------------------------------------------------------------------
// plan: local packs.

#[test]
fn a_pack_the_store_does_not_know_is_local_and_left_alone() {
    let a = agent("a1", &["t"], &[]);
    let r = fresh(&a, None, h(7), Binding::Tenants).unwrap();
    assert_eq!(
        (r.intent, r.version, r.state),
        (Intent::Local, 7, DeliveryState::Local)
    );
    assert_eq!(action(&r), None);
    // Dropped by the agent: the row stays (its last feedback is still the
    // agent's own), holding nothing and asking nothing.
    let gone = plan(
        &a,
        &key("t"),
        None,
        Some(&r),
        None,
        Binding::Tenants,
        RefTime::from_nanos(20),
    )
    .expect("kept");
    assert_eq!(
        (gone.intent, gone.version, gone.held, gone.state),
        (Intent::Local, 7, None, DeliveryState::Local)
    );
    assert_eq!(action(&gone), None);
    // The store learns of the pack (an operator cancels it by name, or
    // pushes it): it is the store's now.
    let known = cancelled(pack("t", 7, TargetsRow::Nobody));
    let w = plan(
        &a,
        &key("t"),
        Some(&known),
        Some(&r),
        h(7),
        Binding::Tenants,
        RefTime::from_nanos(30),
    )
    .unwrap();
    assert_eq!(action(&w), Some(Action::Cancel(7)));
}

#[test]
fn a_withdrawal_of_a_pack_the_store_lost_stays() {
    let a = agent("a1", &["t"], &[]);
    let known = cancelled(pack("t", 7, TargetsRow::Nobody));
    let w = fresh(&a, Some(&known), h(7), Binding::Tenants).unwrap();
    let r = plan(
        &a,
        &key("t"),
        None,
        Some(&w),
        h(7),
        Binding::Tenants,
        RefTime::from_nanos(30),
    )
    .unwrap();
    assert_eq!((r.intent, r.version), (Intent::Withdraw, 7));
    assert_eq!(action(&r), Some(Action::Cancel(7)));
}

// ---------------------------------------------------------------------------
// plan: refusals, attempts, updated_ns.

#[test]
fn a_refusal_counts_only_for_the_version_it_refused() {
    let a = agent("a1", &["t"], &[]);
    let r = refused(&a, &pack("t", 3, ids(&["a1"])), refusal(3, true));
    let newer = pack("t", 4, ids(&["a1"]));
    let n = plan(
        &a,
        &key("t"),
        Some(&newer),
        Some(&r),
        None,
        Binding::Tenants,
        RefTime::from_nanos(30),
    )
    .unwrap();
    assert_eq!(
        (n.version, n.state, n.refusal.clone()),
        (4, DeliveryState::Pending, None)
    );
    assert_eq!(n.errors(), []);
    assert_eq!(action(&n), Some(Action::Push(4)));
}

#[test]
fn a_refusal_is_over_once_the_agent_holds_that_version() {
    let a = agent("a1", &["t"], &[]);
    let p = pack("t", 3, ids(&["a1"]));
    for last in [true, false] {
        let r = refused(&a, &p, refusal(3, last));
        let acked = answered(
            &a,
            Some(&p),
            &r,
            3,
            &Answer::Acked,
            1,
            Binding::Tenants,
            RefTime::from_nanos(30),
        )
        .unwrap();
        assert_eq!(
            (acked.state, acked.refusal.clone()),
            (DeliveryState::Acked, None)
        );
        // It drops it later: pushed again, not nacked for a stale reason.
        let dropped = plan(
            &a,
            &key("t"),
            Some(&p),
            Some(&acked),
            None,
            Binding::Tenants,
            RefTime::from_nanos(40),
        )
        .unwrap();
        assert_eq!(
            (dropped.state, dropped.reason.as_str()),
            (DeliveryState::Pending, "")
        );
        assert_eq!(action(&dropped), Some(Action::Push(3)));
    }
}

#[test]
fn attempts_last_while_the_version_does() {
    let a = agent("a1", &["t"], &[]);
    let p = pack("t", 3, ids(&["a1"]));
    let row = fresh(&a, Some(&p), None, Binding::Tenants).unwrap();
    let r = answered(
        &a,
        Some(&p),
        &row,
        3,
        &Answer::Refused(refusal(3, false)),
        4,
        Binding::Tenants,
        RefTime::from_nanos(20),
    )
    .unwrap();
    assert_eq!(r.attempts, 4);
    // Fewer attempts reported later: the count never goes back.
    let r = answered(
        &a,
        Some(&p),
        &r,
        3,
        &Answer::Refused(refusal(3, false)),
        2,
        Binding::Tenants,
        RefTime::from_nanos(30),
    )
    .unwrap();
    assert_eq!(r.attempts, 4);
    let same = plan(
        &a,
        &key("t"),
        Some(&p),
        Some(&r),
        None,
        Binding::Tenants,
        RefTime::from_nanos(40),
    )
    .unwrap();
    assert_eq!(same.attempts, 4);
    let newer = pack("t", 4, ids(&["a1"]));
    let n = plan(
        &a,
        &key("t"),
        Some(&newer),
        Some(&r),
        None,
        Binding::Tenants,
        RefTime::from_nanos(50),
    )
    .unwrap();
    assert_eq!(n.attempts, 0);
}

#[test]
fn updated_ns_moves_only_when_the_row_changes() {
    let a = agent("a1", &["t"], &[]);
    let p = pack("t", 3, ids(&["a1"]));
    let row = fresh(&a, Some(&p), None, Binding::Tenants).unwrap();
    let same = plan(
        &a,
        &key("t"),
        Some(&p),
        Some(&row),
        None,
        Binding::Tenants,
        RefTime::from_nanos(99),
    )
    .unwrap();
    assert_eq!(same, row);
    let held = plan(
        &a,
        &key("t"),
        Some(&p),
        Some(&row),
        h(3),
        Binding::Tenants,
        RefTime::from_nanos(99),
    )
    .unwrap();
    assert_eq!(held.updated.as_nanos(), 99);
    let same = answered(
        &a,
        Some(&p),
        &held,
        3,
        &Answer::Acked,
        0,
        Binding::Tenants,
        RefTime::from_nanos(120),
    )
    .unwrap();
    assert_eq!(same, held);
}

// ---------------------------------------------------------------------------
// answered.

#[test]
fn an_answer_about_another_version_records_no_refusal() {
    let a = agent("a1", &["t"], &[]);
    let p = pack("t", 3, ids(&["a1"]));
    let row = fresh(&a, Some(&p), h(1), Binding::Tenants).unwrap();
    let r = answered(
        &a,
        Some(&p),
        &row,
        2,
        &Answer::Refused(refusal(2, true)),
        9,
        Binding::Tenants,
        RefTime::from_nanos(20),
    )
    .unwrap();
    assert_eq!(r, row, "nothing changed, not even attempts");
    // An ack of it says what the agent holds now.
    let r = answered(
        &a,
        Some(&p),
        &row,
        2,
        &Answer::Acked,
        9,
        Binding::Tenants,
        RefTime::from_nanos(30),
    )
    .unwrap();
    assert_eq!(
        (r.held, r.state, r.attempts),
        (h(2), DeliveryState::Pending, 0)
    );
    assert_eq!(action(&r), Some(Action::Push(3)));
}

#[test]
fn a_late_ack_of_a_withdrawn_pack_is_cancelled() {
    let a = agent("a1", &["t"], &[]);
    let p = pack("t", 3, ids(&["a1"]));
    let row = fresh(&a, Some(&p), None, Binding::Tenants).unwrap();
    let gone = cancelled(p);
    let w = plan(
        &a,
        &key("t"),
        Some(&gone),
        Some(&row),
        None,
        Binding::Tenants,
        RefTime::from_nanos(20),
    )
    .unwrap();
    let r = answered(
        &a,
        Some(&gone),
        &w,
        3,
        &Answer::Acked,
        1,
        Binding::Tenants,
        RefTime::from_nanos(30),
    )
    .unwrap();
    assert_eq!(action(&r), Some(Action::Cancel(3)));
}

// ---------------------------------------------------------------------------
// Property tests.

const IDS: [&str; 4] = ["a0", "a1", "a2", "a3"];
const TENANTS: [&str; 3] = ["t0", "t1", "t2"];
const KEYS: [&str; 3] = ["k0", "k1", "k2"];
const VALUES: [&str; 2] = ["v0", "v1"];

fn text(from: &'static [&'static str]) -> impl Strategy<Value = String> {
    select(from).prop_map(str::to_owned)
}

fn own_labels() -> impl Strategy<Value = BTreeMap<String, String>> {
    prop::collection::btree_map(text(&KEYS), text(&VALUES), 0..=3)
}

fn agents() -> impl Strategy<Value = AgentRow> {
    (
        text(&IDS),
        own_labels(),
        prop::collection::btree_map(
            text(&TENANTS),
            prop::collection::btree_map(text(&KEYS), prop::option::of(text(&VALUES)), 0..=2),
            0..=2,
        ),
        prop::collection::btree_set(text(&TENANTS), 0..=3),
    )
        .prop_map(|(id, labels, overrides, tenants)| {
            let mut a = AgentRow::new(id, "j1");
            a.labels = labels;
            a.overrides = overrides;
            a.tenants = tenants;
            a
        })
}

fn targets() -> impl Strategy<Value = TargetsRow> {
    prop_oneof![
        Just(TargetsRow::Nobody),
        prop::collection::vec(select(&["a0", "a1", "a2", "a3", "ghost"][..]), 0..=3)
            .prop_map(|ids| TargetsRow::Agents(ids.into_iter().map(str::to_owned).collect())),
        own_labels().prop_map(TargetsRow::Labels),
    ]
}

fn packs() -> impl Strategy<Value = PackTargets> {
    (
        text(&TENANTS),
        1..6_u64,
        targets(),
        any::<bool>(),
        prop::collection::btree_map(text(&IDS), 0..6_u64, 0..=2),
    )
        .prop_map(
            |(tenant, latest, targets, cancelled, stopped)| PackTargets {
                tenant,
                pack: "p".into(),
                latest,
                targets,
                cancelled: cancelled.then_some(RefTime::from_nanos(7)),
                gate: None,
                stopped,
            },
        )
}

fn bindings() -> impl Strategy<Value = Binding> {
    prop_oneof![Just(Binding::Open), Just(Binding::Tenants)]
}

fn helds() -> impl Strategy<Value = Option<Held>> {
    prop::option::of(
        (1..8_u64, any::<bool>()).prop_map(|(version, stopped)| Held { version, stopped }),
    )
}

fn answers() -> impl Strategy<Value = (u64, Answer)> {
    (
        1..8_u64,
        prop_oneof![Just(None), any::<bool>().prop_map(Some),],
    )
        .prop_map(|(version, refused)| {
            let answer = match refused {
                None => Answer::Acked,
                Some(last) => Answer::Refused(refusal(version, last)),
            };
            (version, answer)
        })
}

/// A row as history may have left it: planned for an earlier state of
/// the pack (or none), then maybe answered.
fn histories() -> impl Strategy<Value = (Option<PackTargets>, Option<Held>, Option<(u64, Answer)>)>
{
    (
        prop::option::of(packs()),
        helds(),
        prop::option::of(answers()),
    )
}

fn prior(
    a: &AgentRow,
    k: &PackKey,
    b: Binding,
    (before, held, answer): (Option<PackTargets>, Option<Held>, Option<(u64, Answer)>),
) -> Option<DeliveryRow> {
    let before = before.map(|p| PackTargets {
        tenant: k.tenant.clone(),
        ..p
    });
    let row = plan(
        a,
        k,
        before.as_ref(),
        None,
        held,
        b,
        RefTime::from_nanos(10),
    )?;
    match answer {
        Some((v, ans)) => answered(
            a,
            before.as_ref(),
            &row,
            v,
            &ans,
            1,
            b,
            RefTime::from_nanos(20),
        ),
        None => Some(row),
    }
}

/// The rules' words, written again without the model's helpers: a live
/// pack is wanted at its latest version by an agent serving its tenant
/// (any agent on an open controller) that its targets name, or whose
/// labels for that tenant (the tenant's operator labels over the agent's
/// own; `None` hides) carry every targeted label, unless an operator
/// withdrew that version or a newer one from it.
fn oracle_wanted(a: &AgentRow, p: &PackTargets, b: Binding) -> Option<u64> {
    if p.cancelled.is_some() {
        return None;
    }
    if b == Binding::Tenants && !a.tenants.iter().any(|t| *t == p.tenant) {
        return None;
    }
    let label = |k: &str| -> Option<&String> {
        match a.overrides.get(&p.tenant).and_then(|o| o.get(k)) {
            Some(set) => set.as_ref(),
            None => a.labels.get(k),
        }
    };
    let hit = match &p.targets {
        TargetsRow::Nobody => false,
        TargetsRow::Agents(ids) => ids.contains(&a.id),
        TargetsRow::Labels(want) => want.iter().all(|(k, v)| label(k) == Some(v)),
    };
    // Withdrawn from this agent by an operator: only a newer version.
    let stopped = p.stopped.get(&a.id).is_some_and(|&s| p.latest <= s);
    (hit && !stopped).then_some(p.latest)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn wanted_is_the_oracle(a in agents(), p in packs(), b in bindings()) {
        prop_assert_eq!(wanted(&a, &p, None, b), oracle_wanted(&a, &p, b));
    }

    /// Over a whole fleet: the agents a pack is wanted by are exactly the
    /// oracle's.
    #[test]
    fn a_fleet_wants_what_the_oracle_says(
        fleet in prop::collection::vec(agents(), 1..8),
        p in packs(),
        b in bindings(),
    ) {
        let got: BTreeSet<String> = fleet.iter().filter(|a| wanted(a, &p, None, b).is_some()).map(|a| a.id.clone()).collect();
        let want: BTreeSet<String> = fleet.iter().filter(|a| oracle_wanted(a, &p, b).is_some()).map(|a| a.id.clone()).collect();
        prop_assert_eq!(got, want);
    }

    /// Whatever the history, the pack and what the agent holds: a push is
    /// always of the latest version of a pack that wants the agent, and
    /// higher than anything it holds; a cancel only ever names what it
    /// holds; the row agrees with `wanted`.
    #[test]
    fn actions_never_go_back(
        a in agents(),
        p in prop::option::of(packs()),
        history in histories(),
        held in helds(),
        b in bindings(),
    ) {
        let k = PackKey::new(p.as_ref().map_or("t0", |p| p.tenant.as_str()), "p");
        let row = prior(&a, &k, b, history);
        let Some(next) = plan(&a, &k, p.as_ref(), row.as_ref(), held, b, RefTime::from_nanos(30)) else {
            prop_assert!(held.is_none(), "a held pack always has a row");
            return Ok(());
        };
        prop_assert_eq!(next.held, held);
        let want = p.as_ref().and_then(|p| wanted(&a, p, None, b));
        match action(&next) {
            Some(Action::Push(v)) => {
                prop_assert_eq!(Some(v), want);
                prop_assert!(held.is_none_or(|h| h.version < v), "pushes v{} over {:?}", v, held);
            }
            Some(Action::Cancel(v)) => {
                prop_assert_eq!(Some(v), held.map(|h| h.version));
                prop_assert_eq!(want, None);
            }
            // No gate here: nothing is staged.
            Some(a @ (Action::Stage(_) | Action::Switch(..))) => {
                prop_assert!(false, "{:?} without a rollout", a);
            }
            None => {}
        }
        if let Some(v) = want {
            prop_assert_eq!((next.intent, next.version), (Intent::Hold, v));
        }
        // Planned again with nothing new: the same row, the same instant.
        let again = plan(&a, &k, p.as_ref(), Some(&next), held, b, RefTime::from_nanos(40));
        prop_assert_eq!(again.as_ref(), Some(&next));
    }

    /// After a cancel, every row of an agent holding the pack cancels it.
    #[test]
    fn a_cancel_reaches_every_holder(
        a in agents(),
        p in packs(),
        history in histories(),
        held in (1..8_u64, any::<bool>()).prop_map(|(version, stopped)| Held { version, stopped }),
        b in bindings(),
    ) {
        let k = PackKey::new(&p.tenant, "p");
        let row = prior(&a, &k, b, history);
        let gone = PackTargets { cancelled: Some(RefTime::from_nanos(99)), ..p };
        let next = plan(&a, &k, Some(&gone), row.as_ref(), Some(held), b, RefTime::from_nanos(30)).unwrap();
        prop_assert_eq!(next.intent, Intent::Withdraw);
        prop_assert_eq!(action(&next), Some(Action::Cancel(held.version)));
        // Its late ack of any version is cancelled too.
        let acked = answered(&a, Some(&gone), &next, held.version + 1, &Answer::Acked, 1, b, RefTime::from_nanos(40)).unwrap();
        prop_assert_eq!(action(&acked), Some(Action::Cancel(held.version + 1)));
    }

    /// A refusal (final or not) of one version never holds back another:
    /// a newer version that wants the agent is pushed.
    #[test]
    fn a_refusal_counts_for_its_version_only(
        a in agents(),
        p in packs(),
        last in any::<bool>(),
        held in prop::option::of(1..3_u64),
        b in bindings(),
    ) {
        let mut a = a;
        a.tenants.insert(p.tenant.clone());
        let p = PackTargets { cancelled: None, targets: TargetsRow::Agents(vec![a.id.clone()]), stopped: BTreeMap::new(), ..p };
        let k = PackKey::new(&p.tenant, "p");
        let held = held.map(|version| Held { version, stopped: false }).filter(|h| h.version < p.latest);
        let row = plan(&a, &k, Some(&p), None, held, b, RefTime::from_nanos(10)).unwrap();
        let no = answered(&a, Some(&p), &row, p.latest, &Answer::Refused(refusal(p.latest, last)), 1, b, RefTime::from_nanos(20)).unwrap();
        prop_assert_eq!(no.state, if last { DeliveryState::Nacked } else { DeliveryState::Pending });
        let newer = PackTargets { latest: p.latest + 1, ..p.clone() };
        let next = plan(&a, &k, Some(&newer), Some(&no), held, b, RefTime::from_nanos(30)).unwrap();
        prop_assert_eq!(&next.refusal, &None);
        prop_assert_eq!(next.state, DeliveryState::Pending);
        prop_assert_eq!(action(&next), Some(Action::Push(p.latest + 1)));
        // An answer about the refused version now changes nothing.
        let late = answered(&a, Some(&newer), &next, p.latest, &Answer::Refused(refusal(p.latest, true)), 5, b, RefTime::from_nanos(40)).unwrap();
        prop_assert_eq!(late, next);
    }
}
