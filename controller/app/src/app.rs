//! The application itself: the store, the live streams, the watchers and
//! the counters, and what every operation shares (errors, settings, time).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{broadcast, mpsc};

use crate::events::{AgentEventKind, Event};
use crate::hub::{Hub, SessionCmd};
use crate::stream_health::Measured;
use crate::tally::Tally;
use crate::texts::{PackText, Specs};
use crate::{metrics, pace};
use baton_model::time::{self, RefTime, SignedDuration};
use baton_model::{Binding, DeliveryRow, DeliveryState, EventKind, EventRow, PackKey};
use baton_store::StoreOps;
use baton_store::{Store, StoreError, StoreResult};

/// What an operation can fail with; each transport maps it to its own
/// error (gRPC status, HTTP code). Messages never name what the caller
/// may not see.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The request is malformed or the pack does not validate.
    #[error("{0}")]
    Invalid(String),
    /// No such object, or not the caller's to see (the same words).
    #[error("{0}")]
    NotFound(String),
    /// The caller's role or tenant does not allow it.
    #[error("{0}")]
    Denied(String),
    /// It conflicts with what is stored (a version taken or older).
    #[error("{0}")]
    Conflict(String),
    /// Over a limit (sizes, counts).
    #[error("{0}")]
    Limit(String),
    /// The store failed or is closed: try again.
    #[error("{0}")]
    Unavailable(String),
}

impl From<StoreError> for AppError {
    fn from(e: StoreError) -> AppError {
        match e {
            StoreError::VersionTaken { .. }
            | StoreError::VersionOlder { .. }
            | StoreError::ReleaseTaken { .. } => AppError::Conflict(e.to_string()),
            StoreError::NoSuchPack { .. } | StoreError::NoSuchAgent { .. } => {
                AppError::NotFound(e.to_string())
            }
            StoreError::OutOfRange { .. } | StoreError::Invalid(_) => {
                AppError::Invalid(e.to_string())
            }
            // Retrying helps for the first ones; for a corrupt row or a
            // store set up wrong it does not, but the caller can do nothing
            // else either: the operator of the controller must look.
            StoreError::Unavailable { .. }
            | StoreError::Contended(_)
            | StoreError::Closed
            | StoreError::Fenced { .. }
            | StoreError::IdInUse { .. }
            | StoreError::LeaseLost(_)
            | StoreError::Corrupt { .. }
            | StoreError::Unusable(_) => AppError::Unavailable(e.to_string()),
        }
    }
}

/// Shorthand.
pub type AppResult<T> = Result<T, AppError>;

/// Settings of the application.
#[derive(Clone, Debug)]
pub struct AppConfig {
    /// Whether agents belong to tenants (mTLS) or serve all (plaintext).
    pub binding: Binding,
    /// Most packs an agent's Hello or Held may list (its own advertised
    /// `max-packs` is the tighter bound when smaller).
    pub max_held: usize,
    /// Pacing of pushes to agents.
    pub pace: pace::Pace,
    /// Failed dashboard log-ins allowed per source.
    pub login: crate::login_throttle::LoginThrottle,
}

impl AppConfig {
    /// Defaults under `binding`.
    pub fn new(binding: Binding) -> AppConfig {
        AppConfig {
            binding,
            max_held: 1024,
            pace: pace::Pace::default(),
            login: crate::login_throttle::LoginThrottle::default(),
        }
    }
}

/// The start lateness of an agent's latest [`Recent::LEN`] executions, in
/// µs: what `agents` shows as its p99. A window of recent values rather
/// than a histogram since the stream began: 1 KB per agent instead of
/// ~11 KB (a thousand agents' histograms were a tenth of the controller's
/// memory), and it says how the agent fires now, not an hour ago.
#[derive(Debug, Default)]
pub struct Recent {
    us: Vec<u32>,
    next: usize,
}

impl Recent {
    /// Values kept.
    pub const LEN: usize = 256;

    /// One more execution's lateness (ns; negative: early, as 0).
    pub fn push(&mut self, ns: i64) {
        let us = u32::try_from(ns.max(0) / 1_000).unwrap_or(u32::MAX);
        if self.us.len() < Self::LEN {
            self.us.push(us);
        } else {
            self.us[self.next] = us;
        }
        self.next = (self.next + 1) % Self::LEN;
    }

    /// The 99th percentile, ns (0: nothing recorded).
    pub fn p99(&self) -> i64 {
        if self.us.is_empty() {
            return 0;
        }
        let mut v = self.us.clone();
        let i = (v.len() * 99).div_ceil(100) - 1;
        let (_, p, _) = v.select_nth_unstable(i);
        i64::from(*p) * 1_000
    }
}

