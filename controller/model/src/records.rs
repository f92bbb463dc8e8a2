//! The controller's records: what the store keeps and the planner, the
//! application and the transports speak about. Plain data with the rules
//! that belong to the data itself (label precedence, target matching); no
//! IO, no wire types except the typed feedback enums shared with agents.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use baton_proto::wire;

use crate::gate::Gate;
use crate::time::{RefTime, SignedDuration};

/// A pack of a tenant: `(tenant, pack)`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PackKey {
    /// Tenant.
    pub tenant: String,
    /// Pack id.
    pub pack: String,
}

impl PackKey {
    /// `tenant/pack`.
    pub fn new(tenant: impl Into<String>, pack: impl Into<String>) -> PackKey {
        PackKey {
            tenant: tenant.into(),
            pack: pack.into(),
        }
    }
}

impl std::fmt::Display for PackKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.tenant, self.pack)
    }
}

/// A pack an agent holds, as it says.
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

impl HeldPackRow {
    /// The pack and what is held of it, as the planner takes them.
    pub fn keyed(&self) -> (PackKey, Held) {
        (
            PackKey::new(&self.tenant, &self.pack),
            Held {
                version: self.version,
                stopped: self.stopped,
            },
        )
    }
}

/// An agent's clock report.
#[derive(Clone, Debug, PartialEq)]
pub struct ClockRow {
    /// `ptp`, `ntp`, `link`, `system`.
    pub source: String,
    /// `syncing`, `locked`, `holdover`, `free-running`.
    pub state: String,
    /// Offset from reference time.
    pub offset: SignedDuration,
    /// Jitter.
    pub jitter: SignedDuration,
    /// Uncertainty.
    pub uncertainty: SignedDuration,
    /// Frequency correction, ppm.
    pub frequency_ppm: f64,
    /// When the agent measured it.
    pub at: RefTime,
}

/// One tenant's operator labels on an agent: `Some(v)` sets the key (over
/// the agent's own value), `None` hides the agent's own key.
pub type LabelOverrides = BTreeMap<String, Option<String>>;

/// An agent as the controller knows it.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentRow {
    /// Agent id (its certificate's name under mTLS).
    pub id: String,
    /// Labels from its hello.
    pub labels: BTreeMap<String, String>,
    /// Agent software version.
    pub agent_version: String,
    /// Its journal's id (feedback sequence numbers count within it).
    pub journal_id: String,
    /// A stream was open at the last word from it.
    pub connected: bool,
    /// Last message received.
    pub last_seen: RefTime,
    /// Its last clock report.
    pub clock: Option<ClockRow>,
    /// Operator labels, per tenant (set by that tenant's admins): they
    /// apply to that tenant's packs only. See [`AgentRow::labels_for`].
    pub overrides: BTreeMap<String, LabelOverrides>,
    /// The tenants it serves: from its certificate and from admins'
    /// grants. Only their packs may target it, only their operators see
    /// it (on a controller that binds agents to tenants, see
    /// [`Binding`]).
    pub tenants: BTreeSet<String>,
    /// Its current stream's generation (0: it never said hello to a
    /// controller that fences): only writes from that stream are taken.
    pub session_gen: u64,
    /// The replica whose stream took its last hello (empty on a single
    /// controller).
    pub owner: String,
    /// Start lateness p99 of its recent executions, as its stream last
    /// wrote it (every few seconds): what other replicas show (zero:
    /// none yet).
    pub lateness_p99: SignedDuration,
    /// What its stream last measured of its health beside the clock.
    pub health: StreamHealth,
    /// What it checks packs against, as it last said (`None`: it has not
    /// said: an agent older than signed packs).
    pub trust: Option<TrustRow>,
    /// Its architecture as its hello said (empty: an agent older than
    /// updates, never offered a release).
    pub arch: String,
    /// Its last word on an agent update (`None`: none).
    pub update: Option<crate::UpdateRow>,
}

/// What an agent checks packs against, as it says (its hello, then each
/// change): an operator sees which boxes refuse unsigned packs, which
/// hold an old trust list, and which run nothing, and why.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TrustRow {
    /// A trust root is installed: packs are checked (otherwise nothing is,
    /// and the rest is empty).
    pub root: bool,
    /// The newest root-signed list it holds (0: none yet).
    pub list_version: u64,
    /// That list's expiry (ns since the epoch; 0: no list).
    pub list_expires_ns: i64,
    /// The tenants whose packs it requires signed.
    pub signed_tenants: Vec<String>,
    /// Why it takes no pack (and restores none at a restart), if so
    /// (empty otherwise).
    pub nothing_runs: String,
    /// The last list relayed to it that it refused, and why (empty:
    /// none).
    pub refused: String,
}

