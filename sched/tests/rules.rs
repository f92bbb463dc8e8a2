//! Every scheduling rule, on simulated time.

use std::collections::HashMap;

use baton_proto::RefTime;
use baton_proto::pack::parse_pack;
use baton_sched::sim::{FailSpec, SimOptions, simulate};
use baton_sched::{
    AttemptResult, Config, Event, EventKind, ExecutionId, Output, PackKey, PriorOutcome, Reason,
    SafeReason, Scheduler, Withdrawal,
};

fn t(s: &str) -> RefTime {
    RefTime::from_timestamp(s.parse().expect("test instant")).expect("in range")
}

fn pack(yaml: &str) -> baton_proto::Pack {
    parse_pack(yaml).unwrap_or_else(|e| panic!("test pack invalid:\n{e}"))
}

fn run(yaml: &str, from: &str, until: &str, fail: &[&str]) -> Vec<Event> {
    let mut events = Vec::new();
    let opts = SimOptions {
        from: t(from),
        until: t(until),
        fail: fail
            .iter()
            .map(|f| f.parse().expect("fail spec"))
            .collect::<Vec<FailSpec>>(),
        seed: 7,
        max_events: 100_000,
    };
    let done = simulate(pack(yaml), &opts, |e| events.push(e.clone())).expect("simulate");
    assert!(done, "event cap reached");
    events
}

/// `(instant, event name, instruction)` for compact assertions.
fn brief(events: &[Event]) -> Vec<(String, &'static str, String)> {
    events
        .iter()
        .map(|e| {
            (
                e.t.to_rfc3339(),
                e.kind.name(),
                e.instruction.clone().unwrap_or_else(|| "-".into()),
            )
        })
        .collect()
}

fn names(events: &[Event], ins: &str) -> Vec<&'static str> {
    events
        .iter()
        .filter(|e| e.instruction.as_deref() == Some(ins))
        .map(|e| e.kind.name())
        .collect()
}

fn fires(events: &[Event]) -> Vec<(String, String)> {
    events
        .iter()
        .filter(|e| e.kind == EventKind::Fire)
        .map(|e| (e.t.to_rfc3339(), e.instruction.clone().unwrap_or_default()))
        .collect()
}

const Z: &str = ".000000000Z";

#[test]
fn every_fires_from_acceptance_at_exact_period() {
    let ev = run(
        "pack: p\nversion: 1\ninstructions:\n  - {id: blink, action: gpio.toggle, params: {line: 12}, every: 500ms}\n",
        "2026-12-01T10:00:00Z",
        "2026-12-01T10:00:01.500Z",
        &[],
    );
    let f = fires(&ev);
    let at: Vec<&str> = f.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(
        at,
        [
            "2026-12-01T10:00:00.000000000Z",
            "2026-12-01T10:00:00.500000000Z",
            "2026-12-01T10:00:01.000000000Z",
            "2026-12-01T10:00:01.500000000Z"
        ]
    );
    // Each fire is followed by its ok, and ids differ by occurrence.
    assert_eq!(
        names(&ev, "blink"),
        ["fire", "ok", "fire", "ok", "fire", "ok", "fire", "ok"]
    );
    let ids: Vec<String> = ev
        .iter()
        .filter_map(|e| e.id.as_ref())
        .map(|i| i.to_string())
        .collect();
    assert!(ids[0].starts_with("default/p/v1/blink/"), "{}", ids[0]);
    assert_ne!(ids[0], ids[2]);
}

#[test]
fn every_with_start_at_and_until_is_bounded() {
    let ev = run(
        "pack: p\nversion: 1\ninstructions:\n  - {id: a, action: noop, every: 1s, start_at: 2026-12-01T10:00:05Z, until: 2026-12-01T10:00:07Z}\n",
        "2026-12-01T10:00:00Z",
        "2026-12-01T10:01:00Z",
        &[],
    );
    let at: Vec<String> = fires(&ev).into_iter().map(|(t, _)| t).collect();
    assert_eq!(
        at,
        [
            format!("2026-12-01T10:00:05{Z}"),
            format!("2026-12-01T10:00:06{Z}"),
            format!("2026-12-01T10:00:07{Z}")
        ]
    );
}

const PRESS: &str = "pack: press
version: 1
defaults:
  retry: {max_attempts: 3, backoff: 100ms, factor: 2.0, max_backoff: 5s, jitter: 0.25}
  max_lateness: 50ms
safe_state:
  - {action: gpio.write, params: {line: 1, value: 0}}
instructions:
  - {id: warmup, action: gpio.write, params: {line: 1, value: 1}, at: 2026-12-01T10:00:00Z}
  - {id: clamp, action: gpio.write, params: {line: 2, value: 1}, after: [warmup], delay: 1s}
  - id: press
    action: gpio.pulse
    params: {line: 3, width: 20ms}
    after: [warmup, clamp]
    delay: 2s
    on_failure: {action: gpio.write, params: {line: 3, value: 0}}
  - {id: release, action: gpio.write, params: {line: 2, value: 0}, after: [press], delay: 500ms}
  - {id: beat, action: noop, every: 1s, start_at: 2026-12-01T10:00:00Z}
";

#[test]
fn dag_runs_in_order_with_delays_from_upstream_success() {
    let ev = run(
        PRESS,
        "2026-12-01T09:59:59Z",
        "2026-12-01T10:00:03.600Z",
        &[],
    );
    let f: Vec<(String, String)> = fires(&ev)
        .into_iter()
        .filter(|(_, i)| i != "beat")
        .collect();
    assert_eq!(
        f,
        [
            (format!("2026-12-01T10:00:00{Z}"), "warmup".to_string()),
            (format!("2026-12-01T10:00:01{Z}"), "clamp".to_string()),
            (format!("2026-12-01T10:00:03{Z}"), "press".to_string()),
            (
                "2026-12-01T10:00:03.500000000Z".to_string(),
                "release".to_string()
            ),
        ]
    );
    // The press execution id names its planned occurrence: clamp's + 2s.
    let press = ev
        .iter()
        .find(|e| e.kind == EventKind::Fire && e.instruction.as_deref() == Some("press"))
        .and_then(|e| e.id.clone())
        .expect("press fired");
    assert_eq!(press.occurrence, t("2026-12-01T10:00:03Z"));
}

