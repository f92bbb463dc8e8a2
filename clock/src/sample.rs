//! What a clock source hands the estimator: one measurement of reference
//! time against the local monotonic clock.
//!
//! Every source (PTP, NTP, the controller link, the system clock) runs in
//! its own shell (a thread, or the link's runtime) and sends [`Sample`]s
//! over a bounded channel with `try_send`: a source never blocks on the
//! control thread, and a full channel drops the sample (the next one is as
//! good). The control thread drains the channel into the estimator.

use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};

use super::MonoTime;

/// Which kind of source a sample came from, best first (docs/design.md "Clock
/// sources, best first").
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SourceKind {
    /// PTP slave (statime).
    Ptp,
    /// NTP servers.
    Ntp,
    /// Time exchange with the controller over the link.
    Link,
    /// The system clock (`CLOCK_REALTIME`), as good as the kernel says.
    System,
}

impl SourceKind {
    /// Lower-case name, as reports and logs spell it.
    pub fn name(self) -> &'static str {
        match self {
            SourceKind::Ptp => "ptp",
            SourceKind::Ntp => "ntp",
            SourceKind::Link => "link",
            SourceKind::System => "system",
        }
    }
}

/// One measurement: at monotonic instant `at`, reference time was
/// `at + offset_ns`, give or take `error_ns`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    /// The source.
    pub source: SourceKind,
    /// When (local `CLOCK_MONOTONIC`).
    pub at: MonoTime,
    /// `reference − monotonic` at `at`, ns.
    pub offset_ns: i64,
    /// How far off this one sample may be, ns (≥ 0): half the round trip
    /// plus the server's own dispersion for NTP and the link, the servo's
    /// measured offset for PTP, the kernel's estimated error for the system
    /// clock.
    pub error_ns: i64,
}

/// Where sources send samples.
#[derive(Clone, Debug)]
pub struct SampleSender(SyncSender<Sample>);

/// Samples queued at most; beyond, new ones are dropped (sources sample at
/// most a few times a second, the control thread drains every pass).
pub const SAMPLE_QUEUE: usize = 256;

/// A sender and the control thread's receiver.
pub fn sample_channel() -> (SampleSender, Receiver<Sample>) {
    let (tx, rx) = sync_channel(SAMPLE_QUEUE);
    (SampleSender(tx), rx)
}

impl SampleSender {
    /// Hand a sample over without ever blocking. Returns false when the
    /// estimator is gone (the agent is stopping): the source should end.
    pub fn send(&self, s: Sample) -> bool {
        match self.0.try_send(s) {
            Ok(()) | Err(TrySendError::Full(_)) => true,
            Err(TrySendError::Disconnected(_)) => false,
        }
    }
}

impl From<SourceKind> for baton_proto::feedback::ClockSource {
    fn from(k: SourceKind) -> Self {
        use baton_proto::feedback::ClockSource as C;
        match k {
            SourceKind::Ptp => C::Ptp,
            SourceKind::Ntp => C::Ntp,
            SourceKind::Link => C::Link,
            SourceKind::System => C::System,
        }
    }
}
