//! Cost of the journal's hot paths against a bare peer in the same run, so
//! that the figure that matters is a ratio (this machine's disk sets the
//! absolute numbers):
//!
//! * `durable/journal_record_started` — one execution id, write + fdatasync;
//!   vs `durable/raw_write_all_sync_data` — `File::write_all` + `sync_data`
//!   of exactly as many bytes on a plain append-only file;
//! * `lazy/journal_record_finished` — write only (group commit);
//!   vs `lazy/raw_write_all` — `File::write_all` of as many bytes;
//! * `compact/100k_started_ids` — one full compaction at a realistic live size.
//!
//! fsync latency on a shared machine drifts from second to second and has a
//! long tail, so the journal and its peer are measured *interleaved*, pair
//! by pair (order alternating). Criterion reports each side from its own
//! phase; the line printed at the end gives medians, means and their ratios
//! over all the pairs of both phases — the figure to quote.
//! Automatic compaction is off in the first two groups (measured apart).
//! Files live under Cargo's target tmp dir (the project's disk, not a
//! tmpfs), recreated on every run.
//!
//! Run: `cargo bench -p baton-journal --bench journal`.

use std::fs::{self, File, OpenOptions};
use std::hint::black_box;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use baton_journal::{Journal, JournalConfig, Outcome};
use criterion::{Criterion, criterion_group, criterion_main};

/// An id of the length the lead's deterministic ids will roughly have.
fn id(n: u64) -> String {
    format!("plant-a/line3-startup/7/press/{n:010}/0/0")
}

struct Pair {
    journal: Journal,
    raw: File,
    started_bytes: Vec<u8>,
    finished_bytes: Vec<u8>,
    n: u64,
    m: u64,
    /// Every timed pair, both benchmarks' phases: (journal ns, raw ns).
    durable_pairs: Vec<(u32, u32)>,
    lazy_pairs: Vec<(u32, u32)>,
}

fn ns(d: Duration) -> u32 {
    u32::try_from(d.as_nanos()).unwrap_or(u32::MAX)
}

/// Median of each side and the ratio of the medians (and of the means),
/// over the very same pairs: the figure criterion's separate phases can't give.
fn report(name: &str, pairs: &[(u32, u32)]) {
    let median = |mut v: Vec<u32>| {
        v.sort_unstable();
        v[v.len() / 2]
    };
    let mj = median(pairs.iter().map(|p| p.0).collect());
    let mr = median(pairs.iter().map(|p| p.1).collect());
    let sum = |f: fn(&(u32, u32)) -> u32| pairs.iter().map(|p| u64::from(f(p))).sum::<u64>();
    let (sj, sr) = (sum(|p| p.0), sum(|p| p.1));
    eprintln!(
        "{name}: {} pairs; median journal {:.1} us, raw {:.1} us, ratio {:.2}; \
         mean journal {:.1} us, raw {:.1} us, ratio {:.2}",
        pairs.len(),
        f64::from(mj) / 1e3,
        f64::from(mr) / 1e3,
        f64::from(mj) / f64::from(mr),
        sj as f64 / pairs.len() as f64 / 1e3,
        sr as f64 / pairs.len() as f64 / 1e3,
        sj as f64 / sr as f64,
    );
}

