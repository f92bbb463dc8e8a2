//! A rollout as an operator reads it: each member's state in words and
//! since when, each stage's progress, the soak left, every gate beside
//! the figure it judges, and which members hold the current stage up.
//! Pure (a [`RolloutStatus`] and `now` in, words out): the dashboard
//! renders it, and its tests drive it with statuses made up by hand.

use std::time::Duration;

use crate::rollouts::{RolloutAgent, RolloutStatus};
use baton_model::display::span;
use baton_model::{RefTime, RolloutState, SpanNanos};
use baton_proto::pack::rollout::Compare;
use baton_proto::time::format_duration;

/// Where one targeted agent stands in the rollout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemberState {
    /// Admitted and holding the version (switched, with `activate:
    /// together`).
    Holds,
    /// Staged it, waiting for the stage's instant.
    Staged,
    /// The version is on its way: not acknowledged yet.
    Waiting,
    /// Not switched: its clock was less certain than the pack allows
    /// when the instant was named (or is now, before it is named).
    HeldBack,
    /// Admitted, not holding it, and offline.
    Offline,
    /// Refused the version, with the agent's message.
    Refused(String),
    /// Left out of the verdicts at a deadline (`skip_offline`).
    Skipped,
    /// Not admitted by a stage yet.
    Outside,
}

impl MemberState {
    /// A short word for a badge (the words beside it say the rest).
    pub fn badge(&self) -> &'static str {
        match self {
            MemberState::Holds => "holds",
            MemberState::Staged => "staged",
            MemberState::Waiting => "waiting",
            MemberState::HeldBack => "held back",
            MemberState::Offline => "offline",
            MemberState::Refused(_) => "refused",
            MemberState::Skipped => "skipped",
            MemberState::Outside => "not yet",
        }
    }

    /// Good, waiting or bad: how a page colours the badge (never the
    /// only sign: the word is always there).
    pub fn tone(&self) -> Tone {
        match self {
            MemberState::Holds => Tone::Good,
            MemberState::Staged | MemberState::Waiting | MemberState::Outside => Tone::Neutral,
            MemberState::HeldBack
            | MemberState::Offline
            | MemberState::Refused(_)
            | MemberState::Skipped => Tone::Bad,
        }
    }
}

/// How a state reads at a glance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tone {
    /// As it should be.
    Good,
    /// On its way.
    Neutral,
    /// Needs a look.
    Bad,
}

impl Tone {
    /// Its CSS class word.
    pub fn as_str(self) -> &'static str {
        match self {
            Tone::Good => "good",
            Tone::Neutral => "neutral",
            Tone::Bad => "bad",
        }
    }
}

/// One targeted agent, as the page lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberLine {
    /// Agent id.
    pub id: String,
    /// The stage that admitted it (0-based).
    pub stage: Option<u32>,
    /// Its state.
    pub state: MemberState,
    /// The state in a sentence.
    pub words: String,
    /// Since when (its delivery's last change; last heard of, offline).
    pub since: Option<RefTime>,
    /// It keeps the current stage from going on.
    pub blocks: bool,
}

/// What the members one stage admitted are doing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StageBar {
    /// Admitted by this stage (none yet: the stage has not started).
    pub members: usize,
    /// Of them holding the version.
    pub holds: usize,
    /// Staged, waiting for the instant.
    pub staged: usize,
    /// Refused it.
    pub refused: usize,
    /// Left out at a deadline.
    pub skipped: usize,
    /// The rest: on the way, offline or held back.
    pub pending: usize,
}

/// One `abort_if` gate beside the figure it judges.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gate {
    /// What it judges.
    pub name: &'static str,
    /// The stage fails when the figure is above this, in words.
    pub fails_above: String,
    /// The cohort's figure so far, in words.
    pub now: String,
    /// The figure is above the threshold already.
    pub crossed: bool,
}

/// Every targeted agent's line, cohort first (the status's order).
pub fn members(s: &RolloutStatus) -> Vec<MemberLine> {
    s.agents.iter().map(|a| member(s, a)).collect()
}

