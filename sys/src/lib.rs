//! baton's calls into the C library that neither `nix` nor `rustix`
//! offers, each behind a safe function with its SAFETY note, so the crates
//! that use them stay `#![forbid(unsafe_code)]`.
//!
//! Today: giving freed heap back to the system (the controller, after a
//! burst of feedback). The agent's own (`agent/src/rt.rs` and friends)
//! are to move here (issue 25).

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
