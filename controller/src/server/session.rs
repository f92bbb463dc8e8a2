//! One agent's stream: hello, reconcile, then pushes, acks, feedback and
//! clock reports until the stream ends. Every way out of [`run`] ends in
//! the same place: the agent is marked disconnected and unregistered.
//!
//! Feedback is acknowledged only once stored, with a cumulative ack (the
//! highest seq of the stored batch), so an agent's outbox never loses an
//! entry the controller does not have. A batch re-sent after a lost ack is
//! stored once (the store is idempotent on agent, journal and seq).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_proto::wire::{self, agent_message::Body as In, controller_message::Body as Out};
use tokio::sync::mpsc;
use tonic::{Status, Streaming};

use super::bucket::{Pace, TokenBucket};
use super::convert::{self, BadMessage};
use super::hub::SessionCmd;
use super::metrics::{AgentClock, PushResult};
use super::reconcile::{self, Action, Refused};
use super::{Shared, now_ns};
use crate::store::{
    AgentRow, DeliveryRow, DeliveryState, ErrorRow, FeedbackRow, HeldPackRow, PackVersionRow,
    StoreError,
};

/// Outbound queue of one stream.
pub type Outbound = mpsc::Sender<Result<wire::ControllerMessage, Status>>;

/// How long a send to a slow agent may take before its stream is closed.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);
/// How often desired state is reconciled again on a live stream (catches a
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
        End::Store(e)
    }
}

/// A push sent and not yet answered, or waiting to be retried.
#[derive(Debug)]
struct InFlight {
    sent: Instant,
    retries: u32,
    retry_at: Option<Instant>,
    row: PackVersionRow,
}

/// The state of one live stream.
struct Session {
    shared: Arc<Shared>,
    out: Outbound,
    agent: AgentRow,
    /// Deliveries to this agent by (tenant, pack, version).
    deliveries: HashMap<(String, String, u64), DeliveryRow>,
    in_flight: HashMap<(String, String, u64), InFlight>,
    /// Highest feedback seq received on this stream.
    last_seq: u64,
    last_heard: Instant,
    next_ping: u64,
    /// What a hostile or broken agent may make the controller do per
    /// stream: answer time requests, store clock reports (each a row of
    /// history).
    time_requests: Limited,
    clock_reports: Limited,
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

/// Who opened a link stream, as its TLS certificate says (nothing on a
/// plaintext controller).
#[derive(Clone, Debug, Default)]
pub struct LinkPeer {
    /// The agent id of the certificate: the Hello must say the same.
    pub agent_id: Option<String>,
    /// The certificate's serial: the stream ends when it is revoked.
    pub serial: Option<String>,
}

/// Serve one stream to its end.
pub async fn run(
    shared: Arc<Shared>,
    mut inbound: Streaming<wire::AgentMessage>,
    out: Outbound,
    peer: LinkPeer,
) {
    let hello = match first_hello(&shared, &mut inbound, &peer).await {
        Ok(h) => h,
        Err(end) => {
            tracing::warn!("link stream refused before hello: {}", end.describe());
            if let Some(s) = end.status() {
                let _ = out.send(Err(s)).await;
            }
            return;
        }
    };
    let agent_id = hello.id.clone();
    let (cmd_tx, cmd_rx) = mpsc::channel(64);
    let generation = shared.hub.register(&agent_id, cmd_tx);
    let mut session = Session {
        shared: shared.clone(),
        out: out.clone(),
        agent: hello,
        deliveries: HashMap::new(),
        in_flight: HashMap::new(),
        last_seq: 0,
        last_heard: Instant::now(),
        next_ping: 1,
        time_requests: Limited::new("time requests", TIME_REQUESTS, Instant::now()),
        clock_reports: Limited::new("clock reports", CLOCK_REPORTS, Instant::now()),
    };
    let end = match session.start().await {
        Ok(()) => session.serve(inbound, cmd_rx, peer.serial).await,
        Err(e) => e,
    };
    let reason = end.describe();
    for l in [&session.time_requests, &session.clock_reports] {
        if l.dropped > 0 {
            tracing::warn!(agent = %agent_id, "{} {} over the limit dropped on this stream", l.dropped, l.what);
        }
    }
    if let Some(s) = end.status() {
        let _ = tokio::time::timeout(Duration::from_secs(1), out.send(Err(s))).await;
    }
    let still_current = shared.hub.unregister(&agent_id, generation);
    if still_current {
        shared.metrics.forget(&agent_id);
    }
    // A forgotten agent has no record left to mark.
    if still_current && !matches!(end, End::Forgotten) {
        if let Err(e) = shared.store.agent_seen(&agent_id, false, now_ns()).await {
            tracing::error!(agent = %agent_id, "store: marking disconnected: {e}");
        }
        shared.agent_event(&agent_id, wire::AgentEventKind::Disconnected, None, &reason);
    }
    match end {
        End::Closed | End::Replaced | End::Shutdown | End::Forgotten => {
            tracing::info!(agent = %agent_id, "link stream ended: {reason}")
        }
        _ => tracing::warn!(agent = %agent_id, "link stream ended: {reason}"),
    }
}

/// The first message must be a valid hello, within the hello timeout.
async fn first_hello(
    shared: &Shared,
    inbound: &mut Streaming<wire::AgentMessage>,
    peer: &LinkPeer,
) -> Result<AgentRow, End> {
    let first = tokio::time::timeout(shared.cfg.hello_timeout, inbound.message())
        .await
        .map_err(|_| End::Bad(format!("no hello within {:?}", shared.cfg.hello_timeout)))?;
    let msg = match first {
        Ok(Some(m)) => m,
        Ok(None) => return Err(End::Closed),
        Err(s) => return Err(End::Transport(s)),
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
            let row = convert::hello(&h, now_ns())?;
            Ok(row)
        }
        _ => Err(End::Bad(
            "the first message on a link stream must be hello".into(),
        )),
    }
}

