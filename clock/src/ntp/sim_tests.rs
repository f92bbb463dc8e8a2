//! The core on simulated time: fake servers at known offsets answer with
//! chosen (asymmetric, jittery, scripted) delays; no sockets, no clocks.

use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::client::{
    Action, GROW_AFTER, KissEffect, NtpClient, NtpConfig, Received, Reject, UNREACHABLE_AFTER,
};
use super::packet::{HEADER_LEN, Packet, ns_to_short, unix_ns_to_timestamp};
use crate::MonoTime;
use crate::sample::{Sample, SourceKind};

const S: i64 = 1_000_000_000;
const MS: i64 = 1_000_000;
const US: i64 = 1_000;

/// Reference − monotonic of a typical box: booted a while ago, in 2026.
const TRUTH: i64 = 1_795_996_800 * S + 123_456_789;

#[derive(Clone, Debug)]
struct FakeServer {
    /// Its clock minus our monotonic clock.
    offset_ns: i64,
    /// Request path: base + uniform jitter in 0..=jitter.
    fwd: (i64, i64),
    /// Reply path.
    back: (i64, i64),
    /// Scripted (forward, back) delays, used first, one per request.
    script: Vec<(i64, i64)>,
    processing_ns: i64,
    stratum: u8,
    leap: u8,
    kiss: Option<[u8; 4]>,
    root_delay_ns: i64,
    root_dispersion_ns: i64,
    silent: bool,
}

impl FakeServer {
    fn at(offset_ns: i64) -> Self {
        FakeServer {
            offset_ns,
            fwd: (200 * US, 0),
            back: (200 * US, 0),
            script: Vec::new(),
            processing_ns: 20 * US,
            stratum: 2,
            leap: 0,
            kiss: None,
            root_delay_ns: 0,
            root_dispersion_ns: 0,
            silent: false,
        }
    }

    /// The reply to `req` sent at `t1`, and when it arrives.
    fn reply(
        &mut self,
        req: &[u8],
        t1: MonoTime,
        rng: &mut StdRng,
    ) -> ([u8; HEADER_LEN], MonoTime) {
        let q = Packet::decode(req).expect("the client sends whole headers");
        let (d1, d2) = if self.script.is_empty() {
            (
                self.fwd.0 + rng.random_range(0..=self.fwd.1),
                self.back.0 + rng.random_range(0..=self.back.1),
            )
        } else {
            self.script.remove(0)
        };
        let t2 = t1.as_nanos() + d1 + self.offset_ns;
        let t3 = t2 + self.processing_ns;
        let t4 = MonoTime::from_nanos(t1.as_nanos() + d1 + self.processing_ns + d2);
        let p = Packet {
            leap: self.leap,
            version: 4,
            mode: 4,
            stratum: if self.kiss.is_some() { 0 } else { self.stratum },
            poll: q.poll,
            precision: -20,
            root_delay: ns_to_short(self.root_delay_ns),
            root_dispersion: ns_to_short(self.root_dispersion_ns),
            reference_id: self.kiss.unwrap_or(*b"GPS\0"),
            reference_ts: unix_ns_to_timestamp(t2 - 10 * S),
            origin_ts: q.transmit_ts,
            receive_ts: unix_ns_to_timestamp(t2),
            transmit_ts: unix_ns_to_timestamp(t3),
        };
        (p.encode(), t4)
    }
}

#[derive(Debug)]
struct Sim {
    client: NtpClient,
    servers: Vec<FakeServer>,
    rng: StdRng,
    /// (server, t1) of every request.
    sends: Vec<(usize, MonoTime)>,
    received: Vec<(usize, Received)>,
    samples: Vec<Sample>,
    unreachable: Vec<(usize, MonoTime)>,
}

const START: MonoTime = MonoTime::from_nanos(5_000 * S);

impl Sim {
    fn new(servers: Vec<FakeServer>, config: NtpConfig) -> Self {
        Sim {
            client: NtpClient::new(servers.len(), config, START, StdRng::seed_from_u64(7)),
            servers,
            rng: StdRng::seed_from_u64(11),
            sends: Vec::new(),
            received: Vec::new(),
            samples: Vec::new(),
            unreachable: Vec::new(),
        }
    }

