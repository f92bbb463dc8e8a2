//! Time exchange with the controller over the link, the agent asking
//! (sans-IO): an agent with no PTP or NTP still aligns to the controller,
//! whose clock is reference time.
//!
//! Four timestamps, as NTP: t1 (agent send, monotonic), t2 (controller
//! receive), t3 (controller send), t4 (agent receive, monotonic). Then
//! `reference − monotonic = ((t2 − t1) + (t3 − t4)) / 2`, off by at most
//! half the round trip `(t4 − t1) − (t3 − t2)`, which becomes the sample's
//! error. A gRPC stream is a busier path than a UDP socket (HTTP/2 frames,
//! the controller's other work on the stream, a link that stalls), so only
//! replies whose round trip is close to the recent minimum are kept, as
//! NTP's clock filter keeps the lowest-delay sample of its last eight: a
//! stall on one leg of a slow path (0.5 s, say) moves the offset by half
//! the stall, tens of milliseconds, and looked like the clock stepping
//! while the link source was still syncing. The estimator weighs the rest
//! by their error.

use std::collections::VecDeque;

use super::MonoTime;
use super::sample::{Sample, SourceKind};

/// How often to ask: quickly after a connect (the estimator locks on a
/// few samples), then steadily.
const BURST: u32 = 6;
const BURST_EVERY_NS: i64 = 250_000_000;
const STEADY_EVERY_NS: i64 = 4_000_000_000;
/// A request unanswered this long is forgotten (the next one goes out).
const REPLY_TIMEOUT_NS: i64 = 5_000_000_000;
/// Round trips remembered for the minimum (NTP's filter register).
const DELAYS_KEPT: usize = 8;
/// A round trip above `minimum + max(minimum / DIVISOR, SLACK, typical)`
/// is an outlier: its offset may be off by half the excess, which a
/// path's jitter at its fastest (a few % of the round trip, or 50 µs on a
/// LAN) does not explain, nor does its typical excess over the last
/// round trips (the median's; so a busy machine, whose loopback round
/// trips vary by hundreds of µs, is not starved of samples, while a stall
/// far beyond the usual is still dropped).
const OUTLIER_DIVISOR: i64 = 16;
const OUTLIER_SLACK_NS: i64 = 50_000;
/// Timestamp resolution and processing on the controller, beyond the round
/// trip: added to every sample's error.
const BASE_ERROR_NS: i64 = 2_000;

/// One request to send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// Matches the reply.
    pub id: u64,
}

/// The exchange of one link session.
#[derive(Debug, Default)]
pub struct Exchange {
    next_id: u64,
    sent: u32,
    /// The request in flight: id and t1.
    outstanding: Option<(u64, MonoTime)>,
    next_at: Option<MonoTime>,
    delays: VecDeque<i64>,
}

impl Exchange {
    /// A fresh exchange (a new session): the first request is due at once.
    pub fn new() -> Self {
        Exchange::default()
    }

    /// When the next request is due.
    pub fn next_due(&self) -> MonoTime {
        self.next_at.unwrap_or(MonoTime::MIN)
    }

    /// A request if one is due at `now` (none while one is in flight,
    /// unless it timed out).
    pub fn poll(&mut self, now: MonoTime) -> Option<Request> {
        if now < self.next_due() {
            return None;
        }
        if let Some((_, t1)) = self.outstanding
            && now.nanos_since(t1) < REPLY_TIMEOUT_NS
        {
            return None;
        }
        self.next_id += 1;
        self.sent = self.sent.saturating_add(1);
        let every = if self.sent < BURST {
            BURST_EVERY_NS
        } else {
            STEADY_EVERY_NS
        };
        self.next_at = Some(now.add_nanos(every));
        // t1 is stamped when the request actually leaves ([`Self::sent`]).
        self.outstanding = Some((self.next_id, now));
        Some(Request { id: self.next_id })
    }

    /// The request `id` left at `t1`.
    pub fn sent(&mut self, id: u64, t1: MonoTime) {
        if let Some((o, _)) = self.outstanding
            && o == id
        {
            self.outstanding = Some((id, t1));
        }
    }

