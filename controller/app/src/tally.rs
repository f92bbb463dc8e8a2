//! A rollout stage's feedback, tallied as it is read: counts and a
//! bounded lateness histogram per cohort, so the driver reads only what
//! was stored since its last look.

use baton_model::time::{self, SignedDuration};
use baton_model::{CohortFigures, FeedbackRow, Mark};
use baton_proto::wire::Outcome;
use hdrhistogram::Histogram;

/// Feedback of one stage's window already read: the driver reads only
/// what was stored since its last look.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    /// Where the stage's feedback has been read to (`None`: nothing read
    /// yet, start at the window's beginning).
    pub(crate) read_to: Option<Mark>,
    pub(crate) cohort: Acc,
    pub(crate) baseline: Acc,
    /// Settled firings of the agents the current stage admitted.
    pub(crate) stage_settled: u64,
}

/// One cohort's firings in a stage's window: counts and a lateness
/// histogram (bounded: a 10 kHz pack soaking for an hour is 36 million
/// firings, a few tens of KB here).
#[derive(Clone, Debug)]
pub(crate) struct Acc {
    pub(crate) settled: u64,
    failed: u64,
    unknown: u64,
    lateness_ns: Histogram<u64>,
}

/// 1 ns to an hour at 3 significant digits: 0.1 % resolution.
fn lateness_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000_000, 3)
        .or_else(|_| Histogram::new(3))
        .unwrap_or_else(|_| unreachable!("3 significant digits are valid"))
}

impl Default for Acc {
    fn default() -> Self {
        Acc {
            settled: 0,
            failed: 0,
            unknown: 0,
            lateness_ns: lateness_histogram(),
        }
    }
}

impl Acc {
    fn late(&mut self, lateness: SignedDuration) {
        // Early (negative) counts as on time; past the bound as the bound.
        let ns = time::span_ns(lateness);
        self.lateness_ns.saturating_record(ns.max(1).unsigned_abs());
    }

    pub(crate) fn add(&mut self, f: &FeedbackRow) {
        if f.execution_id.is_empty() {
            return;
        }
        match f.outcome {
            Outcome::Ok => self.late(f.lateness),
            Outcome::Failed | Outcome::GiveUp => {
                self.failed += 1;
                self.late(f.lateness);
            }
            Outcome::Skipped => self.failed += 1,
            Outcome::Unknown => self.unknown += 1,
            // Not settled: another attempt follows; or pack-wide.
            Outcome::Retry | Outcome::SafeState | Outcome::Unspecified => return,
        }
        self.settled += 1;
    }

    pub(crate) fn figures(&self, agents: u64, offset_max: Option<SignedDuration>) -> CohortFigures {
        let h = &self.lateness_ns;
        let lateness_p99 = (!h.is_empty())
            .then(|| time::span(i64::try_from(h.value_at_quantile(0.99)).unwrap_or(i64::MAX)));
        CohortFigures {
            agents,
            settled: self.settled,
            stage_settled: 0,
            failed: self.failed,
            unknown: self.unknown,
            lateness_p99,
            offset_max,
        }
    }
}
