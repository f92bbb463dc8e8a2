//! Feedback into PostgreSQL as a stream, not statements: every agent's
//! batch waiting when the lane's thread comes round is written in one
//! transaction of three statements, whatever the number of agents in it —
//! the fence (every agent's session generation, locked `FOR SHARE` so a
//! takeover's hello waits for this commit, with the replica's lease in the
//! same look), the journals (each one's acked seq before and after, in one
//! upsert), and the rows (one `INSERT … SELECT FROM unnest(…) ON CONFLICT
//! DO NOTHING`). A re-sent entry carrying a count of drops costs a few
//! more, only then.
//!
//! The lane has a connection of its own, beside the writer's: ingest does
//! not queue behind decisions, nor decisions behind ingest. Each caller
//! gets its own answer: a fenced agent's batch is refused alone, a batch
//! with a value past `i64::MAX` too; a failed transaction fails every
//! batch in it, and nothing of it is stored.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use postgres::{Client, Statement};
use tokio::sync::{mpsc, oneshot};

use super::conn::detailed;
use super::lease::{Lease, NOW_US};
use super::{Target, connect};
use crate::sql::codec::canonical_execution_id;
use baton_model::time::span_ns;
use baton_store::{FeedbackRow, FeedbackStored, StoreError, StoreResult, fits};

/// Batches waiting at most (past it, callers wait to queue).
const QUEUE_DEPTH: usize = 1024;
/// Rows per transaction at most (a few thousand: one statement each way).
const MAX_ROWS: usize = 16 * 1024;

/// One caller's batch.
struct Put {
    session: u64,
    rows: Vec<FeedbackRow>,
    reply: oneshot::Sender<StoreResult<FeedbackStored>>,
}

/// What the lane has done, for tests and the bench.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IngestStats {
    /// Transactions committed.
    pub transactions: u64,
    /// Callers' batches in them.
    pub batches: u64,
    /// Statements sent in them, `BEGIN` and `COMMIT` left out.
    pub statements: u64,
}

#[derive(Debug, Default)]
struct Counters {
    transactions: AtomicU64,
    batches: AtomicU64,
    statements: AtomicU64,
}

/// The lane: a thread with its own connection (see the module doc).
pub struct Lane {
    tx: Option<mpsc::Sender<Put>>,
    thread: Option<JoinHandle<()>>,
    counters: Arc<Counters>,
}

impl Lane {
    /// Starts the lane's thread on `target`, writing as `lease`'s
    /// replica.
    pub(super) fn start(
        target: Target,
        lease: Arc<Lease>,
        idle_limit: Duration,
    ) -> StoreResult<Lane> {
        let (tx, rx) = mpsc::channel(QUEUE_DEPTH);
        let counters = Arc::new(Counters::default());
        let c = Arc::clone(&counters);
        let thread = std::thread::Builder::new()
            .name("store-ingest".into())
            .spawn(move || {
                Ingest {
                    target,
                    lease,
                    idle_limit,
                    conn: None,
                    counters: c,
                }
                .run(rx)
            })
            .map_err(|e| StoreError::unavailable("start the feedback ingest thread", e))?;
        Ok(Lane {
            tx: Some(tx),
            thread: Some(thread),
            counters,
        })
    }

