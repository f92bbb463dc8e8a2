//! The embedded [`Store`]: one SQLite file, `DIR/controller.db`.
//!
//! # Shape
//!
//! * **One writer.** SQLite serialises writers anyway; a dedicated OS
//!   thread owns the only write connection, so nothing ever waits on a
//!   `SQLITE_BUSY` lock. Callers send it closures over a *bounded* channel
//!   (a flood of writes pushes back on the senders instead of growing
//!   memory) and await a oneshot answer.
//! * **Group commit.** The writer takes everything queued (up to
//!   [`MAX_BATCH`] commands) and runs it in one transaction, each command
//!   in its own savepoint: a command that fails or is refused leaves no
//!   trace and does not disturb its neighbours. Every caller is answered
//!   only after the `COMMIT` returned, so `Ok` means "on disk"; a failed
//!   commit answers every caller of that batch with the error. With
//!   `synchronous=FULL` one fsync covers the whole batch, which is what
//!   makes thousands of small feedback batches per second affordable.
//! * **Reads beside it.** WAL lets readers run while the writer commits.
//!   Reads take a connection from a small pool inside
//!   [`tokio::task::spawn_blocking`], so neither reads nor writes block
//!   the async runtime.
//!
//! The SQL lives in this file and in `migrations/`; it is plain SQL that
//! PostgreSQL also accepts (`ON CONFLICT`, `COALESCE`, `SAVEPOINT`), apart
//! from the `?N` placeholders, which a PostgreSQL driver spells `$N`, and
//! the connection set-up (`PRAGMA`s, `BEGIN IMMEDIATE`). Text ordering
//! (`agents()`, `packs()`) is SQLite's byte order; a PostgreSQL backend
//! wants `COLLATE "C"` to list in the same order.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::types::{FromSql, Value};
use rusqlite::{Connection, OpenFlags, OptionalExtension, Row, TransactionBehavior, params};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use super::migrations::{CREATE_SCHEMA_MIGRATIONS, MIGRATIONS};
use super::{
    AgentRow, AuditRow, ClockRow, DeliveryRow, DeliveryState, ErrorRow, FeedbackFilter,
    FeedbackRow, FeedbackStored, HeldPackRow, LabelOverrides, PackRow, PackVersionRow, PutPack,
    Store, StoreError, StoreResult, TargetsRow,
};

/// The database file's name inside the data directory.
pub const DB_FILE: &str = "controller.db";

/// Commands that may wait for the writer. Past this, senders wait
/// (back-pressure) rather than queue without bound.
const QUEUE_DEPTH: usize = 1024;

/// Commands per transaction at most: bounds the time one commit holds
/// the write lock and the work lost to one failed commit.
pub const MAX_BATCH: usize = 512;

/// How long a connection waits for a lock held by another process (a
/// backup tool, the sqlite3 shell) before it reports `SQLITE_BUSY`.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Read connections kept open between reads.
const MAX_IDLE_READERS: usize = 4;

/// Prepared statements kept per connection (the writer uses about twenty
/// distinct ones; the feedback filter has 32 shapes).
const STATEMENT_CACHE: usize = 64;

/// The [`Store`] on an embedded SQLite database.
///
/// Cheap to clone (two `Arc`s); every clone talks to the same writer. When
/// the last clone is dropped, the writer commits what is queued, stops,
/// and is joined.
#[derive(Clone)]
pub struct SqliteStore {
    writer: Arc<Writer>,
    readers: Arc<ReadPool>,
}

/// Counts of committed work, for metrics and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// Transactions committed.
    pub batches: u64,
    /// Commands answered from committed transactions (refused ones
    /// included).
    pub commands: u64,
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.readers.path)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// Opens (creating it and `dir` when missing) `dir/controller.db`,
    /// brings its schema up to date and starts the writer thread.
    ///
    /// Blocking: call it before serving, or from `spawn_blocking`.
    /// Refuses a database whose schema is newer than this build knows.
    pub fn open(dir: &Path) -> StoreResult<SqliteStore> {
        std::fs::create_dir_all(dir)
            .map_err(|e| backend(&format!("create {}", dir.display()), e))?;
        let path = dir.join(DB_FILE);
        let mut conn =
            Connection::open(&path).map_err(|e| backend(&format!("open {}", path.display()), e))?;
        configure_writer(&conn)?;
        migrate(&mut conn)?;
        let max_id: i64 = conn
            .query_row("SELECT COALESCE(MAX(id), 0) FROM feedback", [], |r| {
                r.get(0)
            })
            .ctx("read the last feedback id")?;
        let state = WriterState {
            next_feedback_id: max_id.saturating_add(1),
        };

        let readers = Arc::new(ReadPool {
            path: path.clone(),
            idle: Mutex::new(Vec::new()),
        });
        // Fail now, not on the first read, if a reader cannot open.
        readers.with(|_| Ok(()))?;

        let stats = Arc::new(Stats::default());
        let (tx, rx) = mpsc::channel(QUEUE_DEPTH);
        let thread_stats = Arc::clone(&stats);
        let thread = std::thread::Builder::new()
            .name("store-writer".into())
            .spawn(move || writer_loop(conn, rx, state, &thread_stats))
            .map_err(|e| backend("start the store writer thread", e))?;
        Ok(SqliteStore {
            writer: Arc::new(Writer {
                tx: Some(tx),
                thread: Some(thread),
                stats,
            }),
            readers,
        })
    }

    /// What the writer has committed so far.
    pub fn stats(&self) -> WriterStats {
        WriterStats {
            batches: self.writer.stats.batches.load(Ordering::Relaxed),
            commands: self.writer.stats.commands.load(Ordering::Relaxed),
        }
    }

    /// Stops the writer once everything queued before this call is
    /// committed; later writes (from any clone) fail with
    /// [`StoreError::Closed`]. Reads keep working. For an orderly shutdown
    /// that does not depend on when the last clone is dropped.
    pub async fn close(&self) {
        let Some(tx) = self.writer.tx.as_ref() else {
            return;
        };
        let (reply, done) = oneshot::channel();
        if tx.send(Msg::Close(reply)).await.is_ok() {
            // An error here means the writer stopped anyway.
            let _ = done.await;
        }
    }

    /// Runs `f` on the writer thread inside the next batch's transaction
    /// and returns its result once that transaction is committed.
    async fn write<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, &mut WriterState) -> StoreResult<T> + Send + 'static,
    {
        let tx = self.writer.tx.as_ref().ok_or(StoreError::Closed)?;
        let (reply, answer) = oneshot::channel();
        let job = Box::new(Call {
            f: Some(f),
            out: None,
            reply,
        });
        tx.send(Msg::Job(job))
            .await
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// Runs `f` on a pooled read connection off the async runtime.
    async fn read<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<T> + Send + 'static,
    {
        let pool = Arc::clone(&self.readers);
        tokio::task::spawn_blocking(move || pool.with(f))
            .await
            .map_err(|e| backend("read task", e))?
    }

    /// Commands waiting for the writer (tests drive batching with it).
    #[cfg(test)]
    fn queued(&self) -> usize {
        self.writer
            .tx
            .as_ref()
            .map_or(0, |tx| tx.max_capacity() - tx.capacity())
    }
}

