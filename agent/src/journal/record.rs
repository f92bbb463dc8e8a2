//! The on-disk format: a header, then framed records.
//!
//! ```text
//! header  = magic "BATONJNL" | version u32 | salt u32 | crc32(magic..salt) u32   (20 bytes)
//! record  = len u32 | crc u32 | payload[len]
//!           crc = CRC-32 (IEEE), started from `salt`, over the len bytes then the payload
//! payload = kind u8 | fields (little-endian integers; str/bytes = u32 length + bytes;
//!           enums = one u8 tag, see `Outcome` / `StopReason` below)
//! ```
//!
//! Version 2 (this one) made outcomes typed: a result is ONE `Finished`
//! record carrying its [`Outcome`], a stop carries a [`StopReason`], and
//! `Once` records exist. Later additions within version 2, each a new tag
//! an older agent refuses by name ("unknown record kind", "unknown stop
//! reason") rather than misreads: the `JournalId` record (kind 13) and the
//! `lease_lost` stop reason (3). A journal written by this agent is
//! therefore not readable by an agent built before them (no downgrade);
//! every older log reads here unchanged. A snapshot (a compacted log) ends with its `Meta`
//! record, so the offset just past the last `Meta` is the live size at the
//! last compaction (the compaction trigger is recomputed from it at open).
//!
//! The checksum covers the length, so a torn or flipped length never sends
//! the reader to a wrong place unnoticed. Seeding it with a per-file random
//! `salt` means a record can only validate in the file that wrote it: stale
//! bytes of an older, compacted-away log that a file system might expose
//! after a crash are rejected like any other garbage.

use crc32fast::Hasher;

use super::{Outcome, StopReason};

