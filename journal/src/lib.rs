//! The agent's durable journal: accepted packs, the record of fired
//! executions and their outcomes, once-only actions, and the outbox of
//! feedback the controller has not yet acknowledged. It is what makes
//! DESIGN.md principle 4 ("nothing is lost, nothing runs twice") survive
//! `kill -9` and power loss.
//!
//! # Design: an append-only, checksummed log, not an embedded database
//!
//! The journal is one file, `journal.log`, of length-prefixed records, each
//! with a CRC-32 (format in `record.rs`), plus a fold of those records kept
//! in memory. We chose this over an embedded store such as redb because:
//!
//! * **The state the agent asks about is small, bounded and needed in
//!   memory anyway.** The agent asks "has this id started?" before every
//!   firing, so the set lives in RAM whatever the store. What the disk must
//!   give is only an ordered, durable, verifiable record of *changes* —
//!   exactly a log. A B-tree on disk would duplicate the RAM copy and buy
//!   nothing. (Feedback payloads are the exception: they are only re-read
//!   to re-send, so they stay in the log and RAM holds their offsets.)
//! * **The hot durable path is one `write` + one `fdatasync`** of a few
//!   dozen bytes. A redb commit rewrites copy-on-write B-tree pages and a
//!   commit slot before syncing: more bytes and more flash wear per firing
//!   on the SD/eMMC of an edge box. `benches/journal.rs` measures
//!   `record_started` against a bare `write_all` + `sync_data` of the same
//!   bytes, so the overhead of the journal itself is a ratio, not a guess.
//! * **A log has the prefix property.** After any crash what survives is a
//!   prefix of what was written. So "a later record is durable" implies
//!   "every earlier record is": the agent pushes a result's feedback and
//!   *then* records it finished, and can never end up with a finished
//!   execution whose feedback vanished.
//! * **The failure to handle — a torn last write — is what a checksummed log
//!   detects by construction**, and the whole format fits on one screen,
//!   which matters for code that decides whether a press fires twice. The
//!   only new dependency is `crc32fast`.
//!
//! Records are typed (STYLE.md habit 14): an execution's result is ONE
//! record carrying its [`Outcome`], a stop carries its [`StopReason`];
//! never two records or a string suffix, so no crash can leave half an
//! outcome.
//!
//! # Durability, call by call
//!
//! Durable calls write and `fdatasync` their record (and every buffered
//! lazy record before it) before returning. Lazy calls frame their record
//! into a buffer that reaches the kernel in one `write(2)` at the next
//! [`Journal::flush`] (the agent calls it once per pass of its loop), durable
//! call, [`Journal::sync`], compaction, or once 64 KiB are buffered: at
//! 1 000 firings/s that is one write per loop pass instead of two per
//! firing. So a *process* crash (`kill -9`, panic with `abort`) loses at
//! most the lazy records of the current pass; power loss loses what was not
//! yet `fdatasync`ed. Either way the log keeps the calls' order:
//!
//! | call | on return |
//! | --- | --- |
//! | [`Journal::record_started`], [`Journal::record_once`], [`Journal::put_pack`], [`Journal::stop_pack`], [`Journal::remove_pack`], [`Journal::record_session_gen`] | fdatasync'd: survives power loss |
//! | [`Journal::record_finished`], [`Journal::push_feedback`], [`Journal::ack_feedback`], [`Journal::reset_dropped`], [`Journal::heartbeat`] | buffered; written by the next flush, synced by the next durable call, [`Journal::sync`], or a heartbeat once [`JournalConfig::lazy_sync_interval_ns`] has passed since the last sync (group commit) |
//!
//! Why lazy is safe for these: a lost `record_finished` turns into "started,
//! no result" → reported `outcome unknown`, never a second firing; a lost
//! feedback push (always pushed *before* its `record_finished`, see the
//! prefix property) is covered the same way; a lost ack only re-sends
//! feedback the controller already has (it dedups by seq); a lost
//! `reset_dropped` re-reports a drop count. `stop_pack` and `remove_pack`
//! are durable because a stopped or cancelled pack must not come back
//! running after a power cut; `record_once` because its action (an
//! `on_failure`, a give-up or `outcome unknown` report) must be taken at
//! most once: the agent records the key *before* acting;
//! `record_session_gen` because a fence that a power cut could lower would
//! let a stale controller's push through after the restart.
//!
//! After a failed write or sync the journal is *poisoned*: every later call
//! fails with [`JournalError::Poisoned`] until it is reopened. A partial
//! write would otherwise be followed by good records (mid-file corruption),
//! and after a failed `fsync` Linux may have dropped the dirty pages so a
//! retry would lie.
//!
//! # Recovery policy
//!
//! [`Journal::open`] replays the log. A record that fails its checksum
//! (or is cut short) **with no intact record anywhere after it** is a torn
//! tail from a crash mid-write: the file is truncated there, and the number
//! of bytes dropped is returned in [`Recovered::truncated_bytes`]. Only
//! unsynced writes can be torn, so nothing acknowledged is lost. A bad
//! record **followed by an intact one** is damage in the middle: `open`
//! fails with [`JournalError::Corrupt`] naming the offset, and refuses to
//! guess (the agent then stays stopped, the safe choice). This assumes the
//! file system persists appended data in order, as ext4 `data=ordered` (the
//! default) does. A flipped bit inside the very last record is
//! indistinguishable from a torn write and is treated as one. A log of
//! another format version is refused with
//! [`JournalError::UnsupportedVersion`]; a log of an older version this
//! code still reads (2) is rewritten in the current format at open.
//!
//! **A lost log is refused, not silently replaced.** Once a journal's first
//! log is in place, `open` writes a line into `journal.lock`. If that line
//! is there but `journal.log` is not, `open` fails with
//! [`JournalError::LogMissing`] — unless an interrupted compaction left a
//! *complete* snapshot in `journal.log.tmp` (one that replays cleanly up to
//! its closing `Meta` record), which is then moved into place
//! ([`Origin::CompletedCompaction`]). To start over deliberately, set
//! [`JournalConfig::reset`] (`--reset-journal`): any log is moved aside to
//! `journal.log.discarded` and a fresh journal starts
//! ([`Origin::Reset`]). An empty or new directory, or a first creation that
//! never finished, gives a fresh journal ([`Origin::Created`]).
//!
//! [`check_log_bytes`] runs the same replay on a byte image without touching
//! any file (for fuzzing and offline checks).
//!
//! # Compaction
//!
//! [`Journal::compact`] writes the live state as a fresh log to
//! `journal.log.tmp`, fsyncs it, renames it over `journal.log` and fsyncs
//! the directory: at every instant one complete log exists. It runs by
//! itself when the log exceeds `max(max_log_bytes, 2 × live size after the
//! last compaction)`, so a live state larger than the budget cannot make
//! every append compact. The live size is where the snapshot's closing
//! `Meta` record ends, so the trigger is the same after a restart. It
//! keeps: the journal's id ([`Journal::id`]), the highest controller
//! session generation ([`Journal::session_gen`]), stored packs (with their stop
//! reason), the unacknowledged outbox (copied record by record from the old
//! log), the next seq, the dropped count, the last heartbeat, and execution ids and once keys whose
//! reference time is within [`JournalConfig::retention_ns`] (default 7 days)
//! of the journal's "now" (the last heartbeat, else the latest started id).
//! A failed automatic compaction does not fail the call that triggered it;
//! the next [`Journal::heartbeat`] returns its error in
//! [`Heartbeat::compaction_error`] (or [`Journal::take_compaction_error`]).
//!
//! # Bounds
//!
//! With `R` = execution ids and once keys dated within the retention
//! horizon:
//! * **ids in RAM**: one map entry per id (≈ 35 bytes of table plus the id's
//!   own heap allocation: ~80 bytes for a 44-byte id, measured by
//!   `tests/journal_memory.rs`, plus the allocator's overhead), whether
//!   started, finished or both (one entry holds start and outcome). Besides
//!   compaction, a heartbeat forgets ids older than the horizon once every
//!   quarter of `retention_ns` (a scan of the map, amortised over the ids
//!   that arrived since), so at most ~`1.25 × R` ids are held whatever the
//!   log size, and a retention of seconds works. Ids are opaque, so ids of
//!   removed packs are forgotten by the horizon too, not at removal. The
//!   horizon must exceed the longest window in which the scheduler would
//!   still fire an execution (`max_lateness`, catch-up): an id is forgotten
//!   only once firing it again is refused on lateness alone.
//! * **outbox**: ≤ `outbox_cap` entries (each ≤ 16 MiB; typically a few
//!   hundred bytes); past the cap the oldest are dropped and *counted*. RAM
//!   holds 8 bytes per entry (its offset in the log; the index grows by
//!   doubling), not the payload: [`Journal::outbox_page`] reads pages back
//!   from the log to re-send. 10 000 undelivered records of ~200 bytes
//!   cost ~155 KB of RAM (measured), not their 2 MB.
//! * **packs**: every stored pack, YAML deflated (`packed.rs`).
//! * **the log** ≤ `max(max_log_bytes, 2 × live)` plus one record.
//!   [`Journal::open`] reads it whole, so that is also its peak extra memory
//!   (released before it returns).
//!
//! # Single writer
//!
//! One control thread owns the journal (`&mut self`); an exclusive `flock`
//! on `journal.lock` keeps a second process out. The journal never reads a
//! clock: reference times come in through [`Journal::heartbeat`],
//! [`Journal::record_started`] and [`Journal::record_once`].

