//! The rollout state machine. Pure, like the planner: a function of the
//! pack's `rollout:` section, the rollout as stored, and what was observed
//! (the targets, who holds what, the cohorts' figures) at `now`; it
//! returns the next stored state and the effect to carry out. It is
//! level-triggered: whoever runs it (every replica's driver, after any
//! change or on a timer) recomputes from the store and writes with a
//! compare-and-set on the rollout's `rev`, so a step taken twice, or by two
//! replicas at once, is applied once.
//!
//! Rules:
//! - a stage starts (admits its agents) only inside a window, canaries
//!   (label `canary=true`) first, then connected agents, then by id; the
//!   cohort never exceeds the largest share of the stages so far ([`share`]);
//! - **fail** at any time: a member refused the version for good; failed
//!   or unknown firings over their threshold; once the stage has
//!   `min_firings` settled firings, lateness p99 or offset over theirs
//!   (against the baseline with `compare: baseline`) -> aborted;
//! - **pass**: every member holds the version and is connected, the soak
//!   is over (counted from the last ack) and `min_firings` firings settled
//!   (of the agents the stage admitted, when it admitted any);
//! - **inconclusive** at the deadline otherwise: the deadline's action.
//!   Offline never passes: a member that never acked is missing, and a
//!   `skip_offline` only leaves it out, recorded;
//! - aborted, superseded and completed are final; paused waits for an
//!   operator's resume.

mod judge;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use baton_proto::pack::rollout::{Activate, DeadlineAction, OnAbort, Rollout};

use crate::rollout_rows::{
    CohortFigures, Member, RolloutRow, RolloutState, VerdictKind, VerdictRow,
};
use crate::time::{self, RefTime};

/// An agent the pack targets, as the machine needs to see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentView {
    /// Agent id.
    pub id: String,
    /// Labelled `canary=true` (for the pack's tenant).
    pub canary: bool,
    /// Connected to some replica.
    pub connected: bool,
    /// Holds the rollout's version.
    pub holds: bool,
    /// Refused the version for good, with the agent's message.
    pub refused: Option<String>,
    /// Said it staged the version (`activate: together`).
    pub staged: bool,
    /// Its clock, as last reported, is within the pack's
    /// `max_uncertainty`: it may be named an instant.
    pub clock_ok: bool,
    /// When the controller last heard from it (`None`: never), for what
    /// a pause of an agent it has no word from says.
    pub last_seen: Option<RefTime>,
}

/// How far ahead of the moment every member staged a version the
/// controller names the instant they switch at: room for the instant to
/// reach every agent of a stage (a push each, paced) before it comes.
pub const SWITCH_LEAD: std::time::Duration = std::time::Duration::from_secs(2);

/// How long after the instant a member that did not switch (held back,
/// or it refused at the instant) makes the stage inconclusive. A member
/// whose link is down is not judged on it: it may well have switched on
/// time, and says what it holds when it is back.
pub const SWITCH_SETTLE: std::time::Duration = std::time::Duration::from_secs(10);

/// What the driver observed for one step.
#[derive(Clone, Debug, PartialEq)]
pub struct Observed {
    /// Now (the controller's clock).
    pub now: RefTime,
    /// Every agent the pack targets now.
    pub targets: Vec<AgentView>,
    /// The cohort's firings of the version since the stage started, and
    /// its clock offsets.
    pub cohort: CohortFigures,
    /// The same of the agents still on the old version (`None`: none).
    pub baseline: Option<CohortFigures>,
}

/// What to carry out besides storing the next state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Republish the previous version's content, higher, to the cohort.
    Rollback,
    /// Withdraw the version from the cohort (its safe state runs).
    Withdraw,
}

/// One step's decision.
#[derive(Clone, Debug, Default, PartialEq)]
#[must_use = "a step decides a change that must be stored"]
pub struct Step {
    /// The rollout as it should be stored (`None`: nothing changed).
    pub next: Option<RolloutRow>,
    /// Agents admitted now, with their membership.
    pub admit: Vec<(String, Member)>,
    /// Members left out of verdicts from now on.
    pub skip: Vec<String>,
    /// What an abort asks for.
    pub effect: Option<Effect>,
    /// What happened, in words, for the audit log.
    pub said: Vec<String>,
}

