//! The local monotonic clock and its instants: a module of its own so that
//! nothing else in the crate reaches into a [`MonoTime`]'s nanoseconds but
//! through its saturating arithmetic.

use std::ops::{Add, Sub};
use std::time::Duration;

use nix::time::{ClockId, clock_gettime};

/// An instant on `CLOCK_MONOTONIC`, ns. Its own type so that it is never
/// mixed up with reference time ([`baton_proto::RefTime`]), which only the estimator
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
