//! The controller's durable state behind one interface.
//!
//! Everything the controller must not forget lives here: agents (labels,
//! tenants, last seen, clock), packs and all their versions, the desired
//! state per (agent, pack) and how far it got, feedback, clock history and
//! the audit log. The server never keeps the only copy of anything in
//! memory: a pushed pack is stored before the operator gets an answer, and
//! feedback is stored before it is acknowledged to the agent.
//!
//! Three implementations pass one contract suite (`contract.rs`, run by
//! each backend's tests): [`sqlite::SqliteStore`], the embedded default,
//! [`postgres::PgStore`], and [`memory::MemoryStore`], for unit tests of
//! the layers above (on tokio's paused time). The two SQL engines share
//! their SQL ([`sql`]) and their writer thread (`writer`); ids and
//! sequence numbers come from the database.
//!
//! **Decisions are store commands.** What each agent should hold is
//! decided by [`baton_model::planner`], but run by the store, inside its own
//! serialization point (the writer's transaction), for exactly the (agent,
//! pack) pairs a change can affect: a push, a cancel, a hello, a label
//! change, a grant, an agent's answer. So two decisions racing (a push
//! and a hello, a cancel and an ack) never overwrite each other: the later
//! one sees the earlier one's rows. Each returns the rows it changed, for
//! the sessions to act on and the watchers to see.

#![forbid(unsafe_code)]

pub mod memory;

#[cfg(any(test, feature = "contract"))]
pub mod contract;

use async_trait::async_trait;

pub use baton_model::*;

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
    /// The write came from a stream that no longer owns the agent: a later
    /// hello (on this replica or another) raised its session generation.
    /// The stream must end; the agent is served by the newer one.
    #[error(
        "agent {agent}: stream generation {session} no longer owns it (generation {current} does)"
    )]
    Fenced {
        /// Agent id.
        agent: String,
        /// The writing stream's generation.
        session: u64,
        /// The agent's generation now.
        current: u64,
    },
    /// The agent's id is connected to another live replica from another
    /// journal: two machines under one identity (as the hub sees within
    /// one replica). Refused until that stream ends.
    #[error(
        "agent id {agent} is connected to replica {replica} from another journal ({holder_journal}): two machines under one identity; this stream (journal {journal}) is refused"
    )]
    IdInUse {
        /// Agent id.
        agent: String,
        /// The refused hello's journal.
        journal: String,
        /// The connected stream's journal.
        holder_journal: String,
        /// The replica holding it.
        replica: String,
    },
    /// This replica's lease ran out (it was paused, or cut off from the
    /// database, for longer than the lease): it may write nothing more.
    #[error("this replica's lease is lost: {0}")]
    LeaseLost(String),
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

