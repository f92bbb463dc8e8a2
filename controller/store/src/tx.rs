//! What a backend gives the decisions: primitives inside one transaction.
//!
//! Each is one small thing a database does well — rows by key, the
//! candidate queries the planner needs, a conditional write, an append —
//! and none of them decides anything: which (agent, pack) pairs to plan,
//! what a rollout's new version does to the old one, when a stream is
//! fenced, is written once, in [`crate::decide`], over any backend. A
//! backend runs a whole job of them in one transaction
//! ([`crate::Store::transact`]): all of it is committed, or none.

use std::collections::BTreeMap;

use baton_model::{
    AgentRow, AgentUpdateRow, AuditRow, Binding, ClockRow, DeliveryRow, EventRow, FeedbackRow,
    FeedbackStored, GateRow, HelloRow, LabelOverrides, Member, PackKey, PackTargets,
    PackVersionRow, PutPack, RefTime, ReleaseRow, RevocationRow, RolloutRow, SeenRow, SessionRow,
    TargetsRow, TrustRow, UpdateRow,
};

use crate::error::StoreResult;

/// What retention deletes, oldest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grows {
    /// Feedback rows, by when they were stored.
    Feedback,
    /// Clock history rows, by when they were measured (an agent's latest
    /// report is kept on its record).
    Clock,
    /// Audit records, by their instant.
    Audit,
    /// Events between replicas, by when they were stored.
    Events,
}

/// The pack row's head as a new version's rollout needs it: its newest
/// version, whether it is cancelled, and the gate of its rollout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackHead {
    /// Newest version stored.
    pub latest: u64,
    /// Cancelled (withdrawn).
    pub cancelled: bool,
    /// The gate a rollout set.
    pub gate: Option<GateRow>,
}

/// One transaction's primitives. Integers past `i64::MAX` are refused
/// ([`crate::StoreError::OutOfRange`]) by whatever writes them; reads of
/// what is not stored are `None` or empty, never an error.
pub trait Tx {
    /// How decisions bind agents to tenants (the store's setting).
    fn binding(&self) -> Binding;

    // ---- serialization with other writers

    /// Whether other writers run decisions in parallel with this one
    /// (replicas on one database), so decisions must take the locks
    /// below; a store with one writer serializes them already.
    fn locking(&self) -> bool {
        false
    }
    /// Hold, to the end of the transaction, the lock of decisions about
    /// agent `id` (exclusive). Taken before any tenant's.
    fn lock_agent(&mut self, _id: &str) -> StoreResult<()> {
        Ok(())
    }
    /// [`Tx::lock_agent`] for each of `ids`, in their order (sorted by
    /// the caller): a backend may take them all in one statement.
    fn lock_agents(&mut self, ids: &[&str]) -> StoreResult<()> {
        for id in ids {
            self.lock_agent(id)?;
        }
        Ok(())
    }
    /// Hold, to the end of the transaction, the locks of these tenants'
    /// packs: shared by a decision about an agent (whose packs are in
    /// them), exclusive by a decision about one pack of theirs (a push, a
    /// cancel, a rollout's step). Taken in a sorted order.
    fn lock_tenants(&mut self, _tenants: &[&str], _exclusive: bool) -> StoreResult<()> {
        Ok(())
    }

    // ---- agents

