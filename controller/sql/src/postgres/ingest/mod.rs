//! What agents' streams write, into PostgreSQL as a stream, not
//! statements: every batch waiting when the lane's thread comes round —
//! feedback, clock reports, last-seen marks, of any number of agents — is
//! written in one transaction of a few statements whatever its size: the
//! fence (every agent's session generation, locked `FOR SHARE` so a
//! takeover's hello waits for this commit, with the replica's lease in the
//! same look), then for feedback the journals (each one's acked seq before
//! and after, in one upsert) and the rows (one plain `INSERT … SELECT FROM
//! unnest(…)`: see `feedback`'s doc), for clocks the history and each
//! agent's latest (one statement each), for last-seen marks one update.
//! A re-sent entry carrying a count of drops costs a few more, only then.
//!
//! The lane has [`THREADS`] threads, each with a connection of its own,
//! beside the writer's: ingest does not queue behind decisions, nor
//! decisions behind ingest. A transaction the server aborts for another
//! (a deadlock with a decision) runs again, up to [`AGAIN`] times. Each caller
//! gets its own answer: a fenced agent's batch is refused alone (a clock
//! report or a mark of an agent with no record too), a batch with a value
//! past `i64::MAX` too; a failed transaction fails every batch in it, and
//! nothing of it is stored.

mod feedback;
mod status;

use feedback::{Failure, Insert};

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use postgres::{Client, Statement};
use tokio::sync::{mpsc, oneshot};

use super::conn::detailed;
use super::lease::{Lease, NOW_US};
use super::{Target, connect};
use baton_model::SeenRow;
use baton_store::{ClockRow, FeedbackRow, FeedbackStored, StoreError, StoreResult};

/// Batches waiting at most per thread (past it, callers wait to queue).
const QUEUE_DEPTH: usize = 1024;
/// Threads (each with its connection) writing at once: while one waits
/// for the server, another sends; an agent is always written by the same
/// one, so its writes stay in order.
pub const THREADS: usize = 2;
/// Rows per transaction at most (a few thousand: one statement each way).
const MAX_ROWS: usize = 16 * 1024;

/// One caller's feedback batch.
struct Put {
    session: u64,
    rows: Vec<FeedbackRow>,
    reply: oneshot::Sender<StoreResult<FeedbackStored>>,
}

/// One caller's write.
enum Work {
    Feedback(Put),
    Clock {
        session: u64,
        clock: status::Clock,
        reply: oneshot::Sender<StoreResult<()>>,
    },
    Seen {
        session: u64,
        seen: status::Seen,
        reply: oneshot::Sender<StoreResult<()>>,
    },
}

impl Work {
    /// The agent it writes for.
    fn agent(&self) -> &str {
        match self {
            Work::Feedback(p) => p.rows.first().map_or("", |r| r.agent_id.as_str()),
            Work::Clock { clock, .. } => &clock.agent,
            Work::Seen { seen, .. } => &seen.agent,
        }
    }

    /// Rows it writes (its share of a transaction).
    fn rows(&self) -> usize {
        match self {
            Work::Feedback(p) => p.rows.len(),
            Work::Clock { .. } | Work::Seen { .. } => 1,
        }
    }

    fn fail(self, e: &StoreError) {
        match self {
            Work::Feedback(p) => drop(p.reply.send(Err(e.again()))),
            Work::Clock { reply, .. } | Work::Seen { reply, .. } => {
                drop(reply.send(Err(e.again())))
            }
        }
    }
}

/// What the lane has done, for tests and the bench.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IngestStats {
    /// Transactions committed.
    pub transactions: u64,
    /// Callers' batches in them (a clock report or a mark is one).
    pub batches: u64,
    /// Statements sent in them, `BEGIN` and `COMMIT` left out.
    pub statements: u64,
    /// Transactions written again because a plain insert met a feedback
    /// row stored already (see `feedback`'s doc: none expected).
    pub stored_already: u64,
}

#[derive(Debug, Default)]
struct Counters {
    transactions: AtomicU64,
    batches: AtomicU64,
    statements: AtomicU64,
    stored_already: AtomicU64,
}

/// The lane: [`THREADS`] threads, each with its own connection (see the
/// module doc).
pub struct Lane {
    tx: Vec<mpsc::Sender<Work>>,
    threads: Vec<JoinHandle<()>>,
    counters: Arc<Counters>,
}

