//! The embedded [`Store`](baton_store::Store): one SQLite file, `DIR/controller.db`.
//!
//! # Shape
//!
//! * **One writer** (`writer`): SQLite serialises writers
//!   anyway; a dedicated thread owns the only write connection, so nothing
//!   ever waits on a `SQLITE_BUSY` lock, and group-commits up to
//!   [`MAX_BATCH`] commands per transaction, each in its own savepoint.
//!   With `synchronous=FULL` one fsync covers the whole batch, which is
//!   what makes thousands of small feedback batches per second affordable.
//! * **Reads beside it.** WAL lets readers run while the writer commits.
//!   Reads take a connection from a small pool inside
//!   [`tokio::task::spawn_blocking`], so neither reads nor writes block
//!   the async runtime.
//!
//! * **Decisions on the writer.** The commands that decide what agents
//!   should hold ([`baton_model::planner`]) read what they need and write the
//!   rows they change inside the writer's transaction: two decisions never
//!   race (see [`baton_store`]).
//!
//! The SQL itself is shared with every engine ([`crate::sql`]);
//! this module holds what is SQLite's own: the writer thread, the read
//! pool, the `PRAGMA`s and `BEGIN IMMEDIATE`, and the connection as a
//! [`Db`].

mod conn;
#[cfg(test)]
mod tests;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior};

use super::migrations::{CREATE_SCHEMA_MIGRATIONS, Dialect, MIGRATIONS};
use super::sql::db::Db;
use super::sql::{Engine, off_runtime};
pub use super::writer::{BACKGROUND_WAIT, WriterStats};
use super::writer::{Batch, Batches, Writer};
use super::{Binding, StoreError, StoreResult};
use conn::Context;

crate::sql::store_impl::engine_store!(SqliteStore);

/// The database file's name inside the data directory.
pub const DB_FILE: &str = "controller.db";

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

/// The [`Store`](baton_store::Store) on an embedded SQLite database.
///
/// Cheap to clone (two `Arc`s); every clone talks to the same writer. When
/// the last clone is dropped, the writer commits what is queued, stops,
/// and is joined.
#[derive(Clone)]
pub struct SqliteStore {
    writer: Arc<Writer<Connection>>,
    readers: Arc<ReadPool>,
    binding: Binding,
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
            .map_err(|e| StoreError::unavailable(format!("create {}", dir.display()), e))?;
        let path = dir.join(DB_FILE);
        let mut conn = Connection::open(&path)
            .map_err(|e| StoreError::unavailable(format!("open {}", path.display()), e))?;
        configure_writer(&conn)?;
        migrate(&mut conn)?;
        let readers = Arc::new(ReadPool {
            path: path.clone(),
            idle: Mutex::new(Vec::new()),
        });
        // Fail now, not on the first read, if a reader cannot open.
        readers.with(|_| Ok(()))?;

        let writer = Writer::start("store-writer", SqliteBatches(conn), MAX_BATCH)?;
        Ok(SqliteStore {
            writer: Arc::new(writer),
            readers,
            binding,
        })
    }

    /// What the writer has committed so far.
    pub fn stats(&self) -> WriterStats {
        self.writer.stats()
    }

    /// Stops the writer once everything queued before this call is
    /// committed; later writes (from any clone) fail with
    /// [`StoreError::Closed`]. Reads keep working. For an orderly shutdown
    /// that does not depend on when the last clone is dropped.
    pub async fn close(&self) {
        self.writer.close().await;
    }

    /// [`Engine::write`] on the connection itself (tests reach under the
    /// shared SQL: pragmas, raw statements).
    #[cfg(test)]
    async fn write_raw<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnMut(&Connection) -> StoreResult<T> + Send + 'static,
    {
        self.writer.write(f).await
    }

    /// [`Engine::read`] on the connection itself.
    #[cfg(test)]
    async fn read_raw<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnMut(&Connection) -> StoreResult<T> + Send + 'static,
    {
        let pool = Arc::clone(&self.readers);
        off_runtime(move || pool.with(f)).await
    }

    /// Commands waiting for the writer (tests drive batching with it).
    #[cfg(test)]
    fn queued(&self) -> usize {
        self.writer.queued()
    }
}

impl Engine for SqliteStore {
    fn binding(&self) -> Binding {
        self.binding
    }

    /// Inside the next batch's transaction on the writer thread.
    async fn write<T, F>(&self, mut f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnMut(&dyn Db) -> StoreResult<T> + Send + 'static,
    {
        self.writer.write(move |c: &Connection| f(c)).await
    }

    /// Joins the next batch of other writes (at most one such command per
    /// batch), or runs alone after [`BACKGROUND_WAIT`] without any. So
    /// retention's deletes never add a commit, an fsync, to a busy store.
    async fn write_background<T, F>(&self, mut f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnMut(&dyn Db) -> StoreResult<T> + Send + 'static,
    {
        self.writer
            .write_background(move |c: &Connection| f(c))
            .await
    }

    /// On a pooled read connection, in `spawn_blocking`.
    async fn read<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: Fn(&dyn Db) -> StoreResult<T> + Send + 'static,
    {
        let pool = Arc::clone(&self.readers);
        off_runtime(move || pool.with(|c| f(c))).await
    }
}

// ---------------------------------------------------------------------------
// Batches.

/// The write connection, running the writer's batches.
struct SqliteBatches(Connection);

impl Batches<Connection> for SqliteBatches {
    fn run(&mut self, batch: &mut Batch<Connection>) -> StoreResult<()> {
        execute_batch(&self.0, batch)
    }

    fn recover(&mut self) -> bool {
        if !self.0.is_autocommit()
            && let Err(re) = self.0.execute_batch("ROLLBACK")
        {
            tracing::error!(error = %re, "store: rollback failed; the writer stops");
            return false;
        }
        true
    }

    fn close(self) {
        if let Err((_, e)) = self.0.close() {
            tracing::warn!(error = %e, "store: closing the write connection");
        }
    }
}

fn execute_batch(conn: &Connection, batch: &mut Batch<Connection>) -> StoreResult<()> {
    let step = |sql: &str| -> StoreResult<()> {
        conn.prepare_cached(sql)
            .and_then(|mut s| s.execute([]))
            .map(drop)
            .map_err(|e| StoreError::unavailable(format!("write batch not committed ({sql})"), e))
    };
    step("BEGIN IMMEDIATE")?;
    for job in batch.iter_mut() {
        step("SAVEPOINT job")?;
        let status = job.run(conn);
        if conn.is_autocommit() {
            // SQLite rolls the whole transaction back on some errors (I/O,
            // disk full): the commands before this one are lost too.
            let cause = if status.is_err() {
                "the command failed"
            } else {
                "no error reported"
            };
            return Err(StoreError::unavailable(
                "write batch rolled back by the database; nothing in it was stored",
                cause,
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
        return Err(StoreError::Unusable(format!(
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
    .map_err(|e| StoreError::unavailable(format!("open {} for reading", path.display()), e))?;
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
        return Err(StoreError::Unusable(format!(
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
            tx.execute_batch(&m.sql_for(Dialect::Sqlite)).map_err(|e| {
                StoreError::unavailable(format!("apply migration v{}", m.version), e)
            })?;
            super::migrations::after(&*tx, m.version, Dialect::Sqlite)?;
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
