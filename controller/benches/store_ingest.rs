//! Feedback ingest: rows stored per second through `Store::put_feedback`
//! from 1 000 concurrent agents, beside bare batched SQLite inserts of the
//! same rows into the same schema with the same durability settings.
//!
//! Why both: the bare figure is what the disk and SQLite allow (one
//! connection, a prepared statement, one transaction per 512 rows); the
//! ratio is what the store's shape (channel, savepoints, group commit,
//! answers) costs or gains against it.
//!
//! A third figure is retention's cost: the same ingest into a store that
//! already holds a round of old rows, once with the retention sweeper
//! deleting those rows (`app::retention::sweep`, batches of 500) all the
//! while, once without; the ratio is what sweeping costs ingest.
//!
//! `cargo bench -p baton-controller --bench store_ingest`; set
//! `STORE_INGEST_BATCHES` (batches per agent, default 4) and
//! `STORE_INGEST_ROUNDS` (default 3) to change the load.

use std::error::Error;
use std::path::Path;
use std::time::{Duration, Instant};

use baton_model::{Binding, RefTime, time};
use baton_proto::wire;
use baton_sql::sqlite::SqliteStore;
use baton_store::{FeedbackRow, StoreOps};
use common::count;

mod common;

/// Concurrent agents.
const AGENTS: usize = 1_000;
/// Rows per `put_feedback` call (an agent's feedback batch).
const ROWS_PER_BATCH: usize = 64;

type Res<T> = Result<T, Box<dyn Error + Send + Sync>>;

fn env_or(name: &str, default: usize) -> Res<usize> {
    match std::env::var(name) {
        Ok(v) => Ok(v.parse()?),
        Err(_) => Ok(default),
    }
}

/// The store's file after a full checkpoint, bytes (the store is opened,
/// so an empty directory gets the schema first).
fn weigh(dir: &Path) -> Res<u64> {
    drop(SqliteStore::open(dir, Binding::Open)?);
    let db = dir.join(baton_sql::sqlite::DB_FILE);
    let c = rusqlite::Connection::open(&db)?;
    c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
    Ok(std::fs::metadata(&db)?.len())
}