#![forbid(unsafe_code)]

mod error;
mod lock;
mod packed;
mod record;
mod state;

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

pub use error::JournalError;
use packed::PackedPack;
use record::{FRAME_LEN, FinishedBatch, HEADER_LEN, HeaderError, Ids, MAX_PAYLOAD, Rec};
use state::State;

/// The log file's name inside [`JournalConfig::dir`].
pub const LOG_FILE: &str = "journal.log";
/// Where a compaction writes the next log before renaming it into place.
pub const TMP_FILE: &str = "journal.log.tmp";
/// The lock file that keeps a second process out, and records that a log
/// was created in this directory (see the recovery policy).
pub const LOCK_FILE: &str = "journal.lock";
/// Where [`JournalConfig::reset`] moves the previous log.
pub const DISCARDED_FILE: &str = "journal.log.discarded";
/// The log format version this code writes. It reads this one and
/// [`OLDEST_READABLE_VERSION`] up (an older log is rewritten in this
/// format at open); any other is refused with
/// [`JournalError::UnsupportedVersion`].
pub const FORMAT_VERSION: u32 = record::FORMAT_VERSION;
/// The oldest log format version this code reads.
pub const OLDEST_READABLE_VERSION: u32 = record::OLDEST_READABLE;

/// Written into the lock file once the directory's first log is in place.
const CREATED_MARKER: &[u8] =
    b"baton journal: journal.log was created here; if it goes missing the agent refuses to start (see --reset-journal)\n";
/// Started ids per snapshot record, by encoded bytes: keeps each record far
/// below the frame limit whatever the id lengths.
const SNAPSHOT_CHUNK_BYTES: usize = 1 << 20;
/// Buffered lazy records are written once they reach this size.
const LAZY_FLUSH_BYTES: usize = 64 << 10;
/// A reusable frame buffer larger than this (after a pack, a big batch of
/// start records) is released: kept, a 1 MB pack's frame stayed resident.
const KEEP_BUF_BYTES: usize = 64 << 10;

/// The result of one execution attempt, as the journal keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// It ran and succeeded.
    Succeeded,
    /// It ran (or was tried) and failed.
    Failed,
    /// It was started (journalled) but never touched the device (withdrawn,
    /// or too late): after a restart it may fire again.
    NotRun,
}

/// Why a stored pack version stopped for good.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StopReason {
    /// An instruction gave up (retries exhausted, or a missed one-shot).
    GiveUp,
    /// The pack was cancelled.
    Cancel,
    /// The pack's controller lease ran out (`lease` in the pack): it stays
    /// stopped across restarts until a higher version arrives, so that a
    /// reboot does not revive a pack its controller could not reach.
    LeaseLost,
    /// The clock lost sync past the agent's limit and the pack asked for
    /// its safe state then (`on_clock_loss: safe_state`); durable for the
    /// same reason as a lease loss.
    ClockLost,
}

impl StopReason {
    /// The word used in logs and feedback: `give_up`, `cancel` or
    /// `lease_lost`.
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::GiveUp => "give_up",
            StopReason::Cancel => "cancel",
            StopReason::LeaseLost => "lease_lost",
            StopReason::ClockLost => "clock_lost",
        }
    }
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

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

    fn validate(&self) -> Result<(), JournalError> {
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
    /// agent, which trusts nothing — DESIGN.md principle 2).
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

/// Replays a journal log image as [`Journal::open`] would, without any
/// file: what it holds, or why `open` would refuse it. Never panics, on any
/// input (fuzzed: `fuzz/fuzz_targets/journal_replay.rs`).
pub fn check_log_bytes(bytes: &[u8]) -> Result<LogSummary, JournalError> {
    let r = replay(bytes, Path::new("<log image>"))?;
    Ok(LogSummary {
        packs: r.state.packs.len(),
        attempts: r.state.attempts.len(),
        unfinished: r
            .state
            .attempts
            .values()
            .filter(|a| a.outcome.is_none())
            .count(),
        once: r.state.once.len(),
        outbox_len: r.state.outbox.len(),
        next_seq: r.state.next_seq,
        last_alive_ns: r.state.last_alive_ns,
        journal_id: r.state.journal_id.as_deref().map(str::to_string),
        session_gen: r.state.session_gen,
        valid_bytes: r.valid_end as u64,
        truncated_bytes: (bytes.len() - r.valid_end) as u64,
    })
}

/// The durable journal. See the module docs for the design and guarantees.
pub struct Journal {
    cfg: JournalConfig,
    log_path: PathBuf,
    tmp_path: PathBuf,
    /// The log, open for appending and for reading feedback back.
    file: File,
    /// Held for the journal's lifetime; dropping it releases the `flock`.
    _lock: nix::fcntl::Flock<File>,
    /// This log's record checksum seed.
    salt: u32,
    /// This log's format version (an older one only until the compaction
    /// that rewrites it at open).
    version: u32,
    /// Results of this pass, written as one `Finished` record with the
    /// next flush (see `record::FinishedBatch`).
    fin: FinishedBatch,
    /// Bytes in the log.
    len: u64,
    /// Bytes known to be on stable storage.
    synced_len: u64,
    /// fdatasync calls on the log since open (each a flash write and most
    /// of a firing pass's CPU: the figure group commit keeps down).
    syncs: u64,
    state: State,
    /// Reused frame buffer: `record_started` allocates nothing in steady state.
    buf: Vec<u8>,
    /// Lazy records framed but not yet written: one `write(2)` per
    /// [`Journal::flush`] instead of one per record (see the module docs).
    lazy: Vec<u8>,
    compact_trigger: u64,
    /// Reference time of the last group commit (by a heartbeat, or a
    /// durable call seen by the next heartbeat).
    last_group_sync_ns: Option<i64>,
    /// [`Journal::syncs`] at the last heartbeat.
    syncs_at_heartbeat: u64,
    /// Reference time of the last in-memory prune done by a heartbeat.
    last_prune_ns: Option<i64>,
    poisoned: bool,
    compaction_error: Option<JournalError>,
}

impl fmt::Debug for Journal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The state can hold a million ids: summarise it.
        f.debug_struct("Journal")
            .field("log_path", &self.log_path)
            .field("len", &self.len)
            .field("synced_len", &self.synced_len)
            .field("compact_trigger", &self.compact_trigger)
            .field("packs", &self.state.packs.len())
            .field("attempts", &self.state.attempts.len())
            .field("once", &self.state.once.len())
            .field("outbox", &self.state.outbox.len())
            .field("dropped", &self.state.dropped)
            .field("poisoned", &self.poisoned)
            .finish_non_exhaustive()
    }
}

