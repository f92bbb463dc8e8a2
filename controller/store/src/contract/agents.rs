//! The contract on agents: hellos, fencing, sightings, clocks, lists, labels, grants, forgetting.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::collections::BTreeMap;

use baton_model::{RefTime, SpanNanos, time};

use crate::*;

use super::fixtures::*;

// ---------------------------------------------------------------------------
// Agents.

/// A hello creates the agent, updates it later (own labels replaced, clock
/// and operator state kept), replaces its certificate's tenants when it
/// carries a certificate, and plans the agent against its own labels.
pub async fn hello_creates_and_updates(s: &dyn Store, _: Binding) {
    assert_eq!(s.agent("a1").await.unwrap(), None);
    let (a, rows) = s
        .agent_hello(hello_in("a1", &["t"], &[("line", "3")], 100))
        .await
        .unwrap();
    let mut want = AgentRow::new("a1", "j-a1");
    want.labels = labels(&[("line", "3")]);
    want.agent_version = "1.0.0".into();
    want.connected = true;
    want.arch = "x86_64".into();
    want.last_seen = RefTime::from_nanos(100);
    want.tenants = set(&["t"]);
    want.session_gen = 1;
    // Which replica took the hello is the engine's to say.
    want.owner = a.owner.clone();
    assert_eq!(a, want);
    assert!(rows.is_empty());
    assert_eq!(s.agent("a1").await.unwrap(), Some(want.clone()));

    // Own labels are what label targets match.
    let changed = push(s, pack("t", "p", 1, to_labels(&[("line", "3")])), 110).await;
    assert_eq!(brief(&changed), [b("a1", "t/p", 1, Hold, Pending)]);

    // A later hello: labels replaced (the pack withdrawn), version and
    // journal updated, a hello without a certificate leaves the tenants,
    // the clock stays, connected again.
    s.record_clock("a1", 1, clock(50)).await.unwrap();
    s.agent_seen("a1", 1, SeenRow::ended(RefTime::from_nanos(150)))
        .await
        .unwrap();
    let mut h = hello("a1", 200);
    h.labels = labels(&[("site", "n")]);
    h.agent_version = "1.1.0".into();
    h.journal_id = "j2".into();
    let (a, rows) = s.agent_hello(h).await.unwrap();
    want.labels = labels(&[("site", "n")]);
    want.agent_version = "1.1.0".into();
    want.journal_id = "j2".into();
    want.last_seen = RefTime::from_nanos(200);
    want.clock = Some(clock(50));
    want.session_gen = 2;
    assert_eq!(a, want);
    assert_eq!(brief(&rows), [b("a1", "t/p", 1, Withdraw, Cancelled)]);
    assert_eq!(rows, rows_of(s, "a1").await, "a hello returns all its rows");

    // Back on the label: wanted again.
    let (_, rows) = s
        .agent_hello(hello_in("a1", &["t"], &[("line", "3")], 210))
        .await
        .unwrap();
    assert_eq!(brief(&rows), [b("a1", "t/p", 1, Hold, Pending)]);

    // A certificate's tenants are replaced at each hello that has one;
    // grants stay.
    s.grant("a1", "g", true, RefTime::from_nanos(220))
        .await
        .unwrap();
    let (a, _) = s
        .agent_hello(hello_in("a1", &["u", "v", "u"], &[], 300))
        .await
        .unwrap();
    assert_eq!(a.tenants, set(&["g", "u", "v"]));
    let (a, _) = s.agent_hello(hello_in("a1", &[], &[], 310)).await.unwrap();
    assert_eq!(a.tenants, set(&["g"]));
    let (a, _) = s.agent_hello(hello("a1", 320)).await.unwrap();
    assert_eq!(a.tenants, set(&["g"]));
    assert_eq!(s.agent("a1").await.unwrap(), Some(a));

    // Another agent is another record.
    s.agent_hello(hello("b2", 330)).await.unwrap();
    assert_eq!(ids(s, AgentFilter::default()).await, ["a1", "b2"]);
    assert_eq!(s.agent("b2").await.unwrap().unwrap().tenants, set(&[]));
}

