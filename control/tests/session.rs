//! The controller session's rules driven by plain calls: named orders of
//! events, then property tests over any order of connects, welcomes at
//! any generation, orders, acks, pings, disconnects, journal writes and
//! sends, checked against a model of the journal and of what the fence
//! allows.

use std::time::Duration;

use baton_clock::MonoTime;
use baton_control::session::window::MAX_IN_FLIGHT;
use baton_control::session::{Cmd, Facts, Input, Leased, Order, Session, Stale};
use proptest::prelude::*;

const MS: i64 = 1_000_000;

fn at(ms: i64) -> MonoTime {
    MonoTime::from_nanos(ms * MS)
}

/// A journal as far as the session sees it: the fence's generation, the
/// seqs handed out, the acknowledged front.
#[derive(Clone, Copy, Debug, Default)]
struct Journal {
    highest_gen: u64,
    last_seq: u64,
    acked: u64,
}

impl Journal {
    fn facts(&self) -> Facts {
        Facts {
            highest_gen: self.highest_gen,
            last_seq: self.last_seq,
            outbox_front: (self.last_seq > self.acked).then_some(self.acked + 1),
        }
    }

    /// Carry out the journal's commands, as the agent does.
    fn apply(&mut self, cmds: &[Cmd]) {
        for c in cmds {
            match c {
                Cmd::JournalGeneration { generation, .. } => {
                    assert!(*generation > self.highest_gen, "{cmds:?}");
                    self.highest_gen = *generation;
                }
                Cmd::AckFeedback { seq, .. } => {
                    assert!(*seq <= self.last_seq, "an ack beyond the journal: {cmds:?}");
                    self.acked = self.acked.max(*seq);
                }
                _ => {}
            }
        }
    }
}

/// One event as the agent handles it: the commands carried out on the
/// journal in order, a journalled generation said back to the session
/// (`Journalled`), every command returned.
fn drive(s: &mut Session, now: MonoTime, input: Input, j: &mut Journal) -> Vec<Cmd> {
    let cmds = s.handle(now, input, j.facts());
    let mut out = Vec::new();
    for c in cmds {
        j.apply(std::slice::from_ref(&c));
        let back = match &c {
            Cmd::JournalGeneration {
                session,
                generation,
            } => Some(Input::Journalled {
                session: *session,
                generation: *generation,
            }),
            _ => None,
        };
        out.push(c);
        if let Some(b) = back {
            out.extend(drive(s, now, b, j));
        }
    }
    out
}

/// A session welcomed at generation 2 with five entries written.
fn welcomed() -> (Session, Journal) {
    let mut s = Session::new(at(0));
    let mut j = Journal {
        last_seq: 5,
        ..Journal::default()
    };
    let c = s.handle(at(1), Input::Connected { session: 1 }, j.facts());
    assert_eq!(
        c,
        vec![Cmd::Discard { keep: Some(1) }, Cmd::Hello { session: 1 }]
    );
    let _ = drive(
        &mut s,
        at(2),
        Input::Welcome {
            session: 1,
            acked_seq: 0,
            generation: 2,
        },
        &mut j,
    );
    (s, j)
}

/// The Welcome that raises the fence journals it first, before the ack
/// and the report; the window opens at the outbox front.
#[test]
fn a_raised_generation_is_journalled_before_anything_else() {
    let mut s = Session::new(at(0));
    let mut j = Journal {
        highest_gen: 1,
        last_seq: 9,
        acked: 3,
    };
    let _ = s.handle(at(1), Input::Connected { session: 7 }, j.facts());
    let c = s.handle(
        at(2),
        Input::Welcome {
            session: 7,
            acked_seq: 5,
            generation: 2,
        },
        j.facts(),
    );
    assert_eq!(
        c,
        vec![Cmd::JournalGeneration {
            session: 7,
            generation: 2
        }],
        "the journal first, nothing else"
    );
    // Until the journal holds it, the session is not the controller: an
    // order is refused, an ack drops nothing, nothing is sent.
    let order = Input::Order {
        session: 7,
        generation: 2,
        order: Order::Push,
    };
    assert!(matches!(
        s.handle(at(3), order.clone(), j.facts()).as_slice(),
        [Cmd::RefuseOrder { .. }]
    ));
    assert_eq!(
        s.handle(at(3), Input::FeedbackAck { session: 7, seq: 5 }, j.facts()),
        vec![Cmd::IgnoreAck { session: 7, seq: 5 }]
    );
    assert_eq!(s.next_page(Some(4)), None);
    j.apply(&c);
    let c = s.handle(
        at(4),
        Input::Journalled {
            session: 7,
            generation: 2,
        },
        j.facts(),
    );
    assert_eq!(
        c,
        vec![
            Cmd::AckFeedback {
                seq: 5,
                claimed: None
            },
            Cmd::ClockReport { session: 7 },
        ]
    );
    assert!(s.welcomed());
    assert_eq!(s.next_page(Some(6)), Some((6, 256)));
    assert!(matches!(
        s.handle(at(5), order, j.facts()).as_slice(),
        [Cmd::Act { .. }]
    ));
}

