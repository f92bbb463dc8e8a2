//! Rollouts in the memory store: rows by pack and version, each with its
//! cohort.

use super::state::State;
use crate::{PackKey, RolloutRow};

/// One rollout with its cohort (`version` `None`: the pack's newest).
pub(super) fn load(s: &State, key: &PackKey, version: Option<u64>) -> Option<RolloutRow> {
    s.rollouts
        .iter()
        .filter(|((k, v), _)| k == key && version.is_none_or(|want| *v == want))
        .map(|(_, r)| r.clone())
        .next_back()
}

/// The pack's rollouts that are not final.
pub(super) fn open(s: &State, key: &PackKey) -> Vec<RolloutRow> {
    s.rollouts
        .iter()
        .filter(|((k, _), r)| k == key && !r.state.is_final())
        .map(|(_, r)| r.clone())
        .collect()
}

/// Rollouts of one tenant (or all), newest version of each pack first
/// within the pack; only those not final when `open_only`, else the first
/// [`crate::MAX_PAGE`].
pub(super) fn list(s: &State, tenant: Option<&str>, open_only: bool) -> Vec<RolloutRow> {
    let mut out: Vec<RolloutRow> = s
        .rollouts
        .values()
        .filter(|r| tenant.is_none_or(|t| r.tenant == t) && !(open_only && r.state.is_final()))
        .cloned()
        .collect();
    out.sort_by(|a, b| (&a.tenant, &a.pack, b.version).cmp(&(&b.tenant, &b.pack, a.version)));
    if !open_only {
        out.truncate(crate::MAX_PAGE as usize);
    }
    out
}

/// Writes `row` (its cohort kept as stored) if the stored rev is still
/// `row.rev`, moving it to `rev + 1`; whether it was.
pub(super) fn compare_and_set(s: &mut State, row: &RolloutRow) -> bool {
    let k = (row.key(), row.version);
    let Some(stored) = s.rollouts.get(&k) else {
        return false;
    };
    if stored.rev != row.rev {
        return false;
    }
    let mut next = row.clone();
    next.members = stored.members.clone();
    next.rev += 1;
    s.rollouts.insert(k, next);
    true
}
