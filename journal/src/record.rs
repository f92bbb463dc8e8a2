//! The on-disk format: a header, then framed records.
//!
//! ```text
//! header  = magic "BATONJNL" | version u32 | salt u32 | crc32(magic..salt) u32   (20 bytes)
//! record  = len u32 | crc u32 | payload[len]
//!           crc = CRC-32 (IEEE), started from `salt`, over the len bytes then the payload
//! payload = kind u8 | fields
//! ```
//!
//! Fields: little-endian fixed integers and `u32`-length strings in
//! version 2; version 3 (this one) keeps those for the rare records (packs,
//! stops, once keys) and writes the per-firing ones compactly:
//!
//! | record | version 3 fields |
//! |---|---|
//! | `Started` | id table, then per id: [`put_id`] + scheduled (delta from the occurrence) |
//! | `Finished` | id table, then per id: [`put_id`] + dating ns (delta) + outcome u8; one record per loop pass (a batch) |
//! | `Push` | seq, dropped-through (varints), then the feedback bytes to the end |
//! | `Ack` | seq (varint) |
//! | `Meta` | next seq, dropped (varints), alive flag u8 + i64, acked-through (varint) |
//! | `SessionGen` | the generation (varint) |
//!
//! An execution id `tenant/pack/vV/instruction/occ_ns/aA` is stored as an
//! index into the record's table of prefixes (`tenant/pack/vV/instruction`,
//! each once per record), the occurrence as a zigzag varint delta from the
//! previous id's in the record (firings of one pass are close together:
//! ~3 bytes), and the attempt; any other id (a once key's shape, anything
//! not in that form) is stored as text. A started firing went from ~60
//! bytes to ~6, a result from ~70 (with its frame) to ~7 in a pass's batch.
//!
//! Version 2 made outcomes typed: a result is ONE `Finished` record
//! carrying its [`Outcome`], a stop carries a [`StopReason`], and `Once`
//! records exist; later additions within version 2 (each a new tag an older
//! agent refuses by name): the `JournalId` record (kind 13) and the
//! `lease_lost` stop reason (3). Within version 3 likewise: the
//! `SessionGen` record (kind 15; a log without one reads as generation 0,
//! and a snapshot writes it only once a fencing controller was seen, so a
//! journal that never met one stays readable by an agent built before it).
//! A version-2 log is read here and rewritten
//! as version 3 at open (a compaction; its outbox records are copied byte
//! for byte, whatever their format); a version-3 log is not readable by an
//! agent built before it (no downgrade). A snapshot (a compacted log) ends with its `Meta`
//! record, so the offset just past the last `Meta` is the live size at the
//! last compaction (the compaction trigger is recomputed from it at open).
//!
//! The checksum covers the length, so a torn or flipped length never sends
//! the reader to a wrong place unnoticed. Seeding it with a per-file random
//! `salt` means a record can only validate in the file that wrote it: stale
//! bytes of an older, compacted-away log that a file system might expose
//! after a crash are rejected like any other garbage.

use std::borrow::Cow;
use std::collections::HashMap;

use crc32fast::Hasher;

use super::{Outcome, StopReason};

/// First bytes of every journal file.
pub(crate) const MAGIC: &[u8; 8] = b"BATONJNL";
/// The format this code writes.
pub(crate) const FORMAT_VERSION: u32 = 3;
/// The oldest format this code reads (and rewrites at open).
pub(crate) const OLDEST_READABLE: u32 = 2;
/// Bytes in the file header.
pub(crate) const HEADER_LEN: usize = 20;
/// Bytes in front of each record's payload (length and checksum).
pub(crate) const FRAME_LEN: usize = 8;
/// Largest payload of one record. Bounds what a corrupt length can make the
/// reader consider, and what one pack YAML or feedback record may weigh.
pub(crate) const MAX_PAYLOAD: usize = 16 << 20;

const K_PUT_PACK: u8 = 1;
const K_REMOVE_PACK: u8 = 2;
const K_STARTED: u8 = 3;
const K_FINISHED: u8 = 4;
const K_PUSH: u8 = 5;
const K_ACK: u8 = 6;
const K_ALIVE: u8 = 7;
const K_DROPPED_REPORTED: u8 = 8;
const K_META: u8 = 9;
const K_DROP_OLDEST: u8 = 10;
const K_STOP_PACK: u8 = 11;
const K_ONCE: u8 = 12;
const K_JOURNAL_ID: u8 = 13;
const K_DROPS_SENT: u8 = 14;
const K_SESSION_GEN: u8 = 15;

const OUTCOME_SUCCEEDED: u8 = 1;
const OUTCOME_FAILED: u8 = 2;
const OUTCOME_NOT_RUN: u8 = 3;
const STOP_GIVE_UP: u8 = 1;
const STOP_CANCEL: u8 = 2;
const STOP_LEASE_LOST: u8 = 3;
const STOP_CLOCK_LOST: u8 = 4;

