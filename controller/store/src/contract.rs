//! The [`Store`] contract: one conformance suite that every backend runs,
//! after object_store's `integration.rs`. Each `pub async fn`
//! takes a fresh, empty store opened with the [`Binding`] it is given and
//! checks one part of the trait's documented behaviour; a backend's tests
//! call them all through [`contract_suite!`], which makes one
//! `#[tokio::test]` per function and binding:
//!
//! ```ignore
//! fn open(binding: Binding) -> (MyStore, Guard) { ... }
//! crate::contract::contract_suite!(open);
//! ```
//!
//! [`random_equivalence`] is the suite's property test: random sequences
//! of hellos, held sets, labels, grants, pushes, cancels and answers, after
//! each of which the store's rows must equal an oracle that re-plans every
//! (agent, pack) pair from scratch with [`planner::plan`]. That is what
//! proves a backend's shortcuts (an index looked up for only the first
//! label, plans limited to the pairs a change can affect) never miss an
//! agent.
//!
//! The expectations are written from the trait's docs and the planner's
//! rules, never from what a backend happens to do.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use baton_model::{RefTime, SpanNanos, time};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use baton_proto::wire;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use baton_model::planner::{self, Action};

mod rollouts;
pub use rollouts::*;

// ---------------------------------------------------------------------------
// Fixtures.

/// A label map.
pub fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
    kv.iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// A hello with no labels, no certificate and nothing held.
pub fn hello(id: &str, at_ns: i64) -> HelloRow {
    HelloRow {
        id: id.into(),
        labels: BTreeMap::new(),
        agent_version: "1.0.0".into(),
        journal_id: format!("j-{id}"),
        cert_tenants: None,
        held: Vec::new(),
        session_gen_seen: 0,
        at: RefTime::from_nanos(at_ns),
    }
}

/// A hello with a certificate naming `tenants`, and own labels.
pub fn hello_in(id: &str, tenants: &[&str], own: &[(&str, &str)], at_ns: i64) -> HelloRow {
    HelloRow {
        labels: labels(own),
        cert_tenants: Some(tenants.iter().map(|t| (*t).to_owned()).collect()),
        ..hello(id, at_ns)
    }
}

pub fn held(tenant: &str, pack: &str, version: u64) -> HeldPackRow {
    HeldPackRow {
        tenant: tenant.into(),
        pack: pack.into(),
        version,
        stopped: false,
    }
}

pub fn key(tenant: &str, pack: &str) -> PackKey {
    PackKey::new(tenant, pack)
}

pub fn to_ids(ids: &[&str]) -> TargetsRow {
    TargetsRow::Agents(ids.iter().map(|s| (*s).to_owned()).collect())
}

pub fn to_labels(kv: &[(&str, &str)]) -> TargetsRow {
    TargetsRow::Labels(labels(kv))
}

/// Version `version` of `tenant/pack` for `targets`, pushed at `1000 +
/// version`.
pub fn pack(tenant: &str, pack: &str, version: u64, targets: TargetsRow) -> PackVersionRow {
    PackVersionRow {
        tenant: tenant.into(),
        pack: pack.into(),
        version,
        yaml: format!("pack: {pack}\nversion: {version}\n"),
        targets,
        pushed: RefTime::from_nanos(i64::try_from(version).map_or(0, |v| v.saturating_add(1_000))),
        rollout: false,
    }
}

/// Store a new version and plan it, as a push does; the rows that changed.
pub async fn push(s: &dyn Store, p: PackVersionRow, at_ns: i64) -> Vec<DeliveryRow> {
    let k = p.key();
    assert_eq!(s.put_pack(p).await.unwrap(), PutPack::Stored);
    s.reconcile_pack(&k, at_ns).await.unwrap()
}

pub fn ack(agent: &str, k: &PackKey, version: u64, at_ns: i64) -> AnswerRow {
    AnswerRow {
        agent_id: agent.into(),
        key: k.clone(),
        version,
        answer: Answer::Acked,
        attempts: 1,
        session_gen: 1,
        at: RefTime::from_nanos(at_ns),
    }
}

pub fn refusal(version: u64, last: bool, message: &str) -> Refusal {
    Refusal {
        version,
        last,
        message: message.into(),
        errors: Vec::new(),
    }
}

pub fn refuse(agent: &str, k: &PackKey, r: Refusal, at_ns: i64) -> AnswerRow {
    AnswerRow {
        agent_id: agent.into(),
        key: k.clone(),
        version: r.version,
        answer: Answer::Refused(r),
        attempts: 1,
        session_gen: 1,
        at: RefTime::from_nanos(at_ns),
    }
}

/// A row's gist: (agent, `tenant/pack`, version, intent, state).
pub type Brief = (String, String, u64, Intent, DeliveryState);

pub fn b(agent: &str, pack: &str, version: u64, intent: Intent, state: DeliveryState) -> Brief {
    (agent.into(), pack.into(), version, intent, state)
}

/// The gist of rows, by agent then pack.
pub fn brief(rows: &[DeliveryRow]) -> Vec<Brief> {
    let mut out: Vec<Brief> = rows
        .iter()
        .map(|r| {
            (
                r.agent_id.clone(),
                r.key().to_string(),
                r.version,
                r.intent,
                r.state,
            )
        })
        .collect();
    out.sort_by(|x, y| (&x.0, &x.1).cmp(&(&y.0, &y.1)));
    out
}

use DeliveryState::{Acked, Cancelled, Nacked, Pending};
use Intent::{Hold, Local, Withdraw};

async fn rows_of(s: &dyn Store, id: &str) -> Vec<DeliveryRow> {
    s.deliveries_of_agent(id).await.unwrap()
}

async fn row(s: &dyn Store, id: &str, k: &PackKey) -> DeliveryRow {
    rows_of(s, id)
        .await
        .into_iter()
        .find(|r| r.key() == *k)
        .unwrap_or_else(|| panic!("no row of {k} for {id}"))
}

