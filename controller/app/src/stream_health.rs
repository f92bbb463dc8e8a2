//! What the controller measures of an agent's health from its stream,
//! beside the clock: its outbox backlog as the clock reports carry it,
//! and its firings skipped as later than their bound. Kept per stream in
//! memory (it starts over with each stream) and written with the stream's
//! last-seen mark ([`baton_model::SeenRow`]), so every replica's
//! "unhealthy" filter sees it. Pure: the instants come in.

use baton_model::{RefTime, StreamHealth};

/// How many reports in a row the backlog must rise before it is said to
/// grow: one rise is a burst of firings, three (15 s at the agents'
/// 5 s report interval) is feedback not reaching the store.
pub const RISES_TO_GROW: u32 = 3;

/// Below this backlog nothing grows worth a look: a link at 1 000
/// firings a second carries a few hundred entries in flight.
pub const GROWING_FROM: u64 = 1_000;

/// How long a firing skipped as late keeps its agent "unhealthy".
pub const LATE_FOR_NS: i64 = 60_000_000_000;

/// One stream's measures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Measured {
    /// The last reported backlog and when.
    pub outbox: Option<(u64, RefTime)>,
    /// Reports in a row whose backlog was above the one before.
    rises: u32,
    /// The last time a firing was reported skipped as late.
    late_at: Option<RefTime>,
}

impl Measured {
    /// A report of the backlog at `at`.
    pub fn outbox(&mut self, entries: u64, at: RefTime) {
        let rose = self.outbox.is_some_and(|(before, _)| entries > before);
        self.rises = if rose {
            self.rises.saturating_add(1)
        } else {
            0
        };
        self.outbox = Some((entries, at));
    }

    /// A firing reported skipped as late, heard at `at`.
    pub fn late(&mut self, at: RefTime) {
        self.late_at = Some(self.late_at.map_or(at, |t| t.max(at)));
    }

    /// What to store as of `now`.
    pub fn health(&self, now: RefTime) -> StreamHealth {
        let entries = self.outbox.map_or(0, |(n, _)| n);
        StreamHealth {
            outbox_entries: entries,
            outbox_growing: self.rises >= RISES_TO_GROW && entries >= GROWING_FROM,
            late_recently: self
                .late_at
                .is_some_and(|t| now.as_nanos().saturating_sub(t.as_nanos()) <= LATE_FOR_NS),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> RefTime {
        RefTime::from_nanos(s * 1_000_000_000)
    }

    #[test]
    fn a_backlog_grows_only_after_rising_report_after_report_above_the_floor() {
        let mut m = Measured::default();
        let mut t = 0;
        let mut report = |m: &mut Measured, n: u64| {
            t += 5;
            m.outbox(n, at(t));
            m.health(at(t)).outbox_growing
        };
        assert!(!report(&mut m, 900));
        assert!(!report(&mut m, 1_500), "one rise is a burst");
        assert!(!report(&mut m, 2_500));
        assert!(report(&mut m, 4_000), "three rises in a row");
        assert_eq!(m.outbox.map(|(n, _)| n), Some(4_000));
        assert!(report(&mut m, 4_001), "still rising");
        assert!(!report(&mut m, 4_001), "flat: no longer growing");
        assert!(!report(&mut m, 5_000));
        // Small backlogs rising steadily are not a look's worth.
        let mut small = Measured::default();
        for n in [10, 20, 30, 40, 50] {
            assert!(!report(&mut small, n));
        }
    }

    #[test]
    fn a_late_firing_counts_for_a_minute() {
        let mut m = Measured::default();
        assert!(!m.health(at(10)).late_recently);
        m.late(at(10));
        m.late(at(5)); // an older one heard later changes nothing
        assert!(m.health(at(10)).late_recently);
        assert!(m.health(at(70)).late_recently);
        assert!(!m.health(at(71)).late_recently);
    }
}
