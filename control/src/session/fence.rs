//! Session fencing, sans IO: whether a controller session, and each push
//! or cancel it sends, may be acted on (docs/design.md "Stores": fencing that
//! reaches the device).
//!
//! A controller's store raises an agent's *session generation* each time
//! it makes a stream that agent's owner, and says it in `Welcome`. The
//! agent journals the highest generation it has seen (durably, before
//! anything else of that session is looked at) and refuses:
//!
//! - a `Welcome` below it — a replica paused past its lease that wakes up
//!   holding an old stream, or a store restored from an older copy. The
//!   session is then not contact (leases keep running) and the link drops
//!   it and reconnects with its usual backoff. Generation 0 is a
//!   controller that does not fence: accepted only while the agent has
//!   seen nothing higher;
//! - a `PackPush` or `PackCancel` whose generation is not the one its
//!   session was welcomed at (or sent on a session not welcomed, or
//!   refused): a push is nacked `STALE`, a cancel is not acted on.
//!
//! The journal is the fence's memory: its highest generation comes in
//! with every call, and an `Accepted { raised: true }` is the agent's
//! order to journal the new one before it acts on anything else of the
//! session. This type only remembers how the current session's Welcome
//! was decided.

/// Why a session, push or cancel is refused: the sender is not (or no
/// longer) this agent's controller.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Stale {
    /// The Welcome's generation is below the highest the agent has seen.
    #[error(
        "controller welcomed with session generation {got} below the highest seen {highest}: a stale controller or a store restored from an older copy"
    )]
    Welcome {
        /// The Welcome's generation.
        got: u64,
        /// The highest the journal holds.
        highest: u64,
    },
    /// A push or cancel on another generation than its session's.
    #[error(
        "sent on session generation {got}, but this session was welcomed at generation {session} (the highest seen is {highest}): a stale controller; not acted on"
    )]
    Generation {
        /// The message's generation.
        got: u64,
        /// The session's.
        session: u64,
        /// The highest the journal holds.
        highest: u64,
    },
    /// A push or cancel on a session whose Welcome was refused.
    #[error(
        "sent on session generation {got} on a session whose welcome was refused (the highest generation seen is {highest}): a stale controller; not acted on"
    )]
    RefusedSession {
        /// The message's generation.
        got: u64,
        /// The highest the journal holds.
        highest: u64,
    },
    /// A push or cancel before its session was welcomed.
    #[error(
        "sent on session generation {got} before the session was welcomed (the highest generation seen is {highest}): not acted on"
    )]
    NotWelcomed {
        /// The message's generation.
        got: u64,
        /// The highest the journal holds.
        highest: u64,
    },
}

/// How a session's Welcome was decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Decided {
    /// Accepted at this generation, above the journal's: not acted on
    /// until the journal holds it ([`Fence::journalled`]).
    Raising(u64),
    /// Accepted at this generation (0: an unfenced controller).
    Accepted(u64),
    Refused,
}

/// What [`Fence::welcome`] decided.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub enum Welcomed {
    /// The session is the agent's controller. `raised`: its generation
    /// is above the highest seen, and must be journalled first.
    Accepted {
        /// The session's generation.
        generation: u64,
        /// Above the journal's: journal it before anything else.
        raised: bool,
    },
    /// A stale controller: drop the session, nothing of it is acted on.
    Refused(Stale),
}

/// The current session's fencing verdict (see the module docs).
#[derive(Debug, Default)]
pub struct Fence {
    /// The session whose Welcome was decided, and how.
    current: Option<(u64, Decided)>,
}

impl Fence {
    /// A new transport: nothing of `session` is acted on before its
    /// Welcome.
    pub fn connected(&mut self, session: u64) {
        let _ = session;
        self.current = None;
    }

    /// `session` ended.
    pub fn ended(&mut self, session: u64) {
        if self.current.is_some_and(|(s, _)| s == session) {
            self.current = None;
        }
    }

    /// The controller welcomed `session` at `generation`; `highest` is
    /// the journal's. `Accepted { raised: true }` must be journalled
    /// (durably) and said with [`Fence::journalled`] before the session is
    /// accepted: until then nothing of it is acted on or taken as contact,
    /// and a journal failure leaves it so.
    pub fn welcome(&mut self, session: u64, generation: u64, highest: u64) -> Welcomed {
        // 0 below a journalled generation is refused the same way: a
        // controller that stopped fencing may be a store restored from
        // before fencing.
        if generation < highest {
            self.current = Some((session, Decided::Refused));
            return Welcomed::Refused(Stale::Welcome {
                got: generation,
                highest,
            });
        }
        let raised = generation > highest;
        let decided = if raised {
            Decided::Raising(generation)
        } else {
            Decided::Accepted(generation)
        };
        self.current = Some((session, decided));
        Welcomed::Accepted { generation, raised }
    }

