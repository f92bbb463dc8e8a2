//! The controller link, in process: a fake controller (a tonic
//! `LinkServer` on 127.0.0.1:0, on a runtime of its own, driven by the test
//! through channels) and an agent built from parts (a manual clock, the sim
//! GPIO backend behind the in-memory device, a real journal).
//!
//! The agent's own time is the manual clock; the link runs in real time.
//! The test steps the agent while it waits for what the fake controller
//! reports, each wait bounded by a timeout: nothing sleeps to wait.

mod rig;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

use baton_agent::config::{ConfigFile, Overrides};
use baton_agent::runtime::StopFlag;
use baton_agent::runtime::ports::Clock;
use baton_proto::wire::agent_message::Body as A;
use baton_proto::wire::controller_message::Body as C;
use baton_proto::wire::{self, ControllerMessage};
use rig::fake::{Ev, Fake, ToAgent, fake};
use rig::*;

/// The longest any single wait may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(20);

/// An agent linked to a fake controller.
struct H {
    r: Rig,
    fake: Fake,
    /// The controller side of the current stream.
    tx: Option<ToAgent>,
    stream: u64,
}

fn harness() -> H {
    harness_with(ConfigFile::default())
}

fn harness_with(file: ConfigFile) -> H {
    harness_on(file, baton_agent::runtime::ports::ManualClock::new(t(0)))
}

fn harness_on(file: ConfigFile, clock: baton_agent::runtime::ports::ManualClock) -> H {
    let fake = fake();
    let url = format!("http://{}", fake.addr);
    harness_to(fake, vec![url], file, clock)
}

/// An agent dialling `urls`, watched through `fake` (one of them, or none).
fn harness_to(
    fake: Fake,
    urls: Vec<String>,
    file: ConfigFile,
    clock: baton_agent::runtime::ports::ManualClock,
) -> H {
    let r = rig_with_clock(
        file,
        Overrides {
            controllers: urls,
            insecure: true,
            labels: vec![("site".into(), "test".into())],
            ..Overrides::default()
        },
        clock,
    );
    H {
        r,
        fake,
        tx: None,
        stream: 0,
    }
}

fn msg(body: C) -> ControllerMessage {
    ControllerMessage { body: Some(body) }
}

fn welcome(acked: u64, ping_ms: u32) -> ControllerMessage {
    msg(C::Welcome(wire::Welcome {
        session_gen: 0,
        agent_id: "t".into(),
        feedback_acked_seq: acked,
        controller_time_ns: 0,
        ping_interval_ms: ping_ms,
    }))
}

fn pack_ref(pack: &str, version: u64) -> wire::PackRef {
    wire::PackRef {
        tenant: "default".into(),
        pack: pack.into(),
        version,
    }
}

fn push(pack: &str, version: u64, yaml: &str) -> ControllerMessage {
    msg(C::PackPush(wire::PackPush {
        session_gen: 0,
        pack: Some(pack_ref(pack, version)),
        yaml: yaml.into(),
        ..Default::default()
    }))
}

/// `(pack, version, stopped)` of each held pack.
fn held(packs: &[wire::HeldPack]) -> Vec<(String, u64, bool)> {
    packs
        .iter()
        .map(|h| {
            let p = h.pack.clone().unwrap_or_default();
            (p.pack, p.version, h.stopped)
        })
        .collect()
}

impl H {
    /// The next thing the fake controller saw, stepping the agent (on its
    /// manual clock, which does not move) while waiting.
    fn event(&mut self) -> Ev {
        let end = Instant::now() + PATIENCE;
        loop {
            self.r.agent.step().expect("step");
            match self.fake.events.recv_timeout(Duration::from_millis(2)) {
                Ok(e) => return e,
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => panic!("the fake controller is gone"),
            }
            assert!(
                Instant::now() < end,
                "nothing from the agent within {PATIENCE:?}"
            );
        }
    }

    /// Wait for the agent's next stream and its Hello.
    fn connected(&mut self) -> wire::Hello {
        loop {
            match self.event() {
                Ev::Opened { stream, tx } => {
                    self.stream = stream;
                    self.tx = Some(tx);
                }
                Ev::Msg { stream, msg } if stream == self.stream => match msg.body {
                    Some(A::Hello(h)) => return h,
                    other => panic!("the first message must be Hello, got {other:?}"),
                },
                _ => {}
            }
        }
    }

    /// Connect and welcome (acked 0, default ping interval).
    fn session(&mut self) -> wire::Hello {
        let h = self.connected();
        self.send(welcome(0, 0));
        h
    }

    fn send(&mut self, m: ControllerMessage) {
        self.tx
            .as_ref()
            .expect("a stream")
            .try_send(Ok(m))
            .expect("room towards the agent");
    }

    /// The next message on the current stream for which `f` says
    /// something, skipping the others (clock reports, feedback...).
    fn expect<T>(&mut self, what: &str, mut f: impl FnMut(&A) -> Option<T>) -> T {
        let end = Instant::now() + PATIENCE;
        loop {
            assert!(Instant::now() < end, "no {what} within {PATIENCE:?}");
            if let Ev::Msg { stream, msg } = self.event()
                && stream == self.stream
                && let Some(t) = msg.body.as_ref().and_then(&mut f)
            {
                return t;
            }
        }
    }

    fn ack(&mut self) -> wire::PackAck {
        self.expect("ack or nack", |b| match b {
            A::PackAck(a) => Some(a.clone()),
            A::PackNack(n) => panic!("nacked: {n:?}"),
            _ => None,
        })
    }

    fn nack(&mut self) -> wire::PackNack {
        self.expect("ack or nack", |b| match b {
            A::PackNack(n) => Some(n.clone()),
            A::PackAck(a) => panic!("acked: {a:?}"),
            _ => None,
        })
    }

    fn held(&mut self) -> Vec<(String, u64, bool)> {
        self.expect("held", |b| match b {
            A::Held(h) => Some(held(&h.packs)),
            _ => None,
        })
    }

    /// Close the current stream from the controller's side and wait for
    /// the agent's side to end.
    fn drop_stream(&mut self) {
        self.tx = None;
        let s = self.stream;
        while !matches!(self.event(), Ev::Closed { stream } if stream == s) {}
    }

    /// Step the agent (on link events) until its outbox is empty: every
    /// entry acknowledged; fails after `PATIENCE`.
    fn until_outbox_empty(&mut self) {
        let end = Instant::now() + PATIENCE;
        while self.r.agent.journal().outbox_range().is_some() {
            assert!(
                Instant::now() < end,
                "{:?}",
                self.r.agent.journal().outbox_range()
            );
            let _ = self.fake.events.recv_timeout(Duration::from_millis(2));
            self.r.agent.step().expect("step");
        }
    }

    /// Advance the agent's clock by `d` in `every` steps (firings happen).
    fn run_for(&mut self, d: Duration, every: Duration) {
        let until = self.r.clock.now() + d;
        self.r.run_until(until, every);
    }
}

const BLINK: &str = "safe_state:\n  - {action: gpio.write, params: {line: 7, value: 0}}\ninstructions:\n  - {id: on, action: gpio.write, params: {line: 7, value: 1}, every: 100ms}\n";

#[test]
fn hello_names_the_agent_its_packs_its_journal_and_its_outbox() {
    let mut h = harness();
    let first = h.connected();
    assert_eq!(first.agent_id, "t");
    assert_eq!(first.agent_version, env!("CARGO_PKG_VERSION"));
    assert_eq!(first.labels.get("site").map(String::as_str), Some("test"));
    for c in ["gpio", "exec", "lease"] {
        assert!(first.capabilities.iter().any(|x| x == c), "{c}");
    }
    assert_eq!(first.max_packs, 256);
    assert!(first.packs.is_empty());
    assert_eq!(first.journal_id, h.r.agent.journal().id());
    assert_eq!(first.journal_id.len(), 32);
    assert_eq!((first.feedback_first_seq, first.feedback_last_seq), (0, 0));

    // A pack and some feedback, never welcomed (nothing is sent), then a
    // new stream: Hello tells it all.
    h.r.accept(&pack("blink", 3, BLINK)).expect("accepted");
    h.run_for(Duration::from_millis(350), Duration::from_millis(5));
    let (front, back) = h.r.agent.journal().outbox_range().expect("feedback held");
    h.drop_stream();
    let second = h.connected();
    assert_eq!(held(&second.packs), [("blink".to_string(), 3, false)]);
    assert_eq!(second.journal_id, first.journal_id);
    assert_eq!(
        (second.feedback_first_seq, second.feedback_last_seq),
        (front, back)
    );
    assert!(back >= front + 3, "four firings reported: {front}..={back}");

    // The way out stops the link thread, bounded.
    let stop = StopFlag::default();
    stop.request(0);
    let t0 = Instant::now();
    let _ = h.r.agent.run(&stop, false);
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    assert_eq!(h.r.level(7), Some(0), "safe state on the way out");
    let s = h.stream;
    loop {
        match h.fake.events.recv_timeout(PATIENCE) {
            Ok(Ev::Closed { stream }) if stream == s => break,
            Ok(_) => {}
            Err(e) => panic!("the link did not close its stream: {e}"),
        }
    }
}

