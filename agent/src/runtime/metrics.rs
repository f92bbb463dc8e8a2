//! The control thread's side of `/metrics` (`crate::metrics`): a snapshot
//! of what it owns, published at each heartbeat without ever waiting.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::metrics::{ClockSnap, DispatchSnap, Published, Snapshot};
use baton_clock::estimator::ClockState;
use baton_clock::sample::SourceKind;

use super::agent::Agent;

impl Agent {
    /// Publish metrics to `p` (from now on, at each heartbeat).
    pub fn publish_metrics_to(&mut self, p: Arc<Published>) {
        p.try_publish(self.metrics_snapshot());
        self.upkeep.metrics = Some(p);
    }

    /// A heartbeat's publication (a no-op without `--metrics`).
    pub(super) fn publish_metrics(&self) {
        if let Some(p) = &self.upkeep.metrics {
            // Skipped if the metrics thread holds the slot just now.
            p.try_publish(self.metrics_snapshot());
        }
    }

    fn metrics_snapshot(&self) -> Snapshot {
        let t = &self.firing.tally;
        let mut executions = BTreeMap::new();
        for (k, by) in &t.executions {
            executions.insert(
                (k.tenant.clone(), k.pack.clone()),
                by.iter().copied().collect::<BTreeMap<_, _>>(),
            );
        }
        let dispatch = self.ports.device.stats().map(|s| DispatchSnap {
            jobs: s.jobs.load(Ordering::Relaxed),
            spin_ns: s.spin_ns.load(Ordering::Relaxed),
            margin_ns: s.margin_ns.load(Ordering::Relaxed),
            arrived_late: s.arrived_late.load(Ordering::Relaxed),
            lost_results: s.lost_results.load(Ordering::Relaxed),
        });
        let (link_connected, link_queue, link_stale) = match self.link_metrics() {
            Some((up, q, stale)) => (Some(up), q, stale),
            None => (None, 0, Default::default()),
        };
        Snapshot {
            id: self.cfg.id.clone(),
            executions,
            lateness: t.lateness.clone(),
            early: t.early,
            retries: t.retries,
            skips: t.skips,
            give_ups: t.give_ups,
            safe_states: t.safe_states.iter().map(|(k, v)| (*k, *v)).collect(),
            packs: self.plane.held.len(),
            outbox_depth: self.journal.outbox_len(),
            outbox_dropped: self.journal.dropped(),
            journal_bytes: self.journal.log_bytes(),
            journal_syncs: self.journal.syncs(),
            dispatch_backlog: self.firing.arming.backlog_len(),
            dispatch,
            clock: Some(self.clock_snap()),
            link_connected,
            link_queue,
            link_stale,
            session_gen: self.journal.session_gen(),
        }
    }

    /// The clock as the controller's clock report gives it: the offset is
    /// reference minus the system clock.
    fn clock_snap(&self) -> ClockSnap {
        let Some(e) = self.clock.status() else {
            // A clock that is reference time by construction (tests).
            return ClockSnap {
                source: SourceKind::System,
                state: ClockState::Locked,
                offset_ns: 0,
                uncertainty_ns: self.clock.uncertainty_ns(),
                jitter_ns: 0,
                frequency_ppm: 0.0,
            };
        };
        let (_, system_offset, _) = baton_clock::system::read_offset();
        ClockSnap {
            source: e.source,
            state: e.state,
            offset_ns: e.target_ns.saturating_sub(system_offset),
            uncertainty_ns: e.uncertainty_ns,
            jitter_ns: e.jitter_ns,
            frequency_ppm: e.frequency_ppm,
        }
    }
}
