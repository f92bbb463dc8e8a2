//! One agent's stream: hello, then pushes, acks, feedback and clock
//! reports until the stream ends. Every way out of [`run`] ends in the
//! same place: the agent is marked disconnected and unregistered.
//!
//! What the agent should hold is not decided here: the store decides it
//! (the planner, at hello, on every answer and held update, and on every
//! push, cancel or label change elsewhere) and hands this stream the
//! rows; the stream sends what [`planner::action`] asks for each row,
//! paced, with retries for refusals that are only for now.
//!
//! Feedback is acknowledged only once stored, with a cumulative ack (the
//! highest seq of the stored batch), so an agent's outbox never loses an
//! entry the controller does not have. A batch re-sent after a lost ack is
//! stored once (the store is idempotent on agent, journal and seq).
//! Feedback and held entries for what is not the agent's (another
//! tenant's pack, a pack never delivered to it) are dropped and counted.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use baton_proto::wire::{self, agent_message::Body as In, controller_message::Body as Out};
use tokio::sync::mpsc;
use tokio_stream::{Stream, StreamExt};
use tonic::Status;

use super::Shared;
use super::convert::{self, BadMessage};
use crate::app::events::{AgentEvent, AgentEventKind, Event};
use crate::app::hub::SessionCmd;
use crate::app::metrics::{AgentClock, PushResult};
use crate::app::pace::{Pace, TokenBucket};
use crate::app::{App, now_ns};
use crate::model::{
    AgentRow, Answer, Binding, DeliveryRow, HeldPackRow, PackKey, PackVersionRow, Refusal,
};
use crate::model::{RefTime, SpanNanos};
use crate::planner::{self, Action};
use crate::store::{AnswerRow, HelloRow, StoreError};

/// Outbound queue of one stream.
pub type Outbound = mpsc::Sender<Result<wire::ControllerMessage, Status>>;

/// How long a send to a slow agent may take before its stream is closed.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);
/// How often the agent's rows are read again on a live stream (catches a
/// command lost to a full queue, and re-sends pushes never answered).
const RESYNC: Duration = Duration::from_secs(30);
/// A push without an answer this long is sent again at the next resync.
const UNANSWERED: Duration = Duration::from_secs(60);
/// Retry of a push the agent refused for now (at capacity, clock, disk).
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(60);
/// How often last-seen is written to the store while connected.
const SEEN_EVERY: Duration = Duration::from_secs(10);

/// Why a stream ended (for the log and the agent).
enum End {
    /// The agent closed it.
    Closed,
    /// A transport error (reset, keep-alive timeout).
    Transport(Status),
    /// The agent sent something invalid.
    Bad(String),
    /// Silent for too long.
    Dead(Duration),
    /// A newer stream for the same agent.
    Replaced,
    /// The store failed: the agent will re-send.
    Store(StoreError),
    /// The controller is stopping.
    Shutdown,
    /// The agent stopped reading.
    Stuck,
    /// Not allowed (a Hello for another identity than the certificate's).
    Denied(String),
    /// The stream's certificate was revoked.
    Revoked(String),
    /// An admin forgot the agent.
    Forgotten,
    /// Another machine's stream holds the id.
    Duplicate(String),
    /// A later stream of the agent (on this replica or another) owns it
    /// now: this one may write nothing more for it.
    Fenced(String),
}

impl End {
    fn status(&self) -> Option<Status> {
        Some(match self {
            End::Closed => return None,
            // A message that could not be decoded (too large, garbage) is
            // the peer's to know about; on a dead connection this is moot.
            End::Transport(s) => s.clone(),
            End::Bad(m) => Status::invalid_argument(m.clone()),
            End::Dead(d) => Status::unavailable(format!("nothing received for {d:?}")),
            End::Replaced => Status::aborted("a newer stream for the same agent replaced this one"),
            End::Store(e) => Status::unavailable(format!("controller store: {e}")),
            End::Shutdown => Status::unavailable("controller shutting down"),
            End::Stuck => Status::unavailable("agent not reading its stream"),
            End::Denied(m) => Status::permission_denied(m.clone()),
            End::Revoked(serial) => {
                Status::permission_denied(format!("certificate {serial} is revoked"))
            }
            End::Forgotten => Status::aborted("an admin made the controller forget this agent"),
            End::Duplicate(m) => Status::already_exists(m.clone()),
            End::Fenced(m) => Status::aborted(m.clone()),
        })
    }