/// Each hello raises the agent's session generation above the stored one
/// and the one the agent says it has seen; a stream's writes for its agent
/// are refused, with nothing written, once a later hello took it over.
pub async fn stale_streams_are_fenced(s: &dyn Store, _: Binding) {
    let (a, _) = s
        .agent_hello(hello_in("a1", &["t"], &[], 100))
        .await
        .unwrap();
    assert_eq!(a.session_gen, 1);
    let k = key("t", "p");
    push(s, pack("t", "p", 1, to_ids(&["a1"])), 105).await;
    let (a, _) = s
        .agent_hello(hello_in("a1", &["t"], &[], 110))
        .await
        .unwrap();
    assert_eq!(a.session_gen, 2);
    let fenced = |r: StoreResult<()>, what: &str| match r {
        Err(StoreError::Fenced {
            session: 1,
            current: 2,
            ..
        }) => {}
        other => panic!("{what} from the old stream: {other:?}"),
    };
    fenced(
        s.agent_seen("a1", 1, SeenRow::ended(RefTime::from_nanos(120)))
            .await,
        "seen",
    );
    fenced(s.record_clock("a1", 1, clock(120)).await, "clock");
    fenced(
        s.agent_held("a1", 1, vec![held("t", "p", 1)], RefTime::from_nanos(120))
            .await
            .map(drop),
        "held",
    );
    fenced(s.answer(ack("a1", &k, 1, 120)).await.map(drop), "answer");
    let f = fb("a1", "j-a1", 1, 120);
    fenced(
        s.put_feedback(1, vec![f.clone()]).await.map(drop),
        "feedback",
    );
    // Nothing of them was written.
    let a = s.agent("a1").await.unwrap().unwrap();
    assert!(a.connected);
    assert_eq!((a.last_seen.as_nanos(), a.clock.clone()), (110, None));
    assert_eq!(s.feedback_acked("a1", "j-a1").await.unwrap(), 0);
    assert_eq!(
        brief(&rows_of(s, "a1").await),
        [b("a1", "t/p", 1, Hold, Pending)]
    );
    // The owning stream's writes are taken.
    s.record_clock("a1", 2, clock(130)).await.unwrap();
    assert_eq!(s.put_feedback(2, vec![f]).await.unwrap().inserted, 1);
    let mut answer = ack("a1", &k, 1, 130);
    answer.session_gen = 2;
    assert!(s.answer(answer).await.unwrap().is_some());

    // An agent that has seen a higher generation (a store restored from
    // an older copy) is welcomed above it; a lower one changes nothing.
    let mut h = hello_in("a1", &["t"], &[], 140);
    h.session_gen_seen = 40;
    assert_eq!(s.agent_hello(h).await.unwrap().0.session_gen, 41);
    let mut h = hello_in("a1", &["t"], &[], 150);
    h.session_gen_seen = 7;
    assert_eq!(s.agent_hello(h).await.unwrap().0.session_gen, 42);
    // One past what the store keeps is refused, and changes nothing.
    let mut h = hello_in("a1", &["t"], &[], 160);
    h.session_gen_seen = TOO_BIG;
    assert!(s.agent_hello(h).await.is_err());
    assert_eq!(s.agent("a1").await.unwrap().unwrap().session_gen, 42);
}

