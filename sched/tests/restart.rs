//! The restart rules, one test per rule, on simulated time: `catch_up`
//! after downtime, planned instants of dependents, once-only outputs,
//! the anchor, one order for simultaneous firings, exact counts.

use std::collections::{HashMap, HashSet};

use baton_proto::RefTime;
use baton_proto::pack::parse_pack;
use baton_sched::{
    AttemptResult, Config, Event, Firing, OnceKey, Output, PackKey, Prior, PriorOutcome,
    SafeReason, Scheduler,
};

fn t(s: &str) -> RefTime {
    RefTime::from_timestamp(s.parse().expect("test instant")).expect("in range")
}

fn ms(base: RefTime, ms: i64) -> RefTime {
    RefTime::from_nanos(base.as_nanos() + ms * 1_000_000)
}

fn pack(yaml: &str) -> baton_proto::Pack {
    parse_pack(yaml).unwrap_or_else(|e| panic!("test pack invalid:\n{e}"))
}

fn key(p: &str) -> PackKey {
    PackKey {
        tenant: "default".into(),
        pack: p.into(),
    }
}

/// Everything the core says, firings answered at once with `ok` (or a
/// failure for the instructions in `fail`).
#[derive(Default)]
struct Log {
    events: Vec<Event>,
    fires: Vec<(RefTime, Firing)>,
    outputs: Vec<Output>,
}

impl Log {
    fn take(&mut self, core: &mut Scheduler, now: RefTime, out: &mut Vec<Output>, fail: &[&str]) {
        while !out.is_empty() {
            for o in std::mem::take(out) {
                match &o {
                    Output::Event(e) => self.events.push(e.clone()),
                    Output::Fire(f) => {
                        self.fires.push((now, f.clone()));
                        let r = if fail.contains(&f.id.instruction.as_str()) {
                            AttemptResult::Failed("boom".into())
                        } else {
                            AttemptResult::Ok { value: None }
                        };
                        core.attempt_result(&f.id, r, now).drain_into(out);
                    }
                    _ => {}
                }
                self.outputs.push(o);
            }
            core.tick(now).drain_into(out);
        }
    }

    /// Tick at every wake from `from` up to `until` (a wake before `from`
    /// is handled at `from`: time never goes back).
    fn run_from(
        &mut self,
        core: &mut Scheduler,
        from: RefTime,
        until: RefTime,
        out: &mut Vec<Output>,
        fail: &[&str],
    ) {
        self.take(core, from, out, fail);
        while let Some(w) = core.next_wake().filter(|w| *w <= until) {
            let now = w.max(from);
            core.tick(now).drain_into(out);
            self.take(core, now, out, fail);
        }
    }

    fn names(&self, ins: &str) -> Vec<&'static str> {
        self.events
            .iter()
            .filter(|e| e.instruction.as_deref() == Some(ins))
            .map(|e| e.kind.name())
            .collect()
    }

    fn once_keys(&self) -> HashSet<String> {
        let mut keys = HashSet::new();
        for o in &self.outputs {
            match o {
                Output::Event(Event { once: Some(k), .. })
                | Output::OnFailure { once: k, .. }
                | Output::SafeState { once: Some(k), .. } => {
                    keys.insert(k.to_string());
                }
                _ => {}
            }
        }
        keys
    }
}

