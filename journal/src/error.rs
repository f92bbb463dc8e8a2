//! Errors of the journal. Each one names the file (and, for damage, the byte
//! offset) so that an operator reading the agent's log knows what to look at.

use std::io;
use std::path::PathBuf;

/// Why a journal operation failed.
///
/// After [`JournalError::Io`] from a write or a sync the journal is
/// *poisoned* (see [`JournalError::Poisoned`]): the agent must stop firing
/// and reopen it, which re-reads what is really on disk.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JournalError {
    /// A system call on a journal file failed.
    #[error("journal: cannot {op} {path}: {source}")]
    Io {
        /// What was being done ("open", "fdatasync", "rename", ...).
        op: &'static str,
        /// The file or directory concerned.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
    /// The log is damaged somewhere other than its tail, or holds a record
    /// this version cannot read. Never repaired silently: valid records
    /// follow the damage, so dropping it could lose acknowledged state.
    #[error("journal {path} is corrupt at byte offset {offset}: {reason}")]
    Corrupt {
        /// The log file.
        path: PathBuf,
        /// Where the first bad record (or the bad header) starts.
        offset: u64,
        /// What is wrong there.
        reason: String,
    },
    /// The log was written in a format version this agent does not know
    /// (an older agent after a downgrade).
    #[error(
        "journal {path} has format version {found}, this agent reads versions {oldest} to {supported}"
    )]
    UnsupportedVersion {
        /// The log file.
        path: PathBuf,
        /// The version in the file's header.
        found: u32,
        /// The version this code writes (and the newest it reads).
        supported: u32,
        /// The oldest version it reads.
        oldest: u32,
    },
    /// Another process holds the journal directory's lock: two agents on
    /// one journal would break "nothing runs twice".
    #[error("journal directory {path} is locked by another process")]
    Locked {
        /// The lock file.
        path: PathBuf,
    },
    /// One record would exceed the size limit of a log record.
    #[error("journal: {what} of {len} bytes exceeds the record limit of {limit} bytes")]
    TooLarge {
        /// What was too large ("pack", "feedback record", "batch of ids").
        what: &'static str,
        /// Its encoded size.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// An earlier write or sync failed, so what is on disk is unknown
    /// (after a failed fsync Linux may have dropped the dirty pages and a
    /// retry would falsely succeed). Reopen the journal to recover.
    #[error("journal {path} is unusable after an earlier write or sync failure; reopen it")]
    Poisoned {
        /// The log file.
        path: PathBuf,
    },
    /// The log is missing although this directory held a journal (its lock
    /// file records that a log was created): someone deleted it, or the
    /// wrong directory is mounted. Starting empty would silently forget
    /// accepted packs and start records (a one-shot could fire twice), so
    /// the journal refuses; an operator who means it starts fresh with
    /// [`crate::JournalConfig::reset`] (`--reset-journal`).
    #[error(
        "journal {path} is missing, but {lock} shows a journal was created in this directory: \
         accepted packs and start records would be lost without a word. Restore the file, or \
         start a fresh journal deliberately with --reset-journal (JournalConfig::reset)"
    )]
    LogMissing {
        /// The missing log file.
        path: PathBuf,
        /// The lock file that records the log's creation.
        lock: PathBuf,
    },
    /// The configuration cannot work.
    #[error("journal: invalid configuration: {0}")]
    InvalidConfig(String),
}

impl JournalError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        JournalError::Io {
            op,
            path: path.into(),
            source,
        }
    }
}
