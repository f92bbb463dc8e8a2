//! A pass's feedback as one record: each entry's bytes behind its varint
//! length, deflated together into one `PushMany` frame.
//!
//! Why: at 1 000 firings a second the feedback was most of what the
//! journal wrote (a ~45-byte record and a frame of its own per firing,
//! docs/bench/load.md), and the feedback of one pass repeats itself: the
//! same pack, version and instruction names, times a few milliseconds
//! apart. Deflated together (miniz_oxide, already used for packs) a
//! firing's entry takes a fraction of that (`a_pass_of_feedback_deflates_to_a_few_bytes_an_entry`
//! below), and the frame's length and checksum are paid once per pass.
//! The journal never looks inside an entry: what it deflates is bytes.

use super::decode::Reader;
use super::encode::put_varint;
use super::{FRAME_LEN, MAX_PAYLOAD, Rec, TooLarge, frame};

/// Deflate's level: past 6 the pass's few kilobytes shrink no further
/// worth the CPU.
const LEVEL: u8 = 6;

/// The most entries one `PushMany` record holds (replay refuses more): a
/// record's bytes bound the outbox index it can make (8 bytes an entry),
/// whatever its block inflates to.
pub(crate) const MAX_ENTRIES: u64 = 4096;

/// Feedback pushed since the last seal, in push order (contiguous seqs).
#[derive(Debug, Default)]
pub(crate) struct PushBatch {
    first_seq: u64,
    count: u64,
    dropped_through: u64,
    /// Each entry: its length (varint), then its bytes.
    raw: Vec<u8>,
}

impl PushBatch {
    /// Adds the entry `seq` (the one after the last pushed, if any);
    /// entries up to `dropped_through` were dropped to make room for it.
    pub(crate) fn push(&mut self, seq: u64, dropped_through: u64, record: &[u8]) {
        if self.count == 0 {
            self.first_seq = seq;
        }
        debug_assert_eq!(seq, self.first_seq + self.count, "contiguous seqs");
        self.count += 1;
        self.dropped_through = self.dropped_through.max(dropped_through);
        put_varint(&mut self.raw, record.len() as u64);
        self.raw.extend_from_slice(record);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Holds [`MAX_ENTRIES`]: seal it before the next push.
    pub(crate) fn is_full(&self) -> bool {
        self.count >= MAX_ENTRIES
    }

    /// Bytes of the entries before deflating (what bounds the batch).
    pub(crate) fn raw_len(&self) -> usize {
        self.raw.len()
    }

    /// Bytes the sealed record will take in the log, frame included (it
    /// deflates the batch to know: for the rare caller that must be exact).
    pub(crate) fn frame_len(&self) -> usize {
        if self.is_empty() {
            return 0;
        }
        let mut out = Vec::new();
        let block = miniz_oxide::deflate::compress_to_vec(&self.raw, LEVEL);
        let rec = Rec::PushMany {
            first_seq: self.first_seq,
            count: self.count,
            dropped_through: self.dropped_through,
            block: &block,
        };
        frame(&mut out, 0, &rec).map_or(FRAME_LEN + 1 + block.len(), |()| out.len())
    }

    /// Frames the batch into `out` as one `PushMany` record and empties
    /// it. Returns the first seq and the count framed. On error `out` and
    /// the batch are left as they were.
    pub(crate) fn seal(&mut self, out: &mut Vec<u8>, salt: u32) -> Result<(u64, u64), TooLarge> {
        let block = miniz_oxide::deflate::compress_to_vec(&self.raw, LEVEL);
        frame(
            out,
            salt,
            &Rec::PushMany {
                first_seq: self.first_seq,
                count: self.count,
                dropped_through: self.dropped_through,
                block: &block,
            },
        )?;
        let sealed = (self.first_seq, self.count);
        self.count = 0;
        self.dropped_through = 0;
        self.raw.clear();
        if self.raw.capacity() > 1 << 20 {
            self.raw = Vec::new();
        }
        Ok(sealed)
    }
}

/// The entries of one `PushMany` record, inflated.
#[derive(Debug)]
pub(crate) struct Entries {
    bytes: Vec<u8>,
    /// Each entry's start and end in `bytes`.
    spans: Vec<(usize, usize)>,
}

impl Entries {
    /// Inflates `block`, which must hold exactly `count` entries. Its
    /// checksum matched, so an error here is a record this code cannot
    /// read, said in words.
    pub(crate) fn inflate(block: &[u8], count: u64) -> Result<Entries, String> {
        let bytes = miniz_oxide::inflate::decompress_to_vec_with_limit(block, MAX_PAYLOAD)
            .map_err(|e| format!("a batch of feedback does not inflate: {:?}", e.status))?;
        let mut spans = Vec::with_capacity(usize::try_from(count.min(1 << 16)).unwrap_or(0));
        let mut r = Reader { buf: &bytes };
        for _ in 0..count {
            let len = usize::try_from(r.varint()?).map_err(|_| "entry length overflows")?;
            let start = bytes.len() - r.buf.len();
            r.take(len)?;
            spans.push((start, start + len));
        }
        if !r.buf.is_empty() {
            return Err(format!(
                "{} unexpected bytes after {count} feedback entries",
                r.buf.len()
            ));
        }
        Ok(Entries { bytes, spans })
    }

