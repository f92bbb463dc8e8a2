//! One agent's stream against the in-memory store, on tokio's paused
//! clock: the test speaks the agent's side of the protocol through
//! channels and reads what the controller answers.

use std::sync::Arc;
use std::time::Duration;

use baton_proto::wire::{self, agent_message::Body as In, controller_message::Body as Out};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use super::{LinkPeer, run};
use crate::{ServerConfig, Shared};
use baton_app::events::Event;
use baton_app::{App, Caller};
use baton_model::{Binding, DeliveryState, PackKey};
use baton_pki::identity::Identity;
use baton_store::StoreOps;
use baton_store::memory::MemoryStore;

struct Test {
    shared: Arc<Shared>,
    /// The application's store, for a test to read what it holds.
    store: Arc<dyn baton_store::Store>,
    _stop: watch::Sender<bool>,
}

impl Test {
    fn new(binding: Binding) -> Test {
        Test::over(Arc::new(MemoryStore::new(binding)), binding)
    }

    fn over(store: Arc<dyn baton_store::Store>, binding: Binding) -> Test {
        let mut cfg = ServerConfig::new("127.0.0.1:0".parse().expect("addr"), std::env::temp_dir());
        cfg.ping_interval = Duration::from_secs(1);
        cfg.hello_timeout = Duration::from_secs(1);
        cfg.max_held = 4;
        cfg.binding = binding;
        let (stop, stop_rx) = watch::channel(false);
        let app = App::new(store.clone(), cfg.app_config());
        Test {
            shared: Shared::new(app, cfg, stop_rx),
            store,
            _stop: stop,
        }
    }

    fn app(&self) -> &Arc<App> {
        &self.shared.app
    }

    /// The first page of stored feedback.
    async fn feedback(&self) -> Vec<baton_model::FeedbackRow> {
        self.store
            .feedback(baton_model::FeedbackFilter::default())
            .await
            .expect("feedback")
    }

    async fn connect(&self, id: &str, journal: &str, held: &[(&str, &str, u64)]) -> Peer {
        let mut p = self.open(id, journal, held, LinkPeer::default()).await;
        match p.next().await {
            Ok(Out::Welcome(w)) => assert_eq!(w.agent_id, id),
            other => panic!("expected a welcome, got {other:?}"),
        }
        p
    }

    async fn open(
        &self,
        id: &str,
        journal: &str,
        held: &[(&str, &str, u64)],
        peer: LinkPeer,
    ) -> Peer {
        let (tx, rx) = mpsc::channel(64);
        let (out_tx, out_rx) = mpsc::channel(64);
        tokio::spawn(run(
            self.shared.clone(),
            ReceiverStream::new(rx),
            out_tx,
            peer,
        ));
        let p = Peer { tx, rx: out_rx };
        p.send(In::Hello(wire::Hello {
            agent_id: id.into(),
            journal_id: journal.into(),
            agent_version: "test".into(),
            packs: held
                .iter()
                .map(|(t, p, v)| wire::HeldPack {
                    pack: Some(pref(t, p, *v)),
                    stopped: false,
                })
                .collect(),
            ..Default::default()
        }))
        .await;
        p
    }

    async fn push(&self, yaml: &str) -> baton_app::packs::Pushed {
        self.app()
            .push(&Caller::new(Identity::Insecure), yaml.to_string(), "p.yaml")
            .await
            .expect("push")
    }

    async fn state(&self, agent: &str, tenant: &str, pack: &str) -> Option<DeliveryState> {
        let key = PackKey::new(tenant, pack);
        self.store
            .deliveries_of_agent(agent)
            .await
            .expect("rows")
            .into_iter()
            .find(|r| r.key() == key)
            .map(|r| r.state)
    }

    /// Waits for a delivery event of `agent` in `state`.
    async fn until_state(
        &self,
        events: &mut tokio::sync::broadcast::Receiver<Event>,
        agent: &str,
        state: DeliveryState,
    ) -> baton_model::DeliveryRow {
        self.until(events, |d| d.agent_id == agent && d.state == state)
            .await
    }

