//! Opening a journal: the directory's lock and recovery policy (reset,
//! a missing log, an interrupted compaction), the replay of the log and
//! the repairs made before anything is appended.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::compaction::trigger;
use crate::files::{exists, remove_if_exists, sync_dir};
use crate::lock;
use crate::packed::PackedPack;
use crate::record::{FinishedBatch, PushBatch, Rec};
use crate::replay::{Replayed, replay};
use crate::snapshot::write_snapshot;
use crate::state::State;
use crate::{
    CREATED_MARKER, DISCARDED_FILE, FORMAT_VERSION, Journal, JournalConfig, JournalError,
    LAZY_FLUSH_BYTES, LOCK_FILE, LOG_FILE, Origin, Recovered, TMP_FILE,
};

impl Journal {
    /// Opens (creating if needed) the journal in `cfg.dir` and recovers its
    /// state: a torn tail is truncated and reported, damage in the middle is
    /// an error naming its offset, a missing log where one existed is
    /// refused unless `cfg.reset` (see the module docs).
    pub fn open(cfg: JournalConfig) -> Result<(Journal, Recovered), JournalError> {
        cfg.validate()?;
        fs::create_dir_all(&cfg.dir)
            .map_err(|e| JournalError::io("create directory", &cfg.dir, e))?;
        let paths = Paths::in_dir(&cfg.dir);
        let lock = lock::lock_exclusive(&paths.lock)?;
        let created_here = lock
            .metadata()
            .map_err(|e| JournalError::io("stat", &paths.lock, e))?
            .len()
            > 0;

        let origin = settle_log(&cfg, &paths, created_here)?;
        if !created_here {
            // From now on a missing log is refused. Written after the log's
            // directory entry is durable, so a crash before this line leaves
            // a directory that may start fresh (nothing was accepted yet).
            lock.write_all_at(CREATED_MARKER, 0)
                .and_then(|()| lock.sync_data())
                .map_err(|e| JournalError::io("write", &paths.lock, e))?;
        }

        let (replayed, file, truncated_bytes) = load_log(&paths.log)?;
        let Replayed {
            mut state,
            salt,
            version,
            valid_end,
            snapshot_end,
        } = replayed;
        // What compaction would forget, forget now: replay re-read ids of
        // the whole log, and memory must not depend on when we compacted.
        let now = state.reference_now();
        if let Some(now) = now {
            state.prune(now.saturating_sub(cfg.retention_ns));
        }

        let mut journal = Journal {
            log_path: paths.log,
            tmp_path: paths.tmp,
            file,
            _lock: lock,
            salt,
            version,
            fin: FinishedBatch::default(),
            pushes: PushBatch::default(),
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
        journal.repair_before_appending()?;
        let recovered = journal.recovered(truncated_bytes, origin);
        Ok((journal, recovered))
    }

    /// What an opened log needs before anything is appended to it: the
    /// current format, an id, and no more outbox than the cap.
    fn repair_before_appending(&mut self) -> Result<(), JournalError> {
        // An older format is rewritten in this one before anything is
        // appended (a compaction: atomic, the old log stays until the
        // rename; its outbox records are copied byte for byte).
        if self.version < FORMAT_VERSION {
            self.compact()?;
        }

        // A log from before journal ids: it gets one now, durably, before
        // anything is reported under it (kept by every later snapshot).
        if self.state.journal_id.as_deref().is_none_or(str::is_empty) {
            let id = new_journal_id();
            self.commit(&Rec::JournalId { id: &id }, true)?;
        }

        // The cap may have been lowered since the last run.
        let len = self.state.outbox.len();
        if len > self.cfg.outbox_cap {
            let through = self.state.outbox.seq_at(len - self.cfg.outbox_cap - 1);
            self.commit(
                &Rec::DropOldest {
                    through_seq: through,
                },
                true,
            )?;
        }
        self.maybe_compact();
        Ok(())
    }

    /// The opened journal's state, as [`Journal::open`] reports it.
    fn recovered(&self, truncated_bytes: u64, origin: Origin) -> Recovered {
        Recovered {
            packs: self
                .state
                .packs
                .values()
                .map(PackedPack::to_stored)
                .collect(),
            attempts: self
                .state
                .attempts
                .iter()
                .map(|(id, a)| (id.to_string(), a.outcome))
                .collect(),
            once: self.state.once.keys().map(|k| k.to_string()).collect(),
            outbox_len: self.state.outbox.len(),
            dropped: self.state.dropped,
            last_alive_ns: self.state.last_alive_ns,
            forgotten_before_ns: self
                .state
                .reference_now()
                .map(|now| now.saturating_sub(self.cfg.retention_ns)),
            truncated_bytes,
            origin,
        }
    }
}

/// The journal's files inside its directory.
struct Paths {
    log: PathBuf,
    tmp: PathBuf,
    lock: PathBuf,
}

impl Paths {
    fn in_dir(dir: &Path) -> Paths {
        Paths {
            log: dir.join(LOG_FILE),
            tmp: dir.join(TMP_FILE),
            lock: dir.join(LOCK_FILE),
        }
    }
}

/// Applies the recovery policy to the directory's files (a reset, a
/// missing log, an interrupted compaction, a leftover tmp file) and leaves
/// a log in place, creating a fresh one if none is there. Returns how the
/// log came to be.
fn settle_log(
    cfg: &JournalConfig,
    paths: &Paths,
    created_here: bool,
) -> Result<Origin, JournalError> {
    let mut origin = Origin::Existing;
    if cfg.reset {
        let previous = if exists(&paths.log)? {
            let aside = cfg.dir.join(DISCARDED_FILE);
            fs::rename(&paths.log, &aside)
                .map_err(|e| JournalError::io("move aside (reset)", &paths.log, e))?;
            Some(aside)
        } else {
            None
        };
        origin = Origin::Reset { previous };
    } else if !exists(&paths.log)? {
        if complete_snapshot(&paths.tmp)? {
            fs::rename(&paths.tmp, &paths.log)
                .map_err(|e| JournalError::io("rename complete snapshot to", &paths.log, e))?;
            sync_dir(&cfg.dir)?;
            origin = Origin::CompletedCompaction;
        } else if created_here {
            return Err(JournalError::LogMissing {
                path: paths.log.clone(),
                lock: paths.lock.clone(),
            });
        }
    }
    // A leftover tmp file is a compaction (or first creation) that did
    // not reach its rename: the log, if any, is still the truth.
    remove_if_exists(&paths.tmp)?;
    if !exists(&paths.log)? {
        create_fresh_log(&cfg.dir, paths)?;
        if origin == Origin::Existing {
            origin = Origin::Created;
        }
    }
    Ok(origin)
}

/// Writes the first snapshot of a new journal, which gives it its identity.
fn create_fresh_log(dir: &Path, paths: &Paths) -> Result<(), JournalError> {
    let fresh = State {
        journal_id: Some(new_journal_id()),
        ..State::new()
    };
    write_snapshot(dir, &paths.tmp, &paths.log, &fresh, None, None)?;
    // The directory may be new too: make its entry durable, best
    // effort (the parent may not be readable to us).
    if let Some(parent) = dir.parent() {
        let _ = sync_dir(parent);
    }
    Ok(())
}

/// Replays the log and opens it for appending, its torn tail (if any) cut
/// off durably. Returns the replay, the open log and the bytes cut off.
fn load_log(log_path: &Path) -> Result<(Replayed, File, u64), JournalError> {
    let bytes = fs::read(log_path).map_err(|e| JournalError::io("read", log_path, e))?;
    let replayed = replay(&bytes, log_path)?;
    let total = bytes.len();
    drop(bytes);
    let file = OpenOptions::new()
        .read(true)
        .append(true)
        .open(log_path)
        .map_err(|e| JournalError::io("open", log_path, e))?;
    let valid_end = replayed.valid_end;
    let truncated_bytes = (total - valid_end) as u64;
    if truncated_bytes > 0 {
        file.set_len(valid_end as u64)
            .map_err(|e| JournalError::io("truncate torn tail of", log_path, e))?;
        file.sync_all()
            .map_err(|e| JournalError::io("fsync", log_path, e))?;
    }
    Ok((replayed, file, truncated_bytes))
}

/// A fresh journal id: 128 random bits, 32 lowercase hex digits.
fn new_journal_id() -> String {
    format!("{:032x}", rand::random::<u128>())
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
