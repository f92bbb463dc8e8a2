//! The far part of the wheel: hierarchical levels of coarse slots.
//!
//! Time here is counted in *ticks* (`2^tick_shift` ns, default 2^20 ns ≈ 1 ms)
//! on an unsigned scale (see [`super::TimingWheel`] for the mapping). Like the
//! tokio time driver, level `l` has [`SLOTS`] slots of `64^l` ticks each, and a
//! firing at tick `t` is filed relative to the near-window boundary `n` at the
//! level of the highest bit in which `t` and `n` differ (6 bits per level).
//! So a key filed on level `l` lies in the same `64^(l+1)`-tick block as `n`:
//! its slot stands for one absolute range, with no wrap-around ambiguity (but
//! see the last paragraph below), and far firings land in few, coarse slots:
//! an insert is one push onto a `Vec`, whatever the distance.
//!
//! When the near window reaches a slot, the consumer takes the whole slot and
//! re-files its keys relative to the new boundary — each key moves down at
//! least one level per step, so at most one move per level over its lifetime
//! (amortised O(levels) = O(1)). Keys are never sorted until they reach the
//! near window, and only that window's keys.
//!
//! # Synchronisation
//!
//! Each slot has its own mutex; there is no lock over the levels. The only
//! cross-thread hazard is an inserter filing a key into a slot that the
//! consumer has just moved the window past (the key would be stranded for a
//! whole rotation). It is closed by a Dekker-style handshake on two `SeqCst`
//! atomics, the boundary and the level's occupancy bitmap:
//!
//! * an inserter, *holding the slot lock*, first makes sure the slot's
//!   occupancy bit is set, then re-reads the boundary; if the slot now starts
//!   before it, it backs off and files again (usually into the near
//!   skiplist), else it pushes;
//! * the consumer first publishes the new boundary, then reads the bitmaps and
//!   drains every occupied slot that starts before it (taking the slot lock).
//!
//! In the single total order of `SeqCst` operations either the inserter's
//! re-read sees the new boundary, or the consumer's bitmap read sees the bit
//! and then waits on the slot lock until the push is done. Either way the key
//! ends up on the right side of the boundary. A bit may be set on an empty
//! slot (an inserter that backed off); the consumer clears such bits, under
//! the slot lock, when it meets them.
//!
//! Into a slot that already holds keys the inserter does not set the bit
//! again (one locked instruction less per insert). The bit was set by the
//! `fetch_or` of whoever last made the slot non-empty, under the same lock,
//! so that `fetch_or` precedes our boundary re-read in the `SeqCst` order;
//! and a bit is only cleared under the slot lock while the slot is empty,
//! which it has not been since. So the consumer's bitmap read after its
//! boundary store still sees the bit.
//!
//! Between the consumer's publish and its drain reaching a slot, the slot can
//! still hold keys of the range just passed while a key of the next rotation
//! (filed against the new boundary by an inserter, or by the consumer's own
//! re-filing of a coarser slot — levels are drained high to low) lands on the
//! same index. That is harmless: a slot's `start` is set only when it is
//! empty, so it stays the older range's, the drain in progress takes the
//! whole slot, and every key is filed again by its own tick.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

use super::{Key, lock};

/// Bits of tick resolved per level.
pub(super) const LEVEL_BITS: u32 = 6;
/// Slots per level.
pub(super) const SLOTS: usize = 1 << LEVEL_BITS;

/// Number of levels needed to cover a tick space of `tick_bits` bits.
pub(super) fn level_count(tick_bits: u32) -> usize {
    // The highest differing bit is at most `tick_bits - 1`.
    (tick_bits.saturating_sub(1) / LEVEL_BITS) as usize + 1
}

/// The level at which tick `t >= n` is filed while the boundary is `n`.
pub(super) fn level_for(n: u64, t: u64) -> usize {
    debug_assert!(t >= n);
    // `| (SLOTS - 1)` puts everything in the boundary's own 64-tick block on
    // level 0 (tokio's trick).
    let masked = (n ^ t) | (SLOTS as u64 - 1);
    let significant = 63 - masked.leading_zeros();
    (significant / LEVEL_BITS) as usize
}

/// Width, as a shift, of a slot on `level`.
fn slot_shift(level: usize) -> u32 {
    // `level` is below `level_count(64)` = 11, so this is at most 60.
    level as u32 * LEVEL_BITS
}

/// Slot index and slot start of tick `t` on `level`.
pub(super) fn slot_of(level: usize, t: u64) -> (usize, u64) {
    let shift = slot_shift(level);
    // Truncation intended: masked to 6 bits.
    let idx = ((t >> shift) as usize) & (SLOTS - 1);
    let start = t & !((1u64 << shift) - 1);
    (idx, start)
}

