//! The timing structure: pending firings in exact `(deadline ns, tiebreak,
//! insertion order)` order.
//!
//! [`TimingWheel`] is a skiplist-ordered hierarchical timing wheel. It is
//! sans-IO: it never reads a clock, `now` is passed to [`TimingWheel::pop_due`].
//! All methods take `&self` and it is `Send + Sync`, so the link thread inserts
//! and cancels while the dispatcher pops.
//!
//! # Shape
//!
//! ```text
//!   index (64 sharded HashMaps)      id → value           cancel = remove here
//!   ─────────────────────────────────────────────────────────────────────────
//!   near window  (tick < boundary)   exact (deadline, tiebreak, id) order
//!     · run       sorted Vec, owned by the consumer: the tick it drained
//!     · skiplist  crossbeam SkipMap: keys inserted straight into the window
//!   ──────────────────────── boundary (a tick, only grows) ─────────────────
//!   far levels   (tick ≥ boundary)   64 slots per level, 6 bits of tick per
//!                                    level (8 levels at the default tick),
//!                                    unsorted Vecs, one mutex per slot
//! ```
//!
//! *Exact order where it matters*: every key below the boundary is in exact
//! order (the run is sorted, the skiplist is ordered, the consumer merges the
//! two heads), and every key in the far levels is at or after the boundary, so
//! the smaller near head is the global minimum. *Far inserts are cheap*: a far
//! key is pushed unsorted onto its slot's `Vec`, whatever the distance; keys
//! are sorted one tick (2^20 ns ≈ 1 ms by default) at a time, when the window
//! reaches them. Only keys are moved and sorted (24 bytes); values stay put in
//! the index.
//!
//! The boundary moves only when the near window runs dry and the consumer
//! (`pop_due` / `next_deadline`) needs the next key: it jumps to the end of
//! the earliest occupied tick, draining that tick into the run and re-filing
//! coarser slots one level down on the way (see `levels`). An insert below
//! the boundary goes straight into the skiplist, so a key that arrives in the
//! current window — or in the past — is in exact order at once and
//! `next_deadline` sees it immediately.
//!
//! The price of an exact `next_deadline` without a clock: when the only
//! pending firings are far away, asking for the next deadline moves the
//! window out to them, and until they fire, inserts before them take the
//! skiplist path (O(log n) rather than O(1); still exact). In the agent the
//! near future is where the traffic is (every periodic instruction keeps its
//! next occurrence pending), so the window rarely jumps far.
//!
//! # Synchronisation
//!
//! * Inserters and cancellers never block on the dispatcher: the skiplist is
//!   lock-free, each level slot and each index shard has its own mutex, held
//!   for a push, a take or one hash-map operation.
//! * `pop_due` and `next_deadline` take the consumer mutex (run and window
//!   moves); only consumers contend on it, inserters and cancellers never.
//! * The boundary is the one shared word: only the consumer stores it, and a
//!   `SeqCst` handshake with the slots' occupancy bits makes sure no key is
//!   filed into a slot the window has passed (proof in `levels`).
//! * A value is handed out by whoever removes it from its index shard, so a
//!   pop racing a cancel gives it to exactly one of them.
//!
//! # Cancel and memory
//!
//! *Cancel* removes the value from the index and leaves the key behind as a
//! tombstone: the consumer skips keys whose value is gone (and drops them in
//! bulk when it drains a tick). So that memory stays O(pending) under
//! insert/cancel churn, the cancel that makes tombstones outnumber live
//! firings sweeps them out of the levels and the skiplist. The sweep runs on
//! the cancelling thread (the link thread), never on the dispatcher.
//!
//! *Periodic and cron* instructions insert only their next occurrence; the
//! wheel holds one key and one value per pending firing, never a schedule.
//!
//! *Index tables* are sharded by tick, so a batch of firings due together
//! (every periodic instruction on the same second) fills one shard, and the
//! next second's batch another. A removal that leaves a shard's table less
//! than a quarter full shrinks it (see `index`); without that, every shard
//! would keep a table for the largest batch it ever held, and memory would
//! grow towards 64 × the batch with each new second the firings fall on.
//!
//! # Complexity (n pending firings)
//!
//! | operation      | cost                                                    |
//! |----------------|---------------------------------------------------------|
//! | `insert`       | O(1) expected (far); O(log n) into the skiplist (near)  |
//! | `cancel`       | O(1) expected, amortised over sweeps                    |
//! | `pop_due`      | O(1) amortised + the tick's sort, O(k log k) for k keys  |
//! |                | per tick; each key moves at most once per level          |
//! | `next_deadline`| as `pop_due`, without removing                          |
//!
//! # Deadlines and ticks
//!
//! A deadline `d: i64` maps order-preservingly to `d as u64 ^ 1 << 63`; its
//! tick is that shifted right by `tick_shift`. The whole `i64` range is valid:
//! far-past deadlines are due at once, `i64::MAX` is simply last.
//! Time going backwards (a smaller `now`) only means fewer firings are due.