    /// Waits for a delivery event `want` accepts.
    async fn until(
        &self,
        events: &mut tokio::sync::broadcast::Receiver<Event>,
        want: impl Fn(&baton_model::DeliveryRow) -> bool,
    ) -> baton_model::DeliveryRow {
        loop {
            let e = tokio::time::timeout(Duration::from_secs(30), events.recv())
                .await
                .expect("an event within 30 s")
                .expect("events");
            if let Event::Delivery(d) = e
                && want(&d)
            {
                return d;
            }
        }
    }
}

struct Peer {
    tx: mpsc::Sender<Result<wire::AgentMessage, Status>>,
    rx: mpsc::Receiver<Result<wire::ControllerMessage, Status>>,
}

impl Peer {
    async fn send(&self, body: In) {
        self.tx
            .send(Ok(wire::AgentMessage { body: Some(body) }))
            .await
            .expect("stream open");
    }

    /// The next message that is not a ping (answered, as an agent does),
    /// or the stream's end status.
    async fn next(&mut self) -> Result<Out, Status> {
        loop {
            let m = tokio::time::timeout(Duration::from_secs(120), self.rx.recv())
                .await
                .expect("a message within 120 s");
            match m {
                None => return Err(Status::cancelled("stream ended without a status")),
                Some(Err(s)) => return Err(s),
                Some(Ok(m)) => match m.body {
                    Some(Out::Ping(p)) => {
                        let _ = self
                            .tx
                            .send(Ok(wire::AgentMessage {
                                body: Some(In::Pong(wire::Pong { id: p.id })),
                            }))
                            .await;
                    }
                    Some(b) => return Ok(b),
                    None => panic!("an empty message"),
                },
            }
        }
    }

    /// Nothing but pings for `d`.
    async fn quiet_for(&mut self, d: Duration) {
        if let Ok(m) = tokio::time::timeout(d, self.next()).await {
            panic!("expected nothing for {d:?}, got {m:?}");
        }
    }
}

fn pref(tenant: &str, pack: &str, version: u64) -> wire::PackRef {
    wire::PackRef {
        tenant: tenant.into(),
        pack: pack.into(),
        version,
    }
}

fn pack_yaml(tenant: &str, pack: &str, version: u64, targets: &str) -> String {
    format!(
        "pack: {pack}\nversion: {version}\ntenant: {tenant}\ntargets: {targets}\n\
         instructions:\n  - {{id: tick, action: noop, every: 1s}}\n"
    )
}

fn pushed(m: Result<Out, Status>) -> wire::PackRef {
    match m {
        Ok(Out::PackPush(p)) => p.pack.expect("ref"),
        other => panic!("expected a push, got {other:?}"),
    }
}

fn entry(seq: u64, tenant: &str, pack: &str, dropped_before: u64) -> wire::Feedback {
    wire::Feedback {
        seq,
        execution_id: format!("{tenant}/{pack}/v1/tick/{seq}/a1"),
        pack: Some(pref(tenant, pack, 1)),
        instruction: "tick".into(),
        attempt: 1,
        outcome: wire::Outcome::Ok as i32,
        event: "executed".into(),
        dropped_before,
        ..Default::default()
    }
}

#[tokio::test(start_paused = true)]
async fn a_push_reaches_a_connected_agent_and_its_ack_is_recorded() {
    let t = Test::new(Binding::Open);
    let mut a = t.connect("a1", "j1", &[]).await;
    let mut events = t.app().subscribe();
    let p = t
        .push(&pack_yaml("default", "p", 1, "{agents: [a1]}"))
        .await;
    assert_eq!(p.agents, ["a1"]);
    assert_eq!(pushed(a.next().await), pref("default", "p", 1));
    assert_eq!(
        t.state("a1", "default", "p").await,
        Some(DeliveryState::Pending)
    );
    a.send(In::PackAck(wire::PackAck {
        pack: Some(pref("default", "p", 1)),
        unchanged: false,
        ..Default::default()
    }))
    .await;
    let d = t.until_state(&mut events, "a1", DeliveryState::Acked).await;
    assert_eq!((d.version, d.attempts), (1, 1));
    // Acknowledged: a resync sends nothing again.
    a.quiet_for(Duration::from_secs(65)).await;
}

