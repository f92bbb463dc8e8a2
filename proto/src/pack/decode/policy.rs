//! Retry, timeout, lateness and failure handling: `defaults` and the
//! per-instruction overrides.

use std::time::Duration;

use super::fields::{Ctx, Fields};
use super::scalar::{duration, duration_at_least, float, positive_duration, uint};
use super::{DEFAULTS_KEYS, MAX_ATTEMPTS, RETRY_KEYS};
use crate::pack::model::{CatchUp, ClockLoss, OnGiveUp, RetryPolicy};
use crate::time::format_duration;
use crate::yaml::{Node, Pos};

/// Default per-attempt timeout when neither the pack nor the instruction sets one.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Default lateness bound when neither the pack nor the instruction sets one.
pub const DEFAULT_MAX_LATENESS: Duration = Duration::from_secs(1);
/// Smallest `max_lateness` accepted.
///
/// No firing is ever exactly on time: the dispatcher wakes on a Linux timer,
/// and even on a SCHED_FIFO thread that costs tens to hundreds of
/// microseconds, more under load. A bound below that skips firings at
/// random, and `0s` skips every one. 1ms is well above that wake-up jitter
/// on the boxes baton targets, and is also the shortest `every` period
/// ([`super::MIN_PERIOD`]): finer control than that is not what baton
/// schedules.
pub const MIN_MAX_LATENESS: Duration = Duration::from_millis(1);

/// `max_lateness`, at least [`MIN_MAX_LATENESS`].
pub(super) fn max_lateness(cx: &mut Ctx, node: &Node) -> Option<Duration> {
    duration_at_least(
        cx,
        node,
        "max_lateness",
        MIN_MAX_LATENESS,
        ": every firing is a little late (timer wake-up), so a smaller bound would skip firings at random",
    )
}

/// A retry mapping as written: every field optional, so an instruction can
/// override the defaults field by field.
#[derive(Clone, Copy, Default)]
pub(super) struct RetryPatch {
    max_attempts: Option<u32>,
    backoff: Option<Duration>,
    factor: Option<f64>,
    max_backoff: Option<Duration>,
    jitter: Option<f64>,
}

impl RetryPatch {
    pub(super) fn apply(&self, base: RetryPolicy) -> RetryPolicy {
        RetryPolicy {
            max_attempts: self.max_attempts.unwrap_or(base.max_attempts),
            backoff: self.backoff.unwrap_or(base.backoff),
            factor: self.factor.unwrap_or(base.factor),
            max_backoff: self.max_backoff.unwrap_or(base.max_backoff),
            jitter: self.jitter.unwrap_or(base.jitter),
        }
    }
}

pub(super) fn retry_patch(cx: &mut Ctx, node: &Node) -> Option<RetryPatch> {
    let f = Fields::new(cx, node, "retry", RETRY_KEYS)?;
    let mut p = RetryPatch::default();
    if let Some(n) = f.get("max_attempts") {
        p.max_attempts =
            uint(cx, n, "retry.max_attempts", u64::from(MAX_ATTEMPTS)).map(|v| v as u32);
        if p.max_attempts == Some(0) {
            cx.err(
                n.pos,
                "retry.max_attempts must be at least 1 (it counts the first attempt)",
            );
        }
    }
    if let Some(n) = f.get("backoff") {
        p.backoff = duration(cx, n, "retry.backoff");
    }
    if let Some(n) = f.get("factor") {
        p.factor = float(cx, n, "retry.factor");
        if p.factor.is_some_and(|v| v < 1.0) {
            cx.err(
                n.pos,
                "retry.factor must be at least 1.0 (waits never shrink)",
            );
        }
    }
    if let Some(n) = f.get("max_backoff") {
        p.max_backoff = duration(cx, n, "retry.max_backoff");
    }
    if let Some(n) = f.get("jitter") {
        p.jitter = float(cx, n, "retry.jitter");
        if p.jitter.is_some_and(|v| !(0.0..=1.0).contains(&v)) {
            cx.err(
                n.pos,
                "retry.jitter must be between 0 and 1 (a fraction of the wait)",
            );
        }
    }
    Some(p)
}