/// A controller claiming more than the journal ever wrote acknowledges
/// only what exists; what is written after is still sent.
#[test]
fn an_ack_beyond_the_journal_takes_only_what_exists() {
    let (mut s, mut j) = welcomed();
    let c = s.handle(
        at(3),
        Input::FeedbackAck {
            session: 1,
            seq: 50,
        },
        j.facts(),
    );
    assert_eq!(
        c,
        vec![Cmd::AckFeedback {
            seq: 5,
            claimed: Some(50)
        }]
    );
    j.apply(&c);
    j.last_seq = 8;
    assert_eq!(s.next_page(j.facts().outbox_front), Some((6, 256)));
}

/// A lease lost mid-window: feedback in flight is not contact; the
/// controller's silence runs the lease out however much is sent; its
/// next ack is contact again.
#[test]
fn a_lease_runs_out_mid_window_and_an_ack_is_contact_again() {
    let (mut s, j) = welcomed();
    let p = Leased {
        lease: Duration::from_secs(10),
        since: at(0),
    };
    assert_eq!(s.lease_expiry(&p), at(10_002), "from the Welcome");
    let (from, n) = s.next_page(j.facts().outbox_front).expect("room");
    s.sent_through(from + n.min(5) - 1);
    assert!(s.lease_expired(&p, at(10_002)), "sending is not contact");
    let _ = s.handle(
        at(10_500),
        Input::FeedbackAck { session: 1, seq: 5 },
        j.facts(),
    );
    assert!(!s.lease_expired(&p, at(10_502)));
    assert_eq!(s.lease_expiry(&p), at(20_500));
}

/// A reconnect to a newer owner (higher generation): the old session's
/// late push is stale and its ack drops nothing; the new one's orders
/// are acted on and answered on it.
#[test]
fn a_reconnect_with_a_higher_generation_fences_the_old_session() {
    let (mut s, mut j) = welcomed();
    let _ = s.handle(at(3), Input::Disconnected { session: 1 }, j.facts());
    let _ = s.handle(at(4), Input::Connected { session: 2 }, j.facts());
    let _ = drive(
        &mut s,
        at(5),
        Input::Welcome {
            session: 2,
            acked_seq: 0,
            generation: 3,
        },
        &mut j,
    );
    assert_eq!(j.highest_gen, 3);
    let c = s.handle(
        at(6),
        Input::Order {
            session: 1,
            generation: 2,
            order: Order::Push,
        },
        j.facts(),
    );
    assert!(
        matches!(
            c.as_slice(),
            [Cmd::RefuseOrder {
                order: Order::Push,
                reply_on: None,
                stale: Stale::NotWelcomed { got: 2, highest: 3 },
            }]
        ),
        "{c:?}"
    );
    assert_eq!(
        s.handle(at(7), Input::FeedbackAck { session: 1, seq: 5 }, j.facts()),
        vec![Cmd::IgnoreAck { session: 1, seq: 5 }]
    );
    let c = s.handle(
        at(8),
        Input::Order {
            session: 2,
            generation: 3,
            order: Order::Cancel,
        },
        j.facts(),
    );
    assert_eq!(
        c,
        vec![Cmd::Act {
            order: Order::Cancel,
            reply_on: Some(2)
        }]
    );
    assert_eq!(s.stale().pushes, 1);
}

