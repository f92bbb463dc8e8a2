//! The journal's live state: what replaying the log yields. The log is the
//! truth; this is its fold, kept in memory because the agent asks it on
//! every firing ("has this id started?") and it is bounded (see the module
//! docs of [`crate::journal`]).

use std::collections::{BTreeMap, HashMap, VecDeque};

use super::packed::PackedPack;
use super::record::Rec;

#[derive(Debug, Default)]
pub(crate) struct State {
    /// Keyed by (tenant, pack).
    pub(crate) packs: BTreeMap<(String, String), PackedPack>,
    /// Execution id → scheduled reference time.
    pub(crate) started: HashMap<String, i64>,
    /// Execution id → reference time that dates the result.
    pub(crate) finished: HashMap<String, i64>,
    /// Unacknowledged feedback, in seq order.
    pub(crate) outbox: VecDeque<(u64, Vec<u8>)>,
    /// The seq the next pushed feedback gets; seqs start at 1 so that 0 can
    /// mean "nothing acknowledged yet" on the wire.
    pub(crate) next_seq: u64,
    /// Outbox entries dropped because of the cap and not yet reported.
    pub(crate) dropped: u64,
    pub(crate) last_alive_ns: Option<i64>,
    /// Latest scheduled time among started ids (fallback clock, see
    /// [`State::reference_now`]).
    pub(crate) max_started_ns: Option<i64>,
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
    /// journal never reads a clock (DESIGN.md principle 1).
    pub(crate) fn reference_now(&self) -> Option<i64> {
        self.last_alive_ns.or(self.max_started_ns)
    }

    /// Drops outbox entries with seq <= `through`, counting them as dropped.
    fn drop_through(&mut self, through: u64) {
        while self.outbox.front().is_some_and(|(s, _)| *s <= through) {
            self.outbox.pop_front();
            self.dropped = self.dropped.saturating_add(1);
        }
    }

    pub(crate) fn apply(&mut self, rec: &Rec<'_>) {
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
            } => {
                if let Some(p) = self
                    .packs
                    .get_mut(&((*tenant).to_owned(), (*pack).to_owned()))
                    .filter(|p| p.version == *version)
                {
                    p.stopped = Some((*reason).to_owned());
                }
            }
            Rec::RemovePack { tenant, pack } => {
                self.packs
                    .remove(&((*tenant).to_owned(), (*pack).to_owned()));
            }
            Rec::Started(ids) => {
                for (id, ns) in ids.as_slice() {
                    self.started.insert((*id).to_owned(), *ns);
                    self.max_started_ns = Some(self.max_started_ns.map_or(*ns, |m| m.max(*ns)));
                }
            }
            Rec::Finished { id, ref_ns } => {
                self.finished.insert((*id).to_owned(), *ref_ns);
            }
            Rec::Push {
                seq,
                dropped_through,
                record,
            } => {
                self.drop_through(*dropped_through);
                self.outbox.push_back((*seq, record.to_vec()));
                self.next_seq = self.next_seq.max(seq.saturating_add(1));
            }
            Rec::Ack { up_to_seq } => {
                while self.outbox.front().is_some_and(|(s, _)| s <= up_to_seq) {
                    self.outbox.pop_front();
                }
            }
            Rec::Alive { ns } => self.last_alive_ns = Some(*ns),
            Rec::DroppedReported { count } => self.dropped = self.dropped.saturating_sub(*count),
            Rec::Meta {
                next_seq,
                dropped,
                last_alive_ns,
            } => {
                self.next_seq = self.next_seq.max(*next_seq);
                self.dropped = *dropped;
                self.last_alive_ns = *last_alive_ns;
            }
            Rec::DropOldest { through_seq } => self.drop_through(*through_seq),
        }
    }
}
