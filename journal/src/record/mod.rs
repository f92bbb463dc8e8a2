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
//! | `PushMany` | first seq, count, dropped-through (varints), then the deflated entries (each a varint length and its bytes) to the end |
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
//! journal that never met one stays readable by an agent built before it),
//! and the `PushMany` record (kind 16: a pass's feedback in one deflated
//! record, see `pushes.rs`; an agent built before it refuses the log by
//! name, so a downgrade across it fails at open instead of dropping
//! feedback).
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

use crc32fast::Hasher;

use crate::{Outcome, StopReason};

mod decode;
mod encode;
mod pushes;
#[cfg(test)]
mod tests;

pub(crate) use decode::decode;
pub(crate) use encode::FinishedBatch;
pub(crate) use pushes::{Entries, MAX_ENTRIES, PushBatch};

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
const K_PUSH_MANY: u8 = 16;

const OUTCOME_SUCCEEDED: u8 = 1;
const OUTCOME_FAILED: u8 = 2;
const OUTCOME_NOT_RUN: u8 = 3;
const STOP_GIVE_UP: u8 = 1;
const STOP_CANCEL: u8 = 2;
const STOP_LEASE_LOST: u8 = 3;
const STOP_CLOCK_LOST: u8 = 4;

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
    /// `count` feedback records joined the outbox, seqs `first_seq..`, in
    /// one record: their bytes deflated together (`block`, see
    /// `pushes.rs`); entries with a seq up to `dropped_through` were
    /// dropped to make room, those of this record included (0: none).
    /// Version 3, kind 16.
    PushMany {
        first_seq: u64,
        count: u64,
        dropped_through: u64,
        block: &'a [u8],
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
