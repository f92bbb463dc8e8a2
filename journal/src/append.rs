//! Appending records: durable ones written and fdatasynced at once, lazy
//! ones buffered until the next flush; the state is updated only after
//! its record is in the log.

use std::io::Write;

use crate::record::{self, MAX_PAYLOAD, Rec};
use crate::{Journal, JournalError, KEEP_BUF_BYTES, LAZY_FLUSH_BYTES};

impl Journal {
    pub(crate) fn check_poisoned(&self) -> Result<(), JournalError> {
        if self.poisoned {
            Err(JournalError::Poisoned {
                path: self.log_path.clone(),
            })
        } else {
            Ok(())
        }
    }

    /// Writes the buffered lazy records (one `write(2)`). The runtime calls
    /// it once per pass of its loop; durable calls, [`Journal::sync`] and
    /// compaction call it first, so the log keeps the records' order.
    pub fn flush(&mut self) -> Result<(), JournalError> {
        self.check_poisoned()?;
        // The pass's feedback before its results: a durable result implies
        // its feedback is durable too (the prefix property).
        self.seal_pushes()?;
        if !self.fin.is_empty() {
            let start = self.lazy.len();
            // Bounded far below the frame limit (sealed at half the lazy
            // buffer's size).
            self.fin
                .seal(&mut self.lazy, self.salt)
                .map_err(|e| JournalError::TooLarge {
                    what: "batch of results",
                    len: e.len,
                    limit: MAX_PAYLOAD,
                })?;
            self.len += (self.lazy.len() - start) as u64;
        }
        if self.lazy.is_empty() {
            return Ok(());
        }
        let written = self.file.write_all(&self.lazy);
        self.lazy.clear();
        if let Err(e) = written {
            self.poisoned = true;
            return Err(JournalError::io("append to", &self.log_path, e));
        }
        Ok(())
    }

    /// Appends `rec` (and syncs it if `durable`), then applies it to the
    /// in-memory state: the state never runs ahead of the log.
    pub(crate) fn commit(&mut self, rec: &Rec<'_>, durable: bool) -> Result<(), JournalError> {
        self.check_poisoned()?;
        if !durable {
            return self.commit_lazy(rec);
        }
        self.flush()?;
        self.buf.clear();
        record::frame(&mut self.buf, self.salt, rec).map_err(|e| JournalError::TooLarge {
            what: rec.what(),
            len: e.len,
            limit: MAX_PAYLOAD,
        })?;
        let written = self.file.write_all(&self.buf);
        let n = self.buf.len() as u64;
        if self.buf.capacity() > KEEP_BUF_BYTES {
            self.buf = Vec::with_capacity(256);
        }
        if let Err(e) = written {
            self.poisoned = true;
            return Err(JournalError::io("append to", &self.log_path, e));
        }
        let offset = self.len;
        self.len += n;
        if durable {
            self.sync_data()?;
        }
        self.state.apply(rec, offset);
        self.maybe_compact();
        Ok(())
    }

    /// Frames this pass's feedback (if any) into the lazy buffer as one
    /// `PushMany` record, and gives its entries their offset. Called before
    /// any other record is framed, so the log keeps the calls' order.
    pub(crate) fn seal_pushes(&mut self) -> Result<(), JournalError> {
        if self.pushes.is_empty() {
            return Ok(());
        }
        let start = self.lazy.len();
        let raw = self.pushes.raw_len();
        let (first, count) = self.pushes.seal(&mut self.lazy, self.salt).map_err(|e| {
            // Cannot happen (a batch is sealed far below the limit), but
            // its entries are in the state already: nothing may follow.
            self.poisoned = true;
            JournalError::TooLarge {
                what: "batch of feedback",
                len: e.len.max(raw),
                limit: MAX_PAYLOAD,
            }
        })?;
        let offset = self.len;
        self.len += (self.lazy.len() - start) as u64;
        self.state.outbox.settle(first, count, offset);
        Ok(())
    }

    /// A lazy record joins the buffer; its offset is where it will land.
    fn commit_lazy(&mut self, rec: &Rec<'_>) -> Result<(), JournalError> {
        self.seal_pushes()?;
        let start = self.lazy.len();
        record::frame(&mut self.lazy, self.salt, rec).map_err(|e| JournalError::TooLarge {
            what: rec.what(),
            len: e.len,
            limit: MAX_PAYLOAD,
        })?;
        let offset = self.len;
        self.len += (self.lazy.len() - start) as u64;
        self.state.apply(rec, offset);
        if self.lazy.len() >= LAZY_FLUSH_BYTES {
            self.flush()?;
        }
        self.maybe_compact();
        Ok(())
    }

    pub(crate) fn sync_data(&mut self) -> Result<(), JournalError> {
        if let Err(e) = self.file.sync_data() {
            self.poisoned = true;
            return Err(JournalError::io("fdatasync", &self.log_path, e));
        }
        self.synced_len = self.len;
        self.syncs += 1;
        Ok(())
    }
}

impl Rec<'_> {
    /// What this record holds, for [`JournalError::TooLarge`].
    fn what(&self) -> &'static str {
        match self {
            Rec::PutPack { .. } => "pack",
            Rec::Started(_) => "batch of execution ids",
            Rec::Finished(_) => "batch of results",
            Rec::Once { .. } => "once key",
            Rec::Push { .. } => "feedback record",
            _ => "record",
        }
    }
}
