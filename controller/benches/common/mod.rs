//! Shared by the benches: the bare-SQLite baseline for feedback ingest.
//!
//! What the disk and SQLite allow with none of the store's shape: one
//! connection, WAL, `synchronous=FULL`, prepared statements, one
//! transaction per [`BARE_TX_ROWS`] rows, into the store's own schema
//! (same tables, same indexes, same conflict clause, the same columns
//! written: a journal row per agent journal, its acknowledged seq moved
//! once per transaction, execution ids not stored when they are their
//! row's canonical form).

use std::collections::HashMap;
use std::error::Error;
use std::path::Path;
use std::time::{Duration, Instant};

use baton_model::{Binding, RefTime, SpanNanos};
use baton_sql::sqlite::{DB_FILE, SqliteStore};
use baton_store::FeedbackRow;

/// Rows per transaction in the bare baseline.
pub const BARE_TX_ROWS: usize = 512;

/// Errors of the baseline (`Send + Sync`: `anyhow!` takes them too).
pub type BareResult<T> = Result<T, Box<dyn Error + Send + Sync>>;

const INSERT: &str = "INSERT INTO feedback (journal, seq, tenant, pack, version, instruction, \
     execution_id, occurrence_ns, attempt, scheduled_ns, actual_ns, lateness_ns, outcome, \
     reason, event, action, detail, value, dropped_before, uncertainty_ns, clock_source, \
     clock_state, received_ns) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, \
     ?18, ?19, ?20, ?21, ?22, ?23) \
     ON CONFLICT (journal, seq) DO NOTHING";

/// One connection to a database with the store's schema, and the journal
/// ids it made (kept across calls, so several rounds may fill one file).
pub struct Bare {
    conn: rusqlite::Connection,
    journals: HashMap<(String, String), i64>,
}

impl Bare {
    /// Opens `dir/controller.db`, creating the store's schema first (the
    /// store is opened and dropped: nothing of it runs during inserts).
    pub fn open(dir: &Path) -> BareResult<Bare> {
        drop(SqliteStore::open(dir, Binding::Open)?);
        let conn = rusqlite::Connection::open(dir.join(DB_FILE))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        Ok(Bare {
            conn,
            journals: HashMap::new(),
        })
    }

    /// Inserts `rows` in order, one transaction per [`BARE_TX_ROWS`];
    /// returns the time it took (the first `BEGIN` to the last `COMMIT`).
    pub fn insert<'a>(
        &mut self,
        rows: impl IntoIterator<Item = &'a FeedbackRow>,
    ) -> BareResult<Duration> {
        let mut pending: Vec<&FeedbackRow> = Vec::with_capacity(BARE_TX_ROWS);
        let start = Instant::now();
        for r in rows {
            pending.push(r);
            if pending.len() == BARE_TX_ROWS {
                self.flush(&mut pending)?;
            }
        }
        if !pending.is_empty() {
            self.flush(&mut pending)?;
        }
        Ok(start.elapsed())
    }

    fn flush(&mut self, pending: &mut Vec<&FeedbackRow>) -> BareResult<()> {
        let tx = self.conn.transaction()?;
        {
            let mut high: HashMap<i64, i64> = HashMap::new();
            for r in pending.drain(..) {
                let key = (r.agent_id.clone(), r.journal_id.clone());
                let journal = match self.journals.get(&key) {
                    Some(j) => *j,
                    None => {
                        tx.prepare_cached(
                            "INSERT INTO journals (agent_id, journal_id, acked_seq) VALUES (?1, ?2, 0)",
                        )?
                        .execute(rusqlite::params![r.agent_id, r.journal_id])?;
                        let j = tx.last_insert_rowid();
                        self.journals.insert(key, j);
                        j
                    }
                };
                let seq = i64::try_from(r.seq)?;
                let canonical = r.occurrence.map(RefTime::as_nanos).map(|o| {
                    format!(
                        "{}/{}/v{}/{}/{o}/a{}",
                        r.tenant, r.pack, r.version, r.instruction, r.attempt
                    )
                });
                let execution_id = (canonical.as_deref() != Some(r.execution_id.as_str()))
                    .then_some(r.execution_id.as_str());
                tx.prepare_cached(INSERT)?.execute(rusqlite::params![
                    journal,
                    seq,
                    r.tenant,
                    r.pack,
                    i64::try_from(r.version)?,
                    r.instruction,
                    execution_id,
                    r.occurrence.map(RefTime::as_nanos),
                    i64::from(r.attempt),
                    r.scheduled.as_nanos(),
                    r.actual.as_nanos(),
                    r.lateness.nanos(),
                    r.outcome as i32,
                    r.reason as i32,
                    r.event,
                    r.action,
                    r.detail,
                    r.value.map(i64::from),
                    i64::try_from(r.dropped_before)?,
                    r.uncertainty.nanos(),
                    r.clock_source as i32,
                    r.clock_state as i32,
                    r.received.as_nanos()
                ])?;
                let h = high.entry(journal).or_default();
                *h = (*h).max(seq);
            }
            for (journal, seq) in high {
                tx.prepare_cached(
                    "UPDATE journals SET acked_seq = ?2 WHERE id = ?1 AND acked_seq < ?2",
                )?
                .execute(rusqlite::params![journal, seq])?;
            }
        }
        tx.commit()?;
        Ok(())
    }
}

/// Rows in `dir/controller.db`'s feedback table.
pub fn count(dir: &Path) -> BareResult<i64> {
    let conn = rusqlite::Connection::open(dir.join(DB_FILE))?;
    Ok(conn.query_row("SELECT COUNT(*) FROM feedback", [], |r| r.get(0))?)
}
