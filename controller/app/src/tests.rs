//! The application's operations against the in-memory store: who may do
//! what, what is refused whole, what each answer says.

use baton_model::{RefTime, time};
use std::sync::Arc;

use crate::app::{App, AppConfig, AppError};
use crate::caller::Caller;
use crate::feedback::FeedbackQuery;
use crate::metrics::Retained;
use baton_model::identity::{Identity, Role};
use baton_model::{Binding, FeedbackRow, HeldPackRow};
use baton_proto::wire;
use baton_store::StoreOps;
use baton_store::memory::MemoryStore;
use baton_store::{HelloRow, MAX_PAGE};

pub(crate) fn app(binding: Binding) -> Arc<App> {
    App::new(Arc::new(MemoryStore::new(binding)), AppConfig::new(binding))
}

pub(crate) fn open() -> Caller {
    Caller::new(Identity::Insecure)
}

pub(crate) fn op(tenant: &str, role: Role) -> Caller {
    Caller::new(Identity::Operator {
        name: format!("{tenant}-{}", role.as_str()),
        tenant: tenant.into(),
        role,
    })
}

fn yaml(tenant: &str, pack: &str, version: u64, targets: &str) -> String {
    format!(
        "pack: {pack}\nversion: {version}\ntenant: {tenant}\ntargets: {targets}\n\
         instructions:\n  - {{id: tick, action: noop, every: 1s}}\n"
    )
}

/// An agent says hello with the certificate of `tenants`, holding `held`
/// (for the web layer's tests too).
pub(crate) async fn hello(app: &App, id: &str, tenants: &[&str], held: &[(&str, &str, u64)]) {
    app.store
        .agent_hello(HelloRow {
            id: id.into(),
            labels: [("line".to_string(), "3".to_string())].into(),
            agent_version: "t".into(),
            journal_id: format!("j-{id}"),
            cert_tenants: Some(tenants.iter().map(|t| t.to_string()).collect()),
            session_gen_seen: 0,
            trust: None,
            arch: "x86_64".into(),
            update: None,
            held: held
                .iter()
                .map(|(t, p, v)| HeldPackRow {
                    tenant: t.to_string(),
                    pack: p.to_string(),
                    version: *v,
                    stopped: false,
                })
                .collect(),
            at: RefTime::from_nanos(1),
        })
        .await
        .expect("hello");
}

#[tokio::test]
async fn a_bad_push_is_refused_with_its_position_and_audited() {
    let app = app(Binding::Open);
    let caller = open();
    let r = app
        .push(&caller, "pack: p\nversion: x\n".into(), "bad.yaml")
        .await;
    let e = app.audited(&caller, "default", "push", "bad.yaml", r).await;
    match e {
        Err(AppError::Invalid(m)) => assert!(m.contains("bad.yaml:2:"), "{m}"),
        other => panic!("expected invalid, got {other:?}"),
    }
    let audit = app
        .audit(&caller, RefTime::from_nanos(0), 0)
        .await
        .expect("audit");
    assert_eq!(audit.len(), 1);
    assert!(
        audit[0].result.starts_with("InvalidArgument: bad.yaml:"),
        "{:?}",
        audit[0]
    );
    assert!(
        audit[0]
            .result
            .contains("bad.yaml:2:10: version must be a whole number")
    );
    assert!(app.store.packs(None).await.expect("packs").is_empty());
}

#[tokio::test]
async fn roles_and_tenants_gate_pushes() {
    let app = app(Binding::Tenants);
    let viewer = op("plant-a", Role::Viewer);
    let e = app
        .push(&viewer, yaml("plant-a", "p", 1, "{agents: [a1]}"), "p.yaml")
        .await;
    assert!(matches!(e, Err(AppError::Denied(_))), "{e:?}");
    let ann = op("plant-a", Role::Operator);
    let e = app
        .push(&ann, yaml("plant-b", "p", 1, "{agents: [a1]}"), "p.yaml")
        .await;
    assert!(
        matches!(e, Err(AppError::Denied(ref m)) if m.contains("tenant plant-b")),
        "{e:?}"
    );
    let p = app
        .push(&ann, yaml("plant-a", "p", 1, "{agents: [a1]}"), "p.yaml")
        .await
        .expect("own tenant");
    assert!(!p.unchanged);
    let again = app
        .push(&ann, yaml("plant-a", "p", 1, "{agents: [a1]}"), "p.yaml")
        .await
        .expect("same again");
    assert!(again.unchanged);
    let e = app
        .push(&ann, yaml("plant-a", "p", 1, "{agents: [a2]}"), "p.yaml")
        .await;
    assert!(matches!(e, Err(AppError::Conflict(_))), "{e:?}");
}

