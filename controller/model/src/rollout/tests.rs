//! The rollout machine's rules, unit tests in the order of the module doc,
//! windows across Europe/Berlin's DST changes, then property tests driving
//! random fleets through random histories (time, acks, agents going
//! offline, firings, operators' pause, resume and abort).

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use crate::time::RefTime;

use crate::time;
use baton_proto::pack::rollout::{AbortIf, Compare, StageDeadline, StageShare};
use proptest::prelude::*;

use super::*;
use crate::records::PackKey;

const SEC: i64 = 1_000_000_000;

fn ts(s: &str) -> i64 {
    i64::try_from(s.parse::<jiff::Timestamp>().unwrap().as_nanosecond()).unwrap()
}

fn t0() -> i64 {
    ts("2026-01-01T00:00:00Z")
}

/// A pack's `rollout:` section, decoded; `body` is the section's lines.
fn spec(body: &str) -> Rollout {
    let mut text = String::from(
        "pack: p\nversion: 2\ninstructions:\n  - {id: a, action: noop, every: 1s}\nrollout:\n",
    );
    for line in body.lines() {
        text.push_str(&format!("  {line}\n"));
    }
    match baton_proto::pack::parse_pack(&text) {
        Ok(p) => p.rollout.unwrap(),
        Err(e) => panic!("{}", e.render("test.yaml")),
    }
}

fn agent(id: &str, canary: bool, connected: bool) -> AgentView {
    let (holds, refused) = (false, None);
    let id = id.to_string();
    AgentView {
        id,
        canary,
        connected,
        holds,
        refused,
        staged: false,
        clock_ok: true,
        last_seen: Some(RefTime::from_nanos(t0())),
    }
}

/// Connected agents `ids`, none a canary.
fn fleet(ids: &[&str]) -> Vec<AgentView> {
    ids.iter().map(|id| agent(id, false, true)).collect()
}

fn member(stage: u32) -> Member {
    Member {
        stage,
        skipped: false,
    }
}

/// A simulated fleet and store: the row as stored, what the driver
/// observes, the clock.
struct Sim {
    spec: Rollout,
    row: RolloutRow,
    fleet: Vec<AgentView>,
    cohort: CohortFigures,
    baseline: Option<CohortFigures>,
    t0: i64,
    now: i64,
}

impl Sim {
    fn new(spec: Rollout, fleet: Vec<AgentView>, t0: i64) -> Sim {
        let row = RolloutRow::new(
            &PackKey::new("t", "p"),
            2,
            crate::rollout_rows::Base {
                from: Some(1),
                ..Default::default()
            },
            RefTime::from_nanos(t0),
        );
        let (cohort, baseline) = (CohortFigures::default(), None);
        Sim {
            spec,
            row,
            fleet,
            cohort,
            baseline,
            t0,
            now: t0,
        }
    }

    /// One step at the current time, stored as the store would.
    fn step(&mut self) -> Step {
        // The figures count from the stage's start (`apply`), so all of
        // them are the stage's own unless a test says otherwise.
        let mut cohort = self.cohort.clone();
        if cohort.stage_settled == 0 {
            cohort.stage_settled = cohort.settled;
        }
        let obs = Observed {
            now: RefTime::from_nanos(self.now),
            targets: self.fleet.clone(),
            cohort,
            baseline: self.baseline.clone(),
        };
        let s = step(&self.spec, &self.row, &obs);
        self.apply(&s);
        s
    }

    /// One step `secs` after the start.
    fn at(&mut self, secs: i64) -> Step {
        self.now = self.t0 + secs * SEC;
        self.step()
    }

    /// The same, its decision stored and otherwise ignored.
    fn go(&mut self, secs: i64) {
        let _ = self.at(secs);
    }

    fn apply(&mut self, s: &Step) {
        let Some(next) = &s.next else { return };
        let mut next = next.clone();
        for (id, m) in &s.admit {
            next.members.insert(id.clone(), *m);
        }
        for id in &s.skip {
            if let Some(m) = next.members.get_mut(id) {
                m.skipped = true;
            }
        }
        next.rev = self.row.rev + 1;
        // The cohort's figures count from the stage's start.
        if next.stage_started.map(RefTime::as_nanos)
            != self.row.stage_started.map(RefTime::as_nanos)
        {
            self.cohort = CohortFigures::default();
        }
        self.row = next;
    }

    fn agent(&mut self, id: &str) -> &mut AgentView {
        self.fleet.iter_mut().find(|a| a.id == id).unwrap()
    }

    /// Agents ack the version (an offline or refusing one cannot).
    fn hold(&mut self, ids: &[&str]) {
        for id in ids {
            let a = self.agent(id);
            a.holds |= a.connected && a.refused.is_none();
        }
    }

    fn members(&self) -> Vec<&str> {
        self.row.members.keys().map(String::as_str).collect()
    }
}

/// A final rollout refuses every operator and no step changes it.
fn assert_frozen(sim: &mut Sim) {
    let (row, now) = (sim.row.clone(), sim.now);
    assert!(sim.row.state.is_final());
    assert!(pause(&row, "op", RefTime::from_nanos(now)).is_err());
    assert!(resume(&row, "op", RefTime::from_nanos(now)).is_err());
    assert!(abort(&sim.spec, &row, "op", RefTime::from_nanos(now)).is_err());
    assert_eq!(sim.at(10_000).next, None);
    assert_eq!(sim.row, row);
}

