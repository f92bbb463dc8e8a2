//! The civil (wall-clock) half of the search: which local times match, and
//! the first match at or after a given local time.
//!
//! Everything here is integer and bitset work with no jiff calls, because it
//! runs once per firing. Time zones are handled one level up, in
//! [`crate::zone`].

use crate::CronSchedule;
use crate::civil::{Civil, SECS_PER_DAY, days_from_civil, days_in_month, weekday};

/// First year of the supported range (also the lowest year-field value).
pub(crate) const MIN_YEAR: i32 = 1970;
/// Last year of the supported range (also the highest year-field value).
pub(crate) const MAX_YEAR: i32 = 2199;
/// Local seconds of `MIN_YEAR-01-01T00:00:00`.
pub(crate) const MIN_LOCAL: i64 = days_from_civil(MIN_YEAR, 1, 1) * SECS_PER_DAY;
/// Local seconds of the first instant after the supported range.
pub(crate) const END_LOCAL: i64 = days_from_civil(MAX_YEAR + 1, 1, 1) * SECS_PER_DAY;

/// Number of 64-bit words in the year bitset (230 years).
pub(crate) const YEAR_WORDS: usize = ((MAX_YEAR - MIN_YEAR) as usize + 1).div_ceil(64);

/// Bits 0..=23.
pub(crate) const ALL_HOURS: u32 = (1 << 24) - 1;

/// Upper bound on loop turns in [`CronSchedule::next_match`]. Every turn
/// either returns or moves the candidate strictly forward, and a turn that
/// fails below day level is followed by one that succeeds at that level, so
/// the real worst case is about one turn per month of the range (2760) plus
/// a handful; this bound only exists so that a bug cannot hang a device.
const MAX_TURNS: u32 = 16_384;

/// Lowest set bit of `set` at position `>= from`.
#[inline]
fn next_bit(set: u64, from: u32) -> Option<u32> {
    let masked = set & u64::MAX.checked_shl(from).unwrap_or(0);
    (masked != 0).then(|| masked.trailing_zeros())
}

impl CronSchedule {
    /// Whether `year` is allowed by the year field (false outside the
    /// supported range).
    #[inline]
    fn year_allowed(&self, year: i32) -> bool {
        if !(MIN_YEAR..=MAX_YEAR).contains(&year) {
            return false;
        }
        let i = (year - MIN_YEAR) as usize;
        self.years[i / 64] >> (i % 64) & 1 == 1
    }

    /// First allowed year `>= year`, if any.
    fn next_year(&self, year: i32) -> Option<i32> {
        let from = (year.max(MIN_YEAR) - MIN_YEAR) as u32;
        let mut word = (from / 64) as usize;
        let mut bit = from % 64;
        while word < YEAR_WORDS {
            if let Some(b) = next_bit(self.years[word], bit) {
                let y = MIN_YEAR + (word as i32) * 64 + b as i32;
                return (y <= MAX_YEAR).then_some(y);
            }
            word += 1;
            bit = 0;
        }
        None
    }

    /// Bitset (bit `d` = day `d`) of the days of `year-month` that match the
    /// day-of-month / day-of-week fields, with the Vixie OR/AND rule applied.
    #[inline]
    pub(crate) fn day_mask(&self, year: i32, month: u32) -> u32 {
        let dim = days_in_month(year, month);
        let valid: u32 = ((1u64 << (dim + 1)) - 2) as u32; // bits 1..=dim
        let mut dom = self.dom & valid;
        if self.dom_last {
            dom |= 1 << dim;
        }

        // Weekday of the 1st; day d has weekday (wd1 + d - 1) % 7.
        let wd1 = weekday(days_from_civil(year, month, 1));
        let dow7 = u32::from(self.dow);
        // Rotate so that bit i means "day i+1 matches", then repeat weekly.
        let rot = ((dow7 >> wd1) | (dow7 << (7 - wd1))) & 0x7f;
        let weekly = (u64::from(rot) * (1 | 1 << 7 | 1 << 14 | 1 << 21 | 1 << 28)) << 1;
        let mut dow = (weekly as u32) & valid;
        if self.dow_special {
            for w in 0..7u32 {
                let first = (w + 7 - wd1) % 7 + 1; // first day with weekday w
                let nth = u32::from(self.dow_nth[w as usize]);
                if nth != 0 {
                    for n in 1..=5u32 {
                        let d = first + 7 * (n - 1);
                        if nth >> n & 1 == 1 && d <= dim {
                            dow |= 1 << d;
                        }
                    }
                }
                if self.dow_last >> w & 1 == 1 {
                    let wd_last = (wd1 + dim - 1) % 7;
                    dow |= 1 << (dim - (wd_last + 7 - w) % 7);
                }
            }
        }

        if self.dom_star || self.dow_star {
            dom & dow
        } else {
            dom | dow
        }
    }

