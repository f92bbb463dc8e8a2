//! The id → value index: the one place a pending firing's value lives.
//!
//! The ordered parts of the wheel (near window, level slots) hold only small
//! `Copy` [`Key`]s. The value lives here, keyed by the firing's id, and
//! whoever removes it from this index owns it. A key whose id is no longer
//! here is a tombstone (cancelled), and the ordered parts skip it lazily;
//! that is what makes cancel O(1) without knowing where in the wheel the key
//! sits now.
//!
//! Ids are issued here, from one counter: unique for the wheel's lifetime (a
//! stale id never cancels a newer firing), and increasing in insertion order,
//! so the id is also the FIFO tiebreak among equal deadlines. One table, no
//! lock: the wheel has one owner (see the [module docs](super)).
//!
//! # Memory
//!
//! A hash table never gives back capacity by itself, so one that once held a
//! burst would keep its size however few firings are pending. A removal that
//! leaves the table at less than a quarter of its capacity shrinks it to twice
//! its length (to nothing when it is empty). Each resize is paid for by as
//! many inserts or removals as the table's size, so this is O(1) amortised,
//! and after any removal the capacity is at most four times the length: the
//! table stays O(pending firings).
//!
//! `HashMap::capacity` cannot tell when to shrink: it is `len + spare room`,
//! and a removal from a full probe group leaves a "deleted" marker (not our
//! tombstones: the hash table's own) that takes spare room away until the next
//! rehash. Dense ids fill groups sequentially, so this is the common case. So
//! the index remembers the capacity its table had when it was last (re)built.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use super::Key;

/// Hasher for ids, which are a counter.
///
/// hashbrown takes the bucket from the low bits of the hash and a 7-bit
/// control tag from the top bits. The low bits are the id with a zero bit
/// inserted at bit 3: runs of 8 consecutive ids, then 8 free buckets. So
/// inserts write nearly sequentially, yet no 16-bucket probe group is ever
/// filled by a run of ids alone. Without the gaps, a million dense ids fill
/// a million buckets back to back; a removal there leaves a "deleted" marker
/// instead of an empty bucket, and a look-up of a removed id (every
/// cancelled key, checked when its tick is drained) probed on past them to
/// the end of the run: in the benchmark that more than doubled the cost of a
/// pop after cancels. The top bits are a multiplicative mix, so tags differ.
/// SipHash would cost more than the rest of an insert, and ids are our own
/// counter, not attacker input, so HashDoS is not a concern.
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
        // Runs of 8 consecutive ids, then a gap of 8 buckets: see the type's
        // docs.
        let spread = ((id >> 3) << 4) | (id & 7);
        self.0 = (spread & !TAG) | (id.wrapping_mul(0x9E37_79B9_7F4A_7C15) & TAG);
    }
}

/// `id → value` map that issues the ids.
pub(super) struct Index<T> {
    next_id: u64,
    map: HashMap<u64, T, BuildHasherDefault<IdHasher>>,
    /// Capacity of `map`'s table as (re)built, which `map.capacity()` may
    /// understate (see the module docs): the largest `capacity()` seen since
    /// the last shrink, read after every insert (the only other place the
    /// table can be rebuilt).
    table_capacity: usize,
}

impl<T> Index<T> {
    pub(super) fn new() -> Self {
        Self {
            next_id: 0,
            map: HashMap::default(),
            table_capacity: 0,
        }
    }

    /// Stores `value` under a fresh id, which it returns.
    pub(super) fn insert(&mut self, value: T) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let previous = self.map.insert(id, value);
        debug_assert!(previous.is_none(), "id {id} reused");
        self.table_capacity = self.table_capacity.max(self.map.capacity());
        id
    }

    /// Removes and returns the value; `None` if it was popped or cancelled.
    pub(super) fn remove(&mut self, id: u64) -> Option<T> {
        let value = self.map.remove(&id)?;
        self.release_spare();
        Some(value)
    }

    /// Whether the firing with this id is still pending.
    pub(super) fn contains(&self, id: u64) -> bool {
        self.map.contains_key(&id)
    }

    /// Pending firings.
    pub(super) fn len(&self) -> usize {
        self.map.len()
    }

    /// Drops the keys whose firing is no longer pending; returns how many.
    ///
    /// Called on a whole tick's batch as it enters the near window: the
    /// look-ups do not depend on each other, so the CPU overlaps their cache
    /// misses, and the pops that follow find the values in cache (pops come
    /// in deadline order, random with respect to insertion order, so one at a
    /// time each would be a miss in a large table).
    pub(super) fn retain_live(&self, keys: &mut Vec<Key>) -> usize {
        let before = keys.len();
        keys.retain(|key| self.map.contains_key(&key.id));
        before - keys.len()
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
}
