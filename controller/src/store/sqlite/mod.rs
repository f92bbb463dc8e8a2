//! The embedded [`Store`](crate::store::Store): one SQLite file, `DIR/controller.db`.
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
//! * **Decisions on the writer.** The commands that decide what agents
//!   should hold ([`crate::planner`]) read what they need and write the
//!   rows they change inside the writer's transaction: two decisions never
//!   race (see [`crate::store`]).
//!
//! The SQL itself is shared with every engine ([`crate::store::sql`]);
//! this module holds what is SQLite's own: the writer thread, the read
//! pool, the `PRAGMA`s and `BEGIN IMMEDIATE`, and the connection as a
//! [`Db`].

mod conn;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior};
use tokio::sync::{mpsc, oneshot};

use super::migrations::{CREATE_SCHEMA_MIGRATIONS, Dialect, MIGRATIONS};
use super::sql::Engine;
use super::sql::codec::{self, backend};
use super::sql::db::{self, Db};
use super::{Binding, StoreError, StoreResult};
use conn::Context;

/// The database file's name inside the data directory.
pub const DB_FILE: &str = "controller.db";

/// Commands that may wait for the writer. Past this, senders wait
/// (back-pressure) rather than queue without bound.
const QUEUE_DEPTH: usize = 1024;

/// How long background work (retention) waits for other writes to share
/// a commit with before it runs alone.
pub const BACKGROUND_WAIT: Duration = Duration::from_millis(50);

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

