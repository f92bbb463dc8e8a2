//! The decoder's working state and its view of one mapping node.

use std::collections::HashMap;
use std::sync::Arc;

use jiff::tz::TimeZone;

use super::super::error::PackError;
use super::super::model::Policy;
use crate::yaml::{Node, Pos, Value};

/// Collects errors; `instruction` tags those found inside one.
pub(super) struct Ctx {
    pub(super) errors: Vec<PackError>,
    pub(super) instruction: Option<String>,
    /// The pack's zone (UTC until `timezone` is read): local wall times
    /// and cron bounds are read in it.
    pub(super) tz: TimeZone,
    /// That zone's IANA name.
    pub(super) tz_name: String,
    /// Distinct policies seen so far (see `Instruction::policy`).
    pub(super) policies: HashMap<Policy, Arc<Policy>>,
    /// Some action (instruction, `on_failure`, `safe_state`) failed to
    /// decode, so the set of driven lines is incomplete.
    pub(super) actions_incomplete: bool,
    /// Decoding an agent update's plan: a stage may pass on no firing
    /// (`min_firings` 0, its default there): a box may run no pack, and
    /// what an update waits for is the box back on its link, its clock
    /// locked.
    pub(super) silent_stages: bool,
}

impl Ctx {
    pub(super) fn new() -> Self {
        Ctx {
            errors: Vec::new(),
            instruction: None,
            tz: TimeZone::UTC,
            tz_name: "UTC".to_string(),
            policies: HashMap::new(),
            actions_incomplete: false,
            silent_stages: false,
        }
    }

    pub(super) fn err(&mut self, pos: Pos, message: impl Into<String>) {
        self.errors.push(PackError {
            pos,
            instruction: self.instruction.clone(),
            message: message.into(),
        });
    }
}

/// A mapping node whose keys have been checked against an allowed set.
pub(super) struct Fields<'a> {
    pub(super) node: &'a Node,
    entries: HashMap<&'a str, &'a Node>,
    keys: HashMap<&'a str, Pos>,
}

impl<'a> Fields<'a> {
    /// `None` (and an error) if `node` is not a mapping. Unknown keys are
    /// reported with a suggestion when one is close.
    pub(super) fn new(cx: &mut Ctx, node: &'a Node, what: &str, allowed: &[&str]) -> Option<Self> {
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

    pub(super) fn get(&self, key: &str) -> Option<&'a Node> {
        self.entries.get(key).copied()
    }

    pub(super) fn key_pos(&self, key: &str) -> Pos {
        self.keys.get(key).copied().unwrap_or(self.node.pos)
    }

    pub(super) fn required(&self, cx: &mut Ctx, key: &str, what: &str) -> Option<&'a Node> {
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
pub(super) fn suggest<'a>(word: &str, allowed: &[&'a str]) -> Option<&'a str> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggestions_stay_within_two_edits() {
        assert_eq!(
            suggest("timezon", &["timezone", "tenant"]),
            Some("timezone")
        );
        assert_eq!(suggest("zzzzzz", &["timezone", "tenant"]), None);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }
}
