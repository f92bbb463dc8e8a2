//! The audit log.

use rusqlite::{Connection, params};

use super::codec::{Context, query_all};
use crate::store::{AuditRow, MAX_PAGE, StoreResult, page};

pub(super) fn put_audit(conn: &Connection, row: &AuditRow) -> StoreResult<()> {
    conn.prepare_cached(
        "INSERT INTO audit (at_ns, who, tenant, role, action, target, result) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )
    .and_then(|mut st| {
        st.execute(params![
            row.at_ns, row.who, row.tenant, row.role, row.action, row.target, row.result
        ])
    })
    .ctx("write an audit record")?;
    Ok(())
}

/// The newest `limit` records at or after `since_ns`, oldest first: by
/// instant, then in the order they were stored (one order for both, so
/// the newest `limit` are the last `limit` of the full list).
pub(super) fn audit(
    conn: &Connection,
    tenant: Option<&str>,
    since_ns: i64,
    limit: u32,
) -> StoreResult<Vec<AuditRow>> {
    let limit = i64::from(page(limit, MAX_PAGE * 10));
    let sql = "SELECT at_ns, who, tenant, role, action, target, result FROM (\
         SELECT * FROM audit WHERE at_ns >= ?1 AND (?2 IS NULL OR tenant = ?2) \
         ORDER BY at_ns DESC, id DESC LIMIT ?3) AS newest ORDER BY at_ns, id";
    query_all(conn, sql, params![since_ns, tenant, limit], |r| {
        Ok(AuditRow {
            at_ns: r.get(0).ctx("audit at_ns")?,
            who: r.get(1).ctx("audit who")?,
            tenant: r.get(2).ctx("audit tenant")?,
            role: r.get(3).ctx("audit role")?,
            action: r.get(4).ctx("audit action")?,
            target: r.get(5).ctx("audit target")?,
            result: r.get(6).ctx("audit result")?,
        })
    })
}