/// What the stream serving an agent measures of its health beside the
/// clock, written with its last-seen mark so that every replica's fleet
/// filter sees it ("unhealthy"): an outbox that only grows (feedback not
/// reaching the store) and firings skipped as later than their
/// instruction's `max_lateness`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamHealth {
    /// Feedback entries in the agent's outbox, not yet acknowledged, at
    /// its last report.
    pub outbox_entries: u64,
    /// The backlog rose report after report.
    pub outbox_growing: bool,
    /// A firing was skipped as late within the last minute.
    pub late_recently: bool,
}

impl StreamHealth {
    /// Anything to look at.
    pub fn needs_a_look(self) -> bool {
        self.outbox_growing || self.late_recently
    }
}

/// A stream's periodic mark of its agent.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SeenRow {
    /// A stream is open (`false`: the stream ended).
    pub connected: bool,
    /// When.
    pub at: RefTime,
    /// Start lateness p99 of its recent executions (`None`: leave it as
    /// stored).
    pub lateness_p99: Option<SignedDuration>,
    /// Its health as the stream measured it (`None`: leave it as stored;
    /// a stream that ended says nothing new of it).
    pub health: Option<StreamHealth>,
}

impl SeenRow {
    /// A stream that ended, at `at`: only the connection changes.
    pub fn ended(at: RefTime) -> SeenRow {
        SeenRow {
            connected: false,
            at,
            lateness_p99: None,
            health: None,
        }
    }
}

impl AgentRow {
    /// A new agent with no labels, clock, overrides or tenants.
    pub fn new(id: impl Into<String>, journal_id: impl Into<String>) -> AgentRow {
        AgentRow {
            id: id.into(),
            labels: BTreeMap::new(),
            agent_version: String::new(),
            journal_id: journal_id.into(),
            connected: false,
            last_seen: RefTime::from_nanos(0),
            clock: None,
            overrides: BTreeMap::new(),
            tenants: BTreeSet::new(),
            session_gen: 0,
            owner: String::new(),
            lateness_p99: SignedDuration::ZERO,
            health: StreamHealth::default(),
            trust: None,
            arch: String::new(),
            update: None,
        }
    }

    /// The labels the packs of `tenant` target on: the agent's own (its
    /// hello), with that tenant's operator labels applied over them.
    pub fn labels_for(&self, tenant: &str) -> Cow<'_, BTreeMap<String, String>> {
        let Some(o) = self.overrides.get(tenant).filter(|o| !o.is_empty()) else {
            return Cow::Borrowed(&self.labels);
        };
        let mut l = self.labels.clone();
        for (k, v) in o {
            match v {
                Some(v) => l.insert(k.clone(), v.clone()),
                None => l.remove(k),
            };
        }
        Cow::Owned(l)
    }

    /// The tenants with a stake in the agent: those it serves, those with
    /// labels on it, and those with a delivery row (of `rows`, its own)
    /// on it. Sorted.
    pub fn stakeholders(&self, rows: &[DeliveryRow]) -> Vec<String> {
        let t: BTreeSet<&String> = self
            .tenants
            .iter()
            .chain(rows.iter().map(|r| &r.tenant))
            .chain(self.overrides.keys())
            .collect();
        t.into_iter().cloned().collect()
    }

    /// Whether the packs of `tenant` may reach this agent at all.
    pub fn serves(&self, tenant: &str, binding: Binding) -> bool {
        match binding {
            Binding::Open => true,
            Binding::Tenants => self.tenants.contains(tenant),
        }
    }
}

/// Whether agents belong to tenants.
///
/// With mTLS every agent has an identity, and the tenants it serves come
/// from its certificate and from admins' grants: a pack reaches only its
/// tenant's agents, and an operator sees only those. A plaintext
/// controller (`--insecure`) has no identities to bind: every agent
/// serves every tenant, as before tenants existed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binding {
    /// Every agent serves every tenant.
    Open,
    /// An agent serves the tenants of its certificate and grants.
    Tenants,
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
    /// When it was pushed.
    pub pushed: RefTime,
    /// It has a `rollout:` section: storing it starts a rollout (the
    /// agents get it stage by stage), where a version without one goes to
    /// every target at once. Either ends a running rollout (superseded).
    pub rollout: bool,
}

