//! The `rollout:` section: how the controller gives a new version to a
//! fleet stage by stage. Only the controller acts on it; an agent parses it
//! (it validates every pack it receives) and ignores it.

use std::time::Duration;

use baton_cron::CronSchedule;
use jiff::Timestamp;
use jiff::tz::TimeZone;

/// A validated `rollout:` section.
#[derive(Clone, Debug)]
pub struct Rollout {
    /// Cumulative shares of the pack's targets, canaries first; the last
    /// is always every target (`{percent: 100}`).
    pub stages: Vec<StageShare>,
    /// How long each stage is watched after its last agent acked.
    pub soak: Duration,
    /// A stage is judged only on at least this many settled firings of
    /// the new version.
    pub min_firings: u64,
    /// Thresholds that fail a stage the moment one is crossed
    /// ([`DEFAULT_ABORT_IF`] when the section has none).
    pub abort_if: AbortIf,
    /// Whether lateness and offset are judged against the agents still on
    /// the old version over the same window.
    pub compare: Compare,
    /// What a stage that is still undecided this long after it started
    /// does (`None`: it waits for ever, as a pause would).
    pub stage_deadline: Option<StageDeadline>,
    /// Stages start only inside one of these (empty: any time).
    pub windows: Vec<Window>,
    /// When a stage's agents start running the new version.
    pub activate: Activate,
    /// With `activate: together`: an agent whose clock uncertainty is
    /// above this at the instant is not switched (it stays on the old
    /// version and counts as missing: the stage is inconclusive).
    pub max_uncertainty: Duration,
    /// What an abort does to the agents that got the new version.
    pub on_abort: OnAbort,
}

/// Default `soak`.
pub const DEFAULT_SOAK: Duration = Duration::from_secs(300);
/// Default `max_uncertainty`.
pub const DEFAULT_MAX_UNCERTAINTY: Duration = Duration::from_millis(1);
/// Default `min_firings`.
pub const DEFAULT_MIN_FIRINGS: u64 = 1;
/// `abort_if` when the section has none: any failed firing, or any of
/// unknown outcome, fails the stage (a rollout fails closed; write
/// `abort_if` to allow some).
pub const DEFAULT_ABORT_IF: AbortIf = AbortIf {
    failed_percent: Some(0.0),
    unknown: Some(0),
    lateness_p99: None,
    offset: None,
};

/// One stage's cumulative share of the pack's targets.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum StageShare {
    /// This many agents in all (at most every target).
    Agents(u64),
    /// This percentage of the targets, rounded up (0 < p ≤ 100).
    Percent(f64),
}

impl StageShare {
    /// How many of `total` targets the stage covers, cumulatively:
    /// rounded up, so a small percentage of a small fleet is still one
    /// agent, and never more than `total`.
    pub fn of(&self, total: u64) -> u64 {
        match *self {
            StageShare::Agents(n) => n.min(total),
            StageShare::Percent(p) => {
                // Exact for any fleet below 2^53 agents; the tiny epsilon
                // keeps 10% of 30 at 3 despite 0.1 * 30 = 3.0000000000000004.
                let share = (p / 100.0 * total as f64 - 1e-9).ceil();
                (share.max(0.0) as u64).min(total)
            }
        }
    }
}

/// `abort_if`: each threshold given fails a stage once crossed.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AbortIf {
    /// Failed firings as a percentage of settled ones, above which the
    /// stage fails.
    pub failed_percent: Option<f64>,
    /// Firings whose outcome is unknown (an agent died mid-action), above
    /// which the stage fails.
    pub unknown: Option<u64>,
    /// Start lateness p99 above which the stage fails (with
    /// `compare: baseline`: above the baseline's p99 by more than this).
    pub lateness_p99: Option<Duration>,
    /// Clock offset (absolute, the largest of the cohort) above which the
    /// stage fails (with `compare: baseline`: above the baseline's by more
    /// than this).
    pub offset: Option<Duration>,
}

impl AbortIf {
    /// The effective gates in words, the ones turned off last, as
    /// `validate` shows them: an operator reads what fails a stage, not
    /// what the file happened to name.
    pub fn describe(&self) -> String {
        let d = crate::time::format_duration;
        let mut on = Vec::new();
        let mut off = Vec::new();
        match self.failed_percent {
            Some(p) => on.push(format!("failed firings > {p}%")),
            None => off.push("failed_percent"),
        }
        match self.unknown {
            Some(n) => on.push(format!("unknown outcomes > {n}")),
            None => off.push("unknown"),
        }
        match self.lateness_p99 {
            Some(l) => on.push(format!("lateness p99 > {}", d(l))),
            None => off.push("lateness_p99"),
        }
        match self.offset {
            Some(o) => on.push(format!("clock offset > {}", d(o))),
            None => off.push("offset"),
        }
        let mut out = if on.is_empty() {
            "nothing fails a stage".to_string()
        } else {
            format!("a stage fails on {}", on.join(", "))
        };
        if !off.is_empty() {
            out.push_str(&format!("; off: {}", off.join(", ")));
        }
        out
    }
}