#[test]
fn a_restart_drops_missed_occurrences_under_catch_up_none_and_fires_the_next_on_time() {
    // The tester's case: every 10ms, defaults (catch_up none, max_lateness
    // 1s), down for 0.6 s. Nothing missed fires; the next occurrence fires
    // on its instant.
    let yaml = "pack: p\nversion: 1\ninstructions:\n  - {id: blink, action: gpio.toggle, params: {line: 12}, every: 10ms}\n";
    let t0 = t("2026-12-01T10:00:00Z");
    let mut core = Scheduler::new(Config::default(), HashMap::new());
    let mut out = Vec::new();
    let alive = ms(t0, 5_000);
    let now = ms(t0, 5_600);
    core.restore(pack(yaml), t0, alive, now)
        .drain_into(&mut out)
        .expect("restore");
    let mut log = Log::default();
    log.run_from(&mut core, now, ms(t0, 5_650), &mut out, &[]);
    let at_restart: Vec<&(RefTime, Firing)> = log
        .fires
        .iter()
        .filter(|(at, _)| *at < ms(t0, 5_601))
        .collect();
    assert_eq!(at_restart.len(), 1, "{at_restart:?}");
    // 5600 itself is on time; 5010..=5590 (59) were missed.
    assert_eq!(at_restart[0].1.scheduled, now);
    let skip = log
        .events
        .iter()
        .find(|e| e.kind.name() == "skip")
        .expect("one aggregated skip");
    assert!(
        skip.detail().starts_with("missed 59 occurrence(s)"),
        "{}",
        skip.detail()
    );
    // Then one per period, each on its instant.
    for (at, f) in &log.fires {
        assert_eq!(*at, f.scheduled);
        assert!(f.scheduled >= now);
    }
    assert_eq!(log.fires.len(), 6);
}

#[test]
fn catch_up_last_never_fires_past_until() {
    let yaml = "pack: p\nversion: 1\ninstructions:\n  - {id: s, action: noop, every: 1s, start_at: 2026-12-01T09:00:00Z, until: 2026-12-01T09:30:00Z, catch_up: last}\n";
    let mut core = Scheduler::new(Config::default(), HashMap::new());
    let mut out = Vec::new();
    core.restore(
        pack(yaml),
        t("2026-12-01T08:00:00Z"),
        t("2026-12-01T08:59:00Z"),
        t("2026-12-01T10:00:00Z"),
    )
    .drain_into(&mut out)
    .expect("restore");
    let mut log = Log::default();
    let from = t("2026-12-01T10:00:00Z");
    log.run_from(&mut core, from, t("2026-12-01T11:00:00Z"), &mut out, &[]);
    let occ: Vec<RefTime> = log.fires.iter().map(|(_, f)| f.id.occurrence).collect();
    assert_eq!(occ, [t("2026-12-01T09:30:00Z")]);
    assert_eq!(log.fires[0].0, t("2026-12-01T10:00:00Z"));
    // The true lateness: scheduled is the occurrence, not the restart.
    assert_eq!(log.fires[0].1.scheduled, t("2026-12-01T09:30:00Z"));
    assert_eq!(core.next_wake(), None);
}

const UPDOWN: &str = "pack: p
version: 1
instructions:
  - {id: up, action: noop, at: 2026-12-01T10:00:00Z}
  - {id: down, action: noop, after: [up], delay: 3s, max_lateness: LATE, on_give_up: continue}
  - {id: beat, action: noop, every: 1s, start_at: 2026-12-01T10:00:00Z}
";

fn up_succeeded() -> HashMap<String, PriorOutcome> {
    let occ = t("2026-12-01T10:00:00Z").as_nanos();
    [(format!("default/p/v1/up/{occ}/a1"), PriorOutcome::Succeeded)]
        .into_iter()
        .collect()
}

#[test]
fn a_dependent_keeps_its_planned_instant_across_a_restart() {
    // `up` succeeded, the agent was killed, and came back 7 s later: `down`
    // was planned for up + 3 s, while the agent was down.
    let restart = t("2026-12-01T10:00:07Z");
    let run = |late: &str| {
        let mut core = Scheduler::new(Config::default(), up_succeeded());
        let mut out = Vec::new();
        core.restore(
            pack(&UPDOWN.replace("LATE", late)),
            t("2026-12-01T09:00:00Z"),
            t("2026-12-01T10:00:00.500Z"),
            restart,
        )
        .drain_into(&mut out)
        .expect("restore");
        let mut log = Log::default();
        log.run_from(&mut core, restart, t("2026-12-01T10:00:20Z"), &mut out, &[]);
        log
    };
    // max_lateness 200ms: missed, reported with its true lateness.
    let log = run("200ms");
    assert_eq!(log.names("down"), ["give_up"]);
    let gave_up = log
        .events
        .iter()
        .find(|e| e.kind.name() == "give_up")
        .expect("give_up");
    assert_eq!(gave_up.occurrence, Some(t("2026-12-01T10:00:03Z")));
    assert!(
        gave_up.detail().starts_with("missed: late by 4s"),
        "{}",
        gave_up.detail()
    );
    assert!(log.fires.iter().all(|(_, f)| f.id.instruction == "beat"));
    // max_lateness 10s: fires at the restart, scheduled at its plan.
    let log = run("10s");
    let down: Vec<&(RefTime, Firing)> = log
        .fires
        .iter()
        .filter(|(_, f)| f.id.instruction == "down")
        .collect();
    assert_eq!(down.len(), 1);
    assert_eq!(down[0].0, restart);
    assert_eq!(down[0].1.scheduled, t("2026-12-01T10:00:03Z"));
    assert_eq!(down[0].1.id.occurrence, t("2026-12-01T10:00:03Z"));
}