/// A stale Welcome: refused, nothing journalled or acknowledged, not
/// contact; the session's orders are refused after it.
#[test]
fn a_welcome_below_the_fence_is_refused_and_commands_nothing() {
    let mut s = Session::new(at(0));
    let j = Journal {
        highest_gen: 4,
        last_seq: 3,
        acked: 0,
    };
    let _ = s.handle(at(1), Input::Connected { session: 1 }, j.facts());
    let c = s.handle(
        at(2),
        Input::Welcome {
            session: 1,
            acked_seq: 3,
            generation: 3,
        },
        j.facts(),
    );
    assert_eq!(
        c,
        vec![Cmd::Refuse {
            session: 1,
            stale: Stale::Welcome { got: 3, highest: 4 }
        }]
    );
    assert!(!s.welcomed());
    assert_eq!(s.next_page(Some(1)), None, "no feedback to a stale store");
    let p = Leased {
        lease: Duration::from_secs(1),
        since: at(0),
    };
    assert_eq!(s.lease_expiry(&p), at(1_000), "not contact");
    assert_eq!(s.stale().welcomes, 1);
}

/// Clock reports: after the Welcome, every interval, and at once on a
/// change of source or state; never before a Welcome.
#[test]
fn clock_reports_follow_the_interval_and_changes() {
    use baton_clock::estimator::ClockState;
    use baton_clock::sample::SourceKind;
    let mut s = Session::new(at(0));
    let _ = s.handle(at(1), Input::Connected { session: 1 }, Facts::default());
    let link = Some((SourceKind::Link, ClockState::Locked));
    assert_eq!(s.clock_report_due(at(1), link), None, "not welcomed");
    let _ = s.handle(
        at(2),
        Input::Welcome {
            session: 1,
            acked_seq: 0,
            generation: 0,
        },
        Facts::default(),
    );
    // The Welcome's own report went out; the first poll sees a change
    // (nothing reported by a poll yet).
    assert!(s.clock_report_due(at(3), link).is_some());
    assert_eq!(s.clock_report_due(at(4), link), None);
    assert_eq!(s.next_wake(), Some(at(5_003)));
    assert!(s.clock_report_due(at(5_003), link).is_some());
    let holdover = Some((SourceKind::Link, ClockState::Holdover));
    assert_eq!(
        s.clock_report_due(at(5_004), holdover),
        Some(Cmd::ClockReport { session: 1 })
    );
}

/// One step of the property test.
#[derive(Clone, Debug)]
enum Step {
    Connect,
    /// `who`: 0 the current transport, 1 the one before, 2 one never
    /// seen.
    Welcome {
        who: u8,
        acked_back: u64,
        generation: u64,
        /// A raised generation's `Journalled` comes at a later step.
        delay: bool,
    },
    /// The journalled generation a Welcome waits for is said now (or one
    /// whose Welcome is gone).
    Journalled,
    Ack {
        who: u8,
        seq_back: u64,
    },
    Alive {
        who: u8,
    },
    Disconnect {
        who: u8,
    },
    Order {
        who: u8,
        generation: u64,
        push: bool,
    },
    /// The agent writes this many feedback entries.
    Write(u64),
    /// The agent sends what the window allows (one page).
    Send,
    /// Time passes.
    Wait(i64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        2 => Just(Step::Connect),
        3 => (0u8..3, 0u64..8, 0u64..5, any::<bool>()).prop_map(|(who, acked_back, generation, delay)| Step::Welcome {
            who,
            acked_back,
            generation,
            delay,
        }),
        1 => Just(Step::Journalled),
        3 => (0u8..3, 0u64..300).prop_map(|(who, seq_back)| Step::Ack { who, seq_back }),
        1 => (0u8..3).prop_map(|who| Step::Alive { who }),
        1 => (0u8..3).prop_map(|who| Step::Disconnect { who }),
        4 => (0u8..3, 0u64..5, any::<bool>()).prop_map(|(who, generation, push)| Step::Order {
            who,
            generation,
            push
        }),
        3 => (0u64..600).prop_map(Step::Write),
        3 => Just(Step::Send),
        2 => (0i64..4_000).prop_map(Step::Wait),
    ]
}

