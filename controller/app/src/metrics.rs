//! The controller's counters for Prometheus (`serve --metrics ADDR`, served
//! by `server::metrics`): atomics bumped by the application and the
//! sessions, rendered on request (the exposition format is
//! `baton_service::metrics`, shared with the agent).
//!
//! Per-agent series (`agent` label: the last clock report) are kept for
//! connected agents only and removed when a stream ends: for a fleet of
//! ~1 000 agents that is a few thousand series, well within what one
//! Prometheus server takes; every other family has a fixed label set.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use baton_service::metrics::{Encoder, Kind, secs};

use baton_store::DeliveryState;

/// Results of pushes, as labels of `baton_controller_push_results_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PushResult {
    /// Accepted (a new version taken).
    Acked,
    /// Already held with the same text.
    Unchanged,
    /// Refused for good (invalid, refused by the agent's checks).
    Nacked,
    /// Refused for now (capacity, clock, unavailable): retried.
    Retry,
}

const PUSH_RESULTS: [(PushResult, &str); 4] = [
    (PushResult::Acked, "acked"),
    (PushResult::Unchanged, "unchanged"),
    (PushResult::Nacked, "nacked"),
    (PushResult::Retry, "retry"),
];

const DELIVERY_STATES: [DeliveryState; 4] = [
    DeliveryState::Pending,
    DeliveryState::Acked,
    DeliveryState::Nacked,
    DeliveryState::Cancelled,
];

/// An agent's last clock report.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AgentClock {
    /// Reference minus the agent's system clock, ns.
    pub offset_ns: i64,
    /// The agent's uncertainty, ns.
    pub uncertainty_ns: i64,
    /// Whether its clock is locked to a source.
    pub locked: bool,
}

/// The controller's counters.
#[derive(Debug, Default)]
pub struct Metrics {
    pushes_sent: AtomicU64,
    push_results: [AtomicU64; 4],
    deliveries: [AtomicU64; 4],
    feedback_ingested: AtomicU64,
    feedback_duplicates: AtomicU64,
    feedback_batches: AtomicU64,
    /// Entries the agents said they dropped (outbox full).
    feedback_dropped_at_agent: AtomicU64,
    /// Entries a store rolled back had acknowledged (lost).
    feedback_lost: AtomicU64,
    /// Feedback or held entries an agent sent for a tenant it does not
    /// serve or a pack never delivered to it: dropped.
    foreign_entries: AtomicU64,
    /// Streams refused because another journal's stream holds the id.
    duplicate_streams: AtomicU64,
    /// Streams refused over the admission rate (`--admit-rate`).
    admit_refused: AtomicU64,
    /// Events for the other replicas that could not be queued or stored.
    relay_dropped: AtomicU64,
    /// Streams ended because a later stream of their agent (here or on
    /// another replica) fenced them.
    fenced_streams: AtomicU64,
    /// Failed accepts (out of file descriptors, ...).
    accept_errors: AtomicU64,
    /// Rows deleted by retention: feedback, clock, audit.
    retention_deleted: [AtomicU64; 3],
    clocks: Mutex<BTreeMap<String, AgentClock>>,
}

/// What retention deletes, as labels of
/// `baton_controller_retention_deleted_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retained {
    /// Feedback rows.
    Feedback,
    /// Clock history rows.
    Clock,
    /// Audit records.
    Audit,
}

impl Retained {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Retained::Feedback => "feedback",
            Retained::Clock => "clock",
            Retained::Audit => "audit",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

const RETAINED: [Retained; 3] = [Retained::Feedback, Retained::Clock, Retained::Audit];

impl Metrics {
    /// A pack version sent to an agent (first try or again).
    pub fn push_sent(&self) {
        self.pushes_sent.fetch_add(1, Ordering::Relaxed);
    }

    /// An agent's answer to a push.
    pub fn push_result(&self, r: PushResult) {
        let i = PUSH_RESULTS.iter().position(|(x, _)| *x == r).unwrap_or(0);
        self.push_results[i].fetch_add(1, Ordering::Relaxed);
    }

