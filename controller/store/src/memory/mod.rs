//! A [`Store`] in memory: the reference implementation of the contract,
//! written to be obviously right rather than fast (every decision looks at
//! every agent), and the store of the unit tests of the layers above, which
//! run on tokio's paused time with no disk.
//!
//! One mutex over plain maps; every method is one critical section, so
//! each is atomic like a transaction. [`MemoryStore::fail_writes`] makes
//! every later write fail, as a full disk would. Like a database column,
//! it refuses values past `i64::MAX` (versions, seqs) instead of keeping
//! what the SQL stores could not.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use async_trait::async_trait;

use super::{
    AgentFilter, AgentRow, AnswerRow, AuditRow, Binding, ClockRow, DeliveryRow, DeliveryState,
    EventRow, FeedbackFilter, FeedbackRow, FeedbackStored, HeldPackRow, HelloRow, LabelOverrides,
    MAX_PAGE, PackKey, PackSummaryRow, PackVersionRow, PutPack, Store, StoreError, StoreResult,
    TargetsRow, page,
};
use baton_model::planner;
use baton_model::time::{self, RefTime};

mod feedback;
mod plan;
mod records;
mod rollouts;

use plan::{apply_held, replan_pack};

/// The in-memory [`Store`].
#[derive(Debug)]
pub struct MemoryStore {
    binding: Binding,
    state: Mutex<State>,
    fail: AtomicBool,
}

#[derive(Debug, Default)]
struct State {
    agents: BTreeMap<String, AgentRow>,
    /// Tenants from certificates and from grants, by agent (grants may
    /// come before the agent's first hello).
    cert_tenants: BTreeMap<String, BTreeSet<String>>,
    grants: BTreeMap<String, BTreeSet<String>>,
    clock: BTreeMap<(String, i64), ClockRow>,
    packs: BTreeMap<PackKey, PackRec>,
    versions: BTreeMap<(PackKey, u64), PackVersionRow>,
    deliveries: BTreeMap<(String, PackKey), DeliveryRow>,
    journals: BTreeMap<(String, String), u64>,
    feedback: BTreeMap<u64, FeedbackRow>,
    feedback_keys: BTreeSet<(String, String, u64)>,
    next_feedback_id: u64,
    /// By id: storage order.
    audit: BTreeMap<u64, AuditRow>,
    next_audit_id: u64,
    events: BTreeMap<u64, EventRow>,
    next_event_id: u64,
    revocations: BTreeMap<String, crate::RevocationRow>,
    /// By pack and version, with their cohorts.
    rollouts: BTreeMap<(PackKey, u64), crate::RolloutRow>,
}

#[derive(Clone, Debug)]
struct PackRec {
    latest: u64,
    targets: TargetsRow,
    pushed: RefTime,
    cancelled: Option<RefTime>,
    gate: Option<crate::GateRow>,
}

impl MemoryStore {
    /// An empty store deciding under `binding`.
    pub fn new(binding: Binding) -> MemoryStore {
        MemoryStore {
            binding,
            state: Mutex::new(State::default()),
            fail: AtomicBool::new(false),
        }
    }

    /// From now on every write fails (`true`), as on a full disk; reads
    /// keep working.
    pub fn fail_writes(&self, fail: bool) {
        self.fail.store(fail, Ordering::SeqCst);
    }

    fn read<T>(&self, f: impl FnOnce(&State) -> StoreResult<T>) -> StoreResult<T> {
        let s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        f(&s)
    }