#[test]
fn retries_back_off_then_give_up_runs_on_failure_then_safe_state() {
    let ev = run(
        PRESS,
        "2026-12-01T09:59:59Z",
        "2026-12-01T10:00:10Z",
        &["press"],
    );
    let press = names(&ev, "press");
    assert_eq!(
        press,
        [
            "fire",
            "fail",
            "retry",
            "fire",
            "fail",
            "retry",
            "fire",
            "fail",
            "give_up",
            "on_failure"
        ]
    );
    // Retry instants: base 100ms then 200ms, each within ±25% jitter.
    let retries: Vec<&Event> = ev
        .iter()
        .filter(|e| e.instruction.as_deref() == Some("press") && e.kind.name() == "retry")
        .collect();
    for (k, r) in retries.iter().enumerate() {
        let EventKind::Retry { at } = r.kind else {
            unreachable!()
        };
        let wait = at.since(r.t).as_secs_f64();
        let base = 0.1 * 2f64.powi(k as i32);
        assert!(
            (base * 0.75..=base * 1.25).contains(&wait),
            "retry {k} waits {wait}s"
        );
    }
    // After give-up: safe state, pending firings skipped, nothing more fires.
    let give_up = ev
        .iter()
        .position(|e| e.kind.name() == "give_up")
        .expect("give_up");
    let safe = ev
        .iter()
        .position(|e| e.kind.name() == "safe_state")
        .expect("safe_state");
    assert!(safe > give_up);
    assert!(
        ev[give_up..].iter().all(|e| e.kind != EventKind::Fire),
        "something fired after give-up"
    );
    let skipped: Vec<String> = ev[give_up..safe]
        .iter()
        .filter(|e| e.kind.name() == "skip")
        .filter_map(|e| e.instruction.clone())
        .collect();
    assert!(skipped.contains(&"beat".to_string()), "{skipped:?}");
    assert!(skipped.contains(&"release".to_string()), "{skipped:?}");
    assert_eq!(names(&ev, "release"), ["skip"]);
}

#[test]
fn a_retry_that_succeeds_releases_dependents() {
    let ev = run(
        PRESS,
        "2026-12-01T09:59:59Z",
        "2026-12-01T10:00:10Z",
        &["press:2"],
    );
    assert_eq!(
        names(&ev, "press"),
        [
            "fire", "fail", "retry", "fire", "fail", "retry", "fire", "ok"
        ]
    );
    assert_eq!(names(&ev, "release"), ["fire", "ok"]);
    assert!(ev.iter().all(|e| e.kind.name() != "safe_state"));
}

#[test]
fn on_give_up_continue_skips_only_dependents() {
    let yaml = PRESS.replace(
        "    on_failure: {action: gpio.write, params: {line: 3, value: 0}}\n",
        "    on_failure: {action: gpio.write, params: {line: 3, value: 0}}\n    on_give_up: continue\n",
    );
    let ev = run(
        &yaml,
        "2026-12-01T09:59:59Z",
        "2026-12-01T10:00:10Z",
        &["press"],
    );
    assert_eq!(names(&ev, "release"), ["skip"]);
    assert!(ev.iter().all(|e| e.kind.name() != "safe_state"));
    // The periodic instruction keeps firing after the give-up.
    let last_beat = fires(&ev)
        .into_iter()
        .rfind(|(_, i)| i == "beat")
        .expect("beats");
    assert_eq!(last_beat.0, format!("2026-12-01T10:00:10{Z}"));
}

#[test]
fn equal_deadlines_fire_by_priority_then_pack_order() {
    let ev = run(
        "pack: p\nversion: 1\ninstructions:\n  - {id: low, action: noop, at: 2026-12-01T10:00:00Z}\n  - {id: high, action: noop, at: 2026-12-01T10:00:00Z, priority: 90}\n  - {id: low2, action: noop, at: 2026-12-01T10:00:00Z}\n  - {id: mid, action: noop, at: 2026-12-01T10:00:00Z, priority: 10}\n",
        "2026-12-01T09:00:00Z",
        "2026-12-01T11:00:00Z",
        &[],
    );
    let order: Vec<String> = fires(&ev).into_iter().map(|(_, i)| i).collect();
    assert_eq!(order, ["high", "mid", "low", "low2"]);
}

#[test]
fn missed_one_shot_gives_up_and_fails_safe() {
    // Accepted a minute after its instant, far beyond max_lateness.
    let ev = run(PRESS, "2026-12-01T10:01:00Z", "2026-12-01T10:01:00Z", &[]);
    assert_eq!(names(&ev, "warmup"), ["give_up"]);
    let EventKind::GiveUp { reason, detail } = &ev[0].kind else {
        panic!("{:?}", ev[0])
    };
    assert!(detail.starts_with("missed: late by 1m"), "{detail}");
    assert_eq!(*reason, Reason::Late);
    // The give-up names the attempt that would have run, and its occurrence.
    let id = ev[0]
        .id
        .as_ref()
        .expect("a missed one-shot's give-up has an id");
    assert_eq!((id.instruction.as_str(), id.attempt), ("warmup", 1));
    assert_eq!(ev[0].occurrence, Some(id.occurrence));
    assert!(ev.iter().any(|e| e.kind.name() == "safe_state"));
    assert!(ev.iter().all(|e| e.kind != EventKind::Fire));
}

#[test]
fn cron_follows_dst_rules() {
    // Berlin springs forward at 02:00 on 2026-03-29: 02:30 does not exist and
    // fires once at 03:30 CEST (01:30Z). In October 02:30 repeats; the hour
    // field is not `*`, so it fires once, on the first pass (00:30Z).
    let yaml = "pack: p\nversion: 1\ntimezone: Europe/Berlin\ninstructions:\n  - {id: n, action: noop, cron: \"0 30 2 * * *\"}\n";
    let ev = run(yaml, "2026-03-28T00:00:00Z", "2026-03-31T00:00:00Z", &[]);
    let at: Vec<String> = fires(&ev).into_iter().map(|(t, _)| t).collect();
    assert_eq!(
        at,
        [
            format!("2026-03-28T01:30:00{Z}"),
            format!("2026-03-29T01:30:00{Z}"),
            format!("2026-03-30T00:30:00{Z}")
        ]
    );
    let ev = run(yaml, "2026-10-24T12:00:00Z", "2026-10-26T12:00:00Z", &[]);
    let at: Vec<String> = fires(&ev).into_iter().map(|(t, _)| t).collect();
    assert_eq!(
        at,
        [
            format!("2026-10-25T00:30:00{Z}"),
            format!("2026-10-26T01:30:00{Z}")
        ]
    );
}

fn drain(core: &mut Scheduler, now: RefTime, out: &mut Vec<Output>, fail: &[&str]) -> Vec<Event> {
    let mut events = Vec::new();
    core.tick(now).drain_into(out);
    while !out.is_empty() {
        for o in std::mem::take(out) {
            match o {
                Output::Event(e) => events.push(e),
                Output::Fire(f) => {
                    let r = if fail.contains(&f.id.instruction.as_str()) {
                        AttemptResult::Failed("boom".into())
                    } else {
                        AttemptResult::Ok { value: None }
                    };
                    core.attempt_result(&f.id, r, now).drain_into(out);
                }
                _ => {}
            }
        }
        core.tick(now).drain_into(out);
    }
    events
}

fn run_until(
    core: &mut Scheduler,
    until: RefTime,
    out: &mut Vec<Output>,
    fail: &[&str],
) -> Vec<Event> {
    let mut ev = drain(core, RefTime::from_nanos(i64::MIN), out, fail);
    while let Some(w) = core.next_wake().filter(|w| *w <= until) {
        ev.extend(drain(core, w, out, fail));
    }
    ev
}