#[test]
fn pushes_are_acked_then_held_and_the_same_version_again_is_unchanged() {
    let mut h = harness();
    h.session();
    let yaml = pack("blink", 1, BLINK);
    h.send(push("blink", 1, &yaml));
    let a = h.ack();
    assert_eq!(a.pack, Some(pack_ref("blink", 1)));
    assert!(!a.unchanged);
    assert_eq!(h.held(), [("blink".to_string(), 1, false)]);
    // It runs.
    h.run_for(Duration::from_millis(50), Duration::from_millis(5));
    assert_eq!(h.r.level(7), Some(1));
    // Again: unchanged.
    h.send(push("blink", 1, &yaml));
    assert!(h.ack().unchanged);
    // A higher version replaces it.
    h.send(push("blink", 2, &pack("blink", 2, BLINK)));
    assert!(!h.ack().unchanged);
    assert_eq!(h.held(), [("blink".to_string(), 2, false)]);
}

#[test]
fn an_invalid_push_is_nacked_with_every_error_and_its_position() {
    let mut h = harness();
    h.session();
    let yaml = "pack: bad\nversion: 1\nlease: 0s\ninstructions:\n  - {id: a, action: nop, every: 1s}\n  - {id: b, action: noop, every: 0s}\n";
    h.send(push("bad", 1, yaml));
    let n = h.nack();
    assert_eq!(n.reason(), wire::NackReason::Invalid);
    assert_eq!(n.pack, Some(pack_ref("bad", 1)));
    let errors: Vec<(u32, u32, &str)> = n
        .errors
        .iter()
        .map(|e| (e.line, e.column, e.instruction.as_str()))
        .collect();
    assert_eq!(errors, [(3, 8, ""), (5, 21, "a"), (6, 34, "b")], "{n:?}");
    assert!(
        n.errors[0]
            .message
            .contains("lease must be greater than zero")
    );
    assert!(n.message.contains("3 error(s)"), "{}", n.message);

    // A YAML that is not the pack its reference names.
    h.send(push("other", 1, &pack("blink", 1, BLINK)));
    let n = h.nack();
    assert_eq!(n.reason(), wire::NackReason::Invalid);
    assert!(
        n.message.contains("names pack default/other v1") && n.message.contains("default/blink v1"),
        "{}",
        n.message
    );
    // A push without any reference is answered too.
    h.send(msg(C::PackPush(wire::PackPush {
        session_gen: 0,
        pack: None,
        yaml: pack("blink", 1, BLINK),
        ..Default::default()
    })));
    assert_eq!(h.nack().reason(), wire::NackReason::Invalid);
}

#[test]
fn a_push_this_agent_does_not_allow_is_refused_and_capacity_is_resource_exhausted() {
    let mut h = harness_with(ConfigFile {
        max_packs: Some(2),
        ..ConfigFile::default()
    });
    h.session();
    // An exec of a program not on this agent's allowlist.
    let exec =
        "instructions:\n  - {id: x, action: exec, params: {program: /usr/bin/true}, every: 1s}\n";
    h.send(push("runner", 1, &pack("runner", 1, exec)));
    let n = h.nack();
    assert_eq!(n.reason(), wire::NackReason::Refused, "{n:?}");
    assert!(n.message.contains("/usr/bin/true"), "{}", n.message);
    assert!(n.errors.is_empty());

    // Versions only go up.
    h.send(push("blink", 2, &pack("blink", 2, BLINK)));
    h.ack();
    h.send(push("blink", 1, &pack("blink", 1, BLINK)));
    let n = h.nack();
    assert_eq!(n.reason(), wire::NackReason::Refused);
    assert!(n.message.contains("older"), "{}", n.message);

    // Two packs held: a third is refused for now, the held ones still pass.
    let noop = "instructions:\n  - {id: n, action: noop, every: 1s}\n";
    h.send(push("second", 1, &pack("second", 1, noop)));
    h.ack();
    h.send(push("third", 1, &pack("third", 1, noop)));
    let n = h.nack();
    assert_eq!(n.reason(), wire::NackReason::ResourceExhausted, "{n:?}");
    h.send(push("blink", 3, &pack("blink", 3, BLINK)));
    assert!(!h.ack().unchanged, "a held pack's new version still fits");
}

/// Feedback entries of FeedbackBatch messages on the current stream until
/// `n` have arrived.
fn feedback(h: &mut H, n: usize) -> Vec<wire::Feedback> {
    let mut got = Vec::new();
    while got.len() < n {
        let mut batch = h.expect("feedback", |b| match b {
            A::Feedback(f) => Some(f.entries.clone()),
            _ => None,
        });
        got.append(&mut batch);
    }
    got
}

#[test]
fn feedback_flows_in_seq_order_stays_until_acked_and_is_sent_again_after_a_reconnect() {
    let mut h = harness();
    h.session();
    let beat = "instructions:\n  - {id: n, action: noop, every: 100ms}\n";
    h.send(push("beat", 1, &pack("beat", 1, beat)));
    h.ack();
    h.run_for(Duration::from_millis(950), Duration::from_millis(5));
    // Ten firings (0, 100, ..., 900 ms).
    let got = feedback(&mut h, 10);
    let seqs: Vec<u64> = got.iter().map(|f| f.seq).collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as u64).collect::<Vec<_>>(),
        "in order, none missing"
    );
    for f in &got {
        assert_eq!(f.outcome(), wire::Outcome::Ok);
        assert_eq!((f.event.as_str(), f.action.as_str()), ("executed", "noop"));
        assert_eq!(f.pack, Some(pack_ref("beat", 1)));
        assert_eq!(f.attempt, 1);
        assert!(
            f.execution_id.starts_with("default/beat/v1/n/"),
            "{}",
            f.execution_id
        );
    }
    // Nothing acknowledged: all still in the journal.
    let last = *seqs.last().expect("entries");
    assert_eq!(h.r.agent.journal().outbox_range(), Some((1, last)));
    // Acknowledge some: they leave the journal, the rest stays.
    h.send(msg(C::FeedbackAck(wire::FeedbackAck { seq: 4 })));
    let end = Instant::now() + PATIENCE;
    while h.r.agent.journal().outbox_range() != Some((5, last)) {
        assert!(
            Instant::now() < end,
            "{:?}",
            h.r.agent.journal().outbox_range()
        );
        let _ = h.fake.events.recv_timeout(Duration::from_millis(2));
        h.r.agent.step().expect("step");
    }

    // The stream dies; the next one starts from what the controller says
    // it has (acked 6 here: it stored two more before the cut).
    h.drop_stream();
    let hello = h.connected();
    assert_eq!(
        (hello.feedback_first_seq, hello.feedback_last_seq),
        (5, last)
    );
    h.send(welcome(6, 0));
    let again = feedback(&mut h, (last - 6) as usize);
    let seqs: Vec<u64> = again.iter().map(|f| f.seq).collect();
    assert_eq!(seqs, (7..=last).collect::<Vec<_>>());
    assert_eq!(h.r.agent.journal().outbox_range(), Some((7, last)));
    h.send(msg(C::FeedbackAck(wire::FeedbackAck { seq: last })));
    h.until_outbox_empty();
}

#[test]
fn a_cancel_drives_the_safe_state_and_held_no_longer_lists_the_pack() {
    let mut h = harness();
    h.session();
    h.send(push("blink", 1, &pack("blink", 1, BLINK)));
    h.ack();
    assert_eq!(h.held(), [("blink".to_string(), 1, false)]);
    h.run_for(Duration::from_millis(50), Duration::from_millis(5));
    assert_eq!(h.r.level(7), Some(1));
    h.send(msg(C::PackCancel(wire::PackCancel {
        session_gen: 0,
        pack: Some(pack_ref("blink", 1)),
    })));
    assert_eq!(h.held(), []);
    // The safe state is reported (right after the Held).
    let safe = h.expect("safe state feedback", |b| match b {
        A::Feedback(f) => f
            .entries
            .iter()
            .find(|e| e.outcome() == wire::Outcome::SafeState)
            .cloned(),
        _ => None,
    });
    assert_eq!(safe.event, "safe_state");
    assert_eq!(safe.pack, Some(pack_ref("blink", 1)));
    assert!(safe.detail.contains("cancel"), "{}", safe.detail);
    h.run_for(Duration::from_millis(300), Duration::from_millis(5));
    assert_eq!(h.r.level(7), Some(0), "safe state, and nothing after it");
    // Again, or a pack never held: just Held.
    h.send(msg(C::PackCancel(wire::PackCancel {
        session_gen: 0,
        pack: Some(pack_ref("blink", 1)),
    })));
    assert_eq!(h.held(), []);
    h.send(msg(C::PackCancel(wire::PackCancel {
        pack: None,
        session_gen: 0,
    })));
    assert_eq!(h.held(), []);
}