/// The [`Store`](crate::store::Store) on an embedded SQLite database.
///
/// Cheap to clone (two `Arc`s); every clone talks to the same writer. When
/// the last clone is dropped, the writer commits what is queued, stops,
/// and is joined.
#[derive(Clone)]
pub struct SqliteStore {
    writer: Arc<Writer>,
    readers: Arc<ReadPool>,
    binding: Binding,
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
    /// brings its schema up to date and starts the writer thread; its
    /// decisions follow `binding`.
    ///
    /// Blocking: call it before serving, or from `spawn_blocking`.
    /// Refuses a database whose schema is newer than this build knows.
    pub fn open(dir: &Path, binding: Binding) -> StoreResult<SqliteStore> {
        std::fs::create_dir_all(dir)
            .map_err(|e| backend(&format!("create {}", dir.display()), e))?;
        let path = dir.join(DB_FILE);
        let mut conn =
            Connection::open(&path).map_err(|e| backend(&format!("open {}", path.display()), e))?;
        configure_writer(&conn)?;
        migrate(&mut conn)?;
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
            .spawn(move || writer_loop(conn, rx, &thread_stats))
            .map_err(|e| backend("start the store writer thread", e))?;
        Ok(SqliteStore {
            writer: Arc::new(Writer {
                tx: Some(tx),
                thread: Some(thread),
                stats,
            }),
            readers,
            binding,
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

    /// Queues `f` for the writer as `kind` and waits for its answer.
    async fn submit<T, F>(&self, kind: fn(Box<dyn Job>) -> Msg, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<T> + Send + 'static,
    {
        let tx = self.writer.tx.as_ref().ok_or(StoreError::Closed)?;
        let (reply, answer) = oneshot::channel();
        let job = Box::new(Call {
            f: Some(f),
            out: None,
            reply,
        });
        tx.send(kind(job)).await.map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// [`Engine::write`] on the connection itself (tests reach under the
    /// shared SQL: pragmas, raw statements).
    #[cfg(test)]
    async fn write_raw<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<T> + Send + 'static,
    {
        self.submit(Msg::Job, f).await
    }

    /// [`Engine::read`] on the connection itself.
    #[cfg(test)]
    async fn read_raw<T, F>(&self, f: F) -> StoreResult<T>
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

impl Engine for SqliteStore {
    fn binding(&self) -> Binding {
        self.binding
    }

    /// Inside the next batch's transaction on the writer thread.
    async fn write<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&dyn Db) -> StoreResult<T> + Send + 'static,
    {
        self.submit(Msg::Job, move |c: &Connection| f(c)).await
    }

    /// Joins the next batch of other writes (at most one such command per
    /// batch), or runs alone after [`BACKGROUND_WAIT`] without any. So
    /// retention's deletes never add a commit, an fsync, to a busy store.
    async fn write_background<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&dyn Db) -> StoreResult<T> + Send + 'static,
    {
        self.submit(Msg::Background, move |c: &Connection| f(c))
            .await
    }

    /// On a pooled read connection, in `spawn_blocking`.
    async fn read<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&dyn Db) -> StoreResult<T> + Send + 'static,
    {
        let pool = Arc::clone(&self.readers);
        tokio::task::spawn_blocking(move || pool.with(|c| f(c)))
            .await
            .map_err(|e| backend("read task", e))?
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

enum Msg {
    Job(Box<dyn Job>),
    /// Work that need not be fast (retention): it rides the next commit of
    /// other writes instead of costing a commit (an fsync) of its own.
    Background(Box<dyn Job>),
    /// Stop after the commands queued before this one; answer when done.
    Close(oneshot::Sender<()>),
}

/// A write command, type-erased so one channel carries them all.
trait Job: Send {
    /// Runs inside the batch transaction; `Err` (its error, as text) if
    /// it failed, and its savepoint is then rolled back.
    fn run(&mut self, conn: &Connection) -> Result<(), String>;
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
    F: FnOnce(&Connection) -> StoreResult<T> + Send,
{
    fn run(&mut self, conn: &Connection) -> Result<(), String> {
        let out = match self.f.take() {
            Some(f) => f(conn),
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

fn writer_loop(conn: Connection, mut rx: mpsc::Receiver<Msg>, stats: &Stats) {
    let mut msgs: Vec<Msg> = Vec::with_capacity(MAX_BATCH);
    let mut batch: Vec<Box<dyn Job>> = Vec::with_capacity(MAX_BATCH);
    let mut parked: VecDeque<Box<dyn Job>> = VecDeque::new();
    let mut closing: Option<oneshot::Sender<()>> = None;
    let mut alive = true;
    while alive && closing.is_none() {
        let waited = !parked.is_empty();
        let got = if parked.is_empty() {
            rx.blocking_recv_many(&mut msgs, MAX_BATCH)
        } else {
            recv_within(&mut rx, &mut msgs, BACKGROUND_WAIT)
        };
        if got == 0 && parked.is_empty() {
            break; // every handle is gone and the queue is empty
        }
        // Nothing else came within the wait: a background command runs
        // alone.
        let alone = waited && got == 0;
        for msg in msgs.drain(..) {
            match msg {
                Msg::Job(job) if closing.is_none() => batch.push(job),
                Msg::Background(job) if closing.is_none() => parked.push_back(job),
                // Queued after a close: dropped, its caller gets `Closed`.
                Msg::Job(_) | Msg::Background(_) => {}
                Msg::Close(reply) => closing = closing.or(Some(reply)),
            }
        }
        // One background command rides each commit of other writes, or
        // runs alone once nothing else came within the wait.
        if (!batch.is_empty() || alone)
            && let Some(job) = parked.pop_front()
        {
            batch.push(job);
        }
        if !batch.is_empty() {
            alive = run_batch(&conn, &mut batch, stats);
        }
    }
    // Refuse what is still queued (its callers see `Closed`) and anything
    // sent later.
    drop(parked);
    drop(rx);
    if let Err((_, e)) = conn.close() {
        tracing::warn!(error = %e, "store: closing the write connection");
    }
    if let Some(reply) = closing {
        let _ = reply.send(());
    }
}

/// Like `blocking_recv_many`, but gives up after `wait` (0: nothing came,
/// or every sender is gone). Polls: it runs only while background work
/// waits for company, never on an idle store.
fn recv_within(rx: &mut mpsc::Receiver<Msg>, msgs: &mut Vec<Msg>, wait: Duration) -> usize {
    let deadline = std::time::Instant::now() + wait;
    loop {
        match rx.try_recv() {
            Ok(m) => {
                msgs.push(m);
                while msgs.len() < MAX_BATCH {
                    match rx.try_recv() {
                        Ok(m) => msgs.push(m),
                        Err(_) => break,
                    }
                }
                return msgs.len();
            }
            Err(mpsc::error::TryRecvError::Disconnected) => return 0,
            Err(mpsc::error::TryRecvError::Empty) => {
                if std::time::Instant::now() >= deadline {
                    return 0;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }
}

/// Commits one batch and answers its callers. Returns whether the writer
/// can go on (`false`: the connection is in a state it cannot recover).
fn run_batch(conn: &Connection, batch: &mut Vec<Box<dyn Job>>, stats: &Stats) -> bool {
    let outcome = execute_batch(conn, batch);
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

fn execute_batch(conn: &Connection, batch: &mut [Box<dyn Job>]) -> Result<(), String> {
    let step = |sql: &str| -> Result<(), String> {
        conn.prepare_cached(sql)
            .and_then(|mut s| s.execute([]))
            .map(drop)
            .map_err(|e| format!("write batch not committed ({sql}): {e}"))
    };
    step("BEGIN IMMEDIATE")?;
    for job in batch.iter_mut() {
        step("SAVEPOINT job")?;
        let status = job.run(conn);
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
    migrate_to(conn, i64::MAX)
}

/// [`migrate`], stopping after schema version `last` (tests build an
/// older database with it).
fn migrate_to(conn: &mut Connection, last: i64) -> StoreResult<()> {
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
    for m in MIGRATIONS.iter().filter(|m| m.version <= last) {
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
            tx.execute_batch(&m.sql_for(Dialect::Sqlite))
                .map_err(|e| backend(&format!("apply migration v{}", m.version), e))?;
            after_migration(&tx, m.version)?;
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

/// What a migration needs beyond its SQL, in its transaction.
fn after_migration(conn: &Connection, version: i64) -> StoreResult<()> {
    if version == 5 {
        // The agents stored before v5 have their own labels in `labels`
        // only: without their `agent_own_labels` rows a push by label
        // would not find them until their next hello.
        let agents = db::query_all(conn, "SELECT id, labels FROM agents", &[], |r| {
            Ok((db::col::<String>(r, "id")?, db::col::<String>(r, "labels")?))
        })?;
        for (id, labels) in agents {
            let labels: std::collections::BTreeMap<String, String> = codec::with_row(
                format_args!("agent {id}"),
                codec::from_json(&labels, "labels"),
            )?;
            for (k, v) in &labels {
                conn.execute(
                    "INSERT INTO agent_own_labels (agent_id, key, value) VALUES (?1, ?2, ?3)",
                    rusqlite::params![id, k, v],
                )
                .ctx("fill an agent's own labels")?;
            }
        }
    }
    Ok(())
}
