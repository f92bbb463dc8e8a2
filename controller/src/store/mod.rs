//! The controller's durable state behind one interface.
//!
//! Everything the controller must not forget lives here: agents (labels,
//! last seen, clock), packs and all their versions, deliveries per agent
//! and version (the desired state and how far it got), and all feedback.
//! The server never keeps the only copy of anything in memory: a pushed
//! pack is stored before the operator gets an answer, and feedback is
//! stored before it is acknowledged to the agent.
//!
//! [`sqlite::SqliteStore`] is the embedded default. The schema and queries
//! are plain SQL that also runs on PostgreSQL (BIGINT, TEXT, DOUBLE
//! PRECISION, `ON CONFLICT`), so a later backend for controller replicas
//! is another impl of [`Store`], not another design.

mod migrations;
pub mod sqlite;

use std::borrow::Cow;
use std::collections::BTreeMap;

use async_trait::async_trait;

/// What a store operation can fail with.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// This version is stored already, with other content.
    #[error(
        "{tenant}/{pack} v{version} is already stored with different content; push a higher version"
    )]
    VersionTaken {
        /// Tenant.
        tenant: String,
        /// Pack id.
        pack: String,
        /// The version pushed.
        version: u64,
    },
    /// A higher version is stored.
    #[error("{tenant}/{pack} v{version} is older than the stored v{latest}")]
    VersionOlder {
        /// Tenant.
        tenant: String,
        /// Pack id.
        pack: String,
        /// The version pushed.
        version: u64,
        /// The newest stored.
        latest: u64,
    },
    /// No such pack.
    #[error("no pack {tenant}/{pack}")]
    NoSuchPack {
        /// Tenant.
        tenant: String,
        /// Pack id.
        pack: String,
    },
    /// No such agent (it never said hello, or was forgotten).
    #[error("no agent {id}")]
    NoSuchAgent {
        /// Agent id.
        id: String,
    },
    /// The database refused or failed (disk full, corrupt file, ...).
    #[error("store: {0}")]
    Backend(String),
    /// The store's writer has stopped (the controller is shutting down, or
    /// an earlier write failed and the store refuses to go on).
    #[error("store is closed")]
    Closed,
}

/// Shorthand.
pub type StoreResult<T> = Result<T, StoreError>;

/// A pack an agent holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldPackRow {
    /// Tenant.
    pub tenant: String,
    /// Pack id.
    pub pack: String,
    /// Version held.
    pub version: u64,
    /// Stopped in its safe state (cancelled, given up, lease lost).
    pub stopped: bool,
}

/// An agent's last clock report.
#[derive(Clone, Debug, PartialEq)]
pub struct ClockRow {
    /// `ptp`, `ntp`, `link`, `system`.
    pub source: String,
    /// `syncing`, `locked`, `holdover`, `free-running`.
    pub state: String,
    /// Offset from reference time, ns.
    pub offset_ns: i64,
    /// Jitter, ns.
    pub jitter_ns: i64,
    /// Uncertainty, ns.
    pub uncertainty_ns: i64,
    /// Frequency correction, ppm.
    pub frequency_ppm: f64,
    /// When the agent measured it (ns since the epoch).
    pub at_ns: i64,
}

/// An agent as the controller knows it.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentRow {
    /// Agent id (its identity; the certificate's name once TLS lands).
    pub id: String,
    /// Labels from its hello (targets match on them).
    pub labels: BTreeMap<String, String>,
    /// Agent software version.
    pub agent_version: String,
    /// Its journal's id (feedback sequence numbers count within it).
    pub journal_id: String,
    /// A stream is open now.
    pub connected: bool,
    /// Last message received (ns since the epoch).
    pub last_seen_ns: i64,
    /// Packs it holds, as it last said.
    pub held: Vec<HeldPackRow>,
    /// Its last clock report.
    pub clock: Option<ClockRow>,
    /// Operator labels, per tenant (set by that tenant's admins): they
    /// apply to that tenant's packs only. See [`AgentRow::labels_for`].
    pub overrides: BTreeMap<String, LabelOverrides>,
}

/// One tenant's operator labels on an agent: `Some(v)` sets the key (over
/// the agent's own value), `None` hides the agent's own key.
pub type LabelOverrides = BTreeMap<String, Option<String>>;