#[test]
fn a_lease_lost_while_disconnected_stops_that_pack_only_until_a_higher_version() {
    let mut h = harness();
    h.session();
    let leased = "lease: 2s\nsafe_state:\n  - {action: gpio.write, params: {line: 1, value: 0}}\ninstructions:\n  - {id: t, action: gpio.toggle, params: {line: 1}, every: 100ms}\n";
    let free = "safe_state:\n  - {action: gpio.write, params: {line: 2, value: 0}}\ninstructions:\n  - {id: t, action: gpio.toggle, params: {line: 2}, every: 100ms}\n";
    h.send(push("leased", 1, &pack("leased", 1, leased)));
    h.ack();
    h.send(push("free", 1, &pack("free", 1, free)));
    h.ack();
    h.run_for(Duration::from_millis(500), Duration::from_millis(10));

    // The controller goes away and stays away.
    h.fake.refuse.store(true, Ordering::Release);
    h.drop_stream();
    let writes = |h: &H, line: i64| h.r.writes().iter().filter(|w| w["line"] == line).count();
    let before = (writes(&h, 1), writes(&h, 2));
    // Well within the lease: both run.
    h.run_for(Duration::from_millis(1000), Duration::from_millis(10));
    assert!(writes(&h, 1) > before.0 && writes(&h, 2) > before.1);
    // Past it: the leased pack's safe state; the other keeps running.
    h.run_for(Duration::from_millis(1500), Duration::from_millis(10));
    assert_eq!(h.r.level(1), Some(0));
    let stopped_at = (writes(&h, 1), writes(&h, 2));
    h.run_for(Duration::from_millis(1000), Duration::from_millis(10));
    assert_eq!(
        writes(&h, 1),
        stopped_at.0,
        "nothing of the leased pack after its safe state"
    );
    assert!(
        writes(&h, 2) >= stopped_at.1 + 9,
        "the pack without a lease runs on"
    );

    // The controller is back: Hello shows it stopped, feedback says why.
    h.fake.refuse.store(false, Ordering::Release);
    let hello = h.connected();
    assert_eq!(
        held(&hello.packs),
        [
            ("free".to_string(), 1, false),
            ("leased".to_string(), 1, true)
        ]
    );
    h.send(welcome(0, 0));
    let safe = h.expect("lease_lost feedback", |b| match b {
        A::Feedback(f) => f
            .entries
            .iter()
            .find(|e| e.outcome() == wire::Outcome::SafeState)
            .cloned(),
        _ => None,
    });
    assert_eq!(safe.pack, Some(pack_ref("leased", 1)));
    assert!(safe.detail.contains("lease_lost"), "{}", safe.detail);

    // The same version again does not revive it; a higher one does.
    h.send(push("leased", 1, &pack("leased", 1, leased)));
    assert!(h.ack().unchanged);
    h.run_for(Duration::from_millis(300), Duration::from_millis(10));
    assert_eq!(writes(&h, 1), stopped_at.0);
    h.send(push("leased", 2, &pack("leased", 2, leased)));
    assert!(!h.ack().unchanged);
    assert_eq!(
        h.held(),
        [
            ("free".to_string(), 1, false),
            ("leased".to_string(), 2, false)
        ]
    );
    h.run_for(Duration::from_millis(300), Duration::from_millis(10));
    assert!(writes(&h, 1) > stopped_at.0, "v2 runs");
}

#[test]
fn a_silent_controller_is_dropped_within_three_ping_intervals() {
    let mut h = harness();
    h.connected();
    let first = h.stream;
    // Welcome with a 100 ms ping interval, then silence on an open stream
    // (HTTP/2 keeps answering its own pings: only the agent's watchdog can
    // tell).
    h.send(welcome(0, 100));
    let t0 = Instant::now();
    let mut closed = None;
    let reopened = loop {
        match h.event() {
            Ev::Closed { stream } if stream == first => closed = Some(t0.elapsed()),
            Ev::Opened { stream, tx } => {
                h.stream = stream;
                h.tx = Some(tx);
                break t0.elapsed();
            }
            _ => {}
        }
    };
    let closed = closed.expect("the silent stream was closed first");
    assert!(
        closed >= Duration::from_millis(250) && closed < Duration::from_millis(2500),
        "dropped after {closed:?} (3 × 100 ms)"
    );
    // Then a new stream after the backoff (at most 0.5 s the first time).
    assert!(
        reopened < closed + Duration::from_millis(2500),
        "{reopened:?}"
    );
    h.expect("hello", |b| match b {
        A::Hello(_) => Some(()),
        _ => None,
    });
}

#[test]
fn pings_and_time_exchanges_are_answered_and_keep_a_quiet_session_alive() {
    let mut h = harness();
    h.connected();
    // A 200 ms ping interval: silence past 600 ms would drop the stream.
    h.send(welcome(0, 200));
    let end = Instant::now() + Duration::from_millis(1500);
    let mut id = 0;
    while Instant::now() < end {
        id += 1;
        h.send(msg(C::Ping(wire::Ping { id })));
        // On the same stream, or this times out: no reconnect happened.
        let pong = h.expect("pong", |b| match b {
            A::Pong(p) => Some(p.id),
            _ => None,
        });
        assert_eq!(pong, id);
    }
    h.send(msg(C::TimeExchangeRequest(wire::TimeExchangeRequest {
        id: 3,
        t1_ns: 5,
    })));
    let r = h.expect("time exchange reply", |b| match b {
        A::TimeExchangeReply(r) => Some(*r),
        _ => None,
    });
    let now = h.r.clock.now().as_nanos();
    assert_eq!((r.id, r.t1_ns, r.t2_ns, r.t3_ns), (3, 5, now, now));
}

#[test]
fn an_ack_beyond_what_the_journal_wrote_does_not_swallow_later_feedback() {
    let mut h = harness();
    h.connected();
    // A confused controller claims feedback this journal never wrote.
    h.send(welcome(1000, 0));
    let beat = "instructions:\n  - {id: n, action: noop, every: 100ms}\n";
    h.send(push("beat", 1, &pack("beat", 1, beat)));
    h.ack();
    h.run_for(Duration::from_millis(250), Duration::from_millis(5));
    let got = feedback(&mut h, 3);
    let seqs: Vec<u64> = got.iter().map(|f| f.seq).collect();
    assert_eq!(seqs, [1, 2, 3]);
    h.send(msg(C::FeedbackAck(wire::FeedbackAck { seq: 5000 })));
    // Taken as "up to 3" (all there is): the outbox empties.
    h.until_outbox_empty();
    h.run_for(Duration::from_millis(100), Duration::from_millis(5));
    let got = feedback(&mut h, 1);
    assert_eq!(got[0].seq, 4, "the next record is still sent");
}

