//! The controller's metrics for Prometheus (`serve --metrics ADDR`, served
//! by `server::metrics`): counters bumped by the application and the
//! sessions, encoded on request in the Prometheus text format (0.0.4) by
//! `prometheus-client`.
//!
//! Every series the controller keeps is a `prometheus-client` metric in
//! one [`Registry`], so the library writes the format (HELP and TYPE,
//! label escaping, `_total` on counters); a counter's bump is an atomic
//! add. What only the scrape knows (agents connected, deliveries stored by
//! state) goes into a registry of its own made for that scrape. The agent
//! writes its exposition by hand (`baton_service::metrics`) for a reason
//! the controller does not have: see that module.
//!
//! Per-agent series (`agent` label: the last clock report) are kept for
//! connected agents only and removed when a stream ends: for a fleet of
//! ~1 000 agents that is a few thousand series, well within what one
//! Prometheus server takes; every other family has a fixed label set.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Metric, Registry};

use baton_store::DeliveryState;

/// `Content-Type` of the exposition [`Metrics::render`] writes.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

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

/// One label: (name, value).
type Label<V> = [(&'static str, V); 1];

/// A gauge of seconds.
type Seconds = Gauge<f64, AtomicU64>;

/// The controller's metrics.
#[derive(Debug)]
pub struct Metrics {
    /// Every series below, in the order of the exposition.
    registry: Registry,
    pushes_sent: Counter,
    /// Handles into `baton_controller_push_results_total`, by [`PUSH_RESULTS`].
    push_results: [Counter; 4],
    /// Handles into `baton_controller_delivery_updates_total`, by
    /// [`DELIVERY_STATES`].
    deliveries: [Counter; 4],
    feedback_ingested: Counter,
    feedback_duplicates: Counter,
    feedback_batches: Counter,
    /// Entries the agents said they dropped (outbox full).
    feedback_dropped_at_agent: Counter,
    /// Entries a store rolled back had acknowledged (lost).
    feedback_lost: Counter,
    /// Feedback or held entries an agent sent for a tenant it does not
    /// serve or a pack never delivered to it: dropped.
    foreign_entries: Counter,
    /// Streams refused because another journal's stream holds the id.
    duplicate_streams: Counter,
    /// Streams refused over the admission rate (`--admit-rate`).
    admit_refused: Counter,
    /// Events for the other replicas that could not be queued or stored.
    relay_dropped: Counter,
    /// Streams ended because a later stream of their agent (here or on
    /// another replica) fenced them.
    fenced_streams: Counter,
    /// Failed accepts (out of file descriptors, ...).
    accept_errors: Counter,
    /// Handles into `baton_controller_retention_deleted_total`, by
    /// [`RETAINED`].
    retention_deleted: [Counter; 3],
    clock_offset: Family<Label<String>, Seconds>,
    clock_uncertainty: Family<Label<String>, Seconds>,
    clock_locked: Family<Label<String>, Gauge>,
}

/// `m` as `name`. The registry ends every help text with a full stop
/// (ours have theirs), and writes a counter's `_total` itself (ours are
/// spelled in full here, as scraped).
fn register(r: &mut Registry, name: &str, help: &str, m: impl Metric) {
    let name = name.strip_suffix("_total").unwrap_or(name);
    r.register(name, help.strip_suffix('.').unwrap_or(help), m);
}

/// A counter family with one series per `values` (each there from the
/// start, at 0), and a handle to each.
fn labelled<const N: usize>(
    r: &mut Registry,
    name: &str,
    help: &str,
    label: &'static str,
    values: [&'static str; N],
) -> [Counter; N] {
    let family = Family::<Label<&'static str>, Counter>::default();
    let handles = values.map(|v| family.get_or_create_owned(&[(label, v)]));
    register(r, name, help, family);
    handles
}

fn counter(r: &mut Registry, name: &str, help: &str) -> Counter {
    let c = Counter::default();
    register(r, name, help, c.clone());
    c
}

impl Default for Metrics {
    fn default() -> Metrics {
        let mut r = Registry::default();
        register(
            &mut r,
            "baton_controller",
            "The controller's version (always 1).",
            Info::new([("version", env!("CARGO_PKG_VERSION"))]),
        );
        let pushes_sent = counter(
            &mut r,
            "baton_controller_pushes_total",
            "Pack versions sent to agents (retries included).",
        );
        let push_results = labelled(
            &mut r,
            "baton_controller_push_results_total",
            "Agents' answers to pushes, by result (acked, unchanged, nacked: refused for good, retry: refused for now).",
            "result",
            PUSH_RESULTS.map(|(_, v)| v),
        );
        let deliveries = labelled(
            &mut r,
            "baton_controller_delivery_updates_total",
            "Delivery records written (one pack version on one agent), by the state written.",
            "state",
            DELIVERY_STATES.map(DeliveryState::as_str),
        );
        let mut c = |name, help| counter(&mut r, name, help);
        let feedback_ingested = c(
            "baton_controller_feedback_ingested_total",
            "Feedback entries stored.",
        );
        let feedback_duplicates = c(
            "baton_controller_feedback_duplicates_total",
            "Feedback entries received again (a re-send after a lost ack) and not stored twice.",
        );
        let feedback_batches = c(
            "baton_controller_feedback_batches_total",
            "Feedback batches stored and acknowledged.",
        );
        let feedback_dropped_at_agent = c(
            "baton_controller_feedback_dropped_at_agent_total",
            "Feedback entries agents reported dropping because their outbox was full (dropped_before).",
        );
        let feedback_lost = c(
            "baton_controller_feedback_lost_total",
            "Feedback entries acknowledged by a store that was since rolled back (restored from an older copy): lost.",
        );
        let foreign_entries = c(
            "baton_controller_foreign_entries_total",
            "Feedback and held entries an agent sent for a tenant it does not serve or a pack never delivered to it: dropped.",
        );
        let duplicate_streams = c(
            "baton_controller_duplicate_streams_total",
            "Link streams refused because another journal's stream holds the agent id (two machines, one identity).",
        );
        let admit_refused = c(
            "baton_controller_admit_refused_total",
            "New link streams refused over the admission rate (--admit-rate): the agent retries after its backoff.",
        );
        let relay_dropped = c(
            "baton_controller_relay_dropped_total",
            "Events for the other replicas lost (queue full, or the store refused them): their agents' streams learn of the change at their next resync, their watchers not at all.",
        );
        let fenced_streams = c(
            "baton_controller_fenced_streams_total",
            "Link streams ended because a later stream of their agent, on this replica or another, owns it now.",
        );
        let accept_errors = c(
            "baton_controller_accept_errors_total",
            "Connections that could not be accepted (out of file descriptors, ...).",
        );
        let retention_deleted = labelled(
            &mut r,
            "baton_controller_retention_deleted_total",
            "Rows deleted by retention, by table.",
            "table",
            RETAINED.map(Retained::as_str),
        );
        let clock_offset = Family::default();
        register(
            &mut r,
            "baton_controller_agent_clock_offset_seconds",
            "Reference time minus the agent's system clock, from its last clock report (connected agents).",
            clock_offset.clone(),
        );
        let clock_uncertainty = Family::default();
        register(
            &mut r,
            "baton_controller_agent_clock_uncertainty_seconds",
            "The agent's clock uncertainty, from its last clock report (connected agents).",
            clock_uncertainty.clone(),
        );
        let clock_locked = Family::default();
        register(
            &mut r,
            "baton_controller_agent_clock_locked",
            "1 if the agent's clock is locked to a source, from its last clock report (connected agents).",
            clock_locked.clone(),
        );
        Metrics {
            registry: r,
            pushes_sent,
            push_results,
            deliveries,
            feedback_ingested,
            feedback_duplicates,
            feedback_batches,
            feedback_dropped_at_agent,
            feedback_lost,
            foreign_entries,
            duplicate_streams,
            admit_refused,
            relay_dropped,
            fenced_streams,
            accept_errors,
            retention_deleted,
            clock_offset,
            clock_uncertainty,
            clock_locked,
        }
    }
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
        self.pushes_sent.inc();
    }

    /// An agent's answer to a push.
    pub fn push_result(&self, r: PushResult) {
        let i = PUSH_RESULTS.iter().position(|(x, _)| *x == r).unwrap_or(0);
        self.push_results[i].inc();
    }

    /// A delivery record written in `state`. A local pack's row is not
    /// counted (the controller has no say over it; the deliveries gauge
    /// leaves it out too).
    pub fn delivery(&self, state: DeliveryState) {
        if let Some(i) = DELIVERY_STATES.iter().position(|s| *s == state) {
            self.deliveries[i].inc();
        }
    }

    /// A feedback batch stored: `inserted` new rows, `duplicates` re-sent.
    pub fn feedback(&self, inserted: usize, duplicates: usize) {
        self.feedback_batches.inc();
        self.feedback_ingested.inc_by(inserted as u64);
        self.feedback_duplicates.inc_by(duplicates as u64);
    }

    /// Feedback batches stored and pushes sent so far.
    pub fn activity(&self) -> (u64, u64) {
        (self.feedback_batches.get(), self.pushes_sent.get())
    }

    /// An agent reported `n` entries dropped from its outbox.
    pub fn dropped_at_agent(&self, n: u64) {
        self.feedback_dropped_at_agent.inc_by(n);
    }

    /// `n` acknowledged entries found lost (a store rolled back).
    pub fn feedback_lost(&self, n: u64) {
        self.feedback_lost.inc_by(n);
    }

    /// `n` entries of an agent dropped for naming what is not its own.
    pub fn foreign(&self, n: u64) {
        self.foreign_entries.inc_by(n);
    }

    /// A stream refused as a duplicate of a connected agent.
    pub fn duplicate_stream(&self) {
        self.duplicate_streams.inc();
    }

    /// Events for the other replicas lost (queue full, or the store
    /// refused them).
    pub fn relay_dropped(&self, n: u64) {
        self.relay_dropped.inc_by(n);
    }

    /// A new stream refused over the admission rate.
    pub fn admit_refused(&self) {
        self.admit_refused.inc();
    }

    /// A stream fenced by a later one of its agent.
    pub fn fenced_stream(&self) {
        self.fenced_streams.inc();
    }

    /// An accept that failed.
    pub fn accept_error(&self) {
        self.accept_errors.inc();
    }

    /// Rows retention deleted.
    pub fn retention(&self, what: Retained, n: u64) {
        self.retention_deleted[what.index()].inc_by(n);
    }

    /// An agent's clock report.
    pub fn clock(&self, agent: &str, c: AgentClock) {
        let l = [("agent", agent.to_string())];
        self.clock_offset.get_or_create(&l).set(secs(c.offset_ns));
        self.clock_uncertainty
            .get_or_create(&l)
            .set(secs(c.uncertainty_ns));
        self.clock_locked.get_or_create(&l).set(i64::from(c.locked));
    }

    /// An agent's stream ended: its per-agent series go.
    pub fn forget(&self, agent: &str) {
        let l = [("agent", agent.to_string())];
        self.clock_offset.remove(&l);
        self.clock_uncertainty.remove(&l);
        self.clock_locked.remove(&l);
    }

    /// The exposition, with `connected` agents and the stored deliveries
    /// by state (`None`: the store could not say; the family is left out).
    pub fn render(&self, connected: usize, deliveries: Option<&[(DeliveryState, u64)]>) -> String {
        let mut scrape = Registry::default();
        register(
            &mut scrape,
            "baton_controller_agents_connected",
            "Agents with a live link stream.",
            ConstGauge::new(i64::try_from(connected).unwrap_or(i64::MAX)),
        );
        if let Some(d) = deliveries {
            let stored = Family::<Label<&'static str>, Gauge>::default();
            for s in DELIVERY_STATES {
                let n: u64 = d.iter().filter(|(x, _)| *x == s).map(|(_, n)| *n).sum();
                stored
                    .get_or_create(&[("state", s.as_str())])
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            }
            register(
                &mut scrape,
                "baton_controller_deliveries",
                "Deliveries (one pack version on one agent) in the store, by state.",
                stored,
            );
        }
        let mut out = String::new();
        for r in [&self.registry, &scrape] {
            // Only a metric's own encoder can fail, and none of ours does.
            if let Err(e) = prometheus_text::encode(&mut out, r) {
                tracing::warn!("metrics: encoding failed: {e}");
            }
        }
        out
    }
}

/// Nanoseconds as seconds (the base unit).
fn secs(ns: i64) -> f64 {
    ns as f64 / 1e9
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
            "# HELP baton_controller_info The controller's version (always 1).",
            "# TYPE baton_controller_info gauge",
            concat!(
                "baton_controller_info{version=\"",
                env!("CARGO_PKG_VERSION"),
                "\"} 1"
            ),
            "# TYPE baton_controller_agents_connected gauge",
            "baton_controller_agents_connected 3",
            "# HELP baton_controller_pushes_total Pack versions sent to agents (retries included).",
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
            "# HELP baton_controller_accept_errors_total Connections that could not be accepted (out of file descriptors, ...).",
            "baton_controller_accept_errors_total 0",
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