/// Events and feedback are followed by [`Mark`]: from the start every row
/// once, in order, in pages; from the high water only what comes after.
pub async fn events_page_by_mark(s: &dyn Store, _: Binding) {
    let (events_start, feedback_start) = s.high_water().await.unwrap();
    let ev = |n: i64, kind: EventKind| EventRow {
        id: 0,
        replica: "r1".into(),
        kind,
        agent_id: format!("a{n}"),
        tenant: "t".into(),
        pack: "p".into(),
        detail: format!("d{n}"),
        at: RefTime::from_nanos(n),
    };
    let kinds = [
        EventKind::Delivery,
        EventKind::Connected,
        EventKind::Disconnected,
        EventKind::Clock,
        EventKind::Conflict,
    ];
    s.put_events((1..=5).map(|n| ev(n, kinds[(n - 1) as usize])).collect())
        .await
        .unwrap();
    s.put_events(vec![ev(6, EventKind::Delivery)])
        .await
        .unwrap();
    let (all, end) = followed(6, || s.events_after(events_start, 0)).await;
    assert_eq!(all.len(), 6);
    assert!(all.windows(2).all(|w| w[0].id < w[1].id));
    let mut want = ev(4, EventKind::Clock);
    want.id = all[3].id;
    assert_eq!(all[3], want);
    // Pages of two, each from the mark the one before left.
    let (first, m1) = s.events_after(events_start, 2).await.unwrap();
    assert_eq!(first, all[..2].to_vec());
    let (second, m2) = s.events_after(m1, 2).await.unwrap();
    assert_eq!(second, all[2..4].to_vec());
    assert!(m1 < m2 && m2 <= end);
    // Nothing new after the end, nor after the high water now.
    assert_eq!(s.events_after(end, 0).await.unwrap().0, []);
    let (events_now, _) = s.high_water().await.unwrap();
    assert_eq!(s.events_after(events_now, 0).await.unwrap().0, []);
    s.put_feedback(1, vec![fb("a1", "j1", 1, 10)])
        .await
        .unwrap();
    let (fed, fed_end) = followed(1, || {
        s.feedback_after(feedback_start, FeedbackScope::All, 0)
    })
    .await;
    assert_eq!(
        fed.iter()
            .map(|r| (r.agent_id.as_str(), r.seq))
            .collect::<Vec<_>>(),
        [("a1", 1)]
    );
    assert_eq!(
        s.feedback_after(fed_end, FeedbackScope::All, 0)
            .await
            .unwrap()
            .0,
        []
    );
    let (_, feedback_now) = s.high_water().await.unwrap();
    assert_eq!(
        s.feedback_after(feedback_now, FeedbackScope::All, 0)
            .await
            .unwrap()
            .0,
        []
    );
    assert_eq!(
        s.delete_events_before(RefTime::from_nanos(3), 100)
            .await
            .unwrap(),
        2
    );
    let left = s.events_after(events_start, 0).await.unwrap().0;
    assert_eq!(left, all[2..].to_vec());
    // Ids are not handed out again once the newest went.
    s.delete_events_before(RefTime::from_nanos(i64::MAX), 100)
        .await
        .unwrap();
    s.put_events(vec![ev(7, EventKind::Delivery)])
        .await
        .unwrap();
    let (after, _) = followed(1, || s.events_after(end, 0)).await;
    assert!(after[0].id > all[5].id);
}

/// A revocation is recorded once per serial, with its audit records once,
/// however often (and by however many replicas) it is recorded.
pub async fn revocations_once_per_serial(s: &dyn Store, _: Binding) {
    let rev = |serial: &str, name: &str| RevocationRow {
        serial: serial.into(),
        kind: "agent".into(),
        name: name.into(),
        at: RefTime::from_nanos(5),
    };
    let audited = |serial: &str, tenant: &str| AuditRow {
        at: RefTime::from_nanos(5),
        who: "ca".into(),
        tenant: tenant.into(),
        role: "ca".into(),
        action: "revoke".into(),
        target: format!("agent x (serial {serial})"),
        result: "ok".into(),
    };
    let first = vec![
        (
            rev("0b", "b"),
            vec![audited("0b", "t1"), audited("0b", "t2")],
        ),
        (rev("0a", "a"), vec![audited("0a", "")]),
    ];
    assert_eq!(s.revoke(first.clone()).await.unwrap(), ["0b", "0a"]);
    // Again (a restart, another replica): nothing new, nothing audited.
    let mut again = first;
    again.push((rev("0c", "c"), vec![audited("0c", "t1")]));
    assert_eq!(s.revoke(again).await.unwrap(), ["0c"]);
    let list = s.revocations().await.unwrap();
    assert_eq!(
        list.iter().map(|r| r.serial.as_str()).collect::<Vec<_>>(),
        ["0a", "0b", "0c"]
    );
    assert_eq!(list[1], rev("0b", "b"));
    assert_eq!(
        s.audit(None, RefTime::from_nanos(0), 100)
            .await
            .unwrap()
            .len(),
        4
    );
}

