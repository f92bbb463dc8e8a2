//! Reference time on the agent, and its mapping to the local monotonic clock.
//!
//! Packs are written on reference time; threads sleep on `CLOCK_MONOTONIC`,
//! which never steps. The estimator holds `offset = reference − monotonic`
//! with an uncertainty, published here ([`ClockEstimate`], lock-free for the
//! dispatcher) by the control thread's [`driver`], which feeds the sources'
//! samples to the sans-IO [`estimator`] (docs/design.md "Clock sources").

#![forbid(unsafe_code)]

pub mod driver;
pub mod estimator;
pub mod exchange;
mod mono;
pub mod ntp;
pub mod port;
pub mod ptp;
pub mod sample;
pub mod settings;
pub mod system;

use std::sync::atomic::{AtomicI64, Ordering};

use baton_proto::RefTime;

pub use mono::{MonoTime, clock_ns, mono_now};

/// The mapping between reference time and the monotonic clock, shared by
/// the control thread (which updates it) and the dispatcher (which reads it).
#[derive(Debug)]
pub struct ClockEstimate {
    offset_ns: AtomicI64,
    uncertainty_ns: AtomicI64,
}

impl ClockEstimate {
    /// The system clock as it is, until the estimator says better.
    pub fn from_system() -> Self {
        let (_, offset, width) = system::read_offset();
        ClockEstimate {
            offset_ns: AtomicI64::new(offset),
            uncertainty_ns: AtomicI64::new(width),
        }
    }

    /// Publish a new mapping (the control thread, after each estimator
    /// tick). Two stores: a reader between them pairs the new offset with
    /// the old uncertainty for one read, which only a report could see.
    pub fn set(&self, offset_ns: i64, uncertainty_ns: i64) {
        self.offset_ns.store(offset_ns, Ordering::Release);
        self.uncertainty_ns.store(uncertainty_ns, Ordering::Relaxed);
    }

    /// Reference time now.
    pub fn now(&self) -> RefTime {
        self.to_ref(mono_now())
    }

    /// A monotonic instant on the reference scale.
    pub fn to_ref(&self, m: MonoTime) -> RefTime {
        RefTime::from_nanos(
            m.as_nanos()
                .saturating_add(self.offset_ns.load(Ordering::Acquire)),
        )
    }

    /// A reference instant on the monotonic scale.
    pub fn to_mono(&self, t: RefTime) -> MonoTime {
        MonoTime::from_nanos(
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
        c.set(c.offset_ns() + 1_000, 7);
        assert_eq!(c.to_ref(m).as_nanos() - m.as_nanos(), c.offset_ns());
        assert_eq!(c.uncertainty_ns(), 7);
    }
}
