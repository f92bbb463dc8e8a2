//! Turning the position-carrying YAML tree into a validated [`Pack`],
//! collecting every error instead of stopping at the first.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use baton_cron::CronSchedule;
use jiff::Timestamp;
use jiff::civil::DateTime;
use jiff::tz::{Disambiguation, TimeZone};

use super::dag;
use super::error::{PackError, PackErrors};
use super::model::*;
use crate::time::{RefTime, parse_duration};
use crate::yaml::{Node, Pos, Value};

/// Most instructions a pack may hold.
pub const MAX_INSTRUCTIONS: usize = 10_000;
/// Longest id (pack, tenant, instruction).
pub const MAX_ID_LEN: usize = 128;
/// Shortest `every` period: anything faster is a busy loop, not a schedule.
pub const MIN_PERIOD: Duration = Duration::from_millis(1);
/// Most attempts a retry policy may ask for.
pub const MAX_ATTEMPTS: u32 = 1000;

pub(crate) const PACK_KEYS: &[&str] = &[
    "pack",
    "version",
    "tenant",
    "targets",
    "timezone",
    "description",
    "defaults",
    "safe_state",
    "instructions",
];
pub(crate) const DEFAULTS_KEYS: &[&str] = &["retry", "timeout", "max_lateness"];
pub(crate) const RETRY_KEYS: &[&str] =
    &["max_attempts", "backoff", "factor", "max_backoff", "jitter"];
pub(crate) const INSTRUCTION_KEYS: &[&str] = &[
    "id",
    "description",
    "action",
    "params",
    "at",
    "every",
    "cron",
    "after",
    "delay",
    "start_at",
    "until",
    "priority",
    "retry",
    "timeout",
    "max_lateness",
    "on_failure",
    "on_give_up",
    "catch_up",
];
const ACTION_KEYS: &[&str] = &["action", "params"];
const SCHEDULE_KEYS: &[&str] = &["at", "every", "cron", "after"];
/// Action names, for "did you mean" hints and the schema.
pub const ACTIONS: &[&str] = &[
    "gpio.write",
    "gpio.toggle",
    "gpio.pulse",
    "gpio.read",
    "exec",
    "noop",
];

/// Collects errors; `instruction` tags those found inside one.
struct Ctx {
    errors: Vec<PackError>,
    instruction: Option<String>,
    tz: TimeZone,
    /// Distinct policies seen so far (see `Instruction::policy`).
    policies: HashMap<Policy, Arc<Policy>>,
}

impl Ctx {
    fn err(&mut self, pos: Pos, message: impl Into<String>) {
        self.errors.push(PackError {
            pos,
            instruction: self.instruction.clone(),
            message: message.into(),
        });
    }
}

/// A mapping node whose keys have been checked against an allowed set.
struct Fields<'a> {
    node: &'a Node,
    entries: HashMap<&'a str, &'a Node>,
    keys: HashMap<&'a str, Pos>,
}

impl<'a> Fields<'a> {
    /// `None` (and an error) if `node` is not a mapping. Unknown keys are
    /// reported with a suggestion when one is close.
    fn new(cx: &mut Ctx, node: &'a Node, what: &str, allowed: &[&str]) -> Option<Self> {
        let Value::Map(list) = &node.value else {
            cx.err(
                node.pos,
                format!("{what} must be a mapping, found {}", node.kind()),
            );
            return None;
        };
        let mut entries = HashMap::new();
        let mut keys = HashMap::new();
        for (k, v) in list {
            let key = k.as_scalar().unwrap_or_default();
            if allowed.contains(&key) {
                entries.insert(key, v);
                keys.insert(key, k.pos);
            } else {
                let hint = suggest(key, allowed)
                    .map(|s| format!(" (did you mean `{s}`?)"))
                    .unwrap_or_default();
                cx.err(
                    k.pos,
                    format!(
                        "unknown key `{key}` in {what}{hint}; allowed: {}",
                        allowed.join(", ")
                    ),
                );
            }
        }
        Some(Fields {
            node,
            entries,
            keys,
        })
    }

    fn get(&self, key: &str) -> Option<&'a Node> {
        self.entries.get(key).copied()
    }

    fn key_pos(&self, key: &str) -> Pos {
        self.keys.get(key).copied().unwrap_or(self.node.pos)
    }

    fn required(&self, cx: &mut Ctx, key: &str, what: &str) -> Option<&'a Node> {
        let v = self.get(key);
        if v.is_none() {
            cx.err(
                self.node.pos,
                format!("{what} is missing required key `{key}`"),
            );
        }
        v
    }
}

