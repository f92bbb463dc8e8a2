//! Property tests: random packs, random failures, random event orders.
//!
//! Invariants checked on every run:
//! - no execution id is fired twice;
//! - every fired occurrence ends in exactly one of ok / give_up / skip
//!   (or outcome_unknown);
//! - a give_up that fails the pack safe is followed by its safe_state, and
//!   nothing of that pack fires after its safe_state;
//! - retry instants respect the backoff bounds.

use std::collections::{HashMap, HashSet};

use baton_proto::RefTime;
use baton_proto::pack::{OnGiveUp, Pack, parse_pack};
use baton_sched::{
    AttemptResult, Config, EventKind, Firing, Output, PackKey, Reason, Scheduler, Withdrawal,
};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const BASE: i64 = 1_796_119_200_000_000_000; // 2026-12-01T10:00:00Z

#[derive(Clone, Debug)]
struct InsSpec {
    kind: u8,
    offset_ms: u32,
    period_ms: u32,
    ups: Vec<usize>,
    delay_ms: u32,
    attempts: u32,
    backoff_ms: u32,
    factor: f64,
    jitter: f64,
    max_backoff_ms: u32,
    lateness_ms: u32,
    timeout_ms: u32,
    priority: u8,
    cont: bool,
    catch_up: u8,
}

fn ins_spec() -> impl Strategy<Value = InsSpec> {
    (
        (
            0u8..3,
            0u32..5000,
            50u32..2000,
            prop::collection::vec(0usize..8, 0..3),
            0u32..1000,
        ),
        (1u32..5, 1u32..400, 1.0f64..3.0, 0.0f64..1.0, 0u32..3000),
        (1u32..500, 50u32..3000, any::<u8>(), any::<bool>(), 0u8..3),
    )
        .prop_map(
            |(
                (kind, offset_ms, period_ms, ups, delay_ms),
                (attempts, backoff_ms, factor, jitter, extra),
                (lateness_ms, timeout_ms, priority, cont, catch_up),
            )| InsSpec {
                kind,
                offset_ms,
                period_ms,
                ups,
                delay_ms,
                attempts,
                backoff_ms,
                factor,
                jitter,
                max_backoff_ms: backoff_ms + extra,
                lateness_ms,
                timeout_ms,
                priority,
                cont,
                catch_up,
            },
        )
}

fn render(name: &str, version: u64, specs: &[InsSpec], safe: bool) -> String {
    let mut y = format!("pack: {name}\nversion: {version}\n");
    if safe {
        y.push_str("safe_state:\n  - {action: gpio.write, params: {line: 1, value: 0}}\n");
    }
    y.push_str("instructions:\n");
    for (i, s) in specs.iter().enumerate() {
        let at = RefTime::from_nanos(BASE + i64::from(s.offset_ms) * 1_000_000);
        // `after` only on earlier instructions: always a DAG.
        let ups: Vec<String> = {
            let mut u: Vec<usize> = s.ups.iter().filter(|u| **u < i).copied().collect();
            u.sort_unstable();
            u.dedup();
            u.iter().map(|u| format!("i{u}")).collect()
        };
        let sched = match s.kind {
            1 => format!(
                "every: {}ms, start_at: {}, catch_up: {}",
                s.period_ms,
                at,
                ["none", "last", "all"][usize::from(s.catch_up)]
            ),
            2 if !ups.is_empty() => format!("after: [{}], delay: {}ms", ups.join(", "), s.delay_ms),
            _ => format!("at: {at}"),
        };
        y.push_str(&format!(
            "  - {{id: i{i}, action: gpio.write, params: {{line: {i}, value: 1}}, {sched}, priority: {}, max_lateness: {}ms, timeout: {}ms, on_give_up: {}, retry: {{max_attempts: {}, backoff: {}ms, factor: {:.3}, jitter: {:.3}, max_backoff: {}ms}}}}\n",
            s.priority,
            s.lateness_ms,
            s.timeout_ms,
            if s.cont { "continue" } else { "safe_state" },
            s.attempts,
            s.backoff_ms,
            s.factor,
            s.jitter,
            s.max_backoff_ms
        ));
    }
    y
}

#[derive(Default)]
struct Checker {
    fired: HashSet<String>,
    fired_occ: HashSet<String>,
    terminal: HashMap<String, u32>,
    stopped: HashSet<PackKey>,
    give_up_pending: HashSet<PackKey>,
    violations: Vec<String>,
    trace: Vec<String>,
}

