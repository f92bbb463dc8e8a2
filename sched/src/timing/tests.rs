use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};

use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;

/// 2026-01-01T00:00:00Z, a realistic reference time.
const T0: Nanos = 1_767_225_600_000_000_000;
const MS: Nanos = 1_000_000;
const SEC: Nanos = 1_000_000_000;

fn wheel_at(origin: Nanos) -> TimingWheel<u32> {
    TimingWheel::with_config(WheelConfig {
        origin,
        ..WheelConfig::default()
    })
}

/// Pops everything due at `now`, as `(deadline, value)`.
fn drain<T: Send + 'static>(w: &TimingWheel<T>, now: Nanos) -> Vec<(Nanos, T)> {
    std::iter::from_fn(|| w.pop_due(now))
        .map(|(d, _, v)| (d, v))
        .collect()
}

#[test]
fn pops_in_deadline_order() {
    let w = wheel_at(T0);
    for (i, d) in [5 * MS, 1, 3 * SEC, 2 * MS, 0, 7].into_iter().enumerate() {
        w.insert(T0 + d, i as u32);
    }
    assert_eq!(w.len(), 6);
    let got = drain(&w, T0 + 10 * SEC);
    let deadlines: Vec<_> = got.iter().map(|&(d, _)| d - T0).collect();
    assert_eq!(deadlines, [0, 1, 7, 2 * MS, 5 * MS, 3 * SEC]);
    assert_eq!(
        got.iter().map(|&(_, v)| v).collect::<Vec<_>>(),
        [4, 1, 5, 3, 0, 2]
    );
    assert!(w.is_empty());
    assert_eq!(w.pop_due(i64::MAX), None);
}

#[test]
fn equal_deadlines_fire_in_insertion_order() {
    let w = wheel_at(T0);
    // Spread the same deadline over near and far placement: some inserted
    // before the window reaches it, some after.
    let d = T0 + 2 * SEC;
    for v in 0..50 {
        w.insert(d, v);
    }
    assert_eq!(w.next_deadline(), Some(d)); // moves the window to `d`
    for v in 50..100 {
        w.insert(d, v);
    }
    let values: Vec<_> = drain(&w, d).into_iter().map(|(_, v)| v).collect();
    assert_eq!(values, (0..100).collect::<Vec<_>>());
}

#[test]
fn tiebreak_orders_equal_deadlines_before_insertion_order() {
    let w = wheel_at(T0);
    let d = T0 + 40 * MS;
    // (tiebreak, value): lower tiebreak first, FIFO within a tiebreak.
    let inserts = [(5, 0), (1, 1), (5, 2), (0, 3), (1, 4), (9, 5)];
    for (tb, v) in inserts {
        w.insert_with_tiebreak(d, tb, v);
    }
    w.insert_with_tiebreak(d - 1, 100, 6); // an earlier deadline beats any tiebreak
    w.insert(d, 7); // plain insert = tiebreak 0, after the earlier tiebreak-0 one
    let values: Vec<_> = drain(&w, d).into_iter().map(|(_, v)| v).collect();
    assert_eq!(values, [6, 3, 7, 1, 4, 0, 2, 5]);
}

#[test]
fn ids_are_unique_and_ordered_among_equal_deadlines() {
    let w = wheel_at(T0);
    let mut ids = HashSet::new();
    let mut same = Vec::new();
    for i in 0..10_000i64 {
        let id = w.insert(T0 + (i % 97) * 7 * MS, 0);
        assert!(ids.insert(id), "id {id:?} issued twice");
        if i % 97 == 5 {
            same.push(id);
        }
    }
    assert!(
        same.windows(2).all(|p| p[0] < p[1]),
        "ids of one deadline must increase"
    );
    // A popped id is never issued again.
    let (_, first, _) = w.pop_due(T0).expect("due");
    for _ in 0..1000 {
        assert_ne!(w.insert(T0, 0), first);
    }
}

