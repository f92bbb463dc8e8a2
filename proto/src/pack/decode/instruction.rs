//! One instruction: its id, action, schedule and policy.

use std::sync::Arc;

use super::INSTRUCTION_KEYS;
use super::action::{action, action_object};
use super::fields::{Ctx, Fields};
use super::policy::{Defaults, catch_up, max_lateness, on_give_up, retry};
use super::scalar::{ident, positive_duration, string, uint};
use super::schedule::{present, schedule, upstream_refs};
use crate::pack::dag::GraphNode;
use crate::pack::model::{Action, CatchUp, Instruction, OnGiveUp, Policy};
use crate::yaml::Node;

/// What decoding one instruction yielded. Even when it failed, the pieces
/// that did decode still take part in the pack-wide checks (the `after`
/// graph, `shared_lines`), so their errors show in the same run.
#[derive(Default)]
pub(super) struct Decoded {
    /// The instruction, if it has no errors.
    pub(super) instruction: Option<Instruction>,
    /// Its node in the `after` graph, if it has an id.
    pub(super) node: Option<GraphNode>,
    /// Its action and `on_failure`, those that decoded.
    pub(super) actions: Vec<Action>,
}

pub(super) fn instruction(cx: &mut Ctx, node: &Node, d: &Defaults) -> Decoded {
    cx.instruction = None;
    let Some(f) = Fields::new(cx, node, "an instruction", INSTRUCTION_KEYS) else {
        cx.actions_incomplete = true;
        return Decoded::default();
    };
    // Errors are tagged with the id as written, valid or not.
    let raw_id = f
        .get("id")
        .filter(|n| !n.is_null())
        .and_then(|n| n.as_scalar())
        .map(str::to_string);
    let id = f
        .required(cx, "id", "instruction")
        .and_then(|n| ident(cx, n, "instruction id"));
    cx.instruction = raw_id.clone();
    let before = cx.errors.len();
    let act = match f.required(cx, "action", "instruction") {
        Some(a) => action(cx, node, a, f.get("params")),
        None => {
            cx.actions_incomplete = true;
            None
        }
    };
    let sched = schedule(cx, &f);
    let on_failure = f
        .get("on_failure")
        .map(|n| action_object(cx, n, "on_failure"));
    let policy = policy(cx, &f, d, on_failure.clone());
    let priority = f
        .get("priority")
        .and_then(|n| uint(cx, n, "priority", 255))
        .map_or(0, |v| v as u8);
    let description = f
        .get("description")
        .and_then(|n| string(cx, n, "description"));
    let out = Decoded {
        instruction: None,
        node: raw_id.map(|id| GraphNode {
            id,
            pos: node.pos,
            upstream: upstream_refs(&f),
        }),
        actions: act
            .iter()
            .chain(on_failure.iter().flatten())
            .cloned()
            .collect(),
    };
    if cx.errors.len() != before {
        return out;
    }
    let (Some(id), Some(action), Some(schedule), Some(policy)) = (id, act, sched, policy) else {
        return out;
    };
    let policy = cx
        .policies
        .entry(policy.clone())
        .or_insert_with(|| Arc::new(policy))
        .clone();
    Decoded {
        instruction: Some(Instruction {
            id,
            pos: node.pos,
            schedule_pos: present(&f)
                .first()
                .and_then(|k| f.get(k))
                .map_or(node.pos, |n| n.pos),
            action,
            schedule,
            priority,
            policy,
            description: description.map(String::into_boxed_str),
        }),
        ..out
    }
}

/// The instruction's policy: its overrides on top of the pack's defaults.
/// `on_failure` is decoded by the caller (`None`: absent; `Some(None)`:
/// invalid).
fn policy(
    cx: &mut Ctx,
    f: &Fields<'_>,
    d: &Defaults,
    on_failure: Option<Option<Action>>,
) -> Option<Policy> {
    let retry = match f.get("retry") {
        Some(n) => retry(cx, n, d.retry),
        None => Some(d.retry),
    };
    let timeout = match f.get("timeout") {
        Some(n) => positive_duration(cx, n, "timeout"),
        None => Some(d.timeout),
    };
    let max_lateness = match f.get("max_lateness") {
        Some(n) => max_lateness(cx, n),
        None => Some(d.max_lateness),
    };
    let on_give_up = match f.get("on_give_up") {
        Some(n) => on_give_up(cx, n),
        None => Some(OnGiveUp::SafeState),
    };
    // Whether the schedule repeats, from its key alone: known even when
    // its value is invalid.
    let repeating = match present(f).as_slice() {
        [kind] => Some(matches!(*kind, "every" | "cron")),
        _ => None,
    };
    let catch_up = match f.get("catch_up") {
        Some(n) => catch_up(cx, n, repeating),
        None => Some(CatchUp::None),
    };
    Some(Policy {
        retry: retry?,
        timeout: timeout?,
        max_lateness: max_lateness?,
        on_failure: match on_failure {
            None => None,
            Some(a) => Some(a?),
        },
        on_give_up: on_give_up?,
        catch_up: catch_up?,
    })
}
