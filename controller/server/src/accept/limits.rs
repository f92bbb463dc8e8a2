//! The accept loop's decisions, without sockets or clocks (the shell in
//! [`super`] feeds them addresses, errors and `now`):
//!
//! - [`HandshakeBudget`]: which TLS handshake may start, and how long those
//!   in progress may take. A source is an IPv4 address or an IPv6 /64 (one
//!   host commonly holds a whole /64); each has a share of
//!   [`HandshakeLimits::per_source`], and once the budget is *crowded*
//!   (three quarters in use) only sources with fewer than
//!   [`CROWDED_PER_SOURCE`] in progress may take the rest, and every
//!   handshake in progress gets the shorter
//!   [`HandshakeLimits::crowded_timeout`] (for good: the budget uncrowds as
//!   soon as the first of a flood's handshakes time out, and the rest must
//!   not get the long timeout back). With the defaults (256, 16 per
//!   source) filling the budget takes at least 44 sources — 12 to fill the
//!   first 192 at 16 each, 32 more for the last 64 at 2 each — and even
//!   then each slot is held for 3 s at most;
//! - [`AcceptBackoff`]: after a failed `accept` (out of file descriptors,
//!   ...) how long to wait before the next, and whether this failure starts
//!   an episode worth a log line;
//! - [`Throttle`]: one log line per interval for an event that repeats
//!   (refusals under a flood), with the count since the last.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

/// Once the budget is crowded, a source may start a handshake only while it
/// has fewer than this many in progress.
pub const CROWDED_PER_SOURCE: usize = 2;

/// Who shares a handshake allowance: an IPv4 address (IPv4-mapped IPv6
/// addresses included: a listener on `[::]` sees IPv4 clients that way), or
/// an IPv6 /64.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// One IPv4 address.
    V4(Ipv4Addr),
    /// The upper 64 bits of an IPv6 address.
    V6(u64),
}

impl Source {
    /// The source `ip` belongs to.
    pub fn of(ip: IpAddr) -> Source {
        match ip {
            IpAddr::V4(a) => Source::V4(a),
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(v4) => Source::V4(v4),
                None => Source::V6((u128::from(a) >> 64) as u64),
            },
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::V4(a) => write!(f, "{a}"),
            Source::V6(net) => write!(f, "{}/64", Ipv6Addr::from(u128::from(*net) << 64)),
        }
    }
}

/// How many TLS handshakes may be in progress, and for how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HandshakeLimits {
    /// At once, over all sources (`serve --max-handshakes`).
    pub total: usize,
    /// At once from one source (`serve --max-handshakes-per-source`).
    pub per_source: usize,
    /// A handshake not done by then is dropped (`--tls-handshake-timeout`).
    pub timeout: Duration,
    /// The same while the budget is crowded, for every handshake in
    /// progress (`--tls-handshake-timeout-crowded`).
    pub crowded_timeout: Duration,
}

impl Default for HandshakeLimits {
    /// 256 at once, 16 per source, 10 s, 3 s when crowded.
    fn default() -> HandshakeLimits {
        HandshakeLimits {
            total: 256,
            per_source: 16,
            timeout: Duration::from_secs(10),
            crowded_timeout: Duration::from_secs(3),
        }
    }
}

impl HandshakeLimits {
    /// In use from this many on, the budget is crowded: three quarters.
    pub fn crowded_at(&self) -> usize {
        self.total - self.total / 4
    }

    /// How long a handshake may take from its start: `crowded` if the
    /// budget has been crowded at any moment since.
    pub fn timeout(&self, crowded: bool) -> Duration {
        if crowded {
            self.crowded_timeout.min(self.timeout)
        } else {
            self.timeout
        }
    }

    /// Whether these limits make sense; the message names the setting.
    pub fn check(&self) -> Result<(), String> {
        if self.total == 0 {
            return Err("--max-handshakes must be at least 1".into());
        }
        if self.per_source == 0 || self.per_source > self.total {
            return Err(format!(
                "--max-handshakes-per-source must be from 1 to --max-handshakes ({})",
                self.total
            ));
        }
        if self.timeout.is_zero() || self.crowded_timeout.is_zero() {
            return Err(
                "--tls-handshake-timeout and --tls-handshake-timeout-crowded must be > 0".into(),
            );
        }
        Ok(())
    }
}

/// Why a handshake may not start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandshakeRefusal {
    /// Every slot is taken.
    Full {
        /// The budget.
        total: usize,
    },
    /// This source holds its share.
    Source {
        /// Who.
        source: Source,
        /// Its share.
        limit: usize,
    },
    /// The budget is crowded and this source already has
    /// [`CROWDED_PER_SOURCE`] in progress.
    Crowded {
        /// Who.
        source: Source,
        /// In progress overall.
        in_use: usize,
        /// The budget.
        total: usize,
    },
}