/// Closest allowed word within edit distance 2, for "did you mean" hints.
fn suggest<'a>(word: &str, allowed: &[&'a str]) -> Option<&'a str> {
    allowed
        .iter()
        .map(|a| (edit_distance(word, a), *a))
        .filter(|(d, _)| *d <= 2)
        .min_by_key(|(d, _)| *d)
        .map(|(_, a)| a)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

// ---- scalars -------------------------------------------------------------

fn string(cx: &mut Ctx, node: &Node, what: &str) -> Option<String> {
    match &node.value {
        Value::Scalar { text, .. } if !node.is_null() => Some(text.clone()),
        _ => {
            cx.err(
                node.pos,
                format!("{what} must be a string, found {}", node.kind()),
            );
            None
        }
    }
}

fn ident(cx: &mut Ctx, node: &Node, what: &str) -> Option<String> {
    let s = string(cx, node, what)?;
    let ok_first = s
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    let ok_rest = s
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-'));
    if !ok_first || !ok_rest || s.len() > MAX_ID_LEN {
        cx.err(
            node.pos,
            format!(
                "invalid {what} `{s}`: use lowercase letters, digits, `.`, `_`, `-`, starting with a letter or digit, at most {MAX_ID_LEN} characters"
            ),
        );
        return None;
    }
    Some(s)
}

fn plain_scalar(node: &Node) -> Option<&str> {
    match &node.value {
        Value::Scalar { text, plain: true } => Some(text),
        _ => None,
    }
}

fn uint(cx: &mut Ctx, node: &Node, what: &str, max: u64) -> Option<u64> {
    let parsed = plain_scalar(node)
        .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|t| t.parse::<u64>().ok());
    match parsed {
        Some(v) if v <= max => Some(v),
        Some(v) => {
            cx.err(node.pos, format!("{what} must be at most {max}, found {v}"));
            None
        }
        None => {
            let found = node
                .as_scalar()
                .map_or(node.kind().to_string(), |t| format!("`{t}`"));
            cx.err(
                node.pos,
                format!("{what} must be a whole number, found {found}"),
            );
            None
        }
    }
}

fn float(cx: &mut Ctx, node: &Node, what: &str) -> Option<f64> {
    match plain_scalar(node).and_then(|t| t.parse::<f64>().ok()) {
        Some(v) if v.is_finite() => Some(v),
        _ => {
            let found = node
                .as_scalar()
                .map_or(node.kind().to_string(), |t| format!("`{t}`"));
            cx.err(node.pos, format!("{what} must be a number, found {found}"));
            None
        }
    }
}

fn duration(cx: &mut Ctx, node: &Node, what: &str) -> Option<Duration> {
    let Some(text) = node.as_scalar().filter(|_| !node.is_null()) else {
        cx.err(
            node.pos,
            format!(
                "{what} must be a duration like `500ms`, found {}",
                node.kind()
            ),
        );
        return None;
    };
    match parse_duration(text) {
        Ok(d) => Some(d),
        Err(e) => {
            cx.err(node.pos, format!("{what}: {e}"));
            None
        }
    }
}

fn positive_duration(cx: &mut Ctx, node: &Node, what: &str) -> Option<Duration> {
    let d = duration(cx, node, what)?;
    if d.is_zero() {
        cx.err(node.pos, format!("{what} must be greater than zero"));
        return None;
    }
    Some(d)
}

/// An RFC 3339 instant, or a wall time without offset in the pack's zone.
///
/// A wall time that falls in a DST gap or fold resolves like cron does
/// (DESIGN.md "Time semantics"): a gap time uses the offset in force before
/// the gap, a repeated time its first pass — jiff's `Compatible` rule.
fn instant(cx: &mut Ctx, node: &Node, what: &str) -> Option<RefTime> {
    let Some(text) = node.as_scalar().filter(|_| !node.is_null()) else {
        cx.err(
            node.pos,
            format!("{what} must be a date-time, found {}", node.kind()),
        );
        return None;
    };
    let ts = match text.parse::<Timestamp>() {
        Ok(ts) => Ok(ts),
        Err(_) => text.parse::<DateTime>().map_err(|_| ()).and_then(|dt| {
            cx.tz
                .to_ambiguous_timestamp(dt)
                .disambiguate(Disambiguation::Compatible)
                .map_err(|_| ())
        }),
    };
    match ts.ok().and_then(RefTime::from_timestamp) {
        Some(t) => Some(t),
        None => {
            cx.err(
                node.pos,
                format!(
                    "{what}: invalid date-time `{text}`: write RFC 3339 (`2026-12-01T10:00:00Z`, `2026-12-01T11:00:00+01:00`) or a local time without offset (`2026-12-01T10:00:00`) in the pack's timezone, between 1678 and 2261"
                ),
            );
            None
        }
    }
}

