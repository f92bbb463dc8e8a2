//! The whole control loop on simulated time: a manual clock, the in-memory
//! device over the sim GPIO backend, a real journal in a temp dir and a real
//! exec pool. No thread sleeps: each step is driven by the test.

mod rig;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use baton_agent::config::{ConfigFile, Overrides};
use baton_agent::dispatcher::{DispatchError, Job, JobKind};
use baton_agent::runtime::admission::Verdict;
use baton_agent::runtime::ports::{Clock, ManualClock};
use baton_agent::runtime::{StopCause, StopFlag};
use baton_journal::{Journal, JournalConfig};
use baton_proto::parse_pack;
use rig::*;

#[test]
fn periodic_firings_run_on_simulated_time_each_once() {
    let mut r = rig();
    r.accept(&pack(
        "blink",
        1,
        "safe_state:\n  - {action: gpio.write, params: {line: 3, value: 0}}\ninstructions:\n  - {id: b, action: gpio.toggle, params: {line: 3}, every: 100ms}\n",
    ))
    .expect("accepted");
    r.run_until(t(1_050), Duration::from_millis(1));
    let w = r.writes();
    // 0, 100, ..., 1000 ms: eleven toggles, each a distinct id, on time.
    assert_eq!(w.len(), 11, "{w:?}");
    let mut ids: Vec<&str> = w
        .iter()
        .filter_map(|x| x["execution_id"].as_str())
        .collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 11);
    let late = r.agent.tally().hist.max();
    assert!(late < 1_000_000, "lateness on simulated time: {late} ns");
}

#[test]
fn a_burst_far_beyond_the_dispatcher_credits_fires_everything_once() {
    let mut r = rig();
    let mut body = String::from("defaults: {max_lateness: 1h}\ninstructions:\n");
    for i in 0..5000 {
        body.push_str(&format!(
            "  - {{id: s{i}, action: gpio.write, params: {{line: {}, value: 1}}, at: {}}}\n",
            i % 64,
            t(100)
        ));
    }
    r.accept(&pack("burst", 1, &body)).expect("accepted");
    r.run_until(t(500), Duration::from_millis(1));
    let w = r.writes();
    assert_eq!(w.len(), 5000);
    let ids: std::collections::HashSet<&str> = w
        .iter()
        .filter_map(|x| x["execution_id"].as_str())
        .collect();
    assert_eq!(ids.len(), 5000, "each exactly once");
    assert_eq!(r.agent.tally().hist.len(), 5000, "each reported");
}

/// A backlog at its limit with an overdue entry (issue 24: it spun the
/// control thread): the loop does not pass again until results bring
/// credits back; then it does, and everything fires once.
#[test]
fn a_full_backlog_with_an_overdue_entry_waits_for_credits_instead_of_spinning() {
    let mut r = rig_with(
        ConfigFile {
            arm_horizon: Some("10ms".into()),
            ..ConfigFile::default()
        },
        Overrides::default(),
    );
    let mut body = String::from(
        "defaults: {max_lateness: 1h}\ninstructions:\n  - {id: beat, action: noop, every: 1ms}\n",
    );
    for i in 0..7000 {
        body.push_str(&format!(
            "  - {{id: s{i}, action: gpio.write, params: {{line: {}, value: 1}}, at: {}}}\n",
            i % 64,
            t(105)
        ));
    }
    r.accept(&pack("burst", 1, &body)).expect("accepted");
    // Armed ahead (with a heartbeat): 1 536 handed over, the rest wait for
    // credit.
    r.clock.set(t(100));
    r.agent.step().expect("step");
    // Later, before any result was taken: beats are overdue and the
    // backlog is full. No pass is due before results come (they unpark the
    // loop); a pass now would do nothing, again and again.
    r.clock.set(t(115));
    for _ in 0..2 {
        let next = r.agent.next_pass();
        assert!(
            next.is_some_and(|w| w > r.clock.now()),
            "a pass at once would spin: {next:?}"
        );
    }
    r.run_until(t(600), Duration::from_millis(1));
    let ids: std::collections::HashSet<String> = r
        .writes()
        .iter()
        .filter_map(|x| x["execution_id"].as_str().map(str::to_string))
        .collect();
    assert_eq!(ids.len(), 7000, "each exactly once");
}