/// Connection state and last-seen; start-up marks everyone disconnected
/// and keeps last-seen; an unknown agent is an error and not created.
pub async fn agent_seen_and_all_disconnected(s: &dyn Store, _: Binding) {
    s.agent_hello(hello("a1", 100)).await.unwrap();
    s.agent_hello(hello("b2", 110)).await.unwrap();
    s.agent_seen("a1", 1, SeenRow::ended(RefTime::from_nanos(150)))
        .await
        .unwrap();
    let a = s.agent("a1").await.unwrap().unwrap();
    assert_eq!((a.connected, a.last_seen.as_nanos()), (false, 150));
    let sick = StreamHealth {
        outbox_entries: 4_000,
        outbox_growing: true,
        late_recently: true,
    };
    let measured = SeenRow {
        lateness_p99: Some(SignedDuration::from_nanos(2_500)),
        health: Some(sick),
        ..seen_live(155)
    };
    s.agent_seen("a1", 1, measured).await.unwrap();
    s.agent_seen("a1", 1, seen_live(160)).await.unwrap();
    let a = s.agent("a1").await.unwrap().unwrap();
    assert_eq!((a.connected, a.last_seen.as_nanos()), (true, 160));
    assert_eq!(a.lateness_p99.nanos(), 2_500, "kept when not given");
    assert_eq!(a.health, sick, "kept when not given");
    let well = SeenRow {
        health: Some(StreamHealth::default()),
        ..seen_live(161)
    };
    s.agent_seen("a1", 1, well).await.unwrap();
    let a = s.agent("a1").await.unwrap().unwrap();
    assert_eq!(a.health, StreamHealth::default());
    assert_eq!(a.lateness_p99.nanos(), 2_500);
    let r = s
        .agent_seen(
            "a1",
            1,
            SeenRow {
                health: Some(StreamHealth {
                    outbox_entries: u64::MAX,
                    ..sick
                }),
                ..seen_live(162)
            },
        )
        .await;
    assert!(matches!(r, Err(StoreError::OutOfRange { .. })), "{r:?}");

    s.all_disconnected().await.unwrap();
    let all = s.agents(AgentFilter::default()).await.unwrap();
    let got: Vec<(String, bool, i64)> = all
        .iter()
        .map(|a| (a.id.clone(), a.connected, a.last_seen.as_nanos()))
        .collect();
    assert_eq!(got, [("a1".into(), false, 161), ("b2".into(), false, 110)]);

    assert!(s.agent_seen("ghost", 1, seen_live(1)).await.is_err());
    assert_eq!(s.agent("ghost").await.unwrap(), None);
    assert_eq!(ids(s, AgentFilter::default()).await, ["a1", "b2"]);
}

/// What an agent checks packs against: as its hello says (nothing: an
/// older agent, `None` again), then as each report says, from its current
/// stream only; an agent never heard of is refused, nothing created.
pub async fn trust_said_at_hello_and_after(s: &dyn Store, _: Binding) {
    let said = TrustRow {
        root: true,
        list_version: 2,
        list_expires_ns: 9_000,
        signed_tenants: vec!["t".into()],
        nothing_runs: String::new(),
        refused: String::new(),
    };
    let mut h = hello("a1", 1);
    h.trust = Some(said.clone());
    let (a, _) = s.agent_hello(h).await.unwrap();
    assert_eq!(a.trust, Some(said.clone()));
    assert_eq!(s.agent("a1").await.unwrap().unwrap().trust, Some(said));

    let later = TrustRow {
        list_version: 3,
        refused: "list 4: not signed by the root".into(),
        ..TrustRow::default()
    };
    s.record_trust("a1", 1, later.clone()).await.unwrap();
    let a = s.agent("a1").await.unwrap().unwrap();
    assert_eq!(a.trust, Some(later.clone()));
    assert_eq!(a.session_gen, 1, "a report is no hello");

    // A later stream took the agent: the old one's report is fenced.
    s.agent_hello(hello("a1", 2)).await.unwrap();
    let stale = s.record_trust("a1", 1, TrustRow::default()).await;
    assert!(matches!(stale, Err(StoreError::Fenced { .. })), "{stale:?}");
    // That hello said nothing of its trust (an older agent): not known.
    assert_eq!(s.agent("a1").await.unwrap().unwrap().trust, None);

    let unknown = s.record_trust("zz", 1, later).await;
    assert!(
        matches!(unknown, Err(StoreError::NoSuchAgent { .. })),
        "{unknown:?}"
    );
    assert_eq!(s.agent("zz").await.unwrap(), None);
}

