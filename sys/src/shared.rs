//! Memory shared with a file (or with nobody), accessed only through
//! atomics: the agent's dispatch ledger lives in one, so what a thread
//! stored survives `kill -9` in the file.
//!
//! Other processes may map the same file and store into it at any time, so
//! the bytes are never seen as plain Rust values: only as atomic words, at
//! offsets this type checks (in bounds, aligned).

use std::fs::File;
use std::io;
use std::num::NonZeroUsize;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64};

use nix::sys::mman::{MapFlags, ProtFlags, mmap, mmap_anonymous, munmap};

/// A read-write mapping of `len` bytes, unmapped on drop.
#[derive(Debug)]
pub struct AtomicMap {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; every access
// after construction goes through atomics (`u64_at`, `u32_at`), which are
// safe to share between threads.
unsafe impl Send for AtomicMap {}
// SAFETY: as above: concurrent access is atomic only.
unsafe impl Sync for AtomicMap {}

impl AtomicMap {
    /// Map the first `len` bytes of `file` shared (`MAP_SHARED`): stores
    /// reach the file. The file must be at least `len` bytes long.
    pub fn shared(file: &File, len: usize) -> io::Result<AtomicMap> {
        let nz = NonZeroUsize::new(len).ok_or_else(|| io::Error::other("empty mapping"))?;
        if file.metadata()?.len() < len as u64 {
            return Err(io::Error::other("file shorter than the mapping"));
        }
        // SAFETY: a fresh mapping at an address the kernel picks (no
        // existing memory is replaced); it is only ever accessed through
        // atomics, so stores by other mappings of the file are no data race
        // on Rust values.
        let ptr = unsafe {
            mmap(
                None,
                nz,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                file,
                0,
            )
        }?;
        Ok(AtomicMap {
            ptr: ptr.cast(),
            len,
        })
    }

    /// `len` bytes of private anonymous memory, zero-filled by the kernel.
    pub fn anonymous(len: usize) -> io::Result<AtomicMap> {
        let nz = NonZeroUsize::new(len).unwrap_or(NonZeroUsize::MIN);
        // SAFETY: a fresh private anonymous mapping at an address the kernel
        // picks; nothing existing is replaced.
        let ptr = unsafe {
            mmap_anonymous(
                None,
                nz,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_PRIVATE,
            )
        }?;
        Ok(AtomicMap {
            ptr: ptr.cast(),
            len: nz.get(),
        })
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is mapped (never: a mapping has at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The 8-byte word at byte `offset`. Panics when it is out of bounds or
    /// not 8-aligned (a caller's arithmetic error, never input).
    pub fn u64_at(&self, offset: usize) -> &AtomicU64 {
        self.check(offset, 8);
        // SAFETY: in bounds and aligned (checked; the base is page-aligned);
        // the memory lives as long as `self` and is only ever accessed
        // atomically.
        unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().add(offset).cast()) }
    }

    /// The 4-byte word at byte `offset`; panics as [`AtomicMap::u64_at`].
    pub fn u32_at(&self, offset: usize) -> &AtomicU32 {
        self.check(offset, 4);
        // SAFETY: as in `u64_at`, for 4 bytes.
        unsafe { AtomicU32::from_ptr(self.ptr.as_ptr().add(offset).cast()) }
    }

    fn check(&self, offset: usize, size: usize) {
        assert!(
            offset.checked_add(size).is_some_and(|end| end <= self.len),
            "word at {offset} past the mapping's {} bytes",
            self.len
        );
        assert!(
            offset.is_multiple_of(size),
            "word at {offset} not {size}-aligned"
        );
    }
}

impl Drop for AtomicMap {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what mmap returned, and every
        // reference handed out borrows `self`, so none outlives the mapping.
        let _ = unsafe { munmap(self.ptr.cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::atomic::Ordering;

    #[test]
    fn stores_reach_the_file_and_bad_offsets_are_refused() {
        let mut f = tempfile::tempfile().expect("temp file");
        f.write_all(&[0u8; 64]).expect("sized");
        let m = AtomicMap::shared(&f, 64).expect("mapped");
        m.u64_at(8).store(0x0102_0304_0506_0708, Ordering::SeqCst);
        m.u32_at(60).store(7, Ordering::SeqCst);
        let again = AtomicMap::shared(&f, 64).expect("mapped twice");
        assert_eq!(
            again.u64_at(8).load(Ordering::SeqCst),
            0x0102_0304_0506_0708
        );
        assert_eq!(again.u32_at(60).load(Ordering::SeqCst), 7);
        assert!(std::panic::catch_unwind(|| m.u64_at(60).load(Ordering::SeqCst)).is_err());
        assert!(std::panic::catch_unwind(|| m.u32_at(2).load(Ordering::SeqCst)).is_err());
        assert!(AtomicMap::shared(&f, 128).is_err(), "file too short");
    }

    #[test]
    fn anonymous_memory_starts_zeroed() {
        let m = AtomicMap::anonymous(4096).expect("mapped");
        assert_eq!(m.u64_at(4088).load(Ordering::SeqCst), 0);
    }
}
