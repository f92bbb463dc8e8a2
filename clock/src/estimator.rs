//! The clock estimator: from the samples of every source to one mapping
//! `reference = monotonic + offset`, with an uncertainty and a state.
//!
//! Sans-IO: fed [`Sample`]s and `now` (monotonic), it never reads a clock,
//! so tests drive it on simulated time.
//!
//! Per source it keeps a short window of samples and fits offset and
//! frequency to them (weighted least squares, weights 1/error²), so it can
//! carry the mapping forward between samples and through a loss of the
//! source (holdover) while the uncertainty grows with the time since the
//! last sample.
//!
//! Selection follows docs/design.md ("Clock sources, best first"): the best kind
//! of source that is locked (fresh, enough samples, uncertainty within the
//! limit) wins; with none locked, the one with the smallest uncertainty.
//!
//! Switching between sources never steps the applied mapping (docs/design.md
//! "Clock steps"): the difference at the switch is slewed away at
//! [`EstimatorConfig::slew_ppm`], and counted in the uncertainty until it
//! is gone, so periodic instructions neither burst nor skip. Steps happen
//! only where they are the truth: the first acquisition of a real source, a
//! source that itself stepped (the system clock set by hand, a PTP master
//! change), or a switch further apart than [`EstimatorConfig::step_ns`].

use std::collections::VecDeque;

use super::MonoTime;
use super::sample::{Sample, SourceKind};

/// How the estimator judges sources.
#[derive(Clone, Debug, PartialEq)]
pub struct EstimatorConfig {
    /// Uncertainty at or below which a source counts as locked (the
    /// admission limit), ns.
    pub limit_ns: i64,
    /// How fast an unobserved oscillator may wander from its last
    /// estimated frequency, ppm: the holdover growth of the uncertainty.
    pub holdover_ppm: f64,
    /// Rate at which a switch between sources is slewed away, ppm.
    pub slew_ppm: f64,
    /// A switch further apart than this steps instead of slewing, ns.
    pub step_ns: i64,
}

impl EstimatorConfig {
    /// Defaults with this admission limit.
    pub fn with_limit(limit_ns: i64) -> Self {
        EstimatorConfig {
            limit_ns,
            // A plain crystal: a few ppm over minutes with temperature.
            holdover_ppm: 5.0,
            // What adjtime(3) and ntpd slew at.
            slew_ppm: 500.0,
            // ntpd's step threshold.
            step_ns: 128_000_000,
        }
    }
}

/// Where the estimate stands (the wire's `ClockState`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ClockState {
    /// A source is heard but not (yet) good enough.
    Syncing,
    /// A fresh source within the limit.
    Locked,
    /// No fresh source: carrying the last one forward.
    Holdover,
    /// Nothing better than an unsynchronised system clock.
    FreeRunning,
}

impl From<ClockState> for baton_proto::feedback::ClockState {
    fn from(s: ClockState) -> Self {
        use baton_proto::feedback::ClockState as C;
        match s {
            ClockState::Syncing => C::Syncing,
            ClockState::Locked => C::Locked,
            ClockState::Holdover => C::Holdover,
            ClockState::FreeRunning => C::FreeRunning,
        }
    }
}

impl ClockState {
    /// Lower-case name, as reports and logs spell it.
    pub fn name(self) -> &'static str {
        match self {
            ClockState::Syncing => "syncing",
            ClockState::Locked => "locked",
            ClockState::Holdover => "holdover",
            ClockState::FreeRunning => "free-running",
        }
    }
}

/// The estimate at one instant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Estimate {
    /// The source it follows.
    pub source: SourceKind,
    /// Its state.
    pub state: ClockState,
    /// Applied `reference − monotonic`, ns: what deadlines are converted
    /// with (never steps on a switch, see the module doc).
    pub offset_ns: i64,
    /// The followed source's own `reference − monotonic`, ns (equal to
    /// `offset_ns` once a switch is slewed away).
    pub target_ns: i64,
    /// How far reference time may be from `monotonic + offset_ns`, ns.
    pub uncertainty_ns: i64,
    /// Spread of the source's samples around its fit, ns.
    pub jitter_ns: i64,
    /// The monotonic clock's rate error against reference, ppm (positive:
    /// reference runs faster).
    pub frequency_ppm: f64,
}