impl Lane {
    /// Starts the lane's threads on `target`, writing as `lease`'s
    /// replica.
    pub(super) fn start(
        target: Target,
        lease: Arc<Lease>,
        idle_limit: Duration,
        notifier: Arc<super::news::Notifier>,
    ) -> StoreResult<Lane> {
        let counters = Arc::new(Counters::default());
        let (mut senders, mut threads) = (Vec::new(), Vec::new());
        for i in 0..THREADS {
            let (tx, rx) = mpsc::channel(QUEUE_DEPTH);
            let (c, target, lease) = (Arc::clone(&counters), target.clone(), Arc::clone(&lease));
            let notifier = Arc::clone(&notifier);
            let thread = std::thread::Builder::new()
                .name(format!("store-ingest-{i}"))
                .spawn(move || {
                    Ingest {
                        target,
                        lease,
                        idle_limit,
                        conn: None,
                        counters: c,
                        notifier,
                    }
                    .run(rx)
                })
                .map_err(|e| StoreError::unavailable("start the streams' writing thread", e))?;
            senders.push(tx);
            threads.push(thread);
        }
        Ok(Lane {
            tx: senders,
            threads,
            counters,
        })
    }

    async fn send<T>(
        &self,
        work: impl FnOnce(oneshot::Sender<StoreResult<T>>) -> Work,
    ) -> StoreResult<T> {
        let (reply, answer) = oneshot::channel();
        let work = work(reply);
        let tx = self
            .tx
            .get(thread_of(work.agent(), self.tx.len()))
            .ok_or(StoreError::Closed)?;
        tx.send(work).await.map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// Stores one journal's batch, fenced by `session` (see
    /// `StoreOps::put_feedback` for the rules).
    pub async fn put(&self, session: u64, rows: Vec<FeedbackRow>) -> StoreResult<FeedbackStored> {
        self.send(|reply| {
            Work::Feedback(Put {
                session,
                rows,
                reply,
            })
        })
        .await
    }

    /// Stores a clock report of `agent`'s stream `session` (see
    /// `StoreOps::record_clock`).
    pub async fn clock(&self, agent: &str, session: u64, clock: ClockRow) -> StoreResult<()> {
        let clock = status::Clock {
            agent: agent.to_owned(),
            clock,
        };
        self.send(|reply| Work::Clock {
            session,
            clock,
            reply,
        })
        .await
    }

    /// Stores when `agent`'s stream `session` was last seen (see
    /// `StoreOps::agent_seen`).
    pub async fn seen(&self, agent: &str, session: u64, row: SeenRow) -> StoreResult<()> {
        // Refused here, alone: in the batch it would fail its neighbours.
        baton_store::fits(row.health.map_or(0, |h| h.outbox_entries), "outbox entries")?;
        let seen = status::Seen {
            agent: agent.to_owned(),
            row,
        };
        self.send(|reply| Work::Seen {
            session,
            seen,
            reply,
        })
        .await
    }

    /// What the lane has committed so far.
    pub fn stats(&self) -> IngestStats {
        IngestStats {
            transactions: self.counters.transactions.load(Ordering::Relaxed),
            batches: self.counters.batches.load(Ordering::Relaxed),
            statements: self.counters.statements.load(Ordering::Relaxed),
            stored_already: self.counters.stored_already.load(Ordering::Relaxed),
        }
    }
}

impl std::fmt::Debug for Lane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lane")
            .field("stats", &self.stats())
            .finish()
    }
}

