//! Rollouts as decisions: what storing a version does to the pack's
//! rollouts and gate, and a rollout's step applied only if no other
//! writer stepped it first.

use baton_model::{
    Base, DeliveryRow, PackKey, PackVersionRow, PutPack, RefTime, RolloutChange, RolloutRow,
    RolloutState,
};

use super::plan::replan_pack;
use crate::error::StoreResult;
use crate::tx::Tx;

/// Ends every rollout of the pack that is not final, as superseded by
/// `why`.
pub(super) fn supersede(tx: &mut dyn Tx, key: &PackKey, why: &str, at: RefTime) -> StoreResult<()> {
    for mut r in tx.open_rollouts(key)? {
        r.state = RolloutState::Superseded;
        r.reason = why.to_string();
        r.updated = at;
        tx.cas_rollout(&r)?;
    }
    Ok(())
}

/// Store a pack version. Refused when the version is lower than the
/// newest stored, or equal with other YAML; pushing a version of a
/// cancelled pack makes it live again. A new version ends the pack's open
/// rollout (superseded) and, when it has a `rollout:` section, starts its
/// own, gating the version in the same transaction, so no decision ever
/// sees the new version ungated. What its outsiders keep comes from the
/// pack as it was ([`Base::of`]). Does not plan: reconcile the pack.
pub fn put_pack(tx: &mut dyn Tx, p: &PackVersionRow) -> StoreResult<PutPack> {
    let key = p.key();
    super::locks::pack(tx, &key)?;
    let before = tx.pack_head(&key)?;
    let put = tx.write_version(p)?;
    if put == PutPack::Unchanged {
        return Ok(put);
    }
    // Read before `supersede` ends it: whether the gate's rollout aborted.
    let (latest, cancelled, gate) = match before {
        Some(h) => (Some(h.latest), h.cancelled, h.gate),
        None => (None, false, None),
    };
    let aborted = match &gate {
        Some(g) => tx
            .rollout(&key, Some(g.rollout))?
            .is_some_and(|r| r.state == RolloutState::Aborted),
        None => false,
    };
    supersede(tx, &key, &format!("v{} pushed", p.version), p.pushed)?;
    if !p.rollout {
        tx.write_gate(&key, None)?;
        return Ok(put);
    }
    let base = Base::of(latest, cancelled, gate.as_ref(), aborted);
    let row = RolloutRow::new(&key, p.version, base, p.pushed);
    tx.insert_rollout(&row)?;
    tx.write_gate(&key, row.gate(false).as_ref())?;
    Ok(put)
}

/// Apply a rollout change (the row, new members, skipped ones, a
/// republished version, the pack's gate) and re-plan its pack, **only
/// if** the stored rollout is still at `change.row.rev` (it then moves to
/// `rev + 1`). `None`: another writer (a replica, an operator) changed it
/// first; nothing was written. Otherwise the rows that changed.
pub fn advance(
    tx: &mut dyn Tx,
    change: &RolloutChange,
    at: RefTime,
) -> StoreResult<Option<Vec<DeliveryRow>>> {
    let r = &change.row;
    super::locks::pack(tx, &r.key())?;
    if !tx.cas_rollout(r)? {
        return Ok(None);
    }
    let key = r.key();
    if !change.admit.is_empty() {
        tx.admit(&key, r.version, &change.admit)?;
    }
    if !change.skip.is_empty() {
        tx.skip_members(&key, r.version, &change.skip)?;
    }
    if let Some(p) = &change.republish {
        tx.write_version(p)?;
    }
    tx.write_gate(&key, change.gate.as_ref())?;
    Ok(Some(replan_pack(tx, &key, at)?))
}
