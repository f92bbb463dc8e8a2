//! What the controller asks of its store, once for every backend: each
//! operation one transaction of primitives ([`crate::decide`] for those
//! that decide). Every operation is complete and atomic: when it returns
//! `Ok`, the change survives `kill -9` of the controller.

use std::collections::BTreeMap;

use async_trait::async_trait;
use baton_model::{
    AgentRow, AgentUpdateRow, AnswerRow, AuditRow, ClockRow, DeliveryRow, EventRow, FeedbackRow,
    FeedbackStored, HeldPackRow, HelloRow, LabelOverrides, PackKey, PackVersionRow, PutPack,
    RefTime, ReleaseRow, RevocationRow, RolloutChange, SeenRow, SessionOpened, SessionRow,
    TrustRow, UpdateRow,
};

use crate::decide;
use crate::error::{StoreError, StoreResult};
use crate::store::{Store, transact, transact_background};
use crate::tx::Grows;

/// Ended sessions (and old log-in windows) deleted by each new one: more
/// than one, so they go faster than they come.
const ENDED_PER_OPEN: u32 = 16;

/// The store's operations, for any [`Store`] (`use baton_store::StoreOps`
/// to call them).
#[async_trait]
pub trait StoreOps: Store {
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
    /// raised it: a stream that lost its agent to another (on this replica
    /// or another one) can change nothing of it.
    async fn agent_hello(&self, hello: HelloRow) -> StoreResult<(AgentRow, Vec<DeliveryRow>)> {
        transact(self, move |tx| {
            let (agent, rows) = decide::hello(tx, &hello)?;
            tx.announce(&rows, hello.at)?;
            Ok((agent, rows))
        })
        .await
    }

    /// Connection state and last-seen instant, from the stream of
    /// generation `session`, with what that stream measures of the agent
    /// (start lateness p99, health; `None`: leave it), for the other
    /// replicas to show and filter on. An agent that never said hello is
    /// [`StoreError::NoSuchAgent`]: nothing is created.
    async fn agent_seen(&self, id: &str, session: u64, seen: SeenRow) -> StoreResult<()> {
        self.append_seen(id, session, seen).await
    }

    /// At start-up: the agents whose stream no live replica holds (on a
    /// single controller, every agent) are not connected. Last seen stays
    /// the last message actually received.
    async fn all_disconnected(&self) -> StoreResult<()> {
        transact(self, |tx| tx.disconnect_unowned()).await
    }

    /// Store a clock report from the stream of generation `session`: the
    /// agent's latest (unless a report as new or newer is stored), and its
    /// history. Idempotent on the report's instant: a re-sent report
    /// changes nothing. An agent that never said hello is
    /// [`StoreError::NoSuchAgent`].
    async fn record_clock(&self, id: &str, session: u64, clock: ClockRow) -> StoreResult<()> {
        self.append_clock(id, session, clock).await
    }

    /// What the agent checks packs against, as the stream of generation
    /// `session` heard it say (a list taken or refused, one expired). An
    /// agent that never said hello is [`StoreError::NoSuchAgent`].
    async fn record_trust(&self, id: &str, session: u64, trust: TrustRow) -> StoreResult<()> {
        let id = id.to_owned();
        transact(self, move |tx| {
            // Under the agent's lock, as a hello takes it: a takeover's
            // hello cannot commit between the check and the write.
            if tx.locking() {
                tx.lock_agent(&id)?;
            }
            decide::check_session(tx, &id, session)?;
            tx.write_trust(&id, &trust)
        })
        .await
    }