async fn ids(s: &dyn Store, f: AgentFilter) -> Vec<String> {
    s.agents(f)
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.id)
        .collect()
}

pub fn clock(at_ns: i64) -> ClockRow {
    ClockRow {
        source: "ptp".into(),
        state: "locked".into(),
        offset: time::span(-12),
        jitter: time::span(3),
        uncertainty: time::span(250),
        frequency_ppm: 1.25,
        at: RefTime::from_nanos(at_ns),
    }
}

/// Feedback `seq` of `agent`'s journal `journal`, stored at `received_ns`.
pub fn fb(agent: &str, journal: &str, seq: u64, received_ns: i64) -> FeedbackRow {
    let occurrence_ns = 1_796_000_000_000_000_000 + i64::try_from(seq).unwrap_or(0);
    FeedbackRow {
        id: 0,
        agent_id: agent.into(),
        journal_id: journal.into(),
        seq,
        execution_id: format!("t/p/v1/blink/{occurrence_ns}/a1"),
        tenant: "t".into(),
        pack: "p".into(),
        version: 1,
        instruction: "blink".into(),
        occurrence: Some(RefTime::from_nanos(occurrence_ns)),
        attempt: 1,
        scheduled: RefTime::from_nanos(occurrence_ns),
        actual: RefTime::from_nanos(occurrence_ns + 120_000),
        lateness: time::span(120_000),
        outcome: wire::Outcome::Ok,
        reason: wire::Reason::Unspecified,
        event: "executed".into(),
        action: "gpio.write".into(),
        detail: String::new(),
        value: Some(1),
        dropped_before: 0,
        uncertainty: time::span(2_500),
        clock_source: wire::ClockSource::Ptp,
        clock_state: wire::ClockState::Locked,
        received: RefTime::from_nanos(received_ns),
    }
}

async fn all_feedback(s: &dyn Store) -> Vec<FeedbackRow> {
    s.feedback(FeedbackFilter::default()).await.unwrap()
}

/// (agent, journal, seq) of rows, in their order.
fn seqs(rows: &[FeedbackRow]) -> Vec<(String, String, u64)> {
    rows.iter()
        .map(|r| (r.agent_id.clone(), r.journal_id.clone(), r.seq))
        .collect()
}

fn sq(agent: &str, journal: &str, seq: u64) -> (String, String, u64) {
    (agent.into(), journal.into(), seq)
}

pub fn audit_row(at_ns: i64, tenant: &str, target: &str) -> AuditRow {
    AuditRow {
        at: RefTime::from_nanos(at_ns),
        who: "ann".into(),
        tenant: tenant.into(),
        role: "operator".into(),
        action: "push".into(),
        target: target.into(),
        result: "ok".into(),
    }
}

/// Runs futures concurrently on this task (no spawn: they borrow the
/// store), so a batching backend sees them queued together.
pub async fn join_all<F: Future>(futs: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut futs: Vec<Pin<Box<F>>> = futs.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, o) in futs.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *o = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    out.into_iter().map(Option::unwrap).collect()
}