impl Session {
    /// Store the hello, welcome the agent, reconcile.
    async fn start(&mut self) -> Result<(), End> {
        self.shared.store.agent_hello(self.agent.clone()).await?;
        self.reload_labels().await?;
        let store = &self.shared.store;
        let acked = store
            .feedback_acked(&self.agent.id, &self.agent.journal_id)
            .await?;
        self.last_seq = acked;
        for d in store.deliveries_of_agent(&self.agent.id).await? {
            self.deliveries
                .insert((d.tenant.clone(), d.pack.clone(), d.version), d);
        }
        tracing::info!(
            agent = %self.agent.id,
            held = self.agent.held.len(),
            feedback_acked = acked,
            "agent connected"
        );
        self.send(Out::Welcome(wire::Welcome {
            agent_id: self.agent.id.clone(),
            feedback_acked_seq: acked,
            controller_time_ns: now_ns(),
            ping_interval_ms: self.shared.cfg.ping_interval.as_millis() as u32,
        }))
        .await?;
        self.shared.agent_event(
            &self.agent.id,
            wire::AgentEventKind::Connected,
            None,
            &format!("agent {}", self.agent.agent_version),
        );
        self.reconcile().await
    }

    /// Desired against held: push, cancel, or record as acked.
    async fn reconcile(&mut self) -> Result<(), End> {
        let packs = self.shared.store.packs(None).await?;
        let refused: Refused = self
            .deliveries
            .values()
            .filter(|d| d.state == DeliveryState::Nacked)
            .map(|d| (d.tenant.clone(), d.pack.clone(), d.version))
            .collect();
        let actions = reconcile::reconcile(
            &self.agent.id,
            &self.agent.labels,
            &self.agent.overrides,
            &self.agent.held,
            &packs,
            &refused,
        );
        for a in actions {
            match a {
                Action::Push(row) => {
                    let key = (row.tenant.clone(), row.pack.clone(), row.version);
                    let recent = self
                        .in_flight
                        .get(&key)
                        .is_some_and(|f| f.retry_at.is_some() || f.sent.elapsed() < UNANSWERED);
                    if !recent {
                        self.push(row, 0).await?;
                    }
                }
                Action::Cancel {
                    tenant,
                    pack,
                    version,
                } => self.cancel(tenant, pack, version).await?,
                Action::Acked {
                    tenant,
                    pack,
                    version,
                } => {
                    let key = (tenant.clone(), pack.clone(), version);
                    self.in_flight.remove(&key);
                    if self
                        .deliveries
                        .get(&key)
                        .is_none_or(|d| d.state != DeliveryState::Acked)
                    {
                        self.set_delivery(key, DeliveryState::Acked, String::new(), Vec::new(), 0)
                            .await?;
                    }
                }
            }
        }
        Ok(())
    }

