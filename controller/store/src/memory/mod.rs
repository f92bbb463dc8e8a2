//! A [`Store`] in memory: the reference implementation of the contract,
//! written to be obviously right rather than fast (every decision looks at
//! every agent), and the store of the unit tests of the layers above, which
//! run on tokio's paused time with no disk.
//!
//! One mutex over plain maps; a transaction is one critical section on a
//! copy's understudy: the state is cloned first and put back if the job
//! fails, so each is all or nothing. [`MemoryStore::fail_writes`] makes
//! every later write fail, as a full disk would. Like a database column,
//! it refuses values past `i64::MAX` (versions, seqs) instead of keeping
//! what the SQL stores could not.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use async_trait::async_trait;

use crate::store::{Store, TxJob};
use crate::{
    AgentFilter, AgentRow, AgentUpdateRow, AuditRow, Binding, ClockRow, DeliveryRow, DeliveryState,
    EventRow, FeedbackFilter, FeedbackRow, FeedbackScope, FleetCounts, MAX_PAGE, Mark, PackKey,
    PackSummaryRow, PackVersionRow, RefTime, ReleaseRow, RevocationRow, RolloutRow, SessionRow,
    StoreError, StoreResult, clock_locked, page,
};

mod feedback;
mod records;
mod releases;
mod rollouts;
mod state;
mod tx;

use state::State;
use tx::MemTx;

/// The in-memory [`Store`].
#[derive(Debug)]
pub struct MemoryStore {
    binding: Binding,
    state: Mutex<State>,
    fail: AtomicBool,
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
}

#[async_trait]
impl Store for MemoryStore {
    fn binding(&self) -> Binding {
        self.binding
    }

    async fn transact(&self, mut job: TxJob) -> StoreResult<()> {
        if self.fail.load(Ordering::SeqCst) {
            return Err(StoreError::unavailable(
                "write",
                "writes fail (the test's full disk)",
            ));
        }
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let before = s.clone();
        let binding = self.binding;
        let done = job(&mut MemTx { s: &mut s, binding });
        if done.is_err() {
            *s = before;
        }
        done
    }