/// The next step of a moving rollout (waiting for a window, or running).
/// A paused or final rollout does not move.
pub fn step(spec: &Rollout, row: &RolloutRow, obs: &Observed) -> Step {
    if !row.state.is_moving() {
        return Step::default();
    }
    let mut s = Stepper {
        spec,
        now: obs.now,
        next: row.clone(),
        out: Step::default(),
    };
    if row.stage_started.is_none() {
        s.start_stage(obs);
    } else {
        s.judge(obs);
    }
    s.finish(row)
}

/// An operator pauses a moving rollout.
pub fn pause(row: &RolloutRow, why: &str, now: RefTime) -> Result<Step, String> {
    if !row.state.is_moving() {
        return Err(format!(
            "rollout of v{} is {}: only a waiting or running rollout can be paused",
            row.version,
            row.state.as_str()
        ));
    }
    let mut next = row.clone();
    next.state = RolloutState::Paused;
    next.reason = why.to_string();
    next.updated = now;
    Ok(Step {
        next: Some(next),
        said: vec![format!("stage {} paused: {why}", row.stage + 1)],
        ..Step::default()
    })
}

/// An operator resumes a paused rollout: its stage's deadline starts over
/// (and a together stage whose instant passed names a new one for the
/// members still behind).
pub fn resume(row: &RolloutRow, who: &str, now: RefTime) -> Result<Step, String> {
    if row.state != RolloutState::Paused {
        return Err(format!(
            "rollout of v{} is {}: only a paused rollout can be resumed{}",
            row.version,
            row.state.as_str(),
            if row.state == RolloutState::Aborted {
                " (an abort is final: push a higher version to try again)"
            } else {
                ""
            }
        ));
    }
    let mut next = row.clone();
    next.state = if row.stage_started.is_some() {
        RolloutState::Running
    } else {
        RolloutState::WaitingWindow
    };
    next.reason.clear();
    next.deadline_from = row.stage_started.map(|_| now);
    // A together stage whose instant passed with members not switched
    // (held back, or restarted before it): a new instant is named for
    // them once they all staged again.
    if next.switch_at.is_some_and(|t| t <= now) {
        next.switch_at = None;
        next.held_back.clear();
    }
    next.updated = now;
    Ok(Step {
        next: Some(next),
        said: vec![format!("stage {} resumed by {who}", row.stage + 1)],
        ..Step::default()
    })
}

/// An operator aborts a rollout that is not over.
pub fn abort(spec: &Rollout, row: &RolloutRow, why: &str, now: RefTime) -> Result<Step, String> {
    if row.state.is_final() {
        return Err(format!(
            "rollout of v{} is {} already",
            row.version,
            row.state.as_str()
        ));
    }
    let mut s = Stepper {
        spec,
        now,
        next: row.clone(),
        out: Step::default(),
    };
    s.abort(why.to_string());
    Ok(s.finish(row))
}

struct Stepper<'a> {
    spec: &'a Rollout,
    now: RefTime,
    next: RolloutRow,
    out: Step,
}