// ---------------------------------------------------------------------------
// The writer thread.

/// The writer's handle: dropping the last one stops and joins the thread.
struct Writer {
    /// `None` only while dropping.
    tx: Option<mpsc::Sender<Msg>>,
    thread: Option<JoinHandle<()>>,
    stats: Arc<Stats>,
}

impl Drop for Writer {
    fn drop(&mut self) {
        // Closing the channel lets the writer drain what is queued and
        // return.
        self.tx = None;
        if let Some(thread) = self.thread.take() {
            // A write closure that owned the last handle would drop it on
            // the writer itself; joining oneself would never return.
            if thread.thread().id() == std::thread::current().id() {
                return;
            }
            if thread.join().is_err() {
                tracing::error!("store writer thread panicked");
            }
        }
    }
}

#[derive(Debug, Default)]
struct Stats {
    batches: AtomicU64,
    commands: AtomicU64,
}

/// What the writer keeps between batches.
#[derive(Debug)]
struct WriterState {
    /// Storage order of the next feedback row (gaps are harmless: a
    /// rolled-back batch leaves one).
    next_feedback_id: i64,
}

enum Msg {
    Job(Box<dyn Job>),
    /// Stop after the commands queued before this one; answer when done.
    Close(oneshot::Sender<()>),
}

/// A write command, type-erased so one channel carries them all.
trait Job: Send {
    /// Runs inside the batch transaction; `Err` (its error, as text) if
    /// it failed, and its savepoint is then rolled back.
    fn run(&mut self, conn: &Connection, state: &mut WriterState) -> Result<(), String>;
    /// Tells the caller: its own result if the batch committed, else the
    /// batch's error.
    fn answer(self: Box<Self>, batch: Result<(), &str>);
}

struct Call<T, F> {
    f: Option<F>,
    out: Option<StoreResult<T>>,
    reply: oneshot::Sender<StoreResult<T>>,
}

impl<T, F> Job for Call<T, F>
where
    T: Send,
    F: FnOnce(&Connection, &mut WriterState) -> StoreResult<T> + Send,
{
    fn run(&mut self, conn: &Connection, state: &mut WriterState) -> Result<(), String> {
        let out = match self.f.take() {
            Some(f) => f(conn, state),
            None => Err(StoreError::Backend("a write ran twice".into())),
        };
        let status = match &out {
            Ok(_) => Ok(()),
            Err(e) => Err(e.to_string()),
        };
        self.out = Some(out);
        status
    }

    fn answer(self: Box<Self>, batch: Result<(), &str>) {
        let Call { out, reply, .. } = *self;
        let out = match batch {
            Err(e) => Err(StoreError::Backend(e.to_owned())),
            Ok(()) => out.unwrap_or_else(|| Err(StoreError::Backend("a write never ran".into()))),
        };
        // The caller may have stopped waiting; the write stands regardless.
        let _ = reply.send(out);
    }
}

fn writer_loop(
    conn: Connection,
    mut rx: mpsc::Receiver<Msg>,
    mut state: WriterState,
    stats: &Stats,
) {
    let mut msgs: Vec<Msg> = Vec::with_capacity(MAX_BATCH);
    let mut batch: Vec<Box<dyn Job>> = Vec::with_capacity(MAX_BATCH);
    let mut closing: Option<oneshot::Sender<()>> = None;
    let mut alive = true;
    while alive && closing.is_none() {
        if rx.blocking_recv_many(&mut msgs, MAX_BATCH) == 0 {
            break; // every handle is gone and the queue is empty
        }
        for msg in msgs.drain(..) {
            match msg {
                Msg::Job(job) if closing.is_none() => batch.push(job),
                // Queued after a close: dropped, its caller gets `Closed`.
                Msg::Job(_) => {}
                Msg::Close(reply) => closing = closing.or(Some(reply)),
            }
        }
        if !batch.is_empty() {
            alive = run_batch(&conn, &mut state, &mut batch, stats);
        }
    }
    // Refuse what is still queued (its callers see `Closed`) and anything
    // sent later.
    drop(rx);
    if let Err((_, e)) = conn.close() {
        tracing::warn!(error = %e, "store: closing the write connection");
    }
    if let Some(reply) = closing {
        let _ = reply.send(());
    }
}

/// Commits one batch and answers its callers. Returns whether the writer
/// can go on (`false`: the connection is in a state it cannot recover).
fn run_batch(
    conn: &Connection,
    state: &mut WriterState,
    batch: &mut Vec<Box<dyn Job>>,
    stats: &Stats,
) -> bool {
    let outcome = execute_batch(conn, state, batch);
    let mut alive = true;
    match &outcome {
        Ok(()) => {
            stats.batches.fetch_add(1, Ordering::Relaxed);
            stats
                .commands
                .fetch_add(batch.len() as u64, Ordering::Relaxed);
        }
        Err(e) => {
            tracing::error!(error = %e, commands = batch.len(), "store: write batch failed");
            if !conn.is_autocommit()
                && let Err(re) = conn.execute_batch("ROLLBACK")
            {
                tracing::error!(error = %re, "store: rollback failed; the writer stops");
                alive = false;
            }
        }
    }
    let shared = outcome.as_ref().map(|_| ()).map_err(String::as_str);
    for job in batch.drain(..) {
        job.answer(shared);
    }
    alive
}

fn execute_batch(
    conn: &Connection,
    state: &mut WriterState,
    batch: &mut [Box<dyn Job>],
) -> Result<(), String> {
    let step = |sql: &str| -> Result<(), String> {
        conn.prepare_cached(sql)
            .and_then(|mut s| s.execute([]))
            .map(drop)
            .map_err(|e| format!("write batch not committed ({sql}): {e}"))
    };
    step("BEGIN IMMEDIATE")?;
    for job in batch.iter_mut() {
        step("SAVEPOINT job")?;
        let status = job.run(conn, state);
        if conn.is_autocommit() {
            // SQLite rolls the whole transaction back on some errors (I/O,
            // disk full): the commands before this one are lost too.
            let cause = status.err().unwrap_or_else(|| "no error reported".into());
            return Err(format!(
                "write batch rolled back by the database ({cause}); nothing in it was stored"
            ));
        }
        if status.is_err() {
            step("ROLLBACK TO SAVEPOINT job")?;
        }
        step("RELEASE SAVEPOINT job")?;
    }
    step("COMMIT")
}

// ---------------------------------------------------------------------------
// Connections.

