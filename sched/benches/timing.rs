//! Timing-structure benchmark: `TimingWheel` against `BinaryHeap` (lazy
//! cancel) and `BTreeMap`, with 1 000 000 pending firings whose deadlines are
//! uniform over 60 s (seeded).
//!
//! Scenarios, for each structure:
//! * `insert_pop`: insert 1M, then pop all in order;
//! * `insert_cancel_pop`: insert 1M, cancel a random 50 % by id, pop the rest.
//!
//! Before timing, every structure's pop sequence is checked against the
//! exact `(deadline, insertion order)` order, so none can win by cheating.
//! Memory per pending firing is measured with a counting global allocator:
//! bytes requested and still live after inserting 1M, divided by 1M.
//!
//! A summary table (median of a few runs, per phase) is printed first, then
//! criterion runs the two scenarios.
//!
//! Baselines are given their best case: like the wheel, which has one owner
//! (`&mut self`), neither has a lock; the `BTreeMap` is cancelled by its full
//! key (the benchmark knows each id's deadline), so it needs no id index. The
//! wheel is cancelled by id only.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use baton_sched::timing::{Nanos, TimerId, TimingWheel, WheelConfig};
use criterion::{Criterion, SamplingMode, Throughput, criterion_group, criterion_main};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

// ---------------------------------------------------------------------------
// Counting allocator (bench binary only).

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static LIVE: AtomicIsize = AtomicIsize::new(0);

fn account(delta: isize) {
    if COUNTING.load(Relaxed) {
        LIVE.fetch_add(delta, Relaxed);
    }
}

// SAFETY: every method forwards to `System` unchanged and only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as ours.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            account(layout.size() as isize);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as ours.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            account(layout.size() as isize);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) };
        account(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: same contract as ours.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            account(new_size as isize - layout.size() as isize);
        }
        p
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

// ---------------------------------------------------------------------------
// Workload.

const N: usize = 1_000_000;
/// 2026-01-01T00:00:00Z.
const BASE: Nanos = 1_767_225_600_000_000_000;
const SPAN: Nanos = 60_000_000_000;

struct Workload {
    deadlines: Vec<Nanos>,
    /// Insertion indices to cancel: a random half.
    cancel: Vec<usize>,
    /// Expected pops for `insert_pop`: `(deadline, index)` sorted.
    order_all: Vec<(Nanos, u64)>,
    /// Expected pops for `insert_cancel_pop`.
    order_rest: Vec<(Nanos, u64)>,
}

impl Workload {
    fn new() -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(0xBA70_0001);
        let deadlines: Vec<Nanos> = (0..N).map(|_| BASE + rng.random_range(0..SPAN)).collect();
        let mut idx: Vec<usize> = (0..N).collect();
        idx.shuffle(&mut rng);
        let cancel = idx[..N / 2].to_vec();
        let mut order_all: Vec<(Nanos, u64)> = deadlines
            .iter()
            .enumerate()
            .map(|(i, &d)| (d, i as u64))
            .collect();
        order_all.sort_unstable();
        let cancelled: HashSet<usize> = cancel.iter().copied().collect();
        let order_rest = order_all
            .iter()
            .copied()
            .filter(|&(_, i)| !cancelled.contains(&(i as usize)))
            .collect();
        Self {
            deadlines,
            cancel,
            order_all,
            order_rest,
        }
    }
}

// ---------------------------------------------------------------------------
// The three structures behind one interface.

trait Timers {
    const NAME: &'static str;
    fn new() -> Self;
    /// Returns the id to cancel with.
    fn insert(&mut self, deadline: Nanos, value: u64) -> u64;
    /// `deadline` is only used by baselines that cannot cancel by id alone.
    fn cancel(&mut self, id: u64, deadline: Nanos) -> bool;
    fn pop_due(&mut self, now: Nanos) -> Option<(Nanos, u64)>;
}

struct Wheel(TimingWheel<u64>);

impl Timers for Wheel {
    const NAME: &'static str = "TimingWheel";
    fn new() -> Self {
        // The dispatcher builds its wheel with `origin = now`.
        Wheel(TimingWheel::with_config(WheelConfig {
            origin: BASE,
            ..WheelConfig::default()
        }))
    }
    fn insert(&mut self, deadline: Nanos, value: u64) -> u64 {
        self.0.insert(deadline, value).0
    }
    fn cancel(&mut self, id: u64, _deadline: Nanos) -> bool {
        self.0.cancel(TimerId(id)).is_some()
    }
    fn pop_due(&mut self, now: Nanos) -> Option<(Nanos, u64)> {
        self.0.pop_due(now).map(|(d, _, v)| (d, v))
    }
}

