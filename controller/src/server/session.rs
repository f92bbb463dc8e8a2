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
use super::convert;
use crate::app::events::{AgentEvent, AgentEventKind, Event};
use crate::app::hub::Conflict;
use crate::app::{App, now_ns};
use crate::model::{AgentRow, Binding, DeliveryRow, HeldPackRow, PackKey, PackVersionRow, RefTime};
use crate::store::{HelloRow, StoreError};

mod end;
mod feedback;
mod limits;
mod messages;
mod pushes;
mod stream;

use end::End;
use limits::{CLOCK_REPORTS, Limited, TIME_REQUESTS};
use pushes::InFlight;

/// Outbound queue of one stream.
pub type Outbound = mpsc::Sender<Result<wire::ControllerMessage, Status>>;

/// How long a send to a slow agent may take before its stream is closed.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);

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
            refuse_duplicate(&app, agent_id, c, &out).await;
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
    close(&session, end, generation, &out).await;
}

/// Another machine's stream holds the agent id on this replica: this
/// stream is refused, counted, logged and published as a conflict.
async fn refuse_duplicate(app: &App, agent_id: String, c: Conflict, out: &Outbound) {
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
}

/// Every way out of a stream: the end logged and told to the agent, the
/// stream unregistered, the agent marked disconnected if it is still this
/// stream's.
async fn close(session: &Session, end: End, generation: u64, out: &Outbound) {
    let app = session.app.clone();
    let agent_id = session.agent.id.clone();
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