    fn describe(&self) -> String {
        match self {
            End::Closed => "closed by the agent".into(),
            End::Transport(s) => format!("transport: {}", s.message()),
            End::Bad(m) => format!("invalid message: {m}"),
            End::Dead(d) => format!("silent for {d:?}"),
            End::Replaced => "replaced by a newer stream".into(),
            End::Store(e) => format!("store: {e}"),
            End::Shutdown => "controller shutting down".into(),
            End::Stuck => "agent not reading".into(),
            End::Denied(m) => format!("refused: {m}"),
            End::Revoked(serial) => format!("certificate {serial} revoked"),
            End::Forgotten => "forgotten by an admin".into(),
            End::Duplicate(m) => format!("refused: {m}"),
            End::Fenced(m) => format!("fenced: {m}"),
        }
    }
}

impl From<BadMessage> for End {
    fn from(e: BadMessage) -> End {
        End::Bad(e.0)
    }
}

impl From<StoreError> for End {
    fn from(e: StoreError) -> End {
        match e {
            StoreError::Fenced { .. } => End::Fenced(e.to_string()),
            StoreError::IdInUse { .. } => End::Duplicate(e.to_string()),
            e => End::Store(e),
        }
    }
}

/// A push sent and not yet answered, or waiting to be retried.
#[derive(Debug)]
struct InFlight {
    /// What was sent (its version, staged or not, the instant).
    action: Action,
    sent: Instant,
    retries: u32,
    retry_at: Option<Instant>,
}

/// Who opened a link stream, as its TLS certificate says (nothing on a
/// plaintext controller).
#[derive(Clone, Debug, Default)]
pub struct LinkPeer {
    /// The agent id of the certificate: the Hello must say the same.
    pub agent_id: Option<String>,
    /// The certificate's serial: the stream ends when it is revoked.
    pub serial: Option<String>,
    /// The tenants the certificate names (`None`: none named).
    pub tenants: Option<Vec<String>>,
}

/// A per-stream rate limit on one kind of message: past it the message is
/// dropped (a time request goes unanswered, and the agent's exchange asks
/// again later; a clock report is not stored), and the first drop is
/// logged.
struct Limited {
    what: &'static str,
    bucket: TokenBucket,
    dropped: u64,
}

impl Limited {
    fn new(what: &'static str, pace: Pace, now: Instant) -> Limited {
        Limited {
            what,
            bucket: TokenBucket::new(pace, now.into_std()),
            dropped: 0,
        }
    }