    /// Drive the client through every wake-up up to `end` (replies arrive
    /// long before the next wake-up: delays are ms, polls s).
    fn run_until(&mut self, end: MonoTime) {
        while let Some(now) = self.client.next_wake() {
            if now > end {
                break;
            }
            while let Some(a) = self.client.poll(now) {
                match a {
                    Action::Send { server, packet } => {
                        self.sends.push((server, now));
                        self.client.sent(server, now);
                        if self.servers[server].silent {
                            continue;
                        }
                        let (bytes, t4) = self.servers[server].reply(&packet, now, &mut self.rng);
                        let r = self.client.receive(server, &bytes, t4);
                        if let Received::Measured {
                            sample: Some(s), ..
                        } = r
                        {
                            self.samples.push(s);
                        }
                        self.received.push((server, r));
                    }
                    Action::Unreachable { server } => self.unreachable.push((server, now)),
                }
            }
        }
    }

    fn sends_to(&self, server: usize) -> Vec<i64> {
        self.sends
            .iter()
            .filter(|(s, _)| *s == server)
            .map(|(_, t)| t.as_nanos())
            .collect()
    }
}

fn secs(n: i64) -> MonoTime {
    MonoTime::from_nanos(START.as_nanos() + n * S)
}

#[test]
fn a_server_at_a_known_offset_is_found_despite_asymmetric_jittery_paths() {
    let mut srv = FakeServer::at(TRUTH);
    // 3 ms out ± up to 4 ms, 1 ms back ± up to 1 ms: asymmetric, jittery.
    srv.fwd = (3 * MS, 4 * MS);
    srv.back = (MS, MS);
    srv.root_delay_ns = 2 * MS;
    srv.root_dispersion_ns = 500 * US;
    let mut sim = Sim::new(vec![srv], NtpConfig::default());
    sim.run_until(secs(1800));

    let first = sim.samples.first().expect("a sample");
    assert!(
        first.at < secs(1),
        "the first sample comes from the first reply"
    );
    assert_eq!(first.source, SourceKind::Ntp);
    for s in &sim.samples {
        let err = (s.offset_ns - TRUTH).abs();
        assert!(
            err <= s.error_ns,
            "error {err} beyond its bound {}",
            s.error_ns
        );
    }
    // The asymmetry alone is 1 ms (half of 3 − 1); jitter adds up to 2 ms
    // more, but the minimum-delay exchange has little of it.
    let last = sim.samples.last().expect("samples");
    assert!((last.offset_ns - TRUTH).abs() < 1_500 * US, "{last:?}");
    // Samples are used once: strictly increasing in time.
    assert!(sim.samples.windows(2).all(|w| w[0].at < w[1].at));
    // Far fewer samples than replies (the filter waits for a better one).
    assert!(sim.samples.len() < sim.received.len());
}

#[test]
fn the_minimum_delay_exchange_wins_and_later_worse_ones_add_nothing() {
    let mut srv = FakeServer::at(TRUTH);
    // The third exchange is symmetric and fast: exact. The others are slow
    // and lopsided (each off by 2 ms), still under the outlier bar.
    srv.script = vec![
        (5 * MS, MS),
        (5 * MS, 1_100 * US),
        (100 * US, 100 * US),
        (5 * MS, MS),
        (MS, 5 * MS),
        (5 * MS, MS),
    ];
    let mut sim = Sim::new(vec![srv], NtpConfig::default());
    sim.run_until(secs(11));
    assert_eq!(sim.sends.len(), 6);
    // A sample from the first reply (the second was slower), then the
    // exact one; the later slow ones are never handed over.
    assert_eq!(sim.samples.len(), 2, "{:?}", sim.samples);
    let best = sim.samples[1];
    assert!((best.offset_ns - TRUTH).abs() < US, "{best:?}");
    assert!((sim.samples[0].offset_ns - TRUTH).abs() > MS);
}

#[test]
fn a_reply_whose_origin_is_not_our_nonce_is_rejected_and_the_real_one_still_counts() {
    let mut c = NtpClient::new(1, NtpConfig::default(), START, StdRng::seed_from_u64(1));
    let Some(Action::Send { server: 0, packet }) = c.poll(START) else {
        panic!("a request is due at start");
    };
    c.sent(0, START);
    let mut srv = FakeServer::at(TRUTH);
    let mut rng = StdRng::seed_from_u64(2);
    let (good, t4) = srv.reply(&packet, START, &mut rng);
    let mut spoofed = good;
    spoofed[31] ^= 1;
    assert_eq!(
        c.receive(0, &spoofed, t4),
        Received::Rejected(Reject::OriginMismatch)
    );
    assert!(matches!(
        c.receive(0, &good, t4),
        Received::Measured {
            sample: Some(_),
            ..
        }
    ));
    // A duplicate (or a stale reply to an answered request) is not used.
    assert_eq!(
        c.receive(0, &good, t4),
        Received::Rejected(Reject::Unsolicited)
    );
    // Nor is a reply to a request that never went out.
    assert_eq!(
        c.receive(0, &good[..40], t4),
        Received::Rejected(Reject::Malformed)
    );
}