/// What a tick changed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tick {
    /// The estimate now.
    pub estimate: Estimate,
    /// The applied offset jumped by this much, ns (see [`STEP_REPORT_NS`]).
    pub step_ns: Option<i64>,
    /// The source or state differs from the previous tick's.
    pub changed: bool,
}

/// A jump of the applied offset beyond this between two ticks is reported
/// as a step: the runtime treats it as downtime (forward) or an early wake
/// (backward).
pub const STEP_REPORT_NS: i64 = 1_000_000;

/// Samples kept per source.
const WINDOW: usize = 16;
/// Below this time span of samples, no frequency is fitted.
const MIN_SPAN_NS: i64 = 1_000_000_000;

/// How a kind of source is judged.
fn policy(kind: SourceKind) -> (usize, i64) {
    // (samples before it may lock, silence after which it is stale, ns)
    match kind {
        SourceKind::Ptp => (4, 5_000_000_000),
        // NTP sends one filtered sample per poll; polls reach 64 s.
        SourceKind::Ntp => (2, 200_000_000_000),
        SourceKind::Link => (3, 60_000_000_000),
        // Sampled by the control thread on every pass.
        SourceKind::System => (1, 5_000_000_000),
    }
}

/// A fitted source at one instant.
#[derive(Clone, Copy, Debug)]
struct Fit {
    offset_ns: i64,
    freq: f64,
    jitter_ns: i64,
    uncertainty_ns: i64,
    fresh: bool,
    locked: bool,
}

/// One source's recent samples.
#[derive(Debug, Default)]
struct Track {
    samples: VecDeque<Sample>,
    /// The source stepped since the last tick (its window was restarted).
    stepped: bool,
}

impl Track {
    fn push(&mut self, s: Sample, holdover_ppm: f64) {
        if let Some(f) = self.fit_at(s.at, holdover_ppm) {
            // A sample far outside what the fit and its own error allow is
            // the source stepping, not noise: start over from it.
            let allowed = 3 * (s.error_ns + f.uncertainty_ns) + STEP_REPORT_NS;
            if (s.offset_ns - f.offset_ns).abs() > allowed {
                self.samples.clear();
                self.stepped = true;
            }
        }
        if self.samples.back().is_some_and(|b| s.at < b.at) {
            // Out of order (a slow reply overtaken): keep order by time.
            return;
        }
        if self.samples.len() == WINDOW {
            self.samples.pop_front();
        }
        self.samples.push_back(s);
    }