#[tokio::test(start_paused = true)]
async fn a_reconnect_gets_only_what_it_lacks() {
    let t = Test::new(Binding::Open);
    t.push(&pack_yaml("default", "same", 2, "{agents: [a1]}"))
        .await;
    t.push(&pack_yaml("default", "older", 3, "{agents: [a1]}"))
        .await;
    t.push(&pack_yaml("default", "ahead", 1, "{agents: [a1]}"))
        .await;
    // Holds `same` at the latest, `older` below it, `ahead` above what the
    // store knows (a store restored from an older copy).
    let mut a = t
        .connect(
            "a1",
            "j1",
            &[
                ("default", "same", 2),
                ("default", "older", 1),
                ("default", "ahead", 5),
            ],
        )
        .await;
    assert_eq!(pushed(a.next().await), pref("default", "older", 3));
    a.quiet_for(Duration::from_secs(5)).await;
    assert_eq!(
        t.state("a1", "default", "same").await,
        Some(DeliveryState::Acked)
    );
    // Never pushed below what it holds, never pending for ever: nacked
    // with the reason.
    let rows = t.store.deliveries_of_agent("a1").await.expect("rows");
    let ahead = rows.iter().find(|r| r.pack == "ahead").expect("row");
    assert_eq!(ahead.state, DeliveryState::Nacked);
    assert!(
        ahead.reason.contains("holds v5, newer than v1"),
        "{}",
        ahead.reason
    );
    let packs = t.store.packs(None).await.expect("packs");
    assert_eq!(
        packs.iter().find(|p| p.pack == "ahead").map(|p| p.ahead),
        Some(1)
    );
}

#[tokio::test(start_paused = true)]
async fn a_refusal_for_now_is_retried_with_backoff_a_final_one_is_not() {
    let t = Test::new(Binding::Open);
    let mut a = t.connect("a1", "j1", &[]).await;
    let mut events = t.app().subscribe();
    t.push(&pack_yaml("default", "p", 1, "{agents: [a1]}"))
        .await;
    pushed(a.next().await);
    a.send(In::PackNack(wire::PackNack {
        pack: Some(pref("default", "p", 1)),
        reason: wire::NackReason::ResourceExhausted as i32,
        message: "at capacity".into(),
        errors: Vec::new(),
    }))
    .await;
    let d = t
        .until(&mut events, |d| {
            d.state == DeliveryState::Pending && d.reason.contains("retrying")
        })
        .await;
    assert_eq!(d.reason, "at capacity (retrying)");
    let t0 = tokio::time::Instant::now();
    assert_eq!(pushed(a.next().await), pref("default", "p", 1));
    assert!(t0.elapsed() >= Duration::from_secs(2), "{:?}", t0.elapsed());
    // Now refused for good: nacked, with its errors, and not sent again.
    a.send(In::PackNack(wire::PackNack {
        pack: Some(pref("default", "p", 1)),
        reason: wire::NackReason::Refused as i32,
        message: "line 17 is not allowed".into(),
        errors: vec![wire::PackError {
            line: 6,
            column: 3,
            instruction: "tick".into(),
            message: "line 17 is not allowed".into(),
        }],
    }))
    .await;
    let d = t
        .until_state(&mut events, "a1", DeliveryState::Nacked)
        .await;
    assert_eq!(d.errors().len(), 1);
    assert_eq!(d.attempts, 2);
    a.quiet_for(Duration::from_secs(65)).await;
    // A newer version is sent again.
    t.push(&pack_yaml("default", "p", 2, "{agents: [a1]}"))
        .await;
    assert_eq!(pushed(a.next().await), pref("default", "p", 2));
}

