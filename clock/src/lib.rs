//! Reference time on the agent, and its mapping to the local monotonic clock.
//!
//! Packs are written on reference time; threads sleep on `CLOCK_MONOTONIC`,
//! which never steps. The estimator holds `offset = reference − monotonic`
//! with an uncertainty, published here ([`ClockEstimate`], lock-free for the
//! dispatcher) by the control thread's [`driver`], which feeds the sources'
//! samples to the sans-IO [`estimator`] (DESIGN.md "Clock sources").

#![forbid(unsafe_code)]

pub mod driver;
pub mod estimator;
pub mod exchange;
pub mod ntp;
pub mod port;
pub mod ptp;
pub mod sample;
pub mod settings;
pub mod system;

use std::ops::{Add, Sub};
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use baton_proto::RefTime;
use nix::time::{ClockId, clock_gettime};

/// An instant on `CLOCK_MONOTONIC`, ns. Its own type so that it is never
/// mixed up with reference time ([`RefTime`]), which only the estimator
/// converts to and from; its arithmetic saturates (a deadline "never" is
/// [`MonoTime::MAX`], and adding to it stays there), as `RefTime`'s does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MonoTime(i64);

impl MonoTime {
    /// The earliest instant: "long ago".
    pub const MIN: MonoTime = MonoTime(i64::MIN);
    /// The latest instant: "never".
    pub const MAX: MonoTime = MonoTime(i64::MAX);

    /// The instant `ns` after the clock's epoch (boot).
    pub const fn from_nanos(ns: i64) -> MonoTime {
        MonoTime(ns)
    }

    /// Nanoseconds since the clock's epoch.
    pub const fn as_nanos(self) -> i64 {
        self.0
    }

    /// `self + ns` (negative: earlier), saturating at the ends.
    pub const fn add_nanos(self, ns: i64) -> MonoTime {
        MonoTime(self.0.saturating_add(ns))
    }

    /// Signed ns from `earlier` to `self`, saturating.
    pub const fn nanos_since(self, earlier: MonoTime) -> i64 {
        self.0.saturating_sub(earlier.0)
    }

    /// How long after `earlier` this is (zero if it is not after it).
    pub fn since(self, earlier: MonoTime) -> Duration {
        Duration::from_nanos(u64::try_from(self.nanos_since(earlier)).unwrap_or(0))
    }
}

impl Add<Duration> for MonoTime {
    type Output = MonoTime;
    /// Saturating: a duration past `i64` ns lands on [`MonoTime::MAX`].
    fn add(self, d: Duration) -> MonoTime {
        self.add_nanos(i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
    }
}

impl Sub<Duration> for MonoTime {
    type Output = MonoTime;
    /// Saturating at [`MonoTime::MIN`].
    fn sub(self, d: Duration) -> MonoTime {
        MonoTime(
            self.0
                .saturating_sub(i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)),
        )
    }
}

/// Nanoseconds on `clock`. The clocks read here exist on every Linux this
/// agent supports, so a failure is a broken system: it is loud.
#[allow(
    clippy::useless_conversion,
    reason = "`time_t` and `c_long` are i32 on armv7 gnueabihf, i64 here"
)]
pub fn clock_ns(clock: ClockId) -> i64 {
    match clock_gettime(clock) {
        // `time_t` and `c_long` are 32 bits on armv7 (gnueabihf): widen
        // before multiplying (`from` is the identity on 64-bit targets).
        Ok(ts) => i64::from(ts.tv_sec()) * 1_000_000_000 + i64::from(ts.tv_nsec()),
        Err(e) => panic!("clock_gettime({clock}) failed: {e}"),
    }
}

/// The monotonic clock now.
pub fn mono_now() -> MonoTime {
    MonoTime::from_nanos(clock_ns(ClockId::CLOCK_MONOTONIC))
}

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
        c.set(c.offset_ns() + 1_000, 7);
        assert_eq!(c.to_ref(m).as_nanos() - m.0, c.offset_ns());
        assert_eq!(c.uncertainty_ns(), 7);
    }
}