/// The latest report is the newest measured; the history keeps each
/// instant once (the first report of it), newest `limit`, oldest first.
pub async fn clock_latest_and_history(s: &dyn Store, _: Binding) {
    s.agent_hello(hello("a1", 1)).await.unwrap();
    s.agent_hello(hello("b2", 1)).await.unwrap();
    s.record_clock("a1", 1, clock(30)).await.unwrap();
    // Older, measured before: history only.
    s.record_clock("a1", 1, clock(10)).await.unwrap();
    s.record_clock("a1", 1, clock(20)).await.unwrap();
    // Re-sent with other values: changes nothing.
    let resent = ClockRow {
        offset: time::span(999),
        ..clock(30)
    };
    s.record_clock("a1", 1, resent).await.unwrap();
    s.record_clock("b2", 1, clock(25)).await.unwrap();

    assert_eq!(s.agent("a1").await.unwrap().unwrap().clock, Some(clock(30)));
    assert_eq!(
        s.clock_history("a1", RefTime::from_nanos(0), 0)
            .await
            .unwrap(),
        [clock(10), clock(20), clock(30)]
    );
    assert_eq!(
        s.clock_history("a1", RefTime::from_nanos(20), 0)
            .await
            .unwrap(),
        [clock(20), clock(30)]
    );
    assert_eq!(
        s.clock_history("a1", RefTime::from_nanos(0), 2)
            .await
            .unwrap(),
        [clock(20), clock(30)],
        "the newest 2, oldest first"
    );
    assert_eq!(
        s.clock_history("a1", RefTime::from_nanos(31), 0)
            .await
            .unwrap(),
        []
    );
    assert_eq!(
        s.clock_history("b2", RefTime::from_nanos(0), 0)
            .await
            .unwrap(),
        [clock(25)]
    );

    // Newer: the latest moves.
    s.record_clock("a1", 1, clock(40)).await.unwrap();
    assert_eq!(s.agent("a1").await.unwrap().unwrap().clock, Some(clock(40)));

    assert!(s.record_clock("ghost", 1, clock(1)).await.is_err());
    assert_eq!(
        s.clock_history("ghost", RefTime::from_nanos(0), 0)
            .await
            .unwrap(),
        []
    );
    assert_eq!(s.agent("ghost").await.unwrap(), None);
}