/// While a firing is in flight (here a pulse's 200 ms width) the loop
/// passes for its result a results window apart, never at once: even with
/// `arm-horizon: 0ms` the window is 10 ms (it would spin the control
/// thread for the pulse's whole width).
#[test]
fn a_firing_in_flight_never_makes_the_loop_pass_without_pause() {
    let mut r = rig_with(
        ConfigFile {
            arm_horizon: Some("0ms".into()),
            ..ConfigFile::default()
        },
        Overrides::default(),
    );
    r.accept(&pack(
        "a",
        1,
        &format!(
            "instructions:\n  - {{id: p, action: gpio.pulse, params: {{line: 5, width: 200ms}}, at: {}}}\n",
            t(100)
        ),
    ))
    .expect("accepted");
    r.run_until(t(150), Duration::from_millis(5));
    assert_eq!(r.level(5), Some(1), "the pulse started");
    let now = r.clock.now();
    let next = r.agent.next_pass();
    assert!(
        next.is_some_and(|w| w.since(now) >= Duration::from_millis(10)),
        "the pulse's end is in flight: the next pass {next:?} is a results window away"
    );
}

#[test]
fn the_way_out_drives_every_held_pack_safe_state_and_nothing_after() {
    let mut r = rig();
    for (id, line) in [("a", 1), ("b", 2)] {
        r.accept(&pack(
            id,
            1,
            &format!(
                "safe_state:\n  - {{action: gpio.write, params: {{line: {line}, value: 0}}}}\ninstructions:\n  - {{id: t, action: gpio.toggle, params: {{line: {line}}}, every: 30ms}}\n"
            ),
        ))
        .expect("accepted");
    }
    r.run_until(t(95), Duration::from_millis(1));
    assert_eq!(r.level(1), Some(0), "four toggles: back to 0");
    r.run_until(t(125), Duration::from_millis(1));
    assert_eq!(r.level(1), Some(1));
    let stop = StopFlag::default();
    stop.request(15);
    let cause = r.agent.run(&stop, false);
    assert!(matches!(cause, StopCause::Requested(15)), "{cause:?}");
    assert_eq!(r.level(1), Some(0));
    assert_eq!(r.level(2), Some(0));
    let w = r.writes();
    let first_safe = w
        .iter()
        .position(|x| {
            x["execution_id"]
                .as_str()
                .is_some_and(|s| s.contains("safe_state"))
        })
        .expect("safe state written");
    assert!(
        w[first_safe..].iter().all(|x| x["execution_id"]
            .as_str()
            .is_some_and(|s| s.contains("safe_state"))),
        "nothing after the safe state: {w:?}"
    );
}

#[test]
fn two_packs_driving_one_line_are_refused_unless_both_share_it() {
    let mut r = rig();
    r.accept(&pack(
        "a",
        1,
        "instructions:\n  - {id: t, action: gpio.toggle, params: {line: 5}, every: 1s}\n",
    ))
    .expect("a");
    let err = r
        .accept(&pack(
            "b",
            1,
            "safe_state:\n  - {action: gpio.write, params: {line: 5, value: 0}}\ninstructions:\n  - {id: n, action: noop, every: 1s}\n",
        ))
        .expect_err("b drives line 5 in its safe state");
    let msg = format!("{err:#}");
    assert!(msg.contains("line 5") && msg.contains("default/a"), "{msg}");
    // Reading a line another pack drives is fine.
    r.accept(&pack(
        "c",
        1,
        "instructions:\n  - {id: r, action: gpio.read, params: {line: 5}, every: 1s}\n",
    ))
    .expect("a reader does not drive");
}