/// Bytes per clock report: 100 000 reports of 1 000 agents, weighed.
async fn clock_weight(base: &str) -> Res<f64> {
    let dir = tempfile::tempdir_in(base)?;
    let store = SqliteStore::open(dir.path(), Binding::Open)?;
    for a in 0..AGENTS {
        store
            .agent_hello(baton_store::HelloRow {
                id: format!("agent-{a:04}"),
                labels: Default::default(),
                agent_version: "bench".into(),
                journal_id: "journal-1".into(),
                cert_tenants: None,
                held: Vec::new(),
                session_gen_seen: 0,
                trust: None,
                arch: String::new(),
                update: None,
                at: RefTime::from_nanos(1),
            })
            .await?;
    }
    let empty = weigh(dir.path())?;
    const REPORTS: usize = 100;
    let tasks: Vec<_> = (0..AGENTS)
        .map(|a| {
            let store = store.clone();
            tokio::spawn(async move {
                for i in 0..REPORTS {
                    let row = baton_model::ClockRow {
                        source: "ptp".into(),
                        state: "locked".into(),
                        offset: time::span(1_234 + i as i64),
                        jitter: time::span(310),
                        uncertainty: time::span(2_000),
                        frequency_ppm: -3.25,
                        at: RefTime::from_nanos(
                            1_764_000_000_000_000_000 + i as i64 * 5_000_000_000,
                        ),
                    };
                    store.record_clock(&format!("agent-{a:04}"), 1, row).await?;
                }
                Ok::<_, baton_store::StoreError>(())
            })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    drop(store);
    let full = weigh(dir.path())?;
    Ok((full - empty) as f64 / (AGENTS * REPORTS) as f64)
}

/// Rows older than any retention window: what a sweep deletes.
fn old_rows(n: usize) -> Vec<FeedbackRow> {
    (0..n)
        .map(|i| {
            let mut r = row(i % AGENTS, (i / AGENTS + 1) as u64);
            r.journal_id = "journal-0".into();
            r.received = RefTime::from_nanos(1_600_000_000_000_000_000);
            r
        })
        .collect()
}

fn row(agent: usize, seq: u64) -> FeedbackRow {
    let occurrence = 1_700_000_000_000_000_000 + i64::try_from(seq).unwrap_or(0) * 1_000_000;
    FeedbackRow {
        id: 0,
        agent_id: format!("agent-{agent:04}"),
        journal_id: "journal-1".into(),
        seq,
        execution_id: format!("acme/blink/v3/led-on/{occurrence}/a1"),
        tenant: "acme".into(),
        pack: "blink".into(),
        version: 3,
        instruction: "led-on".into(),
        occurrence: Some(RefTime::from_nanos(occurrence)),
        attempt: 1,
        scheduled: RefTime::from_nanos(occurrence),
        actual: RefTime::from_nanos(occurrence + 20_000),
        lateness: time::span(20_000),
        outcome: wire::Outcome::Ok,
        reason: wire::Reason::Unspecified,
        event: "executed".into(),
        action: "gpio.write".into(),
        detail: String::new(),
        value: None,
        dropped_before: 0,
        uncertainty: time::span(1_500),
        clock_source: wire::ClockSource::Ptp,
        clock_state: wire::ClockState::Locked,
        received: RefTime::from_nanos(1_700_000_000_100_000_000),
    }
}

/// Per agent, its batches in sending order.
fn workload(batches: usize) -> Vec<Vec<Vec<FeedbackRow>>> {
    (0..AGENTS)
        .map(|a| {
            (0..batches)
                .map(|b| {
                    (0..ROWS_PER_BATCH)
                        .map(|i| row(a, (b * ROWS_PER_BATCH + i + 1) as u64))
                        .collect()
                })
                .collect()
        })
        .collect()
}

/// Every agent a task sending its batches one after another, each once
/// the previous one is stored (as an agent waits for its ack); with
/// `sweep`, the retention sweeper deletes rows older than a day all the
/// while (how many, in the note).
async fn through_store(
    dir: &Path,
    work: Vec<Vec<Vec<FeedbackRow>>>,
    sweep: bool,
) -> Res<(Duration, String)> {
    let store = SqliteStore::open(dir, Binding::Open)?;
    let app = baton_app::App::new(
        std::sync::Arc::new(store.clone()),
        baton_app::AppConfig::new(Binding::Open),
    );
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sweeper = sweep.then(|| {
        let (app, done) = (app.clone(), done.clone());
        tokio::spawn(async move {
            let cutoff = 1_650_000_000_000_000_000;
            let mut deleted = 0;
            // Until the old rows are gone (or the ingest is done): the
            // real sweeper stops when a sweep finds nothing, too.
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let n = baton_app::retention::sweep(
                    &app,
                    baton_app::metrics::Retained::Feedback,
                    RefTime::from_nanos(cutoff),
                    500,
                )
                .await?;
                deleted += n;
                if n == 0 {
                    break;
                }
            }
            Ok::<_, baton_store::StoreError>(deleted)
        })
    });
    let start = Instant::now();
    let tasks: Vec<_> = work
        .into_iter()
        .map(|batches| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut inserted = 0;
                for batch in batches {
                    inserted += store.put_feedback(1, batch).await?.inserted;
                }
                Ok::<_, baton_store::StoreError>(inserted)
            })
        })
        .collect();
    let mut inserted = 0;
    for t in tasks {
        inserted += t.await??;
    }
    let took = start.elapsed();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let swept = match sweeper {
        Some(t) => format!(", {} old rows swept meanwhile", t.await??),
        None => String::new(),
    };
    let stats = store.stats();
    let note = format!(
        "{} commits, {:.0} calls/commit, {:.0} rows/commit{swept}",
        stats.batches,
        stats.commands as f64 / stats.batches.max(1) as f64,
        inserted as f64 / stats.batches.max(1) as f64,
    );
    Ok((took, note))
}