fn outcome_tag(o: Outcome) -> u8 {
    match o {
        Outcome::Succeeded => OUTCOME_SUCCEEDED,
        Outcome::Failed => OUTCOME_FAILED,
        Outcome::NotRun => OUTCOME_NOT_RUN,
    }
}

fn stop_tag(r: StopReason) -> u8 {
    match r {
        StopReason::GiveUp => STOP_GIVE_UP,
        StopReason::Cancel => STOP_CANCEL,
        StopReason::LeaseLost => STOP_LEASE_LOST,
        StopReason::ClockLost => STOP_CLOCK_LOST,
    }
}

/// Execution ids with their scheduled reference time, either handed in by
/// the caller (encoding) or read back from a log buffer (decoding: rebuilt
/// from their compact form in version 3).
#[derive(Debug)]
pub(crate) enum Ids<'a> {
    Borrowed(&'a [(&'a str, i64)]),
    Decoded(Vec<(Cow<'a, str>, i64)>),
}

impl Ids<'_> {
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, i64)> {
        let (b, d) = match self {
            Ids::Borrowed(s) => (Some(s.iter().map(|(id, ns)| (*id, *ns))), None),
            Ids::Decoded(v) => (None, Some(v.iter().map(|(id, ns)| (&**id, *ns)))),
        };
        b.into_iter().flatten().chain(d.into_iter().flatten())
    }
}

/// One execution's result as a `Finished` record holds it: its id, the
/// reference time that dates it, and its outcome.
pub(crate) type Result1<'a> = (Cow<'a, str>, i64, Outcome);

/// One change to the journal's state. Borrowed, so that encoding on the
/// hot path (`record_started`) and decoding at recovery copy nothing.
#[derive(Debug)]
pub(crate) enum Rec<'a> {
    /// A pack was accepted; replaces any stored version.
    PutPack {
        tenant: &'a str,
        pack: &'a str,
        version: u64,
        accepted_ns: i64,
        yaml: &'a str,
    },
    /// A pack was removed (cancelled).
    RemovePack { tenant: &'a str, pack: &'a str },
    /// A pack version entered its safe state for good (give-up, cancel):
    /// it stays stopped across restarts until a higher version replaces it.
    StopPack {
        tenant: &'a str,
        pack: &'a str,
        version: u64,
        reason: StopReason,
    },
    /// Executions are about to touch the device.
    Started(Ids<'a>),
    /// Executions have results: each one entry (never two records or a
    /// suffix: an outcome is atomic); `ref_ns` dates it for the retention
    /// horizon. Version 2 wrote one per record, version 3 a pass's worth.
    Finished(Vec<Result1<'a>>),
    /// An at-most-once action (keyed by the agent) is about to be taken;
    /// `ref_ns` dates it for the retention horizon.
    Once { key: &'a str, ref_ns: i64 },
    /// A feedback record joined the outbox; entries with a seq up to
    /// `dropped_through` were dropped to make room (0: none).
    Push {
        seq: u64,
        dropped_through: u64,
        record: &'a [u8],
    },
    /// The controller acknowledged feedback up to this seq.
    Ack { up_to_seq: u64 },
    /// The agent was up at this reference time.
    Alive { ns: i64 },
    /// This many drops were reported upstream; subtract them.
    DroppedReported { count: u64 },
    /// Counters a snapshot must carry even when nothing else refers to them.
    /// Written last in a snapshot: the offset past it is the live size.
    /// `carrier`: the entry carrying the unreported drop count, and the
    /// count (version 3; none in version 2).
    Meta {
        next_seq: u64,
        dropped: u64,
        last_alive_ns: Option<i64>,
        carrier: Option<(u64, u64)>,
    },
    /// The unreported drop count (`count`, at most `dropped`) went to the
    /// controller on feedback `seq` (its `dropped_before`); once the
    /// controller acknowledges `seq` the count is reported. Version 3.
    DropsSent { seq: u64, count: u64 },
    /// Outbox entries up to this seq were dropped (cap lowered at open).
    DropOldest { through_seq: u64 },
    /// The journal's identity (see `Journal::id`): written once, first in
    /// every snapshot, and appended at open to a log that has none.
    JournalId { id: &'a str },
    /// The highest controller session generation seen (see
    /// `Journal::record_session_gen`): the replay keeps the maximum, so a
    /// lower one can never lower the fence. Version 3, kind 15.
    SessionGen { generation: u64 },
}

/// The record would not fit in one frame.
#[derive(Debug)]
pub(crate) struct TooLarge {
    pub(crate) len: usize,
}

/// Encodes the file header for a log whose records are checksummed with `salt`.
pub(crate) fn encode_header(salt: u32) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&salt.to_le_bytes());
    let crc = crc32fast::hash(&h[..16]);
    h[16..20].copy_from_slice(&crc.to_le_bytes());
    h
}

/// What is wrong with a header.
#[derive(Debug)]
pub(crate) enum HeaderError {
    Short,
    Magic,
    Checksum,
    Version(u32),
}

/// Reads the header, returning the salt and the format version (one this
/// code reads).
pub(crate) fn decode_header(buf: &[u8]) -> Result<(u32, u32), HeaderError> {
    let h = buf.get(..HEADER_LEN).ok_or(HeaderError::Short)?;
    if &h[..8] != MAGIC {
        return Err(HeaderError::Magic);
    }
    if crc32fast::hash(&h[..16]) != le_u32(&h[16..20]) {
        return Err(HeaderError::Checksum);
    }
    let version = le_u32(&h[8..12]);
    if !(OLDEST_READABLE..=FORMAT_VERSION).contains(&version) {
        return Err(HeaderError::Version(version));
    }
    Ok((le_u32(&h[12..16]), version))
}

fn le_u32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_le_bytes(a)
}

