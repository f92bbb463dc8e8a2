//! The audit log.

use super::codec::instant_col;
use super::db::{Db, col, params, query_all, run};
use baton_store::{AuditRow, MAX_PAGE, StoreResult, page};

pub(crate) fn put_audit(conn: &dyn Db, row: &AuditRow) -> StoreResult<()> {
    run(
        conn,
        "write an audit record",
        "INSERT INTO audit (at_ns, who, tenant, role, action, target, result) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![
            row.at.as_nanos(),
            row.who,
            row.tenant,
            row.role,
            row.action,
            row.target,
            row.result
        ],
    )?;
    Ok(())
}

/// The newest `limit` records at or after `since_ns`, oldest first: by
/// instant, then in the order they were stored (one order for both, so
/// the newest `limit` are the last `limit` of the full list).
pub(crate) fn audit(
    conn: &dyn Db,
    tenant: Option<&str>,
    since_ns: i64,
    limit: u32,
) -> StoreResult<Vec<AuditRow>> {
    let limit = i64::from(page(limit, MAX_PAGE * 10));
    let sql = "SELECT at_ns, who, tenant, role, action, target, result FROM (\
         SELECT * FROM audit WHERE at_ns >= ?1 AND (CAST(?2 AS TEXT) IS NULL OR tenant = ?2) \
         ORDER BY at_ns DESC, id DESC LIMIT ?3) AS newest ORDER BY at_ns, id";
    query_all(conn, sql, params![since_ns, tenant, limit], |r| {
        Ok(AuditRow {
            at: instant_col(r, "at_ns")?,
            who: col(r, "who")?,
            tenant: col(r, "tenant")?,
            role: col(r, "role")?,
            action: col(r, "action")?,
            target: col(r, "target")?,
            result: col(r, "result")?,
        })
    })
}

/// Records `rows`' revocations not recorded yet, with their audit records;
/// the serials recorded now.
pub(crate) fn revoke(
    conn: &dyn Db,
    rows: &[(baton_store::RevocationRow, Vec<AuditRow>)],
) -> StoreResult<Vec<String>> {
    let mut new = Vec::new();
    for (r, audit) in rows {
        let n = run(
            conn,
            "record a revocation",
            "INSERT INTO revocations (serial, kind, name, at_ns) VALUES (?1, ?2, ?3, ?4) \
             ON CONFLICT (serial) DO NOTHING",
            params![r.serial, r.kind, r.name, r.at.as_nanos()],
        )?;
        if n == 1 {
            for a in audit {
                put_audit(conn, a)?;
            }
            new.push(r.serial.clone());
        }
    }
    Ok(new)
}

pub(crate) fn revocations(conn: &dyn Db) -> StoreResult<Vec<baton_store::RevocationRow>> {
    query_all(
        conn,
        "SELECT serial, kind, name, at_ns FROM revocations ORDER BY serial",
        &[],
        |r| {
            Ok(baton_store::RevocationRow {
                serial: col(r, "serial")?,
                kind: col(r, "kind")?,
                name: col(r, "name")?,
                at: instant_col(r, "at_ns")?,
            })
        },
    )
}
