//! Which (agent, pack) pairs a change can affect, planned: the planner
//! ([`planner::plan`]) run on each, the rows that changed written in a
//! few primitives at the end.

use std::collections::{BTreeMap, BTreeSet};

use baton_model::planner;
use baton_model::{
    AgentRow, Binding, DeliveryRow, Held, HeldPackRow, PackKey, PackTargets, RefTime,
};

use crate::error::StoreResult;
use crate::tx::Tx;

/// What a round of decisions changes, written at its end.
#[derive(Default)]
struct Decisions {
    changed: Vec<DeliveryRow>,
    gone: Vec<(String, PackKey)>,
}

/// One decision's inputs: the pair and what is known of it.
struct Pair<'a> {
    agent: &'a AgentRow,
    key: &'a PackKey,
    pack: Option<&'a PackTargets>,
    row: Option<&'a DeliveryRow>,
    held: Option<Held>,
}

impl Decisions {
    /// Plans a pair; keeps its row when it changed.
    fn plan(&mut self, p: Pair<'_>, binding: Binding, at: RefTime) {
        match planner::plan(p.agent, p.key, p.pack, p.row, p.held, binding, at) {
            Some(next) => {
                if p.row != Some(&next) {
                    self.changed.push(next);
                }
            }
            None => {
                if p.row.is_some() {
                    self.gone.push((p.agent.id.clone(), p.key.clone()));
                }
            }
        }
    }

    /// Writes the decisions; the rows that changed.
    fn write(self, tx: &mut dyn Tx) -> StoreResult<Vec<DeliveryRow>> {
        if !self.gone.is_empty() {
            tx.delete_rows(&self.gone)?;
        }
        if !self.changed.is_empty() {
            tx.put_rows(&self.changed)?;
        }
        Ok(self.changed)
    }
}

/// Re-plans every pack that may concern `agent` (as stored now: the live
/// packs of its tenants, its rows, and what it holds), with `held` as its
/// held set when given (else what its rows say it holds). The rows that
/// changed.
pub fn replan_agent(
    tx: &mut dyn Tx,
    agent: &AgentRow,
    held: Option<&[HeldPackRow]>,
    at: RefTime,
) -> StoreResult<Vec<DeliveryRow>> {
    let binding = tx.binding();
    let id = agent.id.as_str();
    let packs: BTreeMap<PackKey, PackTargets> = tx
        .packs_for(agent)?
        .into_iter()
        .map(|p| (PackKey::new(&p.tenant, &p.pack), p))
        .collect();
    let rows: BTreeMap<PackKey, DeliveryRow> = tx
        .rows_of_agent(id)?
        .into_iter()
        .map(|r| (r.key(), r))
        .collect();
    let held: Option<BTreeMap<PackKey, Held>> =
        held.map(|h| h.iter().map(HeldPackRow::keyed).collect());
    let mut keys: BTreeSet<&PackKey> = packs.keys().chain(rows.keys()).collect();
    if let Some(h) = &held {
        keys.extend(h.keys());
    }
    let mut decisions = Decisions::default();
    for key in keys {
        let row = rows.get(key);
        let h = match &held {
            Some(h) => h.get(key).copied(),
            None => row.and_then(|r| r.held),
        };
        let other;
        let pack = match packs.get(key) {
            Some(p) => Some(p),
            // Another tenant's pack (held, or withdrawn): its targets
            // still say it is not this agent's.
            None => {
                other = tx.pack_targets(key, Some(id))?;
                other.as_ref()
            }
        };
        let pair = Pair {
            agent,
            key,
            pack,
            row,
            held: h,
        };
        decisions.plan(pair, binding, at);
    }
    decisions.write(tx)
}

/// Re-plans pack `key` for every agent it may concern: its targets'
/// candidates (while it is live) and the agents with a row for it.
pub fn replan_pack(tx: &mut dyn Tx, key: &PackKey, at: RefTime) -> StoreResult<Vec<DeliveryRow>> {
    let binding = tx.binding();
    let pack = tx.pack_targets(key, None)?;
    let rows: BTreeMap<String, DeliveryRow> = tx
        .rows_of_pack(key)?
        .into_iter()
        .map(|r| (r.agent_id.clone(), r))
        .collect();
    let mut ids: BTreeSet<String> = rows.keys().cloned().collect();
    if let Some(p) = &pack
        && p.cancelled.is_none()
    {
        ids.extend(tx.pack_candidates(key, &p.targets)?);
    }
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let mut decisions = Decisions::default();
    for agent in tx.agents(&ids)? {
        let row = rows.get(&agent.id);
        let pair = Pair {
            agent: &agent,
            key,
            pack: pack.as_ref(),
            row,
            held: row.and_then(|r| r.held),
        };
        decisions.plan(pair, binding, at);
    }
    decisions.write(tx)
}