impl Journal {
    /// Opens (creating if needed) the journal in `cfg.dir` and recovers its
    /// state: a torn tail is truncated and reported, damage in the middle is
    /// an error naming its offset, a missing log where one existed is
    /// refused unless `cfg.reset` (see the module docs).
    pub fn open(cfg: JournalConfig) -> Result<(Journal, Recovered), JournalError> {
        cfg.validate()?;
        fs::create_dir_all(&cfg.dir)
            .map_err(|e| JournalError::io("create directory", &cfg.dir, e))?;
        let lock_path = cfg.dir.join(LOCK_FILE);
        let lock = lock::lock_exclusive(&lock_path)?;
        let log_path = cfg.dir.join(LOG_FILE);
        let tmp_path = cfg.dir.join(TMP_FILE);
        let created_here = lock
            .metadata()
            .map_err(|e| JournalError::io("stat", &lock_path, e))?
            .len()
            > 0;

        let mut origin = Origin::Existing;
        if cfg.reset {
            let previous = if exists(&log_path)? {
                let aside = cfg.dir.join(DISCARDED_FILE);
                fs::rename(&log_path, &aside)
                    .map_err(|e| JournalError::io("move aside (reset)", &log_path, e))?;
                Some(aside)
            } else {
                None
            };
            origin = Origin::Reset { previous };
        } else if !exists(&log_path)? {
            if complete_snapshot(&tmp_path)? {
                fs::rename(&tmp_path, &log_path)
                    .map_err(|e| JournalError::io("rename complete snapshot to", &log_path, e))?;
                sync_dir(&cfg.dir)?;
                origin = Origin::CompletedCompaction;
            } else if created_here {
                return Err(JournalError::LogMissing {
                    path: log_path,
                    lock: lock_path,
                });
            }
        }
        // A leftover tmp file is a compaction (or first creation) that did
        // not reach its rename: the log, if any, is still the truth.
        remove_if_exists(&tmp_path)?;
        if !exists(&log_path)? {
            // A new journal gets its identity in its very first snapshot.
            let fresh = State {
                journal_id: Some(new_journal_id()),
                ..State::new()
            };
            write_snapshot(&cfg.dir, &tmp_path, &log_path, &fresh, None, None)?;
            // The directory may be new too: make its entry durable, best
            // effort (the parent may not be readable to us).
            if let Some(parent) = cfg.dir.parent() {
                let _ = sync_dir(parent);
            }
            if origin == Origin::Existing {
                origin = Origin::Created;
            }
        }
        if !created_here {
            // From now on a missing log is refused. Written after the log's
            // directory entry is durable, so a crash before this line leaves
            // a directory that may start fresh (nothing was accepted yet).
            lock.write_all_at(CREATED_MARKER, 0)
                .and_then(|()| lock.sync_data())
                .map_err(|e| JournalError::io("write", &lock_path, e))?;
        }

        let bytes = fs::read(&log_path).map_err(|e| JournalError::io("read", &log_path, e))?;
        let Replayed {
            mut state,
            salt,
            version,
            valid_end,
            snapshot_end,
        } = replay(&bytes, &log_path)?;

        let total = bytes.len();
        drop(bytes);
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| JournalError::io("open", &log_path, e))?;
        let truncated_bytes = (total - valid_end) as u64;
        if truncated_bytes > 0 {
            file.set_len(valid_end as u64)
                .map_err(|e| JournalError::io("truncate torn tail of", &log_path, e))?;
            file.sync_all()
                .map_err(|e| JournalError::io("fsync", &log_path, e))?;
        }
        // What compaction would forget, forget now: replay re-read ids of
        // the whole log, and memory must not depend on when we compacted.
        let now = state.reference_now();
        if let Some(now) = now {
            state.prune(now.saturating_sub(cfg.retention_ns));
        }

        let mut journal = Journal {
            log_path,
            tmp_path,
            file,
            _lock: lock,
            salt,
            version,
            fin: FinishedBatch::default(),
            len: valid_end as u64,
            synced_len: valid_end as u64,
            syncs: 0,
            state,
            buf: Vec::with_capacity(256),
            lazy: Vec::with_capacity(LAZY_FLUSH_BYTES),
            // The live size at the last compaction is where its snapshot
            // ends: the trigger survives restarts.
            compact_trigger: trigger(cfg.max_log_bytes, snapshot_end.map_or(0, |e| e as u64)),
            last_group_sync_ns: None,
            syncs_at_heartbeat: 0,
            last_prune_ns: now,
            poisoned: false,
            compaction_error: None,
            cfg,
        };

        // An older format is rewritten in this one before anything is
        // appended (a compaction: atomic, the old log stays until the
        // rename; its outbox records are copied byte for byte).
        if journal.version < FORMAT_VERSION {
            journal.compact()?;
        }

        // A log from before journal ids: it gets one now, durably, before
        // anything is reported under it (kept by every later snapshot).
        if journal
            .state
            .journal_id
            .as_deref()
            .is_none_or(str::is_empty)
        {
            let id = new_journal_id();
            journal.commit(&Rec::JournalId { id: &id }, true)?;
        }

        // The cap may have been lowered since the last run.
        let len = journal.state.outbox.len();
        if len > journal.cfg.outbox_cap {
            let through = journal
                .state
                .outbox
                .seq_at(len - journal.cfg.outbox_cap - 1);
            journal.commit(
                &Rec::DropOldest {
                    through_seq: through,
                },
                true,
            )?;
        }
        journal.maybe_compact();