impl PackVersionRow {
    /// Its pack.
    pub fn key(&self) -> PackKey {
        PackKey::new(&self.tenant, &self.pack)
    }
}

/// What the planner needs of a pack: its latest version and targets, and
/// whether it is withdrawn. No YAML: deciding who gets what never reads
/// a pack's text.
#[derive(Clone, Debug, PartialEq)]
pub struct PackTargets {
    /// Tenant.
    pub tenant: String,
    /// Pack id.
    pub pack: String,
    /// The latest version.
    pub latest: u64,
    /// The latest version's targets.
    pub targets: TargetsRow,
    /// When it was cancelled: nobody should hold it.
    pub cancelled: Option<RefTime>,
    /// A rollout's say on who holds the latest (`None`: every target).
    pub gate: Option<Gate>,
    /// Agents an operator withdrew the pack from, each with the latest
    /// version at that moment: no version up to it is wanted there again
    /// (a rollout's `from` included), a newer push is. Kept per pack, not
    /// per row: a withdrawn agent's row may go, the stop must not.
    pub stopped: BTreeMap<String, u64>,
}

impl PackTargets {
    /// Whether an operator withdrew version `v` from agent `id`.
    pub fn stopped_at(&self, id: &str, v: u64) -> bool {
        self.stopped.get(id).is_some_and(|&through| v <= through)
    }
}

/// A pack as `packs` lists it: the latest version and how its deliveries
/// stand.
#[derive(Clone, Debug, PartialEq)]
pub struct PackSummaryRow {
    /// Tenant.
    pub tenant: String,
    /// Pack id.
    pub pack: String,
    /// The latest version.
    pub latest: u64,
    /// Its targets.
    pub targets: TargetsRow,
    /// When it was pushed.
    pub pushed: RefTime,
    /// When it was cancelled, if it was.
    pub cancelled: Option<RefTime>,
    /// Deliveries of the latest version by state.
    pub acked: u32,
    /// Refused for good.
    pub nacked: u32,
    /// Not yet acknowledged.
    pub pending: u32,
    /// Agents holding a version the store does not know (newer than the
    /// latest: a store restored from an older backup).
    pub ahead: u32,
}

/// What the store's `put_pack` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PutPack {
    /// A new version was stored (a cancelled pack is live again).
    Stored,
    /// This exact version and content was stored already.
    Unchanged,
}

/// What the controller wants of an agent for one pack.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Intent {
    /// Hold the row's version.
    Hold,
    /// Do not hold the pack (cancelled, or no longer targeted): the row's
    /// version is the one withdrawn.
    Withdraw,
    /// The controller has no say: a pack the agent reports holding that
    /// the store does not know (loaded from the agent's own files).
    Local,
}

impl Intent {
    /// Stored word.
    pub fn as_str(self) -> &'static str {
        match self {
            Intent::Hold => "hold",
            Intent::Withdraw => "withdraw",
            Intent::Local => "local",
        }
    }

    /// From the stored word.
    pub fn parse(s: &str) -> Option<Intent> {
        Some(match s {
            "hold" => Intent::Hold,
            "withdraw" => Intent::Withdraw,
            "local" => Intent::Local,
            _ => return None,
        })
    }
}

/// Where one pack stands on one agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeliveryState {
    /// Not yet acknowledged (agent offline, in flight, or retrying).
    Pending,
    /// The agent holds the wanted version.
    Acked,
    /// The agent refused it for good, or holds a newer version than the
    /// wanted one (it would refuse it).
    Nacked,
    /// Withdrawn by a cancel or a change of targets.
    Cancelled,
    /// A pack of the agent's own (the controller has no say).
    Local,
}