fn checksum(salt: u32, len_bytes: &[u8], payload: &[u8]) -> u32 {
    let mut h = Hasher::new_with_initial(salt);
    h.update(len_bytes);
    h.update(payload);
    h.finalize()
}

/// Appends `rec`, framed, to `out`. On error `out` is left as it was.
pub(crate) fn frame(out: &mut Vec<u8>, salt: u32, rec: &Rec<'_>) -> Result<(), TooLarge> {
    let start = out.len();
    out.extend_from_slice(&[0u8; FRAME_LEN]);
    rec.encode(out);
    finish_frame(out, start, salt)
}

/// Fills in the frame header of the payload written after `start +
/// FRAME_LEN`. On error `out` is cut back to `start`.
fn finish_frame(out: &mut Vec<u8>, start: usize, salt: u32) -> Result<(), TooLarge> {
    let len = out.len() - start - FRAME_LEN;
    if len > MAX_PAYLOAD {
        out.truncate(start);
        return Err(TooLarge { len });
    }
    // `len <= MAX_PAYLOAD` fits in a u32.
    let len_bytes = (len as u32).to_le_bytes();
    let crc = checksum(salt, &len_bytes, &out[start + FRAME_LEN..]);
    out[start..start + 4].copy_from_slice(&len_bytes);
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// The payload of the record at `pos` and where the next one starts, or
/// `None` if no intact record starts there (short, implausible length, or
/// checksum mismatch).
pub(crate) fn read_frame(buf: &[u8], pos: usize, salt: u32) -> Option<(&[u8], usize)> {
    let head = buf.get(pos..pos.checked_add(FRAME_LEN)?)?;
    let len = le_u32(&head[..4]) as usize;
    if len == 0 || len > MAX_PAYLOAD {
        return None;
    }
    let end = pos + FRAME_LEN + len;
    let payload = buf.get(pos + FRAME_LEN..end)?;
    (checksum(salt, &head[..4], payload) == le_u32(&head[4..8])).then_some((payload, end))
}

/// Whether any intact record starts at or after `from`. Used to tell a torn
/// tail (nothing valid follows the bad bytes) from damage in the middle.
pub(crate) fn any_frame_from(buf: &[u8], from: usize, salt: u32) -> Option<usize> {
    (from..buf.len().saturating_sub(FRAME_LEN)).find(|&p| read_frame(buf, p, salt).is_some())
}

impl Rec<'_> {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Rec::PutPack {
                tenant,
                pack,
                version,
                accepted_ns,
                yaml,
            } => {
                out.push(K_PUT_PACK);
                put_str(out, tenant);
                put_str(out, pack);
                out.extend_from_slice(&version.to_le_bytes());
                out.extend_from_slice(&accepted_ns.to_le_bytes());
                put_str(out, yaml);
            }
            Rec::RemovePack { tenant, pack } => {
                out.push(K_REMOVE_PACK);
                put_str(out, tenant);
                put_str(out, pack);
            }
            Rec::StopPack {
                tenant,
                pack,
                version,
                reason,
            } => {
                out.push(K_STOP_PACK);
                put_str(out, tenant);
                put_str(out, pack);
                out.extend_from_slice(&version.to_le_bytes());
                out.push(stop_tag(*reason));
            }
            Rec::Started(ids) => {
                out.push(K_STARTED);
                let mut table = IdTable::default();
                let mut entries = Vec::new();
                let mut prev = 0;
                let mut n = 0u64;
                for (id, ns) in ids.iter() {
                    table.put(&mut entries, id, ns, &mut prev);
                    n += 1;
                }
                table.write(out);
                put_varint(out, n);
                out.extend_from_slice(&entries);
            }
            Rec::Finished(results) => {
                let mut b = FinishedBatch::default();
                for (id, ns, outcome) in results {
                    b.push(id, *ns, *outcome);
                }
                b.payload(out);
            }
            Rec::Once { key, ref_ns } => {
                out.push(K_ONCE);
                put_str(out, key);
                out.extend_from_slice(&ref_ns.to_le_bytes());
            }
            Rec::Push {
                seq,
                dropped_through,
                record,
            } => {
                out.push(K_PUSH);
                put_varint(out, *seq);
                put_varint(out, *dropped_through);
                out.extend_from_slice(record);
            }
            Rec::Ack { up_to_seq } => {
                out.push(K_ACK);
                put_varint(out, *up_to_seq);
            }
            Rec::Alive { ns } => {
                out.push(K_ALIVE);
                out.extend_from_slice(&ns.to_le_bytes());
            }
            Rec::DroppedReported { count } => {
                out.push(K_DROPPED_REPORTED);
                out.extend_from_slice(&count.to_le_bytes());
            }
            Rec::Meta {
                next_seq,
                dropped,
                last_alive_ns,
                carrier,
            } => {
                out.push(K_META);
                put_varint(out, *next_seq);
                put_varint(out, *dropped);
                out.push(u8::from(last_alive_ns.is_some()));
                out.extend_from_slice(&last_alive_ns.unwrap_or(0).to_le_bytes());
                // Seqs start at 1: 0 is "no carrier".
                let (seq, count) = carrier.unwrap_or((0, 0));
                put_varint(out, seq);
                put_varint(out, count);
            }
            Rec::DropsSent { seq, count } => {
                out.push(K_DROPS_SENT);
                put_varint(out, *seq);
                put_varint(out, *count);
            }
            Rec::DropOldest { through_seq } => {
                out.push(K_DROP_OLDEST);
                out.extend_from_slice(&through_seq.to_le_bytes());
            }
            Rec::JournalId { id } => {
                out.push(K_JOURNAL_ID);
                put_str(out, id);
            }
            Rec::SessionGen { generation } => {
                out.push(K_SESSION_GEN);
                put_varint(out, *generation);
            }
        }
    }
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    // Lengths above u32::MAX exceed MAX_PAYLOAD; `frame` refuses the record.
    out.extend_from_slice(&u32::try_from(b.len()).unwrap_or(u32::MAX).to_le_bytes());
    out.extend_from_slice(b);
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_bytes(out, s.as_bytes());
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Bytes `put_varint` takes for `v`.
fn varint_len(v: u64) -> usize {
    (64 - v.max(1).leading_zeros() as usize).div_ceil(7)
}

