//! The instant (UTC) half of the search: mapping matching local times to
//! instants under baton's DST rules.
//!
//! A time zone is a sequence of *segments* — maximal runs of instants
//! `[start, end)` with one UTC offset `off`. Within a segment, the instant
//! `t` shows local time `t + off`, so the local times that "normally" map
//! into it are `[start + off, end + off)`. At the segment's start the offset
//! changed from `prev_off`:
//!
//! * spring forward (`prev_off < off`): the locals
//!   `[start + prev_off, start + off)` never appear on the wall. RFC 5545
//!   fires them at `local - prev_off`, which lands in
//!   `[start, start + off - prev_off)`, i.e. inside this segment.
//! * fall back (`prev_off > off`): the locals `[start + off, start + prev_off)`
//!   appear twice; the first pass belongs to the previous segment. Unless the
//!   hour field is a wildcard they fire only there, so this segment skips them.
//!
//! The search therefore looks at one segment at a time: the first normal
//! candidate, the first gap candidate, take the smaller; if neither exists,
//! move on to the next segment (or jump far ahead when the civil search says
//! the next match is far away). All jiff calls happen only when crossing a
//! segment boundary, so an iterator that caches its segment does no jiff
//! work for the overwhelming majority of firings.

use jiff::Timestamp;
use jiff::tz::TimeZone;

use crate::CronSchedule;

/// Strictly larger than any UTC offset jiff can represent (±25:59:59), so
/// `local - MAX_OFFSET < instant < local + MAX_OFFSET` for any mapping.
const MAX_OFFSET: i64 = 26 * 3600;

/// Jumping to a far segment costs about four jiff calls, walking costs one
/// per segment; jump only when it skips at least a few months.
const JUMP_MIN: i64 = 120 * 86_400;

/// Bound on segments visited by one search. Walking is only needed near
/// the query or across transitions closer together than `MAX_OFFSET`;
/// anything further is jumped over, so real zones use a handful. The bound
/// only exists so that a pathological zone cannot hang a device.
const MAX_SEGMENTS: u32 = 4_096;

/// A maximal run of instants `[start, end)` with constant UTC offset `off`
/// (all in seconds). `start == i64::MIN` / `end == i64::MAX` mean unbounded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Segment {
    pub(crate) start: i64,
    pub(crate) end: i64,
    /// Offset in force during the segment.
    off: i64,
    /// Offset in force just before `start` (equal to `off` if unbounded).
    prev_off: i64,
    /// Offset that takes over at `end`.
    next_off: i64,
}

impl Segment {
    /// True if instant `t` lies in this segment.
    #[inline]
    pub(crate) fn contains(&self, t: i64) -> bool {
        self.start <= t && t < self.end
    }

    /// The segment containing instant `t`; `None` only if `t` is outside
    /// jiff's timestamp range.
    pub(crate) fn at(tz: &TimeZone, t: i64) -> Option<Segment> {
        let at = Timestamp::from_second(t).ok()?;
        let off = i64::from(tz.to_offset(at).seconds());
        // `preceding` yields transitions strictly before its argument; ask
        // from one second later so that a transition exactly at `t` counts.
        let after_t = Timestamp::from_second(t.checked_add(1)?).ok()?;
        let (start, prev_off) = match tz.preceding(after_t).next() {
            Some(tr) => {
                let start = tr.timestamp().as_second();
                let before = Timestamp::from_second(start - 1).ok()?;
                (start, i64::from(tz.to_offset(before).seconds()))
            }
            None => (i64::MIN, off),
        };
        let (end, next_off) = following(tz, at, off);
        Some(Segment {
            start,
            end,
            off,
            prev_off,
            next_off,
        })
    }

    /// The segment right after this one (one jiff call), or `None` if this
    /// one is unbounded.
    pub(crate) fn next(&self, tz: &TimeZone) -> Option<Segment> {
        if self.end == i64::MAX {
            return None;
        }
        let at = Timestamp::from_second(self.end).ok()?;
        let (end, next_off) = following(tz, at, self.next_off);
        Some(Segment {
            start: self.end,
            end,
            off: self.next_off,
            prev_off: self.off,
            next_off,
        })
    }
}

/// End of the segment holding `at` (the next transition strictly after it)
/// and the offset it switches to; unbounded if there is none.
fn following(tz: &TimeZone, at: Timestamp, off: i64) -> (i64, i64) {
    match tz.following(at).next() {
        Some(tr) => (tr.timestamp().as_second(), i64::from(tr.offset().seconds())),
        None => (i64::MAX, off),
    }
}

impl CronSchedule {
    /// The first firing instant `>= t0` (Unix seconds), using and updating
    /// the cached segment `seg`.
    pub(crate) fn first_firing_from(
        &self,
        tz: &TimeZone,
        seg: &mut Option<Segment>,
        mut t0: i64,
    ) -> Option<i64> {
        let mut cur = match *seg {
            Some(s) if s.contains(t0) => s,
            _ => Segment::at(tz, t0)?,
        };
        for _ in 0..MAX_SEGMENTS {
            *seg = Some(cur);
            let Segment {
                start,
                end,
                off,
                prev_off,
                ..
            } = cur;
            debug_assert!(cur.contains(t0));

            // Normal candidates: locals that exist and map into [t0, end).
            let mut from = t0 + off;
            if prev_off > off && !self.hour_wildcard {
                // Second pass of a fall-back: those locals already fired.
                from = from.max(start + prev_off);
            }
            let normal = self.next_match(from);
            let mut best = normal
                .filter(|&l| l < end.saturating_add(off))
                .map(|l| l - off);

            // Gap candidates: locals skipped by a spring-forward at `start`
            // fire at `local - prev_off`, which must be >= t0.
            if prev_off < off {
                let gap_end = start + off;
                let gap_from = (start + prev_off).max(t0 + prev_off);
                if gap_from < gap_end
                    && let Some(l) = self.next_match(gap_from).filter(|&l| l < gap_end)
                {
                    let t = l - prev_off;
                    best = Some(best.map_or(t, |b| b.min(t)));
                }
            }
            if best.is_some() {
                return best;
            }

            // Nothing here. No local in [from, normal) matches, so a later
            // firing either has local >= normal (instant > normal -
            // MAX_OFFSET) or local < from (instant < from + MAX_OFFSET).
            // Once `end` is past the latter, everything up to the former
            // can be skipped.
            let clear_of_low = end >= from.saturating_add(MAX_OFFSET);
            match normal {
                None if clear_of_low => return None,
                Some(l) if clear_of_low && l - MAX_OFFSET > end.saturating_add(JUMP_MIN) => {
                    t0 = l - MAX_OFFSET;
                    cur = Segment::at(tz, t0)?;
                }
                _ => {
                    t0 = end;
                    cur = cur.next(tz)?;
                }
            }
        }
        debug_assert!(false, "segment walk exceeded its bound: {self:?}");
        None
    }
}
