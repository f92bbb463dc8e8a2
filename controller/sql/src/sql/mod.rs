//! The store in SQL, once for every engine: the statements, the row
//! decoders and the primitives of a transaction (`tx`), written against [`db::Db`]
//! (run a query, run a statement). An engine ([`Engine`]) supplies the
//! connections and what SQL cannot say portably: where the writes are
//! serialised (SQLite's one writer) or what keeps parallel writers from
//! racing (PostgreSQL's decision locks, [`Engine::locks`]). With that, [`baton_store::Store`] is
//! implemented for it here.
//!
//! The SQL is the subset SQLite and PostgreSQL both accept: `?N`
//! placeholders (rewritten to `$N` for PostgreSQL), `ON CONFLICT`,
//! `RETURNING`, `COALESCE`, row values, derived tables with an alias, and
//! an optional filter spelled `CAST(?N AS TEXT) IS NULL OR …` (PostgreSQL
//! cannot type a parameter seen first in `IS NULL`). Integers are bound
//! and read as 64-bit; an engine narrows them to its column types.

pub(crate) mod agents;
pub(crate) mod audit;
pub(crate) mod codec;
pub mod db;
pub(crate) mod deliveries;
pub(crate) mod events;
pub(crate) mod feedback;
pub(crate) mod members;
pub(crate) mod packs;
pub(crate) mod releases;
pub(crate) mod rollouts;
pub(crate) mod sessions;
pub(crate) mod store_impl;
pub(crate) mod tx;

use std::future::Future;

use super::{Binding, StoreResult};

pub use agents::LeaseClock;

/// See [`Engine::horizon`].
pub type Horizon = fn(&dyn db::Db) -> StoreResult<Option<i64>>;

/// What an engine gives the shared SQL: a writer whose commands are
/// committed before they are answered, decisions that never race (its
/// commands serialised, or, where writers run in parallel, each holding
/// the locks of what it decides about: [`Engine::locks`]), and reads
/// beside it.
pub trait Engine: Send + Sync + std::fmt::Debug + 'static {
    /// How decisions bind agents to tenants.
    fn binding(&self) -> Binding;

    /// Whether replicas share this store (their events go through it).
    fn replicated(&self) -> bool {
        false
    }

    /// The replica this store writes as (a hello makes it the agent's
    /// owner). A single controller: empty, epoch 0.
    fn owner(&self) -> agents::Owner {
        agents::Owner::default()
    }

    /// Reads now, in microseconds since the epoch, on the clock leases
    /// are measured with: the database's own where replicas share it
    /// (their clocks may differ; the database's is the one they agree
    /// on), this host's otherwise.
    fn lease_clock(&self) -> LeaseClock {
        |_db| Ok(host_now_us())
    }

    /// The oldest transaction still running, where writers commit in
    /// parallel (PostgreSQL's replicas): followers read only the rows of
    /// transactions below it (see `events::follow_page`). `None` (the
    /// default): one writer, whose rows commit in id order.
    fn horizon(&self) -> Horizon {
        |_db| Ok(None)
    }

    /// Whether decisions take the locks that serialize them with other
    /// writers' ([`baton_store::Tx::lock_agent`]): only where writers run
    /// in parallel.
    fn locks(&self) -> bool {
        false
    }

    /// Whether feedback and clock history are partitioned by day (on
    /// PostgreSQL, migration 15): retention then deletes rows one by one
    /// only in the DEFAULT partitions, and drops the days whole
    /// ([`Engine::drop_partitions_before`]).
    fn partitioned(&self) -> bool {
        false
    }

    /// Drops the whole partitions of `what` older than `before`; how many
    /// rows went (the default: none partitioned).
    fn drop_partitions_before(
        &self,
        what: baton_store::Grows,
        before: baton_model::RefTime,
    ) -> impl Future<Output = StoreResult<u64>> + Send {
        let _ = (what, before);
        std::future::ready(Ok(0))
    }

    /// Stores a stream's feedback ([`baton_store::Store::append_feedback`]):
    /// one transaction each by default; an engine may write many streams'
    /// together (PostgreSQL's lane).
    fn stream_feedback(
        &self,
        session: u64,
        rows: Vec<baton_model::FeedbackRow>,
    ) -> impl Future<Output = StoreResult<baton_store::FeedbackStored>> + Send
    where
        Self: baton_store::Store + Sized,
    {
        baton_store::append_in_transaction(self, session, rows)
    }

    /// Stores a stream's clock report, as [`Engine::stream_feedback`].
    fn stream_clock(
        &self,
        id: &str,
        session: u64,
        clock: baton_store::ClockRow,
    ) -> impl Future<Output = StoreResult<()>> + Send
    where
        Self: baton_store::Store + Sized,
    {
        baton_store::clock_in_transaction(self, id, session, clock)
    }

    /// Stores when a stream was last seen, as [`Engine::stream_feedback`].
    fn stream_seen(
        &self,
        id: &str,
        session: u64,
        seen: baton_model::SeenRow,
    ) -> impl Future<Output = StoreResult<()>> + Send
    where
        Self: baton_store::Store + Sized,
    {
        baton_store::seen_in_transaction(self, id, session, seen)
    }

    /// Events were committed: tell the other writers' followers (the
    /// default: there are none).
    fn told(&self) {}

    /// Waits until another writer announced a commit to follow, or for
    /// `at_most` (the default: other writers are not heard).
    fn news(&self, at_most: std::time::Duration) -> impl Future<Output = ()> + Send {
        tokio::time::sleep(at_most)
    }

    /// Runs `f` in a transaction of the writer; its result once committed
    /// (a failed `f` leaves no trace).
    fn write<T, F>(&self, f: F) -> impl Future<Output = StoreResult<T>> + Send
    where
        T: Send + 'static,
        F: FnMut(&dyn db::Db) -> StoreResult<T> + Send + 'static;

    /// [`Engine::write`] for work that may wait for company (retention):
    /// an engine may run it with the next batch of other writes.
    fn write_background<T, F>(&self, f: F) -> impl Future<Output = StoreResult<T>> + Send
    where
        T: Send + 'static,
        F: FnMut(&dyn db::Db) -> StoreResult<T> + Send + 'static;

    /// Runs `f` on a read connection. `f` must be a pure function of what
    /// its statements answer (no writes, no clock, no randomness: what it
    /// needs of those is captured before): an engine may run it again, on
    /// a new connection when the one it took turns out to be gone, or
    /// replayed with its statements' answers on the async runtime
    /// (PostgreSQL: `postgres/reads.rs`).
    fn read<T, F>(&self, f: F) -> impl Future<Output = StoreResult<T>> + Send
    where
        T: Send + 'static,
        F: Fn(&dyn db::Db) -> StoreResult<T> + Send + 'static;
}

/// Runs blocking database work (a read on a pooled connection) off the
/// async runtime's threads, a panicked task as a store error.
pub(crate) async fn off_runtime<T: Send + 'static>(
    f: impl FnOnce() -> StoreResult<T> + Send + 'static,
) -> StoreResult<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| super::StoreError::unavailable("a read", e.to_string()))?
}

/// This host's clock, in microseconds since the epoch (a single
/// controller's lease clock).
fn host_now_us() -> i64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}
