//! One agent's link session as a value: the protocol's rules (hello,
//! acks and refusals, held sets, the feedback window, retries, resync,
//! the tenant filter, gap accounting, pings and the dead-peer rule) with
//! no IO in it. It takes `(now, input)` and returns [`Action`]s, as
//! statime's ports and ntp-proto's sources do; a shell (the gRPC adapter)
//! performs them: it converts the wire to [`FromAgent`] and [`ToAgent`]
//! back, runs each [`Effect`] through the application ([`App::perform`])
//! and hands its answer back as [`Input::Done`] before anything else, and
//! applies each [`Note`] ([`App::note`]).
//!
//! What the session keeps is the agent's stream state: the rows the store
//! last decided for it (what it should hold is decided by the store's
//! planner, never here: the session sends what [`baton_model::planner::action`] asks of
//! each row), the pushes in flight, the highest feedback seq stored.
//!
//! **Feedback is acknowledged only once stored**: the ack for a batch is
//! an action that follows the answer of the effect that stored it, with
//! the highest seq of the batch, so an agent's outbox never loses an entry
//! the controller does not have. A batch re-sent after a lost ack is
//! stored once (the store is idempotent on agent, journal and seq).
//!
//! While an effect is out the session takes no other input (the shell
//! waits for it): the order of store writes is the order of the agent's
//! messages, as on the stream.

mod feedback;
mod perform;
mod pushes;
mod releases;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_proto::wire;

#[cfg(doc)]
use super::App;
use super::events::{AgentEvent, AgentEventKind, Event};
use super::hub::SessionCmd;
use super::metrics::{AgentClock, PushResult};
use super::pace::{Pace, TokenBucket};
use crate::texts::PackText;
use baton_model::{
    AgentRow, Binding, ClockRow, DeliveryRow, ErrorRow, FeedbackRow, FeedbackStored, HeldPackRow,
    PackKey, RefTime, ReleaseRow, SignedDuration, SpanNanos, TrustRow, UpdateRow,
};
use baton_store::{AnswerRow, HelloRow};

pub use perform::Closing;
use pushes::{InFlight, Work};
pub use pushes::{RETRY_FIRST, RETRY_MAX, UNANSWERED};

/// How often the agent's rows are read again on a live stream (catches a
/// command lost to a full queue, and re-sends pushes never answered).
pub const RESYNC: Duration = Duration::from_secs(30);
/// How often last-seen is written to the store while connected.
pub const SEEN_EVERY: Duration = Duration::from_secs(10);

/// Time requests an agent's stream may have answered: its exchange asks at
/// most 4 a second, in a burst of six, then one every 4 s; twice that.
pub const TIME_REQUESTS: Pace = Pace {
    rate: 8.0,
    burst: 16.0,
};

/// Reports of its trust an agent's stream may have stored: it sends one
/// with its hello and one on each change (a list relayed, one expired).
pub const TRUST_REPORTS: Pace = Pace {
    rate: 0.2,
    burst: 4.0,
};

/// Release pieces an agent's stream answers: its download asks a window
/// of four pieces at a time at a few hundred KiB/s by default (four
/// pieces a second); sixty-four a second (4 MiB/s) at most, what the
/// store reads for one box. Requests past the pace wait their turn
/// ([`RELEASE_QUEUE`]), they are not dropped: an agent that asks faster
/// (a site that raised its `download-rate`) is slowed, not stalled.
pub const RELEASE_REQUESTS: Pace = Pace {
    rate: 64.0,
    burst: 16.0,
};

/// Release requests waiting for their turn at most: an agent's fetch has
/// four in flight; past this many (an agent not following the protocol)
/// they are dropped and counted.
pub const RELEASE_QUEUE: usize = 16;

/// Update reports an agent's stream may have stored: one per step of an
/// update (downloading is said every few pieces).
pub const UPDATE_REPORTS: Pace = Pace {
    rate: 2.0,
    burst: 8.0,
};

/// Clock reports an agent's stream may have stored: it sends one on each
/// welcome and one every 5 s.
pub const CLOCK_REPORTS: Pace = Pace {
    rate: 0.5,
    burst: 4.0,
};

/// The two clocks a session reads, passed in with every input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Now {
    /// Monotonic: deadlines (pings, retries, the dead-peer rule).
    pub mono: Instant,
    /// Reference time: what is stamped on records and sent.
    pub wall: RefTime,
}

