//! Prometheus metrics of the agent (`--metrics ADDR`, config `metrics:`).
//!
//! Threads: the control thread builds a [`Snapshot`] from what it owns
//! (the [`Tally`](crate::runtime::feedback::Tally), the journal, the clock
//! estimate, the dispatcher's `Stats` atomics) at each heartbeat (10 per
//! second) and publishes it with a `try_lock`: if the metrics thread holds
//! the slot at that instant, this heartbeat's snapshot is skipped and the
//! next one goes out. So the control thread never waits on the metrics
//! server, and the dispatcher is not touched at all (its counters are
//! atomics read by the control thread, as the live view reads them).
//!
//! The metrics thread (`baton-metrics`) serves `/metrics` with the small
//! blocking server of `baton_service::metrics` (one connection at a time,
//! bounded request, timeouts): not the link's tokio runtime, which exists
//! only with a controller, and no HTTP crate for one GET every few
//! seconds. It clones the `Arc` of the last snapshot (the lock is held
//! for that clone only) and renders outside the lock.
//!
//! Why not `prometheus-client`, as the controller: its label families and
//! histograms are updated behind locks its encoder holds while a scrape
//! renders, so counting a firing (on the control thread, or on the
//! dispatcher's SCHED_FIFO thread for its own counters) could wait on the
//! metrics thread. Here counting a firing is an add on a value its thread
//! owns, or an atomic, never a lock; `baton_service::metrics` writes the
//! text.
//!
//! Names follow node_exporter / chrony_exporter habits: `baton_` prefix,
//! base units (seconds), `_total` counters, states as one gauge per state
//! set to 0 or 1. Series per pack (`tenant`, `pack`, `result`) are bounded
//! by the agent's `max-packs`.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};

use baton_service::metrics::{Encoder, Kind, secs};

use baton_clock::estimator::ClockState;
use baton_clock::sample::SourceKind;

/// Upper bounds of the start-lateness histogram's buckets, ns: 1 µs (a
/// good RT box) to 10 s (a catch-up firing).
pub const LATENESS_BOUNDS_NS: [i64; 17] = [
    1_000,
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    100_000_000,
    1_000_000_000,
    5_000_000_000,
    10_000_000_000,
];

/// Start lateness of what touched the device, in the histogram's buckets.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Lateness {
    /// Observations per bucket (not cumulative); the last is `+Inf`.
    pub counts: [u64; LATENESS_BOUNDS_NS.len() + 1],
    /// Sum of the observations, ns.
    pub sum_ns: i128,
}

impl Lateness {
    /// Count one start `lateness_ns` late (an early start counts as 0:
    /// `baton_executions_early_total` counts those).
    pub fn observe(&mut self, lateness_ns: i64) {
        let l = lateness_ns.max(0);
        let i = LATENESS_BOUNDS_NS.partition_point(|b| *b < l);
        self.counts[i] += 1;
        self.sum_ns += i128::from(l);
    }
}

/// The clock as the metrics show it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClockSnap {
    /// The source followed.
    pub source: SourceKind,
    /// Its state.
    pub state: ClockState,
    /// Reference minus the system clock (`CLOCK_REALTIME`), ns: what the
    /// controller's clock report says too.
    pub offset_ns: i64,
    /// How far reference time may be from the agent's estimate, ns.
    pub uncertainty_ns: i64,
    /// Spread of the source's samples around its fit, ns.
    pub jitter_ns: i64,
    /// Rate error of the monotonic clock against reference, ppm.
    pub frequency_ppm: f64,
}

/// The dispatcher's counters (copied from its `Stats` atomics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DispatchSnap {
    /// Jobs run.
    pub jobs: u64,
    /// Time spent spinning before deadlines, ns.
    pub spin_ns: u64,
    /// The current wake-up margin (how early the futex wait ends), ns.
    pub margin_ns: u64,
    /// Jobs that reached the dispatcher already past their deadline.
    pub arrived_late: u64,
    /// Results that found the result queue full (always 0).
    pub lost_results: u64,
}

