//! One controller session's rules, sans IO: which session may command the
//! box ([`fence`]), what feedback may be on the wire ([`window`]), what
//! counts as contact for the packs' leases ([`lease`]) and when the clock
//! is reported.
//!
//! [`Session::handle`] takes one [`Input`] (an event of the link, already
//! decoded), the monotonic time and the journal's [`Facts`], changes the
//! session's state, and returns the [`Cmd`]s the agent carries out, in
//! order. A command that fails (the journal) ends the agent's control loop
//! through its one way out, so nothing after it runs. A Welcome that
//! raises the generation is taken in two steps: it returns only
//! [`Cmd::JournalGeneration`]; once the journal holds it the agent says so
//! ([`Input::Journalled`]) and only then is the session accepted (contact,
//! acks, the window, orders), so a session whose generation could not be
//! journalled is never accepted, whatever the agent does after the
//! failure.
//!
//! # A session
//!
//! `Connected` → Hello. `Welcome` → fenced ([`fence`]), then the outbox is
//! acknowledged up to the controller's `feedback_acked_seq` (at most what
//! the journal ever wrote: a confused controller must not swallow feedback
//! that does not exist yet), the send window opens at the outbox front,
//! and a clock report goes out. From then on feedback flows in seq order
//! ([`window`]); an entry leaves the journal only when an ack of an
//! accepted session covers it. Every reconnect starts again at the outbox
//! front.

pub mod fence;
pub mod lease;
pub mod window;

use std::time::Duration;

use baton_clock::MonoTime;
use baton_clock::estimator::ClockState;
use baton_clock::sample::SourceKind;

pub use fence::{Fence, Stale, Welcomed};
pub use lease::{LeaseClock, Leased};
pub use window::SendWindow;

/// Clock reports, this often (and after every Welcome, and at once when
/// the clock's source or state changes).
pub const CLOCK_REPORT_EVERY: Duration = Duration::from_secs(5);

/// What the journal holds as an event is handled; the agent reads it
/// before each call (the journal is the session's durable memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Facts {
    /// The highest session generation journalled (0: none).
    pub highest_gen: u64,
    /// The last feedback seq the journal handed out (0: none yet).
    pub last_seq: u64,
    /// The outbox's first unacknowledged seq (`None`: empty).
    pub outbox_front: Option<u64>,
}

/// The clock's source and state, as last reported.
pub type ClockKind = (SourceKind, ClockState);

/// A controller's order to the box.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// A pack pushed (to run now, or staged for an instant).
    Push,
    /// A pack cancelled.
    Cancel,
}

/// An event of the link, as the session sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    /// A new transport `session`: nothing of it is acted on before its
    /// Welcome.
    Connected {
        /// The link's session number (rises with every connect).
        session: u64,
    },
    /// The controller accepted the Hello.
    Welcome {
        /// Its session.
        session: u64,
        /// The controller has the outbox up to this seq.
        acked_seq: u64,
        /// The session generation it made this stream at.
        generation: u64,
    },
    /// The controller stored feedback up to `seq`.
    FeedbackAck {
        /// Its session.
        session: u64,
        /// Acknowledged through.
        seq: u64,
    },
    /// A ping: contact, nothing else.
    Alive {
        /// Its session.
        session: u64,
    },
    /// The transport ended.
    Disconnected {
        /// The session that ended.
        session: u64,
    },
    /// The journal holds the generation a Welcome raised (after
    /// [`Cmd::JournalGeneration`] was carried out).
    Journalled {
        /// The session whose Welcome raised it.
        session: u64,
        /// The generation.
        generation: u64,
    },
    /// A push or cancel, before anything of it is looked at.
    Order {
        /// Its session.
        session: u64,
        /// The generation it was sent on.
        generation: u64,
        /// What it asks.
        order: Order,
    },
}