/// The same rows, in the order the agents' first, second, ... batches
/// would arrive, through one connection and one transaction per 512 rows.
fn bare(dir: &Path, work: &[Vec<Vec<FeedbackRow>>]) -> Res<Duration> {
    let batches = work.first().map_or(0, Vec::len);
    let rows = (0..batches).flat_map(|b| work.iter().flat_map(move |agent| agent[b].iter()));
    common::Bare::open(dir)?.insert(rows)
}

fn main() -> Res<()> {
    let batches = env_or("STORE_INGEST_BATCHES", 4)?;
    let rounds = env_or("STORE_INGEST_ROUNDS", 3)?;
    let total = AGENTS * batches * ROWS_PER_BATCH;
    let work = workload(batches);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    // On the target's disk, not a tmpfs: fsync has to cost what it costs.
    let base = env!("CARGO_TARGET_TMPDIR");
    println!(
        "store_ingest: {AGENTS} agents x {batches} batches x {ROWS_PER_BATCH} rows = {total} rows/round, \
         synchronous=FULL, files under {base}"
    );
    let per_s = |d: Duration| total as f64 / d.as_secs_f64();
    let (mut best_store, mut best_bare, mut best_sweep) = (0f64, 0f64, 0f64);
    for round in 1..=rounds {
        let dir = tempfile::tempdir_in(base)?;
        let bare_took = bare(dir.path(), &work)?;
        if count(dir.path())? != total as i64 {
            return Err("bare run lost rows".into());
        }
        drop(dir);

        let dir = tempfile::tempdir_in(base)?;
        let empty = weigh(dir.path())?;
        let (store_took, note) = rt.block_on(through_store(dir.path(), work.clone(), false))?;
        if count(dir.path())? != total as i64 {
            return Err("store run lost rows".into());
        }
        if round == 1 {
            let full = weigh(dir.path())?;
            println!(
                "on disk: {:.0} B per feedback row ({total} rows, {full} B after a checkpoint, {empty} B empty)",
                (full - empty) as f64 / total as f64
            );
            let per_clock = rt.block_on(clock_weight(base))?;
            println!("on disk: {per_clock:.0} B per clock report (history row and index)");
        }
        drop(dir);

        // Retention: a round of old rows first, then the same ingest
        // with and without the sweeper deleting them.
        let old = old_rows(total);
        let mut kept = [0f64; 2];
        let mut notes = [String::new(), String::new()];
        for (i, sweep) in [(0, false), (1, true)] {
            let dir = tempfile::tempdir_in(base)?;
            common::Bare::open(dir.path())?.insert(old.iter())?;
            let (took, note) = rt.block_on(through_store(dir.path(), work.clone(), sweep))?;
            let left = count(dir.path())?;
            let want = if sweep { total } else { 2 * total } as i64;
            if (sweep && left < want) || (!sweep && left != want) {
                return Err(format!("retention run: {left} rows left, expected {want}").into());
            }
            kept[i] = per_s(took);
            notes[i] = note;
            drop(dir);
        }

        let (s, b) = (per_s(store_took), per_s(bare_took));
        best_store = best_store.max(s);
        best_bare = best_bare.max(b);
        best_sweep = best_sweep.max(kept[1] / kept[0]);
        println!(
            "round {round}: store {s:>9.0} rows/s ({note}) | bare sqlite {b:>9.0} rows/s | store/bare {:.2}",
            s / b
        );
        println!(
            "         retention: {:>9.0} rows/s without the sweeper ({}) | {:>9.0} rows/s with it ({}) | with/without {:.2}",
            kept[0],
            notes[0],
            kept[1],
            notes[1],
            kept[1] / kept[0]
        );
    }
    println!(
        "best: store {best_store:.0} rows/s | bare sqlite {best_bare:.0} rows/s | store/bare {:.2} | retention sweeping with/without {best_sweep:.2}",
        best_store / best_bare
    );
    Ok(())
}
