//! The storage interface: reads, one query each, and transactions of
//! [`Tx`] primitives (serialized by one writer, or by the locks of what
//! each decides about where writers run in parallel). What the
//! controller does with them — every decision and write rule — is
//! [`crate::ops`], written once over any store.

use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use baton_model::{
    AgentFilter, AgentRow, AgentUpdateRow, AuditRow, Binding, ClockRow, DeliveryRow, DeliveryState,
    EventRow, FeedbackFilter, FeedbackRow, FeedbackScope, FeedbackStored, FleetCounts, Mark,
    PackKey, PackSummaryRow, PackVersionRow, RefTime, ReleaseRow, RevocationRow, RolloutRow,
    SeenRow, SessionRow,
};

use crate::error::{StoreError, StoreResult};
use crate::tx::{Grows, Tx};

/// A transaction's work: primitives on a [`Tx`]; `Err` rolls back all of
/// it. `FnMut`: a backend may run it again in a new transaction when the
/// database aborted the first (a deadlock, a serialization failure), so
/// it reads its inputs by reference.
pub type TxJob = Box<dyn FnMut(&mut dyn Tx) -> StoreResult<()> + Send>;

/// A store: a backend (the memory store, SQLite, PostgreSQL, or a user's)
/// implements this and [`Tx`], and passes the contract suite
/// ([`crate::contract_suite`]).
///
/// Every committed transaction survives `kill -9` of the controller;
/// reads see committed state.
#[async_trait]
pub trait Store: Send + Sync + std::fmt::Debug + 'static {
    /// How decisions bind agents to tenants (set when the store is
    /// opened).
    fn binding(&self) -> Binding;

    /// The replica this store writes as when replicas share it (`None`: a
    /// single controller, whose events stay in its process).
    fn replica(&self) -> Option<String> {
        None
    }

    /// Run `job` in one transaction (two decisions never race: a store
    /// with one writer runs them one after another, one whose writers run
    /// in parallel has each hold the locks [`Tx::locking`] says of, so
    /// the later reads what the earlier committed); `Ok` once committed,
    /// else nothing of it was.
    async fn transact(&self, job: TxJob) -> StoreResult<()>;

    /// [`Store::transact`] for work that may wait for company
    /// (retention): a backend may run it with the next batch of others.
    async fn transact_background(&self, job: TxJob) -> StoreResult<()> {
        self.transact(job).await
    }

    /// Returns once other writers may have stored something to follow
    /// (events), or after `at_most`: a follower's wait between reads. The
    /// default waits `at_most` (polling); a backend that hears of other
    /// writers' commits returns sooner.
    async fn news(&self, at_most: std::time::Duration) {
        tokio_sleep(at_most).await;
    }

    /// Store one journal's feedback from the stream of generation
    /// `session` (the rules: [`crate::StoreOps::put_feedback`], which
    /// checks the rows are one journal's first). A backend may write many
    /// callers' batches together, in a constant number of statements; the
    /// default is one transaction each.
    async fn append_feedback(
        &self,
        session: u64,
        rows: Vec<FeedbackRow>,
    ) -> StoreResult<FeedbackStored> {
        append_in_transaction(self, session, rows).await
    }

    /// Store a clock report of `id`'s stream of generation `session`
    /// (the rules: [`crate::StoreOps::record_clock`]). A backend may write
    /// many streams' reports together, in a constant number of
    /// statements; the default is one transaction each.
    async fn append_clock(&self, id: &str, session: u64, clock: ClockRow) -> StoreResult<()> {
        clock_in_transaction(self, id, session, clock).await
    }

    /// Store when `id`'s stream of generation `session` was last seen
    /// (the rules: [`crate::StoreOps::agent_seen`]); as
    /// [`Store::append_clock`], a backend may write many together.
    async fn append_seen(&self, id: &str, session: u64, seen: SeenRow) -> StoreResult<()> {
        seen_in_transaction(self, id, session, seen).await
    }

    /// Drops, whole, the partitions of `what` whose rows are all older
    /// than `before` (a backend that partitions its history by time);
    /// how many rows went. Retention calls it before deleting row by row
    /// ([`crate::StoreOps::delete_feedback_before`] and the like), which
    /// such a backend confines to the rows outside every partition. The
    /// default partitions nothing.
    async fn drop_partitions_before(&self, what: Grows, before: RefTime) -> StoreResult<u64> {
        let _ = (what, before);
        Ok(0)
    }

    // ---- reads

    /// One agent.
    async fn agent(&self, id: &str) -> StoreResult<Option<AgentRow>>;
    /// One page of the agents `filter` matches, by id (its conditions as
    /// [`AgentFilter::matches`] states them, evaluated by the store).
    async fn agents(&self, filter: AgentFilter) -> StoreResult<Vec<AgentRow>>;
    /// The agents `filter` matches (its tenant, label and text; its state
    /// and page are ignored), counted by state: one query, whatever the
    /// fleet's size.
    async fn agent_counts(&self, filter: AgentFilter) -> StoreResult<FleetCounts>;
    /// Clock history of one agent at or after `since`, oldest first; the
    /// newest `limit` (capped at [`baton_model::MAX_PAGE`] × 10) when there
    /// are more.
    async fn clock_history(
        &self,
        id: &str,
        since: RefTime,
        limit: u32,
    ) -> StoreResult<Vec<ClockRow>>;
    /// Every pack (of one tenant, or all) with its delivery counts, by
    /// tenant then id, without YAML.
    async fn packs(&self, tenant: Option<&str>) -> StoreResult<Vec<PackSummaryRow>>;
    /// A pack's stored versions, newest first, at most `limit`, with an
    /// empty `yaml` (read a text with [`Store::pack_version`]).
    async fn pack_versions(&self, key: &PackKey, limit: u32) -> StoreResult<Vec<PackVersionRow>>;
    /// One version of a pack (`None`: the latest).
    async fn pack_version(
        &self,
        key: &PackKey,
        version: Option<u64>,
    ) -> StoreResult<Option<PackVersionRow>>;
    /// One rollout with its cohort (`version` `None`: the pack's newest).
    async fn rollout(&self, key: &PackKey, version: Option<u64>)
    -> StoreResult<Option<RolloutRow>>;
    /// Rollouts of one tenant (or all), by tenant and pack, newest version
    /// first; with `open_only`, every one not final, else the first
    /// [`baton_model::MAX_PAGE`]. With their cohorts.
    async fn rollouts(&self, tenant: Option<&str>, open_only: bool)
    -> StoreResult<Vec<RolloutRow>>;
    /// Deliveries of one agent, by tenant and pack.
    async fn deliveries_of_agent(&self, id: &str) -> StoreResult<Vec<DeliveryRow>>;
    /// The stored rows of these (agent, pack) pairs (a pair without one is
    /// left out), in no set order: what a replica following the others'
    /// events reads for a page of them, a few queries where one per row
    /// would make a push to thousands of agents on other replicas
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
    /// Highest seq ever stored for this agent and journal (0: none); kept
    /// when retention deletes the rows.
    async fn feedback_acked(&self, agent_id: &str, journal_id: &str) -> StoreResult<u64>;
    /// One page of stored feedback, in storage order (which for one agent
    /// is its sequence order).
    async fn feedback(&self, filter: FeedbackFilter) -> StoreResult<Vec<FeedbackRow>>;
    /// One page of events after `after`, in [`Mark`] order, and the mark
    /// after it: a row committed late by a parallel writer is never
    /// skipped (see [`Mark`]). `limit`: events at most, beyond which a
    /// page is cut, though a store reads [`MAX_PAGE`] stored rows at most
    /// (a row that names a pack's agents together is not cut): a page
    /// with fewer events than `limit` and `MAX_PAGE` (`limit` 0: the
    /// store's page) is the last for now.
    async fn events_after(&self, after: Mark, limit: u32) -> StoreResult<(Vec<EventRow>, Mark)>;
    /// One page of the feedback `scope` names after `after`, in [`Mark`]
    /// order (not the storage order of [`Store::feedback`]'s pages), and
    /// the mark after it: what a follower reads, and a rollout's tally.
    async fn feedback_after(
        &self,
        after: Mark,
        scope: FeedbackScope<'_>,
        limit: u32,
    ) -> StoreResult<(Vec<FeedbackRow>, Mark)>;
    /// A mark before every feedback row received at or after `since` and
    /// every row still to commit: where a follower of a window (a
    /// rollout stage's tally) starts, rather than at the table's
    /// beginning.
    async fn feedback_mark_at(&self, since: RefTime) -> StoreResult<Mark>;
    /// Where a follower starting now begins, for events and for feedback:
    /// after everything committed.
    async fn high_water(&self) -> StoreResult<(Mark, Mark)>;
    /// Every release stored, newest upload first.
    async fn releases(&self) -> StoreResult<Vec<ReleaseRow>>;
    /// Piece `index` of a release's binary (`None`: not stored).
    async fn release_piece(
        &self,
        version: &str,
        arch: &str,
        index: u64,
    ) -> StoreResult<Option<Vec<u8>>>;
    /// The release agent `id` is to be offered: its target's version for
    /// the architecture its hello said (`None`: no target, or none stored
    /// for its architecture).
    async fn release_offer(&self, id: &str) -> StoreResult<Option<ReleaseRow>>;
    /// Agent updates, newest first: every one not final with
    /// `open_only`, else the newest [`baton_model::MAX_PAGE`]. With their
    /// cohorts.
    async fn agent_updates(&self, open_only: bool) -> StoreResult<Vec<AgentUpdateRow>>;
    /// One agent update (`None`: the newest).
    async fn agent_update(&self, id: Option<u64>) -> StoreResult<Option<AgentUpdateRow>>;
    /// Every revoked serial recorded, by serial.
    async fn revocations(&self) -> StoreResult<Vec<RevocationRow>>;
    /// Audit records at or after `since` (of one tenant, or all), oldest
    /// first (by instant, then storage order); the newest `limit` (capped
    /// at [`baton_model::MAX_PAGE`] × 10) of them in that order.
    async fn audit(
        &self,
        tenant: Option<&str>,
        since: RefTime,
        limit: u32,
    ) -> StoreResult<Vec<AuditRow>>;
    /// The dashboard session whose cookie hashes to `id_hash`, if it
    /// stands at `now`: not expired, and its certificate not recorded as
    /// revoked (by any replica).
    async fn session(&self, id_hash: &str, now: RefTime) -> StoreResult<Option<SessionRow>>;
    /// Failed log-ins from `source` counted in each window that starts at
    /// or after `since`: (the window's start, failures), oldest first.
    async fn login_failures(
        &self,
        source: &str,
        since: RefTime,
    ) -> StoreResult<Vec<(RefTime, u64)>>;
}

