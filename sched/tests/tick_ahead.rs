//! Arming ahead: `tick_ahead(now, horizon)` hands out firings due within
//! the horizon, decided as of their own instant. Ticking at `now + horizon`
//! made each look late by up to the horizon, and a `max_lateness` below it
//! skipped every occurrence.

use std::time::Duration;

use baton_proto::RefTime;
use baton_proto::pack::parse_pack;
use baton_sched::{AttemptResult, Config, EventKind, Output, Scheduler};

fn ms(n: i64) -> RefTime {
    RefTime::from_nanos(1_796_000_000_000_000_000 + n * 1_000_000)
}

#[test]
fn firings_armed_ahead_are_on_time_even_with_a_tiny_max_lateness() {
    let pack = parse_pack(
        "pack: p\nversion: 1\ninstructions:\n  - {id: t, action: noop, every: 10ms, max_lateness: 1ms}\n",
    )
    .expect("pack");
    let mut core = Scheduler::new(Config::default(), std::collections::HashMap::new());
    let mut out = Vec::new();
    core.accept(pack, ms(0))
        .drain_into(&mut out)
        .expect("accept");
    let horizon = Duration::from_millis(5);
    let (mut fired, mut skipped) = (0, 0);
    // The runtime wakes half a horizon before each occurrence.
    let mut now = ms(0);
    while now < ms(1000) {
        core.tick_ahead(now, horizon).drain_into(&mut out);
        let mut results = Vec::new();
        for o in out.drain(..) {
            match o {
                Output::Fire(f) => {
                    assert!(f.scheduled >= now, "armed ahead, never behind");
                    assert!(f.not_after >= f.scheduled + Duration::from_millis(1));
                    fired += 1;
                    results.push(f);
                }
                Output::Event(e) if matches!(e.kind, EventKind::Skip { .. }) => skipped += 1,
                _ => {}
            }
        }
        for f in results {
            core.attempt_result(&f.id, AttemptResult::Ok { value: None }, f.scheduled)
                .drain_into(&mut out);
        }
        out.clear();
        now = core.next_wake().map_or(ms(1000), |w| {
            w.saturating_sub(horizon / 2)
                .max(now + Duration::from_micros(1))
        });
    }
    assert_eq!(skipped, 0, "nothing skipped");
    // 0, 10, ..., 1000 ms: the last one armed ahead of the loop's end.
    assert_eq!(fired, 101);
}