impl DeliveryState {
    /// Stored word.
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryState::Pending => "pending",
            DeliveryState::Acked => "acked",
            DeliveryState::Nacked => "nacked",
            DeliveryState::Cancelled => "cancelled",
            DeliveryState::Local => "local",
        }
    }

    /// From the stored word.
    pub fn parse(s: &str) -> Option<DeliveryState> {
        Some(match s {
            "pending" => DeliveryState::Pending,
            "acked" => DeliveryState::Acked,
            "nacked" => DeliveryState::Nacked,
            "cancelled" => DeliveryState::Cancelled,
            "local" => DeliveryState::Local,
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

/// The agent's last refusal of a version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The version refused.
    pub version: u64,
    /// `false`: refused for now (capacity, clock, disk), retried.
    pub last: bool,
    /// Its message.
    pub message: String,
    /// Validation errors (positions in the YAML).
    pub errors: Vec<ErrorRow>,
}

/// What an agent said of a pushed version.
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
    /// It holds the version now.
    Acked,
    /// It staged the version, to switch at this instant (the epoch: none
    /// named).
    Staged(RefTime),
    /// It refused the version (`last`: for good; else retried later).
    Refused(Refusal),
}

/// The version an agent reports holding, and whether it is stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Held {
    /// Version.
    pub version: u64,
    /// Stopped in its safe state.
    pub stopped: bool,
}

/// The desired state of one pack on one agent and how far it got: one row
/// per (agent, tenant, pack), written when the decision or the agent's
/// answer changes. The planner alone computes `intent`, `version`,
/// `state` and `reason` (see the `planner` module).
#[derive(Clone, Debug, PartialEq)]
pub struct DeliveryRow {
    /// Agent.
    pub agent_id: String,
    /// Tenant.
    pub tenant: String,
    /// Pack id.
    pub pack: String,
    /// The version this row is about: the one wanted, withdrawn, or (for
    /// a local pack) held.
    pub version: u64,
    /// What the controller wants.
    pub intent: Intent,
    /// What the agent last said it holds.
    pub held: Option<Held>,
    /// Its last refusal, while it concerns `version`.
    pub refusal: Option<Refusal>,
    /// Derived from the above by the planner.
    pub state: DeliveryState,
    /// Why pending or nacked, in words (derived).
    pub reason: String,
    /// Times the wanted version was sent.
    pub attempts: u32,
    /// Last change.
    pub updated: RefTime,
    /// When the agent is to run `version` (a rollout with `activate:
    /// together`), as the planner decides it.
    pub activate: Activation,
    /// What the agent said it staged of `version` (see [`Answer::Staged`]);
    /// cleared by its next hello (a restart drops staged copies).
    pub staged: Option<StagedRow>,
}

/// When an agent runs the version it is sent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Activation {
    /// As soon as it takes it.
    #[default]
    OnArrival,
    /// Staged: it keeps the version aside until an instant is named.
    Staged,
    /// Staged, switching at this instant.
    At(RefTime),
}

impl Activation {
    /// Its stored form: NULL, 0 (staged), the instant.
    pub fn to_db(self) -> Option<i64> {
        match self {
            Activation::OnArrival => None,
            Activation::Staged => Some(0),
            Activation::At(t) => Some(t.as_nanos()),
        }
    }

    /// From [`Activation::to_db`].
    pub fn from_db(v: Option<i64>) -> Activation {
        match v {
            None => Activation::OnArrival,
            Some(t) if t > 0 => Activation::At(RefTime::from_nanos(t)),
            Some(_) => Activation::Staged,
        }
    }
}

/// A version an agent keeps staged, and the instant it switches at (0:
/// none named yet).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StagedRow {
    /// The version.
    pub version: u64,
    /// Its instant, the epoch (0) when none was named.
    pub at: RefTime,
}

impl DeliveryRow {
    /// Its pack.
    pub fn key(&self) -> PackKey {
        PackKey::new(&self.tenant, &self.pack)
    }

    /// Validation errors of the refusal that made it nacked (none else).
    pub fn errors(&self) -> &[ErrorRow] {
        match (&self.refusal, self.state) {
            (Some(r), DeliveryState::Nacked | DeliveryState::Pending)
                if r.version == self.version =>
            {
                &r.errors
            }
            _ => &[],
        }
    }
}

