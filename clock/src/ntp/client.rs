//! The NTP client's decisions, without sockets or clocks (sans-IO): when
//! to ask which server, what to send, what a reply means, and which
//! measurement becomes a [`Sample`]. The shell in `mod.rs` does the IO and
//! passes the time in, so tests drive this with simulated time.
//!
//! Per server: a burst of requests a couple of seconds apart at start (and
//! after the server was unreachable) so the first estimates come quickly,
//! then a poll interval that doubles from `min_poll` up to `max_poll` while
//! replies keep coming. A kiss-o'-death RATE doubles the interval (and it
//! never shrinks back below that); DENY or RSTR stops polling that server.

use std::time::Duration;

use rand::RngCore;
use rand::rngs::StdRng;

use super::super::MonoTime;
use super::super::sample::{Sample, SourceKind};
use super::filter::{Filter, Measurement, distance_at, truechimers};
use super::packet::{
    HEADER_LEN, LEAP_UNSYNCHRONISED, MODE_SERVER, Packet, short_to_ns, timestamp_to_unix_ns,
};

/// How the client paces its requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NtpConfig {
    /// Requests in the burst at start and after a server came back (≥ 1).
    pub burst: u32,
    /// Between burst requests. 2 s, not 1: ntpd's default rate limit
    /// (`discard minimum 1`) answers requests closer than 2 s with a RATE
    /// kiss, and public servers run it.
    pub burst_spacing: Duration,
    /// The first poll interval after the burst.
    pub min_poll: Duration,
    /// The interval grows up to this while replies keep coming.
    pub max_poll: Duration,
}

impl Default for NtpConfig {
    fn default() -> Self {
        NtpConfig {
            burst: 6,
            burst_spacing: Duration::from_secs(2),
            min_poll: Duration::from_secs(16),
            max_poll: Duration::from_secs(64),
        }
    }
}

/// Good replies in a row at one interval before it doubles.
pub const GROW_AFTER: u32 = 4;
/// Polls in a row without a reply before a server is unreachable.
pub const UNREACHABLE_AFTER: u32 = 4;
/// Longest interval a RATE kiss can push a server to (ntpd's maxpoll 17
/// would be 36 h; 1024 s is ntpd's default maxpoll).
pub const MAX_BACKOFF: Duration = Duration::from_secs(1024);
/// Root distance (root delay / 2 + root dispersion) above which a server
/// is not worth listening to (RFC 5905's MAXDIST).
pub const MAX_ROOT_DISTANCE_NS: i64 = 1_500_000_000;
/// Added to every error bound: reading `CLOCK_MONOTONIC` around the
/// socket calls and the rounding of the timestamps.
pub const LOCAL_ERROR_NS: i64 = 1_000;

fn ns(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// What the shell must do next. Returned one at a time by
/// [`NtpClient::poll`] until it returns `None`.
#[must_use]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Send `packet` to server `server`; read `CLOCK_MONOTONIC` just before
    /// sending and report it with [`NtpClient::sent`].
    Send {
        /// Index into the server list.
        server: usize,
        /// The request.
        packet: [u8; HEADER_LEN],
    },
    /// Server `server` stopped answering ([`UNREACHABLE_AFTER`] polls in a
    /// row); said once until it answers again.
    Unreachable {
        /// Index into the server list.
        server: usize,
    },
}

/// Why a datagram was not used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Reject {
    /// Shorter than an NTP header.
    #[error("shorter than an NTP header")]
    Malformed,
    /// No request to this server is waiting for a reply.
    #[error("no request in flight")]
    Unsolicited,
    /// The origin timestamp is not the nonce we sent: a stale reply to an
    /// earlier request, or a spoofed one.
    #[error("origin timestamp does not match the request (stale or spoofed)")]
    OriginMismatch,
    /// Not a server-mode reply of version 3 or 4.
    #[error("not an NTPv3/v4 server reply")]
    NotAServerReply,
    /// Leap indicator 3 or stratum 16+: the server has no time to give.
    #[error("the server is not synchronised")]
    Unsynchronised,
    /// Receive or transmit timestamp zero, or the reply left before the
    /// request arrived.
    #[error("the server's timestamps are missing or out of order")]
    BadTimestamps,
    /// Root distance above [`MAX_ROOT_DISTANCE_NS`].
    #[error("the server's root distance is too large")]
    RootDistance,
}