fn string_list(cx: &mut Ctx, node: &Node, what: &str) -> Option<Vec<(String, Pos)>> {
    let Value::Seq(items) = &node.value else {
        cx.err(
            node.pos,
            format!("{what} must be a list, found {}", node.kind()),
        );
        return None;
    };
    let mut out = Vec::with_capacity(items.len());
    let mut ok = true;
    for item in items {
        match string(cx, item, &format!("each entry of {what}")) {
            Some(s) => out.push((s, item.pos)),
            None => ok = false,
        }
    }
    ok.then_some(out)
}

fn string_map(cx: &mut Ctx, node: &Node, what: &str) -> Option<BTreeMap<String, String>> {
    let Value::Map(entries) = &node.value else {
        cx.err(
            node.pos,
            format!("{what} must be a mapping, found {}", node.kind()),
        );
        return None;
    };
    let mut out = BTreeMap::new();
    let mut ok = true;
    for (k, v) in entries {
        let key = k.as_scalar().unwrap_or_default().to_string();
        match string(cx, v, &format!("{what}.{key}")) {
            Some(s) => {
                out.insert(key, s);
            }
            None => ok = false,
        }
    }
    ok.then_some(out)
}

// ---- actions -------------------------------------------------------------

fn line_ref(cx: &mut Ctx, f: &Fields<'_>, action: &str) -> Option<LineRef> {
    let line_node = f.required(cx, "line", &format!("params of {action}"))?;
    let line = match &line_node.value {
        Value::Scalar { text, plain: true }
            if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) =>
        {
            match text.parse::<u32>() {
                Ok(o) if o < 10_000 => Line::Offset(o),
                _ => {
                    cx.err(
                        line_node.pos,
                        format!("line offset `{text}` is out of range (0..10000)"),
                    );
                    return None;
                }
            }
        }
        Value::Scalar { text, .. } if !line_node.is_null() && !text.trim().is_empty() => {
            Line::Name(text.clone())
        }
        _ => {
            cx.err(
                line_node.pos,
                format!(
                    "line must be an offset (`12`) or a line name (`RELAY_MAIN`), found {}",
                    line_node.kind()
                ),
            );
            return None;
        }
    };
    let chip = match f.get("chip") {
        Some(n) => Some(string(cx, n, "chip")?),
        None => None,
    };
    Some(LineRef { chip, line })
}

fn level(cx: &mut Ctx, node: &Node) -> Option<u8> {
    match plain_scalar(node) {
        Some("0") => Some(0),
        Some("1") => Some(1),
        _ => {
            let found = node
                .as_scalar()
                .map_or(node.kind().to_string(), |t| format!("`{t}`"));
            cx.err(node.pos, format!("value must be 0 or 1, found {found}"));
            None
        }
    }
}

