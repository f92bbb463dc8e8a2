//! The feedback of a drain: the journals' acked seqs before and after
//! (one upsert), then every new row (one `INSERT … SELECT FROM unnest`).
//!
//! The rows are new by construction: each journal's acked seq is raised
//! in the same transaction as its rows are stored, so every stored row is
//! at or below it, and the rows written are those above it (a seq twice
//! in one batch kept once). Two transactions never write one journal at
//! once: an agent's batches go through one lane thread in order, and the
//! fence's row lock makes a takeover's hello wait for this commit. So the
//! insert is a plain one ([`Insert::New`]): `ON CONFLICT DO NOTHING`'s
//! speculative insertion cost a fifth of the server's time per row. Should
//! a row be stored already all the same (the reasoning above broken by a
//! case not foreseen), the server refuses the whole transaction and the
//! lane writes it again with [`Insert::SkipStored`]: nothing twice, nothing
//! lost, one transaction slower.

use std::collections::{HashMap, HashSet};

use postgres::error::SqlState;
use postgres::{Statement, Transaction};

use super::{Put, fail};
use crate::postgres::conn::detailed;
use crate::sql::codec::canonical_execution_id;
use baton_model::time::span_ns;
use baton_store::{FeedbackRow, FeedbackStored, StoreError, StoreResult, fits};

/// This part's statements, prepared once per connection.
pub(super) struct Statements {
    journals: Statement,
    insert_new: Statement,
    insert_skipping: Statement,
    mine: Statement,
}

impl Statements {
    pub(super) fn prepare(c: &mut postgres::Client) -> Result<Statements, postgres::Error> {
        Ok(Statements {
            journals: c.prepare(JOURNALS_SQL)?,
            insert_new: c.prepare(&insert_sql(""))?,
            insert_skipping: c.prepare(&insert_sql(SKIP_STORED))?,
            mine: c.prepare(MINE_SQL)?,
        })
    }
}

/// How the rows go in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Insert {
    /// A plain insert: every row is new (see the module's doc); one
    /// stored already fails the transaction with [`Failure::StoredAlready`].
    New,
    /// Rows stored already are skipped, at the price of a speculative
    /// insertion per row.
    SkipStored,
}

/// Why a lane's transaction stored nothing.
#[derive(Debug)]
pub(super) enum Failure {
    /// The store's own error, for the callers.
    Store(StoreError),
    /// An [`Insert::New`] met a row stored already: write it again with
    /// [`Insert::SkipStored`].
    StoredAlready(String),
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Failure::Store(e)
    }
}

/// A journal's row and its acked seq before this transaction.
#[derive(Clone, Copy)]
struct Journal {
    id: i64,
    before: i64,
}

/// Stores `puts` in `tx` (those whose `results` are still open: not
/// refused by the fence or their values), and answers each.
pub(super) fn write(
    tx: &mut Transaction<'_>,
    st: &Statements,
    insert: Insert,
    puts: &[&Put],
    results: Vec<Option<StoreResult<FeedbackStored>>>,
    count: &dyn Fn(u64),
) -> Result<Vec<StoreResult<FeedbackStored>>, Failure> {
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
            .query(&st.journals, &[&ja, &jj, &jh])
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
    // A seq twice in the batch is stored once, the first.
    let mut taken: HashSet<(i64, i64)> = HashSet::new();
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
            } else if taken.insert((j.id, seq)) {
                new.push(j.id, row);
            }
        }
    }
    let mut inserted: HashSet<(i64, i64)> = HashSet::new();
    if !new.journal.is_empty() {
        let statement = match insert {
            Insert::New => &st.insert_new,
            Insert::SkipStored => &st.insert_skipping,
        };
        let n = tx.execute(statement, &new.params()).map_err(|e| {
            if insert == Insert::New && e.code() == Some(&SqlState::UNIQUE_VIOLATION) {
                Failure::StoredAlready(detailed(&e))
            } else {
                Failure::Store(fail("store feedback")(e))
            }
        })?;
        count(1);
        if usize::try_from(n).ok() == Some(new.journal.len()) {
            // Every row went in (so no key was twice): no need to hear
            // which.
            inserted.extend(new.journal.iter().copied().zip(new.seq.iter().copied()));
        } else {
            // Some were there already (a seq twice in a batch, a re-send
            // racing its first copy): the rows this transaction wrote
            // carry its id.
            let mut journals = new.journal.clone();
            journals.sort_unstable();
            journals.dedup();
            let rows = tx
                .query(&st.mine, &[&journals])
                .map_err(fail("read back the feedback stored"))?;
            count(1);
            inserted.extend(
                rows.iter()
                    .map(|r| (r.get::<_, i64>(0), r.get::<_, i64>(1))),
            );
        }
    }
    for (journal, seq, dropped) in carriers {
        keep_resent_drops(tx, journal, seq, dropped)?;
        count(2);
    }
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

/// Every integer of a caller's rows fits a column, or the caller's batch
/// is refused whole (nothing of it stored).
pub(super) fn checked(rows: &[FeedbackRow]) -> StoreResult<()> {
    for r in rows {
        fits(r.seq, "feedback seq")?;
        fits(r.version, "feedback pack version")?;
        fits(r.dropped_before, "feedback dropped_before")?;
    }
    Ok(())
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

/// Every new row of the transaction, at once, then `tail`.
/// (The transaction's id is read once for all its rows, not by the
/// column's default for each.)
fn insert_sql(tail: &str) -> String {
    format!(
        "INSERT INTO feedback (journal, seq, tenant, pack, version, \
    instruction, execution_id, occurrence_ns, attempt, scheduled_ns, actual_ns, lateness_ns, \
    outcome, reason, event, action, detail, value, dropped_before, uncertainty_ns, clock_source, \
    clock_state, received_ns, txid) \
  SELECT u.*, x.txid FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::text[], \
    $5::bigint[], $6::text[], $7::text[], $8::bigint[], $9::bigint[], $10::bigint[], \
    $11::bigint[], $12::bigint[], $13::smallint[], $14::smallint[], $15::text[], $16::text[], \
    $17::text[], $18::bigint[], $19::bigint[], $20::bigint[], $21::smallint[], $22::smallint[], \
    $23::bigint[]) AS u \
  CROSS JOIN (SELECT pg_current_xact_id()::text::bigint AS txid) x {tail}"
    )
}

/// [`Insert::SkipStored`]'s tail: the re-send guard alone is the arbiter
/// (ids are the identity's, never given, so the key cannot clash).
const SKIP_STORED: &str = "ON CONFLICT (journal, seq, scheduled_ns) DO NOTHING";

/// The rows of these journals this transaction stored.
const MINE_SQL: &str = "SELECT journal, seq FROM feedback \
  WHERE txid = pg_current_xact_id()::text::bigint AND journal = ANY($1::bigint[])";

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