/// [`Store::append_feedback`] as one transaction of [`Tx`] primitives: the
/// stream's generation checked against the agent's (an agent with no
/// record has none to fence against), then the rows.
pub async fn append_in_transaction<S: Store + ?Sized>(
    store: &S,
    session: u64,
    rows: Vec<FeedbackRow>,
) -> StoreResult<FeedbackStored> {
    let Some(agent) = rows.first().map(|r| r.agent_id.clone()) else {
        return Ok(FeedbackStored::default());
    };
    transact(store, move |tx| {
        crate::decide::session_if_known(tx, &agent, session)?;
        tx.put_feedback(&rows)
    })
    .await
}

/// [`Store::append_clock`] as one transaction of [`Tx`] primitives.
pub async fn clock_in_transaction<S: Store + ?Sized>(
    store: &S,
    id: &str,
    session: u64,
    clock: ClockRow,
) -> StoreResult<()> {
    let id = id.to_owned();
    transact(store, move |tx| {
        crate::decide::check_session(tx, &id, session)?;
        tx.write_clock(&id, &clock)
    })
    .await
}

/// [`Store::append_seen`] as one transaction of [`Tx`] primitives.
pub async fn seen_in_transaction<S: Store + ?Sized>(
    store: &S,
    id: &str,
    session: u64,
    seen: SeenRow,
) -> StoreResult<()> {
    let id = id.to_owned();
    transact(store, move |tx| {
        crate::decide::check_session(tx, &id, session)?;
        tx.write_seen(&id, &seen)
    })
    .await
}

