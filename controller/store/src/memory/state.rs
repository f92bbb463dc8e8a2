//! The memory store's state: plain maps, and the reads every part of it
//! shares (an agent with its tenants, a pack as the planner reads it, an
//! agent's rows).

use std::collections::{BTreeMap, BTreeSet};

use crate::{
    AgentRow, AuditRow, ClockRow, DeliveryRow, EventRow, FeedbackRow, Gate, GateRow, PackKey,
    PackTargets, PackVersionRow, RefTime, RevocationRow, RolloutRow, SessionRow, TargetsRow,
};

/// Everything the memory store keeps; cloned before a transaction so a
/// failed one leaves it as it was.
#[derive(Clone, Debug, Default)]
pub(super) struct State {
    pub(super) agents: BTreeMap<String, AgentRow>,
    /// Tenants from certificates and from grants, by agent (grants may
    /// come before the agent's first hello).
    pub(super) cert_tenants: BTreeMap<String, BTreeSet<String>>,
    pub(super) grants: BTreeMap<String, BTreeSet<String>>,
    pub(super) clock: BTreeMap<(String, i64), ClockRow>,
    pub(super) packs: BTreeMap<PackKey, PackRec>,
    pub(super) versions: BTreeMap<(PackKey, u64), PackVersionRow>,
    pub(super) deliveries: BTreeMap<(String, PackKey), DeliveryRow>,
    pub(super) journals: BTreeMap<(String, String), u64>,
    pub(super) feedback: BTreeMap<u64, FeedbackRow>,
    pub(super) feedback_keys: BTreeSet<(String, String, u64)>,
    pub(super) next_feedback_id: u64,
    /// By id: storage order.
    pub(super) audit: BTreeMap<u64, AuditRow>,
    pub(super) next_audit_id: u64,
    pub(super) events: BTreeMap<u64, EventRow>,
    pub(super) next_event_id: u64,
    pub(super) revocations: BTreeMap<String, RevocationRow>,
    /// By pack and version, with their cohorts.
    pub(super) rollouts: BTreeMap<(PackKey, u64), RolloutRow>,
    /// Dashboard sessions, by hash.
    pub(super) sessions: BTreeMap<String, SessionRow>,
    /// Failed log-ins, by source and window start.
    pub(super) login_failures: BTreeMap<(String, i64), u64>,
    /// Agent releases, updates and who is offered which.
    pub(super) releases: super::releases::Releases,
}

#[derive(Clone, Debug)]
pub(super) struct PackRec {
    pub(super) latest: u64,
    pub(super) targets: TargetsRow,
    pub(super) pushed: RefTime,
    pub(super) cancelled: Option<RefTime>,
    pub(super) gate: Option<GateRow>,
    pub(super) stopped: BTreeMap<String, u64>,
}

impl State {
    pub(super) fn agent(&self, id: &str) -> Option<AgentRow> {
        let mut a = self.agents.get(id)?.clone();
        a.tenants = self.tenants_of(id);
        Some(a)
    }

    /// Whether agent `id` refused a delivery (of `tenant`, or of any).
    pub(super) fn refused(&self, id: &str, tenant: Option<&str>) -> bool {
        self.deliveries.iter().any(|((agent, key), d)| {
            agent == id
                && d.state == crate::DeliveryState::Nacked
                && tenant.is_none_or(|t| key.tenant == t)
        })
    }

    pub(super) fn tenants_of(&self, id: &str) -> BTreeSet<String> {
        let mut t = self.cert_tenants.get(id).cloned().unwrap_or_default();
        t.extend(self.grants.get(id).into_iter().flatten().cloned());
        t
    }

    pub(super) fn pack_targets(&self, key: &PackKey) -> Option<PackTargets> {
        self.packs.get(key).map(|p| PackTargets {
            tenant: key.tenant.clone(),
            pack: key.pack.clone(),
            latest: p.latest,
            targets: p.targets.clone(),
            cancelled: p.cancelled,
            gate: p.gate.clone().map(|row| Gate {
                admitted: self
                    .rollouts
                    .get(&(key.clone(), row.rollout))
                    .map(|r| r.members.keys().cloned().collect())
                    .unwrap_or_default(),
                row,
            }),
            stopped: p.stopped.clone(),
        })
    }

    pub(super) fn rows_of(&self, id: &str) -> Vec<DeliveryRow> {
        self.deliveries
            .iter()
            .filter(|((a, _), _)| a == id)
            .map(|(_, r)| r.clone())
            .collect()
    }
}
