//! The journal's live state: what replaying the log yields. The log is the
//! truth; this is its fold, kept in memory because the agent asks it on
//! every firing ("has this id started?") and it is bounded (see the module
//! docs of [`crate`]). Feedback payloads are NOT held: the outbox
//! is an index of where each unacknowledged record sits in the log.

use std::collections::{BTreeMap, VecDeque};

use super::packed::PackedPack;
use super::record::Rec;
use super::{Outcome, StopReason};

/// What the journal knows of one execution id: 16 bytes beside its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Attempt {
    /// Scheduled reference time (ns) of its start, else the time that
    /// dated its result: what the retention horizon compares.
    pub(crate) ref_ns: i64,
    /// `None`: started, no result (yet).
    pub(crate) outcome: Option<Outcome>,
}

/// Unacknowledged feedback: seqs `first_seq ..= first_seq + len - 1`
/// (contiguous: pushes take the next seq, acks and drops cut the front),
/// each with the offset of its `Push` frame in the current log. 8 bytes per
/// entry; the payloads stay on disk.
#[derive(Debug, Default)]
pub(crate) struct Outbox {
    first_seq: u64,
    offsets: VecDeque<u64>,
}

impl Outbox {
    pub(crate) fn len(&self) -> usize {
        self.offsets.len()
    }

    pub(crate) fn front_seq(&self) -> Option<u64> {
        (!self.offsets.is_empty()).then_some(self.first_seq)
    }

    pub(crate) fn back_seq(&self) -> Option<u64> {
        (!self.offsets.is_empty()).then(|| self.first_seq + self.offsets.len() as u64 - 1)
    }

    /// The seq of the entry at `index` from the front.
    pub(crate) fn seq_at(&self, index: usize) -> u64 {
        self.first_seq + index as u64
    }

    fn push(&mut self, seq: u64, offset: u64) {
        if self.offsets.is_empty() {
            self.first_seq = seq;
        }
        debug_assert_eq!(seq, self.first_seq + self.offsets.len() as u64);
        self.offsets.push_back(offset);
    }

    /// Removes entries with seq <= `through`; returns how many.
    fn pop_through(&mut self, through: u64) -> u64 {
        let Some(front) = self.front_seq() else {
            return 0;
        };
        if through < front {
            return 0;
        }
        let n = (through - front + 1).min(self.offsets.len() as u64);
        self.offsets.drain(..n as usize);
        self.first_seq += n;
        if self.offsets.is_empty() {
            self.offsets.shrink_to(1024);
        }
        n
    }

    /// `(seq, frame offset)` from `from_seq` on, at most `max` of them.
    pub(crate) fn page(&self, from_seq: u64, max: usize) -> impl Iterator<Item = (u64, u64)> + '_ {
        let skip = from_seq.saturating_sub(self.first_seq);
        let skip = usize::try_from(skip).unwrap_or(usize::MAX);
        self.offsets
            .iter()
            .enumerate()
            .skip(skip)
            .take(max)
            .map(|(i, off)| (self.first_seq + i as u64, *off))
    }

    /// The entries `first..first + count` still held (a cap may have
    /// dropped some before their batch was framed) now have their record
    /// at `offset`.
    pub(crate) fn settle(&mut self, first: u64, count: u64, offset: u64) {
        let Some(front) = self.front_seq() else {
            return;
        };
        let from = first.max(front) - front;
        let to = (first + count).saturating_sub(front);
        for i in from..to.min(self.offsets.len() as u64) {
            self.offsets[i as usize] = offset;
        }
    }

    /// Replaces the offsets (after a compaction moved every record).
    pub(crate) fn set_offsets(&mut self, offsets: VecDeque<u64>) {
        debug_assert_eq!(offsets.len(), self.offsets.len());
        self.offsets = offsets;
    }

    /// Bytes of heap this index holds.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.offsets.capacity() * 8
    }
}

/// The offset of an outbox entry whose batch is not framed yet.
pub(crate) const PENDING: u64 = u64::MAX;

/// Keyed by execution id (or once-only key): touched per firing.
pub(crate) type IdMap<V> = std::collections::HashMap<Box<str>, V, foldhash::fast::RandomState>;

