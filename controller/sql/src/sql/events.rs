//! Events between replicas: stored by the replica they happened on, read
//! by the others in mark order (see the `follow_marks` migration).

use std::borrow::Cow;

use super::codec::{instant_col, u64_from_db};
use super::db::{
    Db, Param, Row, chunks, col, params, query_all, query_first, run, values_rows, with_row,
};
use baton_store::{EventKind, EventRow, MAX_PAGE, Mark, StoreResult, page};

pub(crate) const DELETE_EVENTS: &str = "DELETE FROM events WHERE id IN \
     (SELECT id FROM events WHERE at_ns < ?1 ORDER BY id LIMIT ?2)";

/// Several events per statement (in order: their ids follow it).
pub(crate) fn put_events(conn: &dyn Db, rows: &[StoredEvent<'_>]) -> StoreResult<()> {
    const COLUMNS: usize = 7;
    for chunk in chunks(rows) {
        let mut values: Vec<Param<'_>> = Vec::with_capacity(chunk.len() * COLUMNS);
        for e in chunk {
            values.extend([
                Param::Text(e.replica),
                Param::Text(e.kind),
                Param::Text(e.agent_id),
                Param::Text(e.tenant),
                Param::Text(e.pack),
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

/// The stored word of a group of delivery changes: one row naming the
/// agents of one pack whose rows one transaction changed (see
/// [`delivery_groups`]), read back as one `delivery` event per agent.
const DELIVERIES: &str = "deliveries";

/// Agents named by one group row at most: a push to 100 000 agents is a
/// hundred rows of some 15 KB, not one of megabytes a follower expands at
/// once.
const GROUP: usize = 1000;

/// The events that say the delivery rows of `changed` (agent, tenant,
/// pack) changed: one `delivery` event for a pack with one changed row,
/// and, when `grouped` says so (every live replica reads groups:
/// [`every_replica_reads_groups`]), one row naming the agents (a JSON
/// array in `detail`, [`GROUP`] at most) for more. A push to thousands of
/// agents wrote an event each, a statement per 64: the fleet bench's
/// replicas spent 40–55 ms of server time a push round there.
pub(crate) fn delivery_groups<'a>(
    replica: &'a str,
    changed: impl IntoIterator<Item = (&'a str, &'a str, &'a str)>,
    grouped: impl FnOnce() -> StoreResult<bool>,
    at: baton_store::RefTime,
) -> StoreResult<Vec<StoredEvent<'a>>> {
    use std::collections::BTreeMap;
    let mut by_pack: BTreeMap<(&str, &str), Vec<&str>> = BTreeMap::new();
    for (agent, tenant, pack) in changed {
        by_pack.entry((tenant, pack)).or_default().push(agent);
    }
    // Asked only when a pack has more than one row (a statement).
    let grouped = by_pack.values().any(|a| a.len() > 1) && grouped()?;
    let size = if grouped { GROUP } else { 1 };
    let mut out = Vec::new();
    for ((tenant, pack), agents) in by_pack {
        for group in agents.chunks(size) {
            let (kind, agent_id, detail) = match group {
                [one] => (EventKind::Delivery.as_str(), *one, Cow::Borrowed("")),
                many => (DELIVERIES, "", Cow::Owned(super::db::json_array(many)?)),
            };
            out.push(StoredEvent {
                replica,
                kind,
                agent_id,
                tenant,
                pack,
                detail,
                at,
            });
        }
    }
    Ok(out)
}

/// Whether every replica holding a live lease reads grouped delivery
/// events (its lease row says so: migration 22). An older replica, still
/// serving during a rolling upgrade, would pass a group over; it is told
/// of each row instead until its lease ends (a replica of that build can
/// no longer start: the schema is newer than it knows). PostgreSQL only.
pub(crate) fn every_replica_reads_groups(conn: &dyn Db) -> StoreResult<bool> {
    let older: Option<i64> = query_first(
        conn,
        "SELECT COUNT(*) AS n FROM replicas WHERE NOT reads_event_groups \
         AND expires_us > (EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::BIGINT",
        &[],
        |r| col(r, "n"),
    )?;
    Ok(older == Some(0))
}

/// An event row as stored, borrowed from what it tells: its kind as its
/// word (a group of deliveries has no [`EventKind`] of its own).
#[derive(Debug)]
pub(crate) struct StoredEvent<'a> {
    pub(crate) replica: &'a str,
    pub(crate) kind: &'static str,
    pub(crate) agent_id: &'a str,
    pub(crate) tenant: &'a str,
    pub(crate) pack: &'a str,
    pub(crate) detail: Cow<'a, str>,
    pub(crate) at: baton_store::RefTime,
}

impl<'a> StoredEvent<'a> {
    pub(crate) fn of(e: &'a EventRow) -> StoredEvent<'a> {
        StoredEvent {
            replica: &e.replica,
            kind: e.kind.as_str(),
            agent_id: &e.agent_id,
            tenant: &e.tenant,
            pack: &e.pack,
            detail: Cow::Borrowed(&e.detail),
            at: e.at,
        }
    }
}

/// A stored event row as read, before a group is expanded: the row's
/// event (for a group, its agents' common part), its mark, and a group's
/// agents as stored. `event` is `None` for a kind this build does not
/// know (a newer replica's, during a rolling upgrade: passed over, not a
/// reason to stop following).
struct ReadRow {
    mark: Mark,
    event: Option<EventRow>,
    group: Option<String>,
}

fn decode(row: &dyn Row) -> StoreResult<ReadRow> {
    let id: i64 = col(row, "id")?;
    let r = (|| {
        let mark = Mark {
            txid: u64_from_db(col(row, "txid")?, "txid")?,
            id: u64_from_db(id, "id")?,
        };
        let kind: String = col(row, "kind")?;
        let (kind, group) = match (kind.as_str(), EventKind::parse(&kind)) {
            (DELIVERIES, _) => (EventKind::Delivery, Some(col(row, "detail")?)),
            (_, Some(kind)) => (kind, None),
            (_, None) => {
                return Ok(ReadRow {
                    mark,
                    event: None,
                    group: None,
                });
            }
        };
        let event = EventRow {
            id: mark.id,
            replica: col(row, "replica")?,
            kind,
            agent_id: col(row, "agent_id")?,
            tenant: col(row, "tenant")?,
            pack: col(row, "pack")?,
            detail: if group.is_some() {
                String::new()
            } else {
                col(row, "detail")?
            },
            at: instant_col(row, "at_ns")?,
        };
        Ok(ReadRow {
            mark,
            event: Some(event),
            group,
        })
    })();
    with_row(format_args!("event {id}"), r)
}

/// A read row's events: its own, or a `delivery` event per agent its
/// group names (none for a group that does not read: passed over like a
/// kind not known, a later build's form, say; its agents catch up at
/// their streams' resync, and following goes on).
fn expand(read: ReadRow) -> Vec<EventRow> {
    let Some(event) = read.event else {
        return Vec::new();
    };
    let Some(group) = read.group else {
        return vec![event];
    };
    match serde_json::from_str::<Vec<String>>(&group) {
        Ok(agents) => agents
            .into_iter()
            .map(|agent_id| EventRow {
                agent_id,
                ..event.clone()
            })
            .collect(),
        Err(e) => {
            tracing::warn!(
                event = event.id,
                "events: a group's agents do not read: {e}"
            );
            Vec::new()
        }
    }
}

/// One page of events after `after` (see [`follow_page`]): `limit`
/// stored rows at most ([`MAX_PAGE`] at most), expanded in order until
/// their events (a group's agents each) reach `limit` (not bound by
/// [`MAX_PAGE`]: a follower asks for a push's few groups at once); the
/// mark then after the last row expanded, the rows after it read again
/// by the next page. A page cut short that way holds at least `limit`
/// events (a follower reads on), and at most `limit + GROUP - 1`. (A
/// push to 100 000 agents, a hundred groups, read 10 000 events a page,
/// is ten pages, each fetching the rows left.)
pub(crate) fn events_after(
    conn: &dyn Db,
    after: Mark,
    limit: u32,
    horizon: Option<i64>,
) -> StoreResult<(Vec<EventRow>, Mark)> {
    let limit_rows = page(limit, MAX_PAGE);
    // 0: the store's page, as for every list.
    let events = if limit == 0 { limit_rows } else { limit } as usize;
    let limit = limit_rows;
    let (rows, next) = follow_page(conn, &EVENTS_FOLLOWED, after, limit, horizon, decode)?;
    let mut out = Vec::new();
    let mut rows = rows.into_iter();
    while let Some(read) = rows.next() {
        let mark = read.mark;
        out.extend(expand(read));
        if out.len() >= events && !rows.as_slice().is_empty() {
            return Ok((out, mark));
        }
    }
    Ok((out, next))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pack_changed_for_many_agents_is_a_few_rows_naming_them() {
        let many: Vec<String> = (0..2500).map(|i| format!("a{i}")).collect();
        let changed = many
            .iter()
            .map(|a| (a.as_str(), "t", "big"))
            .chain([("b", "t", "small")]);
        let at = baton_store::RefTime::from_nanos(5);
        let events = delivery_groups("r1", changed.clone(), || Ok(true), at).expect("grouped");
        let sizes: Vec<(&str, &str, usize)> = events
            .iter()
            .map(|e| {
                let n = match e.kind {
                    DELIVERIES => serde_json::from_str::<Vec<String>>(&e.detail)
                        .expect("a JSON array")
                        .len(),
                    _ => 1,
                };
                (e.pack, e.kind, n)
            })
            .collect();
        assert_eq!(
            sizes,
            [
                ("big", DELIVERIES, 1000),
                ("big", DELIVERIES, 1000),
                ("big", DELIVERIES, 500),
                ("small", "delivery", 1),
            ]
        );
        assert_eq!(events[3].agent_id, "b");
        let named: Vec<String> = events[..3]
            .iter()
            .flat_map(|e| serde_json::from_str::<Vec<String>>(&e.detail).expect("a JSON array"))
            .collect();
        assert_eq!(named, many, "each agent once, in order");

        // Not grouped (an older replica still serving): a row each.
        let each = delivery_groups("r1", changed, || Ok(false), at).expect("a row each");
        assert_eq!(each.len(), 2501);
        assert!(
            each.iter()
                .all(|e| e.kind == "delivery" && e.detail.is_empty())
        );
        assert_eq!(each[0].agent_id, "a0");
    }
}
