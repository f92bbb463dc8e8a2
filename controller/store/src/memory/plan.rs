//! Planning on the memory store's state: the agents and packs the
//! planner reads, and the re-plans every deciding call makes (every
//! agent, every pack: the reference needs no index).

use std::collections::{BTreeMap, BTreeSet};

use super::State;
use crate::{AgentRow, Binding, DeliveryRow, Held, HeldPackRow, PackKey, PackTargets};
use baton_model::planner;
use baton_model::time;

impl State {
    pub(super) fn agent(&self, id: &str) -> Option<AgentRow> {
        let mut a = self.agents.get(id)?.clone();
        a.tenants = self.tenants_of(id);
        Some(a)
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
            gate: p.gate.clone().map(|row| crate::Gate {
                admitted: self
                    .rollouts
                    .get(&(key.clone(), row.rollout))
                    .map(|r| r.members.keys().cloned().collect())
                    .unwrap_or_default(),
                row,
            }),
        })
    }

    /// Re-plans (agent, key) with `held`; stores and returns the row when
    /// it changed.
    pub(super) fn replan(
        &mut self,
        agent: &AgentRow,
        key: &PackKey,
        held: Option<Held>,
        binding: Binding,
        at_ns: i64,
        changed: &mut Vec<DeliveryRow>,
    ) {
        let k = (agent.id.clone(), key.clone());
        let pack = self.pack_targets(key);
        let row = self.deliveries.get(&k);
        let next = planner::plan(
            agent,
            key,
            pack.as_ref(),
            row,
            held,
            binding,
            time::at(at_ns),
        );
        match next {
            Some(n) => {
                if row != Some(&n) {
                    changed.push(n.clone());
                    self.deliveries.insert(k, n);
                }
            }
            None => {
                self.deliveries.remove(&k);
            }
        }
    }

    /// Re-plans every pack that may concern `id`: its tenants' packs and
    /// its rows.
    pub(super) fn replan_agent(
        &mut self,
        id: &str,
        binding: Binding,
        at_ns: i64,
    ) -> Vec<DeliveryRow> {
        let Some(agent) = self.agent(id) else {
            return Vec::new();
        };
        let mut keys: BTreeSet<PackKey> = self
            .packs
            .keys()
            .filter(|k| agent.serves(&k.tenant, binding))
            .cloned()
            .collect();
        keys.extend(
            self.deliveries
                .keys()
                .filter(|(a, _)| a == id)
                .map(|(_, k)| k.clone()),
        );
        let mut changed = Vec::new();
        for key in keys {
            let held = self
                .deliveries
                .get(&(id.to_string(), key.clone()))
                .and_then(|r| r.held);
            self.replan(&agent, &key, held, binding, at_ns, &mut changed);
        }
        changed
    }

    pub(super) fn rows_of(&self, id: &str) -> Vec<DeliveryRow> {
        self.deliveries
            .iter()
            .filter(|((a, _), _)| a == id)
            .map(|(_, r)| r.clone())
            .collect()
    }
}

/// Records the agent's held set and re-plans what it names or held.
pub(super) fn apply_held(
    s: &mut State,
    id: &str,
    held: &[HeldPackRow],
    binding: Binding,
    at_ns: i64,
) -> Vec<DeliveryRow> {
    let Some(agent) = s.agent(id) else {
        return Vec::new();
    };
    let now: BTreeMap<PackKey, Held> = held.iter().map(HeldPackRow::keyed).collect();
    let mut keys: BTreeSet<PackKey> = now.keys().cloned().collect();
    keys.extend(
        s.deliveries
            .keys()
            .filter(|(a, _)| a == id)
            .map(|(_, k)| k.clone()),
    );
    let mut changed = Vec::new();
    for key in keys {
        let h = now.get(&key).copied();
        s.replan(&agent, &key, h, binding, at_ns, &mut changed);
    }
    changed
}

/// Re-plans `key` for every agent: the reference does not need an index.
pub(super) fn replan_pack(
    s: &mut State,
    key: &PackKey,
    binding: Binding,
    at_ns: i64,
) -> Vec<DeliveryRow> {
    let ids: Vec<String> = s.agents.keys().cloned().collect();
    let mut changed = Vec::new();
    for id in ids {
        let Some(agent) = s.agent(&id) else { continue };
        let held = s
            .deliveries
            .get(&(id.clone(), key.clone()))
            .and_then(|r| r.held);
        s.replan(&agent, key, held, binding, at_ns, &mut changed);
    }
    changed
}