/// Start of slot `idx` on `level` in the rotation that contains boundary `n`.
fn slot_start_near(n: u64, level: usize, idx: u32) -> u64 {
    let shift = slot_shift(level);
    let block_shift = shift + LEVEL_BITS;
    let base = if block_shift >= 64 {
        0
    } else {
        n & !((1u64 << block_shift) - 1)
    };
    base + (u64::from(idx) << shift)
}

/// A slot: the keys of one absolute tick range, unsorted.
#[derive(Debug, Default)]
pub(super) struct Slot {
    /// First tick of the range; meaningful only while `keys` is not empty.
    start: u64,
    keys: Vec<Key>,
}

/// One level: [`SLOTS`] slots and their occupancy bitmap.
#[derive(Debug)]
pub(super) struct Level {
    /// Bit `i` is set whenever slot `i` is not empty (it may also be set on an
    /// empty slot, see the module docs).
    occupied: AtomicU64,
    slots: Box<[Mutex<Slot>]>,
}

impl Level {
    pub(super) fn new() -> Self {
        Self {
            occupied: AtomicU64::new(0),
            slots: (0..SLOTS).map(|_| Mutex::new(Slot::default())).collect(),
        }
    }
}

/// Outcome of [`Levels::try_file`].
pub(super) enum Filed {
    /// The key is in a level slot.
    Done,
    /// The boundary moved to this value before the key could be filed.
    Moved(u64),
}

/// All levels of the far part.
#[derive(Debug)]
pub(super) struct Levels {
    levels: Box<[Level]>,
}

impl Levels {
    pub(super) fn new(tick_bits: u32) -> Self {
        Self {
            levels: (0..level_count(tick_bits)).map(|_| Level::new()).collect(),
        }
    }

    /// Files `key` (at tick `t >= n`) in its slot for boundary `n`, unless
    /// `boundary` has moved past that slot meanwhile.
    pub(super) fn try_file(&self, boundary: &AtomicU64, n: u64, t: u64, key: Key) -> Filed {
        let level = level_for(n, t);
        let (idx, start) = slot_of(level, t);
        let lv = &self.levels[level];
        let bit = 1u64 << idx;
        let mut slot = lock(&lv.slots[idx]);
        // Announce first, then re-check the boundary (see module docs).
        if slot.keys.is_empty() {
            lv.occupied.fetch_or(bit, SeqCst);
        }
        let now_n = boundary.load(SeqCst);
        if start < now_n {
            if slot.keys.is_empty() {
                lv.occupied.fetch_and(!bit, SeqCst);
            }
            return Filed::Moved(now_n);
        }
        if slot.keys.is_empty() {
            slot.start = start;
        }
        debug_assert!(
            slot.start == start || slot.start < now_n,
            "slot holds a range that is neither this one nor passed"
        );
        slot.keys.push(key);
        Filed::Done
    }

    /// Files many keys (all at ticks `>= n`) against boundary `n`, taking
    /// each target slot's lock once. Returns the keys whose slot the boundary
    /// moved past meanwhile (never when the caller is the only one moving it);
    /// the caller files those one by one.
    ///
    /// The keys are grouped by target with a counting sort: a coarse slot
    /// holds tens of thousands of keys, and a lock round trip per key would
    /// cost more than the move itself.
    pub(super) fn file_batch(
        &self,
        boundary: &AtomicU64,
        n: u64,
        keys: &[Key],
        tick: impl Fn(&Key) -> u64,
    ) -> Vec<Key> {
        let mut rejected = Vec::new();
        let Some(&first) = keys.first() else {
            return rejected;
        };
        // Target = level * SLOTS + idx, below 11 * 64.
        let targets: Vec<u16> = keys
            .iter()
            .map(|key| {
                let t = tick(key);
                let level = level_for(n, t);
                (level * SLOTS + slot_of(level, t).0) as u16
            })
            .collect();
        let mut next = vec![0usize; self.levels.len() * SLOTS + 1];
        for &target in &targets {
            next[usize::from(target) + 1] += 1;
        }
        for i in 1..next.len() {
            next[i] += next[i - 1];
        }
        let bounds = next.clone();
        let mut sorted = vec![first; keys.len()];
        for (key, &target) in keys.iter().zip(&targets) {
            let pos = &mut next[usize::from(target)];
            sorted[*pos] = *key;
            *pos += 1;
        }
        for (target, range) in bounds.windows(2).enumerate() {
            let group = &sorted[range[0]..range[1]];
            let Some(head) = group.first() else {
                continue;
            };
            let (level, idx) = (target / SLOTS, target % SLOTS);
            let (_, start) = slot_of(level, tick(head));
            let lv = &self.levels[level];
            let bit = 1u64 << idx;
            let mut slot = lock(&lv.slots[idx]);
            if slot.keys.is_empty() {
                lv.occupied.fetch_or(bit, SeqCst);
            }
            let now_n = boundary.load(SeqCst);
            if start < now_n {
                if slot.keys.is_empty() {
                    lv.occupied.fetch_and(!bit, SeqCst);
                }
                rejected.extend_from_slice(group);
                continue;
            }
            if slot.keys.is_empty() {
                slot.start = start;
            }
            debug_assert!(
                slot.start == start || slot.start < now_n,
                "slot holds a range that is neither this one nor passed"
            );
            slot.keys.extend_from_slice(group);
        }
        rejected
    }

