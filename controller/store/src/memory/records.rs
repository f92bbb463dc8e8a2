//! The memory store's append-only records (clock history, audit,
//! events, revocations): the reads that sort them and retention's
//! deletes.

use super::state::State;
use crate::{AuditRow, RevocationRow, SessionRow, StoreResult};
use baton_model::RefTime;

/// Deletes at most `max` clock reports before `before`, oldest first.
pub(super) fn delete_clock_before(s: &mut State, before: RefTime, max: u32) -> u64 {
    let mut old: Vec<(i64, String)> = s
        .clock
        .keys()
        .filter(|(_, at)| *at < before.as_nanos())
        .map(|(a, at)| (*at, a.clone()))
        .collect();
    old.sort_unstable();
    let keys: Vec<(String, i64)> = old
        .into_iter()
        .take(max as usize)
        .map(|(at, a)| (a, at))
        .collect();
    for k in &keys {
        s.clock.remove(k);
    }
    keys.len() as u64
}

/// Deletes at most `max` audit records before `before`, oldest first.
pub(super) fn delete_audit_before(s: &mut State, before: RefTime, max: u32) -> u64 {
    let mut old: Vec<(RefTime, u64)> = s
        .audit
        .iter()
        .filter(|(_, r)| r.at < before)
        .map(|(id, r)| (r.at, *id))
        .collect();
    old.sort_unstable();
    old.truncate(max as usize);
    for (_, id) in &old {
        s.audit.remove(id);
    }
    old.len() as u64
}

/// Deletes at most `max` events stored before `before`.
pub(super) fn delete_events_before(s: &mut State, before: RefTime, max: u32) -> u64 {
    let gone: Vec<u64> = s
        .events
        .values()
        .filter(|e| e.at < before)
        .take(max as usize)
        .map(|e| e.id)
        .collect();
    for id in &gone {
        s.events.remove(id);
    }
    gone.len() as u64
}

/// Records the revocations not known yet, each with its audit records;
/// their serials.
pub(super) fn revoke(s: &mut State, rows: &[(RevocationRow, Vec<AuditRow>)]) -> Vec<String> {
    let mut new = Vec::new();
    for (r, audit) in rows {
        if s.revocations.contains_key(&r.serial) {
            continue;
        }
        for a in audit {
            s.next_audit_id += 1;
            s.audit.insert(s.next_audit_id, a.clone());
        }
        new.push(r.serial.clone());
        s.revocations.insert(r.serial.clone(), r.clone());
    }
    new
}

/// The newest `limit` audit records at or after `since` (of `tenant`,
/// or all), oldest first.
pub(super) fn audit(
    s: &State,
    tenant: Option<&str>,
    since: RefTime,
    limit: usize,
) -> StoreResult<Vec<AuditRow>> {
    let mut rows: Vec<(RefTime, u64, &AuditRow)> = s
        .audit
        .iter()
        .filter(|(_, r)| r.at >= since && tenant.is_none_or(|t| r.tenant == t))
        .map(|(id, r)| (r.at, *id, r))
        .collect();
    rows.sort_unstable_by_key(|(at, id, _)| (*at, *id));
    let skip = rows.len().saturating_sub(limit);
    Ok(rows
        .into_iter()
        .skip(skip)
        .map(|(_, _, r)| r.clone())
        .collect())
}

/// Whether a session stands at `now`: not expired, its certificate not
/// revoked.
pub(super) fn session_stands(s: &State, row: &SessionRow, now: RefTime) -> bool {
    row.expires > now && !s.revocations.contains_key(&row.serial)
}

/// Deletes at most `max` sessions that ended by `now`, soonest expiry
/// first.
pub(super) fn delete_ended_sessions(s: &mut State, now: RefTime, max: u32) -> u64 {
    let mut ended: Vec<(RefTime, String)> = s
        .sessions
        .values()
        .filter(|r| !session_stands(s, r, now))
        .map(|r| (r.expires, r.id_hash.clone()))
        .collect();
    ended.sort_unstable();
    ended.truncate(max as usize);
    for (_, id) in &ended {
        s.sessions.remove(id);
    }
    ended.len() as u64
}

/// Deletes at most `max` windows of failed log-ins that start before
/// `before`, oldest first.
pub(super) fn delete_login_failures_before(s: &mut State, before: RefTime, max: u32) -> u64 {
    let mut old: Vec<(i64, String)> = s
        .login_failures
        .keys()
        .filter(|(_, w)| *w < before.as_nanos())
        .map(|(src, w)| (*w, src.clone()))
        .collect();
    old.sort_unstable();
    old.truncate(max as usize);
    for (w, src) in &old {
        s.login_failures.remove(&(src.clone(), *w));
    }
    old.len() as u64
}
