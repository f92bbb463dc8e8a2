//! Pacing of pack pushes: a token bucket, sans-IO (the caller passes
//! `now`), so a push to a thousand agents goes out at a rate the agents'
//! disks and the network can take instead of all in one instant.

use std::time::{Duration, Instant};

/// Rate and burst of pushes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pace {
    /// Tokens added per second.
    pub rate: f64,
    /// Most tokens held (a burst that goes out at once).
    pub burst: f64,
}

impl Default for Pace {
    /// The seed figures: 3 000 pushes per second, burst twice that.
    fn default() -> Self {
        Pace {
            rate: 3000.0,
            burst: 6000.0,
        }
    }
}

/// A token bucket.
#[derive(Debug)]
pub struct TokenBucket {
    pace: Pace,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// Full at `now`.
    pub fn new(pace: Pace, now: Instant) -> TokenBucket {
        let pace = Pace {
            rate: pace.rate.max(f64::MIN_POSITIVE),
            burst: pace.burst.max(1.0),
        };
        TokenBucket {
            pace,
            tokens: pace.burst,
            last: now,
        }
    }

    /// Take one token, or say how long until one is there.
    pub fn take(&mut self, now: Instant) -> Result<(), Duration> {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = self.last.max(now);
        self.tokens = (self.tokens + dt * self.pace.rate).min(self.pace.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64(
                (1.0 - self.tokens) / self.pace.rate,
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(
            Pace {
                rate: 10.0,
                burst: 3.0,
            },
            t0,
        );
        for _ in 0..3 {
            assert!(b.take(t0).is_ok());
        }
        let wait = b.take(t0).expect_err("empty after the burst");
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-6, "{wait:?}");
        // 0.25 s later: 2.5 tokens came back.
        let t1 = t0 + Duration::from_millis(250);
        assert!(b.take(t1).is_ok());
        assert!(b.take(t1).is_ok());
        assert!(b.take(t1).is_err());
        // Never more than the burst, however long it rests.
        let t2 = t1 + Duration::from_secs(3600);
        for _ in 0..3 {
            assert!(b.take(t2).is_ok());
        }
        assert!(b.take(t2).is_err());
    }

    #[test]
    fn time_going_backwards_adds_nothing() {
        let t0 = Instant::now() + Duration::from_secs(10);
        let mut b = TokenBucket::new(
            Pace {
                rate: 1.0,
                burst: 1.0,
            },
            t0,
        );
        assert!(b.take(t0).is_ok());
        assert!(b.take(t0 - Duration::from_secs(5)).is_err());
        assert!(b.take(t0).is_err());
    }
}
