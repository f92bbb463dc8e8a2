//! The `rollout:` section: what it accepts, its defaults, and a clear
//! error at its line for each way it can be wrong.

use std::time::Duration;

use baton_proto::pack::parse_pack;
use baton_proto::pack::rollout::*;

const HEAD: &str = "pack: p\nversion: 2\ntimezone: Europe/Berlin\ninstructions:\n  - {id: a, action: noop, every: 1s}\n";

fn with(rollout: &str) -> String {
    format!("{HEAD}rollout:\n{rollout}")
}

#[test]
fn the_issue_example_parses_with_every_field() {
    let p = parse_pack(&with(
        "  stages: [{agents: 1}, {percent: 10}, {percent: 100}]\n  soak: 10m\n  min_firings: 20\n  abort_if: {failed_percent: 2, unknown: 0, lateness_p99: 1ms, offset: 100us}\n  compare: baseline\n  stage_deadline: {after: 30m, then: skip_offline}\n  windows: [{cron: \"0 0 2 * * *\", duration: 2h, tz: America/New_York}]\n  activate: together\n  max_uncertainty: 200us\n  on_abort: safe_state\n",
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    let r = p.rollout.expect("rollout");
    assert_eq!(
        r.stages,
        vec![
            StageShare::Agents(1),
            StageShare::Percent(10.0),
            StageShare::Percent(100.0)
        ]
    );
    assert_eq!(r.soak, Duration::from_secs(600));
    assert_eq!(r.min_firings, 20);
    assert_eq!(
        r.abort_if,
        AbortIf {
            failed_percent: Some(2.0),
            unknown: Some(0),
            lateness_p99: Some(Duration::from_millis(1)),
            offset: Some(Duration::from_micros(100)),
        }
    );
    assert_eq!(r.compare, Compare::Baseline);
    assert_eq!(
        r.stage_deadline,
        Some(StageDeadline {
            after: Duration::from_secs(1800),
            then: DeadlineAction::SkipOffline
        })
    );
    assert_eq!(r.windows.len(), 1);
    assert_eq!(r.windows[0].tz_name, "America/New_York");
    assert_eq!(r.windows[0].duration, Duration::from_secs(7200));
    assert_eq!(r.activate, Activate::Together);
    assert_eq!(r.max_uncertainty, Duration::from_micros(200));
    assert_eq!(r.on_abort, OnAbort::SafeState);
}

#[test]
fn defaults_fill_what_is_not_written_and_windows_take_the_pack_zone() {
    let p = parse_pack(&with(
        "  stages: [{percent: 100}]\n  windows: [{cron: \"0 0 2 * * *\", duration: 1h}]\n",
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    let r = p.rollout.expect("rollout");
    assert_eq!(r.soak, DEFAULT_SOAK);
    assert_eq!(r.min_firings, DEFAULT_MIN_FIRINGS);
    assert_eq!(r.abort_if, DEFAULT_ABORT_IF);
    assert_eq!(r.compare, Compare::Absolute);
    assert_eq!(r.stage_deadline, None);
    assert_eq!(r.activate, Activate::OnArrival);
    assert_eq!(r.max_uncertainty, DEFAULT_MAX_UNCERTAINTY);
    assert_eq!(r.on_abort, OnAbort::Rollback);
    assert_eq!(r.windows[0].tz_name, "Europe/Berlin");
    assert!(parse_pack(HEAD).expect("plain").rollout.is_none());
}

/// Issue 37: naming one threshold used to turn the fail-closed defaults
/// off for the others (`abort_if: {lateness_p99: 1s}` let a version whose
/// every firing failed through). A key left out keeps its default; `off`
/// turns one off in so many words.
#[test]
fn keys_not_named_keep_the_fail_closed_defaults_and_off_is_explicit() {
    let parse = |abort_if: &str| {
        parse_pack(&with(&format!(
            "  stages: [{{percent: 100}}]\n  abort_if: {abort_if}\n"
        )))
        .unwrap_or_else(|e| panic!("{abort_if}: {e}"))
        .rollout
        .expect("rollout")
        .abort_if
    };
    assert_eq!(
        parse("{lateness_p99: 1s}"),
        AbortIf {
            lateness_p99: Some(Duration::from_secs(1)),
            ..DEFAULT_ABORT_IF
        }
    );
    assert_eq!(parse("{}"), DEFAULT_ABORT_IF);
    assert_eq!(
        parse("{failed_percent: off, offset: 2ms}"),
        AbortIf {
            failed_percent: None,
            unknown: Some(0),
            lateness_p99: None,
            offset: Some(Duration::from_millis(2)),
        }
    );
    let all_off = parse("{failed_percent: off, unknown: off, lateness_p99: off, offset: off}");
    assert_eq!(all_off, AbortIf::default());
    assert_eq!(
        parse("{lateness_p99: 1s}").describe(),
        "a stage fails on failed firings > 0%, unknown outcomes > 0, lateness p99 > 1s; off: offset"
    );
    assert_eq!(
        all_off.describe(),
        "nothing fails a stage; off: failed_percent, unknown, lateness_p99, offset"
    );
    // `off` is a word, not any string: a quoted one is a mistake like any other.
    let e = parse_pack(&with(
        "  stages: [{percent: 100}]\n  abort_if: {unknown: 'off'}\n",
    ))
    .expect_err("quoted off");
    assert!(
        e.to_string()
            .contains("rollout.abort_if.unknown must be a whole number"),
        "{e}"
    );
}

/// Each bad section gives one error, at its line and column, saying what
/// is wrong.
#[test]
fn each_mistake_is_reported_at_its_line() {
    let cases: &[(&str, (u32, u32), &str)] = &[
        (
            "  soak: 1m\n",
            (7, 3),
            "rollout is missing required key `stages`",
        ),
        ("  stages: []\n", (7, 11), "rollout.stages is empty"),
        (
            "  stages: [{percent: 10}]\n",
            (7, 12),
            "the last rollout stage must be `{percent: 100}`",
        ),
        (
            "  stages: [{percent: 50}, {percent: 10}, {percent: 100}]\n",
            (7, 27),
            "rollout.stages[1] is smaller than the stage before it",
        ),
        (
            "  stages: [{percent: 0}, {percent: 100}]\n",
            (7, 22),
            "rollout.stages[0].percent must be above 0 and at most 100",
        ),
        (
            "  stages: [{agents: 0}, {percent: 100}]\n",
            (7, 21),
            "rollout.stages[0].agents must be at least 1",
        ),
        (
            "  stages: [{agents: 1, percent: 5}, {percent: 100}]\n",
            (7, 12),
            "takes exactly one of `agents: N` or `percent: P`",
        ),
        (
            "  stages: [{percent: 100}]\n  abort_if: {failed: 2}\n",
            (8, 14),
            "unknown key `failed` in rollout.abort_if",
        ),
        (
            "  stages: [{percent: 100}]\n  abort_if: {failed_percent: 120}\n",
            (8, 30),
            "failed_percent must be within 0 and 100",
        ),
        (
            "  stages: [{percent: 100}]\n  min_firings: 0\n",
            (8, 16),
            "rollout.min_firings must be at least 1",
        ),
        (
            "  stages: [{percent: 100}]\n  compare: average\n",
            (8, 12),
            "rollout.compare must be one of absolute, baseline, found `average`",
        ),
        (
            "  stages: [{percent: 100}]\n  stage_deadline: {then: pause}\n",
            (8, 19),
            "rollout.stage_deadline is missing required key `after`",
        ),
        (
            "  stages: [{percent: 100}]\n  stage_deadline: {after: 5m, then: wait}\n",
            (8, 37),
            "rollout.stage_deadline.then must be one of pause, abort, skip_offline",
        ),
        (
            "  stages: [{percent: 100}]\n  windows: [{cron: \"0 0 25 * * *\", duration: 1h}]\n",
            (8, 25),
            "rollout.windows[0].cron `0 0 25 * * *`",
        ),
        (
            "  stages: [{percent: 100}]\n  windows: [{cron: \"@daily\", duration: 1h, tz: Mars/Olympus}]\n",
            (8, 48),
            "unknown timezone `Mars/Olympus`",
        ),
        (
            "  stages: [{percent: 100}]\n  activate: later\n",
            (8, 13),
            "rollout.activate must be one of on_arrival, together",
        ),
        (
            "  stages: [{percent: 100}]\n  on_abort: ignore\n",
            (8, 13),
            "rollout.on_abort must be one of rollback, safe_state",
        ),
        (
            "  stages: [{percent: 100}]\n  soakk: 1m\n",
            (8, 3),
            "unknown key `soakk` in rollout (did you mean `soak`?)",
        ),
    ];
    for (section, (line, col), message) in cases {
        let e = parse_pack(&with(section)).expect_err(section);
        assert_eq!(e.0.len(), 1, "{section}: {e}");
        assert!(e.0[0].message.contains(message), "{section}: {e}");
        assert_eq!(
            (e.0[0].pos.line, e.0[0].pos.col),
            (*line, *col),
            "{section}: {e}"
        );
    }
}

/// An agent update's plan: a pack's `rollout:` section and optional
/// `targets:`; a stage may pass on no firing there (a box may run no
/// pack), and what is wrong is said with its place.
#[test]
fn an_update_plan_is_a_rollout_section_with_targets() {
    use baton_proto::pack::{Targets, parse_update_plan};
    let p = parse_update_plan(
        "targets: {labels: {site: north}}\nrollout:\n  stages: [{agents: 1}, {percent: 100}]\n  soak: 30s\n",
    )
    .expect("valid");
    assert_eq!(p.rollout.stages.len(), 2);
    assert_eq!(
        p.rollout.min_firings, 0,
        "silence may pass an update's stage"
    );
    assert!(matches!(p.targets, Some(Targets::Labels(l)) if l["site"] == "north"));
    let p = parse_update_plan("rollout:\n  stages: [{percent: 100}]\n  min_firings: 5\n")
        .expect("valid");
    assert_eq!((p.rollout.min_firings, p.targets.is_none()), (5, true));

    let e = parse_update_plan("targets: {agents: [a1]}\n").expect_err("no rollout");
    assert!(
        e.render("plan")
            .contains("plan:1:1: an update plan is missing required key `rollout`"),
        "{}",
        e.render("plan")
    );
    let e = parse_update_plan("rollout:\n  stages: [{percent: 100}]\ninstructions: []\n")
        .expect_err("a pack's key");
    assert!(
        e.render("plan").contains("plan:3:1"),
        "{}",
        e.render("plan")
    );
}
