//! Property tests of the restart rules on simulated time: random packs
//! (`every`, `cron`, `after`, `at`; every `catch_up`; `until`), random
//! failures, random crashes and downtimes. A restart is a new `Scheduler`
//! built from what the runtime would have journalled: the outcome of every
//! attempt fired (no result: unknown), every once-only key emitted, the
//! anchor, `last_alive` (a heartbeat at or before the crash) and whether
//! the pack stopped.
//!
//! Invariants:
//! - no execution id fires twice, across all runs;
//! - no once-only key is emitted in two runs;
//! - no repeating occurrence fires past `until`;
//! - a first attempt's `scheduled` is its planned occurrence (true lateness);
//! - no burst: after a restart, in any window shorter than the period, an
//!   instruction fires at most once — twice with `catch_up: last` (the one
//!   catch-up firing) or `all` (the replay stream beside the live one);
//! - `catch_up: none` fires no occurrence from before the restart; `last`
//!   at most one.

use std::collections::{HashMap, HashSet};

use baton_proto::RefTime;
use baton_proto::pack::{CatchUp, Pack, Schedule, parse_pack};
use baton_sched::{
    AttemptResult, Config, Event, Firing, Output, PackKey, Prior, PriorOutcome, SafeReason,
    Scheduler,
};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const BASE: i64 = 1_796_119_200_000_000_000; // 2026-12-01T10:00:00Z
const SEC: i64 = 1_000_000_000;

fn at(ms: i64) -> RefTime {
    RefTime::from_nanos(BASE + ms * 1_000_000)
}

#[derive(Clone, Debug)]
struct Spec {
    kind: u8,
    period_ms: u32,
    cron_step: u8,
    offset_ms: u32,
    until_s: Option<u32>,
    up: usize,
    delay_ms: u32,
    lateness_ms: u32,
    catch_up: u8,
    attempts: u32,
    cont: bool,
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        (
            0u8..4,
            200u32..3000,
            0u8..4,
            0u32..5000,
            prop::option::of(0u32..90),
        ),
        (
            0usize..4,
            0u32..2000,
            1u32..500,
            0u8..3,
            1u32..3,
            any::<bool>(),
        ),
    )
        .prop_map(
            |(
                (kind, period_ms, cron_step, offset_ms, until_s),
                (up, delay_ms, lateness_ms, catch_up, attempts, cont),
            )| Spec {
                kind,
                period_ms,
                cron_step,
                offset_ms,
                until_s,
                up,
                delay_ms,
                lateness_ms,
                catch_up,
                attempts,
                cont,
            },
        )
}

fn render(specs: &[Spec]) -> String {
    let mut y = String::from(
        "pack: p\nversion: 1\nsafe_state:\n  - {action: gpio.write, params: {line: 1, value: 0}}\ninstructions:\n",
    );
    for (i, s) in specs.iter().enumerate() {
        let start = at(i64::from(s.offset_ms));
        let until = s
            .until_s
            .map(|u| {
                format!(
                    ", until: {}",
                    at(i64::from(s.offset_ms) + i64::from(u) * 1000)
                )
            })
            .unwrap_or_default();
        let cu = ["none", "last", "all"][usize::from(s.catch_up)];
        let sched = match s.kind {
            0 => format!(
                "every: {}ms, start_at: {start}{until}, catch_up: {cu}",
                s.period_ms
            ),
            1 => format!(
                "cron: \"*/{} * * * * *\"{until}, catch_up: {cu}",
                [1, 2, 5, 10][usize::from(s.cron_step)]
            ),
            2 if i > 0 => format!("after: [i{}], delay: {}ms", s.up % i, s.delay_ms),
            _ => format!("at: {start}"),
        };
        y.push_str(&format!(
            "  - {{id: i{i}, action: gpio.write, params: {{line: {i}, value: 1}}, {sched}, max_lateness: {}ms, on_give_up: {}, retry: {{max_attempts: {}, backoff: 50ms}}}}\n",
            s.lateness_ms,
            if s.cont { "continue" } else { "safe_state" },
            s.attempts
        ));
    }
    y
}