    /// One agent, with its tenants.
    fn agent(&mut self, id: &str) -> StoreResult<Option<AgentRow>>;
    /// The agents among `ids` that are stored, by id.
    fn agents(&mut self, ids: &[&str]) -> StoreResult<Vec<AgentRow>>;
    /// The agent's session generation (`None`: not stored): what fencing
    /// compares a stream's generation with.
    fn session_gen(&mut self, id: &str) -> StoreResult<Option<u64>>;
    /// The hello's record: created or updated (labels, version, journal,
    /// certificate tenants when given), connected, seen at its instant,
    /// owned by this writer under a generation above the stored one and
    /// the hello's `session_gen_seen`; refused with
    /// [`crate::StoreError::IdInUse`] while another live owner holds the
    /// id from another journal.
    fn write_hello(&mut self, hello: &HelloRow) -> StoreResult<()>;
    /// Connection state, last seen and (each `Some`) the recent lateness
    /// p99 and health of a stored agent.
    fn write_seen(&mut self, id: &str, seen: &SeenRow) -> StoreResult<()>;
    /// Every agent no live writer holds is marked not connected.
    fn disconnect_unowned(&mut self) -> StoreResult<()>;
    /// What a stored agent checks packs against, as it now says.
    fn write_trust(&mut self, id: &str, trust: &TrustRow) -> StoreResult<()>;
    /// A clock report of a stored agent: its latest unless one as new or
    /// newer is kept, and its history (once per instant).
    fn write_clock(&mut self, id: &str, clock: &ClockRow) -> StoreResult<()>;
    /// One tenant's operator labels on a stored agent: `set`, then
    /// `reset` forgotten.
    fn write_overrides(
        &mut self,
        id: &str,
        tenant: &str,
        set: &LabelOverrides,
        reset: &[String],
    ) -> StoreResult<()>;
    /// A tenant granted to (or taken from) an agent, stored or not yet.
    fn write_grant(
        &mut self,
        id: &str,
        tenant: &str,
        granted: bool,
        at: RefTime,
    ) -> StoreResult<()>;
    /// Forget an agent: with a tenant, that tenant's rows of it, labels on
    /// it and grant; without, everything of it but its feedback. Whether
    /// its record existed.
    fn forget_agent(&mut self, id: &str, tenant: Option<&str>) -> StoreResult<bool>;

    // ---- packs

    /// The pack as the planner reads it, its rollout's cohort read for
    /// `cohort_of` only (`None`: all of it).
    fn pack_targets(
        &mut self,
        key: &PackKey,
        cohort_of: Option<&str>,
    ) -> StoreResult<Option<PackTargets>>;
    /// Candidate query: the live packs that may target `agent` (those of
    /// its tenants, or all under [`Binding::Open`]), each with its cohort
    /// read for the agent only. A superset: the planner decides.
    fn packs_for(&mut self, agent: &AgentRow) -> StoreResult<Vec<PackTargets>>;
    /// Candidate query: the agents `targets` (pack `key`'s) may match. A
    /// superset (an index may look up only the first label; ids the store
    /// does not know are skipped by the caller): the planner decides.
    fn pack_candidates(&mut self, key: &PackKey, targets: &TargetsRow) -> StoreResult<Vec<String>>;
    /// The pack row's head (`None`: no row).
    fn pack_head(&mut self, key: &PackKey) -> StoreResult<Option<PackHead>>;
    /// Store a version, a conditional write: it becomes the newest (the
    /// pack live again) when higher than the stored one; the same version
    /// with the same text is [`PutPack::Unchanged`]; otherwise
    /// [`crate::StoreError::VersionOlder`] or
    /// [`crate::StoreError::VersionTaken`]. The gate is left as it is.
    fn write_version(&mut self, pack: &PackVersionRow) -> StoreResult<PutPack>;
    /// Mark a pack cancelled (the first instant stays); one the store does
    /// not know but agents hold gets a row withdrawn at the newest version
    /// held. `false`: neither known nor held.
    fn write_cancel(&mut self, key: &PackKey, at: RefTime) -> StoreResult<bool>;
    /// The gate on the pack row.
    fn write_gate(&mut self, key: &PackKey, gate: Option<&GateRow>) -> StoreResult<()>;
    /// The agents the pack is withdrawn from ([`PackTargets::stopped`]),
    /// all of them: the map replaces what the pack row had.
    fn write_stops(&mut self, key: &PackKey, stops: &BTreeMap<String, u64>) -> StoreResult<()>;

    // ---- rollouts

