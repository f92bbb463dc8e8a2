//! statime's Kalman servo, watched: every measurement the port hands the
//! filter is also noted here, so the shell knows when to emit a sample,
//! how large the last measured offset and the path delay were (the
//! sample's error), and whether the servo is locked.
//!
//! One correction to statime 0.4's behaviour: after the servo steps the
//! clock, it keeps its state, built while the clock was far off, and
//! measurements timestamped on both sides of the step still arrive. The
//! delay estimate carries that transient for minutes (µs of bias after a
//! 25 ms step, decaying slowly). So after a step the servo starts afresh
//! and measurements from the next [`STEP_QUARANTINE_NS`] are dropped.

use std::cell::RefCell;
use std::rc::Rc;

use statime::Clock;
use statime::filters::{Filter, FilterEstimate, FilterUpdate, KalmanConfiguration, KalmanFilter};
use statime::port::Measurement;

use super::virtual_clock::VirtualClock;
use crate::mono_now;

/// A measured offset below this counts towards lock, ns. Software
/// timestamps on a LAN are good to tens of µs.
pub const LOCK_OFFSET_NS: i64 = 100_000;
/// Consecutive offsets below [`LOCK_OFFSET_NS`] before the port is locked.
pub const LOCK_RUN: u32 = 3;
/// A measured offset above this loses lock, ns: it is where statime's servo
/// steps instead of slewing (its `step_threshold`).
pub const UNLOCK_OFFSET_NS: i64 = 1_000_000;

/// Measurements made this soon after a step are dropped (one may straddle
/// it: a Sync before, its Follow_Up after), ns.
pub const STEP_QUARANTINE_NS: i64 = 1_000_000_000;

/// What the servo has seen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServoObs {
    /// Measurements absorbed since start (sync and delay).
    pub measurements: u64,
    /// The last measured offset (local − master, before correction), ns.
    pub last_offset_ns: Option<i64>,
    /// The servo's mean path delay, ns.
    pub mean_delay_ns: Option<i64>,
    /// Consecutive measured offsets under [`LOCK_OFFSET_NS`].
    pub good_run: u32,
}

impl ServoObs {
    /// Whether the servo is locked (see [`LOCK_RUN`]).
    pub fn locked(&self) -> bool {
        self.good_run >= LOCK_RUN
    }

    /// Note one measured offset.
    pub fn note_offset(&mut self, offset_ns: i64) {
        self.last_offset_ns = Some(offset_ns);
        let a = offset_ns.unsigned_abs();
        if a < LOCK_OFFSET_NS.unsigned_abs() {
            self.good_run = self.good_run.saturating_add(1);
        } else if a > UNLOCK_OFFSET_NS.unsigned_abs() {
            self.good_run = 0;
        }
    }

    /// How far off a sample from this servo may be, ns: the last measured
    /// offset (what the servo is still correcting) plus the mean path delay
    /// (an unknown asymmetry of the path biases the offset by up to it).
    pub fn error_ns(&self) -> Option<i64> {
        let off = self.last_offset_ns?;
        Some(
            off.saturating_abs()
                .saturating_add(self.mean_delay_ns.unwrap_or(0).max(0)),
        )
    }
}

/// The observer shared between the filter (re-created by statime on every
/// change of master) and the shell.
pub type SharedObs = Rc<RefCell<ServoObs>>;

/// [`ObservedFilter`]'s configuration.
#[derive(Clone, Debug)]
pub struct ObservedConfig {
    /// The Kalman servo's settings.
    pub kalman: KalmanConfiguration,
    /// Where measurements are noted.
    pub obs: SharedObs,
    /// The clock the servo steers (read for its steps).
    pub clock: Rc<RefCell<VirtualClock>>,
}

/// statime's [`KalmanFilter`] plus notes in a [`SharedObs`].
pub struct ObservedFilter {
    inner: KalmanFilter,
    config: ObservedConfig,
}

impl std::fmt::Debug for ObservedFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObservedFilter")
            .field("obs", &self.config.obs)
            .finish_non_exhaustive()
    }
}

fn ns(d: statime::time::Duration) -> i64 {
    d.nanos_rounded().clamp(i64::MIN as i128, i64::MAX as i128) as i64
}

impl Filter for ObservedFilter {
    type Config = ObservedConfig;

    fn new(config: Self::Config) -> Self {
        ObservedFilter {
            inner: KalmanFilter::new(config.kalman),
            config,
        }
    }

    fn measurement<C: Clock>(&mut self, m: Measurement, clock: &mut C) -> FilterUpdate {
        let before = self.config.clock.borrow().last_step();
        if before.is_some_and(|s| mono_now().as_nanos() - s < STEP_QUARANTINE_NS) {
            return FilterUpdate::default();
        }
        let update = self.inner.measurement(m, clock);
        if self.config.clock.borrow().last_step() != before {
            self.inner = KalmanFilter::new(self.config.kalman);
            let mut o = self.config.obs.borrow_mut();
            o.good_run = 0;
            o.last_offset_ns = None;
            return update;
        }
        let mut o = self.config.obs.borrow_mut();
        o.measurements += 1;
        if let Some(off) = m.offset {
            o.note_offset(ns(off));
        }
        if let Some(d) = update.mean_delay {
            o.mean_delay_ns = Some(ns(d));
        }
        update
    }

    fn update<C: Clock>(&mut self, clock: &mut C) -> FilterUpdate {
        self.inner.update(clock)
    }

    fn demobilize<C: Clock>(self, clock: &mut C) {
        {
            let mut o = self.config.obs.borrow_mut();
            o.good_run = 0;
            o.last_offset_ns = None;
        }
        self.inner.demobilize(clock)
    }

    fn current_estimates(&self) -> FilterEstimate {
        self.inner.current_estimates()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_needs_a_run_of_small_offsets_and_is_lost_only_past_the_step_threshold() {
        let mut o = ServoObs::default();
        o.note_offset(500_000_000);
        o.note_offset(-20_000);
        o.note_offset(30_000);
        assert!(!o.locked());
        o.note_offset(5_000);
        assert!(o.locked());
        // In between: neither counts nor unlocks.
        o.note_offset(400_000);
        assert!(o.locked());
        o.note_offset(-2_000_000);
        assert!(!o.locked());
    }

    #[test]
    fn error_is_offset_plus_path_delay() {
        let mut o = ServoObs::default();
        assert_eq!(o.error_ns(), None);
        o.note_offset(-1_500);
        o.mean_delay_ns = Some(20_000);
        assert_eq!(o.error_ns(), Some(21_500));
    }
}