/// Refusals of a stale controller (a session generation below the highest
/// seen): an operator alerts on these, since each means a controller
/// replica tried to act after it lost the agent, or a store went back.
pub use baton_control::session::StaleCounts as StaleSnap;

/// Everything `/metrics` shows, as of one heartbeat of the control loop.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// Agent id.
    pub id: String,
    /// Executions by (tenant, pack) and result word.
    pub executions: BTreeMap<(String, String), BTreeMap<&'static str, u64>>,
    /// Start lateness.
    pub lateness: Lateness,
    /// Attempts that started before their instant.
    pub early: u64,
    /// Retries scheduled.
    pub retries: u64,
    /// Occurrences skipped.
    pub skips: u64,
    /// Occurrences given up on.
    pub give_ups: u64,
    /// Safe-state entries by reason.
    pub safe_states: BTreeMap<&'static str, u64>,
    /// Packs held.
    pub packs: usize,
    /// Unacknowledged feedback in the journal's outbox.
    pub outbox_depth: usize,
    /// Outbox entries dropped at its cap and not yet reported upstream.
    pub outbox_dropped: u64,
    /// Size of the journal file, bytes.
    pub journal_bytes: u64,
    /// fdatasync calls on the journal's log since start.
    pub journal_syncs: u64,
    /// Jobs waiting for dispatcher credit.
    pub dispatch_backlog: usize,
    /// The dispatcher's counters (`None`: no dispatcher thread).
    pub dispatch: Option<DispatchSnap>,
    /// The clock.
    pub clock: Option<ClockSnap>,
    /// The controller link: `Some(welcomed)` when a controller is
    /// configured.
    pub link_connected: Option<bool>,
    /// Messages waiting in the control thread's queue for the link.
    pub link_queue: usize,
    /// What the agent refused from stale controllers (fencing).
    pub link_stale: StaleSnap,
    /// The highest controller session generation journalled (0: none).
    pub session_gen: u64,
}

/// Where the control thread leaves the latest snapshot.
#[derive(Debug, Default)]
pub struct Published(Mutex<Arc<Snapshot>>);

impl Published {
    /// Replace the snapshot unless the metrics thread holds it right now
    /// (then `false`: the next heartbeat publishes). Never waits.
    pub fn try_publish(&self, s: Snapshot) -> bool {
        match self.0.try_lock() {
            Ok(mut slot) => {
                *slot = Arc::new(s);
                true
            }
            Err(std::sync::TryLockError::Poisoned(p)) => {
                *p.into_inner() = Arc::new(s);
                true
            }
            Err(std::sync::TryLockError::WouldBlock) => false,
        }
    }