const TOO_BIG: u64 = i64::MAX as u64 + 1;

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
    s.agent_seen("a1", 1, false, 150, None).await.unwrap();
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
    s.grant("a1", "g", true, 220).await.unwrap();
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
    fenced(s.agent_seen("a1", 1, false, 120, None).await, "seen");
    fenced(s.record_clock("a1", 1, clock(120)).await, "clock");
    fenced(
        s.agent_held("a1", 1, vec![held("t", "p", 1)], 120)
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

/// Events between replicas come back in the order stored, by id, one page
/// at a time; the high-water marks say where a follower starts; old ones
/// go.
pub async fn events_page_by_id(s: &dyn Store, _: Binding) {
    assert_eq!(s.high_water().await.unwrap(), (0, 0));
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
    let all = s.events_after(0, 0).await.unwrap();
    assert_eq!(all.len(), 6);
    assert!(all.windows(2).all(|w| w[0].id < w[1].id));
    let mut want = ev(4, EventKind::Clock);
    want.id = all[3].id;
    assert_eq!(all[3], want);
    let page = s.events_after(all[1].id, 2).await.unwrap();
    assert_eq!(page, all[2..4].to_vec());
    assert_eq!(s.high_water().await.unwrap().0, all[5].id);
    s.put_feedback(1, vec![fb("a1", "j1", 1, 10)])
        .await
        .unwrap();
    assert!(s.high_water().await.unwrap().1 > 0);
    assert_eq!(
        s.delete_events_before(RefTime::from_nanos(3), 100)
            .await
            .unwrap(),
        2
    );
    let left = s.events_after(0, 0).await.unwrap();
    assert_eq!(left, all[2..].to_vec());
    // Ids are not handed out again once the newest went.
    s.delete_events_before(RefTime::from_nanos(i64::MAX), 100)
        .await
        .unwrap();
    s.put_events(vec![ev(7, EventKind::Delivery)])
        .await
        .unwrap();
    assert!(s.events_after(0, 0).await.unwrap()[0].id > all[5].id);
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
    assert_eq!(s.audit(None, 0, 100).await.unwrap().len(), 4);
}

/// Connection state and last-seen; start-up marks everyone disconnected
/// and keeps last-seen; an unknown agent is an error and not created.
pub async fn agent_seen_and_all_disconnected(s: &dyn Store, _: Binding) {
    s.agent_hello(hello("a1", 100)).await.unwrap();
    s.agent_hello(hello("b2", 110)).await.unwrap();
    s.agent_seen("a1", 1, false, 150, None).await.unwrap();
    let a = s.agent("a1").await.unwrap().unwrap();
    assert_eq!((a.connected, a.last_seen.as_nanos()), (false, 150));
    s.agent_seen("a1", 1, true, 155, Some(2_500)).await.unwrap();
    s.agent_seen("a1", 1, true, 160, None).await.unwrap();
    let a = s.agent("a1").await.unwrap().unwrap();
    assert_eq!((a.connected, a.last_seen.as_nanos()), (true, 160));
    assert_eq!(a.lateness_p99.nanos(), 2_500, "kept when not given");

    s.all_disconnected().await.unwrap();
    let all = s.agents(AgentFilter::default()).await.unwrap();
    let got: Vec<(String, bool, i64)> = all
        .iter()
        .map(|a| (a.id.clone(), a.connected, a.last_seen.as_nanos()))
        .collect();
    assert_eq!(got, [("a1".into(), false, 160), ("b2".into(), false, 110)]);

    assert!(s.agent_seen("ghost", 1, true, 1, None).await.is_err());
    assert_eq!(s.agent("ghost").await.unwrap(), None);
    assert_eq!(ids(s, AgentFilter::default()).await, ["a1", "b2"]);
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
        s.clock_history("a1", 0, 0).await.unwrap(),
        [clock(10), clock(20), clock(30)]
    );
    assert_eq!(
        s.clock_history("a1", 20, 0).await.unwrap(),
        [clock(20), clock(30)]
    );
    assert_eq!(
        s.clock_history("a1", 0, 2).await.unwrap(),
        [clock(20), clock(30)],
        "the newest 2, oldest first"
    );
    assert_eq!(s.clock_history("a1", 31, 0).await.unwrap(), []);
    assert_eq!(s.clock_history("b2", 0, 0).await.unwrap(), [clock(25)]);

    // Newer: the latest moves.
    s.record_clock("a1", 1, clock(40)).await.unwrap();
    assert_eq!(s.agent("a1").await.unwrap().unwrap().clock, Some(clock(40)));

    assert!(s.record_clock("ghost", 1, clock(1)).await.is_err());
    assert_eq!(s.clock_history("ghost", 0, 0).await.unwrap(), []);
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
    s.grant("a5", "t", true, 1).await.unwrap();
    s.agent_hello(hello("a5", 1)).await.unwrap();
    // Granted, never said hello: not an agent yet.
    s.grant("g0", "t", true, 1).await.unwrap();
    s.label_agent(
        "a3",
        "t",
        [("x".into(), Some("1".into()))].into(),
        Vec::new(),
        2,
    )
    .await
    .unwrap();

    let page = |tenant: Option<&str>, after: Option<&str>, limit: u32| AgentFilter {
        tenant: tenant.map(str::to_owned),
        after_id: after.map(str::to_owned),
        limit,
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
            50,
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
        .label_agent("a1", "t", [("site".into(), None)].into(), Vec::new(), 60)
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
            80,
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
            90,
        )
        .await
        .unwrap();
    assert!(a.overrides.is_empty());
    assert_eq!(changed, []);

    let r = s
        .label_agent("ghost", "t", BTreeMap::new(), Vec::new(), 100)
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
    assert_eq!(s.grant("a9", "t", true, 10).await.unwrap(), []);
    assert_eq!(push(s, pack("t", "p", 1, to_ids(&["a9"])), 20).await, []);
    let (a, rows) = s.agent_hello(hello("a9", 30)).await.unwrap();
    assert_eq!(a.tenants, set(&["t"]));
    assert_eq!(brief(&rows), [b("a9", "t/p", 1, Hold, Pending)]);

    let changed = s.grant("a9", "t", false, 40).await.unwrap();
    assert_eq!(s.agent("a9").await.unwrap().unwrap().tenants, set(&[]));
    if tenants {
        assert_eq!(brief(&changed), [b("a9", "t/p", 1, Withdraw, Cancelled)]);
    } else {
        assert_eq!(changed, []);
    }
    let changed = s.grant("a9", "t", true, 50).await.unwrap();
    if tenants {
        assert_eq!(brief(&changed), [b("a9", "t/p", 1, Hold, Pending)]);
        assert_eq!(changed[0].updated.as_nanos(), 50);
    } else {
        assert_eq!(changed, []);
    }
    // Twice: nothing more.
    assert_eq!(s.grant("a9", "t", true, 60).await.unwrap(), []);

    // A grant beside the certificate's own tenant: taking it back leaves
    // the certificate's.
    s.agent_hello(hello_in("a8", &["t"], &[], 70))
        .await
        .unwrap();
    push(s, pack("t", "q", 1, to_ids(&["a8"])), 80).await;
    assert_eq!(s.grant("a8", "t", true, 90).await.unwrap(), []);
    assert_eq!(s.grant("a8", "t", false, 100).await.unwrap(), []);
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
    s.grant("a1", "t", true, 20).await.unwrap();
    push(s, pack("t", "p", 1, to_ids(&["a1"])), 30).await;
    push(s, pack("u", "q", 1, to_ids(&["a1"])), 40).await;
    s.label_agent(
        "a1",
        "t",
        [("x".into(), Some("1".into()))].into(),
        Vec::new(),
        50,
    )
    .await
    .unwrap();
    s.label_agent(
        "a1",
        "u",
        [("y".into(), Some("2".into()))].into(),
        Vec::new(),
        50,
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
    assert_eq!(s.clock_history("a1", 0, 0).await.unwrap(), [clock(60)]);

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
    assert_eq!(s.clock_history("a1", 0, 0).await.unwrap(), []);
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
    let changed = s.reconcile_pack(&key("t", "n"), 2).await.unwrap();
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

    let changed = s.cancel_pack(&k, 50).await.unwrap();
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
    assert_eq!(s.cancel_pack(&k, 60).await.unwrap(), []);
    assert_eq!(listed().await.cancelled.map(RefTime::as_nanos), Some(50));
    assert_eq!(s.reconcile_pack(&k, 61).await.unwrap(), []);
    // Another pack is not touched.
    assert_eq!(row(s, "a1", &key("t", "o")).await, other[0]);

    // The holder dropped it: the withdrawal stays on record.
    let changed = s.agent_held("a1", 1, Vec::new(), 70).await.unwrap();
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
    assert_eq!(s.reconcile_pack(&k, 75).await.unwrap(), []);

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
        let r = s.cancel_pack(&nobody, 30).await;
        assert!(
            matches!(&r, Err(StoreError::NoSuchPack { tenant, pack }) if *tenant == nobody.tenant && *pack == nobody.pack),
            "{r:?}"
        );
    }
    assert_eq!(s.packs(None).await.unwrap(), []);

    let changed = sorted(s.cancel_pack(&k, 40).await.unwrap());
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
    assert_eq!(s.cancel_pack(&k, 45).await.unwrap(), []);

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
        s.reconcile_pack(&k, 12).await.unwrap(),
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
        45,
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

    assert_eq!(s.reconcile_pack(&key("t", "none"), 60).await.unwrap(), []);
}

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
        .agent_held("a1", 1, vec![held("t", "p", 2)], 30)
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
        s.agent_held("a1", 1, vec![held("t", "p", 2)], 31)
            .await
            .unwrap(),
        []
    );

    // Newer than the store knows: nacked with the reason, never pushed.
    let changed = s
        .agent_held("a1", 1, vec![held("t", "p", 3)], 40)
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
        .agent_held("a1", 1, vec![stopped.clone()], 50)
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
        .agent_held("a1", 1, vec![stopped, held("t", "loc", 1)], 60)
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
    let changed = s.agent_held("a1", 1, Vec::new(), 70).await.unwrap();
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

    assert!(s.agent_held("ghost", 1, Vec::new(), 80).await.is_err());
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
                11,
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
    s.cancel_pack(&key("t", "q"), 40).await.unwrap();
    let mut h = hello_in("a5", &["t"], &[], 50);
    h.held = vec![held("t", "loc", 1)];
    s.agent_hello(h).await.unwrap();
    assert_eq!(
        s.delivery_counts().await.unwrap(),
        [(Pending, 2), (Acked, 1), (Nacked, 1), (Cancelled, 1)]
    );
}

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
        s.clock_history(id, 0, 0)
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
        s.audit(None, 0, 0)
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
    assert_eq!(at(s.audit(None, 0, 0).await.unwrap()), [1, 2, 3, 4]);
    let of_a = s.audit(Some("a"), 2, 0).await.unwrap();
    assert_eq!(of_a, [refused, audit_row(4, "a", "p4")]);
    assert_eq!(at(s.audit(Some("a"), 0, 2).await.unwrap()), [3, 4]);
    assert_eq!(at(s.audit(None, 0, 1).await.unwrap()), [4]);
    assert_eq!(s.audit(Some("none"), 0, 0).await.unwrap(), []);

    // Stored out of instant order: listed by instant, ties in storage
    // order; the newest are the last of that list.
    for (at, target) in [(10, "x1"), (6, "x2"), (10, "x3")] {
        s.put_audit(audit_row(at, "c", target)).await.unwrap();
    }
    let targets = |rows: Vec<AuditRow>| rows.into_iter().map(|r| r.target).collect::<Vec<_>>();
    assert_eq!(
        targets(s.audit(Some("c"), 0, 0).await.unwrap()),
        ["x2", "x1", "x3"]
    );
    assert_eq!(
        targets(s.audit(Some("c"), 0, 2).await.unwrap()),
        ["x1", "x3"]
    );
    assert_eq!(targets(s.audit(Some("c"), 0, 1).await.unwrap()), ["x3"]);
    assert_eq!(
        targets(s.audit(Some("c"), 7, 0).await.unwrap()),
        ["x1", "x3"]
    );
    assert_eq!(
        targets(s.audit(None, 4, 3).await.unwrap()),
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
    assert!(matches!(r, Err(StoreError::Backend(_))), "{r:?}");
    assert_eq!(s.packs(None).await.unwrap(), []);

    let mut h = hello_in("a1", &["t"], &[], 10);
    h.held = vec![held("t", "x", TOO_BIG)];
    assert!(s.agent_hello(h).await.is_err());
    assert_eq!(s.agent("a1").await.unwrap(), None);

    s.agent_hello(hello_in("a1", &["t"], &[], 20))
        .await
        .unwrap();
    assert!(
        s.agent_held("a1", 1, vec![held("t", "x", TOO_BIG)], 30)
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

// ---------------------------------------------------------------------------
// The randomized equivalence test.

/// A fresh store of a backend, with what must outlive it (a directory).
pub type Opened = (Box<dyn Store>, Box<dyn std::any::Any>);

/// Sequences and steps per sequence (`BATON_STORE_SEQUENCES` to run more,
/// seeded from `BATON_STORE_SEED`, when hunting).
const SEQUENCES: u64 = 20;
const STEPS: usize = 60;

const AGENTS: [&str; 5] = ["a0", "a1", "a2", "a3", "a4"];
const TENANTS: [&str; 2] = ["t0", "t1"];
const PACKS: [&str; 3] = ["p0", "p1", "p2"];
const KEYS: [&str; 2] = ["k0", "k1"];
const VALUES: [&str; 2] = ["v0", "v1"];

/// Random sequences of hellos (labels, held sets, certificates), held
/// sets, label changes, grants, pushes (label and id targets, several
/// tenants; refused ones too), cancels, answers and reconciles, each run
/// against a fresh store and an oracle: after every step every agent's
/// rows must equal what [`planner::plan`] gives for every (known agent,
/// stored or held pack) pair, from the oracle's own history of held sets
/// and refusals; each command's result (its changed rows, its errors)
/// must equal the oracle's, and so must `packs` and `deliveries_of_pack`.
pub async fn random_equivalence(open: &dyn Fn(Binding) -> Opened, binding: Binding) {
    let sequences = std::env::var("BATON_STORE_SEQUENCES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(SEQUENCES);
    let first: u64 = std::env::var("BATON_STORE_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    for seed in first..first + sequences {
        let (store, guard) = open(binding);
        run_sequence(store.as_ref(), binding, seed).await;
        drop(store);
        drop(guard);
    }
}

#[derive(Clone, Debug)]
enum Step {
    Hello(HelloRow),
    Held(String, Vec<HeldPackRow>),
    Label(String, String, LabelOverrides, Vec<String>),
    Grant(String, String, bool),
    Push(PackVersionRow),
    Cancel(PackKey),
    Answer(AnswerRow),
    Reconcile(PackKey),
}

/// The oracle: the inputs as plain maps, and every row re-planned from
/// them after each step.
#[derive(Debug)]
struct Model {
    binding: Binding,
    agents: BTreeMap<String, AgentRow>,
    cert: BTreeMap<String, BTreeSet<String>>,
    grants: BTreeMap<String, BTreeSet<String>>,
    packs: BTreeMap<PackKey, PackTargets>,
    pushed: BTreeMap<PackKey, i64>,
    yaml: BTreeMap<(PackKey, u64), String>,
    rows: BTreeMap<(String, PackKey), DeliveryRow>,
}

/// What a put is expected to do.
#[derive(Debug, PartialEq)]
enum Put {
    Stored,
    Unchanged,
    Older(u64),
    Taken,
}

impl Model {
    fn new(binding: Binding) -> Model {
        Model {
            binding,
            agents: BTreeMap::new(),
            cert: BTreeMap::new(),
            grants: BTreeMap::new(),
            packs: BTreeMap::new(),
            pushed: BTreeMap::new(),
            yaml: BTreeMap::new(),
            rows: BTreeMap::new(),
        }
    }

    fn agent(&self, id: &str) -> Option<AgentRow> {
        let mut a = self.agents.get(id)?.clone();
        a.tenants = self.cert.get(id).cloned().unwrap_or_default();
        a.tenants
            .extend(self.grants.get(id).into_iter().flatten().cloned());
        Some(a)
    }

    fn rows_of(&self, id: &str) -> Vec<DeliveryRow> {
        self.rows
            .iter()
            .filter(|((a, _), _)| a == id)
            .map(|(_, r)| r.clone())
            .collect()
    }

    /// Every (known agent, pack) pair planned again; `held`: one agent's
    /// new held set. The rows that changed.
    fn replan(&mut self, held: Option<(&str, &[HeldPackRow])>, at_ns: i64) -> Vec<DeliveryRow> {
        let held: Option<(&str, BTreeMap<PackKey, Held>)> =
            held.map(|(id, h)| (id, h.iter().map(HeldPackRow::keyed).collect()));
        let mut changed = Vec::new();
        let ids: Vec<String> = self.agents.keys().cloned().collect();
        for id in ids {
            let agent = self.agent(&id).unwrap();
            let now = held.as_ref().filter(|(a, _)| *a == id).map(|(_, m)| m);
            let mut keys: BTreeSet<PackKey> = self.packs.keys().cloned().collect();
            keys.extend(
                self.rows
                    .keys()
                    .filter(|(a, _)| *a == id)
                    .map(|(_, k)| k.clone()),
            );
            if let Some(m) = now {
                keys.extend(m.keys().cloned());
            }
            for k in keys {
                let rk = (id.clone(), k.clone());
                let row = self.rows.get(&rk);
                let h = match now {
                    Some(m) => m.get(&k).copied(),
                    None => row.and_then(|r| r.held),
                };
                match planner::plan(
                    &agent,
                    &k,
                    self.packs.get(&k),
                    row,
                    h,
                    self.binding,
                    RefTime::from_nanos(at_ns),
                ) {
                    Some(next) => {
                        if row != Some(&next) {
                            changed.push(next.clone());
                            self.rows.insert(rk, next);
                        }
                    }
                    None => {
                        self.rows.remove(&rk);
                    }
                }
            }
        }
        changed
    }

    fn put(&mut self, p: &PackVersionRow) -> Put {
        let k = p.key();
        if let Some(rec) = self.packs.get(&k) {
            if rec.latest > p.version {
                return Put::Older(rec.latest);
            }
            if rec.latest == p.version {
                match self.yaml.get(&(k.clone(), p.version)) {
                    Some(y) if *y == p.yaml => return Put::Unchanged,
                    Some(_) => return Put::Taken,
                    None => {}
                }
            }
        }
        self.packs.insert(
            k.clone(),
            PackTargets {
                tenant: p.tenant.clone(),
                pack: p.pack.clone(),
                latest: p.version,
                targets: p.targets.clone(),
                cancelled: None,
                gate: None,
            },
        );
        self.pushed.insert(k.clone(), p.pushed.as_nanos());
        self.yaml.insert((k, p.version), p.yaml.clone());
        Put::Stored
    }

    /// `false`: nobody holds an unknown pack (`NoSuchPack`).
    fn cancel(&mut self, k: &PackKey, at_ns: i64) -> bool {
        if let Some(p) = self.packs.get_mut(k) {
            p.cancelled.get_or_insert(RefTime::from_nanos(at_ns));
            return true;
        }
        let newest = self
            .rows
            .iter()
            .filter(|((_, rk), _)| rk == k)
            .filter_map(|(_, r)| r.held.map(|h| h.version))
            .max();
        let Some(latest) = newest else {
            return false;
        };
        self.packs.insert(
            k.clone(),
            PackTargets {
                tenant: k.tenant.clone(),
                pack: k.pack.clone(),
                latest,
                targets: TargetsRow::Nobody,
                cancelled: Some(RefTime::from_nanos(at_ns)),
                gate: None,
            },
        );
        self.pushed.insert(k.clone(), at_ns);
        true
    }

    fn summaries(&self) -> Vec<PackSummaryRow> {
        self.packs
            .iter()
            .map(|(k, p)| {
                let mut s = PackSummaryRow {
                    tenant: k.tenant.clone(),
                    pack: k.pack.clone(),
                    latest: p.latest,
                    targets: p.targets.clone(),
                    pushed: RefTime::from_nanos(self.pushed[k]),
                    cancelled: p.cancelled,
                    acked: 0,
                    nacked: 0,
                    pending: 0,
                    ahead: 0,
                };
                for r in self.rows.values().filter(|r| r.key() == *k) {
                    if r.held.is_some_and(|h| h.version > p.latest) {
                        s.ahead += 1;
                    }
                    if r.version == p.latest {
                        match r.state {
                            Acked => s.acked += 1,
                            Nacked => s.nacked += 1,
                            Pending => s.pending += 1,
                            Cancelled | DeliveryState::Local => {}
                        }
                    }
                }
                s
            })
            .collect()
    }
}

/// Where a sequence is, for failure messages.
struct Trail {
    seed: u64,
    binding: Binding,
    steps: Vec<String>,
}

impl Trail {
    fn check<T: PartialEq + Debug>(&self, what: &str, got: &T, want: &T) {
        if got != want {
            let from = self.steps.len().saturating_sub(25);
            panic!(
                "{what} differs from the oracle (seed {}, {:?}, step {}; \
                 BATON_STORE_SEED={} BATON_STORE_SEQUENCES=1 reruns it)\n\
                 steps (last 25):\n  {}\n got: {got:#?}\nwant: {want:#?}",
                self.seed,
                self.binding,
                self.steps.len(),
                self.seed,
                self.steps[from..].join("\n  "),
            );
        }
    }
}

fn sorted(mut rows: Vec<DeliveryRow>) -> Vec<DeliveryRow> {
    rows.sort_by(|a, b| (&a.agent_id, a.key()).cmp(&(&b.agent_id, b.key())));
    rows
}

fn pick<'a>(rng: &mut StdRng, from: &[&'a str]) -> &'a str {
    from[rng.random_range(0..from.len())]
}