    async fn clock_history(
        &self,
        id: &str,
        since: RefTime,
        limit: u32,
    ) -> StoreResult<Vec<ClockRow>> {
        let limit = page(limit, MAX_PAGE * 10) as usize;
        self.read(|s| {
            let rows: Vec<ClockRow> = s
                .clock
                .range((id.to_string(), since.as_nanos())..=(id.to_string(), i64::MAX))
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
                .filter(|a| f.matches(a, binding, s.refused(&a.id, f.tenant.as_deref())))
                .take(limit)
                .collect())
        })
    }

    async fn agent_counts(&self, f: AgentFilter) -> StoreResult<FleetCounts> {
        let binding = self.binding;
        let f = AgentFilter { state: None, ..f };
        self.read(|s| {
            let mut c = FleetCounts::default();
            for a in s.agents.keys().filter_map(|id| s.agent(id)) {
                if !f.matches(&a, binding, false) {
                    continue;
                }
                c.total += 1;
                if a.connected {
                    c.connected += 1;
                } else {
                    c.offline += 1;
                }
                if !clock_locked(&a) {
                    c.clock_not_locked += 1;
                }
            }
            Ok(c)
        })
    }

    async fn agent(&self, id: &str) -> StoreResult<Option<AgentRow>> {
        self.read(|s| Ok(s.agent(id)))
    }

    async fn rollout(
        &self,
        key: &PackKey,
        version: Option<u64>,
    ) -> StoreResult<Option<RolloutRow>> {
        self.read(|s| Ok(rollouts::load(s, key, version)))
    }

    async fn rollouts(
        &self,
        tenant: Option<&str>,
        open_only: bool,
    ) -> StoreResult<Vec<RolloutRow>> {
        self.read(|s| Ok(rollouts::list(s, tenant, open_only)))
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

    async fn events_after(&self, after: Mark, limit: u32) -> StoreResult<(Vec<EventRow>, Mark)> {
        let limit = page(limit, MAX_PAGE) as usize;
        self.read(|s| {
            let rows: Vec<EventRow> = s
                .events
                .range(after.id.saturating_add(1)..)
                .take(limit)
                .map(|(_, e)| e.clone())
                .collect();
            let next = rows.last().map_or(after, |e| Mark { txid: 0, id: e.id });
            Ok((rows, next))
        })
    }

    async fn feedback_after(
        &self,
        after: Mark,
        scope: FeedbackScope<'_>,
        limit: u32,
    ) -> StoreResult<(Vec<FeedbackRow>, Mark)> {
        let limit = page(limit, MAX_PAGE) as usize;
        self.read(|s| {
            let rows: Vec<FeedbackRow> = s
                .feedback
                .range(after.id.saturating_add(1)..)
                .filter(|(_, r)| scope.takes(r))
                .take(limit)
                .map(|(_, r)| r.clone())
                .collect();
            let next = rows.last().map_or(after, |r| Mark { txid: 0, id: r.id });
            Ok((rows, next))
        })
    }

    async fn feedback_mark_at(&self, since: RefTime) -> StoreResult<Mark> {
        self.read(|s| {
            let first = s.feedback.iter().find(|(_, r)| r.received >= since);
            let id = match first {
                Some((&id, _)) => id.saturating_sub(1),
                None => s.feedback.keys().next_back().copied().unwrap_or(0),
            };
            Ok(Mark { txid: 0, id })
        })
    }

    async fn high_water(&self) -> StoreResult<(Mark, Mark)> {
        self.read(|s| {
            let last = |id: Option<&u64>| Mark {
                txid: 0,
                id: id.copied().unwrap_or(0),
            };
            Ok((
                last(s.events.keys().next_back()),
                last(s.feedback.keys().next_back()),
            ))
        })
    }

    async fn session(&self, id_hash: &str, now: RefTime) -> StoreResult<Option<SessionRow>> {
        self.read(|s| {
            Ok(s.sessions
                .get(id_hash)
                .filter(|r| records::session_stands(s, r, now))
                .cloned())
        })
    }

    async fn login_failures(
        &self,
        source: &str,
        since: RefTime,
    ) -> StoreResult<Vec<(RefTime, u64)>> {
        self.read(|s| {
            Ok(s.login_failures
                .range((source.to_owned(), since.as_nanos())..=(source.to_owned(), i64::MAX))
                .map(|((_, w), n)| (RefTime::from_nanos(*w), *n))
                .collect())
        })
    }

    async fn releases(&self) -> StoreResult<Vec<ReleaseRow>> {
        self.read(|s| Ok(s.releases.list()))
    }

    async fn release_piece(
        &self,
        version: &str,
        arch: &str,
        index: u64,
    ) -> StoreResult<Option<Vec<u8>>> {
        self.read(|s| Ok(s.releases.piece(version, arch, index)))
    }

    async fn release_offer(&self, id: &str) -> StoreResult<Option<ReleaseRow>> {
        self.read(|s| {
            let Some(a) = s.agents.get(id) else {
                return Ok(None);
            };
            Ok(s.releases.offer(id, &a.arch))
        })
    }

    async fn agent_updates(&self, open_only: bool) -> StoreResult<Vec<AgentUpdateRow>> {
        self.read(|s| Ok(s.releases.updates(open_only)))
    }

    async fn agent_update(&self, id: Option<u64>) -> StoreResult<Option<AgentUpdateRow>> {
        self.read(|s| Ok(s.releases.update(id)))
    }

    async fn revocations(&self) -> StoreResult<Vec<RevocationRow>> {
        self.read(|s| Ok(s.revocations.values().cloned().collect()))
    }

    async fn audit(
        &self,
        tenant: Option<&str>,
        since: RefTime,
        limit: u32,
    ) -> StoreResult<Vec<AuditRow>> {
        let limit = page(limit, MAX_PAGE * 10) as usize;
        self.read(|s| records::audit(s, tenant, since, limit))
    }
}

#[cfg(test)]
mod tests;