#[derive(Debug, Default)]
pub(crate) struct State {
    /// Keyed by (tenant, pack).
    pub(crate) packs: BTreeMap<(String, String), PackedPack>,
    /// Execution id → what is known of it (start and/or result).
    pub(crate) attempts: IdMap<Attempt>,
    /// Once-only action key → reference time that dates it.
    pub(crate) once: IdMap<i64>,
    /// Unacknowledged feedback, in seq order (offsets into the log).
    pub(crate) outbox: Outbox,
    /// The seq the next pushed feedback gets; seqs start at 1 so that 0 can
    /// mean "nothing acknowledged yet" on the wire.
    pub(crate) next_seq: u64,
    /// Outbox entries dropped because of the cap and not yet reported.
    pub(crate) dropped: u64,
    /// The outbox entry that carries the unreported drop count to the
    /// controller, and the count: `(seq, count)` (see `Rec::DropsSent`).
    /// Cleared when that entry is acknowledged (the count is then
    /// reported: subtracted from `dropped`) or dropped itself.
    pub(crate) carrier: Option<(u64, u64)>,
    pub(crate) last_alive_ns: Option<i64>,
    /// Latest scheduled time among started ids (fallback clock, see
    /// [`State::reference_now`]).
    pub(crate) max_started_ns: Option<i64>,
    /// The journal's identity (`Journal::id`).
    pub(crate) journal_id: Option<String>,
    /// The highest controller session generation seen (0: none; see
    /// `Journal::record_session_gen`).
    pub(crate) session_gen: u64,
}

impl State {
    pub(crate) fn new() -> Self {
        State {
            next_seq: 1,
            ..State::default()
        }
    }

    /// The journal's idea of "now" on the reference scale, used only to
    /// date results without a start record and to apply the retention
    /// horizon: the last heartbeat, else the latest started execution. The
    /// journal never reads a clock (docs/design.md principle 1).
    pub(crate) fn reference_now(&self) -> Option<i64> {
        self.last_alive_ns.or(self.max_started_ns)
    }

    /// Forgets ids and once keys dated before `horizon`; returns how many.
    /// Releases map capacity once most of it is unused, so memory follows
    /// the retained set down, not only up.
    pub(crate) fn prune(&mut self, horizon: i64) -> usize {
        let before = self.attempts.len() + self.once.len();
        self.attempts.retain(|_, a| a.ref_ns >= horizon);
        self.once.retain(|_, ns| *ns >= horizon);
        shrink_if_sparse(&mut self.attempts);
        shrink_if_sparse(&mut self.once);
        before - self.attempts.len() - self.once.len()
    }

    /// Feedback `seq` joined the outbox as the journal's batch of this
    /// pass (its record is framed at the next flush: [`PENDING`] until
    /// [`Outbox::settle`]); entries up to `dropped_through` were dropped
    /// to make room. What applying its `Push` would do.
    pub(crate) fn push_pending(&mut self, seq: u64, dropped_through: u64) {
        self.drop_through(dropped_through);
        self.outbox.push(seq, PENDING);
        self.next_seq = self.next_seq.max(seq.saturating_add(1));
    }

    /// Checks what replay must not accept although its checksum matched:
    /// feedback seqs that are not strictly increasing and contiguous (the
    /// outbox index relies on it).
    pub(crate) fn check(&self, rec: &Rec<'_>) -> Result<(), String> {
        let first = match rec {
            Rec::Push { seq, .. } => Some((*seq, 1)),
            Rec::PushMany {
                first_seq, count, ..
            } => Some((*first_seq, *count)),
            _ => None,
        };
        if let Some((seq, count)) = first {
            let expect = self.outbox.back_seq().map(|b| b.saturating_add(1));
            let ok = seq >= self.next_seq
                && (1..=crate::record::MAX_ENTRIES).contains(&count)
                && seq.checked_add(count).is_some_and(|end| end < u64::MAX)
                && expect.is_none_or(|e| seq == e);
            if !ok {
                return Err(format!(
                    "feedback seq {seq} out of order (next seq {}, last held {:?})",
                    self.next_seq,
                    self.outbox.back_seq()
                ));
            }
        }
        Ok(())
    }

    /// The drop count entry `seq` carries (0 unless it is the carrier).
    pub(crate) fn dropped_before(&self, seq: u64) -> u64 {
        match self.carrier {
            Some((s, c)) if s == seq => c,
            _ => 0,
        }
    }

    /// An execution's result (see `Rec::Finished`).
    pub(crate) fn finish(&mut self, id: &str, ref_ns: i64, outcome: super::Outcome) {
        match self.attempts.get_mut(id) {
            Some(a) => a.outcome = Some(outcome),
            None => {
                self.attempts.insert(
                    id.into(),
                    Attempt {
                        ref_ns,
                        outcome: Some(outcome),
                    },
                );
            }
        }
    }

    /// Drops outbox entries with seq <= `through`, counting them as dropped.
    fn drop_through(&mut self, through: u64) {
        let n = self.outbox.pop_through(through);
        self.dropped = self.dropped.saturating_add(n);
        // The entry carrying a count went unacknowledged: the count (still
        // in `dropped`) rides on a later entry.
        if self.carrier.is_some_and(|(s, _)| s <= through) {
            self.carrier = None;
        }
    }

    /// A pack version stopped for good (ignored if not that version).
    fn stop_pack(&mut self, tenant: &str, pack: &str, version: u64, reason: StopReason) {
        if let Some(p) = self
            .packs
            .get_mut(&(tenant.to_owned(), pack.to_owned()))
            .filter(|p| p.version == version)
        {
            p.stopped = Some(reason);
        }
    }