fn random_labels(rng: &mut StdRng) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for k in KEYS {
        if rng.random_bool(0.6) {
            out.insert(k.to_owned(), pick(rng, &VALUES).to_owned());
        }
    }
    out
}

fn random_held(rng: &mut StdRng, m: &Model) -> Vec<HeldPackRow> {
    let mut out = Vec::new();
    for t in TENANTS {
        for p in PACKS {
            if !rng.random_bool(0.3) {
                continue;
            }
            let latest = m.packs.get(&key(t, p)).map_or(2, |p| p.latest);
            let version = match rng.random_range(0..4) {
                0 => latest.saturating_sub(1).max(1),
                1 | 2 => latest,
                _ => latest + 1,
            };
            out.push(HeldPackRow {
                stopped: rng.random_bool(0.2),
                ..held(t, p, version)
            });
        }
    }
    out
}

fn random_step(rng: &mut StdRng, m: &Model, at_ns: i64) -> Step {
    let known: Vec<&str> = AGENTS
        .iter()
        .copied()
        .filter(|a| m.agents.contains_key(*a))
        .collect();
    // Mostly agents it knows, sometimes any.
    let agent = |rng: &mut StdRng| -> String {
        if known.is_empty() || rng.random_bool(0.15) {
            pick(rng, &AGENTS).to_owned()
        } else {
            pick(rng, &known).to_owned()
        }
    };
    let any_key = |rng: &mut StdRng| key(pick(rng, &TENANTS), pick(rng, &PACKS));
    match rng.random_range(0..100) {
        0..15 => {
            let id = agent(rng);
            let cert_tenants = rng.random_bool(0.7).then(|| {
                TENANTS
                    .iter()
                    .filter(|_| rng.random_bool(0.6))
                    .map(|t| (*t).to_owned())
                    .collect()
            });
            Step::Hello(HelloRow {
                labels: random_labels(rng),
                cert_tenants,
                held: random_held(rng, m),
                ..hello(&id, at_ns)
            })
        }
        15..25 => Step::Held(agent(rng), random_held(rng, m)),
        25..37 => {
            let mut set = LabelOverrides::new();
            for k in KEYS {
                if rng.random_bool(0.5) {
                    let hide = rng.random_bool(0.3);
                    set.insert(k.to_owned(), (!hide).then(|| pick(rng, &VALUES).to_owned()));
                }
            }
            let reset = KEYS
                .iter()
                .filter(|_| rng.random_bool(0.25))
                .map(|k| (*k).to_owned())
                .collect();
            Step::Label(agent(rng), pick(rng, &TENANTS).to_owned(), set, reset)
        }
        37..45 => Step::Grant(
            agent(rng),
            pick(rng, &TENANTS).to_owned(),
            rng.random_bool(0.6),
        ),
        45..70 => {
            let k = any_key(rng);
            let version = match m.packs.get(&k) {
                Some(p) => match rng.random_range(0..10) {
                    0 => p.latest.saturating_sub(1).max(1),
                    1 | 2 => p.latest,
                    3..8 => p.latest + 1,
                    _ => p.latest + 2,
                },
                None => rng.random_range(1..4),
            };
            let targets = match rng.random_range(0..10) {
                0 => TargetsRow::Nobody,
                1..5 => {
                    let mut ids: Vec<String> = AGENTS
                        .iter()
                        .filter(|_| rng.random_bool(0.4))
                        .map(|a| (*a).to_owned())
                        .collect();
                    if rng.random_bool(0.1) {
                        ids.push("ghost".into());
                    }
                    TargetsRow::Agents(ids)
                }
                _ => TargetsRow::Labels(random_labels(rng)),
            };
            let mut p = PackVersionRow {
                targets,
                pushed: RefTime::from_nanos(at_ns),
                ..pack(&k.tenant, &k.pack, version, TargetsRow::Nobody)
            };
            if rng.random_bool(0.1) {
                p.yaml.push_str("# edited\n");
            }
            Step::Push(p)
        }
        70..78 => Step::Cancel(any_key(rng)),
        78..95 => {
            let id = agent(rng);
            let rows: Vec<&DeliveryRow> = m.rows.values().filter(|r| r.agent_id == id).collect();
            let (k, base) = if rows.is_empty() || rng.random_bool(0.1) {
                (any_key(rng), 1)
            } else {
                let r = rows[rng.random_range(0..rows.len())];
                (r.key(), r.version)
            };
            let version = match rng.random_range(0..6) {
                0 => base.saturating_sub(1).max(1),
                1 => base + 1,
                _ => base,
            };
            let answer = if rng.random_bool(0.5) {
                Answer::Acked
            } else {
                let mut r = refusal(
                    version,
                    rng.random_bool(0.5),
                    &format!("refused at {at_ns}"),
                );
                if rng.random_bool(0.5) {
                    r.errors.push(ErrorRow {
                        line: rng.random_range(0..9),
                        column: 1,
                        instruction: "i".into(),
                        message: "bad".into(),
                    });
                }
                Answer::Refused(r)
            };
            Step::Answer(AnswerRow {
                agent_id: id,
                key: k,
                version,
                answer,
                attempts: rng.random_range(0..4),
                session_gen: 0, // the agent's, when the step runs
                at: RefTime::from_nanos(at_ns),
            })
        }
        _ => Step::Reconcile(any_key(rng)),
    }
}

