//! What a rollout asks of the planner for its pack: the gate, stored with
//! the pack and changed in the same transaction as the rollout.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::time::{RefTime, ns};

/// What a rollout asks of the planner for its pack, stored with the pack
/// (and changed in the same transaction as the rollout).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateRow {
    /// The rollout (its version) whose cohort is let onto the latest.
    pub rollout: u64,
    /// What the others keep.
    pub from: Option<u64>,
    /// Members hold the latest; `false`: it is withdrawn from them (an
    /// abort with `on_abort: safe_state`).
    pub members_hold: bool,
    /// See `RolloutRow::keep_above`.
    #[serde(default)]
    pub keep_above: Option<u64>,
    /// See `RolloutRow::banned`.
    #[serde(default)]
    pub banned: Vec<u64>,
    /// See `RolloutRow::together`.
    #[serde(default)]
    pub together: bool,
    /// See `RolloutRow::switch_at`.
    #[serde(default, rename = "switch_at_ns", with = "ns::opt_instant")]
    pub switch_at: Option<RefTime>,
    /// See `RolloutRow::held_back`.
    #[serde(default)]
    pub held_back: Vec<String>,
}

/// A gate with the members the planner is deciding for (all of the
/// cohort, or only the one agent being planned).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gate {
    /// As stored.
    pub row: GateRow,
    /// Members among the agents being planned.
    pub admitted: BTreeSet<String>,
}