/// The session's settings.
#[derive(Clone, Debug)]
pub struct LinkConfig {
    /// How often the agent is pinged; three silent intervals end the
    /// stream.
    pub ping_interval: Duration,
    /// Whether agents belong to tenants.
    pub binding: Binding,
    /// The fleet's root-signed trust lists (a JSON chain), relayed to
    /// every agent after its Welcome (`serve --trust-chain`); the
    /// controller cannot sign or verify them, the agents' roots do.
    pub trust_chain: Option<Arc<str>>,
}

/// What a session is told.
#[derive(Debug)]
pub enum Input {
    /// A message of the agent (already checked and converted).
    Agent(FromAgent),
    /// A command of the rest of the controller (see [`SessionCmd`]).
    Hub(SessionCmd),
    /// Time passed (at or after [`Session::next_wake`]).
    Tick,
    /// The answer of the [`Effect`] the session asked for last.
    Done(Done),
}

/// A message of the agent, as the session needs it.
#[derive(Debug)]
pub enum FromAgent {
    /// It took (or staged) a version.
    Ack {
        /// The pack.
        key: PackKey,
        /// The version it answers about.
        version: u64,
        /// Staged to switch at this instant (`None`: running it).
        staged: Option<RefTime>,
        /// It held that version already with the same text.
        unchanged: bool,
    },
    /// It refused a version.
    Nack {
        /// The pack.
        key: PackKey,
        /// The version refused.
        version: u64,
        /// Why, in the protocol's words.
        reason: wire::NackReason,
        /// Why, in the agent's words.
        message: String,
        /// Where in the pack.
        errors: Vec<ErrorRow>,
    },
    /// A batch of its outbox, in seq order.
    Feedback(Vec<FeedbackRow>),
    /// A clock report, with its outbox backlog.
    Clock {
        /// The report.
        row: ClockRow,
        /// Entries in its outbox.
        outbox: Option<u64>,
    },
    /// What it holds now.
    Held(Vec<HeldPackRow>),
    /// What it checks packs against, changed since its hello.
    Trust(TrustRow),
    /// It asks for bytes of an offered release's binary.
    ReleaseRequest {
        /// The release's version.
        version: String,
        /// From.
        offset: u64,
        /// At most this many.
        length: u32,
    },
    /// Where an offered update stands on it.
    Update(UpdateRow),
    /// A time request (its `t1`).
    TimeRequest {
        /// The request's id.
        id: u64,
        /// When it left the agent (its clock).
        t1_ns: i64,
    },
    /// Anything else (a pong, a time exchange reply): only heard.
    Heard,
}

/// The answer of an effect.
#[derive(Debug)]
pub enum Done {
    /// [`Effect::Known`]: the agent's stored record and rows.
    Known {
        /// Its record (`None`: new).
        agent: Option<Box<AgentRow>>,
        /// Its delivery rows.
        rows: Vec<DeliveryRow>,
    },
    /// [`Effect::Hello`]: the agent as stored now, all its rows, and the
    /// highest feedback seq stored of its journal.
    Hello {
        /// The agent, with its new session generation.
        agent: Box<AgentRow>,
        /// All its delivery rows.
        rows: Vec<DeliveryRow>,
        /// Highest feedback seq stored.
        acked: u64,
    },
    /// A write that answers nothing.
    Written,
    /// Rows that changed ([`Effect::Held`]), or all rows ([`Effect::Rows`]).
    Rows(Vec<DeliveryRow>),
    /// [`Effect::Answer`]: the row as it is now.
    Answer(Option<DeliveryRow>),
    /// [`Effect::Feedback`].
    Feedback(FeedbackStored),
    /// [`Effect::Agent`].
    Agent(Option<Box<AgentRow>>),
    /// [`Effect::Pack`].
    Pack(Option<Arc<PackText>>),
    /// [`Effect::Offer`].
    Offer(Option<Arc<ReleaseRow>>),
    /// [`Effect::Piece`].
    Piece(Option<Vec<u8>>),
}

/// What a session asks the controller to do.
#[derive(Debug, PartialEq)]
pub enum Action {
    /// Send this to the agent.
    Send(ToAgent),
    /// Perform this and answer with [`Input::Done`] before anything else.
    Effect(Effect),
    /// Apply this (counters, watchers); nothing answers it.
    Note(Note),
    /// End the stream.
    End(End),
}