/// A line a newer version no longer drives stays its pack's until every
/// firing armed on it has run or been withdrawn: here a pulse that started
/// under v1 keeps line 5 until its end has run, and pack b, which wants
/// the line, is refused meanwhile (retried later: transient), then taken.
#[test]
fn a_line_dropped_by_a_newer_version_is_released_once_its_armed_firings_ran() {
    let mut r = rig();
    r.accept(&pack(
        "a",
        1,
        &format!(
            "instructions:\n  - {{id: p, action: gpio.pulse, params: {{line: 5, width: 200ms}}, at: {}}}\n",
            t(100)
        ),
    ))
    .expect("a v1");
    r.run_until(t(150), Duration::from_millis(5));
    assert_eq!(r.level(5), Some(1), "the pulse started");
    r.accept(&pack(
        "a",
        2,
        "instructions:\n  - {id: q, action: gpio.toggle, params: {line: 6}, every: 1s}\n",
    ))
    .expect("a v2 drops line 5");
    let b = pack(
        "b",
        1,
        "instructions:\n  - {id: w, action: gpio.write, params: {line: 5, value: 1}, every: 1s}\n",
    );
    let err = r
        .accept(&b)
        .expect_err("line 5 is still pulsing under a v1");
    let msg = format!("{err:#}");
    assert!(msg.contains("still in use by pack default/a"), "{msg}");
    assert!(matches!(
        err.downcast_ref::<baton_agent::runtime::AcceptError>(),
        Some(baton_agent::runtime::AcceptError::Refused(a)) if a.is_transient()
    ));
    r.run_until(t(350), Duration::from_millis(5));
    assert_eq!(r.level(5), Some(0), "the pulse ended");
    r.accept(&b)
        .expect("line 5 is free once the pulse has ended");
}

#[test]
fn versions_only_go_up_and_a_version_is_one_text() {
    let mut r = rig();
    let v2 = pack(
        "p",
        2,
        "instructions:\n  - {id: n, action: noop, every: 1s}\n",
    );
    assert_eq!(r.accept(&v2).expect("v2"), Verdict::New);
    assert_eq!(r.accept(&v2).expect("again"), Verdict::Unchanged);
    let older = r
        .accept(&pack(
            "p",
            1,
            "instructions:\n  - {id: n, action: noop, every: 1s}\n",
        ))
        .expect_err("older");
    assert!(
        format!("{older:#}").contains("older than version 2"),
        "{older:#}"
    );
    let edited = r
        .accept(&pack(
            "p",
            2,
            "instructions:\n  - {id: n, action: noop, every: 2s}\n",
        ))
        .expect_err("same version, other text");
    assert!(
        format!("{edited:#}").contains("different content"),
        "{edited:#}"
    );
    let v3 = pack(
        "p",
        3,
        "instructions:\n  - {id: n, action: noop, every: 2s}\n",
    );
    assert_eq!(r.accept(&v3).expect("v3"), Verdict::Replace { from: 2 });
}

#[test]
fn a_restart_keeps_the_phase_of_a_replaced_pack() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(t(0)));
    let body = |v: u64, line: u32| {
        pack(
            "beat",
            v,
            &format!(
                "instructions:\n  - {{id: b, action: gpio.toggle, params: {{line: {line}}}, every: 1s}}\n"
            ),
        )
    };
    let times = |log: &Path| -> Vec<i64> {
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|w| w["t"].as_i64())
            .collect()
    };
    {
        let mut a = build(dir.path(), clock.clone());
        let y = body(1, 1);
        a.accept(y.clone(), parse_pack(&y).expect("v1"))
            .expect("v1");
        while clock.now() < t(1_310) {
            a.step().expect("step");
            clock.advance(Duration::from_millis(1));
        }
        // v2 replaces v1 live, 310 ms into the second period: phase kept.
        let y = body(2, 1);
        a.accept(y.clone(), parse_pack(&y).expect("v2"))
            .expect("v2");
        while clock.now() < t(2_500) {
            a.step().expect("step");
            clock.advance(Duration::from_millis(1));
        }
        a.wind_down();
    }
    // Restart: the beat stays on whole seconds from the first acceptance.
    let mut a = build(dir.path(), clock.clone());
    while clock.now() < t(4_500) {
        a.step().expect("step");
        clock.advance(Duration::from_millis(1));
    }
    a.wind_down();
    let ts = times(&dir.path().join("gpio.jsonl"));
    assert!(ts.len() >= 4, "{ts:?}");
    for x in ts {
        let ms_into_second = ((x - T0) / 1_000_000) % 1000;
        assert!(
            ms_into_second < 5,
            "a beat off the phase: {} ms",
            (x - T0) / 1_000_000
        );
    }
}

