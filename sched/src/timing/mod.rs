//! The timing structure: pending firings in exact `(deadline ns, tiebreak,
//! insertion order)` order.
//!
//! [`TimingWheel`] is a hierarchical timing wheel with an exactly ordered
//! near window. It is sans-IO: it never reads a clock, `now` is passed to
//! [`TimingWheel::pop_due`].
//!
//! # One owner
//!
//! The wheel's one user is the [`Scheduler`](crate::Scheduler), and the
//! scheduler is owned by one thread, the agent's control thread: the link's
//! IO thread passes what it receives to the control thread, which alone
//! calls into the core. So
//! the wheel is plain data changed through `&mut self` — no locks, no
//! atomics, no lock-free lists — and it is `Send` (and `Sync`) whenever its
//! values are, by construction. Sharing it would cost every operation a
//! synchronisation it never needs: on the control thread's core, a `&mut`
//! call is the whole cost.
//!
//! # Shape
//!
//! ```text
//!   index (one HashMap)              id → value           cancel = remove here
//!   ─────────────────────────────────────────────────────────────────────────
//!   near window  (tick < boundary)   exact (deadline, tiebreak, id) order
//!     · run       sorted Vec: the tick the window last reached
//!     · late      binary heap: keys inserted below the boundary
//!   ──────────────────────── boundary (a tick, only grows) ─────────────────
//!   far levels   (tick ≥ boundary)   64 slots per level, 6 bits of tick per
//!                                    level (8 levels at the default tick),
//!                                    unsorted Vecs
//! ```
//!
//! *Exact order where it matters*: every key below the boundary is in exact
//! order (the run is sorted, the heap is a heap, the two heads are merged), and
//! every key in the far levels is at or after the boundary, so the smaller near
//! head is the global minimum. *Far inserts are cheap*: a far key is pushed
//! unsorted onto its slot's `Vec`, whatever the distance; keys are sorted one
//! tick (2^20 ns ≈ 1 ms by default) at a time, when the window reaches them.
//! Only keys are moved and sorted (24 bytes); values stay put in the index.
//!
//! The boundary moves only when the near window runs dry and the wheel needs
//! its next key (to pop it, or to know the next deadline after the first one
//! was popped or cancelled): it jumps to the end of the earliest occupied
//! tick, draining that tick into the run and re-filing coarser slots one
//! level down on the way (see `levels`). An insert below the boundary goes
//! into the heap, so a key that arrives in the current window — or in the
//! past — is in exact order at once.
//!
//! *The next deadline without `&mut`*: the wheel keeps its earliest live key
//! (`first`) up to date — an insert compares with it, a pop or the cancel of
//! that very key looks for the next one — so [`TimingWheel::next_deadline`]
//! is a field read, and the scheduler can answer "when do you wake?" through
//! `&self`. Inserts never move the window: a million far inserts into an
//! empty wheel stay O(1) each.
//!
//! # Cancel and memory
//!
//! *Cancel* removes the value from the index and leaves the key behind as a
//! tombstone: the window skips keys whose value is gone (and drops them in
//! bulk when it drains a tick). So that memory stays O(pending) under
//! insert/cancel churn, the cancel that makes tombstones outnumber live
//! firings sweeps them all out of the levels and the near window.
//!
//! *Periodic and cron* instructions insert only their next occurrence; the
//! wheel holds one key and one value per pending firing, never a schedule.
//!
//! *The index table* gives back capacity when a removal leaves it less than
//! a quarter full (see `index`), so a burst does not pin its size forever.
//!
//! # Complexity (n pending firings)
//!
//! | operation      | cost                                                    |
//! |----------------|---------------------------------------------------------|
//! | `insert`       | O(1) expected (far); O(log n) into the heap (near)      |
//! | `cancel`       | O(1) expected, amortised over sweeps; cancelling the   |
//! |                | earliest firing also finds the next one (as a pop)      |
//! | `pop_due`      | O(1) amortised + the tick's sort, O(k log k) for k keys  |
//! |                | per tick; each key moves at most once per level          |
//! | `next_deadline`| O(1), a field read                                      |
//!
//! # Deadlines and ticks
//!
//! A deadline `d: i64` maps order-preservingly to `d as u64 ^ 1 << 63`; its
//! tick is that shifted right by `tick_shift`. The whole `i64` range is valid:
//! far-past deadlines are due at once, `i64::MAX` is simply last.
//! Time going backwards (a smaller `now`) only means fewer firings are due.

mod index;
mod levels;
mod near;

#[cfg(test)]
mod tests;

use std::fmt;

use self::index::Index;
use self::levels::Levels;
use self::near::Near;

/// Reference-time nanoseconds since the Unix epoch.
pub type Nanos = i64;

