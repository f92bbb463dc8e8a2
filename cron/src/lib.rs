//! Cron schedules with baton's exact time-zone semantics.
//!
//! baton fires commands that move real machinery, so a schedule that fires
//! twice, skips, or fires at the wrong instant around a DST change is a
//! safety bug, not a cosmetic one. This crate turns a cron expression plus
//! an IANA time zone into a strictly increasing sequence of instants that
//! follows the contract in docs/design.md ("Time semantics"):
//!
//! * Matching is done on local civil (wall-clock) time in the zone.
//! * **Spring forward**: a local time that does not exist fires once, at the
//!   instant given by the UTC offset in force *before* the gap (RFC 5545).
//!   In America/New_York on 2026-03-08, `02:15` fires at 03:15 EDT (07:15Z).
//! * **No instant fires twice**, however many local times map to it (02:15
//!   in the gap and 03:15 both map to 07:15Z: one firing).
//! * **Fall back**: if the hour field is a wildcard (see
//!   [`CronSchedule::hour_is_wildcard`]) occurrences in the repeated hour
//!   fire in both passes; otherwise a repeated local time fires once, on the
//!   first (earlier) pass.
//! * Output is strictly increasing, every search is bounded, nothing panics.
//!
//! # Supported range
//!
//! Schedules fire at local civil times in the years 1970..=2199 (the range
//! of the year field). Asking for firings after the end of that range
//! yields `None`, as does a year field that lies wholly in the past.
//!
//! # How it works
//!
//! Each field is a bitset. A civil search (`matcher`) finds the first
//! matching wall-clock time at or after a given one by scanning the bitsets
//! from year down to second, with its own calendar arithmetic (`civil`);
//! no jiff calls. A zone search (`zone`) splits time into segments of
//! constant UTC offset, maps civil matches into the current segment under the
//! gap / fold rules, and moves to the next segment (or jumps far ahead) when
//! the segment holds no firing. [`CronIter`] caches the segment, so most
//! iterations make no jiff calls at all.
//!
//! ```
//! use baton_cron::CronSchedule;
//! use jiff::{Timestamp, tz::TimeZone};
//!
//! let tz = TimeZone::get("America/New_York")?;
//! let s = CronSchedule::parse("0 15 2 * * *")?;
//! let after: Timestamp = "2026-03-08T00:00:00Z".parse()?;
//! // 02:15 does not exist that day; it fires at 03:15 EDT.
//! assert_eq!(s.next_after(&tz, after), Some("2026-03-08T07:15:00Z".parse()?));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod civil;
mod matcher;
mod parse;
mod zone;

use jiff::Timestamp;
use jiff::tz::TimeZone;

use crate::matcher::YEAR_WORDS;
use crate::zone::Segment;

/// A parse error, with the byte range of the offending token so that
/// callers (pack validation, the controller UI) can point at it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} (at byte {offset})")]
pub struct CronError {
    /// What is wrong, naming the field and quoting the bad token.
    pub message: String,
    /// Byte offset into the parsed expression where the bad token starts.
    pub offset: usize,
    /// Byte length of the bad token (for "never fires", the span of the
    /// day-related fields).
    pub len: usize,
}

/// A parsed cron schedule.
///
/// Syntax: 6 fields `second minute hour day-of-month month day-of-week`, an
/// optional 7th `year` (1970-2199), or one of `@yearly` / `@annually`,
/// `@monthly`, `@weekly`, `@daily` / `@midnight`, `@hourly`. `@every` is an
/// interval, handled by the pack layer, and is rejected here.
///
/// Per field: `*`, values, lists `a,b`, ranges `a-b` (never wrapping:
/// `5-2` is an error), steps `*/n`, `a-b/n` and `a/n` (from `a` to the end
/// of the field). Months accept `Jan`..`Dec`, days of week `Sun`..`Sat`
/// (any case); day-of-week numbers are 0-7 with both 0 and 7 meaning
/// Sunday, and `*` / `a/n` in day-of-week run to Saturday (6). Day-of-month
/// accepts `L` (last day of the month) and `?`; day-of-week accepts `?`,
/// `5L` (last Friday of the month) and `MON#2` / `1#2` (second Monday).
///
/// # Day matching (Vixie cron)
///
/// When *both* day-of-month and day-of-week are restricted, a day matches
/// if *either* matches; otherwise both must. Exactly as in Vixie cron, a
/// day field counts as unrestricted when its text starts with `*` or is
/// `?` — so `*/2` in day-of-month is "unrestricted" for this rule (its
/// odd-day set is still ANDed with the day-of-week), while `1-31` is
/// restricted (and ORed). Expressions that can never fire within the
/// supported years (`0 0 0 30 2 *`) are rejected at parse time.
///
/// Equality compares the compiled schedule, so `0-23` and `*` in the hour
/// field are equal, while `*` and `1-31` in day-of-month are not (they
/// differ under the Vixie rule).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CronSchedule {
    /// Bits 0..=59.
    seconds: u64,
    /// Bits 0..=59.
    minutes: u64,
    /// Bits 0..=23.
    hours: u32,
    /// Bits 1..=31.
    dom: u32,
    /// `L` in day-of-month.
    dom_last: bool,
    /// Bits 1..=12.
    months: u16,
    /// Plain day-of-week values, bits 0..=6 (0 = Sunday).
    dow: u8,
    /// `w#n`: bit n (1..=5) of `dow_nth[w]`.
    dow_nth: [u8; 7],
    /// `wL`: bit w.
    dow_last: u8,
    /// Any `#` or `L` in day-of-week (skips that work when there is none).
    dow_special: bool,
    /// Vixie "unrestricted" flags.
    dom_star: bool,
    dow_star: bool,
    /// Bit `y - 1970` for each allowed year.
    years: [u64; YEAR_WORDS],
    /// The hour field allows all 24 hours.
    hour_wildcard: bool,
}

