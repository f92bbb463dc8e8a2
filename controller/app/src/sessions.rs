//! Dashboard sessions and log-in throttling, kept in the store so that
//! replicas behind one address share them: a session made on one replica
//! is valid on every other, a log-out or a revocation of its certificate
//! ends it on all of them at once (each request reads it from the store;
//! nothing is cached in a process that a revocation could outlive), and
//! failed log-ins from one address are counted once for the site, so
//! spreading attempts over replicas does not multiply the allowance.
//!
//! What the dashboard holds of a session is its cookie's value; the store
//! holds only that value's SHA-256 (the server hashes it), so reading the
//! database does not let anyone replay a cookie. The rules here: a session
//! lasts [`SESSION_TTL`] and never past its certificate's expiry; a
//! certificate holds at most [`SESSIONS_PER_IDENTITY`] (its oldest go
//! first), the store at most [`MAX_SESSIONS`]; a source that failed to log
//! in [`LoginThrottle::failures`] times within a window waits
//! ([`LoginThrottle`], sans IO).

use std::time::Duration;

use crate::app::{App, AppError, AppResult, now};
pub use crate::login_throttle::LoginThrottle;
use baton_model::identity::Identity;
use baton_model::{RefTime, SessionOpened, SessionRow};
use baton_store::StoreOps;

/// Longest a session lasts.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// Most sessions one certificate may hold; its oldest goes first (so a
/// token holder cannot fill the table and lock others out).
pub const SESSIONS_PER_IDENTITY: usize = 16;
/// Most sessions kept at once (ended ones go first).
pub const MAX_SESSIONS: u64 = 10_000;

/// A session to open: what the dashboard knows of who logged in.
#[derive(Clone, Debug)]
pub struct NewSession {
    /// SHA-256 of the cookie's value, lowercase hex.
    pub id_hash: String,
    /// Who (an operator).
    pub who: Identity,
    /// Its certificate's serial.
    pub serial: String,
    /// Its certificate's expiry: the session ends by then.
    pub not_after: RefTime,
    /// The session's CSRF token.
    pub csrf: String,
}

impl App {
    /// Store a new session, valid on every replica: for
    /// [`SESSION_TTL`] and never past its certificate's expiry, within
    /// [`SESSIONS_PER_IDENTITY`] and [`MAX_SESSIONS`]. Refused
    /// (`Denied`) when the certificate is recorded as revoked, and
    /// (`Unavailable`) when the store holds as many sessions as it may.
    pub async fn open_session(&self, new: NewSession) -> AppResult<SessionRow> {
        let created = now();
        let ttl = i64::try_from(SESSION_TTL.as_nanos()).unwrap_or(i64::MAX);
        let expires = created
            .as_nanos()
            .saturating_add(ttl)
            .min(new.not_after.as_nanos());
        let row = SessionRow {
            id_hash: new.id_hash,
            who: new.who,
            serial: new.serial,
            csrf: new.csrf,
            created,
            expires: RefTime::from_nanos(expires),
        };
        match self
            .store
            .open_session(row.clone(), SESSIONS_PER_IDENTITY, MAX_SESSIONS)
            .await?
        {
            SessionOpened::Opened => Ok(row),
            SessionOpened::Revoked => Err(AppError::Denied("its certificate is revoked".into())),
            SessionOpened::Full => Err(AppError::Unavailable(
                "too many sessions open; try again later".into(),
            )),
        }
    }

    /// The session whose cookie hashes to `id_hash`, if it stands now (not
    /// expired, not logged out, its certificate not recorded as revoked),
    /// on whichever replica it was made.
    pub async fn session(&self, id_hash: &str) -> AppResult<Option<SessionRow>> {
        Ok(self.store.session(id_hash, now()).await?)
    }

    /// End a session (log-out), on every replica.
    pub async fn close_session(&self, id_hash: &str) -> AppResult<()> {
        Ok(self.store.close_session(id_hash).await?)
    }

    /// Whether a log-in from `source` (an address, as the dashboard names
    /// it) may be tried now: `Err(wait)` after too many failures from it,
    /// counted across replicas ([`LoginThrottle`]).
    pub async fn login_allowed(&self, source: &str) -> AppResult<Result<(), Duration>> {
        let at = now();
        let t = self.cfg.login;
        let counts = self
            .store
            .login_failures(source, t.forget_before(at))
            .await?;
        Ok(t.check(&counts, at))
    }

    /// A log-in from `source` failed: counted for every replica.
    pub async fn login_failed(&self, source: &str) -> AppResult<()> {
        let at = now();
        let t = self.cfg.login;
        self.store
            .login_failed(source, t.window_of(at), t.forget_before(at))
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // a failed unwrap is a failed test
    use super::*;
    use proptest::prelude::*;

    const S: i64 = 1_000_000_000;

    fn t(ns: i64) -> RefTime {
        RefTime::from_nanos(ns)
    }

    fn throttle() -> LoginThrottle {
        LoginThrottle {
            failures: 10,
            window: Duration::from_secs(100),
        }
    }

    #[test]
    fn a_source_is_refused_once_its_window_holds_the_allowance() {
        let th = throttle();
        let w = th.window_of(t(250 * S));
        assert_eq!(w, t(200 * S));
        assert_eq!(th.forget_before(t(250 * S)), t(100 * S));
        assert!(th.check(&[(w, 9)], t(250 * S)).is_ok());
        let wait = th.check(&[(w, 10)], t(250 * S)).unwrap_err();
        // Ten in this window: the estimate falls below ten as soon as it
        // has passed (they then count for less than all of the sliding
        // window), 50 s from now.
        assert!(
            (Duration::from_secs(50)..=Duration::from_millis(50_001)).contains(&wait),
            "{wait:?}"
        );
        // Windows that no longer count are ignored.
        assert!(th.check(&[(t(0), 100), (w, 1)], t(250 * S)).is_ok());
    }

    #[test]
    fn the_previous_window_counts_for_the_part_still_covered() {
        let th = throttle();
        // Ten in the previous window; a quarter into this one, three
        // quarters of them still count (7.5).
        let prev = t(100 * S);
        assert!(th.check(&[(prev, 10)], t(225 * S)).is_ok());
        // With 3 here, 10.5: refused, until the previous share falls
        // below 7: (1 − x) · 10 + 3 < 10 at x > 0.3, 5 s from now.
        let wait = th
            .check(&[(prev, 10), (t(200 * S), 3)], t(225 * S))
            .unwrap_err();
        assert!(
            (Duration::from_secs(4)..=Duration::from_secs(6)).contains(&wait),
            "{wait:?}"
        );
    }

    proptest! {
        /// Whatever the counts, a refusal's wait is when the estimate
        /// falls below the allowance: allowed just after it, still
        /// refused a little before it.
        #[test]
        fn the_wait_is_when_a_log_in_is_allowed_again(
            prev in 0u64..40, cur in 0u64..40, into in 0i64..100,
        ) {
            let th = throttle();
            let at = t(1_000 * S + into * S);
            let counts = [(t(900 * S), prev), (t(1_000 * S), cur)];
            if let Err(wait) = th.check(&counts, at) {
                let wait_ns = i64::try_from(wait.as_nanos()).unwrap();
                prop_assert!(th.check(&counts, t(at.as_nanos() + wait_ns + 1_000)).is_ok());
                if wait_ns > 1_000_000 {
                    prop_assert!(th.check(&counts, t(at.as_nanos() + wait_ns - 1_000_000)).is_err());
                }
            }
        }
    }
}
