//! Revocations into the audit log, once each. `ca revoke` only writes the
//! CA directory's list (it works without a running controller); the
//! server re-reads that file when it changes and hands its entries here:
//! each serial seen listed for the first time becomes one audit record per
//! tenant with a stake in it — who `ca`, action `revoke`, target `KIND NAME
//! (serial S)`, result `ok`, at the instant the controller picked it up
//! (at start too, for revocations made while it was down). The store keeps
//! one row per revoked serial, written with its audit records, so neither
//! a restart nor another replica picking up the same list records anything
//! twice.
//!
//! Tenants: an operator certificate's revocation is recorded in its tenant
//! (the caller reads it from the certificate); an agent's in every tenant
//! that sees the agent (the tenants it serves, and those with a delivery
//! to it), or with an empty tenant (fleet-wide: plaintext-era admins and
//! `audit` without a tenant) when none does. No tenant reads another's
//! record.

use std::collections::{HashMap, HashSet};

use crate::app::{App, AppResult, now};
use baton_model::{AuditRow, RefTime, RevocationRow, RevokedEntry};
use baton_store::StoreOps;

/// The audit target of a revoked certificate.
pub fn target(e: &RevokedEntry) -> String {
    let kind = if e.kind.is_empty() {
        "certificate"
    } else {
        &e.kind
    };
    format!("{kind} {} (serial {})", e.name, e.serial).replace("  ", " ")
}

/// The audit records for `entries` not yet in `audited` (serials); one per
/// tenant with a stake in it ([`baton_model::AgentRow::stakeholders`] for
/// an agent), or one with an empty tenant.
pub fn new_records(
    entries: &[RevokedEntry],
    audited: &HashSet<String>,
    tenants: impl Fn(&RevokedEntry) -> Vec<String>,
    at: RefTime,
) -> Vec<AuditRow> {
    let mut out = Vec::new();
    for e in entries.iter().filter(|e| !audited.contains(&e.serial)) {
        let mut ts = tenants(e);
        if ts.is_empty() {
            ts.push(String::new());
        }
        for tenant in ts {
            out.push(AuditRow {
                at,
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

impl App {
    /// Every serial any replica recorded as revoked.
    pub async fn revoked_serials(&self) -> AppResult<Vec<String>> {
        Ok(self
            .store
            .revocations()
            .await?
            .into_iter()
            .map(|r| r.serial)
            .collect())
    }

    /// Record the entries of the revocation list not recorded yet, each
    /// with its audit records; `operator_tenant` names an operator
    /// certificate's tenant. How many were recorded now.
    pub async fn record_revocations(
        &self,
        entries: &[RevokedEntry],
        operator_tenant: impl Fn(&str) -> Option<String>,
    ) -> AppResult<usize> {
        // Recorded already (by this replica or another, now or before):
        // the store holds one row per serial.
        let recorded: HashSet<String> = self.revoked_serials().await?.into_iter().collect();
        if entries.iter().all(|e| recorded.contains(&e.serial)) {
            return Ok(0);
        }
        let agent_seen = self.agent_stakeholders(entries, &recorded).await?;
        let at = now();
        let records = new_records(
            entries,
            &recorded,
            |e| match e.kind.as_str() {
                "agent" => agent_seen.get(&e.name).cloned().unwrap_or_default(),
                "operator" => operator_tenant(&e.name).into_iter().collect(),
                _ => Vec::new(),
            },
            at,
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
                        at,
                    },
                    audit,
                )
            })
            .collect();
        let new = self.store.revoke(rows).await?;
        for serial in &new {
            tracing::info!(%serial, "revocation recorded and audited");
        }
        Ok(new.len())
    }

    /// The tenants with a stake in each newly revoked agent (their audit
    /// logs get the record).
    async fn agent_stakeholders(
        &self,
        entries: &[RevokedEntry],
        recorded: &HashSet<String>,
    ) -> AppResult<HashMap<String, Vec<String>>> {
        let mut agent_seen = HashMap::new();
        for e in entries
            .iter()
            .filter(|e| e.kind == "agent" && !recorded.contains(&e.serial))
        {
            if let Some(a) = self.store.agent(&e.name).await? {
                let rows = self.store.deliveries_of_agent(&e.name).await?;
                agent_seen.insert(e.name.clone(), a.stakeholders(&rows));
            }
        }
        Ok(agent_seen)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The serial a `revoke` audit target names.
    fn serial_of(target: &str) -> Option<&str> {
        target.rsplit_once("(serial ")?.1.strip_suffix(')')
    }

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
            RefTime::from_nanos(7),
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
