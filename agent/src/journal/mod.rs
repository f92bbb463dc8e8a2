//! The agent's durable journal: accepted packs, the record of fired
//! executions, and the outbox of feedback the controller has not yet
//! acknowledged. It is what makes DESIGN.md principle 4 ("nothing is lost,
//! nothing runs twice") survive `kill -9` and power loss.
//!
//! # Design: an append-only, checksummed log, not an embedded database
//!
//! The journal is one file, `journal.log`, of length-prefixed records, each
//! with a CRC-32 (format in `record.rs`), plus a fold of those records kept
//! in memory. We chose this over an embedded store such as redb because:
//!
//! * **The state is small, bounded and needed in memory anyway.** The agent
//!   asks "has this id started?" before every firing, so the set lives in
//!   RAM whatever the store. What the disk must give is only an ordered,
//!   durable, verifiable record of *changes* — exactly a log. A B-tree on
//!   disk would duplicate the RAM copy and buy nothing.
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
//! # Durability, call by call
//!
//! Every call hands its record to the kernel (`write(2)`) before returning,
//! so a *process* crash (`kill -9`, panic with `abort`) loses nothing that
//! any call returned. Power loss loses what was not yet `fdatasync`ed:
//!
//! | call | on return |
//! | --- | --- |
//! | [`Journal::record_started`], [`Journal::put_pack`], [`Journal::remove_pack`] | fdatasync'd: survives power loss |
//! | [`Journal::record_finished`], [`Journal::push_feedback`], [`Journal::ack_feedback`], [`Journal::reset_dropped`], [`Journal::heartbeat`] | written; synced by the next durable call, [`Journal::sync`], or a heartbeat once [`JournalConfig::lazy_sync_interval_ns`] has passed (group commit) |
//!
//! Why lazy is safe for these: a lost `record_finished` turns into "started,
//! no result" → reported `outcome unknown`, never a second firing; a lost
//! feedback push (always pushed *before* its `record_finished`, see the
//! prefix property) is covered the same way; a lost ack only re-sends
//! feedback the controller already has (it dedups by seq); a lost
//! `reset_dropped` re-reports a drop count. `remove_pack` is durable because
//! a cancelled pack must not come back from the dead after a power cut.
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
//! indistinguishable from a torn write and is treated as one.
//!
//! # Compaction and bounds
//!
//! [`Journal::compact`] writes the live state as a fresh log to
//! `journal.log.tmp`, fsyncs it, renames it over `journal.log` and fsyncs
//! the directory: at every instant one complete log exists. It runs by
//! itself when the log exceeds `max(max_log_bytes, 2 × live size after the
//! last compaction)`, so a live state larger than the budget cannot make
//! every append compact. It keeps: stored packs, the unacknowledged outbox,
//! the next seq, the dropped count, the last heartbeat, and started /
//! finished ids whose reference time is within
//! [`JournalConfig::retention_ns`] (default 7 days) of the journal's "now"
//! (the last heartbeat, else the latest started id).
//!
//! Bounds, with `R` = executions started within the retention horizon:
//! * outbox ≤ `outbox_cap` entries (each ≤ 16 MiB; typically a few hundred
//!   bytes); past the cap the oldest are dropped and *counted*;
//! * started + finished ≈ `R × (id length + ~24 bytes)` on disk, about twice
//!   that in RAM. Ids are opaque, so ids of removed packs are forgotten by
//!   the horizon too, not at removal. The horizon must exceed the longest
//!   window in which the scheduler would still fire an execution
//!   (`max_lateness`, catch-up): an id is forgotten only once firing it
//!   again is refused on lateness alone;
//! * the log ≤ `max(max_log_bytes, 2 × live)` plus one record.
//!   [`Journal::open`] reads it whole, so that is also its peak extra memory.
//!
//! # Single writer
//!
//! One control thread owns the journal (`&mut self`); an exclusive `flock`
//! on `journal.lock` keeps a second process out. The journal never reads a
//! clock: reference times come in through [`Journal::heartbeat`] and
//! [`Journal::record_started`].