impl Checker {
    fn see(&mut self, o: &Output, packs: &HashMap<PackKey, Pack>) {
        self.trace.push(format!("{o:?}"));
        match o {
            Output::Fire(f) => {
                if !self.fired.insert(f.id.to_string()) {
                    self.violations.push(format!("fired twice: {}", f.id));
                }
                self.fired_occ.insert(f.id.idempotency_key());
                if self.stopped.contains(&f.id.pack) {
                    self.violations
                        .push(format!("fired after safe_state: {}", f.id));
                }
            }
            Output::Event(e) => {
                let terminal = matches!(
                    e.kind,
                    EventKind::Ok { .. }
                        | EventKind::GiveUp { .. }
                        | EventKind::Skip { .. }
                        | EventKind::OutcomeUnknown
                );
                if let (true, Some(id)) = (terminal, &e.id) {
                    *self.terminal.entry(id.idempotency_key()).or_default() += 1;
                }
                if let EventKind::Retry { at } = e.kind {
                    let id = e.id.as_ref().expect("retry has an id");
                    let p = &packs[&e.pack];
                    let ins = p.instruction(&id.instruction).expect("known instruction");
                    let r = ins.policy.retry;
                    let base = r.base_delay(id.attempt).as_secs_f64();
                    let wait = at.since(e.t).as_secs_f64();
                    let lo = base * (1.0 - r.jitter) - 1e-6;
                    let hi = (base * (1.0 + r.jitter)).min(r.max_backoff.as_secs_f64()) + 1e-6;
                    if !(lo..=hi).contains(&wait) {
                        self.violations
                            .push(format!("retry wait {wait} outside [{lo}, {hi}] for {id}"));
                    }
                }
                if let EventKind::GiveUp { .. } = e.kind {
                    let ins = e
                        .instruction
                        .as_deref()
                        .and_then(|i| packs[&e.pack].instruction(i));
                    if ins.is_some_and(|i| i.policy.on_give_up == OnGiveUp::SafeState) {
                        self.give_up_pending.insert(e.pack.clone());
                    }
                }
                if let EventKind::SafeState { .. } = e.kind {
                    self.give_up_pending.remove(&e.pack);
                    self.stopped.insert(e.pack.clone());
                }
            }
            _ => {}
        }
    }

    fn finish(mut self) -> Vec<String> {
        for occ in &self.fired_occ {
            let n = self.terminal.get(occ).copied().unwrap_or(0);
            if n != 1 {
                self.violations
                    .push(format!("fired occurrence {occ} ended {n} times"));
            }
        }
        for p in &self.give_up_pending {
            self.violations
                .push(format!("give_up in {p} not followed by safe_state"));
        }
        if !self.violations.is_empty() && std::env::var_os("BATON_TRACE").is_some() {
            for line in &self.trace {
                eprintln!("{line}");
            }
        }
        self.violations
    }
}

fn run_case(specs: Vec<InsSpec>, safe: bool, seed: u64, steps: usize) -> Vec<String> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut core = Scheduler::new(
        Config {
            seed,
            catch_up_cap: 5,
            ..Config::default()
        },
        HashMap::new(),
    );
    let mut packs: HashMap<PackKey, Pack> = HashMap::new();
    let mut checker = Checker::default();
    let mut out = Vec::new();
    let mut held = Held::default();
    let mut now = RefTime::from_nanos(BASE - 1_000_000_000);
    let mut version = 1;
    let key = PackKey {
        tenant: "default".into(),
        pack: "p".into(),
    };
    let accept = |core: &mut Scheduler,
                  packs: &mut HashMap<PackKey, Pack>,
                  checker: &mut Checker,
                  v: u64,
                  now,
                  out: &mut Vec<Output>| {
        let p = parse_pack(&render("p", v, &specs, safe)).expect("generated packs are valid");
        packs.insert(key.clone(), p.clone());
        if core.accept(p, now).drain_into(out).is_ok() {
            checker.stopped.remove(&key);
        }
    };
    accept(&mut core, &mut packs, &mut checker, version, now, &mut out);
    let p_fail: f64 = rng.random_range(0.0..0.6);
    for _ in 0..steps {
        drain(
            &mut core,
            &mut out,
            &mut checker,
            &packs,
            &mut held,
            &mut rng,
            now,
        );
        match rng.random_range(0..100) {
            // Deliver a random in-flight result (random order).
            0..=44 if !held.inflight.is_empty() => {
                let f = held
                    .inflight
                    .swap_remove(rng.random_range(0..held.inflight.len()));
                let r = match rng.random_range(0..100) {
                    x if f64::from(x) < p_fail * 100.0 => AttemptResult::Failed("injected".into()),
                    x if x > 97 => AttemptResult::Late { actual: now },
                    _ => AttemptResult::Ok { value: None },
                };
                // Occasionally lose the result: the timeout must handle it.
                checker
                    .trace
                    .push(format!("RESULT {} {r:?} at {now:?}", f.id));
                // (Not one found started by a withdrawal: that one ran.)
                if rng.random_range(0..20) != 0 || held.started.contains(&f.id) {
                    core.attempt_result(&f.id, r, now).drain_into(&mut out);
                } else {
                    held.lost.push(f);
                }
            }
            // Advance to the next wake (or a little past it).
            0..=89 => {
                if let Some(w) = core.next_wake() {
                    let extra = if rng.random_range(0..10) == 0 {
                        rng.random_range(0..3_000_000_000i64)
                    } else {
                        0
                    };
                    now = now.max(RefTime::from_nanos(w.as_nanos() + extra));
                    core.tick(now).drain_into(&mut out);
                }
            }
            // A clock step forward.
            90..=93 => {
                now = RefTime::from_nanos(now.as_nanos() + rng.random_range(0..60_000_000_000i64));
                core.tick(now).drain_into(&mut out);
            }
            // Replace with a higher version, or re-deliver the same one.
            94..=96 => {
                if rng.random_bool(0.5) {
                    version += 1;
                }
                checker.trace.push(format!("ACCEPT v{version} at {now:?}"));
                accept(&mut core, &mut packs, &mut checker, version, now, &mut out);
            }
            97 => {
                checker.trace.push(format!("CANCEL at {now:?}"));
                core.cancel(&key, now).drain_into(&mut out);
            }
            98 => core.lease_lost(now).drain_into(&mut out),
            _ => {
                // A duplicate (stale) result must be ignored.
                if let Some(f) = held.inflight.first() {
                    let id = f.id.clone();
                    core.attempt_result(&id, AttemptResult::Ok { value: None }, now)
                        .drain_into(&mut out);
                    held.inflight.retain(|x| x.id != id);
                }
            }
        }
    }
    // Stop, then let every running attempt end (results or timeouts).
    core.shutdown(now).drain_into(&mut out);
    for _ in 0..10_000 {
        drain(
            &mut core,
            &mut out,
            &mut checker,
            &packs,
            &mut held,
            &mut rng,
            now,
        );
        if let Some(f) = held.inflight.pop() {
            core.attempt_result(&f.id, AttemptResult::Ok { value: None }, now)
                .drain_into(&mut out);
        } else if let Some(w) = core.next_wake() {
            now = now.max(w);
            core.tick(now).drain_into(&mut out);
        } else {
            break;
        }
    }
    for o in out.drain(..) {
        checker.see(&o, &packs);
    }
    checker.finish()
}