#[tokio::test(start_paused = true)]
async fn a_cancel_reaches_the_holder_until_it_lets_go() {
    let t = Test::new(Binding::Open);
    t.push(&pack_yaml("default", "p", 1, "{agents: [a1]}"))
        .await;
    let mut a = t.connect("a1", "j1", &[("default", "p", 1)]).await;
    let c = t
        .app()
        .cancel(&Caller::new(Identity::Insecure), "default", "p")
        .await
        .expect("cancel");
    assert_eq!(c.agents, ["a1"]);
    match a.next().await {
        Ok(Out::PackCancel(c)) => assert_eq!(c.pack, Some(pref("default", "p", 1))),
        other => panic!("expected a cancel, got {other:?}"),
    }
    a.send(In::Held(wire::Held { packs: Vec::new() })).await;
    // Let go: nothing more to say, even at a resync.
    a.quiet_for(Duration::from_secs(65)).await;
    assert_eq!(
        t.state("a1", "default", "p").await,
        Some(DeliveryState::Cancelled)
    );
}

#[tokio::test(start_paused = true)]
async fn a_silent_peer_is_dead_after_three_pings_and_marked_disconnected() {
    let t = Test::new(Binding::Open);
    let (tx, rx) = mpsc::channel(4);
    let (out_tx, mut out_rx) = mpsc::channel(64);
    let task = tokio::spawn(run(
        t.shared.clone(),
        ReceiverStream::new(rx),
        out_tx,
        LinkPeer::default(),
    ));
    tx.send(Ok(wire::AgentMessage {
        body: Some(In::Hello(wire::Hello {
            agent_id: "a1".into(),
            journal_id: "j1".into(),
            ..Default::default()
        })),
    }))
    .await
    .expect("hello");
    // Pings go unanswered.
    let end = loop {
        match out_rx.recv().await {
            Some(Ok(_)) => continue,
            Some(Err(s)) => break s,
            None => panic!("ended without a status"),
        }
    };
    assert_eq!(end.code(), tonic::Code::Unavailable);
    assert!(end.message().contains("nothing received"), "{end}");
    task.await.expect("session");
    let a = t.store.agent("a1").await.expect("read").expect("agent");
    assert!(!a.connected);
    assert!(!t.app().hub.is_connected("a1"));
}

#[tokio::test(start_paused = true)]
async fn another_machine_under_the_same_id_is_refused_and_shown() {
    let t = Test::new(Binding::Open);
    let mut first = t.connect("a1", "j1", &[]).await;
    let mut second = t.open("a1", "j2", &[], LinkPeer::default()).await;
    let s = second.next().await.expect_err("refused");
    assert_eq!(s.code(), tonic::Code::AlreadyExists);
    assert!(
        s.message().contains("two machines under one identity"),
        "{s}"
    );
    let c = t.app().hub.conflict("a1").expect("recorded");
    assert_eq!(
        (c.holder_journal.as_str(), c.refused_journal.as_str()),
        ("j1", "j2")
    );
    // The first stream lives on; the same journal again replaces it.
    first.quiet_for(Duration::from_secs(2)).await;
    let _again = t.connect("a1", "j1", &[]).await;
    assert_eq!(
        first.next().await.expect_err("replaced").code(),
        tonic::Code::Aborted
    );
}

#[tokio::test(start_paused = true)]
async fn feedback_is_stored_only_for_the_agents_own_packs_and_gaps_are_counted() {
    let t = Test::new(Binding::Open);
    let mut a = t.connect("a1", "j1", &[("default", "mine", 1)]).await;
    a.send(In::Feedback(wire::FeedbackBatch {
        entries: vec![
            entry(1, "default", "mine", 0),
            entry(2, "default", "not-mine", 0),
            entry(5, "default", "mine", 2),
        ],
    }))
    .await;
    match a.next().await {
        // Everything acknowledged (the foreign entry must not come back).
        Ok(Out::FeedbackAck(ack)) => assert_eq!(ack.seq, 5),
        other => panic!("expected an ack, got {other:?}"),
    }
    let rows = t.feedback().await;
    let seqs: Vec<u64> = rows.iter().map(|r| r.seq).collect();
    assert_eq!(seqs, [1, 5]);
    assert_eq!(rows[1].dropped_before, 2);
    let m = t.app().metrics.render(1, None);
    assert!(
        m.contains("baton_controller_foreign_entries_total 1"),
        "{m}"
    );
    assert!(
        m.contains("baton_controller_feedback_dropped_at_agent_total 2"),
        "{m}"
    );
}