/// Now: the controller's clock is reference time.
pub fn now() -> RefTime {
    RefTime::from_nanos(now_ns())
}

/// [`now`] as nanoseconds since the Unix epoch, for the store's calls
/// that still take integers.
pub fn now_ns() -> i64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// The application: the store, the live streams, the watchers.
pub struct App {
    /// The durable state: the application's alone (the transports reach
    /// it only through the application's operations).
    pub(crate) store: Arc<dyn Store>,
    /// Live agent streams.
    pub hub: Hub,
    /// Settings.
    pub cfg: AppConfig,
    /// Counters for `/metrics`.
    pub metrics: metrics::Metrics,
    pub(crate) events: broadcast::Sender<Event>,
    pub(crate) bucket: tokio::sync::Mutex<pace::TokenBucket>,
    /// Per connected agent: the start lateness of its latest executions;
    /// dropped when its stream ends.
    pub(crate) lateness: Mutex<HashMap<String, Recent>>,
    /// Feedback batches being converted and stored at once (see
    /// [`App::ingest_permit`]).
    pub(crate) ingest: tokio::sync::Semaphore,
    /// The replica this process is, when replicas share the store: its
    /// events then go to the others through the store ([`follow`]).
    pub(crate) replica: Option<String>,
    /// Events for the store, and their writer's end (taken once).
    pub(crate) relay: Option<mpsc::Sender<EventRow>>,
    pub(crate) relay_rx: Mutex<Option<mpsc::Receiver<EventRow>>>,
    /// Per connected agent: what its stream measured of its health (the
    /// outbox backlog its clock reports carry, late firings); dropped
    /// when its stream ends.
    pub(crate) health: Mutex<HashMap<String, Measured>>,
    /// Feedback already read of each open rollout stage's window.
    pub(crate) rollout_tallies: Mutex<HashMap<(baton_model::PackKey, u64, u32, RefTime), Tally>>,
    /// Feedback already read of each open agent update's stage window.
    pub(crate) update_tallies: Mutex<HashMap<(u64, u32, RefTime), Tally>>,
    /// One release upload at a time (each holds its binary in memory).
    pub(crate) uploads: tokio::sync::Semaphore,
    /// The `rollout:` sections of the versions seen, parsed once each.
    pub(crate) specs: Specs,
    /// Agents' answers, decided in batches.
    pub(crate) answers: crate::answers::Answers,
}

/// Events queued for the store at most; past it they are dropped and
/// counted (`baton_controller_relay_dropped_total`).
pub const RELAY_DEPTH: usize = 65_536;

/// Feedback batches converted and held at once, controller-wide: enough
/// for the store's group commit to fill its batches (it takes up to 512
/// commands per commit), few enough that a thousand agents sending at
/// once do not each hold a decoded batch in memory.
pub const INGEST_AT_ONCE: usize = 256;

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field("store", &self.store)
            .field("connected", &self.hub.connected())
            .finish_non_exhaustive()
    }
}

impl App {
    /// The application over `store`.
    pub fn new(store: Arc<dyn Store>, cfg: AppConfig) -> Arc<App> {
        let (events, _) = broadcast::channel(4096);
        let replica = store.replica();
        let (relay, relay_rx) = match replica {
            Some(_) => {
                let (tx, rx) = mpsc::channel(RELAY_DEPTH);
                (Some(tx), Some(rx))
            }
            None => (None, None),
        };
        Arc::new(App {
            store,
            hub: Hub::default(),
            bucket: tokio::sync::Mutex::new(pace::TokenBucket::new(
                cfg.pace,
                tokio::time::Instant::now().into_std(),
            )),
            cfg,
            metrics: metrics::Metrics::default(),
            events,
            lateness: Mutex::new(HashMap::new()),
            health: Mutex::new(HashMap::new()),
            ingest: tokio::sync::Semaphore::new(INGEST_AT_ONCE),
            replica,
            relay,
            relay_rx: Mutex::new(relay_rx),
            rollout_tallies: Mutex::new(HashMap::new()),
            update_tallies: Mutex::new(HashMap::new()),
            uploads: tokio::sync::Semaphore::new(1),
            specs: Specs::default(),
            answers: crate::answers::Answers::default(),
        })
    }

