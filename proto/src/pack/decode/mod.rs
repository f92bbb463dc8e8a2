//! Turning the position-carrying YAML tree into a validated [`Pack`],
//! collecting every error instead of stopping at the first.
//!
//! Each piece decodes one part of the tree and records its own errors; the
//! pack-wide checks (duplicate ids, the `after` graph, `shared_lines`) run
//! on whatever the pieces produced, including the parts of instructions
//! that failed, so one run reports every error of every pass.

mod action;
mod fields;
mod instruction;
mod policy;
pub(crate) mod rollout;
mod scalar;
mod schedule;

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use self::action::{action_object, line_ref, line_ref_text};
use self::fields::{Ctx, Fields};
use self::instruction::instruction;
pub use self::policy::{DEFAULT_MAX_LATENESS, DEFAULT_TIMEOUT, MIN_MAX_LATENESS};
use self::policy::{Defaults, defaults};
pub use self::rollout::MAX_STAGES;
pub use self::scalar::{check_ident, is_ident};
use self::scalar::{ident, positive_duration, string, string_list, string_map, uint};
use super::dag::{self, GraphNode};
use super::error::{PackError, PackErrors};
use super::lines::driven_by;
use super::model::*;
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
    "lease",
    "on_clock_loss",
    "defaults",
    "safe_state",
    "shared_lines",
    "instructions",
    "rollout",
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
pub(super) const ACTION_KEYS: &[&str] = &["action", "params"];
pub(super) const SCHEDULE_KEYS: &[&str] = &["at", "every", "cron", "after"];
/// Action names, for "did you mean" hints and the schema.
pub const ACTIONS: &[&str] = &[
    "gpio.write",
    "gpio.toggle",
    "gpio.pulse",
    "gpio.read",
    "exec",
    "noop",
];

/// Keys of an agent update's plan.
const PLAN_KEYS: &[&str] = &["targets", "rollout"];

/// Decode and validate an agent update's plan: which agents (`targets:`,
/// as a pack's; absent: every agent the operator sees) and how the
/// release reaches them (`rollout:`, as a pack's, required).
pub(crate) fn update_plan(root: &Node) -> Result<UpdatePlan, PackErrors> {
    let mut cx = Ctx::new();
    cx.silent_stages = true;
    let Some(f) = Fields::new(&mut cx, root, "an update plan", PLAN_KEYS) else {
        return Err(PackErrors(cx.errors));
    };
    let targets = f.get("targets").and_then(|n| targets(&mut cx, n));
    let rollout = f
        .required(&mut cx, "rollout", "an update plan")
        .and_then(|n| rollout::rollout(&mut cx, n));
    match rollout {
        Some(rollout) if cx.errors.is_empty() => Ok(UpdatePlan { targets, rollout }),
        _ => {
            cx.errors.sort_by_key(|e| e.pos);
            Err(PackErrors(cx.errors))
        }
    }
}

/// Decode and validate a whole pack tree.
pub(crate) fn pack(root: &Node) -> Result<Pack, PackErrors> {
    let mut cx = Ctx::new();
    let Some(f) = Fields::new(&mut cx, root, "a pack", PACK_KEYS) else {
        return Err(PackErrors(cx.errors));
    };
    // The zone first: local wall times below are read in it.
    let timezone_name = timezone(&mut cx, f.get("timezone"));
    let header = header(&mut cx, &f);
    let lease = f
        .get("lease")
        .and_then(|n| positive_duration(&mut cx, n, "lease"));
    let on_clock_loss = f
        .get("on_clock_loss")
        .map_or(Some(ClockLoss::Continue), |n| {
            policy::on_clock_loss(&mut cx, n)
        });
    let d = defaults(&mut cx, f.get("defaults"));
    let safe_state = safe_state(&mut cx, f.get("safe_state"));
    let rollout = f.get("rollout").and_then(|n| rollout::rollout(&mut cx, n));
    let body = f
        .required(&mut cx, "instructions", "a pack")
        .map(|n| instructions(&mut cx, n, &d))
        .unwrap_or_default();
    cx.instruction = None;
    cx.errors.extend(dag::check(&body.graph));
    let shared_lines = match f.get("shared_lines") {
        Some(n) => {
            let driven = driven_by(body.actions.iter().chain(&safe_state));
            let check_driven = !cx.actions_incomplete;
            shared_lines(&mut cx, n, check_driven.then_some(&driven))
        }
        None => Vec::new(),
    };
    if !cx.errors.is_empty() {
        cx.errors.sort_by_key(|e| e.pos);
        return Err(PackErrors(cx.errors));
    }
    Ok(Pack {
        id: header.id.unwrap_or_default(),
        version: header.version.unwrap_or_default(),
        tenant: header.tenant.unwrap_or_default(),
        targets: header.targets,
        timezone_name,
        timezone: cx.tz,
        description: header.description,
        lease,
        on_clock_loss: on_clock_loss.unwrap_or_default(),
        safe_state,
        shared_lines,
        instructions: body.instructions,
        rollout,
    })
}

