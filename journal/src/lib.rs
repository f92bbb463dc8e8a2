//! The agent's durable journal: accepted packs, the record of fired
//! executions and their outcomes, once-only actions, and the outbox of
//! feedback the controller has not yet acknowledged. It is what makes
//! docs/design.md principle 4 ("nothing is lost, nothing runs twice") survive
//! `kill -9` and power loss.
//!
//! # Design: an append-only, checksummed log, not an embedded database
//!
//! The journal is one file, `journal.log`, of length-prefixed records, each
//! with a CRC-32 (format in `record/mod.rs`), plus a fold of those records kept
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
//! Records are typed (docs/design.md habit 14): an execution's result is ONE
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
//! most once: the agent records the key *before* acting (a report: pushed
//! just before its key, so the key's write carries it — never lost);
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
mod append;
mod compaction;
mod config;
mod error;
mod files;
mod lock;
mod open;
mod outbox;
mod outcome;
mod packed;
mod record;
mod replay;
mod reports;
mod snapshot;
mod state;

use std::fmt;
use std::fs::File;
use std::path::PathBuf;

pub use config::JournalConfig;
pub use error::JournalError;
pub use outcome::{Outcome, StopReason};
pub use replay::check_log_bytes;
pub use reports::{Heartbeat, Held, LogSummary, Origin, Recovered, StoredPack};
#[cfg(any(test, feature = "test-support"))]
use std::path::Path;

use record::{FinishedBatch, Ids, PushBatch, Rec};
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
    /// Feedback of this pass, written as one `PushMany` record before the
    /// next record of any other kind (see `record::PushBatch`).
    pushes: PushBatch,
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
    /// taken, and must not be taken again. Call it BEFORE an action that
    /// must not run twice; for a report, right AFTER pushing it
    /// ([`Journal::push_feedback`]): this durable call writes the buffered
    /// report before the key, so no crash leaves the key without its report.
    pub fn record_once(&mut self, key: &str, ref_ns: i64) -> Result<bool, JournalError> {
        self.check_poisoned()?;
        if self.state.once.contains_key(key) {
            return Ok(false);
        }
        self.commit(&Rec::Once { key, ref_ns }, true)?;
        Ok(true)
    }

    /// [`Journal::record_once`] for several keys with one fdatasync: keys
    /// already recorded are skipped, the others written in order and made
    /// durable together on return. For the once keys of reports already
    /// pushed (a batch's `outcome unknown`s and their dependents' skips): one
    /// sync for the batch instead of one per key, so a restart's first pass
    /// over a backlog is not held up by hundreds of syncs. A crash part-way
    /// keeps a prefix of the keys, each after the reports pushed before it.
    /// Returns how many keys were new.
    pub fn record_once_all<'k>(
        &mut self,
        keys: impl IntoIterator<Item = (&'k str, i64)>,
    ) -> Result<usize, JournalError> {
        self.check_poisoned()?;
        let mut new = 0;
        for (key, ref_ns) in keys {
            if self.state.once.contains_key(key) {
                continue;
            }
            self.commit(&Rec::Once { key, ref_ns }, false)?;
            new += 1;
        }
        if new > 0 {
            self.flush()?;
            self.sync_data()?;
        }
        Ok(new)
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
    /// welcomed: the fence pushes and cancels are checked against (docs/design.md
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
        self.len + pending + self.pushes.frame_len() as u64
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
}

impl Drop for Journal {
    /// Best-effort flush on a clean drop; a crash relies on the durable
    /// calls instead, and errors here have nowhere to go.
    fn drop(&mut self) {
        if !self.poisoned
            && (self.synced_len < self.len || !self.fin.is_empty() || !self.pushes.is_empty())
        {
            let _ = self.flush();
            let _ = self.file.sync_data();
        }
    }
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
    use crate::record::HEADER_LEN;
    use crate::snapshot::write_snapshot;
    use std::fs;

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