// ---- starting a stage --------------------------------------------------

#[test]
fn the_first_step_admits_canaries_then_connected_agents_then_by_id() {
    let agents = vec![
        agent("a", false, true),
        agent("b", true, false),
        agent("c", false, false),
        agent("d", true, true),
        agent("e", false, true),
    ];
    // 50% of 5, rounded up: 3.
    let mut sim = Sim::new(
        spec("stages: [{percent: 50}, {percent: 100}]"),
        agents.clone(),
        t0(),
    );
    let s = sim.step();
    let admitted: Vec<&str> = s.admit.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(admitted, ["d", "b", "a"]);
    assert!(s.admit.iter().all(|(_, m)| *m == member(0)));
    assert_eq!(sim.row.state, RolloutState::Running);
    assert_eq!(sim.row.stage_started.map(RefTime::as_nanos), Some(t0()));
    assert_eq!(sim.members(), ["a", "b", "d"]);
    // One agent: the connected canary.
    let mut sim = Sim::new(spec("stages: [{agents: 1}, {percent: 100}]"), agents, t0());
    assert_eq!(sim.step().admit, [("d".to_string(), member(0))]);
}

// ---- passing a stage ---------------------------------------------------

#[test]
fn a_stage_passes_only_when_all_hold_the_soak_from_the_last_ack_is_over_and_enough_settled() {
    let sp =
        spec("stages: [{agents: 1}, {percent: 50}, {percent: 100}]\nsoak: 10s\nmin_firings: 5");
    let mut sim = Sim::new(sp, fleet(&["a", "b", "c", "d"]), t0());
    assert_eq!(sim.at(0).admit.len(), 1);
    sim.cohort.settled = 5;
    assert_eq!(sim.at(30).next, None, "nobody holds: no soak, however long");
    sim.hold(&["a"]);
    // The ack seen at 40 starts the soak (not the stage's start at 0).
    sim.go(40);
    assert_eq!(
        sim.row.soak_from.map(RefTime::as_nanos),
        Some(t0() + 40 * SEC)
    );
    assert_eq!(sim.at(49).next, None, "soak not over 9s after the ack");
    sim.cohort.settled = 4;
    assert_eq!(sim.at(50).next, None, "4 settled firings of 5");
    sim.cohort.settled = 5;
    sim.go(50);
    assert_eq!(sim.row.verdicts[0].kind, VerdictKind::Pass);
    assert_eq!(
        (sim.row.stage, sim.row.stage_started.map(RefTime::as_nanos)),
        (1, None)
    );

    // The next step starts stage 2: up to 50% of 4, one more, by id.
    assert_eq!(sim.at(51).admit, [("b".to_string(), member(1))]);
    sim.hold(&["b"]);
    sim.cohort.settled = 5;
    sim.go(52);
    sim.go(62);
    assert_eq!(sim.row.stage, 2);
    sim.go(63);
    assert_eq!(sim.members(), ["a", "b", "c", "d"]);
    sim.hold(&["c"]);
    sim.cohort.settled = 9;
    sim.go(100);
    assert_eq!(sim.row.state, RolloutState::Running, "d does not hold");
    sim.hold(&["d"]);
    sim.go(101);
    sim.go(111);
    assert_eq!(sim.row.state, RolloutState::Completed);
    let kinds: Vec<_> = sim.row.verdicts.iter().map(|v| (v.stage, v.kind)).collect();
    assert_eq!(kinds, [0, 1, 2].map(|i| (i, VerdictKind::Pass)));
    assert_frozen(&mut sim);
}

// ---- failing a stage ---------------------------------------------------

#[test]
fn a_refusal_aborts_with_a_fail_verdict_and_a_rollback_or_the_safe_state() {
    assert_eq!(spec("stages: [{percent: 100}]").on_abort, OnAbort::Rollback);
    for (on_abort, effect) in [
        ("rollback", Effect::Rollback),
        ("safe_state", Effect::Withdraw),
    ] {
        let sp = spec(&format!("stages: [{{percent: 100}}]\non_abort: {on_abort}"));
        let mut sim = Sim::new(sp, fleet(&["a", "b"]), t0());
        sim.go(0);
        sim.hold(&["a"]);
        sim.agent("b").refused = Some("unknown action".into());
        assert_eq!(sim.at(1).effect, Some(effect));
        assert_eq!(sim.row.state, RolloutState::Aborted);
        let v = sim.row.verdicts.last().unwrap();
        assert_eq!(v.kind, VerdictKind::Fail);
        assert!(v.reason.contains("agent b refused"), "{}", v.reason);
        assert_eq!(v.missing, ["b"]);
        assert_frozen(&mut sim);
    }
}