        let recovered = Recovered {
            packs: journal
                .state
                .packs
                .values()
                .map(PackedPack::to_stored)
                .collect(),
            attempts: journal
                .state
                .attempts
                .iter()
                .map(|(id, a)| (id.to_string(), a.outcome))
                .collect(),
            once: journal.state.once.keys().map(|k| k.to_string()).collect(),
            outbox_len: journal.state.outbox.len(),
            dropped: journal.state.dropped,
            last_alive_ns: journal.state.last_alive_ns,
            truncated_bytes,
            origin,
        };
        Ok((journal, recovered))
    }

    /// Records that a stored pack version is stopped for good: after a
    /// restart it is restored in its safe state instead of firing again.
    /// Durable on return. Ignored if that version is not stored.
    pub fn stop_pack(
        &mut self,
        tenant: &str,
        pack: &str,
        version: u64,
        reason: StopReason,
    ) -> Result<(), JournalError> {
        self.commit(
            &Rec::StopPack {
                tenant,
                pack,
                version,
                reason,
            },
            true,
        )
    }

    /// Stores an accepted pack, replacing any stored version of it (the
    /// agent decides which versions to accept; the journal keeps the last
    /// one it was given). Durable on return: ack the pack only after this.
    pub fn put_pack(&mut self, p: &StoredPack) -> Result<(), JournalError> {
        self.commit(
            &Rec::PutPack {
                tenant: &p.tenant,
                pack: &p.pack,
                version: p.version,
                accepted_ns: p.accepted_ns,
                yaml: &p.yaml,
            },
            true,
        )
    }

    /// Forgets a stored pack. Durable on return, so a cancelled pack cannot
    /// reappear after a power cut. Removing an unknown pack is a no-op.
    pub fn remove_pack(&mut self, tenant: &str, pack: &str) -> Result<(), JournalError> {
        if !self
            .state
            .packs
            .contains_key(&(tenant.to_owned(), pack.to_owned()))
        {
            return self.check_poisoned();
        }
        self.commit(&Rec::RemovePack { tenant, pack }, true)
    }

    /// Records that these executions are starting, each with its scheduled
    /// reference time (ns; dates it for the retention horizon). Durable
    /// (fdatasync) on return, and all-or-nothing: the batch is one record,
    /// so one sync covers several firings due together. The agent calls
    /// this BEFORE touching the device; if it fails, nothing may fire.
    pub fn record_started(&mut self, ids: &[(&str, i64)]) -> Result<(), JournalError> {
        if ids.is_empty() {
            return self.check_poisoned();
        }
        self.commit(&Rec::Started(Ids::Borrowed(ids)), true)
    }

    /// Records an execution's result: one record, so a crash leaves either
    /// no result (outcome unknown) or this one, never half of it. Lazily
    /// synced (group commit, see the module docs). Push the result's
    /// feedback *before* calling this, so that a durable result implies
    /// durable feedback. A later call for the same id replaces the outcome.
    pub fn record_finished(&mut self, id: &str, outcome: Outcome) -> Result<(), JournalError> {
        // Date the result by its start if known, else by the journal's
        // "now"; with no reference time known at all (no heartbeat, no
        // start yet) it is dated in the far future: kept, never forgotten.
        self.check_poisoned()?;
        let ref_ns = self
            .state
            .attempts
            .get(id)
            .map(|a| a.ref_ns)
            .or_else(|| self.state.reference_now())
            .unwrap_or(i64::MAX);
        // Lazy like the others, and batched: one record per flush holds
        // every result since the last (a few bytes each, not a frame each).
        self.fin.push(id, ref_ns, outcome);
        self.state.finish(id, ref_ns, outcome);
        if self.fin.frame_len() >= LAZY_FLUSH_BYTES / 2 {
            self.flush()?;
            self.maybe_compact();
        }
        Ok(())
    }

    /// Claims a once-only action (an `on_failure`, a give-up report, an
    /// `outcome unknown` report...) by its key, dated `ref_ns` (reference
    /// ns) for the retention horizon. Returns `true` if the key is new: it
    /// is then durable (fdatasync'd) on return and the caller takes the
    /// action now. Returns `false`, writing nothing, if the key was already
    /// recorded (before a restart, say): the action was or may have been
    /// taken, and must not be taken again. Call it BEFORE acting.
    pub fn record_once(&mut self, key: &str, ref_ns: i64) -> Result<bool, JournalError> {
        self.check_poisoned()?;
        if self.state.once.contains_key(key) {
            return Ok(false);
        }
        self.commit(&Rec::Once { key, ref_ns }, true)?;
        Ok(true)
    }

    /// Appends a feedback record (opaque bytes, JSON by convention) to the
    /// outbox and returns its seq (1, 2, ...; monotonic across restarts).
    /// If the outbox is full, the oldest entries are dropped and counted in
    /// [`Journal::dropped`]. Lazily synced. The payload stays on disk only.
    pub fn push_feedback(&mut self, record: &[u8]) -> Result<u64, JournalError> {
        let seq = self.state.next_seq;
        let len = self.state.outbox.len();
        let cap = self.cfg.outbox_cap;
        let dropped_through = if len >= cap {
            self.state.outbox.seq_at(len - cap)
        } else {
            0
        };
        self.commit(
            &Rec::Push {
                seq,
                dropped_through,
                record,
            },
            false,
        )?;
        Ok(seq)
    }

    /// Removes feedback with seq <= `up_to_seq` from the outbox: the
    /// controller has it. Lazily synced (a lost ack means a re-send). When
    /// it covers the entry that carried the drop count
    /// ([`Journal::carry_drops`]), the count is reported: [`Journal::dropped`]
    /// decreases by it, in the same record.
    pub fn ack_feedback(&mut self, up_to_seq: u64) -> Result<(), JournalError> {
        if self.state.outbox.front_seq().is_none_or(|s| s > up_to_seq) {
            return self.check_poisoned();
        }
        self.commit(&Rec::Ack { up_to_seq }, false)
    }

    /// The drop count to send with feedback `seq` as `dropped_before`.
    /// Call it for the first entry of every page sent: when drops are
    /// unreported and no entry carries them yet, `seq` becomes their
    /// carrier (a lazy `DropsSent` record) and gets the count. The carrier
    /// gets the same count on every re-send, across restarts, until the
    /// controller acknowledges it (then the count is reported, see
    /// [`Journal::ack_feedback`]) or it is dropped itself (then the count
    /// rides on a later entry). Any other entry gets 0. So a count reaches
    /// the controller on exactly one seq, and is never lost.
    ///
    /// The carrier follows the drops directly when the drops happened
    /// while nothing was in flight (an outage: the usual case): its
    /// `dropped_before` entries are the seqs just before it. Drops of
    /// entries already sent (a controller slower than the cap allows) are
    /// counted on the next page sent.
    pub fn carry_drops(&mut self, seq: u64) -> Result<u64, JournalError> {
        if self.state.carrier.is_none()
            && self.state.dropped > 0
            && self.state.outbox.front_seq().is_some_and(|f| f <= seq)
            && self.state.outbox.back_seq().is_some_and(|b| seq <= b)
        {
            let count = self.state.dropped;
            self.commit(&Rec::DropsSent { seq, count }, false)?;
        }
        Ok(self.state.dropped_before(seq))
    }

    /// The drop count entry `seq` carries (see [`Journal::carry_drops`]);
    /// 0 for any entry but the carrier.
    pub fn dropped_before(&self, seq: u64) -> u64 {
        self.state.dropped_before(seq)
    }

    /// Notes that the agent is up at reference time `now_ns`. Cheap: written
    /// every call, fdatasync'd (together with any pending lazy records) only
    /// once per [`JournalConfig::lazy_sync_interval_ns`] (the group commit
    /// of lazy records); once per quarter of
    /// [`JournalConfig::retention_ns`] it also forgets ids and once keys
    /// past the horizon. Call it regularly (the agent: every ~100 ms) and
    /// log what the returned [`Heartbeat`] reports.
    pub fn heartbeat(&mut self, now_ns: i64) -> Result<Heartbeat, JournalError> {
        let prev = self.state.last_alive_ns;
        self.commit(&Rec::Alive { ns: now_ns }, false)?;
        if self.syncs != self.syncs_at_heartbeat
            && let Some(p) = prev.filter(|p| *p <= now_ns)
        {
            // A durable call since the last heartbeat synced everything
            // written before it: a group commit already (dated, to be safe,
            // at that heartbeat). Under load the firings' own syncs keep the
            // lazy records durable; a sync of its own here would rewrite
            // the log's last page once more for nothing.
            self.last_group_sync_ns = Some(self.last_group_sync_ns.map_or(p, |t| t.max(p)));
        }
        let interval = self.cfg.lazy_sync_interval_ns;
        // A clock that went backwards also syncs: better early than never.
        let due = self
            .last_group_sync_ns
            .is_none_or(|t| now_ns < t || now_ns.saturating_sub(t) >= interval);
        if due {
            self.sync()?;
            self.last_group_sync_ns = Some(now_ns);
        }
        self.syncs_at_heartbeat = self.syncs;
        let every = self.cfg.retention_ns / 4;
        let prune_due = self
            .last_prune_ns
            .is_none_or(|t| now_ns < t || now_ns.saturating_sub(t) >= every);
        let mut pruned = 0;
        if prune_due {
            self.last_prune_ns = Some(now_ns);
            pruned = self
                .state
                .prune(now_ns.saturating_sub(self.cfg.retention_ns));
        }
        Ok(Heartbeat {
            compaction_error: self.compaction_error.take(),
            pruned,
        })
    }

    /// The journal's identity: 128 random bits as 32 lowercase hex digits,
    /// made when the journal is created and kept by every compaction and
    /// restart (unlike the header's salt, which each compaction renews). A
    /// new journal (`--reset-journal`, a wiped data directory) has a new id,
    /// so the controller can tell its feedback seqs, which start again at
    /// 1, from a re-send of the old ones.
    pub fn id(&self) -> &str {
        self.state.journal_id.as_deref().unwrap_or_default()
    }

    /// Records that a controller session of generation `generation` was
    /// welcomed: the fence pushes and cancels are checked against (DESIGN.md
    /// "Stores": fencing that reaches the device). Only raises it: a
    /// generation at or below [`Journal::session_gen`] writes nothing.
    /// Durable on return, before the session's first push is looked at, so
    /// neither `kill -9` nor a power cut can lower the fence. Kept by every
    /// compaction.
    pub fn record_session_gen(&mut self, generation: u64) -> Result<(), JournalError> {
        if generation <= self.state.session_gen {
            return self.check_poisoned();
        }
        self.commit(&Rec::SessionGen { generation }, true)
    }

    /// The highest controller session generation recorded (0: none, or a
    /// journal older than fencing): what the agent's Hello carries, and
    /// below which it refuses a controller.
    pub fn session_gen(&self) -> u64 {
        self.state.session_gen
    }

    /// Outbox entries dropped because of the cap and not yet reported.
    pub fn dropped(&self) -> u64 {
        self.state.dropped
    }

    /// Marks `count` drops as reported upstream: [`Journal::dropped`]
    /// decreases by it (not to zero, so drops that happened after the value
    /// was read stay counted). Lazily synced.
    pub fn reset_dropped(&mut self, count: u64) -> Result<(), JournalError> {
        let count = count.min(self.state.dropped);
        if count == 0 {
            return self.check_poisoned();
        }
        self.commit(&Rec::DroppedReported { count }, false)
    }

    /// The seq the next feedback record will get (1 in a new journal):
    /// every seq below it was handed out. An acknowledgement beyond
    /// `next_seq() - 1` names feedback that does not exist yet.
    pub fn next_seq(&self) -> u64 {
        self.state.next_seq
    }

    /// Unacknowledged feedback records held.
    pub fn outbox_len(&self) -> usize {
        self.state.outbox.len()
    }

    /// The first and last seq of unacknowledged feedback, if any (seqs in
    /// between are all held: the outbox is contiguous).
    pub fn outbox_range(&self) -> Option<(u64, u64)> {
        Some((
            self.state.outbox.front_seq()?,
            self.state.outbox.back_seq()?,
        ))
    }

    /// Up to `max` unacknowledged feedback records with seq >= `from_seq`,
    /// in seq order, read back from the log (to re-send after reconnecting:
    /// page through with `from_seq = last seq + 1`). Each record's checksum
    /// is verified again; a mismatch is [`JournalError::Corrupt`].
    pub fn outbox_page(
        &mut self,
        from_seq: u64,
        max: usize,
    ) -> Result<Vec<(u64, Vec<u8>)>, JournalError> {
        self.check_poisoned()?;
        self.flush()?;
        let mut out = Vec::with_capacity(max.min(self.state.outbox.len()).min(1024));
        let mut buf = Vec::new();
        for (seq, offset) in self.state.outbox.page(from_seq, max) {
            let log = OldLog {
                file: &self.file,
                path: &self.log_path,
                salt: self.salt,
                version: self.version,
            };
            let record = read_push(&log, offset, seq, &mut buf)?;
            out.push((seq, record.to_vec()));
        }
        Ok(out)
    }

    /// Whether `id` has a start (or result) record: it must never fire
    /// again, unless its outcome is [`Outcome::NotRun`].
    pub fn is_started(&self, id: &str) -> bool {
        self.state.attempts.contains_key(id)
    }

    /// The result recorded for `id`, if any.
    pub fn outcome(&self, id: &str) -> Option<Outcome> {
        self.state.attempts.get(id).and_then(|a| a.outcome)
    }

    /// Whether the once-only action `key` was recorded.
    pub fn is_once_recorded(&self, key: &str) -> bool {
        self.state.once.contains_key(key)
    }

    /// How much the journal holds in memory now.
    pub fn held(&self) -> Held {
        Held {
            packs: self.state.packs.len(),
            attempts: self.state.attempts.len(),
            once: self.state.once.len(),
            outbox: self.state.outbox.len(),
            outbox_index_bytes: self.state.outbox.heap_bytes(),
        }
    }

    /// Bytes in the log: what the file holds after the next flush (the
    /// results of this pass included, which are written as one record
    /// then, after everything else this pass appended).
    pub fn log_bytes(&self) -> u64 {
        let pending = if self.fin.is_empty() {
            0
        } else {
            self.fin.frame_len() as u64
        };
        self.len + pending
    }

    /// fdatasync calls on the log since it was opened.
    pub fn syncs(&self) -> u64 {
        self.syncs
    }

    /// The error of the last failed automatic compaction, if any, cleared
    /// by this call (the next [`Journal::heartbeat`] also hands it out). An
    /// automatic compaction failure does not fail the call that triggered
    /// it (its record is safely in the log); the journal retries after the
    /// log grew by another quarter of `max_log_bytes`.
    pub fn take_compaction_error(&mut self) -> Option<JournalError> {
        self.compaction_error.take()
    }

    /// Makes everything written so far durable (fdatasync). Call on shutdown.
    pub fn sync(&mut self) -> Result<(), JournalError> {
        self.check_poisoned()?;
        self.flush()?;
        if self.synced_len < self.len {
            self.sync_data()?;
        }
        Ok(())
    }

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

    fn check_poisoned(&self) -> Result<(), JournalError> {
        if self.poisoned {
            Err(JournalError::Poisoned {
                path: self.log_path.clone(),
            })
        } else {
            Ok(())
        }
    }

    /// Appends `rec` (and syncs it if `durable`), then applies it to the
    /// in-memory state: the state never runs ahead of the log.
    /// Writes the buffered lazy records (one `write(2)`). The runtime calls
    /// it once per pass of its loop; durable calls, [`Journal::sync`] and
    /// compaction call it first, so the log keeps the records' order.
    pub fn flush(&mut self) -> Result<(), JournalError> {
        self.check_poisoned()?;
        if !self.fin.is_empty() {
            let start = self.lazy.len();
            // Bounded far below the frame limit (sealed at half the lazy
            // buffer's size).
            self.fin
                .seal(&mut self.lazy, self.salt)
                .map_err(|e| JournalError::TooLarge {
                    what: "batch of results",
                    len: e.len,
                    limit: MAX_PAYLOAD,
                })?;
            self.len += (self.lazy.len() - start) as u64;
        }
        if self.lazy.is_empty() {
            return Ok(());
        }
        let written = self.file.write_all(&self.lazy);
        self.lazy.clear();
        if let Err(e) = written {
            self.poisoned = true;
            return Err(JournalError::io("append to", &self.log_path, e));
        }
        Ok(())
    }

    fn commit(&mut self, rec: &Rec<'_>, durable: bool) -> Result<(), JournalError> {
        self.check_poisoned()?;
        if !durable {
            return self.commit_lazy(rec);
        }
        self.flush()?;
        self.buf.clear();
        record::frame(&mut self.buf, self.salt, rec).map_err(|e| JournalError::TooLarge {
            what: rec.what(),
            len: e.len,
            limit: MAX_PAYLOAD,
        })?;
        let written = self.file.write_all(&self.buf);
        let n = self.buf.len() as u64;
        if self.buf.capacity() > KEEP_BUF_BYTES {
            self.buf = Vec::with_capacity(256);
        }
        if let Err(e) = written {
            self.poisoned = true;
            return Err(JournalError::io("append to", &self.log_path, e));
        }
        let offset = self.len;
        self.len += n;
        if durable {
            self.sync_data()?;
        }
        self.state.apply(rec, offset);
        self.maybe_compact();
        Ok(())
    }

    /// A lazy record joins the buffer; its offset is where it will land.
    fn commit_lazy(&mut self, rec: &Rec<'_>) -> Result<(), JournalError> {
        let start = self.lazy.len();
        record::frame(&mut self.lazy, self.salt, rec).map_err(|e| JournalError::TooLarge {
            what: rec.what(),
            len: e.len,
            limit: MAX_PAYLOAD,
        })?;
        let offset = self.len;
        self.len += (self.lazy.len() - start) as u64;
        self.state.apply(rec, offset);
        if self.lazy.len() >= LAZY_FLUSH_BYTES {
            self.flush()?;
        }
        self.maybe_compact();
        Ok(())
    }

    fn sync_data(&mut self) -> Result<(), JournalError> {
        if let Err(e) = self.file.sync_data() {
            self.poisoned = true;
            return Err(JournalError::io("fdatasync", &self.log_path, e));
        }
        self.synced_len = self.len;
        self.syncs += 1;
        Ok(())
    }

    fn maybe_compact(&mut self) {
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
fn trigger(max_log_bytes: u64, live: u64) -> u64 {
    max_log_bytes.max(live.saturating_mul(2))
}

impl Drop for Journal {
    /// Best-effort flush on a clean drop; a crash relies on the durable
    /// calls instead, and errors here have nowhere to go.
    fn drop(&mut self) {
        if !self.poisoned && (self.synced_len < self.len || !self.fin.is_empty()) {
            let _ = self.flush();
            let _ = self.file.sync_data();
        }
    }
}

impl Rec<'_> {
    /// What this record holds, for [`JournalError::TooLarge`].
    fn what(&self) -> &'static str {
        match self {
            Rec::PutPack { .. } => "pack",
            Rec::Started(_) => "batch of execution ids",
            Rec::Finished(_) => "batch of results",
            Rec::Once { .. } => "once key",
            Rec::Push { .. } => "feedback record",
            _ => "record",
        }
    }
}