    async fn serve(
        &mut self,
        mut inbound: Streaming<wire::AgentMessage>,
        mut cmds: mpsc::Receiver<SessionCmd>,
        serial: Option<String>,
    ) -> End {
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
                m = inbound.message() => match m {
                    Ok(Some(m)) => {
                        self.last_heard = Instant::now();
                        self.on_message(m).await
                    }
                    Ok(None) => Err(End::Closed),
                    Err(s) => Err(End::Transport(s)),
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
                            r = self.shared.store.agent_seen(&self.agent.id, true, now_ns()).await.map_err(End::from);
                        }
                        if r.is_ok() {
                            r = self.retry_due(now).await;
                        }
                        if r.is_ok() && now >= next_resync {
                            next_resync = now + RESYNC;
                            r = self.reconcile().await;
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
            SessionCmd::Deliver(row) => {
                // The agent may hold it already (a push racing a hello).
                if self.agent.held.iter().any(|h| {
                    h.tenant == row.tenant && h.pack == row.pack && h.version >= row.version
                }) {
                    return Ok(());
                }
                self.push(row, 0).await
            }
            SessionCmd::Cancel {
                tenant,
                pack,
                version,
            } => self.cancel(tenant, pack, version).await,
            SessionCmd::Replaced => Err(End::Replaced),
            SessionCmd::Relabelled => {
                self.reload_labels().await?;
                self.reconcile().await
            }
            SessionCmd::Forgotten => Err(End::Forgotten),
        }
    }

    /// The operator labels stored for this agent (they outlive hellos).
    async fn reload_labels(&mut self) -> Result<(), End> {
        match self.shared.store.agent(&self.agent.id).await? {
            Some(a) => {
                self.agent.overrides = a.overrides;
                Ok(())
            }
            None => Err(End::Forgotten),
        }
    }

    async fn on_message(&mut self, m: wire::AgentMessage) -> Result<(), End> {
        match m.body {
            None => Err(End::Bad("empty message".into())),
            Some(In::Hello(_)) => Err(End::Bad("a second hello on the same stream".into())),
            Some(In::PackAck(a)) => {
                let key = convert::pack_ref(a.pack.as_ref())?;
                self.in_flight.remove(&key);
                // An ack means the agent holds that version now, whether or
                // not a `Held` update follows (a resync must not push it
                // again).
                self.note_held(&key).await?;
                self.shared.metrics.push_result(if a.unchanged {
                    PushResult::Unchanged
                } else {
                    PushResult::Acked
                });
                let reason = if a.unchanged { "already held" } else { "" };
                self.set_delivery(key, DeliveryState::Acked, reason.into(), Vec::new(), 0)
                    .await
            }
            Some(In::PackNack(n)) => self.on_nack(n).await,
            Some(In::Feedback(batch)) => self.on_feedback(batch).await,
            Some(In::ClockReport(c)) => {
                let row = convert::clock(&c)?;
                if !self.clock_reports.allow(&self.agent.id, Instant::now()) {
                    return Ok(());
                }
                self.shared.metrics.clock(
                    &self.agent.id,
                    AgentClock {
                        offset_ns: row.offset_ns,
                        uncertainty_ns: row.uncertainty_ns,
                        locked: row.state == "locked",
                    },
                );
                self.shared.store.record_clock(&self.agent.id, row).await?;
                self.shared
                    .agent_event(&self.agent.id, wire::AgentEventKind::Clock, Some(c), "");
                Ok(())
            }
            Some(In::Held(h)) => {
                let held = convert::held(&h.packs)?;
                self.shared
                    .store
                    .agent_held(&self.agent.id, held.clone())
                    .await?;
                self.agent.held = held;
                Ok(())
            }
            Some(In::TimeRequest(r)) => {
                // t2 as soon as the request is seen, t3 as the reply leaves:
                // the controller's clock is reference time.
                let t2 = super::now_ns();
                if !self.time_requests.allow(&self.agent.id, Instant::now()) {
                    return Ok(());
                }
                self.send(Out::TimeReply(wire::TimeExchangeReply {
                    id: r.id,
                    t1_ns: r.t1_ns,
                    t2_ns: t2,
                    t3_ns: super::now_ns(),
                }))
                .await
            }
            Some(In::TimeExchangeReply(_)) | Some(In::Pong(_)) => Ok(()),
        }
    }

