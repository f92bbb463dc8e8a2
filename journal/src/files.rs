//! File-system steps the journal's atomicity rests on.

use std::fs::{self, File};
use std::io;
use std::path::Path;

use crate::JournalError;

pub(crate) fn exists(path: &Path) -> Result<bool, JournalError> {
    match fs::symlink_metadata(path) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(JournalError::io("stat", path, e)),
    }
}

pub(crate) fn remove_if_exists(path: &Path) -> Result<(), JournalError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(JournalError::io("remove", path, e)),
    }
}

/// Makes renames and creations inside `dir` durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), JournalError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| JournalError::io("fsync directory", dir, e))
}