impl fmt::Display for HandshakeRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandshakeRefusal::Full { total } => {
                write!(f, "all {total} TLS handshake slots are in use")
            }
            HandshakeRefusal::Source { source, limit } => write!(
                f,
                "{limit} TLS handshakes in progress from {source} (its share)"
            ),
            HandshakeRefusal::Crowded {
                source,
                in_use,
                total,
            } => write!(
                f,
                "{in_use} of {total} TLS handshake slots in use, {CROWDED_PER_SOURCE} of them from {source} (the share of each source when crowded)"
            ),
        }
    }
}

/// TLS handshakes in progress, by source.
#[derive(Debug)]
pub struct HandshakeBudget {
    limits: HandshakeLimits,
    in_use: usize,
    by_source: HashMap<Source, usize>,
}

impl HandshakeBudget {
    /// Empty.
    pub fn new(limits: HandshakeLimits) -> HandshakeBudget {
        HandshakeBudget {
            limits,
            in_use: 0,
            by_source: HashMap::new(),
        }
    }

    /// A slot for a handshake from `ip`; give it back with
    /// [`HandshakeBudget::leave`].
    pub fn try_enter(&mut self, ip: IpAddr) -> Result<Source, HandshakeRefusal> {
        let source = Source::of(ip);
        let total = self.limits.total;
        if self.in_use >= total {
            return Err(HandshakeRefusal::Full { total });
        }
        let n = self.by_source.get(&source).copied().unwrap_or(0);
        if n >= self.limits.per_source {
            return Err(HandshakeRefusal::Source {
                source,
                limit: self.limits.per_source,
            });
        }
        if self.crowded() && n >= CROWDED_PER_SOURCE {
            return Err(HandshakeRefusal::Crowded {
                source,
                in_use: self.in_use,
                total,
            });
        }
        *self.by_source.entry(source).or_insert(0) += 1;
        self.in_use += 1;
        Ok(source)
    }

    /// A handshake of `source` ended (done, failed or timed out).
    pub fn leave(&mut self, source: Source) {
        if let Some(n) = self.by_source.get_mut(&source) {
            *n -= 1;
            if *n == 0 {
                self.by_source.remove(&source);
            }
            self.in_use -= 1;
        } else {
            debug_assert!(false, "leave without enter: {source}");
        }
    }

    /// Three quarters or more in use.
    pub fn crowded(&self) -> bool {
        self.in_use >= self.limits.crowded_at()
    }

    /// In progress overall.
    pub fn in_use(&self) -> usize {
        self.in_use
    }

    /// In progress from `source`.
    pub fn from_source(&self, source: Source) -> usize {
        self.by_source.get(&source).copied().unwrap_or(0)
    }

    /// Sources with a handshake in progress.
    pub fn sources(&self) -> usize {
        self.by_source.len()
    }
}

/// What a failed `accept` says about the listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AcceptFailure {
    /// The process or the system is out of something (file descriptors,
    /// memory, buffers): every accept fails until that changes.
    Exhausted,
    /// One connection died in the backlog (reset, aborted, refused by a
    /// filter): the next accept is unaffected. A peer can cause these at
    /// will, so they never slow the loop down.
    Connection,
    /// Anything else: treated like [`AcceptFailure::Exhausted`].
    Other,
}

impl AcceptFailure {
    /// Sort an accept error.
    pub fn of(e: &std::io::Error) -> AcceptFailure {
        use std::io::ErrorKind as K;
        match e.raw_os_error() {
            Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM) => {
                return AcceptFailure::Exhausted;
            }
            Some(libc::ECONNABORTED | libc::ECONNRESET | libc::EPROTO | libc::EPERM) => {
                return AcceptFailure::Connection;
            }
            _ => {}
        }
        match e.kind() {
            K::ConnectionAborted | K::ConnectionReset | K::Interrupted => AcceptFailure::Connection,
            K::OutOfMemory => AcceptFailure::Exhausted,
            _ => AcceptFailure::Other,
        }
    }
}

/// What to do after a failed accept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub struct AfterFailure {
    /// Wait this long before the next accept.
    pub wait: Duration,
    /// This failure starts an episode: log it (the rest are counted only).
    pub log: bool,
}

/// A run of failed accepts, reported when accepts succeed again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Episode {
    /// Failed accepts in it.
    pub failures: u64,
    /// From its first failure to the accept that ended it.
    pub lasted: Duration,
}

/// Backoff between failed accepts: a wait that doubles from `first` up to
/// `max` while accepts fail, back to `first` at the next success.
#[derive(Debug)]
pub struct AcceptBackoff {
    first: Duration,
    max: Duration,
    next: Duration,
    episode: Option<(Instant, u64)>,
}