/// Fast hasher for the heap's cancelled-id set (ids are consecutive).
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, _: &[u8]) {
        unreachable!("only u64 keys")
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

struct Heap {
    heap: BinaryHeap<Reverse<(Nanos, u64, u64)>>,
    cancelled: HashSet<u64, BuildHasherDefault<IdHasher>>,
    next: u64,
}

impl Timers for Heap {
    const NAME: &'static str = "BinaryHeap (lazy cancel)";
    fn new() -> Self {
        Heap {
            heap: BinaryHeap::new(),
            cancelled: HashSet::default(),
            next: 0,
        }
    }
    fn insert(&mut self, deadline: Nanos, value: u64) -> u64 {
        let id = self.next;
        self.next += 1;
        self.heap.push(Reverse((deadline, id, value)));
        id
    }
    fn cancel(&mut self, id: u64, _deadline: Nanos) -> bool {
        self.cancelled.insert(id)
    }
    fn pop_due(&mut self, now: Nanos) -> Option<(Nanos, u64)> {
        loop {
            let &Reverse((d, _, _)) = self.heap.peek()?;
            if d > now {
                return None;
            }
            let Reverse((d, id, v)) = self.heap.pop()?;
            if !self.cancelled.is_empty() && self.cancelled.remove(&id) {
                continue;
            }
            return Some((d, v));
        }
    }
}

struct Tree {
    map: BTreeMap<(Nanos, u64), u64>,
    next: u64,
}

impl Timers for Tree {
    const NAME: &'static str = "BTreeMap";
    fn new() -> Self {
        Tree {
            map: BTreeMap::new(),
            next: 0,
        }
    }
    fn insert(&mut self, deadline: Nanos, value: u64) -> u64 {
        let id = self.next;
        self.next += 1;
        self.map.insert((deadline, id), value);
        id
    }
    fn cancel(&mut self, id: u64, deadline: Nanos) -> bool {
        self.map.remove(&(deadline, id)).is_some()
    }
    fn pop_due(&mut self, now: Nanos) -> Option<(Nanos, u64)> {
        let entry = self.map.first_entry()?;
        if entry.key().0 > now {
            return None;
        }
        let ((d, _), v) = entry.remove_entry();
        Some((d, v))
    }
}

// ---------------------------------------------------------------------------
// Runs.

#[derive(Clone, Copy, Default)]
struct Phases {
    insert: Duration,
    cancel: Duration,
    pop: Duration,
}

impl Phases {
    fn total(&self) -> Duration {
        self.insert + self.cancel + self.pop
    }
}

/// One run; `sink` sees every pop. `ids` is scratch, reused across runs.
fn run<S: Timers>(
    w: &Workload,
    cancel: bool,
    ids: &mut Vec<u64>,
    mut sink: impl FnMut(Nanos, u64),
) -> Phases {
    let mut s = S::new();
    ids.clear();
    let t0 = Instant::now();
    for (i, &d) in w.deadlines.iter().enumerate() {
        ids.push(s.insert(d, i as u64));
    }
    let t1 = Instant::now();
    if cancel {
        for &i in &w.cancel {
            let ok = s.cancel(ids[i], w.deadlines[i]);
            debug_assert!(ok);
            black_box(ok);
        }
    }
    let t2 = Instant::now();
    let now = BASE + SPAN;
    while let Some((d, v)) = s.pop_due(now) {
        sink(d, v);
    }
    let t3 = Instant::now();
    drop(black_box(s));
    Phases {
        insert: t1 - t0,
        cancel: t2 - t1,
        pop: t3 - t2,
    }
}

/// Asserts exact `(deadline, insertion order)` pop order for `S`.
fn verify<S: Timers>(w: &Workload, cancel: bool, ids: &mut Vec<u64>) {
    let expected = if cancel { &w.order_rest } else { &w.order_all };
    let mut got = Vec::with_capacity(expected.len());
    run::<S>(w, cancel, ids, |d, v| got.push((d, v)));
    assert_eq!(
        got.len(),
        expected.len(),
        "{}: wrong number of pops",
        S::NAME
    );
    if let Some(i) = (0..got.len()).find(|&i| got[i] != expected[i]) {
        panic!(
            "{}: pop {i} is {:?}, expected {:?}",
            S::NAME,
            got[i],
            expected[i]
        );
    }
}

/// Bytes live after inserting all firings, per firing.
fn bytes_per_firing<S: Timers>(w: &Workload) -> f64 {
    COUNTING.store(true, Relaxed);
    let before = LIVE.load(Relaxed);
    let mut s = S::new();
    for (i, &d) in w.deadlines.iter().enumerate() {
        black_box(s.insert(d, i as u64));
    }
    let after = LIVE.load(Relaxed);
    COUNTING.store(false, Relaxed);
    drop(black_box(s));
    (after - before) as f64 / N as f64
}

fn median(mut xs: Vec<Phases>) -> Phases {
    xs.sort_by_key(|p| p.total());
    xs[xs.len() / 2]
}

fn ns_per(d: Duration, n: usize) -> f64 {
    d.as_nanos() as f64 / n as f64
}

struct Row {
    name: &'static str,
    a: Phases,
    b: Phases,
    bytes: f64,
}

fn measure<S: Timers>(w: &Workload, ids: &mut Vec<u64>) -> Row {
    verify::<S>(w, false, ids);
    verify::<S>(w, true, ids);
    const RUNS: usize = 5;
    let a = median(
        (0..RUNS)
            .map(|_| {
                run::<S>(w, false, ids, |d, v| {
                    black_box((d, v));
                })
            })
            .collect(),
    );
    let b = median(
        (0..RUNS)
            .map(|_| {
                run::<S>(w, true, ids, |d, v| {
                    black_box((d, v));
                })
            })
            .collect(),
    );
    Row {
        name: S::NAME,
        a,
        b,
        bytes: bytes_per_firing::<S>(w),
    }
}

fn summary(w: &Workload) {
    let mut ids = Vec::with_capacity(N);
    let rows = [
        measure::<Wheel>(w, &mut ids),
        measure::<Heap>(w, &mut ids),
        measure::<Tree>(w, &mut ids),
    ];
    let n_rest = w.order_rest.len();
    println!();
    println!("timing structures, {N} firings over 60 s, median of 5 runs; order verified exactly");
    println!(
        "{:<26} | {:>8} {:>8} {:>9} | {:>8} {:>8} {:>8} {:>9} | {:>7}",
        "", "a:insert", "a:pop", "a:total", "b:insert", "b:cancel", "b:pop", "b:total", "B/firing"
    );
    println!(
        "{:<26} | {:>8} {:>8} {:>9} | {:>8} {:>8} {:>8} {:>9} |",
        "", "ns/op", "ns/op", "ns/firing", "ns/op", "ns/op", "ns/op", "ns/firing"
    );
    for r in &rows {
        println!(
            "{:<26} | {:>8.1} {:>8.1} {:>9.1} | {:>8.1} {:>8.1} {:>8.1} {:>9.1} | {:>7.1}",
            r.name,
            ns_per(r.a.insert, N),
            ns_per(r.a.pop, N),
            ns_per(r.a.total(), N),
            ns_per(r.b.insert, N),
            ns_per(r.b.cancel, w.cancel.len()),
            ns_per(r.b.pop, n_rest),
            ns_per(r.b.total(), N),
            r.bytes,
        );
    }
    let wheel = &rows[0];
    for r in &rows[1..] {
        println!(
            "{} / TimingWheel time: a = {:.2}x, b = {:.2}x, memory {:.2}x",
            r.name,
            r.a.total().as_secs_f64() / wheel.a.total().as_secs_f64(),
            r.b.total().as_secs_f64() / wheel.b.total().as_secs_f64(),
            r.bytes / wheel.bytes,
        );
    }
    println!();
}

// ---------------------------------------------------------------------------
// Criterion.

fn bench_scenario<S: Timers>(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    w: &Workload,
    cancel: bool,
) {
    let mut ids = Vec::with_capacity(N);
    group.bench_function(S::NAME, |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let mut pops = 0usize;
                total += run::<S>(w, cancel, &mut ids, |d, v| {
                    black_box((d, v));
                    pops += 1;
                })
                .total();
                assert_eq!(pops, if cancel { w.order_rest.len() } else { N });
            }
            total
        })
    });
}

fn benches(c: &mut Criterion) {
    let w = Workload::new();
    summary(&w);
    for (name, cancel) in [("insert_pop_1M", false), ("insert_cancel50_pop_1M", true)] {
        let mut group = c.benchmark_group(name);
        group
            .sample_size(10)
            .sampling_mode(SamplingMode::Flat)
            .warm_up_time(Duration::from_secs(1))
            .measurement_time(Duration::from_secs(10))
            .throughput(Throughput::Elements(N as u64));
        bench_scenario::<Wheel>(&mut group, &w, cancel);
        bench_scenario::<Heap>(&mut group, &w, cancel);
        bench_scenario::<Tree>(&mut group, &w, cancel);
        group.finish();
    }
}

criterion_group!(timing, benches);
criterion_main!(timing);
