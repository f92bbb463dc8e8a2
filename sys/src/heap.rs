//! The C allocator and locked memory: giving freed heap back, and the
//! range calls (`munlock`, `mlock2`, `madvise(WILLNEED)`) that the agent's
//! locked-heap trim is made of. None of these reads or writes the memory it
//! names, so each is sound for any range (a range not mapped is an error).

use std::io;

/// Asks the C allocator to give the memory it holds free back to the
/// system; whether it gave anything.
///
/// glibc returns freed memory by itself only from the top of each arena:
/// after a burst (a thousand agents' feedback decoded at once) the pages
/// freed below memory still in use stay resident for good. `malloc_trim`
/// walks every arena and gives back every whole free page. It locks each
/// arena in turn, so call it at a quiet moment, not per request. Other C
/// libraries (musl) have no such call and return large blocks themselves:
/// there this does nothing.
pub fn release_free_heap() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim takes no pointer and touches only the
        // allocator's own free lists, under the allocator's own locks; it
        // is safe to call from any thread at any time.
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// Serve allocations of `bytes` and more with their own mappings, which
/// `free` returns at once (glibc's `M_MMAP_THRESHOLD`; fixing it also stops
/// glibc raising it after a large free). Whether the allocator took it;
/// other C libraries: false.
pub fn set_mmap_threshold(bytes: i32) -> bool {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: mallopt only sets allocator tunables; no memory is touched.
        unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, bytes) != 0 }
    }
    #[cfg(not(target_env = "gnu"))]
    {
        let _ = bytes;
        false
    }
}

/// Clear the lock flag of `[start, start + len)`.
pub fn unlock(start: usize, len: usize) -> io::Result<()> {
    // SAFETY: munlock only clears the lock flag of the range; no memory is
    // read, written or unmapped.
    if unsafe { libc::munlock(start as *const libc::c_void, len) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Lock `[start, start + len)` on fault: resident pages now, others when
/// first touched, without faulting any in (`mlock2(MLOCK_ONFAULT)`; nix
/// 0.30 has no mlock2, and plain mlock would fault free pages in). If the
/// kernel refuses, the range is locked fully (faulting it in) as a fallback
/// and the refusal returned.
pub fn lock_on_fault(start: usize, len: usize) -> io::Result<()> {
    let ptr = start as *mut libc::c_void;
    // SAFETY: sets the lock flag of the range; no memory is read or written.
    if unsafe { libc::mlock2(ptr, len, libc::MLOCK_ONFAULT) } == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    // SAFETY: as above; locks (and faults in) the whole range.
    unsafe {
        libc::mlock(ptr, len);
    }
    Err(e)
}

/// Advise that `[start, start + len)` is needed soon: swapped-out pages
/// start coming back. Advice only: contents are untouched.
pub fn advise_will_need(start: usize, len: usize) {
    // SAFETY: MADV_WILLNEED is advice only; pages never touched stay
    // untouched and no content changes.
    unsafe {
        libc::madvise(start as *mut libc::c_void, len, libc::MADV_WILLNEED);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_heap_can_be_given_back() {
        // Many blocks, every other one freed: the freed ones sit below
        // live memory, where only a trim returns them.
        let mut blocks: Vec<Vec<u8>> = (0..4096).map(|_| vec![1u8; 16 * 1024]).collect();
        for i in (0..blocks.len()).step_by(2) {
            blocks[i] = Vec::new();
        }
        let gave = release_free_heap();
        if cfg!(all(target_os = "linux", target_env = "gnu")) {
            assert!(gave, "glibc gave nothing back");
        } else {
            assert!(!gave);
        }
        assert!(blocks[1].iter().all(|b| *b == 1), "live memory untouched");
    }
}