fn member(s: &RolloutStatus, a: &RolloutAgent) -> MemberLine {
    let row = &s.row;
    let v = &a.view;
    let version = row.version;
    let max = format_duration(s.spec.max_uncertainty);
    let (state, words) = match a.stage {
        None => (
            MemberState::Outside,
            match a.held {
                Some(h) => format!("not admitted by a stage yet; holds v{h}"),
                None => "not admitted by a stage yet; holds no version".into(),
            },
        ),
        Some(_) if a.skipped => (
            MemberState::Skipped,
            "left out of the verdicts: offline at the stage's deadline".into(),
        ),
        Some(_) if v.holds => (
            MemberState::Holds,
            match (row.together, v.connected) {
                (true, true) => format!("switched to v{version}"),
                (false, true) => format!("acknowledged v{version}"),
                (_, false) => format!("holds v{version}; offline now"),
            },
        ),
        Some(_) if v.refused.is_some() => {
            let why = v.refused.clone().unwrap_or_default();
            (
                MemberState::Refused(why.clone()),
                format!("refused v{version}: {why}"),
            )
        }
        Some(_) if !v.connected => (
            MemberState::Offline,
            format!("offline: v{version} waits for it to come back"),
        ),
        Some(_) if row.together && row.held_back.contains(&v.id) => (
            MemberState::HeldBack,
            format!(
                "held back: its clock was not within {max} when the instant was named; it stays on {}",
                a.held.map_or("no version".into(), |h| format!("v{h}"))
            ),
        ),
        Some(_) if row.together && !v.clock_ok && row.switch_at.is_none() => (
            MemberState::HeldBack,
            format!("its clock is not within {max}: it will be held back unless that changes"),
        ),
        Some(_) if v.staged => (
            MemberState::Staged,
            match row.switch_at {
                Some(t) => format!(
                    "staged v{version}; switches at {}",
                    baton_model::display::instant(t.as_nanos())
                ),
                None => format!("staged v{version}; waits for the other members to stage it"),
            },
        ),
        Some(_) => (
            MemberState::Waiting,
            format!("v{version} is on its way: not acknowledged yet"),
        ),
    };
    let since = match state {
        MemberState::Offline => v.last_seen,
        _ => a.since,
    };
    // A member that has not taken the version keeps its stage from being
    // judged: a rollout that still moves (or is paused over it) waits.
    let blocks = !row.state.is_final()
        && row.state != RolloutState::WaitingWindow
        && matches!(
            state,
            MemberState::Waiting
                | MemberState::HeldBack
                | MemberState::Offline
                | MemberState::Refused(_)
        );
    MemberLine {
        id: v.id.clone(),
        stage: a.stage,
        state,
        words,
        since,
        blocks,
    }
}

/// Each stage's bar (index: the stage), from the member lines.
pub fn stage_bars(s: &RolloutStatus, lines: &[MemberLine]) -> Vec<StageBar> {
    let mut bars = vec![StageBar::default(); s.stages.max(1)];
    for l in lines {
        let Some(bar) = l.stage.and_then(|k| bars.get_mut(k as usize)) else {
            continue;
        };
        bar.members += 1;
        match l.state {
            MemberState::Holds => bar.holds += 1,
            MemberState::Staged => bar.staged += 1,
            MemberState::Refused(_) => bar.refused += 1,
            MemberState::Skipped => bar.skipped += 1,
            _ => bar.pending += 1,
        }
    }
    bars
}

/// How much of the current stage's soak is left at `now` (`None`: the
/// soak has not started, because a member does not hold the version yet,
/// or the rollout is not running).
pub fn soak_left(s: &RolloutStatus, now: RefTime) -> Option<Duration> {
    if s.row.state != RolloutState::Running {
        return None;
    }
    let from = s.row.soak_from?;
    let gone = u64::try_from(now.as_nanos().saturating_sub(from.as_nanos())).unwrap_or(0);
    Some(s.spec.soak.saturating_sub(Duration::from_nanos(gone)))
}

