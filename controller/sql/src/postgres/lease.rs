//! A replica's lease: the row that says it may still write.
//!
//! A leader election alone is not fencing (a paused process wakes up
//! believing it still leads). So the lease is checked where the writes
//! happen: every write batch reads it, in its own transaction, last
//! before it commits (the streams' lane: in its first statement, with the
//! agents' rows it locks) and with the database's clock, and refuses to
//! commit when it ran out. A replica paused past its lease therefore writes nothing when
//! it wakes, even before its own renewal finds out; and the agents it
//! served are owned by whichever replica they said hello to since (their
//! session generation moved on, see `baton_store::decide::check_session`).
//!
//! The lease is renewed on a thread of its own, with a connection of its
//! own, every [`LeaseConfig::renew_every`]; the same thread marks
//! disconnected the agents whose owner's lease ran out (a replica killed
//! with its streams open leaves them "connected" otherwise). Times are the
//! database's (`clock_timestamp()`): the replicas' own clocks may differ.
//! A replica that cannot renew before its lease runs out says so through
//! [`Lease::lost`], and stops serving.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::conn::PgConn;
use super::{Target, connect};
use crate::sql::agents::{Owner, disconnect_unowned};
use crate::sql::db::{Db, col, params, query_first, run};
use baton_store::{StoreError, StoreResult};

/// Now on the database's clock, in microseconds since the epoch (not
/// `now()`: that is the transaction's start, and a batch may have waited
/// for a decision's locks since).
pub(super) const NOW_US: &str = "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::BIGINT";

/// How a replica holds its lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseConfig {
    /// The replica's id: a restart under the same id takes the next epoch
    /// (fencing its earlier self); two live replicas must not share one.
    pub replica_id: String,
    /// How long a renewal holds. A replica paused or cut off this long
    /// loses its agents' writes.
    pub ttl: Duration,
    /// How often it is renewed.
    pub renew_every: Duration,
}

impl LeaseConfig {
    /// A lease under `replica_id`, of 10 s renewed every 1.5 s: a few
    /// renewals may fail (a database fail-over) before it runs out, and
    /// it runs out well before an agent gives up on a silent stream.
    pub fn new(replica_id: impl Into<String>) -> LeaseConfig {
        LeaseConfig {
            replica_id: replica_id.into(),
            ttl: Duration::from_secs(10),
            renew_every: Duration::from_millis(1500),
        }
    }

