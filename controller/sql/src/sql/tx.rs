//! [`Tx`] on a connection inside the writer's transaction: each primitive
//! one or a few statements of the shared SQL.

use std::collections::BTreeMap;

use baton_store::{
    AgentRow, AgentUpdateRow, AuditRow, Binding, ClockRow, DeliveryRow, EventRow, FeedbackRow,
    FeedbackStored, GateRow, Grows, HelloRow, LabelOverrides, Member, PackHead, PackKey,
    PackTargets, PackVersionRow, PutPack, RefTime, ReleaseRow, RevocationRow, RolloutRow, SeenRow,
    SessionRow, StoreResult, TargetsRow, Tx, UpdateRow,
};

use super::agents::{self, LeaseClock, Owner};
use super::db::{Db, params, run};
use super::feedback::{self, DELETE_AUDIT, DELETE_CLOCK, DELETE_FEEDBACK, delete_oldest};
use super::{audit, deliveries, events, packs, releases, rollouts, sessions};

/// One transaction of an engine's writer.
pub(crate) struct SqlTx<'a> {
    pub(crate) conn: &'a dyn Db,
    pub(crate) binding: Binding,
    pub(crate) owner: &'a Owner,
    pub(crate) lease_clock: LeaseClock,
    /// Whether writers run in parallel (PostgreSQL's replicas): decisions
    /// take locks, and events are announced to the other replicas'
    /// followers on commit.
    pub(crate) locks: bool,
    /// Whether feedback and clock history are partitioned by day
    /// ([`super::Engine::partitioned`]).
    pub(crate) partitioned: bool,
    /// Set when the transaction wrote events: the engine tells the other
    /// writers' followers once it commits.
    pub(crate) told: &'a std::sync::atomic::AtomicBool,
}