/// A fresh journal id: 128 random bits, 32 lowercase hex digits.
fn new_journal_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

fn exists(path: &Path) -> Result<bool, JournalError> {
    match fs::symlink_metadata(path) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(JournalError::io("stat", path, e)),
    }
}

/// Whether `tmp` holds a complete snapshot: it replays cleanly, with no
/// torn tail, up to its closing `Meta` record (written last, then fsynced
/// before any rename).
fn complete_snapshot(tmp: &Path) -> Result<bool, JournalError> {
    let bytes = match fs::read(tmp) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(JournalError::io("read", tmp, e)),
    };
    Ok(replay(&bytes, tmp)
        .is_ok_and(|r| r.valid_end == bytes.len() && r.snapshot_end == Some(bytes.len())))
}

/// A replayed log image.
struct Replayed {
    state: State,
    salt: u32,
    version: u32,
    /// Where its intact records end (the rest is a torn tail).
    valid_end: usize,
    /// Where the last `Meta` record ends: the live size at the last
    /// compaction (every log starts as a snapshot).
    snapshot_end: Option<usize>,
}

/// Replays a log image.
fn replay(buf: &[u8], path: &Path) -> Result<Replayed, JournalError> {
    let corrupt = |offset: usize, reason: String| JournalError::Corrupt {
        path: path.to_owned(),
        offset: offset as u64,
        reason,
    };
    let (salt, version) = record::decode_header(buf).map_err(|e| match e {
        HeaderError::Version(found) => JournalError::UnsupportedVersion {
            path: path.to_owned(),
            found,
            supported: record::FORMAT_VERSION,
            oldest: record::OLDEST_READABLE,
        },
        HeaderError::Short => corrupt(
            0,
            format!(
                "{} bytes, shorter than the {HEADER_LEN}-byte header",
                buf.len()
            ),
        ),
        HeaderError::Magic => corrupt(0, "not a baton journal (bad magic)".into()),
        HeaderError::Checksum => corrupt(0, "header checksum mismatch".into()),
    })?;
    let mut state = State::new();
    let mut snapshot_end = None;
    let mut pos = HEADER_LEN;
    while pos < buf.len() {
        if let Some((payload, next)) = record::read_frame(buf, pos, salt) {
            let rec = record::decode(payload, version).map_err(|reason| corrupt(pos, reason))?;
            state.check(&rec).map_err(|reason| corrupt(pos, reason))?;
            state.apply(&rec, pos as u64);
            if matches!(rec, Rec::Meta { .. }) {
                snapshot_end = Some(next);
            }
            pos = next;
        } else if let Some(intact) = record::any_frame_from(buf, pos + 1, salt) {
            return Err(corrupt(
                pos,
                format!(
                    "record fails its checksum, but an intact record follows at offset \
                     {intact}: damage in the middle, not a torn tail"
                ),
            ));
        } else {
            break;
        }
    }
    Ok(Replayed {
        state,
        salt,
        version,
        valid_end: pos,
        snapshot_end,
    })
}

