//! The memory store's primitives: plain map operations on its state,
//! written to be obviously right (the candidate queries return every
//! agent and every pack of its tenants: the reference needs no index).
//! Like a database column, the state refuses integers past `i64::MAX`.

use std::collections::BTreeMap;

use super::state::{PackRec, State};
use super::{feedback, records, rollouts};
use crate::tx::{Grows, PackHead, Tx};
use crate::{
    AgentRow, AgentUpdateRow, AuditRow, Binding, ClockRow, DeliveryRow, EventRow, FeedbackRow,
    FeedbackStored, GateRow, HelloRow, LabelOverrides, Member, PackKey, PackTargets,
    PackVersionRow, PutPack, RefTime, ReleaseRow, RevocationRow, RolloutRow, SeenRow, SessionRow,
    StoreError, StoreResult, TargetsRow, TrustRow, UpdateRow, fits,
};

/// A transaction on the memory store's state (the store keeps a copy to
/// put back if the job fails).
pub(super) struct MemTx<'a> {
    pub(super) s: &'a mut State,
    pub(super) binding: Binding,
}

fn no_agent(id: &str) -> StoreError {
    StoreError::NoSuchAgent { id: id.to_owned() }
}

fn fits_row(r: &DeliveryRow) -> StoreResult<()> {
    fits(r.version, "version")?;
    if let Some(h) = r.held {
        fits(h.version, "held version")?;
    }
    if let Some(f) = &r.refusal {
        fits(f.version, "refused version")?;
    }
    if let Some(st) = r.staged {
        fits(st.version, "staged version")?;
    }
    Ok(())
}

