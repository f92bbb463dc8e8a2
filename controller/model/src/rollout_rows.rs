//! A rollout as the store keeps it: where it stands, who is in its cohort,
//! every verdict with its inputs, and the gate the planner reads.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::gate::GateRow;
use crate::records::{PackKey, PackVersionRow};
use crate::time::{RefTime, SignedDuration, ns};

/// Where a rollout stands. Only `Paused` can be resumed; `Aborted`,
/// `Superseded` and `Completed` are final.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RolloutState {
    /// The next stage waits for one of the pack's windows.
    WaitingWindow,
    /// A stage is being delivered or watched.
    Running,
    /// Held until an operator resumes it (a deadline, or `rollout pause`).
    Paused,
    /// A stage failed, or an operator aborted it.
    Aborted,
    /// A newer push (or a cancel) of the pack ended it.
    Superseded,
    /// Every stage passed.
    Completed,
}

impl RolloutState {
    /// Its word (CLI, store, audit).
    pub fn as_str(self) -> &'static str {
        match self {
            RolloutState::WaitingWindow => "waiting_window",
            RolloutState::Running => "running",
            RolloutState::Paused => "paused",
            RolloutState::Aborted => "aborted",
            RolloutState::Superseded => "superseded",
            RolloutState::Completed => "completed",
        }
    }

    /// The state a stored word names.
    pub fn parse(s: &str) -> Option<RolloutState> {
        [
            RolloutState::WaitingWindow,
            RolloutState::Running,
            RolloutState::Paused,
            RolloutState::Aborted,
            RolloutState::Superseded,
            RolloutState::Completed,
        ]
        .into_iter()
        .find(|st| st.as_str() == s)
    }

    /// Nothing more happens to it.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            RolloutState::Aborted | RolloutState::Superseded | RolloutState::Completed
        )
    }

    /// Its stages still move (automatically).
    pub fn is_moving(self) -> bool {
        matches!(self, RolloutState::WaitingWindow | RolloutState::Running)
    }
}

/// A stage's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerdictKind {
    /// Soak over, enough firings, every threshold held.
    Pass,
    /// A threshold crossed (or an agent refused the version).
    Fail,
    /// Too few firings, or agents offline, at the deadline.
    Inconclusive,
}

impl VerdictKind {
    /// Its word.
    pub fn as_str(self) -> &'static str {
        match self {
            VerdictKind::Pass => "pass",
            VerdictKind::Fail => "fail",
            VerdictKind::Inconclusive => "inconclusive",
        }
    }
}

/// What a cohort's firings in a window came to: a verdict's inputs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CohortFigures {
    /// Agents whose firings these are.
    pub agents: u64,
    /// Firings settled (ran, failed, gave up, skipped, or unknown).
    pub settled: u64,
    /// Of them, those of the agents the current stage admitted: a stage
    /// that admitted agents is judged on their firings, not on what the
    /// earlier stages' agents fire.
    #[serde(default)]
    pub stage_settled: u64,
    /// Of them failed, gave up or skipped.
    pub failed: u64,
    /// Of them of unknown outcome.
    pub unknown: u64,
    /// Start lateness p99 of those that ran.
    #[serde(default, rename = "lateness_p99_ns", with = "ns::opt_span")]
    pub lateness_p99: Option<SignedDuration>,
    /// Largest absolute clock offset among the agents.
    #[serde(default, rename = "offset_max_ns", with = "ns::opt_span")]
    pub offset_max: Option<SignedDuration>,
}

impl CohortFigures {
    /// Failed firings as a percentage of settled ones (0 with none).
    pub fn failed_percent(&self) -> f64 {
        if self.settled == 0 {
            0.0
        } else {
            self.failed as f64 * 100.0 / self.settled as f64
        }
    }
}

/// One verdict, stored with what it was decided on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VerdictRow {
    /// Stage index (0-based).
    pub stage: u32,
    /// The verdict.
    pub kind: VerdictKind,
    /// Why, in words.
    pub reason: String,
    /// The new version's cohort over the stage's window.
    pub cohort: CohortFigures,
    /// The agents still on the old version, same window (`compare:
    /// baseline`, when there are any).
    pub baseline: Option<CohortFigures>,
    /// Agents of the stage that never acked (offline, or refused).
    pub missing: Vec<String>,
    /// The window judged: from.
    #[serde(rename = "since_ns", with = "ns::instant")]
    pub since: RefTime,
    /// When it was decided.
    #[serde(rename = "at_ns", with = "ns::instant")]
    pub at: RefTime,
}

/// A member of a rollout's cohort.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// The stage that admitted it.
    pub stage: u32,
    /// Left out of a verdict at a deadline (`skip_offline`): never counted
    /// as passed.
    pub skipped: bool,
}