mod error;
mod lock;
mod packed;
mod record;
mod state;

use std::collections::HashSet;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

pub use error::JournalError;
use packed::PackedPack;
use record::{HEADER_LEN, HeaderError, Ids, MAX_PAYLOAD, Rec};
use state::State;

/// The log file's name inside [`JournalConfig::dir`].
pub const LOG_FILE: &str = "journal.log";
/// Where a compaction writes the next log before renaming it into place.
pub const TMP_FILE: &str = "journal.log.tmp";
/// The lock file that keeps a second process out.
pub const LOCK_FILE: &str = "journal.lock";

/// Started ids per snapshot record, by encoded bytes: keeps each record far
/// below the frame limit whatever the id lengths.
const SNAPSHOT_CHUNK_BYTES: usize = 1 << 20;
/// A reusable frame buffer larger than this (after a big pack) is released.
const KEEP_BUF_BYTES: usize = 1 << 20;

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
    /// How long (reference-time ns) started / finished ids are remembered.
    pub retention_ns: i64,
    /// Group-commit window: a heartbeat fdatasyncs pending lazy records
    /// when at least this much reference time passed since the last time it
    /// did. 0 syncs on every heartbeat.
    pub lazy_sync_interval_ns: i64,
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

    /// A configuration for `dir` with every other field at its default.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        JournalConfig {
            dir: dir.into(),
            outbox_cap: Self::DEFAULT_OUTBOX_CAP,
            max_log_bytes: Self::DEFAULT_MAX_LOG_BYTES,
            retention_ns: Self::DEFAULT_RETENTION_NS,
            lazy_sync_interval_ns: Self::DEFAULT_LAZY_SYNC_INTERVAL_NS,
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
    /// Set when this version entered its safe state for good (the reason):
    /// it is restored stopped, never firing again. Ignored by `put_pack`.
    pub stopped: Option<String>,
}

/// What [`Journal::open`] found on disk.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Latest accepted version of each stored pack, ordered by (tenant, pack).
    pub packs: Vec<StoredPack>,
    /// Execution ids with a durable start record.
    pub started: HashSet<String>,
    /// Execution ids with a result record. `started - finished` are the
    /// executions to report as `outcome unknown` and never fire again.
    pub finished: HashSet<String>,
    /// Unacknowledged feedback `(seq, record)`, in seq order.
    pub outbox: Vec<(u64, Vec<u8>)>,
    /// Outbox entries dropped because of the cap and not yet reported.
    pub dropped: u64,
    /// Last heartbeat: the agent was up until at least then (reference ns).
    pub last_alive_ns: Option<i64>,
    /// Bytes of a torn tail cut off the log (a crash mid-write); 0 if the
    /// log ended cleanly. Worth a warning in the agent's log.
    pub truncated_bytes: u64,
}

/// The durable journal. See the module docs for the design and guarantees.
pub struct Journal {
    cfg: JournalConfig,
    log_path: PathBuf,
    tmp_path: PathBuf,
    file: File,
    /// Held for the journal's lifetime; dropping it releases the `flock`.
    _lock: File,
    /// This log's record checksum seed.
    salt: u32,
    /// Bytes in the log.
    len: u64,
    /// Bytes known to be on stable storage.
    synced_len: u64,
    state: State,
    /// Reused frame buffer: `record_started` allocates nothing in steady state.
    buf: Vec<u8>,
    compact_trigger: u64,
    /// Reference time of the last group commit done by a heartbeat.
    last_group_sync_ns: Option<i64>,
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
            .field("packs", &self.state.packs.len())
            .field("started", &self.state.started.len())
            .field("finished", &self.state.finished.len())
            .field("outbox", &self.state.outbox.len())
            .field("dropped", &self.state.dropped)
            .field("poisoned", &self.poisoned)
            .finish_non_exhaustive()
    }
}

