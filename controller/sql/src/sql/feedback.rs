//! Feedback: stored once per (journal, seq), numbered by the database,
//! read one page at a time, deleted oldest first by retention.

use super::codec::{FEEDBACK_COLUMNS, canonical_execution_id, decode_feedback, to_db, u64_from_db};
use super::db::{
    ByShape, Db, Param, chunks, col, params, query_all, query_first, run, values_rows, with_row,
};
use baton_model::RefTime;
use baton_model::time::span_ns;
use baton_store::{
    FeedbackFilter, FeedbackRow, FeedbackScope, FeedbackStored, MAX_PAGE, Mark, StoreError,
    StoreResult, page,
};

/// Stores one journal's rows; every value is checked before anything is
/// written, so a row that cannot be stored fails the call with nothing of
/// it stored. Rows at or below the journal's acked seq (as it was before
/// the call) are duplicates without a look: they were stored once; only a
/// count of drops a re-sent entry now carries (the agent attaches the
/// count to the first entry it sends after the drops, which may be one
/// already sent) is kept on the stored row.
pub(crate) fn write_feedback(conn: &dyn Db, rows: &[FeedbackRow]) -> StoreResult<FeedbackStored> {
    let mut out = FeedbackStored::default();
    let Some(first) = rows.first() else {
        return Ok(out);
    };
    let checked = check_rows(first, rows)?;
    let (journal, acked) = journal_of(conn, &first.agent_id, &first.journal_id)?;
    let mut high = acked;
    let mut fresh = Vec::with_capacity(rows.len());
    for (r, (seq, version, dropped_before)) in rows.iter().zip(checked) {
        if seq <= acked {
            // Stored before (retention may have deleted it since): an
            // agent's seqs only grow, so this is a re-send.
            out.duplicates += 1;
            keep_resent_drops(conn, journal, seq, dropped_before)?;
            continue;
        }
        high = high.max(seq);
        fresh.push((r, seq, version, dropped_before));
    }
    // Several rows per statement: a round trip each would bound a
    // networked engine's ingest by its latency.
    for chunk in chunks(&fresh) {
        let inserted = insert_chunk(conn, journal, chunk)?;
        out.inserted += inserted;
        out.duplicates += chunk.len() - inserted;
    }
    if high > acked {
        run(
            conn,
            "store a journal's acked seq",
            "UPDATE journals SET acked_seq = ?2 WHERE id = ?1 AND acked_seq < ?2",
            params![journal, high],
        )?;
    }
    out.acked_seq = u64_from_db(high, "acked seq")?;
    Ok(out)
}

/// A row to insert with its checked integers: (row, seq, version,
/// dropped_before).
type Fresh<'a> = (&'a FeedbackRow, i64, i64, i64);

/// Every row's integers as columns take them, checked before anything
/// is written; all rows must be of `first`'s journal.
fn check_rows(first: &FeedbackRow, rows: &[FeedbackRow]) -> StoreResult<Vec<(i64, i64, i64)>> {
    rows.iter()
        .map(|r| {
            if r.agent_id != first.agent_id || r.journal_id != first.journal_id {
                return Err(StoreError::Invalid(
                    "one put_feedback call takes one journal's rows".into(),
                ));
            }
            Ok((
                to_db(r.seq, "feedback seq")?,
                to_db(r.version, "feedback pack version")?,
                to_db(r.dropped_before, "feedback dropped_before")?,
            ))
        })
        .collect()
}

/// The journal's row id and acked seq, storing the journal if it is new.
/// Looked up before it is inserted: an engine whose ids come from a
/// sequence spends one on every insert that conflicts.
fn journal_of(conn: &dyn Db, agent_id: &str, journal_id: &str) -> StoreResult<(i64, i64)> {
    let journal_sql = "SELECT id, acked_seq FROM journals WHERE agent_id = ?1 AND journal_id = ?2";
    let journal_params = params![agent_id, journal_id];
    let decode = |r: &dyn super::db::Row| Ok((col::<i64>(r, "id")?, col::<i64>(r, "acked_seq")?));
    if let Some(j) = query_first(conn, journal_sql, journal_params, decode)? {
        return Ok(j);
    }
    run(
        conn,
        "store a journal",
        "INSERT INTO journals (agent_id, journal_id, acked_seq) VALUES (?1, ?2, 0)",
        journal_params,
    )?;
    query_first(conn, journal_sql, journal_params, decode)?
        .ok_or_else(|| StoreError::corrupt("feedback journals", "a journal stored is not found"))
}

/// A re-sent entry's count of drops, kept on the stored row: held to the
/// entries missing right before it (a count the agent carried again for
/// entries stored meanwhile is not a drop; rows retention deleted count
/// as missing).
fn keep_resent_drops(
    conn: &dyn Db,
    journal: i64,
    seq: i64,
    dropped_before: i64,
) -> StoreResult<()> {
    if dropped_before > 0 {
        run(
            conn,
            "keep a re-sent entry's count of drops",
            "UPDATE feedback SET dropped_before = ?3 \
             WHERE journal = ?1 AND seq = ?2 AND dropped_before < ?3",
            params![
                journal,
                seq,
                dropped_before.min(seq - 1 - stored_below(conn, journal, seq)?)
            ],
        )?;
    }
    Ok(())
}

