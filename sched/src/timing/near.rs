//! The near window: every key below the boundary, in exact order.
//!
//! Two parts, merged at their heads:
//!
//! * the *run*: the keys of the tick the window last reached, drained from
//!   the levels and sorted once (descending, so the next is last and a pop
//!   is a `Vec::pop`). This is where nearly all keys pass: a tick's batch is
//!   sorted at once, O(k log k), and popped in O(1) each;
//! * the *late* heap: keys inserted below the boundary after it moved — in
//!   the current tick, or in the past — which must be in exact order at once.
//!   A binary heap: O(log n) push and pop, no allocation per key, and
//!   tombstones are dropped lazily like everywhere else in the wheel.
//!
//! The late keys could go into the run by binary search instead, but a burst
//! of them (a pack accepted with all its first occurrences due now) would
//! shift the run for each; the heap keeps that O(log n).
//!
//! Why a heap, measured: with the window moved past 1M keys inserted below
//! it (every key late, the worst case), insert + pop cost about the same with
//! a `BTreeSet` (465 + 333 ns per key) as with the heap (121 + 721 ns), and
//! three times as much with crossbeam's `SkipSet` (1771 + 874 ns), the
//! structure this was before the wheel had one owner. The usual late set is
//! a handful of keys, where the heap's flat array wins outright.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::Key;

/// Run capacity kept between ticks; a burst beyond it is freed.
const RUN_KEEP: usize = 1024;

/// Late-heap capacity always kept (16 Ki keys, ~400 KB): steady batches
/// reuse it without shrinking and growing again; only a burst beyond it is
/// given back as it drains.
const LATE_KEEP: usize = 16 * 1024;

/// Keys below the boundary.
#[derive(Debug, Default)]
pub(super) struct Near {
    /// Keys drained from the levels, sorted *descending* so the next is last.
    run: Vec<Key>,
    /// Keys inserted below the boundary, smallest on top.
    late: BinaryHeap<Reverse<Key>>,
}

impl Near {
    /// The smallest key (live or tombstone).
    pub(super) fn head(&self) -> Option<Key> {
        match (self.run.last(), self.late.peek()) {
            (Some(&r), Some(&Reverse(l))) => Some(r.min(l)),
            (Some(&r), None) => Some(r),
            (None, Some(&Reverse(l))) => Some(l),
            (None, None) => None,
        }
    }

    /// Removes the smallest key.
    pub(super) fn pop(&mut self) -> Option<Key> {
        match (self.run.last(), self.late.peek()) {
            (Some(r), Some(Reverse(l))) if l < r => self.pop_late(),
            (Some(_), _) => self.run.pop(),
            (None, _) => self.pop_late(),
        }
    }

    /// Pops the late heap, giving capacity back once it is three quarters
    /// empty: when the window has jumped to a far key, everything inserted
    /// before it lands here, and after such a burst drains the heap would
    /// otherwise hold its peak for good (memory follows pending firings).
    /// Halving at a quarter keeps the shrinking amortised O(1) per pop.
    fn pop_late(&mut self) -> Option<Key> {
        let key = self.late.pop().map(|Reverse(k)| k);
        let (len, cap) = (self.late.len(), self.late.capacity());
        if cap > LATE_KEEP && len < cap / 4 {
            self.late.shrink_to((len * 2).max(LATE_KEEP));
        }
        key
    }

    /// Adds a key inserted below the boundary.
    pub(super) fn push(&mut self, key: Key) {
        self.late.push(Reverse(key));
    }

    pub(super) fn is_empty(&self) -> bool {
        self.run.is_empty() && self.late.is_empty()
    }

    /// Fills the (empty) run with the next tick's keys through `fill`, which
    /// may leave them unsorted, then sorts them. Returns whether the run got
    /// any keys.
    pub(super) fn refill(&mut self, fill: impl FnOnce(&mut Vec<Key>)) -> bool {
        debug_assert!(self.run.is_empty());
        self.run.shrink_to(RUN_KEEP);
        fill(&mut self.run);
        self.run.sort_unstable_by(|a, b| b.cmp(a));
        !self.run.is_empty()
    }

    /// Drops keys for which `live` is false; returns how many were dropped.
    pub(super) fn retain(&mut self, mut live: impl FnMut(&Key) -> bool) -> usize {
        let before = self.len();
        // `retain` keeps the order of what it keeps: the run stays sorted.
        self.run.retain(&mut live);
        self.late.retain(|Reverse(key)| live(key));
        if self.late.len() < self.late.capacity() / 4 {
            self.late.shrink_to_fit();
        }
        before - self.len()
    }

    /// Keys held, live or not.
    pub(super) fn len(&self) -> usize {
        self.run.len() + self.late.len()
    }

    /// Every key held, in no particular order (for tests).
    #[cfg(test)]
    pub(super) fn keys(&self) -> impl Iterator<Item = &Key> {
        self.run
            .iter()
            .chain(self.late.iter().map(|Reverse(key)| key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timing::Nanos;

    #[test]
    fn a_drained_burst_of_late_keys_gives_its_memory_back_and_order_holds() {
        let mut near = Near::default();
        let n = 100_000u64;
        for i in (0..n).rev() {
            near.push(Key {
                deadline: i as Nanos,
                tiebreak: 0,
                id: i,
            });
        }
        let peak = near.late.capacity();
        assert!(peak >= n as usize);
        for i in 0..n - 1 {
            assert_eq!(near.pop().map(|k| k.id), Some(i), "exact order");
        }
        assert_eq!(near.len(), 1);
        assert!(
            near.late.capacity() <= LATE_KEEP,
            "one key left, {} of capacity kept (peak {peak})",
            near.late.capacity()
        );
        assert_eq!(near.pop().map(|k| k.id), Some(n - 1));
        assert!(near.is_empty());
    }
}