#[test]
fn a_dependent_fires_at_its_planned_instant_live() {
    let mut core = Scheduler::new(Config::default(), HashMap::new());
    let mut out = Vec::new();
    core.accept(
        pack(&UPDOWN.replace("LATE", "50ms")),
        t("2026-12-01T09:00:00Z"),
    )
    .drain_into(&mut out)
    .expect("accept");
    let mut log = Log::default();
    // up's result arrives 40 ms after it fired: down is still planned for
    // up's occurrence + 3 s.
    core.tick(t("2026-12-01T10:00:00Z")).drain_into(&mut out);
    let up = out
        .iter()
        .find_map(|o| match o {
            Output::Fire(f) if f.id.instruction == "up" => Some(f.id.clone()),
            _ => None,
        })
        .expect("up fired");
    out.clear();
    core.attempt_result(
        &up,
        AttemptResult::Ok { value: None },
        t("2026-12-01T10:00:00.040Z"),
    )
    .drain_into(&mut out);
    let from = t("2026-12-01T10:00:00.040Z");
    log.run_from(&mut core, from, t("2026-12-01T10:00:05Z"), &mut out, &[]);
    let down = log
        .fires
        .iter()
        .find(|(_, f)| f.id.instruction == "down")
        .expect("down fired");
    assert_eq!(down.0, t("2026-12-01T10:00:03Z"));
    assert_eq!(down.1.scheduled, t("2026-12-01T10:00:03Z"));
}

const ONCE: &str = "pack: p
version: 1
safe_state:
  - {action: gpio.write, params: {line: 1, value: 0}}
instructions:
  - {id: a, action: noop, at: 2026-12-01T10:00:00Z, retry: {max_attempts: 2}, on_failure: {action: noop}, on_give_up: GIVEUP}
  - {id: b, action: noop, after: [a], delay: 1s}
  - {id: u, action: noop, at: 2026-12-01T10:00:00Z}
  - {id: beat, action: noop, every: 1s, start_at: 2026-12-01T10:00:00Z}
";

fn once_prior() -> HashMap<String, PriorOutcome> {
    let occ = t("2026-12-01T10:00:00Z").as_nanos();
    [
        (format!("default/p/v1/a/{occ}/a1"), PriorOutcome::Failed),
        (format!("default/p/v1/a/{occ}/a2"), PriorOutcome::Failed),
        (format!("default/p/v1/u/{occ}/a1"), PriorOutcome::Unknown),
    ]
    .into_iter()
    .collect()
}

fn restart_with(prior: Prior, giveup: &str, at: &str) -> (Scheduler, Log) {
    let mut core = Scheduler::new(Config::default(), prior);
    let mut out = Vec::new();
    core.restore(
        pack(&ONCE.replace("GIVEUP", giveup)),
        t("2026-12-01T09:00:00Z"),
        t("2026-12-01T10:00:00.500Z"),
        t(at),
    )
    .drain_into(&mut out)
    .expect("restore");
    let mut log = Log::default();
    log.take(&mut core, t(at), &mut out, &[]);
    core.tick(t(at)).drain_into(&mut out);
    log.take(&mut core, t(at), &mut out, &[]);
    (core, log)
}