    /// Stores one journal's batch, fenced by `session` (see
    /// `StoreOps::put_feedback` for the rules).
    pub async fn put(&self, session: u64, rows: Vec<FeedbackRow>) -> StoreResult<FeedbackStored> {
        let tx = self.tx.as_ref().ok_or(StoreError::Closed)?;
        let (reply, answer) = oneshot::channel();
        tx.send(Put {
            session,
            rows,
            reply,
        })
        .await
        .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// What the lane has committed so far.
    pub fn stats(&self) -> IngestStats {
        IngestStats {
            transactions: self.counters.transactions.load(Ordering::Relaxed),
            batches: self.counters.batches.load(Ordering::Relaxed),
            statements: self.counters.statements.load(Ordering::Relaxed),
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
        // The thread ends once the channel is closed and drained.
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The lane's statements, prepared once per connection.
struct Prepared {
    fence: Statement,
    journals: Statement,
    insert: Statement,
}

struct Ingest {
    target: Target,
    lease: Arc<Lease>,
    idle_limit: Duration,
    conn: Option<(Client, Prepared)>,
    counters: Arc<Counters>,
}

/// A journal's row and its acked seq before this transaction.
#[derive(Clone, Copy)]
struct Journal {
    id: i64,
    before: i64,
}

impl Ingest {
    fn run(mut self, mut rx: mpsc::Receiver<Put>) {
        while let Some(first) = rx.blocking_recv() {
            let mut batch = vec![first];
            let mut rows = batch[0].rows.len();
            while rows < MAX_ROWS {
                match rx.try_recv() {
                    Ok(p) => {
                        rows += p.rows.len();
                        batch.push(p);
                    }
                    Err(_) => break,
                }
            }
            match self.write(&batch) {
                Ok(results) => {
                    self.counters.transactions.fetch_add(1, Ordering::Relaxed);
                    self.counters
                        .batches
                        .fetch_add(batch.len() as u64, Ordering::Relaxed);
                    for (p, r) in batch.into_iter().zip(results) {
                        let _ = p.reply.send(r);
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, batches = batch.len(), "store: feedback not stored");
                    // A transaction left open is rolled back by dropping
                    // it; a broken connection is made again next time.
                    if self.conn.as_ref().is_some_and(|(c, _)| c.is_closed()) {
                        self.conn = None;
                    }
                    for p in batch {
                        let _ = p.reply.send(Err(e.again()));
                    }
                }
            }
        }
        if let Some((c, _)) = self.conn.take() {
            let _ = c.close();
        }
    }

    fn connect(&mut self) -> StoreResult<&mut (Client, Prepared)> {
        if self.conn.as_ref().is_none_or(|(c, _)| c.is_closed()) {
            let mut c = connect(&self.target)?;
            let ms = self.idle_limit.as_millis().max(1);
            let fail = |what: &str, e: postgres::Error| StoreError::unavailable(what, detailed(&e));
            c.batch_execute(&format!("SET idle_in_transaction_session_timeout = {ms}"))
                .map_err(|e| fail("bound idle transactions", e))?;
            let prepared = Prepared {
                fence: c
                    .prepare(&fence_sql())
                    .map_err(|e| fail("prepare the fence", e))?,
                journals: c
                    .prepare(JOURNALS_SQL)
                    .map_err(|e| fail("prepare the journals' upsert", e))?,
                insert: c
                    .prepare(INSERT_SQL)
                    .map_err(|e| fail("prepare the feedback insert", e))?,
            };
            self.conn = Some((c, prepared));
        }
        self.conn
            .as_mut()
            .ok_or_else(|| StoreError::unavailable("feedback ingest", "no connection"))
    }

    /// One transaction for `puts`: each caller's answer, or why none of
    /// it was stored.
    fn write(&mut self, puts: &[Put]) -> StoreResult<Vec<StoreResult<FeedbackStored>>> {
        let lease = Arc::clone(&self.lease);
        let counters = Arc::clone(&self.counters);
        let (client, prep) = self.connect()?;
        fn fail(what: &'static str) -> impl Fn(postgres::Error) -> StoreError {
            move |e| StoreError::unavailable(what, detailed(&e))
        }
        let mut results: Vec<Option<StoreResult<FeedbackStored>>> = puts
            .iter()
            .map(|p| checked(&p.rows).err().map(Err))
            .collect();
        let mut tx = client.transaction().map_err(fail("begin"))?;
        let count = |n: u64| counters.statements.fetch_add(n, Ordering::Relaxed);

        // 1. The fence and the lease, in one look.
        let agents: Vec<&str> = {
            let mut a: Vec<&str> = puts
                .iter()
                .zip(&results)
                .filter(|(_, r)| r.is_none())
                .filter_map(|(p, _)| p.rows.first().map(|r| r.agent_id.as_str()))
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
            let e = StoreError::LeaseLost("it ran out before this feedback".into());
            lease.mark_lost(&e.to_string());
            return Err(e);
        }
        let gens: HashMap<String, i64> = fenced
            .iter()
            .filter_map(|r| Some((r.get::<_, Option<String>>("id")?, r.get("session_gen"))))
            .collect();
        for (p, r) in puts.iter().zip(results.iter_mut()) {
            let (Some(first), None) = (p.rows.first(), &r) else {
                continue;
            };
            if let Some(&current) = gens.get(&first.agent_id)
                && u64::try_from(current).ok() != Some(p.session)
            {
                *r = Some(Err(StoreError::Fenced {
                    agent: first.agent_id.clone(),
                    session: p.session,
                    current: u64::try_from(current).unwrap_or(0),
                }));
            }
        }

        // 2. The journals: each one's acked seq before, and after.
        let mut highs: HashMap<(&str, &str), i64> = HashMap::new();
        for (p, r) in puts.iter().zip(&results) {
            if r.is_some() {
                continue;
            }
            for row in &p.rows {
                let h = highs
                    .entry((row.agent_id.as_str(), row.journal_id.as_str()))
                    .or_insert(0);
                *h = (*h).max(row.seq as i64);
            }
        }
        let (ja, jj, jh): (Vec<&str>, Vec<&str>, Vec<i64>) = highs
            .iter()
            .map(|(&(a, j), &h)| (a, j, h))
            .fold((Vec::new(), Vec::new(), Vec::new()), |mut v, (a, j, h)| {
                v.0.push(a);
                v.1.push(j);
                v.2.push(h);
                v
            });
        let mut journals: HashMap<(String, String), Journal> = HashMap::new();
        if !ja.is_empty() {
            for r in tx
                .query(&prep.journals, &[&ja, &jj, &jh])
                .map_err(fail("store the journals"))?
            {
                journals.insert(
                    (r.get("agent_id"), r.get("journal_id")),
                    Journal {
                        id: r.get("id"),
                        before: r.get("before"),
                    },
                );
            }
            count(1);
        }

        // 3. The new rows, all at once; re-sent ones keep only a count of
        // drops they now carry.
        let mut new = Columns::default();
        let mut carriers: Vec<(i64, i64, i64)> = Vec::new();
        let mut of_put: Vec<Option<(Journal, i64)>> = vec![None; puts.len()];
        for (i, (p, r)) in puts.iter().zip(&results).enumerate() {
            let (Some(first), None) = (p.rows.first(), r) else {
                continue;
            };
            let key = (first.agent_id.clone(), first.journal_id.clone());
            let Some(&j) = journals.get(&key) else {
                continue;
            };
            of_put[i] = Some((
                j,
                highs[&(first.agent_id.as_str(), first.journal_id.as_str())],
            ));
            for row in &p.rows {
                let seq = row.seq as i64;
                if seq <= j.before {
                    if row.dropped_before > 0 {
                        carriers.push((j.id, seq, row.dropped_before as i64));
                    }
                } else {
                    new.push(j.id, row);
                }
            }
        }
        let mut inserted: HashSet<(i64, i64)> = HashSet::new();
        if !new.journal.is_empty() {
            let rows = tx
                .query(&prep.insert, &new.params())
                .map_err(fail("store feedback"))?;
            count(1);
            inserted.extend(
                rows.iter()
                    .map(|r| (r.get::<_, i64>(0), r.get::<_, i64>(1))),
            );
        }
        for (journal, seq, dropped) in carriers {
            keep_resent_drops(&mut tx, journal, seq, dropped)?;
            count(2);
        }
        tx.commit().map_err(fail("commit feedback"))?;

        Ok(puts
            .iter()
            .zip(results)
            .zip(of_put)
            .map(|((p, r), j)| {
                if let Some(r) = r {
                    return r;
                }
                let Some((j, high)) = j else {
                    return Ok(FeedbackStored::default());
                };
                // A seq twice in one batch is stored once (the first).
                let n = p
                    .rows
                    .iter()
                    .filter(|row| inserted.remove(&(j.id, row.seq as i64)))
                    .count();
                Ok(FeedbackStored {
                    inserted: n,
                    duplicates: p.rows.len() - n,
                    acked_seq: u64::try_from(j.before.max(high)).unwrap_or(0),
                })
            })
            .collect())
    }
}

/// Every integer of a caller's rows fits a column, or the caller's batch
/// is refused whole (nothing of it stored).
fn checked(rows: &[FeedbackRow]) -> StoreResult<()> {
    for r in rows {
        fits(r.seq, "feedback seq")?;
        fits(r.version, "feedback pack version")?;
        fits(r.dropped_before, "feedback dropped_before")?;
    }
    Ok(())
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
         LEFT JOIN LATERAL (SELECT id, session_gen FROM agents WHERE id = ANY($1) FOR SHARE) a \
         ON true"
    )
}

/// Each journal stored (new ones at 0 before), its acked seq raised to
/// the batch's highest seq; its id and acked seq before (the `old` rows
/// are read on the statement's snapshot, before the upsert's change).
const JOURNALS_SQL: &str = "WITH input AS ( \
    SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[]) AS i(agent_id, journal_id, high)), \
  old AS ( \
    SELECT j.agent_id, j.journal_id, j.acked_seq FROM journals j \
    JOIN input USING (agent_id, journal_id)), \
  up AS ( \
    INSERT INTO journals (agent_id, journal_id, acked_seq) \
    SELECT agent_id, journal_id, high FROM input \
    ON CONFLICT (agent_id, journal_id) DO UPDATE \
    SET acked_seq = GREATEST(journals.acked_seq, excluded.acked_seq) \
    RETURNING id, agent_id, journal_id) \
  SELECT up.id, up.agent_id, up.journal_id, COALESCE(old.acked_seq, 0) AS before \
  FROM up LEFT JOIN old USING (agent_id, journal_id)";

/// Every new row of the transaction, at once.
const INSERT_SQL: &str = "INSERT INTO feedback (journal, seq, tenant, pack, version, \
    instruction, execution_id, occurrence_ns, attempt, scheduled_ns, actual_ns, lateness_ns, \
    outcome, reason, event, action, detail, value, dropped_before, uncertainty_ns, clock_source, \
    clock_state, received_ns) \
  SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::text[], $5::bigint[], \
    $6::text[], $7::text[], $8::bigint[], $9::bigint[], $10::bigint[], $11::bigint[], \
    $12::bigint[], $13::smallint[], $14::smallint[], $15::text[], $16::text[], $17::text[], \
    $18::bigint[], $19::bigint[], $20::bigint[], $21::smallint[], $22::smallint[], $23::bigint[]) \
  ON CONFLICT DO NOTHING RETURNING journal, seq";

/// The new rows as the insert's arrays, one per column.
#[derive(Default)]
struct Columns<'a> {
    journal: Vec<i64>,
    seq: Vec<i64>,
    tenant: Vec<&'a str>,
    pack: Vec<&'a str>,
    version: Vec<i64>,
    instruction: Vec<&'a str>,
    execution_id: Vec<Option<&'a str>>,
    occurrence: Vec<Option<i64>>,
    attempt: Vec<i64>,
    scheduled: Vec<i64>,
    actual: Vec<i64>,
    lateness: Vec<i64>,
    outcome: Vec<i16>,
    reason: Vec<i16>,
    event: Vec<&'a str>,
    action: Vec<&'a str>,
    detail: Vec<&'a str>,
    value: Vec<Option<i64>>,
    dropped_before: Vec<i64>,
    uncertainty: Vec<i64>,
    clock_source: Vec<i16>,
    clock_state: Vec<i16>,
    received: Vec<i64>,
}

impl<'a> Columns<'a> {
    fn push(&mut self, journal: i64, r: &'a FeedbackRow) {
        self.journal.push(journal);
        self.seq.push(r.seq as i64);
        self.tenant.push(&r.tenant);
        self.pack.push(&r.pack);
        self.version.push(r.version as i64);
        self.instruction.push(&r.instruction);
        // Most ids are their row's canonical form: not stored twice.
        let canonical = canonical_execution_id(r).is_some_and(|c| c == r.execution_id);
        self.execution_id
            .push((!canonical).then_some(r.execution_id.as_str()));
        self.occurrence.push(r.occurrence.map(|t| t.as_nanos()));
        self.attempt.push(i64::from(r.attempt));
        self.scheduled.push(r.scheduled.as_nanos());
        self.actual.push(r.actual.as_nanos());
        self.lateness.push(span_ns(r.lateness));
        self.outcome.push(r.outcome as i16);
        self.reason.push(r.reason as i16);
        self.event.push(&r.event);
        self.action.push(&r.action);
        self.detail.push(&r.detail);
        self.value.push(r.value.map(i64::from));
        self.dropped_before.push(r.dropped_before as i64);
        self.uncertainty.push(span_ns(r.uncertainty));
        self.clock_source.push(r.clock_source as i16);
        self.clock_state.push(r.clock_state as i16);
        self.received.push(r.received.as_nanos());
    }

    fn params(&self) -> [&(dyn postgres::types::ToSql + Sync); 23] {
        [
            &self.journal,
            &self.seq,
            &self.tenant,
            &self.pack,
            &self.version,
            &self.instruction,
            &self.execution_id,
            &self.occurrence,
            &self.attempt,
            &self.scheduled,
            &self.actual,
            &self.lateness,
            &self.outcome,
            &self.reason,
            &self.event,
            &self.action,
            &self.detail,
            &self.value,
            &self.dropped_before,
            &self.uncertainty,
            &self.clock_source,
            &self.clock_state,
            &self.received,
        ]
    }
}

/// A re-sent entry's count of drops, kept on the stored row: held to the
/// entries missing right before it (a count the agent carried again for
/// entries stored meanwhile is not a drop; rows retention deleted count
/// as missing).
fn keep_resent_drops(
    tx: &mut postgres::Transaction<'_>,
    journal: i64,
    seq: i64,
    dropped_before: i64,
) -> StoreResult<()> {
    let fail =
        |e: postgres::Error| StoreError::unavailable("keep a re-sent count of drops", detailed(&e));
    let below: Option<i64> = tx
        .query_one(
            "SELECT MAX(seq) FROM feedback WHERE journal = $1 AND seq < $2",
            &[&journal, &seq],
        )
        .map_err(fail)?
        .get(0);
    let count = dropped_before.min(seq - 1 - below.unwrap_or(0));
    tx.execute(
        "UPDATE feedback SET dropped_before = $3 \
         WHERE journal = $1 AND seq = $2 AND dropped_before < $3",
        &[&journal, &seq, &count],
    )
    .map_err(fail)?;
    Ok(())
}