/// Decode `action` + `params` (from an instruction, `on_failure` or a
/// `safe_state` entry).
fn action(cx: &mut Ctx, owner: &Node, action: &Node, params: Option<&Node>) -> Option<Action> {
    let name = string(cx, action, "action")?;
    let keys: &[&str] = match name.as_str() {
        "gpio.write" => &["line", "value", "chip"],
        "gpio.toggle" | "gpio.read" => &["line", "chip"],
        "gpio.pulse" => &["line", "width", "value", "chip"],
        "exec" => &["program", "args", "env"],
        "noop" => &[],
        other => {
            let hint = suggest(other, ACTIONS)
                .map(|s| format!(" (did you mean `{s}`?)"))
                .unwrap_or_default();
            cx.err(
                action.pos,
                format!(
                    "unknown action `{other}`{hint}; known: {}",
                    ACTIONS.join(", ")
                ),
            );
            return None;
        }
    };
    if keys.is_empty() {
        if let Some(p) = params.filter(|p| !p.is_null() && p.value != Value::Map(vec![])) {
            cx.err(p.pos, format!("action `{name}` takes no params"));
            return None;
        }
        return Some(Action::Noop);
    }
    let Some(params) = params else {
        let needed: Vec<&str> = keys
            .iter()
            .copied()
            .filter(|k| {
                !(matches!(*k, "chip" | "args" | "env") || (name == "gpio.pulse" && *k == "value"))
            })
            .collect();
        cx.err(
            owner.pos,
            format!("action `{name}` needs `params` with {}", needed.join(", ")),
        );
        return None;
    };
    let what = format!("params of {name}");
    let f = Fields::new(cx, params, &what, keys)?;
    let before = cx.errors.len();
    let act = match name.as_str() {
        "gpio.write" => {
            let line = line_ref(cx, &f, &name);
            let value = f.required(cx, "value", &what).and_then(|n| level(cx, n));
            Action::GpioWrite {
                line: line?,
                value: value?,
            }
        }
        "gpio.toggle" => Action::GpioToggle {
            line: line_ref(cx, &f, &name)?,
        },
        "gpio.read" => Action::GpioRead {
            line: line_ref(cx, &f, &name)?,
        },
        "gpio.pulse" => {
            let line = line_ref(cx, &f, &name);
            let width = f
                .required(cx, "width", &what)
                .and_then(|n| positive_duration(cx, n, "width"));
            let value = match f.get("value") {
                Some(n) => level(cx, n),
                None => Some(1),
            };
            Action::GpioPulse {
                line: line?,
                width: width?,
                value: value?,
            }
        }
        _ => {
            // exec
            let program = f
                .required(cx, "program", &what)
                .and_then(|n| string(cx, n, "program").map(|p| (p, n.pos)));
            let args = match f.get("args") {
                Some(n) => {
                    string_list(cx, n, "args").map(|v| v.into_iter().map(|(s, _)| s).collect())
                }
                None => Some(Vec::new()),
            };
            let env = match f.get("env") {
                Some(n) => string_map(cx, n, "env"),
                None => Some(BTreeMap::new()),
            };
            let (program, ppos) = program?;
            if !program.starts_with('/') {
                cx.err(
                    ppos,
                    format!("program `{program}` must be an absolute path (the agent's allowlist names full paths)"),
                );
                return None;
            }
            Action::Exec {
                program,
                args: args?,
                env: env?,
            }
        }
    };
    (cx.errors.len() == before).then_some(act)
}

/// An `{action, params}` mapping (`on_failure`, `safe_state` entries).
fn action_object(cx: &mut Ctx, node: &Node, what: &str) -> Option<Action> {
    let f = Fields::new(cx, node, what, ACTION_KEYS)?;
    let a = f.required(cx, "action", what)?;
    action(cx, node, a, f.get("params"))
}

// ---- retry ---------------------------------------------------------------

/// A retry mapping as written: every field optional, so an instruction can
/// override the defaults field by field.
#[derive(Clone, Copy, Default)]
struct RetryPatch {
    max_attempts: Option<u32>,
    backoff: Option<Duration>,
    factor: Option<f64>,
    max_backoff: Option<Duration>,
    jitter: Option<f64>,
}

impl RetryPatch {
    fn apply(&self, base: RetryPolicy) -> RetryPolicy {
        RetryPolicy {
            max_attempts: self.max_attempts.unwrap_or(base.max_attempts),
            backoff: self.backoff.unwrap_or(base.backoff),
            factor: self.factor.unwrap_or(base.factor),
            max_backoff: self.max_backoff.unwrap_or(base.max_backoff),
            jitter: self.jitter.unwrap_or(base.jitter),
        }
    }
}