impl Drop for Lane {
    fn drop(&mut self) {
        // Each thread ends once its channel is closed and drained.
        self.tx.clear();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The thread an agent's writes go to, of `n`.
fn thread_of(agent: &str, n: usize) -> usize {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    agent.hash(&mut h);
    (h.finish() % n.max(1) as u64) as usize
}

/// The lane's statements, prepared once per connection.
struct Prepared {
    fence: Statement,
    feedback: feedback::Statements,
    status: status::Statements,
}

struct Ingest {
    target: Target,
    lease: Arc<Lease>,
    idle_limit: Duration,
    conn: Option<(Client, Prepared)>,
    counters: Arc<Counters>,
    /// Told when feedback was committed (another replica's watchers
    /// follow it).
    notifier: Arc<super::news::Notifier>,
}

/// A database error as the store's, saying what was being done: a
/// transaction the server aborted for another (a deadlock with a
/// decision on the writer, which locks agents' rows in its own order) is
/// [`StoreError::Contended`], and its drain runs again.
fn fail(what: &'static str) -> impl Fn(postgres::Error) -> StoreError {
    use postgres::error::SqlState;
    move |e| match e.code() {
        Some(c)
            if *c == SqlState::T_R_DEADLOCK_DETECTED
                || *c == SqlState::T_R_SERIALIZATION_FAILURE =>
        {
            StoreError::Contended(format!("{what}: {}", detailed(&e)))
        }
        _ => StoreError::unavailable(what, detailed(&e)),
    }
}

/// Times a drain the server aborted for another transaction runs again
/// before its callers are told.
const AGAIN: usize = 3;

/// The answers of one transaction, in the order of its work.
struct Answers {
    feedback: Vec<StoreResult<FeedbackStored>>,
    clocks: Vec<StoreResult<()>>,
    seen: Vec<StoreResult<()>>,
}

impl Ingest {
    fn run(mut self, mut rx: mpsc::Receiver<Work>) {
        while let Some(first) = rx.blocking_recv() {
            let mut rows = first.rows();
            let mut drain = vec![first];
            while rows < MAX_ROWS {
                match rx.try_recv() {
                    Ok(w) => {
                        rows += w.rows();
                        drain.push(w);
                    }
                    Err(_) => break,
                }
            }
            let n = drain.len() as u64;
            match self.write_again_if_need_be(&drain) {
                Ok(answers) => {
                    if answers
                        .feedback
                        .iter()
                        .any(|r| r.as_ref().is_ok_and(|s| s.inserted > 0))
                    {
                        self.notifier.poke();
                    }
                    self.counters.transactions.fetch_add(1, Ordering::Relaxed);
                    self.counters.batches.fetch_add(n, Ordering::Relaxed);
                    let mut feedback = answers.feedback.into_iter();
                    let mut clocks = answers.clocks.into_iter();
                    let mut seen = answers.seen.into_iter();
                    for w in drain {
                        let closed = StoreError::Closed;
                        match w {
                            Work::Feedback(p) => {
                                let _ = p.reply.send(feedback.next().unwrap_or(Err(closed)));
                            }
                            Work::Clock { reply, .. } => {
                                let _ = reply.send(clocks.next().unwrap_or(Err(closed)));
                            }
                            Work::Seen { reply, .. } => {
                                let _ = reply.send(seen.next().unwrap_or(Err(closed)));
                            }
                        }
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, batches = n, "store: streams' writes not stored");
                    // A transaction left open is rolled back by dropping
                    // it; a broken connection is made again next time.
                    if self.conn.as_ref().is_some_and(|(c, _)| c.is_closed()) {
                        self.conn = None;
                    }
                    for w in drain {
                        w.fail(&e);
                    }
                }
            }
        }
        if let Some((c, _)) = self.conn.take() {
            let _ = c.close();
        }
    }

    /// [`Ingest::write`] of `drain`, again while the server aborts it for
    /// another transaction (up to [`AGAIN`] times), and again skipping
    /// rows stored already should a plain insert meet one.
    fn write_again_if_need_be(&mut self, drain: &[Work]) -> StoreResult<Answers> {
        let mut insert = Insert::New;
        let mut again = 0;
        loop {
            match self.write(drain, insert) {
                Ok(answers) => return Ok(answers),
                Err(Failure::StoredAlready(why)) if insert == Insert::New => {
                    // Not expected (see `feedback`'s doc): said, counted,
                    // and written again the careful way.
                    tracing::warn!(%why, "store: a feedback row was stored already; \
                        writing the batch again skipping stored rows");
                    self.counters.stored_already.fetch_add(1, Ordering::Relaxed);
                    insert = Insert::SkipStored;
                }
                Err(Failure::StoredAlready(why)) => {
                    return Err(StoreError::unavailable("store feedback", why));
                }
                Err(Failure::Store(StoreError::Contended(why))) if again < AGAIN => {
                    tracing::debug!(%why, "store: the streams' writes run again");
                    again += 1;
                }
                Err(Failure::Store(e)) => return Err(e),
            }
        }
    }

    fn connect(&mut self) -> StoreResult<&mut (Client, Prepared)> {
        if self.conn.as_ref().is_none_or(|(c, _)| c.is_closed()) {
            let mut c = connect(&self.target)?;
            let ms = self.idle_limit.as_millis().max(1);
            c.batch_execute(&format!("SET idle_in_transaction_session_timeout = {ms}"))
                .map_err(fail("bound idle transactions"))?;
            let prepared = Prepared {
                fence: c.prepare(&fence_sql()).map_err(fail("prepare the fence"))?,
                feedback: feedback::Statements::prepare(&mut c)
                    .map_err(fail("prepare the feedback statements"))?,
                status: status::Statements::prepare(&mut c)
                    .map_err(fail("prepare the clock statements"))?,
            };
            self.conn = Some((c, prepared));
        }
        self.conn
            .as_mut()
            .ok_or_else(|| StoreError::unavailable("feedback ingest", "no connection"))
    }

    /// One transaction for `drain`: each caller's answer, or why none of
    /// it was stored.
    fn write(&mut self, drain: &[Work], insert: Insert) -> Result<Answers, Failure> {
        let lease = Arc::clone(&self.lease);
        let counters = Arc::clone(&self.counters);
        let (client, prep) = self.connect()?;
        let count = |n: u64| {
            counters.statements.fetch_add(n, Ordering::Relaxed);
        };
        let mut puts: Vec<&Put> = Vec::new();
        let mut clocks: Vec<(u64, &status::Clock)> = Vec::new();
        let mut seen: Vec<(u64, &status::Seen)> = Vec::new();
        for w in drain {
            match w {
                Work::Feedback(p) => puts.push(p),
                Work::Clock { session, clock, .. } => clocks.push((*session, clock)),
                Work::Seen {
                    session, seen: s, ..
                } => seen.push((*session, s)),
            }
        }
        let mut results: Vec<Option<StoreResult<FeedbackStored>>> = puts
            .iter()
            .map(|p| feedback::checked(&p.rows).err().map(Err))
            .collect();
        let mut tx = client.transaction().map_err(fail("begin"))?;

        // 1. The fence and the lease, in one look.
        let agents: Vec<&str> = {
            let mut a: Vec<&str> = puts
                .iter()
                .zip(&results)
                .filter(|(_, r)| r.is_none())
                .filter_map(|(p, _)| p.rows.first().map(|r| r.agent_id.as_str()))
                .chain(clocks.iter().map(|(_, c)| c.agent.as_str()))
                .chain(seen.iter().map(|(_, s)| s.agent.as_str()))
                .collect();
            a.sort_unstable();
            a.dedup();
            a
        };
        let owner = lease.owner();
        let fenced = tx
            .query(&prep.fence, &[&agents, &owner.replica, &owner.epoch])
            .map_err(fail("fence the agents"))?;
        count(1);
        let live = fenced.first().is_some_and(|r| r.get::<_, bool>("live"));
        if !live {
            let e = StoreError::LeaseLost("it ran out before these writes".into());
            lease.mark_lost(&e.to_string());
            return Err(e.into());
        }
        let gens: HashMap<String, i64> = fenced
            .iter()
            .filter_map(|r| Some((r.get::<_, Option<String>>("id")?, r.get("session_gen"))))
            .collect();
        // Feedback of an agent with no record is stored (forgotten while
        // its stream ran); a clock report or a mark is not.
        let fence = |agent: &str, session: u64, known_only: bool| -> StoreResult<()> {
            match gens.get(agent) {
                None if known_only => Err(StoreError::NoSuchAgent {
                    id: agent.to_owned(),
                }),
                None => Ok(()),
                Some(&current) if u64::try_from(current).ok() == Some(session) => Ok(()),
                Some(&current) => Err(StoreError::Fenced {
                    agent: agent.to_owned(),
                    session,
                    current: u64::try_from(current).unwrap_or(0),
                }),
            }
        };
        for (p, r) in puts.iter().zip(results.iter_mut()) {
            if let (Some(first), None) = (p.rows.first(), &r)
                && let Err(e) = fence(&first.agent_id, p.session, false)
            {
                *r = Some(Err(e));
            }
        }
        let clock_answers: Vec<StoreResult<()>> = clocks
            .iter()
            .map(|(session, c)| fence(&c.agent, *session, true))
            .collect();
        let seen_answers: Vec<StoreResult<()>> = seen
            .iter()
            .map(|(session, s)| fence(&s.agent, *session, true))
            .collect();

        // 2. Feedback; 3. clocks; 4. marks.
        let feedback = feedback::write(&mut tx, &prep.feedback, insert, &puts, results, &count)?;
        let ok_clocks: Vec<&status::Clock> = clocks
            .iter()
            .zip(&clock_answers)
            .filter(|(_, a)| a.is_ok())
            .map(|((_, c), _)| *c)
            .collect();
        status::write_clocks(&mut tx, &prep.status, &ok_clocks, &count)?;
        let ok_seen: Vec<&status::Seen> = seen
            .iter()
            .zip(&seen_answers)
            .filter(|(_, a)| a.is_ok())
            .map(|((_, s), _)| *s)
            .collect();
        status::write_seen(&mut tx, &prep.status, &ok_seen, &count)?;
        tx.commit().map_err(fail("commit the streams' writes"))?;
        Ok(Answers {
            feedback,
            clocks: clock_answers,
            seen: seen_answers,
        })
    }
}

/// The fence: whether this replica's lease is live (one row always), and
/// the generation of each agent of `$1` that is stored, its row locked
/// until commit (a takeover's hello, which raises it, waits for this
/// transaction).
fn fence_sql() -> String {
    format!(
        "SELECT l.live, a.id, a.session_gen FROM \
         (SELECT EXISTS (SELECT 1 FROM replicas WHERE id = $2 AND epoch = $3 \
          AND expires_us > {NOW_US}) AS live) l \
         LEFT JOIN LATERAL (SELECT id, session_gen FROM agents WHERE id = ANY($1) ORDER BY id FOR SHARE) a \
         ON true"
    )
}