    /// The latest snapshot.
    pub fn latest(&self) -> Arc<Snapshot> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Bind `addr` (on the caller's thread, so a bad or busy address is an
/// error at start) and serve `/metrics` from a thread of its own
/// (`baton-metrics`) for the rest of the process. Returns where the
/// control thread publishes, and the bound address (port 0: any).
pub fn serve(addr: SocketAddr) -> std::io::Result<(Arc<Published>, SocketAddr)> {
    let listener = TcpListener::bind(addr)?;
    let bound = listener.local_addr()?;
    let published = Arc::new(Published::default());
    let p = published.clone();
    std::thread::Builder::new()
        .name("baton-metrics".into())
        .spawn(move || {
            baton_service::metrics::serve_blocking(listener, || render(&p.latest()));
        })?;
    Ok((published, bound))
}

const CLOCK_STATES: [ClockState; 4] = [
    ClockState::Syncing,
    ClockState::Locked,
    ClockState::Holdover,
    ClockState::FreeRunning,
];
const CLOCK_SOURCES: [SourceKind; 4] = [
    SourceKind::Ptp,
    SourceKind::Ntp,
    SourceKind::Link,
    SourceKind::System,
];

/// The exposition of `s`, family by family.
pub fn render(s: &Snapshot) -> String {
    let mut e = Encoder::new();
    render_executions(&mut e, s);
    render_state(&mut e, s);
    render_dispatcher(&mut e, s);
    render_clock(&mut e, s);
    render_link(&mut e, s);
    e.finish()
}

/// The agent's identity and what its executions did: counts by pack and
/// result, start lateness, retries, skips, give-ups and safe-state entries.
fn render_executions(e: &mut Encoder, s: &Snapshot) {
    e.family(
        "baton_agent_info",
        Kind::Gauge,
        "The agent's id and version (always 1).",
    );
    e.sample(
        "baton_agent_info",
        &[("id", &s.id), ("version", crate::version::version())],
        1.0,
    );

    e.family(
        "baton_executions_total",
        Kind::Counter,
        "Executed or not-run attempts and side actions since the agent started, by pack and result (ok, failed, late, withdrawn, stopped).",
    );
    for ((tenant, pack), by) in &s.executions {
        for (result, n) in by {
            e.sample(
                "baton_executions_total",
                &[("tenant", tenant), ("pack", pack), ("result", result)],
                *n as f64,
            );
        }
    }
    e.family(
        "baton_execution_start_lateness_seconds",
        Kind::Histogram,
        "How late executions that touched the device started after their scheduled instant (early starts count as 0).",
    );
    let bounds: Vec<f64> = LATENESS_BOUNDS_NS.iter().map(|b| secs(*b)).collect();
    e.histogram(
        "baton_execution_start_lateness_seconds",
        &[],
        &bounds,
        &s.lateness.counts,
        s.lateness.sum_ns as f64 / 1e9,
    );
    e.single(
        "baton_executions_early_total",
        Kind::Counter,
        "Executions that started before their scheduled instant.",
        s.early as f64,
    );
    e.single(
        "baton_retries_total",
        Kind::Counter,
        "Retries scheduled after a failed attempt.",
        s.retries as f64,
    );
    e.single(
        "baton_skips_total",
        Kind::Counter,
        "Occurrences skipped (too late, downtime, overlap).",
        s.skips as f64,
    );
    e.single(
        "baton_give_ups_total",
        Kind::Counter,
        "Occurrences given up on after their last attempt failed.",
        s.give_ups as f64,
    );
    e.family(
        "baton_safe_state_entries_total",
        Kind::Counter,
        "Packs that entered their safe state, by reason (give_up, cancel, lease_lost, clock_lost, shutdown).",
    );
    for r in ["give_up", "cancel", "lease_lost", "clock_lost", "shutdown"] {
        let n = s.safe_states.get(r).copied().unwrap_or(0);
        e.sample("baton_safe_state_entries_total", &[("reason", r)], n as f64);
    }
}

/// What the agent holds: packs, the outbox, the journal, the backlog
/// waiting for dispatcher credit.
fn render_state(e: &mut Encoder, s: &Snapshot) {
    e.single(
        "baton_agent_packs",
        Kind::Gauge,
        "Packs held (running or stopped in their safe state).",
        s.packs as f64,
    );
    e.single(
        "baton_agent_outbox_entries",
        Kind::Gauge,
        "Feedback entries in the journal's outbox not yet acknowledged by the controller.",
        s.outbox_depth as f64,
    );
    e.single(
        "baton_agent_outbox_dropped_unreported",
        Kind::Gauge,
        "Feedback entries dropped at the outbox's cap and not yet reported to the controller.",
        s.outbox_dropped as f64,
    );
    e.single(
        "baton_agent_journal_size_bytes",
        Kind::Gauge,
        "Size of the journal file.",
        s.journal_bytes as f64,
    );
    e.single(
        "baton_agent_journal_syncs_total",
        Kind::Counter,
        "fdatasync calls on the journal's log since the agent started (each writes to flash; arm-horizon sets how many firings share one).",
        s.journal_syncs as f64,
    );
    e.single(
        "baton_dispatcher_backlog_jobs",
        Kind::Gauge,
        "Armed jobs waiting in the control thread for dispatcher credit.",
        s.dispatch_backlog as f64,
    );
}

/// The dispatcher thread's counters, when it runs.
fn render_dispatcher(e: &mut Encoder, s: &Snapshot) {
    if let Some(d) = &s.dispatch {
        e.single(
            "baton_dispatcher_jobs_total",
            Kind::Counter,
            "Jobs the dispatcher thread ran.",
            d.jobs as f64,
        );
        e.single(
            "baton_dispatcher_spin_seconds_total",
            Kind::Counter,
            "Time the dispatcher spun before deadlines (its rate is the spin share of one CPU).",
            secs(d.spin_ns as i64),
        );
        e.single(
            "baton_dispatcher_wake_margin_seconds",
            Kind::Gauge,
            "How long before a deadline the dispatcher's sleep ends (then it spins); adapted to the box.",
            secs(d.margin_ns as i64),
        );
        e.single(
            "baton_dispatcher_jobs_arrived_late_total",
            Kind::Counter,
            "Jobs that reached the dispatcher already past their deadline (lateness from arming, not the dispatcher).",
            d.arrived_late as f64,
        );
        e.single(
            "baton_dispatcher_lost_results_total",
            Kind::Counter,
            "Results that found the result queue full (always 0 unless a bug).",
            d.lost_results as f64,
        );
    }
}

/// The clock estimate, when there is one.
fn render_clock(e: &mut Encoder, s: &Snapshot) {
    if let Some(c) = &s.clock {
        e.single(
            "baton_agent_clock_offset_seconds",
            Kind::Gauge,
            "Reference time minus the system clock (CLOCK_REALTIME), as the agent estimates it.",
            secs(c.offset_ns),
        );
        e.single(
            "baton_agent_clock_uncertainty_seconds",
            Kind::Gauge,
            "How far reference time may be from the agent's estimate.",
            secs(c.uncertainty_ns),
        );
        e.single(
            "baton_agent_clock_jitter_seconds",
            Kind::Gauge,
            "Spread of the followed source's samples around its fit.",
            secs(c.jitter_ns),
        );
        e.single(
            "baton_agent_clock_frequency_ppm",
            Kind::Gauge,
            "Rate error of the monotonic clock against reference, in parts per million (positive: reference runs faster).",
            c.frequency_ppm,
        );
        e.family(
            "baton_agent_clock_state",
            Kind::Gauge,
            "The clock's state: 1 for the current one, 0 for the others.",
        );
        for st in CLOCK_STATES {
            let v = if st == c.state { 1.0 } else { 0.0 };
            e.sample("baton_agent_clock_state", &[("state", st.name())], v);
        }
        e.family(
            "baton_agent_clock_source",
            Kind::Gauge,
            "The clock source followed: 1 for the current one, 0 for the others.",
        );
        for src in CLOCK_SOURCES {
            let v = if src == c.source { 1.0 } else { 0.0 };
            e.sample("baton_agent_clock_source", &[("source", src.name())], v);
        }
    }
}

/// The controller link, when there is one.
fn render_link(e: &mut Encoder, s: &Snapshot) {
    if let Some(up) = s.link_connected {
        e.single(
            "baton_agent_link_connected",
            Kind::Gauge,
            "1 while a controller session is established (welcomed), else 0.",
            if up { 1.0 } else { 0.0 },
        );
        e.single(
            "baton_agent_link_queue_messages",
            Kind::Gauge,
            "Messages waiting in the control thread for the link thread to take them.",
            s.link_queue as f64,
        );
        e.single(
            "baton_agent_link_session_generation",
            Kind::Gauge,
            "The highest controller session generation the agent has journalled (0: no fencing controller seen).",
            s.session_gen as f64,
        );
        e.family(
            "baton_agent_link_stale_refused_total",
            Kind::Counter,
            "Messages refused from a stale controller (a session generation below the highest seen), by message.",
        );
        for (what, n) in [
            ("welcome", s.link_stale.welcomes),
            ("push", s.link_stale.pushes),
            ("cancel", s.link_stale.cancels),
        ] {
            e.sample(
                "baton_agent_link_stale_refused_total",
                &[("message", what)],
                n as f64,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lateness_buckets() {
        let mut l = Lateness::default();
        l.observe(-5);
        l.observe(1_000);
        l.observe(1_001);
        l.observe(20_000_000_000);
        assert_eq!(l.counts[0], 2, "early and exactly 1 µs: the first bucket");
        assert_eq!(l.counts[1], 1);
        assert_eq!(l.counts[LATENESS_BOUNDS_NS.len()], 1, "+Inf");
        assert_eq!(l.sum_ns, 20_000_002_001);
    }

    fn sample() -> Snapshot {
        let mut s = Snapshot {
            id: "press-\"01\"".into(),
            ..Snapshot::default()
        };
        s.executions
            .entry(("default".into(), "blink".into()))
            .or_default()
            .insert("ok", 3);
        s.lateness.observe(30_000);
        s.safe_states.insert("cancel", 1);
        s.dispatch = Some(DispatchSnap {
            spin_ns: 1_500_000,
            margin_ns: 200_000,
            ..DispatchSnap::default()
        });
        s.clock = Some(ClockSnap {
            source: SourceKind::Ntp,
            state: ClockState::Locked,
            offset_ns: -2_500,
            uncertainty_ns: 1_000_000,
            jitter_ns: 10_000,
            frequency_ppm: -3.25,
        });
        s.link_connected = Some(true);
        s.link_stale.pushes = 2;
        s.session_gen = 7;
        s
    }

    #[test]
    fn renders_names_units_types_and_labels() {
        let t = render(&sample());
        for line in [
            "# TYPE baton_executions_total counter",
            "baton_executions_total{tenant=\"default\",pack=\"blink\",result=\"ok\"} 3",
            "# TYPE baton_execution_start_lateness_seconds histogram",
            "baton_execution_start_lateness_seconds_bucket{le=\"0.00001\"} 0",
            "baton_execution_start_lateness_seconds_bucket{le=\"0.00005\"} 1",
            "baton_execution_start_lateness_seconds_bucket{le=\"+Inf\"} 1",
            "baton_execution_start_lateness_seconds_sum 0.00003",
            "baton_execution_start_lateness_seconds_count 1",
            "baton_safe_state_entries_total{reason=\"cancel\"} 1",
            "baton_safe_state_entries_total{reason=\"give_up\"} 0",
            "baton_dispatcher_spin_seconds_total 0.0015",
            "baton_dispatcher_wake_margin_seconds 0.0002",
            "# TYPE baton_agent_clock_offset_seconds gauge",
            "baton_agent_clock_offset_seconds -0.0000025",
            "baton_agent_clock_uncertainty_seconds 0.001",
            "baton_agent_clock_frequency_ppm -3.25",
            "baton_agent_clock_state{state=\"locked\"} 1",
            "baton_agent_clock_state{state=\"free-running\"} 0",
            "baton_agent_clock_source{source=\"ntp\"} 1",
            "baton_agent_link_connected 1",
            "baton_agent_link_session_generation 7",
            "baton_agent_link_stale_refused_total{message=\"push\"} 2",
            "baton_agent_link_stale_refused_total{message=\"welcome\"} 0",
            "baton_agent_info{id=\"press-\\\"01\\\"\",version=",
        ] {
            assert!(t.lines().any(|l| l.starts_with(line)), "{line} in\n{t}");
        }
        // Every family's TYPE comes once, before its samples.
        let mut types = std::collections::HashSet::new();
        for l in t.lines().filter(|l| l.starts_with("# TYPE ")) {
            assert!(types.insert(l.to_string()), "{l} twice");
        }
    }

    #[test]
    fn optional_parts_are_absent_without_their_source() {
        let t = render(&Snapshot::default());
        assert!(!t.contains("baton_agent_link_connected"));
        assert!(!t.contains("baton_dispatcher_jobs_total"));
        assert!(!t.contains("baton_agent_clock_state"));
        assert!(t.contains("# TYPE baton_executions_total counter"));
    }

    #[test]
    fn publishing_never_waits() {
        let p = Published::default();
        assert!(p.try_publish(sample()));
        let held = p.0.lock().expect("lock");
        assert!(!p.try_publish(Snapshot::default()), "skipped while held");
        drop(held);
        assert_eq!(p.latest().id, sample().id);
    }
}
