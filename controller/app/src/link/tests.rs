//! The link session as plain function calls: no runtime, no channels, no
//! store. A small fake answers the session's effects the way a store
//! does (feedback stored once per seq, answers re-planned into the row),
//! and a test reads the actions in order.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_proto::wire;
use proptest::prelude::*;

use super::*;
use crate::texts::PackText;
use baton_model::{DeliveryState, Held, Intent, PackVersionRow, TargetsRow};

const PING: Duration = Duration::from_secs(10);

fn key(pack: &str) -> PackKey {
    PackKey::new("default", pack)
}

fn pending(pack: &str, version: u64) -> DeliveryRow {
    DeliveryRow {
        agent_id: "a1".into(),
        tenant: "default".into(),
        pack: pack.into(),
        version,
        intent: Intent::Hold,
        held: None,
        refusal: None,
        state: DeliveryState::Pending,
        reason: String::new(),
        attempts: 0,
        updated: RefTime::from_nanos(0),
        activate: Default::default(),
        staged: None,
    }
}

fn text(pack: &str, version: u64) -> Arc<PackText> {
    let row = PackVersionRow {
        tenant: "default".into(),
        pack: pack.into(),
        version,
        yaml: format!("pack: {pack}\nversion: {version}\n"),
        targets: TargetsRow::default(),
        pushed: RefTime::from_nanos(0),
        rollout: false,
    };
    Arc::new(PackText { row, rollout: None })
}

fn entry(seq: u64, pack: &str) -> FeedbackRow {
    FeedbackRow {
        id: 0,
        agent_id: "a1".into(),
        journal_id: "j1".into(),
        seq,
        execution_id: format!("default/{pack}/v1/i/{seq}/a1"),
        tenant: "default".into(),
        pack: pack.into(),
        version: 1,
        instruction: "i".into(),
        occurrence: None,
        attempt: 1,
        scheduled: RefTime::from_nanos(0),
        actual: RefTime::from_nanos(0),
        lateness: SignedDuration::from_micros(5),
        outcome: wire::Outcome::Ok,
        reason: wire::Reason::Unspecified,
        event: "executed".into(),
        action: "noop".into(),
        detail: String::new(),
        value: None,
        dropped_before: 0,
        uncertainty: SignedDuration::ZERO,
        clock_source: wire::ClockSource::Unspecified,
        clock_state: wire::ClockState::Unspecified,
        received: RefTime::from_nanos(0),
    }
}

/// What a store would answer, kept small: rows by pack, feedback seqs
/// stored, and every effect asked for.
struct Fake {
    rows: Vec<DeliveryRow>,
    stored: BTreeSet<u64>,
    /// Every time a seq was offered to the store (a re-send included).
    offered: Vec<u64>,
    effects: Vec<String>,
    session_gen: u64,
    /// The release the agent is to be offered, and its pieces.
    release: Option<Arc<baton_model::ReleaseRow>>,
    pieces: Vec<Vec<u8>>,
}

impl Fake {
    fn new(rows: Vec<DeliveryRow>) -> Fake {
        Fake {
            rows,
            stored: BTreeSet::new(),
            offered: Vec::new(),
            effects: Vec::new(),
            session_gen: 0,
            release: None,
            pieces: Vec::new(),
        }
    }

    fn acked(&self) -> u64 {
        // Contiguous from 1, as an agent's outbox is.
        (1..)
            .take_while(|s| self.stored.contains(s))
            .last()
            .unwrap_or(0)
    }

    fn answer(&mut self, e: Effect) -> Done {
        self.effects
            .push(format!("{e:?}").chars().take(40).collect());
        match e {
            Effect::Known => Done::Known {
                agent: None,
                rows: self.rows.clone(),
            },
            Effect::Hello(h) => {
                self.session_gen = self.session_gen.max(h.session_gen_seen) + 1;
                let mut a = AgentRow::new(&h.id, &h.journal_id);
                a.session_gen = self.session_gen;
                a.agent_version = h.agent_version.clone();
                Done::Hello {
                    agent: Box::new(a),
                    rows: self.rows.clone(),
                    acked: self.acked(),
                }
            }
            Effect::Seen { .. }
            | Effect::Clock { .. }
            | Effect::Trust { .. }
            | Effect::Update { .. } => Done::Written,
            Effect::Offer => Done::Offer(self.release.clone()),
            Effect::Piece { index, .. } => Done::Piece(self.pieces.get(index as usize).cloned()),
            Effect::Held { .. } => Done::Rows(Vec::new()),
            Effect::Rows => Done::Rows(self.rows.clone()),
            Effect::Agent => Done::Agent(None),
            Effect::Pack { key, version } => Done::Pack(Some(text(&key.pack, version))),
            Effect::Answer(a) => {
                let Some(r) = self.rows.iter_mut().find(|r| r.key() == a.key) else {
                    return Done::Answer(None);
                };
                match &a.answer {
                    baton_model::Answer::Acked => {
                        r.held = Some(Held {
                            version: a.version,
                            stopped: false,
                        });
                        r.state = DeliveryState::Acked;
                    }
                    baton_model::Answer::Refused(f) => {
                        r.state = if f.last {
                            DeliveryState::Nacked
                        } else {
                            DeliveryState::Pending
                        };
                        r.refusal = Some(f.clone());
                    }
                    baton_model::Answer::Staged(_) => {}
                }
                r.attempts = a.attempts;
                Done::Answer(Some(r.clone()))
            }
            Effect::Feedback { rows, .. } => {
                let mut stored = FeedbackStored::default();
                let mut last = 0;
                for r in rows {
                    assert!(r.seq > last, "the store is handed seqs in order");
                    last = r.seq;
                    self.offered.push(r.seq);
                    if self.stored.insert(r.seq) {
                        stored.inserted += 1;
                    } else {
                        stored.duplicates += 1;
                    }
                }
                stored.acked_seq = self.acked();
                Done::Feedback(stored)
            }
        }
    }
}