#[test]
fn a_controller_that_stops_reading_for_a_while_holds_the_agent_back_and_loses_nothing() {
    let mut h = harness();
    h.connected();
    // Two thousand feedback records, not yet sent (no Welcome).
    h.r.accept(&pack(
        "beat",
        1,
        "instructions:\n  - {id: n, action: noop, every: 1ms}\n",
    ))
    .expect("accepted");
    h.run_for(Duration::from_millis(1999), Duration::from_millis(1));
    let (_, last) = h.r.agent.journal().outbox_range().expect("feedback");
    assert!(last >= 2000, "{last}");

    // The controller stops reading, welcomes the agent and pushes far more
    // than the channels between link and control thread hold.
    h.fake.deaf.store(true, Ordering::Release);
    let tx = h.tx.clone().expect("stream");
    let yaml = pack(
        "p",
        1,
        "instructions:\n  - {id: n, action: noop, every: 1h}\n",
    );
    const PUSHES: usize = 600;
    let feeder = std::thread::spawn(move || {
        tx.blocking_send(Ok(welcome(0, 0))).expect("welcome");
        for _ in 0..PUSHES {
            tx.blocking_send(Ok(push("p", 1, &yaml))).expect("push");
        }
    });
    // The agent keeps stepping meanwhile: it must neither block nor spin
    // up memory; the link holds back.
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(1000) {
        h.r.agent.step().expect("step");
        std::thread::park_timeout(Duration::from_millis(2));
    }
    // Listening again: everything arrives, on the same stream.
    h.fake.deaf.store(false, Ordering::Release);
    let stream = h.stream;
    let (mut acks, mut seqs) = (0, Vec::new());
    let end = Instant::now() + PATIENCE;
    while acks < PUSHES || seqs.len() < last as usize {
        assert!(
            Instant::now() < end,
            "{acks} acks, {} feedback entries",
            seqs.len()
        );
        match h.event() {
            Ev::Msg { stream: s, msg } => {
                assert_eq!(s, stream, "no reconnect");
                match msg.body {
                    Some(A::PackAck(_)) => acks += 1,
                    Some(A::PackNack(n)) => panic!("nacked: {n:?}"),
                    Some(A::Feedback(f)) => seqs.extend(f.entries.iter().map(|e| e.seq)),
                    _ => {}
                }
            }
            Ev::Opened { .. } | Ev::Closed { .. } | Ev::Exhausted => {
                panic!("the stream was dropped")
            }
        }
    }
    feeder.join().expect("feeder");
    // (The pushed pack fires once too: there may be one more.)
    let in_order = seqs.iter().zip(1..).all(|(s, want)| *s == want);
    assert!(
        in_order && seqs.len() as u64 >= last,
        "every record once, in order: {} entries, first {:?}, last {:?}",
        seqs.len(),
        seqs.first(),
        seqs.last()
    );
}

/// Issue 26.11: Hello is the first message on every stream, even when the
/// control thread is slow to hand it over and the link has something of
/// its own to say first (a time request, due at once, once the response
/// headers arrive). The control thread is held back by not stepping the
/// agent until the stream is open and the link's time request is due.
#[test]
fn hello_is_first_even_when_the_control_thread_is_slow_to_hand_it_over() {
    let clock = baton_agent::runtime::ports::ManualClock::new(t(0)).taking_samples();
    let mut h = harness_on(ConfigFile::default(), clock);
    // Not stepping the agent: the control thread has not seen Connected,
    // so no Hello is queued. Wait for the stream (its headers went back at
    // once) without stepping.
    let stream = match h.fake.events.recv_timeout(PATIENCE) {
        Ok(Ev::Opened { stream, tx }) => {
            h.tx = Some(tx);
            stream
        }
        Ok(Ev::Msg { msg, .. }) => panic!("a message before the stream opened: {msg:?}"),
        Ok(Ev::Closed { .. } | Ev::Exhausted) => panic!("closed"),
        Err(e) => panic!("no stream within {PATIENCE:?}: {e:?}"),
    };
    h.stream = stream;
    // The link's exchange is due at once and the headers are in: before
    // the fix its time request left now, ahead of any Hello. Give it the
    // time to (a bounded wait for an event that must not come).
    match h.fake.events.recv_timeout(Duration::from_millis(300)) {
        Err(RecvTimeoutError::Timeout) => {}
        Ok(Ev::Msg { msg, .. }) => panic!("sent before the Hello: {msg:?}"),
        Ok(_) => panic!("the stream changed"),
        Err(e) => panic!("{e:?}"),
    }
    // Now the control thread runs: the first message is the Hello...
    let first = h.expect("the first message", |b| Some(b.clone()));
    assert!(
        matches!(first, A::Hello(_)),
        "first on the stream: {first:?}"
    );
    // ...and the time request follows it.
    h.send(welcome(0, 0));
    let r = h.expect("a time request", |b| match b {
        A::TimeRequest(r) => Some(*r),
        _ => None,
    });
    assert!(r.id >= 1);
}

/// Issue 26.8: entries dropped at the outbox cap while the controller was
/// away are not silent: the first entry sent after them carries their
/// count as `dropped_before`, on every re-send until it is acknowledged,
/// and never again after.
#[test]
fn outbox_drops_reach_the_controller_once_on_one_entry() {
    let mut h = harness_with(ConfigFile {
        outbox_cap: Some(4),
        ..ConfigFile::default()
    });
    h.session();
    let beat = "instructions:\n  - {id: n, action: noop, every: 100ms}\n";
    h.send(push("beat", 1, &pack("beat", 1, beat)));
    h.ack();
    // The controller goes away; ten firings into an outbox of four.
    h.fake
        .refuse
        .store(true, std::sync::atomic::Ordering::Release);
    h.drop_stream();
    h.run_for(Duration::from_millis(950), Duration::from_millis(5));
    let j = h.r.agent.journal();
    let (front, last) = j.outbox_range().expect("held");
    assert_eq!(last - front + 1, 4);
    let dropped = j.dropped();
    assert_eq!(
        dropped,
        front - 1,
        "everything before the front was dropped"
    );
    // Back: the first entry sent carries the count.
    h.fake
        .refuse
        .store(false, std::sync::atomic::Ordering::Release);
    h.connected();
    h.send(welcome(0, 0));
    let got = feedback(&mut h, 4);
    assert_eq!(got[0].seq, front);
    assert_eq!(got[0].dropped_before, dropped, "{:?}", got[0]);
    assert!(got[1..].iter().all(|f| f.dropped_before == 0));
    // Not acknowledged, the stream dies: the re-send carries it again.
    h.drop_stream();
    h.connected();
    h.send(welcome(0, 0));
    let again = feedback(&mut h, 4);
    assert_eq!((again[0].seq, again[0].dropped_before), (front, dropped));
    // Acknowledged: reported, never sent again.
    h.send(msg(C::FeedbackAck(wire::FeedbackAck { seq: front })));
    let end = Instant::now() + PATIENCE;
    while h.r.agent.journal().dropped() != 0 {
        assert!(Instant::now() < end, "the count stays unreported");
        let _ = h.fake.events.recv_timeout(Duration::from_millis(2));
        h.r.agent.step().expect("step");
    }
    h.drop_stream();
    h.connected();
    h.send(welcome(front, 0));
    let after = feedback(&mut h, 3);
    assert!(after.iter().all(|f| f.dropped_before == 0), "{after:?}");
}

/// A pack on another line than [`BLINK`]'s.
const OTHER: &str = "safe_state:\n  - {action: gpio.write, params: {line: 8, value: 0}}\ninstructions:\n  - {id: on, action: gpio.write, params: {line: 8, value: 1}, every: 100ms}\n";

fn welcome_gen(session_gen: u64) -> ControllerMessage {
    msg(C::Welcome(wire::Welcome {
        session_gen,
        agent_id: "t".into(),
        feedback_acked_seq: 0,
        controller_time_ns: 0,
        ping_interval_ms: 0,
    }))
}

fn push_gen(pack_id: &str, version: u64, body: &str, session_gen: u64) -> ControllerMessage {
    msg(C::PackPush(wire::PackPush {
        session_gen,
        pack: Some(pack_ref(pack_id, version)),
        yaml: pack(pack_id, version, body),
        ..Default::default()
    }))
}

/// Fencing on one stream: welcomed at 5, a push sent on generation 4 (a
/// stale replica's message) is nacked STALE, naming both generations, and
/// not armed; a cancel on 4 is not acted on; the session's own generation
/// works as ever.
#[test]
fn a_push_or_cancel_on_a_stale_generation_is_refused_and_not_acted_on() {
    let mut h = harness();
    let hello = h.connected();
    assert_eq!(hello.session_gen, 0, "a new journal has seen no generation");
    h.send(welcome_gen(5));
    h.send(push_gen("blink", 1, BLINK, 4));
    let n = h.nack();
    assert_eq!(n.reason(), wire::NackReason::Stale, "{n:?}");
    assert_eq!(n.pack, Some(pack_ref("blink", 1)));
    assert!(
        n.message.contains("generation 4") && n.message.contains("generation 5"),
        "{}",
        n.message
    );
    assert_eq!(h.r.agent.journal().held().packs, 0, "nothing journalled");
    h.run_for(Duration::from_millis(300), Duration::from_millis(10));
    assert_eq!(h.r.level(7), None, "never armed");

    h.send(push_gen("blink", 1, BLINK, 5));
    assert!(!h.ack().unchanged);
    assert_eq!(h.held(), [("blink".to_string(), 1, false)]);
    h.run_for(Duration::from_millis(50), Duration::from_millis(5));
    assert_eq!(h.r.level(7), Some(1));
    // A stale cancel, then the same push again on the session's own
    // generation: its answer comes after the cancel was handled.
    h.send(msg(C::PackCancel(wire::PackCancel {
        session_gen: 4,
        pack: Some(pack_ref("blink", 1)),
    })));
    h.send(push_gen("blink", 1, BLINK, 5));
    assert!(h.ack().unchanged, "still held, running");
    assert_eq!(h.r.agent.journal().held().packs, 1);
    h.run_for(Duration::from_millis(300), Duration::from_millis(5));
    assert_eq!(
        h.r.level(7),
        Some(1),
        "no safe state: the cancel was refused"
    );
}

