//! Dashboard sessions and failed log-ins (see migration 13): every
//! replica reads and writes the same rows, so a session and a count of
//! failures are the site's, not one process's.

use super::codec::{instant_col, u64_from_db};
use super::db::{Db, Param, Row, chunks, col, params, placeholders, query_all, query_first, run};
use baton_model::identity::Identity;
use baton_store::{RefTime, SessionRow, StoreError, StoreResult};

const SESSION_COLUMNS: &str = "id_hash, who, serial, csrf, created_ns, expires_ns";

fn decode_session(row: &dyn Row) -> StoreResult<SessionRow> {
    let who: String = col(row, "who")?;
    Ok(SessionRow {
        id_hash: col(row, "id_hash")?,
        who: Identity::from_uri(&who)
            .map_err(|e| StoreError::corrupt("a dashboard session's identity", e))?,
        serial: col(row, "serial")?,
        csrf: col(row, "csrf")?,
        created: instant_col(row, "created_ns")?,
        expires: instant_col(row, "expires_ns")?,
    })
}

/// The session with this hash, if it stands at `now_ns`: not expired, its
/// certificate not recorded as revoked (one look-up by key, one by serial).
pub(crate) fn session(
    conn: &dyn Db,
    id_hash: &str,
    now_ns: i64,
) -> StoreResult<Option<SessionRow>> {
    let sql = format!(
        "SELECT {SESSION_COLUMNS} FROM dashboard_sessions s \
         WHERE s.id_hash = ?1 AND s.expires_ns > ?2 \
         AND NOT EXISTS (SELECT 1 FROM revocations r WHERE r.serial = s.serial)"
    );
    query_first(conn, &sql, params![id_hash, now_ns], decode_session)
}

pub(crate) fn is_revoked(conn: &dyn Db, serial: &str) -> StoreResult<bool> {
    Ok(query_first(
        conn,
        "SELECT 1 AS found FROM revocations WHERE serial = ?1",
        params![serial],
        |_| Ok(()),
    )?
    .is_some())
}

pub(crate) fn sessions_of(conn: &dyn Db, serial: &str) -> StoreResult<Vec<SessionRow>> {
    let sql = format!(
        "SELECT {SESSION_COLUMNS} FROM dashboard_sessions WHERE serial = ?1 \
         ORDER BY created_ns, id_hash"
    );
    query_all(conn, &sql, params![serial], decode_session)
}

pub(crate) fn count_sessions(conn: &dyn Db) -> StoreResult<u64> {
    let n: Option<i64> = query_first(
        conn,
        "SELECT COUNT(*) AS n FROM dashboard_sessions",
        &[],
        |r| col(r, "n"),
    )?;
    u64_from_db(n.unwrap_or(0), "session count")
}

pub(crate) fn put_session(conn: &dyn Db, row: &SessionRow) -> StoreResult<()> {
    let who = row.who.to_uri().ok_or_else(|| {
        StoreError::Invalid(format!("a session for {}: not an operator", row.who))
    })?;
    run(
        conn,
        "store a dashboard session",
        "INSERT INTO dashboard_sessions (id_hash, who, serial, csrf, created_ns, expires_ns) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![
            row.id_hash,
            who,
            row.serial,
            row.csrf,
            row.created.as_nanos(),
            row.expires.as_nanos()
        ],
    )?;
    Ok(())
}

/// Deletes the rows whose `column` is one of `values`; how many went.
fn delete_in(conn: &dyn Db, column: &str, values: &[String]) -> StoreResult<u64> {
    let mut n = 0;
    for chunk in chunks(values) {
        let p: Vec<Param<'_>> = chunk.iter().map(|v| Param::Text(v)).collect();
        let sql = format!(
            "DELETE FROM dashboard_sessions WHERE {column} IN {}",
            placeholders(1, chunk.len())
        );
        n += run(conn, "delete dashboard sessions", &sql, &p)?;
    }
    Ok(n)
}

pub(crate) fn delete_sessions(conn: &dyn Db, id_hashes: &[String]) -> StoreResult<u64> {
    delete_in(conn, "id_hash", id_hashes)
}

pub(crate) fn delete_sessions_of(conn: &dyn Db, serials: &[String]) -> StoreResult<u64> {
    delete_in(conn, "serial", serials)
}

/// At most `max` sessions ended by `now_ns`: expired (soonest first, by
/// the expiry index), then of revoked certificates.
pub(crate) fn delete_ended_sessions(conn: &dyn Db, now_ns: i64, max: u32) -> StoreResult<u64> {
    let max = i64::from(max);
    let expired = run(
        conn,
        "delete expired dashboard sessions",
        "DELETE FROM dashboard_sessions WHERE id_hash IN (SELECT id_hash FROM dashboard_sessions \
         WHERE expires_ns <= ?1 ORDER BY expires_ns LIMIT ?2)",
        params![now_ns, max],
    )?;
    let left = max.saturating_sub(i64::try_from(expired).unwrap_or(i64::MAX));
    if left == 0 {
        return Ok(expired);
    }
    let revoked = run(
        conn,
        "delete revoked dashboard sessions",
        "DELETE FROM dashboard_sessions WHERE id_hash IN (SELECT s.id_hash FROM dashboard_sessions s \
         JOIN revocations r ON r.serial = s.serial LIMIT ?1)",
        params![left],
    )?;
    Ok(expired + revoked)
}

/// One more failure in `source`'s window; its count now.
pub(crate) fn add_login_failure(conn: &dyn Db, source: &str, window_ns: i64) -> StoreResult<u64> {
    let n: Option<i64> = query_first(
        conn,
        "INSERT INTO login_failures (source, window_ns, failures) VALUES (?1, ?2, 1) \
         ON CONFLICT (source, window_ns) DO UPDATE SET failures = login_failures.failures + 1 \
         RETURNING failures",
        params![source, window_ns],
        |r| col(r, "failures"),
    )?;
    let n = n.ok_or_else(|| StoreError::corrupt("a failed log-in's count", "none returned"))?;
    u64_from_db(n, "failed log-ins")
}

pub(crate) fn delete_login_failures_before(
    conn: &dyn Db,
    before_ns: i64,
    max: u32,
) -> StoreResult<u64> {
    run(
        conn,
        "forget old failed log-ins",
        "DELETE FROM login_failures WHERE (source, window_ns) IN (SELECT source, window_ns \
         FROM login_failures WHERE window_ns < ?1 ORDER BY window_ns LIMIT ?2)",
        params![before_ns, i64::from(max)],
    )
}

/// `source`'s windows from `since_ns` on, oldest first.
pub(crate) fn login_failures(
    conn: &dyn Db,
    source: &str,
    since_ns: i64,
) -> StoreResult<Vec<(RefTime, u64)>> {
    query_all(
        conn,
        "SELECT window_ns, failures FROM login_failures WHERE source = ?1 AND window_ns >= ?2 \
         ORDER BY window_ns",
        params![source, since_ns],
        |r| {
            Ok((
                instant_col(r, "window_ns")?,
                u64_from_db(col(r, "failures")?, "failed log-ins")?,
            ))
        },
    )
}
