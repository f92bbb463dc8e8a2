//! `rollout:`: stages, soak, thresholds, deadline, windows, activation.

use std::time::Duration;

use baton_cron::CronSchedule;

use super::super::rollout::*;
use super::fields::{Ctx, Fields};
use super::scalar::{duration, float, plain_scalar, positive_duration, string, uint};
use crate::yaml::{Node, Value};

pub(crate) const ROLLOUT_KEYS: &[&str] = &[
    "stages",
    "soak",
    "min_firings",
    "abort_if",
    "compare",
    "stage_deadline",
    "windows",
    "activate",
    "max_uncertainty",
    "on_abort",
];
pub(crate) const ABORT_IF_KEYS: &[&str] = &["failed_percent", "unknown", "lateness_p99", "offset"];
pub(crate) const WINDOW_KEYS: &[&str] = &["cron", "duration", "tz"];

/// Most stages a rollout may have.
pub const MAX_STAGES: usize = 100;

/// Decodes `rollout:`; `None` (with errors) when any part is invalid.
pub(super) fn rollout(cx: &mut Ctx, node: &Node) -> Option<Rollout> {
    let f = Fields::new(cx, node, "rollout", ROLLOUT_KEYS)?;
    let stages = f
        .required(cx, "stages", "rollout")
        .and_then(|n| stages(cx, n));
    let soak = f
        .get("soak")
        .map_or(Some(DEFAULT_SOAK), |n| duration(cx, n, "rollout.soak"));
    let default_min = if cx.silent_stages {
        0
    } else {
        DEFAULT_MIN_FIRINGS
    };
    let min_firings = f.get("min_firings").map_or(Some(default_min), |n| {
        let v = uint(cx, n, "rollout.min_firings", u64::from(u32::MAX))?;
        if v == 0 && !cx.silent_stages {
            cx.err(
                n.pos,
                "rollout.min_firings must be at least 1: a stage passes on what its agents fired, never on silence",
            );
            return None;
        }
        Some(v)
    });
    let abort_if = f
        .get("abort_if")
        .map_or(Some(DEFAULT_ABORT_IF), |n| abort_if(cx, n));
    let compare = f.get("compare").map_or(Some(Compare::Absolute), |n| {
        word(
            cx,
            n,
            "rollout.compare",
            &[
                ("absolute", Compare::Absolute),
                ("baseline", Compare::Baseline),
            ],
        )
    });
    let stage_deadline = match f.get("stage_deadline") {
        Some(n) => deadline(cx, n).map(Some),
        None => Some(None),
    };
    let windows = f
        .get("windows")
        .map_or(Some(Vec::new()), |n| windows(cx, n));
    let activate = f.get("activate").map_or(Some(Activate::OnArrival), |n| {
        word(
            cx,
            n,
            "rollout.activate",
            &[
                ("on_arrival", Activate::OnArrival),
                ("together", Activate::Together),
            ],
        )
    });
    let max_uncertainty = f
        .get("max_uncertainty")
        .map_or(Some(DEFAULT_MAX_UNCERTAINTY), |n| {
            positive_duration(cx, n, "rollout.max_uncertainty")
        });
    let on_abort = f.get("on_abort").map_or(Some(OnAbort::Rollback), |n| {
        word(
            cx,
            n,
            "rollout.on_abort",
            &[
                ("rollback", OnAbort::Rollback),
                ("safe_state", OnAbort::SafeState),
            ],
        )
    });
    Some(Rollout {
        stages: stages?,
        soak: soak?,
        min_firings: min_firings?,
        abort_if: abort_if?,
        compare: compare?,
        stage_deadline: stage_deadline?,
        windows: windows?,
        activate: activate?,
        max_uncertainty: max_uncertainty?,
        on_abort: on_abort?,
    })
}

/// One of a few words.
fn word<T: Copy>(cx: &mut Ctx, node: &Node, what: &str, words: &[(&str, T)]) -> Option<T> {
    let text = string(cx, node, what)?;
    match words.iter().find(|(w, _)| *w == text) {
        Some((_, v)) => Some(*v),
        None => {
            let allowed: Vec<&str> = words.iter().map(|(w, _)| *w).collect();
            cx.err(
                node.pos,
                format!(
                    "{what} must be one of {}, found `{text}`",
                    allowed.join(", ")
                ),
            );
            None
        }
    }
}