    /// Start of the earliest occupied slot whose range is not before `n`.
    pub(super) fn earliest_start(&self, n: u64) -> Option<u64> {
        let mut best: Option<u64> = None;
        for (level, lv) in self.levels.iter().enumerate() {
            let pos = slot_of(level, n).0 as u32;
            // Slots before `pos` in this rotation are behind the boundary:
            // only stale bits can be set there.
            let mut bits = lv.occupied.load(SeqCst) & (!0u64 << pos);
            while bits != 0 {
                let idx = bits.trailing_zeros();
                let start = slot_start_near(n, level, idx);
                if start >= n {
                    best = Some(best.map_or(start, |b| b.min(start)));
                    break;
                }
                bits &= bits - 1;
            }
        }
        best
    }

    /// Takes every occupied slot that starts before `n2`, the boundary just
    /// published (it was `n` before), passing each slot's keys to `sink`.
    ///
    /// `sink` runs with no lock held, so it may file keys again.
    pub(super) fn drain_before(&self, n: u64, n2: u64, mut sink: impl FnMut(Vec<Key>)) {
        for (level, lv) in self.levels.iter().enumerate().rev() {
            let mut bits = lv.occupied.load(SeqCst);
            while bits != 0 {
                let idx = bits.trailing_zeros();
                bits &= bits - 1;
                // Exact for every slot filed against `n`; a slot filed against
                // `n2` by a racing insert may look earlier than it is, which
                // only costs a lock: the stored start decides.
                if slot_start_near(n, level, idx) >= n2 {
                    continue;
                }
                let bit = 1u64 << idx;
                let mut slot = lock(&lv.slots[idx as usize]);
                if slot.keys.is_empty() {
                    lv.occupied.fetch_and(!bit, SeqCst);
                    continue;
                }
                if slot.start >= n2 {
                    continue;
                }
                let keys = std::mem::take(&mut slot.keys);
                lv.occupied.fetch_and(!bit, SeqCst);
                drop(slot);
                sink(keys);
            }
        }
    }

