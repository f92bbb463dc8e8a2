//! The far part of the wheel: hierarchical levels of coarse slots.
//!
//! Time here is counted in *ticks* (`2^tick_shift` ns, default 2^20 ns ≈ 1 ms)
//! on an unsigned scale (see [`super::tick`] for the mapping). Like the tokio
//! time driver, level `l` has [`SLOTS`] slots of `64^l` ticks each, and a
//! firing at tick `t` is filed relative to the near-window boundary `n` at the
//! level of the highest bit in which `t` and `n` differ (6 bits per level).
//! So a key filed on level `l` lies in the same `64^(l+1)`-tick block as `n`:
//! its slot stands for one absolute range, with no wrap-around ambiguity, and
//! far firings land in few, coarse slots: an insert is one push onto a `Vec`,
//! whatever the distance.
//!
//! When the near window reaches a slot, the wheel takes the whole slot and
//! re-files its keys relative to the new boundary — each key moves down at
//! least one level per step, so at most one move per level over its lifetime
//! (amortised O(levels) = O(1)). Keys are never sorted until they reach the
//! near window, and only that window's keys.
//!
//! # One owner
//!
//! The levels belong to the wheel, and the wheel to one thread (the control
//! thread's scheduler), so they are plain data: a `u64` occupancy bitmap and
//! 64 `Vec`s per level, changed through `&mut self`. Nothing can file a key
//! while the boundary moves, so a slot the window has passed is drained in
//! the same call that moves it, and a slot's stored `start` is always exact.

use std::mem;

use super::{Key, tick};

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
struct Slot {
    /// First tick of the range; meaningful only while `keys` is not empty.
    start: u64,
    keys: Vec<Key>,
}

/// One level: [`SLOTS`] slots and their occupancy bitmap.
#[derive(Debug)]
struct Level {
    /// Bit `i` is set exactly when slot `i` is not empty.
    occupied: u64,
    slots: Box<[Slot]>,
}

impl Level {
    fn new() -> Self {
        Self {
            occupied: 0,
            slots: (0..SLOTS).map(|_| Slot::default()).collect(),
        }
    }
}

/// All levels of the far part.
#[derive(Debug)]
pub(super) struct Levels {
    tick_shift: u32,
    levels: Box<[Level]>,
}

impl Levels {
    pub(super) fn new(tick_shift: u32) -> Self {
        Self {
            tick_shift,
            levels: (0..level_count(64 - tick_shift))
                .map(|_| Level::new())
                .collect(),
        }
    }

    /// Files `key`, at tick `t >= n`, in its slot for boundary `n`.
    pub(super) fn file(&mut self, n: u64, t: u64, key: Key) {
        let level = level_for(n, t);
        let (idx, start) = slot_of(level, t);
        let lv = &mut self.levels[level];
        let slot = &mut lv.slots[idx];
        if slot.keys.is_empty() {
            slot.start = start;
            lv.occupied |= 1 << idx;
        }
        debug_assert_eq!(slot.start, start, "slot holds another range");
        slot.keys.push(key);
    }

    /// Start of the earliest occupied slot, all of which start at or after
    /// `n`, the boundary; `None` if the levels are empty.
    pub(super) fn earliest_start(&self, n: u64) -> Option<u64> {
        let mut best: Option<u64> = None;
        for (level, lv) in self.levels.iter().enumerate() {
            // Slots of this level in the boundary's rotation are in index
            // order, and none lies before the boundary's own slot.
            let pos = slot_of(level, n).0 as u32;
            debug_assert_eq!(lv.occupied & !(!0u64 << pos), 0, "a passed slot");
            let bits = lv.occupied & (!0u64 << pos);
            if bits != 0 {
                let start = slot_start_near(n, level, bits.trailing_zeros());
                debug_assert_eq!(start, lv.slots[bits.trailing_zeros() as usize].start);
                best = Some(best.map_or(start, |b| b.min(start)));
            }
        }
        best
    }

    /// Takes every slot that starts before `n2`, the new boundary: keys
    /// before it go to `near` (unsorted), the others are filed again
    /// against `n2`, one level lower at least.
    ///
    /// A key re-filed from level `l` lands below `l` (its slot contained
    /// `n2`, so the key and `n2` agree on level `l`'s bits and above), in a
    /// slot that starts at or after `n2`: this call never takes it again.
    pub(super) fn drain_before(&mut self, n2: u64, near: &mut Vec<Key>) {
        for level in (0..self.levels.len()).rev() {
            let mut bits = self.levels[level].occupied;
            while bits != 0 {
                let idx = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                let lv = &mut self.levels[level];
                if lv.slots[idx].start >= n2 {
                    continue;
                }
                let keys = mem::take(&mut lv.slots[idx].keys);
                lv.occupied &= !(1 << idx);
                for key in keys {
                    let t = tick(self.tick_shift, key.deadline);
                    if t < n2 {
                        near.push(key);
                    } else {
                        self.file(n2, t, key);
                    }
                }
            }
        }
    }