/// The labels the packs of `tenant` target on: `own` (an agent's hello
/// labels) with that tenant's operator labels applied over them.
pub fn labels_for<'a>(
    own: &'a BTreeMap<String, String>,
    overrides: &BTreeMap<String, LabelOverrides>,
    tenant: &str,
) -> Cow<'a, BTreeMap<String, String>> {
    let Some(o) = overrides.get(tenant).filter(|o| !o.is_empty()) else {
        return Cow::Borrowed(own);
    };
    let mut l = own.clone();
    for (k, v) in o {
        match v {
            Some(v) => l.insert(k.clone(), v.clone()),
            None => l.remove(k),
        };
    }
    Cow::Owned(l)
}

impl AgentRow {
    /// The labels the packs of `tenant` target on: the agent's own (its
    /// hello), with that tenant's operator labels applied over them.
    pub fn labels_for(&self, tenant: &str) -> Cow<'_, BTreeMap<String, String>> {
        labels_for(&self.labels, &self.overrides, tenant)
    }

    /// Whether this pack version targets the agent (its id, or the labels
    /// its tenant sees).
    pub fn targeted_by(&self, pack: &PackVersionRow) -> bool {
        pack.targets
            .matches(&self.id, &self.labels_for(&pack.tenant))
    }
}

/// Which agents a pack is for, as stored.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum TargetsRow {
    /// No `targets`: nobody (the pack is stored but delivered to no agent).
    #[default]
    Nobody,
    /// These agent ids.
    Agents(Vec<String>),
    /// Every agent carrying all these labels.
    Labels(BTreeMap<String, String>),
}

impl TargetsRow {
    /// Whether an agent with this id and these labels is targeted.
    pub fn matches(&self, id: &str, labels: &BTreeMap<String, String>) -> bool {
        match self {
            TargetsRow::Nobody => false,
            TargetsRow::Agents(ids) => ids.iter().any(|a| a == id),
            TargetsRow::Labels(want) => want.iter().all(|(k, v)| labels.get(k) == Some(v)),
        }
    }
}

impl std::fmt::Display for TargetsRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TargetsRow::Nobody => f.write_str("none"),
            TargetsRow::Agents(ids) => write!(f, "agents: {}", ids.join(", ")),
            TargetsRow::Labels(l) => {
                let kv: Vec<String> = l.iter().map(|(k, v)| format!("{k}={v}")).collect();
                write!(f, "labels: {}", kv.join(", "))
            }
        }
    }
}

/// One stored pack version.
#[derive(Clone, Debug, PartialEq)]
pub struct PackVersionRow {
    /// Tenant.
    pub tenant: String,
    /// Pack id.
    pub pack: String,
    /// Version.
    pub version: u64,
    /// The YAML source, as pushed.
    pub yaml: String,
    /// Its targets.
    pub targets: TargetsRow,
    /// When it was pushed (ns since the epoch).
    pub pushed_ns: i64,
}

/// A pack: its latest version, and whether it was withdrawn.
#[derive(Clone, Debug, PartialEq)]
pub struct PackRow {
    /// The latest version (with its YAML).
    pub latest: PackVersionRow,
    /// When it was cancelled, if it was (ns since the epoch).
    pub cancelled_ns: Option<i64>,
}

/// What [`Store::put_pack`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PutPack {
    /// A new version was stored (a cancelled pack is live again).
    Stored,
    /// This exact version and content was stored already.
    Unchanged,
}

/// Where one pack version stands on one agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeliveryState {
    /// Not yet acknowledged (agent offline, in flight, or retrying).
    Pending,
    /// The agent accepted it.
    Acked,
    /// The agent refused it (final).
    Nacked,
    /// Withdrawn by a cancel.
    Cancelled,
}

impl DeliveryState {
    /// Stored word.
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryState::Pending => "pending",
            DeliveryState::Acked => "acked",
            DeliveryState::Nacked => "nacked",
            DeliveryState::Cancelled => "cancelled",
        }
    }

    /// From the stored word.
    pub fn parse(s: &str) -> Option<DeliveryState> {
        Some(match s {
            "pending" => DeliveryState::Pending,
            "acked" => DeliveryState::Acked,
            "nacked" => DeliveryState::Nacked,
            "cancelled" => DeliveryState::Cancelled,
            _ => return None,
        })
    }
}

