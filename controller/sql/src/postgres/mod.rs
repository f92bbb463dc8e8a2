//! The [`Store`](baton_store::Store) on PostgreSQL, for controllers that
//! share one database (replicas) or that must not depend on one machine's
//! disk.
//!
//! # Shape
//!
//! * **The same SQL** as the embedded store ([`crate::sql`]): the
//!   writer on the sync `postgres` client, a thread like SQLite's
//!   (`writer`'s group commit); reads ([`reads`]) at most
//!   [`Target::readers`] at once, each once its turn came (a read waiting
//!   holds no thread and no connection), on the asynchronous client over
//!   a few shared connections, pipelined. Every read's SQL and decoder
//!   are shared with SQLite through the synchronous [`crate::sql::db::Db`],
//!   so a read runs on a blocking thread that waits for the client's
//!   answers: the hop costs microseconds against a round trip's hundreds.
//! * **What agents' streams write** (feedback, clock reports, last-seen
//!   marks) goes on a lane of its own ([`ingest`]): many agents' writes in
//!   one transaction of a few statements. Beside the writer and the lane,
//!   a listener ([`news`]) hears the other replicas' commits, and
//!   [`partitions`] keeps the days of feedback and clock history.
//! * **Replicas write in parallel**, in READ COMMITTED: no lock is shared
//!   by every write. A decision holds the transaction-scoped advisory
//!   locks of what it decides about (`baton_store::decide`'s locks: the
//!   agent, its packs' tenants), so two decisions that could plan the
//!   same pair wait for each other and the later reads the earlier's
//!   rows; a stream's writes are fenced by its agent's generation. Ids
//!   are then not in commit order: followers read events and feedback by
//!   (transaction, id) below the oldest running transaction
//!   (`sql::events::follow_page`). A job the database aborts for a
//!   deadlock runs again in its batch.
//! * **Batches are smaller** ([`MAX_BATCH`]): each command runs in a
//!   savepoint, and past 64 subtransactions in one transaction PostgreSQL
//!   slows every session's snapshots.
//! * **Text order is bytes**: the database must use the `C` collation
//!   (paging by id and the order of lists are the embedded store's);
//!   [`PgStore::open`] refuses another.
//! * **A lost connection** fails the batch it broke (its callers see the
//!   error, nothing of it is committed) and the writer reconnects before
//!   the next one.

mod conn;
pub mod import;
pub mod ingest;
mod lease;
mod news;
pub mod partitions;
mod reads;

use std::fmt;
use std::sync::Arc;

use postgres::{Client, NoTls};
use rustls_pki_types::pem::PemObject;
use tokio_postgres_rustls::MakeRustlsConnect;

use super::migrations::{CREATE_SCHEMA_MIGRATIONS, Dialect, MIGRATIONS};
use super::sql::db::{Db, col, params, query_first, run};
use super::sql::{Engine, off_runtime};
pub use super::writer::WriterStats;
use super::writer::{Batch, Batches, Writer};
use super::{Binding, StoreError, StoreResult};
use conn::{PgConn, detailed};

crate::sql::store_impl::engine_store!(PgStore);
use lease::Lease;
pub use lease::LeaseConfig;

/// Commands per transaction at most (see the module doc).
pub const MAX_BATCH: usize = 64;

/// The advisory lock migrations run under (replicas starting together).
const MIGRATION_LOCK: i64 = 0x6261_746f_6e4d; // "batonM"

/// Reads running at once on one replica, unless its target says
/// otherwise ([`Target::readers`]): each holds a blocking thread while it
/// runs; more wait for one to end.
pub const DEFAULT_READERS: usize = 8;

/// Connections a replica's reads share, unless its target says otherwise
/// ([`Target::read_connections`]): each a PostgreSQL backend process (a
/// few MB of the server's memory). As many as reads at once by default:
/// with two, the reads' statements pipelined behind each other, the fleet
/// bench's push p99 on replicas went from 190–240 ms to 270–340 (one
/// server process each serving a connection's queue in turn, beside the
/// agents' own writes), where the read bench gained only 0.9–1.1× against
/// 0.8–0.9× (`docs/bench/fleet.md`).
pub const DEFAULT_READ_CONNECTIONS: usize = 8;

/// The store on a PostgreSQL database. Cheap to clone; every clone talks
/// to the same writer.
#[derive(Clone)]
pub struct PgStore {
    writer: Arc<Writer<PgConn>>,
    /// What many streams write (feedback, clocks, marks), together, on
    /// connections of its own.
    ingest: Arc<ingest::Lane>,
    /// Other replicas' commits, heard (a follower's wake-up).
    news: Arc<news::News>,
    /// Tells the other replicas' listeners of this one's commits.
    notifier: Arc<news::Notifier>,
    /// Day partitions made ahead, and dropped by retention.
    partitions: Arc<partitions::Partitions>,
    readers: Arc<reads::Reads>,
    binding: Binding,
    lease: Arc<Lease>,
}

impl fmt::Debug for PgStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgStore")
            .field("stats", &self.writer.stats())
            .finish_non_exhaustive()
    }
}

fn backend(what: &str, e: &postgres::Error) -> StoreError {
    StoreError::unavailable(what, detailed(e))
}

/// Where the database is and how to reach it: plaintext, or TLS (rustls)
/// checked against a CA the operator names. Cheap to clone.
#[derive(Clone)]
pub struct Target {
    config: postgres::Config,
    /// The same, for the asynchronous client ([`reads`]).
    async_config: tokio_postgres::Config,
    tls: Option<MakeRustlsConnect>,
    readers: usize,
    read_connections: usize,
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the configuration: it may hold a password.
        f.debug_struct("Target")
            .field("tls", &self.tls.is_some())
            .field("readers", &self.readers)
            .field("read_connections", &self.read_connections)
            .finish_non_exhaustive()
    }
}

