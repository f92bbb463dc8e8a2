//! Reads on the asynchronous client: at most [`Target::readers`] at once
//! (a turn awaited on the runtime, holding nothing), their statements
//! sent over shared connections ([`Target::read_connections`]; as many
//! as reads by default, fewer to pipeline reads behind each other), where
//! a pool of synchronous clients held a connection and a blocking thread
//! per read.
//!
//! A read is the shared synchronous SQL (`sql/`, one text of every
//! statement and decoder for SQLite and PostgreSQL), a pure `Fn` of what
//! its statements answer. It runs on the runtime by replay ([`Replay`]):
//! run it; at its first statement not yet answered it is stopped (the
//! statement refused, whatever it does with that discarded), the
//! statement is sent and awaited, and it runs again from the start with
//! that answer, until it asks nothing new. A read of `k` statements thus
//! runs `k + 1` times, decoding its earlier answers again each time:
//! microseconds against a round trip while they are a few rows. A read
//! whose answers grow past [`SMALL_ANSWERS`] rows or [`MAX_ROUNDS`]
//! statements, or that asks otherwise the second time, runs once more on
//! a blocking thread, given what it was answered, its further statements
//! waiting for the client there: a long decode holds no worker thread
//! (and no agent's stream) up. Measured by `benches/read_path.rs` against
//! the asynchronous client used directly, and by the fleet bench.
//!
//! A read goes to the connection with the fewest in flight; with fewer
//! connections than reads, a slow read delays those queued behind it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::runtime::Handle;
use tokio_postgres::Statement;

use super::Target;
use super::conn::{as_sql, detailed, pg_failed};
use crate::sql::db::{Db, Param, Row, failed, numbered_placeholders};
use crate::sql::off_runtime;
use baton_store::{StoreError, StoreResult};

/// How long opening a read connection may take, unless the store's URL
/// says (`connect_timeout`).
const READ_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The `application_name` of read connections (`pg_stat_activity`).
pub(super) const READ_APPLICATION: &str = "baton-read";

/// The reads of one store.
pub(super) struct Reads {
    target: Target,
    /// One per read running.
    permits: Arc<tokio::sync::Semaphore>,
    /// Reads waiting for a turn.
    queued: AtomicUsize,
    /// Where reads' connections are (a lock held only to choose one).
    slots: Mutex<Vec<Arc<Slot>>>,
}

/// A place for one connection: opened when a read first needs it, and
/// again once lost (under `conn`'s lock, so reads that come meanwhile
/// wait for that one rather than each opening its own).
#[derive(Default)]
struct Slot {
    /// Reads that chose this slot and have not ended.
    in_flight: AtomicUsize,
    conn: tokio::sync::Mutex<Option<Arc<ReadConn>>>,
}

/// A connection reads share.
struct ReadConn {
    client: tokio_postgres::Client,
    /// Statements prepared on it, by their text.
    statements: Mutex<HashMap<String, Statement>>,
}