/// Pages of agents by id; the tenant filter follows the binding.
pub async fn agents_paging(s: &dyn Store, binding: Binding) {
    s.agent_hello(hello_in("a1", &["t"], &[], 1)).await.unwrap();
    s.agent_hello(hello_in("a2", &["u"], &[], 1)).await.unwrap();
    s.agent_hello(hello_in("a3", &["t", "u"], &[], 1))
        .await
        .unwrap();
    s.agent_hello(hello("a4", 1)).await.unwrap();
    s.grant("a5", "t", true, RefTime::from_nanos(1))
        .await
        .unwrap();
    s.agent_hello(hello("a5", 1)).await.unwrap();
    // Granted, never said hello: not an agent yet.
    s.grant("g0", "t", true, RefTime::from_nanos(1))
        .await
        .unwrap();
    s.label_agent(
        "a3",
        "t",
        [("x".into(), Some("1".into()))].into(),
        Vec::new(),
        RefTime::from_nanos(2),
    )
    .await
    .unwrap();

    let page = |tenant: Option<&str>, after: Option<&str>, limit: u32| AgentFilter {
        tenant: tenant.map(str::to_owned),
        after_id: after.map(str::to_owned),
        limit,
        ..AgentFilter::default()
    };
    assert_eq!(
        ids(s, page(None, None, 0)).await,
        ["a1", "a2", "a3", "a4", "a5"]
    );
    assert_eq!(ids(s, page(None, None, 2)).await, ["a1", "a2"]);
    assert_eq!(ids(s, page(None, Some("a2"), 2)).await, ["a3", "a4"]);
    assert_eq!(ids(s, page(None, Some("a4"), 2)).await, ["a5"]);
    assert_eq!(
        ids(s, page(None, Some("a5"), 2)).await,
        Vec::<String>::new()
    );
    assert_eq!(ids(s, page(None, Some("a"), 1)).await, ["a1"]);

    let (of_t, of_t_after_a1, of_nobody): (&[&str], &[&str], &[&str]) = match binding {
        Binding::Tenants => (&["a1", "a3", "a5"], &["a3"], &[]),
        Binding::Open => (
            &["a1", "a2", "a3", "a4", "a5"],
            &["a2"],
            &["a1", "a2", "a3", "a4", "a5"],
        ),
    };
    assert_eq!(ids(s, page(Some("t"), None, 0)).await, of_t);
    assert_eq!(ids(s, page(Some("t"), Some("a1"), 1)).await, of_t_after_a1);
    assert_eq!(ids(s, page(Some("nobody"), None, 0)).await, of_nobody);

    // Listed rows are whole: operator labels and tenants attached.
    for a in s.agents(page(None, None, 0)).await.unwrap() {
        assert_eq!(Some(&a), s.agent(&a.id).await.unwrap().as_ref());
    }
    let a3 = s.agent("a3").await.unwrap().unwrap();
    assert_eq!(a3.tenants, set(&["t", "u"]));
    assert_eq!(a3.overrides["t"]["x"], Some("1".into()));
    assert_eq!(s.agent("a5").await.unwrap().unwrap().tenants, set(&["t"]));
}

/// One tenant's operator labels: set over the agent's own, hide one of
/// its own, reset back to its own; each change re-plans the agent, only
/// for that tenant's packs; they outlive hellos.
pub async fn labels_set_hide_reset(s: &dyn Store, _: Binding) {
    let own = [("line", "3"), ("site", "n")];
    s.agent_hello(hello_in("a1", &["t", "u"], &own, 10))
        .await
        .unwrap();
    assert_eq!(
        push(s, pack("t", "p", 1, to_labels(&[("line", "4")])), 20).await,
        []
    );
    let changed = push(s, pack("t", "q", 1, to_labels(&[("site", "n")])), 30).await;
    assert_eq!(brief(&changed), [b("a1", "t/q", 1, Hold, Pending)]);
    let changed = push(s, pack("u", "r", 1, to_labels(&[("line", "3")])), 40).await;
    assert_eq!(brief(&changed), [b("a1", "u/r", 1, Hold, Pending)]);

    // Set: over the agent's own, for this tenant only.
    let (a, changed) = s
        .label_agent(
            "a1",
            "t",
            [("line".into(), Some("4".into()))].into(),
            Vec::new(),
            RefTime::from_nanos(50),
        )
        .await
        .unwrap();
    assert_eq!(a.labels, labels(&own), "its own labels stay");
    assert_eq!(*a.labels_for("t"), labels(&[("line", "4"), ("site", "n")]));
    assert_eq!(*a.labels_for("u"), labels(&own));
    assert_eq!(
        a.overrides,
        [(
            "t".to_string(),
            [("line".to_string(), Some("4".to_string()))].into()
        )]
        .into()
    );
    assert_eq!(brief(&changed), [b("a1", "t/p", 1, Hold, Pending)]);
    assert_eq!(changed[0].updated.as_nanos(), 50);

    // Hide one of its own.
    let (a, changed) = s
        .label_agent(
            "a1",
            "t",
            [("site".into(), None)].into(),
            Vec::new(),
            RefTime::from_nanos(60),
        )
        .await
        .unwrap();
    assert_eq!(*a.labels_for("t"), labels(&[("line", "4")]));
    assert_eq!(brief(&changed), [b("a1", "t/q", 1, Withdraw, Cancelled)]);
    assert_eq!(s.agent("a1").await.unwrap(), Some(a.clone()));

    // They outlive a hello.
    let (again, rows) = s
        .agent_hello(hello_in("a1", &["t", "u"], &own, 70))
        .await
        .unwrap();
    assert_eq!(again.overrides, a.overrides);
    assert_eq!(
        brief(&rows),
        [
            b("a1", "t/p", 1, Hold, Pending),
            b("a1", "t/q", 1, Withdraw, Cancelled),
            b("a1", "u/r", 1, Hold, Pending),
        ]
    );

    // Reset: back to its own.
    let (a, changed) = s
        .label_agent(
            "a1",
            "t",
            BTreeMap::new(),
            vec!["line".into(), "site".into()],
            RefTime::from_nanos(80),
        )
        .await
        .unwrap();
    assert!(a.overrides.is_empty(), "{:?}", a.overrides);
    assert_eq!(*a.labels_for("t"), labels(&own));
    assert_eq!(
        brief(&changed),
        [
            b("a1", "t/p", 1, Withdraw, Cancelled),
            b("a1", "t/q", 1, Hold, Pending),
        ]
    );

    // Set and reset of one key in one call: the reset comes after.
    let (a, changed) = s
        .label_agent(
            "a1",
            "t",
            [("line".into(), Some("4".into()))].into(),
            vec!["line".into()],
            RefTime::from_nanos(90),
        )
        .await
        .unwrap();
    assert!(a.overrides.is_empty());
    assert_eq!(changed, []);

    let r = s
        .label_agent(
            "ghost",
            "t",
            BTreeMap::new(),
            Vec::new(),
            RefTime::from_nanos(100),
        )
        .await;
    assert!(
        matches!(&r, Err(StoreError::NoSuchAgent { id }) if id == "ghost"),
        "{r:?}"
    );
    assert_eq!(s.agent("ghost").await.unwrap(), None);
}