/// What a kiss-o'-death made the client do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KissEffect {
    /// RATE: the poll interval doubled to `interval`.
    BackedOff {
        /// The new interval.
        interval: Duration,
    },
    /// DENY or RSTR: this server is not polled again.
    Stopped,
    /// Another code: the reply is ignored.
    Ignored,
}

/// What a datagram from a server amounted to.
#[must_use]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Received {
    /// A good measurement. `sample` is the one to hand the estimator, if
    /// the combined choice moved to a measurement not handed over before.
    Measured {
        /// This exchange.
        measurement: Measurement,
        /// Whether the clock filter kept it (false: a delay outlier).
        kept: bool,
        /// The new combined sample, if any.
        sample: Option<Sample>,
    },
    /// A kiss-o'-death with its ASCII code.
    Kiss {
        /// The code (`RATE`, `DENY`, …).
        code: [u8; 4],
        /// What the client did about it.
        effect: KissEffect,
    },
    /// Not used.
    Rejected(Reject),
}

#[derive(Clone, Copy, Debug)]
struct InFlight {
    nonce: u64,
    t1: Option<MonoTime>,
    /// Sent as part of a burst: its reply does not count towards growing
    /// the interval.
    burst: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reach {
    /// No reply yet, and not yet given up on.
    Unknown,
    Reachable,
    Unreachable,
}

#[derive(Clone, Debug)]
struct Server {
    next_poll: MonoTime,
    interval_ns: i64,
    burst_left: u32,
    good_in_row: u32,
    misses_in_row: u32,
    reach: Reach,
    stopped: bool,
    in_flight: Option<InFlight>,
    filter: Filter,
    /// The newest measurement handed over as a sample; never again one
    /// older or equal (RFC 5905: a sample is used once).
    last_used: Option<MonoTime>,
}

/// The client core for a fixed list of servers (indices 0..n).
#[derive(Debug)]
pub struct NtpClient {
    config: NtpConfig,
    servers: Vec<Server>,
    rng: StdRng,
}

impl NtpClient {
    /// A client for `servers` servers, all due at `now`. `rng` makes the
    /// request nonces: seeded from the OS in the shell (a spoofer must not
    /// guess them), from a fixed seed in tests.
    pub fn new(servers: usize, config: NtpConfig, now: MonoTime, rng: StdRng) -> Self {
        let config = NtpConfig {
            burst: config.burst.max(1),
            max_poll: config.max_poll.max(config.min_poll),
            ..config
        };
        let server = Server {
            next_poll: now,
            interval_ns: ns(config.min_poll),
            burst_left: config.burst - 1,
            good_in_row: 0,
            misses_in_row: 0,
            reach: Reach::Unknown,
            stopped: false,
            in_flight: None,
            filter: Filter::default(),
            last_used: None,
        };
        NtpClient {
            config,
            servers: vec![server; servers],
            rng,
        }
    }

    /// When [`poll`](Self::poll) has something to do next; `None` when no
    /// server is polled any more.
    pub fn next_wake(&self) -> Option<MonoTime> {
        self.servers
            .iter()
            .filter(|s| !s.stopped)
            .map(|s| s.next_poll)
            .min()
    }

    /// The current poll interval of `server` (after its burst).
    pub fn interval(&self, server: usize) -> Option<Duration> {
        let s = self.servers.get(server)?;
        Some(Duration::from_nanos(s.interval_ns.max(0) as u64))
    }