/// Fencing across streams, through the real link: welcomed at 5, the next
/// stream's Hello carries 5; a stream welcomed at 4 is dropped by the
/// agent and nothing it pushes is held; the agent comes back with its
/// usual backoff and a welcome at 6 works.
#[test]
fn a_stream_welcomed_below_the_highest_generation_is_dropped_and_nothing_it_sends_is_acted_on() {
    let mut h = harness();
    h.connected();
    h.send(welcome_gen(5));
    h.send(push_gen("blink", 1, BLINK, 5));
    h.ack();
    h.drop_stream();

    let hello = h.connected();
    assert_eq!(
        hello.session_gen, 5,
        "Hello carries the journalled generation"
    );
    let stale = h.stream;
    h.send(welcome_gen(4));
    h.send(push_gen("other", 1, OTHER, 4));
    // The agent ends the stream; no ack of anything on it before.
    loop {
        match h.event() {
            Ev::Closed { stream } if stream == stale => break,
            Ev::Msg { stream, msg } if stream == stale => {
                assert!(
                    !matches!(msg.body, Some(A::PackAck(_))),
                    "acked on a stale stream: {msg:?}"
                );
            }
            _ => {}
        }
    }
    assert_eq!(h.r.agent.journal().held().packs, 1, "only blink");
    assert_eq!(h.r.agent.journal().session_gen(), 5, "not lowered");

    let hello = h.connected();
    assert!(h.stream > stale, "a new stream");
    assert_eq!(hello.session_gen, 5);
    h.send(welcome_gen(6));
    h.send(push_gen("other", 1, OTHER, 6));
    assert!(!h.ack().unchanged);
    assert_eq!(h.r.agent.journal().session_gen(), 6);
}

/// Failover through the real link: the agent dials the first of two
/// controllers; that one goes away (its server and every connection
/// gone); the agent comes back on the second, which sees its Hello, and
/// works as ever.
#[test]
fn when_its_controller_goes_away_the_agent_fails_over_to_the_next() {
    let first = fake();
    let second = fake();
    let urls = vec![
        format!("http://{}", first.addr),
        format!("http://{}", second.addr),
    ];
    let mut h = harness_to(
        first,
        urls,
        ConfigFile::default(),
        baton_agent::runtime::ports::ManualClock::new(t(0)),
    );
    h.connected();
    h.send(welcome_gen(1));
    h.send(push_gen("blink", 1, BLINK, 1));
    h.ack();
    // The first controller goes away; the test watches the second now.
    drop(std::mem::replace(&mut h.fake, second));
    h.tx = None;
    let hello = h.connected();
    assert_eq!(hello.session_gen, 1);
    assert_eq!(
        held(&hello.packs),
        [("blink".to_string(), 1, false)],
        "the second controller learns what the agent holds"
    );
    h.send(welcome_gen(2));
    h.send(push_gen("blink", 2, BLINK, 2));
    assert!(!h.ack().unchanged);
}

/// A controller refusing new sessions (RESOURCE_EXHAUSTED, a replica
/// admitting them at a bounded rate) is a failed attempt: the agent goes on
/// to the next controller at once, and comes back to the first, after a
/// backoff, once the second is lost.
#[test]
fn a_controller_refusing_sessions_as_exhausted_is_skipped_for_the_next() {
    let busy = fake();
    busy.exhausted.store(true, Ordering::Release);
    let other = fake();
    let urls = vec![
        format!("http://{}", busy.addr),
        format!("http://{}", other.addr),
    ];
    let mut h = harness_to(
        busy,
        urls,
        ConfigFile::default(),
        baton_agent::runtime::ports::ManualClock::new(t(0)),
    );
    // The busy one is tried first and refuses.
    assert!(matches!(h.event(), Ev::Exhausted));
    let busy = std::mem::replace(&mut h.fake, other);
    h.session();
    h.send(push("blink", 1, &pack("blink", 1, BLINK)));
    h.ack();
    // It admits sessions again; the other one goes away.
    busy.exhausted.store(false, Ordering::Release);
    drop(std::mem::replace(&mut h.fake, busy));
    h.tx = None;
    let hello = h.connected();
    assert_eq!(held(&hello.packs), [("blink".to_string(), 1, false)]);
}

/// A controller named by a host name: the link resolves it and dials its
/// addresses in turn (`localhost` may resolve to ::1 first, where nothing
/// listens: the next address is tried at once), with the name as the
/// requests' authority.
#[test]
fn a_controller_named_by_a_host_name_is_dialled_at_its_resolved_addresses() {
    let f = fake();
    let url = format!("http://localhost:{}", f.addr.port());
    let mut h = harness_to(
        f,
        vec![url],
        ConfigFile::default(),
        baton_agent::runtime::ports::ManualClock::new(t(0)),
    );
    h.session();
    h.send(push("blink", 1, &pack("blink", 1, BLINK)));
    assert!(!h.ack().unchanged);
}

fn staged(pack_id: &str, version: u64, yaml: &str, at_ns: i64) -> ControllerMessage {
    msg(C::PackPush(wire::PackPush {
        session_gen: 0,
        pack: Some(pack_ref(pack_id, version)),
        yaml: yaml.into(),
        staged: true,
        activate_at_ns: at_ns,
        max_uncertainty_ns: 0,
    }))
}

/// `activate: together`: a staged version is checked and acked as staged
/// while the held one runs on; named an instant, the agent switches then:
/// nothing of the new version at or before it, nothing of the old after
/// it, the new one's `every` on a grid from it. A staged version older
/// than the held one is refused; a re-sent switch once switched is
/// unchanged.
#[test]
fn a_staged_version_runs_only_from_its_instant() {
    let mut h = harness();
    h.session();
    let v1 = "instructions:\n  - {id: t, action: gpio.toggle, params: {line: 1}, every: 100ms}\n";
    let v2 = "instructions:\n  - {id: t, action: gpio.toggle, params: {line: 2}, every: 100ms}\n";
    h.send(push("p", 1, &pack("p", 1, v1)));
    h.ack();
    h.run_for(Duration::from_millis(330), Duration::from_millis(10));
    h.send(staged("p", 2, &pack("p", 2, v2), 0));
    let a = h.ack();
    assert!(a.staged && !a.unchanged, "{a:?}");
    assert_eq!(a.activate_at_ns, 0);
    h.run_for(Duration::from_millis(500), Duration::from_millis(10));
    assert!(writes_on(&h, 2).is_empty(), "staged is not running");
    assert!(writes_on(&h, 1).len() >= 7, "the held version runs on");
    let at = (h.r.clock.now() + Duration::from_millis(250)).as_nanos();
    h.send(staged("p", 2, &pack("p", 2, v2), at));
    let a = h.ack();
    assert!(a.staged, "{a:?}");
    assert_eq!(a.activate_at_ns, at);
    h.run_for(Duration::from_millis(700), Duration::from_millis(10));
    assert_eq!(h.held(), [("p".to_string(), 2, false)]);
    let (old, new) = (writes_on(&h, 1), writes_on(&h, 2));
    assert!(
        old.iter().all(|t| *t <= at),
        "v1 after the instant: {old:?}"
    );
    assert!(!new.is_empty() && new.iter().all(|t| *t > at), "{new:?}");
    let first = *new.first().expect("v2 fired");
    assert!(
        (first - at - 100_000_000).abs() < 15_000_000,
        "v2's first firing one period after the instant: {}",
        first - at
    );
    // Switched: the same push again is unchanged; an older one refused.
    h.send(staged("p", 2, &pack("p", 2, v2), at));
    assert!(h.ack().unchanged);
    h.send(staged("p", 1, &pack("p", 1, v1), 0));
    let n = h.nack();
    assert_eq!(n.reason(), wire::NackReason::Refused, "{n:?}");
    assert!(n.message.contains("older"), "{}", n.message);
}

/// When the device wrote `line` (reference ns), in order.
fn writes_on(h: &H, line: i64) -> Vec<i64> {
    h.r.writes()
        .iter()
        .filter(|w| w["line"] == line)
        .filter_map(|w| w["t"].as_i64())
        .collect()
}