#[test]
fn version_replacement_mid_run_is_atomic_and_never_refires_one_shots() {
    let v1 = "pack: p\nversion: 1\ninstructions:\n  - {id: once, action: noop, at: 2026-12-01T10:00:01Z}\n  - {id: tick, action: noop, every: 1s, start_at: 2026-12-01T10:00:00Z}\n  - {id: old, action: noop, every: 1s, start_at: 2026-12-01T10:00:00Z}\n";
    let v2 = "pack: p\nversion: 2\ninstructions:\n  - {id: once, action: noop, at: 2026-12-01T10:00:01Z}\n  - {id: tick, action: noop, every: 1s, start_at: 2026-12-01T10:00:00Z}\n  - {id: new, action: noop, at: 2026-12-01T10:00:04Z}\n";
    let mut core = Scheduler::new(Config::default(), HashMap::new());
    let mut out = Vec::new();
    let accepted = core
        .accept(pack(v1), t("2026-12-01T10:00:00Z"))
        .drain_into(&mut out)
        .expect("v1");
    assert_eq!(accepted, baton_sched::Accepted::New);
    let mut ev = run_until(&mut core, t("2026-12-01T10:00:02.500Z"), &mut out, &[]);
    // Same version again: a no-op.
    assert_eq!(
        core.accept(pack(v1), t("2026-12-01T10:00:02.500Z"))
            .drain_into(&mut out),
        Ok(baton_sched::Accepted::Unchanged)
    );
    let r = core
        .accept(pack(v2), t("2026-12-01T10:00:02.500Z"))
        .drain_into(&mut out)
        .expect("v2");
    assert_eq!(r, baton_sched::Accepted::Replaced { from: 1 });
    // An older version is refused.
    assert!(
        core.accept(pack(v1), t("2026-12-01T10:00:02.600Z"))
            .drain_into(&mut out)
            .is_err()
    );
    ev.extend(run_until(
        &mut core,
        t("2026-12-01T10:00:05Z"),
        &mut out,
        &[],
    ));
    let f = fires(&ev);
    let count = |id: &str| f.iter().filter(|(_, i)| i == id).count();
    assert_eq!(count("once"), 1, "{f:?}");
    assert_eq!(count("new"), 1);
    // `old` fired at :00, :01, :02 under v1 and never after the replacement.
    assert_eq!(count("old"), 3);
    // `tick` keeps its phase: :00..:05, one per second, no gap, no double.
    let ticks: Vec<&String> = f
        .iter()
        .filter(|(_, i)| i == "tick")
        .map(|(t, _)| t)
        .collect();
    assert_eq!(ticks.len(), 6, "{ticks:?}");
    // v2 firings carry version 2 in their ids.
    let new_id = ev
        .iter()
        .find(|e| e.instruction.as_deref() == Some("new") && e.kind == EventKind::Fire)
        .and_then(|e| e.id.clone())
        .expect("new fired");
    assert_eq!(new_id.version, 2);
}