fn retry_patch(cx: &mut Ctx, node: &Node) -> Option<RetryPatch> {
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

fn check_retry(cx: &mut Ctx, pos: Pos, r: &RetryPolicy) {
    if r.backoff > r.max_backoff {
        cx.err(
            pos,
            format!(
                "retry.backoff ({}) is larger than retry.max_backoff ({})",
                crate::time::format_duration(r.backoff),
                crate::time::format_duration(r.max_backoff)
            ),
        );
    }
}

// ---- instructions ----------------------------------------------------------

/// Defaults that apply to every instruction.
struct Defaults {
    retry: RetryPolicy,
    timeout: Duration,
    max_lateness: Duration,
}

/// Default per-attempt timeout when neither the pack nor the instruction sets one.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Default lateness bound when neither the pack nor the instruction sets one.
pub const DEFAULT_MAX_LATENESS: Duration = Duration::from_secs(1);

fn defaults(cx: &mut Ctx, node: Option<&Node>) -> Defaults {
    let mut d = Defaults {
        retry: RetryPolicy::default(),
        timeout: DEFAULT_TIMEOUT,
        max_lateness: DEFAULT_MAX_LATENESS,
    };
    let Some(node) = node else { return d };
    let Some(f) = Fields::new(cx, node, "defaults", DEFAULTS_KEYS) else {
        return d;
    };
    if let Some(n) = f.get("retry")
        && let Some(p) = retry_patch(cx, n)
    {
        d.retry = p.apply(d.retry);
        check_retry(cx, n.pos, &d.retry);
    }
    if let Some(t) = f
        .get("timeout")
        .and_then(|n| positive_duration(cx, n, "timeout"))
    {
        d.timeout = t;
    }
    if let Some(t) = f
        .get("max_lateness")
        .and_then(|n| duration(cx, n, "max_lateness"))
    {
        d.max_lateness = t;
    }
    d
}

fn schedule(cx: &mut Ctx, f: &Fields<'_>) -> Option<Schedule> {
    let present: Vec<&str> = SCHEDULE_KEYS
        .iter()
        .copied()
        .filter(|k| f.get(k).is_some())
        .collect();
    let start_at = f.get("start_at");
    let until = f.get("until");
    let delay = f.get("delay");
    match present.as_slice() {
        [] => {
            cx.err(
                f.node.pos,
                "no schedule: give exactly one of `at`, `every`, `cron`, `after`",
            );
            return None;
        }
        [_] => {}
        [_, second, ..] => {
            cx.err(
                f.key_pos(second),
                format!(
                    "more than one schedule ({}): give exactly one of `at`, `every`, `cron`, `after`",
                    present.join(", ")
                ),
            );
            return None;
        }
    }
    let kind = present[0];
    let node = f.get(kind)?;
    // Keys that belong to other schedules.
    if kind != "after" && delay.is_some() {
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
                    format!("`{key}` only applies to repeating schedules (`every`, `cron`), not `{kind}`"),
                );
            }
        }
    }
    let start = start_at.and_then(|n| instant(cx, n, "start_at"));
    let end = until.and_then(|n| instant(cx, n, "until"));
    if let (Some(s), Some(e), Some(n)) = (start, end, until)
        && e < s
    {
        cx.err(
            n.pos,
            "`until` is before `start_at`: the schedule would never fire",
        );
    }
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
        "cron" => {
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
            match CronSchedule::parse(&expr) {
                Ok(cron) => Some(Schedule::Cron {
                    cron: Box::new(cron),
                    expr,
                    start_at: start,
                    until: end,
                }),
                Err(e) => {
                    let quote =
                        usize::from(!matches!(node.value, Value::Scalar { plain: true, .. }));
                    let pos = Pos {
                        line: node.pos.line,
                        col: node.pos.col + quote + e.offset,
                    };
                    cx.err(pos, format!("cron `{expr}`: {}", e.message));
                    None
                }
            }
        }
        _ => {
            // after
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
            let delay = match delay {
                Some(n) => duration(cx, n, "delay")?,
                None => Duration::ZERO,
            };
            Some(Schedule::After {
                upstream: list.into_iter().map(|(s, _)| s).collect(),
                delay,
            })
        }
    }
}

