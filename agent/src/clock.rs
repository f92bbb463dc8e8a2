//! Reference time on the agent, and its mapping to the local monotonic clock.
//!
//! Packs are written on reference time; threads sleep on `CLOCK_MONOTONIC`,
//! which never steps. The estimator holds `offset = reference − monotonic`
//! with an uncertainty. Today the only source is the system clock as it is
//! (`CLOCK_REALTIME`); PTP (statime), NTP and the controller link will feed
//! the same estimate (DESIGN.md "Clock sources").

use std::sync::atomic::{AtomicI64, Ordering};

use baton_proto::RefTime;

/// Nanoseconds on `CLOCK_MONOTONIC`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MonoTime(pub i64);

fn clock_ns(clock: libc::clockid_t) -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock ids used here
    // exist on every Linux kernel this agent supports.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

/// The monotonic clock now.
pub fn mono_now() -> MonoTime {
    MonoTime(clock_ns(libc::CLOCK_MONOTONIC))
}

/// The mapping between reference time and the monotonic clock, shared by
/// the control thread (which updates it) and the dispatcher (which reads it).
#[derive(Debug)]
pub struct ClockEstimate {
    offset_ns: AtomicI64,
    uncertainty_ns: AtomicI64,
}

/// A step of the estimate larger than this is reported as a clock step.
pub const STEP_THRESHOLD_NS: i64 = 1_000_000;

impl ClockEstimate {
    /// Start from the system clock as it is.
    pub fn from_system() -> Self {
        let e = ClockEstimate {
            offset_ns: AtomicI64::new(0),
            uncertainty_ns: AtomicI64::new(0),
        };
        e.resample_system();
        e
    }

    /// Re-read the system clock's offset; returns the change in ns, so the
    /// caller can report a step (the scheduler core treats a step as
    /// downtime or an early wake, never as a burst).
    pub fn resample_system(&self) -> i64 {
        // Bracket the realtime read between two monotonic reads and take the
        // midpoint: the bracket width bounds the sampling error.
        let m0 = clock_ns(libc::CLOCK_MONOTONIC);
        let r = clock_ns(libc::CLOCK_REALTIME);
        let m1 = clock_ns(libc::CLOCK_MONOTONIC);
        let offset = r - (m0 + (m1 - m0) / 2);
        self.uncertainty_ns
            .store((m1 - m0).max(1), Ordering::Relaxed);
        let old = self.offset_ns.swap(offset, Ordering::AcqRel);
        offset - old
    }

    /// Reference time now.
    pub fn now(&self) -> RefTime {
        self.to_ref(mono_now())
    }

    /// A monotonic instant on the reference scale.
    pub fn to_ref(&self, m: MonoTime) -> RefTime {
        RefTime::from_nanos(m.0.saturating_add(self.offset_ns.load(Ordering::Acquire)))
    }

    /// A reference instant on the monotonic scale (what threads sleep on).
    pub fn to_mono(&self, t: RefTime) -> MonoTime {
        MonoTime(
            t.as_nanos()
                .saturating_sub(self.offset_ns.load(Ordering::Acquire)),
        )
    }

    /// Current uncertainty of the estimate, ns.
    pub fn uncertainty_ns(&self) -> i64 {
        self.uncertainty_ns.load(Ordering::Relaxed)
    }

    /// Current offset (reference − monotonic), ns.
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
        // Same clock read twice: within a generous 50 ms on a loaded machine.
        assert!((c.now().as_nanos() - sys).abs() < 50_000_000);
        assert!(c.uncertainty_ns() > 0);
    }
}
