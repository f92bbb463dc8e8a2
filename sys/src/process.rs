//! Process handles nix does not wrap.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

/// A pidfd for `pid` (Linux 5.3+): readable when the process exits, so one
/// `poll` watches the child, its pipes and a stop signal together, and it
/// never names a recycled pid. A bare system call (nix 0.30 has no
/// wrapper).
pub fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags, reads and writes no memory
    // of ours; its result is checked below.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(|_| io::Error::other("pidfd out of range"))?;
    // SAFETY: `fd` was just returned by the kernel, is open, and nothing
    // else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_own_pid_opens_and_a_missing_one_does_not() {
        let me = i32::try_from(std::process::id()).expect("pid");
        match pidfd_open(me) {
            Ok(_) => {}
            // An old kernel: the call does not exist.
            Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => return,
            Err(e) => panic!("pidfd_open(self): {e}"),
        }
        assert!(pidfd_open(-5).is_err());
    }
}
