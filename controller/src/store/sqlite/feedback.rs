//! Feedback: stored once per (journal, seq), numbered by the database,
//! read one page at a time, deleted oldest first by retention.

use rusqlite::types::Value;
use rusqlite::{Connection, params};

use super::codec::{
    Context, FEEDBACK_COLUMNS, backend, canonical_execution_id, decode_feedback, query_all, to_db,
    u64_from_db,
};
use crate::store::{
    FeedbackFilter, FeedbackRow, FeedbackStored, MAX_PAGE, StoreError, StoreResult, page,
};

/// Stores one journal's rows; every value is checked before anything is
/// written, so a row that cannot be stored fails the call with nothing of
/// it stored. Rows at or below the journal's acked seq (as it was before
/// the call) are duplicates without a look: they were stored once; only a
/// count of drops a re-sent entry now carries (the agent attaches the
/// count to the first entry it sends after the drops, which may be one
/// already sent) is kept on the stored row.
pub(super) fn write_feedback(
    conn: &Connection,
    rows: &[FeedbackRow],
) -> StoreResult<FeedbackStored> {
    let mut out = FeedbackStored::default();
    let Some(first) = rows.first() else {
        return Ok(out);
    };
    let mut checked = Vec::with_capacity(rows.len());
    for r in rows {
        if r.agent_id != first.agent_id || r.journal_id != first.journal_id {
            return Err(StoreError::Backend(
                "one put_feedback call takes one journal's rows".into(),
            ));
        }
        checked.push((
            to_db(r.seq, "feedback seq")?,
            to_db(r.version, "feedback pack version")?,
            to_db(r.dropped_before, "feedback dropped_before")?,
        ));
    }
    conn.prepare_cached(
        "INSERT INTO journals (agent_id, journal_id, acked_seq) VALUES (?1, ?2, 0) \
         ON CONFLICT (agent_id, journal_id) DO NOTHING",
    )
    .and_then(|mut s| s.execute(params![first.agent_id, first.journal_id]))
    .ctx("store a journal")?;
    let (journal, acked): (i64, i64) = conn
        .prepare_cached(
            "SELECT id, acked_seq FROM journals WHERE agent_id = ?1 AND journal_id = ?2",
        )
        .and_then(|mut s| {
            s.query_row(params![first.agent_id, first.journal_id], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
        })
        .ctx("look up a journal")?;
    let mut stmt = conn
        .prepare_cached(
            "INSERT INTO feedback (journal, seq, tenant, pack, version, instruction, \
             execution_id, occurrence_ns, attempt, scheduled_ns, actual_ns, lateness_ns, outcome, \
             reason, event, action, detail, value, dropped_before, uncertainty_ns, clock_source, \
             clock_state, received_ns) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, \
             ?18, ?19, ?20, ?21, ?22, ?23) \
             ON CONFLICT (journal, seq) DO NOTHING",
        )
        .ctx("prepare the feedback insert")?;
    let mut high = acked;
    for (r, (seq, version, dropped_before)) in rows.iter().zip(checked) {
        if seq <= acked {
            // Stored before (retention may have deleted it since): an
            // agent's seqs only grow, so this is a re-send.
            out.duplicates += 1;
            if dropped_before > 0 {
                conn.prepare_cached(
                    "UPDATE feedback SET dropped_before = ?3 \
                     WHERE journal = ?1 AND seq = ?2 AND dropped_before < ?3",
                )
                .and_then(|mut s| s.execute(params![journal, seq, dropped_before]))
                .ctx("keep a re-sent entry's count of drops")?;
            }
            continue;
        }
        // Most ids are their row's canonical form: not stored twice.
        let execution_id = match canonical_execution_id(r) {
            Some(c) if c == r.execution_id => None,
            _ => Some(r.execution_id.as_str()),
        };
        let n = stmt
            .execute(params![
                journal,
                seq,
                r.tenant,
                r.pack,
                version,
                r.instruction,
                execution_id,
                r.occurrence_ns,
                i64::from(r.attempt),
                r.scheduled_ns,
                r.actual_ns,
                r.lateness_ns,
                r.outcome as i32,
                r.reason as i32,
                r.event,
                r.action,
                r.detail,
                r.value.map(i64::from),
                dropped_before,
                r.uncertainty_ns,
                r.clock_source as i32,
                r.clock_state as i32,
                r.received_ns
            ])
            .map_err(|e| {
                backend(
                    &format!("store feedback {}/{}#{}", r.agent_id, r.journal_id, r.seq),
                    e,
                )
            })?;
        if n == 0 {
            out.duplicates += 1;
        } else {
            out.inserted += 1;
        }
        high = high.max(seq);
    }
    if high > acked {
        conn.prepare_cached("UPDATE journals SET acked_seq = ?2 WHERE id = ?1 AND acked_seq < ?2")
            .and_then(|mut s| s.execute(params![journal, high]))
            .ctx("store a journal's acked seq")?;
    }
    out.acked_seq = u64_from_db(high, "acked seq")?;
    Ok(out)
}

pub(super) fn feedback_acked(
    conn: &Connection,
    agent_id: &str,
    journal_id: &str,
) -> StoreResult<u64> {
    let v: Option<i64> = conn
        .prepare_cached(
            "SELECT MAX(acked_seq) FROM journals WHERE agent_id = ?1 AND journal_id = ?2",
        )
        .and_then(|mut s| s.query_row(params![agent_id, journal_id], |r| r.get(0)))
        .ctx("read the acked feedback seq")?;
    u64_from_db(v.unwrap_or(0), "acked seq")
}

/// One page, in storage order.
pub(super) fn feedback_page(conn: &Connection, f: FeedbackFilter) -> StoreResult<Vec<FeedbackRow>> {
    let mut args: Vec<Value> = Vec::new();
    let mut clauses: Vec<String> = Vec::new();
    let mut add = |clause: &str, v: Value| {
        args.push(v);
        clauses.push(clause.replace('?', &format!("?{}", args.len())));
    };
    // No id is past i64::MAX: nothing comes after such a cursor.
    let Ok(after_id) = i64::try_from(f.after_id) else {
        return Ok(Vec::new());
    };
    add("f.id > ?", Value::Integer(after_id));
    if let Some(t) = f.tenant {
        add("f.tenant = ?", Value::Text(t));
    }
    if let Some(p) = f.pack {
        add("f.pack = ?", Value::Text(p));
    }
    if let Some(a) = f.agent_id {
        add(
            "f.journal IN (SELECT id FROM journals WHERE agent_id = ?)",
            Value::Text(a),
        );
    }
    if let Some(s) = f.since_ns {
        add("f.received_ns >= ?", Value::Integer(s));
    }
    args.push(Value::Integer(i64::from(page(f.limit, MAX_PAGE))));
    let sql = format!(
        "SELECT {FEEDBACK_COLUMNS} FROM feedback f JOIN journals j ON j.id = f.journal \
         WHERE {} ORDER BY f.id LIMIT ?{}",
        clauses.join(" AND "),
        args.len()
    );
    query_all(
        conn,
        &sql,
        rusqlite::params_from_iter(args),
        decode_feedback,
    )
}

/// Deletes up to `max` rows matching `pick` (a subquery naming key
/// columns, oldest first); how many went.
pub(super) fn delete_oldest(
    conn: &Connection,
    sql: &str,
    before_ns: i64,
    max: u32,
) -> StoreResult<u64> {
    let n = conn
        .prepare_cached(sql)
        .and_then(|mut s| s.execute(params![before_ns, i64::from(max)]))
        .ctx("delete old rows")?;
    Ok(n as u64)
}

/// Retention's statements: each deletes the oldest `?2` rows older than
/// `?1` through the index on their instant, so a sweep never scans what it
/// keeps. Ties are broken by the rest of the index's key (the id, the
/// agent), so which rows go is defined, as in every store.
pub(super) const DELETE_FEEDBACK: &str = "DELETE FROM feedback WHERE id IN \
     (SELECT id FROM feedback WHERE received_ns < ?1 ORDER BY received_ns, id LIMIT ?2)";
pub(super) const DELETE_CLOCK: &str = "DELETE FROM clock_reports WHERE (agent_id, at_ns) IN \
     (SELECT agent_id, at_ns FROM clock_reports WHERE at_ns < ?1 \
     ORDER BY at_ns, agent_id LIMIT ?2)";
pub(super) const DELETE_AUDIT: &str = "DELETE FROM audit WHERE id IN \
     (SELECT id FROM audit WHERE at_ns < ?1 ORDER BY at_ns, id LIMIT ?2)";
