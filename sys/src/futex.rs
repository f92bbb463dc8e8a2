//! Futex wait and wake on a word of our own (`FUTEX_PRIVATE_FLAG`).
//!
//! Why a futex and not `clock_nanosleep(TIMER_ABSTIME)`: both sleep to an
//! absolute monotonic deadline, but only the futex can be woken early
//! without signals when an earlier firing arrives. nix 0.30 has no futex
//! wrapper: raw libc.

use std::io;
use std::sync::atomic::AtomicU32;

/// Sleep while `word` holds `seen`, until woken or until the absolute
/// `CLOCK_MONOTONIC` deadline (`deadline_ns`, ns; before the epoch is a
/// past deadline). `Ok` when woken; the error says why not (`EAGAIN`: the
/// word had changed; `ETIMEDOUT`: the deadline passed; `EINTR`: a signal).
pub fn wait(word: &AtomicU32, seen: u32, deadline_ns: Option<i64>) -> io::Result<()> {
    let ts = deadline_ns.map(|d| {
        let d = d.max(0);
        libc::timespec {
            tv_sec: (d / 1_000_000_000) as libc::time_t,
            tv_nsec: (d % 1_000_000_000) as libc::c_long,
        }
    });
    let ts_ptr = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `word.as_ptr()` points to a live, aligned u32 (borrowed for
    // the whole call) that the kernel only reads; `ts_ptr` is null or points
    // to `ts`, alive until the end of this function; the `uaddr2` argument
    // is unused by FUTEX_WAIT_BITSET (null). Without FUTEX_CLOCK_REALTIME the
    // timeout is absolute on CLOCK_MONOTONIC. Nothing is written to memory.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT_BITSET | libc::FUTEX_PRIVATE_FLAG,
            seen,
            ts_ptr,
            std::ptr::null::<u32>(),
            libc::FUTEX_BITSET_MATCH_ANY,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Wake every waiter on `word` (after changing it).
pub fn wake_all(word: &AtomicU32) -> io::Result<()> {
    // SAFETY: `word.as_ptr()` points to a live, aligned u32 borrowed for the
    // whole call; FUTEX_WAKE only uses it as a key (no read or write of our
    // memory) and takes no other pointer.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    #[test]
    fn a_changed_word_returns_at_once_and_a_past_deadline_times_out() {
        let w = AtomicU32::new(1);
        let e = wait(&w, 0, None).expect_err("word differs");
        assert_eq!(e.raw_os_error(), Some(libc::EAGAIN));
        let e = wait(&w, 1, Some(0)).expect_err("deadline passed");
        assert_eq!(e.raw_os_error(), Some(libc::ETIMEDOUT));
    }

    #[test]
    fn a_waiter_is_woken() {
        let w = Arc::new(AtomicU32::new(0));
        let w2 = w.clone();
        let t = std::thread::spawn(move || {
            while w2.load(Ordering::SeqCst) == 0 {
                let _ = wait(&w2, 0, None);
            }
        });
        w.store(1, Ordering::SeqCst);
        wake_all(&w).expect("wake");
        t.join().expect("waiter ended");
    }
}