/// A session and the fake store behind it, on a test clock.
struct Run {
    s: Session,
    fake: Fake,
    t0: Instant,
    at: Duration,
    /// Every action but effects, in order, since the start.
    seen: Vec<Action>,
    /// Seqs the agent sent of packs it has a row of.
    sent: BTreeSet<u64>,
}

impl Run {
    fn start(fake: Fake, first_held_seq: u64) -> Run {
        let t0 = Instant::now();
        let now = Now {
            mono: t0,
            wall: RefTime::from_nanos(1_000),
        };
        let cfg = LinkConfig {
            ping_interval: PING,
            binding: Binding::Open,
            trust_chain: None,
        };
        let hello = HelloRow {
            id: "a1".into(),
            labels: Default::default(),
            agent_version: "test".into(),
            journal_id: "j1".into(),
            cert_tenants: None,
            held: Vec::new(),
            session_gen_seen: 0,
            trust: None,
            arch: "x86_64".into(),
            update: None,
            at: now.wall,
        };
        let (s, first) = Session::start(now, cfg, hello, None, first_held_seq);
        let mut r = Run {
            s,
            fake,
            t0,
            at: Duration::ZERO,
            seen: Vec::new(),
            sent: BTreeSet::new(),
        };
        r.perform(first);
        r
    }

    fn now(&self) -> Now {
        Now {
            mono: self.t0 + self.at,
            wall: RefTime::from_nanos(1_000 + self.at.as_nanos() as i64),
        }
    }

    /// Performs `actions` as a shell does; returns those that are not
    /// effects.
    fn perform(&mut self, actions: Vec<Action>) -> Vec<Action> {
        let mut out = Vec::new();
        let mut queue = std::collections::VecDeque::from(actions);
        while let Some(a) = queue.pop_front() {
            match a {
                Action::Effect(e) => {
                    assert!(queue.is_empty(), "an effect is the last action");
                    let done = self.fake.answer(e);
                    let now = self.now();
                    queue.extend(self.s.handle(now, Input::Done(done)));
                }
                Action::Send(ToAgent::FeedbackAck(s)) => {
                    // Sent now: every entry of the agent's own it covers
                    // must be stored now.
                    if let Some(missing) = self
                        .sent
                        .range(..=s)
                        .find(|q| !self.fake.stored.contains(q))
                    {
                        panic!("ack {s} sent before {missing} was stored");
                    }
                    out.push(Action::Send(ToAgent::FeedbackAck(s)));
                }
                other => out.push(other),
            }
        }
        self.seen.extend(out.iter().map(clone_action));
        out
    }

    fn input(&mut self, i: Input) -> Vec<Action> {
        let now = self.now();
        let a = self.s.handle(now, i);
        self.perform(a)
    }

    fn agent(&mut self, m: FromAgent) -> Vec<Action> {
        if let FromAgent::Feedback(rows) = &m {
            let own = rows
                .iter()
                .filter(|e| self.fake.rows.iter().any(|r| r.pack == e.pack))
                .map(|e| e.seq);
            self.sent.extend(own);
        }
        self.input(Input::Agent(m))
    }

    fn advance(&mut self, d: Duration) -> Vec<Action> {
        self.at += d;
        let mut out = Vec::new();
        while self.s.next_wake() <= self.t0 + self.at {
            let a = self.input(Input::Tick);
            let ended = a.iter().any(|a| matches!(a, Action::End(_)));
            out.extend(a);
            if ended {
                break;
            }
        }
        out
    }
}

fn clone_action(a: &Action) -> Action {
    match a {
        Action::Send(m) => Action::Send(m.clone()),
        Action::End(e) => Action::End(e.clone()),
        // Notes and effects are not compared across the run.
        Action::Note(_) | Action::Effect(_) => Action::Note(Note::PushSent),
    }
}

fn sends(a: &[Action]) -> Vec<&ToAgent> {
    a.iter()
        .filter_map(|a| match a {
            Action::Send(m) => Some(m),
            _ => None,
        })
        .collect()
}

