//! Day partitions of feedback and clock history (migration 15): made
//! ahead of time, and dropped whole by retention.
//!
//! * **Made ahead** by whichever replica gets there first: at open and
//!   every [`MAKE_EVERY`] after, in one transaction under an advisory lock
//!   (a second replica waits, then finds each day made). A day's partition
//!   takes out of the DEFAULT partition the rows that belong to it (rows
//!   stored before the day was made: a clock far ahead), then is attached.
//!   Days from yesterday to [`AHEAD_DAYS`] ahead are made, so a replica
//!   down for days comes back to days ready.
//! * **Dropped** when every row in it is past the window: clock history by
//!   its key alone (the day ends before the cut-off), feedback when also
//!   no row of the day was *received* at or after the cut-off (a late
//!   re-send keeps its day until it, too, is past). A drop takes the
//!   parent's lock first (the order an insert takes them in, so the two
//!   never deadlock), waits at most [`DROP_LOCK_TIMEOUT`] for it, and
//!   otherwise leaves the day for the next sweep. Rows in the DEFAULT
//!   partition are deleted one by one as before (`sql::feedback`'s
//!   statements, on it alone).
//!
//! So on PostgreSQL a row goes within a day of its window's end, where the
//! embedded store deletes it at the next sweep: retention is
//! by whole days, as the price of never deleting the rows of a busy site
//! one at a time.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use postgres::Client;

use super::conn::detailed;
use super::{Target, connect};
use baton_store::{Grows, StoreError, StoreResult};

/// A day, in the nanoseconds of the partition keys.
pub const DAY_NS: i64 = 86_400 * 1_000_000_000;
/// Days made ahead of today.
pub const AHEAD_DAYS: i64 = 3;
/// How often a replica makes the days ahead.
pub const MAKE_EVERY: Duration = Duration::from_secs(3600);
/// Longest a drop waits for the table's lock (ingest waits behind it
/// meanwhile).
pub const DROP_LOCK_TIMEOUT: &str = "500ms";

/// The advisory lock partitions are made and dropped under.
const PARTITION_LOCK: i64 = 0x6261_746f_6e50; // "batonP"

/// A partitioned table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Parted {
    /// `feedback`, by `scheduled_ns`.
    Feedback,
    /// `clock_reports`, by `at_ns`.
    Clock,
}

impl Parted {
    /// Both.
    pub const ALL: [Parted; 2] = [Parted::Feedback, Parted::Clock];

    /// The table's name.
    pub fn table(self) -> &'static str {
        match self {
            Parted::Feedback => "feedback",
            Parted::Clock => "clock_reports",
        }
    }

    /// Its partition key.
    fn key(self) -> &'static str {
        match self {
            Parted::Feedback => "scheduled_ns",
            Parted::Clock => "at_ns",
        }
    }

    /// Its DEFAULT partition (rows outside every day made).
    pub fn default_partition(self) -> &'static str {
        match self {
            Parted::Feedback => "feedback_default",
            Parted::Clock => "clock_reports_default",
        }
    }

    /// The partitioned table retention sweeps as `what`.
    pub fn of(what: Grows) -> Option<Parted> {
        match what {
            Grows::Feedback => Some(Parted::Feedback),
            Grows::Clock => Some(Parted::Clock),
            Grows::Audit | Grows::Events => None,
        }
    }

    /// The partition of day `day` (days since the epoch):
    /// `feedback_p20261206`.
    pub fn partition(self, day: i64) -> String {
        let date =
            day_start(day).map_or_else(|| format!("d{day}"), |t| t.strftime("%Y%m%d").to_string());
        format!("{}_p{date}", self.table())
    }

    /// The day a partition of this table is (`None`: not one of ours).
    pub fn day_of_partition(self, name: &str) -> Option<i64> {
        let digits = name.strip_prefix(self.table())?.strip_prefix("_p")?;
        if digits.len() != 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let date = jiff::civil::Date::strptime("%Y%m%d", digits).ok()?;
        let t = date
            .to_zoned_datetime(jiff::tz::TimeZone::UTC)
            .ok()?
            .timestamp();
        Some(t.as_second().div_euclid(86_400))
    }
}

/// The day (since the epoch, UTC) an instant is in.
pub fn day_of(ns: i64) -> i64 {
    ns.div_euclid(DAY_NS)
}

fn day_start(day: i64) -> Option<jiff::Timestamp> {
    jiff::Timestamp::from_second(day.checked_mul(86_400)?).ok()
}