    /// One rollout with its cohort (`version` `None`: the pack's newest).
    fn rollout(&mut self, key: &PackKey, version: Option<u64>) -> StoreResult<Option<RolloutRow>>;
    /// The pack's rollouts that are not final (cohorts left out).
    fn open_rollouts(&mut self, key: &PackKey) -> StoreResult<Vec<RolloutRow>>;
    /// A new rollout row (its cohort empty).
    fn insert_rollout(&mut self, row: &RolloutRow) -> StoreResult<()>;
    /// Write `row` (not its cohort) over the stored one if that is still
    /// at `row.rev`; the stored rev is then `row.rev + 1`. Whether it was.
    fn cas_rollout(&mut self, row: &RolloutRow) -> StoreResult<bool>;
    /// Agents let into a rollout's cohort (one already in it is left as
    /// it is).
    fn admit(
        &mut self,
        key: &PackKey,
        version: u64,
        members: &[(String, Member)],
    ) -> StoreResult<()>;
    /// Members left out of a rollout's verdicts.
    fn skip_members(&mut self, key: &PackKey, version: u64, ids: &[String]) -> StoreResult<()>;

    // ---- deliveries

    /// The row of (agent, pack).
    fn row(&mut self, id: &str, key: &PackKey) -> StoreResult<Option<DeliveryRow>>;
    /// The stored rows of these (agent, pack) pairs, in no set order (a
    /// pair without one left out): a backend reads many in one statement.
    fn rows_of_pairs(&mut self, pairs: &[(String, PackKey)]) -> StoreResult<Vec<DeliveryRow>> {
        let mut out = Vec::with_capacity(pairs.len());
        for (id, key) in pairs {
            out.extend(self.row(id, key)?);
        }
        Ok(out)
    }
    /// Every row of an agent, by tenant and pack.
    fn rows_of_agent(&mut self, id: &str) -> StoreResult<Vec<DeliveryRow>>;
    /// Every row of a pack.
    fn rows_of_pack(&mut self, key: &PackKey) -> StoreResult<Vec<DeliveryRow>>;
    /// Write rows, each replacing the stored row of its (agent, pack).
    fn put_rows(&mut self, rows: &[DeliveryRow]) -> StoreResult<()>;
    /// Delete the rows of these pairs.
    fn delete_rows(&mut self, pairs: &[(String, PackKey)]) -> StoreResult<()>;
    /// Forget what an agent staged (a restart dropped its staged copies).
    fn clear_staged(&mut self, id: &str) -> StoreResult<()>;

    // ---- appends

    /// Store feedback of one journal (see `put_feedback` in [`crate::ops`]
    /// for the rules: once per seq, a re-sent drop count kept when
    /// larger, ids never reused).
    fn put_feedback(&mut self, rows: &[FeedbackRow]) -> StoreResult<FeedbackStored>;
    /// Events for the other replicas, in order.
    /// Tell the store's other writers' followers, in this transaction,
    /// that these rows changed (where writers run in parallel: delivery
    /// events naming each row, committed with the change, so a push reaches the
    /// agents streaming to other replicas as soon as it is stored, and no
    /// crash between the two loses the word). The default, for a store
    /// with one writer, tells no one.
    fn announce(&mut self, rows: &[DeliveryRow], at: RefTime) -> StoreResult<()> {
        let _ = (rows, at);
        Ok(())
    }
    fn put_events(&mut self, rows: &[EventRow]) -> StoreResult<()>;
    /// An operator action.
    fn put_audit(&mut self, row: &AuditRow) -> StoreResult<()>;
    /// Revocations not recorded yet, each with its audit records; the
    /// serials recorded now.
    fn revoke(&mut self, rows: &[(RevocationRow, Vec<AuditRow>)]) -> StoreResult<Vec<String>>;
    /// Delete at most `max` records of `what` before `before`, oldest
    /// first; how many went.
    fn delete_before(&mut self, what: Grows, before: RefTime, max: u32) -> StoreResult<u64>;

