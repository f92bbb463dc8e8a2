//! Replaying a log image: its header, then every intact record folded
//! into the state, telling a torn tail (cut off) from damage in the
//! middle (refused).

use std::path::Path;

#[cfg(doc)]
use crate::Journal;
use crate::record::{self, HEADER_LEN, HeaderError, Rec};
use crate::state::State;
use crate::{JournalError, LogSummary};

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

/// A replayed log image.
pub(crate) struct Replayed {
    pub(crate) state: State,
    pub(crate) salt: u32,
    pub(crate) version: u32,
    /// Where its intact records end (the rest is a torn tail).
    pub(crate) valid_end: usize,
    /// Where the last `Meta` record ends: the live size at the last
    /// compaction (every log starts as a snapshot).
    pub(crate) snapshot_end: Option<usize>,
}

/// Replays a log image.
pub(crate) fn replay(buf: &[u8], path: &Path) -> Result<Replayed, JournalError> {
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
