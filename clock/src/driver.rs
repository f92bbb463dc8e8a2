//! The control thread's side of the clock: drains the sources' samples into
//! the [`Estimator`], samples the system clock, and publishes the mapping
//! the dispatcher and the link read.
//!
//! Only the control thread calls [`EstimatedClock::update`] (through the
//! runtime's `Clock::resample`); the mutex around the estimator is never
//! contended. Readers — the dispatcher (lock-free atomics of
//! [`ClockEstimate`]) and the link thread ([`EstimatedClock::status`], a
//! short lock) — never wait on the estimator.

use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};

use super::estimator::{ClockState, Estimate, Estimator, EstimatorConfig};
use super::sample::{Sample, SampleSender, SourceKind, sample_channel};
use super::system::SystemSource;
use super::{ClockEstimate, MonoTime, mono_now};
use crate::settings::ClockConfig;

/// The estimator ticks at most this often without new samples: the
/// published offset then lags the fit by at most the frequency error over
/// this span (100 ppm × 10 ms = 1 µs), and a busy control loop does not
/// refit on every pass.
const TICK_EVERY_NS: i64 = 10_000_000;

/// The clock as the runtime sees it.
#[derive(Debug)]
pub struct EstimatedClock {
    shared: Arc<ClockEstimate>,
    inner: Mutex<Inner>,
    status: Mutex<Option<Estimate>>,
    sender: SampleSender,
    /// The sources' handles (NTP, PTP threads): they stop when the clock
    /// is dropped with the agent.
    sources: Mutex<Vec<Box<dyn std::fmt::Debug + Send>>>,
}

#[derive(Debug)]
struct Inner {
    estimator: Estimator,
    system: SystemSource,
    rx: Receiver<Sample>,
    last_tick: Option<MonoTime>,
}

impl EstimatedClock {
    /// A clock following the system clock until sources speak.
    pub fn new(cfg: &ClockConfig) -> Self {
        let (sender, rx) = sample_channel();
        let limit = i64::try_from(cfg.limit.as_nanos()).unwrap_or(i64::MAX);
        let clock = EstimatedClock {
            shared: Arc::new(ClockEstimate::from_system()),
            inner: Mutex::new(Inner {
                estimator: Estimator::new(EstimatorConfig::with_limit(limit)),
                system: SystemSource::new(cfg.system),
                rx,
                last_tick: None,
            }),
            status: Mutex::new(None),
            sender,
            sources: Mutex::new(Vec::new()),
        };
        clock.update();
        clock
    }

    /// The mapping the dispatcher reads.
    pub fn shared(&self) -> Arc<ClockEstimate> {
        self.shared.clone()
    }

    /// The mapping, borrowed.
    pub fn shared_ref(&self) -> &ClockEstimate {
        &self.shared
    }

    /// Where sources send samples.
    pub fn sender(&self) -> SampleSender {
        self.sender.clone()
    }

    /// Keep a source's handle for as long as the clock lives.
    pub fn keep_source(&self, handle: Box<dyn std::fmt::Debug + Send>) {
        self.sources
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(handle);
    }

    /// The last estimate (for reports).
    pub fn status(&self) -> Option<Estimate> {
        *self.status.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Take new samples and re-estimate. Returns a step of the applied
    /// offset, ns, when there was one.
    pub fn update(&self) -> Option<i64> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let now = super::mono_now();
        let mut fresh = false;
        while let Ok(s) = inner.rx.try_recv() {
            inner.estimator.on_sample(s);
            fresh = true;
        }
        if !fresh
            && inner
                .last_tick
                .is_some_and(|t| now.nanos_since(t) < TICK_EVERY_NS)
        {
            return None;
        }
        let s = inner.system.sample();
        inner.estimator.on_sample(s);
        let now = mono_now();
        inner.last_tick = Some(now);
        let tick = inner.estimator.tick(now)?;
        drop(inner);
        let e = tick.estimate;
        self.shared.set(e.offset_ns, e.uncertainty_ns);
        if tick.changed {
            let msg = format!(
                "clock: following {} ({}), uncertainty {}",
                e.source.name(),
                e.state.name(),
                baton_proto::time::fmt_ns(e.uncertainty_ns)
            );
            // A real source lost or degraded is worth an operator's eye;
            // the system clock free-running at start is the common case.
            if e.state == ClockState::Locked
                || (e.source == SourceKind::System && e.state == ClockState::FreeRunning)
            {
                tracing::info!("{msg}");
            } else {
                tracing::warn!("{msg}");
            }
        }
        *self.status.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
        tick.step_ns
    }
}