impl Tx for MemTx<'_> {
    fn binding(&self) -> Binding {
        self.binding
    }

    fn agent(&mut self, id: &str) -> StoreResult<Option<AgentRow>> {
        Ok(self.s.agent(id))
    }

    fn agents(&mut self, ids: &[&str]) -> StoreResult<Vec<AgentRow>> {
        let mut ids: Vec<&str> = ids.to_vec();
        ids.sort_unstable();
        ids.dedup();
        Ok(ids.into_iter().filter_map(|id| self.s.agent(id)).collect())
    }

    fn session_gen(&mut self, id: &str) -> StoreResult<Option<u64>> {
        Ok(self.s.agents.get(id).map(|a| a.session_gen))
    }

    fn write_hello(&mut self, h: &HelloRow) -> StoreResult<()> {
        fits(h.session_gen_seen, "session generation")?;
        for held in &h.held {
            fits(held.version, "held version")?;
        }
        let prev = self.s.agents.get(&h.id).cloned();
        let mut a = prev.unwrap_or_else(|| AgentRow::new(&h.id, &h.journal_id));
        a.session_gen = a.session_gen.max(h.session_gen_seen) + 1;
        fits(a.session_gen, "session generation")?;
        a.labels = h.labels.clone();
        a.agent_version = h.agent_version.clone();
        a.trust = h.trust.clone();
        a.arch = h.arch.clone();
        if let Some(u) = &h.update {
            a.update = Some(u.clone());
        }
        a.journal_id = h.journal_id.clone();
        a.connected = true;
        a.last_seen = h.at;
        self.s.agents.insert(h.id.clone(), a);
        if let Some(t) = &h.cert_tenants {
            self.s
                .cert_tenants
                .insert(h.id.clone(), t.iter().cloned().collect());
        }
        Ok(())
    }

    fn write_seen(&mut self, id: &str, seen: &SeenRow) -> StoreResult<()> {
        fits(
            seen.health.map_or(0, |h| h.outbox_entries),
            "outbox entries",
        )?;
        let a = self.s.agents.get_mut(id).ok_or_else(|| no_agent(id))?;
        a.connected = seen.connected;
        a.last_seen = seen.at;
        if let Some(p99) = seen.lateness_p99 {
            a.lateness_p99 = p99;
        }
        if let Some(h) = seen.health {
            a.health = h;
        }
        Ok(())
    }

    fn write_trust(&mut self, id: &str, trust: &TrustRow) -> StoreResult<()> {
        let a = self.s.agents.get_mut(id).ok_or_else(|| no_agent(id))?;
        a.trust = Some(trust.clone());
        Ok(())
    }

    fn disconnect_unowned(&mut self) -> StoreResult<()> {
        for a in self.s.agents.values_mut() {
            a.connected = false;
        }
        Ok(())
    }

    fn write_clock(&mut self, id: &str, clock: &ClockRow) -> StoreResult<()> {
        let a = self.s.agents.get_mut(id).ok_or_else(|| no_agent(id))?;
        if a.clock.as_ref().is_none_or(|c| c.at < clock.at) {
            a.clock = Some(clock.clone());
        }
        self.s
            .clock
            .entry((id.to_string(), clock.at.as_nanos()))
            .or_insert_with(|| clock.clone());
        Ok(())
    }

    fn write_overrides(
        &mut self,
        id: &str,
        tenant: &str,
        set: &LabelOverrides,
        reset: &[String],
    ) -> StoreResult<()> {
        let a = self.s.agents.get_mut(id).ok_or_else(|| no_agent(id))?;
        let o = a.overrides.entry(tenant.to_string()).or_default();
        o.extend(set.clone());
        for k in reset {
            o.remove(k);
        }
        if o.is_empty() {
            a.overrides.remove(tenant);
        }
        Ok(())
    }

    fn write_grant(
        &mut self,
        id: &str,
        tenant: &str,
        granted: bool,
        _at: RefTime,
    ) -> StoreResult<()> {
        let g = self.s.grants.entry(id.to_string()).or_default();
        if granted {
            g.insert(tenant.to_string());
        } else {
            g.remove(tenant);
        }
        if g.is_empty() {
            self.s.grants.remove(id);
        }
        Ok(())
    }

    fn forget_agent(&mut self, id: &str, tenant: Option<&str>) -> StoreResult<bool> {
        let s = &mut *self.s;
        let existed = s.agents.contains_key(id);
        s.deliveries
            .retain(|(a, k), _| !(a == id && tenant.is_none_or(|t| k.tenant == t)));
        match tenant {
            Some(t) => {
                if let Some(a) = s.agents.get_mut(id) {
                    a.overrides.remove(t);
                }
                if let Some(g) = s.grants.get_mut(id) {
                    g.remove(t);
                }
            }
            None => {
                s.agents.remove(id);
                s.cert_tenants.remove(id);
                s.grants.remove(id);
                s.clock.retain(|(a, _), _| a != id);
                s.releases.forget_agent(id);
            }
        }
        Ok(existed)
    }

    fn pack_targets(
        &mut self,
        key: &PackKey,
        _cohort_of: Option<&str>,
    ) -> StoreResult<Option<PackTargets>> {
        Ok(self.s.pack_targets(key))
    }

    fn packs_for(&mut self, agent: &AgentRow) -> StoreResult<Vec<PackTargets>> {
        let binding = self.binding;
        let keys: Vec<PackKey> = self
            .s
            .packs
            .iter()
            .filter(|(k, p)| p.cancelled.is_none() && agent.serves(&k.tenant, binding))
            .map(|(k, _)| k.clone())
            .collect();
        Ok(keys.iter().filter_map(|k| self.s.pack_targets(k)).collect())
    }

    fn pack_candidates(
        &mut self,
        _key: &PackKey,
        _targets: &TargetsRow,
    ) -> StoreResult<Vec<String>> {
        Ok(self.s.agents.keys().cloned().collect())
    }

    fn pack_head(&mut self, key: &PackKey) -> StoreResult<Option<PackHead>> {
        Ok(self.s.packs.get(key).map(|p| PackHead {
            latest: p.latest,
            cancelled: p.cancelled.is_some(),
            gate: p.gate.clone(),
        }))
    }

    fn write_version(&mut self, p: &PackVersionRow) -> StoreResult<PutPack> {
        fits(p.version, "pack version")?;
        let s = &mut *self.s;
        let key = p.key();
        if let Some(rec) = s.packs.get(&key) {
            if rec.latest > p.version {
                return Err(StoreError::VersionOlder {
                    tenant: p.tenant.clone(),
                    pack: p.pack.clone(),
                    version: p.version,
                    latest: rec.latest,
                });
            }
            if rec.latest == p.version {
                match s.versions.get(&(key.clone(), p.version)) {
                    Some(v) if v.yaml == p.yaml => return Ok(PutPack::Unchanged),
                    Some(_) => {
                        return Err(StoreError::VersionTaken {
                            tenant: p.tenant.clone(),
                            pack: p.pack.clone(),
                            version: p.version,
                        });
                    }
                    // A withdrawn pack the store had lost: its version can
                    // be stored again.
                    None => {}
                }
            }
        }
        let (gate, stopped) = match s.packs.get(&key) {
            Some(r) => (r.gate.clone(), r.stopped.clone()),
            None => Default::default(),
        };
        s.packs.insert(
            key.clone(),
            PackRec {
                latest: p.version,
                targets: p.targets.clone(),
                pushed: p.pushed,
                cancelled: None,
                gate,
                stopped,
            },
        );
        s.versions.insert((key, p.version), p.clone());
        Ok(PutPack::Stored)
    }

    fn write_cancel(&mut self, key: &PackKey, at: RefTime) -> StoreResult<bool> {
        let s = &mut *self.s;
        if let Some(p) = s.packs.get_mut(key) {
            p.cancelled.get_or_insert(at);
            return Ok(true);
        }
        let held = s
            .deliveries
            .iter()
            .filter(|((_, k), _)| k == key)
            .filter_map(|(_, r)| r.held.map(|h| h.version))
            .max();
        let Some(held) = held else {
            return Ok(false);
        };
        s.packs.insert(
            key.clone(),
            PackRec {
                latest: held,
                targets: TargetsRow::Nobody,
                pushed: at,
                cancelled: Some(at),
                gate: None,
                stopped: BTreeMap::new(),
            },
        );
        Ok(true)
    }

    fn write_gate(&mut self, key: &PackKey, gate: Option<&GateRow>) -> StoreResult<()> {
        if let Some(p) = self.s.packs.get_mut(key) {
            p.gate = gate.cloned();
        }
        Ok(())
    }

    fn write_stops(&mut self, key: &PackKey, stops: &BTreeMap<String, u64>) -> StoreResult<()> {
        if let Some(p) = self.s.packs.get_mut(key) {
            p.stopped = stops.clone();
        }
        Ok(())
    }

    fn rollout(&mut self, key: &PackKey, version: Option<u64>) -> StoreResult<Option<RolloutRow>> {
        Ok(rollouts::load(self.s, key, version))
    }

    fn open_rollouts(&mut self, key: &PackKey) -> StoreResult<Vec<RolloutRow>> {
        Ok(rollouts::open(self.s, key))
    }

    fn insert_rollout(&mut self, row: &RolloutRow) -> StoreResult<()> {
        fits(row.version, "rollout version")?;
        self.s
            .rollouts
            .insert((row.key(), row.version), row.clone());
        Ok(())
    }

    fn cas_rollout(&mut self, row: &RolloutRow) -> StoreResult<bool> {
        Ok(rollouts::compare_and_set(self.s, row))
    }

    fn admit(
        &mut self,
        key: &PackKey,
        version: u64,
        members: &[(String, Member)],
    ) -> StoreResult<()> {
        if let Some(r) = self.s.rollouts.get_mut(&(key.clone(), version)) {
            for (id, m) in members {
                r.members.entry(id.clone()).or_insert(*m);
            }
        }
        Ok(())
    }

    fn skip_members(&mut self, key: &PackKey, version: u64, ids: &[String]) -> StoreResult<()> {
        if let Some(r) = self.s.rollouts.get_mut(&(key.clone(), version)) {
            for id in ids {
                if let Some(m) = r.members.get_mut(id) {
                    m.skipped = true;
                }
            }
        }
        Ok(())
    }

    fn row(&mut self, id: &str, key: &PackKey) -> StoreResult<Option<DeliveryRow>> {
        Ok(self
            .s
            .deliveries
            .get(&(id.to_string(), key.clone()))
            .cloned())
    }

    fn rows_of_agent(&mut self, id: &str) -> StoreResult<Vec<DeliveryRow>> {
        Ok(self.s.rows_of(id))
    }

    fn rows_of_pack(&mut self, key: &PackKey) -> StoreResult<Vec<DeliveryRow>> {
        Ok(self
            .s
            .deliveries
            .iter()
            .filter(|((_, k), _)| k == key)
            .map(|(_, r)| r.clone())
            .collect())
    }

    fn put_rows(&mut self, rows: &[DeliveryRow]) -> StoreResult<()> {
        rows.iter().try_for_each(fits_row)?;
        for r in rows {
            self.s
                .deliveries
                .insert((r.agent_id.clone(), r.key()), r.clone());
        }
        Ok(())
    }

    fn delete_rows(&mut self, pairs: &[(String, PackKey)]) -> StoreResult<()> {
        for p in pairs {
            self.s.deliveries.remove(p);
        }
        Ok(())
    }

    fn clear_staged(&mut self, id: &str) -> StoreResult<()> {
        for ((a, _), r) in self.s.deliveries.iter_mut() {
            if a == id {
                r.staged = None;
            }
        }
        Ok(())
    }

    fn put_feedback(&mut self, rows: &[FeedbackRow]) -> StoreResult<FeedbackStored> {
        feedback::put(self.s, rows)
    }

    fn put_events(&mut self, rows: &[EventRow]) -> StoreResult<()> {
        for e in rows {
            self.s.next_event_id += 1;
            let id = self.s.next_event_id;
            self.s.events.insert(id, EventRow { id, ..e.clone() });
        }
        Ok(())
    }

    fn put_audit(&mut self, row: &AuditRow) -> StoreResult<()> {
        self.s.next_audit_id += 1;
        self.s.audit.insert(self.s.next_audit_id, row.clone());
        Ok(())
    }

    fn revoke(&mut self, rows: &[(RevocationRow, Vec<AuditRow>)]) -> StoreResult<Vec<String>> {
        Ok(records::revoke(self.s, rows))
    }

    fn is_revoked(&mut self, serial: &str) -> StoreResult<bool> {
        Ok(self.s.revocations.contains_key(serial))
    }

    fn sessions_of(&mut self, serial: &str) -> StoreResult<Vec<SessionRow>> {
        let mut rows: Vec<SessionRow> = self
            .s
            .sessions
            .values()
            .filter(|r| r.serial == serial)
            .cloned()
            .collect();
        rows.sort_by(|a, b| (a.created, &a.id_hash).cmp(&(b.created, &b.id_hash)));
        Ok(rows)
    }

    fn count_sessions(&mut self) -> StoreResult<u64> {
        Ok(self.s.sessions.len() as u64)
    }

    fn put_session(&mut self, row: &SessionRow) -> StoreResult<()> {
        if self.s.sessions.contains_key(&row.id_hash) {
            return Err(StoreError::Invalid(format!(
                "session {} is stored already",
                row.id_hash
            )));
        }
        self.s.sessions.insert(row.id_hash.clone(), row.clone());
        Ok(())
    }

    fn delete_sessions(&mut self, id_hashes: &[String]) -> StoreResult<u64> {
        Ok(id_hashes
            .iter()
            .filter(|id| self.s.sessions.remove(*id).is_some())
            .count() as u64)
    }

    fn delete_sessions_of(&mut self, serials: &[String]) -> StoreResult<u64> {
        let before = self.s.sessions.len();
        self.s.sessions.retain(|_, r| !serials.contains(&r.serial));
        Ok((before - self.s.sessions.len()) as u64)
    }

    fn delete_ended_sessions(&mut self, now: RefTime, max: u32) -> StoreResult<u64> {
        Ok(records::delete_ended_sessions(self.s, now, max))
    }

    fn add_login_failure(&mut self, source: &str, window: RefTime) -> StoreResult<u64> {
        let n = self
            .s
            .login_failures
            .entry((source.to_owned(), window.as_nanos()))
            .or_default();
        *n += 1;
        Ok(*n)
    }

    fn delete_login_failures_before(&mut self, before: RefTime, max: u32) -> StoreResult<u64> {
        Ok(records::delete_login_failures_before(self.s, before, max))
    }

    fn release(&mut self, version: &str, arch: &str) -> StoreResult<Option<ReleaseRow>> {
        Ok(self.s.releases.release(version, arch))
    }

    fn put_release(&mut self, row: &ReleaseRow) -> StoreResult<()> {
        self.s.releases.put_release(row)
    }

    fn put_release_piece(
        &mut self,
        version: &str,
        arch: &str,
        index: u64,
        data: &[u8],
    ) -> StoreResult<()> {
        fits(index, "piece index")?;
        self.s.releases.put_piece(version, arch, index, data);
        Ok(())
    }

    fn write_update(&mut self, id: &str, update: &UpdateRow) -> StoreResult<()> {
        fits(update.held_bytes, "held bytes")?;
        fits(update.size, "release size")?;
        let a = self.s.agents.get_mut(id).ok_or_else(|| no_agent(id))?;
        a.update = Some(update.clone());
        Ok(())
    }

    fn open_agent_updates(&mut self) -> StoreResult<Vec<AgentUpdateRow>> {
        Ok(self.s.releases.open_updates())
    }

    fn insert_agent_update(&mut self, row: &AgentUpdateRow) -> StoreResult<u64> {
        self.s.releases.insert_update(row)
    }

    fn cas_agent_update(&mut self, row: &AgentUpdateRow) -> StoreResult<bool> {
        self.s.releases.cas_update(row)
    }

    fn set_release_targets(
        &mut self,
        update: u64,
        version: &str,
        ids: &[String],
    ) -> StoreResult<()> {
        self.s.releases.set_targets(update, version, ids);
        Ok(())
    }

    fn clear_release_targets(&mut self, update: u64) -> StoreResult<()> {
        self.s.releases.clear_targets(update);
        Ok(())
    }

    fn delete_before(&mut self, what: Grows, before: RefTime, max: u32) -> StoreResult<u64> {
        Ok(match what {
            Grows::Feedback => feedback::delete_before(self.s, before, max),
            Grows::Clock => records::delete_clock_before(self.s, before, max),
            Grows::Audit => records::delete_audit_before(self.s, before, max),
            Grows::Events => records::delete_events_before(self.s, before, max),
        })
    }
}