/// The controller's durable state. Every method is a complete, atomic
/// operation: when it returns `Ok`, the change survives `kill -9` of the
/// controller. Methods that decide (hello, labels, grants, `reconcile_pack`,
/// `cancel_pack`, `agent_held`, `answer`) run [`baton_model::planner::plan`]
/// under the [`Binding`] the store was opened with, inside the store's
/// serialization point, and return the delivery rows they changed.
#[async_trait]
pub trait Store: Send + Sync + std::fmt::Debug + 'static {
    // ---- agents

    /// An agent said hello: create or update it (labels, version, journal,
    /// certificate tenants), connected, seen now, owned by this replica
    /// under a new session generation (above the stored one and the
    /// agent's `session_gen_seen`); its held packs recorded and every pack
    /// of its tenants planned for it. Returns the agent (with its new
    /// generation) and all its delivery rows.
    ///
    /// **Fencing.** Every write a stream makes for its agent afterwards
    /// (`agent_seen`, `record_clock`, `agent_held`, `answer`,
    /// `put_feedback`) names that generation and is refused with
    /// [`StoreError::Fenced`], in the same transaction, once a later hello
    /// raised it: a stream that lost its agent to another (on this
    /// replica or another one) can change nothing of it.
    async fn agent_hello(&self, hello: HelloRow) -> StoreResult<(AgentRow, Vec<DeliveryRow>)>;
    /// Connection state and last-seen instant, from the stream of
    /// generation `session`, with the start lateness p99 of its recent
    /// executions as that stream measures it (`None`: leave it), for the
    /// other replicas to show. An agent that never said hello is an error
    /// ([`StoreError::Backend`]): nothing is created.
    async fn agent_seen(
        &self,
        id: &str,
        session: u64,
        connected: bool,
        at_ns: i64,
        lateness_p99_ns: Option<i64>,
    ) -> StoreResult<()>;
    /// At start-up: the agents whose stream no live replica holds (on a
    /// single controller, every agent) are not connected.
    async fn all_disconnected(&self) -> StoreResult<()>;
    /// Store a clock report from the stream of generation `session`: the
    /// agent's latest (unless a report as new or newer is stored), and its
    /// history. Idempotent on the report's `at_ns`: a re-sent report
    /// changes nothing. An agent that never said hello is an error
    /// ([`StoreError::Backend`]).
    async fn record_clock(&self, id: &str, session: u64, clock: ClockRow) -> StoreResult<()>;
    /// Clock history of one agent at or after `since_ns`, oldest first;
    /// the newest `limit` (capped at [`MAX_PAGE`] × 10) when there are
    /// more.
    async fn clock_history(
        &self,
        id: &str,
        since_ns: i64,
        limit: u32,
    ) -> StoreResult<Vec<ClockRow>>;
    /// One page of agents, by id.
    async fn agents(&self, filter: AgentFilter) -> StoreResult<Vec<AgentRow>>;
    /// One agent.
    async fn agent(&self, id: &str) -> StoreResult<Option<AgentRow>>;
    /// Change one tenant's operator labels on an agent: `set` (a value, or
    /// `None` to hide the agent's own key), then `reset` (forget the
    /// tenant's say on these keys); then re-plan the agent. Returns the
    /// agent as it is now and the rows that changed;
    /// [`StoreError::NoSuchAgent`] when it is not known.
    async fn label_agent(
        &self,
        id: &str,
        tenant: &str,
        set: LabelOverrides,
        reset: Vec<String>,
        at_ns: i64,
    ) -> StoreResult<(AgentRow, Vec<DeliveryRow>)>;
    /// An admin grants (or takes back) a tenant on an agent, known or not
    /// yet; the agent is re-planned. Returns the rows that changed.
    async fn grant(
        &self,
        id: &str,
        tenant: &str,
        granted: bool,
        at_ns: i64,
    ) -> StoreResult<Vec<DeliveryRow>>;
    /// Forget an agent. With a tenant: only that tenant's deliveries to it,
    /// labels on it and grant. Without: everything of it (its record,
    /// clock history, deliveries, labels, grants); its feedback stays.
    /// Whether its record existed.
    async fn forget_agent(&self, id: &str, tenant: Option<&str>) -> StoreResult<bool>;

    // ---- packs
    /// A pack's stored versions, newest first, at most `limit`, with an
    /// empty `yaml` (the dashboard's list; read a text with
    /// [`Store::pack_version`]).
    async fn pack_versions(&self, key: &PackKey, limit: u32) -> StoreResult<Vec<PackVersionRow>>;

    /// Store a pack version. Refused when the version is lower than the
    /// newest stored, or equal with other YAML. Pushing a version of a
    /// cancelled pack makes it live again. A new version ends the pack's
    /// open rollout (superseded) and, when it has a `rollout:` section,
    /// starts its own (waiting for its first stage, gating the version in
    /// the same transaction). Does not plan: call [`Store::reconcile_pack`].
    async fn put_pack(&self, pack: PackVersionRow) -> StoreResult<PutPack>;
    /// Withdraw a pack (its open rollout ends, superseded). A pack the store does not know is withdrawn from
    /// the agents that report holding it (a store restored from an older
    /// copy must still be able to stop it); [`StoreError::NoSuchPack`]
    /// only when nobody holds it either. Returns the rows that changed
    /// (every holder's).
    async fn cancel_pack(&self, key: &PackKey, at_ns: i64) -> StoreResult<Vec<DeliveryRow>>;
    /// Plan a pack for every agent it may concern: those its targets
    /// match (among the tenant's agents) and those with a row for it.
    /// Returns the rows that changed.
    async fn reconcile_pack(&self, key: &PackKey, at_ns: i64) -> StoreResult<Vec<DeliveryRow>>;
    /// Every pack (of one tenant, or all) with its delivery counts, by
    /// tenant then id, without YAML.
    async fn packs(&self, tenant: Option<&str>) -> StoreResult<Vec<PackSummaryRow>>;
    /// One version of a pack (`None`: the latest).
    async fn pack_version(
        &self,
        key: &PackKey,
        version: Option<u64>,
    ) -> StoreResult<Option<PackVersionRow>>;

    // ---- rollouts

    /// One rollout with its cohort (`version` `None`: the pack's newest).
    async fn rollout(&self, key: &PackKey, version: Option<u64>)
    -> StoreResult<Option<RolloutRow>>;
    /// Rollouts of one tenant (or all), by tenant and pack, newest version
    /// first; with `open_only`, every one not final, else the first
    /// [`MAX_PAGE`]. With their cohorts.
    async fn rollouts(&self, tenant: Option<&str>, open_only: bool)
    -> StoreResult<Vec<RolloutRow>>;
    /// Apply a rollout change (the row, new members, skipped ones, a
    /// republished version, the pack's gate) and re-plan its pack, all in
    /// one transaction, **only if** the stored rollout is still at
    /// `change.row.rev` (it then moves to `rev + 1`). `None`: another
    /// writer (a replica, an operator) changed it first; nothing was
    /// written. Otherwise the delivery rows that changed.
    async fn advance_rollout(
        &self,
        change: RolloutChange,
        at_ns: i64,
    ) -> StoreResult<Option<Vec<DeliveryRow>>>;

    // ---- deliveries

    /// The agent's held set is now `held` (already filtered to its
    /// tenants); every pack it names or held before is re-planned. Returns
    /// the rows that changed. An agent that never said hello is an error
    /// ([`StoreError::Backend`]).
    async fn agent_held(
        &self,
        id: &str,
        session: u64,
        held: Vec<HeldPackRow>,
        at_ns: i64,
    ) -> StoreResult<Vec<DeliveryRow>>;
    /// The agent answered a push. Returns its row as it is now (`None`: no
    /// such row, e.g. forgotten).
    async fn answer(&self, answer: AnswerRow) -> StoreResult<Option<DeliveryRow>>;
    /// Deliveries of one agent, by tenant and pack.
    async fn deliveries_of_agent(&self, id: &str) -> StoreResult<Vec<DeliveryRow>>;
    /// The stored rows of these (agent, pack) pairs (a pair without one
    /// is left out), in no set order: what a replica following the
    /// others' events reads for a page of them, a few queries where one
    /// per row would make a push to thousands of agents on other replicas
    /// thousands of round trips.
    async fn deliveries_of(&self, pairs: &[(String, PackKey)]) -> StoreResult<Vec<DeliveryRow>>;
    /// One page of the deliveries of one pack about `version` (`None`: any
    /// version), by agent, after `after_agent`.
    async fn deliveries_of_pack(
        &self,
        key: &PackKey,
        version: Option<u64>,
        after_agent: Option<&str>,
        limit: u32,
    ) -> StoreResult<Vec<DeliveryRow>>;
    /// How many deliveries are stored in each state (for `/metrics`; a
    /// state with none is left out; local packs are not deliveries), in
    /// [`DeliveryState`] order.
    async fn delivery_counts(&self) -> StoreResult<Vec<(DeliveryState, u64)>>;

    // ---- feedback

    /// Store feedback of one journal, once: rows whose (agent, journal,
    /// seq) is stored already, or at or below the journal's acked seq as it
    /// was before the call (stored once, maybe deleted by retention since),
    /// are counted as duplicates and left as they are, but for a count of
    /// drops a re-sent entry now carries: the stored row keeps the larger
    /// count, held to the entries missing right before it (rows deleted by
    /// retention count as missing). Ids come from the
    /// store, in storage order, and are never handed out twice (not even
    /// after retention deleted every row). All or nothing: a row that
    /// cannot be stored (a value past `i64::MAX`), or rows of more than one
    /// journal, fail the call with nothing stored.
    /// `session`: the generation of the stream that received them (they are
    /// all of its agent; an agent with no record, forgotten while its
    /// stream ran, has no owner to fence against).
    async fn put_feedback(
        &self,
        session: u64,
        rows: Vec<FeedbackRow>,
    ) -> StoreResult<FeedbackStored>;
    /// Highest seq ever stored for this agent and journal (0: none); kept
    /// when retention deletes the rows.
    async fn feedback_acked(&self, agent_id: &str, journal_id: &str) -> StoreResult<u64>;
    /// One page of stored feedback.
    async fn feedback(&self, filter: FeedbackFilter) -> StoreResult<Vec<FeedbackRow>>;
    /// Delete at most `max` feedback rows stored before `before`, oldest
    /// first (by `received_ns`, then id); how many went. Retention calls
    /// it in small batches.
    async fn delete_feedback_before(&self, before: RefTime, max: u32) -> StoreResult<u64>;
    /// Delete at most `max` clock history rows measured before
    /// `before`, oldest first (by `at_ns`, then agent); an agent's
    /// latest report is kept on its record.
    async fn delete_clock_before(&self, before: RefTime, max: u32) -> StoreResult<u64>;
    /// Delete at most `max` audit records before `before`, oldest first
    /// (by `at_ns`, then storage order).
    async fn delete_audit_before(&self, before: RefTime, max: u32) -> StoreResult<u64>;

    // ---- events between replicas

    /// The replica this store writes as when replicas share it (`None`: a
    /// single controller, whose events stay in its process).
    fn replica(&self) -> Option<String> {
        None
    }
    /// Store events for the other replicas (in one commit, in order).
    async fn put_events(&self, rows: Vec<EventRow>) -> StoreResult<()>;
    /// One page of events stored after `after_id`, by id: ids are handed
    /// out in commit order, so paging by id never skips one committed
    /// late.
    async fn events_after(&self, after_id: u64, limit: u32) -> StoreResult<Vec<EventRow>>;
    /// The highest event id and feedback id stored (0: none): where a
    /// replica starting to follow begins.
    async fn high_water(&self) -> StoreResult<(u64, u64)>;
    /// Delete at most `max` events stored before `before`.
    async fn delete_events_before(&self, before: RefTime, max: u32) -> StoreResult<u64>;

    // ---- revocations

    /// Record revocations, each with its audit records: a serial already
    /// recorded (by this replica or another, now or before) is left as it
    /// is and its audit records are not written. The serials recorded
    /// now.
    async fn revoke(&self, rows: Vec<(RevocationRow, Vec<AuditRow>)>) -> StoreResult<Vec<String>>;
    /// Every revoked serial recorded, by serial.
    async fn revocations(&self) -> StoreResult<Vec<RevocationRow>>;

    // ---- audit

    /// Record an operator action (stored before the action's answer).
    async fn put_audit(&self, row: AuditRow) -> StoreResult<()>;
    /// Audit records at or after `since_ns` (of one tenant, or all), oldest
    /// first (by `at_ns`, then storage order); the newest `limit` (capped
    /// at [`MAX_PAGE`] × 10) of them in that order.
    async fn audit(
        &self,
        tenant: Option<&str>,
        since_ns: i64,
        limit: u32,
    ) -> StoreResult<Vec<AuditRow>>;
}