    /// Weighted least squares of offset against time, evaluated at `now`.
    fn fit_at(&self, now: MonoTime, holdover_ppm: f64) -> Option<Fit> {
        let last = *self.samples.back()?;
        let t0 = last.at.as_nanos();
        let min_err = self.samples.iter().map(|s| s.error_ns).min()?.max(1);
        // Weights relative to the best sample, so sums stay well scaled.
        let w = |s: &Sample| {
            let r = min_err as f64 / s.error_ns.max(1) as f64;
            r * r
        };
        let span = last.at.as_nanos() - self.samples.front()?.at.as_nanos();
        let (mut sw, mut sx, mut sy) = (0.0, 0.0, 0.0);
        for s in &self.samples {
            let wi = w(s);
            sw += wi;
            sx += wi * (s.at.as_nanos() - t0) as f64;
            sy += wi * (s.offset_ns - last.offset_ns) as f64;
        }
        let (mx, my) = (sx / sw, sy / sw);
        let mut freq = 0.0;
        if span >= MIN_SPAN_NS && self.samples.len() >= 3 {
            let (mut sxx, mut sxy) = (0.0, 0.0);
            for s in &self.samples {
                let wi = w(s);
                let dx = (s.at.as_nanos() - t0) as f64 - mx;
                sxx += wi * dx * dx;
                sxy += wi * dx * ((s.offset_ns - last.offset_ns) as f64 - my);
            }
            if sxx > 0.0 {
                // A rate error beyond 1000 ppm is no oscillator: noise.
                freq = (sxy / sxx).clamp(-1e-3, 1e-3);
                // Not significant against the spread of the samples (a
                // noisy path over a short span): carrying it forward
                // would only add error, so the offset is held instead.
                let mut sq = 0.0;
                for s in &self.samples {
                    let dx = (s.at.as_nanos() - t0) as f64 - mx;
                    let r = (s.offset_ns - last.offset_ns) as f64 - my - freq * dx;
                    sq += w(s) * r * r;
                }
                let n = self.samples.len() as f64;
                let stderr = (sq / sw).sqrt() / (n * sxx / sw).sqrt();
                if freq.abs() < 2.0 * stderr {
                    freq = 0.0;
                }
            }
        }
        let at_x = |x: f64| my + freq * (x - mx);
        let mut sq = 0.0;
        for s in &self.samples {
            let r = (s.offset_ns - last.offset_ns) as f64 - at_x((s.at.as_nanos() - t0) as f64);
            sq += w(s) * r * r;
        }
        let jitter = (sq / sw).sqrt();
        let dt = (now.as_nanos() - t0) as f64;
        let offset = last.offset_ns as f64 + at_x(dt);
        let age = now.nanos_since(last.at).max(0);
        // The error of the fit: the best sample's bound or the spread,
        // whichever is larger; then the wander since the last sample.
        let base = (min_err as f64).max(jitter);
        let growth = age as f64 * holdover_ppm * 1e-6;
        let (min_samples, stale_ns) = policy(last.source);
        let uncertainty = clamp_i64(base + growth);
        let fresh = age <= stale_ns;
        Some(Fit {
            offset_ns: clamp_i64(offset),
            freq,
            jitter_ns: clamp_i64(jitter),
            uncertainty_ns: uncertainty,
            fresh,
            locked: false,
        })
        .map(|f| Fit {
            locked: fresh && self.samples.len() >= min_samples,
            ..f
        })
    }
}

fn clamp_i64(x: f64) -> i64 {
    if x.is_nan() {
        0
    } else {
        x.clamp(i64::MIN as f64, i64::MAX as f64) as i64
    }
}

/// The slewed difference left over from a switch.
#[derive(Clone, Copy, Debug)]
struct Applied {
    at: MonoTime,
    offset_ns: i64,
    /// `applied − target` still being slewed away.
    transition_ns: i64,
    /// The followed source's frequency (ns per ns), to carry the applied
    /// offset forward to the next tick.
    freq: f64,
    source: SourceKind,
    state: ClockState,
    /// The uncertainty published with it.
    uncertainty_ns: i64,
}

/// The estimator.
#[derive(Debug)]
pub struct Estimator {
    cfg: EstimatorConfig,
    tracks: [Track; 4],
    applied: Option<Applied>,
    /// A real source (not the system clock) has been followed, locked.
    acquired: bool,
}

fn index(k: SourceKind) -> usize {
    match k {
        SourceKind::Ptp => 0,
        SourceKind::Ntp => 1,
        SourceKind::Link => 2,
        SourceKind::System => 3,
    }
}

const KINDS: [SourceKind; 4] = [
    SourceKind::Ptp,
    SourceKind::Ntp,
    SourceKind::Link,
    SourceKind::System,
];

impl Estimator {
    /// An estimator with no samples yet.
    pub fn new(cfg: EstimatorConfig) -> Self {
        Estimator {
            cfg,
            tracks: Default::default(),
            applied: None,
            acquired: false,
        }
    }