    /// Whether this message may be acted on.
    fn allow(&mut self, agent: &str, now: Instant) -> bool {
        if self.bucket.take(now.into_std()).is_ok() {
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

/// Time requests an agent's stream may have answered: its exchange asks at
/// most 4 a second, in a burst of six, then one every 4 s; twice that.
const TIME_REQUESTS: Pace = Pace {
    rate: 8.0,
    burst: 16.0,
};
/// Clock reports an agent's stream may have stored: it sends one on each
/// welcome and one every 5 s.
const CLOCK_REPORTS: Pace = Pace {
    rate: 0.5,
    burst: 4.0,
};

/// The state of one live stream.
struct Session {
    shared: Arc<Shared>,
    app: Arc<App>,
    out: Outbound,
    agent: AgentRow,
    /// Certificate tenants (kept over regrants).
    cert_tenants: Option<Vec<String>>,
    /// The tenants as events carry them.
    tenants: Arc<BTreeSet<String>>,
    /// The agent's delivery rows, by pack, as the store last said.
    rows: BTreeMap<PackKey, DeliveryRow>,
    /// The pack texts pushed to it recently (a push command carries one).
    texts: HashMap<PackKey, Arc<PackVersionRow>>,
    in_flight: HashMap<PackKey, InFlight>,
    /// Highest feedback seq received on this stream.
    last_seq: u64,
    /// Highest seq the store had acknowledged at hello, and the first seq
    /// the agent then held: entries between them were dropped by the
    /// agent (its first entry's `dropped_before` says how many) or lost.
    gap: Option<(u64, u64)>,
    last_heard: Instant,
    next_ping: u64,
    time_requests: Limited,
    clock_reports: Limited,
    /// Entries dropped for naming what is not the agent's.
    foreign: u64,
    /// Most packs its Held may list (its max-packs, at most the
    /// controller's).
    held_cap: usize,
}

/// Serve one stream to its end.
pub async fn run<S>(shared: Arc<Shared>, mut inbound: S, out: Outbound, peer: LinkPeer)
where
    S: Stream<Item = Result<wire::AgentMessage, Status>> + Unpin + Send,
{
    let (hello, hello_row) = match first_hello(&shared, &mut inbound, &peer).await {
        Ok(h) => h,
        Err(end) => {
            tracing::warn!("link stream refused before hello: {}", end.describe());
            if let Some(s) = end.status() {
                let _ = out.send(Err(s)).await;
            }
            return;
        }
    };
    let agent_id = hello.agent_id.clone();
    let app = shared.app.clone();
    let (cmd_tx, cmd_rx) = mpsc::channel(64);
    let generation = match app
        .hub
        .register(&agent_id, &hello.journal_id, cmd_tx, now_ns())
    {
        Ok(g) => g,
        Err(c) => {
            app.metrics.duplicate_stream();
            let msg = format!(
                "agent id {agent_id} is connected from another journal ({}): two machines under one identity; this stream (journal {}) is refused",
                c.holder_journal, c.refused_journal
            );
            tracing::warn!(agent = %agent_id, refused = c.refused, "{msg}");
            let tenants = app
                .store
                .agent(&agent_id)
                .await
                .ok()
                .flatten()
                .map(|a| a.tenants)
                .unwrap_or_default();
            app.publish(Event::Agent(AgentEvent {
                agent_id: agent_id.clone(),
                tenants: Arc::new(tenants),
                kind: AgentEventKind::Conflict,
                clock: None,
                detail: msg.clone(),
                at: RefTime::from_nanos(now_ns()),
            }));
            let _ = out
                .send(Err(End::Duplicate(msg)
                    .status()
                    .unwrap_or_else(|| Status::already_exists(""))))
                .await;
            return;
        }
    };
    let mut session = Session {
        shared: shared.clone(),
        app: app.clone(),
        out: out.clone(),
        agent: AgentRow::new(&agent_id, &hello.journal_id),
        cert_tenants: peer.tenants.clone(),
        tenants: Arc::default(),
        rows: BTreeMap::new(),
        texts: HashMap::new(),
        in_flight: HashMap::new(),
        last_seq: 0,
        gap: None,
        last_heard: Instant::now(),
        next_ping: 1,
        time_requests: Limited::new("time requests", TIME_REQUESTS, Instant::now()),
        clock_reports: Limited::new("clock reports", CLOCK_REPORTS, Instant::now()),
        foreign: 0,
        held_cap: convert::held_cap(&hello, app.cfg.max_held),
    };
    let end = match session.start(&hello, hello_row).await {
        Ok(()) => session.serve(inbound, cmd_rx, peer.serial).await,
        Err(e) => e,
    };
    let reason = end.describe();
    match end {
        End::Fenced(_) => app.metrics.fenced_stream(),
        // Another replica's stream holds the id (the store said so).
        End::Duplicate(_) => app.metrics.duplicate_stream(),
        _ => {}
    }
    for l in [&session.time_requests, &session.clock_reports] {
        if l.dropped > 0 {
            tracing::warn!(agent = %agent_id, "{} {} over the limit dropped on this stream", l.dropped, l.what);
        }
    }
    if session.foreign > 0 {
        tracing::warn!(agent = %agent_id, "{} entries for packs not the agent's dropped on this stream", session.foreign);
    }
    if let Some(s) = end.status() {
        let _ = tokio::time::timeout(Duration::from_secs(1), out.send(Err(s))).await;
    }
    let still_current = app.hub.unregister(&agent_id, generation);
    if still_current {
        app.agent_gone(&agent_id);
    }
    // A forgotten agent has no record left to mark; a fenced stream's
    // agent is another stream's to mark.
    if still_current && !matches!(end, End::Forgotten | End::Fenced(_)) {
        let ours = match app
            .store
            .agent_seen(&agent_id, session.agent.session_gen, false, now_ns(), None)
            .await
        {
            Ok(()) => true,
            // Taken over (elsewhere) while this stream ended: the agent is
            // connected, to its new stream; watchers must not hear
            // otherwise.
            Err(StoreError::Fenced { .. }) => false,
            Err(e) => {
                tracing::error!(agent = %agent_id, "store: marking disconnected: {e}");
                true
            }
        };
        if ours {
            session.agent_event(AgentEventKind::Disconnected, None, reason.clone());
        }
    }
    match end {
        End::Closed | End::Replaced | End::Shutdown | End::Forgotten | End::Fenced(_) => {
            tracing::info!(agent = %agent_id, "link stream ended: {reason}")
        }
        _ => tracing::warn!(agent = %agent_id, "link stream ended: {reason}"),
    }
}

/// The first message must be a valid hello, within the hello timeout:
/// it and what the store will keep of it.
async fn first_hello<S>(
    shared: &Shared,
    inbound: &mut S,
    peer: &LinkPeer,
) -> Result<(wire::Hello, HelloRow), End>
where
    S: Stream<Item = Result<wire::AgentMessage, Status>> + Unpin + Send,
{
    let first = tokio::time::timeout(shared.cfg.hello_timeout, inbound.next())
        .await
        .map_err(|_| End::Bad(format!("no hello within {:?}", shared.cfg.hello_timeout)))?;
    let msg = match first {
        Some(Ok(m)) => m,
        None => return Err(End::Closed),
        Some(Err(s)) => return Err(End::Transport(s)),
    };
    match msg.body {
        Some(In::Hello(h)) => {
            if let Some(id) = &peer.agent_id
                && h.agent_id != *id
            {
                return Err(End::Denied(format!(
                    "hello as agent `{}` on a certificate of agent `{id}`",
                    h.agent_id
                )));
            }
            // Checked here so a bad hello never registers a stream.
            let row = convert::hello(&h, shared.app.cfg.max_held, now_ns())?;
            Ok((h, row))
        }
        _ => Err(End::Bad(
            "the first message on a link stream must be hello".into(),
        )),
    }
}

impl Session {
    fn binding(&self) -> Binding {
        self.app.cfg.binding
    }

    /// The agent's entries for tenants it serves, and for packs the
    /// controller has a row of on it (delivered before a grant was taken
    /// back: the controller must go on seeing it held, or it could never
    /// cancel it); the rest dropped and counted.
    fn own_held(&mut self, held: Vec<HeldPackRow>) -> Vec<HeldPackRow> {
        let before = held.len();
        let binding = self.binding();
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
        self.app.metrics.foreign(n);
    }

    fn agent_event(
        &self,
        kind: AgentEventKind,
        clock: Option<crate::model::ClockRow>,
        detail: String,
    ) {
        self.app.publish(Event::Agent(AgentEvent {
            agent_id: self.agent.id.clone(),
            tenants: self.tenants.clone(),
            kind,
            clock,
            detail,
            at: RefTime::from_nanos(now_ns()),
        }));
    }

    /// Store the hello (`row`, from `h`; the store plans every pack for
    /// the agent), welcome the agent, act on its rows.
    async fn start(&mut self, h: &wire::Hello, mut row: HelloRow) -> Result<(), End> {
        let app = self.app.clone();
        row.cert_tenants = self.cert_tenants.clone();
        // Its tenants before its held set is taken: grants are stored,
        // the certificate's come with this hello.
        if let Some(a) = app.store.agent(&row.id).await? {
            self.agent.tenants = a.tenants;
        }
        if let Some(t) = &self.cert_tenants {
            self.agent.tenants.extend(t.iter().cloned());
        }
        self.rows = app
            .store
            .deliveries_of_agent(&row.id)
            .await?
            .into_iter()
            .map(|r| (r.key(), r))
            .collect();
        row.held = self.own_held(row.held);
        let (agent, rows) = app.store.agent_hello(row).await?;
        self.set_agent(agent);
        self.rows = rows.into_iter().map(|r| (r.key(), r)).collect();
        let acked = app
            .store
            .feedback_acked(&self.agent.id, &self.agent.journal_id)
            .await?;
        self.last_seq = acked;
        if h.feedback_first_seq > acked + 1 {
            self.gap = Some((acked, h.feedback_first_seq));
        }
        tracing::info!(
            agent = %self.agent.id,
            held = h.packs.len(),
            feedback_acked = acked,
            "agent connected"
        );
        self.send(Out::Welcome(wire::Welcome {
            agent_id: self.agent.id.clone(),
            feedback_acked_seq: acked,
            controller_time_ns: now_ns(),
            ping_interval_ms: self.shared.cfg.ping_interval.as_millis() as u32,
            session_gen: self.agent.session_gen,
        }))
        .await?;
        self.agent_event(
            AgentEventKind::Connected,
            None,
            format!("agent {}", self.agent.agent_version),
        );
        self.act_all().await
    }

    fn set_agent(&mut self, a: AgentRow) {
        self.tenants = Arc::new(a.tenants.clone());
        self.agent = a;
    }

    async fn serve<S>(
        &mut self,
        mut inbound: S,
        mut cmds: mpsc::Receiver<SessionCmd>,
        serial: Option<String>,
    ) -> End
    where
        S: Stream<Item = Result<wire::AgentMessage, Status>> + Unpin + Send,
    {
        let mut shutdown = self.shared.shutdown.clone();
        let mut revoked = self.shared.revoked.subscribe();
        if let Some(s) = &serial
            && revoked.borrow_and_update().contains(s)
        {
            return End::Revoked(s.clone());
        }
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let ping_every = self.shared.cfg.ping_interval;
        let mut next_ping = Instant::now() + ping_every;
        let mut next_resync = Instant::now() + RESYNC;
        let mut next_seen = Instant::now() + SEEN_EVERY;
        loop {
            let r = tokio::select! {
                m = inbound.next() => match m {
                    Some(Ok(m)) => {
                        self.last_heard = Instant::now();
                        self.on_message(m).await
                    }
                    None => Err(End::Closed),
                    Some(Err(s)) => Err(End::Transport(s)),
                },
                c = cmds.recv() => match c {
                    Some(c) => self.on_command(c).await,
                    None => Err(End::Shutdown),
                },
                _ = tick.tick() => {
                    let now = Instant::now();
                    let silent = now.saturating_duration_since(self.last_heard);
                    if silent >= ping_every * 3 {
                        Err(End::Dead(silent))
                    } else {
                        let mut r = Ok(());
                        if now >= next_ping {
                            next_ping = now + ping_every;
                            let id = self.next_ping;
                            self.next_ping += 1;
                            r = self.send(Out::Ping(wire::Ping { id })).await;
                        }
                        if r.is_ok() && now >= next_seen {
                            next_seen = now + SEEN_EVERY;
                            let p99 = Some(self.app.lateness_p99(&self.agent.id).nanos());
                            r = self.app.store.agent_seen(&self.agent.id, self.agent.session_gen, true, now_ns(), p99).await.map_err(End::from);
                        }
                        if r.is_ok() {
                            r = self.retry_due(now).await;
                        }
                        if r.is_ok() && now >= next_resync {
                            next_resync = now + RESYNC;
                            r = self.resync().await;
                        }
                        r
                    }
                },
                _ = shutdown.changed() => Err(End::Shutdown),
                r = revoked.changed(), if serial.is_some() => match (r, &serial) {
                    (Ok(()), Some(s)) if revoked.borrow_and_update().contains(s) => {
                        Err(End::Revoked(s.clone()))
                    }
                    // The sender lives as long as the shared state.
                    (Err(_), _) => Err(End::Shutdown),
                    _ => Ok(()),
                },
            };
            if let Err(end) = r {
                return end;
            }
        }
    }

    async fn on_command(&mut self, c: SessionCmd) -> Result<(), End> {
        match c {
            SessionCmd::Rows { rows, pack } => {
                if let Some(p) = pack {
                    self.texts.insert(p.key(), p);
                }
                for r in rows {
                    let key = r.key();
                    self.rows.insert(key.clone(), r);
                    self.act(&key).await?;
                }
                Ok(())
            }
            SessionCmd::Replaced => Err(End::Replaced),
            SessionCmd::Forgotten => Err(End::Forgotten),
            SessionCmd::Regranted => {
                if let Some(a) = self.app.store.agent(&self.agent.id).await? {
                    self.set_agent(a);
                }
                Ok(())
            }
        }
    }

    /// Every row read again from the store, and acted on.
    async fn resync(&mut self) -> Result<(), End> {
        let rows = self.app.store.deliveries_of_agent(&self.agent.id).await?;
        self.rows = rows.into_iter().map(|r| (r.key(), r)).collect();
        self.texts.clear();
        self.act_all().await
    }

    async fn act_all(&mut self) -> Result<(), End> {
        let keys: Vec<PackKey> = self.rows.keys().cloned().collect();
        for k in keys {
            self.act(&k).await?;
        }
        Ok(())
    }

    /// What the row asks of the agent, unless it was just done.
    async fn act(&mut self, key: &PackKey) -> Result<(), End> {
        let Some(row) = self.rows.get(key) else {
            return Ok(());
        };
        match planner::action(row) {
            Some(a @ (Action::Push(_) | Action::Stage(_) | Action::Switch(..))) => {
                let recent = self.in_flight.get(key).is_some_and(|f| {
                    f.action == a && (f.retry_at.is_some() || f.sent.elapsed() < UNANSWERED)
                });
                if !recent {
                    self.push(key, a, 0).await?;
                }
                Ok(())
            }
            Some(Action::Cancel(version)) => {
                self.in_flight.remove(key);
                self.send(Out::PackCancel(wire::PackCancel {
                    pack: Some(convert::wire_ref(&key.tenant, &key.pack, version)),
                    session_gen: self.agent.session_gen,
                }))
                .await
            }
            None => {
                if self
                    .in_flight
                    .get(key)
                    .is_some_and(|f| f.retry_at.is_none())
                {
                    self.in_flight.remove(key);
                }
                Ok(())
            }
        }
    }

    /// Send a pack version (to run, to stage, or to switch to at an
    /// instant), paced by the controller-wide token bucket.
    async fn push(&mut self, key: &PackKey, action: Action, retries: u32) -> Result<(), End> {
        let (version, staged, activate_at_ns) = match action {
            Action::Push(v) => (v, false, 0),
            Action::Stage(v) => (v, true, 0),
            Action::Switch(v, t) => (v, true, t.as_nanos()),
            // Not a push.
            Action::Cancel(_) => return Ok(()),
        };
        let text = match self.texts.get(key).filter(|t| t.version == version) {
            Some(t) => t.clone(),
            None => match self.app.store.pack_version(key, Some(version)).await? {
                Some(t) => {
                    let t = Arc::new(t);
                    self.texts.insert(key.clone(), t.clone());
                    t
                }
                // Gone from the store (a withdrawn pack it lost): nothing
                // to send.
                None => return Ok(()),
            },
        };
        self.app.pace().await;
        self.app.metrics.push_sent();
        self.send(Out::PackPush(wire::PackPush {
            pack: Some(convert::wire_ref(&key.tenant, &key.pack, version)),
            yaml: text.yaml.clone(),
            session_gen: self.agent.session_gen,
            staged,
            activate_at_ns,
            // The pack's bound, checked again by the agent at the switch
            // (the controller names no instant to an agent whose last
            // report was less certain, but that report is seconds old).
            max_uncertainty_ns: if staged {
                max_uncertainty_ns(&text.yaml)
            } else {
                0
            },
        }))
        .await?;
        self.in_flight.insert(
            key.clone(),
            InFlight {
                action,
                sent: Instant::now(),
                retries,
                retry_at: None,
            },
        );
        Ok(())
    }

    async fn retry_due(&mut self, now: Instant) -> Result<(), End> {
        let due: Vec<(PackKey, Action, u32)> = self
            .in_flight
            .iter()
            .filter(|(_, f)| f.retry_at.is_some_and(|t| t <= now))
            .map(|(k, f)| (k.clone(), f.action, f.retries))
            .collect();
        for (key, action, retries) in due {
            self.in_flight.remove(&key);
            let still = self
                .rows
                .get(&key)
                .is_some_and(|r| planner::action(r) == Some(action));
            if still {
                self.push(&key, action, retries).await?;
            }
        }
        Ok(())
    }

    /// The agent answered a push: the store re-plans the row.
    async fn answered(&mut self, key: PackKey, version: u64, answer: Answer) -> Result<(), End> {
        let attempts = self.in_flight.get(&key).map_or(1, |f| f.retries + 1);
        let row = self
            .app
            .store
            .answer(AnswerRow {
                agent_id: self.agent.id.clone(),
                key: key.clone(),
                version,
                answer,
                session_gen: self.agent.session_gen,
                attempts,
                at: RefTime::from_nanos(now_ns()),
            })
            .await?;
        if let Some(r) = row {
            let changed = self.rows.get(&key) != Some(&r);
            self.rows.insert(key.clone(), r.clone());
            if changed {
                self.app.row_changed(&r);
            }
        }
        Ok(())
    }

    async fn on_message(&mut self, m: wire::AgentMessage) -> Result<(), End> {
        match m.body {
            None => Err(End::Bad("empty message".into())),
            Some(In::Hello(_)) => Err(End::Bad("a second hello on the same stream".into())),
            Some(In::PackAck(a)) => {
                let (tenant, pack, version) = convert::pack_ref(a.pack.as_ref())?;
                let key = PackKey::new(tenant, pack);
                if !self.rows.contains_key(&key) {
                    self.drop_foreign(1, "ack");
                    return Ok(());
                }
                self.app.metrics.push_result(if a.unchanged {
                    PushResult::Unchanged
                } else {
                    PushResult::Acked
                });
                let answer = if a.staged {
                    Answer::Staged(RefTime::from_nanos(a.activate_at_ns))
                } else {
                    Answer::Acked
                };
                self.answered(key.clone(), version, answer).await?;
                self.in_flight.remove(&key);
                Ok(())
            }
            Some(In::PackNack(n)) => self.on_nack(n).await,
            Some(In::Feedback(batch)) => self.on_feedback(batch).await,
            Some(In::ClockReport(c)) => {
                let row = convert::clock(&c)?;
                if !self.clock_reports.allow(&self.agent.id, Instant::now()) {
                    return Ok(());
                }
                if let Some(n) = c.outbox_entries {
                    self.app.record_outbox(&self.agent.id, n, row.at.as_nanos());
                }
                self.app.metrics.clock(
                    &self.agent.id,
                    AgentClock {
                        offset_ns: row.offset.nanos(),
                        uncertainty_ns: row.uncertainty.nanos(),
                        locked: row.state == "locked",
                    },
                );
                self.app
                    .store
                    .record_clock(&self.agent.id, self.agent.session_gen, row.clone())
                    .await?;
                self.agent_event(AgentEventKind::Clock, Some(row), String::new());
                Ok(())
            }
            Some(In::Held(h)) => {
                let held = convert::held(&h.packs, self.held_cap)?;
                let held = self.own_held(held);
                let changed = self
                    .app
                    .store
                    .agent_held(&self.agent.id, self.agent.session_gen, held, now_ns())
                    .await?;
                for r in changed {
                    let key = r.key();
                    self.app.row_changed(&r);
                    self.rows.insert(key.clone(), r);
                    self.act(&key).await?;
                }
                Ok(())
            }
            Some(In::TimeRequest(r)) => {
                // t2 as soon as the request is seen, t3 as the reply leaves:
                // the controller's clock is reference time.
                let t2 = now_ns();
                if !self.time_requests.allow(&self.agent.id, Instant::now()) {
                    return Ok(());
                }
                self.send(Out::TimeReply(wire::TimeExchangeReply {
                    id: r.id,
                    t1_ns: r.t1_ns,
                    t2_ns: t2,
                    t3_ns: now_ns(),
                }))
                .await
            }
            Some(In::TimeExchangeReply(_)) | Some(In::Pong(_)) => Ok(()),
        }
    }

    async fn on_nack(&mut self, n: wire::PackNack) -> Result<(), End> {
        let (tenant, pack, version) = convert::pack_ref(n.pack.as_ref())?;
        let key = PackKey::new(tenant, pack);
        if !self.rows.contains_key(&key) {
            self.drop_foreign(1, "nack");
            return Ok(());
        }
        let errors = convert::nack_errors(&n.errors);
        let reason = wire::NackReason::try_from(n.reason).unwrap_or(wire::NackReason::Unspecified);
        let message = if n.message.is_empty() {
            reason.as_str_name().to_string()
        } else {
            n.message.chars().take(1000).collect()
        };
        let retryable = matches!(
            reason,
            wire::NackReason::ResourceExhausted
                | wire::NackReason::Clock
                | wire::NackReason::Unavailable
        );
        self.app.metrics.push_result(if retryable {
            PushResult::Retry
        } else {
            PushResult::Nacked
        });
        let pack_name = format!("{key} v{version}");
        if retryable {
            // Kept pending with the reason; pushed again with backoff.
            let retries = self.in_flight.get(&key).map_or(0, |f| f.retries) + 1;
            let wait = RETRY_FIRST
                .saturating_mul(1 << retries.min(6))
                .min(RETRY_MAX);
            // The first refusal is news; the retries that follow (every
            // RETRY_MAX at most, for as long as the agent refuses) are not
            // worth a periodic line at info.
            if retries == 1 {
                tracing::info!(agent = %self.agent.id, pack = %pack_name, "agent refused for now ({message}); retry in {wait:?}");
            } else {
                tracing::debug!(agent = %self.agent.id, pack = %pack_name, retries, "agent refused for now ({message}); retry in {wait:?}");
            }
            // Retried as the row asks now (a push, a staging, a switch).
            let action = self
                .rows
                .get(&key)
                .and_then(planner::action)
                .filter(|a| a.version() == version)
                .unwrap_or(Action::Push(version));
            self.in_flight.insert(
                key.clone(),
                InFlight {
                    action,
                    sent: Instant::now(),
                    retries,
                    retry_at: Some(Instant::now() + wait),
                },
            );
        } else {
            tracing::warn!(agent = %self.agent.id, pack = %pack_name, "agent refused the pack: {message}");
        }
        let refusal = Refusal {
            version,
            last: !retryable,
            message,
            errors,
        };
        self.answered(key.clone(), version, Answer::Refused(refusal))
            .await?;
        if !retryable {
            self.in_flight.remove(&key);
        }
        Ok(())
    }

    /// Whether a feedback entry is the agent's to send: a pack of a tenant
    /// it serves, delivered to it or declared by it (held).
    fn owns(&self, tenant: &str, pack: &str) -> bool {
        // Rows exist only for packs delivered to the agent or declared by
        // it for a tenant it serves (see `own_held`).
        self.rows
            .contains_key(&PackKey::new(tenant.to_string(), pack.to_string()))
    }

    async fn on_feedback(&mut self, batch: wire::FeedbackBatch) -> Result<(), End> {
        if batch.entries.is_empty() {
            return Ok(());
        }
        let now = now_ns();
        let mut rows = Vec::with_capacity(batch.entries.len());
        let mut prev = self.last_seq;
        let mut first_new = None;
        let mut foreign = 0;
        let mut dropped_at_agent = 0;
        let mut carriers = Vec::new();
        // Few batches converted at once across the controller's busiest
        // moments is what memory can take: the permit bounds how many
        // streams hold converted rows at once (the rest wait with their
        // bytes in HTTP/2's flow control, compact), and is kept until the
        // rows are stored.
        let app = self.app.clone();
        let _permit = app.ingest_permit().await;
        for e in batch.entries {
            let mut row = convert::feedback_owned(&self.agent.id, &self.agent.journal_id, e, now)?;
            if row.seq <= prev {
                // A re-send of what is stored is fine only as a prefix of
                // the stream (before anything new); within the new part
                // every seq must grow.
                if first_new.is_some() {
                    return Err(End::Bad(format!(
                        "feedback seq {} after {prev}: out of order",
                        row.seq
                    )));
                }
                // A stored entry may come back carrying a count of drops
                // made since it was first sent: the store keeps the count.
                if row.dropped_before > 0 && self.owns(&row.tenant, &row.pack) {
                    carriers.push(row);
                }
                continue;
            }
            first_new.get_or_insert(row.seq);
            // An agent counts drops it cannot see the fate of: an entry it
            // had sent, and then dropped at its cap before the ack came
            // back, was stored here all the same, and its count rides on a
            // later entry again. What is missing is what the stream skipped
            // right before this entry: a count is never more than that.
            let skipped = row.seq - prev - 1;
            if row.dropped_before > skipped {
                tracing::debug!(
                    agent = %self.agent.id,
                    seq = row.seq,
                    claimed = row.dropped_before,
                    skipped,
                    "feedback: drops claimed beyond the entries skipped (already stored); counted as skipped"
                );
                row.dropped_before = skipped;
            }
            prev = row.seq;
            if !self.owns(&row.tenant, &row.pack) {
                // Not stored; still acknowledged (the agent must not keep
                // re-sending it).
                foreign += 1;
                continue;
            }
            if row.dropped_before > 0 {
                dropped_at_agent += row.dropped_before;
                tracing::warn!(
                    agent = %self.agent.id,
                    "{} feedback entries dropped at the agent (outbox full) before seq {}",
                    row.dropped_before,
                    row.seq
                );
            }
            rows.push(row);
        }
        self.drop_foreign(foreign, "feedback");
        if dropped_at_agent > 0 {
            self.app.metrics.dropped_at_agent(dropped_at_agent);
        }
        if let (Some((acked, first)), Some(first_new)) = (self.gap.take(), first_new) {
            self.account_gap(acked, first.min(first_new), &rows);
        }
        let high = prev;
        if !rows.is_empty() {
            self.app.record_lateness(
                &self.agent.id,
                rows.iter()
                    .filter(|r| r.event == "executed")
                    .map(|r| r.lateness.nanos()),
            );
            // Watchers see only what is stored; the batch is copied for
            // them only when someone watches.
            let watched = self.app.watched().then(|| rows.clone());
            let stored = self
                .app
                .store
                .put_feedback(self.agent.session_gen, rows)
                .await?;
            self.app
                .metrics
                .feedback(stored.inserted, stored.duplicates);
            if stored.duplicates > 0 {
                tracing::debug!(agent = %self.agent.id, duplicates = stored.duplicates, "feedback re-sent");
            }
            for r in watched.into_iter().flatten() {
                self.app.publish(Event::Feedback(Arc::new(r)));
            }
        }
        if !carriers.is_empty() {
            self.app
                .store
                .put_feedback(self.agent.session_gen, carriers)
                .await?;
        }
        self.last_seq = high;
        self.send(Out::FeedbackAck(wire::FeedbackAck { seq: high }))
            .await
    }

    /// Entries between what the store acknowledged and the agent's first
    /// held one are either dropped by the agent (the first entry's
    /// `dropped_before` counts them) or were acknowledged by a store that
    /// was since rolled back: those are lost, and said so.
    fn account_gap(&self, acked: u64, first: u64, rows: &[crate::model::FeedbackRow]) {
        let missing = first.saturating_sub(acked + 1);
        let dropped = rows
            .first()
            .filter(|r| r.seq == first)
            .map_or(0, |r| r.dropped_before);
        let lost = missing.saturating_sub(dropped);
        if lost == 0 {
            return;
        }
        let msg = format!(
            "feedback seq {}..={} of journal {} was acknowledged by a store since rolled back (restored from an older copy): {lost} entries lost",
            acked + 1,
            first - 1,
            self.agent.journal_id
        );
        tracing::warn!(agent = %self.agent.id, "{msg}");
        self.app.metrics.feedback_lost(lost);
        self.agent_event(AgentEventKind::Conflict, None, msg);
    }

    async fn send(&self, body: Out) -> Result<(), End> {
        match tokio::time::timeout(
            SEND_TIMEOUT,
            self.out
                .send(Ok(wire::ControllerMessage { body: Some(body) })),
        )
        .await
        {
            Ok(Ok(())) => Ok(()),
            // The response stream was dropped: the agent is gone.
            Ok(Err(_)) => Err(End::Closed),
            Err(_) => Err(End::Stuck),
        }
    }
}

#[cfg(test)]
mod tests;

/// A rollout's `max_uncertainty` in ns (0: none, the agent's own limit).
fn max_uncertainty_ns(yaml: &str) -> i64 {
    baton_proto::pack::parse_pack(yaml)
        .ok()
        .and_then(|p| p.rollout)
        .map_or(0, |r| {
            i64::try_from(r.max_uncertainty.as_nanos()).unwrap_or(i64::MAX)
        })
}