/// A day's range of keys, `[lo, hi)` (`None`: past the keys' range).
fn bounds(day: i64) -> Option<(i64, i64)> {
    let lo = day.checked_mul(DAY_NS)?;
    Some((lo, lo.checked_add(DAY_NS)?))
}

fn failed(what: &'static str) -> impl Fn(postgres::Error) -> StoreError {
    move |e| StoreError::unavailable(what, detailed(&e))
}

/// Makes every day from yesterday to [`AHEAD_DAYS`] after `now_ns`'s that
/// is not made yet, in both tables; returns the partitions made.
pub fn make_ahead(client: &mut Client, now_ns: i64) -> StoreResult<Vec<String>> {
    let today = day_of(now_ns);
    make_days(client, today - 1..=today + AHEAD_DAYS)
}

/// Makes each of `days` not made yet (see the module doc).
pub fn make_days(
    client: &mut Client,
    days: std::ops::RangeInclusive<i64>,
) -> StoreResult<Vec<String>> {
    let mut tx = client
        .transaction()
        .map_err(failed("begin making partitions"))?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&PARTITION_LOCK])
        .map_err(failed("lock the partitions"))?;
    let mut made = Vec::new();
    for t in Parted::ALL {
        for day in days.clone() {
            let name = t.partition(day);
            let exists: bool = tx
                .query_one("SELECT to_regclass($1) IS NOT NULL", &[&name])
                .map_err(failed("look for a partition"))?
                .get(0);
            let Some((lo, hi)) = bounds(day) else {
                continue;
            };
            if exists {
                continue;
            }
            let (table, key, default) = (t.table(), t.key(), t.default_partition());
            // LIKE without INCLUDING IDENTITY: the ids stay the parent's.
            tx.batch_execute(&format!(
                "CREATE TABLE {name} (LIKE {table} INCLUDING DEFAULTS)"
            ))
            .map_err(failed("create a partition"))?;
            tx.execute(
                &format!(
                    "WITH moved AS (DELETE FROM {default} WHERE {key} >= $1 AND {key} < $2 \
                     RETURNING *) INSERT INTO {name} SELECT * FROM moved"
                ),
                &[&lo, &hi],
            )
            .map_err(failed("move a day's rows out of the default partition"))?;
            tx.batch_execute(&format!(
                "ALTER TABLE {table} ATTACH PARTITION {name} FOR VALUES FROM ({lo}) TO ({hi})"
            ))
            .map_err(failed("attach a partition"))?;
            if t == Parted::Feedback {
                // A day's own `received_ns` summary (migration 17): not
                // the parent's, which the DEFAULT partition's btree is not.
                tx.batch_execute(&format!(
                    "CREATE INDEX IF NOT EXISTS {name}_by_received ON {name} USING brin (received_ns)"
                ))
                .map_err(failed("index a partition's received_ns"))?;
            }
            made.push(name);
        }
    }
    tx.commit().map_err(failed("commit the partitions made"))?;
    Ok(made)
}

/// The days of `t` made, oldest first, with the planner's count of their
/// rows (−1: never counted).
pub fn days(client: &mut Client, t: Parted) -> StoreResult<Vec<(i64, String, f64)>> {
    let rows = client
        .query(
            "SELECT c.relname::text AS name, c.reltuples::float8 AS rows FROM pg_inherits i \
             JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass($1)",
            &[&t.table()],
        )
        .map_err(failed("list the partitions"))?;
    let mut days: Vec<(i64, String, f64)> = rows
        .iter()
        .filter_map(|r| {
            let name: String = r.get("name");
            Some((t.day_of_partition(&name)?, name, r.get("rows")))
        })
        .collect();
    days.sort_by_key(|d| d.0);
    Ok(days)
}

/// Drops every day of `t` whose rows are all older than `before_ns` (see
/// the module doc), each in a transaction of its own; returns how many
/// rows went (the planner's count where the table was counted, else an
/// exact count).
pub fn drop_before(client: &mut Client, t: Parted, before_ns: i64) -> StoreResult<u64> {
    let mut gone = 0u64;
    for (day, name, counted) in days(client, t)? {
        let Some((_, hi)) = bounds(day) else {
            continue;
        };
        if hi > before_ns {
            break;
        }
        match drop_day(client, t, &name, before_ns, counted)? {
            Some(n) => gone += n,
            None => break,
        }
    }
    Ok(gone)
}

