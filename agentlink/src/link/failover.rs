//! Which controller address the link dials next, and how long it waits
//! first, sans IO.
//!
//! The agent may know several controllers (`controller: [URL, ...]`, a
//! repeated `--controller`), and a name may resolve to several addresses
//! (replicas behind one DNS name). The link's shell resolves every URL at
//! the start of each *round* and hands the addresses, in URL order, to a
//! [`Failover`]; it answers with the target to dial and the delay before
//! the attempt:
//!
//! - **an attempt that fails** (no connection, TLS refused, the stream
//!   refused — `UNAVAILABLE` or `RESOURCE_EXHAUSTED` from a replica that
//!   admits sessions at a bounded rate —, or a Welcome the agent refused)
//!   moves on to the next target at once, until every target of the list
//!   has failed in a row: then the round is over and the next attempt
//!   waits a [`Backoff`] delay (exponential, full jitter), which grows
//!   round after round. A fleet that lost its controllers does not hammer
//!   them: each agent tries each address once per round;
//! - **a stream that was up and ended** (the controller went away) moves on
//!   to the next target too, after a backoff delay: drawn under the base
//!   again when the stream had been up longer than `reset_after`, so one
//!   loss costs a fleet at most a jittered half second, and a controller
//!   that cuts streams right after opening them keeps growing the delay;
//! - past the last target the list starts over, resolved afresh.
//!
//! No clock, no RNG of its own: `now` and the RNG come in, so the
//! rotation and the backoff are tested with simulated time and a seeded
//! RNG.

use std::time::Duration;

use rand::Rng;

use super::backoff::{Backoff, BackoffConfig};

/// The next targets to dial (see the module docs).
#[derive(Clone, Debug)]
pub struct Failover<T> {
    backoff: Backoff,
    targets: Vec<T>,
    /// The target the next attempt dials.
    pos: usize,
    /// Attempts failed in a row since the last stream was up, or the last
    /// backoff: a whole list of them ends a round.
    failed_in_row: usize,
    /// Past the end of the list: resolve again before the next attempt.
    wrapped: bool,
    /// The soonest instant a target that refused an attempt of this round
    /// said to come back (`retry-after`), as a delay from that refusal.
    hint: Option<Duration>,
}

impl<T> Failover<T> {
    /// Nothing resolved yet: [`Failover::needs_targets`] is true.
    pub fn new(cfg: BackoffConfig) -> Self {
        Failover {
            backoff: Backoff::new(cfg),
            targets: Vec::new(),
            pos: 0,
            failed_in_row: 0,
            wrapped: true,
            hint: None,
        }
    }

    /// Whether the shell must resolve the controllers' addresses (at
    /// the start, and each time the list was gone through).
    pub fn needs_targets(&self) -> bool {
        self.wrapped
    }

    /// The addresses of this round, in order (empty: none resolved; the
    /// attempt then fails at once, see [`Failover::failed`]).
    pub fn set_targets(&mut self, targets: Vec<T>) {
        self.targets = targets;
        self.pos = 0;
        self.wrapped = false;
    }

    /// The target the next attempt dials (`None`: nothing resolved).
    pub fn current(&self) -> Option<&T> {
        self.targets.get(self.pos)
    }

    /// The stream to the current target came up at `now` (any monotonic
    /// scale, the same for every call): the round is a success.
    pub fn up(&mut self, now: Duration) {
        self.backoff.up(now);
        self.failed_in_row = 0;
        self.hint = None;
    }

    /// The attempt about to be reported [`Failover::failed`] was refused by
    /// a controller that said when to come back (a replica admitting
    /// sessions at a bounded rate hands out slots): if every target of the
    /// round fails, the round waits for the soonest such slot (and a
    /// little jitter) instead of a backoff delay, and the backoff does not
    /// grow. Capped at the backoff's cap.
    pub fn retry_after(&mut self, delay: Duration) {
        let delay = delay.min(self.backoff.cap());
        self.hint = Some(self.hint.map_or(delay, |h| h.min(delay)));
    }

    /// The attempt at the current target failed at `now` (no stream came
    /// up): the delay before the next attempt, at the next target — zero
    /// within a round, a backoff delay once every target failed in a row.
    pub fn failed<R: Rng + ?Sized>(&mut self, now: Duration, rng: &mut R) -> Duration {
        self.advance();
        self.failed_in_row += 1;
        if self.failed_in_row >= self.targets.len() {
            self.failed_in_row = 0;
            match self.hint.take() {
                // Up to a tenth more (at most a second): agents handed the
                // same slot do not all come back in the same instant.
                Some(h) => {
                    let spread = (h / 10).min(Duration::from_secs(1));
                    let max = u64::try_from(spread.as_nanos()).unwrap_or(u64::MAX);
                    h + Duration::from_nanos(rng.random_range(0..=max))
                }
                None => self.backoff.next_delay(now, rng),
            }
        } else {
            Duration::ZERO
        }
    }