    // ---- agent releases and updates

    /// Hold, to the end of the transaction, the lock of starting agent
    /// updates (exclusive): two replicas starting one at once would each
    /// supersede what was open and leave both open. Only where
    /// [`Tx::locking`].
    fn lock_agent_updates(&mut self) -> StoreResult<()> {
        Ok(())
    }

    /// A stored release (`None`: not stored).
    fn release(&mut self, version: &str, arch: &str) -> StoreResult<Option<ReleaseRow>>;
    /// Store a release's row (the caller checked it is not stored).
    fn put_release(&mut self, row: &ReleaseRow) -> StoreResult<()>;
    /// Store piece `index` of a release's binary (bytes from `index` ×
    /// [`baton_model::RELEASE_PIECE`]).
    fn put_release_piece(
        &mut self,
        version: &str,
        arch: &str,
        index: u64,
        data: &[u8],
    ) -> StoreResult<()>;
    /// What a stored agent last said of an update.
    fn write_update(&mut self, id: &str, update: &UpdateRow) -> StoreResult<()>;
    /// The updates that are not final, oldest first, with their cohorts.
    fn open_agent_updates(&mut self) -> StoreResult<Vec<AgentUpdateRow>>;
    /// A new update (its id assigned here, above every stored one); its
    /// id.
    fn insert_agent_update(&mut self, row: &AgentUpdateRow) -> StoreResult<u64>;
    /// Write `row` (its machine with its cohort) over the stored one if
    /// that is still at `row.machine.rev`; the stored rev is then one
    /// more. Whether it was.
    fn cas_agent_update(&mut self, row: &AgentUpdateRow) -> StoreResult<bool>;
    /// These agents are to be offered release `version` (of update
    /// `update`), over whatever they were offered.
    fn set_release_targets(
        &mut self,
        update: u64,
        version: &str,
        ids: &[String],
    ) -> StoreResult<()>;
    /// No agent is offered update `update`'s release any more.
    fn clear_release_targets(&mut self, update: u64) -> StoreResult<()>;

    // ---- dashboard sessions and log-in throttling

    /// Hold, to the end of the transaction, the lock of the sessions of
    /// certificate `serial` (exclusive): two replicas opening sessions of
    /// one certificate at once keep its cap. Only where
    /// [`Tx::locking`].
    fn lock_sessions(&mut self, _serial: &str) -> StoreResult<()> {
        Ok(())
    }
    /// Whether `serial` is recorded as revoked.
    fn is_revoked(&mut self, serial: &str) -> StoreResult<bool>;
    /// The sessions of certificate `serial`, oldest first (by when they
    /// were made, then by hash).
    fn sessions_of(&mut self, serial: &str) -> StoreResult<Vec<SessionRow>>;
    /// How many sessions are stored.
    fn count_sessions(&mut self) -> StoreResult<u64>;
    /// Store a session (its hash is new: 256 random bits).
    fn put_session(&mut self, row: &SessionRow) -> StoreResult<()>;
    /// Delete the sessions with these hashes; how many went.
    fn delete_sessions(&mut self, id_hashes: &[String]) -> StoreResult<u64>;
    /// Delete every session of these certificates; how many went.
    fn delete_sessions_of(&mut self, serials: &[String]) -> StoreResult<u64>;
    /// Delete at most `max` sessions that ended by `now` (expired, or of a
    /// revoked certificate); how many went.
    fn delete_ended_sessions(&mut self, now: RefTime, max: u32) -> StoreResult<u64>;
    /// One more failed log-in from `source` in the window starting at
    /// `window`; the window's count now.
    fn add_login_failure(&mut self, source: &str, window: RefTime) -> StoreResult<u64>;
    /// Delete at most `max` windows of failed log-ins that start before
    /// `before`; how many went.
    fn delete_login_failures_before(&mut self, before: RefTime, max: u32) -> StoreResult<u64>;
}
