//! Memory of the core is O(instructions), not O(occurrences): counted with
//! a counting allocator, deterministically (bytes, not timings).

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::sync::atomic::{AtomicIsize, Ordering};

use baton_proto::RefTime;
use baton_proto::pack::parse_pack;
use baton_sched::{AttemptResult, Config, Output, Scheduler};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards to the system allocator and only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        // SAFETY: same layout, passed through.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        // SAFETY: same pointer and layout, passed through.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static A: Counting = Counting;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

const BASE: i64 = 1_796_119_200_000_000_000; // 2026-12-01T10:00:00Z

#[test]
fn memory_is_per_instruction_and_does_not_grow_with_occurrences() {
    let n = 2_000;
    let mut y = String::from("pack: m\nversion: 1\ninstructions:\n");
    for i in 0..n {
        y.push_str(&format!(
            "  - {{id: i{i}, action: gpio.write, params: {{line: {}, value: 1}}, every: 1s, start_at: {}}}\n",
            i % 64,
            if i == 0 { "&s 2026-12-01T10:00:00Z" } else { "*s" }
        ));
    }
    let before = live();
    let pack = parse_pack(&y).expect("valid");
    drop(y);
    let mut core = Scheduler::new(Config::default(), HashMap::new());
    let mut out = Vec::new();
    core.accept(pack, RefTime::from_nanos(BASE - 1))
        .drain_into(&mut out)
        .expect("accept");
    let held = live() - before;
    let per = held / n;
    eprintln!("core + pack: {held} bytes for {n} instructions = {per} B/instruction");
    assert!(per < 1200, "{per} B per pending instruction");
    assert_eq!(core.pending(), n as usize);

    // Rounds of firings, then a pause long enough for their records to
    // expire: the state after each such cycle must not grow.
    let mut t = BASE;
    let mut cycle = |core: &mut Scheduler, out: &mut Vec<Output>| {
        let mut fired = 0;
        for _ in 0..5 {
            core.tick(RefTime::from_nanos(t)).drain_into(out);
            for o in std::mem::take(out) {
                if let Output::Fire(f) = o {
                    fired += 1;
                    core.attempt_result(&f.id, AttemptResult::Ok { value: None }, f.scheduled)
                        .drain_into(out);
                }
            }
            out.clear();
            t += 1_000_000_000;
        }
        t += 200_000_000_000;
        core.tick(RefTime::from_nanos(t)).drain_into(out);
        for o in std::mem::take(out) {
            if let Output::Fire(f) = o {
                core.attempt_result(&f.id, AttemptResult::Ok { value: None }, f.scheduled)
                    .drain_into(out);
            }
        }
        out.clear();
        out.shrink_to_fit();
        fired
    };
    let fired = cycle(&mut core, &mut out);
    assert_eq!(fired, 5 * n);
    // The first cycle sizes the tables; from then on nothing may grow.
    cycle(&mut core, &mut out);
    let m1 = live() - before;
    for _ in 0..2 {
        cycle(&mut core, &mut out);
    }
    let m2 = live() - before;
    eprintln!(
        "after one cycle: {m1} bytes; after two more ({} firings in all): {m2} bytes",
        20 * n
    );
    assert!(
        (m2 - m1).abs() < n * 16,
        "memory grew from {m1} to {m2} bytes with more occurrences"
    );
    assert!(m1 / n < 1200, "{} B per instruction", m1 / n);
    assert_eq!(core.pending(), n as usize);
}