#[test]
fn a_journal_left_behind_without_its_log_is_refused() {
    let r = rig();
    let data = r.data.clone();
    drop(r.agent);
    std::fs::remove_file(data.join("journal.log")).expect("rm log");
    let err = Journal::open(JournalConfig::new(&data)).expect_err("refused");
    assert!(err.to_string().contains("journal.log"), "{err}");
}

#[test]
fn a_sharers_safe_state_withdraws_the_others_armed_writes_to_the_shared_line() {
    let mut r = rig();
    r.accept(&pack(
        "a",
        1,
        "shared_lines: [5]\ninstructions:\n  - {id: t, action: gpio.toggle, params: {line: 5}, every: 100ms}\n",
    ))
    .expect("a");
    r.accept(&pack(
        "b",
        1,
        "shared_lines: [5]\nsafe_state:\n  - {action: gpio.write, params: {line: 5, value: 0}}\ninstructions:\n  - {id: n, action: noop, every: 1s}\n",
    ))
    .expect("b shares line 5 with a");
    // a's toggle due at 100 ms is armed (within the horizon) by 97 ms...
    r.run_until(t(97), Duration::from_millis(1));
    let before = r.writes().len();
    // ...when b is cancelled: b's safe state drives line 5 low and a's
    // armed write to it is withdrawn.
    r.agent
        .cancel_local(&baton_sched::PackKey {
            tenant: "default".into(),
            pack: "b".into(),
        })
        .expect("cancel b");
    r.run_until(t(150), Duration::from_millis(1));
    let w = r.writes();
    let after: Vec<&serde_json::Value> = w[before..].iter().collect();
    assert_eq!(after.len(), 1, "only b's safe-state write: {after:?}");
    assert!(
        after[0]["execution_id"]
            .as_str()
            .is_some_and(|s| s.contains("default/b safe_state (cancel)"))
    );
    // a goes on with its next occurrence.
    r.run_until(t(250), Duration::from_millis(1));
    assert!(
        r.writes()
            .iter()
            .any(|x| x["execution_id"]
                .as_str()
                .is_some_and(|s| s.contains("default/a/v1/t/")
                    && s.contains(&format!("/{}/", T0 + 200_000_000)))),
        "a's toggle at 200 ms ran"
    );
}

