//! Revocations into the audit log. `ca revoke` only writes `revoked.txt`
//! in the CA directory (it works without a running controller); the
//! controller re-reads that file when it changes ([`super::tls`]) and here
//! records each serial it sees listed for the first time as one audit
//! record: who `ca`, action `revoke`, target `KIND NAME (serial S)`, result
//! `ok`, at the instant the controller picked it up (at start too, for
//! revocations made while it was down). The store keeps one row per
//! revoked serial, written with its audit records, so neither a restart
//! nor another replica picking up the same list records anything twice;
//! and every replica refuses the serials any of them recorded
//! ([`follow_revocations`]).
//!
//! Tenants: an operator certificate's revocation is recorded in its
//! tenant (read from `DIR/operators/NAME.pem`); an agent's in every tenant
//! that sees the agent (the tenants it serves, and those with a delivery
//! to it), or with an empty tenant (fleet-wide: plaintext-era admins and
//! `audit` without a tenant) when none does. No tenant reads another's
//! record.

use std::collections::HashSet;
use std::sync::Arc;

use crate::ca::{self, CaDir, RevokedEntry};
use crate::identity::Identity;
use crate::model::{AuditRow, RefTime, RevocationRow};
use crate::store::StoreError;

use super::{Shared, now_ns};

/// The audit target of a revoked certificate.
pub fn target(e: &RevokedEntry) -> String {
    let kind = if e.kind.is_empty() {
        "certificate"
    } else {
        &e.kind
    };
    format!("{kind} {} (serial {})", e.name, e.serial).replace("  ", " ")
}

/// The serial a `revoke` audit target names.
#[cfg(test)]
fn serial_of(target: &str) -> Option<&str> {
    target.rsplit_once("(serial ")?.1.strip_suffix(')')
}

/// The audit records for `entries` not yet in `audited` (serials); one per
/// tenant with a stake in it ([`crate::model::AgentRow::stakeholders`] for an agent), or
/// one with an empty tenant.
pub fn new_records(
    entries: &[RevokedEntry],
    audited: &HashSet<String>,
    tenants: impl Fn(&RevokedEntry) -> Vec<String>,
    at_ns: i64,
) -> Vec<AuditRow> {
    let mut out = Vec::new();
    for e in entries.iter().filter(|e| !audited.contains(&e.serial)) {
        let mut ts = tenants(e);
        if ts.is_empty() {
            ts.push(String::new());
        }
        for tenant in ts {
            out.push(AuditRow {
                at: RefTime::from_nanos(at_ns),
                who: "ca".into(),
                tenant,
                role: "ca".into(),
                action: "revoke".into(),
                target: target(e),
                result: "ok".into(),
            });
        }
    }
    out
}

/// The revocation list's entries (`None`: unreadable just now; the TLS
/// side keeps its previous list and says so too).
async fn read_entries(dir: &CaDir) -> Result<Option<Vec<RevokedEntry>>, StoreError> {
    let path = dir.revoked();
    let read = tokio::task::spawn_blocking({
        let path = path.clone();
        move || ca::read_revoked_entries(&path)
    })
    .await;
    Ok(Some(match read {
        Ok(Ok(e)) => e,
        Ok(Err(e)) => {
            // The TLS side logs it too and keeps the previous list.
            tracing::warn!("revocations not audited: {e}");
            return Ok(None);
        }
        Err(e) => {
            return Err(StoreError::Backend(format!(
                "reading {}: {e}",
                path.display()
            )));
        }
    }))
}

/// The tenants with a stake in each newly revoked agent (their audit
/// logs get the record).
async fn agent_stakeholders(
    store: &Arc<dyn crate::store::Store>,
    entries: &[RevokedEntry],
    recorded: &HashSet<String>,
) -> Result<std::collections::HashMap<String, Vec<String>>, StoreError> {
    let mut agent_seen = std::collections::HashMap::new();
    for e in entries
        .iter()
        .filter(|e| e.kind == "agent" && !recorded.contains(&e.serial))
    {
        if let Some(a) = store.agent(&e.name).await? {
            let rows = store.deliveries_of_agent(&e.name).await?;
            agent_seen.insert(e.name.clone(), a.stakeholders(&rows));
        }
    }
    Ok(agent_seen)
}