#[test]
fn past_deadlines_are_due_at_once_in_order() {
    let w = wheel_at(T0);
    w.insert(T0 + SEC, 0);
    assert_eq!(w.pop_due(T0), None);
    w.insert(T0 - SEC, 1);
    w.insert(T0 - 3 * SEC, 2);
    w.insert(i64::MIN, 3);
    assert_eq!(w.next_deadline(), Some(i64::MIN));
    assert_eq!(
        drain(&w, T0),
        [(i64::MIN, 3), (T0 - 3 * SEC, 2), (T0 - SEC, 1)]
    );
    assert_eq!(w.next_deadline(), Some(T0 + SEC));
}

#[test]
fn far_future_deadlines_cross_every_level() {
    // Deadlines from 1 ns to centuries ahead land on every level and must
    // come back in order, each when `now` reaches it and not before.
    let w = wheel_at(T0);
    let mut expected = Vec::new();
    for exp in 0..62 {
        for j in 0..3i64 {
            let Some(d) = T0.checked_add((1i64 << exp) + j * 977) else {
                continue;
            };
            let v = expected.len() as u32;
            w.insert(d, v);
            expected.push((d, v));
        }
    }
    expected.sort();
    let mut got = Vec::new();
    for &(d, _) in &expected {
        // Nothing is due a nanosecond early.
        if got.len() < expected.len() && d > T0 {
            while let Some((dd, _, v)) = w.pop_due(d - 1) {
                got.push((dd, v));
            }
        }
        assert_eq!(w.next_deadline(), expected.get(got.len()).map(|&(d, _)| d));
        while let Some((dd, _, v)) = w.pop_due(d) {
            got.push((dd, v));
        }
    }
    assert_eq!(got, expected);
    assert!(w.is_empty());
}

#[test]
fn extreme_deadlines() {
    for origin in [0, T0, i64::MIN, i64::MAX, -1] {
        let w = wheel_at(origin);
        let ds = [
            i64::MAX,
            i64::MIN,
            0,
            -1,
            1,
            i64::MAX - 1,
            i64::MIN + 1,
            T0,
            -T0,
        ];
        for (i, &d) in ds.iter().enumerate() {
            w.insert(d, i as u32);
        }
        let mut sorted = ds.to_vec();
        sorted.sort_unstable();
        assert_eq!(w.next_deadline(), Some(i64::MIN));
        let got: Vec<_> = drain(&w, i64::MAX).into_iter().map(|(d, _)| d).collect();
        assert_eq!(got, sorted, "origin {origin}");
        // The window is now at the very end of time; inserts still work.
        w.insert(i64::MAX, 1);
        w.insert(i64::MIN, 2);
        assert_eq!(drain(&w, i64::MAX), [(i64::MIN, 2), (i64::MAX, 1)]);
    }
}

#[test]
fn extreme_deadlines_with_the_finest_tick() {
    // Regression: with 1 ns ticks the tick space was 2^64 and the boundary
    // after `i64::MAX` overflowed; the tick is now at least 2 ns.
    let w: TimingWheel<u32> = TimingWheel::with_config(WheelConfig {
        origin: T0,
        tick_shift: 0,
    });
    w.insert(i64::MAX, 0);
    w.insert(i64::MIN, 1);
    w.insert(T0 + 1, 2);
    assert_eq!(w.next_deadline(), Some(i64::MIN));
    assert_eq!(
        drain(&w, i64::MAX),
        [(i64::MIN, 1), (T0 + 1, 2), (i64::MAX, 0)]
    );
    w.insert(i64::MAX, 3);
    assert_eq!(
        w.pop_due(i64::MAX).map(|(d, _, v)| (d, v)),
        Some((i64::MAX, 3))
    );
}

#[test]
fn cancel_before_and_after_pop() {
    let w = wheel_at(T0);
    let near = w.insert(T0, 1);
    let far = w.insert(T0 + 3600 * SEC, 2);
    let mid = w.insert(T0 + 5 * MS, 3);
    assert_eq!(w.cancel(mid), Some(3));
    assert_eq!(w.cancel(mid), None, "second cancel");
    assert_eq!(w.len(), 2);
    assert_eq!(w.pop_due(T0), Some((T0, near, 1)));
    assert_eq!(w.cancel(near), None, "cancel after pop");
    assert_eq!(
        w.pop_due(T0 + 10 * MS),
        None,
        "cancelled firing must not fire"
    );
    assert_eq!(w.cancel(TimerId(999)), None, "unknown id");
    assert_eq!(w.cancel(far), Some(2));
    assert!(w.is_empty());
    assert_eq!(w.next_deadline(), None);
    assert_eq!(w.pop_due(i64::MAX), None);
}