fn configure_writer(conn: &Connection) -> StoreResult<()> {
    let mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))
        .ctx("set journal_mode=WAL")?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Backend(format!(
            "the database refused WAL mode (journal_mode is {mode}); is it on a network filesystem?"
        )));
    }
    // FULL: the WAL is fsynced at every commit, so a commit that returned
    // survives power loss, not only a crash of this process.
    conn.pragma_update(None, "synchronous", "FULL")
        .ctx("set synchronous=FULL")?;
    conn.pragma_update(None, "foreign_keys", "ON")
        .ctx("set foreign_keys=ON")?;
    conn.busy_timeout(BUSY_TIMEOUT).ctx("set busy_timeout")?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(())
}

fn open_reader(path: &Path) -> StoreResult<Connection> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| backend(&format!("open {} for reading", path.display()), e))?;
    // Read-write open (WAL readers need the shared-memory index) but no
    // write can slip through one of these.
    conn.pragma_update(None, "query_only", "ON")
        .ctx("set query_only")?;
    conn.busy_timeout(BUSY_TIMEOUT).ctx("set busy_timeout")?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(conn)
}

/// Read connections, opened on demand, a few kept for reuse.
struct ReadPool {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
}

impl ReadPool {
    fn with<T>(&self, f: impl FnOnce(&Connection) -> StoreResult<T>) -> StoreResult<T> {
        let pooled = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let conn = match pooled {
            Some(conn) => conn,
            None => open_reader(&self.path)?,
        };
        let out = f(&conn);
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < MAX_IDLE_READERS {
            idle.push(conn);
        }
        out
    }
}

/// Applies the migrations this database lacks, each in its own
/// transaction (re-checked inside it, so two processes opening one file
/// at once do not both apply one).
fn migrate(conn: &mut Connection) -> StoreResult<()> {
    conn.execute_batch(CREATE_SCHEMA_MIGRATIONS)
        .ctx("create schema_migrations")?;
    let newest: i64 = conn
        .query_row(
            "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
            [],
            |r| r.get(0),
        )
        .ctx("read schema_migrations")?;
    let known = MIGRATIONS.last().map_or(0, |m| m.version);
    if newest > known {
        return Err(StoreError::Backend(format!(
            "the database's schema is v{newest}, newer than this controller's v{known}; run a newer controller"
        )));
    }
    for m in MIGRATIONS {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .ctx("begin a migration")?;
        let applied = tx
            .query_row(
                "SELECT version FROM schema_migrations WHERE version = ?1",
                [m.version],
                |r| r.get::<_, i64>(0),
            )
            .optional()
            .ctx("read schema_migrations")?
            .is_some();
        if !applied {
            tx.execute_batch(m.sql)
                .map_err(|e| backend(&format!("apply migration v{}", m.version), e))?;
            tx.execute(
                "INSERT INTO schema_migrations (version) VALUES (?1)",
                [m.version],
            )
            .ctx("record a migration")?;
            tracing::info!(version = m.version, "store: schema migrated");
        }
        tx.commit().ctx("commit a migration")?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Encoding.

fn backend(what: &str, e: impl fmt::Display) -> StoreError {
    StoreError::Backend(format!("{what}: {e}"))
}

/// `?` with a word on what was being done.
trait Context<T> {
    fn ctx(self, what: &str) -> StoreResult<T>;
}

impl<T> Context<T> for rusqlite::Result<T> {
    fn ctx(self, what: &str) -> StoreResult<T> {
        self.map_err(|e| backend(what, e))
    }
}

/// A u64 as BIGINT; values past `i64::MAX` are refused, never wrapped.
fn to_db(v: u64, what: &str) -> StoreResult<i64> {
    i64::try_from(v).map_err(|_| {
        StoreError::Backend(format!(
            "{what} {v} is larger than {} and cannot be stored",
            i64::MAX
        ))
    })
}

fn u64_from_db(v: i64, what: &str) -> StoreResult<u64> {
    u64::try_from(v).map_err(|_| StoreError::Backend(format!("stored {what} is negative: {v}")))
}

fn u32_from_db(v: i64, what: &str) -> StoreResult<u32> {
    u32::try_from(v).map_err(|_| StoreError::Backend(format!("stored {what} is not a u32: {v}")))
}

/// A column by name, a decode failure as a typed error.
fn col<T: FromSql>(row: &Row<'_>, name: &str) -> StoreResult<T> {
    row.get(name)
        .map_err(|e| StoreError::Backend(format!("column {name}: {e}")))
}

fn to_json<T: Serialize>(v: &T, what: &str) -> StoreResult<String> {
    serde_json::to_string(v).map_err(|e| backend(&format!("encode {what}"), e))
}

fn from_json<T: DeserializeOwned>(s: &str, what: &str) -> StoreResult<T> {
    serde_json::from_str(s).map_err(|e| backend(&format!("decode stored {what}"), e))
}

/// [`HeldPackRow`] as stored in `agents.held`.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct HeldJson {
    tenant: String,
    pack: String,
    version: u64,
    stopped: bool,
}

/// [`ErrorRow`] as stored in `deliveries.errors`.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ErrorJson {
    line: u32,
    column: u32,
    instruction: String,
    message: String,
}

/// [`TargetsRow`] as stored in `pack_versions.targets`.
#[derive(Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
enum TargetsJson {
    Nobody,
    Agents { ids: Vec<String> },
    Labels { labels: BTreeMap<String, String> },
}

fn held_json(held: &[HeldPackRow]) -> StoreResult<String> {
    let v: Vec<HeldJson> = held
        .iter()
        .map(|h| HeldJson {
            tenant: h.tenant.clone(),
            pack: h.pack.clone(),
            version: h.version,
            stopped: h.stopped,
        })
        .collect();
    to_json(&v, "held packs")
}

fn targets_json(t: &TargetsRow) -> StoreResult<String> {
    let v = match t {
        TargetsRow::Nobody => TargetsJson::Nobody,
        TargetsRow::Agents(ids) => TargetsJson::Agents { ids: ids.clone() },
        TargetsRow::Labels(labels) => TargetsJson::Labels {
            labels: labels.clone(),
        },
    };
    to_json(&v, "targets")
}

fn errors_json(errors: &[ErrorRow]) -> StoreResult<String> {
    let v: Vec<ErrorJson> = errors
        .iter()
        .map(|e| ErrorJson {
            line: e.line,
            column: e.column,
            instruction: e.instruction.clone(),
            message: e.message.clone(),
        })
        .collect();
    to_json(&v, "errors")
}

// ---------------------------------------------------------------------------
// Decoding rows. Every failure names the row it came from.

fn with_row<T>(what: impl fmt::Display, r: StoreResult<T>) -> StoreResult<T> {
    r.map_err(|e| match e {
        StoreError::Backend(m) => StoreError::Backend(format!("{what}: {m}")),
        other => other,
    })
}

