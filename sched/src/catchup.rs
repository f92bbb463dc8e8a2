//! Downtime maths, pure: which occurrences of a repeating schedule fall in
//! a gap (never past `until`), and what `catch_up` makes of them.
//!
//! A *gap* is time in which the core could not act on a repeating
//! instruction: the agent was down (restart), the clock stepped forward, or
//! the runtime reached an occurrence later than its `max_lateness`.
//!
//! - `none`: every missed occurrence is dropped (one aggregated skip report);
//! - `last`: the latest missed occurrence not past `until` fires once, at
//!   the end of the gap (unless an occurrence that fires anyway, or one that
//!   already ran before a restart, is later);
//! - `all`: the missed occurrences fire in order, oldest first, capped at the
//!   most recent `catch_up_cap` (the older ones are reported skipped). They
//!   are *replayed*: the first at the end of the gap, each next one spaced
//!   from the previous by the schedule's own spacing between those two
//!   occurrences — never faster than the schedule. The live schedule goes on
//!   on its own grid meanwhile, so while a replay lasts the instruction fires
//!   at most twice per period (the replay stream and the live one).
//!
//! Occurrences known to have run before a restart (a journal record) are
//! neither counted as missed nor fired again.

use std::collections::{BTreeSet, VecDeque};

use baton_proto::RefTime;
use baton_proto::pack::{CatchUp, Schedule};
use jiff::tz::TimeZone;

/// The occurrences of a schedule inside a gap.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Gap {
    /// How many.
    pub count: u64,
    /// The earliest.
    pub first: Option<RefTime>,
    /// The latest ones, oldest first (at most the `keep` asked for).
    pub tail: VecDeque<RefTime>,
}

impl Gap {
    /// The latest occurrence in the gap.
    pub fn last(&self) -> Option<RefTime> {
        self.tail.back().copied()
    }
}

/// Occurrences of `schedule` strictly after `after` and strictly before
/// `before`, never past its `until`: all counted, the latest `keep` kept.
/// `every` is counted in closed form (a week of 10 ms blinks is not walked);
/// `cron` is walked.
pub(crate) fn occurrences_between(
    schedule: &Schedule,
    tz: &TimeZone,
    anchor: RefTime,
    after: RefTime,
    before: RefTime,
    keep: usize,
) -> Gap {
    let mut gap = Gap::default();
    let Some(first) = schedule.next_after(tz, anchor, after) else {
        return gap;
    };
    if first >= before {
        return gap;
    }
    gap.first = Some(first);
    if let Schedule::Every {
        period,
        start_at,
        until,
    } = schedule
    {
        let p = i128::try_from(period.as_nanos())
            .unwrap_or(i128::MAX)
            .max(1);
        let base = i128::from(start_at.unwrap_or(anchor).as_nanos());
        let mut hi = i128::from(before.as_nanos()) - 1;
        if let Some(u) = until {
            hi = hi.min(i128::from(u.as_nanos()));
        }
        let f = i128::from(first.as_nanos());
        // `first` is on the grid and ≤ hi, so this is the last one ≤ hi.
        let last = base + (hi - base).div_euclid(p) * p;
        let count = (last - f) / p + 1;
        gap.count = u64::try_from(count).unwrap_or(u64::MAX);
        let kept = count.min(i128::try_from(keep).unwrap_or(i128::MAX));
        for j in (0..kept).rev() {
            let ns = last - j * p;
            gap.tail
                .push_back(RefTime::from_nanos(i64::try_from(ns).unwrap_or(i64::MAX)));
        }
        return gap;
    }
    let mut cur = Some(first);
    while let Some(c) = cur.filter(|c| *c < before) {
        gap.count += 1;
        gap.tail.push_back(c);
        if gap.tail.len() > keep {
            gap.tail.pop_front();
        }
        cur = schedule.next_after(tz, anchor, c);
    }
    gap
}

/// What `catch_up` makes of a gap.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Missed occurrences to fire, oldest first.
    pub replay: Vec<RefTime>,
    /// Missed occurrences dropped (reported, never fired).
    pub skipped: u64,
}

/// Decide a gap. `ran`: occurrences in the gap that ran before a restart
/// (not missed, never refired). `covered`: an occurrence later than the gap
/// fires now anyway (a late but in-bound one), so `last` adds nothing.
/// The gap's tail must hold at least `cap + ran.len()` occurrences for
/// `all`, one for `last`.
pub(crate) fn plan(
    catch_up: CatchUp,
    gap: &Gap,
    ran: &BTreeSet<RefTime>,
    covered: bool,
    cap: usize,
) -> Plan {
    let ran_in_gap = gap
        .first
        .zip(gap.last())
        .map_or(0, |(a, b)| ran.range(a..=b).count() as u64);
    let missed = gap.count.saturating_sub(ran_in_gap);
    let replay: Vec<RefTime> = match catch_up {
        CatchUp::None => Vec::new(),
        CatchUp::Last if covered => Vec::new(),
        CatchUp::Last => gap
            .last()
            .filter(|l| !ran.contains(l))
            .into_iter()
            .collect(),
        CatchUp::All => {
            let fresh: Vec<RefTime> = gap
                .tail
                .iter()
                .copied()
                .filter(|o| !ran.contains(o))
                .collect();
            fresh[fresh.len().saturating_sub(cap)..].to_vec()
        }
    };
    Plan {
        skipped: missed - replay.len() as u64,
        replay,
    }
}