/// Reads back the `Push` frame of feedback `seq` at `offset` of `log`,
/// verifying its checksum again. Returns the record (borrowed from `buf`).
fn read_push<'b>(
    log: &OldLog<'_>,
    offset: u64,
    seq: u64,
    buf: &'b mut Vec<u8>,
) -> Result<&'b [u8], JournalError> {
    let (file, path, salt) = (log.file, log.path, log.salt);
    let corrupt = |reason: String| JournalError::Corrupt {
        path: path.to_owned(),
        offset,
        reason,
    };
    let mut head = [0u8; FRAME_LEN];
    file.read_exact_at(&mut head, offset)
        .map_err(|e| JournalError::io("read feedback from", path, e))?;
    let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
    if len == 0 || len > MAX_PAYLOAD {
        return Err(corrupt(format!(
            "feedback seq {seq}: implausible record length {len} on re-read"
        )));
    }
    buf.clear();
    buf.resize(FRAME_LEN + len, 0);
    buf[..FRAME_LEN].copy_from_slice(&head);
    file.read_exact_at(&mut buf[FRAME_LEN..], offset + FRAME_LEN as u64)
        .map_err(|e| JournalError::io("read feedback from", path, e))?;
    let Some((payload, _)) = record::read_frame(buf, 0, salt) else {
        return Err(corrupt(format!(
            "feedback seq {seq} fails its checksum on re-read"
        )));
    };
    match record::decode(payload, log.version) {
        Ok(Rec::Push {
            seq: found, record, ..
        }) if found == seq => Ok(record),
        Ok(_) => Err(corrupt(format!(
            "expected the record of feedback seq {seq} here"
        ))),
        Err(reason) => Err(corrupt(reason)),
    }
}