/// Record the revocations listed now that the log does not have yet.
async fn record_new(shared: &Shared, dir: &CaDir) -> Result<usize, StoreError> {
    let Some(entries) = read_entries(dir).await? else {
        return Ok(0);
    };
    if entries.is_empty() {
        return Ok(0);
    }
    let store = &shared.app.store;
    // Recorded already (by this replica or another, now or before): the
    // store holds one row per serial.
    let recorded: HashSet<String> = store
        .revocations()
        .await?
        .into_iter()
        .map(|r| r.serial)
        .collect();
    if entries.iter().all(|e| recorded.contains(&e.serial)) {
        return Ok(0);
    }
    let agent_seen = agent_stakeholders(store, &entries, &recorded).await?;
    let operator_tenant = |name: &str| {
        ca::read_cert(&dir.leaf_cert(ca::Kind::Operator, name))
            .ok()
            .and_then(|c| match c.identity {
                Identity::Operator { tenant, .. } => Some(tenant),
                _ => None,
            })
    };
    let at_ns = now_ns();
    let records = new_records(
        &entries,
        &recorded,
        |e| match e.kind.as_str() {
            "agent" => agent_seen.get(&e.name).cloned().unwrap_or_default(),
            "operator" => operator_tenant(&e.name).into_iter().collect(),
            _ => Vec::new(),
        },
        at_ns,
    );
    // Each serial with its records, so the store writes them only with
    // the serial's first row.
    let rows: Vec<(RevocationRow, Vec<AuditRow>)> = entries
        .iter()
        .filter(|e| !recorded.contains(&e.serial))
        .map(|e| {
            let t = target(e);
            let audit = records.iter().filter(|r| r.target == t).cloned().collect();
            (
                RevocationRow {
                    serial: e.serial.clone(),
                    kind: e.kind.clone(),
                    name: e.name.clone(),
                    at: RefTime::from_nanos(at_ns),
                },
                audit,
            )
        })
        .collect();
    let new = store.revoke(rows).await?;
    for serial in &new {
        tracing::info!(%serial, "revocation recorded and audited");
    }
    Ok(new.len())
}

/// Until the controller stops: every [`SHARED_EVERY`], the serials any
/// replica recorded as revoked join this one's list (its own CA
/// directory's `revoked.txt` may not have them: `ca revoke` ran on
/// another host).
pub async fn follow_revocations(shared: Arc<Shared>, tls: Arc<super::tls::TlsState>) {
    let mut tick = tokio::time::interval(SHARED_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stop = shared.shutdown.clone();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        match shared.app.store.revocations().await {
            Ok(rows) => tls.set_shared_revoked(rows.into_iter().map(|r| r.serial).collect()),
            Err(e) => tracing::warn!("cannot read the revocations other replicas recorded: {e}"),
        }
    }
}

/// How often the store's revocations are read.
pub const SHARED_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// Until the controller stops: every time the revocation list is (re)read,
/// audit what is new in it.
pub async fn audit_revocations(shared: Arc<Shared>, dir: CaDir) {
    let mut revoked = shared.revoked.subscribe();
    revoked.mark_changed();
    let mut stop = shared.shutdown.clone();
    loop {
        tokio::select! {
            r = revoked.changed() => {
                if r.is_err() {
                    return;
                }
                revoked.borrow_and_update();
                if let Err(e) = record_new(&shared, &dir).await {
                    // Tried again at the next change of the list.
                    tracing::error!("revocations not audited: {e}");
                }
            }
            _ = stop.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(serial: &str, kind: &str, name: &str) -> RevokedEntry {
        RevokedEntry {
            serial: serial.into(),
            kind: kind.into(),
            name: name.into(),
        }
    }

    #[test]
    fn each_serial_is_audited_once_in_the_tenants_that_see_it() {
        let entries = [
            entry("0a", "agent", "press-01"),
            entry("0b", "operator", "ann"),
            entry("0c", "", ""),
        ];
        let audited: HashSet<String> = ["0b".to_string()].into();
        let rows = new_records(
            &entries,
            &audited,
            |e| match e.name.as_str() {
                "press-01" => vec!["plant-a".into(), "plant-b".into()],
                _ => vec![],
            },
            7,
        );
        let got: Vec<(String, String)> = rows
            .iter()
            .map(|r| (r.tenant.clone(), r.target.clone()))
            .collect();
        assert_eq!(
            got,
            [
                ("plant-a".into(), "agent press-01 (serial 0a)".into()),
                ("plant-b".into(), "agent press-01 (serial 0a)".into()),
                (String::new(), "certificate (serial 0c)".into()),
            ]
        );
        assert!(rows.iter().all(|r| r.who == "ca" && r.action == "revoke"));
        for r in &rows {
            assert!(serial_of(&r.target).is_some());
        }
        assert_eq!(serial_of("agent press-01 (serial 0a)"), Some("0a"));
    }
}
