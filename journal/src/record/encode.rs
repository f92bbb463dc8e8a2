//! Encoding records: one payload per record kind, ids in their compact
//! form (see the format in the parent module's docs).

use std::collections::HashMap;

use super::*;

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

impl Rec<'_> {
    /// Appends this record's payload (kind, then fields) to `out`.
    pub(super) fn encode(&self, out: &mut Vec<u8>) {
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
            Rec::Started(ids) => put_started(out, ids),
            Rec::Finished(results) => put_finished(out, results),
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
            Rec::PushMany {
                first_seq,
                count,
                dropped_through,
                block,
            } => {
                out.push(K_PUSH_MANY);
                put_varint(out, *first_seq);
                put_varint(out, *count);
                put_varint(out, *dropped_through);
                out.extend_from_slice(block);
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
            } => put_meta(out, *next_seq, *dropped, *last_alive_ns, *carrier),
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

/// A `Started` payload: the id table, the count, the entries.
fn put_started(out: &mut Vec<u8>, ids: &Ids<'_>) {
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

/// A `Finished` payload, written as the journal's pass batch would write it.
fn put_finished(out: &mut Vec<u8>, results: &[Result1<'_>]) {
    let mut b = FinishedBatch::default();
    for (id, ns, outcome) in results {
        b.push(id, *ns, *outcome);
    }
    b.payload(out);
}

/// A `Meta` payload (version 3).
fn put_meta(
    out: &mut Vec<u8>,
    next_seq: u64,
    dropped: u64,
    last_alive_ns: Option<i64>,
    carrier: Option<(u64, u64)>,
) {
    out.push(K_META);
    put_varint(out, next_seq);
    put_varint(out, dropped);
    out.push(u8::from(last_alive_ns.is_some()));
    out.extend_from_slice(&last_alive_ns.unwrap_or(0).to_le_bytes());
    // Seqs start at 1: 0 is "no carrier".
    let (seq, count) = carrier.unwrap_or((0, 0));
    put_varint(out, seq);
    put_varint(out, count);
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    // Lengths above u32::MAX exceed MAX_PAYLOAD; `frame` refuses the record.
    out.extend_from_slice(&u32::try_from(b.len()).unwrap_or(u32::MAX).to_le_bytes());
    out.extend_from_slice(b);
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_bytes(out, s.as_bytes());
}

pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
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