    /// At start-up: the agents whose stream no live replica holds (on a
    /// single controller, every agent) are not connected.
    pub async fn mark_all_disconnected(&self) -> AppResult<()> {
        Ok(self.store.all_disconnected().await?)
    }

    /// A stored version with its `rollout:` section parsed (once per
    /// version; see [`crate::texts`]); `None`: not stored.
    pub async fn pack_text(
        &self,
        key: &PackKey,
        version: u64,
    ) -> StoreResult<Option<Arc<PackText>>> {
        let row = self.store.pack_version(key, Some(version)).await?;
        Ok(row.map(|r| self.specs.text(r)))
    }

    /// The replica this process is, when replicas share the store.
    pub fn replica(&self) -> Option<&str> {
        self.replica.as_deref()
    }

    /// A place among the feedback batches being converted and stored
    /// (see [`INGEST_AT_ONCE`]); held until the batch is stored.
    pub async fn ingest_permit(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        // The semaphore is never closed.
        self.ingest.acquire().await.ok()
    }

    /// Wait for a push token (all streams share one pace).
    pub async fn pace(&self) {
        loop {
            let wait = {
                let mut b = self.bucket.lock().await;
                // tokio's clock, so paused-time tests pace too.
                match b.take(tokio::time::Instant::now().into_std()) {
                    Ok(()) => return,
                    Err(w) => w,
                }
            };
            tokio::time::sleep(wait).await;
        }
    }

    /// Tell watchers: this process's directly, or, when replicas share
    /// the store, every replica's through it ([`follow`] reads it back,
    /// this replica's events with the others', so each is told once).
    pub fn publish(&self, e: Event) {
        let Some(replica) = &self.replica else {
            // No watcher: nothing to do.
            let _ = self.events.send(e);
            return;
        };
        let row = match e {
            // This replica's pages at once, the others' through the store
            // (their followers tell their pages; this one's skips it).
            Event::Action(a) => {
                let row = EventRow {
                    id: 0,
                    replica: replica.clone(),
                    kind: EventKind::Action,
                    agent_id: a.agent.clone(),
                    tenant: a.tenant.clone(),
                    pack: a.pack.clone(),
                    detail: a.text.clone(),
                    at: a.at,
                };
                let _ = self.events.send(Event::Action(a));
                row
            }
            // Followed from the feedback table itself.
            Event::Feedback(_) => return,
            // Written by the decision that changed the row, in its
            // transaction (`Tx::announce`): a store shared by replicas
            // announces every change it decides.
            Event::Delivery(_) => return,
            Event::Agent(a) => EventRow {
                id: 0,
                replica: replica.clone(),
                kind: match a.kind {
                    AgentEventKind::Connected => EventKind::Connected,
                    AgentEventKind::Disconnected => EventKind::Disconnected,
                    AgentEventKind::Clock => EventKind::Clock,
                    AgentEventKind::Conflict => EventKind::Conflict,
                },
                agent_id: a.agent_id,
                tenant: String::new(),
                pack: String::new(),
                detail: a.detail,
                at: a.at,
            },
        };
        if let Some(relay) = &self.relay
            && relay.try_send(row).is_err()
        {
            self.metrics.relay_dropped(1);
        }
    }

    /// Tell the other replicas' streams that the release these agents
    /// (`None`: any agent) are to be offered changed; this replica's
    /// streams are told by the caller.
    pub(crate) fn announce_release_change(&self, agents: Option<&[String]>) {
        let (Some(replica), Some(relay)) = (&self.replica, &self.relay) else {
            return;
        };
        let ids: Vec<String> = match agents {
            Some(ids) => ids.to_vec(),
            None => vec![String::new()],
        };
        for agent_id in ids {
            let row = EventRow {
                id: 0,
                replica: replica.clone(),
                kind: EventKind::Release,
                agent_id,
                tenant: String::new(),
                pack: String::new(),
                detail: String::new(),
                at: now(),
            };
            if relay.try_send(row).is_err() {
                self.metrics.relay_dropped(1);
            }
        }
    }

    /// Tell this process's watchers only (what [`follow`] read).
    pub(crate) fn broadcast(&self, e: Event) {
        let _ = self.events.send(e);
    }

    /// The receiving end of the relay (once).
    pub(crate) fn take_relay(&self) -> Option<mpsc::Receiver<EventRow>> {
        self.relay_rx
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }

    /// Whether anyone watches.
    pub fn watched(&self) -> bool {
        self.events.receiver_count() > 0
    }

