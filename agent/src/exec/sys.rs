//! The few raw system calls the exec pool needs, and all of its `unsafe`.
//!
//! std's `Child` spawns, sets the process group and reaps; what it lacks is
//! "wait for exit *without* reaping" (so the process-group id cannot be
//! recycled before we `killpg` it), a pollable exit event (pidfd), and
//! `killpg` itself.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// `pidfd_open(2)`: a descriptor that polls readable when `pid` exits.
///
/// `ENOSYS` on kernels before 5.3 (old vendor kernels on edge boxes); the
/// caller then falls back to short poll slices.
pub(crate) fn pidfd_open(pid: libc::pid_t) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor
    // or -1; no memory is passed.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = RawFd::try_from(fd).map_err(|_| io::Error::other("pidfd out of range"))?;
    // SAFETY: the kernel just returned this descriptor to us; we own it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// True once `pid` (our child) has exited, without reaping it: the zombie
/// keeps the pid — and so the process-group id — reserved until we `wait`.
/// `ECHILD` (someone else reaped it, e.g. `SIGCHLD` ignored) counts as exited.
pub(crate) fn exited_nowait(pid: libc::pid_t) -> io::Result<bool> {
    loop {
        // SAFETY: all-zero is a valid siginfo_t (plain C struct).
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is a valid, writable siginfo_t for the call.
        let r = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            )
        };
        if r == 0 {
            // SAFETY: waitid filled `info` (or left it zeroed: no change).
            return Ok(unsafe { info.si_pid() } != 0);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::ECHILD) => return Ok(true),
            _ => return Err(e),
        }
    }
}

/// `killpg(pgid, SIGKILL)`; a group already gone is not an error.
pub(crate) fn kill_group(pgid: libc::pid_t) -> io::Result<()> {
    // SAFETY: killpg takes plain integers.
    if unsafe { libc::killpg(pgid, libc::SIGKILL) } == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::ESRCH) {
        return Ok(());
    }
    Err(e)
}

/// Put `fd` in non-blocking mode so draining it never hangs on a writer
/// that escaped the process group and keeps the pipe open.
pub(crate) fn set_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    let raw = fd.as_raw_fd();
    // SAFETY: fcntl on a descriptor we hold a borrow of.
    let flags = unsafe { libc::fcntl(raw, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(raw, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A close-on-exec pipe `(read, write)`; the pool's stop signal: closing the
/// write end makes the read end poll readable (EOF) for every worker at once.
pub(crate) fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded; both descriptors are new and ours.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Readiness of each descriptor passed to [`poll`].
pub(crate) const READY: libc::c_short = libc::POLLIN | libc::POLLHUP | libc::POLLERR;

/// `poll(2)` on up to three descriptors for reading, at most `timeout`
/// (`None`: forever). Returns each descriptor's `revents`, in order; all
/// zero on timeout or `EINTR` (the caller re-checks and polls again).
pub(crate) fn poll(
    fds: &[Option<BorrowedFd<'_>>; 3],
    timeout: Option<Duration>,
) -> io::Result<[libc::c_short; 3]> {
    let mut pfds = [libc::pollfd {
        fd: -1,
        events: 0,
        revents: 0,
    }; 3];
    for (p, fd) in pfds.iter_mut().zip(fds) {
        if let Some(fd) = fd {
            p.fd = fd.as_raw_fd();
            p.events = libc::POLLIN;
        }
    }
    let ms = match timeout {
        None => -1,
        // Round up: waking a millisecond early would just spin once more.
        Some(t) => i32::try_from(t.as_micros().div_ceil(1000)).unwrap_or(i32::MAX),
    };
    // SAFETY: `pfds` is a valid array of 3 pollfd; negative fds are ignored.
    let r = unsafe { libc::poll(pfds.as_mut_ptr(), 3, ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EINTR) {
            return Ok([0; 3]);
        }
        return Err(e);
    }
    Ok([pfds[0].revents, pfds[1].revents, pfds[2].revents])
}
