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
//! in [`LoginThrottle::failures`] times within a window waits, and so
//! does a token tried that often from any addresses ([`LoginAttempt`];
//! [`LoginThrottle`], sans IO). Every failed log-in looked at is audited;
//! the throttled ones, not looked at, are not.

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

    /// Whether `attempt` may be looked at now: `Err` after too many
    /// failures from its source, or with its token's first characters
    /// from any source (a leaked or revoked token replayed from many
    /// addresses), counted across replicas ([`LoginThrottle`]). When both
    /// are over their allowance, the longer wait is the answer: the
    /// attempt is refused until both have fallen below.
    pub async fn login_allowed(&self, attempt: &LoginAttempt) -> AppResult<Result<(), Throttled>> {
        let at = now();
        let t = self.cfg.login;
        let mut verdict = Ok(());
        for (key, by) in attempt.keys() {
            let counts = self.store.login_failures(key, t.forget_before(at)).await?;
            if let Err(wait) = t.check(&counts, at) {
                let longer = match verdict {
                    Err(Throttled { wait: w, .. }) => wait > w,
                    Ok(()) => true,
                };
                if longer {
                    verdict = Err(Throttled { by, wait });
                }
            }
        }
        Ok(verdict)
    }

    /// `attempt` was looked at and refused (`why`, as the caller was
    /// told): counted against its source and its token's first
    /// characters for every replica, and audited. `whose`: the operator a
    /// known token was issued to (revoked, expired), `None` for a token
    /// nobody was issued. Both are tried whatever the other's fate; the
    /// first error is the answer (the log-in is refused either way).
    pub async fn login_failed(
        &self,
        attempt: &LoginAttempt,
        whose: Option<&Identity>,
        why: &str,
    ) -> AppResult<()> {
        let at = now();
        let t = self.cfg.login;
        let mut counted = Ok(());
        for (key, _) in attempt.keys() {
            let r = self
                .store
                .login_failed(key, t.window_of(at), t.forget_before(at))
                .await;
            if let Err(e) = r
                && counted.is_ok()
            {
                counted = Err(AppError::from(e));
            }
        }
        let audited = self.audit_failed_login(&attempt.source, whose, why).await;
        counted.and(audited)
    }
}

/// What one dashboard log-in attempt is counted against: its source (an
/// address, as the dashboard names it) and the first
/// [`TOKEN_KEY_CHARS`] characters of the token it offered. Counting the
/// token as well as the address throttles a token tried from many
/// addresses, which no per-address count sees.
///
/// The token's characters are a store key only: they are neither logged
/// nor audited, and `Debug` leaves them out. 16 hex characters are 64 of
/// a token's 256 bits, too few to log in with; a real token could be
/// throttled by whoever knows its first characters, who is close to
/// holding it anyway.
#[derive(Clone, PartialEq, Eq)]
pub struct LoginAttempt {
    source: String,
    token_key: String,
}

/// How many of a token's characters (after its fixed prefix) an attempt
/// is counted by.
pub const TOKEN_KEY_CHARS: usize = 16;

impl LoginAttempt {
    /// An attempt from `source` with `secret`: the token as offered, its
    /// fixed prefix (`baton_`, the same for every token, which the
    /// dashboard knows and this crate does not) removed.
    pub fn new(source: &str, secret: &str) -> LoginAttempt {
        let first: String = secret.trim().chars().take(TOKEN_KEY_CHARS).collect();
        LoginAttempt {
            source: source.to_string(),
            token_key: format!("token:{first}"),
        }
    }

    /// Whom it comes from.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The store keys it is counted against. A source never starts with
    /// `token:` (an address, `unknown`), so the two never share a count.
    fn keys(&self) -> [(&str, ThrottledBy); 2] {
        [
            (self.source.as_str(), ThrottledBy::Source),
            (self.token_key.as_str(), ThrottledBy::Token),
        ]
    }
}

impl std::fmt::Debug for LoginAttempt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token's characters.
        f.debug_struct("LoginAttempt")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

/// A log-in refused without being looked at: too many failures, and for
/// how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Throttled {
    /// Which count is over its allowance (the one with the longer wait).
    pub by: ThrottledBy,
    /// How long until it falls below, if nothing else fails meanwhile.
    pub wait: Duration,
}

/// Which of an attempt's counts throttles it: the caller is told which,
/// so that a person whose address is fine learns the token is the
/// trouble.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThrottledBy {
    /// Its source address.
    Source,
    /// Its token's first characters, from whatever address.
    Token,
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

    #[test]
    fn an_attempt_is_counted_by_its_tokens_first_characters_and_never_shows_them() {
        let a = LoginAttempt::new("192.0.2.1", " 0123456789abcdefXYZ ");
        assert_eq!(
            a.keys().map(|(k, _)| k.to_string()),
            [
                "192.0.2.1".to_string(),
                "token:0123456789abcdef".to_string()
            ]
        );
        // Shorter than the key: all of it; the same first characters,
        // the same key.
        assert_eq!(LoginAttempt::new("x", "ab").keys()[1].0, "token:ab");
        assert_eq!(
            LoginAttempt::new("x", "0123456789abcdefQQQ").keys()[1].0,
            a.keys()[1].0
        );
        let shown = format!("{a:?}");
        assert!(
            shown.contains("192.0.2.1") && !shown.contains("0123"),
            "{shown}"
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