/// A validation error as the agent (or the controller) reported it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorRow {
    /// 1-based line (0: not positioned).
    pub line: u32,
    /// 1-based column.
    pub column: u32,
    /// Instruction id, if any.
    pub instruction: String,
    /// The message.
    pub message: String,
}

/// One pack version's delivery to one agent.
#[derive(Clone, Debug, PartialEq)]
pub struct DeliveryRow {
    /// Agent.
    pub agent_id: String,
    /// Tenant.
    pub tenant: String,
    /// Pack id.
    pub pack: String,
    /// Version.
    pub version: u64,
    /// State.
    pub state: DeliveryState,
    /// Why pending or nacked.
    pub reason: String,
    /// Validation errors of a nack.
    pub errors: Vec<ErrorRow>,
    /// Last change (ns since the epoch).
    pub updated_ns: i64,
    /// Times sent.
    pub attempts: u32,
}

/// One feedback entry, as stored.
#[derive(Clone, Debug, PartialEq)]
pub struct FeedbackRow {
    /// Agent that sent it.
    pub agent_id: String,
    /// Journal it was numbered in.
    pub journal_id: String,
    /// Sequence number within that journal.
    pub seq: u64,
    /// Execution id (empty for pack-wide events).
    pub execution_id: String,
    /// Tenant.
    pub tenant: String,
    /// Pack id.
    pub pack: String,
    /// Pack version.
    pub version: u64,
    /// Instruction id (empty for pack-wide events).
    pub instruction: String,
    /// Attempt number (0 when not an attempt).
    pub attempt: u32,
    /// Scheduled instant, ns since the epoch.
    pub scheduled_ns: i64,
    /// Actual instant, ns since the epoch.
    pub actual_ns: i64,
    /// Start lateness, ns.
    pub lateness_ns: i64,
    /// `ok`, `failed`, `retry`, `give_up`, `skipped`, `unknown`, `safe_state`.
    pub outcome: String,
    /// The agent's word for the entry (`executed`, `retry`, ...).
    pub event: String,
    /// Action, for executed entries.
    pub action: String,
    /// Free text.
    pub detail: String,
    /// `gpio.read` value.
    pub value: Option<u32>,
    /// Entries the agent dropped before this one (outbox full).
    pub dropped_before: u64,
    /// Clock uncertainty at firing, ns.
    pub uncertainty_ns: i64,
    /// When the controller stored it (ns since the epoch).
    pub received_ns: i64,
}

/// What [`Store::put_feedback`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FeedbackStored {
    /// Rows stored now.
    pub inserted: usize,
    /// Rows already stored (a re-send after a lost ack): not stored again.
    pub duplicates: usize,
}

/// Which stored feedback to read. Results are in storage order (the order
/// entries were stored), which for one agent is its sequence order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FeedbackFilter {
    /// Only this tenant.
    pub tenant: Option<String>,
    /// Only this pack.
    pub pack: Option<String>,
    /// Only this agent.
    pub agent_id: Option<String>,
    /// Stored at or after (ns since the epoch).
    pub since_ns: Option<i64>,
    /// At most this many.
    pub limit: Option<u32>,
}

/// One audited operator action.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditRow {
    /// When (ns since the epoch).
    pub at_ns: i64,
    /// The operator's name (certificate), `insecure`, or `ca`.
    pub who: String,
    /// The tenant it acted in.
    pub tenant: String,
    /// Its role.
    pub role: String,
    /// `push`, `cancel`, `label`, `forget`, `revoke`.
    pub action: String,
    /// What it acted on.
    pub target: String,
    /// `ok`, or why it was refused.
    pub result: String,
}

