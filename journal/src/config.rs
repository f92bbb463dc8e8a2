//! Where the journal lives and the limits it keeps to.

use std::path::PathBuf;

use crate::JournalError;
#[cfg(doc)]
use crate::{DISCARDED_FILE, Journal, Recovered};

/// Where the journal lives and how large it may grow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalConfig {
    /// The journal's directory; created if missing.
    pub dir: PathBuf,
    /// Most unacknowledged feedback records kept; past it the oldest are
    /// dropped and counted ([`Journal::dropped`]). At least 1.
    pub outbox_cap: usize,
    /// Log size that triggers an automatic compaction (see the module docs
    /// for why the real trigger may be higher).
    pub max_log_bytes: u64,
    /// How long (reference-time ns) execution ids and once keys are
    /// remembered. Must exceed the longest window in which an execution
    /// could still fire.
    pub retention_ns: i64,
    /// Group-commit window: a heartbeat fdatasyncs pending lazy records
    /// when at least this much reference time passed since the last time it
    /// did. 0 syncs on every heartbeat.
    pub lazy_sync_interval_ns: i64,
    /// Start a fresh journal, deliberately: any existing log is moved aside
    /// to [`DISCARDED_FILE`] (replacing an older one) and
    /// [`Recovered::origin`] says so. The agent's `--reset-journal`. Without
    /// it, a missing log in a directory that had one is refused
    /// ([`JournalError::LogMissing`]).
    pub reset: bool,
}

impl JournalConfig {
    /// Default [`JournalConfig::outbox_cap`].
    pub const DEFAULT_OUTBOX_CAP: usize = 100_000;
    /// Default [`JournalConfig::max_log_bytes`]: 64 MiB.
    pub const DEFAULT_MAX_LOG_BYTES: u64 = 64 << 20;
    /// Default [`JournalConfig::retention_ns`]: 7 days.
    pub const DEFAULT_RETENTION_NS: i64 = 7 * 24 * 3600 * 1_000_000_000;
    /// Default [`JournalConfig::lazy_sync_interval_ns`]: 1 s.
    pub const DEFAULT_LAZY_SYNC_INTERVAL_NS: i64 = 1_000_000_000;

    /// A configuration for `dir` with every other field at its default
    /// (`reset` off).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        JournalConfig {
            dir: dir.into(),
            outbox_cap: Self::DEFAULT_OUTBOX_CAP,
            max_log_bytes: Self::DEFAULT_MAX_LOG_BYTES,
            retention_ns: Self::DEFAULT_RETENTION_NS,
            lazy_sync_interval_ns: Self::DEFAULT_LAZY_SYNC_INTERVAL_NS,
            reset: false,
        }
    }

    pub(crate) fn validate(&self) -> Result<(), JournalError> {
        if self.outbox_cap == 0 {
            return Err(JournalError::InvalidConfig(
                "outbox_cap must be at least 1".into(),
            ));
        }
        if self.retention_ns < 0 {
            return Err(JournalError::InvalidConfig(format!(
                "retention_ns must not be negative, got {}",
                self.retention_ns
            )));
        }
        if self.lazy_sync_interval_ns < 0 {
            return Err(JournalError::InvalidConfig(format!(
                "lazy_sync_interval_ns must not be negative, got {}",
                self.lazy_sync_interval_ns
            )));
        }
        Ok(())
    }
}