#[test]
fn failed_percent_and_unknown_abort_at_any_time_lateness_only_once_min_firings_settled() {
    let sp = spec(
        "stages: [{percent: 100}]\nsoak: 1h\nmin_firings: 50\nabort_if: {failed_percent: 10, unknown: 2, lateness_p99: 2s}",
    );
    // The reason, if the stage aborts on these figures.
    let aborts = |f: &dyn Fn(&mut CohortFigures)| {
        let mut sim = Sim::new(sp.clone(), fleet(&["a"]), t0());
        sim.go(0);
        f(&mut sim.cohort);
        let s = sim.at(1);
        assert_eq!(s.effect.is_some(), sim.row.state == RolloutState::Aborted);
        s.effect.map(|_| sim.row.reason.clone())
    };
    let none = |f: &dyn Fn(&mut CohortFigures)| assert_eq!(aborts(f), None);
    let some = |f: &dyn Fn(&mut CohortFigures), what: &str| {
        let why = aborts(f).unwrap();
        assert!(why.contains(what), "{why}");
    };
    // 10% of 10 settled (far below min_firings) is not above 10%; 20% is.
    none(&|c| (c.settled, c.failed) = (10, 1));
    some(&|c| (c.settled, c.failed) = (10, 2), "failed_percent");
    none(&|c| (c.settled, c.unknown) = (3, 2));
    some(&|c| (c.settled, c.unknown) = (3, 3), "unknown");
    // A late p99 of 49 settled firings is not judged; of 50 it is.
    none(&|c| (c.settled, c.lateness_p99) = (49, Some(time::span(10 * SEC))));
    some(
        &|c| (c.settled, c.lateness_p99) = (50, Some(time::span(10 * SEC))),
        "lateness p99",
    );
}

/// Issue 37's case: `abort_if` naming only lateness over a version whose
/// firings fail. Stage 1 "passed" with 3 of 4 settled firings failed and
/// the version went to every agent; the keys not named keep failing
/// closed now, and only `off` lets failures through.
#[test]
fn an_abort_if_naming_some_keys_keeps_the_fail_closed_default_for_the_others() {
    let run = |abort_if: &str| {
        let sp = spec(&format!(
            "stages: [{{agents: 1}}, {{percent: 100}}]\nsoak: 1s\nmin_firings: 4\nabort_if: {abort_if}"
        ));
        let mut sim = Sim::new(sp, fleet(&["a", "b"]), t0());
        sim.go(0);
        (sim.cohort.settled, sim.cohort.failed) = (4, 3);
        sim.go(1);
        sim.go(3);
        (sim.row.state, sim.row.reason.clone())
    };
    let (state, why) = run("{lateness_p99: 1s}");
    assert_eq!(state, RolloutState::Aborted, "{why}");
    assert!(why.contains("above failed_percent 0%"), "{why}");
    let (state, why) = run("{lateness_p99: 1s, failed_percent: off}");
    assert_ne!(state, RolloutState::Aborted, "{why}");
}

#[test]
fn with_compare_baseline_lateness_is_judged_against_the_baselines_p99() {
    let sp = spec(
        "stages: [{percent: 100}]\nsoak: 10s\nmin_firings: 5\ncompare: baseline\nabort_if: {lateness_p99: 2s}",
    );
    let late = |p99: i64| CohortFigures {
        settled: 5,
        lateness_p99: Some(time::span(p99)),
        ..Default::default()
    };
    let run = |base: Option<i64>| {
        let mut sim = Sim::new(sp.clone(), fleet(&["a"]), t0());
        sim.go(0);
        sim.hold(&["a"]);
        (sim.cohort, sim.baseline) = (late(10 * SEC), base.map(late));
        sim.go(1);
        sim.go(11);
        sim.row
    };
    // As late as the baseline, or 2s later: passes, the baseline recorded.
    for base in [10 * SEC, 8 * SEC] {
        let row = run(Some(base));
        assert_eq!(row.state, RolloutState::Completed);
        assert_eq!(row.verdicts[0].kind, VerdictKind::Pass);
        assert_eq!(row.verdicts[0].baseline, Some(late(base)));
    }
    // 3s later than the baseline: fails.
    let row = run(Some(7 * SEC));
    assert_eq!(row.state, RolloutState::Aborted);
    assert!(row.reason.contains("baseline"), "{}", row.reason);
    // No baseline: absolute, 10s > 2s.
    assert_eq!(run(None).state, RolloutState::Aborted);
}

// ---- the deadline ------------------------------------------------------

/// a holds, b is offline and never does; 5 firings settled.
fn offline_b(then: &str, min_firings: u64) -> Sim {
    let sp = spec(&format!(
        "stages: [{{percent: 100}}]\nsoak: 10s\nmin_firings: {min_firings}\nstage_deadline: {{after: 60s, then: {then}}}"
    ));
    let mut sim = Sim::new(
        sp,
        vec![agent("a", false, true), agent("b", false, false)],
        t0(),
    );
    sim.go(0);
    sim.hold(&["a", "b"]);
    sim.cohort.settled = 5;
    sim
}

#[test]
fn an_offline_member_at_the_deadline_is_inconclusive_and_pauses_until_resumed() {
    let mut sim = offline_b("pause", 5);
    assert_eq!(sim.at(59).next, None);
    sim.go(60);
    assert_eq!(sim.row.state, RolloutState::Paused);
    let v = sim.row.verdicts.last().unwrap();
    assert_eq!(
        (v.kind, &v.missing[..]),
        (VerdictKind::Inconclusive, &["b".to_string()][..])
    );
    assert!(
        v.reason
            .contains("missing, not on the version or offline (1 offline): b"),
        "{}",
        v.reason
    );
    assert_eq!(sim.at(500).next, None, "paused does not move");
    // A resume runs again, its deadline counted from the resume.
    sim.apply(&resume(&sim.row, "op", RefTime::from_nanos(sim.now)).unwrap());
    assert_eq!(sim.row.state, RolloutState::Running);
    assert_eq!(sim.at(559).next, None);
    sim.go(560);
    assert_eq!(
        (sim.row.state, sim.row.verdicts.len()),
        (RolloutState::Paused, 2)
    );
}

