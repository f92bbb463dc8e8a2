//! The per-stream rate limits on what an agent may ask of the controller
//! (time requests) and have it store (clock reports).

use tokio::time::Instant;

use crate::app::pace::{Pace, TokenBucket};

/// A per-stream rate limit on one kind of message: past it the message is
/// dropped (a time request goes unanswered, and the agent's exchange asks
/// again later; a clock report is not stored), and the first drop is
/// logged.
pub(super) struct Limited {
    pub(super) what: &'static str,
    bucket: TokenBucket,
    pub(super) dropped: u64,
}

impl Limited {
    pub(super) fn new(what: &'static str, pace: Pace, now: Instant) -> Limited {
        Limited {
            what,
            bucket: TokenBucket::new(pace, now.into_std()),
            dropped: 0,
        }
    }

    /// Whether this message may be acted on.
    pub(super) fn allow(&mut self, agent: &str, now: Instant) -> bool {
        if self.bucket.take(now.into_std()).is_ok() {
            return true;
        }
        self.dropped += 1;
        if self.dropped == 1 {
            tracing::warn!(
                agent,
                "agent sends {} faster than an agent does: the excess is dropped",
                self.what
            );
        }
        false
    }
}

/// Time requests an agent's stream may have answered: its exchange asks at
/// most 4 a second, in a burst of six, then one every 4 s; twice that.
pub(super) const TIME_REQUESTS: Pace = Pace {
    rate: 8.0,
    burst: 16.0,
};

/// Clock reports an agent's stream may have stored: it sends one on each
/// welcome and one every 5 s.
pub(super) const CLOCK_REPORTS: Pace = Pace {
    rate: 0.5,
    burst: 4.0,
};