    /// What the agent last said of an update, as the stream of generation
    /// `session` heard it. An agent that never said hello is
    /// [`StoreError::NoSuchAgent`].
    async fn record_update(&self, id: &str, session: u64, update: UpdateRow) -> StoreResult<()> {
        let id = id.to_owned();
        transact(self, move |tx| {
            if tx.locking() {
                tx.lock_agent(&id)?;
            }
            decide::check_session(tx, &id, session)?;
            tx.write_update(&id, &update)
        })
        .await
    }

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
        at: RefTime,
    ) -> StoreResult<(AgentRow, Vec<DeliveryRow>)> {
        let (id, tenant) = (id.to_owned(), tenant.to_owned());
        transact(self, move |tx| {
            let (agent, rows) = decide::label(tx, &id, &tenant, &set, &reset, at)?;
            tx.announce(&rows, at)?;
            Ok((agent, rows))
        })
        .await
    }

    /// An admin grants (or takes back) a tenant on an agent, known or not
    /// yet; the agent is re-planned. Returns the rows that changed.
    async fn grant(
        &self,
        id: &str,
        tenant: &str,
        granted: bool,
        at: RefTime,
    ) -> StoreResult<Vec<DeliveryRow>> {
        let (id, tenant) = (id.to_owned(), tenant.to_owned());
        transact(self, move |tx| {
            let rows = decide::grant(tx, &id, &tenant, granted, at)?;
            tx.announce(&rows, at)?;
            Ok(rows)
        })
        .await
    }

    /// Forget an agent. With a tenant: only that tenant's deliveries to it,
    /// labels on it and grant. Without: everything of it (its record,
    /// clock history, deliveries, labels, grants); its feedback stays.
    /// Whether its record existed.
    async fn forget_agent(&self, id: &str, tenant: Option<&str>) -> StoreResult<bool> {
        let (id, tenant) = (id.to_owned(), tenant.map(str::to_owned));
        transact(self, move |tx| tx.forget_agent(&id, tenant.as_deref())).await
    }

    // ---- packs and rollouts

    /// Store a pack version ([`decide::put_pack`]: the version rules, and
    /// the rollout a new version ends or starts). Does not plan: call
    /// [`StoreOps::reconcile_pack`].
    async fn put_pack(&self, pack: PackVersionRow) -> StoreResult<PutPack> {
        transact(self, move |tx| decide::put_pack(tx, &pack)).await
    }

    /// Withdraw a pack ([`decide::cancel`]). Returns the rows that changed
    /// (every holder's).
    async fn cancel_pack(&self, key: &PackKey, at: RefTime) -> StoreResult<Vec<DeliveryRow>> {
        let key = key.clone();
        transact(self, move |tx| {
            let rows = decide::cancel(tx, &key, at)?;
            tx.announce(&rows, at)?;
            Ok(rows)
        })
        .await
    }

    /// Withdraw a live pack from chosen agents only
    /// ([`decide::withdraw_from`]). Returns the rows that changed.
    async fn withdraw_from(
        &self,
        key: &PackKey,
        agents: &[String],
        at: RefTime,
    ) -> StoreResult<Vec<DeliveryRow>> {
        let (key, agents) = (key.clone(), agents.to_vec());
        transact(self, move |tx| {
            let rows = decide::withdraw_from(tx, &key, &agents, at)?;
            tx.announce(&rows, at)?;
            Ok(rows)
        })
        .await
    }

    /// The agents pack `key` is withdrawn from, each with the version it
    /// was withdrawn through (empty for a pack the store does not know).
    async fn withdrawn_from(&self, key: &PackKey) -> StoreResult<BTreeMap<String, u64>> {
        let key = key.clone();
        transact(self, move |tx| {
            Ok(tx
                .pack_targets(&key, Some(""))?
                .map(|p| p.stopped)
                .unwrap_or_default())
        })
        .await
    }

    /// Plan a pack for every agent it may concern: those its targets
    /// match (among the tenant's agents) and those with a row for it.
    /// Returns the rows that changed.
    async fn reconcile_pack(&self, key: &PackKey, at: RefTime) -> StoreResult<Vec<DeliveryRow>> {
        let key = key.clone();
        transact(self, move |tx| {
            let rows = decide::reconcile(tx, &key, at)?;
            tx.announce(&rows, at)?;
            Ok(rows)
        })
        .await
    }

    /// Apply a rollout change if no other writer stepped the rollout first
    /// ([`decide::advance`]): `None` when one did (nothing written),
    /// otherwise the rows that changed.
    async fn advance_rollout(
        &self,
        change: RolloutChange,
        at: RefTime,
    ) -> StoreResult<Option<Vec<DeliveryRow>>> {
        transact(self, move |tx| {
            let rows = decide::advance(tx, &change, at)?;
            if let Some(rows) = &rows {
                tx.announce(rows, at)?;
            }
            Ok(rows)
        })
        .await
    }

    // ---- deliveries

    /// The agent's held set is now `held` (already filtered to its
    /// tenants); every pack it names or held before is re-planned. Returns
    /// the rows that changed. An agent that never said hello is
    /// [`StoreError::NoSuchAgent`].
    async fn agent_held(
        &self,
        id: &str,
        session: u64,
        held: Vec<HeldPackRow>,
        at: RefTime,
    ) -> StoreResult<Vec<DeliveryRow>> {
        let id = id.to_owned();
        transact(self, move |tx| {
            let rows = decide::held(tx, &id, session, &held, at)?;
            tx.announce(&rows, at)?;
            Ok(rows)
        })
        .await
    }

    /// The agent answered a push. Returns its row as it is now (`None`: no
    /// such row, e.g. forgotten).
    async fn answer(&self, answer: AnswerRow) -> StoreResult<Option<DeliveryRow>> {
        transact(self, move |tx| {
            let row = decide::answer(tx, &answer)?;
            tx.announce(row.as_slice(), answer.at)?;
            Ok(row)
        })
        .await
    }

    /// [`StoreOps::answer`] for many answers (of any agents) in one
    /// transaction, in order: each its own answer (a stale stream's
    /// refused alone); an `Err` of the whole is the store's, with nothing
    /// of it written.
    async fn answers(
        &self,
        answers: Vec<AnswerRow>,
    ) -> StoreResult<Vec<StoreResult<Option<DeliveryRow>>>> {
        transact(self, move |tx| {
            let each = decide::answers(tx, &answers)?;
            let rows: Vec<DeliveryRow> = each
                .iter()
                .filter_map(|r| r.as_ref().ok().cloned().flatten())
                .collect();
            if let Some(at) = answers.iter().map(|a| a.at).max() {
                tx.announce(&rows, at)?;
            }
            Ok(each)
        })
        .await
    }

    // ---- feedback

    /// Store feedback of one journal, once: rows whose (agent, journal,
    /// seq) is stored already, or at or below the journal's acked seq as it
    /// was before the call (stored once, maybe deleted by retention since),
    /// are counted as duplicates and left as they are, but for a count of
    /// drops a re-sent entry now carries: the stored row keeps the larger
    /// count, held to the entries missing right before it (rows deleted by
    /// retention count as missing). Ids come from the store, in storage
    /// order, and are never handed out twice (not even after retention
    /// deleted every row). All or nothing: a row that cannot be stored (a
    /// value past `i64::MAX`), or rows of more than one journal, fail the
    /// call with nothing stored. `session`: the generation of the stream
    /// that received them (they are all of its agent; an agent with no
    /// record, forgotten while its stream ran, has no owner to fence
    /// against).
    async fn put_feedback(
        &self,
        session: u64,
        rows: Vec<FeedbackRow>,
    ) -> StoreResult<FeedbackStored> {
        let Some(first) = rows.first() else {
            return Ok(FeedbackStored::default());
        };
        let (agent, journal) = (first.agent_id.clone(), first.journal_id.clone());
        if let Some(other) = rows
            .iter()
            .find(|r| r.agent_id != agent || r.journal_id != journal)
        {
            return Err(StoreError::Invalid(format!(
                "feedback of {agent} (journal {journal}) and {} (journal {}) in one call: one call stores one journal's feedback",
                other.agent_id, other.journal_id
            )));
        }
        self.append_feedback(session, rows).await
    }

    // ---- events, audit, revocations

    /// Store events for the other replicas (in one commit, in order).
    async fn put_events(&self, rows: Vec<EventRow>) -> StoreResult<()> {
        if rows.is_empty() {
            return Ok(());
        }
        transact(self, move |tx| tx.put_events(&rows)).await
    }

    /// Record an operator action (stored before the action's answer).
    async fn put_audit(&self, row: AuditRow) -> StoreResult<()> {
        transact(self, move |tx| tx.put_audit(&row)).await
    }

    /// Record revocations, each with its audit records: a serial already
    /// recorded (by this replica or another, now or before) is left as it
    /// is and its audit records are not written. The serials recorded
    /// now.
    ///
    /// The dashboard sessions of a serial recorded now end in the same
    /// transaction, on every replica at once ([`crate::Store::session`]
    /// also refuses any of a revoked serial).
    async fn revoke(&self, rows: Vec<(RevocationRow, Vec<AuditRow>)>) -> StoreResult<Vec<String>> {
        transact(self, move |tx| {
            let new = tx.revoke(&rows)?;
            tx.delete_sessions_of(&new)?;
            Ok(new)
        })
        .await
    }

    // ---- agent releases and updates

    /// Store a release: its row and its binary's pieces (each
    /// [`baton_model::RELEASE_PIECE`] long but the last), in one
    /// transaction. The same version and architecture stored with the
    /// same digest is `false` (nothing written); with another,
    /// [`StoreError::ReleaseTaken`].
    async fn put_release(&self, row: ReleaseRow, pieces: Vec<Vec<u8>>) -> StoreResult<bool> {
        transact(self, move |tx| {
            if let Some(old) = tx.release(&row.version, &row.arch)? {
                if old.sha256 != row.sha256 || old.size != row.size {
                    return Err(StoreError::ReleaseTaken {
                        version: row.version.clone(),
                        arch: row.arch.clone(),
                    });
                }
                return Ok(false);
            }
            tx.put_release(&row)?;
            for (i, piece) in pieces.iter().enumerate() {
                tx.put_release_piece(&row.version, &row.arch, i as u64, piece)?;
            }
            Ok(true)
        })
        .await
    }

    /// Start an agent update: every open one is superseded (its agents no
    /// longer offered its release) and `row` stored; its id. `expect`: the
    /// ids of the open updates the caller checked it may supersede; any
    /// other set open now is [`StoreError::Contended`], nothing written.
    async fn start_agent_update(&self, row: AgentUpdateRow, expect: Vec<u64>) -> StoreResult<u64> {
        transact(self, move |tx| {
            if tx.locking() {
                tx.lock_agent_updates()?;
            }
            let open = tx.open_agent_updates()?;
            let mut ids: Vec<u64> = open.iter().map(|u| u.id).collect();
            let mut want = expect.clone();
            ids.sort_unstable();
            want.sort_unstable();
            if ids != want {
                return Err(StoreError::Contended(format!(
                    "the open agent updates changed ({ids:?}, {want:?} checked) while this one started; try again"
                )));
            }
            for mut old in open {
                old.machine.state = baton_model::RolloutState::Superseded;
                old.machine.reason = format!("superseded by the update to {}", row.version);
                old.machine.updated = row.machine.created;
                if !tx.cas_agent_update(&old)? {
                    return Err(StoreError::Contended(format!(
                        "agent update {} changed while a new one started",
                        old.id
                    )));
                }
                tx.clear_release_targets(old.id)?;
            }
            tx.insert_agent_update(&row)
        })
        .await
    }

    /// Apply a step of an agent update if no other writer stepped it
    /// first (`false`: one did, nothing written): the row, the agents
    /// `admit` now offered its release, and every offer withdrawn with
    /// `withdraw`.
    async fn advance_agent_update(
        &self,
        row: AgentUpdateRow,
        admit: Vec<String>,
        withdraw: bool,
    ) -> StoreResult<bool> {
        transact(self, move |tx| {
            if !tx.cas_agent_update(&row)? {
                return Ok(false);
            }
            if !admit.is_empty() {
                tx.set_release_targets(row.id, &row.version, &admit)?;
            }
            if withdraw {
                tx.clear_release_targets(row.id)?;
            }
            Ok(true)
        })
        .await
    }

    // ---- dashboard sessions and log-in throttling

    /// Store a dashboard session, within bounds: a certificate holds at
    /// most `per_identity` (its oldest go to make room), and the store at
    /// most `max_total` (ended ones are deleted first). A revoked
    /// certificate gets none. A few ended sessions are deleted on the way,
    /// so the table never grows past its bound with dead rows.
    async fn open_session(
        &self,
        row: SessionRow,
        per_identity: usize,
        max_total: u64,
    ) -> StoreResult<SessionOpened> {
        transact(self, move |tx| {
            if tx.locking() {
                tx.lock_sessions(&row.serial)?;
            }
            if tx.is_revoked(&row.serial)? {
                return Ok(SessionOpened::Revoked);
            }
            tx.delete_ended_sessions(row.created, ENDED_PER_OPEN)?;
            let mine = tx.sessions_of(&row.serial)?;
            let over = (mine.len() + 1).saturating_sub(per_identity.max(1));
            if over > 0 {
                let oldest: Vec<String> = mine.into_iter().take(over).map(|s| s.id_hash).collect();
                tx.delete_sessions(&oldest)?;
            }
            if tx.count_sessions()? >= max_total {
                tx.delete_ended_sessions(row.created, u32::MAX)?;
                if tx.count_sessions()? >= max_total {
                    return Ok(SessionOpened::Full);
                }
            }
            tx.put_session(&row)?;
            Ok(SessionOpened::Opened)
        })
        .await
    }

    /// End a dashboard session (a log-out): on every replica at once.
    async fn close_session(&self, id_hash: &str) -> StoreResult<()> {
        let id = vec![id_hash.to_owned()];
        transact(self, move |tx| tx.delete_sessions(&id).map(drop)).await
    }

    /// Count a failed log-in from `source` in the window starting at
    /// `window`, and forget a few windows that started before
    /// `forget_before` (so the table holds only the windows a decision
    /// still reads); the window's count now. Counted in the store, so
    /// attempts spread over replicas add up.
    async fn login_failed(
        &self,
        source: &str,
        window: RefTime,
        forget_before: RefTime,
    ) -> StoreResult<u64> {
        let source = source.to_owned();
        transact(self, move |tx| {
            tx.delete_login_failures_before(forget_before, ENDED_PER_OPEN)?;
            tx.add_login_failure(&source, window)
        })
        .await
    }

    // ---- retention (small batches, riding other writes' commits)

    /// Delete at most `max` feedback rows stored before `before`, oldest
    /// first (by when they were stored, then id); how many went.
    async fn delete_feedback_before(&self, before: RefTime, max: u32) -> StoreResult<u64> {
        transact_background(self, move |tx| {
            tx.delete_before(Grows::Feedback, before, max)
        })
        .await
    }

    /// Delete at most `max` clock history rows measured before `before`,
    /// oldest first (by instant, then agent); an agent's latest report is
    /// kept on its record.
    async fn delete_clock_before(&self, before: RefTime, max: u32) -> StoreResult<u64> {
        transact_background(self, move |tx| tx.delete_before(Grows::Clock, before, max)).await
    }

    /// Delete at most `max` audit records before `before`, oldest first
    /// (by instant, then storage order).
    async fn delete_audit_before(&self, before: RefTime, max: u32) -> StoreResult<u64> {
        transact_background(self, move |tx| tx.delete_before(Grows::Audit, before, max)).await
    }

    /// Delete at most `max` events stored before `before`.
    async fn delete_events_before(&self, before: RefTime, max: u32) -> StoreResult<u64> {
        transact_background(self, move |tx| tx.delete_before(Grows::Events, before, max)).await
    }
}

impl<S: Store + ?Sized> StoreOps for S {}
