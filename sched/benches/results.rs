//! What a firing's result costs the core as a pack grows: a result names
//! its instruction by id, so a search per result would cost in proportion
//! to the pack. Times `attempt_result` for every firing of one instant of
//! a pack of 500 and of 10 000 instructions; the peer is the small pack in
//! the same run (the figure is the ratio: flat is what the index buys).
//!
//! `cargo bench -p baton-sched --bench results`

use std::collections::HashMap;
use std::hint::black_box;
use std::time::Instant;

use baton_proto::RefTime;
use baton_proto::pack::parse_pack;
use baton_sched::{AttemptResult, Config, Output, Scheduler};

const BASE: i64 = 1_796_119_200_000_000_000; // 2026-12-01T10:00:00Z

/// Nanoseconds per result over one instant's firings of a pack of `n`
/// instructions, the best of `runs`.
fn per_result(n: usize, runs: usize) -> f64 {
    let mut body = String::from("pack: p\nversion: 1\ninstructions:\n");
    for i in 0..n {
        body.push_str(&format!(
            "  - {{id: instruction-number-{i}, action: noop, every: 1s, start_at: 2026-12-01T10:00:00Z}}\n"
        ));
    }
    let pack = parse_pack(&body).expect("bench pack");
    let mut best = f64::MAX;
    for _ in 0..runs {
        let mut core = Scheduler::new(Config::default(), HashMap::new());
        let now = RefTime::from_nanos(BASE);
        let _ = core.accept(pack.clone(), now);
        let fired: Vec<_> = core
            .tick(now)
            .filter_map(|o| match o {
                Output::Fire(f) => Some(f.id),
                _ => None,
            })
            .collect();
        assert_eq!(fired.len(), n, "every instruction fires at the instant");
        let started = Instant::now();
        for id in &fired {
            for o in core.attempt_result(id, AttemptResult::Ok { value: None }, now) {
                drop(black_box(o));
            }
        }
        best = best.min(started.elapsed().as_nanos() as f64 / n as f64);
    }
    best
}

fn main() {
    let small = per_result(500, 20);
    let large = per_result(10_000, 5);
    println!("a result's cost in the core, best of several runs:");
    println!("  500 instructions      {small:>10.0} ns per result");
    println!("  10 000 instructions   {large:>10.0} ns per result");
    println!("  ratio 10 000 / 500    {:>10.2}x", large / small);
}