mod index;
mod levels;

#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crossbeam_skiplist::SkipMap;
use crossbeam_skiplist::map::Entry;

use self::index::Index;
use self::levels::{Filed, Levels};

/// Reference-time nanoseconds since the Unix epoch.
pub type Nanos = i64;

/// Handle of a pending firing, returned by [`TimingWheel::insert`].
///
/// The low 6 bits are the low bits of the firing's deadline tick (they say
/// which index shard holds its value), the high bits a sequence number
/// counted per shard. So ids are unique for the wheel's lifetime — a stale id
/// never cancels a newer firing — and, among firings with the same deadline,
/// increase in insertion order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TimerId(pub u64);

/// Construction parameters of a [`TimingWheel`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WheelConfig {
    /// Where the near window starts: deadlines before it are due at once and
    /// go straight into the skiplist. Pass the current reference time, so the
    /// first firings are filed on the low levels (fewer moves later).
    pub origin: Nanos,
    /// A tick is `2^tick_shift` ns (clamped to `1..=40`): the width of one
    /// near window, so the batch that is sorted at a time. Larger ticks sort
    /// more at once and send more near-future inserts to the skiplist; smaller
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
    /// Among keys with the same deadline, increases with insertion order
    /// (see [`TimerId`]), so it is the FIFO tiebreak as well as the handle.
    id: u64,
}

/// State only the consumer (`pop_due` / `next_deadline`) touches.
#[derive(Debug, Default)]
struct Consumer {
    /// Keys drained from the levels, sorted *descending* so the next is last.
    run: Vec<Key>,
}

/// The smaller of the two near heads.
enum Head<'a> {
    Run(Key),
    List(Entry<'a, Key, ()>),
}

impl Head<'_> {
    fn key(&self) -> Key {
        match self {
            Head::Run(key) => *key,
            Head::List(entry) => *entry.key(),
        }
    }
}

/// Below this many tombstones (beyond the live count) no sweep is started.
/// Tiny under test, so that the model test interleaves sweeps with
/// everything else (the threshold changes when memory is reclaimed, never
/// what the wheel returns).
const SWEEP_SLACK: usize = if cfg!(test) { 4 } else { 1024 };

/// Pending firings in exact `(deadline, tiebreak, insertion order)` order;
/// see the [module docs](self) for the design.
pub struct TimingWheel<T: Send + 'static> {
    tick_shift: u32,
    /// Live (inserted, not yet popped or cancelled) firings.
    len: AtomicUsize,
    index: Index<T>,
    /// The near-window boundary, in ticks; only the consumer stores it, and
    /// only ever larger.
    boundary: AtomicU64,
    near: SkipMap<Key, ()>,
    levels: Levels,
    consumer: Mutex<Consumer>,
    /// Keys still in the structure whose value was cancelled.
    tombstones: AtomicUsize,
    /// Tombstones a sweep could not reach (in the consumer's run or moving).
    sweep_floor: AtomicUsize,
    sweeping: AtomicBool,
    /// Completed sweeps, so tests can tell the sweep really ran.
    #[cfg(test)]
    sweeps: AtomicUsize,
}