    /// Drops keys for which `live` is false; returns how many were dropped.
    pub(super) fn retain(&self, mut live: impl FnMut(&Key) -> bool) -> usize {
        let mut dropped = 0;
        for lv in self.levels.iter() {
            for slot in lv.slots.iter() {
                let mut slot = lock(slot);
                let before = slot.keys.len();
                slot.keys.retain(&mut live);
                dropped += before - slot.keys.len();
                if slot.keys.len() < slot.keys.capacity() / 4 {
                    slot.keys.shrink_to_fit();
                }
            }
        }
        dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn level_count_covers_the_tick_space() {
        assert_eq!(level_count(44), 8); // ticks of 2^20 ns
        assert_eq!(level_count(64), 11); // ticks of 1 ns
        assert_eq!(level_count(6), 1);
        assert_eq!(level_count(7), 2);
    }

    #[test]
    fn level_for_follows_the_highest_differing_bit() {
        assert_eq!(level_for(0, 0), 0);
        assert_eq!(level_for(0, 63), 0);
        assert_eq!(level_for(0, 64), 1);
        assert_eq!(level_for(10, 63), 0);
        assert_eq!(level_for(63, 64), 1);
        assert_eq!(level_for(0, 4095), 1);
        assert_eq!(level_for(0, 4096), 2);
        assert_eq!(level_for(0, (1 << 44) - 1), 7);
        assert_eq!(level_for(0, u64::MAX), 10);
    }

    fn key(id: u64) -> Key {
        Key {
            deadline: 0,
            tiebreak: 0,
            id,
        }
    }

    fn drained(levels: &Levels, n: u64, n2: u64) -> Vec<u64> {
        let mut ids = Vec::new();
        levels.drain_before(n, n2, |keys| ids.extend(keys.iter().map(|k| k.id)));
        ids.sort_unstable();
        ids
    }

    #[test]
    fn an_inserter_with_a_stale_boundary_backs_off() {
        // The inserter's half of the handshake, made deterministic: the
        // consumer publishes a new boundary between the inserter's first read
        // and its push.
        let levels = Levels::new(44);
        let boundary = AtomicU64::new(0);
        assert!(matches!(
            levels.try_file(&boundary, 0, 100, key(1)),
            Filed::Done
        ));
        assert_eq!(levels.earliest_start(0), Some(64)); // level 1, slot 1
        boundary.store(200, SeqCst); // consumer moves past slots 64.. and 128..
        // Filed against the stale boundary 0, tick 150 would go to [128, 192).
        assert!(matches!(
            levels.try_file(&boundary, 0, 150, key(2)),
            Filed::Moved(200)
        ));
        // A slot still ahead of the new boundary takes a stale insert.
        assert!(matches!(
            levels.try_file(&boundary, 0, 300, key(3)),
            Filed::Done
        ));
        assert_eq!(
            drained(&levels, 0, 200),
            [1],
            "only the key filed before the publish"
        );
        assert_eq!(levels.earliest_start(200), Some(256));
        assert_eq!(drained(&levels, 200, 301), [3]);
        assert_eq!(levels.earliest_start(301), None);
    }

    #[test]
    fn a_passed_slot_awaiting_its_drain_may_take_the_next_rotation() {
        let levels = Levels::new(44);
        let boundary = AtomicU64::new(0);
        // Tick 5: level 0, slot 5.
        assert!(matches!(
            levels.try_file(&boundary, 0, 5, key(1)),
            Filed::Done
        ));
        // The consumer publishes 64 but has not drained slot 5 yet; tick 69,
        // filed against 64, is on level 0 too, in the same slot.
        boundary.store(64, SeqCst);
        assert!(matches!(
            levels.try_file(&boundary, 64, 69, key(2)),
            Filed::Done
        ));
        // The drain takes the whole slot: the consumer files each key by its
        // own tick (tick 69 goes back in, tick 5 to the near window).
        assert_eq!(drained(&levels, 0, 64), [1, 2]);
        assert_eq!(levels.earliest_start(64), None);
    }

    #[test]
    fn occupancy_bits_track_slots() {
        let levels = Levels::new(44);
        let boundary = AtomicU64::new(10);
        let bits = |l: usize| levels.levels[l].occupied.load(SeqCst);
        assert!(matches!(
            levels.try_file(&boundary, 10, 12, key(1)),
            Filed::Done
        ));
        assert!(matches!(
            levels.try_file(&boundary, 10, 12, key(2)),
            Filed::Done
        ));
        assert_eq!(bits(0), 1 << 12);
        // Backing off from an empty slot leaves no bit behind.
        boundary.store(20, SeqCst);
        assert!(matches!(
            levels.try_file(&boundary, 10, 15, key(3)),
            Filed::Moved(20)
        ));
        assert_eq!(bits(0), 1 << 12);
        assert_eq!(drained(&levels, 10, 20), [1, 2]);
        assert_eq!(bits(0), 0);
        // Batch filing sets bits and keeps keys together per slot.
        let keys: Vec<Key> = (0..100).map(key).collect();
        let rejected = levels.file_batch(&boundary, 20, &keys, |k| 20 + k.id * 100);
        assert!(rejected.is_empty());
        assert_eq!(levels.earliest_start(20), Some(20));
        let all: Vec<u64> = drained(&levels, 20, u64::MAX >> 1);
        assert_eq!(all, (0..100).collect::<Vec<_>>());
        // A stale batch is handed back whole.
        let rejected = levels.file_batch(&boundary, 0, &keys[..3], |_| 5);
        assert_eq!(rejected.len(), 3);
    }

    #[test]
    fn a_filed_slot_is_in_the_boundary_rotation() {
        // For any n <= t the slot of t at its level starts at or after n and
        // `slot_start_near` recovers it from n alone.
        let samples = [0u64, 1, 63, 64, 65, 4095, 4096, 123_456_789, (1 << 44) - 1];
        for &n in &samples {
            for &d in &samples {
                let t = n + d;
                let level = level_for(n, t);
                let (idx, start) = slot_of(level, t);
                assert!(start >= n, "n={n} t={t} start={start}");
                assert_eq!(slot_start_near(n, level, idx as u32), start);
            }
        }
    }
}