/// Grants (also before an agent's first hello) add to the tenants it
/// serves; under [`Binding::Tenants`] that decides which packs reach it.
pub async fn grants_replan(s: &dyn Store, binding: Binding) {
    let tenants = binding == Binding::Tenants;
    assert_eq!(
        s.grant("a9", "t", true, RefTime::from_nanos(10))
            .await
            .unwrap(),
        []
    );
    assert_eq!(push(s, pack("t", "p", 1, to_ids(&["a9"])), 20).await, []);
    let (a, rows) = s.agent_hello(hello("a9", 30)).await.unwrap();
    assert_eq!(a.tenants, set(&["t"]));
    assert_eq!(brief(&rows), [b("a9", "t/p", 1, Hold, Pending)]);

    let changed = s
        .grant("a9", "t", false, RefTime::from_nanos(40))
        .await
        .unwrap();
    assert_eq!(s.agent("a9").await.unwrap().unwrap().tenants, set(&[]));
    if tenants {
        assert_eq!(brief(&changed), [b("a9", "t/p", 1, Withdraw, Cancelled)]);
    } else {
        assert_eq!(changed, []);
    }
    let changed = s
        .grant("a9", "t", true, RefTime::from_nanos(50))
        .await
        .unwrap();
    if tenants {
        assert_eq!(brief(&changed), [b("a9", "t/p", 1, Hold, Pending)]);
        assert_eq!(changed[0].updated.as_nanos(), 50);
    } else {
        assert_eq!(changed, []);
    }
    // Twice: nothing more.
    assert_eq!(
        s.grant("a9", "t", true, RefTime::from_nanos(60))
            .await
            .unwrap(),
        []
    );

    // A grant beside the certificate's own tenant: taking it back leaves
    // the certificate's.
    s.agent_hello(hello_in("a8", &["t"], &[], 70))
        .await
        .unwrap();
    push(s, pack("t", "q", 1, to_ids(&["a8"])), 80).await;
    assert_eq!(
        s.grant("a8", "t", true, RefTime::from_nanos(90))
            .await
            .unwrap(),
        []
    );
    assert_eq!(
        s.grant("a8", "t", false, RefTime::from_nanos(100))
            .await
            .unwrap(),
        []
    );
    assert_eq!(s.agent("a8").await.unwrap().unwrap().tenants, set(&["t"]));
    assert_eq!(
        brief(&rows_of(s, "a8").await),
        [b("a8", "t/q", 1, Hold, Pending)]
    );
}