/// `stages`: a non-empty list of `{agents: N}` or `{percent: P}`, each
/// covering at least as many agents as the one before it (percent stages
/// among themselves; an agent count before a percentage is not comparable
/// until the fleet is known), the last `{percent: 100}`.
fn stages(cx: &mut Ctx, node: &Node) -> Option<Vec<StageShare>> {
    let Value::Seq(items) = &node.value else {
        cx.err(
            node.pos,
            format!("rollout.stages must be a list, found {}", node.kind()),
        );
        return None;
    };
    if items.is_empty() {
        cx.err(
            node.pos,
            "rollout.stages is empty: give at least `[{percent: 100}]`",
        );
        return None;
    }
    if items.len() > MAX_STAGES {
        cx.err(
            node.pos,
            format!(
                "rollout.stages has {} stages; at most {MAX_STAGES}",
                items.len()
            ),
        );
        return None;
    }
    let mut out = Vec::with_capacity(items.len());
    let mut ok = true;
    for (i, item) in items.iter().enumerate() {
        let what = format!("rollout.stages[{i}]");
        match stage(cx, item, &what) {
            Some(s) => {
                let shrinks = match (out.last(), s) {
                    (Some(StageShare::Percent(a)), StageShare::Percent(b)) => b < *a,
                    (Some(StageShare::Agents(a)), StageShare::Agents(b)) => b < *a,
                    _ => false,
                };
                if shrinks {
                    cx.err(
                        item.pos,
                        format!("{what} is smaller than the stage before it: stages are cumulative shares"),
                    );
                    ok = false;
                }
                out.push(s);
            }
            None => ok = false,
        }
    }
    if ok && out.last() != Some(&StageShare::Percent(100.0)) {
        cx.err(
            items.last().map_or(node.pos, |n| n.pos),
            "the last rollout stage must be `{percent: 100}`: a rollout ends with every target on the version",
        );
        ok = false;
    }
    ok.then_some(out)
}

fn stage(cx: &mut Ctx, node: &Node, what: &str) -> Option<StageShare> {
    let f = Fields::new(cx, node, what, &["agents", "percent"])?;
    match (f.get("agents"), f.get("percent")) {
        (Some(n), None) => {
            let v = uint(cx, n, &format!("{what}.agents"), u64::from(u32::MAX))?;
            if v == 0 {
                cx.err(n.pos, format!("{what}.agents must be at least 1"));
                return None;
            }
            Some(StageShare::Agents(v))
        }
        (None, Some(n)) => {
            let p = float(cx, n, &format!("{what}.percent"))?;
            if !(p > 0.0 && p <= 100.0) {
                cx.err(
                    n.pos,
                    format!("{what}.percent must be above 0 and at most 100, found {p}"),
                );
                return None;
            }
            Some(StageShare::Percent(p))
        }
        _ => {
            cx.err(
                node.pos,
                format!("{what} takes exactly one of `agents: N` or `percent: P`"),
            );
            None
        }
    }
}

/// `abort_if`: the keys it names replace the fail-closed defaults
/// ([`DEFAULT_ABORT_IF`]) one by one; a key it leaves out keeps its
/// default, so naming `lateness_p99` alone does not let failed firings
/// through. `off` turns a threshold off, in so many words.
fn abort_if(cx: &mut Ctx, node: &Node) -> Option<AbortIf> {
    let f = Fields::new(cx, node, "rollout.abort_if", ABORT_IF_KEYS)?;
    let mut ok = true;
    let mut out = DEFAULT_ABORT_IF;
    if let Some(n) = f.get("failed_percent") {
        match off_or(cx, n, percent) {
            Some(v) => out.failed_percent = v,
            None => ok = false,
        }
    }
    if let Some(n) = f.get("unknown") {
        let read =
            |cx: &mut Ctx, n: &Node| uint(cx, n, "rollout.abort_if.unknown", u64::from(u32::MAX));
        match off_or(cx, n, read) {
            Some(v) => out.unknown = v,
            None => ok = false,
        }
    }
    if let Some(n) = f.get("lateness_p99") {
        let read = |cx: &mut Ctx, n: &Node| duration(cx, n, "rollout.abort_if.lateness_p99");
        match off_or(cx, n, read) {
            Some(v) => out.lateness_p99 = v,
            None => ok = false,
        }
    }
    if let Some(n) = f.get("offset") {
        let read = |cx: &mut Ctx, n: &Node| duration(cx, n, "rollout.abort_if.offset");
        match off_or(cx, n, read) {
            Some(v) => out.offset = v,
            None => ok = false,
        }
    }
    ok.then_some(out)
}