/// A snapshot failed before its rename (the old log is untouched) or after
/// it (the new log is in place but its directory entry may not be durable).
enum SnapshotError {
    BeforeRename(JournalError),
    AfterRename(JournalError),
}

impl From<SnapshotError> for JournalError {
    fn from(e: SnapshotError) -> Self {
        match e {
            SnapshotError::BeforeRename(e) | SnapshotError::AfterRename(e) => e,
        }
    }
}

/// A log feedback payloads are read back from (the current one, or the
/// one a snapshot copies from).
struct OldLog<'a> {
    file: &'a File,
    path: &'a Path,
    salt: u32,
    version: u32,
}

/// Writes `state` (ids older than `horizon` left out) as a complete new log
/// at `tmp`, fsyncs it, renames it over `log` and fsyncs `dir`. Returns the
/// new log open for appending (and reading), its salt, its length and the
/// new offsets of the outbox's records (copied from `old`).
fn write_snapshot(
    dir: &Path,
    tmp: &Path,
    log: &Path,
    state: &State,
    horizon: Option<i64>,
    old: Option<OldLog<'_>>,
) -> Result<(File, u32, u64, VecDeque<u64>), SnapshotError> {
    let salt: u32 = rand::random();
    let result = write_tmp(tmp, state, horizon, salt, old);
    let (file, len, offsets) = match result {
        Ok(v) => v,
        Err(e) => {
            let _ = fs::remove_file(tmp);
            return Err(SnapshotError::BeforeRename(e));
        }
    };
    if let Err(e) = fs::rename(tmp, log) {
        let _ = fs::remove_file(tmp);
        return Err(SnapshotError::BeforeRename(JournalError::io(
            "rename compacted log over",
            log,
            e,
        )));
    }
    sync_dir(dir).map_err(SnapshotError::AfterRename)?;
    Ok((file, salt, len, offsets))
}

fn write_tmp(
    tmp: &Path,
    state: &State,
    horizon: Option<i64>,
    salt: u32,
    old: Option<OldLog<'_>>,
) -> Result<(File, u64, VecDeque<u64>), JournalError> {
    let io_err = |op| move |e| JournalError::io(op, tmp, e);
    remove_if_exists(tmp)?;
    let file = OpenOptions::new()
        .read(true)
        .append(true)
        .create_new(true)
        .open(tmp)
        .map_err(io_err("create"))?;
    let mut w = Snapshot {
        out: BufWriter::with_capacity(1 << 16, file),
        buf: Vec::new(),
        salt,
        len: 0,
    };
    w.out
        .write_all(&record::encode_header(salt))
        .map_err(io_err("write"))?;
    w.len += HEADER_LEN as u64;
    let keep = |ns: i64| horizon.is_none_or(|h| ns >= h);

    if let Some(id) = &state.journal_id {
        w.emit(&Rec::JournalId { id }).map_err(io_err("write"))?;
    }
    // Only once a fencing controller was seen: a journal that never met
    // one stays readable by an agent built before the record existed.
    if state.session_gen > 0 {
        w.emit(&Rec::SessionGen {
            generation: state.session_gen,
        })
        .map_err(io_err("write"))?;
    }
    for p in state.packs.values() {
        let yaml = p.yaml();
        w.emit(&Rec::PutPack {
            tenant: &p.tenant,
            pack: &p.pack,
            version: p.version,
            accepted_ns: p.accepted_ns,
            yaml: &yaml,
        })
        .map_err(io_err("write"))?;
        if let Some(reason) = p.stopped {
            w.emit(&Rec::StopPack {
                tenant: &p.tenant,
                pack: &p.pack,
                version: p.version,
                reason,
            })
            .map_err(io_err("write"))?;
        }
    }
    // Started-only ids in batches; ids with a result as one `Finished`
    // record each (which implies the start).
    let mut chunk: Vec<(&str, i64)> = Vec::new();
    let mut chunk_bytes = 0;
    for (id, a) in state
        .attempts
        .iter()
        .filter(|(_, a)| a.outcome.is_none() && keep(a.ref_ns))
    {
        chunk.push((id, a.ref_ns));
        chunk_bytes += id.len() + 12;
        if chunk_bytes >= SNAPSHOT_CHUNK_BYTES {
            // In time order: the compact form stores times as deltas (the
            // map's order would cost a byte or more per id).
            chunk.sort_unstable_by_key(|(_, ns)| *ns);
            w.emit(&Rec::Started(Ids::Borrowed(&chunk)))
                .map_err(io_err("write"))?;
            chunk.clear();
            chunk_bytes = 0;
        }
    }
    if !chunk.is_empty() {
        chunk.sort_unstable_by_key(|(_, ns)| *ns);
        w.emit(&Rec::Started(Ids::Borrowed(&chunk)))
            .map_err(io_err("write"))?;
    }
    drop(chunk);
    let mut results: Vec<record::Result1<'_>> = Vec::new();
    let mut results_bytes = 0;
    for (id, a) in state.attempts.iter().filter(|(_, a)| keep(a.ref_ns)) {
        if let Some(outcome) = a.outcome {
            results.push((std::borrow::Cow::Borrowed(&**id), a.ref_ns, outcome));
            results_bytes += id.len() + 13;
            if results_bytes >= SNAPSHOT_CHUNK_BYTES {
                results.sort_unstable_by_key(|r| r.1);
                w.emit(&Rec::Finished(std::mem::take(&mut results)))
                    .map_err(io_err("write"))?;
                results_bytes = 0;
            }
        }
    }
    if !results.is_empty() {
        results.sort_unstable_by_key(|r| r.1);
        w.emit(&Rec::Finished(results)).map_err(io_err("write"))?;
    }
    for (key, ns) in state.once.iter().filter(|(_, ns)| keep(**ns)) {
        w.emit(&Rec::Once { key, ref_ns: *ns })
            .map_err(io_err("write"))?;
    }
    let mut offsets = VecDeque::with_capacity(state.outbox.len());
    if let Some(old) = old {
        let mut rbuf = Vec::new();
        for (seq, offset) in state.outbox.page(0, usize::MAX) {
            let record = read_push(&old, offset, seq, &mut rbuf)?;
            offsets.push_back(w.len);
            w.emit(&Rec::Push {
                seq,
                dropped_through: 0,
                record,
            })
            .map_err(io_err("write"))?;
            if rbuf.capacity() > KEEP_BUF_BYTES {
                rbuf = Vec::new();
            }
        }
    }
    debug_assert_eq!(offsets.len(), state.outbox.len(), "outbox copied whole");
    // Last: its end marks the snapshot complete and measures the live size.
    w.emit(&Rec::Meta {
        next_seq: state.next_seq,
        dropped: state.dropped,
        last_alive_ns: state.last_alive_ns,
        carrier: state.carrier,
    })
    .map_err(io_err("write"))?;
    let len = w.len;
    let file = w
        .out
        .into_inner()
        .map_err(|e| JournalError::io("write", tmp, e.into_error()))?;
    file.sync_all().map_err(io_err("fsync"))?;
    Ok((file, len, offsets))
}