/// A read counted as waiting for its turn, until it has it or is given up.
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn new(queued: &'a AtomicUsize) -> Waiting<'a> {
        queued.fetch_add(1, Ordering::SeqCst);
        Waiting(queued)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl ReadConn {
    /// `sql` run with `params` (prepared on this connection once), as a
    /// query (`rows`) or a statement: one way for the replays and for a
    /// read finishing on a blocking thread.
    async fn answer(&self, sql: &str, params: &[Param<'_>], rows: bool) -> Result<Answer, Failed> {
        let known = self
            .statements
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(sql)
            .cloned();
        let stmt = match known {
            Some(s) => s,
            None => {
                let s = self
                    .client
                    .prepare(&numbered_placeholders(sql))
                    .await
                    .map_err(|error| Failed {
                        what: PREPARE,
                        error,
                    })?;
                self.statements
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(sql.to_owned(), s.clone());
                s
            }
        };
        let params = as_sql(params);
        if rows {
            let rows = self.client.query(&stmt, &params).await;
            rows.map(Answer::Rows)
                .map_err(|error| Failed { what: QUERY, error })
        } else {
            let n = self.client.execute(&stmt, &params).await;
            n.map(Answer::Count).map_err(|error| Failed {
                what: EXECUTE,
                error,
            })
        }
    }
}

/// A read's count on its slot, while it runs.
struct InFlight(Arc<Slot>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Slot {
    /// The slot's connection: the one open, or a new one in place of
    /// `lost` (or of one the server closed).
    async fn conn(
        &self,
        target: &Target,
        lost: Option<&Arc<ReadConn>>,
    ) -> StoreResult<Arc<ReadConn>> {
        let mut conn = self.conn.lock().await;
        match &*conn {
            Some(c) if !c.client.is_closed() && !lost.is_some_and(|l| Arc::ptr_eq(l, c)) => {
                Ok(Arc::clone(c))
            }
            _ => {
                let fresh = Arc::new(connect(target).await?);
                *conn = Some(Arc::clone(&fresh));
                Ok(fresh)
            }
        }
    }
}

impl Reads {
    pub fn new(target: Target) -> Reads {
        let slots = (0..target.read_connections.min(target.readers))
            .map(|_| Arc::new(Slot::default()))
            .collect();
        Reads {
            permits: Arc::new(tokio::sync::Semaphore::new(target.readers)),
            queued: AtomicUsize::new(0),
            slots: Mutex::new(slots),
            target,
        }
    }

    /// Reads running and reads waiting for a turn, now.
    pub fn now(&self) -> (usize, usize) {
        (
            self.target.readers - self.permits.available_permits(),
            self.queued.load(Ordering::SeqCst),
        )
    }

    /// Runs `f` once its turn came, replayed on a shared connection (see
    /// the module doc). A connection the server closed since (a restart,
    /// a cut) is found out only when used: then `f` runs once more on a
    /// new one (reads change nothing).
    pub async fn run<T, F>(self: &Arc<Self>, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: Fn(&dyn Db) -> StoreResult<T> + Send + 'static,
    {
        // The turn is awaited here, on the runtime: a read waiting holds
        // no thread and no connection (and one given up while waiting
        // is no longer counted as waiting).
        let turn = {
            let _waiting = Waiting::new(&self.queued);
            Arc::clone(&self.permits).acquire_owned().await
        };
        let turn = turn.map_err(|_| StoreError::Closed)?;
        // The read is a task of its own that holds the turn: a caller that
        // gives up (a client gone) does not free the turn while its
        // statement is still on the connection, and a panic is an error.
        let reads = Arc::clone(self);
        tokio::spawn(async move {
            let out = reads.replayed(f).await;
            drop(turn);
            out
        })
        .await
        .map_err(|e| StoreError::unavailable("a read", e.to_string()))?
    }

    /// [`Reads::run`] once its turn came.
    async fn replayed<T, F>(self: Arc<Self>, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: Fn(&dyn Db) -> StoreResult<T> + Send + 'static,
    {
        let slot = self.pick();
        let mut conn = slot.0.conn(&self.target, None).await?;
        let mut answers: Vec<Answered> = Vec::new();
        let mut reopened = false;
        let mut rows = 0;
        loop {
            let replay = Replay {
                answers: &answers,
                next: std::cell::Cell::new(0),
                asked: std::cell::RefCell::new(None),
            };
            let out = f(&replay);
            let Some(ask) = replay.asked.into_inner() else {
                return out;
            };
            if ask.index < answers.len() || answers.len() == MAX_ROUNDS || rows > SMALL_ANSWERS {
                // Asked otherwise than the first time (not a pure read),
                // past the replays' bound, or answered more rows than
                // are decoded again cheaply on the runtime's threads.
                break;
            }
            let answer = ask.send(&conn).await;
            let gone = match &answer {
                Err(f) => f.gone() || conn.client.is_closed(),
                Ok(_) => false,
            };
            if gone && !reopened {
                // Found out here that the server closed it: once more on
                // a new one, from the start (what it answered before is
                // still what it answered).
                reopened = true;
                conn = slot.0.conn(&self.target, Some(&conn)).await?;
                continue;
            }
            if let Ok(Answer::Rows(r)) = &answer {
                rows += r.len();
            }
            answers.push(Answered {
                sql: ask.sql,
                params: ask.params,
                answer,
            });
            if rows > SMALL_ANSWERS {
                // Decoded once, where a long decode holds no stream up.
                break;
            }
        }
        tracing::debug!(
            statements = answers.len(),
            "store: a read past its replays (or not asking the same again) runs on a blocking thread"
        );
        let handle = Handle::current();
        // The read and its answers go to the thread and come back, for
        // a second run on a new connection.
        let on_thread = |f: F, answers: Vec<Answered>, conn: Arc<ReadConn>| {
            let handle = handle.clone();
            off_runtime(move || {
                let out = f(&OnConn {
                    conn: &conn,
                    handle: &handle,
                    known: &answers,
                    next: std::cell::Cell::new(0),
                });
                Ok((f, answers, out))
            })
        };
        let (f, answers, out) = on_thread(f, answers, Arc::clone(&conn)).await?;
        if out.is_err() && conn.client.is_closed() && !reopened {
            // Reopened here, on the runtime: on the blocking thread, the
            // connection's name look-up would wait for a blocking thread
            // of its own, which reads waiting there could all be holding.
            let fresh = slot.0.conn(&self.target, Some(&conn)).await?;
            return on_thread(f, answers, fresh).await?.2;
        }
        out
    }

    /// The slot with the fewest reads, counted in for this one.
    fn pick(&self) -> InFlight {
        let slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let slot = slots
            .iter()
            .min_by_key(|s| s.in_flight.load(Ordering::SeqCst))
            .expect("at least one read connection");
        slot.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(Arc::clone(slot))
    }
}

/// Opens a read connection, its task on the runtime.
async fn connect(target: &Target) -> StoreResult<ReadConn> {
    let mut config = target.async_config.clone();
    config.application_name(READ_APPLICATION);
    if config.get_connect_timeout().is_none() {
        // Reads queued on a slot wait for its connection: an unreachable
        // server must fail them in seconds, not at the system's TCP
        // timeout (minutes).
        config.connect_timeout(READ_CONNECT_TIMEOUT);
    }
    let failed = |e: tokio_postgres::Error| {
        StoreError::unavailable(
            format!("connect to PostgreSQL at {}", target.address()),
            detailed(&e),
        )
    };
    // The whole of it bounded (the client's own timeout is each host's
    // TCP connect only: a server that accepts and then hangs would hold
    // the slot, and the reads waiting on it, for ever): each host's
    // connect, then as long again for TLS and the log-in.
    let per_host = config
        .get_connect_timeout()
        .copied()
        .unwrap_or(READ_CONNECT_TIMEOUT);
    let hosts = u32::try_from(config.get_hosts().len().max(1)).unwrap_or(u32::MAX);
    let whole = per_host.saturating_mul(hosts).saturating_add(per_host);
    let timed_out = || {
        StoreError::unavailable(
            format!("connect to PostgreSQL at {}", target.address()),
            format!("no answer within {whole:?}"),
        )
    };
    let client = match &target.tls {
        Some(tls) => {
            let (client, conn) = tokio::time::timeout(whole, config.connect(tls.clone()))
                .await
                .map_err(|_| timed_out())?
                .map_err(failed)?;
            tokio::spawn(drive(conn));
            client
        }
        None => {
            let (client, conn) = tokio::time::timeout(whole, config.connect(tokio_postgres::NoTls))
                .await
                .map_err(|_| timed_out())?
                .map_err(failed)?;
            tokio::spawn(drive(conn));
            client
        }
    };
    Ok(ReadConn {
        client,
        statements: Mutex::default(),
    })
}

/// Runs a connection until it closes; its end is found by the next read
/// on it (`is_closed`), which opens another.
async fn drive<F>(conn: F)
where
    F: std::future::Future<Output = Result<(), tokio_postgres::Error>>,
{
    if let Err(e) = conn.await {
        tracing::debug!(error = %detailed(&e), "store: a read connection ended");
    }
}

/// A read's view of its connection on a blocking thread, as the shared
/// SQL's [`Db`]: what its replays were answered, again, as long as it
/// asks the same; then each statement sent and waited for there.
struct OnConn<'a> {
    conn: &'a ReadConn,
    handle: &'a Handle,
    known: &'a [Answered],
    next: std::cell::Cell<usize>,
}

impl OnConn<'_> {
    /// The answer already had for the next statement, if it is the one
    /// asked (from then on, none: the read went its own way).
    fn known(&self, sql: &str, params: &[Param<'_>], rows: bool) -> Option<&Answered> {
        let index = self.next.get();
        let a = self.known.get(index).filter(|a| a.same(sql, params, rows));
        self.next
            .set(if a.is_some() { index + 1 } else { usize::MAX });
        a
    }
}

impl Db for OnConn<'_> {
    fn query_each(
        &self,
        sql: &str,
        params: &[Param<'_>],
        each: &mut dyn FnMut(&dyn Row) -> StoreResult<()>,
    ) -> StoreResult<()> {
        match self.known(sql, params, true) {
            Some(a) => a.rows(sql, each),
            None => rows_of(
                &self.handle.block_on(self.conn.answer(sql, params, true)),
                sql,
                each,
            ),
        }
    }

    fn execute(&self, sql: &str, params: &[Param<'_>]) -> StoreResult<u64> {
        match self.known(sql, params, false) {
            Some(a) => a.count(sql),
            None => count_of(
                &self.handle.block_on(self.conn.answer(sql, params, false)),
                sql,
            ),
        }
    }
}

/// Statements a read is replayed for at most before it runs on a
/// blocking thread instead (its earlier answers decoded again each time).
const MAX_ROUNDS: usize = 16;

/// Rows a read's answers hold at most to be replayed on the runtime's
/// threads: past it the read is decoded once on a blocking thread (a page
/// of a thousand agents, decoded again at each replay on one of two
/// worker threads, held the agents' streams up: the fleet bench's push
/// p99 went from 190–240 ms to 290–340).
const SMALL_ANSWERS: usize = 64;

/// A statement's answer, as a read is replayed with it.
enum Answer {
    Rows(Vec<tokio_postgres::Row>),
    Count(u64),
}

/// A statement that failed: `what` it was doing (preparing or running).
struct Failed {
    what: &'static str,
    error: tokio_postgres::Error,
}

impl Failed {
    /// Whether it says the connection is gone (the server shut it, or it
    /// broke), before the client may have seen it close.
    fn gone(&self) -> bool {
        use tokio_postgres::error::SqlState;
        self.error.is_closed()
            || self.error.code().is_some_and(|c| {
                *c == SqlState::ADMIN_SHUTDOWN
                    || *c == SqlState::CRASH_SHUTDOWN
                    || *c == SqlState::CANNOT_CONNECT_NOW
            })
    }

    /// The error the synchronous path gives for the same failure.
    fn error(&self, sql: &str) -> StoreError {
        match self.what {
            PREPARE => failed(PREPARE, sql, detailed(&self.error)),
            what => pg_failed(what, sql, &self.error),
        }
    }
}

const PREPARE: &str = "prepare a statement";
const QUERY: &str = "run a query";
const EXECUTE: &str = "run a statement";

/// A statement sent, and what it answered.
struct Answered {
    sql: String,
    params: Vec<OwnedParam>,
    answer: Result<Answer, Failed>,
}

impl Answered {
    /// Whether it answers `sql` with `params`, as a query (`rows`) or a
    /// statement.
    fn same(&self, sql: &str, params: &[Param<'_>], rows: bool) -> bool {
        let kind = match &self.answer {
            Ok(Answer::Rows(_)) => rows,
            Ok(Answer::Count(_)) => !rows,
            Err(_) => true,
        };
        kind && self.sql == sql
            && self.params.len() == params.len()
            && self.params.iter().zip(params).all(|(a, b)| a.view() == *b)
    }

    /// Its rows, to `each` (a query's answer, [`Answered::same`]).
    fn rows(
        &self,
        sql: &str,
        each: &mut dyn FnMut(&dyn Row) -> StoreResult<()>,
    ) -> StoreResult<()> {
        rows_of(&self.answer, sql, each)
    }

    /// The rows it changed (a statement's answer, [`Answered::same`]).
    fn count(&self, sql: &str) -> StoreResult<u64> {
        count_of(&self.answer, sql)
    }
}

/// A query's answer, its rows to `each`, as the shared SQL reads them.
fn rows_of(
    answer: &Result<Answer, Failed>,
    sql: &str,
    each: &mut dyn FnMut(&dyn Row) -> StoreResult<()>,
) -> StoreResult<()> {
    match answer {
        Ok(Answer::Rows(rows)) => {
            for row in rows {
                each(row)?;
            }
            Ok(())
        }
        // Asked as a query: a statement's count is never its answer.
        Ok(Answer::Count(_)) => Err(not_yet()),
        Err(f) => Err(f.error(sql)),
    }
}

/// A statement's answer, the rows it changed.
fn count_of(answer: &Result<Answer, Failed>, sql: &str) -> StoreResult<u64> {
    match answer {
        Ok(Answer::Count(n)) => Ok(*n),
        // Asked as a statement: a query's rows are never its answer.
        Ok(Answer::Rows(_)) => Err(not_yet()),
        Err(f) => Err(f.error(sql)),
    }
}

/// The first statement a replay found unanswered (or asked otherwise
/// than before: `index` below the answers').
struct Ask {
    index: usize,
    sql: String,
    params: Vec<OwnedParam>,
    rows: bool,
}

impl Ask {
    /// Sends it on `conn` and awaits its answer.
    async fn send(&self, conn: &ReadConn) -> Result<Answer, Failed> {
        let views: Vec<Param<'_>> = self.params.iter().map(OwnedParam::view).collect();
        conn.answer(&self.sql, &views, self.rows).await
    }
}

/// A parameter kept for a statement sent later.
#[derive(Debug, PartialEq)]
enum OwnedParam {
    Null,
    Int(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}

impl OwnedParam {
    fn of(p: &Param<'_>) -> OwnedParam {
        match *p {
            Param::Null => OwnedParam::Null,
            Param::Int(i) => OwnedParam::Int(i),
            Param::Real(f) => OwnedParam::Real(f),
            Param::Text(t) => OwnedParam::Text(t.to_owned()),
            Param::Blob(b) => OwnedParam::Blob(b.to_vec()),
        }
    }

    fn view(&self) -> Param<'_> {
        match self {
            OwnedParam::Null => Param::Null,
            OwnedParam::Int(i) => Param::Int(*i),
            OwnedParam::Real(f) => Param::Real(*f),
            OwnedParam::Text(t) => Param::Text(t),
            OwnedParam::Blob(b) => Param::Blob(b),
        }
    }
}

/// A read's [`Db`] while it is replayed: statements answered so far
/// answer again, in order; the first one not answered is kept in `asked`
/// and refused, as is every one after it (the run is discarded).
struct Replay<'a> {
    answers: &'a [Answered],
    /// The index of the read's next statement.
    next: std::cell::Cell<usize>,
    asked: std::cell::RefCell<Option<Ask>>,
}

impl Replay<'_> {
    /// The answer to the next statement, or `None` when it is to be sent
    /// (then kept as asked).
    fn answer(&self, sql: &str, params: &[Param<'_>], rows: bool) -> Option<&Answered> {
        let index = self.next.get();
        self.next.set(index + 1);
        if self.asked.borrow().is_some() {
            return None;
        }
        match self
            .answers
            .get(index)
            .filter(|a| a.same(sql, params, rows))
        {
            Some(a) => Some(a),
            None => {
                *self.asked.borrow_mut() = Some(Ask {
                    index,
                    sql: sql.to_owned(),
                    params: params.iter().map(OwnedParam::of).collect(),
                    rows,
                });
                None
            }
        }
    }
}

/// What a replayed read's statement answers until it is sent: never
/// seen outside (the run that got it is discarded).
fn not_yet() -> StoreError {
    StoreError::unavailable("a read", "its statement is being sent")
}

impl Db for Replay<'_> {
    fn query_each(
        &self,
        sql: &str,
        params: &[Param<'_>],
        each: &mut dyn FnMut(&dyn Row) -> StoreResult<()>,
    ) -> StoreResult<()> {
        match self.answer(sql, params, true) {
            Some(a) => a.rows(sql, each),
            None => Err(not_yet()),
        }
    }

    fn execute(&self, sql: &str, params: &[Param<'_>]) -> StoreResult<u64> {
        match self.answer(sql, params, false) {
            Some(a) => a.count(sql),
            None => Err(not_yet()),
        }
    }
}
