//! The calling thread's scheduling policy.
//!
//! nix 0.30 has no sched_setscheduler, and musl's libc function is a stub
//! that always fails (ENOSYS: POSIX means the process, Linux the thread):
//! the system call itself, as glibc makes it.

use std::io;

/// Put the calling thread under `SCHED_FIFO` at `priority` (1–99).
pub fn set_fifo(priority: i32) -> io::Result<()> {
    // SAFETY: sched_param is plain integers (musl adds a few more fields
    // than glibc), for which all-zero bytes are a valid value.
    let mut param: libc::sched_param = unsafe { std::mem::zeroed() };
    param.sched_priority = priority;
    // SAFETY: `param` is a live, initialised sched_param that the kernel
    // only reads during the call; pid 0 names the calling thread.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_sched_setscheduler,
            0,
            libc::SCHED_FIFO,
            &param as *const libc::sched_param,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The calling thread's policy as the kernel has it (`libc::SCHED_*`).
pub fn current_policy() -> io::Result<i32> {
    // SAFETY: no arguments but pid 0 (the calling thread); nothing of ours
    // is read or written.
    let rc = unsafe { libc::syscall(libc::SYS_sched_getscheduler, 0) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc as i32)
    }
}