fn put_zigzag(out: &mut Vec<u8>, v: i64) {
    put_varint(out, ((v << 1) ^ (v >> 63)) as u64);
}

/// An execution id's compact parts: `prefix/occ/aATTEMPT` where the text
/// is exactly what formatting them back gives (so the id is rebuilt byte
/// for byte); `None` for anything else (stored as text).
fn split_id(id: &str) -> Option<(&str, i64, u32)> {
    let (rest, attempt) = id.rsplit_once('/')?;
    let attempt = attempt.strip_prefix('a')?;
    let (prefix, occ) = rest.rsplit_once('/')?;
    let canonical = |t: &str| {
        let digits = t.strip_prefix('-').unwrap_or(t);
        !digits.is_empty()
            && digits.bytes().all(|b| b.is_ascii_digit())
            && (digits == "0" || !digits.starts_with('0'))
            && t != "-0"
    };
    if prefix.is_empty() || !canonical(occ) || !canonical(attempt) || attempt.starts_with('-') {
        return None;
    }
    Some((prefix, occ.parse().ok()?, attempt.parse().ok()?))
}

/// The prefixes of one record's ids, each written once (see the module
/// docs), and the entries that refer to them.
#[derive(Debug, Default)]
pub(crate) struct IdTable {
    prefixes: Vec<String>,
    index: HashMap<String, u64>,
    /// Bytes of the prefixes as written (lengths included).
    bytes: usize,
}

impl IdTable {
    /// Appends one id (and its ns, as a delta) to `entries`; `prev`: the
    /// previous entry's occurrence, updated.
    fn put(&mut self, entries: &mut Vec<u8>, id: &str, ns: i64, prev: &mut i64) {
        match split_id(id) {
            Some((prefix, occ, attempt)) => {
                let i = match self.index.get(prefix) {
                    Some(i) => *i,
                    None => {
                        let i = self.prefixes.len() as u64;
                        self.prefixes.push(prefix.to_string());
                        self.index.insert(prefix.to_string(), i);
                        self.bytes += varint_len(prefix.len() as u64) + prefix.len();
                        i
                    }
                };
                put_varint(entries, i + 1);
                put_zigzag(entries, occ.wrapping_sub(*prev));
                put_varint(entries, u64::from(attempt));
                put_zigzag(entries, ns.wrapping_sub(occ));
                *prev = occ;
            }
            None => {
                put_varint(entries, 0);
                put_varint(entries, id.len() as u64);
                entries.extend_from_slice(id.as_bytes());
                put_zigzag(entries, ns.wrapping_sub(*prev));
                *prev = ns;
            }
        }
    }

    fn write(&self, out: &mut Vec<u8>) {
        put_varint(out, self.prefixes.len() as u64);
        for p in &self.prefixes {
            put_varint(out, p.len() as u64);
            out.extend_from_slice(p.as_bytes());
        }
    }

    fn clear(&mut self) {
        self.prefixes.clear();
        self.index.clear();
        self.bytes = 0;
    }
}