/// A message for the agent.
#[derive(Clone, Debug, PartialEq)]
pub enum ToAgent {
    /// The fleet's trust lists (after the Welcome).
    TrustLists(Arc<str>),
    /// The answer to its hello.
    Welcome {
        /// Its id.
        agent_id: String,
        /// Highest feedback seq stored.
        feedback_acked_seq: u64,
        /// How often it is pinged.
        ping_interval: Duration,
        /// The stream's session generation.
        session_gen: u64,
    },
    /// A version to take: to run (`staged` false), to stage, or to stage
    /// and switch to at `activate_at`. Paced: the shell waits for the
    /// controller-wide push token before sending it.
    Push {
        /// The pack version.
        pack: Arc<PackText>,
        /// The stream's generation.
        session_gen: u64,
        /// Staged rather than run.
        staged: bool,
        /// The instant to switch at.
        activate_at: Option<RefTime>,
        /// The rollout's clock bound, checked again by the agent at the
        /// switch (zero: none).
        max_uncertainty: SignedDuration,
    },
    /// Stop a pack (its safe state).
    Cancel {
        /// The pack.
        key: PackKey,
        /// The version to stop.
        version: u64,
        /// The stream's generation.
        session_gen: u64,
    },
    /// Feedback stored up to this seq.
    FeedbackAck(u64),
    /// The answer to a time request; `t3` is stamped as it leaves.
    TimeReply {
        /// The request's id.
        id: u64,
        /// Its t1.
        t1_ns: i64,
        /// When it was seen.
        t2: RefTime,
    },
    /// Are you there.
    Ping(u64),
    /// A release offered: its signed manifest, relayed as signed.
    ReleaseOffer(Arc<ReleaseRow>),
    /// A release no longer offered: the box stops its download, and
    /// undoes an install of it not yet run.
    ReleaseWithdraw(String),
    /// Bytes of the offered release's binary, as asked.
    ReleaseChunk {
        /// The release's version.
        version: String,
        /// Where they start.
        offset: u64,
        /// The bytes.
        data: Vec<u8>,
    },
}

/// A store operation the session needs, performed for its agent through
/// the application ([`App::perform`]).
#[derive(Debug, PartialEq)]
pub enum Effect {
    /// Read the agent's record and rows (before its hello is stored: its
    /// tenants and rows decide which held entries are its own).
    Known,
    /// Store the hello: the store plans every pack for the agent.
    Hello(HelloRow),
    /// Mark the agent seen (connected), with its recent lateness p99.
    Seen {
        /// The stream's generation.
        session: u64,
        /// When.
        at: RefTime,
    },
    /// Store a clock report.
    Clock {
        /// The stream's generation.
        session: u64,
        /// The report.
        row: ClockRow,
    },
    /// Store what the agent checks packs against.
    Trust {
        /// The stream's generation.
        session: u64,
        /// As it says.
        row: TrustRow,
    },
    /// Store what the agent holds (re-planned by the store).
    Held {
        /// The stream's generation.
        session: u64,
        /// Its own entries.
        held: Vec<HeldPackRow>,
        /// When.
        at: RefTime,
    },
    /// Store an answer to a push.
    Answer(AnswerRow),
    /// Store feedback (watchers are shown `rows` once stored when
    /// `publish`).
    Feedback {
        /// The stream's generation.
        session: u64,
        /// The entries.
        rows: Vec<FeedbackRow>,
        /// New entries (shown to watchers and counted) rather than
        /// re-sent ones carrying a count of drops.
        publish: bool,
    },
    /// Read every row of the agent.
    Rows,
    /// Read the agent's record (its tenants changed).
    Agent,
    /// Read a pack version's text.
    Pack {
        /// The pack.
        key: PackKey,
        /// The version.
        version: u64,
    },
    /// Read the release the agent is to be offered.
    Offer,
    /// Read a piece of a release's binary.
    Piece {
        /// The release's version.
        version: String,
        /// Its architecture.
        arch: String,
        /// The piece.
        index: u64,
    },
    /// Store what the agent says of an update.
    Update {
        /// The stream's generation.
        session: u64,
        /// As it says.
        row: UpdateRow,
    },
}

/// Something to count or show; nothing answers it.
#[derive(Debug, PartialEq)]
pub enum Note {
    /// For watchers.
    Event(Event),
    /// A delivery row changed (counted and shown).
    RowChanged(DeliveryRow),
    /// A push went out.
    PushSent,
    /// An agent answered a push.
    PushResult(PushResult),
    /// Entries for what is not the agent's, dropped.
    Foreign(u64),
    /// Entries the agent dropped (its outbox full).
    DroppedAtAgent(u64),
    /// Entries a store rolled back lost.
    FeedbackLost(u64),
    /// Feedback stored: new rows, duplicates.
    FeedbackStored(FeedbackStored),
    /// Start lateness of executed entries, ns.
    Lateness(Vec<i64>),
    /// The agent's clock, for `/metrics`.
    Clock(AgentClock),
    /// The agent reported a firing skipped as later than its bound.
    Late,
    /// The agent's outbox backlog, as its report said.
    Outbox {
        /// Entries.
        entries: u64,
        /// When.
        at: RefTime,
    },
}