impl Journal {
    /// Opens (creating if needed) the journal in `cfg.dir` and recovers its
    /// state: a torn tail is truncated and reported, damage in the middle is
    /// an error naming its offset (see the module docs).
    pub fn open(cfg: JournalConfig) -> Result<(Journal, Recovered), JournalError> {
        cfg.validate()?;
        fs::create_dir_all(&cfg.dir)
            .map_err(|e| JournalError::io("create directory", &cfg.dir, e))?;
        let lock = lock::lock_exclusive(&cfg.dir.join(LOCK_FILE))?;
        let log_path = cfg.dir.join(LOG_FILE);
        let tmp_path = cfg.dir.join(TMP_FILE);

        // A leftover tmp file is a compaction (or first creation) that did
        // not reach its rename: the log, if any, is still the truth.
        remove_if_exists(&tmp_path)?;
        let exists = match fs::metadata(&log_path) {
            Ok(_) => true,
            Err(e) if e.kind() == io::ErrorKind::NotFound => false,
            Err(e) => return Err(JournalError::io("stat", &log_path, e)),
        };
        if !exists {
            let (_, _, _) = write_snapshot(&cfg.dir, &tmp_path, &log_path, &State::new(), None)?;
            // The directory may be new too: make its entry durable, best
            // effort (the parent may not be readable to us).
            if let Some(parent) = cfg.dir.parent() {
                let _ = sync_dir(parent);
            }
        }

        let bytes = fs::read(&log_path).map_err(|e| JournalError::io("read", &log_path, e))?;
        let (state, salt, valid_end) = replay(&bytes, &log_path)?;
        let total = bytes.len();
        drop(bytes);
        let file = OpenOptions::new()
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

        let mut journal = Journal {
            log_path,
            tmp_path,
            file,
            _lock: lock,
            salt,
            len: valid_end as u64,
            synced_len: valid_end as u64,
            state,
            buf: Vec::with_capacity(256),
            compact_trigger: cfg.max_log_bytes,
            last_group_sync_ns: None,
            poisoned: false,
            compaction_error: None,
            cfg,
        };

        // The cap may have been lowered since the last run.
        let len = journal.state.outbox.len();
        if len > journal.cfg.outbox_cap {
            let through = journal.state.outbox[len - journal.cfg.outbox_cap - 1].0;
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
            started: journal.state.started.keys().cloned().collect(),
            finished: journal.state.finished.keys().cloned().collect(),
            outbox: journal.state.outbox.iter().cloned().collect(),
            dropped: journal.state.dropped,
            last_alive_ns: journal.state.last_alive_ns,
            truncated_bytes,
        };
        Ok((journal, recovered))
    }