/// Results gathered for one `Finished` record (the journal keeps one per
/// loop pass): encoded as they come, so a result costs no allocation of
/// its own (a prefix is copied once per pass).
#[derive(Debug, Default)]
pub(crate) struct FinishedBatch {
    table: IdTable,
    entries: Vec<u8>,
    n: u64,
    prev: i64,
}

impl FinishedBatch {
    pub(crate) fn push(&mut self, id: &str, ref_ns: i64, outcome: Outcome) {
        self.table
            .put(&mut self.entries, id, ref_ns, &mut self.prev);
        self.entries.push(outcome_tag(outcome));
        self.n += 1;
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Bytes the sealed record will take in the log, frame included.
    pub(crate) fn frame_len(&self) -> usize {
        FRAME_LEN
            + 1
            + varint_len(self.table.prefixes.len() as u64)
            + self.table.bytes
            + varint_len(self.n)
            + self.entries.len()
    }

    /// The record's payload, appended to `out`.
    fn payload(&self, out: &mut Vec<u8>) {
        out.push(K_FINISHED);
        self.table.write(out);
        put_varint(out, self.n);
        out.extend_from_slice(&self.entries);
    }

    /// Frames the batch into `out` and empties it.
    pub(crate) fn seal(&mut self, out: &mut Vec<u8>, salt: u32) -> Result<(), TooLarge> {
        let start = out.len();
        out.extend_from_slice(&[0u8; FRAME_LEN]);
        self.payload(out);
        let r = finish_frame(out, start, salt);
        self.table.clear();
        self.n = 0;
        self.prev = 0;
        if self.entries.capacity() > 64 << 10 {
            self.entries = Vec::new();
        } else {
            self.entries.clear();
        }
        r
    }
}

/// Decodes a payload whose checksum matched, in a log of format
/// `version` ([`decode_header`]). An error here is not a torn write but a
/// record this code cannot understand.
pub(crate) fn decode(payload: &[u8], version: u32) -> Result<Rec<'_>, String> {
    let mut r = Reader { buf: payload };
    let kind = r.u8()?;
    let v3 = version >= 3;
    let rec = match kind {
        K_PUT_PACK => Rec::PutPack {
            tenant: r.str()?,
            pack: r.str()?,
            version: r.u64()?,
            accepted_ns: r.i64()?,
            yaml: r.str()?,
        },
        K_REMOVE_PACK => Rec::RemovePack {
            tenant: r.str()?,
            pack: r.str()?,
        },
        K_STOP_PACK => Rec::StopPack {
            tenant: r.str()?,
            pack: r.str()?,
            version: r.u64()?,
            reason: match r.u8()? {
                STOP_GIVE_UP => StopReason::GiveUp,
                STOP_CANCEL => StopReason::Cancel,
                STOP_LEASE_LOST => StopReason::LeaseLost,
                STOP_CLOCK_LOST => StopReason::ClockLost,
                t => return Err(format!("unknown stop reason {t}")),
            },
        },
        K_STARTED if v3 => {
            let table = r.table()?;
            let n = r.varint()?;
            // Each entry takes at least 4 bytes: never trust `n` for capacity.
            let mut ids = Vec::with_capacity((n as usize).min(r.buf.len() / 4));
            let mut prev = 0;
            for _ in 0..n {
                ids.push(r.id(&table, &mut prev)?);
            }
            Rec::Started(Ids::Decoded(ids))
        }
        K_STARTED => {
            let n = r.u32()? as usize;
            // Each entry takes at least 12 bytes: never trust `n` for capacity.
            let mut ids = Vec::with_capacity(n.min(r.buf.len() / 12));
            for _ in 0..n {
                ids.push((Cow::Borrowed(r.str()?), r.i64()?));
            }
            Rec::Started(Ids::Decoded(ids))
        }
        K_FINISHED if v3 => {
            let table = r.table()?;
            let n = r.varint()?;
            let mut results = Vec::with_capacity((n as usize).min(r.buf.len() / 5));
            let mut prev = 0;
            for _ in 0..n {
                let (id, ns) = r.id(&table, &mut prev)?;
                results.push((id, ns, r.outcome()?));
            }
            Rec::Finished(results)
        }
        K_FINISHED => Rec::Finished(vec![(Cow::Borrowed(r.str()?), r.i64()?, r.outcome()?)]),
        K_ONCE => Rec::Once {
            key: r.str()?,
            ref_ns: r.i64()?,
        },
        K_PUSH if v3 => Rec::Push {
            seq: r.varint()?,
            dropped_through: r.varint()?,
            record: std::mem::take(&mut r.buf),
        },
        K_PUSH => Rec::Push {
            seq: r.u64()?,
            dropped_through: r.u64()?,
            record: r.bytes()?,
        },
        K_ACK => Rec::Ack {
            up_to_seq: if v3 { r.varint()? } else { r.u64()? },
        },
        K_ALIVE => Rec::Alive { ns: r.i64()? },
        K_DROPPED_REPORTED => Rec::DroppedReported { count: r.u64()? },
        K_META if v3 => {
            let next_seq = r.varint()?;
            let dropped = r.varint()?;
            let has_alive = r.u8()?;
            let alive = r.i64()?;
            let (seq, count) = (r.varint()?, r.varint()?);
            Rec::Meta {
                next_seq,
                dropped,
                last_alive_ns: (has_alive != 0).then_some(alive),
                carrier: (seq != 0).then_some((seq, count)),
            }
        }
        K_META => {
            let next_seq = r.u64()?;
            let dropped = r.u64()?;
            let has_alive = r.u8()?;
            let alive = r.i64()?;
            Rec::Meta {
                next_seq,
                dropped,
                last_alive_ns: (has_alive != 0).then_some(alive),
                carrier: None,
            }
        }
        K_DROP_OLDEST => Rec::DropOldest {
            through_seq: r.u64()?,
        },
        K_JOURNAL_ID => Rec::JournalId { id: r.str()? },
        K_DROPS_SENT if v3 => Rec::DropsSent {
            seq: r.varint()?,
            count: r.varint()?,
        },
        K_SESSION_GEN if v3 => Rec::SessionGen {
            generation: r.varint()?,
        },
        k => {
            return Err(format!(
                "unknown record kind {k} (written by a newer agent?)"
            ));
        }
    };
    if !r.buf.is_empty() {
        return Err(format!(
            "{} unexpected bytes after a record of kind {kind}",
            r.buf.len()
        ));
    }
    Ok(rec)
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.buf.len() < n {
            return Err(format!(
                "record ends early: needs {n} more bytes, has {}",
                self.buf.len()
            ));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.array::<1>()?[0])
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    fn i64(&mut self) -> Result<i64, String> {
        Ok(i64::from_le_bytes(self.array()?))
    }
    fn bytes(&mut self) -> Result<&'a [u8], String> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    fn str(&mut self) -> Result<&'a str, String> {
        utf8(self.bytes()?)
    }
    fn varint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                if shift == 63 && b > 1 {
                    break;
                }
                return Ok(v);
            }
        }
        Err("varint longer than 64 bits".into())
    }
    fn zigzag(&mut self) -> Result<i64, String> {
        let v = self.varint()?;
        Ok(((v >> 1) as i64) ^ -((v & 1) as i64))
    }
    fn outcome(&mut self) -> Result<Outcome, String> {
        match self.u8()? {
            OUTCOME_SUCCEEDED => Ok(Outcome::Succeeded),
            OUTCOME_FAILED => Ok(Outcome::Failed),
            OUTCOME_NOT_RUN => Ok(Outcome::NotRun),
            t => Err(format!("unknown outcome {t}")),
        }
    }
    /// A version-3 id table.
    fn table(&mut self) -> Result<Vec<&'a str>, String> {
        let n = self.varint()?;
        let mut t = Vec::with_capacity((n as usize).min(self.buf.len()));
        for _ in 0..n {
            let len = usize::try_from(self.varint()?).map_err(|_| "length over usize")?;
            t.push(utf8(self.take(len)?)?);
        }
        Ok(t)
    }
    /// A version-3 id and its ns (see `IdTable::put`).
    fn id(&mut self, table: &[&str], prev: &mut i64) -> Result<(Cow<'a, str>, i64), String> {
        match self.varint()? {
            0 => {
                let len = usize::try_from(self.varint()?).map_err(|_| "length over usize")?;
                let id = utf8(self.take(len)?)?;
                let ns = prev.wrapping_add(self.zigzag()?);
                *prev = ns;
                Ok((Cow::Borrowed(id), ns))
            }
            i => {
                let prefix = usize::try_from(i - 1)
                    .ok()
                    .and_then(|i| table.get(i))
                    .ok_or_else(|| format!("id prefix {i} beyond the table of {}", table.len()))?;
                let occ = prev.wrapping_add(self.zigzag()?);
                let attempt =
                    u32::try_from(self.varint()?).map_err(|_| "attempt over u32".to_string())?;
                let ns = occ.wrapping_add(self.zigzag()?);
                *prev = occ;
                Ok((Cow::Owned(format!("{prefix}/{occ}/a{attempt}")), ns))
            }
        }
    }
}