    /// The first local time `>= from` (local seconds) matching every field,
    /// or `None` if there is none before the end of the supported range.
    /// Times before the range start are clamped to it.
    ///
    /// Fields are advanced from the most significant down; when a field has
    /// no allowed value left, the field above is incremented (possibly past
    /// its range, which the next scan turns into a further carry) and all
    /// fields below reset to their minimum.
    pub(crate) fn next_match(&self, from: i64) -> Option<i64> {
        if from >= END_LOCAL {
            return None;
        }
        let mut c = Civil::from_local_seconds(from.max(MIN_LOCAL));
        // The day mask of (year, month), recomputed only when those change:
        // carries out of the time fields revisit the same month.
        let mut mask_of = (0, 0);
        let mut mask = 0u32;
        for _ in 0..MAX_TURNS {
            if !self.year_allowed(c.year) {
                c.year = self.next_year(c.year + 1)?;
                (c.month, c.day, c.hour, c.minute, c.second) = (1, 1, 0, 0, 0);
            }
            match next_bit(u64::from(self.months), c.month) {
                None => {
                    c.year += 1;
                    (c.month, c.day, c.hour, c.minute, c.second) = (1, 1, 0, 0, 0);
                    continue;
                }
                Some(m) if m != c.month => {
                    (c.month, c.day, c.hour, c.minute, c.second) = (m, 1, 0, 0, 0);
                }
                Some(_) => {}
            }
            if mask_of != (c.year, c.month) {
                mask_of = (c.year, c.month);
                mask = self.day_mask(c.year, c.month);
            }
            match next_bit(u64::from(mask), c.day) {
                None => {
                    (c.month, c.day, c.hour, c.minute, c.second) = (c.month + 1, 1, 0, 0, 0);
                    continue;
                }
                Some(dd) if dd != c.day => (c.day, c.hour, c.minute, c.second) = (dd, 0, 0, 0),
                Some(_) => {}
            }
            if !self.time_in_day(&mut c) {
                continue;
            }
            let local = c.to_local_seconds();
            debug_assert!(local >= from && local < END_LOCAL);
            return Some(local);
        }
        debug_assert!(false, "civil search exceeded its bound: {self:?}");
        None
    }

    /// Moves `c` to the first allowed time of day at or after its own, on
    /// its day: `true` if found; `false` after carrying into the field above
    /// (the caller goes round again from the date).
    fn time_in_day(&self, c: &mut Civil) -> bool {
        match next_bit(u64::from(self.hours), c.hour) {
            None => {
                (c.day, c.hour, c.minute, c.second) = (c.day + 1, 0, 0, 0);
                return false;
            }
            Some(hh) if hh != c.hour => (c.hour, c.minute, c.second) = (hh, 0, 0),
            Some(_) => {}
        }
        match next_bit(self.minutes, c.minute) {
            None => {
                (c.hour, c.minute, c.second) = (c.hour + 1, 0, 0);
                return false;
            }
            Some(mm) if mm != c.minute => (c.minute, c.second) = (mm, 0),
            Some(_) => {}
        }
        match next_bit(self.seconds, c.second) {
            None => {
                (c.minute, c.second) = (c.minute + 1, 0);
                false
            }
            Some(ss) => {
                c.second = ss;
                true
            }
        }
    }
}