impl AcceptBackoff {
    /// Doubling from `first` up to `max`.
    pub fn new(first: Duration, max: Duration) -> AcceptBackoff {
        AcceptBackoff {
            first,
            max,
            next: first,
            episode: None,
        }
    }

    /// An accept failed at `now`.
    pub fn failed(&mut self, kind: AcceptFailure, now: Instant) -> AfterFailure {
        if kind == AcceptFailure::Connection {
            return AfterFailure {
                wait: Duration::ZERO,
                log: false,
            };
        }
        let log = match &mut self.episode {
            Some((_, n)) => {
                *n += 1;
                false
            }
            None => {
                self.episode = Some((now, 1));
                true
            }
        };
        let wait = self.next;
        self.next = (self.next * 2).min(self.max);
        AfterFailure { wait, log }
    }

    /// An accept succeeded at `now`: the episode it ends, if any.
    pub fn accepted(&mut self, now: Instant) -> Option<Episode> {
        self.next = self.first;
        self.episode.take().map(|(since, failures)| Episode {
            failures,
            lasted: now.saturating_duration_since(since),
        })
    }
}

/// An event that may repeat many times a second (a refusal under a flood),
/// logged at most once per `every`: the first at once, then one line with
/// the count since.
#[derive(Debug)]
pub struct Throttle {
    every: Duration,
    last: Option<Instant>,
    pending: u64,
}

impl Throttle {
    /// At most one line per `every`.
    pub fn new(every: Duration) -> Throttle {
        Throttle {
            every,
            last: None,
            pending: 0,
        }
    }

    /// The event happened at `now`: `Some(n)` if a line is due, `n` events
    /// since the last line (this one included).
    pub fn hit(&mut self, now: Instant) -> Option<u64> {
        self.pending += 1;
        let due = self
            .last
            .is_none_or(|t| now.saturating_duration_since(t) >= self.every);
        if !due {
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.pending))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    fn limits(total: usize, per_source: usize) -> HandshakeLimits {
        HandshakeLimits {
            total,
            per_source,
            ..HandshakeLimits::default()
        }
    }

    #[test]
    fn sources_are_ipv4_addresses_and_ipv6_slash_64s() {
        assert_eq!(Source::of(ip("10.0.0.1")), Source::of(ip("10.0.0.1")));
        assert_ne!(Source::of(ip("10.0.0.1")), Source::of(ip("10.0.0.2")));
        // One /64, however many addresses.
        let a = Source::of(ip("2001:db8:1:2::1"));
        assert_eq!(a, Source::of(ip("2001:db8:1:2:ffff:ffff:ffff:ffff")));
        assert_ne!(a, Source::of(ip("2001:db8:1:3::1")));
        assert_eq!(a.to_string(), "2001:db8:1:2::/64");
        // IPv4 clients of a [::] listener are IPv4 sources, not one /64.
        assert_eq!(
            Source::of(ip("::ffff:10.0.0.1")),
            Source::of(ip("10.0.0.1"))
        );
        assert_ne!(
            Source::of(ip("::ffff:10.0.0.1")),
            Source::of(ip("::ffff:10.0.0.2"))
        );
    }

    #[test]
    fn a_source_gets_its_share_and_others_are_unaffected() {
        let mut b = HandshakeBudget::new(limits(256, 16));
        let a = ip("10.0.0.1");
        for _ in 0..16 {
            b.try_enter(a).expect("within its share");
        }
        assert_eq!(
            b.try_enter(a),
            Err(HandshakeRefusal::Source {
                source: Source::of(a),
                limit: 16
            })
        );
        // Another address of the same /64 is the same source.
        let v6 = ip("2001:db8::1");
        for _ in 0..16 {
            b.try_enter(v6).expect("v6");
        }
        assert!(b.try_enter(ip("2001:db8::2")).is_err());
        b.try_enter(ip("10.0.0.2")).expect("another address");
        b.leave(Source::of(a));
        assert_eq!(b.from_source(Source::of(a)), 15);
        b.try_enter(a).expect("a slot came back");
    }

    /// The flood: 300 silent handshakes from five addresses leave
    /// most of the budget to everyone else.
    #[test]
    fn five_hosts_cannot_fill_the_budget() {
        let mut b = HandshakeBudget::new(HandshakeLimits::default());
        let mut taken = 0;
        for i in 0..300 {
            if b.try_enter(ip(&format!("127.0.0.{}", 2 + i % 5))).is_ok() {
                taken += 1;
            }
        }
        assert_eq!(taken, 80);
        assert!(!b.crowded());
        b.try_enter(ip("127.0.0.1")).expect("the operator gets in");
    }