#[test]
fn absolute_packs_wait_for_the_clock_and_on_clock_loss_is_honoured() {
    let mut r = rig();
    let at = t(10_000);
    let absolute = |id: &str, version: u64, policy: &str, line: u32| {
        pack(
            id,
            version,
            &format!(
                "on_clock_loss: {policy}\nsafe_state:\n  - {{action: gpio.write, params: {{line: {line}, value: 0}}}}\n\
                 instructions:\n  - {{id: tick, action: gpio.toggle, params: {{line: {line}}}, every: 100ms, until: {at}}}\n"
            ),
        )
    };
    // 50 ms uncertain, limit 10 ms: what needs absolute time is refused
    // with both figures; plain intervals are taken.
    r.clock.set_uncertainty(50_000_000);
    let e = r
        .accept(&absolute("strict", 1, "safe_state", 1))
        .expect_err("refused while unsynchronised");
    let m = format!("{e:#}");
    assert!(m.contains("needs absolute time"), "{m}");
    assert!(m.contains("50.0ms") && m.contains("limit 10ms"), "{m}");
    r.accept(&pack(
        "plain",
        1,
        "instructions:\n  - {id: t, action: gpio.toggle, params: {line: 3}, every: 100ms}\n",
    ))
    .expect("intervals need no absolute time");

    // Synchronised: both absolute packs are taken and run.
    r.clock.set_uncertainty(20_000);
    r.accept(&absolute("strict", 1, "safe_state", 1))
        .expect("taken once synchronised");
    r.accept(&absolute("lenient", 1, "continue", 2))
        .expect("taken once synchronised");
    r.run_until(t(1_050), Duration::from_millis(5));
    let toggles = |r: &Rig, line: i64| r.writes().iter().filter(|w| w["line"] == line).count();
    assert_eq!(toggles(&r, 1), 11);
    assert_eq!(toggles(&r, 2), 11);

    // Sync lost: `safe_state` drives its safe state and stays stopped;
    // `continue` and the plain pack keep firing.
    r.clock.set_uncertainty(80_000_000);
    r.run_until(t(2_050), Duration::from_millis(5));
    assert_eq!(r.level(1), Some(0), "the strict pack's safe state ran");
    let strict_after = toggles(&r, 1);
    assert_eq!(toggles(&r, 2), 21, "the lenient pack kept its schedule");
    // Back in sync: the strict pack does not come back by itself.
    r.clock.set_uncertainty(20_000);
    r.run_until(t(3_050), Duration::from_millis(5));
    assert_eq!(toggles(&r, 1), strict_after, "stopped until a new version");
    // The same version again does not revive it; a higher one does.
    let same = r.accept(&absolute("strict", 1, "safe_state", 1));
    assert!(
        matches!(same, Ok(Verdict::Unchanged)) || same.is_err(),
        "{same:?}"
    );
    r.run_until(t(3_250), Duration::from_millis(5));
    assert_eq!(
        toggles(&r, 1),
        strict_after,
        "the same version stays stopped"
    );
    r.accept(&absolute("strict", 2, "safe_state", 1))
        .expect("a higher version brings it back");
    r.run_until(t(3_750), Duration::from_millis(5));
    assert!(toggles(&r, 1) > strict_after + 3);
}

#[test]
fn after_a_restart_clock_sources_get_a_grace_before_a_loss_counts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(t(0)));
    let o = baton_agent::config::Overrides {
        ntp_servers: vec!["127.0.0.1:9".into()],
        ..Default::default()
    };
    let cfg = config(dir.path(), baton_agent::config::ConfigFile::default(), o);
    let strict = pack(
        "strict",
        1,
        &format!(
            "on_clock_loss: safe_state\nsafe_state:\n  - {{action: gpio.write, params: {{line: 1, value: 0}}}}\n\
             instructions:\n  - {{id: tick, action: gpio.toggle, params: {{line: 1}}, every: 1s, until: {}}}\n",
            t(3_600_000)
        ),
    );
    let writes = || {
        std::fs::read_to_string(dir.path().join("gpio.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("\"toggle\"") || l.contains("\"line\":1"))
            .count()
    };
    {
        let mut a = build_with(dir.path(), clock.clone(), cfg.clone());
        a.accept(strict.clone(), parse_pack(&strict).expect("pack"))
            .expect("synchronised: taken");
        while clock.now() < t(2_500) {
            a.step().expect("step");
            clock.advance(Duration::from_millis(10));
        }
        a.wind_down();
    }
    // Restarted with its NTP source not locked yet: the pack runs on
    // through the grace...
    clock.set_uncertainty(40_000_000);
    let mut a = build_with(dir.path(), clock.clone(), cfg);
    let before = writes();
    let until = clock.now().as_nanos() + 20_000_000_000;
    while clock.now().as_nanos() < until {
        a.step().expect("step");
        clock.advance(Duration::from_millis(10));
    }
    let during = writes();
    assert!(
        during >= before + 19,
        "kept firing in the grace: {before} -> {during}"
    );
    // ...and a clock still unknown after it is a loss: the safe state.
    let until = clock.now().as_nanos() + 20_000_000_000;
    while clock.now().as_nanos() < until {
        a.step().expect("step");
        clock.advance(Duration::from_millis(10));
    }
    let last: Vec<serde_json::Value> = std::fs::read_to_string(dir.path().join("gpio.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let after = writes();
    assert!(
        after < during + 15,
        "stopped once the grace ran out: {during} -> {after}"
    );
    assert_eq!(
        last.last().and_then(|w| w["value"].as_i64()),
        Some(0),
        "safe state last"
    );
    a.wind_down();
}

#[test]
fn a_local_pack_on_absolute_time_waits_for_the_clock_instead_of_failing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("p.yaml");
    std::fs::write(
        &file,
        pack(
            "local",
            1,
            &format!(
                "instructions:\n  - {{id: once, action: gpio.write, params: {{line: 7, value: 1}}, at: {}}}\n",
                t(2_000)
            ),
        ),
    )
    .expect("write");
    let clock = Arc::new(ManualClock::new(t(0)));
    clock.set_uncertainty(1_000_000_000);
    let o = baton_agent::config::Overrides {
        packs: vec![file],
        ..Default::default()
    };
    let cfg = config(dir.path(), baton_agent::config::ConfigFile::default(), o);
    let mut a = build_with(dir.path(), clock.clone(), cfg);
    a.load_configured().expect("waits instead of failing");
    assert!(!a.idle(), "a waiting pack is work to come");
    let step_to = |a: &mut baton_agent::runtime::Agent, ms: i64| {
        while clock.now() < t(ms) {
            a.step().expect("step");
            clock.advance(Duration::from_millis(5));
        }
    };
    step_to(&mut a, 1_000);
    let log = dir.path().join("gpio.jsonl");
    assert_eq!(
        std::fs::read_to_string(&log).unwrap_or_default(),
        "",
        "nothing before the clock is known"
    );
    // The clock locks: the pack is taken and fires on time.
    clock.set_uncertainty(50_000);
    step_to(&mut a, 2_100);
    let fired = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(fired.lines().count(), 1, "{fired}");
    a.wind_down();
}