/// Drops one day if it is still wholly past; `Some(rows)` if dropped or
/// kept for a late row, `None` if its lock was not had in time.
fn drop_day(
    client: &mut Client,
    t: Parted,
    name: &str,
    before_ns: i64,
    counted: f64,
) -> StoreResult<Option<u64>> {
    let mut tx = client
        .transaction()
        .map_err(failed("begin dropping a partition"))?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&PARTITION_LOCK])
        .map_err(failed("lock the partitions"))?;
    tx.batch_execute(&format!("SET LOCAL lock_timeout = '{DROP_LOCK_TIMEOUT}'"))
        .map_err(failed("bound the wait for a partition's lock"))?;
    let table = t.table();
    if let Err(e) = tx.batch_execute(&format!("LOCK TABLE ONLY {table} IN ACCESS EXCLUSIVE MODE")) {
        if e.code() == Some(&postgres::error::SqlState::LOCK_NOT_AVAILABLE) {
            tracing::info!(
                table,
                "retention: {name} is busy; dropped at the next sweep"
            );
            return Ok(None);
        }
        return Err(failed("lock a partitioned table")(e));
    }
    if t == Parted::Feedback {
        let late: bool = tx
            .query_one(
                &format!("SELECT EXISTS (SELECT 1 FROM {name} WHERE received_ns >= $1)"),
                &[&before_ns],
            )
            .map_err(failed("look for a late row"))?
            .get(0);
        if late {
            return Ok(Some(0));
        }
    }
    let rows = if counted >= 0.0 {
        counted as u64
    } else {
        let n: i64 = tx
            .query_one(&format!("SELECT count(*) FROM {name}"), &[])
            .map_err(failed("count a partition"))?
            .get(0);
        u64::try_from(n).unwrap_or(0)
    };
    tx.batch_execute(&format!("DROP TABLE {name}"))
        .map_err(failed("drop a partition"))?;
    tx.commit().map_err(failed("commit a partition's drop"))?;
    tracing::info!(table, rows, "retention: dropped {name}");
    Ok(Some(rows))
}

/// A connection for partition work, and the thread that makes days ahead.
pub(super) struct Partitions {
    target: Target,
    conn: Mutex<Option<Client>>,
    stop: Arc<AtomicBool>,
    wake: Arc<(Mutex<()>, std::sync::Condvar)>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Partitions {
    /// Makes the days around now (before the store serves), then starts
    /// the thread that keeps making them.
    pub fn start(target: Target) -> StoreResult<Arc<Partitions>> {
        let p = Arc::new(Partitions {
            target,
            conn: Mutex::new(None),
            stop: Arc::new(AtomicBool::new(false)),
            wake: Arc::new((Mutex::new(()), std::sync::Condvar::new())),
            thread: Mutex::new(None),
        });
        p.with(|c| make_ahead(c, now_ns()).map(drop))?;
        let weak = Arc::downgrade(&p);
        let (stop, wake) = (Arc::clone(&p.stop), Arc::clone(&p.wake));
        let thread = std::thread::Builder::new()
            .name("store-partitions".into())
            .spawn(move || {
                loop {
                    let (lock, cv) = &*wake;
                    let guard = lock.lock().unwrap_or_else(PoisonError::into_inner);
                    let _ = cv
                        .wait_timeout_while(guard, MAKE_EVERY, |()| !stop.load(Ordering::SeqCst))
                        .unwrap_or_else(PoisonError::into_inner);
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let Some(p) = weak.upgrade() else { return };
                    if let Err(e) = p.with(|c| make_ahead(c, now_ns()).map(drop)) {
                        tracing::warn!("store: days ahead not made ({e}); tried again in an hour");
                    }
                }
            })
            .map_err(|e| StoreError::unavailable("start the partitions' thread", e))?;
        *p.thread.lock().unwrap_or_else(PoisonError::into_inner) = Some(thread);
        Ok(p)
    }

    /// Runs `f` on the partition connection (made again if it was lost).
    pub fn with<T>(&self, f: impl FnOnce(&mut Client) -> StoreResult<T>) -> StoreResult<T> {
        let mut conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        if conn.as_ref().is_none_or(Client::is_closed) {
            *conn = Some(connect(&self.target)?);
        }
        let client = conn.as_mut().expect("connected above");
        let out = f(client);
        if out.is_err() && client.is_closed() {
            *conn = None;
        }
        out
    }
}

impl Drop for Partitions {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.wake.1.notify_all();
        let thread = self
            .thread
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        // The thread may hold the last reference for a moment (then this
        // runs on it, and it ends by itself).
        if let Some(t) = thread
            && t.thread().id() != std::thread::current().id()
        {
            let _ = t.join();
        }
        // The sync client owns a small runtime, which may not be dropped on
        // an async runtime's thread.
        let conn = self
            .conn
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(c) = conn {
            let _ = std::thread::spawn(move || drop(c)).join();
        }
    }
}

fn now_ns() -> i64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}
