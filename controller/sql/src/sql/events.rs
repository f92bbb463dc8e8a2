//! Events between replicas: stored by the replica they happened on, read
//! by the others in id order (see the `events` migration).

use super::codec::{instant_col, u64_from_db};
use super::db::{
    Db, Param, Row, chunks, col, params, query_all, query_first, run, values_rows, with_row,
};
use baton_store::{EventKind, EventRow, MAX_PAGE, StoreError, StoreResult, page};

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

fn decode(row: &dyn Row) -> StoreResult<EventRow> {
    let id: i64 = col(row, "id")?;
    let r = (|| {
        let kind: String = col(row, "kind")?;
        Ok(EventRow {
            id: u64_from_db(id, "id")?,
            replica: col(row, "replica")?,
            kind: EventKind::parse(&kind)
                .ok_or_else(|| StoreError::corrupt("event kind", format!("unknown: {kind:?}")))?,
            agent_id: col(row, "agent_id")?,
            tenant: col(row, "tenant")?,
            pack: col(row, "pack")?,
            detail: col(row, "detail")?,
            at: instant_col(row, "at_ns")?,
        })
    })();
    with_row(format_args!("event {id}"), r)
}

pub(crate) fn events_after(conn: &dyn Db, after_id: u64, limit: u32) -> StoreResult<Vec<EventRow>> {
    let Ok(after) = i64::try_from(after_id) else {
        return Ok(Vec::new());
    };
    query_all(
        conn,
        "SELECT id, replica, kind, agent_id, tenant, pack, detail, at_ns FROM events \
         WHERE id > ?1 ORDER BY id LIMIT ?2",
        params![after, i64::from(page(limit, MAX_PAGE))],
        decode,
    )
}

pub(crate) fn high_water(conn: &dyn Db) -> StoreResult<(u64, u64)> {
    let max = |table: &str| -> StoreResult<u64> {
        let n: Option<Option<i64>> = query_first(
            conn,
            &format!("SELECT MAX(id) AS n FROM {table}"),
            &[],
            |r| col(r, "n"),
        )?;
        u64_from_db(n.flatten().unwrap_or(0), "id")
    };
    Ok((max("events")?, max("feedback")?))
}