/// `timezone`: sets the zone wall times are read in, returns its name
/// (`UTC` when absent or unknown).
fn timezone(cx: &mut Ctx, node: Option<&Node>) -> String {
    let Some(n) = node else {
        return "UTC".to_string();
    };
    let Some(name) = string(cx, n, "timezone") else {
        return "UTC".to_string();
    };
    match jiff::tz::db().get(&name) {
        Ok(tz) => {
            cx.tz = tz;
            cx.tz_name = name.clone();
            name
        }
        Err(_) => {
            cx.err(
                n.pos,
                format!(
                    "unknown timezone `{name}`: use an IANA name such as `Europe/Berlin` or `UTC`"
                ),
            );
            "UTC".to_string()
        }
    }
}

/// The pack's own scalar fields; each `None` when absent or invalid.
struct Header {
    id: Option<String>,
    version: Option<u64>,
    tenant: Option<String>,
    targets: Option<Targets>,
    description: Option<String>,
}

fn header(cx: &mut Ctx, f: &Fields<'_>) -> Header {
    Header {
        id: f
            .required(cx, "pack", "a pack")
            .and_then(|n| ident(cx, n, "pack id")),
        version: f
            .required(cx, "version", "a pack")
            .and_then(|n| uint(cx, n, "version", u64::MAX)),
        tenant: match f.get("tenant") {
            Some(n) => ident(cx, n, "tenant"),
            None => Some("default".to_string()),
        },
        targets: f.get("targets").and_then(|n| targets(cx, n)),
        description: f
            .get("description")
            .and_then(|n| string(cx, n, "description")),
    }
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

/// `safe_state`: actions that set defined levels (no toggle, pulse, read).
fn safe_state(cx: &mut Ctx, node: Option<&Node>) -> Vec<Action> {
    let Some(n) = node else {
        return Vec::new();
    };
    let Value::Seq(items) = &n.value else {
        cx.err(
            n.pos,
            format!(
                "safe_state must be a list of {{action, params}}, found {}",
                n.kind()
            ),
        );
        return Vec::new();
    };
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let Some(a) = action_object(cx, item, "a safe_state entry") else {
            continue;
        };
        if matches!(
            a,
            Action::GpioToggle { .. } | Action::GpioPulse { .. } | Action::GpioRead { .. }
        ) {
            cx.err(
                item.pos,
                format!(
                    "safe_state cannot use `{}`: a safe state must set defined levels (use gpio.write, exec or noop)",
                    a.name()
                ),
            );
            cx.actions_incomplete = true;
        } else {
            out.push(a);
        }
    }
    out
}

/// What the `instructions` list decoded to.
#[derive(Default)]
struct Body {
    /// The instructions without errors, in pack order.
    instructions: Vec<Instruction>,
    /// Every instruction with an id, for the `after` graph.
    graph: Vec<GraphNode>,
    /// Every action (and `on_failure`) that decoded.
    actions: Vec<Action>,
}

fn instructions(cx: &mut Ctx, n: &Node, d: &Defaults) -> Body {
    let items = match &n.value {
        Value::Seq(items) if items.len() > MAX_INSTRUCTIONS => {
            cx.err(
                n.pos,
                format!(
                    "too many instructions: {} (at most {MAX_INSTRUCTIONS} per pack; split it into several packs)",
                    items.len()
                ),
            );
            return Body::default();
        }
        Value::Seq(items) if items.is_empty() => {
            cx.err(
                n.pos,
                "instructions is empty: a pack needs at least one instruction",
            );
            return Body::default();
        }
        Value::Seq(items) => items,
        _ => {
            cx.err(
                n.pos,
                format!("instructions must be a list, found {}", n.kind()),
            );
            return Body::default();
        }
    };
    cx.errors.extend(duplicate_ids(items));
    let mut body = Body::default();
    for item in items {
        let decoded = instruction(cx, item, d);
        body.instructions.extend(decoded.instruction);
        body.graph.extend(decoded.node);
        body.actions.extend(decoded.actions);
    }
    cx.instruction = None;
    body
}