/// Checks across the fields of a resolved policy.
pub(super) fn check_retry(cx: &mut Ctx, pos: Pos, r: &RetryPolicy) {
    if r.backoff > r.max_backoff {
        cx.err(
            pos,
            format!(
                "retry.backoff ({}) is larger than retry.max_backoff ({})",
                format_duration(r.backoff),
                format_duration(r.max_backoff)
            ),
        );
    }
}

/// A `retry` override on top of `base`, checked as a whole.
pub(super) fn retry(cx: &mut Ctx, node: &Node, base: RetryPolicy) -> Option<RetryPolicy> {
    let p = retry_patch(cx, node)?;
    let r = p.apply(base);
    check_retry(cx, node.pos, &r);
    Some(r)
}

/// Defaults that apply to every instruction.
pub(super) struct Defaults {
    pub(super) retry: RetryPolicy,
    pub(super) timeout: Duration,
    pub(super) max_lateness: Duration,
}

impl Default for Defaults {
    fn default() -> Self {
        Defaults {
            retry: RetryPolicy::default(),
            timeout: DEFAULT_TIMEOUT,
            max_lateness: DEFAULT_MAX_LATENESS,
        }
    }
}

/// The pack's `defaults`; a bad field keeps the built-in default, so the
/// instructions are still checked against something sensible.
pub(super) fn defaults(cx: &mut Ctx, node: Option<&Node>) -> Defaults {
    let mut d = Defaults::default();
    let Some(f) = node.and_then(|n| Fields::new(cx, n, "defaults", DEFAULTS_KEYS)) else {
        return d;
    };
    if let Some(r) = f.get("retry").and_then(|n| retry(cx, n, d.retry)) {
        d.retry = r;
    }
    if let Some(t) = f
        .get("timeout")
        .and_then(|n| positive_duration(cx, n, "timeout"))
    {
        d.timeout = t;
    }
    if let Some(t) = f.get("max_lateness").and_then(|n| max_lateness(cx, n)) {
        d.max_lateness = t;
    }
    d
}

pub(super) fn on_give_up(cx: &mut Ctx, node: &Node) -> Option<OnGiveUp> {
    match node.as_scalar() {
        Some("safe_state") => Some(OnGiveUp::SafeState),
        Some("continue") => Some(OnGiveUp::Continue),
        _ => {
            cx.err(
                node.pos,
                "on_give_up must be `safe_state` (default) or `continue`",
            );
            None
        }
    }
}

/// `on_clock_loss` (pack level).
pub(super) fn on_clock_loss(cx: &mut Ctx, node: &Node) -> Option<ClockLoss> {
    match node.as_scalar() {
        Some("continue") => Some(ClockLoss::Continue),
        Some("safe_state") => Some(ClockLoss::SafeState),
        _ => {
            cx.err(
                node.pos,
                "on_clock_loss must be `continue` (default) or `safe_state`",
            );
            None
        }
    }
}

/// `catch_up`; `repeating` is whether the instruction's schedule repeats
/// (`None` when it is unknown because the schedule has errors).
pub(super) fn catch_up(cx: &mut Ctx, node: &Node, repeating: Option<bool>) -> Option<CatchUp> {
    let c = match node.as_scalar() {
        Some("none") => Some(CatchUp::None),
        Some("last") => Some(CatchUp::Last),
        Some("all") => Some(CatchUp::All),
        _ => {
            cx.err(
                node.pos,
                "catch_up must be `none` (default), `last` or `all`",
            );
            None
        }
    };
    if repeating == Some(false) {
        cx.err(
            node.pos,
            "catch_up only applies to repeating schedules (`every`, `cron`); a missed `at` fires once if still within max_lateness",
        );
    }
    c
}