const AGENT_COLUMNS: &str = "id, labels, agent_version, journal_id, connected, last_seen_ns, held, \
     clock_source, clock_state, clock_offset_ns, clock_jitter_ns, clock_uncertainty_ns, \
     clock_frequency_ppm, clock_at_ns";

fn decode_agent(row: &Row<'_>) -> StoreResult<AgentRow> {
    let id: String = col(row, "id")?;
    let r = (|| {
        let labels: String = col(row, "labels")?;
        let held: String = col(row, "held")?;
        let held: Vec<HeldJson> = from_json(&held, "held packs")?;
        let clock = match col::<Option<i64>>(row, "clock_at_ns")? {
            None => None,
            Some(at_ns) => Some(ClockRow {
                source: col(row, "clock_source")?,
                state: col(row, "clock_state")?,
                offset_ns: col(row, "clock_offset_ns")?,
                jitter_ns: col(row, "clock_jitter_ns")?,
                uncertainty_ns: col(row, "clock_uncertainty_ns")?,
                frequency_ppm: col(row, "clock_frequency_ppm")?,
                at_ns,
            }),
        };
        Ok(AgentRow {
            id: id.clone(),
            labels: from_json(&labels, "labels")?,
            agent_version: col(row, "agent_version")?,
            journal_id: col(row, "journal_id")?,
            connected: col::<i64>(row, "connected")? != 0,
            last_seen_ns: col(row, "last_seen_ns")?,
            held: held
                .into_iter()
                .map(|h| HeldPackRow {
                    tenant: h.tenant,
                    pack: h.pack,
                    version: h.version,
                    stopped: h.stopped,
                })
                .collect(),
            clock,
            overrides: BTreeMap::new(),
        })
    })();
    with_row(format_args!("agent {id}"), r)
}

/// Read the operator labels of `agents` (of one agent with `only`).
fn attach_overrides(
    conn: &Connection,
    agents: &mut [AgentRow],
    only: Option<&str>,
) -> StoreResult<()> {
    let rows = query_all(
        conn,
        "SELECT agent_id, tenant, key, value FROM agent_labels \
         WHERE ?1 IS NULL OR agent_id = ?1 ORDER BY agent_id, tenant, key",
        params![only],
        |r| {
            Ok((
                col::<String>(r, "agent_id")?,
                col::<String>(r, "tenant")?,
                col::<String>(r, "key")?,
                col::<Option<String>>(r, "value")?,
            ))
        },
    )?;
    for (agent, tenant, key, value) in rows {
        if let Ok(i) = agents.binary_search_by(|a| a.id.as_str().cmp(&agent)) {
            agents[i]
                .overrides
                .entry(tenant)
                .or_default()
                .insert(key, value);
        }
    }
    Ok(())
}

fn read_agent(conn: &Connection, id: &str) -> StoreResult<Option<AgentRow>> {
    let sql = format!("SELECT {AGENT_COLUMNS} FROM agents WHERE id = ?1");
    let mut rows = query_all(conn, &sql, [id], decode_agent)?;
    attach_overrides(conn, &mut rows, Some(id))?;
    Ok(rows.pop())
}

fn write_label_agent(
    conn: &Connection,
    id: &str,
    tenant: &str,
    set: &LabelOverrides,
    reset: &[String],
) -> StoreResult<AgentRow> {
    if !agent_exists(conn, id)? {
        return Err(StoreError::NoSuchAgent { id: id.to_string() });
    }
    for (k, v) in set {
        conn.prepare_cached(
            "INSERT INTO agent_labels (agent_id, tenant, key, value) VALUES (?1, ?2, ?3, ?4) \
             ON CONFLICT (agent_id, tenant, key) DO UPDATE SET value = excluded.value",
        )
        .and_then(|mut st| st.execute(params![id, tenant, k, v]))
        .ctx("store an agent label")?;
    }
    for k in reset {
        conn.prepare_cached(
            "DELETE FROM agent_labels WHERE agent_id = ?1 AND tenant = ?2 AND key = ?3",
        )
        .and_then(|mut st| st.execute(params![id, tenant, k]))
        .ctx("reset an agent label")?;
    }
    read_agent(conn, id)?.ok_or_else(|| StoreError::NoSuchAgent { id: id.to_string() })
}

fn write_forget_agent(conn: &Connection, id: &str, tenant: Option<&str>) -> StoreResult<bool> {
    let existed = agent_exists(conn, id)?;
    let run = |sql: &str, what: &str| -> StoreResult<()> {
        conn.prepare_cached(sql)
            .and_then(|mut st| st.execute(params![id, tenant]))
            .ctx(what)?;
        Ok(())
    };
    run(
        "DELETE FROM agent_labels WHERE agent_id = ?1 AND (?2 IS NULL OR tenant = ?2)",
        "forget an agent's labels",
    )?;
    run(
        "DELETE FROM deliveries WHERE agent_id = ?1 AND (?2 IS NULL OR tenant = ?2)",
        "forget an agent's deliveries",
    )?;
    if tenant.is_none() {
        run(
            "DELETE FROM clock_reports WHERE agent_id = ?1 AND ?2 IS NULL",
            "forget an agent's clock history",
        )?;
        run(
            "DELETE FROM agents WHERE id = ?1 AND ?2 IS NULL",
            "forget an agent",
        )?;
    }
    Ok(existed)
}

const CLOCK_COLUMNS: &str =
    "source, state, offset_ns, jitter_ns, uncertainty_ns, frequency_ppm, at_ns";

fn decode_clock(row: &Row<'_>) -> StoreResult<ClockRow> {
    Ok(ClockRow {
        source: col(row, "source")?,
        state: col(row, "state")?,
        offset_ns: col(row, "offset_ns")?,
        jitter_ns: col(row, "jitter_ns")?,
        uncertainty_ns: col(row, "uncertainty_ns")?,
        frequency_ppm: col(row, "frequency_ppm")?,
        at_ns: col(row, "at_ns")?,
    })
}

fn decode_pack_version(row: &Row<'_>) -> StoreResult<PackVersionRow> {
    let tenant: String = col(row, "tenant")?;
    let pack: String = col(row, "pack")?;
    let version: i64 = col(row, "version")?;
    let r = (|| {
        let targets: String = col(row, "targets")?;
        let targets = match from_json(&targets, "targets")? {
            TargetsJson::Nobody => TargetsRow::Nobody,
            TargetsJson::Agents { ids } => TargetsRow::Agents(ids),
            TargetsJson::Labels { labels } => TargetsRow::Labels(labels),
        };
        Ok(PackVersionRow {
            tenant: tenant.clone(),
            pack: pack.clone(),
            version: u64_from_db(version, "version")?,
            yaml: col(row, "yaml")?,
            targets,
            pushed_ns: col(row, "pushed_ns")?,
        })
    })();
    with_row(format_args!("pack {tenant}/{pack} v{version}"), r)
}