#[tokio::test]
async fn a_pack_naming_another_tenants_agent_is_refused_whole() {
    let app = app(Binding::Tenants);
    hello(&app, "a2", &["plant-b"], &[]).await;
    hello(&app, "a1", &["plant-a"], &[]).await;
    let ann = op("plant-a", Role::Operator);
    let e = app
        .push(
            &ann,
            yaml("plant-a", "steal", 1, "{agents: [a1, a2]}"),
            "p.yaml",
        )
        .await;
    match e {
        Err(AppError::Denied(m)) => {
            assert!(m.contains("a2 is not an agent of tenant plant-a"), "{m}");
            assert!(!m.contains("plant-b"), "names the other tenant: {m}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(
        app.store.packs(None).await.expect("packs").is_empty(),
        "nothing stored"
    );
    // Labels reach only the tenant's own agents.
    let p = app
        .push(
            &ann,
            yaml("plant-a", "line", 1, "{labels: {line: \"3\"}}"),
            "p.yaml",
        )
        .await
        .expect("push");
    assert_eq!(p.agents, ["a1"]);
}

#[tokio::test]
async fn a_tenant_sees_only_the_agents_that_serve_it_and_no_one_elses_names() {
    let app = app(Binding::Tenants);
    hello(&app, "a1", &["plant-a"], &[]).await;
    hello(&app, "b1", &["plant-b", "plant-c"], &[]).await;
    let ann = op("plant-a", Role::Admin);
    let page = app.agents(&ann, None, 0).await.expect("agents");
    let ids: Vec<&str> = page.agents.iter().map(|v| v.agent.id.as_str()).collect();
    assert_eq!(ids, ["a1"]);
    let hidden = app.visible_agent(&ann, "b1").await.expect_err("hidden");
    let missing = app.visible_agent(&ann, "zz").await.expect_err("missing");
    assert_eq!(
        hidden.to_string().replace("b1", "X"),
        missing.to_string().replace("zz", "X")
    );
    // Sharing b1 needs an admin of a tenant it serves.
    let e = app.grant(&ann, "b1", "plant-a", true).await;
    assert!(matches!(e, Err(AppError::NotFound(_))), "{e:?}");
    let bea = op("plant-b", Role::Admin);
    // The answer names the caller's tenant and the one granted, not
    // plant-c, which b1 also serves.
    let tenants = app.grant(&bea, "b1", "plant-a", true).await.expect("grant");
    assert_eq!(tenants, ["plant-a", "plant-b"]);
    let tenants = app.grant(&ann, "b1", "plant-d", true).await.expect("grant");
    assert_eq!(tenants, ["plant-a", "plant-d"]);
    let page = app.agents(&ann, None, 0).await.expect("agents");
    assert_eq!(page.agents.len(), 2);
    // ...and what plant-a sees of b1 is plant-a's only.
    let b1 = &page.agents[1].agent;
    assert_eq!(b1.tenants.iter().collect::<Vec<_>>(), ["plant-a"]);
}

#[tokio::test]
async fn a_pack_the_store_lost_can_still_be_cancelled_on_its_holders() {
    let app = app(Binding::Open);
    hello(&app, "a1", &[], &[("default", "ghost", 4)]).await;
    let c = app
        .cancel(&open(), "default", "ghost")
        .await
        .expect("cancel");
    assert_eq!(
        (c.agents.as_slice(), c.version),
        (&["a1".to_string()][..], 4)
    );
    let e = app.cancel(&open(), "default", "never").await;
    assert!(matches!(e, Err(AppError::NotFound(_))), "{e:?}");
    // Pushing it again later works (above what was held).
    let p = app
        .push(
            &open(),
            yaml("default", "ghost", 5, "{agents: [a1]}"),
            "p.yaml",
        )
        .await
        .expect("push");
    assert_eq!(p.agents, ["a1"]);
}

#[test]
fn lateness_p99_is_of_the_latest_executions() {
    let mut r = crate::app::Recent::default();
    assert_eq!(r.p99(), 0);
    for i in 1..=100 {
        r.push(i * 1_000_000);
    }
    assert_eq!(r.p99(), 99_000_000, "the 99th of 1..=100 ms");
    // A window: old values leave.
    for _ in 0..crate::app::Recent::LEN {
        r.push(2_000);
    }
    assert_eq!(r.p99(), 2_000);
    r.push(-5);
    assert_eq!(r.p99(), 2_000, "early counts as 0, not below");
}

fn fb(seq: u64, pack: &str) -> FeedbackRow {
    FeedbackRow {
        id: 0,
        agent_id: "a1".into(),
        journal_id: "j".into(),
        seq,
        execution_id: String::new(),
        tenant: "default".into(),
        pack: pack.into(),
        version: 1,
        instruction: "tick".into(),
        occurrence: Some(RefTime::from_nanos(seq as i64)),
        attempt: 1,
        scheduled: RefTime::from_nanos(0),
        actual: RefTime::from_nanos(0),
        lateness: time::span(0),
        outcome: wire::Outcome::Ok,
        reason: wire::Reason::Unspecified,
        event: "executed".into(),
        action: "noop".into(),
        detail: String::new(),
        value: None,
        dropped_before: 0,
        uncertainty: time::span(0),
        clock_source: wire::ClockSource::Unspecified,
        clock_state: wire::ClockState::Unspecified,
        received: RefTime::from_nanos(seq as i64),
    }
}

#[tokio::test]
async fn feedback_streams_page_by_page_and_honours_its_limit() {
    let app = app(Binding::Open);
    let n = u64::from(MAX_PAGE) * 2 + 17;
    let rows: Vec<FeedbackRow> = (1..=n)
        .map(|s| fb(s, if s % 2 == 0 { "even" } else { "odd" }))
        .collect();
    app.store.put_feedback(1, rows).await.expect("store");
    let read = |q: FeedbackQuery| {
        let mut rx = app.feedback(&open(), q);
        async move {
            let mut seqs = Vec::new();
            while let Some(r) = rx.recv().await {
                seqs.push(r.expect("row").seq);
            }
            seqs
        }
    };
    let all = read(FeedbackQuery::default()).await;
    assert_eq!(all, (1..=n).collect::<Vec<_>>());
    let some = read(FeedbackQuery {
        limit: 1500,
        ..Default::default()
    })
    .await;
    assert_eq!(some, (1..=1500).collect::<Vec<_>>());
    let even = read(FeedbackQuery {
        pack: Some("even".into()),
        ..Default::default()
    })
    .await;
    assert_eq!(even.len() as u64, n / 2);
    // Another tenant's: nothing.
    let mut rx = app.feedback(
        &op("plant-b", Role::Viewer),
        FeedbackQuery {
            tenant: "default".into(),
            ..Default::default()
        },
    );
    assert!(rx.recv().await.is_none());
}

#[tokio::test]
async fn retention_deletes_only_what_is_older_than_its_window() {
    let app = app(Binding::Open);
    let rows: Vec<FeedbackRow> = (1..=1200).map(|s| fb(s, "p")).collect();
    app.store.put_feedback(1, rows).await.expect("store");
    // received_ns = seq: everything before 1001 goes, in batches of 500.
    let n = crate::retention::sweep(&app, Retained::Feedback, RefTime::from_nanos(1001), 500)
        .await
        .expect("sweep");
    assert_eq!(n, 1000);
    let left = app
        .store
        .feedback(baton_store::FeedbackFilter::default())
        .await
        .expect("read");
    assert_eq!(left.first().map(|r| r.seq), Some(1001));
    assert_eq!(left.len(), 200);
    // What the journal acknowledged is kept.
    assert_eq!(
        app.store.feedback_acked("a1", "j").await.expect("acked"),
        1200
    );
    let m = app.metrics.render(0, None);
    assert!(
        m.contains("baton_controller_retention_deleted_total{table=\"feedback\"} 1000"),
        "{m}"
    );
}

/// A rollout is seen and commanded only within its tenant, and only by
/// operators and admins; every command is audited, refused ones too.
#[tokio::test]
async fn rollouts_stay_within_their_tenant_and_role() {
    let app = app(Binding::Tenants);
    hello(&app, "a1", &["t"], &[]).await;
    let staged = format!(
        "{}rollout:\n  stages: [{{percent: 100}}]\n",
        yaml("t", "p", 1, "{agents: [a1]}")
    );
    let t_op = op("t", Role::Operator);
    app.push(&t_op, staged, "p.yaml").await.expect("pushed");
    let s = app.rollout_status(&t_op, "", "p").await.expect("status");
    assert_eq!((s.row.version, s.agents.len()), (1, 1));
    let u_admin = op("u", Role::Admin);
    for r in [
        app.rollout_status(&u_admin, "t", "p").await.map(|_| ()),
        app.rollout_status(&u_admin, "", "p").await.map(|_| ()),
    ] {
        assert!(matches!(r, Err(AppError::NotFound(_))), "{r:?}");
    }
    assert!(app.rollout_list(&u_admin).await.expect("list").is_empty());
    assert_eq!(app.rollout_list(&t_op).await.expect("list").len(), 1);
    let paused = app
        .rollout_command(&u_admin, "t", "p", crate::rollouts::RolloutCommand::Pause)
        .await;
    assert!(matches!(paused, Err(AppError::NotFound(_))), "{paused:?}");
    let viewer = app
        .rollout_command(
            &op("t", Role::Viewer),
            "",
            "p",
            crate::rollouts::RolloutCommand::Pause,
        )
        .await;
    assert!(matches!(viewer, Err(AppError::Denied(_))), "{viewer:?}");
    let row = app
        .rollout_command(&t_op, "", "p", crate::rollouts::RolloutCommand::Pause)
        .await
        .expect("paused");
    assert_eq!(row.state, baton_model::RolloutState::Paused);
    let audit = app
        .store
        .audit(None, RefTime::from_nanos(0), 100)
        .await
        .expect("audit");
    let pauses: Vec<&str> = audit
        .iter()
        .filter(|r| r.action == "rollout.pause")
        .map(|r| r.result.as_str())
        .collect();
    assert_eq!(pauses.len(), 3, "{pauses:?}");
    assert_eq!(
        pauses.iter().filter(|r| **r == "ok").count(),
        1,
        "{pauses:?}"
    );
}

/// What a stream measures of its agent (a late firing, an outbox that
/// rises report after report) is written with its last-seen mark and
/// makes the agent "unhealthy" in the fleet filter, for every replica;
/// a stream that ends leaves the last measure.
#[tokio::test]
async fn a_streams_measures_reach_the_unhealthy_filter() {
    use crate::link::Effect;
    use baton_model::{AgentFilter, FleetState};
    let app = app(Binding::Tenants);
    for id in ["a1", "a2", "a3"] {
        hello(&app, id, &["t"], &[]).await;
    }
    let unhealthy = || async {
        let f = AgentFilter {
            tenant: Some("t".into()),
            state: Some(FleetState::Unhealthy),
            ..AgentFilter::default()
        };
        let agents = app.store.agents(f).await.expect("agents");
        agents
            .into_iter()
            .filter(|a| a.connected)
            .map(|a| a.id)
            .collect::<Vec<_>>()
    };
    // Each mark after a fresh, locked clock report.
    let seen = |id: &'static str, at_s: i64| {
        let app = app.clone();
        async move {
            let at = RefTime::from_nanos(at_s * 1_000_000_000);
            let locked = baton_store::ClockRow {
                source: "ptp".into(),
                state: "locked".into(),
                offset: time::span(-12),
                jitter: time::span(3),
                uncertainty: time::span(250),
                frequency_ppm: 0.0,
                at,
            };
            app.store.record_clock(id, 1, locked).await.expect("clock");
            app.perform(id, Effect::Seen { session: 1, at })
                .await
                .expect("seen");
        }
    };
    for id in ["a1", "a2", "a3"] {
        seen(id, 1).await;
    }
    assert!(unhealthy().await.is_empty());
    app.record_late("a2", RefTime::from_nanos(2_000_000_000));
    for (i, n) in [500_u64, 2_000, 3_000, 4_000].into_iter().enumerate() {
        app.record_outbox("a3", n, RefTime::from_nanos((i as i64 + 2) * 5_000_000_000));
    }
    for id in ["a1", "a2", "a3"] {
        seen(id, 20).await;
    }
    assert_eq!(unhealthy().await, ["a2", "a3"]);
    let a3 = app.store.agent("a3").await.expect("read").expect("a3");
    assert_eq!(a3.health.outbox_entries, 4_000);
    // A minute after the late firing, a2 is well again; a3's backlog fell.
    app.record_outbox("a3", 100, RefTime::from_nanos(30_000_000_000));
    for id in ["a2", "a3"] {
        seen(id, 63).await;
    }
    assert!(unhealthy().await.is_empty());
}