#[test]
fn the_deadline_with_then_abort_aborts_for_good() {
    let mut sim = offline_b("abort", 5);
    assert_eq!(sim.at(60).effect, Some(Effect::Rollback));
    assert_eq!(sim.row.state, RolloutState::Aborted);
    assert_eq!(sim.row.verdicts[0].kind, VerdictKind::Inconclusive);
    let err = resume(&sim.row, "op", RefTime::from_nanos(sim.now)).unwrap_err();
    assert!(err.contains("an abort is final"), "{err}");
    assert_frozen(&mut sim);
}

#[test]
fn skip_offline_leaves_the_offline_member_out_and_the_stage_passes_on_the_others() {
    let mut sim = offline_b("skip_offline", 5);
    assert_eq!(sim.at(60).skip, ["b"]);
    assert!(sim.row.members["b"].skipped && !sim.row.members["a"].skipped);
    assert_eq!(sim.row.state, RolloutState::Running);
    assert_eq!(sim.row.verdicts[0].kind, VerdictKind::Inconclusive);
    sim.go(61);
    sim.go(71);
    assert_eq!(sim.row.state, RolloutState::Completed);
    let pass = sim.row.verdicts.last().unwrap();
    assert_eq!(pass.kind, VerdictKind::Pass);
    assert!(pass.missing.is_empty());
}

#[test]
fn a_second_deadline_after_skip_offline_pauses_when_still_undecided() {
    let mut sim = offline_b("skip_offline", 50);
    assert_eq!(sim.at(60).skip, ["b"]);
    sim.go(61);
    assert_eq!(sim.at(119).next, None);
    assert!(sim.at(120).skip.is_empty());
    assert_eq!(sim.row.state, RolloutState::Paused);
    assert!(
        sim.row.reason.contains("5 settled firing(s), 50 needed"),
        "{}",
        sim.row.reason
    );
    assert_eq!(sim.row.verdicts.len(), 2);
}

#[test]
fn operators_pause_and_resume_a_moving_rollout_and_abort_one_not_over() {
    let sp = spec("stages: [{percent: 100}]\nsoak: 0s");
    let mut sim = Sim::new(sp.clone(), fleet(&["a"]), t0());
    sim.go(0);
    assert!(
        resume(&sim.row, "op", RefTime::from_nanos(sim.now)).is_err(),
        "running is not paused"
    );
    sim.apply(&pause(&sim.row, "look", RefTime::from_nanos(sim.now)).unwrap());
    assert_eq!(sim.row.state, RolloutState::Paused);
    assert!(pause(&sim.row, "again", RefTime::from_nanos(sim.now)).is_err());
    sim.hold(&["a"]);
    sim.cohort.settled = 1;
    assert_eq!(sim.at(100).next, None, "paused does not move");
    // An abort of a paused rollout is allowed, and final.
    let s = abort(&sp, &sim.row, "bad", RefTime::from_nanos(sim.now)).unwrap();
    assert_eq!(s.effect, Some(Effect::Rollback));
    let mut aborted = Sim {
        row: s.next.unwrap(),
        ..Sim::new(sp.clone(), fleet(&["a"]), t0())
    };
    assert_eq!(aborted.row.state, RolloutState::Aborted);
    assert_frozen(&mut aborted);
    // Resumed, it completes; a superseded one is frozen too.
    sim.apply(&resume(&sim.row, "op", RefTime::from_nanos(sim.now)).unwrap());
    sim.go(101);
    sim.go(102);
    assert_eq!(sim.row.state, RolloutState::Completed);
    assert_frozen(&mut sim);
    sim.row.state = RolloutState::Superseded;
    assert_frozen(&mut sim);
}

// ---- windows -----------------------------------------------------------

fn berlin() -> Rollout {
    spec(
        "stages: [{percent: 100}]\nwindows: [{cron: \"0 0 2 * * *\", duration: 1h, tz: Europe/Berlin}]",
    )
}

/// Whether a first step at each UTC instant admits and runs, or waits.
fn assert_opens(cases: &[(&str, bool)]) {
    for &(utc, open) in cases {
        let mut sim = Sim::new(berlin(), fleet(&["a", "b"]), ts(utc));
        assert_eq!(sim.step().admit.len(), if open { 2 } else { 0 }, "at {utc}");
        let state = [RolloutState::WaitingWindow, RolloutState::Running][usize::from(open)];
        assert_eq!(sim.row.state, state, "at {utc}");
    }
}

/// The opening of the window `utc` lies in.
fn opened(utc: &str) -> Option<i64> {
    let at = utc.parse::<jiff::Timestamp>().unwrap();
    let w = &berlin().windows[0];
    w.open_since(at)
        .map(|t| i64::try_from(t.as_nanosecond()).unwrap())
}