/// Why the session ended the stream.
#[derive(Clone, Debug, PartialEq)]
pub enum End {
    /// The agent sent something invalid.
    Bad(String),
    /// Silent for too long.
    Dead(Duration),
    /// A newer stream for the same agent.
    Replaced,
    /// An admin forgot the agent.
    Forgotten,
    /// The store failed: the agent will re-send.
    Unavailable(String),
    /// Another machine's stream holds the id.
    Duplicate(String),
    /// A later stream of the agent (on this replica or another) owns it
    /// now: this one may write nothing more for it.
    Fenced(String),
}

impl std::fmt::Display for End {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            End::Bad(m) => write!(f, "invalid message: {m}"),
            End::Dead(d) => write!(f, "silent for {d:?}"),
            End::Replaced => f.write_str("replaced by a newer stream"),
            End::Forgotten => f.write_str("forgotten by an admin"),
            End::Unavailable(e) => write!(f, "store: {e}"),
            End::Duplicate(m) => write!(f, "refused: {m}"),
            End::Fenced(m) => write!(f, "fenced: {m}"),
        }
    }
}

/// What the answer of the effect out continues.
#[derive(Debug)]
enum Wait {
    Known(Box<HelloRow>),
    Hello,
    Answered {
        key: PackKey,
        clear: bool,
    },
    Clock(ClockRow),
    Rows,
    Resync,
    Agent,
    Feedback(feedback::Pending),
    Text(Work),
    Written,
    Offer,
    Piece {
        version: String,
        offset: u64,
        length: u32,
    },
}

/// A per-stream rate limit on one kind of message: past it the message is
/// dropped (a time request goes unanswered, and the agent's exchange asks
/// again later; a clock report is not stored), and the first drop is
/// logged.
#[derive(Debug)]
struct Limited {
    what: &'static str,
    bucket: TokenBucket,
    dropped: u64,
}

/// One agent's link session.
#[derive(Debug)]
pub struct Session {
    cfg: LinkConfig,
    agent: AgentRow,
    /// Certificate tenants (kept over regrants).
    cert_tenants: Option<Vec<String>>,
    /// The tenants as events carry them.
    tenants: Arc<BTreeSet<String>>,
    /// The agent's delivery rows, by pack, as the store last said.
    rows: BTreeMap<PackKey, DeliveryRow>,
    /// The pack texts pushed to it recently (a push command carries one).
    texts: HashMap<PackKey, Arc<PackText>>,
    in_flight: HashMap<PackKey, InFlight>,
    /// Highest feedback seq stored of this stream's journal.
    last_seq: u64,
    /// Highest seq the store had acknowledged at hello, and the first seq
    /// the agent then held: entries between them were dropped by the
    /// agent (its first entry's `dropped_before` says how many) or lost.
    gap: Option<(u64, u64)>,
    /// The first seq the agent's outbox held at hello.
    first_held_seq: u64,
    last_heard: Instant,
    next_ping_id: u64,
    next_ping: Instant,
    next_seen: Instant,
    next_resync: Instant,
    time_requests: Limited,
    clock_reports: Limited,
    trust_reports: Limited,
    /// The agent's latest trust report past the rate, stored when the rate
    /// allows (the agent says a change once: a report dropped for good
    /// would leave its trust shown stale).
    trust_held_back: Option<TrustRow>,
    release_requests: Limited,
    update_reports: Limited,
    /// The release offered on this stream (pieces of it only are
    /// served).
    offered: Option<Arc<ReleaseRow>>,
    /// The agent's latest update report past the rate, stored when the
    /// rate allows.
    update_held_back: Option<UpdateRow>,
    /// The version withdrawn on this stream (said once).
    withdrawn: Option<String>,
    /// Release requests waiting for the pace: (version, offset, length).
    release_queue: VecDeque<(String, u64, u32)>,
    /// When the next waiting request may be served.
    release_due: Option<Instant>,
    /// Entries dropped for naming what is not the agent's.
    foreign: u64,
    /// Whether the hello is stored (the stream is live).
    live: bool,
    /// The effect out, and what its answer continues.
    wait: Option<Wait>,
    /// Work left behind the effect out.
    work: VecDeque<Work>,
    out: Vec<Action>,
}