impl Stepper<'_> {
    fn finish(mut self, row: &RolloutRow) -> Step {
        if self.next != *row || !self.out.admit.is_empty() || !self.out.skip.is_empty() {
            self.next.updated = self.now;
            self.out.next = Some(self.next);
        }
        self.out
    }

    fn stage_no(&self) -> u32 {
        self.next.stage + 1
    }

    /// Admits the current stage's agents if a window is open.
    fn start_stage(&mut self, obs: &Observed) {
        if !window_open(self.spec, self.now) {
            if self.next.state != RolloutState::WaitingWindow {
                self.next.state = RolloutState::WaitingWindow;
                let n = self.stage_no();
                self.out.said.push(format!("stage {n} waits for a window"));
            }
            return;
        }
        let stage = self.next.stage;
        let share = share(self.spec, stage, obs.targets.len() as u64);
        let members = &self.next.members;
        let already = obs
            .targets
            .iter()
            .filter(|a| members.contains_key(&a.id))
            .count() as u64;
        let mut candidates: Vec<&AgentView> = obs
            .targets
            .iter()
            .filter(|a| !members.contains_key(&a.id))
            .collect();
        candidates.sort_by(|a, b| {
            (!a.canary, !a.connected, &a.id).cmp(&(!b.canary, !b.connected, &b.id))
        });
        let admit: Vec<(String, Member)> = candidates
            .into_iter()
            .take(share.saturating_sub(already) as usize)
            .map(|a| {
                (
                    a.id.clone(),
                    Member {
                        stage,
                        skipped: false,
                    },
                )
            })
            .collect();
        for (id, m) in &admit {
            self.next.members.insert(id.clone(), *m);
        }
        self.out.said.push(format!(
            "stage {} of {} started: {} agent(s) admitted, {} in the cohort, {} targeted",
            self.stage_no(),
            self.spec.stages.len(),
            admit.len(),
            already + admit.len() as u64,
            obs.targets.len()
        ));
        self.out.admit = admit;
        self.next.state = RolloutState::Running;
        self.next.stage_started = Some(self.now);
        self.next.deadline_from = Some(self.now);
        self.next.soak_from = None;
        self.next.deadline_taken = false;
        self.next.together = self.spec.activate == Activate::Together;
        self.next.switch_at = None;
        self.next.held_back.clear();
    }

    /// With `activate: together`, once every member not on the version
    /// staged it (and is connected): the instant they switch at, a little
    /// ahead; members whose clock is not certain enough are held back
    /// (not switched: they stay missing, and the stage inconclusive).
    fn name_instant(&mut self, members: &[&AgentView]) {
        if !self.next.together || self.next.switch_at.is_some() {
            return;
        }
        let behind: Vec<&AgentView> = members.iter().copied().filter(|a| !a.holds).collect();
        if behind.is_empty() || !behind.iter().all(|a| a.staged && a.connected) {
            return;
        }
        let at = self.now + SWITCH_LEAD;
        self.next.switch_at = Some(at);
        self.next.held_back = behind
            .iter()
            .filter(|a| !a.clock_ok)
            .map(|a| a.id.clone())
            .collect();
        let n = self.stage_no();
        let switching = behind.len() - self.next.held_back.len();
        let mut line = format!(
            "stage {n}: {switching} agent(s) switch together at {} ns",
            at.as_nanos()
        );
        if !self.next.held_back.is_empty() {
            line.push_str(&format!(
                "; held back, their clock less certain than max_uncertainty: {}",
                self.next.held_back.join(", ")
            ));
        }
        self.out.said.push(line);
    }

    /// A together stage whose instant passed [`SWITCH_SETTLE`] ago with
    /// members known to be behind (held back, or connected and not on the
    /// version: they refused at the instant, or restarted before it) is
    /// inconclusive at once: the deadline's action (`skip_offline`
    /// leaves them out, `abort` aborts), else a pause for an operator,
    /// whose resume names a new instant for them. A member the controller
    /// has no word from (its link cut across the instant) is not among
    /// them: it may have switched on time, and is an offline member like
    /// any other: the stage cannot pass without it, its hello on
    /// reconnecting says what it holds (and the stage goes on by itself),
    /// and the stage's deadline acts on it meanwhile. Returns whether it
    /// decided.
    fn not_switched(&mut self, members: &[&AgentView], obs: &Observed) -> bool {
        let settled_at = self.next.switch_at.map(|t| t + SWITCH_SETTLE);
        if !self.next.together || settled_at.is_none_or(|t| self.now < t) {
            return false;
        }
        let held_back = &self.next.held_back;
        let behind: Vec<String> = members
            .iter()
            .filter(|a| !a.holds && (a.connected || held_back.contains(&a.id)))
            .map(|a| a.id.clone())
            .collect();
        if behind.is_empty() {
            return false;
        }
        let why = format!(
            "not switched at the stage's instant (held back, their clock less certain than max_uncertainty, or refused at the instant): {}",
            behind.join(", ")
        );
        self.verdict(VerdictKind::Inconclusive, why.clone(), obs, members);
        let n = self.stage_no();
        match self.spec.stage_deadline.map(|d| d.then) {
            Some(DeadlineAction::Abort) => self.abort(why),
            Some(DeadlineAction::SkipOffline) => {
                for id in &behind {
                    if let Some(m) = self.next.members.get_mut(id) {
                        m.skipped = true;
                    }
                }
                self.out.said.push(format!(
                    "stage {n}: left out of its verdict (skip_offline): {why}"
                ));
                self.out.skip = behind;
            }
            _ => {
                self.next.state = RolloutState::Paused;
                self.next.reason = why.clone();
                self.out.said.push(format!("stage {n} paused: {why}"));
            }
        }
        true
    }

    /// Judges the started stage: fail, pass, the deadline, or nothing yet.
    fn judge(&mut self, obs: &Observed) {
        let members = active_members(&self.next.members, obs);
        if let Some(why) = judge::failure(self.spec, members.iter().copied(), obs) {
            self.verdict(VerdictKind::Fail, why.clone(), obs, &members);
            self.abort(why);
            return;
        }
        self.name_instant(&members);
        if self.not_switched(&members, obs) {
            return;
        }
        // Offline never passes: a member must hold the version and be
        // connected.
        let missing: Vec<&AgentView> = members
            .iter()
            .copied()
            .filter(|a| !a.holds || !a.connected)
            .collect();
        if missing.is_empty() && self.next.soak_from.is_none() {
            self.next.soak_from = Some(self.now);
        }
        let soaked = self
            .next
            .soak_from
            .is_some_and(|s| elapsed(s, self.now, self.spec.soak));
        let stage = self.next.stage;
        let admitted_now = self.next.members.values().any(|m| m.stage == stage);
        let settled = if admitted_now {
            obs.cohort.stage_settled
        } else {
            obs.cohort.settled
        };
        let enough = settled >= self.spec.min_firings;
        if missing.is_empty() && soaked && enough {
            self.verdict(
                VerdictKind::Pass,
                format!(
                    "soak of {} over, {settled} settled firing(s), thresholds held",
                    fmt_duration(self.spec.soak),
                ),
                obs,
                &members,
            );
            self.next_stage();
            return;
        }
        let Some(deadline) = self.spec.stage_deadline else {
            return;
        };
        let from = self.next.deadline_from.or(self.next.stage_started);
        let due = from.is_some_and(|f| elapsed(f, self.now, deadline.after));
        if !due {
            return;
        }
        let why = undecided(&missing, soaked, enough, settled, self.spec);
        self.verdict(VerdictKind::Inconclusive, why.clone(), obs, &members);
        match deadline.then {
            DeadlineAction::Abort => self.abort(format!("stage deadline: {why}")),
            DeadlineAction::SkipOffline if !self.next.deadline_taken && !missing.is_empty() => {
                self.out.skip = missing.iter().map(|a| a.id.clone()).collect();
                for id in &self.out.skip {
                    if let Some(m) = self.next.members.get_mut(id) {
                        m.skipped = true;
                    }
                }
                self.next.deadline_taken = true;
                self.next.deadline_from = Some(self.now);
                let n = self.stage_no();
                self.out.said.push(format!(
                    "stage {n}: {} agent(s) that never acked left out of its verdict (skip_offline): {}",
                    self.out.skip.len(),
                    self.out.skip.join(", ")
                ));
            }
            _ => {
                self.next.state = RolloutState::Paused;
                self.next.reason = format!("stage deadline: {why}");
                let n = self.stage_no();
                self.out.said.push(format!("stage {n} paused: {why}"));
            }
        }
    }

    fn next_stage(&mut self) {
        let done = self.next.stage as usize + 1 >= self.spec.stages.len();
        if done {
            self.next.state = RolloutState::Completed;
            self.out.said.push("completed: every stage passed".into());
        } else {
            self.next.stage += 1;
            self.next.stage_started = None;
            self.next.soak_from = None;
            self.next.deadline_from = None;
            self.next.deadline_taken = false;
            self.next.switch_at = None;
            self.next.held_back.clear();
        }
    }

    fn abort(&mut self, why: String) {
        self.next.state = RolloutState::Aborted;
        let effect = match self.spec.on_abort {
            OnAbort::Rollback => Effect::Rollback,
            OnAbort::SafeState => Effect::Withdraw,
        };
        let what = match (effect, self.next.from) {
            (Effect::Rollback, Some(f)) => format!("the cohort gets v{f}'s content again"),
            (Effect::Rollback, None) => {
                "the cohort's copy is withdrawn (there is no earlier version to roll back to)"
                    .to_string()
            }
            (Effect::Withdraw, _) => "the cohort's copy is withdrawn (safe state)".to_string(),
        };
        self.out.said.push(format!("aborted: {why}; {what}"));
        self.next.reason = why;
        self.out.effect = Some(effect);
    }

    fn verdict(
        &mut self,
        kind: VerdictKind,
        reason: String,
        obs: &Observed,
        members: &[&AgentView],
    ) {
        let missing = members
            .iter()
            .filter(|a| !a.holds || !a.connected)
            .map(|a| a.id.clone())
            .collect();
        self.out.said.push(format!(
            "stage {} verdict {}: {reason}",
            self.stage_no(),
            kind.as_str()
        ));
        self.next.verdicts.push(VerdictRow {
            stage: self.next.stage,
            kind,
            reason,
            cohort: obs.cohort.clone(),
            baseline: obs.baseline.clone(),
            missing,
            since: self.next.stage_started.unwrap_or(self.now),
            at: self.now,
        });
    }
}