#[test]
fn outside_a_window_a_stage_waits_and_admits_nobody() {
    // Winter: 02:00-03:00 CET is 01:00-02:00 UTC.
    assert_opens(&[
        ("2026-12-01T00:59:59Z", false),
        ("2026-12-01T01:30:00Z", true),
        ("2026-12-01T02:00:00Z", false),
    ]);
    // A running rollout whose next stage is outside a window waits.
    let mut sp = berlin();
    (sp.stages, sp.soak) = (
        vec![StageShare::Agents(1), StageShare::Percent(100.0)],
        Default::default(),
    );
    let mut sim = Sim::new(sp, fleet(&["a", "b"]), ts("2026-12-01T01:30:00Z"));
    sim.go(0);
    sim.hold(&["a"]);
    sim.cohort.settled = 1;
    sim.go(1);
    assert_eq!(sim.row.stage, 1);
    sim.now = ts("2026-12-01T02:00:00Z");
    assert!(sim.step().admit.is_empty());
    assert_eq!(
        (sim.row.state, sim.members()),
        (RolloutState::WaitingWindow, vec!["a"])
    );
    sim.now = ts("2026-12-02T01:00:00Z");
    assert_eq!(sim.step().admit, [("b".to_string(), member(1))]);
    assert_eq!(sim.row.state, RolloutState::Running);
}

#[test]
fn on_the_spring_forward_day_the_window_opens_at_03_00_cest_which_is_01_00_utc() {
    // 2026-03-29: 02:00 Berlin does not exist; the project's rule fires it
    // at the offset before the gap: 03:00 CEST.
    let open = ts("2026-03-29T01:00:00Z");
    assert_eq!(opened("2026-03-29T01:00:00Z"), Some(open));
    assert_eq!(opened("2026-03-29T01:59:59Z"), Some(open));
    assert_eq!(opened("2026-03-29T02:00:00Z"), None);
    assert_opens(&[
        ("2026-03-29T00:00:00Z", false),
        ("2026-03-29T00:59:59Z", false),
        ("2026-03-29T01:00:00Z", true),
        ("2026-03-29T01:59:59Z", true),
        ("2026-03-29T02:00:00Z", false),
        // The day after: 02:00 CEST is 00:00 UTC.
        ("2026-03-30T00:30:00Z", true),
    ]);
}

#[test]
fn on_the_fall_back_day_the_window_opens_once_at_02_00_cest_which_is_00_00_utc() {
    // 2026-10-25: 02:00-03:00 Berlin happens twice; a fixed hour fires on
    // the first pass only (02:00 CEST), not again at 02:00 CET (01:00 UTC).
    let open = ts("2026-10-25T00:00:00Z");
    assert_eq!(opened("2026-10-25T00:00:00Z"), Some(open));
    assert_eq!(opened("2026-10-25T00:59:59Z"), Some(open));
    assert_eq!(opened("2026-10-25T01:30:00Z"), None);
    assert_opens(&[
        ("2026-10-24T23:59:59Z", false),
        ("2026-10-25T00:00:00Z", true),
        ("2026-10-25T00:59:59Z", true),
        ("2026-10-25T01:00:00Z", false),
        ("2026-10-25T01:30:00Z", false),
        // The day after: 02:00 CET is 01:00 UTC.
        ("2026-10-26T00:30:00Z", false),
        ("2026-10-26T01:30:00Z", true),
    ]);
}

// ---- properties --------------------------------------------------------

#[derive(Clone, Debug)]
enum Ev {
    /// Seconds pass.
    Advance(u16),
    /// A member (by index among the members) acks, if it can.
    Hold(usize),
    /// Every member that can acks.
    HoldAll,
    /// An agent (by index) goes offline or comes back.
    Flip(usize),
    /// Firings settle: ok, failed, unknown.
    Settle(u8, u8, u8),
    /// The cohort's lateness p99 is now this many seconds.
    Late(u8),
    /// A member that does not hold the version refuses it.
    Refuse(usize),
    Pause,
    Resume,
    Abort,
}

fn events() -> impl Strategy<Value = Vec<Ev>> {
    let bit = |p| prop::bool::weighted(p).prop_map(u8::from);
    let ev = prop_oneof![
        90 => (0u16..40).prop_map(Ev::Advance),
        60 => any::<usize>().prop_map(Ev::Hold),
        15 => Just(Ev::HoldAll),
        24 => any::<usize>().prop_map(Ev::Flip),
        75 => (0u8..6, bit(0.15), bit(0.1)).prop_map(|(o, f, u)| Ev::Settle(o, f, u)),
        6 => (0u8..8).prop_map(Ev::Late),
        1 => any::<usize>().prop_map(Ev::Refuse),
        4 => Just(Ev::Pause),
        12 => Just(Ev::Resume),
        1 => Just(Ev::Abort),
    ];
    prop::collection::vec(ev, 0..160)
}

/// Cumulative stages for `n` targets: an optional agent count (at most
/// the first percentage's share), percentages in tenths, then 100%.
fn cumulative(lead: Option<u64>, mut tenths: Vec<u32>, n: u64) -> Vec<StageShare> {
    tenths.sort_unstable();
    let mut out: Vec<_> = tenths
        .iter()
        .map(|t| StageShare::Percent(f64::from(*t) / 10.0))
        .collect();
    out.push(StageShare::Percent(100.0));
    if let Some(k) = lead {
        out.insert(0, StageShare::Agents(k.min(out[0].of(n)).max(1)));
    }
    out
}