    /// A reply, received at `t4`. A sample unless it answers nothing in
    /// flight (late, duplicated or forged), is inconsistent, or its round
    /// trip is an outlier.
    pub fn on_reply(
        &mut self,
        id: u64,
        t1_ns: i64,
        t2_ns: i64,
        t3_ns: i64,
        t4: MonoTime,
    ) -> Option<Sample> {
        let (want, t1) = self.outstanding?;
        if id != want || t1_ns != t1.as_nanos() {
            return None;
        }
        self.outstanding = None;
        let server = t3_ns.checked_sub(t2_ns)?;
        let delay = (t4.as_nanos().checked_sub(t1.as_nanos())?).checked_sub(server)?;
        if server < 0 || delay < 0 {
            return None;
        }
        if self.delays.len() == DELAYS_KEPT {
            self.delays.pop_front();
        }
        self.delays.push_back(delay);
        let mut sorted: Vec<i64> = self.delays.iter().copied().collect();
        sorted.sort_unstable();
        let min = sorted[0];
        // The lower median's excess, once there are enough round trips to
        // say what is typical.
        let typical = if sorted.len() >= 4 {
            sorted[(sorted.len() - 1) / 2] - min
        } else {
            0
        };
        let tolerance = (min / OUTLIER_DIVISOR).max(OUTLIER_SLACK_NS).max(typical);
        if delay > min.saturating_add(tolerance) {
            return None;
        }
        let offset =
            ((t2_ns as i128 - t1.as_nanos() as i128) + (t3_ns as i128 - t4.as_nanos() as i128)) / 2;
        Some(Sample {
            source: SourceKind::Link,
            // The midpoint of the round trip on our clock.
            at: t1.add_nanos(t4.nanos_since(t1) / 2),
            offset_ns: i64::try_from(offset).ok()?,
            error_ns: delay / 2 + BASE_ERROR_NS,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: i64 = 1_000_000;
    const US: i64 = 1_000;

    /// The controller's clock is monotonic + `offset`; the request takes
    /// `up` to arrive, the reply `down`.
    fn round(e: &mut Exchange, now: i64, offset: i64, up: i64, down: i64) -> Option<Sample> {
        let r = e.poll(MonoTime::from_nanos(now))?;
        e.sent(r.id, MonoTime::from_nanos(now));
        let t2 = now + up + offset;
        let t3 = t2 + 10 * US;
        let t4 = now + up + 10 * US + down;
        e.on_reply(r.id, now, t2, t3, MonoTime::from_nanos(t4))
    }

    #[test]
    fn symmetric_paths_give_the_offset_and_half_the_round_trip_as_error() {
        let mut e = Exchange::new();
        let s = round(&mut e, 1_000 * MS, 5_000 * MS, 100 * US, 100 * US).expect("sample");
        assert_eq!(s.offset_ns, 5_000 * MS);
        assert_eq!(s.error_ns, 100 * US + BASE_ERROR_NS);
        assert_eq!(s.source, SourceKind::Link);
    }

    #[test]
    fn asymmetry_stays_within_the_error_and_outliers_are_dropped() {
        let mut e = Exchange::new();
        let mut t = 0;
        let mut kept = 0;
        for i in 0..30 {
            // Every fifth reply waits 20 ms behind other traffic.
            let down = if i % 5 == 4 { 20 * MS } else { 80 * US };
            t += 5 * 1_000 * MS;
            if let Some(s) = round(&mut e, t, -3 * MS, 120 * US, down) {
                kept += 1;
                assert!((s.offset_ns + 3 * MS).abs() <= s.error_ns, "{s:?}");
                assert!(s.error_ns < MS, "an outlier got through: {s:?}");
            }
        }
        assert_eq!(kept, 24, "the slow replies, and only they, are dropped");
    }

    #[test]
    fn unexpected_replies_are_ignored() {
        let mut e = Exchange::new();
        let r = e.poll(MonoTime::from_nanos(0)).expect("due at once");
        e.sent(r.id, MonoTime::from_nanos(10));
        // Wrong id, wrong t1 echo, a reply claiming to precede its request.
        assert!(
            e.on_reply(r.id + 1, 10, 0, 0, MonoTime::from_nanos(20))
                .is_none()
        );
        assert!(
            e.on_reply(r.id, 11, 0, 0, MonoTime::from_nanos(20))
                .is_none()
        );
        assert!(
            e.on_reply(r.id, 10, 50, 40, MonoTime::from_nanos(20))
                .is_none()
        );
        // Consumed by the inconsistent one: a replay is nothing either.
        assert!(
            e.on_reply(r.id, 10, 15, 16, MonoTime::from_nanos(20))
                .is_none()
        );
    }

    #[test]
    fn a_burst_then_a_steady_pace_and_no_second_request_in_flight() {
        let mut e = Exchange::new();
        let mut t = 0;
        let mut gaps = Vec::new();
        let mut last = None;
        while gaps.len() < 8 {
            if let Some(r) = e.poll(MonoTime::from_nanos(t)) {
                // In flight: nothing more until answered or timed out.
                assert!(e.poll(MonoTime::from_nanos(t)).is_none());
                e.sent(r.id, MonoTime::from_nanos(t));
                e.on_reply(r.id, t, t, t, MonoTime::from_nanos(t + 1));
                if let Some(l) = last {
                    gaps.push(t - l);
                }
                last = Some(t);
            }
            t += 50 * MS;
        }
        assert!(gaps[..5].iter().all(|g| *g == BURST_EVERY_NS), "{gaps:?}");
        assert!(gaps[5..].iter().all(|g| *g == STEADY_EVERY_NS), "{gaps:?}");
        // A lost reply: after the timeout a new request goes out.
        let r = e
            .poll(MonoTime::from_nanos(t + STEADY_EVERY_NS))
            .expect("due");
        e.sent(r.id, MonoTime::from_nanos(t + STEADY_EVERY_NS));
        assert!(
            e.poll(MonoTime::from_nanos(t + 2 * STEADY_EVERY_NS))
                .is_none()
        );
        assert!(
            e.poll(MonoTime::from_nanos(t + STEADY_EVERY_NS + REPLY_TIMEOUT_NS))
                .is_some()
        );
    }

    /// A busy machine's loopback: round trips of 80 µs at best, hundreds
    /// of µs usually. The filter must not starve the source (a link that
    /// never locks): about half the replies are kept, each within its
    /// error of the truth.
    #[test]
    fn a_busy_loopback_is_not_starved() {
        let mut e = Exchange::new();
        let offset = 3 * MS;
        let mut x = 0x2545_f491_u32;
        let mut rand = move |n: i64| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            i64::from(x).rem_euclid(n)
        };
        let (mut kept, mut asked, mut t) = (0, 0, 0i64);
        while asked < 100 {
            t += 250 * MS;
            let Some(r) = e.poll(MonoTime::from_nanos(t)) else {
                continue; // the exchange's own pace
            };
            asked += 1;
            let up = 40 * US + rand(300 * US);
            let down = 40 * US + rand(300 * US);
            let id = r.id;
            e.sent(id, MonoTime::from_nanos(t));
            let t2 = t + up + offset;
            let t3 = t2 + 10 * US;
            if let Some(s) =
                e.on_reply(id, t, t2, t3, MonoTime::from_nanos(t + up + 10 * US + down))
            {
                kept += 1;
                assert!((s.offset_ns - offset).abs() <= s.error_ns, "{s:?}");
            }
        }
        assert!(kept >= 35, "only {kept} of 100 replies kept");
    }

    /// Issue 26.12: a 0.5 s path whose legs stall now and then (one leg at
    /// a time: the offset is off by half the stall). Replies delayed by a
    /// stall are dropped; what is kept is within a few ms of the truth,
    /// and the estimator fed with it never reports a step of the link
    /// source.
    #[test]
    fn a_slow_stalling_path_keeps_only_replies_near_its_fastest() {
        use crate::estimator::{Estimator, EstimatorConfig};
        let mut e = Exchange::new();
        let mut est = Estimator::new(EstimatorConfig::with_limit(10 * MS));
        let offset = 7_000 * MS;
        let mut x = 0x9e37_79b9_u32;
        let mut rand = move |n: i64| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            i64::from(x).rem_euclid(n)
        };
        let (mut kept, mut stalled_kept, mut t) = (0, 0, 0i64);
        let mut steps = Vec::new();
        for i in 0..200 {
            t += 750 * MS;
            // 250 ms each way, up to 2 ms of jitter; a third of the rounds
            // (at random) one leg stalls 40..200 ms.
            let (mut up, mut down) = (250 * MS + rand(2 * MS), 250 * MS + rand(2 * MS));
            let stalled = rand(3) == 0;
            if stalled {
                if rand(2) == 0 {
                    up += 40 * MS + rand(160 * MS);
                } else {
                    down += 40 * MS + rand(160 * MS);
                }
            }
            let Some(s) = round(&mut e, t, offset, up, down) else {
                continue;
            };
            kept += 1;
            stalled_kept += i32::from(stalled);
            assert!((s.offset_ns - offset).abs() <= 20 * MS, "kept {s:?} at {i}");
            assert!((s.offset_ns - offset).abs() <= s.error_ns, "{s:?}");
            est.on_sample(s);
            if let Some(tick) = est.tick(MonoTime::from_nanos(t + 600 * MS))
                && tick.estimate.source == SourceKind::Link
                && let Some(step) = tick.step_ns
            {
                steps.push((i, step));
            }
        }
        assert!(kept >= 25, "the unstalled rounds are kept: {kept}");
        assert_eq!(stalled_kept, 0, "no stalled round is kept");
        // The first sample moves the estimate from nothing; after it, the
        // link source never steps.
        assert!(steps.len() <= 1, "{steps:?}");
    }
}