#[test]
fn cancel_in_the_drained_window() {
    let w = wheel_at(T0);
    let ids: Vec<_> = (0..10).map(|i| w.insert(T0 + SEC + i, i as u32)).collect();
    // Draws the tick into the consumer's sorted run.
    assert_eq!(w.next_deadline(), Some(T0 + SEC));
    assert_eq!(w.cancel(ids[0]), Some(0));
    assert_eq!(w.cancel(ids[5]), Some(5));
    assert_eq!(w.next_deadline(), Some(T0 + SEC + 1));
    let values: Vec<_> = drain(&w, T0 + 2 * SEC)
        .into_iter()
        .map(|(_, v)| v)
        .collect();
    assert_eq!(values, [1, 2, 3, 4, 6, 7, 8, 9]);
}

#[test]
fn next_deadline_is_exact_after_inserts_cancels_and_pops() {
    let w = wheel_at(T0);
    assert_eq!(w.next_deadline(), None);
    let a = w.insert(T0 + 10 * SEC + 3, 0);
    assert_eq!(w.next_deadline(), Some(T0 + 10 * SEC + 3));
    // The window has jumped to 10 s ahead; an earlier insert is seen at once.
    let b = w.insert(T0 + 7, 1);
    assert_eq!(w.next_deadline(), Some(T0 + 7));
    let c = w.insert(T0 + 10 * SEC + 2, 2);
    assert_eq!(w.next_deadline(), Some(T0 + 7));
    assert_eq!(w.cancel(b), Some(1));
    assert_eq!(w.next_deadline(), Some(T0 + 10 * SEC + 2));
    assert_eq!(w.cancel(c), Some(2));
    assert_eq!(w.next_deadline(), Some(T0 + 10 * SEC + 3));
    let d = w.insert(T0 + 20 * SEC, 3);
    assert_eq!(
        w.pop_due(T0 + 10 * SEC + 3),
        Some((T0 + 10 * SEC + 3, a, 0))
    );
    assert_eq!(w.next_deadline(), Some(T0 + 20 * SEC));
    assert_eq!(w.pop_due(T0 + 20 * SEC), Some((T0 + 20 * SEC, d, 3)));
    assert_eq!(w.next_deadline(), None);
}

#[test]
fn pop_due_respects_now_and_tolerates_time_going_backwards() {
    let w = wheel_at(T0);
    w.insert(T0 + 5 * MS, 0);
    w.insert(T0 + 9 * MS, 1);
    assert_eq!(w.pop_due(T0 + 5 * MS - 1), None);
    assert_eq!(
        w.pop_due(T0 + 5 * MS).map(|(d, _, v)| (d, v)),
        Some((T0 + 5 * MS, 0))
    );
    // The clock steps back: nothing is due, nothing is lost.
    assert_eq!(w.pop_due(T0 - SEC), None);
    w.insert(T0 - 2 * SEC, 2);
    assert_eq!(w.pop_due(T0 - SEC).map(|(_, _, v)| v), Some(2));
    assert_eq!(w.pop_due(T0 + 9 * MS).map(|(_, _, v)| v), Some(1));
    assert!(w.is_empty());
}

#[test]
fn small_ticks_and_origin_at_epoch() {
    for tick_shift in [0, 1, 6, 13, 40, 63] {
        let w: TimingWheel<u32> = TimingWheel::with_config(WheelConfig {
            origin: 0,
            tick_shift,
        });
        let mut rng = ChaCha8Rng::seed_from_u64(u64::from(tick_shift));
        let mut expected = Vec::new();
        for v in 0..2000 {
            let d = T0 + rng.random_range(-SEC..100 * SEC);
            w.insert(d, v);
            expected.push((d, v));
        }
        expected.sort();
        assert_eq!(drain(&w, i64::MAX), expected, "tick_shift {tick_shift}");
    }
}