    /// An id unique to this process: the host's name, the process id and a
    /// random suffix.
    pub fn unique_id() -> String {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_else(|_| "replica".into());
        format!(
            "{host}-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        )
    }

    fn ttl_us(&self) -> i64 {
        i64::try_from(self.ttl.as_micros()).unwrap_or(i64::MAX / 2)
    }

    /// Refuses a lease that could not work.
    pub fn check(&self) -> Result<(), String> {
        if self.replica_id.is_empty() || self.replica_id.len() > 200 {
            return Err("the replica id must be 1 to 200 characters".into());
        }
        if self.renew_every < Duration::from_millis(10) || self.renew_every * 3 > self.ttl {
            return Err(format!(
                "the lease ({:?}) must last at least three renewals ({:?} each)",
                self.ttl, self.renew_every
            ));
        }
        Ok(())
    }
}

/// Takes the lease row: a new replica at epoch 1, a known one at its next
/// epoch. Rows of replicas gone for a day are deleted on the way.
fn acquire(db: &dyn Db, cfg: &LeaseConfig) -> StoreResult<i64> {
    run(
        db,
        "forget replicas gone for a day",
        &format!("DELETE FROM replicas WHERE expires_us < {NOW_US} - 86400000000"),
        &[],
    )?;
    let epoch = query_first(
        db,
        &format!(
            "INSERT INTO replicas (id, epoch, expires_us, reads_event_groups) \
             VALUES (?1, 1, {NOW_US} + ?2, TRUE) \
             ON CONFLICT (id) DO UPDATE SET epoch = replicas.epoch + 1, \
             expires_us = excluded.expires_us, reads_event_groups = TRUE RETURNING epoch"
        ),
        params![cfg.replica_id, cfg.ttl_us()],
        |r| col::<i64>(r, "epoch"),
    )?;
    epoch.ok_or_else(|| StoreError::unavailable("take the lease", "the lease row was not written"))
}

/// Extends the lease if it is still ours and has not run out: whether it
/// was.
fn renew(db: &dyn Db, cfg: &LeaseConfig, epoch: i64) -> StoreResult<bool> {
    let n = run(
        db,
        "renew the lease",
        &format!(
            "UPDATE replicas SET expires_us = {NOW_US} + ?3 \
             WHERE id = ?1 AND epoch = ?2 AND expires_us > {NOW_US}"
        ),
        params![cfg.replica_id, epoch, cfg.ttl_us()],
    )?;
    Ok(n == 1)
}

/// Whether `owner`'s lease is live now: what every write batch checks.
pub(super) fn is_live(db: &dyn Db, owner: &Owner) -> StoreResult<bool> {
    let n = query_first(
        db,
        &format!(
            "SELECT COUNT(*) AS n FROM replicas \
             WHERE id = ?1 AND epoch = ?2 AND expires_us > {NOW_US}"
        ),
        params![owner.replica, owner.epoch],
        |r| col::<i64>(r, "n"),
    )?;
    Ok(n == Some(1))
}

/// Now on the database's clock ([`NOW_US`]): what leases are measured
/// with (the store's `lease_clock`, the sweep).
pub(super) fn db_now_us(db: &dyn Db) -> StoreResult<i64> {
    query_first(db, &format!("SELECT {NOW_US} AS now"), &[], |r| {
        col::<i64>(r, "now")
    })?
    .ok_or_else(|| StoreError::unavailable("read the time of the database", "it did not say"))
}

/// Marks the lease lost, once, and says so.
fn declare_lost(lost: &watch::Sender<bool>, owner: &Owner, why: &str) {
    if !lost.send_replace(true) {
        tracing::error!(replica = %owner.replica, epoch = owner.epoch, "store: the replica's lease is lost: {why}");
    }
}

/// How often the renewal thread sweeps orphans (in renewals).
const SWEEP_EVERY: u32 = 5;

/// The held lease: its owner (for hellos and the batches' check), whether
/// it is lost, and the thread renewing it (stopped, and the lease given
/// back, when this is dropped).
pub(super) struct Lease {
    owner: Owner,
    lost: Arc<watch::Sender<bool>>,
    stop: Mutex<Option<mpsc::Sender<()>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Lease {
    /// Takes the lease on `conn` and starts renewing it.
    pub fn start(conn: &PgConn, target: &Target, cfg: LeaseConfig) -> StoreResult<Lease> {
        cfg.check().map_err(StoreError::Unusable)?;
        let epoch = acquire(conn, &cfg)?;
        let owner = Owner {
            replica: cfg.replica_id.clone(),
            epoch,
        };
        tracing::info!(replica = %owner.replica, epoch, "store: replica lease taken");
        let (lost, _) = watch::channel(false);
        let lost = Arc::new(lost);
        let (stop_tx, stop_rx) = mpsc::channel();
        let renewer = Renewer {
            target: target.clone(),
            cfg,
            owner: owner.clone(),
            lost: Arc::clone(&lost),
            conn: None,
        };
        let thread = std::thread::Builder::new()
            .name("store-lease".into())
            .spawn(move || renewer.run(&stop_rx))
            .map_err(|e| StoreError::unavailable("start the lease thread", e))?;
        Ok(Lease {
            owner,
            lost,
            stop: Mutex::new(Some(stop_tx)),
            thread: Mutex::new(Some(thread)),
        })
    }

    pub fn owner(&self) -> &Owner {
        &self.owner
    }

    /// Becomes `true` (for good) once the lease is lost.
    pub fn lost(&self) -> watch::Receiver<bool> {
        self.lost.subscribe()
    }

    /// Marks the lease lost (a batch found it run out).
    pub fn mark_lost(&self, why: &str) {
        declare_lost(&self.lost, &self.owner, why);
    }

    pub fn is_lost(&self) -> bool {
        *self.lost.borrow()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        drop(
            self.stop
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
        let thread = self
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

/// The renewal thread's state.
struct Renewer {
    target: Target,
    cfg: LeaseConfig,
    owner: Owner,
    lost: Arc<watch::Sender<bool>>,
    conn: Option<PgConn>,
}

impl Renewer {
    fn run(mut self, stop: &mpsc::Receiver<()>) {
        let mut last_ok = Instant::now();
        let mut ticks = 0u32;
        loop {
            match stop.recv_timeout(self.cfg.renew_every) {
                Err(RecvTimeoutError::Timeout) => {}
                // Dropped: the store is gone; give the lease back so the
                // other replicas see its agents gone at once.
                _ => {
                    self.give_back();
                    return;
                }
            }
            if *self.lost.borrow() {
                continue;
            }
            match self.renew_once() {
                Ok(true) => last_ok = Instant::now(),
                Ok(false) => {
                    self.lose("the lease ran out or was taken by a newer start of this replica");
                    continue;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "store: renewing the replica's lease");
                    self.conn = None;
                    if last_ok.elapsed() >= self.cfg.ttl {
                        self.lose(&format!("not renewed for {:?}: {e}", self.cfg.ttl));
                    }
                    continue;
                }
            }
            ticks = ticks.wrapping_add(1);
            if ticks.is_multiple_of(SWEEP_EVERY)
                && let Err(e) = self.sweep()
            {
                tracing::warn!(error = %e, "store: marking the agents of lost replicas disconnected");
            }
        }
    }

    fn conn(&mut self) -> StoreResult<&PgConn> {
        if self.conn.as_ref().is_none_or(PgConn::is_closed) {
            self.conn = Some(PgConn::new(connect(&self.target)?));
        }
        self.conn
            .as_ref()
            .ok_or_else(|| StoreError::unavailable("renew the lease", "no connection"))
    }

    fn renew_once(&mut self) -> StoreResult<bool> {
        let (cfg, epoch) = (self.cfg.clone(), self.owner.epoch);
        renew(self.conn()?, &cfg, epoch)
    }

    /// The agents whose stream no live lease holds are not connected: how
    /// the agents of a replica that died are seen to be gone.
    fn sweep(&mut self) -> StoreResult<u64> {
        let conn = self.conn()?;
        let n = disconnect_unowned(conn, db_now_us(conn)?, None)?;
        if n > 0 {
            tracing::info!(
                agents = n,
                "store: agents of replicas whose lease ran out marked disconnected"
            );
        }
        Ok(n)
    }

    fn lose(&self, why: &str) {
        declare_lost(&self.lost, &self.owner, why);
    }

    fn give_back(&mut self) {
        if *self.lost.borrow() {
            return;
        }
        let (id, epoch) = (self.owner.replica.clone(), self.owner.epoch);
        let given = self.conn().and_then(|c| {
            run(
                c,
                "give the lease back",
                &format!("UPDATE replicas SET expires_us = {NOW_US} WHERE id = ?1 AND epoch = ?2"),
                params![id, epoch],
            )
        });
        if let Err(e) = given {
            tracing::warn!(error = %e, "store: giving the replica's lease back");
        }
        if let Some(c) = self.conn.take() {
            let _ = c.close();
        }
    }
}