    async fn on_nack(&mut self, n: wire::PackNack) -> Result<(), End> {
        let key = convert::pack_ref(n.pack.as_ref())?;
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
        self.shared.metrics.push_result(if retryable {
            PushResult::Retry
        } else {
            PushResult::Nacked
        });
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
                tracing::info!(
                    agent = %self.agent.id,
                    pack = %format!("{}/{} v{}", key.0, key.1, key.2),
                    "agent refused for now ({message}); retry in {wait:?}"
                );
            } else {
                tracing::debug!(
                    agent = %self.agent.id,
                    pack = %format!("{}/{} v{}", key.0, key.1, key.2),
                    retries,
                    "agent refused for now ({message}); retry in {wait:?}"
                );
            }
            if let Some(row) = self
                .in_flight
                .get(&key)
                .map(|f| f.row.clone())
                .or(self.pack_row(&key).await?)
            {
                self.in_flight.insert(
                    key.clone(),
                    InFlight {
                        sent: Instant::now(),
                        retries,
                        retry_at: Some(Instant::now() + wait),
                        row,
                    },
                );
            }
            self.set_delivery(
                key,
                DeliveryState::Pending,
                format!("{message} (retrying)"),
                errors,
                0,
            )
            .await
        } else {
            self.in_flight.remove(&key);
            tracing::warn!(
                agent = %self.agent.id,
                pack = %format!("{}/{} v{}", key.0, key.1, key.2),
                "agent refused the pack: {message}"
            );
            self.set_delivery(key, DeliveryState::Nacked, message, errors, 0)
                .await
        }
    }

    /// Record that the agent holds this version (running).
    async fn note_held(&mut self, key: &(String, String, u64)) -> Result<(), End> {
        let held = &mut self.agent.held;
        match held
            .iter_mut()
            .find(|h| h.tenant == key.0 && h.pack == key.1)
        {
            Some(h) if h.version == key.2 => return Ok(()),
            Some(h) => {
                h.version = key.2;
                h.stopped = false;
            }
            None => held.push(HeldPackRow {
                tenant: key.0.clone(),
                pack: key.1.clone(),
                version: key.2,
                stopped: false,
            }),
        }
        self.shared
            .store
            .agent_held(&self.agent.id, self.agent.held.clone())
            .await?;
        Ok(())
    }

    async fn pack_row(&self, key: &(String, String, u64)) -> Result<Option<PackVersionRow>, End> {
        Ok(self
            .shared
            .store
            .pack_version(&key.0, &key.1, Some(key.2))
            .await?)
    }

    async fn on_feedback(&mut self, batch: wire::FeedbackBatch) -> Result<(), End> {
        if batch.entries.is_empty() {
            return Ok(());
        }
        let now = now_ns();
        let mut rows: Vec<FeedbackRow> = Vec::with_capacity(batch.entries.len());
        let mut prev = self.last_seq;
        let mut first_new = None;
        for e in &batch.entries {
            let row = convert::feedback(&self.agent.id, &self.agent.journal_id, e, now)?;
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
                continue;
            }
            first_new.get_or_insert(row.seq);
            prev = row.seq;
            rows.push(row);
        }
        let high = prev;
        if !rows.is_empty() {
            self.shared.record_lateness(&rows);
            // Watchers see only what is stored; the batch is copied for
            // them only when someone watches.
            let watched = self.shared.watched().then(|| rows.clone());
            let stored = self.shared.store.put_feedback(rows).await?;
            self.shared
                .metrics
                .feedback(stored.inserted, stored.duplicates);
            if stored.duplicates > 0 {
                tracing::debug!(agent = %self.agent.id, duplicates = stored.duplicates, "feedback re-sent");
            }
            if let Some(rows) = watched {
                self.shared.publish_feedback(&rows);
            }
        }
        self.last_seq = high;
        self.send(Out::FeedbackAck(wire::FeedbackAck { seq: high }))
            .await
    }

    async fn retry_due(&mut self, now: Instant) -> Result<(), End> {
        let due: Vec<(String, String, u64)> = self
            .in_flight
            .iter()
            .filter(|(_, f)| f.retry_at.is_some_and(|t| t <= now))
            .map(|(k, _)| k.clone())
            .collect();
        for key in due {
            if let Some(f) = self.in_flight.remove(&key) {
                self.push(f.row, f.retries).await?;
            }
        }
        Ok(())
    }

    /// Send a pack version, paced by the controller-wide token bucket.
    async fn push(&mut self, row: PackVersionRow, retries: u32) -> Result<(), End> {
        let key = (row.tenant.clone(), row.pack.clone(), row.version);
        self.shared.pace().await;
        let attempts = self.deliveries.get(&key).map_or(0, |d| d.attempts) + 1;
        let reason = if retries > 0 {
            format!("sent again (try {attempts})")
        } else {
            "sent, waiting for the agent".to_string()
        };
        self.set_delivery(key.clone(), DeliveryState::Pending, reason, Vec::new(), 1)
            .await?;
        self.shared.metrics.push_sent();
        self.send(Out::PackPush(wire::PackPush {
            pack: Some(convert::wire_ref(&row.tenant, &row.pack, row.version)),
            yaml: row.yaml.clone(),
        }))
        .await?;
        self.in_flight.insert(
            key,
            InFlight {
                sent: Instant::now(),
                retries,
                retry_at: None,
                row,
            },
        );
        Ok(())
    }

    async fn cancel(&mut self, tenant: String, pack: String, version: u64) -> Result<(), End> {
        self.in_flight
            .retain(|k, _| !(k.0 == tenant && k.1 == pack));
        self.send(Out::PackCancel(wire::PackCancel {
            pack: Some(convert::wire_ref(&tenant, &pack, version)),
        }))
        .await
    }

    /// Record a delivery state (and `add_attempts` sends).
    async fn set_delivery(
        &mut self,
        key: (String, String, u64),
        state: DeliveryState,
        reason: String,
        errors: Vec<ErrorRow>,
        add_attempts: u32,
    ) -> Result<(), End> {
        let attempts = self.deliveries.get(&key).map_or(0, |d| d.attempts) + add_attempts;
        let row = DeliveryRow {
            agent_id: self.agent.id.clone(),
            tenant: key.0.clone(),
            pack: key.1.clone(),
            version: key.2,
            state,
            reason,
            errors,
            updated_ns: now_ns(),
            attempts,
        };
        self.shared.store.put_delivery(row.clone()).await?;
        self.shared.delivery_event(&row);
        self.deliveries.insert(key, row);
        Ok(())
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

/// Packs held by an agent that a cancel must reach (for [`super::admin`]).
pub fn holders(agents: &[AgentRow], tenant: &str, pack: &str) -> HashSet<String> {
    agents
        .iter()
        .filter(|a| a.held.iter().any(|h| h.tenant == tenant && h.pack == pack))
        .map(|a| a.id.clone())
        .collect()
}