    /// Drops keys for which `live` is false; returns how many were dropped.
    pub(super) fn retain(&mut self, mut live: impl FnMut(&Key) -> bool) -> usize {
        let mut dropped = 0;
        for lv in self.levels.iter_mut() {
            let mut bits = lv.occupied;
            while bits != 0 {
                let idx = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                let slot = &mut lv.slots[idx];
                let before = slot.keys.len();
                slot.keys.retain(&mut live);
                dropped += before - slot.keys.len();
                if slot.keys.is_empty() {
                    lv.occupied &= !(1 << idx);
                }
                if slot.keys.len() < slot.keys.capacity() / 4 {
                    slot.keys.shrink_to_fit();
                }
            }
        }
        dropped
    }

    /// Keys held, live or not (for tests).
    #[cfg(test)]
    pub(super) fn key_count(&self) -> usize {
        self.levels
            .iter()
            .flat_map(|lv| lv.slots.iter())
            .map(|slot| slot.keys.len())
            .sum()
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

    /// A key at tick `t` with tick shift 1, as in these tests.
    fn key_at(t: u64, id: u64) -> Key {
        Key {
            deadline: ((t << 1) ^ (1 << 63)) as i64,
            tiebreak: 0,
            id,
        }
    }

    fn file(levels: &mut Levels, n: u64, t: u64, id: u64) {
        levels.file(n, t, key_at(t, id));
    }

    fn drained(levels: &mut Levels, n2: u64) -> Vec<u64> {
        let mut near = Vec::new();
        levels.drain_before(n2, &mut near);
        let mut ids: Vec<u64> = near.iter().map(|k| k.id).collect();
        ids.sort_unstable();
        ids
    }

    #[test]
    fn drains_move_keys_down_to_the_window() {
        let mut levels = Levels::new(1);
        file(&mut levels, 0, 100, 1); // level 1, slot [64, 128)
        file(&mut levels, 0, 150, 2); // level 1, slot [128, 192)
        file(&mut levels, 0, 5000, 3); // level 2, slot [4096, 8192)
        assert_eq!(levels.earliest_start(0), Some(64));
        // The window reaches tick 64: slot [64, 128) moves to level 0.
        assert_eq!(drained(&mut levels, 65), Vec::<u64>::new());
        assert_eq!(levels.earliest_start(65), Some(100));
        assert_eq!(drained(&mut levels, 101), [1]);
        assert_eq!(levels.earliest_start(101), Some(128));
        assert_eq!(drained(&mut levels, 151), [2]);
        assert_eq!(levels.earliest_start(151), Some(4096));
        assert_eq!(drained(&mut levels, 4097), Vec::<u64>::new());
        assert_eq!(levels.earliest_start(4097), Some(4992)); // level 1
        assert_eq!(drained(&mut levels, 4993), Vec::<u64>::new());
        assert_eq!(levels.earliest_start(4993), Some(5000)); // level 0
        assert_eq!(drained(&mut levels, 5001), [3]);
        assert_eq!(levels.earliest_start(5001), None);
        assert_eq!(levels.key_count(), 0);
    }

    #[test]
    fn occupancy_bits_track_slots() {
        let mut levels = Levels::new(1);
        let bits = |levels: &Levels, l: usize| levels.levels[l].occupied;
        file(&mut levels, 10, 12, 1);
        file(&mut levels, 10, 12, 2);
        assert_eq!(bits(&levels, 0), 1 << 12);
        assert_eq!(drained(&mut levels, 20), [1, 2]);
        assert_eq!(bits(&levels, 0), 0);
        for id in 0..100 {
            file(&mut levels, 20, 20 + id * 100, id);
        }
        assert_eq!(levels.earliest_start(20), Some(20));
        // A sweep that empties a slot clears its bit.
        assert_eq!(levels.retain(|k| k.id != 0), 1);
        assert_eq!(bits(&levels, 0), 0);
        assert_eq!(levels.earliest_start(20), Some(64));
        let all = drained(&mut levels, u64::MAX >> 1);
        assert_eq!(all, (1..100).collect::<Vec<_>>());
        assert!(levels.levels.iter().all(|lv| lv.occupied == 0));
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