async fn run_sequence(s: &dyn Store, binding: Binding, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed ^ ((binding as u64) << 32));
    let mut m = Model::new(binding);
    let mut trail = Trail {
        seed,
        binding,
        steps: Vec::new(),
    };
    for i in 0..STEPS {
        let at_ns = 1_000 + 10 * i64::try_from(i).unwrap();
        let step = random_step(&mut rng, &m, at_ns);
        trail.steps.push(format!("{step:?}"));
        apply(s, &mut m, &trail, step, at_ns).await;
        // Every agent's rows, and every pack's.
        for id in AGENTS {
            trail.check(
                &format!("rows of {id}"),
                &s.deliveries_of_agent(id).await.unwrap(),
                &m.rows_of(id),
            );
        }
        trail.check("packs", &s.packs(None).await.unwrap(), &m.summaries());
        for t in TENANTS {
            for p in PACKS {
                let k = key(t, p);
                let want: Vec<DeliveryRow> = m
                    .rows
                    .values()
                    .filter(|r| r.key() == k && r.state != DeliveryState::Local)
                    .cloned()
                    .collect();
                trail.check(
                    &format!("deliveries of {k}"),
                    &s.deliveries_of_pack(&k, None, None, 0).await.unwrap(),
                    &sorted(want),
                );
            }
        }
        let agents: Vec<AgentRow> = m.agents.keys().filter_map(|id| m.agent(id)).collect();
        trail.check(
            "agents",
            &s.agents(AgentFilter::default()).await.unwrap(),
            &agents,
        );
    }
}