/// What one run (between restarts) said.
#[derive(Default)]
struct Run {
    restart: RefTime,
    /// (instant handed out, firing).
    fires: Vec<(RefTime, Firing)>,
    keys: HashSet<String>,
    results: HashMap<String, PriorOutcome>,
    stopped: bool,
}

impl Run {
    fn see(&mut self, o: &Output, now: RefTime) {
        match o {
            Output::Fire(f) => self.fires.push((now, f.clone())),
            Output::Event(Event { once: Some(k), .. })
            | Output::OnFailure { once: k, .. }
            | Output::SafeState { once: Some(k), .. } => {
                self.keys.insert(k.to_string());
            }
            _ => {}
        }
        if let Output::SafeState {
            reason: SafeReason::GiveUp,
            ..
        } = o
        {
            self.stopped = true;
        }
    }
}

/// Drain outputs at `now`; results come back at once unless `crash_after`
/// says the agent died with this attempt running.
fn drain(
    core: &mut Scheduler,
    run: &mut Run,
    rng: &mut ChaCha8Rng,
    p_fail: f64,
    now: RefTime,
    out: &mut Vec<Output>,
) {
    while !out.is_empty() {
        for o in std::mem::take(out) {
            run.see(&o, now);
            if let Output::Fire(f) = o {
                let ok = !rng.random_bool(p_fail);
                run.results.insert(
                    f.id.to_string(),
                    if ok {
                        PriorOutcome::Succeeded
                    } else {
                        PriorOutcome::Failed
                    },
                );
                let r = if ok {
                    AttemptResult::Ok { value: None }
                } else {
                    AttemptResult::Failed("injected".into())
                };
                core.attempt_result(&f.id, r, now).drain_into(out);
            }
        }
        core.tick(now).drain_into(out);
    }
}

fn period_ns(s: &Schedule) -> Option<(i64, Option<RefTime>)> {
    match s {
        Schedule::Every { period, until, .. } => {
            Some((i64::try_from(period.as_nanos()).ok()?, *until))
        }
        Schedule::Cron { expr, until, .. } => {
            let step: i64 = expr.strip_prefix("*/")?.split(' ').next()?.parse().ok()?;
            Some((step * SEC, *until))
        }
        _ => None,
    }
}

fn check(pack: &Pack, runs: &[Run]) -> Vec<String> {
    let mut v = Vec::new();
    let mut ids = HashSet::new();
    let mut keys: HashMap<&String, usize> = HashMap::new();
    for (n, run) in runs.iter().enumerate() {
        for k in &run.keys {
            if let Some(m) = keys.insert(k, n) {
                v.push(format!("once key {k} emitted in runs {m} and {n}"));
            }
        }
        for (_, f) in &run.fires {
            if !ids.insert(f.id.to_string()) {
                v.push(format!("fired twice: {}", f.id));
            }
        }
        for ins in &pack.instructions {
            let Some((p, until)) = period_ns(&ins.schedule) else {
                continue;
            };
            let mine: Vec<&(RefTime, Firing)> = run
                .fires
                .iter()
                .filter(|(_, f)| f.id.instruction == ins.id && f.id.attempt == 1)
                .collect();
            for (_, f) in &mine {
                if until.is_some_and(|u| f.id.occurrence > u) {
                    v.push(format!("fired past until: {}", f.id));
                }
                if f.scheduled != f.id.occurrence {
                    v.push(format!(
                        "scheduled {} is not the plan: {}",
                        f.scheduled, f.id
                    ));
                }
            }
            if n == 0 {
                continue;
            }
            let allowed = match ins.policy.catch_up {
                CatchUp::None => 1,
                CatchUp::Last | CatchUp::All => 2,
            };
            for (j, (t, _)) in mine.iter().enumerate() {
                let within = mine[j..]
                    .iter()
                    .take_while(|(u, _)| u.as_nanos() < t.as_nanos() + p)
                    .count();
                if within > allowed {
                    v.push(format!(
                        "burst: {} fired {within} times within {p} ns from {t} (run {n})",
                        ins.id
                    ));
                }
            }
            let old = mine
                .iter()
                .filter(|(_, f)| f.id.occurrence < run.restart)
                .count();
            let max_old = match ins.policy.catch_up {
                CatchUp::None => 0,
                CatchUp::Last => 1,
                CatchUp::All => usize::MAX,
            };
            if old > max_old {
                v.push(format!(
                    "{}: {old} occurrences from before the restart fired (run {n})",
                    ins.id
                ));
            }
        }
    }
    v
}

