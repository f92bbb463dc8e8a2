//! Pack leases, sans IO: which packs have been without their controller
//! for longer than their `lease`.
//!
//! A pack's lease runs from the later of the last contact with the
//! controller and the moment the pack was taken in this run. Contact is
//! the controller's Welcome and every message after it (pushes, cancels,
//! acks, pings); the agent's start counts as contact, so a restarted agent
//! gives every pack a full lease to find its controller. A transport that
//! connects but whose stream the controller refuses is *not* contact: a
//! controller that cannot talk to the agent cannot cancel its packs either.
//!
//! Time is the agent's monotonic clock (as the runtime's `Clock` maps it),
//! so a step of the reference clock neither ends nor extends a lease.

use std::time::Duration;

use baton_clock::MonoTime;

/// One held, running pack with a lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Leased {
    /// Its `lease`.
    pub lease: Duration,
    /// When it was taken in this run.
    pub since: MonoTime,
}

/// The last contact with the controller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseClock {
    last_contact: MonoTime,
}

fn add(t: MonoTime, d: Duration) -> MonoTime {
    t + d
}

impl LeaseClock {
    /// The agent started at `now`: that counts as contact.
    pub fn new(now: MonoTime) -> Self {
        LeaseClock { last_contact: now }
    }

    /// The controller was heard from at `now`.
    pub fn contact(&mut self, now: MonoTime) {
        self.last_contact = self.last_contact.max(now);
    }

    /// When `p`'s lease runs out (if no contact comes first).
    pub fn expiry(&self, p: &Leased) -> MonoTime {
        add(self.last_contact.max(p.since), p.lease)
    }

    /// Whether `p`'s lease has run out at `now`.
    pub fn expired(&self, p: &Leased, now: MonoTime) -> bool {
        now >= self.expiry(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000_000;

    fn at(s: i64) -> MonoTime {
        MonoTime::from_nanos(s * S)
    }

    #[test]
    fn a_lease_runs_from_the_last_contact_or_the_acceptance() {
        let mut c = LeaseClock::new(at(0));
        let p = Leased {
            lease: Duration::from_secs(10),
            since: at(0),
        };
        assert!(!c.expired(&p, at(9)));
        assert!(c.expired(&p, at(10)));
        c.contact(at(5));
        assert_eq!(c.expiry(&p), at(15));
        // A pack taken later gets its full lease from then.
        let later = Leased {
            lease: Duration::from_secs(10),
            since: at(12),
        };
        assert_eq!(c.expiry(&later), at(22));
        // Contact never goes backwards.
        c.contact(at(1));
        assert_eq!(c.expiry(&p), at(15));
    }

    #[test]
    fn a_huge_lease_does_not_overflow() {
        let c = LeaseClock::new(at(1));
        let p = Leased {
            lease: Duration::MAX,
            since: at(0),
        };
        assert_eq!(c.expiry(&p), MonoTime::MAX);
        assert!(!c.expired(&p, at(1_000_000)));
    }
}