    /// Records that a stored pack version is stopped for good (give-up,
    /// cancel): after a restart it is restored in its safe state instead of
    /// firing again. Durable on return. Ignored if that version is not stored.
    pub fn stop_pack(
        &mut self,
        tenant: &str,
        pack: &str,
        version: u64,
        reason: &str,
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

    /// Records that an execution has a result. Lazily synced (group commit,
    /// see the module docs). Push the result's feedback *before* calling
    /// this, so that a durable "finished" implies durable feedback.
    pub fn record_finished(&mut self, id: &str) -> Result<(), JournalError> {
        // Date the result by its start if known, else by the journal's
        // "now"; with no time known at all it is kept until one is.
        let ref_ns = self
            .state
            .started
            .get(id)
            .copied()
            .or_else(|| self.state.reference_now())
            .unwrap_or(i64::MAX);
        self.commit(&Rec::Finished { id, ref_ns }, false)
    }

    /// Appends a feedback record (opaque bytes, JSON by convention) to the
    /// outbox and returns its seq (1, 2, ...; monotonic across restarts).
    /// If the outbox is full, the oldest entries are dropped and counted in
    /// [`Journal::dropped`]. Lazily synced.
    pub fn push_feedback(&mut self, record: &[u8]) -> Result<u64, JournalError> {
        let seq = self.state.next_seq;
        let len = self.state.outbox.len();
        let cap = self.cfg.outbox_cap;
        let dropped_through = if len >= cap {
            self.state.outbox[len - cap].0
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
    /// controller has it. Lazily synced (a lost ack means a re-send).
    pub fn ack_feedback(&mut self, up_to_seq: u64) -> Result<(), JournalError> {
        if self
            .state
            .outbox
            .front()
            .is_none_or(|(s, _)| *s > up_to_seq)
        {
            return self.check_poisoned();
        }
        self.commit(&Rec::Ack { up_to_seq }, false)
    }

    /// Notes that the agent is up at reference time `now_ns`. Cheap: written
    /// every call, fdatasync'd (together with any pending lazy records) only
    /// once per [`JournalConfig::lazy_sync_interval_ns`]; this is the group
    /// commit of lazy records.
    pub fn heartbeat(&mut self, now_ns: i64) -> Result<(), JournalError> {
        self.commit(&Rec::Alive { ns: now_ns }, false)?;
        let interval = self.cfg.lazy_sync_interval_ns;
        // A clock that went backwards also syncs: better early than never.
        let due = self
            .last_group_sync_ns
            .is_none_or(|t| now_ns < t || now_ns.saturating_sub(t) >= interval);
        if due {
            self.sync()?;
            self.last_group_sync_ns = Some(now_ns);
        }
        Ok(())
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

    /// Unacknowledged feedback records held.
    pub fn outbox_len(&self) -> usize {
        self.state.outbox.len()
    }

    /// Unacknowledged feedback, in seq order (to re-send after reconnecting).
    pub fn outbox(&self) -> impl ExactSizeIterator<Item = (u64, &[u8])> {
        self.state.outbox.iter().map(|(s, r)| (*s, r.as_slice()))
    }

    /// Whether `id` has a start record (it must never fire again).
    pub fn is_started(&self, id: &str) -> bool {
        self.state.started.contains_key(id)
    }

    /// Whether `id` has a result record.
    pub fn is_finished(&self, id: &str) -> bool {
        self.state.finished.contains_key(id)
    }

    /// Bytes in the log file now.
    pub fn log_bytes(&self) -> u64 {
        self.len
    }

    /// The error of the last failed automatic compaction, if any, cleared
    /// by this call. An automatic compaction failure does not fail the call
    /// that triggered it (its record is safely in the log); the journal
    /// retries after the log grew by another quarter of `max_log_bytes`.
    pub fn take_compaction_error(&mut self) -> Option<JournalError> {
        self.compaction_error.take()
    }

    /// Makes everything written so far durable (fdatasync). Call on shutdown.
    pub fn sync(&mut self) -> Result<(), JournalError> {
        self.check_poisoned()?;
        if self.synced_len < self.len {
            self.sync_data()?;
        }
        Ok(())
    }

    /// Rewrites the log as a snapshot of the live state, forgetting ids
    /// older than the retention horizon (see the module docs). Atomic: a
    /// crash at any point leaves either the old or the new log. Also runs
    /// by itself when the log grows past its trigger.
    pub fn compact(&mut self) -> Result<(), JournalError> {
        self.check_poisoned()?;
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
        );
        let (file, salt, len) = match snapshot {
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
        self.len = len;
        self.synced_len = len;
        if let Some(h) = horizon {
            self.state.started.retain(|_, ns| *ns >= h);
            self.state.finished.retain(|_, ns| *ns >= h);
        }
        self.compact_trigger = self.cfg.max_log_bytes.max(len.saturating_mul(2));
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
    fn commit(&mut self, rec: &Rec<'_>, durable: bool) -> Result<(), JournalError> {
        self.check_poisoned()?;
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
        self.len += n;
        if durable {
            self.sync_data()?;
        }
        self.state.apply(rec);
        self.maybe_compact();
        Ok(())
    }

    fn sync_data(&mut self) -> Result<(), JournalError> {
        if let Err(e) = self.file.sync_data() {
            self.poisoned = true;
            return Err(JournalError::io("fdatasync", &self.log_path, e));
        }
        self.synced_len = self.len;
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

impl Drop for Journal {
    /// Best-effort flush on a clean drop; a crash relies on the durable
    /// calls instead, and errors here have nowhere to go.
    fn drop(&mut self) {
        if !self.poisoned && self.synced_len < self.len {
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
            Rec::Finished { .. } => "execution id",
            Rec::Push { .. } => "feedback record",
            _ => "record",
        }
    }
}

/// Replays a log image: its state, its salt, and where its intact records
/// end (the rest is a torn tail).
fn replay(buf: &[u8], path: &Path) -> Result<(State, u32, usize), JournalError> {
    let corrupt = |offset: usize, reason: String| JournalError::Corrupt {
        path: path.to_owned(),
        offset: offset as u64,
        reason,
    };
    let salt = record::decode_header(buf).map_err(|e| match e {
        HeaderError::Version(found) => JournalError::UnsupportedVersion {
            path: path.to_owned(),
            found,
            supported: record::FORMAT_VERSION,
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
    let mut pos = HEADER_LEN;
    while pos < buf.len() {
        if let Some((payload, next)) = record::read_frame(buf, pos, salt) {
            let rec = record::decode(payload).map_err(|reason| corrupt(pos, reason))?;
            state.apply(&rec);
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
    Ok((state, salt, pos))
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

/// Writes `state` (ids older than `horizon` left out) as a complete new log
/// at `tmp`, fsyncs it, renames it over `log` and fsyncs `dir`. Returns the
/// new log open for appending, its salt and its length.
fn write_snapshot(
    dir: &Path,
    tmp: &Path,
    log: &Path,
    state: &State,
    horizon: Option<i64>,
) -> Result<(File, u32, u64), SnapshotError> {
    let salt: u32 = rand::random();
    let result = write_tmp(tmp, state, horizon, salt);
    let (file, len) = match result {
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
    Ok((file, salt, len))
}

fn write_tmp(
    tmp: &Path,
    state: &State,
    horizon: Option<i64>,
    salt: u32,
) -> Result<(File, u64), JournalError> {
    let io_err = |op| move |e| JournalError::io(op, tmp, e);
    remove_if_exists(tmp)?;
    let file = OpenOptions::new()
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

    w.emit(&Rec::Meta {
        next_seq: state.next_seq,
        dropped: state.dropped,
        last_alive_ns: state.last_alive_ns,
    })
    .map_err(io_err("write"))?;
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
        if let Some(reason) = &p.stopped {
            w.emit(&Rec::StopPack {
                tenant: &p.tenant,
                pack: &p.pack,
                version: p.version,
                reason,
            })
            .map_err(io_err("write"))?;
        }
    }
    let mut chunk: Vec<(&str, i64)> = Vec::new();
    let mut chunk_bytes = 0;
    for (id, ns) in state.started.iter().filter(|(_, ns)| keep(**ns)) {
        chunk.push((id, *ns));
        chunk_bytes += id.len() + 12;
        if chunk_bytes >= SNAPSHOT_CHUNK_BYTES {
            w.emit(&Rec::Started(Ids::Borrowed(&chunk)))
                .map_err(io_err("write"))?;
            chunk.clear();
            chunk_bytes = 0;
        }
    }
    if !chunk.is_empty() {
        w.emit(&Rec::Started(Ids::Borrowed(&chunk)))
            .map_err(io_err("write"))?;
    }
    for (id, ns) in state.finished.iter().filter(|(_, ns)| keep(**ns)) {
        w.emit(&Rec::Finished { id, ref_ns: *ns })
            .map_err(io_err("write"))?;
    }
    for (seq, record) in &state.outbox {
        w.emit(&Rec::Push {
            seq: *seq,
            dropped_through: 0,
            record,
        })
        .map_err(io_err("write"))?;
    }
    let len = w.len;
    let file = w
        .out
        .into_inner()
        .map_err(|e| JournalError::io("write", tmp, e.into_error()))?;
    file.sync_all().map_err(io_err("fsync"))?;
    Ok((file, len))
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
