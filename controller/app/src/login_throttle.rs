//! How many failed log-ins one source may make (sans IO: counts per
//! window in, a verdict out). Its own module: the application holds one
//! ([`crate::app::App`]'s `login`) and the sessions module applies it,
//! and neither should import the other for it.

use std::time::Duration;

use baton_model::RefTime;

/// How many failed log-ins a source may make, and over how long: at most
/// `failures` within any `window` (estimated from two fixed windows, the
/// current one and the one before it weighted by how much of it the
/// sliding window still covers; a burst at a window's edge is not let
/// through twice). Tokens carry 256 random bits, so this does not guard
/// a secret that could be guessed; it bounds what one address makes the
/// controller do and log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoginThrottle {
    /// Failures allowed per window.
    pub failures: u64,
    /// The window.
    pub window: Duration,
}

impl Default for LoginThrottle {
    /// 10 failures per 5 minutes: a person mistyping never meets it.
    fn default() -> LoginThrottle {
        LoginThrottle {
            failures: 10,
            window: Duration::from_secs(300),
        }
    }
}

impl LoginThrottle {
    fn window_ns(&self) -> i64 {
        i64::try_from(self.window.as_nanos())
            .unwrap_or(i64::MAX)
            .max(1)
    }

    /// The start of the fixed window `at` falls in.
    pub fn window_of(&self, at: RefTime) -> RefTime {
        let w = self.window_ns();
        RefTime::from_nanos(at.as_nanos().div_euclid(w) * w)
    }

    /// Windows starting before this are no longer read at `at` (the
    /// store may forget them).
    pub fn forget_before(&self, at: RefTime) -> RefTime {
        RefTime::from_nanos(
            self.window_of(at)
                .as_nanos()
                .saturating_sub(self.window_ns()),
        )
    }

    /// Whether a log-in may be tried at `at`, given the failures counted
    /// per window (`(window start, failures)`, any windows: only the
    /// current one and the one before it count). `Err`: how long to wait
    /// before the estimate falls below the allowance, if nothing else
    /// fails meanwhile.
    pub fn check(&self, counts: &[(RefTime, u64)], at: RefTime) -> Result<(), Duration> {
        let w = self.window_ns();
        let cur_start = self.window_of(at).as_nanos();
        let count_at = |start: i64| {
            counts
                .iter()
                .filter(|(s, _)| s.as_nanos() == start)
                .map(|(_, n)| *n)
                .sum::<u64>()
        };
        let (prev, cur) = (count_at(cur_start - w), count_at(cur_start));
        let into = at.as_nanos() - cur_start;
        let limit = self.failures as f64;
        let estimate = |prev: u64, cur: u64, into: i64| {
            prev as f64 * (1.0 - into as f64 / w as f64) + cur as f64
        };
        if estimate(prev, cur, into) < limit {
            return Ok(());
        }
        // Nothing more failing: within this window the previous one's
        // share shrinks; after it, this one's does.
        let wait_ns = if (cur as f64) < limit && prev > 0 {
            // prev·(1 − (into+t)/w) + cur < limit
            let t = w as f64 * (1.0 - (limit - cur as f64) / prev as f64) - into as f64;
            t.max(0.0)
        } else {
            // cur·(1 − (into+t−w)/w) < limit
            let t = w as f64 * (2.0 - limit / cur.max(1) as f64) - into as f64;
            t.max(0.0)
        };
        // A nanosecond past the instant it falls to the allowance.
        Err(Duration::from_nanos(wait_ns as u64 + 1))
    }
}
