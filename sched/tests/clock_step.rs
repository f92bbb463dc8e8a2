//! Issue 26.12: a step of the reference clock (the agent's estimate, on a
//! jittery link) is downtime or an early wake for a pack placed on absolute
//! time, but a pack of intervals only runs on the local clock: it never
//! skips for it, never fires twice, and keeps its interval on the local
//! (monotonic) scale.
//!
//! The runtime's rule: reference time = monotonic + offset; a step moves
//! the offset by `step` at once. Here the local clock is `mono` and the
//! core is fed `mono + offset`.

use std::collections::HashSet;

use baton_proto::RefTime;
use baton_proto::pack::parse_pack;
use baton_sched::{AttemptResult, Config, EventKind, Output, Reason, Scheduler};

const BASE: i64 = 1_796_000_000_000_000_000;
const MS: i64 = 1_000_000;

/// Runs `yaml` for 2 s of local time with the reference stepping by
/// `steps` (local ms, step ns); returns the local instants fired at and the
/// skips' reasons.
fn run(yaml: &str, steps: &[(i64, i64)]) -> (Vec<i64>, Vec<Reason>) {
    let pack = parse_pack(yaml).expect("pack");
    let mut core = Scheduler::new(Config::default(), std::collections::HashMap::new());
    let mut out = Vec::new();
    let mut offset = BASE;
    let refn = |mono: i64, offset: i64| RefTime::from_nanos(mono + offset);
    core.accept(pack, refn(0, offset))
        .drain_into(&mut out)
        .expect("accept");
    let (mut fired, mut skips) = (Vec::new(), Vec::new());
    let mut ids = HashSet::new();
    let mut pending_steps = steps.to_vec();
    let mut mono = 0;
    while mono <= 2_000 * MS {
        if let Some(&(at, step)) = pending_steps.first()
            && mono >= at * MS
        {
            pending_steps.remove(0);
            offset += step;
            core.clock_stepped(step, refn(mono, offset))
                .drain_into(&mut out);
        }
        core.tick(refn(mono, offset)).drain_into(&mut out);
        let mut results = Vec::new();
        for o in out.drain(..) {
            match o {
                Output::Fire(f) => {
                    assert!(ids.insert(f.id.clone()), "fired twice: {}", f.id);
                    fired.push(mono);
                    results.push(f);
                }
                Output::Event(e) => {
                    if let EventKind::Skip { reason, .. } = e.kind {
                        skips.push(reason);
                    }
                }
                _ => {}
            }
        }
        for f in results {
            let now = refn(mono, offset);
            core.attempt_result(&f.id, AttemptResult::Ok { value: None }, now)
                .drain_into(&mut out);
        }
        out.clear();
        mono += MS;
    }
    (fired, skips)
}

const EVERY: &str = "pack: p\nversion: 1\ninstructions:\n  - {id: t, action: noop, every: 50ms, max_lateness: 5ms}\n";

#[test]
fn a_pack_of_intervals_follows_the_local_clock_through_steps() {
    // Seven steps of ±40 ms in two seconds, as on the jittery link.
    let steps = [
        (110, 40 * MS),
        (333, -40 * MS),
        (512, 40 * MS),
        (700, 40 * MS),
        (901, -40 * MS),
        (1_250, -40 * MS),
        (1_600, 40 * MS),
    ];
    let (fired, skips) = run(EVERY, &steps);
    assert!(skips.is_empty(), "skipped: {skips:?}");
    // Every 50 ms of local time, whatever the reference did.
    assert_eq!(fired.len(), 41, "{fired:?}");
    for w in fired.windows(2) {
        assert_eq!(w[1] - w[0], 50 * MS, "{fired:?}");
    }
}

#[test]
fn a_pack_on_absolute_time_treats_a_forward_step_as_downtime() {
    let yaml = format!(
        "pack: p\nversion: 1\ninstructions:\n  - {{id: t, action: noop, every: 50ms, max_lateness: 5ms, start_at: {}}}\n",
        RefTime::from_nanos(BASE).to_rfc3339()
    );
    let (fired, skips) = run(&yaml, &[(110, 60 * MS)]);
    // The occurrence due within the skipped 60 ms (at 150) is missed, for
    // the clock; the schedule resumes on reference time (200, 250...).
    assert_eq!(skips, [Reason::Clock]);
    assert_eq!(fired.len(), 3 + 38, "{fired:?}");
    // A backward step is an early wake: nothing is missed, nothing twice.
    let (fired, skips) = run(&yaml, &[(110, -40 * MS)]);
    assert!(skips.is_empty(), "{skips:?}");
    assert_eq!(
        fired.len(),
        41 - 1,
        "40 ms of reference time came again: {fired:?}"
    );
}
