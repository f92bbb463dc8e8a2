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

/// New agent streams admitted at a bounded rate. A refused one is handed
/// a slot of its own, one rate interval after the previous refusal's, so
/// a crowd refused together (a dead replica's agents arriving at once)
/// comes back spread at the rate the replica admits, instead of drawing
/// exponential backoffs that leave the replica idle in the gaps (what
/// `benches/storm.rs` measured).
#[derive(Debug)]
pub struct Admission {
    bucket: TokenBucket,
    interval: Duration,
    next_slot: Instant,
}

/// Slots are handed out at most this far ahead; a crowd larger than the
/// rate admits in this time is told to come back at its end, and spread
/// by the agents' own jitter from there.
pub const MAX_SLOT_AHEAD: Duration = Duration::from_secs(120);

impl Admission {
    /// Full at `now`.
    pub fn new(pace: Pace, now: Instant) -> Admission {
        Admission {
            bucket: TokenBucket::new(pace, now),
            interval: Duration::from_secs_f64(1.0 / pace.rate.max(f64::MIN_POSITIVE))
                .min(MAX_SLOT_AHEAD),
            next_slot: now,
        }
    }

    /// Admit a stream at `now`, or refuse it with the delay after which
    /// its slot comes.
    pub fn admit(&mut self, now: Instant) -> Result<(), Duration> {
        let Err(wait) = self.bucket.take(now) else {
            return Ok(());
        };
        let slot = (now + wait).max(self.next_slot).min(now + MAX_SLOT_AHEAD);
        self.next_slot = slot + self.interval;
        Err(slot.saturating_duration_since(now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_streams_get_slots_one_interval_apart() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut a = Admission::new(
            Pace {
                rate: 10.0,
                burst: 2.0,
            },
            t0,
        );
        assert!(a.admit(t0).is_ok() && a.admit(t0).is_ok());
        let slots: Vec<Duration> = (0..4).map(|_| a.admit(t0).expect_err("refused")).collect();
        let near = |d: Duration, want: Duration| d.abs_diff(want) < ms(1);
        for (i, s) in slots.iter().enumerate() {
            assert!(near(*s, ms(100) * (i as u32 + 1)), "slot {i}: {s:?}");
        }
        // Each comes back at its slot and is admitted.
        for i in 1..=4u32 {
            assert!(a.admit(t0 + ms(100) * i).is_ok(), "back at slot {i}");
        }
        // The queue is past: a refusal waits only for the next token.
        let later = t0 + ms(450);
        assert!(a.admit(later).is_err_and(|d| d <= ms(100)));
        // A crowd is told at most MAX_SLOT_AHEAD.
        let far = (0..5000)
            .map(|_| a.admit(later).expect_err("refused"))
            .max();
        assert_eq!(far, Some(MAX_SLOT_AHEAD));
    }

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
