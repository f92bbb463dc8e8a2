//! The feedback outbox: records pushed until the controller acknowledges
//! them, paged back for re-sending, and the count of those dropped at the
//! cap until it is reported.

use crate::record::Rec;
use crate::snapshot::{OldLog, OutboxReader};
use crate::{Journal, JournalError, LAZY_FLUSH_BYTES};

impl Journal {
    /// Appends a feedback record (opaque bytes, JSON by convention) to the
    /// outbox and returns its seq (1, 2, ...; monotonic across restarts).
    /// If the outbox is full, the oldest entries are dropped and counted in
    /// [`Journal::dropped`]. Lazily synced. The payload stays on disk only.
    ///
    /// The records pushed in a row are written as one deflated record
    /// (`record::PushBatch`) before the next record of another kind, at
    /// the latest by the next [`Journal::flush`]; a large one (half the
    /// lazy buffer or more) is written alone, as before.
    pub fn push_feedback(&mut self, record: &[u8]) -> Result<u64, JournalError> {
        self.check_poisoned()?;
        let seq = self.state.next_seq;
        let len = self.state.outbox.len();
        let cap = self.cfg.outbox_cap;
        let dropped_through = if len >= cap {
            self.state.outbox.seq_at(len - cap)
        } else {
            0
        };
        if record.len() >= LAZY_FLUSH_BYTES / 2 {
            self.commit(
                &Rec::Push {
                    seq,
                    dropped_through,
                    record,
                },
                false,
            )?;
            return Ok(seq);
        }
        self.pushes.push(seq, dropped_through, record);
        self.state.push_pending(seq, dropped_through);
        if self.pushes.raw_len() >= LAZY_FLUSH_BYTES / 2 || self.pushes.is_full() {
            self.flush()?;
        }
        self.maybe_compact();
        Ok(seq)
    }

    /// Removes feedback with seq <= `up_to_seq` from the outbox: the
    /// controller has it. Lazily synced (a lost ack means a re-send). When
    /// it covers the entry that carried the drop count
    /// ([`Journal::carry_drops`]), the count is reported: [`Journal::dropped`]
    /// decreases by it, in the same record.
    pub fn ack_feedback(&mut self, up_to_seq: u64) -> Result<(), JournalError> {
        if self.state.outbox.front_seq().is_none_or(|s| s > up_to_seq) {
            return self.check_poisoned();
        }
        self.commit(&Rec::Ack { up_to_seq }, false)
    }

    /// The drop count to send with feedback `seq` as `dropped_before`.
    /// Call it for the first entry of every page sent: when drops are
    /// unreported and no entry carries them yet, `seq` becomes their
    /// carrier (a lazy `DropsSent` record) and gets the count. The carrier
    /// gets the same count on every re-send, across restarts, until the
    /// controller acknowledges it (then the count is reported, see
    /// [`Journal::ack_feedback`]) or it is dropped itself (then the count
    /// rides on a later entry). Any other entry gets 0. So a count reaches
    /// the controller on exactly one seq, and is never lost.
    ///
    /// The carrier follows the drops directly when the drops happened
    /// while nothing was in flight (an outage: the usual case): its
    /// `dropped_before` entries are the seqs just before it. Drops of
    /// entries already sent (a controller slower than the cap allows) are
    /// counted on the next page sent.
    pub fn carry_drops(&mut self, seq: u64) -> Result<u64, JournalError> {
        if self.state.carrier.is_none()
            && self.state.dropped > 0
            && self.state.outbox.front_seq().is_some_and(|f| f <= seq)
            && self.state.outbox.back_seq().is_some_and(|b| seq <= b)
        {
            let count = self.state.dropped;
            self.commit(&Rec::DropsSent { seq, count }, false)?;
        }
        Ok(self.state.dropped_before(seq))
    }

    /// The drop count entry `seq` carries (see [`Journal::carry_drops`]);
    /// 0 for any entry but the carrier.
    pub fn dropped_before(&self, seq: u64) -> u64 {
        self.state.dropped_before(seq)
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

    /// The seq the next feedback record will get (1 in a new journal):
    /// every seq below it was handed out. An acknowledgement beyond
    /// `next_seq() - 1` names feedback that does not exist yet.
    pub fn next_seq(&self) -> u64 {
        self.state.next_seq
    }

    /// Unacknowledged feedback records held.
    pub fn outbox_len(&self) -> usize {
        self.state.outbox.len()
    }

    /// The first and last seq of unacknowledged feedback, if any (seqs in
    /// between are all held: the outbox is contiguous).
    pub fn outbox_range(&self) -> Option<(u64, u64)> {
        Some((
            self.state.outbox.front_seq()?,
            self.state.outbox.back_seq()?,
        ))
    }

    /// Up to `max` unacknowledged feedback records with seq >= `from_seq`,
    /// in seq order, read back from the log (to re-send after reconnecting:
    /// page through with `from_seq = last seq + 1`). Each record's checksum
    /// is verified again; a mismatch is [`JournalError::Corrupt`].
    pub fn outbox_page(
        &mut self,
        from_seq: u64,
        max: usize,
    ) -> Result<Vec<(u64, Vec<u8>)>, JournalError> {
        self.check_poisoned()?;
        self.flush()?;
        let mut out = Vec::with_capacity(max.min(self.state.outbox.len()).min(1024));
        let mut reader = OutboxReader::default();
        let log = OldLog {
            file: &self.file,
            path: &self.log_path,
            salt: self.salt,
            version: self.version,
        };
        for (seq, offset) in self.state.outbox.page(from_seq, max) {
            out.push((seq, reader.read(&log, offset, seq)?.to_vec()));
        }
        Ok(out)
    }
}
