//! The id → value index: the one place a pending firing's value lives.
//!
//! The ordered parts of the wheel (skiplist, level slots, the consumer's sorted
//! run) hold only small `Copy` [`Key`]s. The value lives here, keyed by the
//! firing's id, and whoever *removes* it from this index owns it: a pop and a
//! cancel racing for the same firing are arbitrated by one shard mutex, so a
//! value is handed out exactly once. A key whose id is no longer here is a
//! tombstone (cancelled), and the ordered parts skip it lazily; that is what
//! makes cancel O(1) without knowing where in the wheel the key sits now.
//!
//! # Sharding by tick
//!
//! The map is split into [`SHARDS`] shards, and the shard of a firing is the
//! low bits of its deadline *tick*, carried in the low bits of its id (see
//! [`TimerId`](super::TimerId)); the high bits are a sequence number counted
//! per shard, under the shard lock. Three things follow:
//!
//! * firings with equal deadlines share a tick, hence a shard, so their ids
//!   increase in insertion order: the id is the FIFO tiebreak, and no global
//!   counter is needed;
//! * each shard's sequence numbers are dense, and they are the low bits of
//!   the hash, so inserts fill each table nearly sequentially (one hot cache
//!   line per shard) instead of missing cache on every insert;
//! * the firings of one tick — the batch the consumer drains and pops next —
//!   share a shard, so the consumer checks the whole batch under one lock
//!   ([`Index::retain_live`]). Pops come in deadline order, which is random
//!   with respect to insertion order, so every look-up is a cache miss in a
//!   large table; inside one critical section the CPU overlaps those misses
//!   instead of paying them one at a time behind a lock per pop (a locked
//!   instruction is a full barrier on x86), and the pops that follow hit
//!   cache. This halved pop cost in the benchmark;
//! * the link thread inserting future firings and the dispatcher popping the
//!   current tick rarely meet on the same mutex.
//!
//! # Memory
//!
//! The flip side of sharding by tick: a shard's table is sized by the largest
//! batch of firings that ever shared its ticks, not by what it holds now. With
//! 2000 periodic instructions due on the same second, one shard holds all 2000
//! occurrences, and a second later another one does; a hash table never gives
//! back capacity by itself, so over time every shard would keep a table for the
//! whole batch: up to 64 × the peak batch, however few firings are pending. So
//! a removal that leaves a shard at less than a quarter of its table's capacity
//! shrinks the table to twice its length (to nothing when it is empty). Each
//! resize is paid for by as many inserts or removals as the table's size, so
//! this is O(1) amortised, and after any removal a table's capacity is at most
//! four times its length: the tables together stay O(pending firings).
//!
//! `HashMap::capacity` cannot tell when to shrink: it is `len + spare room`,
//! and a removal from a full probe group leaves a "deleted" marker (not our
//! tombstones: the hash table's own) that takes spare room away until the next
//! rehash. Our dense ids fill groups sequentially, so this is the common case:
//! once a batch of 2000 is popped, `capacity` reads 1584 for a table with room
//! for 3584. Each shard therefore remembers the capacity its table had when it
//! was last (re)built. In the benchmark (1M firings over 60 s, inserted then
//! popped) the shrinks take about 8 ms of the pops' 140 ms.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Mutex;

use super::{Key, lock};

/// Bits of an id (and of a tick) that select the shard.
pub(super) const SHARD_BITS: u32 = 6;
/// Number of shards.
pub(super) const SHARDS: usize = 1 << SHARD_BITS;

/// Hasher for ids: `per-shard sequence << SHARD_BITS | shard`.
///
/// hashbrown takes the bucket from the low bits of the hash and a 7-bit
/// control tag from the top bits. The low bits are the id's sequence number,
/// dense within a shard, so inserts write nearly sequentially; the top bits
/// are a multiplicative mix, so tags differ.
/// SipHash would cost more than the rest of an insert, and ids are our own
/// counters, not attacker input, so HashDoS is not a concern.
#[derive(Default, Clone, Copy, Debug)]
pub(super) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used for `u64` keys; keep a correct fallback.
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u64(&mut self, id: u64) {
        const TAG: u64 = 0x7F << 57;
        let seq = id >> SHARD_BITS;
        self.0 = (seq & !TAG) | (seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) & TAG);
    }
}