#[test]
fn a_stale_reply_to_the_previous_request_is_rejected() {
    let mut c = NtpClient::new(1, NtpConfig::default(), START, StdRng::seed_from_u64(1));
    let Some(Action::Send { packet: first, .. }) = c.poll(START) else {
        panic!("due");
    };
    c.sent(0, START);
    let t = c.next_wake().expect("polling");
    let Some(Action::Send { .. }) = c.poll(t) else {
        panic!("due again");
    };
    c.sent(0, t);
    let mut rng = StdRng::seed_from_u64(2);
    let (late, _) = FakeServer::at(TRUTH).reply(&first, START, &mut rng);
    assert_eq!(
        c.receive(0, &late, t.add_nanos(MS)),
        Received::Rejected(Reject::OriginMismatch)
    );
}

#[test]
fn a_rate_kiss_backs_off_and_deny_stops_polling() {
    let mut srv = FakeServer::at(TRUTH);
    srv.kiss = Some(*b"RATE");
    let mut sim = Sim::new(vec![srv, FakeServer::at(TRUTH)], NtpConfig::default());
    sim.run_until(secs(300));
    assert!(sim.samples.iter().all(|s| (s.offset_ns - TRUTH).abs() < MS));
    let sends = sim.sends_to(0);
    let gaps: Vec<i64> = sends.windows(2).map(|w| (w[1] - w[0]) / S).collect();
    // No burst: 16 s doubled to 32 s, then 64 s, 128 s …
    assert_eq!(gaps, vec![32, 64, 128], "{sends:?}");
    assert!(sim.received.iter().any(|(s, r)| *s == 0
        && *r
            == Received::Kiss {
                code: *b"RATE",
                effect: KissEffect::BackedOff {
                    interval: std::time::Duration::from_secs(32)
                }
            }));
    // The good server was polled as usual meanwhile.
    assert!(sim.sends_to(1).len() > 10);

    let mut srv = FakeServer::at(TRUTH);
    srv.kiss = Some(*b"DENY");
    let mut sim = Sim::new(vec![srv], NtpConfig::default());
    sim.run_until(secs(300));
    assert_eq!(sim.sends.len(), 1);
    assert_eq!(sim.client.next_wake(), None, "nothing left to poll");
    assert!(sim.samples.is_empty());
}

#[test]
fn an_unsynchronised_server_is_ignored() {
    let mut leap3 = FakeServer::at(TRUTH + 10 * S);
    leap3.leap = 3;
    let mut stratum16 = FakeServer::at(TRUTH - 10 * S);
    stratum16.stratum = 16;
    let mut far = FakeServer::at(TRUTH + 20 * S);
    far.root_dispersion_ns = 2 * S;
    let mut sim = Sim::new(vec![leap3, stratum16, far], NtpConfig::default());
    sim.run_until(secs(120));
    assert!(sim.samples.is_empty(), "{:?}", sim.samples);
    let rejections = |server: usize| {
        sim.received
            .iter()
            .filter(|(s, _)| *s == server)
            .map(|(_, r)| *r)
            .collect::<Vec<_>>()
    };
    assert!(
        rejections(0)
            .iter()
            .all(|r| *r == Received::Rejected(Reject::Unsynchronised))
    );
    assert!(
        rejections(1)
            .iter()
            .all(|r| *r == Received::Rejected(Reject::Unsynchronised))
    );
    assert!(
        rejections(2)
            .iter()
            .all(|r| *r == Received::Rejected(Reject::RootDistance))
    );
    // They answer, so they are not unreachable.
    assert!(sim.unreachable.is_empty());
}

#[test]
fn the_poll_interval_starts_with_a_burst_and_grows_to_the_maximum() {
    let config = NtpConfig::default();
    let mut sim = Sim::new(vec![FakeServer::at(TRUTH)], config);
    sim.run_until(secs(1200));
    let sends = sim.sends_to(0);
    let gaps: Vec<i64> = sends.windows(2).map(|w| (w[1] - w[0]) / S).collect();
    let burst = config.burst as usize;
    let mut want = vec![2; burst - 1];
    let g = GROW_AFTER as usize;
    // GROW_AFTER good replies at an interval double it, and the poll
    // already scheduled moves too; the request that ended the burst is the
    // first at 16 s, so 16 s shows one gap fewer.
    want.extend([16].repeat(g - 1));
    want.extend([32].repeat(g));
    want.extend([64].repeat(gaps.len() - want.len()));
    assert_eq!(gaps, want);
    assert_eq!(sim.client.interval(0), Some(config.max_poll));
    // The first samples come within the burst.
    assert!(sim.samples.iter().filter(|s| s.at < secs(12)).count() >= 2);
}

