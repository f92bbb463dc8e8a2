//! The system calls the exec pool needs beyond std.
//!
//! std's `Child` spawns, sets the process group and reaps; what it lacks is
//! "wait for exit *without* reaping" (so the process-group id cannot be
//! recycled before we `killpg` it), a pollable exit event (pidfd), and
//! `killpg` itself. Everything `nix` covers goes through `nix`; the one call
//! it lacks (`pidfd_open`, a bare syscall) is `baton_sys`'s.

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{Signal, killpg};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
use nix::unistd::Pid;

/// `pidfd_open(2)`: a descriptor that polls readable when `pid` exits.
///
/// `ENOSYS` on kernels before 5.3 (old vendor kernels on edge boxes); the
/// caller then falls back to short poll slices. nix 0.30 has no wrapper.
pub(crate) fn pidfd_open(pid: Pid) -> io::Result<OwnedFd> {
    baton_sys::process::pidfd_open(pid.as_raw())
}

/// True once `pid` (our child) has exited, without reaping it: the zombie
/// keeps the pid — and so the process-group id — reserved until we `wait`.
/// `ECHILD` (someone else reaped it, e.g. `SIGCHLD` ignored) counts as exited.
pub(crate) fn exited_nowait(pid: Pid) -> io::Result<bool> {
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    loop {
        return match waitid(Id::Pid(pid), flags) {
            Ok(WaitStatus::StillAlive) => Ok(false),
            Ok(_) => Ok(true),
            Err(Errno::EINTR) => continue,
            Err(Errno::ECHILD) => Ok(true),
            Err(e) => Err(e.into()),
        };
    }
}

/// `killpg(pgid, SIGKILL)`; a group already gone is not an error.
pub(crate) fn kill_group(pgid: Pid) -> io::Result<()> {
    match killpg(pgid, Signal::SIGKILL) {
        Ok(()) | Err(Errno::ESRCH) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Put `fd` in non-blocking mode so draining it never hangs on a writer
/// that escaped the process group and keeps the pipe open.
pub(crate) fn set_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    let flags = OFlag::from_bits_retain(fcntl(fd, FcntlArg::F_GETFL)?);
    fcntl(fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    Ok(())
}

/// A close-on-exec pipe `(read, write)`; the pool's stop signal: closing the
/// write end makes the read end poll readable (EOF) for every worker at once.
pub(crate) fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(nix::unistd::pipe2(OFlag::O_CLOEXEC)?)
}

/// `poll(2)` on up to three descriptors for reading, at most `timeout`
/// (`None`: forever). Returns, in order, whether each descriptor is ready
/// (readable, hung up or in error); all false on timeout or `EINTR` (the
/// caller re-checks and polls again) and for the `None` slots.
pub(crate) fn poll(
    fds: &[Option<BorrowedFd<'_>>; 3],
    timeout: Option<Duration>,
) -> io::Result<[bool; 3]> {
    let timeout = match timeout {
        None => PollTimeout::NONE,
        // Round up: waking a millisecond early would just spin once more.
        Some(t) => {
            let ms = i32::try_from(t.as_micros().div_ceil(1000)).unwrap_or(i32::MAX);
            PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX)
        }
    };
    // Only the present descriptors are polled; `slot` maps them back.
    let mut pfds = Vec::with_capacity(3);
    let mut slot = [0usize; 3];
    for (i, fd) in fds.iter().enumerate() {
        if let Some(fd) = fd {
            slot[pfds.len()] = i;
            pfds.push(PollFd::new(*fd, PollFlags::POLLIN));
        }
    }
    let mut ready = [false; 3];
    match nix::poll::poll(&mut pfds, timeout) {
        Ok(_) => {}
        Err(Errno::EINTR) => return Ok(ready),
        Err(e) => return Err(e.into()),
    }
    let any = PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR | PollFlags::POLLNVAL;
    for (p, &i) in pfds.iter().zip(&slot) {
        ready[i] = p.revents().is_some_and(|r| r.intersects(any));
    }
    Ok(ready)
}