fn utf8(b: &[u8]) -> Result<&str, String> {
    std::str::from_utf8(b).map_err(|e| format!("string is not UTF-8: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(buf: &[u8], salt: u32) -> Rec<'_> {
        let (payload, _) = read_frame(buf, 0, salt).expect("intact");
        decode(payload, FORMAT_VERSION).expect("decodes")
    }

    #[test]
    fn frame_round_trip_and_salt_binds_records_to_their_file() {
        let mut buf = Vec::new();
        let ids = [("a", 1i64), ("bb", -2)];
        frame(&mut buf, 7, &Rec::Started(Ids::Borrowed(&ids))).expect("small record");
        let (payload, next) = read_frame(&buf, 0, 7).expect("intact");
        assert_eq!(next, buf.len());
        match decode(payload, FORMAT_VERSION).expect("decodes") {
            Rec::Started(got) => assert_eq!(got.iter().collect::<Vec<_>>(), ids),
            other => panic!("wrong record {other:?}"),
        }
        assert!(read_frame(&buf, 0, 8).is_none(), "another file's salt");
    }

    /// Ids in the execution-id form are stored by their parts and come back
    /// byte for byte; any other text comes back as it was.
    #[test]
    fn ids_round_trip_compact_or_as_text() {
        let ids = [
            (
                "plant-a/press/v7/stamp/1796000000000000000/a1",
                1_796_000_000_000_000_000i64,
            ),
            (
                "plant-a/press/v7/stamp/1796000000001000000/a1",
                1_796_000_000_001_000_000,
            ),
            (
                "plant-a/press/v7/stamp/1796000000000000000/a2",
                1_796_000_000_300_000_000,
            ),
            ("plant-a/press/v7/other/-5/a3", -5),
            ("t/p/v1/i/0/a1", 0),
            // Not canonical: kept as text.
            ("t/p/v1/i/007/a1", 7),
            ("t/p/v1/i/7/a01", 7),
            ("t/p/v1/i/-0/a1", 0),
            ("t/p/v1/i/7/b1", 7),
            ("on_failure/t/p/i/5", 5),
            ("/5/a1", 5),
            ("", i64::MIN),
            ("t/p/v1/i/9223372036854775807/a4294967295", i64::MAX),
        ];
        let mut buf = Vec::new();
        frame(&mut buf, 1, &Rec::Started(Ids::Borrowed(&ids))).expect("small record");
        match one(&buf, 1) {
            Rec::Started(got) => assert_eq!(got.iter().collect::<Vec<_>>(), ids),
            other => panic!("wrong record {other:?}"),
        }
        let results: Vec<Result1<'_>> = ids
            .iter()
            .zip(
                [Outcome::Succeeded, Outcome::Failed, Outcome::NotRun]
                    .iter()
                    .cycle(),
            )
            .map(|((id, ns), o)| (Cow::Borrowed(*id), *ns, *o))
            .collect();
        let mut buf = Vec::new();
        frame(&mut buf, 1, &Rec::Finished(results.clone())).expect("small record");
        match one(&buf, 1) {
            Rec::Finished(got) => assert_eq!(got, results),
            other => panic!("wrong record {other:?}"),
        }
    }

    /// What a firing costs in the log: its start among a pass's batch,
    /// its result in the pass's `Finished` batch.
    #[test]
    fn a_pass_of_firings_is_a_few_bytes_each() {
        let ids: Vec<String> = (0..50)
            .map(|k| {
                format!(
                    "default/k1/v1/i{}/{}/a1",
                    k % 10,
                    1_796_000_000_000_000_000i64 + k * 1_000_000
                )
            })
            .collect();
        let started: Vec<(&str, i64)> = ids
            .iter()
            .enumerate()
            .map(|(k, id)| {
                (
                    id.as_str(),
                    1_796_000_000_000_000_000i64 + k as i64 * 1_000_000,
                )
            })
            .collect();
        let mut buf = Vec::new();
        frame(&mut buf, 1, &Rec::Started(Ids::Borrowed(&started))).expect("small record");
        assert!(buf.len() / 50 <= 10, "{} bytes per start", buf.len() / 50);
        let mut b = FinishedBatch::default();
        for (id, ns) in &started {
            b.push(id, *ns, Outcome::Succeeded);
        }
        let expect = b.frame_len();
        let mut buf = Vec::new();
        b.seal(&mut buf, 1).expect("small");
        assert_eq!(buf.len(), expect, "frame_len is exact");
        assert!(b.is_empty(), "sealed");
        assert!(buf.len() / 50 <= 10, "{} bytes per result", buf.len() / 50);
        match one(&buf, 1) {
            Rec::Finished(got) => assert_eq!(got.len(), 50),
            other => panic!("wrong record {other:?}"),
        }
    }

    /// Version-2 records (fixed-width fields, one result per record) still
    /// decode: an old log is read, then rewritten.
    #[test]
    fn version_2_records_decode() {
        let mut started = vec![K_STARTED];
        started.extend_from_slice(&1u32.to_le_bytes());
        started.extend_from_slice(&3u32.to_le_bytes());
        started.extend_from_slice(b"a/b");
        started.extend_from_slice(&(-2i64).to_le_bytes());
        assert!(matches!(
            decode(&started, 2),
            Ok(Rec::Started(ids)) if ids.iter().collect::<Vec<_>>() == [("a/b", -2)]
        ));
        let mut fin = vec![K_FINISHED];
        fin.extend_from_slice(&3u32.to_le_bytes());
        fin.extend_from_slice(b"a/b");
        fin.extend_from_slice(&9i64.to_le_bytes());
        fin.push(OUTCOME_NOT_RUN);
        assert!(matches!(
            decode(&fin, 2),
            Ok(Rec::Finished(r)) if r == [(Cow::Borrowed("a/b"), 9, Outcome::NotRun)]
        ));
        let mut push = vec![K_PUSH];
        push.extend_from_slice(&4u64.to_le_bytes());
        push.extend_from_slice(&2u64.to_le_bytes());
        push.extend_from_slice(&2u32.to_le_bytes());
        push.extend_from_slice(b"{}");
        assert!(matches!(
            decode(&push, 2),
            Ok(Rec::Push {
                seq: 4,
                dropped_through: 2,
                record: b"{}"
            })
        ));
        let mut meta = vec![K_META];
        meta.extend_from_slice(&7u64.to_le_bytes());
        meta.extend_from_slice(&1u64.to_le_bytes());
        meta.push(1);
        meta.extend_from_slice(&5i64.to_le_bytes());
        assert!(matches!(
            decode(&meta, 2),
            Ok(Rec::Meta {
                next_seq: 7,
                dropped: 1,
                last_alive_ns: Some(5),
                carrier: None
            })
        ));
    }

    #[test]
    fn typed_records_round_trip_and_unknown_tags_are_refused() {
        for outcome in [Outcome::Succeeded, Outcome::Failed, Outcome::NotRun] {
            let mut buf = Vec::new();
            let rec = Rec::Finished(vec![(Cow::Borrowed("p/1/i/0/0/1"), -5, outcome)]);
            frame(&mut buf, 3, &rec).expect("small record");
            let (payload, _) = read_frame(&buf, 0, 3).expect("intact");
            match decode(payload, FORMAT_VERSION).expect("decodes") {
                Rec::Finished(got) => {
                    assert_eq!(got, [(Cow::Borrowed("p/1/i/0/0/1"), -5, outcome)])
                }
                other => panic!("wrong record {other:?}"),
            }
            // The outcome is the last byte: an unknown tag is an error.
            let mut bad = payload.to_vec();
            *bad.last_mut().expect("non-empty") = 9;
            assert!(decode(&bad, FORMAT_VERSION).is_err());
        }
        for reason in [
            StopReason::GiveUp,
            StopReason::Cancel,
            StopReason::LeaseLost,
            StopReason::ClockLost,
        ] {
            let mut buf = Vec::new();
            let rec = Rec::StopPack {
                tenant: "t",
                pack: "p",
                version: 4,
                reason,
            };
            frame(&mut buf, 0, &rec).expect("small record");
            assert!(matches!(
                one(&buf, 0),
                Rec::StopPack { reason: r, version: 4, .. } if r == reason
            ));
        }
        let mut buf = Vec::new();
        frame(
            &mut buf,
            0,
            &Rec::Once {
                key: "k",
                ref_ns: 7,
            },
        )
        .expect("small record");
        assert!(matches!(
            one(&buf, 0),
            Rec::Once {
                key: "k",
                ref_ns: 7
            }
        ));
        for rec in [
            Rec::Push {
                seq: 300,
                dropped_through: 2,
                record: b"\xb1xyz",
            },
            Rec::Ack { up_to_seq: 1 << 40 },
            Rec::Meta {
                next_seq: 9,
                dropped: 3,
                last_alive_ns: Some(-1),
                carrier: Some((5, 2)),
            },
            Rec::DropsSent { seq: 5, count: 2 },
        ] {
            let mut buf = Vec::new();
            frame(&mut buf, 0, &rec).expect("small record");
            assert_eq!(format!("{:?}", one(&buf, 0)), format!("{rec:?}"));
        }
    }

    /// The session generation round-trips, and a log of version 2 (which
    /// never had it) refuses the kind rather than misreading it.
    #[test]
    fn session_gen_round_trips_in_version_3_only() {
        for generation in [1, 300, u64::MAX] {
            let mut buf = Vec::new();
            frame(&mut buf, 9, &Rec::SessionGen { generation }).expect("small record");
            assert!(matches!(one(&buf, 9), Rec::SessionGen { generation: g } if g == generation));
            let (payload, _) = read_frame(&buf, 0, 9).expect("intact");
            assert!(decode(payload, 2).is_err(), "not a version-2 record");
        }
    }

    #[test]
    fn journal_id_round_trips() {
        let mut buf = Vec::new();
        frame(&mut buf, 5, &Rec::JournalId { id: "00ff" }).expect("small record");
        assert!(matches!(one(&buf, 5), Rec::JournalId { id: "00ff" }));
    }

    #[test]
    fn header_round_trip_and_damage() {
        let h = encode_header(42);
        assert_eq!(decode_header(&h).ok(), Some((42, FORMAT_VERSION)));
        let mut bad = h;
        bad[13] ^= 1;
        assert!(matches!(decode_header(&bad), Err(HeaderError::Checksum)));
        assert!(matches!(decode_header(&h[..5]), Err(HeaderError::Short)));
    }

    #[test]
    fn oversized_record_is_refused_and_leaves_buffer_intact() {
        let mut buf = vec![1, 2, 3];
        let big = vec![0u8; MAX_PAYLOAD];
        let rec = Rec::Push {
            seq: 1,
            dropped_through: 0,
            record: &big,
        };
        assert!(frame(&mut buf, 0, &rec).is_err());
        assert_eq!(buf, [1, 2, 3]);
    }
}
