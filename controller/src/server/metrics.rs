//! Prometheus metrics of the controller (`serve --metrics ADDR`): counters
//! kept in atomics by the sessions, rendered on request by a small tokio
//! listener on the server's runtime (the request parsing, the answer and
//! the exposition format are `baton_service::metrics`, shared with the
//! agent). No HTTP framework: one GET every few seconds needs none, and
//! tonic's own axum router is for gRPC.
//!
//! Per-agent series (`agent` label: the last clock report) are kept for
//! connected agents only and removed when a stream ends: for a fleet of
//! ~1 000 agents that is a few thousand series, well within what one
//! Prometheus server takes; every other family has a fixed label set.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use baton_service::metrics::{Encoder, Kind, Request, parse_request, response, secs};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::Shared;
use crate::store::DeliveryState;

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
    clocks: Mutex<BTreeMap<String, AgentClock>>,
}

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

    /// A delivery record written in `state`.
    pub fn delivery(&self, state: DeliveryState) {
        let i = DELIVERY_STATES
            .iter()
            .position(|s| *s == state)
            .unwrap_or(0);
        self.deliveries[i].fetch_add(1, Ordering::Relaxed);
    }

    /// A feedback batch stored: `inserted` new rows, `duplicates` re-sent.
    pub fn feedback(&self, inserted: usize, duplicates: usize) {
        self.feedback_batches.fetch_add(1, Ordering::Relaxed);
        self.feedback_ingested
            .fetch_add(inserted as u64, Ordering::Relaxed);
        self.feedback_duplicates
            .fetch_add(duplicates as u64, Ordering::Relaxed);
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
        e.finish()
    }
}

/// Serve `/metrics` on `listener` until the task is aborted: one task
/// per connection, each bounded by the request size and a timeout.
pub async fn serve(listener: tokio::net::TcpListener, shared: std::sync::Arc<Shared>) {
    loop {
        let Ok((mut s, _)) = listener.accept().await else {
            // Out of descriptors, say: do not spin on it.
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(baton_service::metrics::IO_TIMEOUT, async {
                let mut buf = Vec::with_capacity(1024);
                let mut chunk = [0u8; 1024];
                let req = loop {
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            buf.extend_from_slice(&chunk[..n]);
                            match parse_request(&buf) {
                                Request::Incomplete => continue,
                                r => break r,
                            }
                        }
                    }
                };
                // The store is asked only for a scrape (not for a 404).
                let deliveries = match &req {
                    Request::Get { path, .. } if path == "/metrics" => {
                        match shared.store.delivery_counts().await {
                            Ok(d) => Some(d),
                            Err(e) => {
                                tracing::warn!("metrics: deliveries by state: {e}");
                                None
                            }
                        }
                    }
                    _ => None,
                };
                let out = response(&req, || {
                    shared
                        .metrics
                        .render(shared.hub.connected(), deliveries.as_deref())
                });
                let _ = s.write_all(&out).await;
                let _ = s.shutdown().await;
            })
            .await;
        });
    }
}

/// Bind the metrics listener (before READY: a busy address is an error at
/// start).
pub async fn bind(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("metrics: cannot listen on {addr}: {e}"))
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
