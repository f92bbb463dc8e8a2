//! Events between replicas: stored by the replica they happened on, read
//! by the others in mark order (see the `follow_marks` migration).

use super::codec::{instant_col, u64_from_db};
use super::db::{
    Db, Param, Row, chunks, col, params, query_all, query_first, run, values_rows, with_row,
};
use baton_store::{EventKind, EventRow, MAX_PAGE, Mark, StoreResult, page};

pub(crate) const DELETE_EVENTS: &str = "DELETE FROM events WHERE id IN \
     (SELECT id FROM events WHERE at_ns < ?1 ORDER BY id LIMIT ?2)";

/// Several events per statement (in order: their ids follow it): a push
/// to thousands of agents relays thousands of delivery changes.
pub(crate) fn put_events(conn: &dyn Db, rows: &[EventRow]) -> StoreResult<()> {
    const COLUMNS: usize = 7;
    for chunk in chunks(rows) {
        let mut values: Vec<Param<'_>> = Vec::with_capacity(chunk.len() * COLUMNS);
        for e in chunk {
            values.extend([
                Param::Text(&e.replica),
                Param::Text(e.kind.as_str()),
                Param::Text(&e.agent_id),
                Param::Text(&e.tenant),
                Param::Text(&e.pack),
                Param::Text(&e.detail),
                Param::Int(e.at.as_nanos()),
            ]);
        }
        run(
            conn,
            "store events",
            &format!(
                "INSERT INTO events (replica, kind, agent_id, tenant, pack, detail, at_ns) \
                 VALUES {}",
                values_rows(chunk.len(), COLUMNS)
            ),
            &values,
        )?;
    }
    Ok(())
}

/// An event, or `None` for a kind this build does not know: a newer
/// replica's (during a rolling upgrade), passed over, not a reason to stop
/// following.
fn decode(row: &dyn Row) -> StoreResult<Option<EventRow>> {
    let id: i64 = col(row, "id")?;
    let r = (|| {
        let kind: String = col(row, "kind")?;
        let Some(kind) = EventKind::parse(&kind) else {
            return Ok(None);
        };
        Ok(Some(EventRow {
            id: u64_from_db(id, "id")?,
            replica: col(row, "replica")?,
            kind,
            agent_id: col(row, "agent_id")?,
            tenant: col(row, "tenant")?,
            pack: col(row, "pack")?,
            detail: col(row, "detail")?,
            at: instant_col(row, "at_ns")?,
        }))
    })();
    with_row(format_args!("event {id}"), r)
}

/// One page of events after `after` (see [`follow_page`]).
pub(crate) fn events_after(
    conn: &dyn Db,
    after: Mark,
    limit: u32,
    horizon: Option<i64>,
) -> StoreResult<(Vec<EventRow>, Mark)> {
    let (rows, next) = follow_page(conn, &EVENTS_FOLLOWED, after, limit, horizon, decode)?;
    Ok((rows.into_iter().flatten().collect(), next))
}

/// A followed table as a query reads it.
pub(crate) struct Followed<'a> {
    /// The table, with its joins.
    pub(crate) from: &'a str,
    /// The followed table's alias prefix (`"f."`, or empty).
    pub(crate) t: &'a str,
    /// What to read; it must name `txid` and `id`.
    pub(crate) columns: &'a str,
    /// Conditions beyond the mark (`AND …`, its values numbered from
    /// `?5`), or empty.
    pub(crate) scope: &'a str,
    /// The values `scope` names.
    pub(crate) scope_args: &'a [Param<'a>],
}

/// One page of a followed table's rows after `after`, in (txid, id) order,
/// the mark compared as a row value (an index range on `(txid, id)` even
/// in PostgreSQL's generic plan of the prepared statement, where an `OR`
/// of the two columns scanned the whole index on every read: 52 ms at
/// 300 000 events against 0.2 ms) beside `txid >= ?1` (what a BRIN on
/// `txid` can use),
/// and the mark after it. With a `horizon` (the oldest transaction still
/// running when the read began: PostgreSQL, replicas writing in
/// parallel), only rows of transactions below it, which are final: a row
/// committed late is read when its transaction falls below the horizon,
/// never skipped. A page that is not full leaves the mark at the horizon,
/// past every final row. Without one (a single writer, committing in id
/// order) txid is 0 and the mark is the last id read.
pub(crate) fn follow_page<T>(
    conn: &dyn Db,
    table: &Followed<'_>,
    after: Mark,
    limit: u32,
    horizon: Option<i64>,
    decode: impl Fn(&dyn Row) -> StoreResult<T>,
) -> StoreResult<(Vec<T>, Mark)> {
    let limit = page(limit, MAX_PAGE);
    let (Ok(txid), Ok(id)) = (i64::try_from(after.txid), i64::try_from(after.id)) else {
        return Ok((Vec::new(), after));
    };
    let sql = follow_sql(table);
    let limit_arg = i64::from(limit);
    let mut args = params![txid, id, horizon, limit_arg].to_vec();
    args.extend_from_slice(table.scope_args);
    let rows = query_all(conn, &sql, &args, |r| {
        let mark = Mark {
            txid: u64_from_db(col(r, "txid")?, "txid")?,
            id: u64_from_db(col(r, "id")?, "id")?,
        };
        Ok((mark, decode(r)?))
    })?;
    let last = rows.last().map(|(m, _)| *m);
    let mut next = last.unwrap_or(after);
    if rows.len() < limit as usize
        && let Some(h) = horizon
    {
        next = next.max(before_transaction(h, "horizon")?);
    }
    Ok((rows.into_iter().map(|(_, r)| r).collect(), next))
}

/// [`follow_page`]'s query: after the mark `(?1, ?2)`, below the horizon
/// `?3` if any, at most `?4` rows, then `table`'s scope.
pub(crate) fn follow_sql(table: &Followed<'_>) -> String {
    let Followed {
        from,
        t,
        columns,
        scope,
        ..
    } = table;
    format!(
        "SELECT {columns} FROM {from} \
         WHERE ({t}txid, {t}id) > (?1, ?2) AND {t}txid >= ?1 \
         AND (CAST(?3 AS BIGINT) IS NULL OR {t}txid < ?3) {scope} \
         ORDER BY {t}txid, {t}id LIMIT ?4"
    )
}

/// The events table as a follower reads it.
pub(crate) const EVENTS_FOLLOWED: Followed<'static> = Followed {
    from: "events",
    t: "",
    columns: "id, txid, replica, kind, agent_id, tenant, pack, detail, at_ns",
    scope: "",
    scope_args: &[],
};

/// The mark past every row of the transactions below `txid` (`what`
/// names it in an error: the value is the database's), before any of
/// its own.
pub(crate) fn before_transaction(txid: i64, what: &str) -> StoreResult<Mark> {
    Ok(Mark {
        txid: u64_from_db(txid, what)?.saturating_sub(1),
        id: i64::MAX as u64,
    })
}

/// Where a follower starting now begins in `table`: past every row
/// committed (`horizon`: see [`follow_page`]).
pub(crate) fn high_water(conn: &dyn Db, table: &str, horizon: Option<i64>) -> StoreResult<Mark> {
    if let Some(h) = horizon {
        return before_transaction(h, "horizon");
    }
    let n: Option<Option<i64>> = query_first(
        conn,
        &format!("SELECT MAX(id) AS n FROM {table}"),
        &[],
        |r| col(r, "n"),
    )?;
    Ok(Mark {
        txid: 0,
        id: u64_from_db(n.flatten().unwrap_or(0), "id")?,
    })
}
