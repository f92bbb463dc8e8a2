//! Fixtures: the rows and calls every part of the contract builds on.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use baton_model::{RefTime, time};
use baton_proto::wire;

use crate::*;

// ---------------------------------------------------------------------------
// Fixtures.

/// A label map.
pub fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
    kv.iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

pub fn set(items: &[&str]) -> BTreeSet<String> {
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
        trust: None,
        arch: "x86_64".into(),
        update: None,
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
    s.reconcile_pack(&k, RefTime::from_nanos(at_ns))
        .await
        .unwrap()
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

pub use DeliveryState::{Acked, Cancelled, Nacked, Pending};
pub use Intent::{Hold, Local, Withdraw};

pub async fn rows_of(s: &dyn Store, id: &str) -> Vec<DeliveryRow> {
    s.deliveries_of_agent(id).await.unwrap()
}

pub async fn row(s: &dyn Store, id: &str, k: &PackKey) -> DeliveryRow {
    rows_of(s, id)
        .await
        .into_iter()
        .find(|r| r.key() == *k)
        .unwrap_or_else(|| panic!("no row of {k} for {id}"))
}

pub async fn ids(s: &dyn Store, f: AgentFilter) -> Vec<String> {
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

pub async fn all_feedback(s: &dyn Store) -> Vec<FeedbackRow> {
    s.feedback(FeedbackFilter::default()).await.unwrap()
}

/// (agent, journal, seq) of rows, in their order.
pub fn seqs(rows: &[FeedbackRow]) -> Vec<(String, String, u64)> {
    rows.iter()
        .map(|r| (r.agent_id.clone(), r.journal_id.clone(), r.seq))
        .collect()
}

pub fn sq(agent: &str, journal: &str, seq: u64) -> (String, String, u64) {
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

pub const TOO_BIG: u64 = i64::MAX as u64 + 1;

pub fn sorted(mut rows: Vec<DeliveryRow>) -> Vec<DeliveryRow> {
    rows.sort_by(|a, b| (&a.agent_id, a.key()).cmp(&(&b.agent_id, b.key())));
    rows
}

/// What a follower reads once at least `n` rows are final: a backend whose
/// writers commit in parallel shows a row only once every transaction
/// older than its own has ended (another writer's, in a shared test
/// database), so this asks again until then, for at most 10 s.
pub async fn followed<T, F, Fut>(n: usize, read: F) -> (Vec<T>, Mark)
where
    F: Fn() -> Fut,
    Fut: Future<Output = StoreResult<(Vec<T>, Mark)>>,
{
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (rows, mark) = read().await.unwrap();
        if rows.len() >= n || std::time::Instant::now() > deadline {
            return (rows, mark);
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// A live stream's mark at `at_ns` that says nothing of lateness or
/// health (kept as stored).
pub fn seen_live(at_ns: i64) -> SeenRow {
    SeenRow {
        connected: true,
        at: RefTime::from_nanos(at_ns),
        lateness_p99: None,
        health: None,
    }
}