#[test]
fn churn_of_far_cancels_keeps_memory_bounded() {
    // A far firing re-inserted and cancelled over and over (a pack replaced
    // again and again) must not pile up tombstones.
    let w = wheel_at(T0);
    let keep = w.insert(T0 + 3600 * SEC, u32::MAX);
    for i in 0..100_000u32 {
        let id = w.insert(T0 + 60 * SEC + i64::from(i) * MS, i);
        assert_eq!(w.cancel(id), Some(i));
        assert!(w.tombstones.load(Ordering::Relaxed) <= 2 + SWEEP_SLACK);
    }
    assert_eq!(w.len(), 1);
    assert_eq!(w.next_deadline(), Some(T0 + 3600 * SEC));
    assert_eq!(w.pop_due(i64::MAX), Some((T0 + 3600 * SEC, keep, u32::MAX)));
}

#[test]
fn churn_of_near_cancels_keeps_memory_bounded() {
    let w = wheel_at(T0);
    // Move the window far ahead so everything below goes to the skiplist.
    w.insert(T0 + 3600 * SEC, 0);
    assert_eq!(w.next_deadline(), Some(T0 + 3600 * SEC));
    for i in 0..20_000u32 {
        let id = w.insert(T0 + SEC + i64::from(i), i);
        assert_eq!(w.cancel(id), Some(i));
    }
    assert!(
        w.near.len() <= 2 + SWEEP_SLACK,
        "{} keys in the skiplist",
        w.near.len()
    );
    assert_eq!(w.next_deadline(), Some(T0 + 3600 * SEC));
}

/// A counting allocator for this test binary: bytes in large allocations
/// made and not yet freed, counted per thread so that the tests running
/// alongside do not disturb the count. Only allocations of at least
/// [`LARGE`](counting::LARGE) bytes are counted: those are the wheel's hash
/// tables and key vectors, which only the thread calling into the wheel
/// allocates and frees. Skiplist nodes and crossbeam-epoch's garbage bags are
/// smaller, and are freed by whichever thread collects the garbage, often
/// another test's; counting them would make the measure depend on the others.
#[allow(unsafe_code)]
mod counting {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    pub(super) const LARGE: usize = 4096;

    thread_local! {
        static LARGE_BYTES: Cell<isize> = const { Cell::new(0) };
    }

    fn account(size: usize, sign: isize) {
        if size >= LARGE {
            // Sizes fit an `isize` (a `Layout` guarantees it). `try_with`,
            // so the allocator never panics, even during thread teardown.
            let delta = sign * size as isize;
            let _ = LARGE_BYTES.try_with(|b| b.set(b.get() + delta));
        }
    }

    pub(super) fn large_bytes() -> isize {
        LARGE_BYTES.with(Cell::get)
    }

    struct Counting;

    // SAFETY: every method forwards to `System` unchanged and only counts.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            // SAFETY: same contract as ours.
            let p = unsafe { System.alloc(layout) };
            if !p.is_null() {
                account(layout.size(), 1);
            }
            p
        }

        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            // SAFETY: same contract as ours.
            let p = unsafe { System.alloc_zeroed(layout) };
            if !p.is_null() {
                account(layout.size(), 1);
            }
            p
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: same contract as ours.
            unsafe { System.dealloc(ptr, layout) };
            account(layout.size(), -1);
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            // SAFETY: same contract as ours.
            let p = unsafe { System.realloc(ptr, layout, new_size) };
            if !p.is_null() {
                account(layout.size(), -1);
                account(new_size, 1);
            }
            p
        }
    }

    #[global_allocator]
    static COUNTING: Counting = Counting;
}