/// What the agent carries out, in order (see the module docs for what a
/// failing command means).
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub enum Cmd {
    /// Messages waiting for the link for any other session than `keep`
    /// (`None`: all) are moot: drop them.
    Discard {
        /// The session whose messages stay.
        keep: Option<u64>,
    },
    /// Send Hello on `session`: where things stand (the journal, the held
    /// packs).
    Hello {
        /// Where.
        session: u64,
    },
    /// Journal `generation` durably, then say [`Input::Journalled`]: the
    /// session is accepted only then.
    JournalGeneration {
        /// The session that raised it.
        session: u64,
        /// The new highest generation.
        generation: u64,
    },
    /// Tell the session's controller why it is refused (the link then
    /// drops the session and reconnects with its backoff).
    Refuse {
        /// Where.
        session: u64,
        /// Why.
        stale: Stale,
    },
    /// The controller has feedback through `seq`: it leaves the journal.
    AckFeedback {
        /// Acknowledged through (never beyond what the journal wrote).
        seq: u64,
        /// What the controller claimed, when that was beyond the journal's
        /// last seq (said in the log).
        claimed: Option<u64>,
    },
    /// Send a clock report on `session`.
    ClockReport {
        /// Where.
        session: u64,
    },
    /// Act on the order (contact was taken).
    Act {
        /// The order.
        order: Order,
        /// Where its answer goes: its session if it is still the current
        /// one (`None`: nothing goes out).
        reply_on: Option<u64>,
    },
    /// A stale order: nothing of it is acted on, not contact; a push is
    /// nacked `STALE` on `reply_on`.
    RefuseOrder {
        /// The order.
        order: Order,
        /// Why.
        stale: Stale,
        /// Where a nack goes (`None`: its session is gone).
        reply_on: Option<u64>,
    },
    /// An ack of a session not accepted: nothing leaves the journal (said
    /// in the log).
    IgnoreAck {
        /// Its session.
        session: u64,
        /// What it acknowledged.
        seq: u64,
    },
    /// The current session ended (said in the log).
    Ended {
        /// The session.
        session: u64,
    },
}

/// Refusals of stale controllers, for `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StaleCounts {
    /// Welcomes refused (their sessions dropped).
    pub welcomes: u64,
    /// Pushes nacked `STALE`.
    pub pushes: u64,
    /// Cancels not acted on.
    pub cancels: u64,
}

/// The controller session's state on the agent (see the module docs).
#[derive(Debug)]
pub struct Session {
    /// The transport Hello was sent on, while it lasts.
    current: Option<u64>,
    /// The current session was welcomed and accepted: feedback and clock
    /// reports flow.
    welcomed: bool,
    window: SendWindow,
    lease: LeaseClock,
    fence: Fence,
    next_clock_report: MonoTime,
    /// Source and state of the last clock report.
    last_clock: Option<ClockKind>,
    stale: StaleCounts,
    /// A Welcome waiting for its generation to be journalled: its
    /// session, acknowledged seq and generation.
    raising: Option<(u64, u64, u64)>,
}

impl Session {
    /// No session yet; the agent's start at `now` counts as contact (see
    /// [`lease`]).
    pub fn new(now: MonoTime) -> Self {
        Session {
            current: None,
            welcomed: false,
            window: SendWindow::default(),
            lease: LeaseClock::new(now),
            fence: Fence::default(),
            next_clock_report: now,
            last_clock: None,
            stale: StaleCounts::default(),
            raising: None,
        }
    }

    /// One event: the session's new state, and what to carry out.
    pub fn handle(&mut self, now: MonoTime, input: Input, facts: Facts) -> Vec<Cmd> {
        match input {
            Input::Connected { session } => {
                self.raising = None;
                self.current = Some(session);
                self.welcomed = false;
                self.fence.connected(session);
                self.window.close();
                // Whatever waited for an earlier session is moot: Hello
                // says where things stand.
                vec![
                    Cmd::Discard {
                        keep: Some(session),
                    },
                    Cmd::Hello { session },
                ]
            }
            Input::Welcome {
                session,
                acked_seq,
                generation,
            } => self.on_welcome(now, session, acked_seq, generation, facts),
            Input::FeedbackAck { session, seq } => {
                // A refused (or not yet welcomed) controller's store is
                // not where feedback must land: its acks drop nothing.
                if !self.fence.accepted(session) {
                    return vec![Cmd::IgnoreAck { session, seq }];
                }
                self.lease.contact(now);
                let (seq, claimed) = known_seq(seq, facts.last_seq);
                if self.current == Some(session) {
                    self.window.acked(seq);
                }
                vec![Cmd::AckFeedback { seq, claimed }]
            }
            Input::Alive { session } => {
                if self.fence.accepted(session) {
                    self.lease.contact(now);
                }
                Vec::new()
            }
            Input::Disconnected { session } => {
                self.fence.ended(session);
                if self.raising.is_some_and(|(s, _, _)| s == session) {
                    self.raising = None;
                }
                if self.current != Some(session) {
                    return Vec::new();
                }
                self.current = None;
                self.welcomed = false;
                self.window.close();
                vec![Cmd::Discard { keep: None }, Cmd::Ended { session }]
            }
            Input::Journalled {
                session,
                generation,
            } => match self.raising {
                Some((s, acked_seq, g))
                    if s == session
                        && g == generation
                        && self.fence.journalled(session, generation) =>
                {
                    self.raising = None;
                    self.welcomed_now(now, session, acked_seq, facts)
                }
                _ => Vec::new(),
            },
            Input::Order {
                session,
                generation,
                order,
            } => {
                let reply_on = self.current.filter(|c| *c == session);
                match self.fence.check(session, generation, facts.highest_gen) {
                    Ok(()) => {
                        self.lease.contact(now);
                        vec![Cmd::Act { order, reply_on }]
                    }
                    Err(stale) => {
                        // Not contact, not parsed, nothing journalled.
                        match order {
                            Order::Push => self.stale.pushes += 1,
                            Order::Cancel => self.stale.cancels += 1,
                        }
                        vec![Cmd::RefuseOrder {
                            order,
                            stale,
                            reply_on,
                        }]
                    }
                }
            }
        }
    }