impl Session {
    /// A session for the hello `hello` (checked; its held entries not yet
    /// filtered) of a stream whose certificate names `cert_tenants`; the
    /// agent's outbox held `first_held_seq` first. Returns the session and
    /// its first actions (reading what is known of the agent).
    pub fn start(
        now: Now,
        cfg: LinkConfig,
        mut hello: HelloRow,
        cert_tenants: Option<Vec<String>>,
        first_held_seq: u64,
    ) -> (Session, Vec<Action>) {
        hello.cert_tenants = cert_tenants.clone();
        let ping_interval = cfg.ping_interval;
        let mut s = Session {
            cfg,
            agent: AgentRow::new(&hello.id, &hello.journal_id),
            cert_tenants,
            tenants: Arc::default(),
            rows: BTreeMap::new(),
            texts: HashMap::new(),
            in_flight: HashMap::new(),
            last_seq: 0,
            gap: None,
            first_held_seq,
            last_heard: now.mono,
            next_ping_id: 1,
            next_ping: now.mono + ping_interval,
            next_seen: now.mono + SEEN_EVERY,
            next_resync: now.mono + RESYNC,
            time_requests: Limited::new("time requests", TIME_REQUESTS, now.mono),
            clock_reports: Limited::new("clock reports", CLOCK_REPORTS, now.mono),
            trust_reports: Limited::new("trust reports", TRUST_REPORTS, now.mono),
            trust_held_back: None,
            release_requests: Limited::new("release requests", RELEASE_REQUESTS, now.mono),
            update_reports: Limited::new("update reports", UPDATE_REPORTS, now.mono),
            offered: None,
            update_held_back: None,
            withdrawn: None,
            release_queue: VecDeque::new(),
            release_due: None,
            foreign: 0,
            live: false,
            wait: None,
            work: VecDeque::new(),
            out: Vec::new(),
        };
        s.effect(Effect::Known, Wait::Known(Box::new(hello)));
        let first = s.take();
        (s, first)
    }

    /// The agent as the store last said (its generation once the hello
    /// is stored).
    pub fn agent(&self) -> &AgentRow {
        &self.agent
    }

    /// The tenants the agent serves, as events carry them.
    pub fn tenants(&self) -> &Arc<BTreeSet<String>> {
        &self.tenants
    }

    /// Whether the hello is stored and the agent welcomed.
    pub fn is_live(&self) -> bool {
        self.live
    }

    /// Whether an effect is out (the shell must answer it first).
    pub fn is_waiting(&self) -> bool {
        self.wait.is_some()
    }