#[test]
fn periodic_batches_with_timeouts_and_time_jumps_keep_memory_flat() {
    // The scheduler's pattern: N periodic instructions due on the same
    // second. Each firing arms a timeout 30 s ahead, which its result
    // cancels, and the next occurrence 1 s ahead; after 5 rounds time jumps
    // 200 s. Pending firings stay N, but every second's batch lands in
    // another index shard (shards go by tick), so tables sized for a batch
    // must be given back once it has fired, or memory grows cycle after
    // cycle towards 64 tables of N.
    const N: u32 = 2000;
    let before = counting::large_bytes();
    let w = wheel_at(T0);
    for v in 0..N {
        w.insert(T0, v);
    }
    let mut now = T0;
    let mut cycle = || {
        now += 200 * SEC;
        for _ in 0..5 {
            let fired = drain(&w, now);
            assert_eq!(fired.len(), N as usize);
            let timeouts: Vec<TimerId> = fired
                .into_iter()
                .map(|(_, v)| {
                    w.insert(now + SEC, v);
                    w.insert(now + 30 * SEC, v)
                })
                .collect();
            for id in timeouts {
                assert!(w.cancel(id).is_some());
            }
            now += SEC;
            assert_eq!(w.next_deadline(), Some(now));
        }
        assert_eq!(w.len(), N as usize);
        // The cancelled timeouts are swept or drained as they go.
        assert!(w.tombstones.load(Ordering::Relaxed) <= N as usize + SWEEP_SLACK);
    };
    // The first cycles size the tables and vectors.
    cycle();
    cycle();
    let warm = counting::large_bytes() - before;
    for _ in 0..4 {
        cycle();
    }
    let after = counting::large_bytes() - before;
    eprintln!("large allocations: {warm} B after 2 cycles, {after} B after 6");
    assert!(
        after <= warm,
        "memory grew from {warm} to {after} B with pending firings steady at {N}"
    );
    // Key vectors, and the index table of one batch, with headroom.
    let per_firing = warm / N as isize;
    assert!(per_firing < 200, "{per_firing} B per pending firing");
}

#[test]
fn values_are_dropped_exactly_once() {
    use std::sync::Arc;
    let token = Arc::new(());
    {
        let w = wheel_at(T0);
        let w2: TimingWheel<Arc<()>> = TimingWheel::with_config(WheelConfig {
            origin: T0,
            ..Default::default()
        });
        drop(w);
        let a = w2.insert(T0 + SEC, Arc::clone(&token));
        w2.insert(T0 + 2 * SEC, Arc::clone(&token));
        w2.insert(T0 - SEC, Arc::clone(&token));
        assert_eq!(Arc::strong_count(&token), 4);
        drop(w2.cancel(a));
        drop(w2.pop_due(T0));
        assert_eq!(Arc::strong_count(&token), 2);
    }
    assert_eq!(Arc::strong_count(&token), 1, "pending value leaked on drop");
}

#[test]
fn wheel_is_send_and_sync() {
    fn check<S: Send + Sync>() {}
    check::<TimingWheel<u32>>();
    check::<TimingWheel<std::sync::mpsc::Sender<u8>>>();
}

// ---------------------------------------------------------------------------
// Model test: random operations against a BTreeMap.

#[derive(Clone, Debug)]
enum Op {
    /// Deadline = now + offset (offset may be negative: in the past).
    Insert {
        offset: i64,
        tiebreak: u64,
    },
    /// Deadline at an extreme or fixed point of the time line.
    InsertAbsolute {
        deadline: i64,
    },
    /// Cancel the `n`-th id ever issued (modulo), popped or not.
    Cancel {
        n: usize,
    },
    /// Advance `now` (or step it back if negative), then pop once.
    Pop {
        step: i64,
    },
    /// Pop everything due at the current `now`.
    PopAll,
    NextDeadline,
}

/// Offsets across scales: sub-tick, ticks, seconds, hours, years, ages.
fn offset() -> impl Strategy<Value = i64> {
    (0u32..8, any::<i64>(), prop::bool::weighted(0.15)).prop_map(|(scale, raw, past)| {
        let bits = [4, 12, 20, 26, 32, 40, 50, 62][scale as usize];
        let magnitude = (raw & i64::MAX) >> (63 - bits);
        if past { -magnitude } else { magnitude }
    })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (offset(), 0u64..3).prop_map(|(offset, tiebreak)| Op::Insert { offset, tiebreak }),
        1 => prop::sample::select(vec![i64::MIN, i64::MAX, 0, -1, T0, T0 + 1])
            .prop_map(|deadline| Op::InsertAbsolute { deadline }),
        3 => any::<usize>().prop_map(|n| Op::Cancel { n }),
        4 => prop_oneof![offset(), Just(0), -1_000i64..1_000].prop_map(|step| Op::Pop { step }),
        1 => Just(Op::PopAll),
        2 => Just(Op::NextDeadline),
    ]
}