    /// A delivery row was written: counted, and shown to watchers.
    pub fn row_changed(&self, r: &DeliveryRow) {
        self.metrics.delivery(r.state);
        // The other replicas' streams and watchers are told whether or not
        // anyone watches here.
        if self.watched() || self.replica.is_some() {
            self.publish(Event::Delivery(self.decorate(r.clone())));
        }
    }

    /// A new watcher's receiver.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    /// Delivery rows changed by a decision: watchers see them, and each
    /// agent's stream acts on its own (with `pack` for the pushes it
    /// makes, so a push to a thousand agents reads the pack once).
    pub fn delivered(&self, rows: &[DeliveryRow], pack: Option<&Arc<PackText>>) {
        let mut by_agent: HashMap<&str, Vec<DeliveryRow>> = HashMap::new();
        for r in rows {
            self.row_changed(r);
            by_agent.entry(&r.agent_id).or_default().push(r.clone());
        }
        for (agent, rows) in by_agent {
            self.hub.send(
                agent,
                SessionCmd::Rows {
                    rows,
                    pack: pack.cloned(),
                },
            );
        }
    }

    /// A pending row's reason as an operator reads it: why it is still
    /// pending when the planner left no reason.
    pub fn decorate(&self, mut r: DeliveryRow) -> DeliveryRow {
        if r.state == DeliveryState::Pending && r.reason.is_empty() {
            r.reason = if self.hub.is_connected(&r.agent_id) {
                "sent, waiting for the agent".into()
            } else if self.replica.is_some() {
                // Its stream may be another replica's: not known here.
                "waiting for the agent (not connected to this replica)".into()
            } else {
                "agent not connected".into()
            };
        }
        r
    }

    /// Record start lateness of executed entries of `agent`.
    pub fn record_lateness(&self, agent: &str, lateness_ns: impl Iterator<Item = i64>) {
        let mut l = self.lateness.lock().unwrap_or_else(|p| p.into_inner());
        let r = match l.get_mut(agent) {
            Some(r) => r,
            None => l.entry(agent.to_string()).or_default(),
        };
        for ns in lateness_ns {
            r.push(ns);
        }
    }

    /// Start lateness p99 of an agent's latest executions on its current
    /// stream (zero: none).
    pub fn lateness_p99(&self, agent: &str) -> SignedDuration {
        let l = self.lateness.lock().unwrap_or_else(|p| p.into_inner());
        time::span(l.get(agent).map_or(0, Recent::p99))
    }

    /// What changes when the controller works: feedback batches stored,
    /// pushes sent, streams open (see [`heap`]).
    pub fn activity(&self) -> (u64, u64, usize) {
        let (batches, pushes) = self.metrics.activity();
        (batches, pushes, self.hub.connected())
    }

    /// Change what `agent`'s stream measured of its health.
    fn measure(&self, agent: &str, f: impl FnOnce(&mut Measured)) {
        let mut m = self.health.lock().unwrap_or_else(|p| p.into_inner());
        match m.get_mut(agent) {
            Some(h) => f(h),
            None => f(m.entry(agent.to_string()).or_default()),
        }
    }

    /// An agent's outbox backlog as it reported it at `at`.
    pub fn record_outbox(&self, agent: &str, entries: u64, at: RefTime) {
        self.measure(agent, |m| m.outbox(entries, at));
    }

    /// An agent reported a firing skipped as late; heard at `at`.
    pub fn record_late(&self, agent: &str, at: RefTime) {
        self.measure(agent, |m| m.late(at));
    }

    /// The backlog an agent streaming here last reported: (entries, when).
    pub fn outbox_of(&self, agent: &str) -> Option<(u64, RefTime)> {
        self.measured(agent).outbox
    }

    /// What `agent`'s stream here measured of it (nothing: default).
    pub fn measured(&self, agent: &str) -> Measured {
        self.health
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(agent)
            .copied()
            .unwrap_or_default()
    }

    /// An agent's stream ended for good (not replaced): what the
    /// controller held in memory for it goes.
    pub fn agent_gone(&self, agent: &str) {
        self.lateness
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(agent);
        self.health
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(agent);
        self.metrics.forget(agent);
    }
}

impl App {
    /// The exposition: the counters, and the store's deliveries by state
    /// (left out, and logged, when the store cannot say).
    pub async fn metrics_text(&self) -> String {
        let deliveries = match self.store.delivery_counts().await {
            Ok(d) => Some(d),
            Err(e) => {
                tracing::warn!("metrics: deliveries by state: {e}");
                None
            }
        };
        self.metrics
            .render(self.hub.connected(), deliveries.as_deref())
    }
}
