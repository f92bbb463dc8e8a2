//! What fails a stage: a refusal, or a threshold of `abort_if` crossed.

use baton_proto::pack::rollout::{Compare, Rollout};
use baton_proto::time::format_duration;

use super::{AgentView, Observed, duration_ns};
use crate::time::span_ns;

/// Why the stage fails now, if it does. Failed and unknown firings fail
/// it at any time; lateness and offset only once the stage has
/// `min_firings` settled firings (a p99 of three firings is their
/// maximum, and one slow first firing must not abort a fleet's rollout).
pub(super) fn failure<'a>(
    spec: &Rollout,
    members: impl Iterator<Item = &'a AgentView>,
    obs: &Observed,
) -> Option<String> {
    let mut refused = members.filter_map(|a| a.refused.as_ref().map(|m| (a, m)));
    if let Some((a, msg)) = refused.next() {
        return Some(format!("agent {} refused the version: {msg}", a.id));
    }
    let t = &spec.abort_if;
    let c = &obs.cohort;
    if let Some(max) = t.failed_percent
        && c.settled > 0
        && c.failed_percent() > max
    {
        return Some(format!(
            "{} of {} settled firing(s) failed ({:.2}%), above failed_percent {max}%",
            c.failed,
            c.settled,
            c.failed_percent()
        ));
    }
    if let Some(max) = t.unknown
        && c.unknown > max
    {
        return Some(format!(
            "{} firing(s) of unknown outcome, above unknown {max}",
            c.unknown
        ));
    }
    if c.settled < spec.min_firings.max(1) {
        return None;
    }
    let base = match spec.compare {
        Compare::Baseline => obs.baseline.as_ref(),
        Compare::Absolute => None,
    };
    if let (Some(max), Some(p99)) = (t.lateness_p99, c.lateness_p99.map(span_ns)) {
        let base_p99 = base.and_then(|b| b.lateness_p99.map(span_ns));
        if let Some(why) = over("lateness p99", p99, base_p99, duration_ns(max)) {
            return Some(why);
        }
    }
    if let (Some(max), Some(off)) = (t.offset, c.offset_max.map(span_ns)) {
        let base_off = base.and_then(|b| b.offset_max.map(span_ns));
        if let Some(why) = over("clock offset", off, base_off, duration_ns(max)) {
            return Some(why);
        }
    }
    None
}

/// `value` over `max` (or over `base` by more than `max`), in words.
fn over(what: &str, value: i64, base: Option<i64>, max: i64) -> Option<String> {
    let ns = |v: i64| format_duration(std::time::Duration::from_nanos(v.unsigned_abs()));
    match base {
        Some(b) if value.saturating_sub(b) > max => Some(format!(
            "{what} {} is {} above the baseline's {}, more than the {} allowed",
            ns(value),
            ns(value.saturating_sub(b)),
            ns(b),
            ns(max)
        )),
        Some(_) => None,
        None if value > max => Some(format!(
            "{what} {} is above the {} allowed",
            ns(value),
            ns(max)
        )),
        None => None,
    }
}