    /// A `Push` record's one entry.
    pub(crate) fn one(bytes: Vec<u8>) -> Entries {
        let spans = vec![(0, bytes.len())];
        Entries { bytes, spans }
    }

    /// The entry at `index` (0: the record's first seq).
    pub(crate) fn get(&self, index: u64) -> Option<&[u8]> {
        let &(a, b) = self.spans.get(usize::try_from(index).ok()?)?;
        Some(&self.bytes[a..b])
    }
}

#[cfg(test)]
mod tests {
    use super::super::{decode, read_frame};
    use super::*;

    fn sealed(batch: &mut PushBatch) -> Vec<u8> {
        let mut out = Vec::new();
        batch.seal(&mut out, 7).expect("fits");
        out
    }

    #[test]
    fn a_batch_round_trips_through_its_frame_and_empties() {
        let mut b = PushBatch::default();
        let entries: [&[u8]; 3] = [b"first", b"", &[0xB1; 300]];
        for (i, e) in entries.iter().enumerate() {
            b.push(10 + i as u64, if i == 2 { 4 } else { 0 }, e);
        }
        let out = sealed(&mut b);
        assert!(b.is_empty() && b.raw_len() == 0);
        let (payload, end) = read_frame(&out, 0, 7).expect("intact frame");
        assert_eq!(end, out.len());
        let Ok(Rec::PushMany {
            first_seq,
            count,
            dropped_through,
            block,
        }) = decode(payload, 3)
        else {
            panic!("a PushMany record");
        };
        assert_eq!((first_seq, count, dropped_through), (10, 3, 4));
        let got = Entries::inflate(block, count).expect("inflates");
        for (i, e) in entries.iter().enumerate() {
            assert_eq!(got.get(i as u64), Some(*e));
        }
        assert_eq!(got.get(3), None);
        // A count that does not match the block is refused, not guessed at.
        assert!(Entries::inflate(block, 2).is_err());
        assert!(Entries::inflate(block, 4).is_err());
        assert!(Entries::inflate(b"not deflate", 1).is_err());
    }

    #[test]
    fn a_pass_of_feedback_deflates_to_a_few_bytes_an_entry() {
        // Fifty firings of one instruction 1 ms apart, each entry shaped
        // like the agent's binary feedback: names, a fixed-width
        // occurrence, small deltas.
        let mut b = PushBatch::default();
        let mut plain = 0;
        for i in 0..50u64 {
            let mut e = vec![0xB1, 0x12, 13];
            e.extend_from_slice(b"bench-latency");
            e.extend_from_slice(&[0x18, 1, 0x22, 1, b'w', 0x28, 1, 0x31]);
            e.extend_from_slice(&(1_733_500_000_000_000_000 + i * 1_000_000).to_le_bytes());
            e.extend_from_slice(&[0x40, (i * 7 % 100) as u8, 0x58, 0x83, 0x82, 0x01, 0x68, 1]);
            plain += e.len();
            b.push(1 + i, 0, &e);
        }
        let framed = sealed(&mut b).len();
        assert!(
            framed * 3 < plain,
            "50 entries of {} bytes each framed in {framed} bytes",
            plain / 50
        );
    }
}
