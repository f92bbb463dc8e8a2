//! Reference time on the agent, and its mapping to the local monotonic clock.
//!
//! Packs are written on reference time; threads sleep on `CLOCK_MONOTONIC`,
//! which never steps. The estimator holds `offset = reference − monotonic`
//! with an uncertainty. Today the only source is the system clock as it is
//! (`CLOCK_REALTIME`); PTP (statime), NTP and the controller link will feed
//! the same estimate (DESIGN.md "Clock sources").

pub mod ptp;
pub mod sample;

use std::sync::atomic::{AtomicI64, Ordering};

use baton_proto::RefTime;
use nix::time::{ClockId, clock_gettime};

/// Nanoseconds on `CLOCK_MONOTONIC`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MonoTime(pub i64);

/// Nanoseconds on `clock`. The clocks read here exist on every Linux this
/// agent supports, so a failure is a broken system: it is loud.
pub fn clock_ns(clock: ClockId) -> i64 {
    match clock_gettime(clock) {
        Ok(ts) => ts.tv_sec() * 1_000_000_000 + ts.tv_nsec(),
        Err(e) => panic!("clock_gettime({clock}) failed: {e}"),
    }
}

/// The monotonic clock now.
pub fn mono_now() -> MonoTime {
    MonoTime(clock_ns(ClockId::CLOCK_MONOTONIC))
}

/// The mapping between reference time and the monotonic clock, shared by
/// the control thread (which updates it) and the dispatcher (which reads it).
#[derive(Debug)]
pub struct ClockEstimate {
    offset_ns: AtomicI64,
    uncertainty_ns: AtomicI64,
}

/// A change of the offset larger than this (beyond the reading's own
/// uncertainty) is a step of the system clock.
pub const STEP_THRESHOLD_NS: i64 = 1_000_000;

/// Reads per resample; the one bracketed most tightly wins, so a thread
/// preempted between two reads does not look like a clock step.
const SAMPLES: usize = 3;

/// One reading of `realtime − monotonic`, and how wide its bracket was.
fn sample_offset() -> (i64, i64) {
    let mut best = (0, i64::MAX);
    for _ in 0..SAMPLES {
        let m0 = clock_ns(ClockId::CLOCK_MONOTONIC);
        let r = clock_ns(ClockId::CLOCK_REALTIME);
        let m1 = clock_ns(ClockId::CLOCK_MONOTONIC);
        let width = (m1 - m0).max(1);
        if width < best.1 {
            best = (r - (m0 + (m1 - m0) / 2), width);
        }
    }
    best
}

impl ClockEstimate {
    /// The system clock as it is.
    pub fn from_system() -> Self {
        let (offset, width) = sample_offset();
        ClockEstimate {
            offset_ns: AtomicI64::new(offset),
            uncertainty_ns: AtomicI64::new(width),
        }
    }

    /// Re-read the system clock. Returns the step if the offset moved by
    /// more than [`STEP_THRESHOLD_NS`] plus the reading's uncertainty.
    pub fn resample_system(&self) -> Option<i64> {
        let (offset, width) = sample_offset();
        self.uncertainty_ns.store(width, Ordering::Relaxed);
        let old = self.offset_ns.swap(offset, Ordering::AcqRel);
        let d = offset - old;
        (d.abs() > STEP_THRESHOLD_NS + width).then_some(d)
    }

    /// Reference time now.
    pub fn now(&self) -> RefTime {
        self.to_ref(mono_now())
    }

    /// A monotonic instant on the reference scale.
    pub fn to_ref(&self, m: MonoTime) -> RefTime {
        RefTime::from_nanos(m.0.saturating_add(self.offset_ns.load(Ordering::Acquire)))
    }

    /// A reference instant on the monotonic scale.
    pub fn to_mono(&self, t: RefTime) -> MonoTime {
        MonoTime(
            t.as_nanos()
                .saturating_sub(self.offset_ns.load(Ordering::Acquire)),
        )
    }

    /// How uncertain the mapping is, ns.
    pub fn uncertainty_ns(&self) -> i64 {
        self.uncertainty_ns.load(Ordering::Relaxed)
    }

    /// `reference − monotonic`, ns.
    pub fn offset_ns(&self) -> i64 {
        self.offset_ns.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_round_trip_and_follow_the_system_clock() {
        let c = ClockEstimate::from_system();
        let m = mono_now();
        assert_eq!(c.to_mono(c.to_ref(m)), m);
        let sys = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as i64)
            .unwrap_or_default();
        assert!((c.now().as_nanos() - sys).abs() < 50_000_000);
        assert!(c.uncertainty_ns() > 0);
    }

    #[test]
    fn an_idle_clock_reports_no_steps() {
        let c = ClockEstimate::from_system();
        let steps = (0..2000).filter_map(|_| c.resample_system()).count();
        assert_eq!(steps, 0, "resampling a steady clock must not report steps");
    }
}