impl Pair {
    fn new(dir: &Path) -> Pair {
        let cfg = JournalConfig {
            max_log_bytes: u64::MAX,
            ..JournalConfig::new(dir.join("journal"))
        };
        let (mut journal, _) = Journal::open(cfg).expect("open");
        // Measure the exact frame sizes so the peers write the same bytes.
        let before = journal.log_bytes();
        journal.record_started(&[(&id(0), 0)]).expect("started");
        let started_len = (journal.log_bytes() - before) as usize;
        let before = journal.log_bytes();
        journal
            .record_finished(&id(0), Outcome::Succeeded)
            .expect("finished");
        let finished_len = (journal.log_bytes() - before) as usize;
        eprintln!("frame sizes: record_started {started_len} B, record_finished {finished_len} B");
        let raw = OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("raw.log"))
            .expect("open raw");
        Pair {
            journal,
            raw,
            started_bytes: vec![0x5a; started_len],
            finished_bytes: vec![0xa5; finished_len],
            n: 1,
            m: 1,
            durable_pairs: Vec::new(),
            lazy_pairs: Vec::new(),
        }
    }

    /// `iters` interleaved pairs of durable appends: (journal, raw) time.
    fn durable(&mut self, iters: u64) -> (Duration, Duration) {
        let (mut dj, mut dr) = (Duration::ZERO, Duration::ZERO);
        for _ in 0..iters {
            let id = id(self.n);
            let journal_first = self.n.is_multiple_of(2);
            self.n += 1;
            let (mut pj, mut pr) = (Duration::ZERO, Duration::ZERO);
            for side in [journal_first, !journal_first] {
                let t = Instant::now();
                if side {
                    self.journal
                        .record_started(&[(&id, self.n as i64)])
                        .expect("started");
                    pj = t.elapsed();
                } else {
                    self.raw
                        .write_all(black_box(&self.started_bytes))
                        .expect("write");
                    self.raw.sync_data().expect("sync");
                    pr = t.elapsed();
                }
            }
            dj += pj;
            dr += pr;
            self.durable_pairs.push((ns(pj), ns(pr)));
        }
        (dj, dr)
    }

    /// `iters` interleaved pairs of lazy appends: (journal, raw) time.
    fn lazy(&mut self, iters: u64) -> (Duration, Duration) {
        let (mut dj, mut dr) = (Duration::ZERO, Duration::ZERO);
        for _ in 0..iters {
            // Ids are formatted outside the timed region on both sides.
            let id = id(self.m);
            self.m += 1;
            let t = Instant::now();
            self.journal
                .record_finished(&id, Outcome::Succeeded)
                .expect("finished");
            let pj = t.elapsed();
            let t = Instant::now();
            self.raw
                .write_all(black_box(&self.finished_bytes))
                .expect("write");
            let pr = t.elapsed();
            dj += pj;
            dr += pr;
            self.lazy_pairs.push((ns(pj), ns(pr)));
        }
        (dj, dr)
    }
}

fn bench(c: &mut Criterion) {
    let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("journal-bench");
    let _ = fs::remove_dir_all(&base);
    fs::create_dir_all(&base).expect("bench dir");
    let mut pair = Pair::new(&base);

    let mut g = c.benchmark_group("durable");
    g.bench_function("journal_record_started", |b| {
        b.iter_custom(|iters| pair.durable(iters).0)
    });
    g.bench_function("raw_write_all_sync_data", |b| {
        b.iter_custom(|iters| pair.durable(iters).1)
    });
    g.finish();

    let mut g = c.benchmark_group("lazy");
    g.bench_function("journal_record_finished", |b| {
        b.iter_custom(|iters| pair.lazy(iters).0)
    });
    g.bench_function("raw_write_all", |b| {
        b.iter_custom(|iters| pair.lazy(iters).1)
    });
    g.finish();
    report(
        "durable (record_started vs write_all+sync_data)",
        &pair.durable_pairs,
    );
    report("lazy (record_finished vs write_all)", &pair.lazy_pairs);
    drop(pair);

    let (mut j, _) = Journal::open(JournalConfig::new(base.join("compact"))).expect("open");
    let ids: Vec<String> = (0..100_000).map(id).collect();
    for chunk in ids.chunks(1000) {
        let batch: Vec<(&str, i64)> = chunk.iter().map(|s| (s.as_str(), 1)).collect();
        j.record_started(&batch).expect("started");
    }
    let mut g = c.benchmark_group("compact");
    g.sample_size(10);
    g.bench_function("100k_started_ids", |b| {
        b.iter(|| j.compact().expect("compact"))
    });
    g.finish();
    eprintln!("compacted log: {} B", j.log_bytes());
    drop(j);
    let _ = fs::remove_dir_all(&base);
}

criterion_group!(benches, bench);
criterion_main!(benches);
