//! Retention: what grows for ever has an owner that deletes it. One task
//! wakes every sweep interval and deletes rows older than their window in
//! small batches, each its own store command, so ingest interleaves with
//! them and is never held up by a long delete. Rows younger than the
//! window are never touched (the store deletes only `< now - window`).
//!
//! Defaults (see the README for the arithmetic): feedback 30 days, clock
//! history 7 days, the audit log for ever.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::app::{App, now};
use crate::metrics::Retained;
use baton_model::RefTime;
use baton_store::StoreOps;
use baton_store::{Grows, StoreResult};

/// What is kept, and how the sweeper works.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Retention {
    /// Feedback younger than this is kept (`None`: for ever).
    pub feedback: Option<Duration>,
    /// Clock history younger than this is kept (`None`: for ever).
    pub clock: Option<Duration>,
    /// Audit records younger than this are kept (`None`: for ever).
    pub audit: Option<Duration>,
    /// Rows per delete command.
    pub batch: u32,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            feedback: Some(Duration::from_secs(30 * 24 * 3600)),
            clock: Some(Duration::from_secs(7 * 24 * 3600)),
            audit: None,
            batch: 500,
        }
    }
}

impl Retention {
    /// How often to sweep: a tenth of the shortest window, between 1 s and
    /// 1 h (so a table holds at most about one window and a tenth).
    pub fn every(&self) -> Option<Duration> {
        [self.feedback, self.clock, self.audit]
            .into_iter()
            .flatten()
            .min()
            .map(|w| (w / 10).clamp(Duration::from_secs(1), Duration::from_secs(3600)))
    }
}

/// Sweep until `stop`.
pub async fn run(app: Arc<App>, r: Retention, mut stop: watch::Receiver<bool>) {
    let Some(every) = r.every() else {
        return;
    };
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.changed() => return,
        }
        for (what, window) in [
            (Retained::Feedback, r.feedback),
            (Retained::Clock, r.clock),
            (Retained::Audit, r.audit),
        ] {
            let Some(window) = window else { continue };
            let before = now() - window;
            if let Err(e) = sweep(&app, what, before, r.batch).await {
                // Tried again at the next sweep; ingest is not affected.
                tracing::warn!("retention: {} not swept: {e}", what.as_str());
            }
        }
    }
}

/// Deletes `what` older than `before`, a batch at a time, until none is
/// left; how many went.
pub async fn sweep(app: &App, what: Retained, before: RefTime, batch: u32) -> StoreResult<u64> {
    // Whole days first, where the store keeps them apart (PostgreSQL):
    // what is left to go row by row is only what lies outside them.
    let grows = match what {
        Retained::Feedback => Some(Grows::Feedback),
        Retained::Clock => Some(Grows::Clock),
        Retained::Audit => None,
    };
    let mut total = match grows {
        Some(g) => app.store.drop_partitions_before(g, before).await?,
        None => 0,
    };
    app.metrics.retention(what, total);
    loop {
        let n = match what {
            Retained::Feedback => app.store.delete_feedback_before(before, batch).await?,
            Retained::Clock => app.store.delete_clock_before(before, batch).await?,
            Retained::Audit => app.store.delete_audit_before(before, batch).await?,
        };
        app.metrics.retention(what, n);
        total += n;
        if n < u64::from(batch) {
            if total > 0 {
                tracing::debug!(table = what.as_str(), rows = total, "retention swept");
            }
            return Ok(total);
        }
        // Let ingest's commands in between batches.
        tokio::task::yield_now().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sweep_interval_follows_the_shortest_window() {
        let mut r = Retention::default();
        assert_eq!(r.every(), Some(Duration::from_secs(3600)));
        r.feedback = Some(Duration::from_secs(10));
        assert_eq!(r.every(), Some(Duration::from_secs(1)));
        r.feedback = Some(Duration::from_secs(600));
        assert_eq!(r.every(), Some(Duration::from_secs(60)));
        r = Retention {
            feedback: None,
            clock: None,
            audit: None,
            batch: 1,
        };
        assert_eq!(r.every(), None, "nothing to sweep");
    }
}
