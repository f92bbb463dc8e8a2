//! What the core does with measurements: a clock filter per server (RFC
//! 5905 §10, simplified) and the choice among servers (§11, simplified).
//!
//! A round trip that queued somewhere measures the offset badly, and the
//! queueing is only ever added to the delay: so of a server's recent
//! measurements the one with the smallest delay is the best, and a
//! measurement whose delay is far above that minimum is dropped before it
//! can matter. Across servers, when three or more have an estimate, those
//! whose intervals do not share a point with a majority are falsetickers.

use super::super::MonoTime;

/// One exchange with a server, on the agent's time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Measurement {
    /// Middle of the round trip (`CLOCK_MONOTONIC`).
    pub at: MonoTime,
    /// `reference − monotonic`, ns.
    pub offset_ns: i64,
    /// Round trip minus the server's processing time, ns (≥ 0).
    pub delay_ns: i64,
    /// Bound on the offset's error at `at`: half the delay plus the
    /// server's root distance and precision, ns.
    pub error_ns: i64,
}

/// Measurements kept per server (RFC 5905's clock filter holds 8 too).
pub const FILTER_LEN: usize = 8;

/// A measurement whose delay exceeds `OUTLIER_FACTOR × minimum +
/// OUTLIER_FLOOR_NS` is an outlier: its queueing added far more error than
/// the best recent one has.
pub const OUTLIER_FACTOR: i64 = 3;
/// The floor keeps loopback and LAN paths, whose minimum is a few tens of
/// µs, from calling ordinary scheduling jitter an outlier.
pub const OUTLIER_FLOOR_NS: i64 = 100_000;
/// After this many outliers in a row the path itself has changed (a new
/// route, a slower link): the filter starts over from the next one.
pub const OUTLIER_PATIENCE: u32 = 4;

/// How fast an old measurement loses value: RFC 5905's PHI, 15 ppm, the
/// frequency error assumed of an undisciplined local oscillator.
pub const PHI_PPM: i64 = 15;

/// Error bound of `m` once `now` has come: its own plus PHI × age.
pub fn distance_at(m: &Measurement, now: MonoTime) -> i64 {
    let age = now.nanos_since(m.at).max(0);
    m.error_ns.saturating_add(age / 1_000_000 * PHI_PPM)
}

/// The last [`FILTER_LEN`] accepted measurements of one server; a fixed
/// ring, no allocation.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    ring: [Option<Measurement>; FILTER_LEN],
    next: usize,
    outliers_in_row: u32,
}

impl Filter {
    /// Keep `m` unless it is an outlier. Returns whether it was kept.
    pub fn push(&mut self, m: Measurement) -> bool {
        if let Some(min) = self.min_delay()
            && m.delay_ns > OUTLIER_FACTOR.saturating_mul(min) + OUTLIER_FLOOR_NS
        {
            if self.outliers_in_row < OUTLIER_PATIENCE {
                self.outliers_in_row += 1;
                return false;
            }
            // The path changed: the old minimum no longer applies.
            self.clear();
        }
        self.outliers_in_row = 0;
        self.ring[self.next] = Some(m);
        self.next = (self.next + 1) % FILTER_LEN;
        true
    }

    /// Forget everything (the server was unreachable; its old path and
    /// offset may not hold).
    pub fn clear(&mut self) {
        *self = Filter::default();
    }

    fn min_delay(&self) -> Option<i64> {
        self.ring.iter().flatten().map(|m| m.delay_ns).min()
    }

    /// The kept measurement with the smallest delay (the newest of equals).
    pub fn best(&self) -> Option<Measurement> {
        self.ring
            .iter()
            .flatten()
            .min_by_key(|m| (m.delay_ns, std::cmp::Reverse(m.at)))
            .copied()
    }
}

