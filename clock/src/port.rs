//! The clock as the rest of the agent holds it: reference time now, and
//! its mapping to the local monotonic clock. Here, with the clock, so the
//! link (which feeds it samples) and the runtime (which plans on it) both
//! import it from below, not from each other.

use baton_proto::RefTime;

use super::MonoTime;
use super::driver::EstimatedClock;
use super::estimator::Estimate;
use super::sample::SampleSender;

/// Reference time and its mapping to the local monotonic clock.
pub trait Clock: Send + Sync {
    /// Reference time now.
    fn now(&self) -> RefTime;
    /// A reference instant on the local monotonic scale.
    fn to_mono(&self, t: RefTime) -> MonoTime;
    /// A monotonic instant on the reference scale.
    fn to_ref(&self, m: MonoTime) -> RefTime;
    /// Refresh the estimate; returns a step (ns) if one was detected.
    fn resample(&self) -> Option<i64>;
    /// How uncertain the mapping is, ns.
    fn uncertainty_ns(&self) -> i64;
    /// The estimate in full (source, state, jitter...), for reports; `None`
    /// for a clock that is reference time by construction (tests).
    fn status(&self) -> Option<Estimate> {
        None
    }
    /// Where clock sources (the link's time exchange) send samples.
    fn samples(&self) -> Option<SampleSender> {
        None
    }
}

impl Clock for EstimatedClock {
    fn now(&self) -> RefTime {
        self.shared_ref().now()
    }
    fn to_mono(&self, t: RefTime) -> MonoTime {
        self.shared_ref().to_mono(t)
    }
    fn to_ref(&self, m: MonoTime) -> RefTime {
        self.shared_ref().to_ref(m)
    }
    fn resample(&self) -> Option<i64> {
        self.update()
    }
    fn uncertainty_ns(&self) -> i64 {
        self.shared_ref().uncertainty_ns()
    }
    fn status(&self) -> Option<Estimate> {
        EstimatedClock::status(self)
    }
    fn samples(&self) -> Option<SampleSender> {
        Some(self.sender())
    }
}