#[test]
fn give_up_on_failure_and_outcome_unknown_are_reported_once_across_restarts() {
    let (_, first) = restart_with(once_prior().into(), "continue", "2026-12-01T10:00:02Z");
    assert_eq!(first.names("a"), ["give_up", "on_failure"]);
    assert_eq!(first.names("b"), ["skip"]);
    assert_eq!(first.names("u"), ["outcome_unknown"]);
    let on_failure = first
        .outputs
        .iter()
        .filter(|o| matches!(o, Output::OnFailure { .. }))
        .count();
    assert_eq!(on_failure, 1);
    let keys = first.once_keys();
    let occ = t("2026-12-01T10:00:00Z").as_nanos();
    assert!(
        keys.contains(&format!("default/p/v1/a/{occ}/give_up")),
        "{keys:?}"
    );
    assert!(keys.contains(&format!("default/p/v1/a/{occ}/on_failure")));
    assert!(keys.contains(&format!("default/p/v1/u/{occ}/outcome_unknown")));
    // The runtime journalled the keys; killed again, restarted again.
    let prior = Prior {
        attempts: once_prior(),
        done: keys,
    };
    let (core, second) = restart_with(prior, "continue", "2026-12-01T10:00:09Z");
    assert!(second.names("a").is_empty(), "{:?}", second.events);
    assert!(second.names("u").is_empty());
    assert!(second.names("b").is_empty());
    assert!(
        second
            .outputs
            .iter()
            .all(|o| !matches!(o, Output::OnFailure { .. } | Output::SafeState { .. }))
    );
    // Its state still follows: b is not pending, beat goes on.
    assert_eq!(core.held(&key("p")), Some((1, true)));
    assert!(second.fires.iter().all(|(_, f)| f.id.instruction == "beat"));
}

#[test]
fn a_give_up_safe_state_is_entered_once_and_the_pack_still_stops() {
    let (_, first) = restart_with(once_prior().into(), "safe_state", "2026-12-01T10:00:02Z");
    let safe: Vec<&Output> = first
        .outputs
        .iter()
        .filter(|o| matches!(o, Output::SafeState { .. }))
        .collect();
    assert_eq!(safe.len(), 1);
    let Output::SafeState {
        once: Some(k),
        reason: SafeReason::GiveUp,
        ..
    } = safe[0]
    else {
        panic!("{safe:?}")
    };
    assert!(
        k.to_string().ends_with("/a/1796119200000000000/safe_state"),
        "{k}"
    );
    let prior = Prior {
        attempts: once_prior(),
        done: first.once_keys(),
    };
    let (core, second) = restart_with(prior, "safe_state", "2026-12-01T10:00:03Z");
    // Nothing of the give-up again (beat's own gap is a new report).
    assert!(
        second.outputs.iter().all(|o| match o {
            Output::Event(e) => e.instruction.as_deref() == Some("beat") && e.kind.name() == "skip",
            _ => false,
        }),
        "{:?}",
        second.outputs
    );
    assert_eq!(core.held(&key("p")), Some((1, false)));
    assert_eq!(core.next_wake(), None);
}

#[test]
fn a_restored_stopped_pack_reasserts_its_safe_state_without_reporting_it() {
    let mut core = Scheduler::new(Config::default(), HashMap::new());
    let mut out = Vec::new();
    core.restore_stopped(
        pack(&ONCE.replace("GIVEUP", "safe_state")),
        t("2026-12-01T09:00:00Z"),
        SafeReason::GiveUp,
        t("2026-12-01T12:00:00Z"),
    )
    .drain_into(&mut out)
    .expect("restore");
    assert_eq!(out.len(), 1, "{out:?}");
    assert!(matches!(
        &out[0],
        Output::SafeState {
            once: None,
            reason: SafeReason::GiveUp,
            ..
        }
    ));
    assert_eq!(core.next_wake(), None);
}