fn instruction(cx: &mut Ctx, node: &Node, d: &Defaults) -> Option<(Instruction, Vec<Pos>)> {
    cx.instruction = None;
    let f = Fields::new(cx, node, "an instruction", INSTRUCTION_KEYS)?;
    let id = f
        .required(cx, "id", "instruction")
        .and_then(|n| ident(cx, n, "instruction id"));
    cx.instruction = id.clone();
    let before = cx.errors.len();
    let act = f
        .required(cx, "action", "instruction")
        .and_then(|a| action(cx, node, a, f.get("params")));
    if act.is_none() && f.get("action").is_none() && f.get("params").is_some() {
        // already reported as missing `action`
    }
    let sched = schedule(cx, &f);
    let priority = f
        .get("priority")
        .and_then(|n| uint(cx, n, "priority", 255))
        .map_or(0, |v| v as u8);
    let retry = match f.get("retry") {
        Some(n) => retry_patch(cx, n).map(|p| {
            let r = p.apply(d.retry);
            check_retry(cx, n.pos, &r);
            r
        }),
        None => Some(d.retry),
    };
    let timeout = match f.get("timeout") {
        Some(n) => positive_duration(cx, n, "timeout"),
        None => Some(d.timeout),
    };
    let max_lateness = match f.get("max_lateness") {
        Some(n) => duration(cx, n, "max_lateness"),
        None => Some(d.max_lateness),
    };
    let on_failure = match f.get("on_failure") {
        Some(n) => action_object(cx, n, "on_failure").map(Some),
        None => Some(None),
    };
    let on_give_up = match f.get("on_give_up") {
        Some(n) => match n.as_scalar() {
            Some("safe_state") => Some(OnGiveUp::SafeState),
            Some("continue") => Some(OnGiveUp::Continue),
            _ => {
                cx.err(
                    n.pos,
                    "on_give_up must be `safe_state` (default) or `continue`",
                );
                None
            }
        },
        None => Some(OnGiveUp::SafeState),
    };
    let catch_up = match f.get("catch_up") {
        Some(n) => {
            let c = match n.as_scalar() {
                Some("none") => Some(CatchUp::None),
                Some("last") => Some(CatchUp::Last),
                Some("all") => Some(CatchUp::All),
                _ => {
                    cx.err(n.pos, "catch_up must be `none` (default), `last` or `all`");
                    None
                }
            };
            if sched.as_ref().is_some_and(|s| !s.is_repeating()) {
                cx.err(
                    n.pos,
                    "catch_up only applies to repeating schedules (`every`, `cron`); a missed `at` fires once if still within max_lateness",
                );
            }
            c
        }
        None => Some(CatchUp::None),
    };
    let description = f
        .get("description")
        .and_then(|n| string(cx, n, "description"));
    let after_pos = match f.get("after").map(|n| &n.value) {
        Some(Value::Seq(items)) => items.iter().map(|n| n.pos).collect(),
        _ => Vec::new(),
    };
    if cx.errors.len() != before {
        return None;
    }
    let policy = Policy {
        retry: retry?,
        timeout: timeout?,
        max_lateness: max_lateness?,
        on_failure: on_failure?,
        on_give_up: on_give_up?,
        catch_up: catch_up?,
    };
    let policy = cx
        .policies
        .entry(policy.clone())
        .or_insert_with(|| Arc::new(policy))
        .clone();
    Some((
        Instruction {
            id: id?,
            pos: node.pos,
            action: act?,
            schedule: sched?,
            priority,
            policy,
            description: description.map(String::into_boxed_str),
        },
        after_pos,
    ))
}

fn targets(cx: &mut Ctx, node: &Node) -> Option<Targets> {
    let f = Fields::new(cx, node, "targets", &["agents", "labels"])?;
    match (f.get("agents"), f.get("labels")) {
        (Some(a), None) => {
            let list = string_list(cx, a, "targets.agents")?;
            if list.is_empty() {
                cx.err(a.pos, "targets.agents is empty: the pack would go nowhere");
                return None;
            }
            Some(Targets::Agents(list.into_iter().map(|(s, _)| s).collect()))
        }
        (None, Some(l)) => {
            let map = string_map(cx, l, "targets.labels")?;
            if map.is_empty() {
                cx.err(l.pos, "targets.labels is empty: give at least one label");
                return None;
            }
            Some(Targets::Labels(map))
        }
        (Some(_), Some(_)) => {
            cx.err(
                node.pos,
                "targets takes either `agents` or `labels`, not both",
            );
            None
        }
        (None, None) => {
            cx.err(node.pos, "targets needs `agents: [..]` or `labels: {..}`");
            None
        }
    }
}

