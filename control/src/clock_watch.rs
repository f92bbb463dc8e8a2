//! The clock's health over one run of the agent, sans IO: when the clock
//! counts as lost (its uncertainty past the admission limit), when a loss
//! is worth saying (it changed), whether the packs that asked for it
//! (`on_clock_loss: safe_state`) stop now, and the local packs waiting for
//! the clock to be known.
//!
//! A run that just started with clock sources that need a moment to lock
//! (NTP's first polls, PTP's first syncs, the link's exchange) is given
//! [`CLOCK_START_GRACE`] before a clock never good in this run counts as
//! lost: without it a restart would stop, for good, every `safe_state`
//! pack before its clock had a chance.

use std::time::Duration;

use baton_clock::MonoTime;

/// How long configured clock sources get to lock after a start before a
/// clock still past the limit counts as lost (NTP locks in ~10 s, PTP and
/// the link in a few).
pub const CLOCK_START_GRACE: Duration = Duration::from_secs(30);

/// A change of the clock's verdict, to say in the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// Past the limit now; `was_good`: it had been within it in this run
    /// (a loss, not a clock never synchronised).
    Lost {
        /// Within the limit at some earlier check of this run.
        was_good: bool,
    },
    /// Back within the limit.
    Back,
}

/// One check's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Checked {
    /// The verdict changed since the last check.
    pub change: Option<Change>,
    /// The packs with `on_clock_loss: safe_state` stop now.
    pub stop_packs: bool,
}

/// What the loop knows of the clock's health over this run, and the
/// local packs waiting for it.
#[derive(Debug)]
pub struct ClockWatch {
    /// The clock's uncertainty was past the limit at the last check.
    lost: bool,
    /// It has been within the limit at some check of this run.
    was_good: bool,
    /// When this run started (the clock sources' grace runs from here).
    started: MonoTime,
    /// Local packs (file name, text) waiting for the clock to be known.
    waiting: Vec<(String, String)>,
}

impl ClockWatch {
    /// A run started at `started`: nothing known of the clock yet.
    pub fn new(started: MonoTime) -> Self {
        ClockWatch {
            lost: false,
            was_good: false,
            started,
            waiting: Vec::new(),
        }
    }

    /// A check at `now`: the clock's `uncertainty_ns` against `limit_ns`;
    /// `sources_to_lock`: the agent has sources that take a moment to lock
    /// (PTP, NTP, the link), which the start's grace is for.
    pub fn check(
        &mut self,
        now: MonoTime,
        uncertainty_ns: i64,
        limit_ns: i64,
        sources_to_lock: bool,
    ) -> Checked {
        let lost = uncertainty_ns > limit_ns;
        let change = (lost != self.lost).then_some(if lost {
            Change::Lost {
                was_good: self.was_good,
            }
        } else {
            Change::Back
        });
        self.lost = lost;
        if !lost {
            self.was_good = true;
        }
        let in_grace =
            !self.was_good && sources_to_lock && now.since(self.started) < CLOCK_START_GRACE;
        Checked {
            change,
            stop_packs: lost && !in_grace,
        }
    }

    /// A local pack (`file`, its text) waits for the clock.
    pub fn wait(&mut self, file: String, yaml: String) {
        self.waiting.push((file, yaml));
    }

    /// Whether no pack waits for the clock.
    pub fn nothing_waits(&self) -> bool {
        self.waiting.is_empty()
    }

    /// The waiting packs, to try again (those still waiting come back
    /// through [`ClockWatch::wait`]).
    pub fn take_waiting(&mut self) -> Vec<(String, String)> {
        std::mem::take(&mut self.waiting)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: i64 = 1_000_000;

    fn at(ms: i64) -> MonoTime {
        MonoTime::from_nanos(ms * MS)
    }

    /// A fresh start with sources to lock: past the limit is not a loss
    /// within the grace, is after it; said once per change.
    #[test]
    fn a_start_gets_its_grace_then_a_loss_stops_the_packs() {
        let mut w = ClockWatch::new(at(0));
        let c = w.check(at(1_000), 5 * MS, MS, true);
        assert_eq!(
            c,
            Checked {
                change: Some(Change::Lost { was_good: false }),
                stop_packs: false
            }
        );
        let c = w.check(at(29_999), 5 * MS, MS, true);
        assert_eq!((c.change, c.stop_packs), (None, false), "still in grace");
        let c = w.check(at(30_000), 5 * MS, MS, true);
        assert_eq!((c.change, c.stop_packs), (None, true), "grace over");
    }

    /// Once good in this run, a loss stops the packs at once (no grace),
    /// and its change says it was a loss; without sources to lock there
    /// is no grace either.
    #[test]
    fn a_loss_after_a_good_clock_stops_at_once() {
        let mut w = ClockWatch::new(at(0));
        assert_eq!(w.check(at(1), 10, MS, true).change, None);
        let c = w.check(at(2), 2 * MS, MS, true);
        assert_eq!(
            c,
            Checked {
                change: Some(Change::Lost { was_good: true }),
                stop_packs: true
            }
        );
        assert_eq!(w.check(at(3), 10, MS, true).change, Some(Change::Back));
        let mut w = ClockWatch::new(at(0));
        assert!(
            w.check(at(1), 2 * MS, MS, false).stop_packs,
            "no sources to wait for"
        );
    }
}