/// A threshold: the plain word `off` (`Some(None)`), or what `read`
/// makes of the node (`None` once it reported an error).
fn off_or<T>(
    cx: &mut Ctx,
    node: &Node,
    read: impl FnOnce(&mut Ctx, &Node) -> Option<T>,
) -> Option<Option<T>> {
    if plain_scalar(node) == Some("off") {
        return Some(None);
    }
    read(cx, node).map(Some)
}

fn percent(cx: &mut Ctx, node: &Node) -> Option<f64> {
    let p = float(cx, node, "rollout.abort_if.failed_percent")?;
    if !(0.0..=100.0).contains(&p) {
        cx.err(
            node.pos,
            format!(
                "rollout.abort_if.failed_percent must be within 0 and 100 (or `off`), found {p}"
            ),
        );
        return None;
    }
    Some(p)
}

fn deadline(cx: &mut Ctx, node: &Node) -> Option<StageDeadline> {
    let f = Fields::new(cx, node, "rollout.stage_deadline", &["after", "then"])?;
    let after = f
        .required(cx, "after", "rollout.stage_deadline")
        .and_then(|n| positive_duration(cx, n, "rollout.stage_deadline.after"));
    let then = f.get("then").map_or(Some(DeadlineAction::Pause), |n| {
        word(
            cx,
            n,
            "rollout.stage_deadline.then",
            &[
                ("pause", DeadlineAction::Pause),
                ("abort", DeadlineAction::Abort),
                ("skip_offline", DeadlineAction::SkipOffline),
            ],
        )
    });
    Some(StageDeadline {
        after: after?,
        then: then?,
    })
}

fn windows(cx: &mut Ctx, node: &Node) -> Option<Vec<Window>> {
    let Value::Seq(items) = &node.value else {
        cx.err(
            node.pos,
            format!("rollout.windows must be a list, found {}", node.kind()),
        );
        return None;
    };
    let mut out = Vec::with_capacity(items.len());
    let mut ok = true;
    for (i, item) in items.iter().enumerate() {
        match window(cx, item, &format!("rollout.windows[{i}]")) {
            Some(w) => out.push(w),
            None => ok = false,
        }
    }
    ok.then_some(out)
}

fn window(cx: &mut Ctx, node: &Node, what: &str) -> Option<Window> {
    let f = Fields::new(cx, node, what, WINDOW_KEYS)?;
    let cron = f.required(cx, "cron", what).and_then(|n| {
        let text = string(cx, n, &format!("{what}.cron"))?;
        match CronSchedule::parse(&text) {
            Ok(c) => Some((text, c)),
            Err(e) => {
                // At the bad token, as an instruction's cron error is.
                let quote = u32::from(!matches!(n.value, Value::Scalar { plain: true, .. }));
                let offset = u32::try_from(e.offset).unwrap_or(u32::MAX);
                let pos = crate::yaml::Pos {
                    line: n.pos.line,
                    col: n.pos.col.saturating_add(quote).saturating_add(offset),
                };
                cx.err(pos, format!("{what}.cron `{text}`: {}", e.message));
                None
            }
        }
    });
    let duration = f.required(cx, "duration", what).and_then(|n| {
        let d = positive_duration(cx, n, &format!("{what}.duration"))?;
        if d > Duration::from_secs(366 * 86_400) {
            cx.err(n.pos, format!("{what}.duration must be at most a year"));
            return None;
        }
        Some(d)
    });
    let tz = match f.get("tz") {
        None => Some((cx.tz_name.clone(), cx.tz.clone())),
        Some(n) => {
            let name = string(cx, n, &format!("{what}.tz"))?;
            match jiff::tz::db().get(&name) {
                Ok(tz) => Some((name, tz)),
                Err(_) => {
                    cx.err(
                        n.pos,
                        format!("{what}.tz: unknown timezone `{name}`: use an IANA name such as `Europe/Berlin`"),
                    );
                    None
                }
            }
        }
    };
    let ((cron_text, cron), duration, (tz_name, tz)) = (cron?, duration?, tz?);
    Some(Window {
        cron_text,
        cron: Box::new(cron),
        duration,
        tz_name,
        tz,
    })
}