impl SqlTx<'_> {
    /// Events were written: the other replicas' followers are told once
    /// this commits (`Engine::told`), and read at once, not at their next
    /// poll.
    fn tell_followers(&self) {
        self.told.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Advisory lock namespaces (the first key of the two-key form).
const AGENT_LOCKS: i64 = 1;
const TENANT_LOCKS: i64 = 2;
const SESSION_LOCKS: i64 = 3;

impl Tx for SqlTx<'_> {
    fn binding(&self) -> Binding {
        self.binding
    }

    fn locking(&self) -> bool {
        self.locks
    }

    /// A transaction-scoped advisory lock on the id's hash: two ids that
    /// hash alike only wait for each other more than they need to.
    fn lock_agent(&mut self, id: &str) -> StoreResult<()> {
        run(
            self.conn,
            "lock an agent's decisions",
            "SELECT pg_advisory_xact_lock(CAST(?1 AS INTEGER), hashtext(?2))",
            params![AGENT_LOCKS, id],
        )?;
        Ok(())
    }

    /// One statement for all: the ids as a JSON array (any text), locked
    /// in the array's order.
    fn lock_agents(&mut self, ids: &[&str]) -> StoreResult<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let list = super::db::json_array(ids)?;
        run(
            self.conn,
            "lock agents' decisions",
            "SELECT pg_advisory_xact_lock(CAST(?1 AS INTEGER), hashtext(t.id)) \
             FROM json_array_elements_text(CAST(?2 AS TEXT)::json) WITH ORDINALITY AS t(id, n) \
             ORDER BY t.n",
            params![AGENT_LOCKS, list],
        )?;
        Ok(())
    }

    fn lock_tenants(&mut self, tenants: &[&str], exclusive: bool) -> StoreResult<()> {
        let sql = if exclusive {
            "SELECT pg_advisory_xact_lock(CAST(?1 AS INTEGER), hashtext(?2))"
        } else {
            "SELECT pg_advisory_xact_lock_shared(CAST(?1 AS INTEGER), hashtext(?2))"
        };
        for t in tenants {
            run(
                self.conn,
                "lock a tenant's packs",
                sql,
                params![TENANT_LOCKS, t],
            )?;
        }
        Ok(())
    }

    fn agent(&mut self, id: &str) -> StoreResult<Option<AgentRow>> {
        agents::load_agent(self.conn, id)
    }

    fn agents(&mut self, ids: &[&str]) -> StoreResult<Vec<AgentRow>> {
        // `locks`: PostgreSQL's replicas (its JSON functions).
        if self.locks {
            agents::load_agents_as_array(self.conn, ids)
        } else {
            agents::load_agents(self.conn, ids)
        }
    }

    fn session_gen(&mut self, id: &str) -> StoreResult<Option<u64>> {
        agents::session_gen(self.conn, id)
    }

    fn write_hello(&mut self, h: &HelloRow) -> StoreResult<()> {
        agents::refuse_a_second_machine(self.conn, h, self.owner, self.lease_clock)?;
        agents::write_hello(self.conn, h, self.owner)
    }

    fn write_seen(&mut self, id: &str, seen: &SeenRow) -> StoreResult<()> {
        let p99 = seen.lateness_p99.map(baton_model::time::span_ns);
        let h = seen.health;
        let outbox = h
            .map(|h| baton_store::fits(h.outbox_entries, "outbox entries"))
            .transpose()?;
        let growing = h.map(|h| i64::from(h.outbox_growing));
        let late = h.map(|h| i64::from(h.late_recently));
        agents::update_agent(
            self.conn,
            id,
            "UPDATE agents SET connected = ?2, last_seen_ns = ?3, \
             lateness_p99_ns = COALESCE(?4, lateness_p99_ns), \
             outbox_entries = COALESCE(?5, outbox_entries), \
             outbox_growing = COALESCE(?6, outbox_growing), \
             late_recently = COALESCE(?7, late_recently) WHERE id = ?1",
            params![
                id,
                i64::from(seen.connected),
                seen.at.as_nanos(),
                p99,
                outbox,
                growing,
                late
            ],
        )
    }

    /// `last_seen_ns` is left as it was: it stays the last message
    /// actually received. A stream is held only by a replica whose lease
    /// (at the epoch it took the hello under) is live, and not by this
    /// one, which is starting: on a single controller, which has no lease
    /// rows, none.
    fn write_trust(&mut self, id: &str, trust: &baton_model::TrustRow) -> StoreResult<()> {
        agents::write_trust(self.conn, id, trust)
    }

    fn disconnect_unowned(&mut self) -> StoreResult<()> {
        let now_us = (self.lease_clock)(self.conn)?;
        agents::disconnect_unowned(self.conn, now_us, Some(&self.owner.replica))?;
        Ok(())
    }

    fn write_clock(&mut self, id: &str, clock: &ClockRow) -> StoreResult<()> {
        agents::write_clock(self.conn, id, clock)
    }

    fn write_overrides(
        &mut self,
        id: &str,
        tenant: &str,
        set: &LabelOverrides,
        reset: &[String],
    ) -> StoreResult<()> {
        agents::write_labels(self.conn, id, tenant, set, reset)
    }

    fn write_grant(
        &mut self,
        id: &str,
        tenant: &str,
        granted: bool,
        at: RefTime,
    ) -> StoreResult<()> {
        agents::write_grant(self.conn, id, tenant, granted, at.as_nanos())
    }

    fn forget_agent(&mut self, id: &str, tenant: Option<&str>) -> StoreResult<bool> {
        agents::write_forget(self.conn, id, tenant)
    }

    fn pack_targets(
        &mut self,
        key: &PackKey,
        cohort_of: Option<&str>,
    ) -> StoreResult<Option<PackTargets>> {
        deliveries::load_pack_targets(self.conn, key, cohort_of)
    }

    fn packs_for(&mut self, agent: &AgentRow) -> StoreResult<Vec<PackTargets>> {
        deliveries::packs_for(self.conn, agent, self.binding)
    }

    fn pack_candidates(&mut self, key: &PackKey, targets: &TargetsRow) -> StoreResult<Vec<String>> {
        deliveries::candidates(self.conn, key, targets, self.binding)
    }

    fn pack_head(&mut self, key: &PackKey) -> StoreResult<Option<PackHead>> {
        rollouts::pack_head(self.conn, key)
    }

    fn write_version(&mut self, pack: &PackVersionRow) -> StoreResult<PutPack> {
        packs::write_pack(self.conn, pack)
    }

    fn write_cancel(&mut self, key: &PackKey, at: RefTime) -> StoreResult<bool> {
        packs::write_cancel(self.conn, key, at.as_nanos())
    }

    fn write_gate(&mut self, key: &PackKey, gate: Option<&GateRow>) -> StoreResult<()> {
        rollouts::set_gate(self.conn, key, gate)
    }

    fn write_stops(&mut self, key: &PackKey, stops: &BTreeMap<String, u64>) -> StoreResult<()> {
        packs::write_stops(self.conn, key, stops)
    }

    fn rollout(&mut self, key: &PackKey, version: Option<u64>) -> StoreResult<Option<RolloutRow>> {
        rollouts::load(self.conn, key, version)
    }

    fn open_rollouts(&mut self, key: &PackKey) -> StoreResult<Vec<RolloutRow>> {
        rollouts::open(self.conn, key)
    }

    fn insert_rollout(&mut self, row: &RolloutRow) -> StoreResult<()> {
        rollouts::insert(self.conn, row)
    }

    fn cas_rollout(&mut self, row: &RolloutRow) -> StoreResult<bool> {
        rollouts::compare_and_set(self.conn, row)
    }

    fn admit(
        &mut self,
        key: &PackKey,
        version: u64,
        members: &[(String, Member)],
    ) -> StoreResult<()> {
        rollouts::admit(self.conn, key, version, members)
    }

    fn skip_members(&mut self, key: &PackKey, version: u64, ids: &[String]) -> StoreResult<()> {
        rollouts::skip(self.conn, key, version, ids)
    }

    fn row(&mut self, id: &str, key: &PackKey) -> StoreResult<Option<DeliveryRow>> {
        deliveries::load_row(self.conn, id, key)
    }

    fn rows_of_agent(&mut self, id: &str) -> StoreResult<Vec<DeliveryRow>> {
        deliveries::rows_of_agent(self.conn, id)
    }

    fn rows_of_pack(&mut self, key: &PackKey) -> StoreResult<Vec<DeliveryRow>> {
        deliveries::rows_of_pack(self.conn, key)
    }

    fn put_rows(&mut self, rows: &[DeliveryRow]) -> StoreResult<()> {
        deliveries::store_rows(self.conn, rows)
    }

    fn rows_of_pairs(&mut self, pairs: &[(String, PackKey)]) -> StoreResult<Vec<DeliveryRow>> {
        // `locks`: PostgreSQL's replicas (its JSON functions).
        if self.locks {
            deliveries::rows_of_pairs_as_array(self.conn, pairs)
        } else {
            deliveries::rows_of_pairs(self.conn, pairs)
        }
    }

    fn delete_rows(&mut self, pairs: &[(String, PackKey)]) -> StoreResult<()> {
        for (id, key) in pairs {
            deliveries::delete_row(self.conn, id, key)?;
        }
        Ok(())
    }

    fn clear_staged(&mut self, id: &str) -> StoreResult<()> {
        deliveries::clear_staged(self.conn, id)
    }

    fn put_feedback(&mut self, rows: &[FeedbackRow]) -> StoreResult<FeedbackStored> {
        feedback::write_feedback(self.conn, rows)
    }

    fn announce(&mut self, rows: &[DeliveryRow], at: RefTime) -> StoreResult<()> {
        if !self.locks || rows.is_empty() {
            return Ok(());
        }
        let changed = rows
            .iter()
            .map(|r| (r.agent_id.as_str(), r.tenant.as_str(), r.pack.as_str()));
        let conn = self.conn;
        let grouped = || events::every_replica_reads_groups(conn);
        let events = events::delivery_groups(&self.owner.replica, changed, grouped, at)?;
        events::put_events(self.conn, &events)?;
        self.tell_followers();
        Ok(())
    }

    fn put_events(&mut self, rows: &[EventRow]) -> StoreResult<()> {
        let rows: Vec<events::StoredEvent<'_>> = rows.iter().map(events::StoredEvent::of).collect();
        events::put_events(self.conn, &rows)?;
        self.tell_followers();
        Ok(())
    }

    fn put_audit(&mut self, row: &AuditRow) -> StoreResult<()> {
        audit::put_audit(self.conn, row)
    }

    fn revoke(&mut self, rows: &[(RevocationRow, Vec<AuditRow>)]) -> StoreResult<Vec<String>> {
        audit::revoke(self.conn, rows)
    }

    fn delete_before(&mut self, what: Grows, before: RefTime, max: u32) -> StoreResult<u64> {
        let sql = match what {
            Grows::Feedback if self.partitioned => feedback::DELETE_FEEDBACK_DEFAULT,
            Grows::Clock if self.partitioned => feedback::DELETE_CLOCK_DEFAULT,
            Grows::Feedback => DELETE_FEEDBACK,
            Grows::Clock => DELETE_CLOCK,
            Grows::Audit => DELETE_AUDIT,
            Grows::Events => events::DELETE_EVENTS,
        };
        delete_oldest(self.conn, sql, before.as_nanos(), max)
    }

    fn lock_sessions(&mut self, serial: &str) -> StoreResult<()> {
        run(
            self.conn,
            "lock a certificate's sessions",
            "SELECT pg_advisory_xact_lock(CAST(?1 AS INTEGER), hashtext(?2))",
            params![SESSION_LOCKS, serial],
        )?;
        Ok(())
    }

    fn is_revoked(&mut self, serial: &str) -> StoreResult<bool> {
        sessions::is_revoked(self.conn, serial)
    }

    fn sessions_of(&mut self, serial: &str) -> StoreResult<Vec<SessionRow>> {
        sessions::sessions_of(self.conn, serial)
    }

    fn count_sessions(&mut self) -> StoreResult<u64> {
        sessions::count_sessions(self.conn)
    }

    fn put_session(&mut self, row: &SessionRow) -> StoreResult<()> {
        sessions::put_session(self.conn, row)
    }

    fn delete_sessions(&mut self, id_hashes: &[String]) -> StoreResult<u64> {
        sessions::delete_sessions(self.conn, id_hashes)
    }

    fn delete_sessions_of(&mut self, serials: &[String]) -> StoreResult<u64> {
        sessions::delete_sessions_of(self.conn, serials)
    }

    fn delete_ended_sessions(&mut self, now: RefTime, max: u32) -> StoreResult<u64> {
        sessions::delete_ended_sessions(self.conn, now.as_nanos(), max)
    }

    fn add_login_failure(&mut self, source: &str, window: RefTime) -> StoreResult<u64> {
        sessions::add_login_failure(self.conn, source, window.as_nanos())
    }

    fn release(&mut self, version: &str, arch: &str) -> StoreResult<Option<ReleaseRow>> {
        releases::release(self.conn, version, arch)
    }

    fn put_release(&mut self, row: &ReleaseRow) -> StoreResult<()> {
        releases::put_release(self.conn, row)
    }

    fn put_release_piece(
        &mut self,
        version: &str,
        arch: &str,
        index: u64,
        data: &[u8],
    ) -> StoreResult<()> {
        releases::put_piece(self.conn, version, arch, index, data)
    }

    fn write_update(&mut self, id: &str, update: &UpdateRow) -> StoreResult<()> {
        agents::write_update(self.conn, id, update)
    }

    fn open_agent_updates(&mut self) -> StoreResult<Vec<AgentUpdateRow>> {
        releases::open_updates(self.conn)
    }

    fn lock_agent_updates(&mut self) -> StoreResult<()> {
        // Taken before the open updates are read: a second start waits,
        // then sees the first's update open and supersedes it.
        run(
            self.conn,
            "serialize new agent updates",
            "LOCK TABLE agent_updates IN SHARE ROW EXCLUSIVE MODE",
            &[],
        )?;
        Ok(())
    }

    fn insert_agent_update(&mut self, row: &AgentUpdateRow) -> StoreResult<u64> {
        releases::insert_update(self.conn, row)
    }

    fn cas_agent_update(&mut self, row: &AgentUpdateRow) -> StoreResult<bool> {
        releases::cas_update(self.conn, row)
    }

    fn set_release_targets(
        &mut self,
        update: u64,
        version: &str,
        ids: &[String],
    ) -> StoreResult<()> {
        releases::set_targets(self.conn, update, version, ids)
    }

    fn clear_release_targets(&mut self, update: u64) -> StoreResult<()> {
        releases::clear_targets(self.conn, update)
    }

    fn delete_login_failures_before(&mut self, before: RefTime, max: u32) -> StoreResult<u64> {
        sessions::delete_login_failures_before(self.conn, before.as_nanos(), max)
    }
}