/// A spec with random soak, min_firings, thresholds, compare, deadline and
/// on_abort (its stages are set once the fleet is known).
fn specs() -> impl Strategy<Value = Rollout> {
    use prop::option::of;
    use prop::sample::select;
    let secs = std::time::Duration::from_secs;
    let then = vec![
        DeadlineAction::Pause,
        DeadlineAction::Abort,
        DeadlineAction::SkipOffline,
    ];
    let abort_if = (of(5u8..=100), of(2u64..20), of(1u64..10)).prop_map(move |(f, u, l)| AbortIf {
        failed_percent: f.map(f64::from),
        unknown: u,
        lateness_p99: l.map(secs),
        offset: None,
    });
    let deadline = of((10u64..200, select(then))).prop_map(move |d| {
        d.map(|(after, then)| StageDeadline {
            after: secs(after),
            then,
        })
    });
    let compare = select(vec![Compare::Absolute, Compare::Baseline]);
    let on_abort = select(vec![OnAbort::Rollback, OnAbort::SafeState]);
    (0u64..60, 0u64..8, abort_if, compare, deadline, on_abort).prop_map(
        move |(soak, min_firings, abort_if, compare, stage_deadline, on_abort)| Rollout {
            soak: secs(soak),
            min_firings,
            abort_if,
            compare,
            stage_deadline,
            on_abort,
            ..spec("stages: [{percent: 100}]")
        },
    )
}

/// Drives `events` through the machine (a step after each), checking the
/// invariants after every step.
fn drive(sim: &mut Sim, events: &[Ev]) -> Result<(), TestCaseError> {
    let n = sim.fleet.len() as u64;
    for ev in events {
        let before = sim.row.clone();
        let members: Vec<String> = sim.row.members.keys().cloned().collect();
        let pick = |i: usize| members.get(i % members.len().max(1)).cloned();
        match ev {
            Ev::Advance(s) => sim.now += i64::from(*s) * SEC,
            Ev::Hold(i) => {
                if let Some(id) = pick(*i) {
                    sim.hold(&[&id]);
                }
            }
            Ev::HoldAll => {
                let ids: Vec<&str> = members.iter().map(String::as_str).collect();
                sim.hold(&ids);
            }
            Ev::Flip(i) => {
                let a = &mut sim.fleet[i % n as usize];
                a.connected = !a.connected;
            }
            Ev::Settle(ok, failed, unknown) => {
                let c = &mut sim.cohort;
                c.settled += u64::from(ok + failed + unknown);
                c.failed += u64::from(*failed);
                c.unknown += u64::from(*unknown);
            }
            Ev::Late(s) => sim.cohort.lateness_p99 = Some(time::span(i64::from(*s) * SEC)),
            Ev::Refuse(i) => {
                if let Some(a) = pick(*i).map(|id| sim.agent(&id))
                    && !a.holds
                {
                    a.refused = Some("no".into());
                }
            }
            Ev::Pause | Ev::Resume | Ev::Abort => {
                let (st, now) = (sim.row.state, sim.now);
                let (r, allowed) = match ev {
                    Ev::Pause => (
                        pause(&sim.row, "op", RefTime::from_nanos(now)),
                        st.is_moving(),
                    ),
                    Ev::Resume => (
                        resume(&sim.row, "op", RefTime::from_nanos(now)),
                        st == RolloutState::Paused,
                    ),
                    _ => (
                        abort(&sim.spec, &sim.row, "op", RefTime::from_nanos(now)),
                        !st.is_final(),
                    ),
                };
                prop_assert_eq!(r.is_ok(), allowed, "{:?} on {:?}", ev, st);
                if let Ok(s) = r {
                    prop_assert_eq!(s.effect.is_some(), matches!(ev, Ev::Abort));
                    sim.apply(&s);
                }
            }
        }
        let s = sim.step();
        // (b) final is final: no step, no event, changes anything.
        if before.state.is_final() {
            prop_assert!(s.next.is_none() && s.admit.is_empty() && s.skip.is_empty());
            prop_assert_eq!(&sim.row, &before);
        }
        if sim.row.state == RolloutState::Aborted {
            prop_assert!(resume(&sim.row, "op", RefTime::from_nanos(sim.now)).is_err());
        }
        // (a) the cohort never exceeds the current stage's share.
        let share = share(&sim.spec, sim.row.stage, n);
        let cohort = sim
            .fleet
            .iter()
            .filter(|a| sim.row.members.contains_key(&a.id))
            .count();
        prop_assert!(
            cohort as u64 <= share,
            "{} members, stage {} of {}",
            cohort,
            sim.row.stage,
            share
        );
        prop_assert!(
            sim.row.verdicts.starts_with(&before.verdicts),
            "verdicts only grow"
        );
        for v in &sim.row.verdicts[before.verdicts.len()..] {
            if v.kind != VerdictKind::Pass {
                continue;
            }
            // (c) offline never passes: every member judged holds.
            prop_assert!(v.missing.is_empty(), "a pass with missing {:?}", v.missing);
            for (id, m) in sim.row.members.iter().filter(|(_, m)| !m.skipped) {
                let holds = sim.fleet.iter().any(|a| a.id == *id && a.holds);
                prop_assert!(
                    m.stage > v.stage || holds,
                    "{} passed stage {} unheld",
                    id,
                    v.stage
                );
            }
            // (d) never on fewer than min_firings.
            prop_assert!(v.cohort.settled >= sim.spec.min_firings);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1_000))]

    #[test]
    fn random_histories_keep_the_rollout_rules(
        flags in prop::collection::vec((any::<bool>(), prop::bool::weighted(0.8)), 1..60),
        lead in prop::option::of(1u64..6),
        tenths in prop::collection::vec(1u32..=1000, 0..4),
        mut sp in specs(),
        base in prop::option::of(0i64..8),
        evs in events(),
    ) {
        let agents: Vec<AgentView> = flags
            .iter()
            .enumerate()
            .map(|(i, (canary, connected))| agent(&format!("a{i:02}"), *canary, *connected))
            .collect();
        sp.stages = cumulative(lead, tenths, agents.len() as u64);
        let mut sim = Sim::new(sp, agents, t0());
        sim.baseline = base.map(|s| CohortFigures {
            settled: 10,
            lateness_p99: Some(time::span(s * SEC)),
            ..Default::default()
        });
        drive(&mut sim, &evs)?;
    }

    /// Whatever came before, an abort is final.
    #[test]
    fn after_an_abort_nothing_changes_the_rollout(
        n in 1usize..20,
        evs in events(),
        after in events(),
    ) {
        let sp = spec("stages: [{agents: 1}, {percent: 50}, {percent: 100}]\nsoak: 5s\nmin_firings: 2");
        let agents = (0..n).map(|i| agent(&format!("a{i:02}"), i % 3 == 0, true)).collect();
        let mut sim = Sim::new(sp, agents, t0());
        drive(&mut sim, &evs)?;
        if let Ok(s) = abort(&sim.spec, &sim.row, "op", RefTime::from_nanos(sim.now)) {
            sim.apply(&s);
        }
        prop_assert!(sim.row.state.is_final());
        let frozen = sim.row.clone();
        drive(&mut sim, &after)?;
        prop_assert_eq!(&sim.row, &frozen);
        prop_assert!(resume(&sim.row, "op", RefTime::from_nanos(sim.now)).is_err());
    }
}

