//! `rt::return_free_heap`: with memory locked (as the running agent has
//! it), freed heap pages still go back to the kernel, and the heap stays
//! locked afterwards. `harness = false`: this runs on the process's main
//! thread, whose allocations glibc serves from `[heap]`, and its
//! `mlockall` concerns no other test.

fn status_kb(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/self/status"))
}

/// The `[heap]` mapping's `Locked:` size and whether it is flagged locked
/// (`lf`: locked on fault), from smaps.
fn heap_lock() -> (u64, bool) {
    let smaps = std::fs::read_to_string("/proc/self/smaps").expect("/proc/self/smaps");
    let mut in_heap = false;
    let (mut locked_kb, mut flagged) = (0, false);
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        let is_header = first.split_once('-').is_some_and(|(a, b)| {
            u64::from_str_radix(a, 16).is_ok() && u64::from_str_radix(b, 16).is_ok()
        });
        if is_header {
            in_heap = line.trim_end().ends_with("[heap]");
        }
        if !in_heap {
            continue;
        }
        if let Some(v) = line.strip_prefix("Locked:") {
            locked_kb = v.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
        }
        if let Some(v) = line.strip_prefix("VmFlags:") {
            flagged = v.split_whitespace().any(|f| f == "lf");
        }
    }
    (locked_kb, flagged)
}

fn main() {
    if !cfg!(target_env = "gnu") {
        // Only glibc's heap is trimmed (musl's allocator returns memory
        // itself).
        println!("return_free_heap: not glibc; skipped");
        println!("test result: ok. 0 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out");
        return;
    }
    let mut st = baton_agent::rt::RtStatus::default();
    baton_agent::rt::lock_memory(&mut st);
    if !st.locked {
        // Without CAP_IPC_LOCK or a large RLIMIT_MEMLOCK this cannot be
        // shown; CI runs as root.
        baton_testenv::missing(
            "return_free_heap",
            None,
            &format!("memory not locked here ({:?})", st.refused),
        );
        println!("test result: ok. 0 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out");
        return;
    }
    // A burst's worth of small allocations (below glibc's mmap threshold,
    // so on the heap), touched, then freed but for every 64th: the heap
    // cannot shrink from its top, its free middle must be trimmed.
    let blocks: Vec<Box<[u8; 4000]>> = (0..8_000).map(|i| Box::new([i as u8; 4000])).collect();
    let keep: Vec<Box<[u8; 4000]>> = blocks
        .into_iter()
        .enumerate()
        .filter_map(|(i, b)| (i % 64 == 63).then_some(b))
        .collect();
    let before = status_kb("RssAnon:");
    assert!(
        heap_lock().0 > 20_000,
        "the burst's pages are locked: {:?}",
        heap_lock()
    );
    let heap = baton_agent::rt::return_free_heap().expect("the heap is locked again on fault");
    let after = status_kb("RssAnon:");
    assert!(
        heap.is_some(),
        "glibc with memory locked on fault: the heap is trimmed"
    );
    assert!(
        after + 20_000 < before,
        "anonymous RSS {before} kB -> {after} kB: the freed ~31 MB did not go back"
    );
    let (locked_kb, flagged) = heap_lock();
    assert!(flagged, "the heap is locked again (on fault)");
    assert!(locked_kb > 0, "what is in use stays locked");
    // What was kept is intact, and the heap still serves allocations.
    // Block i of `keep` is block 64·i + 63 of the burst, filled with that
    // number's low byte: a page wrongly dropped would read back as zeros.
    assert_eq!(keep.len(), 125);
    for (i, b) in keep.iter().enumerate() {
        let n = 64 * i + 63;
        assert!(
            b.iter().all(|&x| x == n as u8),
            "kept block {i} (burst block {n}) changed"
        );
    }
    let more: Vec<Box<[u8; 4000]>> = (0..1_000).map(|_| Box::new([7; 4000])).collect();
    assert!(more.iter().all(|b| b[123] == 7));
    println!(
        "return_free_heap: anonymous RSS {before} kB -> {after} kB, heap locked again ({locked_kb} kB)"
    );
    println!("test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out");
}