/// The controller's durable state. Every method is a complete, atomic
/// operation: when it returns `Ok`, the change survives `kill -9` of the
/// controller.
#[async_trait]
pub trait Store: Send + Sync + std::fmt::Debug + 'static {
    /// An agent said hello: create or update it (labels, version, journal,
    /// held packs), connected, seen now.
    async fn agent_hello(&self, agent: AgentRow) -> StoreResult<()>;
    /// Connection state and last-seen instant.
    async fn agent_seen(&self, id: &str, connected: bool, at_ns: i64) -> StoreResult<()>;
    /// The packs an agent holds changed.
    async fn agent_held(&self, id: &str, held: Vec<HeldPackRow>) -> StoreResult<()>;
    /// At start-up: nobody is connected to a controller that just started.
    async fn all_disconnected(&self, at_ns: i64) -> StoreResult<()>;
    /// Store a clock report: the agent's latest, and its history.
    async fn record_clock(&self, id: &str, clock: ClockRow) -> StoreResult<()>;
    /// Clock history of one agent, oldest first.
    async fn clock_history(&self, id: &str, since_ns: i64) -> StoreResult<Vec<ClockRow>>;
    /// Every agent, by id.
    async fn agents(&self) -> StoreResult<Vec<AgentRow>>;
    /// One agent.
    async fn agent(&self, id: &str) -> StoreResult<Option<AgentRow>>;
    /// Change one tenant's operator labels on an agent: `set` (a value, or
    /// `None` to hide the agent's own key), then `reset` (forget the
    /// tenant's say on these keys). Returns the agent as it is now;
    /// [`StoreError::NoSuchAgent`] when it is not known.
    async fn label_agent(
        &self,
        id: &str,
        tenant: &str,
        set: LabelOverrides,
        reset: Vec<String>,
    ) -> StoreResult<AgentRow>;
    /// Forget an agent. With a tenant: only that tenant's deliveries to it
    /// and labels on it. Without: everything of it (its record, clock
    /// history, deliveries, labels); its feedback stays. Whether its
    /// record existed.
    async fn forget_agent(&self, id: &str, tenant: Option<&str>) -> StoreResult<bool>;

    /// Store a pack version. Refused when the version is lower than the
    /// newest stored, or equal with other YAML. Pushing a version of a
    /// cancelled pack makes it live again.
    async fn put_pack(&self, pack: PackVersionRow) -> StoreResult<PutPack>;
    /// Withdraw a pack (its latest version); its pending and acked
    /// deliveries become cancelled. Returns the pack as it is now.
    async fn cancel_pack(&self, tenant: &str, pack: &str, at_ns: i64) -> StoreResult<PackRow>;
    /// The latest version of every pack (of one tenant, or all), cancelled
    /// ones included, by tenant then id.
    async fn packs(&self, tenant: Option<&str>) -> StoreResult<Vec<PackRow>>;
    /// One version of a pack (`None`: the latest).
    async fn pack_version(
        &self,
        tenant: &str,
        pack: &str,
        version: Option<u64>,
    ) -> StoreResult<Option<PackVersionRow>>;

    /// Create or replace the delivery of (agent, tenant, pack, version).
    async fn put_delivery(&self, delivery: DeliveryRow) -> StoreResult<()>;
    /// How many deliveries are stored in each state (for `/metrics`; a
    /// state with none is left out).
    async fn delivery_counts(&self) -> StoreResult<Vec<(DeliveryState, u64)>>;
    /// Deliveries of one pack version, by agent.
    async fn deliveries_of_pack(
        &self,
        tenant: &str,
        pack: &str,
        version: u64,
    ) -> StoreResult<Vec<DeliveryRow>>;
    /// Deliveries to one agent (every pack, every version).
    async fn deliveries_of_agent(&self, agent_id: &str) -> StoreResult<Vec<DeliveryRow>>;

    /// Store feedback, once: rows whose (agent, journal, seq) is stored
    /// already are counted as duplicates and left as they are.
    async fn put_feedback(&self, rows: Vec<FeedbackRow>) -> StoreResult<FeedbackStored>;
    /// Highest seq stored for this agent and journal (0: none).
    async fn feedback_acked(&self, agent_id: &str, journal_id: &str) -> StoreResult<u64>;
    /// Stored feedback.
    async fn feedback(&self, filter: FeedbackFilter) -> StoreResult<Vec<FeedbackRow>>;

    /// Record an operator action (stored before the action's answer).
    async fn put_audit(&self, row: AuditRow) -> StoreResult<()>;
    /// Audit records at or after `since_ns` (of one tenant, or all), oldest
    /// first; with a limit, the newest `limit` of them.
    async fn audit(
        &self,
        tenant: Option<&str>,
        since_ns: i64,
        limit: Option<u32>,
    ) -> StoreResult<Vec<AuditRow>>;
}
