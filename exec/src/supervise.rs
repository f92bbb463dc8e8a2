//! Watching one child to its end: wait for its exit, its timeout or the
//! pool's stop (reading its stderr meanwhile), then kill its process group,
//! reap it and keep the tail of what it wrote.

use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::process::{Child, ChildStderr, ExitStatus};
use std::thread;
use std::time::{Duration, Instant};

use nix::unistd::Pid;

use super::{FALLBACK_SLICE, STDERR_TAIL, Shared, sys};

/// How the wait for a child ended.
pub(super) enum End {
    Exited,
    TimedOut,
    Cancelled,
}

/// Wait for exit, timeout or stop; then kill the group, reap, drain stderr.
pub(super) fn supervise(
    child: &mut Child,
    timeout: Duration,
    shared: &Shared,
) -> (End, io::Result<ExitStatus>, String) {
    // std's pids fit pid_t; a failure here is impossible in practice, and
    // 0 would make killpg target our own group, so refuse it outright.
    let pid = Pid::from_raw(libc::pid_t::try_from(child.id()).unwrap_or(-1));
    // `None`: a timeout too large to represent, i.e. no deadline.
    let deadline = Instant::now().checked_add(timeout);
    let mut tail = Tail::default();
    let mut stderr = child.stderr.take();
    if let Some(s) = &stderr
        && sys::set_nonblocking(s.as_fd()).is_err()
    {
        // Blocking reads could hang on an escaped grandchild; give up the
        // tail rather than risk it.
        stderr = None;
    }
    let pidfd = if shared.use_pidfd {
        sys::pidfd_open(pid).ok()
    } else {
        None
    };
    let end = wait_for_end(
        pid,
        deadline,
        pidfd.as_ref(),
        &mut stderr,
        &mut tail,
        shared,
    );
    let (status, tail) = kill_and_reap(child, pid, &end, tail, &mut stderr);
    (end, status, tail)
}

/// Poll until the child exits, its deadline passes or the pool stops,
/// reading its stderr into `tail` as it comes. Without a pidfd (an old
/// kernel) the exit is checked every [`FALLBACK_SLICE`].
fn wait_for_end(
    pid: Pid,
    deadline: Option<Instant>,
    pidfd: Option<&OwnedFd>,
    stderr: &mut Option<ChildStderr>,
    tail: &mut Tail,
    shared: &Shared,
) -> End {
    loop {
        match sys::exited_nowait(pid) {
            Ok(true) | Err(_) => break End::Exited,
            Ok(false) => {}
        }
        let now = Instant::now();
        let mut wait = match deadline {
            Some(d) if now >= d => break End::TimedOut,
            Some(d) => Some(d - now),
            None => None,
        };
        if pidfd.is_none() {
            wait = Some(wait.map_or(FALLBACK_SLICE, |w| w.min(FALLBACK_SLICE)));
        }
        let fds = [
            Some(shared.stop_rx.as_fd()),
            stderr.as_ref().map(|s| s.as_fd()),
            pidfd.map(|p| p.as_fd()),
        ];
        let Ok(ready) = sys::poll(&fds, wait) else {
            // poll itself failed (ENOMEM): pause one slice, then re-check
            // exit and deadline, rather than spin.
            thread::sleep(FALLBACK_SLICE);
            continue;
        };
        if ready[0] {
            break End::Cancelled;
        }
        if ready[1] && !tail.drain(stderr) {
            *stderr = None; // EOF or error: stop polling it
        }
    }
}

/// Kill the child's group, reap the child and drain the rest of its
/// stderr: its exit status and the tail (with a note if the kill failed).
fn kill_and_reap(
    child: &mut Child,
    pid: Pid,
    end: &End,
    mut tail: Tail,
    stderr: &mut Option<ChildStderr>,
) -> (io::Result<ExitStatus>, String) {
    // Kill the group while the leader is unreaped: its pid, and so the group
    // id, cannot have been reused. After a normal exit this cleans up
    // background stragglers; after a timeout or stop it is the kill.
    // A failure other than "already gone" (ESRCH) should not happen for our
    // own child's group (EPERM needs a program that changed its real uid);
    // if it does, kill at least the leader and say so in the tail.
    let mut kill_error = None;
    if pid.as_raw() > 0
        && let Err(e) = sys::kill_group(pid)
    {
        kill_error = Some(e);
        if !matches!(end, End::Exited) {
            // Best effort: if this fails too, `wait` reaps the leader
            // whenever it ends on its own.
            let _ = child.kill();
        }
    }
    let status = child.wait();
    tail.drain(stderr);
    let mut tail = tail.into_string();
    if let Some(e) = kill_error {
        tail.push_str(&format!("[baton: could not kill the process group: {e}]"));
    }
    (status, tail)
}

/// The last [`STDERR_TAIL`] bytes seen.
#[derive(Default)]
pub(super) struct Tail {
    buf: Vec<u8>,
}

impl Tail {
    /// Read what is available without blocking; false on EOF or error.
    pub(super) fn drain(&mut self, src: &mut Option<ChildStderr>) -> bool {
        let Some(s) = src else {
            return false;
        };
        let mut chunk = [0u8; 4096];
        loop {
            match s.read(&mut chunk) {
                Ok(0) => return false,
                Ok(n) => self.push(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
    }

    pub(super) fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
        if self.buf.len() > 2 * STDERR_TAIL {
            let cut = self.buf.len() - STDERR_TAIL;
            self.buf.drain(..cut);
        }
    }

    pub(super) fn into_string(mut self) -> String {
        if self.buf.len() > STDERR_TAIL {
            let cut = self.buf.len() - STDERR_TAIL;
            self.buf.drain(..cut);
        }
        String::from_utf8_lossy(&self.buf).into_owned()
    }
}