    /// Entries dropped on this stream for naming what is not the agent's,
    /// and the messages dropped over each rate limit.
    pub fn dropped(&self) -> [(&'static str, u64); 6] {
        [
            ("entries for packs not the agent's", self.foreign),
            (self.time_requests.what, self.time_requests.dropped),
            (self.clock_reports.what, self.clock_reports.dropped),
            (self.trust_reports.what, self.trust_reports.dropped),
            (self.release_requests.what, self.release_requests.dropped),
            (self.update_reports.what, self.update_reports.dropped),
        ]
    }

    /// When the session next needs a [`Input::Tick`].
    pub fn next_wake(&self) -> Instant {
        let dead = self.last_heard + self.cfg.ping_interval * 3;
        let retry = self.in_flight.values().filter_map(|f| f.retry_at).min();
        [self.next_ping, self.next_seen, self.next_resync, dead]
            .into_iter()
            .chain(retry)
            .chain(self.release_due)
            .min()
            .unwrap_or(dead)
    }

    /// Take `input` at `now`; the actions it leads to, in order.
    pub fn handle(&mut self, now: Now, input: Input) -> Vec<Action> {
        match input {
            Input::Done(d) => self.done(now, d),
            other if self.wait.is_some() => {
                // The shell answers every effect before anything else; a
                // second input would reorder the store's writes.
                debug_assert!(false, "input while an effect is out: {other:?}");
                tracing::error!(agent = %self.agent.id, "link session: input while an effect is out (dropped)");
            }
            Input::Agent(m) => {
                self.last_heard = now.mono;
                self.on_agent(now, m);
            }
            Input::Hub(c) => self.on_command(c),
            Input::Tick => self.tick(now),
        }
        self.drive(now);
        self.take()
    }

    fn take(&mut self) -> Vec<Action> {
        std::mem::take(&mut self.out)
    }

    fn send(&mut self, m: ToAgent) {
        self.out.push(Action::Send(m));
    }

    fn note(&mut self, n: Note) {
        self.out.push(Action::Note(n));
    }

    fn end(&mut self, e: End) {
        self.work.clear();
        self.out.push(Action::End(e));
    }

    fn effect(&mut self, e: Effect, then: Wait) {
        debug_assert!(self.wait.is_none(), "two effects out");
        self.wait = Some(then);
        self.out.push(Action::Effect(e));
    }

    fn ended(&self) -> bool {
        self.out.iter().any(|a| matches!(a, Action::End(_)))
    }

    fn agent_event(
        &mut self,
        now: Now,
        kind: AgentEventKind,
        clock: Option<ClockRow>,
        detail: String,
    ) {
        let e = Event::Agent(AgentEvent {
            agent_id: self.agent.id.clone(),
            tenants: self.tenants.clone(),
            kind,
            clock,
            detail,
            at: now.wall,
        });
        self.note(Note::Event(e));
    }

    fn set_agent(&mut self, a: AgentRow) {
        self.tenants = Arc::new(a.tenants.clone());
        self.agent = a;
    }

    fn on_agent(&mut self, now: Now, m: FromAgent) {
        match m {
            FromAgent::Ack {
                key,
                version,
                staged,
                unchanged,
            } => self.on_ack(now, key, version, staged, unchanged),
            FromAgent::Nack {
                key,
                version,
                reason,
                message,
                errors,
            } => self.on_nack(now, key, version, reason, message, errors),
            FromAgent::Feedback(rows) => self.on_feedback(now, rows),
            FromAgent::Clock { row, outbox } => self.on_clock(now, row, outbox),
            FromAgent::Held(held) => self.on_held(now, held),
            FromAgent::Trust(row) => self.on_trust(now, row),
            FromAgent::ReleaseRequest {
                version,
                offset,
                length,
            } => self.on_release_request(now, version, offset, length),
            FromAgent::Update(row) => self.on_update(now, row),
            FromAgent::TimeRequest { id, t1_ns } => {
                // t2 as soon as the request is seen; t3 as the reply
                // leaves (the shell stamps it).
                let agent = self.agent.id.clone();
                if self.time_requests.allow(&agent, now.mono) {
                    self.send(ToAgent::TimeReply {
                        id,
                        t1_ns,
                        t2: now.wall,
                    });
                }
            }
            FromAgent::Heard => {}
        }
    }

    fn on_command(&mut self, c: SessionCmd) {
        match c {
            SessionCmd::Rows { rows, pack } => {
                if let Some(p) = pack {
                    self.texts.insert(p.row.key(), p);
                }
                for r in rows {
                    let key = r.key();
                    self.rows.insert(key.clone(), r);
                    self.work.push_back(Work::Act(key));
                }
            }
            SessionCmd::TrustLists(chain) => {
                // Streams welcomed from now on get it after their Welcome;
                // this one at once if welcomed already (else at its
                // Welcome).
                self.cfg.trust_chain = Some(chain.clone());
                if self.live {
                    self.send(ToAgent::TrustLists(chain));
                }
            }
            SessionCmd::Replaced => self.end(End::Replaced),
            SessionCmd::Forgotten => self.end(End::Forgotten),
            SessionCmd::Regranted => {
                self.effect(Effect::Agent, Wait::Agent);
            }
            SessionCmd::Release => {
                if self.live {
                    self.work.push_back(Work::Offer);
                }
            }
        }
    }

    /// A clock report: metrics, the store and watchers, within its rate
    /// limit.
    fn on_clock(&mut self, now: Now, row: ClockRow, outbox: Option<u64>) {
        let agent = self.agent.id.clone();
        if !self.clock_reports.allow(&agent, now.mono) {
            return;
        }
        if let Some(n) = outbox {
            self.note(Note::Outbox {
                entries: n,
                at: row.at,
            });
        }
        self.note(Note::Clock(AgentClock {
            offset_ns: row.offset.nanos(),
            uncertainty_ns: row.uncertainty.nanos(),
            locked: row.state == "locked",
        }));
        let session = self.agent.session_gen;
        self.effect(
            Effect::Clock {
                session,
                row: row.clone(),
            },
            Wait::Clock(row),
        );
    }

    /// What the agent checks packs against now: stored, for every
    /// replica's pages (past the stream's rate, dropped and counted: an
    /// agent says it once per change).
    fn on_trust(&mut self, now: Now, row: TrustRow) {
        let agent = self.agent.id.clone();
        self.agent.trust = Some(row.clone());
        if !self.trust_reports.allow(&agent, now.mono) {
            self.trust_held_back = Some(row);
            return;
        }
        self.trust_held_back = None;
        self.store_trust(row);
    }

    fn store_trust(&mut self, row: TrustRow) {
        let session = self.agent.session_gen;
        self.effect(Effect::Trust { session, row }, Wait::Written);
    }

    /// What the agent holds now: the store re-plans its rows, and they
    /// are acted on.
    fn on_held(&mut self, now: Now, held: Vec<HeldPackRow>) {
        let held = self.own_held(held);
        let session = self.agent.session_gen;
        self.effect(
            Effect::Held {
                session,
                held,
                at: now.wall,
            },
            Wait::Rows,
        );
    }

    /// The agent's entries for tenants it serves, and for packs the
    /// controller has a row of on it (delivered before a grant was taken
    /// back: the controller must go on seeing it held, or it could never
    /// cancel it); the rest dropped and counted.
    fn own_held(&mut self, held: Vec<HeldPackRow>) -> Vec<HeldPackRow> {
        let before = held.len();
        let binding = self.cfg.binding;
        let (agent, rows) = (&self.agent, &self.rows);
        let kept: Vec<HeldPackRow> = held
            .into_iter()
            .filter(|h| {
                agent.serves(&h.tenant, binding)
                    || rows.contains_key(&PackKey::new(h.tenant.clone(), h.pack.clone()))
            })
            .collect();
        self.drop_foreign((before - kept.len()) as u64, "held");
        kept
    }

    fn drop_foreign(&mut self, n: u64, what: &str) {
        if n == 0 {
            return;
        }
        if self.foreign == 0 {
            tracing::warn!(
                agent = %self.agent.id,
                "agent sent {what} entries for packs of tenants it does not serve, or never delivered to it: dropped"
            );
        }
        self.foreign += n;
        self.note(Note::Foreign(n));
    }

    /// Pings, last-seen, retries and the resync, as they come due; the
    /// dead-peer rule first.
    fn tick(&mut self, now: Now) {
        if !self.live {
            return;
        }
        let silent = now.mono.saturating_duration_since(self.last_heard);
        if silent >= self.cfg.ping_interval * 3 {
            self.end(End::Dead(silent));
            return;
        }
        if now.mono >= self.next_ping {
            self.next_ping = now.mono + self.cfg.ping_interval;
            let id = self.next_ping_id;
            self.next_ping_id += 1;
            self.send(ToAgent::Ping(id));
        }
        if now.mono >= self.next_seen {
            self.next_seen = now.mono + SEEN_EVERY;
            self.work.push_back(Work::Seen);
            if self.trust_held_back.is_some() && self.trust_reports.bucket.take(now.mono).is_ok() {
                self.work.push_back(Work::Trust);
            }
            if self.update_held_back.is_some()
                && self.update_reports.bucket.take(now.mono).is_ok()
                && let Some(row) = self.update_held_back.take()
            {
                self.work.push_back(Work::Update(row));
            }
        }
        self.work.push_back(Work::RetriesDue);
        if self.release_due.is_some_and(|t| now.mono >= t) {
            self.release_due = None;
            self.work.push_back(Work::ReleaseDue);
        }
        if now.mono >= self.next_resync {
            self.next_resync = now.mono + RESYNC;
            self.work.push_back(Work::Resync);
            // An offer whose word from another replica was lost, or one
            // refused for now, is read again.
            self.work.push_back(Work::Offer);
        }
    }

    /// The answer of the effect out.
    fn done(&mut self, now: Now, d: Done) {
        let Some(wait) = self.wait.take() else {
            debug_assert!(false, "an answer with no effect out: {d:?}");
            tracing::error!(agent = %self.agent.id, "link session: an answer with no effect out (dropped)");
            return;
        };
        match (wait, d) {
            (Wait::Known(hello), Done::Known { agent, rows }) => self.known(*hello, agent, rows),
            (Wait::Hello, Done::Hello { agent, rows, acked }) => {
                self.welcome(now, agent, rows, acked)
            }
            (Wait::Answered { key, clear }, Done::Answer(row)) => {
                if let Some(r) = row {
                    let changed = self.rows.get(&key) != Some(&r);
                    self.rows.insert(key.clone(), r.clone());
                    if changed {
                        self.note(Note::RowChanged(r));
                    }
                }
                if clear {
                    self.in_flight.remove(&key);
                }
            }
            (Wait::Clock(row), Done::Written) => {
                self.agent_event(now, AgentEventKind::Clock, Some(row), String::new())
            }
            (Wait::Rows, Done::Rows(changed)) => {
                for r in changed {
                    let key = r.key();
                    self.note(Note::RowChanged(r.clone()));
                    self.rows.insert(key.clone(), r);
                    self.work.push_back(Work::Act(key));
                }
            }
            (Wait::Resync, Done::Rows(rows)) => {
                self.rows = rows.into_iter().map(|r| (r.key(), r)).collect();
                self.texts.clear();
                self.act_all();
            }
            (Wait::Agent, Done::Agent(a)) => {
                if let Some(a) = a {
                    self.set_agent(*a);
                }
            }
            (Wait::Feedback(p), Done::Feedback(stored)) => self.feedback_stored(p, stored),
            (Wait::Text(work), Done::Pack(text)) => self.text_read(now, work, text),
            (Wait::Written, Done::Written) => {}
            (Wait::Offer, Done::Offer(release)) => self.offer(release),
            (
                Wait::Piece {
                    version,
                    offset,
                    length,
                },
                Done::Piece(piece),
            ) => self.piece_read(version, offset, length, piece),
            (w, d) => {
                debug_assert!(false, "answer {d:?} does not fit {w:?}");
                tracing::error!(agent = %self.agent.id, "link session: an answer of the wrong kind (dropped)");
            }
        }
    }

    /// What is known of the agent before its hello is stored: its
    /// tenants (grants are stored; the certificate's come with this
    /// hello) and rows decide which of its held entries are its own.
    fn known(&mut self, mut hello: HelloRow, agent: Option<Box<AgentRow>>, rows: Vec<DeliveryRow>) {
        if let Some(a) = agent {
            self.agent.tenants = a.tenants;
        }
        if let Some(t) = &self.cert_tenants {
            self.agent.tenants.extend(t.iter().cloned());
        }
        self.rows = rows.into_iter().map(|r| (r.key(), r)).collect();
        hello.held = self.own_held(std::mem::take(&mut hello.held));
        self.effect(Effect::Hello(hello), Wait::Hello);
    }

    fn welcome(&mut self, now: Now, agent: Box<AgentRow>, rows: Vec<DeliveryRow>, acked: u64) {
        self.set_agent(*agent);
        self.rows = rows.into_iter().map(|r| (r.key(), r)).collect();
        self.last_seq = acked;
        if self.first_held_seq > acked + 1 {
            self.gap = Some((acked, self.first_held_seq));
        }
        self.live = true;
        tracing::info!(agent = %self.agent.id, rows = self.rows.len(), feedback_acked = acked, "agent connected");
        self.send(ToAgent::Welcome {
            agent_id: self.agent.id.clone(),
            feedback_acked_seq: acked,
            ping_interval: self.cfg.ping_interval,
            session_gen: self.agent.session_gen,
        });
        if let Some(chain) = &self.cfg.trust_chain {
            self.send(ToAgent::TrustLists(chain.clone()));
        }
        let detail = format!("agent {}", self.agent.agent_version);
        self.agent_event(now, AgentEventKind::Connected, None, detail);
        self.act_all();
        self.update_at_welcome(now);
    }

    /// Work queued behind effects, until it needs one or is done.
    fn drive(&mut self, now: Now) {
        while self.wait.is_none() && !self.ended() {
            let Some(w) = self.work.pop_front() else {
                return;
            };
            match w {
                Work::Seen => {
                    let session = self.agent.session_gen;
                    self.effect(
                        Effect::Seen {
                            session,
                            at: now.wall,
                        },
                        Wait::Written,
                    );
                }
                Work::Trust => {
                    if let Some(row) = self.trust_held_back.take() {
                        self.store_trust(row);
                    }
                }
                Work::Offer => self.effect(Effect::Offer, Wait::Offer),
                Work::ReleaseDue => self.release_due(now),
                Work::Update(row) => {
                    let session = self.agent.session_gen;
                    self.effect(Effect::Update { session, row }, Wait::Written);
                }
                Work::RetriesDue => self.retries_due(now),
                Work::Resync => self.effect(Effect::Rows, Wait::Resync),
                Work::Act(key) => self.act(now, &key),
                w @ Work::Push { .. } => self.push(now, w),
                Work::Ack(seq) => {
                    self.last_seq = self.last_seq.max(seq);
                    self.send(ToAgent::FeedbackAck(seq));
                }
            }
        }
    }
}

impl Limited {
    fn new(what: &'static str, pace: Pace, now: Instant) -> Limited {
        Limited {
            what,
            bucket: TokenBucket::new(pace, now),
            dropped: 0,
        }
    }

    /// Whether this message may be acted on.
    fn allow(&mut self, agent: &str, now: Instant) -> bool {
        if self.bucket.take(now).is_ok() {
            return true;
        }
        self.dropped += 1;
        if self.dropped == 1 {
            tracing::warn!(
                agent,
                "agent sends {} faster than an agent does: the excess is dropped",
                self.what
            );
        }
        false
    }
}
