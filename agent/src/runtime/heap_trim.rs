//! When the control loop gives freed heap back to the kernel
//! ([`crate::rt::return_free_heap`]). With memory locked, freed pages stay
//! resident until trimmed: a burst of firings or a parsed pack would set
//! the agent's footprint for good. Trimming unlocks the heap for a moment
//! and holds the allocator's lock while it walks the free lists, so it
//! waits for a quiet moment: nothing armed, nothing due soon. Under a
//! steady load without such a gap the heap keeps its working set (flat,
//! not growing: what is freed is reused).
//!
//! Sans-IO: the loop hands in the reference time, how many attempts have
//! ended so far, and when the next thing is due.

use std::time::Duration;

use baton_proto::RefTime;

/// Ended attempts since the last trim that make one worth it (a burst).
const BURST: u64 = 1_000;
/// No trim sooner than this after the previous one.
const MIN_INTERVAL: Duration = Duration::from_secs(5);
/// Nothing may be due within this when trimming.
const QUIET: Duration = Duration::from_millis(100);
/// After a burst's trim, one more this much later: the records the burst
/// left (the journal's 5 s window of ids, the core's fired ids, kept until
/// `max_lateness` plus 2 s past their instant) have aged out and been
/// freed by then, and would otherwise stay resident until the next burst.
const FOLLOW_UP: Duration = Duration::from_secs(10);

/// The trim policy's memory.
#[derive(Debug, Default)]
pub(crate) struct HeapTrim {
    /// Ended attempts counted at the last trim.
    ended_at_last: u64,
    /// When the last trim ran.
    last: Option<RefTime>,
    /// A pack was parsed since (its YAML tree is garbage now).
    parsed: bool,
    /// One more trim is worth it from this instant (see [`FOLLOW_UP`]).
    follow_up: Option<RefTime>,
}

impl HeapTrim {
    /// A pushed pack was parsed (valid or not): its tree was freed.
    pub(crate) fn parsed(&mut self) {
        self.parsed = true;
    }

    /// Whether to trim now. `ended`: attempts ended so far (monotonic);
    /// `next_due`: the next firing or wake-up the loop knows of; `idle`:
    /// nothing armed or in flight.
    pub(crate) fn due(
        &self,
        now: RefTime,
        ended: u64,
        next_due: Option<RefTime>,
        idle: bool,
    ) -> bool {
        let worth = self.parsed
            || ended.saturating_sub(self.ended_at_last) >= BURST
            || self.follow_up.is_some_and(|t| now >= t);
        let rested = self.last.is_none_or(|l| now.since(l) >= MIN_INTERVAL);
        let quiet = idle && next_due.is_none_or(|d| d.since(now) >= QUIET);
        worth && rested && quiet
    }

    /// A trim ran at `now`, with `ended` attempts ended so far.
    pub(crate) fn done(&mut self, now: RefTime, ended: u64) {
        let burst = ended.saturating_sub(self.ended_at_last) >= BURST;
        self.follow_up = burst.then(|| now + FOLLOW_UP);
        self.ended_at_last = ended;
        self.last = Some(now);
        self.parsed = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: i64) -> RefTime {
        RefTime::from_nanos(ms * 1_000_000)
    }

    #[test]
    fn a_burst_is_trimmed_once_quiet_and_not_again_without_cause() {
        let mut h = HeapTrim::default();
        // Nothing happened: nothing to give back.
        assert!(!h.due(t(0), 0, None, true));
        // A burst, but the next firing is 50 ms away, or jobs are armed.
        assert!(!h.due(t(0), 1_000, Some(t(50)), true));
        assert!(!h.due(t(0), 1_000, Some(t(500)), false));
        // Quiet: trim.
        assert!(h.due(t(0), 1_000, Some(t(100)), true));
        h.done(t(0), 1_000);
        // Too few attempts since, then enough but too soon after the last.
        assert!(!h.due(t(6_000), 1_999, None, true));
        assert!(!h.due(t(4_999), 2_000, None, true));
        assert!(h.due(t(5_000), 2_000, None, true));
    }

    #[test]
    fn a_burst_gets_one_more_trim_once_its_records_aged_out() {
        let mut h = HeapTrim::default();
        h.done(t(0), 1_000);
        assert!(!h.due(t(9_999), 1_000, None, true));
        assert!(h.due(t(10_000), 1_000, None, true));
        h.done(t(10_000), 1_000);
        // Once only.
        assert!(!h.due(t(30_000), 1_000, None, true));
    }

    #[test]
    fn a_parsed_pack_is_cause_enough() {
        let mut h = HeapTrim::default();
        h.parsed();
        assert!(h.due(t(0), 0, None, true));
        h.done(t(0), 0);
        assert!(!h.due(t(10_000), 0, None, true));
    }
}