    /// A delivery record written in `state`. A local pack's row is not
    /// counted (the controller has no say over it; the deliveries gauge
    /// leaves it out too).
    pub fn delivery(&self, state: DeliveryState) {
        if let Some(i) = DELIVERY_STATES.iter().position(|s| *s == state) {
            self.deliveries[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A feedback batch stored: `inserted` new rows, `duplicates` re-sent.
    pub fn feedback(&self, inserted: usize, duplicates: usize) {
        self.feedback_batches.fetch_add(1, Ordering::Relaxed);
        self.feedback_ingested
            .fetch_add(inserted as u64, Ordering::Relaxed);
        self.feedback_duplicates
            .fetch_add(duplicates as u64, Ordering::Relaxed);
    }

    /// Feedback batches stored and pushes sent so far.
    pub fn activity(&self) -> (u64, u64) {
        (
            self.feedback_batches.load(Ordering::Relaxed),
            self.pushes_sent.load(Ordering::Relaxed),
        )
    }

    /// An agent reported `n` entries dropped from its outbox.
    pub fn dropped_at_agent(&self, n: u64) {
        self.feedback_dropped_at_agent
            .fetch_add(n, Ordering::Relaxed);
    }

    /// `n` acknowledged entries found lost (a store rolled back).
    pub fn feedback_lost(&self, n: u64) {
        self.feedback_lost.fetch_add(n, Ordering::Relaxed);
    }

    /// `n` entries of an agent dropped for naming what is not its own.
    pub fn foreign(&self, n: u64) {
        self.foreign_entries.fetch_add(n, Ordering::Relaxed);
    }

    /// A stream refused as a duplicate of a connected agent.
    pub fn duplicate_stream(&self) {
        self.duplicate_streams.fetch_add(1, Ordering::Relaxed);
    }

    /// Events for the other replicas lost (queue full, or the store
    /// refused them).
    pub fn relay_dropped(&self, n: u64) {
        self.relay_dropped.fetch_add(n, Ordering::Relaxed);
    }

    /// A new stream refused over the admission rate.
    pub fn admit_refused(&self) {
        self.admit_refused.fetch_add(1, Ordering::Relaxed);
    }

    /// A stream fenced by a later one of its agent.
    pub fn fenced_stream(&self) {
        self.fenced_streams.fetch_add(1, Ordering::Relaxed);
    }

    /// An accept that failed.
    pub fn accept_error(&self) {
        self.accept_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// Rows retention deleted.
    pub fn retention(&self, what: Retained, n: u64) {
        self.retention_deleted[what.index()].fetch_add(n, Ordering::Relaxed);
    }

    /// An agent's clock report.
    pub fn clock(&self, agent: &str, c: AgentClock) {
        let mut m = self.clocks.lock().unwrap_or_else(|p| p.into_inner());
        match m.get_mut(agent) {
            Some(v) => *v = c,
            None => {
                m.insert(agent.to_string(), c);
            }
        }
    }

    /// An agent's stream ended: its per-agent series go.
    pub fn forget(&self, agent: &str) {
        self.clocks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(agent);
    }

    /// The exposition, with `connected` agents and the stored deliveries
    /// by state (`None`: the store could not say; the family is left out).
    pub fn render(&self, connected: usize, deliveries: Option<&[(DeliveryState, u64)]>) -> String {
        let mut e = Encoder::new();
        self.render_links(&mut e, connected);
        self.render_deliveries(&mut e, deliveries);
        self.render_feedback(&mut e);
        self.render_retention(&mut e);
        self.render_clocks(&mut e);
        e.finish()
    }

    /// The controller itself, its link streams and its pushes.
    fn render_links(&self, e: &mut Encoder, connected: usize) {
        e.family(
            "baton_controller_info",
            Kind::Gauge,
            "The controller's version (always 1).",
        );
        e.sample(
            "baton_controller_info",
            &[("version", env!("CARGO_PKG_VERSION"))],
            1.0,
        );
        e.single(
            "baton_controller_agents_connected",
            Kind::Gauge,
            "Agents with a live link stream.",
            connected as f64,
        );
        e.single(
            "baton_controller_pushes_total",
            Kind::Counter,
            "Pack versions sent to agents (retries included).",
            self.pushes_sent.load(Ordering::Relaxed) as f64,
        );
        e.family(
            "baton_controller_push_results_total",
            Kind::Counter,
            "Agents' answers to pushes, by result (acked, unchanged, nacked: refused for good, retry: refused for now).",
        );
        for (i, (_, name)) in PUSH_RESULTS.iter().enumerate() {
            let n = self.push_results[i].load(Ordering::Relaxed);
            e.sample(
                "baton_controller_push_results_total",
                &[("result", name)],
                n as f64,
            );
        }
    }

    /// Delivery records written, and stored by state.
    fn render_deliveries(&self, e: &mut Encoder, deliveries: Option<&[(DeliveryState, u64)]>) {
        e.family(
            "baton_controller_delivery_updates_total",
            Kind::Counter,
            "Delivery records written (one pack version on one agent), by the state written.",
        );
        for (i, s) in DELIVERY_STATES.iter().enumerate() {
            let n = self.deliveries[i].load(Ordering::Relaxed);
            e.sample(
                "baton_controller_delivery_updates_total",
                &[("state", s.as_str())],
                n as f64,
            );
        }
        if let Some(d) = deliveries {
            e.family(
                "baton_controller_deliveries",
                Kind::Gauge,
                "Deliveries (one pack version on one agent) in the store, by state.",
            );
            for s in DELIVERY_STATES {
                let n = d
                    .iter()
                    .filter(|(x, _)| *x == s)
                    .map(|(_, n)| *n)
                    .sum::<u64>();
                e.sample(
                    "baton_controller_deliveries",
                    &[("state", s.as_str())],
                    n as f64,
                );
            }
        }
    }

    /// Feedback stored, and the counters of entries and streams dropped or refused.
    fn render_feedback(&self, e: &mut Encoder) {
        e.single(
            "baton_controller_feedback_ingested_total",
            Kind::Counter,
            "Feedback entries stored.",
            self.feedback_ingested.load(Ordering::Relaxed) as f64,
        );
        e.single(
            "baton_controller_feedback_duplicates_total",
            Kind::Counter,
            "Feedback entries received again (a re-send after a lost ack) and not stored twice.",
            self.feedback_duplicates.load(Ordering::Relaxed) as f64,
        );
        e.single(
            "baton_controller_feedback_batches_total",
            Kind::Counter,
            "Feedback batches stored and acknowledged.",
            self.feedback_batches.load(Ordering::Relaxed) as f64,
        );
        for (name, help, v) in [
            (
                "baton_controller_feedback_dropped_at_agent_total",
                "Feedback entries agents reported dropping because their outbox was full (dropped_before).",
                &self.feedback_dropped_at_agent,
            ),
            (
                "baton_controller_feedback_lost_total",
                "Feedback entries acknowledged by a store that was since rolled back (restored from an older copy): lost.",
                &self.feedback_lost,
            ),
            (
                "baton_controller_foreign_entries_total",
                "Feedback and held entries an agent sent for a tenant it does not serve or a pack never delivered to it: dropped.",
                &self.foreign_entries,
            ),
            (
                "baton_controller_duplicate_streams_total",
                "Link streams refused because another journal's stream holds the agent id (two machines, one identity).",
                &self.duplicate_streams,
            ),
            (
                "baton_controller_admit_refused_total",
                "New link streams refused over the admission rate (--admit-rate): the agent retries after its backoff.",
                &self.admit_refused,
            ),
            (
                "baton_controller_relay_dropped_total",
                "Events for the other replicas lost (queue full, or the store refused them): their agents' streams learn of the change at their next resync, their watchers not at all.",
                &self.relay_dropped,
            ),
            (
                "baton_controller_fenced_streams_total",
                "Link streams ended because a later stream of their agent, on this replica or another, owns it now.",
                &self.fenced_streams,
            ),
            (
                "baton_controller_accept_errors_total",
                "Connections that could not be accepted (out of file descriptors, ...).",
                &self.accept_errors,
            ),
        ] {
            e.single(name, Kind::Counter, help, v.load(Ordering::Relaxed) as f64);
        }
    }

    /// Rows retention deleted.
    fn render_retention(&self, e: &mut Encoder) {
        e.family(
            "baton_controller_retention_deleted_total",
            Kind::Counter,
            "Rows deleted by retention, by table.",
        );
        for r in RETAINED {
            e.sample(
                "baton_controller_retention_deleted_total",
                &[("table", r.as_str())],
                self.retention_deleted[r.index()].load(Ordering::Relaxed) as f64,
            );
        }
    }

    /// Connected agents' clocks, from their last reports.
    fn render_clocks(&self, e: &mut Encoder) {
        let clocks = self
            .clocks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        e.family(
            "baton_controller_agent_clock_offset_seconds",
            Kind::Gauge,
            "Reference time minus the agent's system clock, from its last clock report (connected agents).",
        );
        for (a, c) in &clocks {
            e.sample(
                "baton_controller_agent_clock_offset_seconds",
                &[("agent", a)],
                secs(c.offset_ns),
            );
        }
        e.family(
            "baton_controller_agent_clock_uncertainty_seconds",
            Kind::Gauge,
            "The agent's clock uncertainty, from its last clock report (connected agents).",
        );
        for (a, c) in &clocks {
            e.sample(
                "baton_controller_agent_clock_uncertainty_seconds",
                &[("agent", a)],
                secs(c.uncertainty_ns),
            );
        }
        e.family(
            "baton_controller_agent_clock_locked",
            Kind::Gauge,
            "1 if the agent's clock is locked to a source, from its last clock report (connected agents).",
        );
        for (a, c) in &clocks {
            e.sample(
                "baton_controller_agent_clock_locked",
                &[("agent", a)],
                if c.locked { 1.0 } else { 0.0 },
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_per_agent_series() {
        let m = Metrics::default();
        m.push_sent();
        m.push_result(PushResult::Acked);
        m.push_result(PushResult::Retry);
        m.delivery(DeliveryState::Pending);
        m.delivery(DeliveryState::Acked);
        m.delivery(DeliveryState::Local);
        m.feedback(5, 2);
        m.clock(
            "edge \"7\"",
            AgentClock {
                offset_ns: -1_500,
                uncertainty_ns: 2_000_000,
                locked: true,
            },
        );
        let t = m.render(3, Some(&[(DeliveryState::Acked, 4)]));
        for line in [
            "baton_controller_agents_connected 3",
            "# TYPE baton_controller_pushes_total counter",
            "baton_controller_pushes_total 1",
            "baton_controller_push_results_total{result=\"acked\"} 1",
            "baton_controller_push_results_total{result=\"retry\"} 1",
            "baton_controller_push_results_total{result=\"nacked\"} 0",
            "baton_controller_delivery_updates_total{state=\"pending\"} 1",
            "baton_controller_delivery_updates_total{state=\"cancelled\"} 0",
            "baton_controller_deliveries{state=\"acked\"} 4",
            "baton_controller_deliveries{state=\"pending\"} 0",
            "baton_controller_feedback_ingested_total 5",
            "baton_controller_feedback_duplicates_total 2",
            "baton_controller_agent_clock_offset_seconds{agent=\"edge \\\"7\\\"\"} -0.0000015",
            "baton_controller_agent_clock_uncertainty_seconds{agent=\"edge \\\"7\\\"\"} 0.002",
            "baton_controller_agent_clock_locked{agent=\"edge \\\"7\\\"\"} 1",
        ] {
            assert!(t.lines().any(|l| l == line), "{line} in\n{t}");
        }
        m.forget("edge \"7\"");
        let t = m.render(0, None);
        assert!(!t.contains("{agent=") && !t.contains("baton_controller_deliveries{"));
    }
}
