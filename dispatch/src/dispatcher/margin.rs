//! The dispatcher's sleep margin: how long before a deadline it stops
//! sleeping and spins, learned from its recent wake-up latencies within the
//! spin budget, at the rate firings come. Plain arithmetic on a fixed
//! array: nothing here allocates.

const MIN_MARGIN_NS: i64 = 2_000;
const MAX_MARGIN_NS: i64 = 500_000;
/// Wake-up latencies the margin is learned from.
const SAMPLES: usize = 32;
/// Past the slowest recent wake-up, what the margin adds at most.
const COVER_NS: i64 = 10_000;
/// One wake-up that came very late (a hypervisor hiccup) must not make the
/// thread spin for milliseconds afterwards: samples are capped here.
const MAX_SAMPLE_NS: i64 = 250_000;

/// The margin and what it is learned from. Margin: start generous, then
/// learn it from the recent wake-up latencies (the last 32, each capped)
/// within the spin budget, at the rate firings come (a moving average of
/// the gaps between timed wake-ups' deadlines).
pub(super) struct Pacing {
    /// The current margin, ns.
    pub(super) margin: i64,
    recent: [i64; SAMPLES],
    filled: usize,
    next_sample: usize,
    interval_ns: i64,
    last_deadline: i64,
    budget_ppm: i64,
}

impl Pacing {
    /// Before any wake-up was seen, with a spin budget of `budget_ppm`
    /// millionths of a core.
    pub(super) fn new(budget_ppm: u32) -> Self {
        Pacing {
            margin: 200_000,
            recent: [0i64; SAMPLES],
            filled: 0,
            next_sample: 0,
            interval_ns: 1_000_000_000,
            last_deadline: 0,
            budget_ppm: i64::from(budget_ppm),
        }
    }

    /// A timed wake-up for `deadline` came `latency` ns after it was asked
    /// for: learn the latency, and the pace. Returns the new margin.
    #[inline]
    pub(super) fn learn(&mut self, latency: i64, deadline: i64) -> i64 {
        self.recent[self.next_sample] = latency.min(MAX_SAMPLE_NS);
        self.next_sample = (self.next_sample + 1) % SAMPLES;
        self.filled = (self.filled + 1).min(SAMPLES);
        if deadline > self.last_deadline && self.last_deadline > 0 {
            let gap = (deadline - self.last_deadline).min(1_000_000_000);
            self.interval_ns += (gap - self.interval_ns) / 8;
        }
        self.last_deadline = deadline;
        self.margin = margin_within(
            &self.recent[..self.filled],
            self.interval_ns,
            self.budget_ppm,
        );
        self.margin
    }
}

/// The sleep margin: the largest one (within [`MIN_MARGIN_NS`],
/// [`MAX_MARGIN_NS`]) whose expected spin per firing, judged on the recent
/// wake-up latencies `samples` (ns), keeps spinning within `budget_ppm`
/// millionths of a core when firings come `interval_ns` apart. A firing
/// whose wake-up takes `L` spins `max(0, margin − L)` and is late by
/// `max(0, L − margin)`: the more the budget allows, the more firings land
/// on their instant exactly; none is ever later than its wake-up.
pub fn margin_within(samples: &[i64], interval_ns: i64, budget_ppm: i64) -> i64 {
    let mut sorted = [0i64; SAMPLES];
    let n = samples.len().min(SAMPLES);
    if n == 0 {
        return MIN_MARGIN_NS;
    }
    sorted[..n].copy_from_slice(&samples[..n]);
    let sorted = &mut sorted[..n];
    sorted.sort_unstable();
    // Spin allowed per firing, ns, summed over the n samples.
    let budget = (interval_ns.max(0) as i128 * budget_ppm.max(0) as i128 / 1_000_000) * n as i128;
    // spin(m) · n = Σ_{s < m} (m − s): piecewise linear, increasing. With
    // the k smallest below m (sum p), it reaches the budget at
    // m = (budget + p) / k, valid while m ≤ the next sample.
    let mut p: i128 = 0;
    let mut m = i128::from(sorted[0]);
    for k in 1..=n {
        p += i128::from(sorted[k - 1]);
        let at = (budget + p) / k as i128;
        if k == n || at <= i128::from(sorted[k]) {
            m = at.max(i128::from(sorted[k - 1]));
            break;
        }
    }
    // No more than covers the slowest recent wake-up (and a little): at a
    // low rate the budget would allow more spin than anything needs.
    let enough = i128::from(sorted[n - 1]) + i128::from(COVER_NS);
    (m.min(enough).min(i128::from(MAX_MARGIN_NS)) as i64).clamp(MIN_MARGIN_NS, MAX_MARGIN_NS)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Wake-ups of 20..=51 µs (1 µs apart), firings 1 ms apart.
    fn latencies() -> Vec<i64> {
        (20..52).map(|us| us * 1_000).collect()
    }

    /// Mean spin per firing at margin `m` over `samples`.
    fn spin(samples: &[i64], m: i64) -> f64 {
        samples.iter().map(|s| (m - s).max(0) as f64).sum::<f64>() / samples.len() as f64
    }

    #[test]
    fn the_margin_spends_the_spin_budget_and_no_more() {
        let l = latencies();
        // 1 % of a core at 1 000 firings/s: 10 µs of spin per firing.
        let m = margin_within(&l, 1_000_000, 10_000);
        assert!(
            (spin(&l, m) - 10_000.0).abs() < 1_000.0,
            "{m} spins {}",
            spin(&l, m)
        );
        // A tenth of the rate affords ten times the spin: every wake-up
        // covered (the margin past the slowest), and no more than that.
        let slow = margin_within(&l, 10_000_000, 10_000);
        assert!(slow > *l.last().expect("samples"), "{slow}");
        assert_eq!(slow, l.last().expect("samples") + COVER_NS);
        // No budget: no spin at all (at most the floor).
        assert!(margin_within(&l, 1_000_000, 0) <= 20_000);
        // More budget, more margin (never less).
        let mut prev = 0;
        for ppm in [0, 1_000, 5_000, 10_000, 50_000, 500_000] {
            let m = margin_within(&l, 1_000_000, ppm);
            assert!(m >= prev, "{ppm}: {m} < {prev}");
            prev = m;
        }
        assert_eq!(
            margin_within(&[600_000], 1_000_000_000, 500_000),
            MAX_MARGIN_NS
        );
        assert_eq!(margin_within(&[], 1_000_000, 10_000), MIN_MARGIN_NS);
    }
}
