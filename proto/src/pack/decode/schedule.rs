//! The schedule of an instruction: exactly one of `at`, `every`, `cron`,
//! `after`, with the keys that qualify it (`start_at`, `until`, `delay`).

use std::collections::HashSet;
use std::time::Duration;

use baton_cron::CronSchedule;
use jiff::tz::TimeZone;

use super::fields::{Ctx, Fields};
use super::scalar::{duration, instant, positive_duration, string, string_list};
use super::{MIN_PERIOD, SCHEDULE_KEYS};
use crate::pack::model::Schedule;
use crate::time::{RefTime, parse_duration};
use crate::yaml::{Node, Pos, Value};

/// The schedule keys present, in [`SCHEDULE_KEYS`] order.
pub(super) fn present(f: &Fields<'_>) -> Vec<&'static str> {
    SCHEDULE_KEYS
        .iter()
        .copied()
        .filter(|k| f.get(k).is_some())
        .collect()
}

/// The one schedule key, or an error for none or several.
fn kind(cx: &mut Ctx, f: &Fields<'_>) -> Option<&'static str> {
    let present = present(f);
    match present.as_slice() {
        [] => {
            cx.err(
                f.node.pos,
                "no schedule: give exactly one of `at`, `every`, `cron`, `after`",
            );
            None
        }
        [one] => Some(one),
        [_, second, ..] => {
            cx.err(
                f.key_pos(second),
                format!(
                    "more than one schedule ({}): give exactly one of `at`, `every`, `cron`, `after`",
                    present.join(", ")
                ),
            );
            None
        }
    }
}

/// Keys that only make sense with another kind of schedule.
fn misplaced_keys(cx: &mut Ctx, f: &Fields<'_>, kind: &str) {
    if kind != "after" && f.get("delay").is_some() {
        cx.err(
            f.key_pos("delay"),
            "`delay` only applies to `after` schedules",
        );
    }
    if !matches!(kind, "every" | "cron") {
        for key in ["start_at", "until"] {
            if f.get(key).is_some() {
                cx.err(
                    f.key_pos(key),
                    format!(
                        "`{key}` only applies to repeating schedules (`every`, `cron`), not `{kind}`"
                    ),
                );
            }
        }
    }
}

/// `start_at` and `until`, each `None` when absent or invalid.
fn bounds(cx: &mut Ctx, f: &Fields<'_>) -> (Option<RefTime>, Option<RefTime>) {
    let start = f.get("start_at").and_then(|n| instant(cx, n, "start_at"));
    let end = f.get("until").and_then(|n| instant(cx, n, "until"));
    if let (Some(s), Some(e), Some(n)) = (start, end, f.get("until"))
        && e < s
    {
        cx.err(
            n.pos,
            "`until` is before `start_at`: the schedule would never fire",
        );
    }
    (start, end)
}

/// Decode the schedule. With several schedule keys each value is still
/// checked, so every error shows at once.
pub(super) fn schedule(cx: &mut Ctx, f: &Fields<'_>) -> Option<Schedule> {
    let kind = kind(cx, f);
    if let Some(k) = kind {
        misplaced_keys(cx, f, k);
    }
    let (start, end) = bounds(cx, f);
    let Some(kind) = kind else {
        for k in present(f) {
            if let Some(n) = f.get(k) {
                one(cx, k, n, f.get("delay"), (start, end));
            }
        }
        return None;
    };
    one(cx, kind, f.get(kind)?, f.get("delay"), (start, end))
}

fn one(
    cx: &mut Ctx,
    kind: &str,
    node: &Node,
    delay: Option<&Node>,
    (start, end): (Option<RefTime>, Option<RefTime>),
) -> Option<Schedule> {
    match kind {
        "at" => instant(cx, node, "at").map(Schedule::At),
        "every" => {
            let period = positive_duration(cx, node, "every")?;
            if period < MIN_PERIOD {
                cx.err(node.pos, "every must be at least 1ms");
                return None;
            }
            Some(Schedule::Every {
                period,
                start_at: start,
                until: end,
            })
        }
        "cron" => cron(cx, node, start, end),
        _ => after(cx, node, delay),
    }
}

fn cron(
    cx: &mut Ctx,
    node: &Node,
    start: Option<RefTime>,
    end: Option<RefTime>,
) -> Option<Schedule> {
    let expr = string(cx, node, "cron")?;
    if let Some(rest) = expr.trim().strip_prefix("@every") {
        let period = match parse_duration(rest.trim()) {
            Ok(p) if p >= MIN_PERIOD => p,
            Ok(_) => {
                cx.err(node.pos, "cron `@every` period must be at least 1ms");
                return None;
            }
            Err(e) => {
                cx.err(node.pos, format!("cron `{expr}`: {e}"));
                return None;
            }
        };
        return Some(Schedule::Every {
            period,
            start_at: start,
            until: end,
        });
    }
    let cron = match CronSchedule::parse(&expr) {
        Ok(c) => c,
        Err(e) => {
            let quote = u32::from(!matches!(node.value, Value::Scalar { plain: true, .. }));
            let offset = u32::try_from(e.offset).unwrap_or(u32::MAX);
            let pos = Pos {
                line: node.pos.line,
                col: node.pos.col.saturating_add(quote).saturating_add(offset),
            };
            cx.err(pos, format!("cron `{expr}`: {}", e.message));
            return None;
        }
    };
    if let Some(why) = never_fires_within(&cron, &cx.tz, start, end) {
        cx.err(node.pos, format!("cron `{expr}` {why}"));
        return None;
    }
    Some(Schedule::Cron {
        cron: Box::new(cron),
        expr,
        start_at: start,
        until: end,
    })
}

/// Why `cron` has no firing at or after `start` and at or before `until`
/// (both inclusive, both optional), or `None` if it has one. Pure: it needs
/// no clock, so it runs at parse time; [`crate::pack::Pack::check_live`]
/// does the same against "now".
pub(super) fn never_fires_within(
    cron: &CronSchedule,
    tz: &TimeZone,
    start: Option<RefTime>,
    until: Option<RefTime>,
) -> Option<String> {
    if start.is_none() && until.is_none() {
        // The cron parser already refused expressions that never fire.
        return None;
    }
    // Cron years start in 1970: searching from before that adds nothing.
    let epoch = RefTime::from_nanos(0);
    let from = start.map_or(epoch, |s| s.max(epoch));
    let first = cron
        .next_after(tz, (from - Duration::from_nanos(1)).to_timestamp())
        .and_then(RefTime::from_timestamp);
    match (first, start, until) {
        (None, Some(s), _) => Some(format!(
            "can never fire: it has no firing at or after start_at ({s})"
        )),
        (Some(t), Some(s), Some(u)) if t > u => Some(format!(
            "can never fire: its first firing after start_at ({s}) is {t}, after until ({u})"
        )),
        (Some(t), None, Some(u)) if t > u => Some(format!(
            "can never fire: its first firing is {t}, after until ({u})"
        )),
        _ => None,
    }
}

fn after(cx: &mut Ctx, node: &Node, delay: Option<&Node>) -> Option<Schedule> {
    let delay = match delay {
        Some(n) => duration(cx, n, "delay"),
        None => Some(Duration::ZERO),
    };
    let list = string_list(cx, node, "after")?;
    if list.is_empty() {
        cx.err(node.pos, "`after` needs at least one instruction id");
        return None;
    }
    let mut seen = HashSet::new();
    for (id, pos) in &list {
        if !seen.insert(id.as_str()) {
            cx.err(*pos, format!("`after` lists `{id}` twice"));
        }
    }
    Some(Schedule::After {
        upstream: list.into_iter().map(|(s, _)| s).collect(),
        delay: delay?,
    })
}

/// The ids an instruction's `after` names, with their positions, read
/// straight from the tree: the `after` graph is checked even for
/// instructions that have other errors.
pub(super) fn upstream_refs(f: &Fields<'_>) -> Vec<(String, Pos)> {
    match f.get("after").map(|n| &n.value) {
        Some(Value::Seq(items)) => items
            .iter()
            .filter(|n| !n.is_null())
            .filter_map(|n| n.as_scalar().map(|s| (s.to_string(), n.pos)))
            .collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> RefTime {
        RefTime::from_timestamp(s.parse().expect("instant")).expect("in range")
    }

    #[test]
    fn cron_window() {
        let tz = TimeZone::get("Europe/Berlin").expect("zone");
        let y2030 = CronSchedule::parse("0 0 0 1 1 * 2030").expect("cron");
        assert_eq!(never_fires_within(&y2030, &tz, None, None), None);
        assert_eq!(
            never_fires_within(&y2030, &tz, Some(t("2029-01-01T00:00:00Z")), None),
            None
        );
        let late = never_fires_within(&y2030, &tz, Some(t("2031-01-01T00:00:00Z")), None);
        assert!(late.is_some_and(|m| m.contains("no firing at or after start_at")));
        let early = never_fires_within(&y2030, &tz, None, Some(t("2029-06-01T00:00:00Z")));
        assert!(early.is_some_and(|m| m.contains("first firing is 2029-12-31T23:00:00")));
        // Far in the future, in a zone with many transitions: still found.
        let y2190 = CronSchedule::parse("0 0 0 1 1 * 2190").expect("cron");
        assert_eq!(
            never_fires_within(&y2190, &tz, None, Some(t("2191-01-01T00:00:00Z"))),
            None
        );
    }
}
