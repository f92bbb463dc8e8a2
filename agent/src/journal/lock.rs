//! The journal directory's advisory lock: the only `unsafe` of the journal.
//!
//! Two agents (say, a stale one and its systemd restart) writing one journal
//! would interleave records and break "nothing runs twice". `flock` is tied
//! to the open file description, so the kernel releases it when the process
//! dies, `kill -9` included: no stale lock files to clean up. (`File::lock`
//! would do without `unsafe`, but it is newer than the workspace's MSRV.)

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

use super::JournalError;

/// Opens (creating) `path` and takes an exclusive, non-blocking `flock` on
/// it. The lock lives as long as the returned file.
pub(crate) fn lock_exclusive(path: &Path) -> Result<File, JournalError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| JournalError::io("open lock file", path, e))?;
    // SAFETY: `flock` takes a plain integer descriptor and touches no memory
    // of ours; `file` keeps that descriptor open for the whole call.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(file);
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Err(JournalError::Locked { path: path.into() })
    } else {
        Err(JournalError::io("flock", path, err))
    }
}
