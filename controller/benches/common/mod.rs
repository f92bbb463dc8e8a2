//! Shared by the benches: the bare-SQLite baseline for feedback ingest.
//!
//! What the disk and SQLite allow with none of the store's shape: one
//! connection, WAL, `synchronous=FULL`, one prepared statement, one
//! transaction per [`BARE_TX_ROWS`] rows, into the store's own schema
//! (same table, same indexes, same conflict clause).

use std::error::Error;
use std::path::Path;
use std::time::{Duration, Instant};

use baton_controller::store::FeedbackRow;
use baton_controller::store::sqlite::{DB_FILE, SqliteStore};

/// Rows per transaction in the bare baseline.
pub const BARE_TX_ROWS: usize = 512;

/// Errors of the baseline (`Send + Sync`: `anyhow!` takes them too).
pub type BareResult<T> = Result<T, Box<dyn Error + Send + Sync>>;

const INSERT: &str = "INSERT INTO feedback (id, agent_id, journal_id, seq, execution_id, tenant, \
     pack, version, instruction, attempt, scheduled_ns, actual_ns, lateness_ns, \
     outcome, event, action, detail, value, dropped_before, uncertainty_ns, \
     received_ns) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, \
     ?17, ?18, ?19, ?20, ?21) \
     ON CONFLICT (agent_id, journal_id, seq) DO NOTHING";

/// One connection to a database with the store's schema, and the next
/// storage id (kept across calls, so several rounds may fill one file).
pub struct Bare {
    conn: rusqlite::Connection,
    next_id: i64,
}

impl Bare {
    /// Opens `dir/controller.db`, creating the store's schema first (the
    /// store is opened and dropped: nothing of it runs during inserts).
    pub fn open(dir: &Path) -> BareResult<Bare> {
        drop(SqliteStore::open(dir)?);
        let conn = rusqlite::Connection::open(dir.join(DB_FILE))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        let max: i64 = conn.query_row("SELECT COALESCE(MAX(id), 0) FROM feedback", [], |r| {
            r.get(0)
        })?;
        Ok(Bare {
            conn,
            next_id: max + 1,
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
            let mut stmt = tx.prepare_cached(INSERT)?;
            for r in pending.drain(..) {
                stmt.execute(rusqlite::params![
                    self.next_id,
                    r.agent_id,
                    r.journal_id,
                    i64::try_from(r.seq)?,
                    r.execution_id,
                    r.tenant,
                    r.pack,
                    i64::try_from(r.version)?,
                    r.instruction,
                    i64::from(r.attempt),
                    r.scheduled_ns,
                    r.actual_ns,
                    r.lateness_ns,
                    r.outcome,
                    r.event,
                    r.action,
                    r.detail,
                    r.value.map(i64::from),
                    i64::try_from(r.dropped_before)?,
                    r.uncertainty_ns,
                    r.received_ns
                ])?;
                self.next_id += 1;
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