/// Handle of a pending firing, returned by [`TimingWheel::insert`].
///
/// A counter of the wheel's inserts: unique for the wheel's lifetime — a
/// stale id never cancels a newer firing — and, among firings with the same
/// deadline and tiebreak, the insertion order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TimerId(pub u64);

/// Construction parameters of a [`TimingWheel`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WheelConfig {
    /// Where the near window starts: deadlines before it are due at once and
    /// go straight into the near window. Pass the current reference time, so
    /// the first firings are filed on the low levels (fewer moves later).
    pub origin: Nanos,
    /// A tick is `2^tick_shift` ns (clamped to `1..=40`): the width of one
    /// near window, so the batch that is sorted at a time. Larger ticks sort
    /// more at once and send more near-future inserts to the heap; smaller
    /// ones move the window more often.
    pub tick_shift: u32,
}

impl WheelConfig {
    /// Default tick: 2^20 ns ≈ 1.05 ms.
    pub const DEFAULT_TICK_SHIFT: u32 = 20;
    /// At least 1, so that tick numbers stay below 2^63 and the boundary
    /// after the last tick still fits a `u64`. Order within a tick is exact
    /// anyway, so finer ticks would buy nothing.
    const MIN_TICK_SHIFT: u32 = 1;
    const MAX_TICK_SHIFT: u32 = 40;
}

impl Default for WheelConfig {
    fn default() -> Self {
        Self {
            origin: 0,
            tick_shift: Self::DEFAULT_TICK_SHIFT,
        }
    }
}

/// Full ordering key of a pending firing.
///
/// Field order is the order: deadline, then the caller's tiebreak (lower
/// first, e.g. inverted priority), then insertion order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Key {
    deadline: Nanos,
    tiebreak: u64,
    /// Increases with insertion order (see [`TimerId`]), so it is the FIFO
    /// tiebreak as well as the handle.
    id: u64,
}

/// Below this many tombstones (beyond the live count) no sweep is started.
/// Tiny under test, so that the model test interleaves sweeps with
/// everything else (the threshold changes when memory is reclaimed, never
/// what the wheel returns).
const SWEEP_SLACK: usize = if cfg!(test) { 4 } else { 1024 };

/// Pending firings in exact `(deadline, tiebreak, insertion order)` order;
/// see the [module docs](self) for the design.
pub struct TimingWheel<T> {
    tick_shift: u32,
    index: Index<T>,
    /// The near-window boundary, in ticks; only ever larger.
    boundary: u64,
    near: Near,
    levels: Levels,
    /// The earliest live key, wherever it is; `None` when nothing is pending.
    first: Option<Key>,
    /// Keys still in the structure whose value was cancelled.
    tombstones: usize,
    /// No tombstone in the near window: it was filled or swept since the
    /// last cancel. Then its head is live without a look-up in the index
    /// (the common case while a tick's batch is popped).
    near_clean: bool,
    /// Completed sweeps, so tests can tell the sweep really ran.
    #[cfg(test)]
    sweeps: usize,
}

impl<T> fmt::Debug for TimingWheel<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TimingWheel")
            .field("len", &self.len())
            .field("tick_shift", &self.tick_shift)
            .field("boundary_tick", &self.boundary)
            .field("near", &self.near.len())
            .field("tombstones", &self.tombstones)
            .finish_non_exhaustive()
    }
}

impl<T> Default for TimingWheel<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> TimingWheel<T> {
    /// An empty wheel with the default tick and its origin at the Unix epoch.
    ///
    /// Prefer [`with_config`](Self::with_config) with `origin = now`: firings
    /// decades after the origin are filed on high levels and move down a few
    /// more times before they fire (still correct, a little slower).
    pub fn new() -> Self {
        Self::with_config(WheelConfig::default())
    }

    /// An empty wheel with the given origin and tick.
    pub fn with_config(config: WheelConfig) -> Self {
        let tick_shift = config
            .tick_shift
            .clamp(WheelConfig::MIN_TICK_SHIFT, WheelConfig::MAX_TICK_SHIFT);
        Self {
            tick_shift,
            index: Index::new(),
            boundary: tick(tick_shift, config.origin),
            near: Near::default(),
            levels: Levels::new(tick_shift),
            first: None,
            tombstones: 0,
            near_clean: true,
            #[cfg(test)]
            sweeps: 0,
        }
    }

    /// Inserts a firing; equal deadlines fire in insertion order (FIFO).
    ///
    /// Same as [`insert_with_tiebreak`](Self::insert_with_tiebreak) with
    /// tiebreak 0, so it fires before equal-deadline firings with a higher one.
    pub fn insert(&mut self, deadline: Nanos, value: T) -> TimerId {
        self.insert_with_tiebreak(deadline, 0, value)
    }