/// What the fence allows, written out from the rules (docs/design.md
/// "Stores": fencing that reaches the device), beside the session.
#[derive(Debug, Default)]
struct Model {
    journal: Journal,
    /// The last transport connected, and whether it still lasts.
    latest: u64,
    live: bool,
    /// The session whose Welcome was accepted, at its generation.
    accepted: Option<(u64, u64)>,
    /// The session whose Welcome was refused.
    refused: Option<u64>,
    last_contact: i64,
    /// This session's highest seq handed to the link, and whether its
    /// window is open.
    sent: u64,
    open: bool,
    /// A Welcome waiting for its generation's journalling: session,
    /// generation.
    raising: Option<(u64, u64)>,
    /// The last one that waited (said again later: ignored).
    last_raised: Option<(u64, u64)>,
}

impl Model {
    /// `session` accepted at `generation` (its Welcome's last commands
    /// `c`): acked, the window open at the outbox front, a report.
    fn finish(
        &mut self,
        session: u64,
        generation: u64,
        now: i64,
        c: &[Cmd],
    ) -> Result<(), TestCaseError> {
        let acked = matches!(c, [Cmd::AckFeedback { .. }, Cmd::ClockReport { session: s }] if *s == session);
        prop_assert!(acked, "{:?}", c);
        self.journal.apply(c);
        self.accepted = Some((session, generation));
        self.last_contact = now;
        self.open = true;
        self.sent = self.journal.acked;
        Ok(())
    }