/// A transaction that answers: `f` runs in [`Store::transact`] and its
/// value comes back once committed.
pub async fn transact<S, T, F>(store: &S, f: F) -> StoreResult<T>
where
    S: Store + ?Sized,
    T: Send + 'static,
    F: FnMut(&mut dyn Tx) -> StoreResult<T> + Send + 'static,
{
    let (job, slot) = answering(f);
    store.transact(job).await?;
    take(&slot)
}

/// [`transact`] for retention's work ([`Store::transact_background`]).
pub async fn transact_background<S, T, F>(store: &S, f: F) -> StoreResult<T>
where
    S: Store + ?Sized,
    T: Send + 'static,
    F: FnMut(&mut dyn Tx) -> StoreResult<T> + Send + 'static,
{
    let (job, slot) = answering(f);
    store.transact_background(job).await?;
    take(&slot)
}

/// A follower's wait without a clock of the store's own: the runtime's
/// timer (tokio's, so paused-time tests advance it).
async fn tokio_sleep(d: std::time::Duration) {
    tokio::time::sleep(d).await;
}

type Slot<T> = Arc<Mutex<Option<T>>>;

fn answering<T, F>(f: F) -> (TxJob, Slot<T>)
where
    T: Send + 'static,
    F: FnMut(&mut dyn Tx) -> StoreResult<T> + Send + 'static,
{
    let slot: Slot<T> = Arc::new(Mutex::new(None));
    let out = slot.clone();
    let mut f = f;
    let job: TxJob = Box::new(move |tx| {
        let v = f(tx)?;
        *out.lock().unwrap_or_else(PoisonError::into_inner) = Some(v);
        Ok(())
    });
    (job, slot)
}

fn take<T>(slot: &Slot<T>) -> StoreResult<T> {
    slot.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
        .ok_or_else(|| StoreError::corrupt("a transaction's answer", "committed without one"))
}