/// A safe state whose write cannot be handed to the device still settles
/// the exec firing it withdrew (journalled not run) and journals the
/// pack's stop: after a restart the cancelled pack stays stopped.
#[test]
fn a_failing_safe_state_still_settles_its_withdrawn_firings_and_journals_the_stop() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(t(0)));
    let file = baton_agent::config::parse_file("agent.yaml", "exec-allowlist: [/bin/true]\n")
        .expect("config");
    let cfg = config(dir.path(), file, Overrides::default());
    let failing = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let f = failing.clone();
    // Safe-state jobs fail to be handed over once `failing` is set (a
    // dispatcher gone, a bug); everything else reaches the device.
    let mut agent = build_with_device(dir.path(), clock.clone(), cfg, move |inner| {
        Box::new(Intercept {
            inner,
            answer: move |job: &Job| {
                (job.kind == JobKind::Safe && f.load(std::sync::atomic::Ordering::SeqCst))
                    .then(|| Err(DispatchError::NoCredit(job.id.clone())))
            },
        })
    });
    let yaml = pack(
        "p",
        1,
        &format!(
            "safe_state:\n  - {{action: gpio.write, params: {{line: 5, value: 0}}}}\n\
             instructions:\n  - {{id: x, action: exec, params: {{program: /bin/true}}, at: {}}}\n",
            t(200)
        ),
    );
    let parsed = parse_pack(&yaml).expect("pack");
    agent.accept(yaml, parsed).expect("accepted");
    // Armed ahead (its pass starts a lead before it): the exec firing
    // waits for its instant.
    for ms in 0..=198 {
        clock.set(t(ms));
        agent.step().expect("step");
    }
    failing.store(true, std::sync::atomic::Ordering::SeqCst);
    let key = baton_sched::PackKey {
        tenant: "default".into(),
        pack: "p".into(),
    };
    assert!(agent.cancel_local(&key).is_err(), "the safe state failed");
    let id = format!("default/p/v1/x/{}/a1", t(200).as_nanos());
    assert_eq!(
        agent.journal().outcome(&id),
        Some(baton_journal::Outcome::NotRun),
        "settled, not left open"
    );
    drop(agent);
    let (_, recovered) = Journal::open(JournalConfig::new(dir.path().join("data"))).expect("open");
    assert_eq!(
        recovered.packs[0].stopped,
        Some(baton_journal::StopReason::Cancel),
        "the stop was journalled"
    );
}

