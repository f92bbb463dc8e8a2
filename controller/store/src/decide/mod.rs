//! The decisions, once for every store: what a hello, a held set, an
//! answer, a label change, a grant, a push, a cancel or a rollout's step
//! changes, as [`Tx`] primitives inside one transaction. What each agent
//! should hold is decided by [`baton_model::planner`]; this module finds
//! the (agent, pack) pairs a change can affect ([`plan`]), runs the
//! rollout rules a new version or a step brings ([`rollouts`]), and
//! fences writes of streams that no longer own their agent.
//!
//! Each holds the locks of what it decides about where writers run in
//! parallel ([`locks`]; one writer serializes them anyway), so two
//! decisions racing (a push and a hello, a cancel and an ack) never
//! overwrite each other: the later one sees the earlier one's rows. Each returns the rows it
//! changed, for the sessions to act on and the watchers to see.

mod answers;
mod locks;
mod plan;
mod rollouts;

use baton_model::{
    AgentRow, AnswerRow, DeliveryRow, HeldPackRow, HelloRow, LabelOverrides, PackKey, RefTime,
};

use crate::error::{StoreError, StoreResult};
use crate::tx::Tx;

pub use answers::answers;
pub use plan::replan_agent;

/// Plan pack `key` for every agent it may concern (its targets'
/// candidates and the agents with a row for it): the rows that changed.
pub fn reconcile(tx: &mut dyn Tx, key: &PackKey, at: RefTime) -> StoreResult<Vec<DeliveryRow>> {
    locks::pack(tx, key)?;
    plan::replan_pack(tx, key, at)
}
pub use rollouts::{advance, put_pack};

/// Fencing: the write of a stream of generation `session` for agent `id`
/// goes on only while that generation owns the agent
/// ([`StoreError::Fenced`] once a later hello raised it, on this replica
/// or another); an agent that is not stored is
/// [`StoreError::NoSuchAgent`].
pub fn check_session(tx: &mut dyn Tx, id: &str, session: u64) -> StoreResult<()> {
    match session_if_known(tx, id, session)? {
        true => Ok(()),
        false => Err(no_agent(id)),
    }
}

/// [`check_session`] for writes an agent with no record may still make
/// (feedback, answers of an agent forgotten while its stream ran):
/// whether the agent is stored.
pub fn session_if_known(tx: &mut dyn Tx, id: &str, session: u64) -> StoreResult<bool> {
    match tx.session_gen(id)? {
        None => Ok(false),
        Some(current) if current == session => Ok(true),
        Some(current) => Err(StoreError::Fenced {
            agent: id.to_owned(),
            session,
            current,
        }),
    }
}

/// An agent said hello: its record written (a new generation), what it
/// staged forgotten (a restart drops staged copies), every pack that may
/// concern it planned with what it holds. The agent and all its rows.
pub fn hello(tx: &mut dyn Tx, h: &HelloRow) -> StoreResult<(AgentRow, Vec<DeliveryRow>)> {
    let certificate = h.cert_tenants.iter().flatten().map(String::as_str);
    let held = h.held.iter().map(|p| p.tenant.as_str());
    locks::agent(tx, &h.id, certificate.chain(held))?;
    tx.write_hello(h)?;
    tx.clear_staged(&h.id)?;
    let agent = tx.agent(&h.id)?.ok_or_else(|| no_agent(&h.id))?;
    replan_agent(tx, &agent, Some(&h.held), h.at)?;
    let rows = tx.rows_of_agent(&h.id)?;
    Ok((agent, rows))
}

/// The agent's held set (its stream of generation `session` said so):
/// every pack it names or held before re-planned. The rows that changed.
pub fn held(
    tx: &mut dyn Tx,
    id: &str,
    session: u64,
    held: &[HeldPackRow],
    at: RefTime,
) -> StoreResult<Vec<DeliveryRow>> {
    locks::agent(tx, id, held.iter().map(|p| p.tenant.as_str()))?;
    check_session(tx, id, session)?;
    let agent = tx.agent(id)?.ok_or_else(|| no_agent(id))?;
    replan_agent(tx, &agent, Some(held), at)
}

