//! Memory of the timing wheel stays flat under the scheduler's pattern of
//! inserts, pops and cancels: counted with a counting allocator, in bytes.
//!
//! An integration test, so that the allocator's `unsafe` stays out of the
//! library crate, which forbids unsafe code, its unit tests included.

use baton_sched::timing::{Nanos, TimerId, TimingWheel, WheelConfig};

/// 2026-01-01T00:00:00Z.
const T0: Nanos = 1_767_225_600_000_000_000;
const SEC: Nanos = 1_000_000_000;

/// Pops everything due at `now`, as `(deadline, value)`.
fn drain<T>(w: &mut TimingWheel<T>, now: Nanos) -> Vec<(Nanos, T)> {
    std::iter::from_fn(|| w.pop_due(now))
        .map(|(d, _, v)| (d, v))
        .collect()
}

/// A counting allocator for this test binary: bytes in large allocations
/// made and not yet freed, counted per thread so that the test harness's own
/// threads do not disturb the count. Only allocations of at least
/// [`LARGE`](counting::LARGE) bytes are counted: those are the wheel's hash
/// table and the key vectors of whole batches, the ones that would grow.
/// Small slot vectors come and go with where each cycle's ticks fall among
/// the slots, which would make the count jitter by a few hundred bytes.
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
    // 200 s. Pending firings stay N, with as many timeouts cancelled each
    // round: tombstones must be swept or drained, and key vectors and the
    // index table given back, or memory grows cycle after cycle.
    const N: u32 = 2000;
    let before = counting::large_bytes();
    let mut w: TimingWheel<u32> = TimingWheel::with_config(WheelConfig {
        origin: T0,
        ..WheelConfig::default()
    });
    for v in 0..N {
        w.insert(T0, v);
    }
    let mut now = T0;
    let mut cycle = || {
        now += 200 * SEC;
        for _ in 0..5 {
            let fired = drain(&mut w, now);
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