    /// The stream that was up ended at `now`: the delay before the next
    /// attempt, at the next target (a backoff delay, reset when the stream
    /// was up long enough).
    pub fn ended<R: Rng + ?Sized>(&mut self, now: Duration, rng: &mut R) -> Duration {
        self.advance();
        self.failed_in_row = 0;
        self.backoff.next_delay(now, rng)
    }

    /// The ceiling the next backoff delay is drawn under.
    pub fn ceiling(&self) -> Duration {
        self.backoff.ceiling()
    }

    fn advance(&mut self) {
        self.pos += 1;
        if self.pos >= self.targets.len() {
            self.pos = 0;
            self.wrapped = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    const S: Duration = Duration::from_secs(1);

    fn cfg() -> BackoffConfig {
        BackoffConfig::default()
    }

    /// Dial the current target (resolving first when asked): what it is.
    fn dial(f: &mut Failover<&'static str>, list: &[&'static str]) -> Option<&'static str> {
        if f.needs_targets() {
            f.set_targets(list.to_vec());
        }
        f.current().copied()
    }

    /// Failures go through the list at once; the round's last failure
    /// waits a backoff delay, whose ceiling doubles per round.
    #[test]
    fn failures_rotate_at_once_and_back_off_after_a_whole_round() {
        let list = ["a1", "a2", "b1"];
        let mut f = Failover::new(cfg());
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut seen = Vec::new();
        let mut delays = Vec::new();
        let mut ceilings = Vec::new();
        for i in 0..9 {
            seen.push(dial(&mut f, &list).expect("a target"));
            ceilings.push(f.ceiling());
            delays.push(f.failed(S * i, &mut rng));
        }
        assert_eq!(seen, ["a1", "a2", "b1", "a1", "a2", "b1", "a1", "a2", "b1"]);
        for (i, d) in delays.iter().enumerate() {
            if i % 3 == 2 {
                assert!(
                    *d <= ceilings[i],
                    "round end {i}: {d:?} over {:?}",
                    ceilings[i]
                );
            } else {
                assert_eq!(*d, Duration::ZERO, "within a round, attempt {i}");
            }
        }
        // Half a second, then one, then two: one step per round.
        assert_eq!([ceilings[2], ceilings[5], ceilings[8]], [S / 2, S, 2 * S]);
        assert_eq!(f.ceiling(), 4 * S);
    }

    /// A round whose refusals said when to come back waits for the soonest
    /// slot (with at most a tenth more), and does not grow the backoff; a
    /// hint past the cap waits the cap; a stream up forgets the hint.
    #[test]
    fn a_refusal_with_a_slot_waits_for_it_instead_of_backing_off() {
        let list = ["dead", "busy-a", "busy-b"];
        let mut f = Failover::new(cfg());
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let before = f.ceiling();
        dial(&mut f, &list);
        assert_eq!(f.failed(S, &mut rng), Duration::ZERO);
        dial(&mut f, &list);
        f.retry_after(5 * S);
        assert_eq!(f.failed(S, &mut rng), Duration::ZERO);
        dial(&mut f, &list);
        f.retry_after(3 * S);
        let d = f.failed(S, &mut rng);
        assert!(d >= 3 * S && d <= 3 * S + 3 * S / 10, "{d:?}");
        assert_eq!(f.ceiling(), before, "the backoff did not grow");
        // The next round, without slots, backs off as usual.
        for _ in 0..2 {
            dial(&mut f, &list);
            assert_eq!(f.failed(2 * S, &mut rng), Duration::ZERO);
        }
        dial(&mut f, &list);
        assert!(f.failed(2 * S, &mut rng) <= before);
        assert_eq!(f.ceiling(), 2 * before);
        // Past the cap: the cap (and its tenth, at most a second).
        let mut g = Failover::new(cfg());
        dial(&mut g, &["one"]);
        g.retry_after(3600 * S);
        let d = g.failed(S, &mut rng);
        assert!(d >= 30 * S && d <= 31 * S, "{d:?}");
        // Up: the hint is gone.
        dial(&mut g, &["one"]);
        g.retry_after(7 * S);
        g.up(2 * S);
        dial(&mut g, &["one"]);
        assert!(g.failed(3 * S, &mut rng) <= S / 2);
    }

