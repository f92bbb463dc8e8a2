//! [`Store`] for each [`Engine`]: each method one read or one command
//! on the engine's writer.

use async_trait::async_trait;

use super::agents::{self, check_session, unknown_agent, update_agent};
use super::codec::{DELIVERY_COLUMNS, decode_delivery, u64_from_db};
use super::db::{col, params, query_all};
use super::feedback::{self, DELETE_AUDIT, DELETE_CLOCK, DELETE_FEEDBACK, delete_oldest};
use super::{Engine, audit, events, packs, plan, rollouts};
use baton_model::RefTime;
use baton_store::{
    AgentFilter, AgentRow, AnswerRow, AuditRow, ClockRow, DeliveryRow, DeliveryState, EventRow,
    FeedbackFilter, FeedbackRow, FeedbackStored, HeldPackRow, HelloRow, LabelOverrides, MAX_PAGE,
    PackKey, PackSummaryRow, PackVersionRow, PutPack, RolloutChange, RolloutRow, Store, StoreError,
    StoreResult, page,
};

/// [`Store`] for an [`Engine`]: written once, implemented for each
/// engine's store type (a blanket `impl<E: Engine> Store for E` would
/// implement a trait of another crate for every type).
macro_rules! engine_store {
    ($engine:ty) => {
#[async_trait]
        impl Store for $engine {
    async fn agent_hello(&self, hello: HelloRow) -> StoreResult<(AgentRow, Vec<DeliveryRow>)> {
        let binding = self.binding();
        let owner = self.owner();
        let lease_now_us = self.lease_clock();
        self.write(move |conn| {
            agents::refuse_a_second_machine(conn, &hello, &owner, lease_now_us)?;
            agents::write_hello(conn, &hello, &owner)?;
            // A restart drops staged copies: what was staged is asked
            // again.
            super::db::run(
                conn,
                "forget what the agent staged",
                "UPDATE deliveries SET staged_version = NULL, staged_at_ns = NULL \
                 WHERE agent_id = ?1 AND staged_version IS NOT NULL",
                params![hello.id],
            )?;
            let agent =
                agents::load_agent(conn, &hello.id)?.ok_or_else(|| unknown_agent(&hello.id))?;
            plan::replan_agent(
                conn,
                &agent,
                Some(&hello.held),
                binding,
                hello.at.as_nanos(),
            )?;
            Ok((agent, plan::rows_of_agent(conn, &hello.id)?))
        })
        .await
    }

    async fn agent_seen(
        &self,
        id: &str,
        session: u64,
        connected: bool,
        at_ns: i64,
        lateness_p99_ns: Option<i64>,
    ) -> StoreResult<()> {
        let id = id.to_owned();
        self.write(move |conn| {
            check_session(conn, &id, session)?;
            update_agent(
                conn,
                &id,
                "UPDATE agents SET connected = ?2, last_seen_ns = ?3, \
                 lateness_p99_ns = COALESCE(?4, lateness_p99_ns) WHERE id = ?1",
                params![id, i64::from(connected), at_ns, lateness_p99_ns],
            )
        })
        .await
    }

    /// `last_seen_ns` is left as it was: it stays the last message
    /// actually received. A stream is held only by a replica whose lease
    /// (at the epoch it took the hello under) is live, and not by this
    /// one, which is starting: on a single controller, which has no lease
    /// rows, none.
    async fn all_disconnected(&self) -> StoreResult<()> {
        let lease_now_us = self.lease_clock();
        let me = self.owner().replica;
        self.write(move |conn| {
            agents::disconnect_unowned(conn, lease_now_us(conn)?, Some(&me))?;
            Ok(())
        })
        .await
    }

    async fn record_clock(&self, id: &str, session: u64, clock: ClockRow) -> StoreResult<()> {
        let id = id.to_owned();
        self.write(move |conn| {
            check_session(conn, &id, session)?;
            agents::write_clock(conn, &id, &clock)
        })
        .await
    }

    async fn clock_history(
        &self,
        id: &str,
        since_ns: i64,
        limit: u32,
    ) -> StoreResult<Vec<ClockRow>> {
        let id = id.to_owned();
        self.read(move |conn| agents::clock_history(conn, &id, since_ns, limit))
            .await
    }

    async fn agents(&self, filter: AgentFilter) -> StoreResult<Vec<AgentRow>> {
        let mut filter = filter;
        if self.binding() == baton_store::Binding::Open {
            // Every agent serves every tenant.
            filter.tenant = None;
        }
        self.read(move |conn| agents::agents_page(conn, &filter))
            .await
    }

    async fn agent(&self, id: &str) -> StoreResult<Option<AgentRow>> {
        let id = id.to_owned();
        self.read(move |conn| agents::load_agent(conn, &id)).await
    }

    async fn label_agent(
        &self,
        id: &str,
        tenant: &str,
        set: LabelOverrides,
        reset: Vec<String>,
        at_ns: i64,
    ) -> StoreResult<(AgentRow, Vec<DeliveryRow>)> {
        let (id, tenant) = (id.to_owned(), tenant.to_owned());
        let binding = self.binding();
        self.write(move |conn| {
            agents::write_labels(conn, &id, &tenant, &set, &reset)?;
            let agent = agents::load_agent(conn, &id)?
                .ok_or_else(|| StoreError::NoSuchAgent { id: id.clone() })?;
            let changed = plan::replan_agent(conn, &agent, None, binding, at_ns)?;
            Ok((agent, changed))
        })
        .await
    }

    async fn grant(
        &self,
        id: &str,
        tenant: &str,
        granted: bool,
        at_ns: i64,
    ) -> StoreResult<Vec<DeliveryRow>> {
        let (id, tenant) = (id.to_owned(), tenant.to_owned());
        let binding = self.binding();
        self.write(move |conn| {
            agents::write_grant(conn, &id, &tenant, granted, at_ns)?;
            match agents::load_agent(conn, &id)? {
                Some(agent) => plan::replan_agent(conn, &agent, None, binding, at_ns),
                // Granted before the agent first connects: nothing to plan.
                None => Ok(Vec::new()),
            }
        })
        .await
    }

    async fn forget_agent(&self, id: &str, tenant: Option<&str>) -> StoreResult<bool> {
        let (id, tenant) = (id.to_owned(), tenant.map(str::to_owned));
        self.write(move |conn| agents::write_forget(conn, &id, tenant.as_deref()))
            .await
    }

    async fn put_pack(&self, pack: PackVersionRow) -> StoreResult<PutPack> {
        self.write(move |conn| rollouts::put_pack(conn, &pack))
            .await
    }

    async fn cancel_pack(&self, key: &PackKey, at_ns: i64) -> StoreResult<Vec<DeliveryRow>> {
        let key = key.clone();
        let binding = self.binding();
        self.write(move |conn| {
            if !packs::write_cancel(conn, &key, at_ns)? {
                return Err(StoreError::NoSuchPack {
                    tenant: key.tenant.clone(),
                    pack: key.pack.clone(),
                });
            }
            rollouts::on_cancel(conn, &key, at_ns)?;
            plan::replan_pack(conn, &key, binding, at_ns)
        })
        .await
    }

    async fn reconcile_pack(&self, key: &PackKey, at_ns: i64) -> StoreResult<Vec<DeliveryRow>> {
        let key = key.clone();
        let binding = self.binding();
        self.write(move |conn| plan::replan_pack(conn, &key, binding, at_ns))
            .await
    }

    async fn rollout(
        &self,
        key: &PackKey,
        version: Option<u64>,
    ) -> StoreResult<Option<RolloutRow>> {
        let key = key.clone();
        self.read(move |conn| rollouts::load(conn, &key, version))
            .await
    }

    async fn rollouts(
        &self,
        tenant: Option<&str>,
        open_only: bool,
    ) -> StoreResult<Vec<RolloutRow>> {
        let tenant = tenant.map(str::to_owned);
        self.read(move |conn| rollouts::list(conn, tenant.as_deref(), open_only))
            .await
    }

    async fn advance_rollout(
        &self,
        change: RolloutChange,
        at_ns: i64,
    ) -> StoreResult<Option<Vec<DeliveryRow>>> {
        let binding = self.binding();
        self.write(move |conn| rollouts::advance(conn, &change, binding, at_ns))
            .await
    }

    async fn packs(&self, tenant: Option<&str>) -> StoreResult<Vec<PackSummaryRow>> {
        let tenant = tenant.map(str::to_owned);
        self.read(move |conn| packs::packs(conn, tenant.as_deref()))
            .await
    }

    async fn pack_version(
        &self,
        key: &PackKey,
        version: Option<u64>,
    ) -> StoreResult<Option<PackVersionRow>> {
        let key = key.clone();
        // A version past i64::MAX cannot have been stored.
        let version = match version.map(i64::try_from).transpose() {
            Ok(v) => v,
            Err(_) => return Ok(None),
        };
        self.read(move |conn| packs::pack_version(conn, &key, version))
            .await
    }

    async fn pack_versions(&self, key: &PackKey, limit: u32) -> StoreResult<Vec<PackVersionRow>> {
        let key = key.clone();
        self.read(move |conn| packs::pack_versions(conn, &key, limit))
            .await
    }

    async fn agent_held(
        &self,
        id: &str,
        session: u64,
        held: Vec<HeldPackRow>,
        at_ns: i64,
    ) -> StoreResult<Vec<DeliveryRow>> {
        let id = id.to_owned();
        let binding = self.binding();
        self.write(move |conn| {
            check_session(conn, &id, session)?;
            let agent = agents::load_agent(conn, &id)?.ok_or_else(|| unknown_agent(&id))?;
            plan::replan_agent(conn, &agent, Some(&held), binding, at_ns)
        })
        .await
    }

    /// An agent not stored (forgotten) has no row to answer about:
    /// `None`, as before fencing.
    async fn answer(&self, a: AnswerRow) -> StoreResult<Option<DeliveryRow>> {
        let binding = self.binding();
        self.write(move |conn| {
            if !agents::check_session_if_known(conn, &a.agent_id, a.session_gen)? {
                return Ok(None);
            }
            plan::replan_answer(conn, &a, binding)
        })
        .await
    }

    async fn deliveries_of_agent(&self, id: &str) -> StoreResult<Vec<DeliveryRow>> {
        let id = id.to_owned();
        self.read(move |conn| plan::rows_of_agent(conn, &id)).await
    }

    async fn deliveries_of(&self, pairs: &[(String, PackKey)]) -> StoreResult<Vec<DeliveryRow>> {
        let mut pairs = pairs.to_vec();
        pairs.sort();
        pairs.dedup();
        self.read(move |conn| plan::rows_of_pairs(conn, &pairs))
            .await
    }

    async fn deliveries_of_pack(
        &self,
        key: &PackKey,
        version: Option<u64>,
        after_agent: Option<&str>,
        limit: u32,
    ) -> StoreResult<Vec<DeliveryRow>> {
        let key = key.clone();
        let Ok(version) = version.map(i64::try_from).transpose() else {
            return Ok(Vec::new());
        };
        let after = after_agent.map(str::to_owned);
        let limit = i64::from(page(limit, MAX_PAGE));
        self.read(move |conn| {
            let sql = format!(
                "SELECT {DELIVERY_COLUMNS} FROM deliveries \
                 WHERE tenant = ?1 AND pack = ?2 AND state <> 'local' \
                 AND (CAST(?3 AS BIGINT) IS NULL OR version = ?3) AND (CAST(?4 AS TEXT) IS NULL OR agent_id > ?4) \
                 ORDER BY agent_id LIMIT ?5"
            );
            query_all(
                conn,
                &sql,
                params![key.tenant, key.pack, version, after, limit],
                decode_delivery,
            )
        })
        .await
    }

    /// One scan of the state index (a few hundred thousand rows for a
    /// large fleet: milliseconds, once per scrape, on the read pool).
    async fn delivery_counts(&self) -> StoreResult<Vec<(DeliveryState, u64)>> {
        self.read(|conn| {
            query_all(
                conn,
                "SELECT state, COUNT(*) AS n FROM deliveries WHERE state <> 'local' \
                 GROUP BY state",
                &[],
                |row| {
                    let state: String = col(row, "state")?;
                    let n: i64 = col(row, "n")?;
                    let state = DeliveryState::parse(&state)
                        .ok_or_else(|| StoreError::Backend(format!("unknown state {state:?}")))?;
                    Ok((state, u64_from_db(n, "count")?))
                },
            )
            .map(|mut counts| {
                // The words sort otherwise than the states.
                counts.sort_by_key(|(state, _)| *state);
                counts
            })
        })
        .await
    }

    /// All or nothing: a row that cannot be stored (a value past
    /// `i64::MAX`) fails the whole call and stores none of it.
    async fn put_feedback(
        &self,
        session: u64,
        rows: Vec<FeedbackRow>,
    ) -> StoreResult<FeedbackStored> {
        let Some(agent) = rows.first().map(|r| r.agent_id.clone()) else {
            return Ok(FeedbackStored::default());
        };
        if let Some(other) = rows.iter().find(|r| r.agent_id != agent) {
            return Err(StoreError::Backend(format!(
                "feedback of agents {agent} and {} in one call: one stream's feedback is one agent's",
                other.agent_id
            )));
        }
        self.write(move |conn| {
            // An agent with no record (forgotten while its stream ran) has
            // no owner to fence against; its feedback is kept, as it
            // would have been before the forget.
            agents::check_session_if_known(conn, &agent, session)?;
            feedback::write_feedback(conn, &rows)
        })
        .await
    }

    async fn feedback_acked(&self, agent_id: &str, journal_id: &str) -> StoreResult<u64> {
        let (agent_id, journal_id) = (agent_id.to_owned(), journal_id.to_owned());
        self.read(move |conn| feedback::feedback_acked(conn, &agent_id, &journal_id))
            .await
    }

    async fn feedback(&self, filter: FeedbackFilter) -> StoreResult<Vec<FeedbackRow>> {
        self.read(move |conn| feedback::feedback_page(conn, &filter))
            .await
    }

    async fn delete_feedback_before(&self, before: RefTime, max: u32) -> StoreResult<u64> {
        let before_ns = before.as_nanos();
        self.write_background(move |conn| delete_oldest(conn, DELETE_FEEDBACK, before_ns, max))
            .await
    }

    async fn delete_clock_before(&self, before: RefTime, max: u32) -> StoreResult<u64> {
        let before_ns = before.as_nanos();
        self.write_background(move |conn| delete_oldest(conn, DELETE_CLOCK, before_ns, max))
            .await
    }

    async fn delete_audit_before(&self, before: RefTime, max: u32) -> StoreResult<u64> {
        let before_ns = before.as_nanos();
        self.write_background(move |conn| delete_oldest(conn, DELETE_AUDIT, before_ns, max))
            .await
    }

    fn replica(&self) -> Option<String> {
        self.replicated().then(|| self.owner().replica)
    }

    async fn put_events(&self, rows: Vec<EventRow>) -> StoreResult<()> {
        if rows.is_empty() {
            return Ok(());
        }
        self.write(move |conn| events::put_events(conn, &rows))
            .await
    }

    async fn events_after(&self, after_id: u64, limit: u32) -> StoreResult<Vec<EventRow>> {
        self.read(move |conn| events::events_after(conn, after_id, limit))
            .await
    }

    async fn high_water(&self) -> StoreResult<(u64, u64)> {
        self.read(events::high_water).await
    }

    async fn delete_events_before(&self, before: RefTime, max: u32) -> StoreResult<u64> {
        let before_ns = before.as_nanos();
        self.write_background(move |conn| {
            delete_oldest(conn, events::DELETE_EVENTS, before_ns, max)
        })
        .await
    }

    async fn revoke(
        &self,
        rows: Vec<(baton_store::RevocationRow, Vec<AuditRow>)>,
    ) -> StoreResult<Vec<String>> {
        self.write(move |conn| audit::revoke(conn, &rows)).await
    }

    async fn revocations(&self) -> StoreResult<Vec<baton_store::RevocationRow>> {
        self.read(audit::revocations).await
    }

    async fn put_audit(&self, row: AuditRow) -> StoreResult<()> {
        self.write(move |conn| audit::put_audit(conn, &row)).await
    }

    async fn audit(
        &self,
        tenant: Option<&str>,
        since_ns: i64,
        limit: u32,
    ) -> StoreResult<Vec<AuditRow>> {
        let tenant = tenant.map(str::to_owned);
        self.read(move |conn| audit::audit(conn, tenant.as_deref(), since_ns, limit))
            .await
    }
}
    };
}

engine_store!(crate::sqlite::SqliteStore);
engine_store!(crate::postgres::PgStore);