/// Staged push of `yaml` to switch at `at_ns`, not while the clock is less
/// certain than `max_uncertainty_ns`.
fn staged_within(
    pack_id: &str,
    version: u64,
    yaml: &str,
    at_ns: i64,
    max_uncertainty_ns: i64,
) -> ControllerMessage {
    msg(C::PackPush(wire::PackPush {
        session_gen: 0,
        pack: Some(pack_ref(pack_id, version)),
        yaml: yaml.into(),
        staged: true,
        activate_at_ns: at_ns,
        max_uncertainty_ns,
    }))
}

/// Held v1 on a grid of 100 ms from `t(0)` (line 1), a v2 (line 2) staged
/// to switch 5 ms before one of v1's occurrences, and the loop stepped to
/// 3 ms before the instant: v1's occurrence 5 ms after it is within the
/// arming horizon. Returns the instant.
fn stage_before_an_occurrence(h: &mut H, max_uncertainty_ns: i64) -> baton_proto::RefTime {
    stage_version_before_an_occurrence(h, 2, max_uncertainty_ns, |_| {})
}

/// A grid of 100 ms on line `line` from t(0), as a pack body.
fn grid_on(line: u32) -> String {
    format!(
        "instructions:\n  - {{id: t, action: gpio.toggle, params: {{line: {line}}}, every: 100ms, start_at: {}, max_lateness: 1s}}\n",
        t(0)
    )
}

/// [`stage_before_an_occurrence`] of version `staged`, `meanwhile` run
/// right after it was staged.
fn stage_version_before_an_occurrence(
    h: &mut H,
    staged: u64,
    max_uncertainty_ns: i64,
    meanwhile: impl FnOnce(&mut H),
) -> baton_proto::RefTime {
    let v2 = "instructions:\n  - {id: t, action: gpio.toggle, params: {line: 2}, every: 100ms}\n";
    h.send(push("p", 1, &pack("p", 1, &grid_on(1))));
    h.ack();
    h.run_for(Duration::from_millis(330), Duration::from_millis(10));
    let at = t(795);
    h.send(staged_within(
        "p",
        staged,
        &pack("p", staged, v2),
        at.as_nanos(),
        max_uncertainty_ns,
    ));
    assert!(h.ack().staged);
    meanwhile(h);
    h.r.run_until(at - Duration::from_millis(13), Duration::from_millis(10));
    h.r.clock.set(at - Duration::from_millis(3));
    h.r.agent.step().expect("step");
    at
}

/// The control loop is held up across a switch instant (the pass that
/// arms ahead comes 3 ms before it, the next one 7 ms after it, as under
/// load): v1's occurrence 5 ms after the instant was never released to
/// the device, so its program never runs after the instant (it did:
/// armed ahead, then run by the device before the same pass switched and
/// asked it back).
#[test]
fn a_stalled_loop_never_runs_the_old_version_after_the_switch_instant() {
    let mut h = harness();
    h.session();
    let at = stage_before_an_occurrence(&mut h, 0);
    h.r.clock.set(at + Duration::from_millis(7));
    h.r.agent.step().expect("step");
    h.run_for(Duration::from_millis(400), Duration::from_millis(10));
    let (old, new) = (writes_on(&h, 1), writes_on(&h, 2));
    assert!(
        old.iter().all(|w| *w <= at.as_nanos()),
        "v1 after the instant {}: {old:?}",
        at.as_nanos()
    );
    assert!(old.len() >= 7, "{old:?}");
    assert!(
        !new.is_empty() && new.iter().all(|w| *w > at.as_nanos()),
        "{new:?}"
    );
}

/// A version accepted from a local pack file while a newer one waits
/// staged keeps the held version's fence: the stalled loop never runs it
/// after the instant, and the staged version switches in at it.
#[test]
fn a_local_version_over_a_fenced_one_keeps_the_fence_until_the_instant() {
    let mut h = harness();
    h.session();
    let at = stage_version_before_an_occurrence(&mut h, 3, 0, |h| {
        h.r.accept(&pack("p", 2, &grid_on(3))).expect("local v2");
    });
    h.r.clock.set(at + Duration::from_millis(7));
    h.r.agent.step().expect("step");
    h.run_for(Duration::from_millis(400), Duration::from_millis(10));
    let (local, staged) = (writes_on(&h, 3), writes_on(&h, 2));
    assert!(local.len() >= 4, "the local version ran: {local:?}");
    assert!(
        local.iter().all(|w| *w <= at.as_nanos()),
        "the local version after the instant {}: {local:?}",
        at.as_nanos()
    );
    assert!(
        !staged.is_empty() && staged.iter().all(|w| *w > at.as_nanos()),
        "{staged:?}"
    );
}

/// A local version no older than the staged one: the staged version can
/// never switch in, so the local one is not fenced (it runs through the
/// instant, each occurrence once) and the switch is refused, said so.
#[test]
fn a_local_version_newer_than_the_staged_one_runs_through_the_instant() {
    let mut h = harness();
    h.session();
    let at = stage_version_before_an_occurrence(&mut h, 2, 0, |h| {
        h.r.accept(&pack("p", 3, &grid_on(3))).expect("local v3");
    });
    h.r.clock.set(at + Duration::from_millis(7));
    h.r.agent.step().expect("step");
    let n = h.nack();
    assert!(n.message.contains("not switched"), "{}", n.message);
    h.run_for(Duration::from_millis(400), Duration::from_millis(10));
    let after: Vec<i64> = writes_on(&h, 3)
        .into_iter()
        .filter(|w| *w > at.as_nanos())
        .collect();
    // 800 ... 1200 ms, each once. (The rig's device writes at the loop's
    // pass: an occurrence held at the fence and one armed ahead both show
    // at the stalled pass, 802 ms; that it was not held is the core's.)
    assert_eq!(after.len(), 5, "{after:?}");
    assert!(writes_on(&h, 2).is_empty());
}

/// A switch refused at its instant (the clock less certain than the
/// rollout's bound) lifts the fence: v1's occurrence held past the
/// instant fires, late, once, and v1 runs on.
#[test]
fn a_refused_switch_releases_the_held_occurrence_late_once() {
    let mut h = harness();
    h.session();
    let at = stage_before_an_occurrence(&mut h, 1_000);
    h.r.clock.set_uncertainty(5_000);
    h.r.clock.set(at + Duration::from_millis(7));
    h.r.agent.step().expect("step");
    let n = h.nack();
    assert!(n.message.contains("not switched"), "{}", n.message);
    h.run_for(Duration::from_millis(400), Duration::from_millis(10));
    let after: Vec<i64> = writes_on(&h, 1)
        .into_iter()
        .filter(|w| *w > at.as_nanos())
        .collect();
    // 800 ms (late: released at the refusal), 900 ... 1200 ms.
    assert_eq!(after.len(), 5, "{after:?}");
    assert!(
        after[0] <= (at + Duration::from_millis(17)).as_nanos(),
        "{after:?}"
    );
    assert!(h.r.writes().iter().all(|w| w["line"] != 2));
}

/// A pack cancelled on the box while a new version of it waits staged:
/// the switch at the instant does not bring it back (the staged copy was
/// pushed for a pack that ran; the controller must push again), and it is
/// nacked saying why.
#[test]
fn a_pack_cancelled_while_staged_is_not_brought_back_at_the_instant() {
    let mut h = harness();
    h.session();
    let at = stage_before_an_occurrence(&mut h, 0);
    let key = baton_sched::PackKey {
        tenant: "default".into(),
        pack: "p".into(),
    };
    h.r.agent.cancel_local(&key).expect("cancelled");
    h.r.clock.set(at + Duration::from_millis(1));
    h.r.agent.step().expect("step");
    let n = h.nack();
    assert!(n.message.contains("was stopped"), "{}", n.message);
    h.run_for(Duration::from_millis(400), Duration::from_millis(10));
    let (old, new) = (writes_on(&h, 1), writes_on(&h, 2));
    assert!(
        new.is_empty(),
        "the staged version ran after a cancel: {new:?}"
    );
    assert!(old.iter().all(|t| *t <= at.as_nanos()), "{old:?}");
}

/// Issue 37: a member whose loop gets to the switch long after the
/// instant (the process stopped across it) used to start a grid of its
/// own from the moment it switched, out of phase with its stage for as
/// long as the version ran. It joins the stage's grid now: its new
/// version fires at the instant plus whole periods, the occurrences it
/// missed are not replayed, and nothing of the old version runs after the
/// instant.
#[test]
fn a_late_switch_joins_the_stages_grid() {
    let mut h = harness();
    h.session();
    let at = stage_before_an_occurrence(&mut h, 0);
    // 2.65 s late: not a whole number of periods, so a grid from the
    // switch would be 50 ms out of phase with the instant's.
    let late = Duration::from_millis(2_650);
    h.r.clock.set(at + late);
    h.r.agent.step().expect("step");
    h.run_for(Duration::from_millis(500), Duration::from_millis(10));
    let (old, new) = (writes_on(&h, 1), writes_on(&h, 2));
    assert!(
        old.iter().all(|w| *w <= at.as_nanos()),
        "v1 after the instant: {old:?}"
    );
    assert!(new.len() >= 4, "{new:?}");
    let period = 100_000_000;
    for w in &new {
        let since = w - at.as_nanos();
        assert!(
            since > late.as_nanos() as i64,
            "an occurrence before the switch replayed: {since} ns after the instant"
        );
        let off = since.rem_euclid(period);
        assert!(
            off < 15_000_000,
            "v2 fired {off} ns past the stage's grid ({since} ns after the instant)"
        );
    }
}