const DELIVERY_COLUMNS: &str =
    "agent_id, tenant, pack, version, state, reason, errors, updated_ns, attempts";

fn decode_delivery(row: &Row<'_>) -> StoreResult<DeliveryRow> {
    let agent_id: String = col(row, "agent_id")?;
    let tenant: String = col(row, "tenant")?;
    let pack: String = col(row, "pack")?;
    let version: i64 = col(row, "version")?;
    let r = (|| {
        let state: String = col(row, "state")?;
        let errors: String = col(row, "errors")?;
        let errors: Vec<ErrorJson> = from_json(&errors, "errors")?;
        Ok(DeliveryRow {
            agent_id: agent_id.clone(),
            tenant: tenant.clone(),
            pack: pack.clone(),
            version: u64_from_db(version, "version")?,
            state: DeliveryState::parse(&state)
                .ok_or_else(|| StoreError::Backend(format!("unknown state {state:?}")))?,
            reason: col(row, "reason")?,
            errors: errors
                .into_iter()
                .map(|e| ErrorRow {
                    line: e.line,
                    column: e.column,
                    instruction: e.instruction,
                    message: e.message,
                })
                .collect(),
            updated_ns: col(row, "updated_ns")?,
            attempts: u32_from_db(col(row, "attempts")?, "attempts")?,
        })
    })();
    with_row(
        format_args!("delivery of {tenant}/{pack} v{version} to {agent_id}"),
        r,
    )
}

const FEEDBACK_COLUMNS: &str = "agent_id, journal_id, seq, execution_id, tenant, pack, version, \
     instruction, attempt, scheduled_ns, actual_ns, lateness_ns, outcome, event, action, detail, \
     value, dropped_before, uncertainty_ns, received_ns";

fn decode_feedback(row: &Row<'_>) -> StoreResult<FeedbackRow> {
    let agent_id: String = col(row, "agent_id")?;
    let journal_id: String = col(row, "journal_id")?;
    let seq: i64 = col(row, "seq")?;
    let r = (|| {
        Ok(FeedbackRow {
            agent_id: agent_id.clone(),
            journal_id: journal_id.clone(),
            seq: u64_from_db(seq, "seq")?,
            execution_id: col(row, "execution_id")?,
            tenant: col(row, "tenant")?,
            pack: col(row, "pack")?,
            version: u64_from_db(col(row, "version")?, "version")?,
            instruction: col(row, "instruction")?,
            attempt: u32_from_db(col(row, "attempt")?, "attempt")?,
            scheduled_ns: col(row, "scheduled_ns")?,
            actual_ns: col(row, "actual_ns")?,
            lateness_ns: col(row, "lateness_ns")?,
            outcome: col(row, "outcome")?,
            event: col(row, "event")?,
            action: col(row, "action")?,
            detail: col(row, "detail")?,
            value: col::<Option<i64>>(row, "value")?
                .map(|v| u32_from_db(v, "value"))
                .transpose()?,
            dropped_before: u64_from_db(col(row, "dropped_before")?, "dropped_before")?,
            uncertainty_ns: col(row, "uncertainty_ns")?,
            received_ns: col(row, "received_ns")?,
        })
    })();
    with_row(format_args!("feedback {agent_id}/{journal_id}#{seq}"), r)
}