/// Every gate that is on, beside the cohort's figure (and the baseline's,
/// with `compare: baseline`).
pub fn gates(s: &RolloutStatus) -> Vec<Gate> {
    let g = &s.spec.abort_if;
    let c = &s.cohort;
    let base = s
        .baseline
        .as_ref()
        .filter(|_| s.spec.compare == Compare::Baseline);
    let mut out = Vec::new();
    if let Some(p) = g.failed_percent {
        out.push(Gate {
            name: "failed firings",
            fails_above: format!("{p}%"),
            now: format!(
                "{:.1}% ({} of {} settled)",
                c.failed_percent(),
                c.failed,
                c.settled
            ),
            crossed: c.failed_percent() > p,
        });
    }
    if let Some(n) = g.unknown {
        out.push(Gate {
            name: "unknown outcomes",
            fails_above: n.to_string(),
            now: c.unknown.to_string(),
            crossed: c.unknown > n,
        });
    }
    let relative = |limit: Duration, now: Option<i64>, then: Option<i64>| {
        let limit = i64::try_from(limit.as_nanos()).unwrap_or(i64::MAX);
        match (now, base.map(|_| then.unwrap_or(0))) {
            (None, _) => ("no firing yet".to_string(), span(limit), false),
            (Some(n), None) => (span(n), span(limit), n > limit),
            (Some(n), Some(b)) => (
                format!("{} (baseline {})", span(n), span(b)),
                format!("baseline + {}", span(limit)),
                n > b.saturating_add(limit),
            ),
        }
    };
    if let Some(l) = g.lateness_p99 {
        let (now, fails_above, crossed) = relative(
            l,
            c.lateness_p99.map(|d| d.nanos()),
            base.and_then(|b| b.lateness_p99).map(|d| d.nanos()),
        );
        out.push(Gate {
            name: "lateness p99",
            fails_above,
            now,
            crossed,
        });
    }
    if let Some(o) = g.offset {
        let (now, fails_above, crossed) = relative(
            o,
            c.offset_max.map(|d| d.nanos()),
            base.and_then(|b| b.offset_max).map(|d| d.nanos()),
        );
        out.push(Gate {
            name: "clock offset",
            fails_above,
            now,
            crossed,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_model::rollout::AgentView;
    use baton_model::time::span as dur;
    use baton_model::{CohortFigures, PackKey, RolloutRow};
    use baton_proto::pack::parse_pack;
    use std::sync::Arc;

    const PACK: &str = "tenant: t\npack: p\nversion: 3\ntargets: {agents: [a, b, c, d, e]}\nrollout:\n  stages: [{agents: 2}, {percent: 100}]\n  soak: 60s\n  activate: together\n  abort_if: {lateness_p99: 1ms}\ninstructions:\n  - {id: x, action: noop, every: 1s}\n";

    fn agent(id: &str, stage: Option<u32>, f: impl FnOnce(&mut AgentView)) -> RolloutAgent {
        let mut view = AgentView {
            id: id.into(),
            canary: false,
            connected: true,
            holds: false,
            refused: None,
            staged: false,
            clock_ok: true,
            last_seen: Some(RefTime::from_nanos(5)),
        };
        f(&mut view);
        RolloutAgent {
            view,
            stage,
            skipped: false,
            held: Some(2),
            since: Some(RefTime::from_nanos(7)),
        }
    }

    fn status(agents: Vec<RolloutAgent>, f: impl FnOnce(&mut RolloutRow)) -> RolloutStatus {
        let spec = parse_pack(PACK).expect("pack").rollout.expect("rollout");
        let mut row = RolloutRow::new(
            &PackKey::new("t", "p"),
            3,
            Default::default(),
            RefTime::from_nanos(1),
        );
        row.state = RolloutState::Running;
        row.together = true;
        f(&mut row);
        RolloutStatus {
            row,
            stages: 2,
            agents,
            cohort: CohortFigures::default(),
            baseline: None,
            spec: Arc::new(spec),
        }
    }

    #[test]
    fn each_member_says_where_it_stands_and_who_blocks_the_stage() {
        let s = status(
            vec![
                agent("a", Some(0), |v| v.holds = true),
                agent("b", Some(1), |v| v.connected = false),
                agent("c", Some(1), |v| v.clock_ok = false),
                agent("d", Some(1), |v| v.staged = true),
                agent("e", None, |_| {}),
            ],
            |r| r.stage = 1,
        );
        let lines = members(&s);
        let by = |id: &str| lines.iter().find(|l| l.id == id).expect("line");
        assert_eq!(by("a").state, MemberState::Holds);
        assert_eq!(by("a").words, "switched to v3");
        assert!(!by("a").blocks);
        assert_eq!(by("b").state, MemberState::Offline);
        assert!(by("b").blocks, "an offline member blocks its stage");
        assert_eq!(by("b").since, Some(RefTime::from_nanos(5)), "last seen");
        assert_eq!(by("c").state, MemberState::HeldBack);
        assert!(by("c").words.contains("1ms"), "{}", by("c").words);
        assert!(by("c").blocks);
        assert_eq!(by("d").state, MemberState::Staged);
        assert!(!by("d").blocks, "a staged member waits for the others");
        assert_eq!(by("e").state, MemberState::Outside);
        assert_eq!(by("e").words, "not admitted by a stage yet; holds v2");
        let bars = stage_bars(&s, &lines);
        assert_eq!(
            bars[1],
            StageBar {
                members: 3,
                staged: 1,
                pending: 2,
                ..StageBar::default()
            }
        );
        assert_eq!(bars[0].holds, 1);
    }

    #[test]
    fn a_named_instant_holds_back_only_whom_the_row_names() {
        let s = status(
            vec![
                agent("a", Some(0), |v| v.clock_ok = false),
                agent("b", Some(0), |v| v.staged = true),
            ],
            |r| {
                r.switch_at = Some(RefTime::from_nanos(2_000_000_000));
                r.held_back = vec!["b".into()];
            },
        );
        let lines = members(&s);
        // After the instant was named, a clock that went bad is not
        // "held back" (the instant did not hold it back): it waits.
        assert_eq!(lines[0].state, MemberState::Waiting);
        assert_eq!(lines[1].state, MemberState::HeldBack);
        assert!(lines[1].words.contains("stays on v2"), "{}", lines[1].words);
    }

    #[test]
    fn a_final_rollout_has_no_blocker_and_refusals_say_why() {
        let s = status(
            vec![agent("a", Some(0), |v| {
                v.refused = Some("bad line 12".into())
            })],
            |r| r.state = RolloutState::Aborted,
        );
        let lines = members(&s);
        assert_eq!(lines[0].state, MemberState::Refused("bad line 12".into()));
        assert_eq!(lines[0].words, "refused v3: bad line 12");
        assert!(!lines[0].blocks);
    }

    #[test]
    fn the_soak_counts_down_from_when_every_member_held_it() {
        let mut s = status(Vec::new(), |_| {});
        assert_eq!(soak_left(&s, RefTime::from_nanos(0)), None);
        s.row.soak_from = Some(RefTime::from_nanos(10_000_000_000));
        let at = |secs: i64| RefTime::from_nanos(secs * 1_000_000_000);
        assert_eq!(soak_left(&s, at(25)), Some(Duration::from_secs(45)));
        assert_eq!(soak_left(&s, at(200)), Some(Duration::ZERO));
        s.row.state = RolloutState::Paused;
        assert_eq!(soak_left(&s, at(25)), None);
    }

    #[test]
    fn gates_stand_beside_the_figures_they_judge() {
        let mut s = status(Vec::new(), |_| {});
        s.cohort = CohortFigures {
            settled: 40,
            failed: 2,
            lateness_p99: Some(dur(2_000_000)),
            ..CohortFigures::default()
        };
        let g = gates(&s);
        let names: Vec<&str> = g.iter().map(|g| g.name).collect();
        // abort_if names lateness only: the fail-closed defaults stay on.
        assert_eq!(
            names,
            ["failed firings", "unknown outcomes", "lateness p99"]
        );
        assert!(g[0].crossed && g[0].now.starts_with("5.0%"), "{:?}", g[0]);
        assert!(!g[1].crossed);
        assert!(g[2].crossed, "2 ms over 1 ms: {:?}", g[2]);
    }
}
