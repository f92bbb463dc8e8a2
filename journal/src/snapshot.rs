//! Writing a snapshot: the live state as a complete new log, its outbox
//! records copied byte for byte from the old one, fsynced and renamed
//! into place atomically.

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::files::{remove_if_exists, sync_dir};
use crate::record::{self, Entries, FRAME_LEN, HEADER_LEN, Ids, MAX_PAYLOAD, PushBatch, Rec};
use crate::state::State;
use crate::{JournalError, KEEP_BUF_BYTES, SNAPSHOT_CHUNK_BYTES};

/// Reads feedback back from a log by seq and offset, verifying each
/// record's checksum again; keeps the last `PushMany` record inflated, so
/// a page of its entries costs one read and one inflate.
#[derive(Default)]
pub(crate) struct OutboxReader {
    buf: Vec<u8>,
    /// The record last inflated: its offset, first seq and entries.
    batch: Option<(u64, u64, Entries)>,
}

impl OutboxReader {
    /// The bytes of feedback `seq`, whose record is at `offset` of `log`.
    pub(crate) fn read(
        &mut self,
        log: &OldLog<'_>,
        offset: u64,
        seq: u64,
    ) -> Result<&[u8], JournalError> {
        let corrupt = |reason: String| JournalError::Corrupt {
            path: log.path.to_owned(),
            offset,
            reason,
        };
        if !matches!(&self.batch, Some((o, _, _)) if *o == offset) {
            self.batch = None;
            read_frame_at(log, offset, seq, &mut self.buf)?;
            let Some((payload, _)) = record::read_frame(&self.buf, 0, log.salt) else {
                return Err(corrupt(format!(
                    "feedback seq {seq} fails its checksum on re-read"
                )));
            };
            let (first, entries) = match record::decode(payload, log.version).map_err(corrupt)? {
                Rec::Push {
                    seq: found, record, ..
                } if found == seq => (seq, Entries::one(record.to_vec())),
                Rec::PushMany {
                    first_seq,
                    count,
                    block,
                    ..
                } if (first_seq..first_seq.saturating_add(count)).contains(&seq) => {
                    (first_seq, Entries::inflate(block, count).map_err(corrupt)?)
                }
                _ => {
                    return Err(corrupt(format!(
                        "expected the record of feedback seq {seq} here"
                    )));
                }
            };
            self.batch = Some((offset, first, entries));
        }
        let Some((_, first, entries)) = &self.batch else {
            return Err(corrupt(format!("feedback seq {seq} not read")));
        };
        seq.checked_sub(*first)
            .and_then(|i| entries.get(i))
            .ok_or_else(|| corrupt(format!("feedback seq {seq} not in its batch")))
    }
}

/// Reads the frame at `offset` of `log` into `buf` (length checked).
fn read_frame_at(
    log: &OldLog<'_>,
    offset: u64,
    seq: u64,
    buf: &mut Vec<u8>,
) -> Result<(), JournalError> {
    let (file, path) = (log.file, log.path);
    let mut head = [0u8; FRAME_LEN];
    file.read_exact_at(&mut head, offset)
        .map_err(|e| JournalError::io("read feedback from", path, e))?;
    let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
    if len == 0 || len > MAX_PAYLOAD {
        return Err(JournalError::Corrupt {
            path: path.to_owned(),
            offset,
            reason: format!("feedback seq {seq}: implausible record length {len} on re-read"),
        });
    }
    buf.clear();
    buf.resize(FRAME_LEN + len, 0);
    buf[..FRAME_LEN].copy_from_slice(&head);
    file.read_exact_at(&mut buf[FRAME_LEN..], offset + FRAME_LEN as u64)
        .map_err(|e| JournalError::io("read feedback from", path, e))?;
    if buf.capacity() > KEEP_BUF_BYTES && len < KEEP_BUF_BYTES / 2 {
        buf.shrink_to(KEEP_BUF_BYTES);
    }
    Ok(())
}

/// A snapshot failed before its rename (the old log is untouched) or after
/// it (the new log is in place but its directory entry may not be durable).
pub(crate) enum SnapshotError {
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
pub(crate) struct OldLog<'a> {
    pub(crate) file: &'a File,
    pub(crate) path: &'a Path,
    pub(crate) salt: u32,
    pub(crate) version: u32,
}