/// `activate: together`: no instant while a member has not staged the
/// version; once all did, one instant `SWITCH_LEAD` ahead, with members
/// whose clock is not certain enough held back (never switched: missing,
/// so the stage cannot pass on them); the next stage names its own.
#[test]
fn a_together_stage_names_one_instant_once_every_member_staged() {
    let spec =
        spec("stages: [{agents: 2}, {percent: 100}]\nsoak: 1s\nmin_firings: 1\nactivate: together");
    let mut sim = Sim::new(spec, fleet(&["a", "b", "c"]), 0);
    sim.go(0);
    assert_eq!(sim.members(), ["a", "b"]);
    assert!(sim.row.together);
    sim.agent("a").staged = true;
    sim.go(1);
    assert_eq!(
        sim.row.switch_at.map(RefTime::as_nanos),
        None,
        "b has not staged yet"
    );
    sim.agent("b").staged = true;
    sim.agent("b").clock_ok = false;
    let s = sim.at(2);
    let at = 2 * SEC + i64::try_from(SWITCH_LEAD.as_nanos()).unwrap();
    assert_eq!(sim.row.switch_at.map(RefTime::as_nanos), Some(at));
    assert_eq!(sim.row.held_back, ["b"]);
    assert!(
        s.said
            .iter()
            .any(|l| l.contains("1 agent(s) switch together")
                && l.contains("held back, their clock less certain than max_uncertainty: b")),
        "{:?}",
        s.said
    );
    // The instant stays; a switches, b (held back) never does: no pass.
    sim.hold(&["a"]);
    sim.cohort.settled = 10;
    sim.go(10);
    assert_eq!(sim.row.switch_at.map(RefTime::as_nanos), Some(at));
    assert_eq!(sim.row.stage, 0, "b is missing");
    assert!(sim.row.verdicts.is_empty());
    // b's clock recovers and it is switched by hand (an operator's
    // resume does not name a new instant): the stage passes, and the next
    // stage starts with no instant until its new member staged.
    sim.hold(&["b"]);
    sim.go(12);
    assert!(sim.row.verdicts.is_empty(), "the soak starts now");
    sim.go(13);
    assert_eq!(sim.row.verdicts.len(), 1);
    assert_eq!(sim.row.stage, 1);
    assert_eq!(
        (
            sim.row.switch_at.map(RefTime::as_nanos),
            sim.row.held_back.len()
        ),
        (None, 0)
    );
    sim.go(14);
    assert_eq!(sim.members(), ["a", "b", "c"]);
    assert_eq!(
        sim.row.switch_at.map(RefTime::as_nanos),
        None,
        "c has not staged yet"
    );
    sim.agent("c").staged = true;
    sim.go(15);
    let lead = i64::try_from(SWITCH_LEAD.as_nanos()).unwrap();
    assert_eq!(
        sim.row.switch_at.map(RefTime::as_nanos),
        Some(15 * SEC + lead)
    );
}