/// Of servers' best measurements (server index, measurement), the ones
/// that agree: with fewer than three everyone (two that disagree cannot be
/// told apart); with three or more, those whose error intervals (aged to
/// `now`) contain the point most intervals share, if that is a majority,
/// else none. Returns the indices into `cands`.
pub fn truechimers(cands: &[(usize, Measurement)], now: MonoTime) -> Vec<usize> {
    if cands.len() < 3 {
        return (0..cands.len()).collect();
    }
    // Sweep over interval ends; at equal positions starts come first, so
    // touching intervals count as overlapping.
    let mut ends: Vec<(i64, i32)> = Vec::with_capacity(cands.len() * 2);
    for (_, m) in cands {
        let d = distance_at(m, now);
        ends.push((m.offset_ns.saturating_sub(d), -1));
        ends.push((m.offset_ns.saturating_add(d), 1));
    }
    ends.sort_unstable();
    let (mut depth, mut best, mut point) = (0i32, 0i32, 0i64);
    for &(x, kind) in &ends {
        depth -= kind;
        if depth > best {
            best = depth;
            point = x;
        }
    }
    if (best as usize) * 2 <= cands.len() {
        return Vec::new();
    }
    cands
        .iter()
        .enumerate()
        .filter(|(_, (_, m))| {
            let d = distance_at(m, now);
            m.offset_ns.saturating_sub(d) <= point && point <= m.offset_ns.saturating_add(d)
        })
        .map(|(i, _)| i)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(at_s: i64, offset_ns: i64, delay_ns: i64) -> Measurement {
        Measurement {
            at: MonoTime::from_nanos(at_s * 1_000_000_000),
            offset_ns,
            delay_ns,
            error_ns: delay_ns / 2,
        }
    }

    #[test]
    fn the_filter_picks_the_minimum_delay_of_the_last_eight() {
        let mut f = Filter::default();
        for (i, d) in [400, 300, 120, 250, 200, 180, 260, 290].iter().enumerate() {
            assert!(f.push(m(i as i64, i as i64, d * 1000)));
        }
        assert_eq!(f.best().map(|b| b.delay_ns), Some(120_000));
        // Two more push the 120 µs one out (it was third of eight).
        f.push(m(8, 8, 310_000));
        assert_eq!(f.best().map(|b| b.delay_ns), Some(120_000));
        f.push(m(9, 9, 330_000));
        f.push(m(10, 10, 340_000));
        assert_eq!(f.best().map(|b| b.delay_ns), Some(180_000));
    }

    #[test]
    fn outliers_are_dropped_until_the_path_has_clearly_changed() {
        let mut f = Filter::default();
        f.push(m(0, 0, 200_000));
        for i in 0..OUTLIER_PATIENCE {
            assert!(!f.push(m(1 + i as i64, 0, 5_000_000)), "outlier {i} kept");
        }
        assert_eq!(f.best().map(|b| b.delay_ns), Some(200_000));
        // One more: the path changed, the filter starts over.
        assert!(f.push(m(9, 0, 5_000_000)));
        assert_eq!(f.best().map(|b| b.delay_ns), Some(5_000_000));
        // Within the factor is not an outlier.
        assert!(f.push(m(10, 0, 3 * 5_000_000 + OUTLIER_FLOOR_NS)));
    }

    #[test]
    fn a_falseticker_among_three_is_left_out_and_no_majority_means_none() {
        let now = MonoTime::from_nanos(0);
        let good = [(0, m(0, 1_000, 100_000)), (1, m(0, 20_000, 100_000))];
        let mut cands = good.to_vec();
        cands.push((2, m(0, 10_000_000, 100_000)));
        assert_eq!(truechimers(&cands, now), vec![0, 1]);
        // Three that all disagree: no majority, nobody.
        let split = [
            (0, m(0, 0, 100_000)),
            (1, m(0, 5_000_000, 100_000)),
            (2, m(0, 10_000_000, 100_000)),
        ];
        assert!(truechimers(&split, now).is_empty());
        // Two cannot be told apart.
        assert_eq!(truechimers(&split[..2], now), vec![0, 1]);
    }

    #[test]
    fn age_widens_the_error_at_phi() {
        let x = m(0, 0, 100_000);
        assert_eq!(distance_at(&x, MonoTime::from_nanos(0)), 50_000);
        assert_eq!(
            distance_at(&x, MonoTime::from_nanos(100_000_000_000)),
            50_000 + 1_500_000
        );
    }
}