fn acks(a: &[Action]) -> Vec<u64> {
    sends(a)
        .into_iter()
        .filter_map(|m| match m {
            ToAgent::FeedbackAck(s) => Some(*s),
            _ => None,
        })
        .collect()
}

fn pushes(a: &[Action]) -> Vec<(String, u64)> {
    sends(a)
        .into_iter()
        .filter_map(|m| match m {
            ToAgent::Push { pack, .. } => Some((pack.row.pack.clone(), pack.row.version)),
            _ => None,
        })
        .collect()
}

fn ended(a: &[Action]) -> Option<&End> {
    a.iter().find_map(|a| match a {
        Action::End(e) => Some(e),
        _ => None,
    })
}

#[test]
fn a_hello_is_welcomed_with_what_is_stored_and_pending_rows_are_pushed() {
    let mut fake = Fake::new(vec![pending("p", 2)]);
    fake.stored.extend(1..=4);
    let r = Run::start(fake, 5);
    assert!(r.s.is_live());
    let welcome = r.seen.iter().find_map(|a| match a {
        Action::Send(ToAgent::Welcome {
            feedback_acked_seq,
            session_gen,
            ..
        }) => Some((*feedback_acked_seq, *session_gen)),
        _ => None,
    });
    assert_eq!(welcome, Some((4, 1)));
    assert_eq!(pushes(&r.seen), vec![("p".to_string(), 2)]);
    // The text was read once, through an effect, after the hello.
    let order: Vec<&str> = r.fake.effects.iter().map(|e| &e[..5]).collect();
    assert_eq!(order, ["Known", "Hello", "Pack ", "Offer"]);
}

#[test]
fn feedback_is_acknowledged_only_after_it_is_stored_and_a_resend_is_stored_once() {
    let mut r = Run::start(Fake::new(vec![pending("p", 1)]), 1);
    let a = r.agent(FromAgent::Feedback(vec![entry(1, "p"), entry(2, "p")]));
    assert_eq!(acks(&a), [2]);
    assert_eq!(r.fake.stored, BTreeSet::from([1, 2]));
    // The ack came after the store's answer: the effect was performed
    // inside `perform`, before the ack was handed out.
    assert_eq!(r.fake.effects.last().map(|e| &e[..8]), Some("Feedback"));
    // The ack was lost: the agent sends 1..=3 again; 1 and 2 are not new.
    let a = r.agent(FromAgent::Feedback(vec![
        entry(1, "p"),
        entry(2, "p"),
        entry(3, "p"),
    ]));
    assert_eq!(acks(&a), [3]);
    assert_eq!(
        r.fake.offered,
        [1, 2, 3],
        "re-sent entries are not offered again"
    );
}

#[test]
fn an_out_of_order_seq_ends_the_stream_and_nothing_of_the_batch_is_stored() {
    let mut r = Run::start(Fake::new(vec![pending("p", 1)]), 1);
    let a = r.agent(FromAgent::Feedback(vec![entry(2, "p"), entry(1, "p")]));
    assert!(matches!(ended(&a), Some(End::Bad(m)) if m.contains("out of order")));
    assert!(acks(&a).is_empty());
    assert!(r.fake.stored.is_empty());
}

#[test]
fn entries_for_packs_not_the_agents_are_acknowledged_but_not_stored() {
    let mut r = Run::start(Fake::new(vec![pending("p", 1)]), 1);
    let a = r.agent(FromAgent::Feedback(vec![entry(1, "other"), entry(2, "p")]));
    assert_eq!(acks(&a), [2]);
    assert_eq!(r.fake.stored, BTreeSet::from([2]));
    assert!(r.s.dropped()[0].1 == 1, "the foreign entry is counted");
}

#[test]
fn a_gap_not_explained_by_the_agents_drops_is_reported_lost() {
    let mut fake = Fake::new(vec![pending("p", 1)]);
    fake.stored.extend(1..=3);
    // The store has 1..=3; the agent's outbox starts at 10 and says it
    // dropped 2 entries before it: 4..=9 is six missing, two explained.
    let mut r = Run::start(fake, 10);
    let mut first = entry(10, "p");
    first.dropped_before = 2;
    let a = r.agent(FromAgent::Feedback(vec![first]));
    let lost = a.iter().find_map(|a| match a {
        Action::Note(Note::FeedbackLost(n)) => Some(*n),
        _ => None,
    });
    assert_eq!(lost, Some(4));
    assert_eq!(acks(&a), [10]);
}