/// The attempts the simulated runtime holds.
#[derive(Default)]
struct Held {
    /// Handed out, their results not delivered yet.
    inflight: Vec<Firing>,
    /// Results the harness dropped: those attempts never ran (a
    /// withdrawal of one succeeds).
    lost: Vec<Firing>,
    /// Found started by a withdrawal (too late): they ran, their results
    /// are never dropped.
    started: HashSet<baton_sched::ExecutionId>,
}

/// See every output; fires go in flight; a withdrawal is answered as a
/// runtime would: an attempt whose result was lost never ran (withdrawn),
/// one in flight is withdrawn or found started at random, one whose
/// result came had run (too late). A withdrawn replaced attempt is
/// reported by the runtime: it ends its occurrence.
fn drain(
    core: &mut Scheduler,
    out: &mut Vec<Output>,
    checker: &mut Checker,
    packs: &HashMap<PackKey, Pack>,
    held: &mut Held,
    rng: &mut ChaCha8Rng,
    now: RefTime,
) {
    let Held {
        inflight,
        lost,
        started,
    } = held;
    while !out.is_empty() {
        let batch = std::mem::take(out);
        for o in batch {
            checker.see(&o, packs);
            match o {
                Output::Fire(f) => inflight.push(f),
                Output::Withdraw { id, reason } => {
                    let in_lost = lost.iter().position(|f| f.id == id);
                    let in_flight = inflight.iter().position(|f| f.id == id);
                    let answer = match (in_lost, in_flight) {
                        (Some(k), _) => {
                            lost.swap_remove(k);
                            Withdrawal::Withdrawn
                        }
                        (None, Some(k)) if rng.random_bool(0.5) => {
                            inflight.swap_remove(k);
                            Withdrawal::Withdrawn
                        }
                        _ => {
                            started.insert(id.clone());
                            Withdrawal::TooLate
                        }
                    };
                    checker
                        .trace
                        .push(format!("WITHDRAW {id} {reason:?}: {answer:?}"));
                    if answer == Withdrawal::Withdrawn && reason == Reason::Replaced {
                        *checker.terminal.entry(id.idempotency_key()).or_default() += 1;
                    }
                    core.withdrawal(&id, answer, now).drain_into(out);
                }
                _ => {}
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold_under_random_packs_failures_and_orders(
        specs in prop::collection::vec(ins_spec(), 1..8),
        safe in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let v = run_case(specs, safe, seed, 400);
        prop_assert!(v.is_empty(), "violations:\n{}", v.join("\n"));
    }
}
