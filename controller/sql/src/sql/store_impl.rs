//! [`Store`] for each [`Engine`]: each read one query on the read pool;
//! each transaction one command on the engine's writer, its primitives
//! [`SqlTx`]'s.

// What the macro's body names, for its expansion in each engine's module
// (`use $crate::sql::store_impl::*` inside it).
pub(crate) use async_trait::async_trait;

pub(crate) use super::agents;
pub(crate) use super::codec::{DELIVERY_COLUMNS, decode_delivery, u64_from_db};
pub(crate) use super::db::{col, params, query_all};
pub(crate) use super::feedback;
pub(crate) use super::tx::SqlTx;
pub(crate) use super::{Engine, audit, deliveries, events, packs, releases, rollouts, sessions};
pub(crate) use baton_model::RefTime;
pub(crate) use baton_store::{
    AgentFilter, AgentRow, AuditRow, Binding, ClockRow, DeliveryRow, DeliveryState, EventRow,
    FeedbackFilter, FeedbackRow, FeedbackScope, MAX_PAGE, Mark, PackKey, PackSummaryRow,
    PackVersionRow, RolloutRow, Store, StoreError, StoreResult, TxJob, page,
};

/// [`Store`] for an [`Engine`]: written once, implemented for each
/// engine's store type (a blanket `impl<E: Engine> Store for E` would
/// implement a trait of another crate for every type). Each engine's
/// module invokes it for its store, so the shared SQL names no engine; its
/// body's names come from this module, in a block of their own.
macro_rules! engine_store {
    ($engine:ty) => {
const _: () = {
use $crate::sql::store_impl::*;
#[async_trait]
impl Store for $engine {
    fn binding(&self) -> Binding {
        Engine::binding(self)
    }

    async fn transact(&self, mut job: TxJob) -> StoreResult<()> {
        let binding = Engine::binding(self);
        let owner = self.owner();
        let lease_clock = self.lease_clock();
        let locks = self.locks();
        let partitioned = self.partitioned();
        let told = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = std::sync::Arc::clone(&told);
        self.write(move |conn| {
            job(&mut SqlTx {
                conn,
                binding,
                owner: &owner,
                lease_clock,
                locks,
                partitioned,
                told: &flag,
            })
        })
        .await?;
        if told.load(std::sync::atomic::Ordering::Relaxed) {
            Engine::told(self);
        }
        Ok(())
    }

    async fn append_feedback(
        &self,
        session: u64,
        rows: Vec<FeedbackRow>,
    ) -> StoreResult<baton_store::FeedbackStored> {
        Engine::stream_feedback(self, session, rows).await
    }

    async fn append_clock(
        &self,
        id: &str,
        session: u64,
        clock: baton_store::ClockRow,
    ) -> StoreResult<()> {
        Engine::stream_clock(self, id, session, clock).await
    }

    async fn append_seen(
        &self,
        id: &str,
        session: u64,
        seen: baton_model::SeenRow,
    ) -> StoreResult<()> {
        Engine::stream_seen(self, id, session, seen).await
    }

    async fn drop_partitions_before(
        &self,
        what: baton_store::Grows,
        before: RefTime,
    ) -> StoreResult<u64> {
        Engine::drop_partitions_before(self, what, before).await
    }

    async fn news(&self, at_most: std::time::Duration) {
        Engine::news(self, at_most).await
    }

    async fn transact_background(&self, mut job: TxJob) -> StoreResult<()> {
        let binding = Engine::binding(self);
        let owner = self.owner();
        let lease_clock = self.lease_clock();
        let locks = self.locks();
        let partitioned = self.partitioned();
        let told = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = std::sync::Arc::clone(&told);
        self.write_background(move |conn| {
            job(&mut SqlTx {
                conn,
                binding,
                owner: &owner,
                lease_clock,
                locks,
                partitioned,
                told: &flag,
            })
        })
        .await?;
        if told.load(std::sync::atomic::Ordering::Relaxed) {
            Engine::told(self);
        }
        Ok(())
    }

    async fn clock_history(
        &self,
        id: &str,
        since: RefTime,
        limit: u32,
    ) -> StoreResult<Vec<ClockRow>> {
        let id = id.to_owned();
        let since_ns = since.as_nanos();
        self.read(move |conn| agents::clock_history(conn, &id, since_ns, limit))
            .await
    }

    async fn agents(&self, filter: AgentFilter) -> StoreResult<Vec<AgentRow>> {
        let binding = Engine::binding(self);
        self.read(move |conn| agents::agents_page(conn, &filter, binding))
            .await
    }

    async fn agent_counts(&self, filter: AgentFilter) -> StoreResult<baton_store::FleetCounts> {
        let binding = Engine::binding(self);
        self.read(move |conn| agents::agent_counts(conn, &filter, binding))
            .await
    }

    async fn session(
        &self,
        id_hash: &str,
        now: RefTime,
    ) -> StoreResult<Option<baton_store::SessionRow>> {
        let id_hash = id_hash.to_owned();
        self.read(move |conn| sessions::session(conn, &id_hash, now.as_nanos()))
            .await
    }

    async fn login_failures(
        &self,
        source: &str,
        since: RefTime,
    ) -> StoreResult<Vec<(RefTime, u64)>> {
        let source = source.to_owned();
        self.read(move |conn| sessions::login_failures(conn, &source, since.as_nanos()))
            .await
    }

    async fn agent(&self, id: &str) -> StoreResult<Option<AgentRow>> {
        let id = id.to_owned();
        self.read(move |conn| agents::load_agent(conn, &id)).await
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

    async fn deliveries_of_agent(&self, id: &str) -> StoreResult<Vec<DeliveryRow>> {
        let id = id.to_owned();
        self.read(move |conn| deliveries::rows_of_agent(conn, &id)).await
    }

    async fn deliveries_of(&self, pairs: &[(String, PackKey)]) -> StoreResult<Vec<DeliveryRow>> {
        let mut pairs = pairs.to_vec();
        pairs.sort();
        pairs.dedup();
        // `locks`: PostgreSQL's replicas (its JSON functions).
        if Engine::locks(self) {
            self.read(move |conn| deliveries::rows_of_pairs_as_array(conn, &pairs))
                .await
        } else {
            self.read(move |conn| deliveries::rows_of_pairs(conn, &pairs))
                .await
        }
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

    /// One scan of the state index on SQLite, of the table on PostgreSQL
    /// (which keeps no state index: see migration 19), a few hundred
    /// thousand rows for a large fleet: tens of milliseconds, once per
    /// scrape, on the read pool.
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
                        .ok_or_else(|| StoreError::corrupt("delivery state", format!("unknown: {state:?}")))?;
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

    async fn feedback_acked(&self, agent_id: &str, journal_id: &str) -> StoreResult<u64> {
        let (agent_id, journal_id) = (agent_id.to_owned(), journal_id.to_owned());
        self.read(move |conn| feedback::feedback_acked(conn, &agent_id, &journal_id))
            .await
    }

    async fn feedback(&self, filter: FeedbackFilter) -> StoreResult<Vec<FeedbackRow>> {
        self.read(move |conn| feedback::feedback_page(conn, &filter))
            .await
    }

    async fn events_after(&self, after: Mark, limit: u32) -> StoreResult<(Vec<EventRow>, Mark)> {
        let horizon = self.horizon();
        self.read(move |conn| events::events_after(conn, after, limit, horizon(conn)?))
            .await
    }

    async fn feedback_after(
        &self,
        after: Mark,
        scope: FeedbackScope<'_>,
        limit: u32,
    ) -> StoreResult<(Vec<FeedbackRow>, Mark)> {
        let horizon = self.horizon();
        // The read runs on a pool thread: it owns what it names.
        let pack = match scope {
            FeedbackScope::All => None,
            FeedbackScope::Pack { key, since } => Some((key.clone(), since)),
        };
        self.read(move |conn| {
            let scope = pack
                .as_ref()
                .map_or(FeedbackScope::All, |(key, since)| FeedbackScope::Pack {
                    key,
                    since: *since,
                });
            feedback::feedback_after(conn, after, scope, limit, horizon(conn)?)
        })
        .await
    }

    async fn feedback_mark_at(&self, since: RefTime) -> StoreResult<Mark> {
        let horizon = self.horizon();
        self.read(move |conn| {
            let h = horizon(conn)?;
            feedback::feedback_mark_at(conn, since, h)
        })
        .await
    }

    async fn high_water(&self) -> StoreResult<(Mark, Mark)> {
        let horizon = self.horizon();
        self.read(move |conn| {
            let h = horizon(conn)?;
            Ok((
                events::high_water(conn, "events", h)?,
                events::high_water(conn, "feedback", h)?,
            ))
        })
        .await
    }

    async fn releases(&self) -> StoreResult<Vec<baton_store::ReleaseRow>> {
        self.read(releases::releases).await
    }

    async fn release_piece(
        &self,
        version: &str,
        arch: &str,
        index: u64,
    ) -> StoreResult<Option<Vec<u8>>> {
        let (version, arch) = (version.to_owned(), arch.to_owned());
        self.read(move |conn| releases::piece(conn, &version, &arch, index))
            .await
    }

    async fn release_offer(&self, id: &str) -> StoreResult<Option<baton_store::ReleaseRow>> {
        let id = id.to_owned();
        self.read(move |conn| releases::offer(conn, &id)).await
    }

    async fn agent_updates(
        &self,
        open_only: bool,
    ) -> StoreResult<Vec<baton_store::AgentUpdateRow>> {
        self.read(move |conn| releases::updates(conn, open_only))
            .await
    }

    async fn agent_update(
        &self,
        id: Option<u64>,
    ) -> StoreResult<Option<baton_store::AgentUpdateRow>> {
        self.read(move |conn| releases::update(conn, id)).await
    }

    async fn revocations(&self) -> StoreResult<Vec<baton_store::RevocationRow>> {
        self.read(audit::revocations).await
    }

    async fn audit(
        &self,
        tenant: Option<&str>,
        since: RefTime,
        limit: u32,
    ) -> StoreResult<Vec<AuditRow>> {
        let tenant = tenant.map(str::to_owned);
        let since_ns = since.as_nanos();
        self.read(move |conn| audit::audit(conn, tenant.as_deref(), since_ns, limit))
            .await
    }

    fn replica(&self) -> Option<String> {
        self.replicated().then(|| self.owner().replica)
    }
}
};
    };
}

pub(crate) use engine_store;