/// An error for each instruction whose id an earlier one already has;
/// looks only at the `id` scalars, so it works on broken instructions too.
fn duplicate_ids(items: &[Node]) -> Vec<PackError> {
    let mut seen: HashMap<&str, Pos> = HashMap::new();
    let mut errors = Vec::new();
    for item in items {
        let Value::Map(entries) = &item.value else {
            continue;
        };
        let Some((_, idn)) = entries.iter().find(|(k, _)| k.as_scalar() == Some("id")) else {
            continue;
        };
        let Some(id) = idn.as_scalar() else {
            continue;
        };
        if let Some(first) = seen.get(id) {
            errors.push(PackError {
                pos: idn.pos,
                instruction: None,
                message: format!(
                    "duplicate instruction id `{id}` (first at line {})",
                    first.line
                ),
            });
        } else {
            seen.insert(id, idn.pos);
        }
    }
    errors
}

/// `shared_lines`: lines the pack agrees to share with other packs that
/// declare them shared too. Each entry is `LINE`, `CHIP:LINE` or
/// `{line, chip}`; duplicates are refused, and so is an entry the pack
/// does not drive (checked only when `driven` is given, i.e. when every
/// action decoded: otherwise the set would be incomplete).
fn shared_lines(cx: &mut Ctx, node: &Node, driven: Option<&BTreeSet<LineRef>>) -> Vec<LineRef> {
    let Value::Seq(items) = &node.value else {
        cx.err(
            node.pos,
            format!(
                "shared_lines must be a list of lines (`5`, `RELAY_MAIN`, \"gpiochip1:7\"), found {}",
                node.kind()
            ),
        );
        return Vec::new();
    };
    let mut seen: HashMap<LineRef, Pos> = HashMap::new();
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let Some(line) = shared_line(cx, item).map(|l| l.normalized()) else {
            continue;
        };
        if let Some(first) = seen.get(&line) {
            cx.err(
                item.pos,
                format!(
                    "shared_lines lists {} twice (first at line {})",
                    line.display(),
                    first.line
                ),
            );
            continue;
        }
        seen.insert(line.clone(), item.pos);
        if let Some(driven) = driven.filter(|d| !d.contains(&line)) {
            let list: Vec<String> = driven.iter().map(LineRef::display).collect();
            cx.err(
                item.pos,
                format!(
                    "shared_lines names {}, which no gpio.write, gpio.toggle or gpio.pulse of this pack drives (write the line as its actions do); the pack drives: {}",
                    line.display(),
                    if list.is_empty() { "no line".to_string() } else { list.join(", ") }
                ),
            );
        }
        out.push(line);
    }
    out
}