async fn apply(s: &dyn Store, m: &mut Model, trail: &Trail, step: Step, at_ns: i64) {
    match step {
        Step::Hello(h) => {
            let got = s.agent_hello(h.clone()).await.unwrap();
            let prev = m.agents.get(&h.id).cloned();
            let mut a = prev.unwrap_or_else(|| AgentRow::new(&h.id, &h.journal_id));
            a.labels = h.labels.clone();
            a.agent_version = h.agent_version.clone();
            a.journal_id = h.journal_id.clone();
            a.connected = true;
            a.last_seen = h.at;
            a.session_gen += 1;
            // Which replica took the hello is the engine's to say.
            a.owner = got.0.owner.clone();
            m.agents.insert(h.id.clone(), a);
            if let Some(t) = &h.cert_tenants {
                m.cert.insert(h.id.clone(), t.iter().cloned().collect());
            }
            m.replan(Some((&h.id, &h.held)), at_ns);
            let want = (m.agent(&h.id).unwrap(), m.rows_of(&h.id));
            trail.check("hello", &got, &want);
        }
        Step::Held(id, held) => {
            let session = m.agents.get(&id).map_or(0, |a| a.session_gen);
            let got = s.agent_held(&id, session, held.clone(), at_ns).await;
            if m.agents.contains_key(&id) {
                let want = m.replan(Some((&id, &held)), at_ns);
                trail.check("held", &sorted(got.unwrap()), &sorted(want));
            } else {
                trail.check("held of an unknown agent fails", &got.is_err(), &true);
            }
        }
        Step::Label(id, tenant, set, reset) => {
            let got = s
                .label_agent(&id, &tenant, set.clone(), reset.clone(), at_ns)
                .await;
            match m.agents.get_mut(&id) {
                Some(a) => {
                    let o = a.overrides.entry(tenant.clone()).or_default();
                    o.extend(set);
                    for k in &reset {
                        o.remove(k);
                    }
                    if o.is_empty() {
                        a.overrides.remove(&tenant);
                    }
                    let changed = m.replan(None, at_ns);
                    let (agent, rows) = got.unwrap();
                    trail.check("labelled agent", &agent, &m.agent(&id).unwrap());
                    trail.check("label", &sorted(rows), &sorted(changed));
                }
                None => trail.check(
                    "label of an unknown agent",
                    &matches!(got, Err(StoreError::NoSuchAgent { .. })),
                    &true,
                ),
            }
        }
        Step::Grant(id, tenant, granted) => {
            let got = s.grant(&id, &tenant, granted, at_ns).await.unwrap();
            let g = m.grants.entry(id.clone()).or_default();
            if granted {
                g.insert(tenant);
            } else {
                g.remove(&tenant);
            }
            let changed = m.replan(None, at_ns);
            trail.check("grant", &sorted(got), &sorted(changed));
        }
        Step::Push(p) => {
            let k = p.key();
            let got = s.put_pack(p.clone()).await;
            let got = match got {
                Ok(PutPack::Stored) => Put::Stored,
                Ok(PutPack::Unchanged) => Put::Unchanged,
                Err(StoreError::VersionOlder { latest, .. }) => Put::Older(latest),
                Err(StoreError::VersionTaken { .. }) => Put::Taken,
                Err(e) => panic!("put_pack: {e}"),
            };
            trail.check("put_pack", &got, &m.put(&p));
            let got = s.reconcile_pack(&k, at_ns).await.unwrap();
            let changed = m.replan(None, at_ns);
            trail.check("reconcile after a put", &sorted(got), &sorted(changed));
        }
        Step::Cancel(k) => {
            let got = s.cancel_pack(&k, at_ns).await;
            if m.cancel(&k, at_ns) {
                let changed = m.replan(None, at_ns);
                trail.check("cancel", &sorted(got.unwrap()), &sorted(changed));
            } else {
                trail.check(
                    "cancel of a pack nobody has",
                    &matches!(got, Err(StoreError::NoSuchPack { .. })),
                    &true,
                );
            }
        }
        Step::Answer(mut a) => {
            a.session_gen = m.agents.get(&a.agent_id).map_or(0, |a| a.session_gen);
            let got = s.answer(a.clone()).await.unwrap();
            let rk = (a.agent_id.clone(), a.key.clone());
            let want = match (m.agent(&a.agent_id), m.rows.get(&rk)) {
                (Some(agent), Some(row)) => {
                    let next = planner::answered(
                        &agent,
                        m.packs.get(&a.key),
                        row,
                        a.version,
                        &a.answer,
                        a.attempts,
                        m.binding,
                        a.at,
                    );
                    match &next {
                        Some(n) => m.rows.insert(rk, n.clone()),
                        None => m.rows.remove(&rk),
                    };
                    next
                }
                _ => None,
            };
            trail.check("answer", &got, &want);
            let more = m.replan(None, at_ns);
            trail.check("re-planning after an answer", &more, &Vec::new());
        }
        Step::Reconcile(k) => {
            let got = s.reconcile_pack(&k, at_ns).await.unwrap();
            let changed = m.replan(None, at_ns);
            trail.check("reconcile", &sorted(got), &sorted(changed));
        }
    }
}

