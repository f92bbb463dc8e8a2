//! The validated pack: what the agent schedules and the controller stores.
//!
//! Every value here has passed validation; defaults are already applied, so
//! the scheduler never has to ask "was this set?".

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use baton_cron::CronSchedule;
use jiff::tz::TimeZone;

use crate::time::RefTime;
use crate::yaml::Pos;

/// A validated instruction pack.
#[derive(Clone, Debug)]
pub struct Pack {
    /// Pack id, unique within the tenant.
    pub id: String,
    /// Version; a higher one replaces the pack atomically.
    pub version: u64,
    /// Tenant, `default` unless given.
    pub tenant: String,
    /// Which agents the controller sends it to (not needed on the agent).
    pub targets: Option<Targets>,
    /// IANA zone name the pack's wall times and cron fields are written in.
    pub timezone_name: String,
    /// The zone itself.
    pub timezone: TimeZone,
    /// Optional free text.
    pub description: Option<String>,
    /// `lease`: how long the pack keeps running without contact with the
    /// controller. Past it the agent drives the pack's safe state (reason
    /// `lease_lost`) and keeps it stopped until a higher version arrives.
    /// `None` (no `lease` key): the pack runs its schedule offline for as
    /// long as the agent is up. Always greater than zero.
    pub lease: Option<Duration>,
    /// `on_clock_loss`: what a running pack that needs absolute time does
    /// when the agent's clock uncertainty rises past its limit.
    pub on_clock_loss: ClockLoss,
    /// Actions that drive the device to a safe state.
    pub safe_state: Vec<Action>,
    /// Lines this pack agrees to share with other packs that declare them
    /// shared too, normalised ([`LineRef::normalized`]). Each is a line the
    /// pack drives; see [`Pack::driven_lines`] and [`Pack::line_conflicts`].
    pub shared_lines: Vec<LineRef>,
    /// Instructions in pack order (the order breaks priority ties).
    pub instructions: Vec<Instruction>,
    /// How the controller gives this version to the fleet (`None`: to
    /// every target at once). The agent ignores it.
    pub rollout: Option<super::rollout::Rollout>,
}

impl Pack {
    /// Whether any instruction is placed on absolute reference time: an
    /// `at`, a `cron` calendar, or an `every` with `start_at` / `until`.
    /// Such a pack is refused while the agent's clock is less certain than
    /// its limit (docs/design.md principle 3); a pack of plain `every` and
    /// `after` only runs on intervals, which an unsynchronised clock keeps.
    pub fn needs_absolute_time(&self) -> bool {
        self.instructions.iter().any(|i| match &i.schedule {
            Schedule::At(_) | Schedule::Cron { .. } => true,
            Schedule::Every {
                start_at, until, ..
            } => start_at.is_some() || until.is_some(),
            Schedule::After { .. } => false,
        })
    }

    /// The instruction with this id.
    pub fn instruction(&self, id: &str) -> Option<&Instruction> {
        self.instructions.iter().find(|i| i.id == id)
    }

    /// Every action the pack can run, with the instruction it belongs to
    /// (`None` for `safe_state`): what the agent checks against its allowlist.
    pub fn all_actions(&self) -> impl Iterator<Item = (Option<&Instruction>, &Action)> {
        self.instructions
            .iter()
            .flat_map(|i| {
                std::iter::once((Some(i), &i.action))
                    .chain(i.policy.on_failure.iter().map(move |a| (Some(i), a)))
            })
            .chain(self.safe_state.iter().map(|a| (None, a)))
    }
}

/// An agent update's plan: which agents, and the stages, soak, gates,
/// windows and deadline of its rollout (a pack's `rollout:` section).
#[derive(Clone, Debug)]
pub struct UpdatePlan {
    /// The agents it is for (`None`: every agent the operator sees).
    pub targets: Option<Targets>,
    /// How it reaches them.
    pub rollout: crate::pack::rollout::Rollout,
}

/// Which agents a pack is for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Targets {
    /// These agent ids.
    Agents(Vec<String>),
    /// Every agent carrying all these labels.
    Labels(BTreeMap<String, String>),
}