#[test]
fn a_firing_skipped_as_late_is_noted_once_per_batch() {
    let mut r = Run::start(Fake::new(vec![pending("p", 1)]), 1);
    let late_notes = |a: &[Action]| {
        a.iter()
            .filter(|a| matches!(a, Action::Note(Note::Late)))
            .count()
    };
    let a = r.agent(FromAgent::Feedback(vec![entry(1, "p"), entry(2, "p")]));
    assert_eq!(late_notes(&a), 0, "on time");
    let late = |seq| FeedbackRow {
        event: "skipped".into(),
        reason: wire::Reason::Late,
        ..entry(seq, "p")
    };
    let a = r.agent(FromAgent::Feedback(vec![late(3), entry(4, "p"), late(5)]));
    assert_eq!(late_notes(&a), 1);
    // Sent again (the ack was lost): not new, not noted again.
    let a = r.agent(FromAgent::Feedback(vec![late(3), late(5)]));
    assert_eq!(late_notes(&a), 0);
}

#[test]
fn a_refusal_for_now_is_retried_with_backoff_and_a_final_one_is_not() {
    let mut r = Run::start(Fake::new(vec![pending("p", 1)]), 1);
    assert_eq!(pushes(&r.seen).len(), 1);
    let nack = |reason| FromAgent::Nack {
        key: key("p"),
        version: 1,
        reason,
        message: String::new(),
        errors: Vec::new(),
    };
    r.agent(nack(wire::NackReason::ResourceExhausted));
    // First retry after RETRY_FIRST × 2, not before.
    assert_eq!(
        r.s.next_wake(),
        r.t0 + pushes::retry_wait(1),
        "the session wakes for the retry"
    );
    let a = r.advance(pushes::retry_wait(1) - Duration::from_millis(1));
    assert!(pushes(&a).is_empty());
    let a = r.advance(Duration::from_millis(1));
    assert_eq!(pushes(&a), vec![("p".to_string(), 1)]);
    // Refused again, for good this time: never sent again on its own.
    r.agent(nack(wire::NackReason::Invalid));
    let a = r.advance(RETRY_MAX * 2);
    assert!(pushes(&a).is_empty(), "{a:?}");
    assert_eq!(r.fake.rows[0].state, DeliveryState::Nacked);
    assert_eq!(r.fake.rows[0].attempts, 2);
}

#[test]
fn a_silent_agent_is_pinged_and_dead_after_three_intervals() {
    let mut r = Run::start(Fake::new(Vec::new()), 1);
    let a = r.advance(PING);
    assert!(sends(&a).iter().any(|m| matches!(m, ToAgent::Ping(1))));
    r.agent(FromAgent::Heard);
    let a = r.advance(PING * 3 - Duration::from_millis(1));
    assert!(ended(&a).is_none(), "{a:?}");
    let a = r.advance(Duration::from_millis(1));
    assert!(matches!(ended(&a), Some(End::Dead(d)) if *d >= PING * 3));
}

#[test]
fn time_requests_past_the_rate_limit_go_unanswered() {
    let mut r = Run::start(Fake::new(Vec::new()), 1);
    let mut answered = 0;
    for id in 0..40 {
        let a = r.agent(FromAgent::TimeRequest { id, t1_ns: 5 });
        answered += sends(&a)
            .iter()
            .filter(|m| matches!(m, ToAgent::TimeReply { t1_ns: 5, .. }))
            .count();
    }
    assert_eq!(answered, TIME_REQUESTS.burst as usize);
    assert_eq!(r.s.dropped()[1].1, 40 - TIME_REQUESTS.burst as u64);
}

#[test]
fn new_trust_lists_are_relayed_on_a_live_stream() {
    let mut r = Run::start(Fake::new(Vec::new()), 1);
    let chain: Arc<str> = Arc::from("[]");
    let a = r.input(Input::Hub(SessionCmd::TrustLists(chain.clone())));
    assert!(
        sends(&a)
            .iter()
            .any(|m| matches!(m, ToAgent::TrustLists(c) if **c == *chain)),
        "{a:?}"
    );
    assert_eq!(r.s.cfg.trust_chain.as_deref(), Some("[]"), "kept for later");
}

#[test]
fn trust_reports_are_stored_from_the_stream_up_to_a_rate() {
    let mut r = Run::start(Fake::new(Vec::new()), 1);
    for v in 0..20 {
        r.agent(FromAgent::Trust(baton_model::TrustRow {
            root: true,
            list_version: v,
            ..Default::default()
        }));
    }
    let stored = r
        .fake
        .effects
        .iter()
        .filter(|e| e.starts_with("Trust { session: 1"))
        .count();
    assert_eq!(stored, TRUST_REPORTS.burst as usize, "{:?}", r.fake.effects);
    assert_eq!(r.s.dropped()[3].1, 20 - TRUST_REPORTS.burst as u64);
    // The latest, held back, is stored once the rate allows: what the
    // agent said last is what is shown, though it says it only once.
    r.advance(SEEN_EVERY);
    let last = r
        .fake
        .effects
        .iter()
        .filter(|e| e.starts_with("Trust { session: 1"))
        .count();
    assert_eq!(last, stored + 1, "{:?}", r.fake.effects);
    assert_eq!(r.s.agent.trust.as_ref().map(|t| t.list_version), Some(19));
}