#[test]
fn the_phase_survives_a_restart_through_the_anchor() {
    let v = |n: u64, action: &str| {
        format!(
            "pack: p\nversion: {n}\ninstructions:\n  - {{id: s, action: {action}, every: 10s}}\n"
        )
    };
    let t0 = t("2026-12-01T10:00:00Z");
    let mut core = Scheduler::new(Config::default(), HashMap::new());
    let mut out = Vec::new();
    core.accept(pack(&v(1, "noop")), t0)
        .drain_into(&mut out)
        .expect("v1");
    let mut log = Log::default();
    log.run_from(&mut core, t0, ms(t0, 25_000), &mut out, &[]);
    // v2 changes the action, accepted at :27: the phase stays at :x0.
    core.accept(pack(&gpio(&v(2, "ACTION"))), ms(t0, 27_000))
        .drain_into(&mut out)
        .expect("v2");
    let anchor = core.anchor(&key("p")).expect("held");
    assert_eq!(anchor, t0);
    // Restart at :43 (down since :31): the next firing is :50, not :53/:47.
    let mut core = Scheduler::new(Config::default(), HashMap::new());
    core.restore(
        pack(&gpio(&v(2, "ACTION"))),
        anchor,
        ms(t0, 31_000),
        ms(t0, 43_000),
    )
    .drain_into(&mut out)
    .expect("restore");
    let mut log = Log::default();
    log.run_from(&mut core, ms(t0, 43_000), ms(t0, 70_000), &mut out, &[]);
    let at: Vec<RefTime> = log.fires.iter().map(|(_, f)| f.scheduled).collect();
    assert_eq!(at, [ms(t0, 50_000), ms(t0, 60_000), ms(t0, 70_000)]);
}

fn gpio(yaml: &str) -> String {
    yaml.replace("ACTION", "gpio.toggle, params: {line: 3}")
}

#[test]
fn a_missed_count_never_includes_an_occurrence_that_ran() {
    // last_alive is a coarse heartbeat: :01 and :02 ran after it.
    let yaml = "pack: p\nversion: 1\ninstructions:\n  - {id: s, action: noop, every: 1s, start_at: 2026-12-01T10:00:00Z}\n";
    let mut prior = HashMap::new();
    for s in ["01", "02"] {
        let occ = t(&format!("2026-12-01T10:00:{s}Z")).as_nanos();
        prior.insert(format!("default/p/v1/s/{occ}/a1"), PriorOutcome::Succeeded);
    }
    let mut core = Scheduler::new(Config::default(), prior);
    let mut out = Vec::new();
    core.restore(
        pack(yaml),
        t("2026-12-01T09:00:00Z"),
        t("2026-12-01T10:00:00.500Z"),
        t("2026-12-01T10:00:05.500Z"),
    )
    .drain_into(&mut out)
    .expect("restore");
    let mut log = Log::default();
    log.take(&mut core, t("2026-12-01T10:00:05.500Z"), &mut out, &[]);
    let skips: Vec<String> = log
        .events
        .iter()
        .filter(|e| e.kind.name() == "skip")
        .map(Event::detail)
        .collect();
    assert_eq!(skips.len(), 1, "{skips:?}");
    assert!(skips[0].starts_with("missed 3 occurrence(s)"), "{skips:?}");
}

#[test]
fn a_clock_step_announced_as_downtime_neither_bursts_nor_silences() {
    let yaml = "pack: p\nversion: 1\ninstructions:\n  - {id: b, action: noop, every: 10ms}\n";
    let t0 = t("2026-12-01T10:00:00Z");
    let mut core = Scheduler::new(Config::default(), HashMap::new());
    let mut out = Vec::new();
    core.accept(pack(yaml), t0)
        .drain_into(&mut out)
        .expect("accept");
    let mut log = Log::default();
    log.run_from(&mut core, t0, ms(t0, 100), &mut out, &[]);
    let before = log.fires.len();
    // The clock steps 600 ms forward (within max_lateness 1s).
    let now = ms(t0, 705);
    core.downtime(now).drain_into(&mut out);
    core.tick(now).drain_into(&mut out);
    log.take(&mut core, now, &mut out, &[]);
    assert_eq!(log.fires.len(), before, "no burst");
    assert_eq!(core.next_wake(), Some(ms(t0, 710)));
    log.run_from(&mut core, now, ms(t0, 730), &mut out, &[]);
    assert_eq!(log.fires.len(), before + 3, "no silence");
}