#[test]
fn a_silent_server_is_reported_once_and_rebursts_when_it_answers_again() {
    let mut srv = FakeServer::at(TRUTH);
    srv.silent = true;
    let mut sim = Sim::new(vec![srv], NtpConfig::default());
    sim.run_until(secs(600));
    assert_eq!(sim.unreachable.len(), 1, "{:?}", sim.unreachable);
    assert!(sim.sends.len() as u32 > UNREACHABLE_AFTER);
    // Unreachable: polled at the maximum interval.
    let gaps: Vec<i64> = sim
        .sends
        .windows(2)
        .map(|w| (w[1].1.as_nanos() - w[0].1.as_nanos()) / S)
        .collect();
    assert_eq!(gaps.last(), Some(&64));
    sim.servers[0].silent = false;
    let back = sim.sends.len();
    sim.run_until(secs(700));
    assert!(!sim.samples.is_empty());
    // It answered: a burst again.
    let later: Vec<i64> = sim.sends[back..]
        .windows(2)
        .map(|w| (w[1].1.as_nanos() - w[0].1.as_nanos()) / S)
        .collect();
    assert_eq!(&later[..3], &[2, 2, 2], "{later:?}");
    assert_eq!(sim.unreachable.len(), 1);
}

#[test]
fn a_falseticker_is_outvoted() {
    for n_good in [2usize, 3] {
        let mut servers: Vec<FakeServer> = (0..n_good)
            .map(|i| {
                let mut s = FakeServer::at(TRUTH + i as i64 * 30 * US);
                s.fwd = (MS, 500 * US);
                s.back = (MS, 500 * US);
                s
            })
            .collect();
        // Closer (so its error bound is the smallest) but 50 ms off.
        let mut liar = FakeServer::at(TRUTH + 50 * MS);
        liar.fwd = (50 * US, 0);
        liar.back = (50 * US, 0);
        servers.insert(1, liar);
        let mut sim = Sim::new(servers, NtpConfig::default());
        sim.run_until(secs(600));
        let n = n_good + 1;
        // Until all have answered (the first round, all sent at once),
        // fewer than three estimates cannot outvote anyone; after it, the
        // liar never wins.
        let after_first_round = sim.sends[n].1;
        let later: Vec<&Sample> = sim
            .samples
            .iter()
            .filter(|s| s.at > after_first_round)
            .collect();
        assert!(!later.is_empty());
        for s in later {
            assert!((s.offset_ns - TRUTH).abs() < 2 * MS, "{n} servers: {s:?}");
        }
    }
}

#[test]
fn three_servers_that_all_disagree_give_no_sample() {
    let servers = (0..3)
        .map(|i| FakeServer::at(TRUTH + i * 100 * MS))
        .collect();
    let mut sim = Sim::new(servers, NtpConfig::default());
    sim.run_until(secs(120));
    // The first round (sent at once) answered before the second is sent.
    let all_answered = sim.sends[3].1;
    assert!(sim.samples.iter().all(|s| s.at <= all_answered));
}

proptest! {
    #[test]
    fn garbage_replies_never_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..100),
        keep_origin in any::<bool>(),
    ) {
        let mut c = NtpClient::new(1, NtpConfig::default(), START, StdRng::seed_from_u64(3));
        let Some(Action::Send { packet, .. }) = c.poll(START) else {
            panic!("due");
        };
        c.sent(0, START);
        let mut b = bytes;
        if keep_origin && b.len() >= HEADER_LEN {
            // Past the origin check, into the deeper validation.
            b[24..32].copy_from_slice(&packet[40..48]);
        }
        let r = c.receive(0, &b, MonoTime::from_nanos(START.as_nanos() + MS));
        if let Received::Measured { measurement, .. } = r {
            prop_assert!(measurement.delay_ns >= 0);
            prop_assert!(measurement.error_ns >= 0);
        }
        // Other server indices are not a panic either.
        let _ = c.receive(5, &b, MonoTime::from_nanos(START.as_nanos() + MS));
    }
}