/// Inserts one chunk of new rows in one statement; how many were
/// inserted (the others were stored already).
fn insert_chunk(conn: &dyn Db, journal: i64, chunk: &[Fresh<'_>]) -> StoreResult<usize> {
    let n = chunk.len();
    let mut values: Vec<Param<'_>> = Vec::with_capacity(n * FEEDBACK_INSERT_COLUMNS);
    for &(r, seq, version, dropped_before) in chunk {
        // Most ids are their row's canonical form: not stored twice.
        let execution_id = match canonical_execution_id(r) {
            Some(c) if c == r.execution_id => Param::Null,
            _ => Param::Text(&r.execution_id),
        };
        values.extend([
            Param::Int(journal),
            Param::Int(seq),
            Param::Text(&r.tenant),
            Param::Text(&r.pack),
            Param::Int(version),
            Param::Text(&r.instruction),
            execution_id,
            r.occurrence
                .map_or(Param::Null, |t| Param::Int(t.as_nanos())),
            Param::Int(i64::from(r.attempt)),
            Param::Int(r.scheduled.as_nanos()),
            Param::Int(r.actual.as_nanos()),
            Param::Int(span_ns(r.lateness)),
            Param::Int(r.outcome as i64),
            Param::Int(r.reason as i64),
            Param::Text(&r.event),
            Param::Text(&r.action),
            Param::Text(&r.detail),
            r.value.map_or(Param::Null, |v| Param::Int(i64::from(v))),
            Param::Int(dropped_before),
            Param::Int(span_ns(r.uncertainty)),
            Param::Int(r.clock_source as i64),
            Param::Int(r.clock_state as i64),
            Param::Int(r.received.as_nanos()),
        ]);
    }
    let (first, last) = (chunk[0].1, chunk[n - 1].1);
    Ok(with_row(
        format_args!(
            "store feedback {}/{}#{first}..={last}",
            chunk[0].0.agent_id, chunk[0].0.journal_id
        ),
        query_all(conn, &INSERT.get(n), &values, |r| col::<i64>(r, "seq")),
    )?
    .len())
}

pub(crate) fn feedback_acked(conn: &dyn Db, agent_id: &str, journal_id: &str) -> StoreResult<u64> {
    let v = query_first(
        conn,
        "SELECT acked_seq FROM journals WHERE agent_id = ?1 AND journal_id = ?2",
        params![agent_id, journal_id],
        |r| col::<i64>(r, "acked_seq"),
    )?;
    u64_from_db(v.unwrap_or(0), "acked seq")
}

/// The highest seq of `journal` stored below `seq` (0: none).
fn stored_below(conn: &dyn Db, journal: i64, seq: i64) -> StoreResult<i64> {
    Ok(query_first(
        conn,
        "SELECT MAX(seq) AS below FROM feedback WHERE journal = ?1 AND seq < ?2",
        params![journal, seq],
        |r| col::<Option<i64>>(r, "below"),
    )?
    .flatten()
    .unwrap_or(0))
}

/// Columns of one feedback row in [`insert_sql`].
const FEEDBACK_INSERT_COLUMNS: usize = 23;

/// [`insert_sql`] of each chunk's shape, built once.
static INSERT: ByShape = ByShape::new(insert_sql);

/// `INSERT` of `rows` feedback rows, each skipped if its (journal, seq)
/// is stored; returns the seqs it inserted.
fn insert_sql(rows: usize) -> String {
    format!(
        "INSERT INTO feedback (journal, seq, tenant, pack, version, instruction, \
         execution_id, occurrence_ns, attempt, scheduled_ns, actual_ns, lateness_ns, outcome, \
         reason, event, action, detail, value, dropped_before, uncertainty_ns, clock_source, \
         clock_state, received_ns) VALUES {} \
         ON CONFLICT DO NOTHING RETURNING seq",
        values_rows(rows, FEEDBACK_INSERT_COLUMNS)
    )
}

/// One page, in storage order.
pub(crate) fn feedback_page(conn: &dyn Db, f: &FeedbackFilter) -> StoreResult<Vec<FeedbackRow>> {
    let mut args: Vec<Param<'_>> = Vec::new();
    let mut clauses: Vec<String> = Vec::new();
    let mut add = |clause: &str, v| {
        args.push(v);
        clauses.push(clause.replace('?', &format!("?{}", args.len())));
    };
    // No id is past i64::MAX: nothing comes after such a cursor.
    let Ok(after_id) = i64::try_from(f.after_id) else {
        return Ok(Vec::new());
    };
    add("f.id > ?", Param::Int(after_id));
    if let Some(t) = &f.tenant {
        add("f.tenant = ?", Param::Text(t));
    }
    if let Some(p) = &f.pack {
        add("f.pack = ?", Param::Text(p));
    }
    if let Some(a) = &f.agent_id {
        add(
            "f.journal IN (SELECT id FROM journals WHERE agent_id = ?)",
            Param::Text(a),
        );
    }
    if let Some(s) = f.since {
        add("f.received_ns >= ?", Param::Int(s.as_nanos()));
    }
    args.push(Param::Int(i64::from(page(f.limit, MAX_PAGE))));
    let sql = format!(
        "SELECT {FEEDBACK_COLUMNS} FROM feedback f JOIN journals j ON j.id = f.journal \
         WHERE {} ORDER BY f.id LIMIT ?{}",
        clauses.join(" AND "),
        args.len()
    );
    query_all(conn, &sql, &args, decode_feedback)
}

/// Deletes up to `max` rows matching `pick` (a subquery naming key
/// columns, oldest first); how many went.
pub(crate) fn delete_oldest(
    conn: &dyn Db,
    sql: &str,
    before_ns: i64,
    max: u32,
) -> StoreResult<u64> {
    run(
        conn,
        "delete old rows",
        sql,
        params![before_ns, i64::from(max)],
    )
}

/// Retention's statements: each deletes the oldest `?2` rows older than
/// `?1` through the index on their instant, so a sweep never scans what it
/// keeps. Ties are broken by the rest of the index's key (the id, the
/// agent), so which rows go is defined, as in every store.
pub(crate) const DELETE_FEEDBACK: &str = "DELETE FROM feedback WHERE id IN \
     (SELECT id FROM feedback WHERE received_ns < ?1 ORDER BY received_ns, id LIMIT ?2)";
pub(crate) const DELETE_CLOCK: &str = "DELETE FROM clock_reports WHERE (agent_id, at_ns) IN \
     (SELECT agent_id, at_ns FROM clock_reports WHERE at_ns < ?1 \
     ORDER BY at_ns, agent_id LIMIT ?2)";
/// [`DELETE_FEEDBACK`] and [`DELETE_CLOCK`] where the tables are
/// partitioned by day: only the rows outside every day (the DEFAULT
/// partitions); the days go whole (`postgres::partitions`).
pub(crate) const DELETE_FEEDBACK_DEFAULT: &str = "DELETE FROM feedback_default WHERE id IN \
     (SELECT id FROM feedback_default WHERE received_ns < ?1 ORDER BY received_ns, id LIMIT ?2)";
pub(crate) const DELETE_CLOCK_DEFAULT: &str = "DELETE FROM clock_reports_default \
     WHERE (agent_id, at_ns) IN (SELECT agent_id, at_ns FROM clock_reports_default \
     WHERE at_ns < ?1 ORDER BY at_ns, agent_id LIMIT ?2)";
pub(crate) const DELETE_AUDIT: &str = "DELETE FROM audit WHERE id IN \
     (SELECT id FROM audit WHERE at_ns < ?1 ORDER BY at_ns, id LIMIT ?2)";

/// One page of the feedback `scope` names after `after`, in mark order
/// (see [`super::events::follow_page`]).
pub(crate) fn feedback_after(
    conn: &dyn Db,
    after: Mark,
    scope: FeedbackScope<'_>,
    limit: u32,
    horizon: Option<i64>,
) -> StoreResult<(Vec<FeedbackRow>, Mark)> {
    let columns = format!("{FEEDBACK_COLUMNS}, f.txid");
    let (clause, args) = match scope {
        FeedbackScope::All => ("", Vec::new()),
        FeedbackScope::Pack { key, since } => (
            "AND f.tenant = ?5 AND f.pack = ?6 AND f.received_ns >= ?7",
            vec![
                Param::Text(&key.tenant),
                Param::Text(&key.pack),
                Param::Int(since.as_nanos()),
            ],
        ),
    };
    let table = super::events::Followed {
        from: "feedback f JOIN journals j ON j.id = f.journal",
        t: "f.",
        columns: &columns,
        scope: clause,
        scope_args: &args,
    };
    super::events::follow_page(conn, &table, after, limit, horizon, decode_feedback)
}

/// A mark before every feedback row received at or after `since`, and
/// before every row still to commit: where a follower of a window starts
/// without reading the table from its beginning. With a `horizon` (read
/// before this, see [`super::events::follow_page`]) a row still to commit
/// is of a transaction at or above it; a committed row of the window is at
/// or above the lowest transaction among the window's rows. Without one
/// (a single writer, ids in commit order), before the window's lowest id,
/// or past every row where it has none yet.
pub(crate) fn feedback_mark_at(
    conn: &dyn Db,
    since: RefTime,
    horizon: Option<i64>,
) -> StoreResult<Mark> {
    let lowest = |column: &str| -> StoreResult<Option<i64>> {
        Ok(query_first(
            conn,
            &format!("SELECT MIN({column}) AS n FROM feedback WHERE received_ns >= ?1"),
            params![since.as_nanos()],
            |r| col::<Option<i64>>(r, "n"),
        )?
        .flatten())
    };
    match horizon {
        Some(h) => {
            let start = lowest("txid")?.map_or(h, |t| t.min(h));
            super::events::before_transaction(start, "txid")
        }
        None => match lowest("id")? {
            Some(id) => Ok(Mark {
                txid: 0,
                id: u64_from_db(id, "id")?.saturating_sub(1),
            }),
            None => super::events::high_water(conn, "feedback", None),
        },
    }
}