/// `compare`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Compare {
    /// Thresholds are absolute.
    #[default]
    Absolute,
    /// Lateness and offset are judged against the agents still on the old
    /// version, over the same window (absolute when there are none).
    Baseline,
}

/// `stage_deadline`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StageDeadline {
    /// From the stage's start.
    pub after: Duration,
    /// What an undecided stage does then.
    pub then: DeadlineAction,
}

/// `stage_deadline.then`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeadlineAction {
    /// The rollout pauses until an operator resumes it.
    Pause,
    /// The rollout aborts.
    Abort,
    /// Agents that never acked are left out of the verdict (recorded as
    /// skipped, never as passed) and the stage is judged on the others;
    /// too few firings still pause.
    SkipOffline,
}

/// `activate`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Activate {
    /// Each agent runs the new version as soon as it accepts it.
    #[default]
    OnArrival,
    /// A stage's agents receive the version staged, then switch at one
    /// instant on their aligned clocks.
    Together,
}

/// `on_abort`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnAbort {
    /// The agents that got the new version get the previous version's
    /// content again, as a new, higher version.
    #[default]
    Rollback,
    /// The new version is cancelled on them: its safe state runs.
    SafeState,
}

/// A window stages may start in: from each firing of `cron` (in `tz`) for
/// `duration`.
#[derive(Clone, Debug)]
pub struct Window {
    /// The expression as written.
    pub cron_text: String,
    /// Compiled.
    pub cron: Box<CronSchedule>,
    /// How long each window stays open.
    pub duration: Duration,
    /// The zone's IANA name (the pack's `timezone` unless given).
    pub tz_name: String,
    /// The zone.
    pub tz: TimeZone,
}

impl Window {
    /// Whether `now` lies in a window: some firing `f` with
    /// `f <= now < f + duration`. The earliest firing that can still cover
    /// `now` is the first after `now - duration` (a firing exactly then
    /// closes at `now`, outside).
    pub fn is_open(&self, now: Timestamp) -> bool {
        self.open_since(now).is_some()
    }

    /// The opening of the window `now` lies in, if it does.
    pub fn open_since(&self, now: Timestamp) -> Option<Timestamp> {
        let span = jiff::SignedDuration::try_from(self.duration).ok()?;
        let from = now.checked_sub(span).ok()?;
        self.cron
            .next_after(&self.tz, from)
            .filter(|&first| first <= now)
    }

    /// The next opening strictly after `now`.
    pub fn next_open(&self, now: Timestamp) -> Option<Timestamp> {
        self.cron.next_after(&self.tz, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_round_up_and_stay_within_the_fleet() {
        assert_eq!(StageShare::Percent(10.0).of(30), 3);
        assert_eq!(StageShare::Percent(10.0).of(31), 4);
        assert_eq!(StageShare::Percent(1.0).of(5), 1);
        assert_eq!(StageShare::Percent(100.0).of(7), 7);
        assert_eq!(StageShare::Agents(3).of(2), 2);
        assert_eq!(StageShare::Percent(50.0).of(0), 0);
    }

    #[test]
    fn a_window_is_open_from_its_firing_for_its_duration_in_its_zone() {
        let tz = TimeZone::get("Europe/Berlin").expect("zone");
        let w = Window {
            cron_text: "0 0 2 * * *".into(),
            cron: Box::new(CronSchedule::parse("0 0 2 * * *").expect("cron")),
            duration: Duration::from_secs(2 * 3600),
            tz_name: "Europe/Berlin".into(),
            tz,
        };
        // 02:00 Berlin in winter is 01:00 UTC.
        let at = |s: &str| s.parse::<Timestamp>().expect("instant");
        assert!(!w.is_open(at("2026-12-01T00:59:59Z")));
        assert!(w.is_open(at("2026-12-01T01:00:00Z")));
        assert!(w.is_open(at("2026-12-01T02:59:59Z")));
        assert!(!w.is_open(at("2026-12-01T03:00:00Z")));
        // In summer 02:00 Berlin is 00:00 UTC.
        assert!(w.is_open(at("2026-07-01T00:30:00Z")));
        assert!(!w.is_open(at("2026-07-01T02:30:00Z")));
        assert_eq!(
            w.next_open(at("2026-12-01T03:00:00Z")),
            Some(at("2026-12-02T01:00:00Z"))
        );
    }
}