/// An agent that is a new version on trial (the launcher started it and
/// wrote so), dialling a fake controller.
fn trial_harness() -> H {
    use baton_update::{BootState, Trial, Versions};
    let fake = fake();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let state = BootState {
        packaged: baton_agent::version::version().into(),
        trial: Some(Trial {
            version: baton_agent::version::version().into(),
            started: true,
        }),
        ..BootState::default()
    };
    Versions::of_data_dir(&data)
        .write_state(&state)
        .expect("state");
    let clock = Arc::new(baton_agent::runtime::ports::ManualClock::new(t(0)));
    let cfg = config(
        dir.path(),
        ConfigFile::default(),
        Overrides {
            controllers: vec![format!("http://{}", fake.addr)],
            insecure: true,
            ..Overrides::default()
        },
    );
    let agent = build_with(dir.path(), clock.clone(), cfg);
    H {
        r: Rig {
            log: dir.path().join("gpio.jsonl"),
            data,
            _dir: dir,
            clock,
            agent,
        },
        fake,
        tx: None,
        stream: 0,
    }
}

fn boot_state(h: &H) -> baton_update::BootState {
    baton_update::Versions::of_data_dir(&h.r.data)
        .read_state()
        .expect("read")
        .expect("a state")
}

/// A new version on trial is settled once a controller welcomes it, and
/// not before: the launcher's next start runs it again instead of rolling
/// it back.
#[test]
fn a_version_on_trial_is_settled_when_a_controller_welcomes_it() {
    let mut h = trial_harness();
    h.connected();
    h.r.agent.step().expect("step");
    assert!(boot_state(&h).trial.is_some(), "a hello is no welcome");
    h.send(welcome(0, 0));
    let end = Instant::now() + PATIENCE;
    while boot_state(&h).trial.is_some() {
        assert!(Instant::now() < end, "not settled within {PATIENCE:?}");
        let _ = h.fake.events.recv_timeout(Duration::from_millis(2));
        h.r.agent.step().expect("step");
    }
    let s = boot_state(&h);
    assert_eq!(s.settled.as_deref(), Some(baton_agent::version::version()));
    assert_eq!(
        baton_update::boot::at_launch(Some(&s), baton_agent::version::version(), |_| true).1,
        baton_update::Launch::Version(baton_agent::version::version().into())
    );
}

/// A trial no controller welcomed within its deadline ends the loop (its
/// way out drives the safe state), unconfirmed: the launcher rolls it back.
#[test]
fn a_version_on_trial_no_controller_welcomes_stops_at_its_deadline() {
    let mut h = trial_harness();
    h.fake.refuse.store(true, Ordering::Release);
    h.run_for(Duration::from_secs(299), Duration::from_secs(1));
    h.r.clock.advance(Duration::from_secs(2));
    let e = h.r.agent.step().expect_err("past the deadline");
    assert!(
        matches!(
            e,
            baton_agent::runtime::RuntimeError::TrialUnconfirmed { .. }
        ),
        "{e}"
    );
    assert!(boot_state(&h).trial.is_some_and(|t| t.started));
}

/// A box whose trust list names `release` as a release key.
fn trust_dir_with_release_key(
    dir: &std::path::Path,
    release: &baton_trust::SigningKey,
) -> std::path::PathBuf {
    use baton_trust::{SignedList, SigningKey, TrustList};
    let root = SigningKey::generate().expect("root");
    let trust = dir.join("trust");
    std::fs::create_dir_all(&trust).expect("mkdir");
    std::fs::write(trust.join("root.pub"), root.public().to_base64()).expect("root.pub");
    let list = TrustList {
        version: 1,
        expires_ns: i64::MAX,
        next_root: None,
        tenants: [("default".to_string(), Default::default())]
            .into_iter()
            .collect(),
        release_keys: vec![release.public()],
    };
    let chain = vec![SignedList::sign(&list, &root)];
    std::fs::write(
        trust.join("trust.json"),
        serde_json::to_string(&chain).expect("json"),
    )
    .expect("trust.json");
    trust
}

/// An agent with a trust directory naming a release key, dialling a fake
/// controller that will offer releases; and that key.
fn update_harness(update: &str) -> (H, baton_trust::SigningKey, tempfile::TempDir) {
    let release = baton_trust::SigningKey::generate().expect("release key");
    let keep = tempfile::tempdir().expect("tempdir");
    let trust = trust_dir_with_release_key(keep.path(), &release);
    let file = baton_agent::config::parse_file("a.yaml", update).expect("config");
    let fake = fake();
    let url = format!("http://{}", fake.addr);
    let r = rig_with_clock(
        file,
        Overrides {
            controllers: vec![url],
            insecure: true,
            trust_dir: Some(trust),
            ..Overrides::default()
        },
        baton_agent::runtime::ports::ManualClock::new(t(0)),
    );
    (
        H {
            r,
            fake,
            tx: None,
            stream: 0,
        },
        release,
        keep,
    )
}

/// A release of `bin` as `version` for this box, signed by `key`.
fn offer(key: &baton_trust::SigningKey, version: &str, bin: &[u8]) -> ControllerMessage {
    let m =
        baton_trust::ReleaseManifest::of(version, std::env::consts::ARCH, bin).expect("manifest");
    let s = baton_trust::SignedRelease::sign(&m, key);
    msg(C::ReleaseOffer(wire::ReleaseOffer {
        manifest: s.body,
        key: s.key.to_string(),
        signature: s.signature.to_base64(),
    }))
}

fn update_state(h: &mut H) -> wire::UpdateState {
    h.expect("update state", |b| match b {
        A::UpdateState(u) => Some(u.clone()),
        _ => None,
    })
}

impl H {
    /// Steps the agent (its clock a second on at each step, so the
    /// download's pace allows the next piece) until it asks for a piece.
    fn next_request(&mut self) -> wire::ReleaseRequest {
        let end = Instant::now() + PATIENCE;
        loop {
            assert!(
                Instant::now() < end,
                "no release request within {PATIENCE:?}"
            );
            if let Ok(Ev::Msg { stream, msg }) =
                self.fake.events.recv_timeout(Duration::from_millis(2))
                && stream == self.stream
                && let Some(A::ReleaseRequest(r)) = msg.body
            {
                return r;
            }
            self.r.clock.advance(Duration::from_millis(250));
            self.r.agent.step().expect("step");
        }
    }

    /// Answers requests with `bin`'s bytes (as a controller would) until
    /// the agent says where the release stands other than downloading.
    fn serve_release(&mut self, version: &str, bin: &[u8]) -> wire::UpdateState {
        let end = Instant::now() + PATIENCE;
        loop {
            assert!(
                Instant::now() < end,
                "download not done within {PATIENCE:?}"
            );
            self.r.agent.step().expect("step");
            match self.fake.events.recv_timeout(Duration::from_millis(2)) {
                Ok(Ev::Msg { stream, msg }) if stream == self.stream => match msg.body {
                    Some(A::ReleaseRequest(r)) => {
                        assert_eq!(r.version, version);
                        let from = r.offset as usize;
                        let to = (from + r.length as usize).min(bin.len());
                        self.send(msg_chunk(version, r.offset, &bin[from..to]));
                    }
                    Some(A::UpdateState(u))
                        if u.phase != wire::update_state::Phase::Downloading as i32 =>
                    {
                        return u;
                    }
                    _ => {}
                },
                _ => self.r.clock.advance(Duration::from_millis(250)),
            }
        }
    }
}

/// Offers `bin` as `version`, serves it until the box says it is
/// installed, and returns the box's versions directory.
fn install(
    h: &mut H,
    key: &baton_trust::SigningKey,
    version: &str,
    bin: &[u8],
) -> baton_update::Versions {
    h.send(offer(key, version, bin));
    let said = h.serve_release(version, bin);
    assert_eq!(
        said.phase,
        wire::update_state::Phase::Installed as i32,
        "{said:?}"
    );
    baton_update::Versions::of_data_dir(&h.r.data)
}