    /// Take a sample.
    pub fn on_sample(&mut self, s: Sample) {
        let ppm = self.cfg.holdover_ppm;
        self.tracks[index(s.source)].push(s, ppm);
    }

    /// The source to follow now, and its fit.
    fn select(&self, now: MonoTime) -> Option<(SourceKind, Fit)> {
        let fits = KINDS.iter().filter_map(|&k| {
            let mut f = self.tracks[index(k)].fit_at(now, self.cfg.holdover_ppm)?;
            f.locked &= f.uncertainty_ns <= self.cfg.limit_ns;
            Some((k, f))
        });
        let all: Vec<_> = fits.collect();
        all.iter()
            .find(|(_, f)| f.locked)
            .or_else(|| all.iter().min_by_key(|(_, f)| f.uncertainty_ns))
            .copied()
    }

    /// What is left, at `now`, of the difference between the offset last
    /// applied and `target` (the followed fit's): kept across a switch of
    /// source (unless beyond the step limit) and decayed at the slew rate;
    /// 0 at the start, when the followed source stepped, and at the first
    /// lock.
    fn transition(
        &self,
        now: MonoTime,
        source: SourceKind,
        target: i64,
        stepped: bool,
        first_lock: bool,
    ) -> i64 {
        match self.applied {
            None => 0,
            // The followed source stepped: that is the truth, follow it.
            Some(a) if a.source == source && stepped => 0,
            // First acquisition of a real source: step onto it.
            Some(_) if first_lock => 0,
            Some(a) if a.source != source => {
                let dt = now.nanos_since(a.at).max(0) as f64;
                let prev = a.offset_ns.saturating_add(clamp_i64(dt * a.freq));
                let d = prev.saturating_sub(target);
                if d.abs() > self.cfg.step_ns { 0 } else { d }
            }
            // Same source: the leftover of an earlier switch decays, once a
            // real source has been acquired (before that, the first lock
            // steps onto it: slewing toward a source still syncing would
            // only make that step smaller and later).
            Some(a) => {
                let dt = now.nanos_since(a.at).max(0) as f64;
                let rate = if self.acquired {
                    self.cfg.slew_ppm
                } else {
                    0.0
                };
                let budget = clamp_i64(dt * rate * 1e-6);
                let t = a.transition_ns;
                t.signum() * (t.abs() - budget).max(0)
            }
        }
    }

    /// Advance to `now`: choose the source, slew, and say what changed.
    /// `None` until any sample has arrived.
    pub fn tick(&mut self, now: MonoTime) -> Option<Tick> {
        let (source, fit) = self.select(now)?;
        let state = state_of(source, &fit);
        let stepped = std::mem::take(&mut self.tracks[index(source)].stepped);
        let target = fit.offset_ns;
        let first_lock =
            state == ClockState::Locked && source != SourceKind::System && !self.acquired;
        if first_lock {
            self.acquired = true;
        }
        let transition = self.transition(now, source, target, stepped, first_lock);
        let offset = target.saturating_add(transition);
        let uncertainty = fit.uncertainty_ns.saturating_add(transition.abs());
        let prev = self.applied;
        // The followed source's fit moving within the uncertainty it had
        // (a source still syncing averaging noisy samples: a slow link) is
        // not the clock stepping; only its own step, a first lock, a
        // switch, or a move beyond that uncertainty is reported.
        let own_move = prev.is_some_and(|a| a.source == source) && !stepped && !first_lock;
        self.applied = Some(Applied {
            at: now,
            offset_ns: offset,
            transition_ns: transition,
            freq: fit.freq,
            source,
            state,
            uncertainty_ns: uncertainty,
        });
        let step_ns = prev.and_then(|p| {
            let drift = clamp_i64(now.nanos_since(p.at).max(0) as f64 * fit.freq.abs());
            let noise = if own_move { p.uncertainty_ns } else { 0 };
            let d = offset - p.offset_ns;
            (d.abs() > STEP_REPORT_NS.saturating_add(drift).saturating_add(noise)).then_some(d)
        });
        let changed = prev.is_none_or(|p| p.source != source || p.state != state);
        Some(Tick {
            estimate: Estimate {
                source,
                state,
                offset_ns: offset,
                target_ns: target,
                uncertainty_ns: uncertainty,
                jitter_ns: fit.jitter_ns,
                frequency_ppm: fit.freq * 1e6,
            },
            step_ns,
            changed,
        })
    }
}