    fn write<T>(&self, f: impl FnOnce(&mut State) -> StoreResult<T>) -> StoreResult<T> {
        if self.fail.load(Ordering::SeqCst) {
            return Err(StoreError::Backend("writes fail (test)".into()));
        }
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        // All or nothing, like a transaction: every closure below checks
        // what can fail before it changes anything.
        f(&mut s)
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn agent_hello(&self, h: HelloRow) -> StoreResult<(AgentRow, Vec<DeliveryRow>)> {
        let binding = self.binding;
        self.write(|s| {
            fits_held(&h.held)?;
            fits(h.session_gen_seen, "session generation")?;
            let prev = s.agents.get(&h.id).cloned();
            let mut a = prev.unwrap_or_else(|| AgentRow::new(&h.id, &h.journal_id));
            a.session_gen = a.session_gen.max(h.session_gen_seen) + 1;
            a.labels = h.labels.clone();
            a.agent_version = h.agent_version.clone();
            a.journal_id = h.journal_id.clone();
            a.connected = true;
            a.last_seen = h.at;
            s.agents.insert(h.id.clone(), a);
            if let Some(t) = &h.cert_tenants {
                s.cert_tenants
                    .insert(h.id.clone(), t.iter().cloned().collect());
            }
            // A restart drops staged copies: what was staged is asked
            // again.
            for ((a, _), r) in s.deliveries.iter_mut() {
                if *a == h.id {
                    r.staged = None;
                }
            }
            apply_held(s, &h.id, &h.held, binding, h.at.as_nanos());
            s.replan_agent(&h.id, binding, h.at.as_nanos());
            let agent = s.agent(&h.id).ok_or_else(|| no_agent(&h.id))?;
            Ok((agent, s.rows_of(&h.id)))
        })
    }

    async fn agent_seen(
        &self,
        id: &str,
        session: u64,
        connected: bool,
        at_ns: i64,
        lateness_p99_ns: Option<i64>,
    ) -> StoreResult<()> {
        self.write(|s| {
            check_session(s, id, session)?;
            let a = s.agents.get_mut(id).ok_or_else(|| unknown(id))?;
            a.connected = connected;
            a.last_seen = time::at(at_ns);
            if let Some(p99) = lateness_p99_ns {
                a.lateness_p99 = time::span(p99);
            }
            Ok(())
        })
    }

    async fn all_disconnected(&self) -> StoreResult<()> {
        self.write(|s| {
            for a in s.agents.values_mut() {
                a.connected = false;
            }
            Ok(())
        })
    }

    async fn record_clock(&self, id: &str, session: u64, clock: ClockRow) -> StoreResult<()> {
        self.write(|s| {
            check_session(s, id, session)?;
            let a = s.agents.get_mut(id).ok_or_else(|| unknown(id))?;
            if a.clock.as_ref().is_none_or(|c| c.at < clock.at) {
                a.clock = Some(clock.clone());
            }
            s.clock
                .entry((id.to_string(), clock.at.as_nanos()))
                .or_insert(clock);
            Ok(())
        })
    }

    async fn clock_history(
        &self,
        id: &str,
        since_ns: i64,
        limit: u32,
    ) -> StoreResult<Vec<ClockRow>> {
        let limit = page(limit, MAX_PAGE * 10) as usize;
        self.read(|s| {
            let rows: Vec<ClockRow> = s
                .clock
                .range((id.to_string(), since_ns)..=(id.to_string(), i64::MAX))
                .map(|(_, c)| c.clone())
                .collect();
            let skip = rows.len().saturating_sub(limit);
            Ok(rows.into_iter().skip(skip).collect())
        })
    }

    async fn agents(&self, f: AgentFilter) -> StoreResult<Vec<AgentRow>> {
        let binding = self.binding;
        let limit = page(f.limit, MAX_PAGE) as usize;
        self.read(|s| {
            Ok(s.agents
                .keys()
                .filter(|id| f.after_id.as_ref().is_none_or(|a| *id > a))
                .filter_map(|id| s.agent(id))
                .filter(|a| f.tenant.as_ref().is_none_or(|t| a.serves(t, binding)))
                .take(limit)
                .collect())
        })
    }

    async fn agent(&self, id: &str) -> StoreResult<Option<AgentRow>> {
        self.read(|s| Ok(s.agent(id)))
    }

    async fn label_agent(
        &self,
        id: &str,
        tenant: &str,
        set: LabelOverrides,
        reset: Vec<String>,
        at_ns: i64,
    ) -> StoreResult<(AgentRow, Vec<DeliveryRow>)> {
        let binding = self.binding;
        self.write(|s| {
            let a = s
                .agents
                .get_mut(id)
                .ok_or_else(|| StoreError::NoSuchAgent { id: id.to_string() })?;
            let o = a.overrides.entry(tenant.to_string()).or_default();
            o.extend(set);
            for k in &reset {
                o.remove(k);
            }
            if o.is_empty() {
                a.overrides.remove(tenant);
            }
            let changed = s.replan_agent(id, binding, at_ns);
            Ok((s.agent(id).ok_or_else(|| no_agent(id))?, changed))
        })
    }

    async fn grant(
        &self,
        id: &str,
        tenant: &str,
        granted: bool,
        at_ns: i64,
    ) -> StoreResult<Vec<DeliveryRow>> {
        let binding = self.binding;
        self.write(|s| {
            let g = s.grants.entry(id.to_string()).or_default();
            if granted {
                g.insert(tenant.to_string());
            } else {
                g.remove(tenant);
            }
            if g.is_empty() {
                s.grants.remove(id);
            }
            Ok(s.replan_agent(id, binding, at_ns))
        })
    }

    async fn forget_agent(&self, id: &str, tenant: Option<&str>) -> StoreResult<bool> {
        self.write(|s| {
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
                }
            }
            Ok(existed)
        })
    }

    async fn put_pack(&self, p: PackVersionRow) -> StoreResult<PutPack> {
        self.write(|s| {
            fits(p.version, "pack version")?;
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
                        // A withdrawn pack the store had lost: its
                        // version can be stored again.
                        None => {}
                    }
                }
            }
            let before = s
                .packs
                .get(&key)
                .map(|r| (r.latest, r.cancelled.is_some(), r.gate.clone()));
            let gate = before.as_ref().and_then(|b| b.2.clone());
            s.packs.insert(
                key.clone(),
                PackRec {
                    latest: p.version,
                    targets: p.targets.clone(),
                    pushed: p.pushed,
                    cancelled: None,
                    gate,
                },
            );
            rollouts::on_new_version(s, &p, before);
            s.versions.insert((key, p.version), p);
            Ok(PutPack::Stored)
        })
    }

    async fn cancel_pack(&self, key: &PackKey, at_ns: i64) -> StoreResult<Vec<DeliveryRow>> {
        let binding = self.binding;
        self.write(|s| {
            match s.packs.get_mut(key) {
                Some(p) => {
                    p.cancelled.get_or_insert(time::at(at_ns));
                }
                None => {
                    let held = s
                        .deliveries
                        .iter()
                        .filter(|((_, k), _)| k == key)
                        .filter_map(|(_, r)| r.held.map(|h| h.version))
                        .max()
                        .ok_or_else(|| StoreError::NoSuchPack {
                            tenant: key.tenant.clone(),
                            pack: key.pack.clone(),
                        })?;
                    s.packs.insert(
                        key.clone(),
                        PackRec {
                            latest: held,
                            targets: TargetsRow::Nobody,
                            pushed: time::at(at_ns),
                            cancelled: Some(time::at(at_ns)),
                            gate: None,
                        },
                    );
                }
            }
            rollouts::on_cancel(s, key, at_ns);
            Ok(replan_pack(s, key, binding, at_ns))
        })
    }

    async fn rollout(
        &self,
        key: &PackKey,
        version: Option<u64>,
    ) -> StoreResult<Option<crate::RolloutRow>> {
        self.read(|s| Ok(rollouts::load(s, key, version)))
    }

    async fn rollouts(
        &self,
        tenant: Option<&str>,
        open_only: bool,
    ) -> StoreResult<Vec<crate::RolloutRow>> {
        self.read(|s| Ok(rollouts::list(s, tenant, open_only)))
    }

    async fn advance_rollout(
        &self,
        change: crate::RolloutChange,
        at_ns: i64,
    ) -> StoreResult<Option<Vec<DeliveryRow>>> {
        let binding = self.binding;
        self.write(|s| {
            if !rollouts::advance(s, &change)? {
                return Ok(None);
            }
            Ok(Some(replan_pack(s, &change.row.key(), binding, at_ns)))
        })
    }

    async fn reconcile_pack(&self, key: &PackKey, at_ns: i64) -> StoreResult<Vec<DeliveryRow>> {
        let binding = self.binding;
        self.write(|s| Ok(replan_pack(s, key, binding, at_ns)))
    }

    async fn packs(&self, tenant: Option<&str>) -> StoreResult<Vec<PackSummaryRow>> {
        self.read(|s| {
            Ok(s.packs
                .iter()
                .filter(|(k, _)| tenant.is_none_or(|t| k.tenant == t))
                .map(|(k, p)| {
                    let mut row = PackSummaryRow {
                        tenant: k.tenant.clone(),
                        pack: k.pack.clone(),
                        latest: p.latest,
                        targets: p.targets.clone(),
                        pushed: p.pushed,
                        cancelled: p.cancelled,
                        acked: 0,
                        nacked: 0,
                        pending: 0,
                        ahead: 0,
                    };
                    for ((_, rk), d) in &s.deliveries {
                        if rk != k {
                            continue;
                        }
                        if d.held.is_some_and(|h| h.version > p.latest) {
                            row.ahead += 1;
                        }
                        if d.version != p.latest {
                            continue;
                        }
                        match d.state {
                            DeliveryState::Acked => row.acked += 1,
                            DeliveryState::Nacked => row.nacked += 1,
                            DeliveryState::Pending => row.pending += 1,
                            DeliveryState::Cancelled | DeliveryState::Local => {}
                        }
                    }
                    row
                })
                .collect())
        })
    }

    async fn pack_versions(&self, key: &PackKey, limit: u32) -> StoreResult<Vec<PackVersionRow>> {
        self.read(|s| {
            Ok(s.versions
                .range((key.clone(), 0)..=(key.clone(), u64::MAX))
                .rev()
                .take(limit as usize)
                .map(|(_, v)| PackVersionRow {
                    yaml: String::new(),
                    ..v.clone()
                })
                .collect())
        })
    }

    async fn pack_version(
        &self,
        key: &PackKey,
        version: Option<u64>,
    ) -> StoreResult<Option<PackVersionRow>> {
        self.read(|s| {
            let v = match version {
                Some(v) => v,
                None => match s.packs.get(key) {
                    Some(p) => p.latest,
                    None => return Ok(None),
                },
            };
            Ok(s.versions.get(&(key.clone(), v)).cloned())
        })
    }

    async fn agent_held(
        &self,
        id: &str,
        session: u64,
        held: Vec<HeldPackRow>,
        at_ns: i64,
    ) -> StoreResult<Vec<DeliveryRow>> {
        let binding = self.binding;
        self.write(|s| {
            check_session(s, id, session)?;
            fits_held(&held)?;
            Ok(apply_held(s, id, &held, binding, at_ns))
        })
    }

    async fn answer(&self, a: AnswerRow) -> StoreResult<Option<DeliveryRow>> {
        let binding = self.binding;
        self.write(|s| {
            if s.agents.contains_key(&a.agent_id) {
                check_session(s, &a.agent_id, a.session_gen)?;
            }
            let k = (a.agent_id.clone(), a.key.clone());
            let (Some(agent), Some(row)) = (s.agent(&a.agent_id), s.deliveries.get(&k)) else {
                return Ok(None);
            };
            let pack = s.pack_targets(&a.key);
            let next = planner::answered(
                &agent,
                pack.as_ref(),
                row,
                a.version,
                &a.answer,
                a.attempts,
                binding,
                a.at,
            );
            match &next {
                Some(n) => {
                    fits_row(n)?;
                    s.deliveries.insert(k, n.clone())
                }
                None => s.deliveries.remove(&k),
            };
            Ok(next)
        })
    }

    async fn deliveries_of_agent(&self, id: &str) -> StoreResult<Vec<DeliveryRow>> {
        self.read(|s| Ok(s.rows_of(id)))
    }

    async fn deliveries_of(&self, pairs: &[(String, PackKey)]) -> StoreResult<Vec<DeliveryRow>> {
        self.read(|s| {
            let mut rows: Vec<DeliveryRow> = pairs
                .iter()
                .filter_map(|p| s.deliveries.get(p).cloned())
                .collect();
            rows.sort_by(|a, b| (&a.agent_id, a.key()).cmp(&(&b.agent_id, b.key())));
            rows.dedup_by(|a, b| a.agent_id == b.agent_id && a.key() == b.key());
            Ok(rows)
        })
    }

    async fn deliveries_of_pack(
        &self,
        key: &PackKey,
        version: Option<u64>,
        after_agent: Option<&str>,
        limit: u32,
    ) -> StoreResult<Vec<DeliveryRow>> {
        let limit = page(limit, MAX_PAGE) as usize;
        self.read(|s| {
            let mut rows: Vec<DeliveryRow> = s
                .deliveries
                .iter()
                .filter(|((a, k), r)| {
                    k == key
                        && r.state != DeliveryState::Local
                        && version.is_none_or(|v| r.version == v)
                        && after_agent.is_none_or(|after| a.as_str() > after)
                })
                .map(|(_, r)| r.clone())
                .collect();
            rows.sort_by(|a, b| a.agent_id.cmp(&b.agent_id));
            rows.truncate(limit);
            Ok(rows)
        })
    }

    async fn delivery_counts(&self) -> StoreResult<Vec<(DeliveryState, u64)>> {
        self.read(|s| {
            let mut n: BTreeMap<DeliveryState, u64> = BTreeMap::new();
            for r in s.deliveries.values() {
                if r.state != DeliveryState::Local {
                    *n.entry(r.state).or_default() += 1;
                }
            }
            Ok(n.into_iter().collect())
        })
    }

    async fn put_feedback(
        &self,
        session: u64,
        rows: Vec<FeedbackRow>,
    ) -> StoreResult<FeedbackStored> {
        self.write(|s| feedback::put(s, session, rows))
    }

    async fn feedback_acked(&self, agent_id: &str, journal_id: &str) -> StoreResult<u64> {
        self.read(|s| {
            Ok(s.journals
                .get(&(agent_id.to_string(), journal_id.to_string()))
                .copied()
                .unwrap_or(0))
        })
    }

    async fn feedback(&self, f: FeedbackFilter) -> StoreResult<Vec<FeedbackRow>> {
        let limit = page(f.limit, MAX_PAGE) as usize;
        self.read(|s| {
            Ok(s.feedback
                .range(f.after_id.saturating_add(1)..)
                .map(|(_, r)| r)
                .filter(|r| {
                    f.tenant.as_ref().is_none_or(|t| &r.tenant == t)
                        && f.pack.as_ref().is_none_or(|p| &r.pack == p)
                        && f.agent_id.as_ref().is_none_or(|a| &r.agent_id == a)
                        && f.since.is_none_or(|t| r.received >= t)
                })
                .take(limit)
                .cloned()
                .collect())
        })
    }

    async fn delete_feedback_before(&self, before: RefTime, max: u32) -> StoreResult<u64> {
        self.write(|s| feedback::delete_before(s, before, max))
    }

    async fn delete_clock_before(&self, before: RefTime, max: u32) -> StoreResult<u64> {
        self.write(|s| records::delete_clock_before(s, before, max))
    }

    async fn delete_audit_before(&self, before: RefTime, max: u32) -> StoreResult<u64> {
        self.write(|s| records::delete_audit_before(s, before, max))
    }

    async fn put_events(&self, rows: Vec<EventRow>) -> StoreResult<()> {
        self.write(|s| {
            for mut e in rows {
                s.next_event_id += 1;
                e.id = s.next_event_id;
                s.events.insert(e.id, e);
            }
            Ok(())
        })
    }

    async fn events_after(&self, after_id: u64, limit: u32) -> StoreResult<Vec<EventRow>> {
        let limit = page(limit, MAX_PAGE) as usize;
        self.read(|s| {
            Ok(s.events
                .range(after_id.saturating_add(1)..)
                .take(limit)
                .map(|(_, e)| e.clone())
                .collect())
        })
    }

    async fn high_water(&self) -> StoreResult<(u64, u64)> {
        self.read(|s| {
            Ok((
                s.events.keys().next_back().copied().unwrap_or(0),
                s.feedback.keys().next_back().copied().unwrap_or(0),
            ))
        })
    }

    async fn delete_events_before(&self, before: RefTime, max: u32) -> StoreResult<u64> {
        self.write(|s| records::delete_events_before(s, before, max))
    }

    async fn revoke(
        &self,
        rows: Vec<(crate::RevocationRow, Vec<AuditRow>)>,
    ) -> StoreResult<Vec<String>> {
        self.write(|s| records::revoke(s, rows))
    }

    async fn revocations(&self) -> StoreResult<Vec<crate::RevocationRow>> {
        self.read(|s| Ok(s.revocations.values().cloned().collect()))
    }

    async fn put_audit(&self, row: AuditRow) -> StoreResult<()> {
        self.write(|s| {
            s.next_audit_id += 1;
            s.audit.insert(s.next_audit_id, row);
            Ok(())
        })
    }

    async fn audit(
        &self,
        tenant: Option<&str>,
        since_ns: i64,
        limit: u32,
    ) -> StoreResult<Vec<AuditRow>> {
        let limit = page(limit, MAX_PAGE * 10) as usize;
        self.read(|s| records::audit(s, tenant, since_ns, limit))
    }
}