/// One shard: its values and its next sequence number.
struct Shard<T> {
    next_seq: u64,
    map: HashMap<u64, T, BuildHasherDefault<IdHasher>>,
    /// Capacity of `map`'s table as (re)built, which `map.capacity()` may
    /// understate (see the module docs): the largest `capacity()` seen since
    /// the last shrink, read after every insert (the only other place the
    /// table can be rebuilt).
    table_capacity: usize,
}

impl<T> Shard<T> {
    fn new() -> Self {
        Self {
            next_seq: 0,
            map: HashMap::default(),
            table_capacity: 0,
        }
    }

    /// Shrinks the table once a removal leaves it less than a quarter full,
    /// to twice its length; frees it when empty.
    fn release_spare(&mut self) {
        let len = self.map.len();
        if len * 4 < self.table_capacity {
            self.map.shrink_to(len * 2);
            self.table_capacity = self.map.capacity();
        }
    }

    /// Removes and returns the value, shrinking the table if it is sparse.
    fn remove(&mut self, id: u64) -> Option<T> {
        let value = self.map.remove(&id);
        if value.is_some() {
            self.release_spare();
        }
        value
    }
}

/// Sharded `id → value` map.
pub(super) struct Index<T> {
    shards: Box<[Mutex<Shard<T>>]>,
}

/// Shard of an id.
fn shard_of(id: u64) -> usize {
    // Truncation intended: masked to SHARD_BITS.
    (id as usize) & (SHARDS - 1)
}

impl<T> Index<T> {
    pub(super) fn new() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::new())).collect(),
        }
    }

    fn shard(&self, id: u64) -> &Mutex<Shard<T>> {
        &self.shards[shard_of(id)]
    }

    /// Stores `value` in shard `shard_hint` (only its low bits are used)
    /// under a fresh id, which it returns.
    pub(super) fn insert(&self, shard_hint: u64, value: T) -> u64 {
        // Truncation intended: masked to SHARD_BITS.
        let s = (shard_hint as usize) & (SHARDS - 1);
        let mut shard = lock(&self.shards[s]);
        let id = (shard.next_seq << SHARD_BITS) | s as u64;
        shard.next_seq += 1;
        let previous = shard.map.insert(id, value);
        debug_assert!(previous.is_none(), "id {id} reused");
        shard.table_capacity = shard.table_capacity.max(shard.map.capacity());
        id
    }

    /// Removes and returns the value; `None` if it was popped or cancelled.
    ///
    /// `on_removed` runs under the shard lock, only when a value was removed,
    /// so a counter it updates is ordered before any later look-up of the same
    /// id (a racing consumer never meets the tombstone before the counter).
    pub(super) fn remove_with(&self, id: u64, on_removed: impl FnOnce()) -> Option<T> {
        let mut shard = lock(self.shard(id));
        let value = shard.remove(id);
        if value.is_some() {
            on_removed();
        }
        value
    }

    /// Removes and returns the value; `None` if it was popped or cancelled.
    pub(super) fn remove(&self, id: u64) -> Option<T> {
        lock(self.shard(id)).remove(id)
    }

    /// Whether the firing with this id is still pending.
    pub(super) fn contains(&self, id: u64) -> bool {
        lock(self.shard(id)).map.contains_key(&id)
    }

    /// Drops the keys whose firing is no longer pending; returns how many.
    ///
    /// Takes each shard lock once per run of keys in that shard (usually the
    /// whole batch), so the look-ups overlap; see the module docs.
    pub(super) fn retain_live(&self, keys: &mut Vec<Key>) -> usize {
        let before = keys.len();
        let mut current: Option<(usize, std::sync::MutexGuard<'_, Shard<T>>)> = None;
        keys.retain(|key| {
            let s = shard_of(key.id);
            let guard = match &mut current {
                Some((cs, guard)) if *cs == s => guard,
                _ => {
                    current = None; // release before taking the next one
                    &mut current.insert((s, lock(&self.shards[s]))).1
                }
            };
            guard.map.contains_key(&key.id)
        });
        before - keys.len()
    }
}