/// The clock's state when following `source` with `fit`.
fn state_of(source: SourceKind, fit: &Fit) -> ClockState {
    if fit.locked {
        ClockState::Locked
    } else if source == SourceKind::System {
        ClockState::FreeRunning
    } else if fit.fresh {
        ClockState::Syncing
    } else if fit.uncertainty_ns <= 1_000_000_000 {
        ClockState::Holdover
    } else {
        ClockState::FreeRunning
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000_000;
    const MS: i64 = 1_000_000;
    const US: i64 = 1_000;

    fn cfg() -> EstimatorConfig {
        EstimatorConfig::with_limit(10 * MS)
    }

    fn sample(source: SourceKind, at: i64, offset: i64, error: i64) -> Sample {
        Sample {
            source,
            at: MonoTime::from_nanos(at),
            offset_ns: offset,
            error_ns: error,
        }
    }

    /// A source whose reference runs `ppm` fast against monotonic, with
    /// offset `base` at t = 0 and deterministic ±`noise` jitter.
    fn truth(base: i64, ppm: f64, t: i64) -> i64 {
        base + (t as f64 * ppm * 1e-6) as i64
    }

    fn noise(i: i64, amp: i64) -> i64 {
        // A fixed pseudo-random sequence in [-amp, amp].
        let x = (i.wrapping_mul(2_654_435_761) >> 7) % (2 * amp + 1);
        x.abs() - amp
    }

    #[test]
    fn converges_to_offset_and_frequency_and_locks() {
        let mut e = Estimator::new(cfg());
        let mut last = None;
        for i in 0..20 {
            let t = i * S;
            let off = truth(5 * S, 20.0, t) + noise(i, 20 * US);
            e.on_sample(sample(SourceKind::Ntp, t, off, 50 * US));
            last = e.tick(MonoTime::from_nanos(t));
        }
        let est = last.expect("ticks").estimate;
        assert_eq!(est.state, ClockState::Locked);
        assert_eq!(est.source, SourceKind::Ntp);
        assert!((est.frequency_ppm - 20.0).abs() < 2.0, "{est:?}");
        let want = truth(5 * S, 20.0, 19 * S);
        assert!((est.offset_ns - want).abs() < 30 * US, "{est:?} vs {want}");
        assert!(
            est.uncertainty_ns >= 50 * US && est.uncertainty_ns < MS,
            "{est:?}"
        );
    }

    #[test]
    fn noise_on_a_short_span_is_not_taken_for_a_frequency() {
        let mut e = Estimator::new(cfg());
        let mut est = None;
        for i in 0..16 {
            let t = i * S;
            // ±300 µs of path noise, no true rate error.
            e.on_sample(sample(SourceKind::Link, t, noise(i, 300 * US), 300 * US));
            est = Some(e_tick(&mut e, t));
        }
        let est = est.expect("estimate");
        assert_eq!(est.frequency_ppm, 0.0, "{est:?}");
        assert!(est.offset_ns.abs() < 300 * US, "{est:?}");
    }

    #[test]
    fn holdover_carries_the_frequency_and_grows_the_uncertainty() {
        let mut e = Estimator::new(cfg());
        for i in 0..10 {
            let t = i * S;
            e.on_sample(sample(SourceKind::Ptp, t, truth(0, -30.0, t), US));
            e.tick(MonoTime::from_nanos(t));
        }
        let locked = e.tick(MonoTime::from_nanos(9 * S)).expect("tick").estimate;
        assert_eq!(locked.state, ClockState::Locked);
        // Silence: still locked within the stale window, then holdover.
        let mut at = |secs: i64| e_tick(&mut e, secs * S);
        let h = at(60);
        assert_eq!(h.state, ClockState::Holdover);
        // The frequency is carried: the offset still tracks the truth.
        assert!(
            (h.offset_ns - truth(0, -30.0, 60 * S)).abs() < 10 * US,
            "{h:?}"
        );
        // The uncertainty grows with the silence, and past the limit the
        // estimate is no longer good enough (admission refuses).
        let later = at(3600);
        assert!(later.uncertainty_ns > h.uncertainty_ns);
        assert!(later.uncertainty_ns > 10 * MS, "{later:?}");
        assert_ne!(later.state, ClockState::Locked);
    }

    fn e_tick(e: &mut Estimator, t: i64) -> Estimate {
        e.tick(MonoTime::from_nanos(t)).expect("tick").estimate
    }

    /// Every `every` of reference time, from monotonic `from` to `to`,
    /// mapped through the estimator ticking every 10 ms: the intervals
    /// between successive firings on the monotonic scale.
    #[test]
    fn a_source_switch_slews_without_burst_or_skip() {
        let mut e = Estimator::new(cfg());
        // PTP locked at offset 0; then lost; NTP takes over 2 ms apart.
        for i in 0..10 {
            let t = i * S;
            e.on_sample(sample(SourceKind::Ptp, t, 0, US));
            e.on_sample(sample(SourceKind::Ntp, t, 2 * MS, 100 * US));
            e.tick(MonoTime::from_nanos(t));
        }
        assert_eq!(e_tick(&mut e, 9 * S).source, SourceKind::Ptp);
        // From 10 s on only NTP speaks; PTP goes stale after 5 s.
        let mut prev = e_tick(&mut e, 10 * S).offset_ns;
        let mut switched_at = None;
        let mut t = 10 * S;
        while t < 40 * S {
            t += 10 * MS;
            if t % S == 0 {
                e.on_sample(sample(SourceKind::Ntp, t, 2 * MS, 100 * US));
            }
            let est = e_tick(&mut e, t);
            let d = est.offset_ns - prev;
            // 10 ms at 500 ppm: at most 5 µs per tick, never a step.
            assert!(d.abs() <= 5 * US + 1, "jump of {d} ns at {t}");
            if est.source == SourceKind::Ntp && switched_at.is_none() {
                switched_at = Some(t);
                // The gap is counted in the uncertainty while it lasts.
                assert!(est.uncertainty_ns >= 2 * MS - 10 * US, "{est:?}");
            }
            prev = est.offset_ns;
        }
        assert!(switched_at.is_some());
        // 2 ms at 500 ppm: slewed away within 4 s, then it is the target.
        let est = e_tick(&mut e, 40 * S);
        assert_eq!(est.offset_ns, est.target_ns);
        assert!((est.offset_ns - 2 * MS).abs() < 10 * US);
        assert!(est.uncertainty_ns < MS);
    }

    #[test]
    fn a_step_of_the_followed_system_clock_is_followed_and_reported() {
        let mut e = Estimator::new(cfg());
        for i in 0..5 {
            e.on_sample(sample(SourceKind::System, i * S, 7 * S, US));
            e.tick(MonoTime::from_nanos(i * S));
        }
        // Someone sets the clock one second ahead.
        e.on_sample(sample(SourceKind::System, 5 * S, 8 * S, US));
        let tick = e.tick(MonoTime::from_nanos(5 * S)).expect("tick");
        assert_eq!(tick.step_ns, Some(S));
        assert_eq!(tick.estimate.offset_ns, 8 * S);
        // And back: a backward step is reported too.
        e.on_sample(sample(SourceKind::System, 6 * S, 7 * S, US));
        assert_eq!(
            e.tick(MonoTime::from_nanos(6 * S)).expect("tick").step_ns,
            Some(-S)
        );
    }

    #[test]
    fn a_system_clock_step_does_not_move_an_estimate_on_another_source() {
        let mut e = Estimator::new(cfg());
        for i in 0..20 {
            let t = i * S;
            // Someone sets the system clock one second ahead at 10 s.
            let sys = if i < 10 { 0 } else { S };
            e.on_sample(sample(SourceKind::System, t, sys, US));
            e.on_sample(sample(SourceKind::Ptp, t, 0, US));
            let tick = e.tick(MonoTime::from_nanos(t)).expect("tick");
            assert_eq!(tick.step_ns, None, "at {i} s");
            assert_eq!(tick.estimate.offset_ns, 0);
            if i >= 3 {
                // PTP locked (four samples): it is followed from then on.
                assert_eq!(tick.estimate.source, SourceKind::Ptp, "at {i} s");
            }
        }
    }

    #[test]
    fn first_lock_of_a_real_source_steps_onto_it() {
        let mut e = Estimator::new(cfg());
        // An unsynchronised system clock, 16 s max error: free-running.
        e.on_sample(sample(SourceKind::System, 0, 3 * S, 16 * S));
        let est = e_tick(&mut e, 0);
        assert_eq!(est.state, ClockState::FreeRunning);
        assert_eq!(est.source, SourceKind::System);
        let mut step = None;
        for i in 1..=4 {
            e.on_sample(sample(SourceKind::System, i * S, 3 * S, 16 * S));
            e.on_sample(sample(SourceKind::Link, i * S, 3 * S + 40 * MS, 80 * US));
            let tick = e.tick(MonoTime::from_nanos(i * S)).expect("tick");
            if i < 3 {
                assert_eq!(tick.estimate.state, ClockState::Syncing);
            }
            step = step.or(tick.step_ns);
        }
        let est = e_tick(&mut e, 4 * S);
        assert_eq!(
            (est.source, est.state),
            (SourceKind::Link, ClockState::Locked)
        );
        assert_eq!(est.offset_ns, est.target_ns, "no slewing at first lock");
        assert_eq!(step, Some(40 * MS));
    }

    #[test]
    fn a_noisy_reply_does_not_look_like_a_step() {
        let mut e = Estimator::new(cfg());
        for i in 0..10 {
            e.on_sample(sample(SourceKind::Link, i * S, 0, 50 * US));
            e.tick(MonoTime::from_nanos(i * S));
        }
        // One reply delayed 40 ms on the way back: its error says so.
        e.on_sample(sample(SourceKind::Link, 10 * S, -20 * MS, 20 * MS));
        let tick = e.tick(MonoTime::from_nanos(10 * S)).expect("tick");
        assert_eq!(tick.step_ns, None);
        assert!(tick.estimate.offset_ns.abs() < 200 * US, "{tick:?}");
        assert_eq!(tick.estimate.state, ClockState::Locked);
    }

    #[test]
    fn the_best_locked_kind_wins_over_a_smaller_uncertainty() {
        let mut e = Estimator::new(cfg());
        for i in 0..6 {
            e.on_sample(sample(SourceKind::Ntp, i * S, 0, 300 * US));
            e.on_sample(sample(SourceKind::System, i * S, 0, 2 * US));
            e.tick(MonoTime::from_nanos(i * S));
        }
        assert_eq!(e_tick(&mut e, 5 * S).source, SourceKind::Ntp);
    }

    #[test]
    fn no_sample_no_estimate_and_changes_are_flagged_once() {
        let mut e = Estimator::new(cfg());
        assert!(e.tick(MonoTime::from_nanos(0)).is_none());
        e.on_sample(sample(SourceKind::System, 0, 0, US));
        assert!(e.tick(MonoTime::from_nanos(0)).expect("tick").changed);
        e.on_sample(sample(SourceKind::System, S, 0, US));
        assert!(!e.tick(MonoTime::from_nanos(S)).expect("tick").changed);
    }
}