/// The fence of a stream's writes (see `sql::agents::check_session`).
fn check_session(s: &State, id: &str, session: u64) -> StoreResult<()> {
    let a = s.agents.get(id).ok_or_else(|| unknown(id))?;
    if a.session_gen != session {
        return Err(StoreError::Fenced {
            agent: id.to_owned(),
            session,
            current: a.session_gen,
        });
    }
    Ok(())
}

fn unknown(id: &str) -> StoreError {
    StoreError::Backend(format!("no agent {id}: it must say hello first"))
}

fn no_agent(id: &str) -> StoreError {
    StoreError::NoSuchAgent { id: id.to_string() }
}

/// Refuses what a BIGINT column could not hold, as the SQL stores do.
fn fits(v: u64, what: &str) -> StoreResult<()> {
    match i64::try_from(v) {
        Ok(_) => Ok(()),
        Err(_) => Err(StoreError::Backend(format!(
            "{what} {v} is larger than {} and cannot be stored",
            i64::MAX
        ))),
    }
}

fn fits_held(held: &[HeldPackRow]) -> StoreResult<()> {
    held.iter()
        .try_for_each(|h| fits(h.version, "held version"))
}

fn fits_row(r: &DeliveryRow) -> StoreResult<()> {
    fits(r.version, "version")?;
    if let Some(h) = r.held {
        fits(h.version, "held version")?;
    }
    if let Some(f) = &r.refusal {
        fits(f.version, "refused version")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