/// When each replayed occurrence is released: the first at `start`, the
/// others keeping the schedule's spacing between them.
pub(crate) fn releases(replay: &[RefTime], start: RefTime) -> Vec<RefTime> {
    let Some(first) = replay.first() else {
        return Vec::new();
    };
    replay
        .iter()
        .map(|o| {
            RefTime::from_nanos(
                start
                    .as_nanos()
                    .saturating_add(o.as_nanos().saturating_sub(first.as_nanos())),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const S: i64 = 1_000_000_000;

    fn t(s: i64) -> RefTime {
        RefTime::from_nanos(s * S)
    }

    fn every(p: u64, start: i64, until: Option<i64>) -> Schedule {
        Schedule::Every {
            period: Duration::from_secs(p),
            start_at: Some(t(start)),
            until: until.map(t),
        }
    }

    #[test]
    fn every_gap_is_counted_in_closed_form_and_stops_at_until() {
        let s = every(1, 0, None);
        let g = occurrences_between(&s, &TimeZone::UTC, t(0), t(10), t(20), 3);
        assert_eq!(g.count, 9); // 11..=19
        assert_eq!(g.first, Some(t(11)));
        assert_eq!(g.tail, [t(17), t(18), t(19)]);
        // An hour-long schedule that ended half an hour ago: the latest
        // occurrence is `until`, not the one closest to now.
        let s = every(1, -3600, Some(-1800));
        let g = occurrences_between(&s, &TimeZone::UTC, t(0), t(-3601), t(0), 1);
        assert_eq!(g.count, 1801);
        assert_eq!(g.last(), Some(t(-1800)));
        // Entirely past until: nothing.
        let g = occurrences_between(&s, &TimeZone::UTC, t(0), t(-1000), t(0), 1);
        assert_eq!(g, Gap::default());
    }

    #[test]
    fn cron_gap_is_walked() {
        let pack = baton_proto::pack::parse_pack(
            "pack: p\nversion: 1\ninstructions:\n  - {id: c, action: noop, cron: \"*/10 * * * * *\", until: 2027-01-15T08:00:50Z}\n",
        )
        .expect("pack");
        let s = pack.instructions[0].schedule.clone();
        let g = occurrences_between(
            &s,
            &TimeZone::UTC,
            t(0),
            t(1_800_000_000),
            t(1_800_000_100),
            2,
        );
        // 10, 20, 30, 40, 50 (until) — `before` is exclusive, the gap is.
        assert_eq!(g.count, 5);
        assert_eq!(g.tail, [t(1_800_000_040), t(1_800_000_050)]);
    }

    #[test]
    fn plans_follow_catch_up_and_skip_what_ran() {
        let s = every(1, 0, None);
        let g = occurrences_between(&s, &TimeZone::UTC, t(0), t(0), t(6), 10);
        // 1..=5, of which 5 ran before the restart.
        let ran: BTreeSet<RefTime> = [t(5), t(100)].into_iter().collect();
        let none = plan(CatchUp::None, &g, &ran, false, 10);
        assert_eq!(
            none,
            Plan {
                replay: vec![],
                skipped: 4
            }
        );
        // The latest one ran: nothing to catch up.
        let last = plan(CatchUp::Last, &g, &ran, false, 10);
        assert_eq!(
            last,
            Plan {
                replay: vec![],
                skipped: 4
            }
        );
        let last = plan(CatchUp::Last, &g, &BTreeSet::new(), false, 10);
        assert_eq!(last.replay, [t(5)]);
        assert_eq!(last.skipped, 4);
        let covered = plan(CatchUp::Last, &g, &BTreeSet::new(), true, 10);
        assert_eq!(covered.replay, []);
        assert_eq!(covered.skipped, 5);
        let all = plan(CatchUp::All, &g, &ran, false, 3);
        assert_eq!(
            all,
            Plan {
                replay: vec![t(2), t(3), t(4)],
                skipped: 1
            }
        );
    }

    #[test]
    fn replays_keep_the_schedule_spacing() {
        assert_eq!(
            releases(&[t(2), t(3), t(5)], t(100)),
            [t(100), t(101), t(103)]
        );
        assert!(releases(&[], t(1)).is_empty());
    }
}