fn run_model(tick_shift: u32, ops: &[Op]) -> Result<(), TestCaseError> {
    let w: TimingWheel<u64> = TimingWheel::with_config(WheelConfig {
        origin: T0,
        tick_shift,
    });
    let mut model: BTreeMap<(Nanos, u64, u64), u64> = BTreeMap::new();
    let mut keys: HashMap<u64, (Nanos, u64, u64)> = HashMap::new();
    let mut issued: Vec<TimerId> = Vec::new();
    let mut now = T0;
    let mut next_value = 0u64;
    for op in ops {
        match *op {
            Op::Insert { .. } | Op::InsertAbsolute { .. } => {
                let (deadline, tiebreak) = match *op {
                    Op::Insert { offset, tiebreak } => (now.saturating_add(offset), tiebreak),
                    Op::InsertAbsolute { deadline } => (deadline, 0),
                    _ => unreachable!(),
                };
                let value = next_value;
                next_value += 1;
                let id = w.insert_with_tiebreak(deadline, tiebreak, value);
                prop_assert!(!issued.contains(&id), "id reused");
                issued.push(id);
                let key = (deadline, tiebreak, id.0);
                model.insert(key, value);
                keys.insert(id.0, key);
            }
            Op::Cancel { n } => {
                if issued.is_empty() {
                    continue;
                }
                let id = issued[n % issued.len()];
                let expected = keys.remove(&id.0).and_then(|key| model.remove(&key));
                prop_assert_eq!(w.cancel(id), expected, "cancel {:?}", id);
            }
            Op::Pop { step } => {
                now = now.saturating_add(step);
                let expected = model
                    .first_key_value()
                    .filter(|((d, _, _), _)| *d <= now)
                    .map(|(&k, &v)| (k, v));
                if let Some((k, _)) = expected {
                    model.remove(&k);
                    keys.remove(&k.2);
                }
                let got = w.pop_due(now);
                prop_assert_eq!(
                    got,
                    expected.map(|((d, _, s), v)| (d, TimerId(s), v)),
                    "pop at {}",
                    now
                );
            }
            Op::PopAll => loop {
                let expected = model
                    .first_key_value()
                    .filter(|((d, _, _), _)| *d <= now)
                    .map(|(&k, &v)| (k, v));
                if let Some((k, _)) = expected {
                    model.remove(&k);
                    keys.remove(&k.2);
                }
                let got = w.pop_due(now);
                prop_assert_eq!(got, expected.map(|((d, _, s), v)| (d, TimerId(s), v)));
                if got.is_none() {
                    break;
                }
            },
            Op::NextDeadline => {
                let expected = model.keys().next().map(|k| k.0);
                prop_assert_eq!(w.next_deadline(), expected);
            }
        }
        prop_assert_eq!(w.len(), model.len());
    }
    // Finally everything comes out, in order.
    let rest: Vec<_> = std::iter::from_fn(|| w.pop_due(i64::MAX)).collect();
    let expected: Vec<_> = model
        .into_iter()
        .map(|((d, _, s), v)| (d, TimerId(s), v))
        .collect();
    prop_assert_eq!(rest, expected);
    prop_assert!(w.is_empty());
    Ok(())
}

proptest! {
    // 256 cases by default; PROPTEST_CASES=n for a longer soak.
    #[test]
    fn matches_btreemap_model(
        tick_shift in prop::sample::select(vec![0u32, 3, 10, 20, 30]),
        ops in prop::collection::vec(op(), 1..300),
    ) {
        run_model(tick_shift, &ops)?;
    }
}

// ---------------------------------------------------------------------------
// Concurrency: one thread inserts and cancels while another pops.

/// Range-maximum over a fixed slice (sparse table), for the order check.
struct RangeMax {
    table: Vec<Vec<(Nanos, u64, u64)>>,
}

impl RangeMax {
    fn new(values: &[(Nanos, u64, u64)]) -> Self {
        let mut table = vec![values.to_vec()];
        let mut width = 1;
        while width * 2 <= values.len() {
            let prev = &table[table.len() - 1];
            let next = (0..=values.len() - width * 2)
                .map(|i| prev[i].max(prev[i + width]))
                .collect();
            table.push(next);
            width *= 2;
        }
        Self { table }
    }