fn msg_chunk(version: &str, offset: u64, data: &[u8]) -> ControllerMessage {
    msg(C::ReleaseChunk(wire::ReleaseChunk {
        version: version.into(),
        offset,
        data: data.to_vec(),
    }))
}

/// A "build" of `n` bytes that is not all one byte, reporting `version`
/// (its version slot at the end).
fn binary(n: usize, version: &str) -> Vec<u8> {
    let mut b: Vec<u8> = (0..n).map(|i| (i * 31 % 251) as u8).collect();
    b.extend_from_slice(baton_trust::release::SLOT_MARK);
    b.extend_from_slice(version.as_bytes());
    b.resize(n + baton_trust::release::SLOT_LEN, 0);
    b
}

/// An offered release is checked, downloaded a piece at a time, installed
/// beside the running version and put on trial; the loop then ends only
/// at a quiet moment (never while a pack fires within the margin).
#[test]
fn an_offered_release_is_downloaded_installed_on_trial_and_restarted_into_when_quiet() {
    let (mut h, key, _keep) = update_harness("update: {download-rate: 131072}\n");
    h.session();
    h.r.agent.step().expect("step");
    let bin = binary(200_000, "9.9.9");
    let versions = install(&mut h, &key, "9.9.9", &bin);
    assert_eq!(
        std::fs::read(versions.binary("9.9.9")).expect("installed"),
        bin
    );
    let state = versions.read_state().expect("read").expect("state");
    assert_eq!(
        state.trial,
        Some(baton_update::Trial {
            version: "9.9.9".into(),
            started: false
        })
    );
    // A pack firing every 100 ms: never 2 s of quiet.
    h.send(push("blink", 1, &pack("blink", 1, BLINK)));
    h.ack();
    for _ in 0..30 {
        h.run_for(Duration::from_millis(100), Duration::from_millis(10));
        assert_eq!(
            h.r.agent.update_restart_due(),
            None,
            "a firing is due within the margin"
        );
    }
    // Cancelled (its safe state driven): quiet, the restart is due.
    h.send(msg(C::PackCancel(wire::PackCancel {
        session_gen: 0,
        pack: Some(pack_ref("blink", 1)),
    })));
    let end = Instant::now() + PATIENCE;
    while h.r.agent.update_restart_due().is_none() {
        assert!(Instant::now() < end, "no quiet moment after the cancel");
        let _ = h.fake.events.recv_timeout(Duration::from_millis(2));
        h.r.clock.advance(Duration::from_millis(10));
        h.r.agent.step().expect("step");
    }
    assert_eq!(h.r.agent.update_restart_due().as_deref(), Some("9.9.9"));
}

/// A download cut mid-way (the stream lost) goes on from the bytes kept
/// when the release is offered again, never from the start; and the box
/// asks one piece at a time at its configured rate.
#[test]
fn a_download_cut_midway_resumes_from_what_was_kept() {
    let (mut h, key, _keep) = update_harness("update: {download-rate: 65536}\n");
    h.session();
    let bin = binary(300_000, "9.9.9");
    h.send(offer(&key, "9.9.9", &bin));
    let first = h.next_request();
    assert_eq!((first.offset, first.length), (0, 65536));
    h.send(msg_chunk("9.9.9", 0, &bin[..65536]));
    let second = h.next_request();
    assert_eq!(second.offset, 65536);
    h.drop_stream();
    h.session();
    h.send(offer(&key, "9.9.9", &bin));
    let again = h.next_request();
    assert_eq!(again.offset, 65536, "resumed from what was kept");
    h.send(msg_chunk("9.9.9", 65536, &bin[65536..131072]));
    let said = h.serve_release("9.9.9", &bin);
    assert_eq!(
        said.phase,
        wire::update_state::Phase::Installed as i32,
        "{said:?}"
    );
    let versions = baton_update::Versions::of_data_dir(&h.r.data);
    assert_eq!(
        std::fs::read(versions.binary("9.9.9")).expect("installed"),
        bin
    );
}

/// What a box must not install is refused with the reason, and nothing is
/// put on trial: another key's signature, bytes that are not the signed
/// ones, no trust directory at all.
#[test]
fn a_release_the_box_must_not_install_is_refused_with_the_reason() {
    let (mut h, _key, _keep) = update_harness("{}\n");
    h.session();
    let bin = binary(10_000, "9.9.9");
    let stranger = baton_trust::SigningKey::generate().expect("key");
    h.send(offer(&stranger, "9.9.9", &bin));
    let said = update_state(&mut h);
    assert_eq!(said.phase, wire::update_state::Phase::Refused as i32);
    assert!(
        said.reason.contains("does not name as a release key"),
        "{}",
        said.reason
    );

    // Signed right, but the controller serves other bytes.
    let (mut h, key, _keep) = update_harness("{}\n");
    h.session();
    h.send(offer(&key, "9.9.9", &bin));
    let mut evil = bin.clone();
    evil[9_999] ^= 0xff;
    let said = h.serve_release("9.9.9", &evil);
    assert_eq!(said.phase, wire::update_state::Phase::Refused as i32);
    assert!(said.reason.contains("SHA-256"), "{}", said.reason);
    let versions = baton_update::Versions::of_data_dir(&h.r.data);
    assert!(!versions.is_installed("9.9.9"));
    assert_eq!(
        versions.read_state().expect("read"),
        None,
        "nothing on trial"
    );

    // Signed right, but the build reports another version: never
    // installed (it would never confirm itself).
    let (mut h, key, _keep) = update_harness("{}\n");
    h.session();
    let other = binary(10_000, "9.9.8");
    h.send(offer(&key, "9.9.9", &other));
    let said = h.serve_release("9.9.9", &other);
    assert_eq!(said.phase, wire::update_state::Phase::Refused as i32);
    assert!(
        said.reason.contains("reports version 9.9.8"),
        "{}",
        said.reason
    );
    let versions = baton_update::Versions::of_data_dir(&h.r.data);
    assert!(!versions.is_installed("9.9.9"));

    // No trust directory: no release key, nothing taken.
    let mut h = harness();
    h.session();
    h.send(offer(&key, "9.9.9", &bin));
    let said = update_state(&mut h);
    assert_eq!(said.phase, wire::update_state::Phase::Refused as i32);
    assert!(
        said.reason.contains("no trust directory"),
        "{}",
        said.reason
    );
}

/// A release withdrawn by the controller after the box installed it, and
/// before a quiet moment came: its trial is undone in the launcher's
/// state, the box never restarts into it, and says so; a download
/// withdrawn stops.
#[test]
fn a_release_withdrawn_before_it_ran_is_undone_and_never_restarted_into() {
    let (mut h, key, _keep) = update_harness("update: {download-rate: 131072}\n");
    h.session();
    h.r.agent.step().expect("step");
    // A pack firing every 100 ms keeps the box from a quiet moment.
    h.send(push("blink", 1, &pack("blink", 1, BLINK)));
    h.ack();
    let bin = binary(200_000, "9.9.9");
    let versions = install(&mut h, &key, "9.9.9", &bin);
    assert!(
        versions
            .read_state()
            .expect("read")
            .expect("state")
            .trial
            .is_some()
    );
    h.send(msg(C::ReleaseWithdraw(wire::ReleaseWithdraw {
        version: "9.9.9".into(),
    })));
    let said = h.serve_release("9.9.9", &bin);
    assert_eq!(
        said.phase,
        wire::update_state::Phase::Refused as i32,
        "{said:?}"
    );
    assert!(
        said.reason
            .contains("withdrawn by the controller before it ran"),
        "{said:?}"
    );
    let state = versions.read_state().expect("read").expect("state");
    assert_eq!(state.trial, None, "the trial undone: {state:?}");
    assert!(!versions.binary("9.9.9").exists(), "its files removed");
    // Quiet now (the pack cancelled): still no restart.
    h.send(msg(C::PackCancel(wire::PackCancel {
        session_gen: 0,
        pack: Some(pack_ref("blink", 1)),
    })));
    for _ in 0..50 {
        h.run_for(Duration::from_millis(100), Duration::from_millis(10));
        assert_eq!(h.r.agent.update_restart_due(), None);
    }

    // A download withdrawn mid-way stops: no more requests.
    let bin = binary(300_000, "9.9.10");
    h.send(offer(&key, "9.9.10", &bin));
    let first = h.next_request();
    assert_eq!(first.version, "9.9.10");
    h.send(msg(C::ReleaseWithdraw(wire::ReleaseWithdraw {
        version: "9.9.10".into(),
    })));
    let said = h.serve_release("9.9.10", &bin);
    assert!(
        said.reason
            .contains("withdrawn by the controller during its download"),
        "{said:?}"
    );
}