    fn on_welcome(
        &mut self,
        now: MonoTime,
        session: u64,
        acked_seq: u64,
        generation: u64,
        facts: Facts,
    ) -> Vec<Cmd> {
        if self.current != Some(session) {
            return Vec::new();
        }
        match self.fence.welcome(session, generation, facts.highest_gen) {
            Welcomed::Refused(stale) => {
                // Not contact: a stale controller cannot cancel anything
                // either, so leases keep running. A second Welcome of a
                // session once accepted closes what the first opened
                // (nothing more goes to a store it refuses).
                self.welcomed = false;
                self.window.close();
                self.raising = None;
                self.stale.welcomes += 1;
                return vec![Cmd::Refuse { session, stale }];
            }
            Welcomed::Accepted { raised: true, .. } => {
                // Accepted once the journal holds it (`Journalled`);
                // until then nothing flows (a second Welcome of a session
                // closes what the first opened).
                self.welcomed = false;
                self.window.close();
                self.raising = Some((session, acked_seq, generation));
                return vec![Cmd::JournalGeneration {
                    session,
                    generation,
                }];
            }
            Welcomed::Accepted { .. } => {}
        }
        self.raising = None;
        self.welcomed_now(now, session, acked_seq, facts)
    }

    /// The session is accepted: contact, the outbox acknowledged, the
    /// window open at its front, a clock report.
    fn welcomed_now(
        &mut self,
        now: MonoTime,
        session: u64,
        acked_seq: u64,
        facts: Facts,
    ) -> Vec<Cmd> {
        let mut out = Vec::with_capacity(2);
        self.lease.contact(now);
        let (acked, claimed) = known_seq(acked_seq, facts.last_seq);
        out.push(Cmd::AckFeedback {
            seq: acked,
            claimed,
        });
        // The outbox front once the ack has taken what it covers (an
        // empty outbox: the next seq the journal hands out, whatever
        // lower seq the controller says it has).
        let front = facts
            .outbox_front
            .unwrap_or(facts.last_seq.saturating_add(1))
            .max(acked.saturating_add(1));
        self.window.open(front, acked);
        self.welcomed = true;
        out.push(Cmd::ClockReport { session });
        self.next_clock_report = now + CLOCK_REPORT_EVERY;
        out
    }

    /// A clock report is due: every [`CLOCK_REPORT_EVERY`], and at once
    /// when the clock's source or state (`clock`) changed; only on a
    /// welcomed session.
    pub fn clock_report_due(&mut self, now: MonoTime, clock: Option<ClockKind>) -> Option<Cmd> {
        let session = self.current.filter(|_| self.welcomed)?;
        if now < self.next_clock_report && clock == self.last_clock {
            return None;
        }
        self.last_clock = clock;
        self.next_clock_report = now + CLOCK_REPORT_EVERY;
        Some(Cmd::ClockReport { session })
    }

    /// The next feedback page to read from the journal, `(from, count)`,
    /// as the window allows: none without a welcomed session.
    pub fn next_page(&self, outbox_front: Option<u64>) -> Option<(u64, u64)> {
        self.window.next_page(outbox_front)
    }

    /// Entries through `last` were handed to the link.
    pub fn sent_through(&mut self, last: u64) {
        self.window.sent_through(last);
    }

    /// The session messages go out on (Hello sent, not yet ended).
    pub fn current(&self) -> Option<u64> {
        self.current
    }

    /// The current session was welcomed and accepted.
    pub fn welcomed(&self) -> bool {
        self.welcomed
    }

    /// Refusals of stale controllers so far.
    pub fn stale(&self) -> StaleCounts {
        self.stale
    }

    /// When `p`'s lease runs out, if no contact comes first.
    pub fn lease_expiry(&self, p: &Leased) -> MonoTime {
        self.lease.expiry(p)
    }

    /// Whether `p`'s lease has run out at `now`.
    pub fn lease_expired(&self, p: &Leased, now: MonoTime) -> bool {
        self.lease.expired(p, now)
    }

    /// The next instant the session has timed work (a clock report).
    pub fn next_wake(&self) -> Option<MonoTime> {
        self.welcomed.then_some(self.next_clock_report)
    }
}

/// An acknowledged seq, at most the last the journal handed out, and what
/// was claimed when it was more.
fn known_seq(seq: u64, last: u64) -> (u64, Option<u64>) {
    if seq > last {
        (last, Some(seq))
    } else {
        (seq, None)
    }
}
