//! The locks that keep decisions of parallel writers (replicas on one
//! database) from racing, taken at the start of each decision and held
//! to its transaction's end: a decision about an agent holds the agent
//! (exclusive) and the tenants of every pack it may plan for it (shared);
//! a decision about a pack (a push, a cancel, a rollout's step) holds its
//! tenant (exclusive). Two decisions that could plan the same (agent,
//! pack) pair thus never run at once, and the later one reads what the
//! earlier committed. Agents are locked before tenants, tenants in order,
//! so two decisions wait for each other only in one direction; within a
//! batch of several decisions a deadlock is still possible, and the
//! database breaks it: the aborted decision runs again.
//!
//! Under [`Binding::Open`] an agent serves every tenant: all decisions
//! share one tenant lock.

use std::collections::BTreeSet;

use baton_model::{Binding, PackKey};

use crate::error::StoreResult;
use crate::tx::Tx;

/// The one tenant lock under [`Binding::Open`].
const EVERY_TENANT: &str = "*";

/// A decision about agent `id` that may plan packs of `also` (held,
/// named in its certificate, labelled) besides those of the tenants it
/// serves and those it has rows of.
pub(super) fn agent<'a>(
    tx: &mut dyn Tx,
    id: &str,
    also: impl Iterator<Item = &'a str>,
) -> StoreResult<()> {
    if !tx.locking() {
        return Ok(());
    }
    tx.lock_agent(id)?;
    let tenants: BTreeSet<String> = match tx.binding() {
        Binding::Open => [EVERY_TENANT.to_owned()].into(),
        Binding::Tenants => {
            // Read under the agent's lock: no other decision about it
            // changes its tenants or rows meanwhile (a pack's decision
            // adds rows only for agents serving the pack's tenant).
            let mut t: BTreeSet<String> = also.map(str::to_owned).collect();
            if let Some(a) = tx.agent(id)? {
                t.extend(a.tenants);
            }
            t.extend(tx.rows_of_agent(id)?.into_iter().map(|r| r.tenant));
            t
        }
    };
    let tenants: Vec<&str> = tenants.iter().map(String::as_str).collect();
    tx.lock_tenants(&tenants, false)
}

/// Decisions about several agents at once, each about packs of
/// `tenants` (a batch of answers): the agents in id order, then the
/// tenants (shared), as one decision about each would.
pub(super) fn agents_in<'a>(
    tx: &mut dyn Tx,
    ids: &[&str],
    tenants: impl Iterator<Item = &'a str>,
) -> StoreResult<()> {
    if !tx.locking() {
        return Ok(());
    }
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    tx.lock_agents(&sorted)?;
    let binding = tx.binding();
    let tenants: BTreeSet<&str> = tenants.map(|t| scope(binding, t)).collect();
    let tenants: Vec<&str> = tenants.into_iter().collect();
    tx.lock_tenants(&tenants, false)
}

/// A decision about pack `key` for every agent it concerns.
pub(super) fn pack(tx: &mut dyn Tx, key: &PackKey) -> StoreResult<()> {
    if !tx.locking() {
        return Ok(());
    }
    let t = scope(tx.binding(), &key.tenant);
    tx.lock_tenants(&[t], true)
}

fn scope(binding: Binding, tenant: &str) -> &str {
    match binding {
        Binding::Open => EVERY_TENANT,
        Binding::Tenants => tenant,
    }
}