/// Forget a tenant's part (its deliveries, labels and grant) or the whole
/// agent (record, clock history, deliveries, labels, grants); feedback and
/// its journal's acked seq stay.
pub async fn forget_agent_parts(s: &dyn Store, binding: Binding) {
    s.agent_hello(hello_in("a1", &["u"], &[("line", "3")], 10))
        .await
        .unwrap();
    s.grant("a1", "t", true, RefTime::from_nanos(20))
        .await
        .unwrap();
    push(s, pack("t", "p", 1, to_ids(&["a1"])), 30).await;
    push(s, pack("u", "q", 1, to_ids(&["a1"])), 40).await;
    s.label_agent(
        "a1",
        "t",
        [("x".into(), Some("1".into()))].into(),
        Vec::new(),
        RefTime::from_nanos(50),
    )
    .await
    .unwrap();
    s.label_agent(
        "a1",
        "u",
        [("y".into(), Some("2".into()))].into(),
        Vec::new(),
        RefTime::from_nanos(50),
    )
    .await
    .unwrap();
    s.record_clock("a1", 1, clock(60)).await.unwrap();
    let journal = "j-a1";
    s.put_feedback(1, (1..=3).map(|q| fb("a1", journal, q, 70)).collect())
        .await
        .unwrap();
    assert_eq!(
        brief(&rows_of(s, "a1").await),
        [
            b("a1", "t/p", 1, Hold, Pending),
            b("a1", "u/q", 1, Hold, Pending)
        ]
    );

    // A tenant's part.
    assert!(s.forget_agent("a1", Some("t")).await.unwrap());
    let a = s.agent("a1").await.unwrap().unwrap();
    assert_eq!(a.overrides.keys().collect::<Vec<_>>(), ["u"]);
    assert_eq!(a.tenants, set(&["u"]), "the grant is gone");
    assert_eq!(a.clock, Some(clock(60)));
    assert_eq!(
        brief(&rows_of(s, "a1").await),
        [b("a1", "u/q", 1, Hold, Pending)]
    );
    assert_eq!(
        s.clock_history("a1", RefTime::from_nanos(0), 0)
            .await
            .unwrap(),
        [clock(60)]
    );

    // The whole agent.
    assert!(s.forget_agent("a1", None).await.unwrap());
    assert_eq!(s.agent("a1").await.unwrap(), None);
    assert_eq!(rows_of(s, "a1").await, []);
    assert_eq!(
        s.deliveries_of_pack(&key("u", "q"), None, None, 0)
            .await
            .unwrap(),
        []
    );
    assert_eq!(
        s.clock_history("a1", RefTime::from_nanos(0), 0)
            .await
            .unwrap(),
        []
    );
    assert_eq!(ids(s, AgentFilter::default()).await, Vec::<String>::new());
    assert_eq!(all_feedback(s).await.len(), 3, "feedback stays");
    assert_eq!(s.feedback_acked("a1", journal).await.unwrap(), 3);
    assert!(!s.forget_agent("a1", None).await.unwrap());
    assert!(!s.forget_agent("a1", Some("u")).await.unwrap());

    // It may say hello again: a new record, its feedback goes on.
    let (a, rows) = s
        .agent_hello(hello_in("a1", &["u"], &[], 80))
        .await
        .unwrap();
    assert!(a.overrides.is_empty());
    assert_eq!(a.tenants, set(&["u"]));
    assert_eq!(a.clock, None);
    let mut want = vec![b("a1", "u/q", 1, Hold, Pending)];
    if binding == Binding::Open {
        want.insert(0, b("a1", "t/p", 1, Hold, Pending));
    }
    assert_eq!(brief(&rows), want);
    let r = s
        .put_feedback(1, (2..=4).map(|q| fb("a1", journal, q, 90)).collect())
        .await
        .unwrap();
    assert_eq!((r.inserted, r.duplicates, r.acked_seq), (1, 2, 4));
}