/// Decode and validate a whole pack tree.
pub(crate) fn pack(root: &Node) -> Result<Pack, PackErrors> {
    let mut cx = Ctx {
        errors: Vec::new(),
        instruction: None,
        tz: TimeZone::UTC,
        policies: HashMap::new(),
    };
    let Some(f) = Fields::new(&mut cx, root, "a pack", PACK_KEYS) else {
        return Err(PackErrors(cx.errors));
    };
    // The zone first: local wall times below are read in it.
    let mut tz_name = "UTC".to_string();
    if let Some(n) = f.get("timezone")
        && let Some(name) = string(&mut cx, n, "timezone")
    {
        match jiff::tz::db().get(&name) {
            Ok(tz) => {
                cx.tz = tz;
                tz_name = name;
            }
            Err(_) => cx.err(
                n.pos,
                format!(
                    "unknown timezone `{name}`: use an IANA name such as `Europe/Berlin` or `UTC`"
                ),
            ),
        }
    }
    let id = f
        .required(&mut cx, "pack", "a pack")
        .and_then(|n| ident(&mut cx, n, "pack id"));
    let version = f
        .required(&mut cx, "version", "a pack")
        .and_then(|n| uint(&mut cx, n, "version", u64::MAX));
    let tenant = match f.get("tenant") {
        Some(n) => ident(&mut cx, n, "tenant"),
        None => Some("default".to_string()),
    };
    let targets = f.get("targets").and_then(|n| targets(&mut cx, n));
    let description = f
        .get("description")
        .and_then(|n| string(&mut cx, n, "description"));
    let d = defaults(&mut cx, f.get("defaults"));
    let mut safe_state = Vec::new();
    if let Some(n) = f.get("safe_state") {
        match &n.value {
            Value::Seq(items) => {
                for item in items {
                    if let Some(a) = action_object(&mut cx, item, "a safe_state entry") {
                        if matches!(
                            a,
                            Action::GpioToggle { .. }
                                | Action::GpioPulse { .. }
                                | Action::GpioRead { .. }
                        ) {
                            cx.err(
                                item.pos,
                                format!(
                                    "safe_state cannot use `{}`: a safe state must set defined levels (use gpio.write, exec or noop)",
                                    a.name()
                                ),
                            );
                        } else {
                            safe_state.push(a);
                        }
                    }
                }
            }
            _ => cx.err(
                n.pos,
                format!(
                    "safe_state must be a list of {{action, params}}, found {}",
                    n.kind()
                ),
            ),
        }
    }
    let mut instructions = Vec::new();
    let mut after_positions = HashMap::new();
    let mut all_ids = HashSet::new();
    if let Some(n) = f.required(&mut cx, "instructions", "a pack") {
        match &n.value {
            Value::Seq(items) if items.len() > MAX_INSTRUCTIONS => cx.err(
                n.pos,
                format!(
                    "too many instructions: {} (at most {MAX_INSTRUCTIONS} per pack; split it into several packs)",
                    items.len()
                ),
            ),
            Value::Seq(items) if items.is_empty() => {
                cx.err(n.pos, "instructions is empty: a pack needs at least one instruction")
            }
            Value::Seq(items) => {
                let mut seen: HashMap<String, Pos> = HashMap::new();
                for item in items {
                    // Report duplicate ids even when the rest of the
                    // instruction has errors.
                    if let Value::Map(entries) = &item.value
                        && let Some((_, idn)) =
                            entries.iter().find(|(k, _)| k.as_scalar() == Some("id"))
                            && let Some(idv) = idn.as_scalar() {
                                if let Some(first) = seen.get(idv) {
                                    cx.instruction = None;
                                    cx.err(
                                        idn.pos,
                                        format!(
                                            "duplicate instruction id `{idv}` (first at line {})",
                                            first.line
                                        ),
                                    );
                                } else {
                                    seen.insert(idv.to_string(), idn.pos);
                                }
                            }
                    if let Some((ins, pos)) = instruction(&mut cx, item, &d) {
                        after_positions.insert(ins.id.clone(), pos);
                        instructions.push(ins);
                    }
                }
                cx.instruction = None;
                all_ids = seen.into_keys().collect();
            }
            _ => cx.err(n.pos, format!("instructions must be a list, found {}", n.kind())),
        }
    }
    // Cycles are looked for among the instructions that decoded; an `after`
    // target counts as known if any instruction carries that id, so one bad
    // instruction does not cascade into "unknown target" errors.
    dag::check(&instructions, &after_positions, &all_ids, &mut cx.errors);
    if !cx.errors.is_empty() {
        cx.errors.sort_by_key(|e| e.pos);
        return Err(PackErrors(cx.errors));
    }
    Ok(Pack {
        id: id.unwrap_or_default(),
        version: version.unwrap_or_default(),
        tenant: tenant.unwrap_or_default(),
        targets,
        timezone_name: tz_name,
        timezone: cx.tz,
        description,
        safe_state,
        instructions,
    })
}