/// A changed periodic instruction whose old version has occurrences armed
/// ahead (handed out, results not back) when the replacement arrives: the
/// old version is asked to give them back. Those it gives back (not yet
/// started) fire under the new version; the one that had started (0 ms)
/// stays the old version's, and the new one never fires it. Before, both
/// versions fired those instants: a toggle done twice is none.
#[test]
fn a_changed_periodic_takes_back_what_its_old_version_armed_ahead() {
    let v1 = "pack: p\nversion: 1\ninstructions:\n  - {id: t, action: gpio.toggle, params: {line: 1}, every: 10ms, start_at: 2026-12-01T10:00:00Z}\n";
    let v2 = "pack: p\nversion: 2\ninstructions:\n  - {id: t, action: gpio.toggle, params: {line: 2}, every: 10ms, start_at: 2026-12-01T10:00:00Z}\n";
    let mut core = Scheduler::new(Config::default(), HashMap::new());
    let mut out = Vec::new();
    let t0 = t("2026-12-01T10:00:00Z");
    core.accept(pack(v1), t0).drain_into(&mut out).expect("v1");
    // Armed 50 ms ahead: 0, 10, .., 50 ms are handed out now.
    out.clear();
    core.tick_ahead(t0, std::time::Duration::from_millis(50))
        .drain_into(&mut out);
    let armed: Vec<i64> = out
        .iter()
        .filter_map(|o| match o {
            Output::Fire(f) => Some(f.id.occurrence.since(t0).as_millis() as i64),
            _ => None,
        })
        .collect();
    assert_eq!(armed, [0, 10, 20, 30, 40, 50]);
    out.clear();
    let at = t0 + std::time::Duration::from_millis(5);
    core.accept(pack(v2), at).drain_into(&mut out).expect("v2");
    let asked: Vec<ExecutionId> = out
        .iter()
        .filter_map(|o| match o {
            Output::Withdraw { id, .. } => Some(id.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(asked.len(), 6, "every attempt handed out is asked back");
    out.clear();
    // The runtime: 0 ms had run; the others were still armed.
    for id in &asked {
        let answer = if id.occurrence == t0 {
            Withdrawal::TooLate
        } else {
            Withdrawal::Withdrawn
        };
        core.withdrawal(id, answer, at).drain_into(&mut out);
    }
    let first = asked.iter().find(|i| i.occurrence == t0).expect("0 ms");
    core.attempt_result(first, AttemptResult::Ok { value: None }, at)
        .drain_into(&mut out);
    out.clear();
    let until = t0 + std::time::Duration::from_millis(100);
    let ev = run_until(&mut core, until, &mut out, &[]);
    let v2_fires: Vec<i64> = ev
        .iter()
        .filter(|e| e.kind == EventKind::Fire)
        .filter_map(|e| e.id.as_ref())
        .map(|id| {
            assert_eq!(id.version, 2, "{id}");
            id.occurrence.since(t0).as_millis() as i64
        })
        .collect();
    assert_eq!(v2_fires, [10, 20, 30, 40, 50, 60, 70, 80, 90, 100]);
}

/// A device attempt that times out before it could start (the dispatcher
/// behind, say) is withdrawn, and only then retried; one that had started
/// is never retried beside itself: its own result decides.
#[test]
fn a_timed_out_device_attempt_is_retried_only_once_withdrawn() {
    let p = "pack: p\nversion: 1\ninstructions:\n  - {id: w, action: gpio.write, params: {line: 1, value: 1}, at: 2026-12-01T10:00:00Z, timeout: 20ms, retry: {max_attempts: 2, backoff: 1ms}}\n";
    for started in [false, true] {
        let mut core = Scheduler::new(Config::default(), HashMap::new());
        let mut out = Vec::new();
        let t0 = t("2026-12-01T10:00:00Z");
        core.accept(pack(p), t0)
            .drain_into(&mut out)
            .expect("accepted");
        out.clear();
        core.tick(t0).drain_into(&mut out);
        let id = out
            .iter()
            .find_map(|o| match o {
                Output::Fire(f) => Some(f.id.clone()),
                _ => None,
            })
            .expect("fired");
        out.clear();
        let late = t0 + std::time::Duration::from_millis(20);
        core.tick(late).drain_into(&mut out);
        let asked: Vec<&Output> = out
            .iter()
            .filter(|o| matches!(o, Output::Withdraw { .. }))
            .collect();
        assert_eq!(
            asked,
            [&Output::Withdraw {
                id: id.clone(),
                reason: baton_sched::Reason::Timeout
            }],
            "{out:?}"
        );
        assert!(!out.iter().any(|o| matches!(o, Output::Abort(_))));
        out.clear();
        let answer = if started {
            Withdrawal::TooLate
        } else {
            Withdrawal::Withdrawn
        };
        core.withdrawal(&id, answer, late).drain_into(&mut out);
        let names: Vec<&str> = out
            .iter()
            .filter_map(|o| match o {
                Output::Event(e) => Some(e.kind.name()),
                _ => None,
            })
            .collect();
        if started {
            assert!(names.is_empty(), "{names:?}");
            // Its result, however late, ends the occurrence.
            core.attempt_result(&id, AttemptResult::Ok { value: None }, late)
                .drain_into(&mut out);
            assert!(
                out.iter()
                    .any(|o| matches!(o, Output::Event(e) if e.kind.name() == "ok"))
            );
            out.clear();
            core.tick(late + std::time::Duration::from_secs(1))
                .drain_into(&mut out);
            assert!(!out.iter().any(|o| matches!(o, Output::Fire(_))), "{out:?}");
        } else {
            assert_eq!(names, ["fail", "retry"]);
            core.tick(late + std::time::Duration::from_millis(5))
                .drain_into(&mut out);
            let retried = out
                .iter()
                .any(|o| matches!(o, Output::Fire(f) if f.id.attempt == 2));
            assert!(retried, "{out:?}");
        }
    }
}

/// A device attempt that could not be withdrawn at its timeout and whose
/// call never returns (a hung device) is ended one timeout later: aborted,
/// failed for its timeout, given up (its `on_give_up` applies), never
/// retried beside itself; a result that comes after that changes nothing.
/// A result within the grace ends it as usual.
#[test]
fn a_device_attempt_whose_call_hangs_is_ended_one_timeout_after_it() {
    let p = "pack: p\nversion: 1\nsafe_state:\n  - {action: gpio.write, params: {line: 1, value: 0}}\ninstructions:\n  - {id: w, action: gpio.write, params: {line: 1, value: 1}, at: 2026-12-01T10:00:00Z, timeout: 20ms, retry: {max_attempts: 2, backoff: 1ms}}\n";
    let ms = std::time::Duration::from_millis;
    for result_in_grace in [false, true] {
        let mut core = Scheduler::new(Config::default(), HashMap::new());
        let mut out = Vec::new();
        let t0 = t("2026-12-01T10:00:00Z");
        core.accept(pack(p), t0)
            .drain_into(&mut out)
            .expect("accepted");
        out.clear();
        core.tick(t0).drain_into(&mut out);
        let id = out
            .iter()
            .find_map(|o| match o {
                Output::Fire(f) => Some(f.id.clone()),
                _ => None,
            })
            .expect("fired");
        core.tick(t0 + ms(20)).drain_into(&mut out);
        core.withdrawal(&id, Withdrawal::TooLate, t0 + ms(20))
            .drain_into(&mut out);
        out.clear();
        if result_in_grace {
            core.attempt_result(&id, AttemptResult::Ok { value: None }, t0 + ms(30))
                .drain_into(&mut out);
        }
        core.tick(t0 + ms(39)).drain_into(&mut out);
        assert!(
            !out.iter().any(|o| matches!(o, Output::Abort(_))),
            "not before the grace ends: {out:?}"
        );
        core.tick(t0 + ms(1_000)).drain_into(&mut out);
        let names: Vec<&str> = out
            .iter()
            .filter_map(|o| match o {
                Output::Event(e) => Some(e.kind.name()),
                _ => None,
            })
            .collect();
        assert!(
            !out.iter().any(|o| matches!(o, Output::Fire(_))),
            "never retried: {out:?}"
        );
        if result_in_grace {
            assert_eq!(names, ["ok"], "{out:?}");
            continue;
        }
        assert!(out.contains(&Output::Abort(id.clone())), "{out:?}");
        let fail = out.iter().find_map(|o| match o {
            Output::Event(e) if e.kind.name() == "fail" => Some(format!("{:?}", e.kind)),
            _ => None,
        });
        assert!(
            fail.is_some_and(
                |f| f.contains("did not return within 20ms") && f.contains("outcome unknown")
            ),
            "{out:?}"
        );
        assert!(
            names.contains(&"give_up") && names.contains(&"safe_state"),
            "{names:?}"
        );
        // The call returns after all: nothing more.
        out.clear();
        core.attempt_result(&id, AttemptResult::Ok { value: None }, t0 + ms(2_000))
            .drain_into(&mut out);
        assert!(out.is_empty(), "{out:?}");
    }
}

/// Armed ahead, an attempt's timeout is not: a pass 50 ms ahead of a
/// firing with a 20 ms timeout arms it and leaves the timeout for its own
/// instant (taken ahead, it aborted the attempt before it could run and
/// armed the retry beside it: the occurrence fired twice).
#[test]
fn a_timeout_is_never_taken_ahead_of_now() {
    let p = "pack: p\nversion: 1\ninstructions:\n  - {id: w, action: gpio.write, params: {line: 1, value: 1}, every: 1s, start_at: 2026-12-01T10:00:00Z, timeout: 20ms, retry: {max_attempts: 3, backoff: 1ms}}\n";
    let mut core = Scheduler::new(Config::default(), HashMap::new());
    let mut out = Vec::new();
    let t0 = t("2026-12-01T10:00:00Z");
    let before = t0 - std::time::Duration::from_millis(2);
    core.accept(pack(p), before)
        .drain_into(&mut out)
        .expect("accepted");
    out.clear();
    core.tick_ahead(before, std::time::Duration::from_millis(50))
        .drain_into(&mut out);
    let kinds: Vec<String> = out
        .iter()
        .map(|o| match o {
            Output::Fire(f) => format!("fire {}", f.id.attempt),
            Output::Abort(_) => "abort".into(),
            Output::Event(e) => e.kind.name().to_string(),
            _ => "other".into(),
        })
        .collect();
    assert_eq!(kinds, ["fire", "fire 1"], "{kinds:?}");
    let id = match &out[1] {
        Output::Fire(f) => f.id.clone(),
        _ => unreachable!(),
    };
    out.clear();
    // Its success arrives after the timeout's instant has passed (it was
    // left for a pass): it still counts, nothing is retried.
    let late = t0 + std::time::Duration::from_millis(30);
    core.attempt_result(&id, AttemptResult::Ok { value: None }, late)
        .drain_into(&mut out);
    core.tick_ahead(late, std::time::Duration::from_millis(50))
        .drain_into(&mut out);
    let names: Vec<&str> = out
        .iter()
        .filter_map(|o| match o {
            Output::Event(e) => Some(e.kind.name()),
            Output::Fire(_) => Some("FIRE"),
            Output::Abort(_) => Some("ABORT"),
            _ => None,
        })
        .collect();
    assert_eq!(names, ["ok"], "{names:?}");
}

#[test]
fn cancel_mid_dag_enters_safe_state_and_skips_the_rest() {
    let mut core = Scheduler::new(Config::default(), HashMap::new());
    let mut out = Vec::new();
    core.accept(pack(PRESS), t("2026-12-01T09:59:59Z"))
        .drain_into(&mut out)
        .expect("accept");
    let mut ev = run_until(&mut core, t("2026-12-01T10:00:01.500Z"), &mut out, &[]);
    let key = PackKey {
        tenant: "default".into(),
        pack: "press".into(),
    };
    assert!(
        core.cancel(&key, t("2026-12-01T10:00:01.500Z"))
            .drain_into(&mut out)
    );
    let safe = out.iter().any(|o| {
        matches!(o, Output::SafeState { reason: SafeReason::Cancel, actions, .. } if actions.len() == 1)
    });
    assert!(safe, "{out:?}");
    ev.extend(run_until(
        &mut core,
        t("2026-12-01T10:01:00Z"),
        &mut out,
        &[],
    ));
    assert_eq!(names(&ev, "press"), ["skip"]);
    assert_eq!(names(&ev, "release"), ["skip"]);
    assert!(
        fires(&ev)
            .iter()
            .all(|(t, _)| t.as_str() <= "2026-12-01T10:00:01.500000000Z")
    );
    assert_eq!(core.next_wake(), None);
}

#[test]
fn lease_loss_and_shutdown_run_every_safe_state() {
    let mut core = Scheduler::new(Config::default(), HashMap::new());
    let mut out = Vec::new();
    core.accept(pack(PRESS), t("2026-12-01T09:59:59Z"))
        .drain_into(&mut out)
        .expect("accept");
    core.accept(
        pack(&PRESS.replace("pack: press", "pack: other")),
        t("2026-12-01T09:59:59Z"),
    )
    .drain_into(&mut out)
    .expect("accept");
    core.lease_lost(t("2026-12-01T09:59:59.5Z"))
        .drain_into(&mut out);
    let n = out
        .iter()
        .filter(|o| {
            matches!(
                o,
                Output::SafeState {
                    reason: SafeReason::LeaseLost,
                    ..
                }
            )
        })
        .count();
    assert_eq!(n, 2);
    out.clear();
    core.shutdown(t("2026-12-01T09:59:59.6Z"))
        .drain_into(&mut out);
    // Already safe: not repeated.
    assert!(out.iter().all(|o| !matches!(o, Output::SafeState { .. })));
    assert_eq!(core.next_wake(), None);
}

#[test]
fn lease_loss_of_one_pack_stops_that_pack_only_until_a_higher_version() {
    let blink = |id: &str, version: u64| {
        pack(&format!(
            "pack: {id}\nversion: {version}\nsafe_state:\n  - {{action: gpio.write, params: {{line: 1, value: 0}}}}\ninstructions:\n  - {{id: b, action: gpio.toggle, params: {{line: 1}}, every: 1s, start_at: 2026-12-01T10:00:00Z}}\n"
        ))
    };
    let key = |id: &str| PackKey {
        tenant: "default".into(),
        pack: id.into(),
    };
    let fired = |out: &[Output]| -> Vec<String> {
        out.iter()
            .filter_map(|o| match o {
                Output::Fire(f) => Some(f.id.pack.pack.clone()),
                _ => None,
            })
            .collect()
    };
    let mut core = Scheduler::new(Config::default(), HashMap::new());
    let mut out = Vec::new();
    core.accept(blink("leased", 1), t("2026-12-01T09:59:59Z"))
        .drain_into(&mut out)
        .expect("accept");
    core.accept(blink("free", 1), t("2026-12-01T09:59:59Z"))
        .drain_into(&mut out)
        .expect("accept");
    core.tick(t("2026-12-01T10:00:00Z")).drain_into(&mut out);
    assert_eq!(fired(&out), ["leased", "free"]);
    for o in &out {
        if let Output::Fire(f) = o {
            let mut more = Vec::new();
            core.attempt_result(
                &f.id,
                AttemptResult::Ok { value: None },
                t("2026-12-01T10:00:00Z"),
            )
            .drain_into(&mut more);
        }
    }
    out.clear();

    assert!(
        core.lease_lost_pack(&key("leased"), t("2026-12-01T10:00:00.5Z"))
            .drain_into(&mut out)
    );
    let safe: Vec<(String, SafeReason)> = out
        .iter()
        .filter_map(|o| match o {
            Output::SafeState {
                pack, reason, once, ..
            } => {
                assert!(once.is_none(), "a lease loss runs every time it happens");
                Some((pack.pack.clone(), *reason))
            }
            _ => None,
        })
        .collect();
    assert_eq!(safe, [("leased".to_string(), SafeReason::LeaseLost)]);
    let ev: Vec<&str> = out
        .iter()
        .filter_map(|o| match o {
            Output::Event(e) if e.pack.pack == "leased" => Some(e.kind.name()),
            _ => None,
        })
        .collect();
    assert_eq!(
        ev,
        ["skip", "safe_state"],
        "the pending occurrence is reported skipped"
    );
    assert_eq!(core.held(&key("leased")), Some((1, false)));
    assert_eq!(core.held(&key("free")), Some((1, true)));

    // Again: already safe, nothing output. Unknown packs: nothing.
    out.clear();
    assert!(
        !core
            .lease_lost_pack(&key("leased"), t("2026-12-01T10:00:00.6Z"))
            .drain_into(&mut out)
    );
    assert!(
        !core
            .lease_lost_pack(&key("ghost"), t("2026-12-01T10:00:00.6Z"))
            .drain_into(&mut out)
    );
    assert!(out.is_empty(), "{out:?}");

    // The other pack keeps firing; the stopped one does not.
    core.tick(t("2026-12-01T10:00:03Z")).drain_into(&mut out);
    assert!(!fired(&out).is_empty());
    assert!(fired(&out).iter().all(|p| p == "free"), "{:?}", fired(&out));

    // A new version runs again (the agent passes the core only higher
    // versions: a same-text re-push is `unchanged` at admission).
    out.clear();
    core.accept(blink("leased", 2), t("2026-12-01T10:00:03.5Z"))
        .drain_into(&mut out)
        .expect("higher version");
    assert_eq!(core.held(&key("leased")), Some((2, true)));
    out.clear();
    core.tick(t("2026-12-01T10:00:04Z")).drain_into(&mut out);
    assert!(
        fired(&out).contains(&"leased".to_string()),
        "{:?}",
        fired(&out)
    );
}

#[test]
fn a_timed_out_attempt_is_aborted_and_retried() {
    let yaml = "pack: p\nversion: 1\ninstructions:\n  - {id: x, action: exec, params: {program: /bin/true}, at: 2026-12-01T10:00:00Z, timeout: 2s, retry: {max_attempts: 2, backoff: 1s}}\n";
    let mut core = Scheduler::new(Config::default(), HashMap::new());
    let mut out = Vec::new();
    core.accept(pack(yaml), t("2026-12-01T09:00:00Z"))
        .drain_into(&mut out)
        .expect("accept");
    core.tick(t("2026-12-01T10:00:00Z")).drain_into(&mut out);
    assert!(out.iter().any(|o| matches!(o, Output::Fire(_))));
    out.clear();
    assert_eq!(core.next_wake(), Some(t("2026-12-01T10:00:02Z")));
    core.tick(t("2026-12-01T10:00:02Z")).drain_into(&mut out);
    let aborted = out.iter().find_map(|o| match o {
        Output::Abort(id) => Some(id.clone()),
        _ => None,
    });
    assert_eq!(aborted.map(|i| i.attempt), Some(1));
    let kinds: Vec<&str> = out
        .iter()
        .filter_map(|o| match o {
            Output::Event(e) => Some(e.kind.name()),
            _ => None,
        })
        .collect();
    assert_eq!(kinds, ["fail", "retry"]);
    // A late result for the aborted attempt is ignored.
    let id = ExecutionId::parse(&format!(
        "default/p/v1/x/{}/a1",
        t("2026-12-01T10:00:00Z").as_nanos()
    ))
    .expect("id");
    let mut late = Vec::new();
    core.attempt_result(
        &id,
        AttemptResult::Ok { value: None },
        t("2026-12-01T10:00:02.1Z"),
    )
    .drain_into(&mut late);
    assert!(late.is_empty(), "{late:?}");
}

#[test]
fn restart_never_refires_and_resolves_from_the_journal() {
    let occ = t("2026-12-01T10:00:00Z").as_nanos();
    let mut prior = HashMap::new();
    prior.insert(
        format!("default/press/v1/warmup/{occ}/a1"),
        PriorOutcome::Succeeded,
    );
    let clamp_occ = t("2026-12-01T10:00:01Z").as_nanos();
    prior.insert(
        format!("default/press/v1/clamp/{clamp_occ}/a1"),
        PriorOutcome::Unknown,
    );
    let mut core = Scheduler::new(Config::default(), prior);
    let mut out = Vec::new();
    // Restarted 0.5 s after warmup ran, clamp had started with no result.
    core.restore(
        pack(PRESS),
        t("2026-12-01T09:59:59Z"),
        t("2026-12-01T10:00:01Z"),
        t("2026-12-01T10:00:01.500Z"),
    )
    .drain_into(&mut out)
    .expect("restore");
    let ev = run_until(&mut core, t("2026-12-01T10:00:10Z"), &mut out, &[]);
    // warmup's success was reported before the crash: settled silently.
    assert!(names(&ev, "warmup").is_empty(), "{:?}", brief(&ev));
    assert_eq!(names(&ev, "clamp"), ["outcome_unknown"]);
    // press needs clamp to have succeeded: it never runs, and says so once
    // (upstream_unknown), with nothing more at shutdown.
    assert_eq!(names(&ev, "press"), ["skip"], "{:?}", brief(&ev));
    let skip = ev
        .iter()
        .find(|e| e.instruction.as_deref() == Some("press"))
        .expect("press reported");
    assert_eq!(skip.kind.reason(), Some(Reason::UpstreamUnknown));
    assert!(fires(&ev).iter().all(|(_, i)| i == "beat"));
    let mut end = Vec::new();
    core.shutdown(t("2026-12-01T10:00:10Z"))
        .drain_into(&mut end);
    let again = end
        .iter()
        .any(|o| matches!(o, Output::Event(e) if e.instruction.as_deref() == Some("press")));
    assert!(!again, "press reported again at shutdown: {end:?}");
}

/// A second restart after the unknown was reported: nothing of it or its
/// dependents is reported again.
#[test]
fn dependents_of_an_unknown_outcome_are_reported_once_across_restarts() {
    let clamp_occ = t("2026-12-01T10:00:01Z");
    let warmup_occ = t("2026-12-01T10:00:00Z").as_nanos();
    let mut prior = baton_sched::Prior::from(HashMap::from([
        (
            format!("default/press/v1/warmup/{warmup_occ}/a1"),
            PriorOutcome::Succeeded,
        ),
        (
            format!("default/press/v1/clamp/{}/a1", clamp_occ.as_nanos()),
            PriorOutcome::Unknown,
        ),
    ]));
    let p = pack(PRESS);
    let key = baton_sched::OnceKey {
        pack: PackKey::of(&p),
        version: 1,
        instruction: "clamp".into(),
        occurrence: clamp_occ,
        kind: baton_sched::OnceKind::OutcomeUnknown,
    };
    prior.done.insert(key.to_string());
    let mut core = Scheduler::new(Config::default(), prior);
    let mut out = Vec::new();
    core.restore(
        p,
        t("2026-12-01T09:59:59Z"),
        t("2026-12-01T10:00:01Z"),
        t("2026-12-01T10:00:01.500Z"),
    )
    .drain_into(&mut out)
    .expect("restore");
    let ev = run_until(&mut core, t("2026-12-01T10:00:10Z"), &mut out, &[]);
    assert!(names(&ev, "clamp").is_empty(), "{:?}", brief(&ev));
    assert!(names(&ev, "press").is_empty(), "{:?}", brief(&ev));
    let mut end = Vec::new();
    core.shutdown(t("2026-12-01T10:00:10Z"))
        .drain_into(&mut end);
    assert!(
        !end.iter()
            .any(|o| matches!(o, Output::Event(e) if e.instruction.as_deref() == Some("press"))),
        "{end:?}"
    );
}

#[test]
fn catch_up_after_downtime() {
    let base = "pack: p\nversion: 1\ndefaults: {max_lateness: 100ms}\ninstructions:\n  - {id: s, action: noop, every: 1m, start_at: 2026-12-01T10:00:00Z, catch_up: MODE}\n";
    // Up until 10:00:30, back at 10:05:30: 10:01..10:05 (5 occurrences) missed.
    let run_mode = |mode: &str| {
        let mut core = Scheduler::new(Config::default(), HashMap::new());
        let mut out = Vec::new();
        core.restore(
            pack(&base.replace("MODE", mode)),
            t("2026-12-01T09:00:00Z"),
            t("2026-12-01T10:00:30Z"),
            t("2026-12-01T10:05:30Z"),
        )
        .drain_into(&mut out)
        .expect("restore");
        let mut ev = drain(&mut core, t("2026-12-01T10:05:30Z"), &mut out, &[]);
        ev.extend(run_until(
            &mut core,
            t("2026-12-01T10:06:00Z"),
            &mut out,
            &[],
        ));
        ev
    };
    let none = run_mode("none");
    assert_eq!(
        brief(&none).iter().map(|(_, n, _)| *n).collect::<Vec<_>>(),
        ["skip", "fire", "ok"]
    );
    let EventKind::Skip { detail, .. } = &none[0].kind else {
        panic!()
    };
    assert!(detail.starts_with("missed 5 occurrence(s)"), "{detail}");
    assert_eq!(
        fires(&none),
        [(format!("2026-12-01T10:06:00{Z}"), "s".to_string())]
    );

    let last = run_mode("last");
    let f = fires(&last);
    assert_eq!(f.len(), 2, "{f:?}");
    let first = last
        .iter()
        .find(|e| e.kind == EventKind::Fire)
        .expect("fire");
    assert_eq!(first.t, t("2026-12-01T10:05:30Z"));
    assert_eq!(first.occurrence, Some(t("2026-12-01T10:05:00Z")));

    // `all` replays the missed ones oldest first at the schedule's own
    // pace, from the restart on; the live grid goes on meanwhile.
    let mut core = Scheduler::new(Config::default(), HashMap::new());
    let mut out = Vec::new();
    core.restore(
        pack(&base.replace("MODE", "all")),
        t("2026-12-01T09:00:00Z"),
        t("2026-12-01T10:00:30Z"),
        t("2026-12-01T10:05:30Z"),
    )
    .drain_into(&mut out)
    .expect("restore");
    let all = run_until(&mut core, t("2026-12-01T10:10:00Z"), &mut out, &[]);
    let f: Vec<(RefTime, RefTime)> = all
        .iter()
        .filter(|e| e.kind == EventKind::Fire)
        .map(|e| (e.t, e.occurrence.expect("occurrence")))
        .collect();
    let m = |s: &str| t(&format!("2026-12-01T10:{s}Z"));
    assert_eq!(
        f,
        [
            (m("05:30"), m("01:00")),
            (m("06:00"), m("06:00")),
            (m("06:30"), m("02:00")),
            (m("07:00"), m("07:00")),
            (m("07:30"), m("03:00")),
            (m("08:00"), m("08:00")),
            (m("08:30"), m("04:00")),
            (m("09:00"), m("09:00")),
            (m("09:30"), m("05:00")),
            (m("10:00"), m("10:00")),
        ]
    );
    assert!(all.iter().all(|e| e.kind.name() != "skip"));
}

#[test]
fn a_clock_step_never_bursts_nor_silences_a_periodic() {
    let yaml = "pack: p\nversion: 1\ninstructions:\n  - {id: b, action: noop, every: 100ms, max_lateness: 10ms}\n";
    let mut core = Scheduler::new(Config::default(), HashMap::new());
    let mut out = Vec::new();
    core.accept(pack(yaml), t("2026-12-01T10:00:00Z"))
        .drain_into(&mut out)
        .expect("accept");
    let mut ev = drain(&mut core, t("2026-12-01T10:00:00Z"), &mut out, &[]);
    // The clock jumps an hour forward.
    ev.extend(drain(
        &mut core,
        t("2026-12-01T11:00:00.050Z"),
        &mut out,
        &[],
    ));
    let after_step: Vec<&Event> = ev
        .iter()
        .filter(|e| e.t == t("2026-12-01T11:00:00.050Z"))
        .collect();
    assert_eq!(
        after_step.len(),
        1,
        "one aggregated skip, no burst: {after_step:?}"
    );
    assert_eq!(after_step[0].kind.name(), "skip");
    // ...and resumes on its grid right after.
    assert_eq!(core.next_wake(), Some(t("2026-12-01T11:00:00.100Z")));
    // A step backwards only delays: nothing fires early, nothing is lost.
    let before = core.next_wake();
    let mut none = Vec::new();
    core.tick(t("2026-12-01T10:30:00Z")).drain_into(&mut none);
    assert!(none.is_empty());
    assert_eq!(core.next_wake(), before);
}

#[test]
fn the_same_id_never_fires_twice_even_if_the_pack_is_redelivered_after_a_cancel() {
    let yaml = "pack: p\nversion: 1\ninstructions:\n  - {id: once, action: noop, at: 2026-12-01T10:00:00Z}\n";
    let mut core = Scheduler::new(Config::default(), HashMap::new());
    let mut out = Vec::new();
    core.accept(pack(yaml), t("2026-12-01T09:00:00Z"))
        .drain_into(&mut out)
        .expect("accept");
    let mut ev = run_until(&mut core, t("2026-12-01T10:00:00Z"), &mut out, &[]);
    let key = PackKey {
        tenant: "default".into(),
        pack: "p".into(),
    };
    core.cancel(&key, t("2026-12-01T10:00:00.001Z"))
        .drain_into(&mut out);
    core.accept(pack(yaml), t("2026-12-01T10:00:00.002Z"))
        .drain_into(&mut out)
        .expect("re-accept");
    ev.extend(run_until(
        &mut core,
        t("2026-12-01T10:00:10Z"),
        &mut out,
        &[],
    ));
    assert_eq!(fires(&ev).len(), 1, "{:?}", brief(&ev));
    // The re-delivered one-shot is known to have fired: nothing is pending.
    assert_eq!(core.next_wake(), None);
}

#[test]
fn a_restart_days_later_does_not_miss_one_shots_that_ran_before() {
    // The journal no longer remembers warmup (retention), but the agent was
    // up well after it: it was handled then, and must not now count as
    // missed (which would fail the whole pack safe on every restart).
    let mut core = Scheduler::new(Config::default(), HashMap::new());
    let mut out = Vec::new();
    core.restore(
        pack(PRESS),
        t("2026-12-01T09:59:59Z"),
        t("2026-12-03T08:00:00Z"),
        t("2026-12-03T09:00:00Z"),
    )
    .drain_into(&mut out)
    .expect("restore");
    let ev = run_until(&mut core, t("2026-12-03T09:00:03Z"), &mut out, &[]);
    assert!(names(&ev, "warmup").is_empty(), "{:?}", brief(&ev));
    assert!(
        ev.iter()
            .all(|e| e.kind.name() != "safe_state" && e.kind.name() != "give_up")
    );
    // The periodic instruction goes on.
    assert!(fires(&ev).iter().any(|(_, i)| i == "beat"));
}

#[test]
fn an_attempt_withdrawn_before_a_restart_fires_after_it() {
    // Armed at SIGTERM, withdrawn before it touched the device: after the
    // restart the same attempt runs, instead of counting as failed.
    let yaml = "pack: p\nversion: 1\ninstructions:\n  - {id: once, action: noop, at: 2026-12-01T10:00:00Z, max_lateness: 1m}\n";
    let occ = t("2026-12-01T10:00:00Z").as_nanos();
    let mut prior = HashMap::new();
    prior.insert(format!("default/p/v1/once/{occ}/a1"), PriorOutcome::NotRun);
    let mut core = Scheduler::new(Config::default(), prior);
    let mut out = Vec::new();
    core.restore(
        pack(yaml),
        t("2026-12-01T09:00:00Z"),
        t("2026-12-01T09:59:59.999Z"),
        t("2026-12-01T10:00:05Z"),
    )
    .drain_into(&mut out)
    .expect("restore");
    let ev = run_until(&mut core, t("2026-12-01T10:01:00Z"), &mut out, &[]);
    assert_eq!(names(&ev, "once"), ["fire", "ok"], "{:?}", brief(&ev));
    let id = ev[0].id.clone().expect("id");
    assert_eq!(id.attempt, 1);
}

/// An occurrence reported not run on the way out (armed, then withdrawn by
/// the shutdown) and then part of the restart's gap is reported once: the
/// gap's "missed N" does not count it again (`catch_up: none`).
#[test]
fn an_occurrence_reported_not_run_before_a_restart_is_not_reported_missed_again() {
    let yaml = "pack: p\nversion: 1\ninstructions:\n  - {id: t, action: noop, every: 1s, start_at: 2026-12-01T10:00:00Z, catch_up: none}\n";
    let occ = t("2026-12-01T10:00:03Z").as_nanos();
    let mut prior = HashMap::new();
    prior.insert(format!("default/p/v1/t/{occ}/a1"), PriorOutcome::NotRun);
    let mut core = Scheduler::new(Config::default(), prior);
    let mut out = Vec::new();
    // Alive until 10:00:02.5, back at 10:00:07.5: 3, 4, 5, 6 and 7 s were
    // missed, of which 3 s was already reported not run.
    core.restore(
        pack(yaml),
        t("2026-12-01T10:00:00Z"),
        t("2026-12-01T10:00:02.500Z"),
        t("2026-12-01T10:00:07.500Z"),
    )
    .drain_into(&mut out)
    .expect("restore");
    let ev = run_until(&mut core, t("2026-12-01T10:00:07.600Z"), &mut out, &[]);
    let missed: Vec<String> = ev
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Skip { reason, detail } if detail.starts_with("missed") => {
                assert_eq!(*reason, Reason::CatchUp, "missed while down");
                Some(detail.clone())
            }
            _ => None,
        })
        .collect();
    assert_eq!(missed.len(), 1, "{missed:?}");
    assert!(
        missed[0].starts_with("missed 4 occurrence(s)"),
        "{missed:?}"
    );
}

/// A switch at an instant (`activate: together`): the old version fires
/// everything up to it, the new one runs on a grid anchored at it (its
/// first `every` firing one period later: the same instants on every agent
/// that switches then), and what the old one had armed past it is asked
/// back, so nothing fires twice.
#[test]
fn a_switch_at_an_instant_runs_the_old_version_until_it_and_the_new_one_from_it() {
    let v1 = "pack: p\nversion: 1\ninstructions:\n  - {id: t, action: gpio.toggle, params: {line: 1}, every: 100ms}\n";
    let v2 = "pack: p\nversion: 2\ninstructions:\n  - {id: t, action: gpio.toggle, params: {line: 2}, every: 100ms}\n";
    let mut core = Scheduler::new(Config::default(), HashMap::new());
    let mut out = Vec::new();
    let t0 = t("2026-12-01T10:00:00.030Z");
    core.accept(pack(v1), t0).drain_into(&mut out).expect("v1");
    let ms = |n: u64| std::time::Duration::from_millis(n);
    let at = t("2026-12-01T10:00:00.250Z");
    let mut ev = run_until(&mut core, at - ms(1), &mut out, &[]);
    // v1's 330 ms occurrence is armed ahead when the switch comes.
    out.clear();
    core.tick_ahead(at, ms(100)).drain_into(&mut out);
    let armed: Vec<ExecutionId> = out
        .iter()
        .filter_map(|o| match o {
            Output::Fire(f) => Some(f.id.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(armed.len(), 1, "{armed:?}");
    out.clear();
    core.accept_at(pack(v2), at, at)
        .drain_into(&mut out)
        .expect("v2");
    let asked: Vec<ExecutionId> = out
        .iter()
        .filter_map(|o| match o {
            Output::Withdraw { id, .. } => Some(id.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(asked, armed, "what v1 armed past the instant is asked back");
    out.clear();
    for id in &asked {
        core.withdrawal(id, Withdrawal::Withdrawn, at)
            .drain_into(&mut out);
    }
    ev.extend(run_until(&mut core, at + ms(300), &mut out, &[]));
    let fired: Vec<(u64, i64)> = ev
        .iter()
        .filter(|e| e.kind == EventKind::Fire)
        .filter_map(|e| e.id.as_ref())
        .map(|id| (id.version, id.occurrence.since(t0).as_millis() as i64))
        .collect();
    assert_eq!(
        fired,
        [(1, 0), (1, 100), (1, 200), (2, 320), (2, 420), (2, 520)],
        "v1 at its own phase until the instant, v2 on a grid anchored at it"
    );
}

/// A switch that comes late (the control loop ran 120 ms after the
/// instant): the old version fired what fell before the switch, and the
/// new one starts after it. On one grid (`start_at`) the occurrence at
/// 300 ms fired once, under v1, never again under v2.
#[test]
fn a_late_switch_never_fires_an_occurrence_under_both_versions() {
    let v = |n: u32, line: u32| {
        format!(
            "pack: p\nversion: {n}\ninstructions:\n  - {{id: t, action: gpio.toggle, params: {{line: {line}}}, every: 100ms, start_at: 2026-12-01T10:00:00Z}}\n"
        )
    };
    let mut core = Scheduler::new(Config::default(), HashMap::new());
    let mut out = Vec::new();
    let t0 = t("2026-12-01T10:00:00Z");
    core.accept(pack(&v(1, 1)), t0)
        .drain_into(&mut out)
        .expect("v1");
    let ms = |n: u64| std::time::Duration::from_millis(n);
    let at = t0 + ms(250);
    let switch = at + ms(120);
    let mut ev = run_until(&mut core, switch, &mut out, &[]);
    out.clear();
    core.accept_at(pack(&v(2, 2)), at, switch)
        .drain_into(&mut out)
        .expect("v2");
    let asked: Vec<ExecutionId> = out
        .iter()
        .filter_map(|o| match o {
            Output::Withdraw { id, .. } => Some(id.clone()),
            _ => None,
        })
        .collect();
    out.clear();
    for id in &asked {
        core.withdrawal(id, Withdrawal::Withdrawn, switch)
            .drain_into(&mut out);
    }
    ev.extend(run_until(&mut core, t0 + ms(650), &mut out, &[]));
    let fired: Vec<(u64, i64)> = ev
        .iter()
        .filter(|e| e.kind == EventKind::Fire)
        .filter_map(|e| e.id.as_ref())
        .map(|id| (id.version, id.occurrence.since(t0).as_millis() as i64))
        .collect();
    let occurrences: Vec<i64> = fired.iter().map(|f| f.1).collect();
    let mut once = occurrences.clone();
    once.dedup();
    assert_eq!(occurrences, once, "an occurrence fired twice: {fired:?}");
    assert!(fired.contains(&(1, 300)), "{fired:?}");
    assert!(
        fired.iter().all(|&(v, o)| v == 1 || o > 370),
        "v2 fires only after the switch: {fired:?}"
    );
    assert!(fired.contains(&(2, 400)), "{fired:?}");
}