    /// A lost stream moves on to the next target after a jittered delay;
    /// a stream up for longer than `reset_after` starts the backoff over,
    /// and the failures that follow count a new round from there.
    #[test]
    fn a_lost_stream_moves_on_and_a_long_one_resets_the_backoff() {
        let list = ["a", "b"];
        let mut f = Failover::new(cfg());
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        // Two bad rounds: the ceiling is up to 2 s.
        for i in 0..4 {
            dial(&mut f, &list);
            let _ = f.failed(S * i, &mut rng);
        }
        assert_eq!(f.ceiling(), 2 * S);
        assert_eq!(dial(&mut f, &list), Some("a"));
        f.up(10 * S);
        // Up for 100 s, then lost: the delay is drawn under the base
        // again, and the next attempt is the other controller.
        let d = f.ended(110 * S, &mut rng);
        assert!(d <= S / 2, "{d:?}");
        assert_eq!(dial(&mut f, &list), Some("b"));
        assert_eq!(f.ceiling(), S);
        // b fails: not yet a whole round (a has not failed since).
        assert_eq!(f.failed(111 * S, &mut rng), Duration::ZERO);
        assert_eq!(dial(&mut f, &list), Some("a"));
        let d = f.failed(112 * S, &mut rng);
        assert!(d <= S, "round over: drawn under 1 s, {d:?}");
        // A stream cut right after it opened keeps growing the delay.
        assert_eq!(dial(&mut f, &list), Some("b"));
        f.up(113 * S);
        let _ = f.ended(113 * S, &mut rng);
        assert_eq!(f.ceiling(), 4 * S);
        assert_eq!(dial(&mut f, &list), Some("a"));
    }

    /// The list is resolved again each time it was gone through, and may
    /// change; nothing resolved is a failed round (backoff), resolved again
    /// next time.
    #[test]
    fn the_list_is_resolved_again_after_each_pass_and_may_be_empty() {
        let mut f: Failover<&str> = Failover::new(cfg());
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        assert!(f.needs_targets());
        f.set_targets(vec![]);
        assert_eq!(f.current(), None);
        let d = f.failed(S, &mut rng);
        assert!(d <= S / 2);
        assert_eq!(f.ceiling(), S, "a failed round");
        assert!(f.needs_targets(), "resolved again");
        f.set_targets(vec!["x", "y"]);
        assert!(!f.needs_targets());
        assert_eq!(f.current(), Some(&"x"));
        assert_eq!(f.failed(2 * S, &mut rng), Duration::ZERO);
        assert!(!f.needs_targets(), "mid-list");
        assert_eq!(f.current(), Some(&"y"));
        let _ = f.failed(3 * S, &mut rng);
        assert!(f.needs_targets(), "past the end");
        f.set_targets(vec!["z"]);
        assert_eq!(f.current(), Some(&"z"));
    }

    /// One controller at one address behaves as the link always did: every
    /// failure backs off, growing; the same seed gives the same delays.
    #[test]
    fn a_single_target_backs_off_on_every_failure_deterministically() {
        let run = || {
            let mut f = Failover::new(cfg());
            let mut rng = ChaCha8Rng::seed_from_u64(9);
            (0..6u32)
                .map(|i| {
                    dial(&mut f, &["only"]);
                    (f.ceiling(), f.failed(S * i, &mut rng))
                })
                .collect::<Vec<_>>()
        };
        let got = run();
        assert_eq!(got, run(), "seeded: deterministic");
        let ceilings: Vec<u128> = got.iter().map(|(c, _)| c.as_millis()).collect();
        assert_eq!(ceilings, [500, 1000, 2000, 4000, 8000, 16000]);
        assert!(got.iter().all(|(c, d)| d <= c));
    }

    proptest::proptest! {
        /// Whatever happens, every target of a round is tried before a
        /// backoff delay, and no delay exceeds the cap.
        #[test]
        fn each_target_is_tried_once_per_round(
            seed: u64,
            n in 1usize..5,
            events in proptest::collection::vec(0u8..3, 1..80),
        ) {
            let list: Vec<usize> = (0..n).collect();
            let mut f = Failover::new(cfg());
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let mut now = Duration::ZERO;
            let mut tried_since_backoff = std::collections::HashSet::new();
            for e in events {
                if f.needs_targets() {
                    f.set_targets(list.clone());
                }
                let t = *f.current().expect("a target");
                let d = if e == 0 {
                    f.up(now);
                    now += 5 * S;
                    tried_since_backoff.clear();
                    f.ended(now, &mut rng)
                } else {
                    proptest::prop_assert!(tried_since_backoff.insert(t), "{} twice in a round", t);
                    let d = f.failed(now, &mut rng);
                    if d > Duration::ZERO || tried_since_backoff.len() == n {
                        tried_since_backoff.clear();
                    }
                    d
                };
                proptest::prop_assert!(d <= cfg().cap);
                now += d;
            }
        }
    }
}
