//! `baton_sys::pages::page_out_file_pages`: the code and read-only data pages start-up
//! touched leave the resident set (so `lock_memory` does not lock them for
//! good), and what runs next comes back. Host only: `cross/test-aarch64.sh` runs lib tests, and
//! qemu-user need not pass `madvise` advice on to the host kernel.

fn rss_file_kb() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("RssFile:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("RssFile in /proc/self/status")
}

#[test]
fn file_pages_leave_the_resident_set_and_come_back_on_use() {
    // Touch a good deal of code first (formatting, parsing, collections).
    let pack = "pack: p\nversion: 1\ninstructions:\n  - {id: a, action: noop, every: 1s}\n";
    let parsed = baton_proto::pack::parse_pack(pack).expect("a valid pack");
    let before = rss_file_kb();
    baton_sys::pages::page_out_file_pages();
    let after = rss_file_kb();
    assert!(
        after + 256 < before,
        "file-backed RSS {before} kB -> {after} kB: nothing paged out"
    );
    // The code still runs (faulting back in what it needs).
    assert_eq!(parsed.instructions.len(), 1);
    assert!(baton_proto::pack::parse_pack(pack).is_ok());
}