/// One `shared_lines` entry.
fn shared_line(cx: &mut Ctx, node: &Node) -> Option<LineRef> {
    match &node.value {
        Value::Scalar { text, plain } if !node.is_null() => match line_ref_text(text, *plain) {
            Ok(l) => Some(l),
            Err(e) => {
                cx.err(node.pos, format!("shared_lines entry: {e}"));
                None
            }
        },
        Value::Map(_) => {
            let f = Fields::new(cx, node, "a shared_lines entry", &["line", "chip"])?;
            line_ref(cx, &f, "a shared_lines entry")
        }
        _ => {
            cx.err(
                node.pos,
                format!(
                    "a shared_lines entry must be a line (`5`, `RELAY_MAIN`, \"gpiochip1:7\") or {{line, chip}}, found {}",
                    node.kind()
                ),
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::yaml::{Limits, parse};

    fn tree(text: &str) -> Node {
        parse(text, Limits::default()).expect("yaml")
    }

    fn messages(cx: &Ctx) -> Vec<String> {
        cx.errors.iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn lease_is_optional_positive_and_kept_as_a_duration() {
        let body = "instructions:\n  - {id: a, action: noop, every: 1s}\n";
        let p = crate::pack::parse_pack(&format!("pack: p\nversion: 1\n{body}")).expect("valid");
        assert_eq!(p.lease, None, "no lease: the pack runs offline");
        let p = crate::pack::parse_pack(&format!("pack: p\nversion: 1\nlease: 1m30s\n{body}"))
            .expect("valid");
        assert_eq!(p.lease, Some(Duration::from_secs(90)));
        // Zero is refused where it is written; other errors still come.
        let e = crate::pack::parse_pack(&format!(
            "pack: p\nversion: 1\nlease: 0ms\ntimezone: Mars/x\n{body}"
        ))
        .expect_err("zero lease");
        let m: Vec<String> = e.0.iter().map(|e| e.to_string()).collect();
        assert_eq!(m.len(), 2, "{m:?}");
        assert_eq!(m[0], "3:8: lease must be greater than zero");
    }

    #[test]
    fn on_clock_loss_and_what_needs_absolute_time() {
        let parse = |head: &str, instr: &str| {
            crate::pack::parse_pack(&format!(
                "pack: p\nversion: 1\n{head}instructions:\n  - {{id: a, action: noop, {instr}}}\n"
            ))
        };
        let p = parse("", "every: 1s").expect("valid");
        assert_eq!(p.on_clock_loss, ClockLoss::Continue);
        assert!(
            !p.needs_absolute_time(),
            "plain intervals need no absolute time"
        );
        let p = parse("on_clock_loss: safe_state\n", "at: 2030-01-01T00:00:00Z").expect("valid");
        assert_eq!(p.on_clock_loss, ClockLoss::SafeState);
        assert!(p.needs_absolute_time());
        assert!(
            parse("", "cron: '0 0 * * * *'")
                .expect("valid")
                .needs_absolute_time()
        );
        assert!(
            parse("", "every: 1s, start_at: 2030-01-01T00:00:00Z")
                .expect("valid")
                .needs_absolute_time()
        );
        let e = parse("on_clock_loss: panic\n", "every: 1s").expect_err("bad value");
        assert_eq!(
            e.0[0].to_string(),
            "3:16: on_clock_loss must be `continue` (default) or `safe_state`"
        );
    }

    #[test]
    fn timezone_sets_the_zone_or_reports() {
        let mut cx = Ctx::new();
        let n = tree("Europe/Berlin");
        assert_eq!(timezone(&mut cx, Some(&n)), "Europe/Berlin");
        assert!(cx.errors.is_empty());
        let n = tree("Mars/Olympus");
        assert_eq!(timezone(&mut cx, Some(&n)), "UTC");
        assert_eq!(cx.errors.len(), 1);
        assert_eq!(timezone(&mut Ctx::new(), None), "UTC");
    }

    #[test]
    fn header_reports_each_field() {
        let mut cx = Ctx::new();
        let root = tree("pack: P\nversion: x\ntenant: t\n");
        let f = Fields::new(&mut cx, &root, "a pack", PACK_KEYS).expect("map");
        let h = header(&mut cx, &f);
        assert_eq!(
            (h.id, h.version, h.tenant.as_deref()),
            (None, None, Some("t"))
        );
        assert_eq!(cx.errors.len(), 2, "{:?}", messages(&cx));
    }

    #[test]
    fn safe_state_refuses_toggles_and_marks_lines_incomplete() {
        let mut cx = Ctx::new();
        let n = tree(
            "- {action: gpio.write, params: {line: 1, value: 0}}\n- {action: gpio.toggle, params: {line: 2}}\n",
        );
        let s = safe_state(&mut cx, Some(&n));
        assert_eq!(s.len(), 1);
        assert!(cx.actions_incomplete);
        assert_eq!(cx.errors.len(), 1);
    }

    #[test]
    fn duplicate_ids_look_at_raw_ids() {
        let n = tree("- {id: a, action: nope}\n- {id: a}\n- 5\n- {id: b}\n");
        let Value::Seq(items) = &n.value else {
            panic!("list")
        };
        let e = duplicate_ids(items);
        assert_eq!(e.len(), 1);
        assert_eq!((e[0].pos.line, e[0].pos.col), (2, 8));
    }

    #[test]
    fn instructions_keep_the_pieces_of_broken_ones() {
        let mut cx = Ctx::new();
        let n = tree(
            "- {id: a, action: gpio.write, params: {line: 3, value: 1}, at: never}\n- {id: b, action: noop, after: [a, zz]}\n",
        );
        let body = instructions(&mut cx, &n, &Defaults::default());
        assert_eq!(body.instructions.len(), 1);
        assert_eq!(body.graph.len(), 2);
        assert_eq!(body.actions.len(), 2);
        assert_eq!(body.graph[1].upstream.len(), 2);
        assert!(!cx.actions_incomplete);
    }

    #[test]
    fn shared_lines_forms_duplicates_and_driven() {
        let driven: BTreeSet<LineRef> = [
            LineRef {
                chip: None,
                line: Line::Offset(5),
            },
            LineRef {
                chip: Some("gpiochip1".into()),
                line: Line::Offset(7),
            },
            LineRef {
                chip: None,
                line: Line::Name("RELAY".into()),
            },
        ]
        .into();
        let mut cx = Ctx::new();
        let n = tree("[5, RELAY, \"gpiochip1:7\", {line: 7, chip: /dev/gpiochip1}, 6]");
        let out = shared_lines(&mut cx, &n, Some(&driven));
        assert_eq!(out.len(), 4, "{:?}", messages(&cx));
        let m = messages(&cx);
        assert_eq!(m.len(), 2, "{m:?}");
        assert!(m[0].contains("lists gpiochip1:7 twice"), "{m:?}");
        assert!(m[1].contains("names 6, which no gpio.write"), "{m:?}");
        // Without the driven set, only the form and duplicates are checked.
        let mut cx = Ctx::new();
        assert_eq!(shared_lines(&mut cx, &n, None).len(), 4);
        assert_eq!(cx.errors.len(), 1);
    }
}
