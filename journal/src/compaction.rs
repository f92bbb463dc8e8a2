//! Compaction: when the log is rewritten as a snapshot of the live state,
//! and what the journal takes over from the new log.

use crate::snapshot::{OldLog, SnapshotError, write_snapshot};
use crate::{FORMAT_VERSION, Journal, JournalError};

impl Journal {
    /// Rewrites the log as a snapshot of the live state, forgetting ids
    /// and once keys older than the retention horizon (see the module
    /// docs). Atomic: a crash at any point leaves either the old or the new
    /// log. Also runs by itself when the log grows past its trigger.
    pub fn compact(&mut self) -> Result<(), JournalError> {
        self.check_poisoned()?;
        self.flush()?;
        let horizon = self
            .state
            .reference_now()
            .map(|now| now.saturating_sub(self.cfg.retention_ns));
        let snapshot = write_snapshot(
            &self.cfg.dir,
            &self.tmp_path,
            &self.log_path,
            &self.state,
            horizon,
            Some(OldLog {
                file: &self.file,
                path: &self.log_path,
                salt: self.salt,
                version: self.version,
            }),
        );
        let (file, salt, len, offsets) = match snapshot {
            Ok(v) => v,
            Err(SnapshotError::BeforeRename(e)) => return Err(e),
            Err(SnapshotError::AfterRename(e)) => {
                // The rename happened but the directory could not be synced:
                // which log survives a power cut is unknown. Stop.
                self.poisoned = true;
                return Err(e);
            }
        };
        self.file = file;
        self.salt = salt;
        self.version = FORMAT_VERSION;
        self.len = len;
        self.synced_len = len;
        self.state.outbox.set_offsets(offsets);
        if let Some(h) = horizon {
            self.state.prune(h);
        }
        self.compact_trigger = trigger(self.cfg.max_log_bytes, len);
        Ok(())
    }

    /// Compacts if the log grew past its trigger. A failure does not fail
    /// the caller (its record is in the log): it is kept for the next
    /// heartbeat, and the next try waits for another quarter of
    /// `max_log_bytes`.
    pub(crate) fn maybe_compact(&mut self) {
        if self.len <= self.compact_trigger || self.poisoned {
            return;
        }
        if let Err(e) = self.compact() {
            self.compact_trigger = self
                .len
                .saturating_add(self.cfg.max_log_bytes / 4)
                .saturating_add(1);
            self.compaction_error = Some(e);
        }
    }
}

/// The log size past which a log whose live part is `live` bytes compacts.
pub(crate) fn trigger(max_log_bytes: u64, live: u64) -> u64 {
    max_log_bytes.max(live.saturating_mul(2))
}
