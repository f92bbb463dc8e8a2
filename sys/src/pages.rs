//! The process's own pages: touching a stack ahead of need, and giving
//! back the file pages only start-up read. Dropping pages is sound only
//! for mappings whose contents the file holds, so the check that makes it
//! so (`/proc/self/smaps`) lives here beside the call.

/// Touch `bytes` of the calling thread's stack so those pages are resident
/// (and, under mlockall, locked) before the first deadline.
#[inline(never)]
pub fn prefault_stack(bytes: usize) {
    let mut buf = [0u8; 64 * 1024];
    let n = bytes.min(buf.len());
    for i in (0..n).step_by(4096) {
        // Volatile: the writes must happen even though nothing reads them.
        // SAFETY: `i < n <= buf.len()`, so the pointer stays inside `buf`,
        // which this function owns; a `u8` needs no alignment.
        unsafe { std::ptr::write_volatile(buf.as_mut_ptr().add(i), 1) };
    }
    std::hint::black_box(&buf);
}

/// Drop the code and read-only data mapped so far (the agent's and its
/// libraries') from the resident set: what start-up alone used (argument
/// and config parsing, the pack parser, the journal's replay, and their
/// constant tables and messages) would otherwise stay resident, and
/// locked, for good. `MADV_DONTNEED` only unmaps the pages: they stay in
/// the page cache, so what the running agent uses comes back on first use
/// as a minor fault (microseconds, no disk) and is locked from then on.
/// Only unmodified file-backed mappings that cannot be written (`r-x`,
/// `r--`) are touched: a mapping with private copies of pages (text
/// relocations, RELRO data written before it was made read-only), resident
/// (`Anonymous` in smaps) or swapped out (`Swap`), would lose them, so it
/// is left alone.
pub fn page_out_file_pages() {
    let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
        return;
    };
    for (range, private_kb) in read_only_file_mappings(&smaps) {
        if private_kb != 0 {
            continue;
        }
        let (a, b) = range;
        // SAFETY: the range is a whole mapping of this process, file-backed,
        // read-only and without private copies, resident or swapped
        // (checked above): dropping its pages loses nothing, they are read
        // back from the file (the page cache) on the next access. Nothing
        // is unmapped or written.
        unsafe {
            libc::madvise(a as *mut libc::c_void, b - a, libc::MADV_DONTNEED);
        }
    }
}

/// The file-backed mappings in `/proc/self/smaps` text that the process
/// cannot write (`r-x` or `r--`), each with the kB of private copies of
/// its pages, resident (`Anonymous`) or swapped out (`Swap`). A mapping
/// whose fields are missing or unreadable counts as holding copies.
fn read_only_file_mappings(smaps: &str) -> Vec<((usize, usize), u64)> {
    // (range, Anonymous, Swap) of the mapping being read.
    type Reading = ((usize, usize), Option<u64>, Option<u64>);
    fn finish(out: &mut Vec<((usize, usize), u64)>, m: Option<Reading>) {
        if let Some((r, anon, swap)) = m {
            let private = match (anon, swap) {
                (Some(a), Some(s)) => a.saturating_add(s),
                _ => u64::MAX,
            };
            out.push((r, private));
        }
    }
    let kb = |v: &str| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok();
    let mut out = Vec::new();
    let mut current: Option<Reading> = None;
    for line in smaps.lines() {
        if let Some(v) = line.strip_prefix("Anonymous:") {
            if let Some(m) = current.as_mut() {
                m.1 = Some(kb(v).unwrap_or(u64::MAX));
            }
            continue;
        }
        if let Some(v) = line.strip_prefix("Swap:") {
            if let Some(m) = current.as_mut() {
                m.2 = Some(kb(v).unwrap_or(u64::MAX));
            }
            continue;
        }
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else {
            continue;
        };
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) else {
            continue; // a field line ("Rss: 4 kB"), not a mapping's header
        };
        // A new mapping: the previous one is complete.
        finish(&mut out, current.take());
        let path = f.nth(3).unwrap_or("");
        let read_only = perms.starts_with("r-x") || perms.starts_with("r--");
        current = (read_only && path.starts_with('/')).then_some(((a, b), None, None));
    }
    finish(&mut out, current);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_read_only_file_mappings_are_picked_with_their_private_copies() {
        let smaps = "\
55d000000000-55d000100000 r--p 00000000 fe:01 123 /usr/bin/baton-agent
Rss:                 400 kB
Anonymous:             0 kB
Swap:                  0 kB
55d000100000-55d000600000 r-xp 00100000 fe:01 123 /usr/bin/baton-agent
Rss:                2976 kB
Anonymous:             0 kB
Swap:                  0 kB
7f0000000000-7f0000100000 r-xp 00000000 fe:01 456 /usr/lib/x86_64-linux-gnu/with space.so
Anonymous:             8 kB
Swap:                  0 kB
7f0000100000-7f0000101000 r--p 00100000 fe:01 456 /usr/lib/x86_64-linux-gnu/with space.so
Anonymous:             0 kB
Swap:                  4 kB
7f0000200000-7f0000300000 rw-p 00000000 00:00 0 
Anonymous:          1024 kB
Swap:                  0 kB
7f0000300000-7f0000301000 rw-p 00003000 fe:01 456 /usr/lib/x86_64-linux-gnu/with space.so
Anonymous:             4 kB
Swap:                  0 kB
7f0000400000-7f0000410000 r--p 00000000 fe:01 789 /usr/lib/locale/C.utf8/LC_CTYPE
Anonymous:             0 kB
7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0                          [vdso]
Anonymous:             0 kB
Swap:                  0 kB
";
        assert_eq!(
            read_only_file_mappings(smaps),
            [
                ((0x55d0_0000_0000, 0x55d0_0010_0000), 0),
                ((0x55d0_0010_0000, 0x55d0_0060_0000), 0),
                ((0x7f00_0000_0000, 0x7f00_0010_0000), 8),
                // A relocated page swapped out is a private copy too.
                ((0x7f00_0010_0000, 0x7f00_0010_1000), 4),
                // No `Swap:` line read: not known to be clean.
                ((0x7f00_0040_0000, 0x7f00_0041_0000), u64::MAX),
            ]
        );
    }
}