/// The agent sent a page whose first entry carried 3 drops, then (its
/// outbox at the cap before the ack came back) dropped that entry and
/// counted it again: the next page's first entry says 4. Only the 3
/// entries the stream skipped are drops; the carrier was stored.
#[tokio::test(start_paused = true)]
async fn a_count_of_drops_carried_again_is_held_to_what_the_stream_skipped() {
    let t = Test::new(Binding::Open);
    let mut a = t.connect("a1", "j1", &[("default", "mine", 1)]).await;
    a.send(In::Feedback(wire::FeedbackBatch {
        entries: vec![
            entry(4, "default", "mine", 3),
            entry(5, "default", "mine", 0),
        ],
    }))
    .await;
    assert!(matches!(a.next().await, Ok(Out::FeedbackAck(ack)) if ack.seq == 5));
    a.send(In::Feedback(wire::FeedbackBatch {
        entries: vec![
            entry(6, "default", "mine", 4),
            entry(8, "default", "mine", 9),
        ],
    }))
    .await;
    assert!(matches!(a.next().await, Ok(Out::FeedbackAck(ack)) if ack.seq == 8));
    let rows = t.feedback().await;
    let drops: Vec<(u64, u64)> = rows.iter().map(|r| (r.seq, r.dropped_before)).collect();
    assert_eq!(drops, [(4, 3), (5, 0), (6, 0), (8, 1)]);
    let m = t.app().metrics.render(1, None);
    assert!(
        m.contains("baton_controller_feedback_dropped_at_agent_total 4"),
        "{m}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_hello_listing_more_packs_than_allowed_is_refused() {
    let t = Test::new(Binding::Open);
    let held: Vec<(&str, String, u64)> = (0..5).map(|i| ("default", format!("p{i}"), 1)).collect();
    let held: Vec<(&str, &str, u64)> = held.iter().map(|(t, p, v)| (*t, p.as_str(), *v)).collect();
    let mut a = t.open("a1", "j1", &held, LinkPeer::default()).await;
    let s = a.next().await.expect_err("refused");
    assert_eq!(s.code(), tonic::Code::InvalidArgument);
    assert!(s.message().contains("5 held packs"), "{s}");
    assert!(t.store.agent("a1").await.expect("read").is_none());
}

#[tokio::test(start_paused = true)]
async fn an_agent_bound_to_one_tenant_cannot_claim_anothers() {
    let t = Test::new(Binding::Tenants);
    t.push(&pack_yaml("plant-b", "pb", 1, "{agents: [a1]}"))
        .await;
    let peer = LinkPeer {
        agent_id: Some("a1".into()),
        serial: None,
        tenants: Some(vec!["plant-a".into()]),
    };
    let mut a = t.open("a1", "j1", &[("plant-b", "pb", 1)], peer).await;
    match a.next().await {
        Ok(Out::Welcome(_)) => {}
        other => panic!("expected a welcome, got {other:?}"),
    }
    // plant-b's pack names it, but it serves plant-a only: no push, and
    // its claim to hold plant-b's pack is not recorded.
    a.quiet_for(Duration::from_secs(5)).await;
    assert_eq!(t.state("a1", "plant-b", "pb").await, None);
    a.send(In::Feedback(wire::FeedbackBatch {
        entries: vec![entry(1, "plant-b", "pb", 0)],
    }))
    .await;
    match a.next().await {
        Ok(Out::FeedbackAck(ack)) => assert_eq!(ack.seq, 1),
        other => panic!("expected an ack, got {other:?}"),
    }
    let rows = t.feedback().await;
    assert!(rows.is_empty(), "{rows:?}");
    // Granted to plant-b: now it is targeted.
    t.app()
        .grant(&Caller::new(Identity::Insecure), "a1", "plant-b", true)
        .await
        .expect("grant");
    assert_eq!(pushed(a.next().await), pref("plant-b", "pb", 1));
}

#[tokio::test(start_paused = true)]
async fn a_pack_of_a_tenant_taken_back_is_cancelled_even_after_a_reconnect() {
    let t = Test::new(Binding::Tenants);
    let admin = Caller::new(Identity::Insecure);
    t.app()
        .grant(&admin, "a1", "plant-b", true)
        .await
        .expect("grant");
    t.push(&pack_yaml("plant-b", "pb", 1, "{agents: [a1]}"))
        .await;
    let peer = || LinkPeer {
        agent_id: Some("a1".into()),
        serial: None,
        tenants: Some(vec!["plant-a".into()]),
    };
    let mut a = t.open("a1", "j1", &[], peer()).await;
    assert!(matches!(a.next().await, Ok(Out::Welcome(_))));
    assert_eq!(pushed(a.next().await), pref("plant-b", "pb", 1));
    a.send(In::PackAck(wire::PackAck {
        pack: Some(pref("plant-b", "pb", 1)),
        unchanged: false,
        ..Default::default()
    }))
    .await;
    drop(a);
    // The grant taken back while the agent is away: it comes back still
    // running plant-b's pack, and is told to cancel it.
    t.app()
        .grant(&admin, "a1", "plant-b", false)
        .await
        .expect("ungrant");
    let mut a = t.open("a1", "j1", &[("plant-b", "pb", 1)], peer()).await;
    assert!(matches!(a.next().await, Ok(Out::Welcome(_))));
    match a.next().await {
        Ok(Out::PackCancel(c)) => assert_eq!(c.pack, Some(pref("plant-b", "pb", 1))),
        other => panic!("expected a cancel, got {other:?}"),
    }
}

/// Another replica took the agent (its hello raised the generation in the
/// shared store): this stream's next write for the agent is refused, the
/// stream ends ABORTED, and nothing it received is stored or acked. The
/// generation rides on the Welcome and every push.
#[tokio::test(start_paused = true)]
async fn a_stream_whose_agent_said_hello_elsewhere_is_fenced() {
    let t = Test::new(Binding::Open);
    let mut a = t.open("a1", "j1", &[], LinkPeer::default()).await;
    match a.next().await {
        Ok(Out::Welcome(w)) => assert_eq!(w.session_gen, 1),
        other => panic!("expected a welcome, got {other:?}"),
    }
    t.push(&pack_yaml("default", "p", 1, "{agents: [a1]}"))
        .await;
    match a.next().await {
        Ok(Out::PackPush(p)) => assert_eq!(p.session_gen, 1),
        other => panic!("expected a push, got {other:?}"),
    }
    // The agent's hello on another replica (same store).
    let mut elsewhere = baton_store::contract::hello("a1", 5);
    elsewhere.journal_id = "j1".into();
    let (taken, _) = t.store.agent_hello(elsewhere).await.expect("hello");
    assert_eq!(taken.session_gen, 2);
    a.send(In::Feedback(wire::FeedbackBatch {
        entries: vec![entry(1, "default", "p", 0)],
    }))
    .await;
    a.send(In::PackAck(wire::PackAck {
        pack: Some(pref("default", "p", 1)),
        unchanged: false,
        ..Default::default()
    }))
    .await;
    loop {
        match a.next().await {
            Ok(Out::FeedbackAck(ack)) => panic!("a fenced stream acked feedback: {ack:?}"),
            Ok(_) => {}
            Err(s) => {
                assert_eq!(s.code(), tonic::Code::Aborted, "{s:?}");
                assert!(s.message().contains("no longer owns"), "{s:?}");
                break;
            }
        }
    }
    assert!(t.feedback().await.is_empty());
    assert_eq!(
        t.state("a1", "default", "p").await,
        Some(DeliveryState::Pending)
    );
    // Still the other stream's, and still connected.
    let a1 = t.store.agent("a1").await.expect("read").expect("a1");
    assert_eq!((a1.session_gen, a1.connected), (2, true));
}

/// Two replicas on one PostgreSQL database: a push made through one
/// reaches an agent streaming to the other within a follow, not at its
/// resync; a watcher on either sees the other's agents come and go, and
/// an operator's action on the other, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_hear_of_each_other_through_the_store() {
    let Some(stores) = baton_sql::postgres::test_replicas(&["ra", "rb"]) else {
        return;
    };
    let mut stores = stores.into_iter();
    let (a, b) = (
        Test::over(Arc::new(stores.next().expect("ra")), Binding::Open),
        Test::over(Arc::new(stores.next().expect("rb")), Binding::Open),
    );
    for t in [&a, &b] {
        tokio::spawn(baton_app::follow::relay(
            t.app().clone(),
            t._stop.subscribe(),
        ));
        tokio::spawn(baton_app::follow::follow_everything(
            t.app().clone(),
            t._stop.subscribe(),
        ));
    }
    let mut on_b = b.app().subscribe();
    let mut agent = a.connect("a1", "j1", &[]).await;
    let seen = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Event::Agent(e) = on_b.recv().await.expect("events") {
                return e;
            }
        }
    })
    .await
    .expect("b's watcher hears a1 connect on a");
    assert_eq!(
        (seen.agent_id.as_str(), seen.kind),
        ("a1", baton_app::events::AgentEventKind::Connected)
    );
    // Pushed through b: a's stream sends it, well before a resync (30 s).
    b.push(&pack_yaml("default", "p", 1, "{agents: [a1]}"))
        .await;
    let started = std::time::Instant::now();
    let sent = tokio::time::timeout(Duration::from_secs(10), agent.next())
        .await
        .expect("a push within 10 s");
    assert_eq!(pushed(sent), pref("default", "p", 1));
    assert!(started.elapsed() < Duration::from_secs(10));
    // The ack on a is seen by b's watcher, once, as acked.
    agent
        .send(In::PackAck(wire::PackAck {
            pack: Some(pref("default", "p", 1)),
            unchanged: false,
            ..Default::default()
        }))
        .await;
    let acked = b.until_state(&mut on_b, "a1", DeliveryState::Acked).await;
    assert_eq!(acked.version, 1);

    // An operator's action on a: a's pages hear it at once, b's through
    // the store, each once.
    let mut on_a = a.app().subscribe();
    let operator = Caller::new(Identity::Insecure);
    a.app()
        .cancel_as(&operator, "default", "p", &["a1".to_string()])
        .await
        .expect("cancel on a1");
    let action = |e: &Event| match e {
        Event::Action(x) => Some(x.text.clone()),
        _ => None,
    };
    let next_action = |rx: &mut tokio::sync::broadcast::Receiver<Event>| {
        let mut rx = rx.resubscribe();
        async move {
            loop {
                let e = rx.recv().await.expect("events");
                if let Some(t) = action(&e) {
                    return t;
                }
            }
        }
    };
    let heard_b = tokio::time::timeout(Duration::from_secs(10), next_action(&mut on_b))
        .await
        .expect("b's watcher hears a's action");
    assert!(heard_b.contains("cancelled the pack on a1"), "{heard_b}");
    // Ordered after a's action row (b already read it): a push through b.
    // Until its row reaches a, a's watcher hears the action once.
    b.push(&pack_yaml("default", "p", 2, "{agents: [a1]}"))
        .await;
    let mut actions_on_a = Vec::new();
    loop {
        let e = tokio::time::timeout(Duration::from_secs(10), on_a.recv())
            .await
            .expect("a hears b's push")
            .expect("events");
        actions_on_a.extend(action(&e));
        if matches!(&e, Event::Delivery(d) if d.version == 2) {
            break;
        }
    }
    assert_eq!(actions_on_a.len(), 1, "{actions_on_a:?}");
    let _ = a._stop.send(true);
    let _ = b._stop.send(true);
}
