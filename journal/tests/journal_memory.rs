//! The journal's memory stays bounded and flat: feedback payloads live on
//! disk (RAM holds 8 bytes of index per record), and execution ids and once
//! keys past the retention horizon are forgotten on heartbeats, not only at
//! compaction. Measured with a counting global allocator, so this binary
//! holds exactly one test (a second one would allocate concurrently).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use baton_journal::{Journal, JournalConfig, Outcome};

/// Bytes currently allocated by the whole process.
static LIVE: AtomicIsize = AtomicIsize::new(0);

struct Counting;

// SAFETY: every call is forwarded unchanged to the system allocator; the
// counter only observes sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as ours.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as ours.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: same contract as ours.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_add(
                new_size as isize - layout.size() as isize,
                Ordering::Relaxed,
            );
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

/// A feedback record of about 200 bytes, as the agent writes them.
fn feedback(n: u64) -> Vec<u8> {
    format!(
        "{{\"execution_id\":\"plant-a/line3-startup/7/press/{n:010}/0/0\",\"instruction\":\"press\",\
         \"event\":\"executed\",\"scheduled_ns\":{n},\"actual_ns\":{n},\"lateness_ns\":1234,\
         \"result\":\"ok\",\"value\":null}}"
    )
    .into_bytes()
}

#[test]
fn journal_memory_stays_flat_with_undelivered_feedback_and_a_short_retention() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let sec = 1_000_000_000i64;
    let cfg = JournalConfig {
        outbox_cap: 10_000,
        retention_ns: 5 * sec,
        // Small enough that the steady phase compacts (copying the outbox).
        max_log_bytes: 2 << 20,
        ..JournalConfig::new(tmp.path())
    };
    let (mut j, _) = Journal::open(cfg).expect("open");

    // 1. 10 000 undelivered feedback records of ~200 bytes: 2 MB of
    //    payload, which the journal must not hold.
    let record_len = feedback(0).len();
    assert!((170..=250).contains(&record_len), "{record_len}");
    let base = live();
    for n in 0..10_000 {
        j.push_feedback(&feedback(n)).expect("push");
    }
    let outbox_cost = live() - base;
    eprintln!(
        "10 000 undelivered feedback records of {record_len} B: {outbox_cost} B of RAM \
         (payload {} B)",
        10_000 * record_len
    );
    assert!(
        outbox_cost < 256 << 10,
        "10 000 undelivered records cost {outbox_cost} B of RAM"
    );
    assert_eq!(j.outbox_len(), 10_000);

    // 2. Steady state, no acks: per 100 ms of reference time, 50 firings
    //    (started, finished, feedback) and a once key. Retention 5 s.
    let mut samples = Vec::new();
    let mut peak_held = 0;
    let mut compactions = 0;
    let mut last_len = j.log_bytes();
    for step in 0..400i64 {
        let now = step * sec / 10;
        let ids: Vec<String> = (0..50)
            .map(|k| format!("plant-a/line3-startup/7/press/{step:06}{k:04}/0/0"))
            .collect();
        let batch: Vec<(&str, i64)> = ids.iter().map(|s| (s.as_str(), now)).collect();
        j.record_started(&batch).expect("started");
        for (k, id) in ids.iter().enumerate() {
            j.push_feedback(&feedback(k as u64)).expect("push");
            j.record_finished(id, Outcome::Succeeded).expect("finished");
        }
        let _ = j.record_once(&format!("report/{step}"), now).expect("once");
        let beat = j.heartbeat(now).expect("heartbeat");
        assert!(beat.compaction_error.is_none());
        drop((batch, beat));
        drop(ids);
        if j.log_bytes() < last_len {
            compactions += 1;
        }
        last_len = j.log_bytes();
        let held = j.held();
        peak_held = peak_held.max(held.attempts + held.once);
        // After the retention window has filled (and one full quarter more).
        if step >= 100 {
            samples.push(live());
        }
    }
    let (lo, hi) = (
        *samples.iter().min().expect("samples"),
        *samples.iter().max().expect("samples"),
    );
    eprintln!(
        "steady state: {} B .. {} B allocated (spread {} B), peak {} ids + keys held, \
         {compactions} compactions, log {} B",
        lo - base,
        hi - base,
        hi - lo,
        peak_held,
        j.log_bytes()
    );
    assert!(compactions >= 1, "the steady phase should compact");
    assert_eq!(j.outbox_len(), 10_000, "the cap holds, drops counted");
    assert!(j.dropped() >= 20_000 - 10_000);
    // 5 s retention + a quarter: at most 51 ids/keys x 65 steps.
    assert!(peak_held <= 51 * 65, "held {peak_held}");
    // No trend: the second half of the run peaks no higher than the first
    // (the sawtooth of amortised pruning and compaction repeats).
    let (first, second) = samples.split_at(samples.len() / 2);
    let peak = |s: &[isize]| *s.iter().max().expect("samples");
    assert!(
        peak(second) <= peak(first) + (16 << 10),
        "memory grows: first half peaked at {} B, second at {} B",
        peak(first) - base,
        peak(second) - base
    );
    assert!(
        hi - lo < 256 << 10,
        "memory drifted by {} B under a steady load",
        hi - lo
    );
    assert!(hi - base < 1 << 20, "steady state costs {} B", hi - base);

    // 3. What a retained id costs (informational, and a loose bound).
    let before = live();
    let ids: Vec<String> = (0..10_000)
        .map(|k| format!("plant-a/line3-startup/7/press/{k:010}/0/0"))
        .collect();
    let ids_heap = live() - before;
    let now = 400 * sec / 10;
    for chunk in ids.chunks(1_000) {
        let batch: Vec<(&str, i64)> = chunk.iter().map(|s| (s.as_str(), now)).collect();
        j.record_started(&batch).expect("started");
    }
    let per_id = (live() - before - ids_heap) / 10_000;
    eprintln!("one retained id of {} B: ~{per_id} B of RAM", ids[0].len());
    assert!(per_id < 200, "{per_id} B per id");
}