impl Target {
    /// `url` (`postgres://…` or `host=… dbname=…`), with TLS when `ca` (a
    /// PEM file of the CA that signed the database's certificate) is
    /// given: then TLS is required (`sslmode=require`, whatever the URL
    /// says) and the certificate must be the host's and chain to `ca`.
    /// A URL asking for TLS without `ca` is refused rather than trusted
    /// blindly.
    pub fn new(url: &str, ca: Option<&std::path::Path>) -> StoreResult<Target> {
        let mut config: postgres::Config = url.parse().map_err(|e| {
            StoreError::Unusable(format!("the store URL is not a PostgreSQL URL: {e}"))
        })?;
        let mut async_config: tokio_postgres::Config = url.parse().map_err(|e| {
            StoreError::Unusable(format!("the store URL is not a PostgreSQL URL: {e}"))
        })?;
        let tls = match ca {
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                let certs = rustls_pki_types::CertificateDer::pem_file_iter(ca).map_err(|e| {
                    StoreError::Unusable(format!("--store-ca {}: {e}", ca.display()))
                })?;
                for c in certs {
                    let c = c.map_err(|e| {
                        StoreError::Unusable(format!("--store-ca {}: {e}", ca.display()))
                    })?;
                    roots.add(c).map_err(|e| {
                        StoreError::Unusable(format!("--store-ca {}: {e}", ca.display()))
                    })?;
                }
                if roots.is_empty() {
                    return Err(StoreError::Unusable(format!(
                        "--store-ca {}: no certificate in it",
                        ca.display()
                    )));
                }
                let client = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
                    rustls::crypto::ring::default_provider(),
                ))
                .with_safe_default_protocol_versions()
                .map_err(|e| StoreError::Unusable(format!("TLS to the store: {e}")))?
                .with_root_certificates(roots)
                .with_no_client_auth();
                config.ssl_mode(postgres::config::SslMode::Require);
                async_config.ssl_mode(postgres::config::SslMode::Require);
                Some(MakeRustlsConnect::new(client))
            }
            None => {
                if config.get_ssl_mode() == postgres::config::SslMode::Require {
                    return Err(StoreError::Unusable(
                        "the store URL requires TLS: name the CA that signed the database's \
                         certificate with --store-ca FILE"
                            .into(),
                    ));
                }
                config.ssl_mode(postgres::config::SslMode::Disable);
                async_config.ssl_mode(postgres::config::SslMode::Disable);
                None
            }
        };
        Ok(Target {
            config,
            async_config,
            tls,
            readers: DEFAULT_READERS,
            read_connections: DEFAULT_READ_CONNECTIONS,
        })
    }

    /// Where it is, as `host:port` (each of several, comma-separated),
    /// never with the user or the password: for messages.
    pub fn address(&self) -> String {
        let ports = self.config.get_ports();
        self.config
            .get_hosts()
            .iter()
            .enumerate()
            .map(|(i, h)| {
                let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
                match h {
                    postgres::config::Host::Tcp(name) => format!("{name}:{port}"),
                    postgres::config::Host::Unix(dir) => format!("{}:{port}", dir.display()),
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// At most `n` reads at once (at least 1), instead of
    /// [`DEFAULT_READERS`].
    pub fn readers(mut self, n: usize) -> Target {
        self.readers = n.max(1);
        self
    }

    /// Reads share `n` connections (at least 1, at most one per read at
    /// once), instead of [`DEFAULT_READ_CONNECTIONS`]: fewer spare the
    /// server processes, and a read then waits behind those sent before it
    /// on its connection.
    pub fn read_connections(mut self, n: usize) -> Target {
        self.read_connections = n.max(1);
        self
    }
}

fn connect(target: &Target) -> StoreResult<Client> {
    let r = match &target.tls {
        Some(tls) => target.config.connect(tls.clone()),
        None => target.config.connect(NoTls),
    };
    r.map_err(|e| {
        StoreError::unavailable(
            format!("connect to PostgreSQL at {}", target.address()),
            detailed(&e),
        )
    })
}

impl PgStore {
    /// Connects to `target`, brings
    /// the schema up to date (under a lock, so replicas starting together
    /// do not both migrate) and starts the writer.
    ///
    /// Blocking: call it before the async runtime serves, or from
    /// `spawn_blocking`. Refuses a database whose schema is newer than
    /// this build knows, or whose text collation is not `C`.
    pub fn open(target: &Target, binding: Binding) -> StoreResult<PgStore> {
        PgStore::open_replica(target, binding, LeaseConfig::new(LeaseConfig::unique_id()))
    }

    /// [`PgStore::open`] as the replica `lease` names: its lease is taken
    /// (at the next epoch) before anything is written, and every write
    /// batch commits only while it is live.
    pub fn open_replica(
        target: &Target,
        binding: Binding,
        lease: LeaseConfig,
    ) -> StoreResult<PgStore> {
        let conn = PgConn::new(connect(target)?);
        check_collation(&conn)?;
        migrate(&conn)?;
        let idle_limit = lease.ttl;
        let lease = Arc::new(Lease::start(&conn, target, lease)?);
        bound_idle_transactions(&conn, idle_limit)?;
        let readers = Arc::new(reads::Reads::new(target.clone()));
        let batches = PgBatches {
            target: target.clone(),
            conn: Some(conn),
            lease: Arc::clone(&lease),
            open: false,
            idle_limit,
        };
        let writer = Writer::start("store-writer", batches, MAX_BATCH)?;
        let notifier = Arc::new(news::Notifier::start(target.clone())?);
        let ingest = ingest::Lane::start(
            target.clone(),
            Arc::clone(&lease),
            idle_limit,
            Arc::clone(&notifier),
        )?;
        let news = news::News::start(target.clone())?;
        let partitions = partitions::Partitions::start(target.clone())?;
        Ok(PgStore {
            writer: Arc::new(writer),
            ingest: Arc::new(ingest),
            news: Arc::new(news),
            notifier,
            partitions,
            readers,
            binding,
            lease,
        })
    }

    /// Reads running and reads waiting for a turn, now.
    pub fn reads(&self) -> (usize, usize) {
        self.readers.now()
    }

    /// What the streams' lane has committed so far.
    pub fn ingest_stats(&self) -> ingest::IngestStats {
        self.ingest.stats()
    }

    /// Becomes `true`, for good, when this replica's lease is lost: it
    /// writes nothing more and must stop serving.
    pub fn lease_lost(&self) -> tokio::sync::watch::Receiver<bool> {
        self.lease.lost()
    }

    /// The replica id and epoch this store writes as.
    pub fn replica(&self) -> (String, i64) {
        let o = self.lease.owner();
        (o.replica.clone(), o.epoch)
    }

    /// What the writer has committed so far.
    pub fn stats(&self) -> WriterStats {
        self.writer.stats()
    }

    /// Stops the writer once everything queued before this call is
    /// committed; later writes fail with [`StoreError::Closed`].
    pub async fn close(&self) {
        self.writer.close().await;
    }
}

impl Engine for PgStore {
    fn binding(&self) -> Binding {
        self.binding
    }

    fn replicated(&self) -> bool {
        true
    }

    fn owner(&self) -> crate::sql::agents::Owner {
        self.lease.owner().clone()
    }

    fn lease_clock(&self) -> crate::sql::LeaseClock {
        lease::db_now_us
    }

    fn horizon(&self) -> crate::sql::Horizon {
        |db| {
            query_first(
                db,
                "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint AS h",
                &[],
                |r| col(r, "h"),
            )
        }
    }

    fn locks(&self) -> bool {
        true
    }

    // The streams' writes go through the lane: many streams' batches in
    // one transaction of a few statements.
    fn stream_feedback(
        &self,
        session: u64,
        rows: Vec<baton_model::FeedbackRow>,
    ) -> impl std::future::Future<Output = StoreResult<baton_store::FeedbackStored>> + Send {
        self.ingest.put(session, rows)
    }

    fn stream_clock(
        &self,
        id: &str,
        session: u64,
        clock: baton_store::ClockRow,
    ) -> impl std::future::Future<Output = StoreResult<()>> + Send {
        self.ingest.clock(id, session, clock)
    }

    fn stream_seen(
        &self,
        id: &str,
        session: u64,
        seen: baton_model::SeenRow,
    ) -> impl std::future::Future<Output = StoreResult<()>> + Send {
        self.ingest.seen(id, session, seen)
    }

    fn partitioned(&self) -> bool {
        true
    }

    async fn drop_partitions_before(
        &self,
        what: baton_store::Grows,
        before: baton_model::RefTime,
    ) -> StoreResult<u64> {
        let Some(t) = partitions::Parted::of(what) else {
            return Ok(0);
        };
        let p = Arc::clone(&self.partitions);
        off_runtime(move || p.with(|c| partitions::drop_before(c, t, before.as_nanos()))).await
    }

    async fn news(&self, at_most: std::time::Duration) {
        self.news.wait(at_most).await;
    }

    fn told(&self) {
        self.notifier.poke();
    }

    async fn write<T, F>(&self, mut f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnMut(&dyn Db) -> StoreResult<T> + Send + 'static,
    {
        self.writer.write(move |c: &PgConn| f(c)).await
    }

    async fn write_background<T, F>(&self, mut f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnMut(&dyn Db) -> StoreResult<T> + Send + 'static,
    {
        self.writer.write_background(move |c: &PgConn| f(c)).await
    }

    async fn read<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: Fn(&dyn Db) -> StoreResult<T> + Send + 'static,
    {
        self.readers.run(f).await
    }
}

/// The writer's connection (reopened after it is lost).
struct PgBatches {
    target: Target,
    conn: Option<PgConn>,
    lease: Arc<Lease>,
    /// A transaction was begun on `conn` and not ended (`recover` rolls
    /// it back).
    open: bool,
    /// How long the server lets a batch's transaction sit idle (the
    /// lease's length; see [`bound_idle_transactions`]).
    idle_limit: std::time::Duration,
}

/// A writer's transaction left idle longer than `limit` (its replica
/// paused mid-batch, SIGSTOP) is ended by the server, and the locks it
/// held with it: the other replicas' decisions and hellos wait at most
/// that long for a paused one, which then loses its lease and writes
/// nothing when it wakes.
fn bound_idle_transactions(conn: &PgConn, limit: std::time::Duration) -> StoreResult<()> {
    let ms = limit.as_millis().max(1);
    conn.batch(&format!("SET idle_in_transaction_session_timeout = {ms}"))
        .map_err(|e| backend("bound idle transactions", &e))
}

/// Times a job the database aborted for a conflicting transaction (a
/// deadlock among decisions' locks) is run again in the same batch.
const CONTENDED_RUNS: usize = 3;

/// One job in its savepoint; run again (its savepoint rolled back first)
/// while the database aborts it for a conflicting transaction, at most
/// [`CONTENDED_RUNS`] times; a job that fails otherwise leaves no trace.
fn run_job(
    job: &mut dyn crate::writer::Job<PgConn>,
    conn: &PgConn,
    step: &dyn Fn(&str) -> StoreResult<()>,
) -> StoreResult<()> {
    for _ in 0..CONTENDED_RUNS {
        step("SAVEPOINT job")?;
        match job.run(conn) {
            Ok(()) => return step("RELEASE SAVEPOINT job"),
            Err(contended) => {
                step("ROLLBACK TO SAVEPOINT job")?;
                step("RELEASE SAVEPOINT job")?;
                if !contended {
                    return Ok(());
                }
            }
        }
    }
    Ok(())
}

impl Batches<PgConn> for PgBatches {
    fn run(&mut self, batch: &mut Batch<PgConn>) -> StoreResult<()> {
        if self.lease.is_lost() {
            return Err(StoreError::LeaseLost(
                "this replica writes nothing more".into(),
            ));
        }
        if self.conn.as_ref().is_none_or(PgConn::is_closed) {
            self.conn = None;
            let c = PgConn::new(connect(&self.target)?);
            bound_idle_transactions(&c, self.idle_limit)?;
            tracing::info!("store: reconnected to PostgreSQL");
            self.conn = Some(c);
        }
        let conn = self
            .conn
            .as_ref()
            .ok_or_else(|| StoreError::unavailable("write batch", "no PostgreSQL connection"))?;
        let step = |sql: &str| {
            conn.batch(sql).map_err(|e| {
                StoreError::unavailable(format!("write batch not committed ({sql})"), detailed(&e))
            })
        };
        // A batch that fails from here on is rolled back by `recover`.
        // READ COMMITTED (the default): each statement sees what was
        // committed before it. No lock is shared by every batch: replicas
        // write in parallel; decisions take the locks of what they decide
        // about (`sql::tx`), and a stream's writes are fenced by its
        // agent's generation.
        self.open = true;
        step("BEGIN")?;
        for job in batch.iter_mut() {
            run_job(job.as_mut(), conn, &step)?;
        }
        // Last, on the database's clock: a replica paused past its lease
        // commits nothing when it wakes (see `lease`); one paused inside
        // the batch loses its connection to the server's idle-in-
        // transaction timeout (`connect`), and its locks with it.
        match lease::is_live(conn, self.lease.owner()) {
            Ok(true) => {}
            Ok(false) => {
                let e = StoreError::LeaseLost("it ran out before this write batch".into());
                self.lease.mark_lost(&e.to_string());
                return Err(e);
            }
            Err(e) => return Err(e),
        }
        step("COMMIT")?;
        self.open = false;
        Ok(())
    }

    fn recover(&mut self) -> bool {
        // Whatever the batch left open is rolled back; a lost connection
        // is reopened by the next batch.
        let open = std::mem::take(&mut self.open);
        if let Some(c) = &self.conn
            && open
            && !c.is_closed()
            && let Err(e) = c.batch("ROLLBACK")
        {
            tracing::warn!(error = %detailed(&e), "store: rollback after a failed batch");
            self.conn = None;
        }
        true
    }

    fn close(self) {
        if let Some(c) = self.conn
            && let Err(e) = c.close()
        {
            tracing::warn!(error = %detailed(&e), "store: closing the write connection");
        }
    }
}

/// Text is compared and ordered byte-wise only under `C` (or `POSIX`).
fn check_collation(conn: &PgConn) -> StoreResult<()> {
    let collation: Option<String> = query_first(
        conn,
        "SELECT datcollate::text AS collation FROM pg_database WHERE datname = current_database()",
        &[],
        |r| col(r, "collation"),
    )?;
    match collation.as_deref() {
        Some("C" | "POSIX") => Ok(()),
        other => Err(StoreError::Unusable(format!(
            "the database's collation is {other:?}, not \"C\": lists and pages would not be in the \
             byte order the store relies on; create it with \
             CREATE DATABASE … TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'"
        ))),
    }
}

/// Applies the migrations this database lacks, each in its own
/// transaction, under a session lock (replicas starting together).
fn migrate(conn: &PgConn) -> StoreResult<()> {
    let lock = |sql: &str| run(conn, "the migration lock", sql, params![MIGRATION_LOCK]);
    lock("SELECT pg_advisory_lock(?1)")?;
    let out = migrate_locked(conn);
    let unlocked = lock("SELECT pg_advisory_unlock(?1)");
    out?;
    unlocked?;
    Ok(())
}

fn migrate_locked(conn: &PgConn) -> StoreResult<()> {
    migrate_up_to(conn, i64::MAX)
}

/// Applies every migration not applied yet up to version `last`
/// (tests stop short of the newest, to migrate stored rows).
fn migrate_up_to(conn: &PgConn, last: i64) -> StoreResult<()> {
    conn.batch(CREATE_SCHEMA_MIGRATIONS)
        .map_err(|e| backend("create schema_migrations", &e))?;
    let newest: i64 = query_first(
        conn,
        "SELECT COALESCE(MAX(version), 0) AS newest FROM schema_migrations",
        &[],
        |r| col(r, "newest"),
    )?
    .unwrap_or(0);
    let known = MIGRATIONS.last().map_or(0, |m| m.version);
    if newest > known {
        return Err(StoreError::Unusable(format!(
            "the database's schema is v{newest}, newer than this controller's v{known}; run a newer controller"
        )));
    }
    for m in MIGRATIONS
        .iter()
        .filter(|m| m.version > newest && m.version <= last)
    {
        conn.batch("BEGIN")
            .map_err(|e| backend("begin a migration", &e))?;
        let applied = (|| {
            conn.batch(&m.sql_for(Dialect::Postgres))
                .map_err(|e| backend(&format!("apply migration v{}", m.version), &e))?;
            super::migrations::after(conn, m.version, Dialect::Postgres)?;
            run(
                conn,
                "record a migration",
                "INSERT INTO schema_migrations (version) VALUES (?1)",
                params![m.version],
            )?;
            conn.batch("COMMIT")
                .map_err(|e| backend("commit a migration", &e))
        })();
        if let Err(e) = applied {
            let _ = conn.batch("ROLLBACK");
            return Err(e);
        }
        tracing::info!(version = m.version, "store: schema migrated");
    }
    Ok(())
}

/// `names` replicas on one fresh test database (`None`: no test cluster
/// here). Opened on a thread of their own (the sync client's runtime may
/// not start inside a test's). For tests, this crate's and its users'
/// (the `testing` feature).
#[cfg(any(test, feature = "testing"))]
pub fn test_replicas(names: &[&str]) -> Option<Vec<PgStore>> {
    let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    std::thread::spawn(move || {
        if !baton_testpg::available() {
            return None;
        }
        let url = baton_testpg::fresh_database().expect("a test database");
        let target = Target::new(&url, None).expect("target");
        Some(
            names
                .into_iter()
                .map(|n| {
                    PgStore::open_replica(&target, Binding::Open, LeaseConfig::new(n))
                        .expect("a replica")
                })
                .collect(),
        )
    })
    .join()
    .expect("open thread")
}

#[cfg(test)]
mod partition_tests;
#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // a failed unwrap is a failed test
    use super::*;
    use baton_store::{RefTime, Store, StoreOps};

    /// Whether a test cluster runs here (else the tests return at once;
    /// `baton_testpg` said why, or panicked if PostgreSQL is required).
    fn available() -> bool {
        std::thread::spawn(baton_testpg::available)
            .join()
            .unwrap_or(false)
    }

    /// A store on a fresh database. Opened on a thread of its own: the
    /// sync client runs its own small runtime, which may not start inside
    /// the test's.
    fn open(binding: Binding) -> (PgStore, ()) {
        let store = std::thread::spawn(move || {
            let url = baton_testpg::fresh_database().expect("a test database");
            PgStore::open(&Target::new(&url, None)?, binding)
        })
        .join()
        .expect("open thread")
        .expect("open the store");
        (store, ())
    }

    baton_store::contract_suite!(open, available);

    /// Replicas share dashboard sessions and failed log-ins: a session
    /// made through one is valid through the other and a log-out through
    /// the other ends it; failures counted at once through both add up.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sessions_and_failed_log_ins_are_shared_by_replicas() {
        if !available() {
            return;
        }
        let (a, b, _) = replicas(LeaseConfig::new("ra"), LeaseConfig::new("rb"));
        baton_store::contract::sessions_and_failures_shared_by_two_handles(&a, &b).await;
    }

    /// Two replicas (`a`, `b`) on one fresh database, and a plain
    /// connection to it (the clock a paused replica does not see pass).
    fn replicas(a: LeaseConfig, b: LeaseConfig) -> (PgStore, PgStore, Target) {
        std::thread::spawn(move || {
            let url = baton_testpg::fresh_database().expect("a test database");
            let target = Target::new(&url, None).expect("target");
            let a = PgStore::open_replica(&target, Binding::Open, a).expect("replica a");
            let b = PgStore::open_replica(&target, Binding::Open, b).expect("replica b");
            (a, b, target)
        })
        .join()
        .expect("open thread")
    }

    /// Ends `id`'s lease now, as the database sees it: what a replica
    /// paused (SIGSTOP) past its lease finds when it wakes.
    fn expire(target: &Target, id: &str) {
        let id = id.to_owned();
        on_own_connection(target, move |raw| {
            run(
                raw,
                "expire a lease",
                "UPDATE replicas SET expires_us = 0 WHERE id = ?1",
                params![id],
            )
            .expect("expire");
        });
    }

    /// `f` on a connection of its own to the replicas' database, on a
    /// thread of its own (the sync client's runtime), waited for.
    fn on_own_connection<T: Send + 'static>(
        target: &Target,
        f: impl FnOnce(&PgConn) -> T + Send + 'static,
    ) -> T {
        let target = target.clone();
        std::thread::spawn(move || f(&PgConn::new(connect(&target).expect("connect"))))
            .join()
            .expect("a connection's thread")
    }

    fn hello(id: &str) -> baton_store::HelloRow {
        baton_store::contract::hello(id, 100)
    }

    /// A connection of its own to the replicas' database, on a thread of
    /// its own (the sync client's runtime), driven by `steps`: each step
    /// runs one statement when the test sends it, and answers when done.
    pub(super) fn raw_session(
        target: &Target,
    ) -> (
        std::sync::mpsc::Sender<String>,
        std::sync::mpsc::Receiver<StoreResult<()>>,
    ) {
        let (to, steps) = std::sync::mpsc::channel::<String>();
        let (done, answers) = std::sync::mpsc::channel();
        let target = target.clone();
        std::thread::spawn(move || {
            let raw = PgConn::new(connect(&target).expect("connect"));
            for sql in steps {
                let r = raw.batch(&sql).map_err(|e| backend(&sql, &e));
                if done.send(r).is_err() {
                    return;
                }
            }
        });
        (to, answers)
    }

    /// Replicas write in parallel: a transaction that took an event id
    /// and has not committed holds every later one back from followers
    /// (they read below the oldest running transaction), so when it
    /// commits its row is read, once, and nothing is skipped or read
    /// twice around it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_follower_neither_skips_nor_repeats_a_row_committed_late() {
        if !available() {
            return;
        }
        let (a, b, target) = replicas(LeaseConfig::new("ra"), LeaseConfig::new("rb"));
        let (start, _) = b.high_water().await.unwrap();
        let ev = |n: i64| baton_store::EventRow {
            id: 0,
            replica: "x".into(),
            kind: baton_store::EventKind::Delivery,
            agent_id: format!("a{n}"),
            tenant: "t".into(),
            pack: "p".into(),
            detail: String::new(),
            at: RefTime::from_nanos(n),
        };
        // Another writer's transaction takes the next id and stays open.
        let (late, answers) = raw_session(&target);
        late.send("BEGIN".into()).unwrap();
        late.send(
            "INSERT INTO events (replica, kind, agent_id, tenant, pack, detail, at_ns) \
             VALUES ('late', 'delivery', 'a0', 't', 'p', '', 0)"
                .into(),
        )
        .unwrap();
        for _ in 0..2 {
            answers.recv().unwrap().unwrap();
        }
        // Replica a commits later ids meanwhile.
        a.put_events((1..=3).map(ev).collect()).await.unwrap();
        let (seen, held) = b.events_after(start, 0).await.unwrap();
        assert_eq!(seen, [], "rows past an open transaction are not final yet");
        assert_eq!(b.events_after(held, 0).await.unwrap().0, []);
        late.send("COMMIT".into()).unwrap();
        answers.recv().unwrap().unwrap();
        let (rows, end) = baton_store::contract::followed(4, || b.events_after(held, 0)).await;
        let agents: Vec<&str> = rows.iter().map(|e| e.agent_id.as_str()).collect();
        assert_eq!(
            agents,
            ["a0", "a1", "a2", "a3"],
            "each once, the late one first"
        );
        assert_eq!(b.events_after(end, 0).await.unwrap().0, []);
        // The late row's id is below the others': a follower paging by id
        // alone would have passed it.
        assert!(rows[0].id < rows[1].id);
    }

    /// The follower's query is an index range on `(txid, id)` in the
    /// generic plan PostgreSQL keeps for a prepared statement, not a walk
    /// of the whole index from its start (what `txid > $1 OR (txid = $1
    /// AND id > $2)` was: the top statement of every push round across
    /// replicas, growing with the table).
    #[test]
    fn the_follower_reads_an_index_range_in_a_generic_plan() {
        if !available() {
            return;
        }
        // A migrated database (the replicas are not used).
        let (_a, _b, target) = replicas(LeaseConfig::new("ra"), LeaseConfig::new("rb"));
        let sql = crate::sql::db::numbered_placeholders(&crate::sql::events::follow_sql(
            &crate::sql::events::EVENTS_FOLLOWED,
        ));
        let plan = std::thread::spawn(move || {
            let mut c = connect(&target).expect("connect");
            c.batch_execute(&format!(
                "SET plan_cache_mode = force_generic_plan; \
                 PREPARE follow (bigint, bigint, bigint, bigint) AS {sql}"
            ))
            .expect("prepare");
            c.query("EXPLAIN EXECUTE follow (0, 0, NULL, 10)", &[])
                .expect("explain")
                .iter()
                .map(|r| r.get::<_, String>(0))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .join()
        .expect("explain thread");
        assert!(
            plan.lines()
                .any(|l| l.contains("Index Cond") && l.contains("ROW(txid, id) > ROW($1, $2)")),
            "{plan}"
        );
    }

    /// A rollout stage's tally follows its pack's feedback by mark: a row
    /// of the pack whose transaction took its id first and commits last
    /// (the lane's other thread, another replica) is counted once when it
    /// commits, never passed over as paging by id would.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_packs_feedback_committed_late_is_followed_not_skipped() {
        if !available() {
            return;
        }
        let (a, b, target) = replicas(LeaseConfig::new("ra"), LeaseConfig::new("rb"));
        let (_, start) = b.high_water().await.unwrap();
        let key = baton_store::PackKey {
            tenant: "t".into(),
            pack: "p".into(),
        };
        let scope = baton_store::FeedbackScope::Pack {
            key: &key,
            since: RefTime::from_nanos(0),
        };
        let (late, answers) = raw_session(&target);
        for sql in [
            "BEGIN",
            "INSERT INTO journals (agent_id, journal_id, acked_seq) VALUES ('late', 'j', 1)",
            "INSERT INTO feedback (journal, seq, tenant, pack, version, instruction, \
             attempt, scheduled_ns, actual_ns, lateness_ns, outcome, reason, event, action, \
             detail, dropped_before, uncertainty_ns, clock_source, clock_state, received_ns) \
             SELECT id, 1, 't', 'p', 1, 'blink', 1, 5, 5, 0, 1, 0, 'executed', 'gpio.write', \
             '', 0, 0, 0, 0, 5 FROM journals WHERE agent_id = 'late'",
        ] {
            late.send(sql.into()).unwrap();
            answers.recv().unwrap().unwrap();
        }
        let rows = (1..=3)
            .map(|q| baton_store::contract::fb("a1", "j1", q, 10))
            .collect();
        a.put_feedback(1, rows).await.unwrap();
        let (seen, held) = b.feedback_after(start, scope, 0).await.unwrap();
        assert_eq!(seen, [], "rows past an open transaction are not final yet");
        late.send("COMMIT".into()).unwrap();
        answers.recv().unwrap().unwrap();
        let (rows, end) =
            baton_store::contract::followed(4, || b.feedback_after(held, scope, 0)).await;
        let agents: Vec<&str> = rows.iter().map(|r| r.agent_id.as_str()).collect();
        assert_eq!(
            agents,
            ["late", "a1", "a1", "a1"],
            "each once, the late one first"
        );
        assert_eq!(b.feedback_after(end, scope, 0).await.unwrap().0, []);
        assert!(rows[0].id < rows[1].id, "paging by id would have passed it");
    }

    /// The lane inserts feedback rows plainly, as new (each journal's acked
    /// seq is raised with its rows); should a row be stored already all
    /// the same — here the journal's acked seq is set back by hand — the
    /// transaction is written again skipping stored rows: each row once,
    /// the answer counting the stored ones as duplicates.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_row_stored_already_is_written_again_skipping_it() {
        if !available() {
            return;
        }
        use baton_store::contract::fb;
        use baton_store::{FeedbackFilter, FeedbackRow};
        let (a, _b, target) = replicas(LeaseConfig::new("ra"), LeaseConfig::new("rb"));
        let rows = |seqs: std::ops::RangeInclusive<u64>| -> Vec<FeedbackRow> {
            seqs.map(|q| fb("a1", "j1", q, 10)).collect()
        };
        let first = a.put_feedback(1, rows(1..=3)).await.unwrap();
        assert_eq!((first.inserted, first.acked_seq), (3, 3));
        assert_eq!(a.ingest_stats().stored_already, 0);
        let (raw, answers) = raw_session(&target);
        raw.send("UPDATE journals SET acked_seq = 1 WHERE agent_id = 'a1'".into())
            .unwrap();
        answers.recv().unwrap().unwrap();
        let again = a.put_feedback(1, rows(2..=5)).await.unwrap();
        assert_eq!(
            (again.inserted, again.duplicates, again.acked_seq),
            (2, 2, 5)
        );
        assert_eq!(a.ingest_stats().stored_already, 1);
        let stored = a
            .feedback(FeedbackFilter {
                agent_id: Some("a1".into()),
                ..FeedbackFilter::default()
            })
            .await
            .unwrap();
        let seqs: Vec<u64> = stored.iter().map(|r| r.seq).collect();
        assert_eq!(seqs, [1, 2, 3, 4, 5], "each once");
        // A seq twice in one batch is stored once, on the plain path.
        let twice = a
            .put_feedback(1, vec![fb("a1", "j1", 6, 10), fb("a1", "j1", 6, 10)])
            .await
            .unwrap();
        assert_eq!((twice.inserted, twice.duplicates), (1, 1));
        assert_eq!(a.ingest_stats().stored_already, 1);
    }

    /// Feedback of many streams at once is written together: three
    /// statements a transaction whatever the number of agents in it, and
    /// fewer transactions than batches; each agent's rows stored once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn feedback_of_many_agents_costs_three_statements_a_transaction() {
        if !available() {
            return;
        }
        const AGENTS: usize = 60;
        let (store, _) = open(Binding::Open);
        let store = Arc::new(store);
        let puts: Vec<_> = (0..AGENTS)
            .map(|i| {
                let s = store.clone();
                tokio::spawn(async move {
                    let id = format!("a{i:02}");
                    let rows = (1..=64)
                        .map(|q| baton_store::contract::fb(&id, "j1", q, 10 + q as i64))
                        .collect();
                    s.put_feedback(1, rows).await.unwrap()
                })
            })
            .collect();
        for p in puts {
            assert_eq!(p.await.unwrap().inserted, 64);
        }
        let st = store.ingest_stats();
        assert_eq!(st.batches, AGENTS as u64);
        assert!(st.transactions < st.batches, "{st:?}");
        assert!(st.statements <= 3 * st.transactions, "{st:?}");
        for i in 0..AGENTS {
            let acked = store
                .feedback_acked(&format!("a{i:02}"), "j1")
                .await
                .unwrap();
            assert_eq!(acked, 64);
        }
    }

    /// Clock reports and last-seen marks of many streams are written
    /// together too (history and latest: two statements; marks: one;
    /// the fence shared), each answered as the writer would: a report of a
    /// stale stream is fenced, one of an agent never seen is refused, an
    /// older report leaves the latest alone.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn clock_reports_and_marks_of_many_agents_cost_a_few_statements_a_transaction() {
        if !available() {
            return;
        }
        use baton_store::contract::{clock, hello};
        const AGENTS: usize = 40;
        let (store, _) = open(Binding::Open);
        let store = Arc::new(store);
        let mut gens = Vec::new();
        for i in 0..AGENTS {
            let (a, _) = store
                .agent_hello(hello(&format!("c{i:02}"), 100))
                .await
                .unwrap();
            gens.push(a.session_gen);
        }
        let before = store.ingest_stats();
        let writes: Vec<_> = (0..AGENTS)
            .map(|i| {
                let (s, session) = (store.clone(), gens[i]);
                tokio::spawn(async move {
                    let id = format!("c{i:02}");
                    s.record_clock(&id, session, clock(2_000)).await.unwrap();
                    // Older, and a re-send: the latest stays at 2 000.
                    s.record_clock(&id, session, clock(1_000)).await.unwrap();
                    s.record_clock(&id, session, clock(2_000)).await.unwrap();
                    s.agent_seen(&id, session, baton_store::contract::seen_live(3_000))
                        .await
                        .unwrap();
                })
            })
            .collect();
        for w in writes {
            w.await.unwrap();
        }
        let st = store.ingest_stats();
        let (tx, batches, statements) = (
            st.transactions - before.transactions,
            st.batches - before.batches,
            st.statements - before.statements,
        );
        assert_eq!(batches, 4 * AGENTS as u64);
        assert!(tx < batches, "{st:?}");
        assert!(statements <= 4 * tx, "{st:?}");
        for i in 0..AGENTS {
            let id = format!("c{i:02}");
            let a = store.agent(&id).await.unwrap().unwrap();
            assert_eq!(a.clock.unwrap().at, RefTime::from_nanos(2_000));
            assert_eq!(a.last_seen, RefTime::from_nanos(3_000));
            let history = store
                .clock_history(&id, RefTime::from_nanos(0), 10)
                .await
                .unwrap();
            assert_eq!(history.len(), 2);
        }
        // A stale stream's report is fenced; an unknown agent's refused.
        let stale = store.record_clock("c00", gens[0] - 1, clock(5_000)).await;
        assert!(matches!(stale, Err(StoreError::Fenced { .. })), "{stale:?}");
        let unknown = store.record_clock("nobody", 1, clock(5_000)).await;
        assert!(
            matches!(unknown, Err(StoreError::NoSuchAgent { .. })),
            "{unknown:?}"
        );
        let gone = store
            .agent_seen(
                "nobody",
                1,
                baton_model::SeenRow::ended(RefTime::from_nanos(1)),
            )
            .await;
        assert!(
            matches!(gone, Err(StoreError::NoSuchAgent { .. })),
            "{gone:?}"
        );
    }

    /// A replica hears another's events as they commit: its follower's
    /// wait ends then, not at the end of its poll.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_follower_is_woken_by_another_replicas_events() {
        if !available() {
            return;
        }
        let (a, b, _) = replicas(LeaseConfig::new("ra"), LeaseConfig::new("rb"));
        let ev = baton_store::EventRow {
            id: 0,
            replica: "ra".into(),
            kind: baton_store::EventKind::Connected,
            agent_id: "a1".into(),
            tenant: String::new(),
            pack: String::new(),
            detail: String::new(),
            at: RefTime::from_nanos(1),
        };
        woken(b, "events", async || {
            a.put_events(vec![ev.clone()]).await.unwrap()
        })
        .await;
    }

    /// `commit`s on one replica until `b`'s follower wait ends, at most
    /// 20 s: a commit made before `b` listens wakes nobody (its first wait
    /// may also end on a commit made before: a follower then reads), so
    /// they repeat, each waited on for 50 ms.
    async fn woken(b: PgStore, what: &str, mut commit: impl AsyncFnMut()) {
        let b = Arc::new(b);
        let mut waiting = {
            let b = b.clone();
            tokio::spawn(async move { Store::news(&*b, std::time::Duration::from_secs(60)).await })
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            commit().await;
            match tokio::time::timeout(std::time::Duration::from_millis(50), &mut waiting).await {
                Ok(done) => return done.unwrap(),
                Err(_) => assert!(
                    std::time::Instant::now() < deadline,
                    "no wake-up in 20 s of {what}"
                ),
            }
        }
    }

    /// Feedback stored on one replica wakes another's follower too (its
    /// watchers see it then, not at the next poll); the word is sent
    /// after the commit, by the notifier, not inside the transaction.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_follower_is_woken_by_another_replicas_feedback() {
        if !available() {
            return;
        }
        let (a, b, _) = replicas(LeaseConfig::new("ra"), LeaseConfig::new("rb"));
        let mut seq = 0;
        woken(b, "feedback", async || {
            seq += 1;
            a.put_feedback(1, vec![baton_store::contract::fb("a1", "j1", seq, 10)])
                .await
                .unwrap();
        })
        .await;
        assert!(a.notifier.sent() >= 1);
    }

    /// Reads beyond the bound wait their turn without a connection:
    /// with the table locked by another session, six reads at once with
    /// two at a time on two connections put two on the server (both
    /// waiting on the lock) and four in line; once it is released all six
    /// answer.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reads_past_the_bound_wait_their_turn_without_a_connection() {
        reads_while_locked(2, 2, (2, 4), 2).await;
    }

    /// Reads share their connections: four at a time on one connection
    /// are one server process (its first statement waiting on the lock,
    /// the next three sent behind it), two more in line.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reads_share_their_connections_pipelined() {
        reads_while_locked(4, 1, (4, 2), 1).await;
    }

    /// Six reads of the agents while another session holds their table
    /// locked, `readers` at a time on `connections`: `reads` (running,
    /// waiting) and `on_server` read connections, each waiting on the lock,
    /// until it is released; then all six answer.
    async fn reads_while_locked(
        readers: usize,
        connections: usize,
        reads: (usize, usize),
        on_server: i64,
    ) {
        if !available() {
            return;
        }
        let (store, target) = std::thread::spawn(move || {
            let url = baton_testpg::fresh_database().expect("a test database");
            let target = Target::new(&url, None)
                .unwrap()
                .readers(readers)
                .read_connections(connections);
            (PgStore::open(&target, Binding::Open).unwrap(), target)
        })
        .join()
        .unwrap();
        let (steps, answers) = raw_session(&target);
        for sql in ["BEGIN", "LOCK TABLE agents IN ACCESS EXCLUSIVE MODE"] {
            steps.send(sql.into()).unwrap();
            answers.recv().unwrap().unwrap();
        }
        let running: Vec<_> = (0..6)
            .map(|i| {
                let s = store.clone();
                tokio::spawn(async move { s.agent(&format!("a{i}")).await })
            })
            .collect();
        // Read connections, and those of them waiting on a lock.
        let seen = |target: &Target| {
            on_own_connection(target, |raw| {
                query_first(
                    raw,
                    "SELECT count(*) AS n, \
                     count(*) FILTER (WHERE wait_event_type = 'Lock') AS waiting \
                     FROM pg_stat_activity \
                     WHERE application_name = ?1 AND datname = current_database()",
                    params![reads::READ_APPLICATION],
                    |r| Ok((col::<i64>(r, "n")?, col::<i64>(r, "waiting")?)),
                )
                .unwrap()
                .unwrap_or((0, 0))
            })
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while store.reads() != reads || seen(&target) != (on_server, on_server) {
            assert!(
                std::time::Instant::now() < deadline,
                "reads {:?}, read connections (all, waiting) {:?}",
                store.reads(),
                seen(&target)
            );
            tokio::task::yield_now().await;
        }
        steps.send("COMMIT".into()).unwrap();
        answers.recv().unwrap().unwrap();
        for r in running {
            assert_eq!(r.await.unwrap().unwrap(), None);
        }
        assert_eq!(store.reads(), (0, 0));
    }

    /// A read is replayed with its statements' answers: each answered in
    /// order, past the replays' bound too (then on a blocking thread); a
    /// read that asks otherwise when replayed (not a pure one) still
    /// answers; a statement's failure is the read's to handle, as on the
    /// synchronous path.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reads_are_replayed_with_their_answers() {
        if !available() {
            return;
        }
        let store = std::thread::spawn(|| {
            let url = baton_testpg::fresh_database().expect("a test database");
            PgStore::open(&Target::new(&url, None).unwrap(), Binding::Open).unwrap()
        })
        .join()
        .unwrap();
        let number = |db: &dyn Db, n: i64| {
            query_first(db, "SELECT CAST(?1 AS BIGINT) AS n", params![n], |r| {
                col::<i64>(r, "n")
            })
        };
        for many in [3, 16, 17, 40] {
            let got = Engine::read(&store, move |db| {
                (0..many)
                    .map(|i| number(db, i * 7))
                    .collect::<StoreResult<Vec<_>>>()
            })
            .await
            .unwrap();
            assert_eq!(got, (0..many).map(|i| Some(i * 7)).collect::<Vec<_>>());
        }
        // A big answer (decoded once, on a blocking thread), then more.
        let got = Engine::read(&store, move |db| {
            let many = crate::sql::db::query_all(
                db,
                "SELECT CAST(generate_series(1, 300) AS BIGINT) AS n",
                &[],
                |r| col::<i64>(r, "n"),
            )?;
            Ok((many.iter().sum::<i64>(), number(db, 9)?, number(db, 10)?))
        })
        .await
        .unwrap();
        assert_eq!(got, (45_150, Some(9), Some(10)));
        let runs = Arc::new(std::sync::atomic::AtomicI64::new(0));
        let r = Arc::clone(&runs);
        let got = Engine::read(&store, move |db| {
            let run = r.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok((run, number(db, run)?))
        })
        .await
        .unwrap();
        assert_eq!(got.1, Some(got.0), "each run's own answer");
        assert!(runs.load(std::sync::atomic::Ordering::SeqCst) >= 3);
        let got = Engine::read(&store, move |db| {
            let failed = query_first(db, "SELECT nothing FROM nowhere", &[], |r| {
                col::<i64>(r, "nothing")
            })
            .map_err(|e| e.to_string());
            Ok((failed, number(db, 5)?))
        })
        .await
        .unwrap();
        assert!(
            got.0.as_ref().is_err_and(|e| e.contains("nowhere")),
            "{got:?}"
        );
        assert_eq!(got.1, Some(5));
    }

    /// A read connection the server ended (a restart, an administrator's
    /// `pg_terminate_backend`) is found out by the next read on it, which
    /// runs again on a new connection and answers.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_read_connection_the_server_ended_is_opened_again() {
        if !available() {
            return;
        }
        let (store, target) = std::thread::spawn(move || {
            let url = baton_testpg::fresh_database().expect("a test database");
            let target = Target::new(&url, None).unwrap().read_connections(1);
            (PgStore::open(&target, Binding::Open).unwrap(), target)
        })
        .join()
        .unwrap();
        store.agent_hello(hello("a1")).await.unwrap();
        assert!(store.agent("a1").await.unwrap().is_some());
        let ended = on_own_connection(&target, |raw| {
            query_first(
                raw,
                "SELECT count(pg_terminate_backend(pid)) AS n FROM pg_stat_activity \
                 WHERE application_name = ?1 AND datname = current_database()",
                params![reads::READ_APPLICATION],
                |r| col::<i64>(r, "n"),
            )
            .unwrap()
        });
        assert_eq!(ended, Some(1));
        for _ in 0..3 {
            let a1 = store.agent("a1").await.expect("read on a new connection");
            assert_eq!(a1.map(|a| a.id).as_deref(), Some("a1"));
        }
    }

    /// A decision's changed rows are announced in its own transaction: as
    /// soon as a push is stored on one replica, another replica's
    /// follower reads an event for each agent it planned (nothing relayed
    /// after the commit, which a crash in between would lose).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_decisions_rows_are_announced_in_its_own_transaction() {
        if !available() {
            return;
        }
        use baton_store::contract::{hello_in, key, pack, to_ids};
        let (a, b, _) = replicas(LeaseConfig::new("ra"), LeaseConfig::new("rb"));
        for id in ["x1", "x2"] {
            a.agent_hello(hello_in(id, &[], &[], 1)).await.unwrap();
        }
        let (from, _) = b.high_water().await.unwrap();
        a.put_pack(pack("default", "p", 1, to_ids(&["x1", "x2"])))
            .await
            .unwrap();
        let rows = a
            .reconcile_pack(&key("default", "p"), RefTime::from_nanos(5))
            .await
            .unwrap();
        assert_eq!(rows.len(), 2);
        // A follower reads below the oldest transaction still open (the
        // snapshot's xmin): another test's transaction on the shared
        // cluster, or the lease's, may hold it back a moment. The events
        // are there once it ends; waited for, not slept for.
        let want = vec![
            ("ra".to_string(), "x1".to_string(), "p".to_string()),
            ("ra".to_string(), "x2".to_string(), "p".to_string()),
        ];
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let (events, _) = b.events_after(from, 100).await.unwrap();
            let mut told: Vec<(String, String, String)> = events
                .iter()
                .filter(|e| e.kind == baton_store::EventKind::Delivery)
                .map(|e| (e.replica.clone(), e.agent_id.clone(), e.pack.clone()))
                .collect();
            told.sort();
            if told == want {
                break;
            }
            assert!(
                told.len() < want.len() && std::time::Instant::now() < deadline,
                "{told:?}"
            );
            tokio::task::yield_now().await;
        }
    }

    /// The kinds of the events stored for pack `p`, counted.
    fn event_kinds(target: &Target) -> Vec<(String, i64)> {
        on_own_connection(target, |raw| {
            crate::sql::db::query_all(
                raw,
                "SELECT kind, COUNT(*) AS n FROM events WHERE pack = 'p' GROUP BY kind ORDER BY kind",
                &[],
                |r| Ok((col::<String>(r, "kind")?, col::<i64>(r, "n")?)),
            )
            .expect("kinds")
        })
    }

    /// A decision's rows of one pack are one event row naming the agents,
    /// read back as an event per agent; but while a replica of an older
    /// build (which would pass a group over) holds a live lease, a row
    /// each, as before.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn delivery_events_are_grouped_once_no_older_replica_is_live() {
        if !available() {
            return;
        }
        use baton_store::contract::{hello_in, key, pack, to_ids};
        let (a, b, target) = replicas(LeaseConfig::new("ra"), LeaseConfig::new("rb"));
        // An older build's lease: live, silent on groups (the column's
        // default).
        let (raw, answers) = raw_session(&target);
        raw.send(
            "INSERT INTO replicas (id, epoch, expires_us) VALUES ('old', 1, 9223372036854775807)"
                .into(),
        )
        .unwrap();
        answers.recv().unwrap().unwrap();
        let ids = ["x1", "x2", "x3"];
        for id in ids {
            a.agent_hello(hello_in(id, &[], &[], 1)).await.unwrap();
        }
        let push = |v: u64| {
            let a = &a;
            async move {
                a.put_pack(pack("default", "p", v, to_ids(&ids)))
                    .await
                    .unwrap();
                a.reconcile_pack(&key("default", "p"), RefTime::from_nanos(5))
                    .await
                    .unwrap()
            }
        };
        let (from, _) = b.high_water().await.unwrap();
        assert_eq!(push(1).await.len(), 3);
        assert_eq!(event_kinds(&target), vec![("delivery".to_string(), 3)]);
        let (first, after_first) = delivery_events_of_p(&b, from, 3).await;
        let rows: std::collections::BTreeSet<u64> = first.iter().map(|e| e.id).collect();
        assert_eq!(rows.len(), 3, "a row each: {first:?}");

        expire(&target, "old");
        assert_eq!(push(2).await.len(), 3);
        assert_eq!(
            event_kinds(&target),
            vec![("deliveries".to_string(), 1), ("delivery".to_string(), 3)]
        );
        // Read back as a delivery event per agent, each once, from one
        // stored row.
        let (second, _) = delivery_events_of_p(&b, after_first, 3).await;
        let mut agents: Vec<&str> = second.iter().map(|e| e.agent_id.as_str()).collect();
        agents.sort_unstable();
        assert_eq!(agents, ids, "{second:?}");
        assert!(second.iter().all(|e| e.id == second[0].id), "{second:?}");
    }

    /// The delivery events of pack `p` a follower reads after `from`,
    /// page by page until `n` came (waited for, not slept for: a follower
    /// reads below the oldest transaction open on the shared cluster),
    /// never more; and the mark after them.
    async fn delivery_events_of_p(
        s: &PgStore,
        from: baton_store::Mark,
        n: usize,
    ) -> (Vec<baton_store::EventRow>, baton_store::Mark) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let mut at = from;
        let mut seen = Vec::new();
        while seen.len() < n {
            assert!(std::time::Instant::now() < deadline, "{seen:?}");
            let (events, next) = s.events_after(at, 100).await.unwrap();
            at = next;
            seen.extend(
                events
                    .into_iter()
                    .filter(|e| e.kind == baton_store::EventKind::Delivery && e.pack == "p"),
            );
            tokio::task::yield_now().await;
        }
        assert_eq!(seen.len(), n, "{seen:?}");
        (seen, at)
    }

    /// A page of events holds `limit` stored rows at most, and stops at
    /// the row whose agents bring it to `limit` events: a follower never
    /// holds a page of thousands of groups at once, and reads on from the
    /// row after.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_page_of_groups_is_cut_at_the_limit_and_read_on() {
        if !available() {
            return;
        }
        let (_a, b, target) = replicas(LeaseConfig::new("ra"), LeaseConfig::new("rb"));
        let (from, _) = b.high_water().await.unwrap();
        let (raw, answers) = raw_session(&target);
        // Three groups of four agents, then a single event.
        let mut sql = String::from("BEGIN;");
        for g in 0..3 {
            let agents: Vec<String> = (0..4).map(|i| format!("\"g{g}a{i}\"")).collect();
            sql.push_str(&format!(
                "INSERT INTO events (replica, kind, agent_id, tenant, pack, detail, at_ns) \
                 VALUES ('x', 'deliveries', '', 't', 'p', '[{}]', 0);",
                agents.join(",")
            ));
        }
        sql.push_str(
            "INSERT INTO events (replica, kind, agent_id, tenant, pack, detail, at_ns) \
             VALUES ('x', 'delivery', 'solo', 't', 'p', '', 0); COMMIT",
        );
        raw.send(sql).unwrap();
        answers.recv().unwrap().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let mut at = from;
        let mut pages = Vec::new();
        while pages.iter().map(Vec::len).sum::<usize>() < 13 {
            assert!(std::time::Instant::now() < deadline, "{pages:?}");
            let (events, next) = b.events_after(at, 6).await.unwrap();
            at = next;
            if !events.is_empty() {
                pages.push(events.into_iter().map(|e| e.agent_id).collect::<Vec<_>>());
            }
            tokio::task::yield_now().await;
        }
        let sizes: Vec<usize> = pages.iter().map(Vec::len).collect();
        // 4 + 4 reach the limit of 6: cut there; then 4 + 1.
        assert_eq!(sizes, [8, 5], "{pages:?}");
        assert_eq!(pages[1].last().map(String::as_str), Some("solo"));
        // A limit of events past the store's page of rows (a follower's):
        // the four rows in one page, as the two pages read them.
        let (one, _) = b
            .events_after(from, 10 * baton_store::MAX_PAGE)
            .await
            .unwrap();
        let one: Vec<String> = one.into_iter().map(|e| e.agent_id).collect();
        assert_eq!(one, pages.concat());
    }

    /// A decision on one replica waits for another replica's decision
    /// about the same packs in flight, and then reads what it committed:
    /// a hello that came while a retarget was being decided elsewhere
    /// plans with the new targets (without the locks it would plan with
    /// the old ones, and the agent would never get the pack).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_decision_waits_for_another_replicas_decision_in_flight_and_reads_it() {
        if !available() {
            return;
        }
        use baton_store::contract::{hello_in, pack};
        let (a, b, target) = replicas(LeaseConfig::new("ra"), LeaseConfig::new("rb"));
        let key = baton_store::PackKey::new("default", "p");
        a.put_pack(pack("default", "p", 1, baton_store::TargetsRow::Nobody))
            .await
            .unwrap();
        // Replica a's decision to retarget the pack, held open: it holds
        // the pack's tenant as a decision about a pack does.
        let (other, answers) = raw_session(&target);
        let labels =
            crate::sql::codec::targets_json(&baton_store::contract::to_labels(&[("line", "3")]))
                .unwrap();
        for sql in [
            "BEGIN".to_string(),
            "SELECT pg_advisory_xact_lock(2, hashtext('*'))".into(),
            format!(
                "UPDATE packs SET targets = '{labels}' WHERE tenant = 'default' AND pack = 'p'"
            ),
        ] {
            other.send(sql).unwrap();
            answers.recv().unwrap().unwrap();
        }
        let b2 = Arc::new(b);
        let hello = {
            let b = b2.clone();
            tokio::spawn(async move {
                b.agent_hello(hello_in("x1", &[], &[("line", "3")], 1))
                    .await
                    .unwrap()
            })
        };
        // Until the hello waits on a lock (or, without locks, is done).
        let waiting = |t: &Target| {
            let t = t.clone();
            std::thread::spawn(move || {
                let raw = PgConn::new(connect(&t).expect("connect"));
                query_first(
                    &raw,
                    "SELECT COUNT(*) AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
                    &[],
                    |r| col::<i64>(r, "n"),
                )
                .unwrap()
                .unwrap_or(0)
            })
            .join()
            .unwrap()
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while waiting(&target) == 0 && !hello.is_finished() {
            assert!(
                std::time::Instant::now() < deadline,
                "the hello neither waited nor ended"
            );
            tokio::task::yield_now().await;
        }
        other.send("COMMIT".into()).unwrap();
        answers.recv().unwrap().unwrap();
        let (_, rows) = hello.await.unwrap();
        assert_eq!(
            rows.iter()
                .map(|r| (r.key(), r.version))
                .collect::<Vec<_>>(),
            [(key, 1)],
            "the hello planned with the targets committed before it read them"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_restart_under_the_same_id_fences_the_earlier_one() {
        if !available() {
            return;
        }
        let (old, new, _) = replicas(LeaseConfig::new("r1"), LeaseConfig::new("r1"));
        assert_eq!((old.replica().1, new.replica().1), (1, 2));
        assert!(old.agent_hello(hello("a1")).await.is_err());
        let (agent, _) = new.agent_hello(hello("a1")).await.unwrap();
        assert_eq!(agent.owner, "r1");
        assert!(*old.lease_lost().borrow());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_agents_of_a_replica_whose_lease_ran_out_are_marked_disconnected() {
        use baton_store::Store;
        if !available() {
            return;
        }
        // b renews (and sweeps) often, so the test need not wait long.
        let mut quick = LeaseConfig::new("rb");
        quick.renew_every = std::time::Duration::from_millis(100);
        let (a, b, target) = replicas(LeaseConfig::new("ra"), quick);
        a.agent_hello(hello("on-a")).await.unwrap();
        b.agent_hello(hello("earlier-b")).await.unwrap();
        let connected = |s: &PgStore, id: &'static str| {
            let s = s.clone();
            async move { s.agent(id).await.unwrap().unwrap().connected }
        };
        // A replica starting marks its own agents gone (it holds no stream
        // yet) and leaves those of live replicas.
        b.all_disconnected().await.unwrap();
        assert!(connected(&b, "on-a").await);
        assert!(!connected(&b, "earlier-b").await);
        b.agent_hello(hello("on-b")).await.unwrap();
        // a dies: b's renewals sweep its agents, and only those.
        expire(&target, "ra");
        tokio::time::timeout(std::time::Duration::from_secs(10), async {
            while connected(&b, "on-a").await {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        })
        .await
        .expect("a's agent is marked disconnected by b's sweep");
        assert!(connected(&b, "on-b").await);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_second_machine_under_one_id_is_refused_by_another_replica() {
        use baton_store::Store;
        if !available() {
            return;
        }
        let (a, b, target) = replicas(LeaseConfig::new("ra"), LeaseConfig::new("rb"));
        let mut first = hello("a1");
        first.journal_id = "j-one".into();
        a.agent_hello(first.clone()).await.unwrap();
        let mut second = hello("a1");
        second.journal_id = "j-two".into();
        match b.agent_hello(second.clone()).await {
            Err(StoreError::IdInUse {
                holder_journal,
                replica,
                ..
            }) => assert_eq!((holder_journal.as_str(), replica.as_str()), ("j-one", "ra")),
            other => panic!("a second machine let in: {other:?}"),
        }
        let kept = b.agent("a1").await.unwrap().unwrap();
        assert_eq!(
            (kept.journal_id.as_str(), kept.owner.as_str()),
            ("j-one", "ra")
        );
        // The same machine moving to b is its own business.
        let (moved, _) = b.agent_hello(first).await.unwrap();
        assert_eq!((moved.owner.as_str(), moved.session_gen), ("rb", 2));
        // b holds it now: a refuses the other journal in turn.
        assert!(matches!(
            a.agent_hello(second.clone()).await,
            Err(StoreError::IdInUse { .. })
        ));
        // Once b's stream is gone (here: b's lease ran out), a new
        // journal is a machine whose disk was wiped: let in.
        expire(&target, "rb");
        let (wiped, _) = a.agent_hello(second).await.unwrap();
        assert_eq!(
            (wiped.journal_id.as_str(), wiped.owner.as_str()),
            ("j-two", "ra")
        );
    }

    #[test]
    fn a_lease_must_outlast_three_renewals() {
        let mut l = LeaseConfig::new("r");
        assert!(l.check().is_ok());
        l.renew_every = l.ttl / 2;
        assert!(l.check().is_err());
        assert!(LeaseConfig::new("").check().is_err());
    }
}