/// A rollout of one pack version, as stored. `rev` is its compare-and-set
/// counter: a change names the `rev` it was computed from, so two
/// replicas never both advance it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RolloutRow {
    /// Tenant.
    pub tenant: String,
    /// Pack id.
    pub pack: String,
    /// The version rolled out.
    pub version: u64,
    /// The version the agents outside the cohort keep (`None`: the pack
    /// was new, or cancelled: they get nothing until admitted).
    pub from: Option<u64>,
    /// Outsiders keep only versions above this one (the pack was
    /// cancelled at it: nothing of it runs again).
    #[serde(default)]
    pub keep_above: Option<u64>,
    /// Versions outsiders never keep: those of aborted rollouts before it.
    #[serde(default)]
    pub banned: Vec<u64>,
    /// Its stages switch at one instant (`activate: together`).
    #[serde(default)]
    pub together: bool,
    /// The current stage's instant, once every member staged the version.
    #[serde(default, rename = "switch_at_ns", with = "ns::opt_instant")]
    pub switch_at: Option<RefTime>,
    /// Members of the current stage not switched: their clock was less
    /// certain than the pack allows when the instant was named.
    #[serde(default)]
    pub held_back: Vec<String>,
    /// Compare-and-set counter (the store sets it).
    pub rev: u64,
    /// Where it stands.
    pub state: RolloutState,
    /// The current stage (0-based).
    pub stage: u32,
    /// When the current stage admitted its agents (`None`: not yet, it
    /// waits for a window).
    #[serde(default, rename = "stage_started_ns", with = "ns::opt_instant")]
    pub stage_started: Option<RefTime>,
    /// When every agent of the current stage held the version: the soak
    /// runs from here.
    #[serde(default, rename = "soak_from_ns", with = "ns::opt_instant")]
    pub soak_from: Option<RefTime>,
    /// When the current stage's deadline clock started: the stage's
    /// start, a resume, or a `skip_offline` (whose stage gets one more
    /// deadline, then pauses).
    #[serde(default, rename = "deadline_from_ns", with = "ns::opt_instant")]
    pub deadline_from: Option<RefTime>,
    /// `skip_offline` was applied to the current stage.
    pub deadline_taken: bool,
    /// The version republished with the old content by an abort's
    /// rollback.
    pub rollback: Option<u64>,
    /// Why it is paused, aborted or superseded; empty otherwise.
    pub reason: String,
    /// Every verdict so far, oldest first.
    pub verdicts: Vec<VerdictRow>,
    /// The cohort: agents let onto the version, by id.
    #[serde(skip)]
    pub members: BTreeMap<String, Member>,
    /// Created.
    #[serde(rename = "created_ns", with = "ns::instant")]
    pub created: RefTime,
    /// Last changed.
    #[serde(rename = "updated_ns", with = "ns::instant")]
    pub updated: RefTime,
}

impl RolloutRow {
    /// A new rollout, waiting to start its first stage.
    pub fn new(key: &PackKey, version: u64, base: Base, at: RefTime) -> RolloutRow {
        RolloutRow {
            tenant: key.tenant.clone(),
            pack: key.pack.clone(),
            version,
            from: base.from,
            keep_above: base.keep_above,
            banned: base.banned,
            together: false,
            switch_at: None,
            held_back: Vec::new(),
            rev: 0,
            state: RolloutState::WaitingWindow,
            stage: 0,
            stage_started: None,
            soak_from: None,
            deadline_from: None,
            deadline_taken: false,
            rollback: None,
            reason: String::new(),
            verdicts: Vec::new(),
            members: BTreeMap::new(),
            created: at,
            updated: at,
        }
    }

    /// Its pack.
    pub fn key(&self) -> PackKey {
        PackKey::new(&self.tenant, &self.pack)
    }

    /// What the planner must do for the pack while this rollout is its
    /// latest: `None` when it no longer gates anything (completed,
    /// superseded).
    pub fn gate(&self, on_abort_cancels: bool) -> Option<GateRow> {
        let members_hold = match self.state {
            RolloutState::Completed | RolloutState::Superseded => return None,
            RolloutState::Aborted => !on_abort_cancels,
            _ => true,
        };
        // An abort's rollback (or withdrawal) goes to the cohort at once,
        // not at an instant: it replaces whatever a member had staged.
        let together = self.together && self.state != RolloutState::Aborted;
        Some(GateRow {
            rollout: self.version,
            from: self.from,
            members_hold,
            keep_above: self.keep_above,
            banned: self.banned.clone(),
            together,
            switch_at: self.switch_at.filter(|_| together),
            held_back: if together {
                self.held_back.clone()
            } else {
                Vec::new()
            },
        })
    }
}

/// What a new rollout's outsiders keep, from the pack as it was.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Base {
    /// See [`RolloutRow::from`].
    pub from: Option<u64>,
    /// See [`RolloutRow::keep_above`].
    pub keep_above: Option<u64>,
    /// See [`RolloutRow::banned`].
    pub banned: Vec<u64>,
}

impl Base {
    /// From the pack before the new version: its latest version, whether
    /// it was cancelled, and the gate a rollout left on it (`aborted`: that
    /// rollout ended in an abort).
    ///
    /// - cancelled: outsiders get nothing, and keep nothing of it;
    /// - gated (an open rollout, now superseded, or an aborted one): its
    ///   outsiders' version stays theirs; an aborted version is never
    ///   kept;
    /// - otherwise every target held the latest: that is what they keep.
    pub fn of(latest: Option<u64>, cancelled: bool, gate: Option<&GateRow>, aborted: bool) -> Base {
        if cancelled {
            return Base {
                from: None,
                keep_above: latest,
                banned: Vec::new(),
            };
        }
        match gate {
            Some(g) => {
                let mut banned = g.banned.clone();
                if aborted && !banned.contains(&g.rollout) {
                    banned.push(g.rollout);
                }
                Base {
                    from: g.from,
                    keep_above: g.keep_above,
                    banned,
                }
            }
            None => Base {
                from: latest,
                ..Base::default()
            },
        }
    }
}

/// A change to a rollout, applied only if its `rev` is still the stored
/// one (`Store::advance_rollout`, in baton-store).
#[derive(Clone, Debug, PartialEq)]
pub struct RolloutChange {
    /// The rollout as it should be (its `rev` the one it was read at).
    pub row: RolloutRow,
    /// Agents admitted now (they join `members`).
    pub admit: Vec<(String, Member)>,
    /// Members marked skipped now.
    pub skip: Vec<String>,
    /// A pack version to store with it (an abort's rollback).
    pub republish: Option<PackVersionRow>,
    /// The pack's gate from now on ([`RolloutRow::gate`]).
    pub gate: Option<GateRow>,
}