/// Runs a query and decodes every row.
fn query_all<T>(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
    decode: impl Fn(&Row<'_>) -> StoreResult<T>,
) -> StoreResult<Vec<T>> {
    let mut stmt = conn.prepare_cached(sql).ctx("prepare a query")?;
    let mut rows = stmt.query(params).ctx("run a query")?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().ctx("read a row")? {
        out.push(decode(row)?);
    }
    Ok(out)
}

// ---------------------------------------------------------------------------
// Writes, run on the writer thread inside a batch.

fn no_agent(id: &str) -> StoreError {
    StoreError::Backend(format!("no agent {id}: it must say hello first"))
}

fn agent_exists(conn: &Connection, id: &str) -> StoreResult<bool> {
    Ok(conn
        .prepare_cached("SELECT 1 FROM agents WHERE id = ?1")
        .and_then(|mut s| s.query_row([id], |_| Ok(())).optional())
        .ctx("look up an agent")?
        .is_some())
}

/// The latest-clock columns and the history row; a report older than the
/// stored latest goes to history only.
fn write_clock(conn: &Connection, id: &str, c: &ClockRow) -> StoreResult<()> {
    conn.prepare_cached(
        "INSERT INTO clock_reports \
         (agent_id, at_ns, source, state, offset_ns, jitter_ns, uncertainty_ns, frequency_ppm) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) \
         ON CONFLICT (agent_id, at_ns) DO NOTHING",
    )
    .and_then(|mut s| {
        s.execute(params![
            id,
            c.at_ns,
            c.source,
            c.state,
            c.offset_ns,
            c.jitter_ns,
            c.uncertainty_ns,
            c.frequency_ppm
        ])
    })
    .ctx("store a clock report")?;
    conn.prepare_cached(
        "UPDATE agents SET clock_source = ?2, clock_state = ?3, clock_offset_ns = ?4, \
         clock_jitter_ns = ?5, clock_uncertainty_ns = ?6, clock_frequency_ppm = ?7, \
         clock_at_ns = ?8 \
         WHERE id = ?1 AND (clock_at_ns IS NULL OR clock_at_ns <= ?8)",
    )
    .and_then(|mut s| {
        s.execute(params![
            id,
            c.source,
            c.state,
            c.offset_ns,
            c.jitter_ns,
            c.uncertainty_ns,
            c.frequency_ppm,
            c.at_ns
        ])
    })
    .ctx("store an agent's latest clock")?;
    Ok(())
}

fn write_agent_hello(conn: &Connection, a: &AgentRow) -> StoreResult<()> {
    let labels = to_json(&a.labels, "labels")?;
    let held = held_json(&a.held)?;
    conn.prepare_cached(
        "INSERT INTO agents (id, labels, agent_version, journal_id, connected, last_seen_ns, held) \
         VALUES (?1, ?2, ?3, ?4, 1, ?5, ?6) \
         ON CONFLICT (id) DO UPDATE SET labels = excluded.labels, \
         agent_version = excluded.agent_version, journal_id = excluded.journal_id, \
         connected = excluded.connected, last_seen_ns = excluded.last_seen_ns, \
         held = excluded.held",
    )
    .and_then(|mut s| {
        s.execute(params![
            a.id,
            labels,
            a.agent_version,
            a.journal_id,
            a.last_seen_ns,
            held
        ])
    })
    .ctx("store an agent")?;
    if let Some(clock) = &a.clock {
        write_clock(conn, &a.id, clock)?;
    }
    Ok(())
}

/// Runs an `UPDATE agents ... WHERE id = ?1`; an unknown agent is an error
/// (the server only updates agents that said hello).
fn update_agent(
    conn: &Connection,
    id: &str,
    sql: &str,
    params: impl rusqlite::Params,
) -> StoreResult<()> {
    let n = conn
        .prepare_cached(sql)
        .and_then(|mut s| s.execute(params))
        .ctx("update an agent")?;
    if n == 0 {
        return Err(no_agent(id));
    }
    Ok(())
}

fn read_pack(conn: &Connection, tenant: &str, pack: &str) -> StoreResult<Option<PackRow>> {
    let mut rows = query_all(
        conn,
        "SELECT p.cancelled_ns, v.tenant, v.pack, v.version, v.yaml, v.targets, v.pushed_ns \
         FROM packs p JOIN pack_versions v \
         ON v.tenant = p.tenant AND v.pack = p.pack AND v.version = p.latest_version \
         WHERE p.tenant = ?1 AND p.pack = ?2",
        params![tenant, pack],
        decode_pack,
    )?;
    Ok(rows.pop())
}

fn decode_pack(row: &Row<'_>) -> StoreResult<PackRow> {
    Ok(PackRow {
        latest: decode_pack_version(row)?,
        cancelled_ns: col(row, "cancelled_ns")?,
    })
}

fn write_pack(conn: &Connection, p: &PackVersionRow) -> StoreResult<PutPack> {
    let version = to_db(p.version, "pack version")?;
    let latest: Option<i64> = conn
        .prepare_cached("SELECT latest_version FROM packs WHERE tenant = ?1 AND pack = ?2")
        .and_then(|mut s| s.query_row([&p.tenant, &p.pack], |r| r.get(0)).optional())
        .ctx("look up a pack")?;
    if let Some(latest) = latest {
        if latest > version {
            return Err(StoreError::VersionOlder {
                tenant: p.tenant.clone(),
                pack: p.pack.clone(),
                version: p.version,
                latest: u64_from_db(latest, "latest version")?,
            });
        }
        if latest == version {
            let yaml: Option<String> = conn
                .prepare_cached(
                    "SELECT yaml FROM pack_versions \
                     WHERE tenant = ?1 AND pack = ?2 AND version = ?3",
                )
                .and_then(|mut s| {
                    s.query_row(params![p.tenant, p.pack, version], |r| r.get(0))
                        .optional()
                })
                .ctx("look up a pack version")?;
            return if yaml.as_deref() == Some(p.yaml.as_str()) {
                Ok(PutPack::Unchanged)
            } else {
                Err(StoreError::VersionTaken {
                    tenant: p.tenant.clone(),
                    pack: p.pack.clone(),
                    version: p.version,
                })
            };
        }
    }
    let targets = targets_json(&p.targets)?;
    conn.prepare_cached(
        "INSERT INTO packs (tenant, pack, latest_version, cancelled_ns) \
         VALUES (?1, ?2, ?3, NULL) \
         ON CONFLICT (tenant, pack) DO UPDATE SET \
         latest_version = excluded.latest_version, cancelled_ns = NULL",
    )
    .and_then(|mut s| s.execute(params![p.tenant, p.pack, version]))
    .ctx("store a pack")?;
    conn.prepare_cached(
        "INSERT INTO pack_versions (tenant, pack, version, yaml, targets, pushed_ns) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )
    .and_then(|mut s| {
        s.execute(params![
            p.tenant,
            p.pack,
            version,
            p.yaml,
            targets,
            p.pushed_ns
        ])
    })
    .ctx("store a pack version")?;
    Ok(PutPack::Stored)
}

fn write_cancel(conn: &Connection, tenant: &str, pack: &str, at_ns: i64) -> StoreResult<PackRow> {
    let no_pack = || StoreError::NoSuchPack {
        tenant: tenant.to_owned(),
        pack: pack.to_owned(),
    };
    // A second cancel keeps the first instant.
    let n = conn
        .prepare_cached(
            "UPDATE packs SET cancelled_ns = COALESCE(cancelled_ns, ?3) \
             WHERE tenant = ?1 AND pack = ?2",
        )
        .and_then(|mut s| s.execute(params![tenant, pack, at_ns]))
        .ctx("cancel a pack")?;
    if n == 0 {
        return Err(no_pack());
    }
    conn.prepare_cached(
        "UPDATE deliveries SET state = 'cancelled', reason = '', updated_ns = ?3 \
         WHERE tenant = ?1 AND pack = ?2 AND state IN ('pending', 'acked')",
    )
    .and_then(|mut s| s.execute(params![tenant, pack, at_ns]))
    .ctx("cancel a pack's deliveries")?;
    read_pack(conn, tenant, pack)?.ok_or_else(no_pack)
}

fn write_delivery(conn: &Connection, d: &DeliveryRow) -> StoreResult<()> {
    let version = to_db(d.version, "delivery version")?;
    let errors = errors_json(&d.errors)?;
    conn.prepare_cached(
        "INSERT INTO deliveries \
         (agent_id, tenant, pack, version, state, reason, errors, updated_ns, attempts) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) \
         ON CONFLICT (agent_id, tenant, pack, version) DO UPDATE SET \
         state = excluded.state, reason = excluded.reason, errors = excluded.errors, \
         updated_ns = excluded.updated_ns, attempts = excluded.attempts",
    )
    .and_then(|mut s| {
        s.execute(params![
            d.agent_id,
            d.tenant,
            d.pack,
            version,
            d.state.as_str(),
            d.reason,
            errors,
            d.updated_ns,
            i64::from(d.attempts)
        ])
    })
    .map_err(|e| {
        backend(
            &format!(
                "store the delivery of {}/{} v{} to {}",
                d.tenant, d.pack, d.version, d.agent_id
            ),
            e,
        )
    })?;
    Ok(())
}

fn write_feedback(
    conn: &Connection,
    state: &mut WriterState,
    rows: &[FeedbackRow],
) -> StoreResult<FeedbackStored> {
    let mut stmt = conn
        .prepare_cached(
            "INSERT INTO feedback (id, agent_id, journal_id, seq, execution_id, tenant, pack, \
             version, instruction, attempt, scheduled_ns, actual_ns, lateness_ns, outcome, event, \
             action, detail, value, dropped_before, uncertainty_ns, received_ns) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, \
             ?18, ?19, ?20, ?21) \
             ON CONFLICT (agent_id, journal_id, seq) DO NOTHING",
        )
        .ctx("prepare the feedback insert")?;
    let mut stored = FeedbackStored::default();
    for r in rows {
        let seq = to_db(r.seq, "feedback seq")?;
        let version = to_db(r.version, "feedback pack version")?;
        let dropped_before = to_db(r.dropped_before, "feedback dropped_before")?;
        let id = state.next_feedback_id;
        let n = stmt
            .execute(params![
                id,
                r.agent_id,
                r.journal_id,
                seq,
                r.execution_id,
                r.tenant,
                r.pack,
                version,
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
                dropped_before,
                r.uncertainty_ns,
                r.received_ns
            ])
            .map_err(|e| {
                backend(
                    &format!("store feedback {}/{}#{}", r.agent_id, r.journal_id, r.seq),
                    e,
                )
            })?;
        if n == 0 {
            stored.duplicates += 1;
        } else {
            stored.inserted += 1;
            state.next_feedback_id = id
                .checked_add(1)
                .ok_or_else(|| StoreError::Backend("feedback ids exhausted".into()))?;
        }
    }
    Ok(stored)
}

// ---------------------------------------------------------------------------
// The trait.

#[async_trait]
impl Store for SqliteStore {
    /// Forces `connected`; `last_seen_ns` is the hello's. A clock in the
    /// hello is stored as [`Store::record_clock`] would.
    async fn agent_hello(&self, agent: AgentRow) -> StoreResult<()> {
        self.write(move |conn, _| write_agent_hello(conn, &agent))
            .await
    }

    /// Unknown agent: [`StoreError::Backend`].
    async fn agent_seen(&self, id: &str, connected: bool, at_ns: i64) -> StoreResult<()> {
        let id = id.to_owned();
        self.write(move |conn, _| {
            update_agent(
                conn,
                &id,
                "UPDATE agents SET connected = ?2, last_seen_ns = ?3 WHERE id = ?1",
                params![id, i64::from(connected), at_ns],
            )
        })
        .await
    }

    /// Unknown agent: [`StoreError::Backend`].
    async fn agent_held(&self, id: &str, held: Vec<HeldPackRow>) -> StoreResult<()> {
        let id = id.to_owned();
        self.write(move |conn, _| {
            let held = held_json(&held)?;
            update_agent(
                conn,
                &id,
                "UPDATE agents SET held = ?2 WHERE id = ?1",
                params![id, held],
            )
        })
        .await
    }

    /// `last_seen_ns` is left as it was: it stays the last message
    /// actually received, which `at_ns` (the controller's start) is not.
    async fn all_disconnected(&self, _at_ns: i64) -> StoreResult<()> {
        self.write(|conn, _| {
            conn.prepare_cached("UPDATE agents SET connected = 0 WHERE connected <> 0")
                .and_then(|mut s| s.execute([]))
                .ctx("mark agents disconnected")?;
            Ok(())
        })
        .await
    }

    /// Idempotent on (agent, `at_ns`); a report older than the stored
    /// latest only joins the history. Unknown agent: [`StoreError::Backend`].
    async fn record_clock(&self, id: &str, clock: ClockRow) -> StoreResult<()> {
        let id = id.to_owned();
        self.write(move |conn, _| {
            if !agent_exists(conn, &id)? {
                return Err(no_agent(&id));
            }
            write_clock(conn, &id, &clock)
        })
        .await
    }

    async fn clock_history(&self, id: &str, since_ns: i64) -> StoreResult<Vec<ClockRow>> {
        let id = id.to_owned();
        self.read(move |conn| {
            let sql = format!(
                "SELECT {CLOCK_COLUMNS} FROM clock_reports \
                 WHERE agent_id = ?1 AND at_ns >= ?2 ORDER BY at_ns"
            );
            query_all(conn, &sql, params![id, since_ns], |row| {
                with_row(format_args!("clock report of {id}"), decode_clock(row))
            })
        })
        .await
    }

    async fn agents(&self) -> StoreResult<Vec<AgentRow>> {
        self.read(|conn| {
            let sql = format!("SELECT {AGENT_COLUMNS} FROM agents ORDER BY id");
            let mut rows = query_all(conn, &sql, [], decode_agent)?;
            attach_overrides(conn, &mut rows, None)?;
            Ok(rows)
        })
        .await
    }

    async fn agent(&self, id: &str) -> StoreResult<Option<AgentRow>> {
        let id = id.to_owned();
        self.read(move |conn| read_agent(conn, &id)).await
    }

    async fn label_agent(
        &self,
        id: &str,
        tenant: &str,
        set: LabelOverrides,
        reset: Vec<String>,
    ) -> StoreResult<AgentRow> {
        let (id, tenant) = (id.to_owned(), tenant.to_owned());
        self.write(move |conn, _| write_label_agent(conn, &id, &tenant, &set, &reset))
            .await
    }

    async fn forget_agent(&self, id: &str, tenant: Option<&str>) -> StoreResult<bool> {
        let (id, tenant) = (id.to_owned(), tenant.map(str::to_owned));
        self.write(move |conn, _| write_forget_agent(conn, &id, tenant.as_deref()))
            .await
    }

    async fn put_pack(&self, pack: PackVersionRow) -> StoreResult<PutPack> {
        self.write(move |conn, _| write_pack(conn, &pack)).await
    }

    /// Cancelling a cancelled pack keeps its first `cancelled_ns` (and
    /// cancels deliveries stored since). Cancelled deliveries get
    /// `updated_ns = at_ns` and an empty reason.
    async fn cancel_pack(&self, tenant: &str, pack: &str, at_ns: i64) -> StoreResult<PackRow> {
        let (tenant, pack) = (tenant.to_owned(), pack.to_owned());
        self.write(move |conn, _| write_cancel(conn, &tenant, &pack, at_ns))
            .await
    }

    async fn packs(&self, tenant: Option<&str>) -> StoreResult<Vec<PackRow>> {
        let tenant = tenant.map(str::to_owned);
        self.read(move |conn| {
            let select = "SELECT p.cancelled_ns, v.tenant, v.pack, v.version, v.yaml, v.targets, \
                 v.pushed_ns FROM packs p JOIN pack_versions v \
                 ON v.tenant = p.tenant AND v.pack = p.pack AND v.version = p.latest_version";
            match tenant {
                Some(t) => query_all(
                    conn,
                    &format!("{select} WHERE p.tenant = ?1 ORDER BY p.tenant, p.pack"),
                    [t],
                    decode_pack,
                ),
                None => query_all(
                    conn,
                    &format!("{select} ORDER BY p.tenant, p.pack"),
                    [],
                    decode_pack,
                ),
            }
        })
        .await
    }

    async fn pack_version(
        &self,
        tenant: &str,
        pack: &str,
        version: Option<u64>,
    ) -> StoreResult<Option<PackVersionRow>> {
        let (tenant, pack) = (tenant.to_owned(), pack.to_owned());
        // A version past i64::MAX cannot have been stored.
        let version = match version.map(i64::try_from).transpose() {
            Ok(v) => v,
            Err(_) => return Ok(None),
        };
        self.read(move |conn| {
            let rows = match version {
                Some(v) => query_all(
                    conn,
                    "SELECT tenant, pack, version, yaml, targets, pushed_ns FROM pack_versions \
                     WHERE tenant = ?1 AND pack = ?2 AND version = ?3",
                    params![tenant, pack, v],
                    decode_pack_version,
                ),
                None => query_all(
                    conn,
                    "SELECT v.tenant, v.pack, v.version, v.yaml, v.targets, v.pushed_ns \
                     FROM packs p JOIN pack_versions v \
                     ON v.tenant = p.tenant AND v.pack = p.pack AND v.version = p.latest_version \
                     WHERE p.tenant = ?1 AND p.pack = ?2",
                    params![tenant, pack],
                    decode_pack_version,
                ),
            };
            Ok(rows?.pop())
        })
        .await
    }

    /// The pack version must be stored (foreign key); the agent need not
    /// have connected yet.
    async fn put_delivery(&self, delivery: DeliveryRow) -> StoreResult<()> {
        self.write(move |conn, _| write_delivery(conn, &delivery))
            .await
    }

    async fn deliveries_of_pack(
        &self,
        tenant: &str,
        pack: &str,
        version: u64,
    ) -> StoreResult<Vec<DeliveryRow>> {
        let (tenant, pack) = (tenant.to_owned(), pack.to_owned());
        let Ok(version) = i64::try_from(version) else {
            return Ok(Vec::new());
        };
        self.read(move |conn| {
            let sql = format!(
                "SELECT {DELIVERY_COLUMNS} FROM deliveries \
                 WHERE tenant = ?1 AND pack = ?2 AND version = ?3 ORDER BY agent_id"
            );
            query_all(conn, &sql, params![tenant, pack, version], decode_delivery)
        })
        .await
    }

    /// By tenant, pack, version.
    /// One scan of `deliveries` (a few hundred thousand rows for a large
    /// fleet: milliseconds, once per scrape, on the read pool).
    async fn delivery_counts(&self) -> StoreResult<Vec<(DeliveryState, u64)>> {
        self.read(|conn| {
            query_all(
                conn,
                "SELECT state, COUNT(*) AS n FROM deliveries GROUP BY state",
                [],
                |row| {
                    let state: String = col(row, "state")?;
                    let n: i64 = col(row, "n")?;
                    let state = DeliveryState::parse(&state)
                        .ok_or_else(|| StoreError::Backend(format!("unknown state {state:?}")))?;
                    Ok((state, u64_from_db(n, "count")?))
                },
            )
        })
        .await
    }

    async fn deliveries_of_agent(&self, agent_id: &str) -> StoreResult<Vec<DeliveryRow>> {
        let agent_id = agent_id.to_owned();
        self.read(move |conn| {
            let sql = format!(
                "SELECT {DELIVERY_COLUMNS} FROM deliveries \
                 WHERE agent_id = ?1 ORDER BY tenant, pack, version"
            );
            query_all(conn, &sql, [agent_id], decode_delivery)
        })
        .await
    }

    /// All or nothing: a row that cannot be stored (a value past
    /// `i64::MAX`) fails the whole call and stores none of it.
    async fn put_feedback(&self, rows: Vec<FeedbackRow>) -> StoreResult<FeedbackStored> {
        if rows.is_empty() {
            return Ok(FeedbackStored::default());
        }
        self.write(move |conn, state| write_feedback(conn, state, &rows))
            .await
    }

    async fn feedback_acked(&self, agent_id: &str, journal_id: &str) -> StoreResult<u64> {
        let (agent_id, journal_id) = (agent_id.to_owned(), journal_id.to_owned());
        self.read(move |conn| {
            let max: i64 = conn
                .prepare_cached(
                    "SELECT COALESCE(MAX(seq), 0) FROM feedback \
                     WHERE agent_id = ?1 AND journal_id = ?2",
                )
                .and_then(|mut s| s.query_row([&agent_id, &journal_id], |r| r.get(0)))
                .ctx("read the acked feedback seq")?;
            u64_from_db(max, "feedback seq")
        })
        .await
    }

    async fn feedback(&self, filter: FeedbackFilter) -> StoreResult<Vec<FeedbackRow>> {
        self.read(move |conn| {
            let mut args: Vec<Value> = Vec::new();
            let mut clauses: Vec<String> = Vec::new();
            let mut add = |column: &str, op: &str, v: Value| {
                args.push(v);
                clauses.push(format!("{column} {op} ?{}", args.len()));
            };
            if let Some(t) = filter.tenant {
                add("tenant", "=", Value::Text(t));
            }
            if let Some(p) = filter.pack {
                add("pack", "=", Value::Text(p));
            }
            if let Some(a) = filter.agent_id {
                add("agent_id", "=", Value::Text(a));
            }
            if let Some(s) = filter.since_ns {
                add("received_ns", ">=", Value::Integer(s));
            }
            let mut sql = format!("SELECT {FEEDBACK_COLUMNS} FROM feedback");
            if !clauses.is_empty() {
                sql.push_str(" WHERE ");
                sql.push_str(&clauses.join(" AND "));
            }
            sql.push_str(" ORDER BY id");
            if let Some(limit) = filter.limit {
                args.push(Value::Integer(i64::from(limit)));
                sql.push_str(&format!(" LIMIT ?{}", args.len()));
            }
            query_all(
                conn,
                &sql,
                rusqlite::params_from_iter(args),
                decode_feedback,
            )
        })
        .await
    }

    /// Ids are assigned by the single writer (max + 1 in its transaction).
    async fn put_audit(&self, row: AuditRow) -> StoreResult<()> {
        self.write(move |conn, _| {
            conn.prepare_cached(
                "INSERT INTO audit (id, at_ns, who, tenant, role, action, target, result) \
                 SELECT COALESCE(MAX(id), 0) + 1, ?1, ?2, ?3, ?4, ?5, ?6, ?7 FROM audit",
            )
            .and_then(|mut st| {
                st.execute(params![
                    row.at_ns, row.who, row.tenant, row.role, row.action, row.target, row.result
                ])
            })
            .ctx("write an audit record")?;
            Ok(())
        })
        .await
    }

    async fn audit(
        &self,
        tenant: Option<&str>,
        since_ns: i64,
        limit: Option<u32>,
    ) -> StoreResult<Vec<AuditRow>> {
        let tenant = tenant.map(str::to_owned);
        self.read(move |conn| {
            // The newest `limit` rows, returned oldest first.
            let limit = limit.map_or(i64::MAX, i64::from);
            let sql = "SELECT at_ns, who, tenant, role, action, target, result FROM (\
                 SELECT * FROM audit WHERE at_ns >= ?1 AND (?2 IS NULL OR tenant = ?2) \
                 ORDER BY id DESC LIMIT ?3) AS newest ORDER BY at_ns, who";
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
        })
        .await
    }
}

#[cfg(test)]
mod tests;