/// A member held back at the instant gets another once an operator
/// resumes the stage (its clock recovered); an aborted together rollout
/// sends its rollback at once, never at an instant.
#[test]
fn a_resume_names_a_new_instant_for_held_back_members_and_an_abort_is_not_staged() {
    let spec = spec("stages: [{percent: 100}]\nsoak: 1s\nactivate: together");
    let mut sim = Sim::new(spec, fleet(&["a", "b"]), 0);
    sim.go(0);
    sim.agent("a").staged = true;
    sim.agent("b").staged = true;
    sim.agent("b").clock_ok = false;
    sim.go(1);
    assert_eq!(sim.row.held_back, ["b"]);
    sim.hold(&["a"]);
    sim.go(5);
    assert_eq!(sim.row.state, RolloutState::Running, "b is given time");
    // SWITCH_SETTLE after the instant (3 s), b still behind: the stage is
    // inconclusive and, without a deadline, paused for an operator.
    sim.go(14);
    assert_eq!(sim.row.state, RolloutState::Paused);
    assert!(sim.row.reason.contains("not switched") && sim.row.reason.contains('b'));
    let last = sim.row.verdicts.last().unwrap();
    assert_eq!(last.kind, VerdictKind::Inconclusive);
    sim.agent("b").clock_ok = true;
    let resumed = resume(&sim.row, "op", RefTime::from_nanos(15 * SEC)).unwrap();
    sim.apply(&resumed);
    assert_eq!(
        (
            sim.row.switch_at.map(RefTime::as_nanos),
            sim.row.held_back.len()
        ),
        (None, 0)
    );
    sim.go(16);
    let lead = i64::try_from(SWITCH_LEAD.as_nanos()).unwrap();
    assert_eq!(
        sim.row.switch_at.map(RefTime::as_nanos),
        Some(16 * SEC + lead),
        "b's own instant"
    );
    assert!(sim.row.held_back.is_empty());
    let gate = sim.row.gate(false).unwrap();
    assert!(gate.together && gate.switch_at.is_some());
    let aborted = abort(&sim.spec, &sim.row, "op", RefTime::from_nanos(17 * SEC)).unwrap();
    sim.apply(&aborted);
    let gate = sim.row.gate(false).unwrap();
    assert_eq!(
        (
            gate.together,
            gate.switch_at.map(RefTime::as_nanos),
            gate.held_back.len()
        ),
        (false, None, 0),
        "a rollback goes on arrival"
    );
}

/// Issue 37: a member whose link is cut across the instant may have
/// switched exactly on time; the stage used to pause "not switched" at
/// SWITCH_SETTLE and stay paused after the member came back holding the
/// version. Now it waits for the member's word like any offline member:
/// its hello (holding the version) lets the stage go on by itself, and a
/// deadline that runs out first says what the controller knows.
#[test]
fn a_member_unheard_across_the_instant_settles_when_it_reports_the_version() {
    let together = "stages: [{percent: 100}]\nsoak: 1s\nactivate: together";
    let with_deadline = "stages: [{percent: 100}]\nsoak: 1s\nactivate: together\nstage_deadline: {after: 1m, then: pause}";
    // Members a and b, both staged at 0 s: the instant named at 1 s.
    let staged = |body: &str| {
        let mut sim = Sim::new(spec(body), fleet(&["a", "b"]), 0);
        sim.go(0);
        sim.agent("a").staged = true;
        sim.agent("b").staged = true;
        sim.go(1);
        assert!(sim.row.switch_at.is_some() && sim.row.held_back.is_empty());
        sim
    };
    // b's link is cut before the instant (last heard at 0.5 s); a
    // switches and says so; 30 s pass, far beyond SWITCH_SETTLE.
    let cut_off = |sim: &mut Sim| {
        sim.agent("b").connected = false;
        sim.agent("b").last_seen = Some(RefTime::from_nanos(SEC / 2));
        sim.hold(&["a"]);
        sim.cohort.settled = 5;
        sim.go(30);
        assert_eq!(sim.row.state, RolloutState::Running, "{}", sim.row.reason);
        assert!(sim.row.verdicts.is_empty());
    };

    let mut sim = staged(together);
    let at = sim.row.switch_at;
    cut_off(&mut sim);
    assert_eq!(sim.row.switch_at, at);
    // b is back, holding the version it switched to at the instant.
    sim.agent("b").connected = true;
    sim.hold(&["b"]);
    sim.go(31);
    sim.go(33);
    assert_eq!(sim.row.state, RolloutState::Completed, "{}", sim.row.reason);
    assert_eq!(sim.row.verdicts.last().unwrap().kind, VerdictKind::Pass);

    // With a deadline, and b never back: the pause says when b was last
    // heard from, not that it did not switch.
    let mut sim = staged(with_deadline);
    cut_off(&mut sim);
    sim.go(61);
    assert_eq!(sim.row.state, RolloutState::Paused);
    assert!(
        sim.row
            .reason
            .contains("no word from b since 1970-01-01T00:00:00.5"),
        "{}",
        sim.row.reason
    );
    assert!(
        !sim.row.reason.contains("not switched"),
        "{}",
        sim.row.reason
    );

    // A member that is connected and not on the version after the
    // instant (it refused, or restarted before it) is still judged at
    // SWITCH_SETTLE.
    let mut sim = staged(with_deadline);
    sim.hold(&["a"]);
    sim.go(14);
    assert_eq!(sim.row.state, RolloutState::Paused);
    assert!(
        sim.row.reason.contains("not switched"),
        "{}",
        sim.row.reason
    );
}
