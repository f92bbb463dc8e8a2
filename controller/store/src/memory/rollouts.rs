//! Rollouts in the memory store, as `sql::rollouts` keeps them.

use super::State;
use crate::{
    Base, GateRow, PackKey, PackVersionRow, RolloutChange, RolloutRow, RolloutState, StoreError,
    StoreResult,
};
use baton_model::time;

fn set_gate(s: &mut State, key: &PackKey, gate: Option<GateRow>) {
    if let Some(p) = s.packs.get_mut(key) {
        p.gate = gate;
    }
}

/// Ends the pack's open rollouts.
fn supersede(s: &mut State, key: &PackKey, why: &str, at_ns: i64) {
    for ((k, _), r) in s.rollouts.iter_mut() {
        if k == key && !r.state.is_final() {
            r.state = RolloutState::Superseded;
            r.reason = why.to_string();
            r.updated = time::at(at_ns);
            r.rev += 1;
        }
    }
}

/// A new version was stored (see `sql::rollouts::put_pack`): `before` is
/// the pack as it was (latest, cancelled, gate).
pub(super) fn on_new_version(
    s: &mut State,
    p: &PackVersionRow,
    before: Option<(u64, bool, Option<GateRow>)>,
) {
    let key = p.key();
    let (latest, cancelled, gate) = match before {
        Some((l, c, g)) => (Some(l), c, g),
        None => (None, false, None),
    };
    let aborted = gate.as_ref().is_some_and(|g| {
        s.rollouts
            .get(&(key.clone(), g.rollout))
            .is_some_and(|r| r.state == RolloutState::Aborted)
    });
    supersede(
        s,
        &key,
        &format!("v{} pushed", p.version),
        p.pushed.as_nanos(),
    );
    if !p.rollout {
        set_gate(s, &key, None);
        return;
    }
    let base = Base::of(latest, cancelled, gate.as_ref(), aborted);
    let row = RolloutRow::new(&key, p.version, base, p.pushed);
    set_gate(s, &key, row.gate(false));
    s.rollouts.insert((key, p.version), row);
}

pub(super) fn on_cancel(s: &mut State, key: &PackKey, at_ns: i64) {
    supersede(s, key, "the pack was cancelled", at_ns);
    set_gate(s, key, None);
}

pub(super) fn load(s: &State, key: &PackKey, version: Option<u64>) -> Option<RolloutRow> {
    s.rollouts
        .iter()
        .filter(|((k, v), _)| k == key && version.is_none_or(|want| *v == want))
        .map(|(_, r)| r.clone())
        .next_back()
}

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

/// Applies `change` if the stored rev is still its rev; whether it was.
pub(super) fn advance(s: &mut State, change: &RolloutChange) -> StoreResult<bool> {
    let key = change.row.key();
    let Some(stored) = s.rollouts.get(&(key.clone(), change.row.version)) else {
        return Ok(false);
    };
    if stored.rev != change.row.rev {
        return Ok(false);
    }
    if let Some(p) = &change.republish {
        // As `put_pack` decides: only a higher version, or the same one
        // with the same text.
        let latest = s.packs.get(&key).map_or(0, |r| r.latest);
        if p.version < latest {
            return Err(StoreError::VersionOlder {
                tenant: p.tenant.clone(),
                pack: p.pack.clone(),
                version: p.version,
                latest,
            });
        }
        if s.versions
            .get(&(key.clone(), p.version))
            .is_some_and(|v| v.yaml != p.yaml)
        {
            return Err(StoreError::VersionTaken {
                tenant: p.tenant.clone(),
                pack: p.pack.clone(),
                version: p.version,
            });
        }
    }
    let mut row = change.row.clone();
    row.members = stored.members.clone();
    row.rev += 1;
    for (id, m) in &change.admit {
        row.members.entry(id.clone()).or_insert(*m);
    }
    for id in &change.skip {
        if let Some(m) = row.members.get_mut(id) {
            m.skipped = true;
        }
    }
    if let Some(p) = &change.republish {
        if let Some(rec) = s.packs.get_mut(&key) {
            rec.latest = p.version;
            rec.targets = p.targets.clone();
            rec.pushed = p.pushed;
            rec.cancelled = None;
        }
        s.versions.insert((key.clone(), p.version), p.clone());
    }
    set_gate(s, &key, change.gate.clone());
    s.rollouts.insert((key, row.version), row);
    Ok(true)
}