    /// Maximum of `values[lo..hi]`, `hi > lo`.
    fn max(&self, lo: usize, hi: usize) -> (Nanos, u64, u64) {
        let level = (usize::BITS - 1 - (hi - lo).leading_zeros()) as usize;
        let row = &self.table[level];
        row[lo].max(row[hi - (1 << level)])
    }
}

/// Parameters of one concurrent run.
#[derive(Clone, Copy, Debug)]
struct Scenario {
    tick_shift: u32,
    seed: u64,
    /// Inserting threads (each also cancels its own firings).
    inserters: u64,
    per_inserter: u64,
    /// Chance that an insert is followed by a cancel.
    cancel_p: f64,
    /// Cancel one of the last `cancel_window` inserts of this thread.
    cancel_window: usize,
    /// Out of 10 inserts, how many are far (up to ~18 min) rather than
    /// within 2 s; one more is in the past.
    far_in_10: u32,
}

/// The tiebreak is a function of the value, so the popper can rebuild the
/// full key of what it pops.
fn tiebreak_of(value: u64) -> u64 {
    value % 3
}

/// Per-inserter record: `(key, insert-returned stamp)` indexed by the
/// inserter's own counter, and the ids it cancelled successfully.
type InsertLog = (Vec<((Nanos, u64, u64), u64)>, HashSet<u64>);

fn concurrent_run(sc: Scenario) {
    let w: TimingWheel<u64> = TimingWheel::with_config(WheelConfig {
        origin: 0,
        tick_shift: sc.tick_shift,
    });
    // A logical clock ordering "insert returned" before "pop started".
    let clock = AtomicU64::new(0);
    let running = AtomicU64::new(sc.inserters);

    let (logs, popped) = std::thread::scope(|s| {
        let inserters: Vec<_> = (0..sc.inserters)
            .map(|t| {
                let (w, clock, running) = (&w, &clock, &running);
                s.spawn(move || -> InsertLog {
                    // Count down even if this thread panics, so the popper ends.
                    struct Done<'a>(&'a AtomicU64);
                    impl Drop for Done<'_> {
                        fn drop(&mut self) {
                            self.0.fetch_sub(1, Ordering::SeqCst);
                        }
                    }
                    let _done = Done(running);
                    let mut rng = ChaCha8Rng::seed_from_u64(sc.seed * 1000 + t);
                    let mut log = Vec::new();
                    let mut cancelled = HashSet::new();
                    for i in 0..sc.per_inserter {
                        // Values are unique across threads: thread in the top bits.
                        let value = (t << 32) | i;
                        let roll = rng.random_range(0..10);
                        let deadline = if roll == 0 {
                            rng.random_range(-1_000_000..0) // past
                        } else if roll <= sc.far_in_10 {
                            rng.random_range(0..1i64 << 40) // far
                        } else {
                            rng.random_range(0..2_000_000_000) // near-ish
                        };
                        let id = w.insert_with_tiebreak(deadline, tiebreak_of(value), value);
                        let stamp = clock.fetch_add(1, Ordering::SeqCst);
                        log.push(((deadline, tiebreak_of(value), id.0), stamp));
                        if rng.random_bool(sc.cancel_p) {
                            let lo = log.len().saturating_sub(sc.cancel_window);
                            let victim = rng.random_range(lo..log.len());
                            let victim_id = TimerId(log[victim].0.2);
                            if let Some(v) = w.cancel(victim_id) {
                                assert_eq!(
                                    v,
                                    (t << 32) | victim as u64,
                                    "cancel returned another value"
                                );
                                assert!(cancelled.insert(victim_id.0), "cancelled twice");
                            }
                        }
                    }
                    (log, cancelled)
                })
            })
            .collect();
        let popper = s.spawn(|| {
            // (key, value, pop-start stamp)
            let mut popped: Vec<((Nanos, u64, u64), u64, u64)> = Vec::new();
            let mut now: Nanos = -2_000_000;
            loop {
                let done = running.load(Ordering::SeqCst) == 0;
                let start = clock.fetch_add(1, Ordering::SeqCst);
                match w.pop_due(now) {
                    Some((d, id, v)) => popped.push(((d, tiebreak_of(v), id.0), v, start)),
                    // Everything is due: an empty pop means all was popped
                    // (a lost firing is reported by the checks below).
                    None if now == i64::MAX => break,
                    None if done => now = i64::MAX,
                    None => now += 200_000,
                }
                if popped.len().is_multiple_of(64) {
                    let _ = w.next_deadline();
                }
            }
            popped
        });
        let logs: Vec<InsertLog> = inserters
            .into_iter()
            .map(|h| h.join().expect("inserter panicked"))
            .collect();
        (logs, popper.join().expect("popper panicked"))
    });

    // value -> (key, insert stamp); and all successfully cancelled ids.
    let mut by_value: HashMap<u64, ((Nanos, u64, u64), u64)> = HashMap::new();
    let mut cancelled: HashSet<u64> = HashSet::new();
    for (t, (log, c)) in logs.iter().enumerate() {
        for (i, entry) in log.iter().enumerate() {
            by_value.insert(((t as u64) << 32) | i as u64, *entry);
        }
        cancelled.extend(c);
    }
    let all_ids: HashSet<u64> = by_value.values().map(|(k, _)| k.2).collect();
    assert_eq!(all_ids.len(), by_value.len(), "an id was issued twice");

    // Every id: popped exactly once, or cancelled exactly once, never both.
    let mut seen = HashSet::new();
    for &(key, value, _) in &popped {
        assert!(seen.insert(key.2), "id {} popped twice", key.2);
        assert!(
            !cancelled.contains(&key.2),
            "id {} popped after a successful cancel",
            key.2
        );
        assert_eq!(by_value[&value].0, key, "popped with another key or value");
    }
    for id in &all_ids {
        assert!(seen.contains(id) ^ cancelled.contains(id), "id {id} lost");
    }
    assert_eq!(
        (popped.len() + cancelled.len()) as u64,
        sc.inserters * sc.per_inserter
    );
    assert!(!cancelled.is_empty() && !popped.is_empty());

    // Order: a pop may return a key smaller than an earlier pop's only if it
    // was inserted after that earlier pop began.
    let keys: Vec<_> = popped.iter().map(|p| p.0).collect();
    let starts: Vec<_> = popped.iter().map(|p| p.2).collect();
    let range_max = RangeMax::new(&keys);
    for (j, &(key, value, _)) in popped.iter().enumerate() {
        let inserted_at = by_value[&value].1;
        // Earlier pops that began after this key's insert had returned.
        let lo = starts[..j].partition_point(|&s| s < inserted_at);
        if lo < j {
            let max = range_max.max(lo, j);
            assert!(
                max <= key,
                "popped {key:?} after {max:?} although it was pending first"
            );
        }
    }
    assert_eq!(
        w.tombstones.load(Ordering::Relaxed),
        0,
        "tombstones left behind"
    );
    if sc.cancel_p > 0.8 {
        assert!(w.sweeps.load(Ordering::Relaxed) > 0, "the sweep never ran");
    }
}

