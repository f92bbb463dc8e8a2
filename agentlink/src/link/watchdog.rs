//! Dead-peer detection, sans IO: the controller promises a ping every
//! `Welcome.ping_interval_ms`; three intervals without any message from it
//! mean the peer is gone, whatever TCP and HTTP/2 say. HTTP/2 keep-alive
//! catches a dead connection, but not a controller process that holds the
//! connection open and no longer answers (stuck, overloaded, a proxy
//! keeping the TCP side alive); this catches both.

use std::time::Duration;

/// The interval assumed until the controller's Welcome names its own (and
/// when it names 0).
pub const DEFAULT_PING_INTERVAL: Duration = Duration::from_secs(10);
/// Silent intervals after which the stream is dropped.
pub const MISSED_PINGS: u32 = 3;
/// Shortest interval honoured: a controller asking for less would make the
/// agent reconnect on any scheduling hiccup.
pub const MIN_PING_INTERVAL: Duration = Duration::from_millis(50);
/// Longest interval honoured: a dead peer is noticed within half an hour.
pub const MAX_PING_INTERVAL: Duration = Duration::from_secs(600);

/// When the controller was last heard from, and how long silence may last.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Silence {
    interval: Duration,
    last_heard: Duration,
}

impl Silence {
    /// A stream opened at `now` (any monotonic scale): the default interval
    /// until the controller names its own.
    pub fn new(now: Duration) -> Self {
        Silence {
            interval: DEFAULT_PING_INTERVAL,
            last_heard: now,
        }
    }

    /// The ping interval from a Welcome, clamped to
    /// [`MIN_PING_INTERVAL`]`..=`[`MAX_PING_INTERVAL`]; 0 means the default.
    pub fn set_interval_ms(&mut self, ms: u32) -> Duration {
        self.interval = if ms == 0 {
            DEFAULT_PING_INTERVAL
        } else {
            Duration::from_millis(u64::from(ms)).clamp(MIN_PING_INTERVAL, MAX_PING_INTERVAL)
        };
        self.interval
    }

    /// Something arrived at `now` (or the link was busy elsewhere until
    /// `now` and could not have listened: silence is not counted then).
    pub fn heard(&mut self, now: Duration) {
        self.last_heard = self.last_heard.max(now);
    }

    /// How long silence may last: [`MISSED_PINGS`] intervals.
    pub fn limit(&self) -> Duration {
        self.interval.saturating_mul(MISSED_PINGS)
    }

    /// The instant past which the peer counts as dead.
    pub fn deadline(&self) -> Duration {
        self.last_heard.saturating_add(self.limit())
    }

    /// Whether the peer counts as dead at `now`.
    pub fn dead(&self, now: Duration) -> bool {
        now >= self.deadline()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn three_silent_intervals_make_a_dead_peer() {
        let mut s = Silence::new(Duration::ZERO);
        assert_eq!(
            s.deadline(),
            Duration::from_secs(30),
            "default 10 s interval"
        );
        assert_eq!(s.set_interval_ms(100), 100 * MS);
        assert!(!s.dead(299 * MS));
        assert!(s.dead(300 * MS));
        s.heard(250 * MS);
        assert!(!s.dead(549 * MS));
        assert!(s.dead(550 * MS));
        // An earlier instant never moves the deadline back.
        s.heard(10 * MS);
        assert_eq!(s.deadline(), 550 * MS);
    }

    #[test]
    fn intervals_are_clamped_and_zero_is_the_default() {
        let mut s = Silence::new(Duration::ZERO);
        assert_eq!(s.set_interval_ms(0), DEFAULT_PING_INTERVAL);
        assert_eq!(s.set_interval_ms(1), MIN_PING_INTERVAL);
        assert_eq!(s.set_interval_ms(u32::MAX), MAX_PING_INTERVAL);
        assert_eq!(s.limit(), 3 * MAX_PING_INTERVAL);
    }
}