fn run_case(specs: &[Spec], seed: u64, downs: &[(u32, u32, u32)]) -> Vec<String> {
    let yaml = render(specs);
    let pack = parse_pack(&yaml).expect("generated packs are valid");
    let key = PackKey {
        tenant: "default".into(),
        pack: "p".into(),
    };
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let p_fail = rng.random_range(0.0..0.3);
    let cfg = Config {
        seed,
        catch_up_cap: 4,
        ..Config::default()
    };
    let mut runs: Vec<Run> = Vec::new();
    let mut prior = Prior::default();
    let mut now = at(-1000);
    let mut anchor = now;
    let mut alive = now;
    // Run k lasts downs[k].0 × 30 ms, then the agent is down downs[k].2 ms;
    // the last run lasts 30 s.
    let segments = downs
        .iter()
        .copied()
        .map(Some)
        .chain(std::iter::once(None))
        .enumerate();
    for (k, seg) in segments {
        let (up_ms, heartbeat_ms, down_ms) = seg.unwrap_or((1000, 0, 0));
        let mut core = Scheduler::new(cfg.clone(), prior.clone());
        let mut out = Vec::new();
        let mut run = Run {
            restart: now,
            ..Run::default()
        };
        let stopped = runs.last().is_some_and(|r: &Run| r.stopped);
        if k == 0 {
            core.accept(pack.clone(), now)
                .drain_into(&mut out)
                .expect("accept");
        } else if stopped {
            core.restore_stopped(pack.clone(), anchor, SafeReason::GiveUp, now)
                .drain_into(&mut out)
                .expect("restore stopped");
        } else {
            core.restore(pack.clone(), anchor, alive, now)
                .drain_into(&mut out)
                .expect("restore");
        }
        run.stopped = stopped;
        drain(&mut core, &mut run, &mut rng, p_fail, now, &mut out);
        let crash = RefTime::from_nanos(now.as_nanos() + i64::from(up_ms) * 1_000_000 * 30);
        while let Some(w) = core.next_wake().filter(|w| *w <= crash) {
            now = w.max(now);
            core.tick(now).drain_into(&mut out);
            drain(&mut core, &mut run, &mut rng, p_fail, now, &mut out);
        }
        anchor = core.anchor(&key).expect("held");
        // The last heartbeat: at or before the last instant the agent acted.
        alive = RefTime::from_nanos(
            (now.as_nanos() - i64::from(heartbeat_ms) * 1_000_000).max(run.restart.as_nanos()),
        );
        // The attempt handed out last may have been running at the crash.
        if let Some((_, f)) = run.fires.last()
            && rng.random_bool(0.3)
        {
            run.results.insert(f.id.to_string(), PriorOutcome::Unknown);
        }
        prior.attempts.extend(run.results.clone());
        prior.done.extend(run.keys.iter().cloned());
        now = RefTime::from_nanos(crash.as_nanos() + i64::from(down_ms) * 1_000_000);
        runs.push(run);
    }
    if std::env::var_os("BATON_STATS").is_some() {
        let fires: Vec<usize> = runs.iter().map(|r| r.fires.len()).collect();
        let old: usize = runs
            .iter()
            .skip(1)
            .map(|r| {
                r.fires
                    .iter()
                    .filter(|(_, f)| f.id.occurrence < r.restart)
                    .count()
            })
            .sum();
        let keys: usize = runs.iter().map(|r| r.keys.len()).sum();
        eprintln!("fires per run {fires:?}, caught up {old}, once keys {keys}");
    }
    check(&pack, &runs)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn restarts_follow_catch_up_without_bursts_doubles_or_lies(
        specs in prop::collection::vec(spec(), 1..5),
        seed in any::<u64>(),
        downs in prop::collection::vec((1u32..1000, 0u32..2000, prop_oneof![0u32..5000, 5000u32..120_000]), 1..4),
    ) {
        let v = run_case(&specs, seed, &downs);
        prop_assert!(v.is_empty(), "violations:\n{}\npack:\n{}", v.join("\n"), render(&specs));
    }
}