/// One instruction, with defaults applied.
#[derive(Clone, Debug)]
pub struct Instruction {
    /// Id, unique within the pack.
    pub id: String,
    /// Where the instruction starts in the pack file.
    pub pos: Pos,
    /// Where its schedule's value (`at`, `every`, `cron` or `after`) starts.
    pub schedule_pos: Pos,
    /// What it does.
    pub action: Action,
    /// When it does it.
    pub schedule: Schedule,
    /// Equal deadlines fire highest priority first, then in pack order.
    pub priority: u8,
    /// Retry, timeouts and failure handling. Shared: instructions with the
    /// same settings (most of a pack, through `defaults`) hold one `Arc`,
    /// which keeps a 10 000-instruction pack small on the agent.
    pub policy: Arc<Policy>,
    /// Optional free text.
    pub description: Option<Box<str>>,
}

/// How an instruction's attempts are bounded and what failure does.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Policy {
    /// How failed attempts are retried.
    pub retry: RetryPolicy,
    /// Per-attempt timeout.
    pub timeout: Duration,
    /// A firing later than this is skipped and reported, not run.
    pub max_lateness: Duration,
    /// Run when the instruction gives up (retries exhausted or missed).
    pub on_failure: Option<Action>,
    /// What giving up does to the rest of the pack.
    pub on_give_up: OnGiveUp,
    /// What to do with occurrences missed during downtime.
    pub catch_up: CatchUp,
}

/// When an instruction fires. Exactly one per instruction.
#[derive(Clone, Debug, PartialEq)]
pub enum Schedule {
    /// Once, at this instant.
    At(RefTime),
    /// Every `period` from `start_at` (default: on acceptance) to `until`.
    Every {
        /// Interval between firings.
        period: Duration,
        /// First firing; `None` means "when the pack is accepted".
        start_at: Option<RefTime>,
        /// Last possible firing (inclusive).
        until: Option<RefTime>,
    },
    /// On a cron calendar in the pack's time zone.
    Cron {
        /// The parsed expression.
        cron: Box<CronSchedule>,
        /// The text as written, for messages.
        expr: String,
        /// No firing before this.
        start_at: Option<RefTime>,
        /// No firing after this (inclusive).
        until: Option<RefTime>,
    },
    /// When every upstream instruction has succeeded, plus `delay`.
    After {
        /// Upstream instruction ids.
        upstream: Vec<String>,
        /// Wait after the last upstream success.
        delay: Duration,
    },
}

impl Schedule {
    /// True for schedules that fire more than once on their own.
    pub fn is_repeating(&self) -> bool {
        matches!(self, Schedule::Every { .. } | Schedule::Cron { .. })
    }

    /// Short name for messages (`at`, `every`, `cron`, `after`).
    pub fn kind(&self) -> &'static str {
        match self {
            Schedule::At(_) => "at",
            Schedule::Every { .. } => "every",
            Schedule::Cron { .. } => "cron",
            Schedule::After { .. } => "after",
        }
    }
}

/// Retry policy, fully resolved.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetryPolicy {
    /// Attempts in all, including the first (≥ 1).
    pub max_attempts: u32,
    /// Wait before the first retry.
    pub backoff: Duration,
    /// Growth of the wait per retry (≥ 1).
    pub factor: f64,
    /// Cap on the wait.
    pub max_backoff: Duration,
    /// Random spread of each wait, as a fraction in [0, 1].
    pub jitter: f64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 1,
            backoff: Duration::from_millis(100),
            factor: 2.0,
            max_backoff: Duration::from_secs(5),
            jitter: 0.0,
        }
    }
}

// Validation refuses NaN and infinities, so comparing the floats by their
// bits is a true equivalence: policies can be interned in a hash map.
impl Eq for RetryPolicy {}

impl Hash for RetryPolicy {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.max_attempts.hash(h);
        self.backoff.hash(h);
        self.factor.to_bits().hash(h);
        self.max_backoff.hash(h);
        self.jitter.to_bits().hash(h);
    }
}