/// The agent answered a push: its row re-planned with the answer (`None`:
/// no such row, or the agent was forgotten).
pub fn answer(tx: &mut dyn Tx, a: &AnswerRow) -> StoreResult<Option<DeliveryRow>> {
    answers(tx, std::slice::from_ref(a))?
        .pop()
        .unwrap_or(Ok(None))
}

/// One tenant's operator labels on an agent changed, the agent
/// re-planned: the agent and the rows that changed.
pub fn label(
    tx: &mut dyn Tx,
    id: &str,
    tenant: &str,
    set: &LabelOverrides,
    reset: &[String],
    at: RefTime,
) -> StoreResult<(AgentRow, Vec<DeliveryRow>)> {
    locks::agent(tx, id, std::iter::once(tenant))?;
    if tx.session_gen(id)?.is_none() {
        return Err(no_agent(id));
    }
    tx.write_overrides(id, tenant, set, reset)?;
    let agent = tx.agent(id)?.ok_or_else(|| no_agent(id))?;
    let changed = replan_agent(tx, &agent, None, at)?;
    Ok((agent, changed))
}

/// A tenant granted to (or taken from) an agent, known or not yet; a
/// known agent re-planned. The rows that changed.
pub fn grant(
    tx: &mut dyn Tx,
    id: &str,
    tenant: &str,
    granted: bool,
    at: RefTime,
) -> StoreResult<Vec<DeliveryRow>> {
    locks::agent(tx, id, std::iter::once(tenant))?;
    tx.write_grant(id, tenant, granted, at)?;
    match tx.agent(id)? {
        Some(agent) => replan_agent(tx, &agent, None, at),
        // Granted before the agent first connects: nothing to plan.
        None => Ok(Vec::new()),
    }
}

/// A pack withdrawn (its open rollout superseded, its gate lifted) and
/// re-planned for every holder; a pack the store does not know is
/// withdrawn from the agents that hold it (a store restored from an older
/// copy must still be able to stop it). [`StoreError::NoSuchPack`] only
/// when nobody holds it either.
pub fn cancel(tx: &mut dyn Tx, key: &PackKey, at: RefTime) -> StoreResult<Vec<DeliveryRow>> {
    locks::pack(tx, key)?;
    if !tx.write_cancel(key, at)? {
        return Err(StoreError::NoSuchPack {
            tenant: key.tenant.clone(),
            pack: key.pack.clone(),
        });
    }
    rollouts::supersede(tx, key, "the pack was cancelled", at)?;
    tx.write_gate(key, None)?;
    plan::replan_pack(tx, key, at)
}

/// A live pack withdrawn from chosen agents only: each is stopped at the
/// latest version ([`baton_model::PackTargets::stopped`]) and the pack
/// re-planned, so a holder is told to cancel and nobody is sent a version
/// up to it again (a newer push reaches them). A cancelled pack is
/// withdrawn everywhere already: nothing changes.
pub fn withdraw_from(
    tx: &mut dyn Tx,
    key: &PackKey,
    agents: &[String],
    at: RefTime,
) -> StoreResult<Vec<DeliveryRow>> {
    locks::pack(tx, key)?;
    // Read for no agent of the cohort: only the pack row is needed.
    let Some(mut pack) = tx.pack_targets(key, Some(""))? else {
        return Err(StoreError::NoSuchPack {
            tenant: key.tenant.clone(),
            pack: key.pack.clone(),
        });
    };
    if pack.cancelled.is_some() {
        return Ok(Vec::new());
    }
    for id in agents {
        let through = pack.stopped.entry(id.clone()).or_default();
        *through = (*through).max(pack.latest);
    }
    tx.write_stops(key, &pack.stopped)?;
    plan::replan_pack(tx, key, at)
}

fn no_agent(id: &str) -> StoreError {
    StoreError::NoSuchAgent { id: id.to_owned() }
}