/// A device call that never returns: one timeout after the attempt's own
/// it is ended (journalled failed, not left open), never retried beside
/// itself, and the pack gives up into its safe state.
#[test]
fn an_attempt_whose_device_call_hangs_is_ended_and_not_retried() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(t(0)));
    let cfg = config(dir.path(), ConfigFile::default(), Overrides::default());
    let taken = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = taken.clone();
    // Calls for attempts never return (a hung device call): each takes
    // its attempt's slot, as the dispatcher does right before the call,
    // and the job is kept; everything else reaches the device.
    let mut agent = build_with_device(dir.path(), clock.clone(), cfg, move |inner| {
        Box::new(Intercept {
            inner,
            answer: move |job: &Job| {
                (job.kind == JobKind::Attempt).then(|| {
                    if job.live.as_ref().is_some_and(|s| s.claim()) {
                        seen.lock().expect("taken").push(job.id.to_string());
                    }
                    Ok(())
                })
            },
        })
    });
    let yaml = pack(
        "p",
        1,
        &format!(
            "safe_state:\n  - {{action: gpio.write, params: {{line: 6, value: 0}}}}\n\
             instructions:\n  - {{id: w, action: gpio.write, params: {{line: 5, value: 1}}, at: {}, timeout: 50ms, retry: {{max_attempts: 3, backoff: 1ms}}}}\n",
            t(100)
        ),
    );
    let parsed = parse_pack(&yaml).expect("pack");
    agent.accept(yaml, parsed).expect("accepted");
    for ms in 0..=1_000 {
        clock.set(t(ms));
        agent.step().expect("step");
    }
    let id = format!("default/p/v1/w/{}/a1", t(100).as_nanos());
    assert_eq!(
        taken.lock().expect("taken").as_slice(),
        std::slice::from_ref(&id),
        "one attempt, never retried"
    );
    assert_eq!(
        agent.journal().outcome(&id),
        Some(baton_journal::Outcome::Failed),
        "ended, not left open"
    );
    let log = std::fs::read_to_string(dir.path().join("gpio.jsonl")).unwrap_or_default();
    assert!(
        log.lines()
            .any(|l| l.contains("\"line\":6") && l.contains("safe_state")),
        "the pack gave up into its safe state: {log}"
    );
}

/// A journalled pack this agent refuses after a restart (its program left
/// the exec allowlist) is kept stopped, and its safe state is driven on
/// lines no other pack had opened: a relay it left energised goes low.
#[test]
fn a_journalled_pack_refused_after_a_restart_has_its_safe_state_driven() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(t(0)));
    let allowing = baton_agent::config::parse_file("agent.yaml", "exec-allowlist: [/bin/true]\n")
        .expect("config");
    let yaml = pack(
        "p",
        1,
        "safe_state:\n  - {action: gpio.write, params: {line: 6, value: 0}}\n\
         instructions:\n  - {id: on, action: gpio.write, params: {line: 6, value: 1}, every: 100ms}\n  \
         - {id: x, action: exec, params: {program: /bin/true}, every: 1h}\n",
    );
    {
        let mut a = build_with(
            dir.path(),
            clock.clone(),
            config(dir.path(), allowing, Overrides::default()),
        );
        let parsed = parse_pack(&yaml).expect("pack");
        a.accept(yaml.clone(), parsed).expect("accepted");
        for ms in (0..=150).step_by(5) {
            clock.set(t(ms));
            a.step().expect("step");
        }
        // Killed: no way out, the line stays high.
    }
    let log = dir.path().join("gpio.jsonl");
    let level = |log: &Path| {
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("json"))
            .rfind(|w| w["line"] == 6)
            .and_then(|w| w["value"].as_i64())
    };
    assert_eq!(level(&log), Some(1), "energised before the restart");
    // Restarted without /bin/true on the allowlist: the pack is refused.
    let mut a = build_with(
        dir.path(),
        clock.clone(),
        config(dir.path(), ConfigFile::default(), Overrides::default()),
    );
    for ms in (150..=200).step_by(5) {
        clock.set(t(ms));
        a.step().expect("step");
    }
    assert_eq!(level(&log), Some(0), "the refused pack's safe state ran");
    a.wind_down();
}
