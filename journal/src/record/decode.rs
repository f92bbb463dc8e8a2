//! Decoding records: one payload per record kind and format version;
//! anything not understood is refused by name, never guessed at.

use std::borrow::Cow;

use super::*;

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
            reason: r.stop_reason()?,
        },
        K_STARTED if v3 => Rec::Started(Ids::Decoded(r.started_v3()?)),
        K_STARTED => Rec::Started(Ids::Decoded(r.started_v2()?)),
        K_FINISHED if v3 => Rec::Finished(r.finished_v3()?),
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
        K_PUSH_MANY if v3 => Rec::PushMany {
            first_seq: r.varint()?,
            count: r.varint()?,
            dropped_through: r.varint()?,
            block: std::mem::take(&mut r.buf),
        },
        K_ACK => Rec::Ack {
            up_to_seq: if v3 { r.varint()? } else { r.u64()? },
        },
        K_ALIVE => Rec::Alive { ns: r.i64()? },
        K_DROPPED_REPORTED => Rec::DroppedReported { count: r.u64()? },
        K_META if v3 => r.meta_v3()?,
        K_META => r.meta_v2()?,
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

pub(super) struct Reader<'a> {
    pub(super) buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
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
    pub(super) fn varint(&mut self) -> Result<u64, String> {
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

    /// A stop record's reason.
    fn stop_reason(&mut self) -> Result<StopReason, String> {
        Ok(match self.u8()? {
            STOP_GIVE_UP => StopReason::GiveUp,
            STOP_CANCEL => StopReason::Cancel,
            STOP_LEASE_LOST => StopReason::LeaseLost,
            STOP_CLOCK_LOST => StopReason::ClockLost,
            t => return Err(format!("unknown stop reason {t}")),
        })
    }

    /// A version-3 `Started` record's ids: table, count, entries.
    fn started_v3(&mut self) -> Result<Vec<(Cow<'a, str>, i64)>, String> {
        let table = self.table()?;
        let n = self.varint()?;
        // Each entry takes at least 4 bytes: never trust `n` for capacity.
        let mut ids = Vec::with_capacity((n as usize).min(self.buf.len() / 4));
        let mut prev = 0;
        for _ in 0..n {
            ids.push(self.id(&table, &mut prev)?);
        }
        Ok(ids)
    }

    /// A version-2 `Started` record's ids: count, then each as text.
    fn started_v2(&mut self) -> Result<Vec<(Cow<'a, str>, i64)>, String> {
        let n = self.u32()? as usize;
        // Each entry takes at least 12 bytes: never trust `n` for capacity.
        let mut ids = Vec::with_capacity(n.min(self.buf.len() / 12));
        for _ in 0..n {
            ids.push((Cow::Borrowed(self.str()?), self.i64()?));
        }
        Ok(ids)
    }

    /// A version-3 `Finished` record's results: table, count, entries.
    fn finished_v3(&mut self) -> Result<Vec<Result1<'a>>, String> {
        let table = self.table()?;
        let n = self.varint()?;
        let mut results = Vec::with_capacity((n as usize).min(self.buf.len() / 5));
        let mut prev = 0;
        for _ in 0..n {
            let (id, ns) = self.id(&table, &mut prev)?;
            results.push((id, ns, self.outcome()?));
        }
        Ok(results)
    }

    /// A version-3 `Meta` record (varints, and the drop-count carrier).
    fn meta_v3(&mut self) -> Result<Rec<'a>, String> {
        let next_seq = self.varint()?;
        let dropped = self.varint()?;
        let has_alive = self.u8()?;
        let alive = self.i64()?;
        let (seq, count) = (self.varint()?, self.varint()?);
        Ok(Rec::Meta {
            next_seq,
            dropped,
            last_alive_ns: (has_alive != 0).then_some(alive),
            carrier: (seq != 0).then_some((seq, count)),
        })
    }

    /// A version-2 `Meta` record (fixed integers, no carrier).
    fn meta_v2(&mut self) -> Result<Rec<'a>, String> {
        let next_seq = self.u64()?;
        let dropped = self.u64()?;
        let has_alive = self.u8()?;
        let alive = self.i64()?;
        Ok(Rec::Meta {
            next_seq,
            dropped,
            last_alive_ns: (has_alive != 0).then_some(alive),
            carrier: None,
        })
    }
}

fn utf8(b: &[u8]) -> Result<&str, String> {
    std::str::from_utf8(b).map_err(|e| format!("string is not UTF-8: {e}"))
}