    fn who(&self, who: u8) -> u64 {
        match who {
            0 => self.latest,
            1 => self.latest.saturating_sub(1),
            _ => self.latest + 100,
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Whatever the order: only an accepted session at its own
    /// generation, never below the journal's, is acted on; a raised
    /// generation is journalled first; nothing is acknowledged beyond the
    /// journal or by a session not accepted; contact is only an accepted
    /// session's; the window never holds more than its limit and starts
    /// each session at the outbox front.
    #[test]
    fn the_fence_and_the_window_hold_in_any_order(steps in prop::collection::vec(step(), 1..80)) {
        let mut s = Session::new(at(0));
        let mut m = Model::default();
        let mut now = 0i64;
        let lease = Leased { lease: Duration::from_secs(10), since: at(0) };
        for st in steps {
            now += 1;
            let facts = m.journal.facts();
            match st {
                Step::Connect => {
                    m.latest += 1;
                    m.live = true;
                    m.accepted = None;
                    m.refused = None;
                    m.open = false;
                    m.raising = None;
                    let c = s.handle(at(now), Input::Connected { session: m.latest }, facts);
                    prop_assert_eq!(c, vec![Cmd::Discard { keep: Some(m.latest) }, Cmd::Hello { session: m.latest }]);
                }
                Step::Welcome { who, acked_back, generation, delay } => {
                    let session = m.who(who);
                    let acked_seq = m.journal.last_seq.saturating_sub(acked_back);
                    let c = s.handle(at(now), Input::Welcome { session, acked_seq, generation }, facts);
                    if !(m.live && session == m.latest) {
                        prop_assert!(c.is_empty(), "{:?}", c);
                        continue;
                    }
                    m.raising = None;
                    if generation < m.journal.highest_gen {
                        m.refused = Some(session);
                        m.accepted = None;
                        m.open = false;
                        let refused = matches!(c.as_slice(), [Cmd::Refuse { .. }]);
                        prop_assert!(refused, "{:?}", c);
                        continue;
                    }
                    m.refused = None;
                    if generation > m.journal.highest_gen {
                        // The journal first, and nothing else until it
                        // holds it.
                        prop_assert_eq!(&c, &vec![Cmd::JournalGeneration { session, generation }]);
                        m.journal.apply(&c);
                        m.accepted = None;
                        m.open = false;
                        m.raising = Some((session, generation));
                        m.last_raised = m.raising;
                        if delay {
                            continue;
                        }
                        let c = s.handle(at(now), Input::Journalled { session, generation }, m.journal.facts());
                        m.raising = None;
                        m.finish(session, generation, now, &c)?;
                    } else {
                        m.finish(session, generation, now, &c)?;
                    }
                }
                Step::Journalled => {
                    let (said, live) = match m.raising.take() {
                        Some(r) => (Some(r), true),
                        None => (m.last_raised, false),
                    };
                    let Some((session, generation)) = said else { continue };
                    let c = s.handle(at(now), Input::Journalled { session, generation }, facts);
                    if live {
                        m.finish(session, generation, now, &c)?;
                    } else {
                        prop_assert!(c.is_empty(), "a journalling nobody waits for: {:?}", c);
                    }
                }
                Step::Ack { who, seq_back } => {
                    let session = m.who(who);
                    let seq = (m.journal.last_seq + 50).saturating_sub(seq_back);
                    let c = s.handle(at(now), Input::FeedbackAck { session, seq }, facts);
                    if m.accepted.is_some_and(|(a, _)| a == session) {
                        m.journal.apply(&c);
                        m.last_contact = now;
                        let acked = matches!(c.as_slice(), [Cmd::AckFeedback { .. }]);
                        prop_assert!(acked, "{:?}", c);
                        m.sent = m.sent.max(m.journal.acked);
                    } else {
                        prop_assert_eq!(c, vec![Cmd::IgnoreAck { session, seq }]);
                    }
                }
                Step::Alive { who } => {
                    let session = m.who(who);
                    let c = s.handle(at(now), Input::Alive { session }, facts);
                    prop_assert!(c.is_empty());
                    if m.accepted.is_some_and(|(a, _)| a == session) {
                        m.last_contact = now;
                    }
                }
                Step::Disconnect { who } => {
                    let session = m.who(who);
                    let c = s.handle(at(now), Input::Disconnected { session }, facts);
                    if m.accepted.is_some_and(|(a, _)| a == session) {
                        m.accepted = None;
                    }
                    if m.refused == Some(session) {
                        m.refused = None;
                    }
                    if m.raising.is_some_and(|(r, _)| r == session) {
                        m.raising = None;
                    }
                    if m.live && session == m.latest {
                        m.live = false;
                        m.open = false;
                        prop_assert_eq!(c, vec![Cmd::Discard { keep: None }, Cmd::Ended { session }]);
                    } else {
                        prop_assert!(c.is_empty(), "{:?}", c);
                    }
                }
                Step::Order { who, generation, push } => {
                    let session = m.who(who);
                    let order = if push { Order::Push } else { Order::Cancel };
                    let c = s.handle(at(now), Input::Order { session, generation, order }, facts);
                    let allowed = m.accepted == Some((session, generation))
                        && generation >= m.journal.highest_gen;
                    let reply_on = (m.live && session == m.latest).then_some(session);
                    if allowed {
                        m.last_contact = now;
                        prop_assert_eq!(c, vec![Cmd::Act { order, reply_on }]);
                    } else {
                        let refused = matches!(
                            c.as_slice(),
                            [Cmd::RefuseOrder { order: o, reply_on: r, .. }] if *o == order && *r == reply_on
                        );
                        prop_assert!(refused, "{:?}", c);
                    }
                }
                Step::Write(n) => m.journal.last_seq += n,
                Step::Send => {
                    let front = facts.outbox_front;
                    match s.next_page(front) {
                        Some((from, n)) => {
                            prop_assert!(m.open, "a page while no session is welcomed");
                            // In order from the outbox front, nothing
                            // acknowledged sent again.
                            prop_assert_eq!(from, front.unwrap_or(m.journal.last_seq + 1).max(m.sent + 1));
                            let last = (from + n - 1).min(m.journal.last_seq);
                            if last >= from {
                                s.sent_through(last);
                                m.sent = last;
                            }
                            prop_assert!(m.sent.saturating_sub(m.journal.acked) <= MAX_IN_FLIGHT);
                        }
                        None => prop_assert!(
                            !m.open || m.sent - m.journal.acked.min(m.sent) >= MAX_IN_FLIGHT,
                            "no page with room in an open window"
                        ),
                    }
                }
                Step::Wait(ms) => now += ms,
            }
            prop_assert_eq!(s.welcomed(), m.open);
            prop_assert_eq!(s.lease_expiry(&lease), at(m.last_contact + 10_000));
        }
    }
}