/// Fired ids, in order, of a restart with a catch-up burst across packs
/// and instructions, ticked at every wake or in one jump.
fn burst_order(jump: bool) -> Vec<String> {
    let a = "pack: a\nversion: 1\ndefaults: {max_lateness: 1h}\ninstructions:\n  - {id: x, action: noop, every: 2s, start_at: 2026-12-01T10:00:00Z, catch_up: all}\n  - {id: y, action: noop, every: 1s, start_at: 2026-12-01T10:00:00Z, catch_up: all, priority: 9}\n  - {id: z, action: noop, every: 3s, start_at: 2026-12-01T10:00:00Z, catch_up: last}\n";
    let b = "pack: b\nversion: 1\ndefaults: {max_lateness: 1h}\ninstructions:\n  - {id: w, action: noop, every: 1s, start_at: 2026-12-01T10:00:00Z, catch_up: all}\n  - {id: v, action: noop, at: 2026-12-01T10:00:20Z}\n";
    let mut core = Scheduler::new(Config::default(), HashMap::new());
    let mut out = Vec::new();
    let (alive, now) = (t("2026-12-01T10:00:10.5Z"), t("2026-12-01T10:00:17Z"));
    core.restore(pack(a), alive, alive, now)
        .drain_into(&mut out)
        .expect("a");
    core.restore(pack(b), alive, alive, now)
        .drain_into(&mut out)
        .expect("b");
    let until = t("2026-12-01T10:00:30Z");
    let mut log = Log::default();
    if jump {
        log.take(&mut core, now, &mut out, &[]);
        core.tick(until).drain_into(&mut out);
        log.take(&mut core, until, &mut out, &[]);
    } else {
        log.run_from(&mut core, now, until, &mut out, &[]);
    }
    log.fires.iter().map(|(_, f)| f.id.to_string()).collect()
}

#[test]
fn simultaneous_firings_and_catch_up_bursts_have_one_order_whatever_the_tick_span() {
    let fine = burst_order(false);
    let jump = burst_order(true);
    assert_eq!(fine, jump);
    let at = |i: usize| {
        let id = baton_sched::ExecutionId::parse(&fine[i]).expect("id");
        format!("{}/{}", id.pack.pack, id.instruction)
    };
    // At the restart (:17): y (priority 9) — its replay of :11, then its
    // on-time :17 — then pack a's x and z, then pack b's w (replay, live).
    assert_eq!(
        (0..6).map(at).collect::<Vec<_>>(),
        ["a/y", "a/y", "a/x", "a/z", "b/w", "b/w"]
    );
    assert!(fine[0].contains(&t("2026-12-01T10:00:11Z").as_nanos().to_string()));
}

#[test]
fn once_keys_render_as_documented() {
    let k = OnceKey {
        pack: key("p"),
        version: 2,
        instruction: "i".into(),
        occurrence: RefTime::from_nanos(5),
        kind: baton_sched::OnceKind::OnFailure,
    };
    assert_eq!(k.to_string(), "default/p/v2/i/5/on_failure");
}

#[test]
fn equal_instants_fire_by_priority_then_pack_order_then_instruction_order() {
    let p = |name: &str| {
        format!(
            "pack: {name}\nversion: 1\ninstructions:\n  - {{id: lo, action: noop, every: 1s, start_at: 2026-12-01T10:00:00Z}}\n  - {{id: hi, action: noop, at: 2026-12-01T10:00:01Z, priority: 50}}\n  - {{id: lo2, action: noop, at: 2026-12-01T10:00:01Z}}\n"
        )
    };
    let mut core = Scheduler::new(Config::default(), HashMap::new());
    let mut out = Vec::new();
    core.accept(pack(&p("second")), t("2026-12-01T09:00:00Z"))
        .drain_into(&mut out)
        .expect("accept");
    core.accept(pack(&p("first")), t("2026-12-01T09:00:01Z"))
        .drain_into(&mut out)
        .expect("accept");
    let mut log = Log::default();
    let from = t("2026-12-01T09:00:01Z");
    log.run_from(&mut core, from, t("2026-12-01T10:00:01Z"), &mut out, &[]);
    let order: Vec<String> = log
        .fires
        .iter()
        .filter(|(at, _)| *at == t("2026-12-01T10:00:01Z"))
        .map(|(_, f)| format!("{}/{}", f.id.pack.pack, f.id.instruction))
        .collect();
    assert_eq!(
        order,
        [
            "second/hi",
            "first/hi",
            "second/lo",
            "second/lo2",
            "first/lo",
            "first/lo2"
        ]
    );
}