impl CronSchedule {
    /// Parses 6 fields (sec min hour dom month dow), 7 (+ year), or a macro
    /// (`@yearly`, `@annually`, `@monthly`, `@weekly`, `@daily`,
    /// `@midnight`, `@hourly`). See the type docs for the syntax.
    ///
    /// Errors name the field and the bad token and carry its byte range:
    /// out-of-range values, reversed ranges, step 0, empty list items,
    /// wrong field count, misplaced `?` / `L` / `#`, unsupported `W`, and
    /// expressions that can never fire.
    ///
    /// Parsing reads no clock, so an expression whose years are all in the
    /// past (`* * * * * * 2020`) parses: it has firings, just none left.
    /// Whoever knows "now" decides (baton-proto's `Pack::check_live`
    /// refuses it: [`CronSchedule::next_after`] from now is `None`).
    pub fn parse(expr: &str) -> Result<CronSchedule, CronError> {
        parse::parse(expr)
    }

    /// The smallest firing instant strictly greater than `after`, in zone
    /// `tz`, or `None` if there is none (a year field in the past, or
    /// nothing left before the end of 2199).
    ///
    /// Each call looks up the zone's offset segment afresh; to walk many
    /// firings use [`CronSchedule::iter_after`], which caches it.
    pub fn next_after(&self, tz: &TimeZone, after: Timestamp) -> Option<Timestamp> {
        self.iter_after(tz, after).next()
    }

    /// Successive firings strictly after `after`, strictly increasing.
    ///
    /// The iterator keeps the current constant-offset segment of `tz`, so
    /// consecutive firings within it cost only the civil search. It clones
    /// `tz` (a reference-count bump) so it borrows only `self`.
    pub fn iter_after(&self, tz: &TimeZone, after: Timestamp) -> CronIter<'_> {
        // Firings are whole seconds; the first candidate is the whole second
        // after `after` (floor, then +1; `as_second` truncates toward zero).
        let mut secs = after.as_second();
        if after.subsec_nanosecond() < 0 {
            secs -= 1;
        }
        CronIter {
            schedule: self,
            tz: tz.clone(),
            next_from: secs.checked_add(1),
            segment: None,
        }
    }

    /// True if the hour field allows every hour (`*`, `*/1`, `0-23`, ...).
    ///
    /// This decides the fall-back rule: an "every hour" schedule should run
    /// in each real hour, including both passes of a repeated hour, while a
    /// schedule pinned to particular hours ("at 01:30") must run once per
    /// day. The test is on the set of hours, not the spelling, so two
    /// expressions that match the same wall-clock times always behave the
    /// same; `*/2` or `0-22` are not wildcards.
    pub fn hour_is_wildcard(&self) -> bool {
        self.hour_wildcard
    }
}

/// Iterator over firings, from [`CronSchedule::iter_after`].
///
/// Yields strictly increasing instants and ends (for good) when the
/// schedule is exhausted.
#[derive(Debug, Clone)]
pub struct CronIter<'a> {
    schedule: &'a CronSchedule,
    tz: TimeZone,
    /// Smallest instant (Unix seconds) the next firing may have; `None`
    /// once exhausted.
    next_from: Option<i64>,
    /// The offset segment the last search ended in.
    segment: Option<Segment>,
}

impl Iterator for CronIter<'_> {
    type Item = Timestamp;

    fn next(&mut self) -> Option<Timestamp> {
        let t0 = self.next_from?;
        let found = self
            .schedule
            .first_firing_from(&self.tz, &mut self.segment, t0)
            .and_then(|t| Some((t, Timestamp::from_second(t).ok()?)));
        match found {
            Some((t, ts)) => {
                debug_assert!(t >= t0);
                self.next_from = t.checked_add(1);
                Some(ts)
            }
            None => {
                self.next_from = None;
                None
            }
        }
    }
}

impl std::iter::FusedIterator for CronIter<'_> {}