/// Whether a stage may start at `now`: no windows, or one is open.
pub fn window_open(spec: &Rollout, now: RefTime) -> bool {
    spec.windows.is_empty() || {
        let t = now.to_timestamp();
        spec.windows.iter().any(|w| w.is_open(t))
    }
}

/// How many of `total` targets the cohort may hold by stage `stage`:
/// stages are cumulative, so an agent count before a smaller percentage
/// (`[{agents: 5}, {percent: 10}]` on 20 agents) keeps the larger share,
/// never taking agents back.
pub fn share(spec: &Rollout, stage: u32, total: u64) -> u64 {
    spec.stages
        .iter()
        .take(stage as usize + 1)
        .map(|s| s.of(total))
        .max()
        .unwrap_or(0)
}

/// The cohort's members the pack still targets, skipped ones left out.
fn active_members<'a>(members: &BTreeMap<String, Member>, obs: &'a Observed) -> Vec<&'a AgentView> {
    obs.targets
        .iter()
        .filter(|a| members.get(&a.id).is_some_and(|m| !m.skipped))
        .collect()
}

/// Why a stage is undecided at its deadline.
fn undecided(
    missing: &[&AgentView],
    soaked: bool,
    enough: bool,
    settled: u64,
    spec: &Rollout,
) -> String {
    let mut why = Vec::new();
    if !missing.is_empty() {
        let offline: Vec<&AgentView> = missing.iter().copied().filter(|a| !a.connected).collect();
        let ids: Vec<&str> = missing.iter().map(|a| a.id.as_str()).collect();
        why.push(format!(
            "{} agent(s) missing, not on the version or offline ({} offline): {}",
            missing.len(),
            offline.len(),
            ids.join(", ")
        ));
        // What the controller knows of the offline ones: when it last
        // heard from each, not a guess at what they did since.
        let unheard: Vec<String> = offline
            .iter()
            .map(|a| match a.last_seen {
                Some(t) => format!("{} since {}", a.id, t.to_rfc3339()),
                None => format!("{} ever", a.id),
            })
            .collect();
        if !unheard.is_empty() {
            why.push(format!("no word from {}", unheard.join(", ")));
        }
    }
    if !enough {
        why.push(format!(
            "{settled} settled firing(s), {} needed",
            spec.min_firings
        ));
    }
    if missing.is_empty() && !soaked {
        why.push(format!(
            "the soak of {} is not over",
            fmt_duration(spec.soak)
        ));
    }
    why.join("; ")
}

/// Whether `d` has passed from `from` to `now` (never when `now` is
/// before `from`, unless `d` is zero and they are equal).
fn elapsed(from: RefTime, now: RefTime, d: std::time::Duration) -> bool {
    time::span_ns(time::between(from, now)) >= duration_ns(d)
}

fn duration_ns(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

fn fmt_duration(d: std::time::Duration) -> String {
    baton_proto::time::format_duration(d)
}