#[test]
fn a_replaced_or_forgotten_stream_ends_and_a_held_set_is_filtered_to_its_own() {
    let mut r = Run::start(Fake::new(vec![pending("p", 1)]), 1);
    let a = r.input(Input::Hub(SessionCmd::Replaced));
    assert_eq!(ended(&a), Some(&End::Replaced));

    let cfg_tenants = LinkConfig {
        ping_interval: PING,
        binding: Binding::Tenants,
        trust_chain: None,
    };
    let mut r = Run::start(Fake::new(vec![pending("p", 1)]), 1);
    r.s.cfg = cfg_tenants;
    let held = |tenant: &str, pack: &str| HeldPackRow {
        tenant: tenant.into(),
        pack: pack.into(),
        version: 1,
        stopped: false,
    };
    r.agent(FromAgent::Held(vec![
        held("default", "p"),
        held("plant-b", "q"),
    ]));
    // The agent serves no tenant here: only the entry it has a row of is
    // stored; the other is dropped and counted.
    let stored = r
        .fake
        .effects
        .iter()
        .rfind(|e| e.starts_with("Held"))
        .cloned()
        .unwrap_or_default();
    assert!(stored.starts_with("Held"), "{:?}", r.fake.effects);
    assert_eq!(r.s.dropped()[0].1, 1);
}