    /// The journal holds `generation`, which `session`'s Welcome raised:
    /// from now on the session is the agent's controller. `false`: not
    /// the welcome waiting for it (the session ended since).
    pub fn journalled(&mut self, session: u64, generation: u64) -> bool {
        if self.current == Some((session, Decided::Raising(generation))) {
            self.current = Some((session, Decided::Accepted(generation)));
            return true;
        }
        false
    }

    /// Whether a push or cancel of `session` sent on `generation` may be
    /// acted on: only on a welcomed session, at its generation, never
    /// below the journal's.
    pub fn check(&self, session: u64, generation: u64, highest: u64) -> Result<(), Stale> {
        match self.current {
            Some((s, Decided::Accepted(g))) if s == session => {
                if generation == g && generation >= highest {
                    Ok(())
                } else {
                    Err(Stale::Generation {
                        got: generation,
                        session: g,
                        highest,
                    })
                }
            }
            Some((s, Decided::Refused)) if s == session => Err(Stale::RefusedSession {
                got: generation,
                highest,
            }),
            _ => Err(Stale::NotWelcomed {
                got: generation,
                highest,
            }),
        }
    }

    /// Whether `session` was welcomed and accepted: only then are its
    /// messages contact (leases) and its acknowledgements taken.
    pub fn accepted(&self, session: u64) -> bool {
        matches!(self.current, Some((s, Decided::Accepted(_))) if s == session)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Welcome at 3, then a push at 2: refused, naming both generations
    /// and the fence; the session's own generation passes.
    #[test]
    fn a_push_below_its_sessions_generation_is_stale() {
        let mut f = Fence::default();
        f.connected(1);
        assert_eq!(
            f.check(1, 0, 0),
            Err(Stale::NotWelcomed { got: 0, highest: 0 }),
            "nothing before the Welcome"
        );
        assert_eq!(
            f.welcome(1, 3, 0),
            Welcomed::Accepted {
                generation: 3,
                raised: true
            },
            "to be journalled before any push"
        );
        assert!(!f.accepted(1), "not before the journal holds it");
        assert!(f.check(1, 3, 0).is_err());
        assert!(!f.journalled(1, 2), "another generation");
        assert!(f.journalled(1, 3));
        assert!(f.accepted(1));
        let e = f.check(1, 2, 3).expect_err("stale");
        assert_eq!(
            e,
            Stale::Generation {
                got: 2,
                session: 3,
                highest: 3
            }
        );
        let text = e.to_string();
        assert!(
            text.contains("generation 2") && text.contains("generation 3"),
            "{text}"
        );
        assert!(f.check(1, 4, 3).is_err(), "above is not it either");
        assert_eq!(f.check(1, 3, 3), Ok(()));
        // Another session's messages are not this one's.
        assert!(f.check(2, 3, 3).is_err());
        // A higher generation journalled since (another session of a
        // newer owner, then this one's message late): below it, refused.
        assert!(f.check(1, 3, 4).is_err());
        f.ended(1);
        assert!(!f.accepted(1));
        assert!(f.check(1, 3, 3).is_err(), "the session is over");
    }

    /// A journal at 3 (say, after a restart), then a Welcome at 2:
    /// refused, the push after it too; a later session at 3 is fine.
    #[test]
    fn a_welcome_below_the_journalled_generation_is_refused() {
        let mut f = Fence::default();
        f.connected(1);
        let w = f.welcome(1, 2, 3);
        let Welcomed::Refused(e) = w else {
            panic!("accepted: {w:?}")
        };
        assert_eq!(
            e.to_string(),
            "controller welcomed with session generation 2 below the highest seen 3: a stale controller or a store restored from an older copy"
        );
        assert!(!f.accepted(1), "not contact");
        assert_eq!(
            f.check(1, 2, 3),
            Err(Stale::RefusedSession { got: 2, highest: 3 })
        );
        // The same owner reconnecting at the journalled generation:
        // nothing to journal.
        f.connected(2);
        assert_eq!(
            f.welcome(2, 3, 3),
            Welcomed::Accepted {
                generation: 3,
                raised: false
            }
        );
    }

    /// A controller that does not fence (generation 0) is accepted while
    /// nothing higher was seen; once one was, 0 is refused like any lower
    /// generation.
    #[test]
    fn an_unfenced_controller_is_accepted_only_while_nothing_higher_was_seen() {
        let mut f = Fence::default();
        f.connected(1);
        assert_eq!(
            f.welcome(1, 0, 0),
            Welcomed::Accepted {
                generation: 0,
                raised: false
            },
            "nothing to journal"
        );
        assert_eq!(f.check(1, 0, 0), Ok(()), "its pushes carry 0");
        f.connected(2);
        assert!(matches!(
            f.welcome(2, 1, 0),
            Welcomed::Accepted { raised: true, .. }
        ));
        f.connected(3);
        assert_eq!(
            f.welcome(3, 0, 1),
            Welcomed::Refused(Stale::Welcome { got: 0, highest: 1 })
        );
        assert!(f.check(3, 0, 1).is_err());
    }
}