// ---------------------------------------------------------------------------
// The suite, for a backend's tests.

/// One `#[tokio::test]` per contract function and binding (a module per
/// function, a test per binding), against the stores `$open(binding)`
/// makes: `(store, guard)`, where `guard` (a temporary directory, or `()`)
/// outlives the store.
#[macro_export]
macro_rules! contract_suite {
    ($open:ident) => {
        fn always_available() -> bool {
            true
        }
        $crate::contract_suite!($open, always_available);
    };
    // `$available()`: whether the backend can run here at all (a test
    // without it returns at once; the backend's helper says why).
    ($open:ident, $available:ident) => {
        $crate::contract_suite!(@tests $open, $available;
            hello_creates_and_updates: [tenants, open];
            stale_streams_are_fenced: [tenants];
            events_page_by_id: [tenants];
            revocations_once_per_serial: [tenants];
            agent_seen_and_all_disconnected: [tenants];
            clock_latest_and_history: [tenants];
            agents_paging: [tenants, open];
            labels_set_hide_reset: [tenants, open];
            grants_replan: [tenants, open];
            forget_agent_parts: [tenants, open];
            put_pack_versions: [tenants];
            cancel_known_pack: [tenants, open];
            cancel_unknown_pack: [tenants, open];
            reconcile_pack_targets: [tenants, open];
            agent_held_rules: [tenants, open];
            answers: [tenants, open];
            deliveries_of_pack_paging: [tenants];
            a_push_to_many_agents_plans_each: [tenants, open];
            a_rollout_gates_its_version: [tenants];
            a_push_or_cancel_supersedes_a_rollout: [tenants];
            outsiders_never_get_an_aborted_or_cancelled_version_back: [tenants];
            deliveries_of_pairs: [tenants];
            delivery_counts: [tenants];
            feedback_stored_once: [tenants];
            feedback_drops_on_a_resent_entry: [tenants];
            feedback_all_or_nothing: [tenants];
            feedback_through_retention: [tenants];
            feedback_pages_and_filters: [tenants];
            retention_oldest_first: [tenants];
            audit_newest_oldest_first: [tenants];
            pages_capped: [tenants];
            values_past_i64_max_refused: [tenants];
        );
        mod random_equivalence {
            $crate::contract_suite!(@random $open, $available; tenants, open);
        }
    };
    (@tests $open:ident, $available:ident; $($name:ident: [$($b:ident),+];)+) => {
        $(
            mod $name {
                $(
                    #[tokio::test]
                    async fn $b() {
                        if !super::$available() {
                            return;
                        }
                        let binding = $crate::contract_suite!(@binding $b);
                        let (store, guard) = super::$open(binding);
                        $crate::contract::$name(&store, binding).await;
                        // The store first: the guard may be its directory.
                        drop(store);
                        let _ = guard;
                    }
                )+
            }
        )+
    };
    (@random $open:ident, $available:ident; $($b:ident),+) => {
        $(
            #[tokio::test]
            async fn $b() {
                if !super::$available() {
                    return;
                }
                let binding = $crate::contract_suite!(@binding $b);
                $crate::contract::random_equivalence(
                    &|b| {
                        let (store, guard) = super::$open(b);
                        (
                            Box::new(store) as Box<dyn $crate::Store>,
                            Box::new(guard) as Box<dyn std::any::Any>,
                        )
                    },
                    binding,
                )
                .await;
            }
        )+
    };
    (@binding tenants) => {
        $crate::Binding::Tenants
    };
    (@binding open) => {
        $crate::Binding::Open
    };
}
