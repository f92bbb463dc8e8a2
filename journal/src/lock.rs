//! The journal directory's advisory lock.
//!
//! Two agents (say, a stale one and its systemd restart) writing one journal
//! would interleave records and break "nothing runs twice". `flock` is tied
//! to the open file description, so the kernel releases it when the process
//! dies, `kill -9` included: no stale lock files to clean up. nix's `Flock`
//! wraps the call safely (`File::lock` is newer than the workspace's MSRV).

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use super::JournalError;

/// Opens (creating) `path` and takes an exclusive, non-blocking `flock` on
/// it. The lock lives as long as the returned guard.
pub(crate) fn lock_exclusive(path: &Path) -> Result<Flock<File>, JournalError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| JournalError::io("open lock file", path, e))?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(guard) => Ok(guard),
        Err((_, Errno::EWOULDBLOCK)) => Err(JournalError::Locked { path: path.into() }),
        Err((_, e)) => Err(JournalError::io("flock", path, io::Error::from(e))),
    }
}