impl<T: Send + 'static> fmt::Debug for TimingWheel<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TimingWheel")
            .field("len", &self.len())
            .field("tick_shift", &self.tick_shift)
            .field("boundary_tick", &self.boundary.load(Ordering::Relaxed))
            .field("near_skiplist", &self.near.len())
            .field("tombstones", &self.tombstones.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl<T: Send + 'static> Default for TimingWheel<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Send + 'static> TimingWheel<T> {
    /// An empty wheel with the default tick and its origin at the Unix epoch.
    ///
    /// Prefer [`with_config`](Self::with_config) with `origin = now`: firings
    /// decades after the origin are filed on high levels and move down a few
    /// more times before they fire (still correct; in the benchmark about a
    /// third slower than with the origin at the current time).
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
            len: AtomicUsize::new(0),
            index: Index::new(),
            boundary: AtomicU64::new(tick(tick_shift, config.origin)),
            near: SkipMap::new(),
            levels: Levels::new(64 - tick_shift),
            consumer: Mutex::new(Consumer::default()),
            tombstones: AtomicUsize::new(0),
            sweep_floor: AtomicUsize::new(0),
            sweeping: AtomicBool::new(false),
            #[cfg(test)]
            sweeps: AtomicUsize::new(0),
        }
    }

    /// Inserts a firing; equal deadlines fire in insertion order (FIFO).
    ///
    /// Same as [`insert_with_tiebreak`](Self::insert_with_tiebreak) with
    /// tiebreak 0, so it fires before equal-deadline firings with a higher one.
    pub fn insert(&self, deadline: Nanos, value: T) -> TimerId {
        self.insert_with_tiebreak(deadline, 0, value)
    }

    /// Inserts a firing ordered by `(deadline, tiebreak, insertion order)`,
    /// lower first. The scheduler passes e.g. `u64::MAX - priority` so that
    /// equal deadlines fire in priority order, then in pack order.
    pub fn insert_with_tiebreak(&self, deadline: Nanos, tiebreak: u64, value: T) -> TimerId {
        // Count first, store the value second, file the key last: a consumer
        // that finds the key always finds the value, and `len` never dips
        // below zero when a pop beats this function to its end.
        self.len.fetch_add(1, Ordering::Relaxed);
        let id = self.index.insert(self.tick(deadline), value);
        self.file(Key {
            deadline,
            tiebreak,
            id,
        });
        TimerId(id)
    }

    /// Cancels a pending firing and returns its value; `None` if it already
    /// fired, was cancelled, or never existed.
    pub fn cancel(&self, id: TimerId) -> Option<T> {
        let value = self.index.remove_with(id.0, || {
            // Under the shard lock: see `Index::remove_with`.
            self.tombstones.fetch_add(1, Ordering::Relaxed);
        })?;
        self.len.fetch_sub(1, Ordering::Relaxed);
        self.maybe_sweep();
        Some(value)
    }

    /// Pops the earliest firing whose deadline is `<= now`, in exact
    /// `(deadline, tiebreak, insertion order)` order.
    pub fn pop_due(&self, now: Nanos) -> Option<(Nanos, TimerId, T)> {
        let mut consumer = lock(&self.consumer);
        loop {
            let head = self.head(&mut consumer)?;
            let key = head.key();
            if key.deadline > now {
                return None;
            }
            if !self.take_head(&mut consumer, head) {
                continue;
            }
            match self.index.remove(key.id) {
                Some(value) => {
                    self.len.fetch_sub(1, Ordering::Relaxed);
                    return Some((key.deadline, TimerId(key.id), value));
                }
                None => {
                    self.tombstones.fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// The earliest pending deadline, exactly, for the dispatcher to sleep
    /// until. A firing inserted before this call is always taken into account.
    pub fn next_deadline(&self) -> Option<Nanos> {
        let mut consumer = lock(&self.consumer);
        loop {
            let head = self.head(&mut consumer)?;
            let key = head.key();
            if self.index.contains(key.id) {
                return Some(key.deadline);
            }
            // A tombstone: drop it so the answer is a live deadline.
            if self.take_head(&mut consumer, head) {
                self.tombstones.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// Number of pending firings.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Whether no firing is pending.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn tick(&self, deadline: Nanos) -> u64 {
        tick(self.tick_shift, deadline)
    }

    /// Puts a key below the boundary into the skiplist, else into the levels.
    fn file(&self, key: Key) {
        let t = self.tick(key.deadline);
        let mut n = self.boundary.load(Ordering::SeqCst);
        loop {
            if t < n {
                self.near.insert(key, ());
                return;
            }
            match self.levels.try_file(&self.boundary, n, t, key) {
                Filed::Done => return,
                Filed::Moved(moved) => n = moved,
            }
        }
    }

    /// The smallest key below the boundary (live or tombstone), moving the
    /// boundary on if the near window is empty; `None` if nothing is pending.
    fn head<'a>(&'a self, consumer: &mut Consumer) -> Option<Head<'a>> {
        loop {
            let run = consumer.run.last().copied();
            // `is_empty` reads crossbeam's relaxed length counter, which is
            // raised before a node is linked: it can read non-zero while the
            // list is empty (then `front` says so), never zero while a
            // completed insert is present. It saves the epoch pin of `front`
            // on the common path, where the skiplist is empty.
            let list = if self.near.is_empty() {
                None
            } else {
                self.near.front()
            };
            return match (run, list) {
                (Some(r), Some(l)) if *l.key() < r => Some(Head::List(l)),
                (Some(r), _) => Some(Head::Run(r)),
                (None, Some(l)) => Some(Head::List(l)),
                (None, None) => {
                    if self.advance(consumer) {
                        continue;
                    }
                    None
                }
            };
        }
    }

    /// Removes `head` from the near window; false if someone else did first.
    fn take_head(&self, consumer: &mut Consumer, head: Head<'_>) -> bool {
        match head {
            Head::Run(_) => {
                consumer.run.pop();
                true
            }
            Head::List(entry) => entry.remove(),
        }
    }

    /// Moves the boundary past the earliest occupied tick, draining it into
    /// the run. Returns false if the levels are empty.
    fn advance(&self, consumer: &mut Consumer) -> bool {
        /// Run capacity kept between ticks; a burst beyond it is freed.
        const RUN_KEEP: usize = 1024;
        debug_assert!(consumer.run.is_empty());
        consumer.run.shrink_to(RUN_KEEP);
        loop {
            let n = self.boundary.load(Ordering::SeqCst);
            let Some(first) = self.levels.earliest_start(n) else {
                return false;
            };
            // `first < 2^(64 - tick_shift) <= 2^63`, so this cannot overflow.
            let n2 = first + 1;
            // Publish before draining: the handshake in `levels`.
            self.boundary.store(n2, Ordering::SeqCst);
            let run = &mut consumer.run;
            self.levels.drain_before(n, n2, |mut keys| {
                keys.retain(|key| {
                    let near = self.tick(key.deadline) < n2;
                    if near {
                        run.push(*key);
                    }
                    !near
                });
                self.refile(n2, keys);
            });
            if !consumer.run.is_empty() {
                // Drop tombstones now, in one pass per shard: it also pulls
                // the values of this tick into cache for the pops to come.
                let dropped = self.index.retain_live(&mut consumer.run);
                self.tombstones.fetch_sub(dropped, Ordering::Relaxed);
                consumer.run.sort_unstable_by(|a, b| b.cmp(a));
            }
            if !consumer.run.is_empty() {
                return true;
            }
            if !self.near.is_empty() {
                // Racing inserts went straight into the new window.
                return true;
            }
            // Only coarse slots moved down a level; go again.
        }
    }

    /// Files keys taken from a coarse slot again, against boundary `n2`
    /// (they are all at or after it). Only the consumer calls this.
    fn refile(&self, n2: u64, keys: Vec<Key>) {
        /// Below this, one lock per key is cheaper than grouping.
        const BATCH: usize = 64;
        if keys.len() < BATCH {
            keys.into_iter().for_each(|key| self.file(key));
            return;
        }
        let rejected = self
            .levels
            .file_batch(&self.boundary, n2, &keys, |key| self.tick(key.deadline));
        rejected.into_iter().for_each(|key| self.file(key));
    }

    /// Sweeps tombstones out of the levels and the skiplist once they
    /// outnumber live firings, bounding memory by O(pending).
    fn maybe_sweep(&self) {
        let tombstones = self.tombstones.load(Ordering::Relaxed);
        let threshold = self
            .len()
            .saturating_add(self.sweep_floor.load(Ordering::Relaxed))
            .saturating_add(SWEEP_SLACK);
        if tombstones <= threshold {
            return;
        }
        if self.sweeping.swap(true, Ordering::Acquire) {
            return;
        }
        let index = &self.index;
        let mut swept = self.levels.retain(|key| index.contains(key.id));
        for entry in self.near.iter() {
            if !index.contains(entry.key().id) && entry.remove() {
                swept += 1;
            }
        }
        // Every swept key was counted when it was cancelled, so this does not
        // underflow; saturate anyway rather than trust that in release builds.
        let left = self
            .tombstones
            .fetch_sub(swept, Ordering::Relaxed)
            .saturating_sub(swept);
        self.sweep_floor.store(left, Ordering::Relaxed);
        #[cfg(test)]
        self.sweeps.fetch_add(1, Ordering::Relaxed);
        self.sweeping.store(false, Ordering::Release);
    }
}

/// Tick of a deadline: order-preserving map of `i64` onto `u64`, shifted.
fn tick(tick_shift: u32, deadline: Nanos) -> u64 {
    ((deadline as u64) ^ (1 << 63)) >> tick_shift
}

/// Locks a mutex, ignoring poisoning: no critical section in this module can
/// leave its data half-updated (they only push, pop, take or compare).
fn lock<M>(mutex: &Mutex<M>) -> MutexGuard<'_, M> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
