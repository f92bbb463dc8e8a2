//! What the journal hands back: the packs it stores, what `open`
//! recovered and how, what a heartbeat and the size probes report.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

#[cfg(doc)]
use crate::{Journal, JournalConfig, check_log_bytes};
use crate::{JournalError, Outcome, StopReason};

/// One accepted pack, as the journal keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredPack {
    /// Tenant the pack belongs to.
    pub tenant: String,
    /// Pack id, unique within the tenant.
    pub pack: String,
    /// Accepted version.
    pub version: u64,
    /// The pack's YAML source, as accepted (re-validated on recovery by the
    /// agent, which trusts nothing — docs/design.md principle 2).
    pub yaml: String,
    /// Reference time of acceptance, ns.
    pub accepted_ns: i64,
    /// Set when this version entered its safe state for good: it is
    /// restored stopped, never firing again. Ignored by `put_pack`.
    pub stopped: Option<StopReason>,
}

/// How [`Journal::open`] came by the journal it opened.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Origin {
    /// An existing log was replayed.
    Existing,
    /// No journal was here (a new or empty directory, or a first creation
    /// that never finished): a fresh, empty one was created.
    #[default]
    Created,
    /// The log was missing, but an interrupted compaction had left its
    /// complete, fsynced snapshot; it was moved into place and replayed.
    CompletedCompaction,
    /// [`JournalConfig::reset`]: a fresh journal was started on purpose.
    Reset {
        /// Where the previous log was moved, if there was one.
        previous: Option<PathBuf>,
    },
}

/// What [`Journal::open`] found on disk.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Latest accepted version of each stored pack, ordered by (tenant, pack).
    pub packs: Vec<StoredPack>,
    /// Every execution id with a start or result record (within the
    /// retention horizon) and its outcome. `None`: started, no result —
    /// report it as `outcome unknown` and never fire it again.
    pub attempts: HashMap<String, Option<Outcome>>,
    /// Once-only action keys already recorded: those actions were (or may
    /// have been) taken; never take them again.
    pub once: HashSet<String>,
    /// Unacknowledged feedback records held (read them with
    /// [`Journal::outbox_page`]).
    pub outbox_len: usize,
    /// Outbox entries dropped because of the cap and not yet reported.
    pub dropped: u64,
    /// Last heartbeat: the agent was up until at least then (reference ns).
    pub last_alive_ns: Option<i64>,
    /// Ids and once keys dated before this (reference ns: the retention
    /// before the last heartbeat, else before the latest start) were
    /// forgotten: no record there proves nothing, so a caller must not
    /// take such an occurrence for one never started.
    pub forgotten_before_ns: Option<i64>,
    /// Bytes of a torn tail cut off the log (a crash mid-write); 0 if the
    /// log ended cleanly. Worth a warning in the agent's log.
    pub truncated_bytes: u64,
    /// Whether the log was replayed, created, completed from a compaction
    /// or reset. Anything but [`Origin::Existing`] is worth a line in the
    /// agent's log; [`Origin::Reset`] is worth a warning.
    pub origin: Origin,
}

/// What a heartbeat has to report besides success. Not an error: the
/// journal keeps working.
#[derive(Debug, Default)]
#[must_use = "a compaction error must reach the agent's log"]
#[non_exhaustive]
pub struct Heartbeat {
    /// An automatic compaction failed since the last heartbeat (its record
    /// is safely in the log; the log keeps growing until one succeeds).
    pub compaction_error: Option<JournalError>,
    /// Execution ids and once keys this heartbeat forgot (retention).
    pub pruned: usize,
}

/// How much state the journal holds in memory (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Held {
    /// Stored packs.
    pub packs: usize,
    /// Execution ids (started and/or finished).
    pub attempts: usize,
    /// Once-only keys.
    pub once: usize,
    /// Unacknowledged feedback records (on disk; 8 bytes each in memory).
    pub outbox: usize,
    /// Heap bytes of the outbox index.
    pub outbox_index_bytes: usize,
}

/// What [`check_log_bytes`] found in a log image.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LogSummary {
    /// Stored packs.
    pub packs: usize,
    /// Execution ids with a start or result record.
    pub attempts: usize,
    /// Of those, started without a result.
    pub unfinished: usize,
    /// Once-only keys.
    pub once: usize,
    /// Unacknowledged feedback records.
    pub outbox_len: usize,
    /// The seq the next feedback record would get.
    pub next_seq: u64,
    /// Last heartbeat.
    pub last_alive_ns: Option<i64>,
    /// The journal's id, if the log records one (every log this agent
    /// writes does; older logs get one at their next open).
    pub journal_id: Option<String>,
    /// The highest controller session generation recorded (0: none).
    pub session_gen: u64,
    /// Bytes of intact records (with the header): where a torn tail starts.
    pub valid_bytes: u64,
    /// Bytes after them that `open` would cut off as a torn tail.
    pub truncated_bytes: u64,
}