impl RetryPolicy {
    /// The wait before retry number `retry` (1 = first retry) with no
    /// jitter: `backoff * factor^(retry-1)`, capped at `max_backoff`.
    pub fn base_delay(&self, retry: u32) -> Duration {
        let exp = retry.saturating_sub(1).min(1024) as i32;
        let secs = self.backoff.as_secs_f64() * self.factor.powi(exp);
        let cap = self.max_backoff.as_secs_f64();
        Duration::from_secs_f64(secs.min(cap).max(0.0))
    }

    /// The wait with jitter applied: `unit` is a uniform sample in [0, 1)
    /// from the caller's (seedable) RNG, spreading the wait over
    /// `base * (1 ± jitter)`, still capped at `max_backoff`.
    pub fn delay(&self, retry: u32, unit: f64) -> Duration {
        let base = self.base_delay(retry).as_secs_f64();
        let spread = 1.0 + self.jitter * (2.0 * unit.clamp(0.0, 1.0) - 1.0);
        let cap = self.max_backoff.as_secs_f64();
        Duration::from_secs_f64((base * spread).min(cap).max(0.0))
    }
}

/// What giving up on an instruction does to the rest of its pack.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum OnGiveUp {
    /// Run `safe_state` and fire nothing more of the pack (the default).
    #[default]
    SafeState,
    /// Skip only this instruction's dependents.
    Continue,
}

/// What a pack that needs absolute time ([`Pack::needs_absolute_time`])
/// does when the agent loses sync past its limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum ClockLoss {
    /// Keep firing; every firing's feedback carries the uncertainty it
    /// fired with (the default).
    #[default]
    Continue,
    /// Drive the safe state (reason `clock_lost`) and stay stopped until a
    /// higher version is accepted.
    SafeState,
}

/// What to do with repeating occurrences missed while the agent was down.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum CatchUp {
    /// Drop them (the default).
    #[default]
    None,
    /// Fire the latest one once.
    Last,
    /// Fire each one (capped, and reported).
    All,
}

/// A GPIO line: an offset on a chip or a name as libgpiod names it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Line {
    /// Offset on the chip.
    Offset(u32),
    /// Line name (`line: "RELAY_MAIN"`; a quoted number is a name too).
    Name(String),
}

impl std::fmt::Display for Line {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Line::Offset(o) => write!(f, "{o}"),
            Line::Name(n) => f.write_str(n),
        }
    }
}

/// A line on an optional chip (`None`: the agent's default chip, or found by name).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LineRef {
    /// Chip, e.g. `gpiochip0`.
    pub chip: Option<String>,
    /// Line on it.
    pub line: Line,
}

/// Something the agent does to the device.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Drive a line to a level.
    GpioWrite {
        /// The line.
        line: LineRef,
        /// 0 or 1.
        value: u8,
    },
    /// Invert a line.
    GpioToggle {
        /// The line.
        line: LineRef,
    },
    /// Drive a line to `value` for `width`, then back.
    GpioPulse {
        /// The line.
        line: LineRef,
        /// How long the pulse lasts.
        width: Duration,
        /// Level during the pulse (default 1).
        value: u8,
    },
    /// Sample a line; the value goes into feedback.
    GpioRead {
        /// The line.
        line: LineRef,
    },
    /// Run a program from the agent's allowlist.
    Exec {
        /// Absolute path of the program.
        program: String,
        /// Arguments.
        args: Vec<String>,
        /// Extra environment.
        env: BTreeMap<String, String>,
    },
    /// Do nothing (tests, placeholders, DAG joins).
    Noop,
}

impl Action {
    /// The action's name as written in packs.
    pub fn name(&self) -> &'static str {
        match self {
            Action::GpioWrite { .. } => "gpio.write",
            Action::GpioToggle { .. } => "gpio.toggle",
            Action::GpioPulse { .. } => "gpio.pulse",
            Action::GpioRead { .. } => "gpio.read",
            Action::Exec { .. } => "exec",
            Action::Noop => "noop",
        }
    }

    /// The GPIO line this action touches, if any.
    pub fn line(&self) -> Option<&LineRef> {
        match self {
            Action::GpioWrite { line, .. }
            | Action::GpioToggle { line }
            | Action::GpioPulse { line, .. }
            | Action::GpioRead { line } => Some(line),
            Action::Exec { .. } | Action::Noop => None,
        }
    }
}
