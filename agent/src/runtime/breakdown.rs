//! Where each firing's lateness came from, for `bench-latency`: the
//! dispatcher's [`Timing`] of every executed attempt, and how long the
//! control thread's durable start records took (written and synced
//! before a batch is handed over). Kept only when asked
//! ([`crate::runtime::Agent::measure_breakdown`]): a few histogram records
//! per firing that production does not need.

use hdrhistogram::Histogram;

use crate::dispatcher::Timing;

/// A firing-lateness histogram: 1 ns .. 60 s at 2 significant digits, a
/// fixed bound (the run's tally, the breakdown's steps and the live view's
/// status line).
pub fn lateness_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 2)
        .or_else(|_| Histogram::new(2))
        .unwrap_or_else(|_| unreachable!("2 significant digits are valid"))
}

/// One histogram per step, ns.
#[derive(Debug)]
pub struct Breakdown {
    /// How far before its deadline a job reached the dispatcher (jobs
    /// that came after it are counted in `arrived_late`).
    pub lead: Histogram<u64>,
    /// Jobs that reached the dispatcher past their deadline.
    pub arrived_late: u64,
    /// The timed wake-up's lateness before a job.
    pub wake_late: Histogram<u64>,
    /// The spin to the deadline.
    pub spin: Histogram<u64>,
    /// The device call.
    pub call: Histogram<u64>,
    /// One batch's start records, written and synced (control thread).
    pub journal: Histogram<u64>,
}

impl Default for Breakdown {
    fn default() -> Self {
        Breakdown {
            lead: lateness_histogram(),
            arrived_late: 0,
            wake_late: lateness_histogram(),
            spin: lateness_histogram(),
            call: lateness_histogram(),
            journal: lateness_histogram(),
        }
    }
}

impl Breakdown {
    /// An executed attempt's way through the dispatcher.
    pub fn record(&mut self, t: &Timing) {
        if t.lead_ns < 0 {
            self.arrived_late += 1;
        } else {
            self.lead.saturating_record(t.lead_ns as u64);
        }
        self.wake_late
            .saturating_record(t.wake_late_ns.max(0) as u64);
        self.spin.saturating_record(t.spin_ns.max(0) as u64);
        self.call.saturating_record(t.call_ns.max(0) as u64);
    }

    /// Each step as `name p50 p99 max`, ns (lead: p1, the closest calls).
    pub fn rows(&self) -> Vec<(&'static str, [u64; 3])> {
        let q = |h: &Histogram<u64>, p: f64| h.value_at_quantile(p);
        let three = |h: &Histogram<u64>| [q(h, 0.5), q(h, 0.99), h.max()];
        vec![
            ("arrival lead (p50, p1, min)", {
                let h = &self.lead;
                [q(h, 0.5), q(h, 0.01), h.min()]
            }),
            ("wake-up lateness", three(&self.wake_late)),
            ("spin", three(&self.spin)),
            ("device call", three(&self.call)),
            ("journal start records per batch", three(&self.journal)),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_step_is_kept_apart_and_late_arrivals_are_counted_not_recorded() {
        let mut b = Breakdown::default();
        for i in 1..=100 {
            b.record(&Timing {
                lead_ns: 1_000_000 + i,
                wake_late_ns: 50_000,
                spin_ns: i * 1_000,
                call_ns: 2_000,
            });
        }
        b.record(&Timing {
            lead_ns: -5,
            ..Timing::default()
        });
        assert_eq!(b.arrived_late, 1);
        assert_eq!(b.lead.len(), 100);
        let rows = b.rows();
        let spin = rows.iter().find(|r| r.0 == "spin").map(|r| r.1);
        // 2 significant digits: 100 µs within 1 %.
        assert!(
            spin.is_some_and(|[p50, p99, max]| {
                (49_000..=51_000).contains(&p50) && p99 >= 98_000 && max >= 99_000
            }),
            "{spin:?}"
        );
        let call = rows.iter().find(|r| r.0 == "device call").map(|r| r.1[0]);
        assert!(
            call.is_some_and(|c| (1_980..=2_020).contains(&c)),
            "{call:?}"
        );
    }
}