/// First bytes of every journal file.
pub(crate) const MAGIC: &[u8; 8] = b"BATONJNL";
/// The format this code writes and reads.
pub(crate) const FORMAT_VERSION: u32 = 2;
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
/// the caller (encoding) or read back from a log buffer (decoding).
#[derive(Debug)]
pub(crate) enum Ids<'a> {
    Borrowed(&'a [(&'a str, i64)]),
    Decoded(Vec<(&'a str, i64)>),
}

impl<'a> Ids<'a> {
    pub(crate) fn as_slice(&self) -> &[(&'a str, i64)] {
        match self {
            Ids::Borrowed(s) => s,
            Ids::Decoded(v) => v,
        }
    }
}

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
    /// An execution has a result, in one record (never two records or a
    /// suffix: the outcome is atomic); `ref_ns` dates it for the retention
    /// horizon.
    Finished {
        id: &'a str,
        ref_ns: i64,
        outcome: Outcome,
    },
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
    Meta {
        next_seq: u64,
        dropped: u64,
        last_alive_ns: Option<i64>,
    },
    /// Outbox entries up to this seq were dropped (cap lowered at open).
    DropOldest { through_seq: u64 },
    /// The journal's identity (see `Journal::id`): written once, first in
    /// every snapshot, and appended at open to a log that has none.
    JournalId { id: &'a str },
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

/// Reads the header, returning the salt.
pub(crate) fn decode_header(buf: &[u8]) -> Result<u32, HeaderError> {
    let h = buf.get(..HEADER_LEN).ok_or(HeaderError::Short)?;
    if &h[..8] != MAGIC {
        return Err(HeaderError::Magic);
    }
    if crc32fast::hash(&h[..16]) != le_u32(&h[16..20]) {
        return Err(HeaderError::Checksum);
    }
    let version = le_u32(&h[8..12]);
    if version != FORMAT_VERSION {
        return Err(HeaderError::Version(version));
    }
    Ok(le_u32(&h[12..16]))
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
                let ids = ids.as_slice();
                // A count above u32::MAX would be far past MAX_PAYLOAD, which
                // `frame` then refuses; saturate instead of wrapping.
                out.extend_from_slice(&u32::try_from(ids.len()).unwrap_or(u32::MAX).to_le_bytes());
                for (id, ns) in ids {
                    put_str(out, id);
                    out.extend_from_slice(&ns.to_le_bytes());
                }
            }
            Rec::Finished {
                id,
                ref_ns,
                outcome,
            } => {
                out.push(K_FINISHED);
                put_str(out, id);
                out.extend_from_slice(&ref_ns.to_le_bytes());
                out.push(outcome_tag(*outcome));
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
                out.extend_from_slice(&seq.to_le_bytes());
                out.extend_from_slice(&dropped_through.to_le_bytes());
                put_bytes(out, record);
            }
            Rec::Ack { up_to_seq } => {
                out.push(K_ACK);
                out.extend_from_slice(&up_to_seq.to_le_bytes());
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
            } => {
                out.push(K_META);
                out.extend_from_slice(&next_seq.to_le_bytes());
                out.extend_from_slice(&dropped.to_le_bytes());
                out.push(u8::from(last_alive_ns.is_some()));
                out.extend_from_slice(&last_alive_ns.unwrap_or(0).to_le_bytes());
            }
            Rec::DropOldest { through_seq } => {
                out.push(K_DROP_OLDEST);
                out.extend_from_slice(&through_seq.to_le_bytes());
            }
            Rec::JournalId { id } => {
                out.push(K_JOURNAL_ID);
                put_str(out, id);
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

/// Decodes a payload whose checksum matched. An error here is not a torn
/// write but a record this code cannot understand.
pub(crate) fn decode(payload: &[u8]) -> Result<Rec<'_>, String> {
    let mut r = Reader { buf: payload };
    let kind = r.u8()?;
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
        K_STARTED => {
            let n = r.u32()? as usize;
            // Each entry takes at least 12 bytes: never trust `n` for capacity.
            let mut ids = Vec::with_capacity(n.min(r.buf.len() / 12));
            for _ in 0..n {
                ids.push((r.str()?, r.i64()?));
            }
            Rec::Started(Ids::Decoded(ids))
        }
        K_FINISHED => Rec::Finished {
            id: r.str()?,
            ref_ns: r.i64()?,
            outcome: match r.u8()? {
                OUTCOME_SUCCEEDED => Outcome::Succeeded,
                OUTCOME_FAILED => Outcome::Failed,
                OUTCOME_NOT_RUN => Outcome::NotRun,
                t => return Err(format!("unknown outcome {t}")),
            },
        },
        K_ONCE => Rec::Once {
            key: r.str()?,
            ref_ns: r.i64()?,
        },
        K_PUSH => Rec::Push {
            seq: r.u64()?,
            dropped_through: r.u64()?,
            record: r.bytes()?,
        },
        K_ACK => Rec::Ack {
            up_to_seq: r.u64()?,
        },
        K_ALIVE => Rec::Alive { ns: r.i64()? },
        K_DROPPED_REPORTED => Rec::DroppedReported { count: r.u64()? },
        K_META => {
            let next_seq = r.u64()?;
            let dropped = r.u64()?;
            let has_alive = r.u8()?;
            let alive = r.i64()?;
            Rec::Meta {
                next_seq,
                dropped,
                last_alive_ns: (has_alive != 0).then_some(alive),
            }
        }
        K_DROP_OLDEST => Rec::DropOldest {
            through_seq: r.u64()?,
        },
        K_JOURNAL_ID => Rec::JournalId { id: r.str()? },
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
        std::str::from_utf8(self.bytes()?).map_err(|e| format!("string is not UTF-8: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_round_trip_and_salt_binds_records_to_their_file() {
        let mut buf = Vec::new();
        let ids = [("a", 1i64), ("bb", -2)];
        frame(&mut buf, 7, &Rec::Started(Ids::Borrowed(&ids))).expect("small record");
        let (payload, next) = read_frame(&buf, 0, 7).expect("intact");
        assert_eq!(next, buf.len());
        match decode(payload).expect("decodes") {
            Rec::Started(got) => assert_eq!(got.as_slice(), &ids),
            other => panic!("wrong record {other:?}"),
        }
        assert!(read_frame(&buf, 0, 8).is_none(), "another file's salt");
    }

    #[test]
    fn typed_records_round_trip_and_unknown_tags_are_refused() {
        for outcome in [Outcome::Succeeded, Outcome::Failed, Outcome::NotRun] {
            let mut buf = Vec::new();
            let rec = Rec::Finished {
                id: "p/1/i/0/0/1",
                ref_ns: -5,
                outcome,
            };
            frame(&mut buf, 3, &rec).expect("small record");
            let (payload, _) = read_frame(&buf, 0, 3).expect("intact");
            match decode(payload).expect("decodes") {
                Rec::Finished {
                    id,
                    ref_ns,
                    outcome: got,
                } => assert_eq!((id, ref_ns, got), ("p/1/i/0/0/1", -5, outcome)),
                other => panic!("wrong record {other:?}"),
            }
            // The outcome is the last byte: an unknown tag is an error.
            let mut bad = payload.to_vec();
            *bad.last_mut().expect("non-empty") = 9;
            assert!(decode(&bad).is_err());
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
            let (payload, _) = read_frame(&buf, 0, 0).expect("intact");
            assert!(matches!(
                decode(payload),
                Ok(Rec::StopPack { reason: r, version: 4, .. }) if r == reason
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
        let (payload, _) = read_frame(&buf, 0, 0).expect("intact");
        assert!(matches!(
            decode(payload),
            Ok(Rec::Once {
                key: "k",
                ref_ns: 7
            })
        ));
    }

    #[test]
    fn journal_id_round_trips() {
        let mut buf = Vec::new();
        frame(&mut buf, 5, &Rec::JournalId { id: "00ff" }).expect("small record");
        let (payload, _) = read_frame(&buf, 0, 5).expect("intact");
        assert!(matches!(decode(payload), Ok(Rec::JournalId { id: "00ff" })));
    }

    #[test]
    fn header_round_trip_and_damage() {
        let h = encode_header(42);
        assert_eq!(decode_header(&h).ok(), Some(42));
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