    /// How many sources it takes to fill the default budget, whatever the
    /// order they come in: at least 44.
    #[test]
    fn filling_the_budget_takes_many_sources() {
        let l = HandshakeLimits::default();
        let mut b = HandshakeBudget::new(l);
        let mut source = 0u32;
        // Greedy: each source takes all it can.
        while b.in_use() < l.total {
            source += 1;
            let a = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + source));
            while b.try_enter(a).is_ok() {}
        }
        assert_eq!(source, 12 + 32);
        assert_eq!(b.sources(), 44);
        assert_eq!(
            b.try_enter(ip("192.0.2.1")),
            Err(HandshakeRefusal::Full { total: 256 })
        );

        // Crowded: a newcomer gets in while a busy source does not.
        let mut b = HandshakeBudget::new(l);
        for i in 0..12 {
            let a = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i));
            for _ in 0..16 {
                b.try_enter(a).expect("share");
            }
        }
        assert_eq!(b.in_use(), 192);
        assert!(b.crowded());
        let busy = ip("10.0.0.0");
        assert!(matches!(
            b.try_enter(busy),
            Err(HandshakeRefusal::Source { .. })
        ));
        let other = ip("10.1.0.1");
        b.try_enter(other).expect("one");
        b.try_enter(other).expect("two");
        assert!(matches!(
            b.try_enter(other),
            Err(HandshakeRefusal::Crowded { in_use: 194, .. })
        ));
        b.try_enter(ip("192.0.2.7")).expect("a newcomer");
        // Below three quarters again: shares are back.
        for _ in 0..3 {
            b.leave(Source::of(busy));
        }
        b.leave(Source::of(other));
        assert!(!b.crowded());
        b.try_enter(other).expect("not crowded");
    }

    #[test]
    fn the_timeout_is_shorter_when_crowded() {
        let l = HandshakeLimits::default();
        assert_eq!(l.timeout(false), Duration::from_secs(10));
        assert_eq!(l.timeout(true), Duration::from_secs(3));
        let short = HandshakeLimits {
            timeout: Duration::from_secs(1),
            ..l
        };
        assert_eq!(short.timeout(true), Duration::from_secs(1), "never longer");
        assert_eq!(l.crowded_at(), 192);
        assert!(l.check().is_ok());
        assert!(limits(8, 9).check().is_err());
        assert!(limits(0, 0).check().is_err());
    }

    #[test]
    fn accept_failures_back_off_and_log_once_per_episode() {
        let mut b = AcceptBackoff::new(Duration::from_millis(10), Duration::from_secs(1));
        let t0 = Instant::now();
        let s = b.failed(AcceptFailure::Exhausted, t0);
        assert_eq!(
            s,
            AfterFailure {
                wait: Duration::from_millis(10),
                log: true
            }
        );
        let waits: Vec<u64> = (1..10)
            .map(|i| {
                let s = b.failed(AcceptFailure::Exhausted, t0 + Duration::from_millis(i));
                assert!(!s.log, "logged again");
                s.wait.as_millis() as u64
            })
            .collect();
        assert_eq!(waits, [20, 40, 80, 160, 320, 640, 1000, 1000, 1000]);
        // A connection that died in the backlog neither waits nor logs.
        assert_eq!(
            b.failed(AcceptFailure::Connection, t0),
            AfterFailure {
                wait: Duration::ZERO,
                log: false
            }
        );
        let e = b.accepted(t0 + Duration::from_secs(4)).expect("episode");
        assert_eq!(
            e,
            Episode {
                failures: 10,
                lasted: Duration::from_secs(4)
            }
        );
        assert!(b.accepted(t0 + Duration::from_secs(5)).is_none());
        // Reset: the next episode starts short and is logged.
        let s = b.failed(AcceptFailure::Other, t0 + Duration::from_secs(6));
        assert_eq!(s.wait, Duration::from_millis(10));
        assert!(s.log);
    }

    #[test]
    fn accept_errors_are_sorted() {
        let os = std::io::Error::from_raw_os_error;
        assert_eq!(
            AcceptFailure::of(&os(libc::EMFILE)),
            AcceptFailure::Exhausted
        );
        assert_eq!(
            AcceptFailure::of(&os(libc::ENFILE)),
            AcceptFailure::Exhausted
        );
        assert_eq!(
            AcceptFailure::of(&os(libc::ENOBUFS)),
            AcceptFailure::Exhausted
        );
        assert_eq!(
            AcceptFailure::of(&os(libc::ECONNABORTED)),
            AcceptFailure::Connection
        );
        assert_eq!(AcceptFailure::of(&os(libc::EINVAL)), AcceptFailure::Other);
    }

    #[test]
    fn throttled_lines_carry_the_count() {
        let mut t = Throttle::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(t.hit(t0), Some(1));
        for i in 1..100 {
            assert_eq!(t.hit(t0 + Duration::from_millis(i)), None);
        }
        assert_eq!(t.hit(t0 + Duration::from_secs(10)), Some(100));
        assert_eq!(t.hit(t0 + Duration::from_secs(11)), None);
    }
}