/// One feedback entry, as stored: the typed record the agent sent, with
/// who sent it and when it was stored.
#[derive(Clone, Debug, PartialEq)]
pub struct FeedbackRow {
    /// Storage order, assigned by the store (0 before it is stored).
    pub id: u64,
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
    /// The occurrence it is about, if any.
    pub occurrence: Option<RefTime>,
    /// Attempt number (0 when not an attempt).
    pub attempt: u32,
    /// Scheduled instant.
    pub scheduled: RefTime,
    /// Actual instant.
    pub actual: RefTime,
    /// Start lateness.
    pub lateness: SignedDuration,
    /// What became of it.
    pub outcome: wire::Outcome,
    /// Why (skipped: why not run; safe state: its trigger).
    pub reason: wire::Reason,
    /// The agent's word for the entry (`executed`, `retry`, ...).
    pub event: String,
    /// Action, for executed entries.
    pub action: String,
    /// Free text.
    pub detail: String,
    /// `gpio.read` value.
    pub value: Option<u32>,
    /// Entries the agent dropped just before this one (outbox full).
    pub dropped_before: u64,
    /// Clock uncertainty at firing.
    pub uncertainty: SignedDuration,
    /// The agent's clock source when it was taken.
    pub clock_source: wire::ClockSource,
    /// Its state.
    pub clock_state: wire::ClockState,
    /// When the controller stored it.
    pub received: RefTime,
}

/// What the store's `put_feedback` did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FeedbackStored {
    /// Rows stored now.
    pub inserted: usize,
    /// Rows already stored (a re-send after a lost ack), or at or below
    /// the journal's acked seq: not stored again.
    pub duplicates: usize,
    /// The highest seq stored for the journal now.
    pub acked_seq: u64,
}

/// One audited operator action.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditRow {
    /// When.
    pub at: RefTime,
    /// The operator's name (certificate), `insecure`, or `ca`.
    pub who: String,
    /// The tenant it acted in.
    pub tenant: String,
    /// Its role.
    pub role: String,
    /// `push`, `cancel`, `label`, `forget`, `grant`, `revoke`.
    pub action: String,
    /// What it acted on.
    pub target: String,
    /// `ok`, or why it was refused.
    pub result: String,
}

/// What an [`EventRow`] says happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// A delivery row changed (read it for its state).
    Delivery,
    /// An agent's stream opened.
    Connected,
    /// An agent's stream ended.
    Disconnected,
    /// An agent reported its clock (read the agent for it).
    Clock,
    /// A second machine tried an agent's id, or its feedback was lost.
    Conflict,
    /// An operator acted on a pack or an agent (`detail`: what, in words),
    /// for the other replicas' open pages.
    Action,
    /// The release an agent is to be offered changed (an update admitted
    /// it, or was withdrawn; an empty agent: any agent): its stream reads
    /// it again.
    Release,
}

impl EventKind {
    /// Its word in the store.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Delivery => "delivery",
            EventKind::Connected => "connected",
            EventKind::Disconnected => "disconnected",
            EventKind::Clock => "clock",
            EventKind::Conflict => "conflict",
            EventKind::Action => "action",
            EventKind::Release => "release",
        }
    }

    /// The kind a stored word names.
    pub fn parse(s: &str) -> Option<EventKind> {
        Some(match s {
            "delivery" => EventKind::Delivery,
            "connected" => EventKind::Connected,
            "disconnected" => EventKind::Disconnected,
            "clock" => EventKind::Clock,
            "conflict" => EventKind::Conflict,
            "action" => EventKind::Action,
            "release" => EventKind::Release,
            _ => return None,
        })
    }
}

/// Something one replica tells the others (sessions and watchers there),
/// through the store: a pointer to the state that changed, not a copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventRow {
    /// Store-assigned (0 before it is stored); with replicas writing in
    /// parallel, not in commit order: followers read by [`crate::Mark`].
    pub id: u64,
    /// The replica it happened on.
    pub replica: String,
    /// What.
    pub kind: EventKind,
    /// The agent.
    pub agent_id: String,
    /// The delivery's tenant and pack (empty for an agent's events).
    pub tenant: String,
    /// See `tenant`.
    pub pack: String,
    /// In words.
    pub detail: String,
    /// When.
    pub at: RefTime,
}

/// A revoked certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RevocationRow {
    /// Its serial (hex, as `ca` lists it).
    pub serial: String,
    /// `agent`, `operator`, or empty when the list did not say.
    pub kind: String,
    /// The agent or operator name, or empty.
    pub name: String,
    /// When the first replica picked it up.
    pub at: RefTime,
}

/// One line of the CA's revocation list (`revoked.txt`: `SERIAL KIND
/// NAME`; kind and name empty when the line has only a serial).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RevokedEntry {
    /// Serial, lowercase hex.
    pub serial: String,
    /// `agent` or `operator`.
    pub kind: String,
    /// The certificate's name.
    pub name: String,
}