    /// Execution `id`, scheduled at `ns`, is about to touch the device.
    fn start(&mut self, id: &str, ns: i64) {
        match self.attempts.get_mut(id) {
            // Started again after it did not run (withdrawn, too late,
            // armed at a crash): unknown again until this start's result.
            Some(a) if a.outcome == Some(Outcome::NotRun) => {
                a.ref_ns = ns;
                a.outcome = None;
            }
            // A start after a result it ran with (a caller's mistake) keeps
            // the result: an outcome is never un-known.
            Some(a) => a.ref_ns = ns,
            None => {
                self.attempts.insert(
                    id.into(),
                    Attempt {
                        ref_ns: ns,
                        outcome: None,
                    },
                );
            }
        }
        self.max_started_ns = Some(self.max_started_ns.map_or(ns, |m| m.max(ns)));
    }

    /// The controller acknowledged feedback up to `up_to_seq`.
    fn ack(&mut self, up_to_seq: u64) {
        self.outbox.pop_through(up_to_seq);
        // The controller stored the entry carrying the count: reported,
        // never sent again.
        if let Some((_, c)) = self.carrier.filter(|(s, _)| *s <= up_to_seq) {
            self.dropped = self.dropped.saturating_sub(c);
            self.carrier = None;
        }
    }

    /// `count` drops were reported upstream.
    fn dropped_reported(&mut self, count: u64) {
        self.dropped = self.dropped.saturating_sub(count);
        if let Some((_, c)) = &mut self.carrier {
            *c = (*c).min(self.dropped);
        }
    }

    /// Applies `rec`, whose frame starts at `offset` in the log (the outbox
    /// index keeps it for `Push`).
    pub(crate) fn apply(&mut self, rec: &Rec<'_>, offset: u64) {
        match rec {
            Rec::PutPack {
                tenant,
                pack,
                version,
                accepted_ns,
                yaml,
            } => {
                let p = PackedPack::new(tenant, pack, *version, *accepted_ns, yaml);
                self.packs.insert((p.tenant.clone(), p.pack.clone()), p);
            }
            Rec::StopPack {
                tenant,
                pack,
                version,
                reason,
            } => self.stop_pack(tenant, pack, *version, *reason),
            Rec::RemovePack { tenant, pack } => {
                self.packs
                    .remove(&((*tenant).to_owned(), (*pack).to_owned()));
            }
            Rec::Started(ids) => {
                for (id, ns) in ids.iter() {
                    self.start(id, ns);
                }
            }
            Rec::Finished(results) => {
                for (id, ref_ns, outcome) in results {
                    self.finish(id, *ref_ns, *outcome);
                }
            }
            Rec::Once { key, ref_ns } => {
                self.once.insert((*key).into(), *ref_ns);
            }
            Rec::Push {
                seq,
                dropped_through,
                ..
            } => {
                self.drop_through(*dropped_through);
                self.outbox.push(*seq, offset);
                self.next_seq = self.next_seq.max(seq.saturating_add(1));
            }
            Rec::PushMany {
                first_seq,
                count,
                dropped_through,
                ..
            } => {
                // Live, each entry dropped what it made room for before it
                // joined; adding them all, then dropping up to the last
                // one's mark, leaves the same entries and the same count.
                for seq in *first_seq..first_seq.saturating_add(*count) {
                    self.outbox.push(seq, offset);
                }
                self.drop_through(*dropped_through);
                self.next_seq = self.next_seq.max(first_seq.saturating_add(*count));
            }
            Rec::Ack { up_to_seq } => self.ack(*up_to_seq),
            Rec::DropsSent { seq, count } => {
                self.carrier = Some((*seq, (*count).min(self.dropped)));
            }
            Rec::Alive { ns } => self.last_alive_ns = Some(*ns),
            Rec::DroppedReported { count } => self.dropped_reported(*count),
            Rec::Meta {
                next_seq,
                dropped,
                last_alive_ns,
                carrier,
            } => {
                self.next_seq = self.next_seq.max(*next_seq);
                self.dropped = *dropped;
                self.last_alive_ns = *last_alive_ns;
                self.carrier = *carrier;
            }
            Rec::DropOldest { through_seq } => self.drop_through(*through_seq),
            Rec::JournalId { id } => self.journal_id = Some((*id).to_owned()),
            // Never lowered: the fence only rises.
            Rec::SessionGen { generation } => {
                self.session_gen = self.session_gen.max(*generation);
            }
        }
    }
}

fn shrink_if_sparse<V>(m: &mut IdMap<V>) {
    if m.capacity() > 4 * m.len().max(256) {
        m.shrink_to(2 * m.len());
    }
}