    /// Inserts a firing ordered by `(deadline, tiebreak, insertion order)`,
    /// lower first. The scheduler passes e.g. `u64::MAX - priority` so that
    /// equal deadlines fire in priority order, then in pack order.
    pub fn insert_with_tiebreak(&mut self, deadline: Nanos, tiebreak: u64, value: T) -> TimerId {
        let id = self.index.insert(value);
        let key = Key {
            deadline,
            tiebreak,
            id,
        };
        let t = tick(self.tick_shift, deadline);
        if t < self.boundary {
            self.near.push(key);
        } else {
            self.levels.file(self.boundary, t, key);
        }
        if self.first.is_none_or(|first| key < first) {
            self.first = Some(key);
        }
        TimerId(id)
    }

    /// Cancels a pending firing and returns its value; `None` if it already
    /// fired, was cancelled, or never existed.
    pub fn cancel(&mut self, id: TimerId) -> Option<T> {
        let value = self.index.remove(id.0)?;
        self.tombstones += 1;
        // Wherever the key is: the index holds values, not places.
        self.near_clean = false;
        self.maybe_sweep();
        if self.first.is_some_and(|first| first.id == id.0) {
            self.settle();
        }
        Some(value)
    }

    /// Pops the earliest firing whose deadline is `<= now`, in exact
    /// `(deadline, tiebreak, insertion order)` order.
    pub fn pop_due(&mut self, now: Nanos) -> Option<(Nanos, TimerId, T)> {
        let first = self.first.filter(|first| first.deadline <= now)?;
        // `first` is the earliest live key: the live head, once the window
        // has dropped earlier tombstones or moved out to it.
        let head = self.live_head();
        debug_assert_eq!(head, Some(first));
        self.near.pop();
        let value = self.index.remove(first.id);
        debug_assert!(value.is_some(), "the first key is live");
        self.settle();
        value.map(|value| (first.deadline, TimerId(first.id), value))
    }

    /// The earliest pending deadline, exactly, for the control loop to sleep
    /// until.
    pub fn next_deadline(&self) -> Option<Nanos> {
        self.first.map(|first| first.deadline)
    }

    /// Number of pending firings.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether no firing is pending.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Finds the earliest live key again, after the first one was popped or
    /// cancelled.
    fn settle(&mut self) {
        // Cleared first: `live_head` takes `first` to be live.
        self.first = None;
        self.first = self.live_head();
    }

    /// The smallest live key, now at the head of the near window: drops
    /// tombstones before it and moves the window as needed. `None` if
    /// nothing is pending.
    fn live_head(&mut self) -> Option<Key> {
        loop {
            let head = match self.near.head() {
                Some(head) => head,
                None if self.advance() => continue,
                None => return None,
            };
            // `first` is live by construction, and so is every key of a
            // clean near window: skip the look-up.
            if self.near_clean || self.first == Some(head) || self.index.contains(head.id) {
                return Some(head);
            }
            self.near.pop();
            self.tombstones -= 1;
        }
    }

    /// Moves the boundary past the earliest occupied tick, draining it into
    /// the run. Returns false if the levels are empty.
    fn advance(&mut self) -> bool {
        debug_assert!(self.near.is_empty());
        loop {
            let Some(start) = self.levels.earliest_start(self.boundary) else {
                return false;
            };
            // `start < 2^(64 - tick_shift) <= 2^63`, so this cannot overflow.
            let n2 = start + 1;
            self.boundary = n2;
            let (levels, index, tombstones) = (&mut self.levels, &self.index, &mut self.tombstones);
            let filled = self.near.refill(|run| {
                levels.drain_before(n2, run);
                // Drop tombstones now, in one pass: it also pulls the values
                // of this tick into cache for the pops to come.
                *tombstones -= index.retain_live(run);
            });
            if filled {
                // The near window was empty, and its new keys are all live.
                self.near_clean = true;
                return true;
            }
            // Only coarse slots moved down a level, or the tick held only
            // tombstones; go again.
        }
    }

    /// Sweeps tombstones out of the levels and the near window once they
    /// outnumber live firings, bounding memory by O(pending).
    fn maybe_sweep(&mut self) {
        if self.tombstones <= self.len().saturating_add(SWEEP_SLACK) {
            return;
        }
        let index = &self.index;
        let swept = self.levels.retain(|key| index.contains(key.id))
            + self.near.retain(|key| index.contains(key.id));
        debug_assert_eq!(swept, self.tombstones, "a tombstone out of reach");
        self.tombstones = self.tombstones.saturating_sub(swept);
        self.near_clean = true;
        #[cfg(test)]
        {
            self.sweeps += 1;
        }
    }
}

/// Tick of a deadline: order-preserving map of `i64` onto `u64`, shifted.
fn tick(tick_shift: u32, deadline: Nanos) -> u64 {
    ((deadline as u64) ^ (1 << 63)) >> tick_shift
}