#[test]
fn concurrent_insert_cancel_pop() {
    let base = Scenario {
        tick_shift: 20,
        seed: 1,
        inserters: 1,
        per_inserter: 40_000,
        cancel_p: 0.3,
        cancel_window: usize::MAX,
        far_in_10: 1,
    };
    concurrent_run(base);
    // Small ticks: the window moves constantly, many cascades race inserts.
    concurrent_run(Scenario {
        tick_shift: 8,
        seed: 2,
        ..base
    });
    concurrent_run(Scenario {
        tick_shift: 1,
        seed: 3,
        ..base
    });
}

#[test]
fn concurrent_inserters_share_slots() {
    concurrent_run(Scenario {
        tick_shift: 12,
        seed: 4,
        inserters: 2,
        per_inserter: 20_000,
        cancel_p: 0.2,
        cancel_window: usize::MAX,
        far_in_10: 1,
    });
}

#[test]
fn concurrent_cancel_churn_sweeps_while_popping() {
    // Nearly every insert is cancelled soon after, and most are far ahead of
    // the popper's `now`: tombstones pile up in the levels until a sweep runs
    // on the cancelling thread, racing the popper's pops and window moves.
    concurrent_run(Scenario {
        tick_shift: 20,
        seed: 5,
        inserters: 1,
        per_inserter: 40_000,
        cancel_p: 0.95,
        cancel_window: 4,
        far_in_10: 8,
    });
}
