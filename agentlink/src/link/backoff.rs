//! Reconnect delays: exponential backoff with full jitter, sans IO.
//!
//! Every agent of a site loses its controller at the same moment (a
//! controller restart, a switch reboot); if they all came back on the same
//! schedule they would hammer it in waves. Full jitter (AWS architecture
//! blog, "Exponential Backoff And Jitter") draws each delay uniformly in
//! `[0, ceiling]`, where the ceiling doubles per failed attempt from
//! [`BackoffConfig::base`] up to [`BackoffConfig::cap`]: the reconnects of
//! a fleet spread out, and one agent still retries quickly at first.
//!
//! A stream that stayed up longer than [`BackoffConfig::reset_after`]
//! counts as a success: the next outage starts again from the base. A
//! stream that drops right after it opened (a controller refusing us, a
//! proxy cutting streams) keeps growing the delay.
//!
//! The struct reads no clock and owns no RNG: `now` and the RNG come in, so
//! the maths is tested on simulated time with a seeded RNG.

use std::time::Duration;

use rand::Rng;

/// The shape of the backoff.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackoffConfig {
    /// Ceiling of the first delay.
    pub base: Duration,
    /// Largest ceiling.
    pub cap: Duration,
    /// A stream up longer than this resets the sequence.
    pub reset_after: Duration,
}

impl Default for BackoffConfig {
    /// 0.5 s doubling to 30 s, reset after a stream up for more than 60 s.
    fn default() -> Self {
        BackoffConfig {
            base: Duration::from_millis(500),
            cap: Duration::from_secs(30),
            reset_after: Duration::from_secs(60),
        }
    }
}

/// Delays between connection attempts (see the module docs).
#[derive(Clone, Debug)]
pub struct Backoff {
    cfg: BackoffConfig,
    /// Attempts that failed (or streams that ended early) in a row.
    failures: u32,
    /// When the current stream came up (`now` as given to [`Backoff::up`]).
    up_since: Option<Duration>,
}

impl Backoff {
    /// A fresh sequence: the first delay's ceiling is `cfg.base`.
    pub fn new(cfg: BackoffConfig) -> Self {
        Backoff {
            cfg,
            failures: 0,
            up_since: None,
        }
    }

    /// The largest delay it ever draws.
    pub fn cap(&self) -> Duration {
        self.cfg.cap
    }

    /// The ceiling the next delay is drawn under: `base · 2^failures`,
    /// at most `cap`.
    pub fn ceiling(&self) -> Duration {
        let factor = 1u32 << self.failures.min(31);
        self.cfg.base.saturating_mul(factor).min(self.cfg.cap)
    }

    /// A stream came up at `now` (any monotonic scale, the same for every
    /// call).
    pub fn up(&mut self, now: Duration) {
        self.up_since = Some(now);
    }

    /// An attempt failed, or the stream ended, at `now`: the delay before
    /// the next attempt, uniform in `[0, ceiling]`. A stream that had been
    /// up for longer than `reset_after` starts the sequence over first.
    pub fn next_delay<R: Rng + ?Sized>(&mut self, now: Duration, rng: &mut R) -> Duration {
        if let Some(since) = self.up_since.take()
            && now.saturating_sub(since) > self.cfg.reset_after
        {
            self.failures = 0;
        }
        let ceiling = self.ceiling();
        self.failures = self.failures.saturating_add(1);
        let max = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(rng.random_range(0..=max))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn ceilings_double_from_half_a_second_to_thirty_seconds() {
        let mut b = Backoff::new(BackoffConfig::default());
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut ceilings = Vec::new();
        for i in 0..10 {
            let c = b.ceiling();
            ceilings.push(c.as_millis());
            let d = b.next_delay(S * i, &mut rng);
            assert!(d <= c, "delay {d:?} above its ceiling {c:?}");
        }
        assert_eq!(
            ceilings,
            [
                500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000, 30000
            ]
        );
        // Far along, nothing overflows.
        for _ in 0..100 {
            assert!(b.next_delay(S, &mut rng) <= 30 * S);
        }
    }

    #[test]
    fn a_stream_up_for_more_than_a_minute_resets_the_sequence() {
        let mut b = Backoff::new(BackoffConfig::default());
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        for _ in 0..4 {
            let _ = b.next_delay(Duration::ZERO, &mut rng);
        }
        assert_eq!(b.ceiling(), 8 * S);
        // Up for 30 s only: the sequence goes on.
        b.up(100 * S);
        let _ = b.next_delay(130 * S, &mut rng);
        assert_eq!(b.ceiling(), 16 * S);
        // Up for 61 s: the next delay is drawn under the base again.
        b.up(200 * S);
        let d = b.next_delay(261 * S, &mut rng);
        assert!(d <= Duration::from_millis(500), "{d:?}");
        assert_eq!(b.ceiling(), S);
        // Exactly 60 s is not "longer than".
        b.up(300 * S);
        let _ = b.next_delay(360 * S, &mut rng);
        assert_eq!(b.ceiling(), 2 * S);
    }

    #[test]
    fn delays_are_spread_over_the_whole_range() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let cfg = BackoffConfig::default();
        let draws: Vec<Duration> = (0..2000)
            .map(|_| Backoff::new(cfg).next_delay(Duration::ZERO, &mut rng))
            .collect();
        let min = draws.iter().min().copied().unwrap_or_default();
        let max = draws.iter().max().copied().unwrap_or_default();
        let mean = draws.iter().sum::<Duration>() / 2000;
        assert!(min < Duration::from_millis(10), "{min:?}");
        assert!(max > Duration::from_millis(490), "{max:?}");
        assert!(
            (Duration::from_millis(220)..Duration::from_millis(280)).contains(&mean),
            "full jitter: mean about half the ceiling, got {mean:?}"
        );
    }

    #[test]
    fn the_same_seed_gives_the_same_delays() {
        let run = || {
            let mut b = Backoff::new(BackoffConfig::default());
            let mut rng = ChaCha8Rng::seed_from_u64(9);
            (0..8)
                .map(|i| b.next_delay(S * i, &mut rng))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(), run());
    }

    proptest::proptest! {
        /// Whatever happens, a delay is never above `min(cap, base·2^n)`
        /// for the n-th failure in a row, and never above the cap.
        #[test]
        fn delays_stay_under_their_ceiling(
            seed: u64,
            ups in proptest::collection::vec(proptest::option::of(0u64..200), 1..60),
        ) {
            let cfg = BackoffConfig::default();
            let mut b = Backoff::new(cfg);
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let mut now = Duration::ZERO;
            let mut streak = 0u32;
            for up in ups {
                if let Some(secs) = up {
                    b.up(now);
                    now += Duration::from_secs(secs);
                    if Duration::from_secs(secs) > cfg.reset_after {
                        streak = 0;
                    }
                }
                let ceiling = cfg.base.saturating_mul(1 << streak.min(31)).min(cfg.cap);
                let d = b.next_delay(now, &mut rng);
                proptest::prop_assert!(d <= ceiling, "{:?} > {:?}", d, ceiling);
                proptest::prop_assert!(d <= cfg.cap);
                streak += 1;
                now += d;
            }
        }
    }
}