/// Writes `state` (ids older than `horizon` left out) as a complete new log
/// at `tmp`, fsyncs it, renames it over `log` and fsyncs `dir`. Returns the
/// new log open for appending (and reading), its salt, its length and the
/// new offsets of the outbox's records (copied from `old`).
pub(crate) fn write_snapshot(
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

/// Writes the snapshot of `state` at `tmp` (see [`write_snapshot`]), in
/// the order replay needs: identity, packs, ids, once keys, the outbox,
/// then the closing `Meta` record.
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

    w.emit_identity(state).map_err(io_err("write"))?;
    w.emit_packs(state).map_err(io_err("write"))?;
    w.emit_started(state, keep).map_err(io_err("write"))?;
    w.emit_results(state, keep).map_err(io_err("write"))?;
    w.emit_once(state, keep).map_err(io_err("write"))?;
    let offsets = match old {
        Some(old) => w.copy_outbox(state, &old, tmp)?,
        None => VecDeque::with_capacity(state.outbox.len()),
    };
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

    /// The journal's id and controller session generation.
    fn emit_identity(&mut self, state: &State) -> io::Result<()> {
        if let Some(id) = &state.journal_id {
            self.emit(&Rec::JournalId { id })?;
        }
        // Only once a fencing controller was seen: a journal that never met
        // one stays readable by an agent built before the record existed.
        if state.session_gen > 0 {
            self.emit(&Rec::SessionGen {
                generation: state.session_gen,
            })?;
        }
        Ok(())
    }

    /// Every stored pack, and its stop if it stopped for good.
    fn emit_packs(&mut self, state: &State) -> io::Result<()> {
        for p in state.packs.values() {
            let yaml = p.yaml();
            self.emit(&Rec::PutPack {
                tenant: &p.tenant,
                pack: &p.pack,
                version: p.version,
                accepted_ns: p.accepted_ns,
                yaml: &yaml,
            })?;
            if let Some(reason) = p.stopped {
                self.emit(&Rec::StopPack {
                    tenant: &p.tenant,
                    pack: &p.pack,
                    version: p.version,
                    reason,
                })?;
            }
        }
        Ok(())
    }

    /// Started-only ids kept by `keep`, in batches (ids with a result are
    /// written by [`Snapshot::emit_results`], which implies the start).
    fn emit_started(&mut self, state: &State, keep: impl Fn(i64) -> bool) -> io::Result<()> {
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
                self.emit(&Rec::Started(Ids::Borrowed(&chunk)))?;
                chunk.clear();
                chunk_bytes = 0;
            }
        }
        if !chunk.is_empty() {
            chunk.sort_unstable_by_key(|(_, ns)| *ns);
            self.emit(&Rec::Started(Ids::Borrowed(&chunk)))?;
        }
        Ok(())
    }

    /// Ids with a result kept by `keep`, as `Finished` records in batches.
    fn emit_results(&mut self, state: &State, keep: impl Fn(i64) -> bool) -> io::Result<()> {
        let mut results: Vec<record::Result1<'_>> = Vec::new();
        let mut results_bytes = 0;
        for (id, a) in state.attempts.iter().filter(|(_, a)| keep(a.ref_ns)) {
            if let Some(outcome) = a.outcome {
                results.push((std::borrow::Cow::Borrowed(&**id), a.ref_ns, outcome));
                results_bytes += id.len() + 13;
                if results_bytes >= SNAPSHOT_CHUNK_BYTES {
                    results.sort_unstable_by_key(|r| r.1);
                    self.emit(&Rec::Finished(std::mem::take(&mut results)))?;
                    results_bytes = 0;
                }
            }
        }
        if !results.is_empty() {
            results.sort_unstable_by_key(|r| r.1);
            self.emit(&Rec::Finished(results))?;
        }
        Ok(())
    }

    /// Once keys kept by `keep`.
    fn emit_once(&mut self, state: &State, keep: impl Fn(i64) -> bool) -> io::Result<()> {
        for (key, ns) in state.once.iter().filter(|(_, ns)| keep(**ns)) {
            self.emit(&Rec::Once { key, ref_ns: *ns })?;
        }
        Ok(())
    }

    /// The outbox's records, read back from `old` and copied byte for
    /// byte, in batches of consecutive entries (`PushMany`, as a pass
    /// writes them) of at most [`SNAPSHOT_CHUNK_BYTES`] before deflating.
    /// Returns their offsets in the new log.
    fn copy_outbox(
        &mut self,
        state: &State,
        old: &OldLog<'_>,
        tmp: &Path,
    ) -> Result<VecDeque<u64>, JournalError> {
        let mut offsets = VecDeque::with_capacity(state.outbox.len());
        let mut reader = OutboxReader::default();
        let mut batch = PushBatch::default();
        let mut in_batch = 0;
        let write_err = |e| JournalError::io("write", tmp, e);
        for (seq, offset) in state.outbox.page(0, usize::MAX) {
            let record = reader.read(old, offset, seq)?;
            if record.len() >= SNAPSHOT_CHUNK_BYTES {
                // Alone, as it was pushed: a batch stays far below the
                // frame limit.
                self.emit_pushes(&mut batch, &mut offsets, in_batch)
                    .map_err(write_err)?;
                in_batch = 0;
                offsets.push_back(self.len);
                self.emit(&Rec::Push {
                    seq,
                    dropped_through: 0,
                    record,
                })
                .map_err(write_err)?;
                continue;
            }
            batch.push(seq, 0, record);
            in_batch += 1;
            if batch.raw_len() >= SNAPSHOT_CHUNK_BYTES || batch.is_full() {
                self.emit_pushes(&mut batch, &mut offsets, in_batch)
                    .map_err(write_err)?;
                in_batch = 0;
            }
        }
        self.emit_pushes(&mut batch, &mut offsets, in_batch)
            .map_err(write_err)?;
        Ok(offsets)
    }

    /// Writes `batch` (its `n` entries) as one record, their offset noted.
    fn emit_pushes(
        &mut self,
        batch: &mut PushBatch,
        offsets: &mut VecDeque<u64>,
        n: usize,
    ) -> io::Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        self.buf.clear();
        batch.seal(&mut self.buf, self.salt).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("snapshot record of {} bytes over the limit", e.len),
            )
        })?;
        offsets.extend(std::iter::repeat_n(self.len, n));
        self.out.write_all(&self.buf)?;
        self.len += self.buf.len() as u64;
        Ok(())
    }
}