/// What the agent does next, for the property tests.
#[derive(Clone, Debug)]
enum Step {
    /// Send the next `n` entries, starting `back` before the first the
    /// agent believes unacknowledged (a re-send after a lost ack).
    Send { n: u64, back: u64 },
    /// The controller's ack of the last batch is lost on the way.
    LoseAck,
    /// Send a batch in the wrong order (a broken or hostile agent).
    Reorder,
    /// The stream breaks: the agent reconnects with what it still holds.
    Reconnect,
    /// Time passes.
    Wait(u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (1u64..6, 0u64..4).prop_map(|(n, back)| Step::Send { n, back }),
        1 => Just(Step::LoseAck),
        1 => Just(Step::Reorder),
        1 => Just(Step::Reconnect),
        1 => (1u64..40).prop_map(Step::Wait),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever the order of re-sends, lost acks, broken batches and
    /// reconnects mid-window: an ack never covers an entry the store does
    /// not have, acks on a stream never go back, nothing is stored out of
    /// order, and once the agent has sent everything, everything is
    /// stored.
    #[test]
    fn feedback_acks_never_run_ahead_of_the_store(steps in proptest::collection::vec(step(), 1..40)) {
        const TOTAL: u64 = 30;
        let mut agent_acked = 0u64; // what the agent believes stored
        let mut fake = Fake::new(vec![pending("p", 1)]);
        fake.rows[0].held = Some(Held { version: 1, stopped: false });
        fake.rows[0].state = DeliveryState::Acked;
        let mut r = Run::start(fake, 1);
        let mut stream_acks: Vec<u64> = Vec::new();
        let mut lose_next = false;
        let check = |a: &[Action], r: &Run, stream_acks: &mut Vec<u64>| -> Option<u64> {
            let mut last = None;
            for s in acks(a) {
                for seq in 1..=s {
                    assert!(r.fake.stored.contains(&seq), "ack {s} before {seq} was stored");
                }
                if let Some(p) = stream_acks.last() {
                    assert!(s >= *p, "acks went back: {p} then {s}");
                }
                stream_acks.push(s);
                last = Some(s);
            }
            last
        };
        for st in steps {
            let a = match st {
                Step::Send { n, back } => {
                    let from = agent_acked.saturating_sub(back) + 1;
                    let to = (agent_acked + n).min(TOTAL);
                    if from > to { continue; }
                    r.agent(FromAgent::Feedback((from..=to).map(|s| entry(s, "p")).collect()))
                }
                Step::LoseAck => { lose_next = true; continue; }
                Step::Reorder => {
                    let s = agent_acked + 1;
                    if s + 1 > TOTAL { continue; }
                    r.agent(FromAgent::Feedback(vec![entry(s + 1, "p"), entry(s, "p")]))
                }
                Step::Reconnect => {
                    let fake = std::mem::replace(&mut r.fake, Fake::new(Vec::new()));
                    r = Run::start(fake, agent_acked + 1);
                    stream_acks.clear();
                    // The welcome says what the store has.
                    agent_acked = agent_acked.max(r.fake.acked());
                    continue;
                }
                Step::Wait(s) => r.advance(Duration::from_secs(s)),
            };
            let got = check(&a, &r, &mut stream_acks);
            if let Some(s) = got && !std::mem::take(&mut lose_next) {
                agent_acked = agent_acked.max(s);
            }
            if ended(&a).is_some() {
                let fake = std::mem::replace(&mut r.fake, Fake::new(Vec::new()));
                r = Run::start(fake, agent_acked + 1);
                stream_acks.clear();
                agent_acked = agent_acked.max(r.fake.acked());
            }
        }
        // The agent sends the rest on a fresh stream.
        let fake = std::mem::replace(&mut r.fake, Fake::new(Vec::new()));
        let mut r = Run::start(fake, agent_acked + 1);
        let from = r.fake.acked() + 1;
        if from <= TOTAL {
            let a = r.agent(FromAgent::Feedback((from..=TOTAL).map(|s| entry(s, "p")).collect()));
            prop_assert_eq!(acks(&a), vec![TOTAL]);
        }
        prop_assert_eq!(r.fake.stored.clone(), (1..=TOTAL).collect::<BTreeSet<u64>>());
    }

    /// Whatever the order of the agent's answers (acks, refusals for now
    /// and for good, repeated) and the ticks between them: every push the
    /// session sends is what the row asks at that moment, and a version
    /// refused for good is not sent again on its own.
    #[test]
    fn pushes_follow_the_row_whatever_the_order_of_answers(
        answers in proptest::collection::vec((0u8..4, 0u64..90), 1..30)
    ) {
        let mut r = Run::start(Fake::new(vec![pending("p", 3)]), 1);
        for (what, secs) in answers {
            // Keep the agent heard from, so the stream is not dead.
            r.agent(FromAgent::Heard);
            let asks = baton_model::planner::action(&r.fake.rows[0]);
            let a = match what {
                0 => r.agent(FromAgent::Ack { key: key("p"), version: 3, staged: None, unchanged: false }),
                1 | 2 => r.agent(FromAgent::Nack {
                    key: key("p"),
                    version: 3,
                    reason: if what == 1 { wire::NackReason::Clock } else { wire::NackReason::Invalid },
                    message: "no".into(),
                    errors: Vec::new(),
                }),
                _ => r.advance(Duration::from_secs(secs.min(25))),
            };
            for (_, v) in pushes(&a) {
                prop_assert_eq!(v, 3);
                prop_assert_eq!(
                    asks, Some(baton_model::planner::Action::Push(3)),
                    "a push when the row asked for {:?} ({:?})", asks, r.fake.rows[0]
                );
            }
            if what == 2 {
                prop_assert_eq!(r.fake.rows[0].state, DeliveryState::Nacked);
            }
        }
    }
}

fn release(version: &str, size: u64) -> Arc<baton_model::ReleaseRow> {
    Arc::new(baton_model::ReleaseRow {
        version: version.into(),
        arch: "x86_64".into(),
        manifest: format!("{{\"version\":\"{version}\"}}"),
        key: "00112233aabbccdd".into(),
        signature: "c2ln".into(),
        size,
        sha256: "ab".repeat(32),
        uploaded: RefTime::from_nanos(0),
        by: "ann".into(),
    })
}

/// What a box says of update `version`.
fn word(version: &str, phase: baton_model::UpdatePhase, held: u64) -> baton_model::UpdateRow {
    baton_model::UpdateRow {
        version: version.into(),
        phase,
        held_bytes: held,
        size: 10,
        reason: String::new(),
        at: RefTime::from_nanos(5),
    }
}

fn offers(a: &[Action]) -> Vec<String> {
    sends(a)
        .into_iter()
        .filter_map(|m| match m {
            ToAgent::ReleaseOffer(r) => Some(r.version.clone()),
            _ => None,
        })
        .collect()
}

fn chunks(a: &[Action]) -> Vec<(u64, Vec<u8>)> {
    sends(a)
        .into_iter()
        .filter_map(|m| match m {
            ToAgent::ReleaseChunk { offset, data, .. } => Some((*offset, data.clone())),
            _ => None,
        })
        .collect()
}

fn ask(version: &str, offset: u64, length: u32) -> FromAgent {
    FromAgent::ReleaseRequest {
        version: version.into(),
        offset,
        length,
    }
}

#[test]
fn a_release_is_offered_at_the_welcome_and_its_pieces_served_as_asked() {
    let piece = baton_model::RELEASE_PIECE;
    let mut fake = Fake::new(Vec::new());
    fake.release = Some(release("2.0.0", piece + 10));
    fake.pieces = vec![(0..piece).map(|i| (i % 251) as u8).collect(), vec![7; 10]];
    let mut r = Run::start(fake, 1);
    assert_eq!(offers(&r.seen), ["2.0.0"]);

    // A whole piece, part of one, across two (answered short), the tail.
    let a = r.agent(ask("2.0.0", 0, piece as u32));
    assert_eq!(chunks(&a), [(0, r.fake.pieces[0].clone())]);
    let a = r.agent(ask("2.0.0", 100, 50));
    assert_eq!(chunks(&a), [(100, r.fake.pieces[0][100..150].to_vec())]);
    let a = r.agent(ask("2.0.0", piece - 4, 64));
    assert_eq!(
        chunks(&a),
        [(piece - 4, r.fake.pieces[0][piece as usize - 4..].to_vec())]
    );
    let a = r.agent(ask("2.0.0", piece, 64 * 1024));
    assert_eq!(chunks(&a), [(piece, vec![7; 10])]);
    assert!(ended(&r.seen).is_none());

    // Past its end: a box that does not follow the protocol.
    let a = r.agent(ask("2.0.0", piece + 10, 1));
    assert!(matches!(ended(&a), Some(End::Bad(_))), "{a:?}");
}

#[test]
fn only_the_offered_release_is_served_and_a_withdrawn_one_no_more() {
    let mut fake = Fake::new(Vec::new());
    fake.release = Some(release("2.0.0", 10));
    fake.pieces = vec![vec![1; 10]];
    let mut r = Run::start(fake, 1);
    // Another version (in flight from an offer superseded): dropped,
    // counted, the stream goes on.
    let a = r.agent(ask("1.9.0", 0, 10));
    assert!(chunks(&a).is_empty() && ended(&a).is_none(), "{a:?}");
    assert_eq!(r.s.dropped()[4].1, 1);

    let mut fake = Fake::new(Vec::new());
    fake.release = Some(release("2.0.0", 10));
    fake.pieces = vec![vec![1; 10]];
    let mut r = Run::start(fake, 1);
    // Withdrawn (an abort): read again on the hub's word, nothing more
    // served, the stream goes on.
    r.fake.release = None;
    r.input(Input::Hub(SessionCmd::Release));
    let a = r.agent(ask("2.0.0", 0, 10));
    assert!(chunks(&a).is_empty() && ended(&a).is_none(), "{a:?}");
    // Offered again (a new update): sent once however often it is told.
    r.fake.release = Some(release("2.0.1", 10));
    let a = r.input(Input::Hub(SessionCmd::Release));
    assert_eq!(offers(&a), ["2.0.1"]);
    let a = r.input(Input::Hub(SessionCmd::Release));
    assert!(offers(&a).is_empty(), "{a:?}");
}

#[test]
fn a_release_the_agent_runs_or_gave_up_is_not_offered() {
    let mut fake = Fake::new(Vec::new());
    fake.release = Some(release("test", 10));
    let r = Run::start(fake, 1);
    assert!(offers(&r.seen).is_empty(), "it runs version `test`");

    let mut fake = Fake::new(Vec::new());
    fake.release = Some(release("2.0.0", 10));
    let mut r = Run::start(fake, 1);
    r.agent(FromAgent::Update(baton_model::UpdateRow {
        reason: "not welcomed within 5m".into(),
        ..word("2.0.0", baton_model::UpdatePhase::RolledBack, 10)
    }));
    assert!(
        r.fake
            .effects
            .iter()
            .any(|e| e.starts_with("Update { session: 1"))
    );
    r.s.offered = None;
    let a = r.input(Input::Hub(SessionCmd::Release));
    assert!(offers(&a).is_empty(), "rolled back here: {a:?}");
}

#[test]
fn update_reports_are_stored_up_to_a_rate_and_requests_past_theirs_dropped() {
    let mut fake = Fake::new(Vec::new());
    fake.release = Some(release("2.0.0", 10));
    fake.pieces = vec![vec![1; 10]];
    let mut r = Run::start(fake, 1);
    for held in 0..20 {
        r.agent(FromAgent::Update(word(
            "2.0.0",
            baton_model::UpdatePhase::Downloading,
            held,
        )));
    }
    let stored = r
        .fake
        .effects
        .iter()
        .filter(|e| e.starts_with("Update {"))
        .count();
    assert_eq!(stored, UPDATE_REPORTS.burst as usize);
    // A burst at once: the pace's burst served now, the queue's worth
    // waits its turn (served as time passes, none dropped), the rest of an
    // agent asking far more than its window is dropped.
    let mut served = 0;
    for _ in 0..200 {
        served += chunks(&r.agent(ask("2.0.0", 0, 10))).len();
    }
    let burst = RELEASE_REQUESTS.burst as usize;
    assert_eq!(served, burst);
    assert_eq!(r.s.dropped()[4].1, (200 - burst - RELEASE_QUEUE) as u64);
    let mut later = 0;
    for _ in 0..100 {
        later += chunks(&r.advance(Duration::from_millis(10))).len();
    }
    assert_eq!(later, RELEASE_QUEUE, "the waiting ones, at the pace");
    assert!(ended(&r.seen).is_none());
}

#[test]
fn a_download_faster_than_the_pace_is_slowed_not_dropped() {
    let mut fake = Fake::new(Vec::new());
    fake.release = Some(release("2.0.0", 10));
    fake.pieces = vec![vec![1; 10]];
    let mut r = Run::start(fake, 1);
    // An agent whose download-rate is far above the pace keeps a window
    // of four in flight and asks again as each answer comes: every
    // request is answered, at the pace.
    let mut answered = 0;
    let mut asked = 0;
    let mut in_flight = 0;
    for _ in 0..2_000 {
        while in_flight < 4 {
            let a = r.agent(ask("2.0.0", 0, 10));
            asked += 1;
            in_flight += 1;
            let n = chunks(&a).len();
            answered += n;
            in_flight -= n;
        }
        let n = chunks(&r.advance(Duration::from_millis(1))).len();
        answered += n;
        in_flight -= n;
    }
    assert_eq!(r.s.dropped()[4].1, 0, "none dropped");
    assert!(
        answered + 4 >= asked && answered <= asked,
        "{answered} of {asked}"
    );
    // Two seconds at 64 a second, and the first burst.
    let most = (2.0 * RELEASE_REQUESTS.rate + RELEASE_REQUESTS.burst) as usize + 1;
    assert!(
        answered <= most && answered >= most - 8,
        "{answered}, about {most}"
    );
}

#[test]
fn a_refused_offer_is_made_again_at_the_next_resync_and_held_back_reports_stored() {
    let mut fake = Fake::new(Vec::new());
    fake.release = Some(release("2.0.0", 10));
    let mut r = Run::start(fake, 1);
    assert_eq!(offers(&r.seen), ["2.0.0"]);
    let said = |phase, held| word("2.0.0", phase, held);
    // Refused for now (the box was itself on trial): offered again on
    // the next word of a step, and at the resync.
    r.agent(FromAgent::Update(said(
        baton_model::UpdatePhase::Refused,
        0,
    )));
    let a = r.input(Input::Hub(SessionCmd::Release));
    assert_eq!(offers(&a), ["2.0.0"], "a word of a step reads it again");
    r.agent(FromAgent::Update(said(
        baton_model::UpdatePhase::Refused,
        0,
    )));
    let mut again = Vec::new();
    while r.at < RESYNC + PING {
        again.extend(offers(&r.advance(PING / 2)));
        // The agent answers pings (the stream stays live).
        r.agent(FromAgent::Heard);
    }
    assert_eq!(again, ["2.0.0"], "offered again at the resync");
    // Not after a rollback: the box never takes that version again.
    r.agent(FromAgent::Update(said(
        baton_model::UpdatePhase::RolledBack,
        10,
    )));
    let a = r.advance(RESYNC);
    assert!(offers(&a).is_empty(), "{a:?}");
    // A burst of reports past the rate: the latest is stored later.
    for held in 0..20 {
        r.agent(FromAgent::Update(said(
            baton_model::UpdatePhase::Downloading,
            held,
        )));
    }
    let stored = |r: &Run| {
        r.fake
            .effects
            .iter()
            .filter(|e| e.starts_with("Update {"))
            .count()
    };
    let before = stored(&r);
    r.advance(SEEN_EVERY);
    assert_eq!(stored(&r), before + 1, "{:?}", r.fake.effects);
    assert_eq!(
        r.s.agent.update.as_ref().map(|u| u.held_bytes),
        Some(19),
        "the latest word kept"
    );
}

#[test]
fn a_release_the_box_holds_but_is_no_longer_offered_is_withdrawn_once() {
    let mut fake = Fake::new(Vec::new());
    fake.release = Some(release("2.0.0", 10));
    let mut r = Run::start(fake, 1);
    r.agent(FromAgent::Update(baton_model::UpdateRow {
        reason: "restarts into it at the first quiet moment".into(),
        ..word("2.0.0", baton_model::UpdatePhase::Installed, 10)
    }));
    // Still its target: nothing withdrawn.
    let a = r.input(Input::Hub(SessionCmd::Release));
    assert!(
        !sends(&a)
            .iter()
            .any(|m| matches!(m, ToAgent::ReleaseWithdraw(_))),
        "{a:?}"
    );
    // Aborted: withdrawn, once.
    r.fake.release = None;
    let a = r.input(Input::Hub(SessionCmd::Release));
    let withdrawn: Vec<&ToAgent> = sends(&a)
        .into_iter()
        .filter(|m| matches!(m, ToAgent::ReleaseWithdraw(v) if v == "2.0.0"))
        .collect();
    assert_eq!(withdrawn.len(), 1, "{a:?}");
    let a = r.advance(RESYNC);
    assert!(
        !sends(&a)
            .iter()
            .any(|m| matches!(m, ToAgent::ReleaseWithdraw(_))),
        "{a:?}"
    );
    // Another release now: the one installed is withdrawn, the new one
    // offered.
    let mut fake = Fake::new(Vec::new());
    fake.release = Some(release("2.0.0", 10));
    let mut r = Run::start(fake, 1);
    r.agent(FromAgent::Update(word(
        "2.0.0",
        baton_model::UpdatePhase::Downloading,
        4,
    )));
    r.fake.release = Some(release("2.0.1", 10));
    let a = r.input(Input::Hub(SessionCmd::Release));
    assert!(
        sends(&a)
            .iter()
            .any(|m| matches!(m, ToAgent::ReleaseWithdraw(v) if v == "2.0.0")),
        "{a:?}"
    );
    assert_eq!(offers(&a), ["2.0.1"]);
}