    /// The next thing to do at `now`; call until `None`.
    pub fn poll(&mut self, now: MonoTime) -> Option<Action> {
        let spacing = ns(self.config.burst_spacing);
        let max_poll = ns(self.config.max_poll);
        for (i, s) in self.servers.iter_mut().enumerate() {
            if s.stopped || now < s.next_poll {
                continue;
            }
            if s.in_flight.take().is_some() {
                s.misses_in_row += 1;
                s.good_in_row = 0;
                if s.misses_in_row >= UNREACHABLE_AFTER && s.reach != Reach::Unreachable {
                    s.reach = Reach::Unreachable;
                    s.filter.clear();
                    s.burst_left = 0;
                    s.interval_ns = s.interval_ns.max(max_poll);
                    return Some(Action::Unreachable { server: i });
                }
            }
            let burst = s.burst_left > 0;
            let wait = if burst {
                s.burst_left -= 1;
                spacing
            } else {
                s.interval_ns
            };
            s.next_poll = now.add_nanos(wait);
            let nonce = self.rng.next_u64();
            s.in_flight = Some(InFlight {
                nonce,
                t1: None,
                burst,
            });
            let poll = log2_s(s.interval_ns);
            return Some(Action::Send {
                server: i,
                packet: Packet::request(nonce, poll).encode(),
            });
        }
        None
    }

    /// The request to `server` left at `t1` (read just before sending).
    pub fn sent(&mut self, server: usize, t1: MonoTime) {
        if let Some(f) = self
            .servers
            .get_mut(server)
            .and_then(|s| s.in_flight.as_mut())
        {
            f.t1 = Some(t1);
        }
    }

    /// A datagram `bytes` from `server`, received at `t4` (read just
    /// after receiving). Never panics, whatever the bytes.
    pub fn receive(&mut self, server: usize, bytes: &[u8], t4: MonoTime) -> Received {
        match self.receive_inner(server, bytes, t4) {
            Ok(r) => r,
            Err(e) => Received::Rejected(e),
        }
    }

    fn receive_inner(
        &mut self,
        server: usize,
        bytes: &[u8],
        t4: MonoTime,
    ) -> Result<Received, Reject> {
        let p = Packet::decode(bytes).map_err(|_| Reject::Malformed)?;
        let config = self.config;
        let s = self.servers.get_mut(server).ok_or(Reject::Unsolicited)?;
        let f = s.in_flight.ok_or(Reject::Unsolicited)?;
        if p.origin_ts != f.nonce {
            // Keep waiting: the genuine reply may still come.
            return Err(Reject::OriginMismatch);
        }
        s.in_flight = None;
        let t1 = f.t1.ok_or(Reject::Unsolicited)?;
        if p.mode != MODE_SERVER || !(3..=4).contains(&p.version) {
            return Err(Reject::NotAServerReply);
        }
        // It answered, whatever it said.
        s.misses_in_row = 0;
        if p.stratum == 0 {
            return Ok(Received::Kiss {
                code: p.reference_id,
                effect: kiss(s, &p, t4),
            });
        }
        let measurement = measure(&p, t1, t4)?;
        answered(s, &config, f.burst, t4);
        s.reach = Reach::Reachable;
        let kept = s.filter.push(measurement);
        let sample = self.combine(measurement.at);
        Ok(Received::Measured {
            measurement,
            kept,
            sample,
        })
    }

    /// The best measurement among the servers that agree, as a sample, if
    /// it was not handed over before.
    fn combine(&mut self, now: MonoTime) -> Option<Sample> {
        let cands: Vec<(usize, Measurement)> = self
            .servers
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.stopped)
            .filter_map(|(i, s)| s.filter.best().map(|m| (i, m)))
            .collect();
        let (server, m) = truechimers(&cands, now)
            .into_iter()
            .map(|k| cands[k])
            .min_by_key(|(_, m)| distance_at(m, now))?;
        let s = &mut self.servers[server];
        if s.last_used.is_some_and(|u| m.at <= u) {
            return None;
        }
        s.last_used = Some(m.at);
        Some(Sample {
            source: SourceKind::Ntp,
            at: m.at,
            offset_ns: m.offset_ns,
            error_ns: m.error_ns,
        })
    }
}