/// Buffered writer of framed records for a snapshot.
struct Snapshot {
    out: BufWriter<File>,
    buf: Vec<u8>,
    salt: u32,
    len: u64,
}

impl Snapshot {
    fn emit(&mut self, rec: &Rec<'_>) -> io::Result<()> {
        self.buf.clear();
        // Every record in the state was framed once already (or is a chunk
        // bounded far below the limit), so this cannot be too large.
        record::frame(&mut self.buf, self.salt, rec).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("snapshot record of {} bytes over the limit", e.len),
            )
        })?;
        self.out.write_all(&self.buf)?;
        self.len += self.buf.len() as u64;
        Ok(())
    }
}

fn remove_if_exists(path: &Path) -> Result<(), JournalError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(JournalError::io("remove", path, e)),
    }
}

/// Makes renames and creations inside `dir` durable.
fn sync_dir(dir: &Path) -> Result<(), JournalError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| JournalError::io("fsync directory", dir, e))
}

/// Opens the journal in `dir` for a test, retrying briefly while
/// another test of the same binary forks a child: between its fork and
/// exec the child holds a copy of every open fd, the lock's included, for
/// a moment. For tests of this crate and of the agent (feature
/// `test-support`).
#[cfg(any(test, feature = "test-support"))]
pub fn open_retrying(dir: &Path) -> Journal {
    let mut r = Journal::open(JournalConfig::new(dir));
    for _ in 0..200 {
        if !matches!(r, Err(JournalError::Locked { .. })) {
            break;
        }
        std::thread::park_timeout(std::time::Duration::from_millis(10));
        r = Journal::open(JournalConfig::new(dir));
    }
    r.expect("open the journal").0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fence: a journal without the record (new, or written before
    /// fencing) is at 0; it only rises; it survives a reopen and a
    /// compaction (whose snapshot carries it), and a log image shows it.
    #[test]
    fn the_session_generation_only_rises_and_survives_reopen_and_compaction() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path();
        let mut j = open_retrying(dir);
        assert_eq!(j.session_gen(), 0, "a new journal has seen none");
        let before = j.log_bytes();
        j.record_session_gen(0).expect("no-op");
        assert_eq!(j.log_bytes(), before, "0 writes nothing");
        j.record_session_gen(3).expect("record");
        assert_eq!(j.session_gen(), 3);
        let syncs = j.syncs();
        j.record_session_gen(2).expect("lower: no-op");
        j.record_session_gen(3).expect("same: no-op");
        assert_eq!(j.session_gen(), 3, "never lowered");
        assert_eq!(j.syncs(), syncs, "nothing written for them");
        drop(j);

        let mut j = open_retrying(dir);
        assert_eq!(j.session_gen(), 3, "after a restart");
        j.compact().expect("compact");
        assert_eq!(j.session_gen(), 3, "after a compaction");
        drop(j);
        let j = open_retrying(dir);
        assert_eq!(j.session_gen(), 3, "a restart after the compaction");
        drop(j);
        let bytes = fs::read(dir.join(LOG_FILE)).expect("read");
        assert_eq!(check_log_bytes(&bytes).expect("replays").session_gen, 3);
    }

    /// A snapshot of a journal that never met a fencing controller holds no
    /// `SessionGen` record (an older agent can still read it).
    #[test]
    fn a_snapshot_without_a_generation_has_no_record_of_it() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path();
        let log = dir.join(LOG_FILE);
        write_snapshot(dir, &dir.join(TMP_FILE), &log, &State::new(), None, None)
            .map_err(JournalError::from)
            .expect("snapshot");
        let bytes = fs::read(&log).expect("read");
        let (salt, version) = record::decode_header(&bytes).expect("header");
        let mut pos = HEADER_LEN;
        while let Some((payload, next)) = record::read_frame(&bytes, pos, salt) {
            let rec = record::decode(payload, version).expect("decodes");
            assert!(!matches!(rec, Rec::SessionGen { .. }), "{rec:?}");
            pos = next;
        }
        assert_eq!(pos, bytes.len());
        assert_eq!(check_log_bytes(&bytes).expect("replays").session_gen, 0);
    }

    /// A log written before journal ids existed (a snapshot without the
    /// record) gets an id at open, durably, and keeps it.
    #[test]
    fn a_log_without_an_id_gets_one_at_open_and_keeps_it() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path();
        let log = dir.join(LOG_FILE);
        let mut old = State::new();
        old.next_seq = 7;
        write_snapshot(dir, &dir.join(TMP_FILE), &log, &old, None, None)
            .map_err(JournalError::from)
            .expect("old-style log");
        let bytes = fs::read(&log).expect("read");
        assert_eq!(check_log_bytes(&bytes).expect("replays").journal_id, None);

        let (mut j, rec) = Journal::open(JournalConfig::new(dir)).expect("open old log");
        assert_eq!(rec.origin, Origin::Existing);
        let id = j.id().to_string();
        assert_eq!(id.len(), 32);
        assert_eq!(
            j.push_feedback(b"x").expect("push"),
            7,
            "the rest is as it was"
        );
        drop(j);
        let bytes = fs::read(&log).expect("read");
        assert_eq!(
            check_log_bytes(&bytes)
                .expect("replays")
                .journal_id
                .as_deref(),
            Some(id.as_str()),
            "recorded in the log"
        );
        let j = open_retrying(dir);
        assert_eq!(j.id(), id);
    }
}