/// The measurement a server reply `p` gives for a request sent at `t1`
/// and answered at `t4`, if the reply is sane (synchronised, consistent
/// timestamps, within the root distance).
fn measure(p: &Packet, t1: MonoTime, t4: MonoTime) -> Result<Measurement, Reject> {
    if p.leap == LEAP_UNSYNCHRONISED || p.stratum >= 16 {
        return Err(Reject::Unsynchronised);
    }
    if p.receive_ts == 0 || p.transmit_ts == 0 || p.transmit_ts < p.receive_ts {
        return Err(Reject::BadTimestamps);
    }
    let root_delay = short_to_ns(p.root_delay);
    let root_dispersion = short_to_ns(p.root_dispersion);
    if root_delay / 2 + root_dispersion > MAX_ROOT_DISTANCE_NS {
        return Err(Reject::RootDistance);
    }
    if t4 < t1 {
        return Err(Reject::BadTimestamps);
    }
    let t2 = i128::from(timestamp_to_unix_ns(p.receive_ts));
    let t3 = i128::from(timestamp_to_unix_ns(p.transmit_ts));
    let (m1, m4) = (i128::from(t1.as_nanos()), i128::from(t4.as_nanos()));
    let offset = ((t2 - m1) + (t3 - m4)) / 2;
    // A server whose clock ran a little during its processing can make
    // this slightly negative; RFC 5905 clamps it.
    let delay = ((m4 - m1) - (t3 - t2)).max(0);
    let (Ok(offset_ns), Ok(delay_ns)) = (i64::try_from(offset), i64::try_from(delay)) else {
        return Err(Reject::BadTimestamps);
    };
    let measurement = Measurement {
        at: t1.add_nanos(t4.nanos_since(t1) / 2),
        offset_ns,
        delay_ns,
        error_ns: delay_ns / 2
            + root_delay / 2
            + root_dispersion
            + precision_ns(p.precision)
            + LOCAL_ERROR_NS,
    };
    Ok(measurement)
}

/// A good reply from `s` (to a burst request if `burst`) at `t4`: a server
/// that was unreachable converges again as at start; otherwise its poll
/// interval grows after enough good replies in a row.
fn answered(s: &mut Server, config: &NtpConfig, burst: bool, t4: MonoTime) {
    if s.reach == Reach::Unreachable {
        // Back: converge again as at start.
        s.burst_left = config.burst - 1;
        s.interval_ns = ns(config.min_poll).max(s.interval_ns.min(ns(config.max_poll)));
        let soon = t4.add_nanos(ns(config.burst_spacing));
        s.next_poll = soon.min(s.next_poll);
    } else if !burst {
        s.good_in_row += 1;
        let max = ns(config.max_poll);
        if s.good_in_row >= GROW_AFTER && s.interval_ns < max {
            s.good_in_row = 0;
            let grown = s.interval_ns.saturating_mul(2).min(max);
            // The next poll was set at the old interval; move it too.
            s.next_poll = s.next_poll.add_nanos(grown - s.interval_ns);
            s.interval_ns = grown;
        }
    }
}

/// Apply a kiss-o'-death to `s`.
fn kiss(s: &mut Server, p: &Packet, t4: MonoTime) -> KissEffect {
    match &p.reference_id {
        b"RATE" => {
            // At least double, at least what the server asks for.
            let asked = 1i64
                .checked_shl(p.poll.clamp(0, 40) as u32)
                .unwrap_or(i64::MAX)
                .saturating_mul(1_000_000_000);
            let cap = ns(MAX_BACKOFF);
            s.interval_ns = s.interval_ns.saturating_mul(2).max(asked).min(cap);
            s.burst_left = 0;
            s.good_in_row = 0;
            s.next_poll = t4.add_nanos(s.interval_ns);
            KissEffect::BackedOff {
                interval: Duration::from_nanos(s.interval_ns as u64),
            }
        }
        b"DENY" | b"RSTR" => {
            s.stopped = true;
            KissEffect::Stopped
        }
        _ => KissEffect::Ignored,
    }
}

/// A server's precision (log2 s) in ns; below 1 ns is 0, above 1 s is 1 s.
fn precision_ns(log2: i8) -> i64 {
    match log2 {
        i8::MIN..=-31 => 0,
        -30..=0 => 1_000_000_000 >> (-log2) as u32,
        _ => 1_000_000_000,
    }
}

/// An interval as the log2-seconds poll field.
fn log2_s(interval_ns: i64) -> i8 {
    let s = (interval_ns / 1_000_000_000).max(1);
    (63 - s.leading_zeros()) as i8
}
