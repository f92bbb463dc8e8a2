//! Switch fences: a pack whose next version is staged to switch at a known
//! instant (`activate: together`) releases none of its held version's
//! occurrences due after that instant. A runtime that arms firings ahead
//! would otherwise have handed them out before the switch came, and a
//! withdrawal can lose to the dispatcher: an old-program stroke after the
//! instant on a line of presses that was promised to change program
//! between two strokes.
//!
//! An occurrence (or catch-up replay) that comes due past the fence is
//! taken out of the queue as it is popped and kept with the fence, so
//! the control loop is not woken for it again. A version that replaces
//! the held one to run now ([`Scheduler::accept`]: a local pack file)
//! keeps the fence: the staged version still switches at the instant.
//! Three things end a fence:
//! - the switch: the version is replaced ([`Scheduler::accept_at`]) and
//!   the fence goes with the old version's state; an unchanged
//!   instruction's held occurrence carries over like any pending one, a
//!   changed one's that was due by the switch is reported not run
//!   (`replaced`): the new version's grid starts after the switch;
//! - a lift ([`Scheduler::switch_fence`] with `None`: the switch was
//!   refused, the stage dropped): what was held goes back into the queue
//!   at its own instant and the next tick decides it as any occurrence
//!   that comes due late (fired late within `max_lateness`, else missed
//!   and `catch_up`), once;
//! - the pack stopping (cancel, lease, clock, give-up, shutdown): held
//!   occurrences are skipped and reported as any pending one.
//!
//! Retries and timeouts of attempts already started are not held. A fence
//! lives in memory only, like the staged version it stands for.

use std::collections::HashSet;

use baton_proto::RefTime;

use super::{Entry, EntryKind, PackState, Scheduler, Status, tiebreak};
use crate::id::PackKey;
use crate::output::{Event, EventKind, Output, Reason};
use crate::timing::TimerId;

/// A pack's fence: nothing of its held version due after `at` is released.
#[derive(Debug)]
pub(super) struct Fence {
    /// The switch instant.
    at: RefTime,
    /// Entries taken out of the queue at the fence, in the order they
    /// came due.
    held: Vec<Held>,
}

impl Fence {
    /// The same instant for the version that replaces this one to run
    /// now: nothing of the old version's held entries (they went with it).
    pub(super) fn carried(&self) -> Fence {
        Fence {
            at: self.at,
            held: Vec::new(),
        }
    }
}

/// A queue entry kept at a fence, with what it needs to go back.
#[derive(Debug)]
struct Held {
    deadline: RefTime,
    /// Its timer when it was popped: it goes back only if its
    /// instruction still points at it (a clock step or a gap may have
    /// re-armed the instruction since).
    timer: TimerId,
    entry: Entry,
}

impl Held {
    /// The occurrence it stands for, if its instruction in `ps` still
    /// waits for it.
    fn live_occurrence(&self, ps: &PackState) -> Option<RefTime> {
        let st = ps.ins.get(self.entry.instr)?;
        match self.entry.kind {
            EntryKind::Occurrence(occ) => st
                .pending
                .filter(|&(t, o)| t == self.timer && o == occ)
                .map(|_| occ),
            EntryKind::CatchUp(occ) => st
                .catching
                .iter()
                .any(|r| r.timer == Some(self.timer))
                .then_some(occ),
            _ => None,
        }
    }
}

impl Scheduler {
    /// Fence the held version of `key` at the instant `at` (`None`: lift
    /// the fence): while set, none of its occurrences or catch-up replays
    /// due after `at` is released, by [`Scheduler::tick`] or
    /// [`Scheduler::tick_ahead`] whatever the horizon; they wait in the
    /// core (see the module's doc). A runtime sets it when it stages a
    /// version to switch at `at`, moves it when the stage is named again,
    /// and lifts it when the staged version goes without switching: what
    /// was held is then released on the next tick as any occurrence that
    /// comes due late. The switch (replacing the version as of the
    /// instant), cancelling or stopping the pack ends the fence with the
    /// version; a version accepted to run now in its place keeps it.
    /// Nothing happens for a pack not held or not active.
    pub fn switch_fence(&mut self, key: &PackKey, at: Option<RefTime>) {
        let Some(&slot) = self.by_key.get(key) else {
            return;
        };
        let Some(ps) = self.packs[slot].as_mut() else {
            return;
        };
        let next = at.filter(|_| ps.status == Status::Active).map(|at| Fence {
            at,
            held: Vec::new(),
        });
        // Moved or lifted: everything held goes back; what is still past
        // a moved fence is held again as it comes due.
        if let Some(old) = std::mem::replace(&mut ps.fence, next) {
            self.release_held(slot, old.held);
        }
    }

    /// The instant the pack's held version is fenced at, if any.
    pub fn switch_fence_at(&self, key: &PackKey) -> Option<RefTime> {
        let ps = self.packs[*self.by_key.get(key)?].as_ref()?;
        ps.fence.as_ref().map(|f| f.at)
    }

    /// An entry popped from the queue, due at `deadline`: kept at its
    /// pack's fence if it is an occurrence or a replay due after it
    /// (`None` then), else handed back to be decided.
    pub(super) fn hold_at_fence(
        &mut self,
        deadline: RefTime,
        timer: TimerId,
        entry: Entry,
    ) -> Option<Entry> {
        if !matches!(entry.kind, EntryKind::Occurrence(_) | EntryKind::CatchUp(_)) {
            return Some(entry);
        }
        let Some(ps) = self.packs.get_mut(entry.slot).and_then(|p| p.as_mut()) else {
            return Some(entry);
        };
        let Some(fence) = ps.fence.as_mut() else {
            return Some(entry);
        };
        if ps.generation != entry.generation || deadline <= fence.at {
            return Some(entry);
        }
        fence.held.push(Held {
            deadline,
            timer,
            entry,
        });
        None
    }

    /// Put held entries back into the queue at their own instants, and
    /// point their instructions at the new timers.
    fn release_held(&mut self, slot: usize, held: Vec<Held>) {
        for h in held {
            let Some(ps) = self.packs[slot].as_ref() else {
                return;
            };
            if h.live_occurrence(ps).is_none() {
                continue;
            }
            let (i, old) = (h.entry.instr, h.timer);
            let order = tiebreak(ps, slot, i);
            let timer = self
                .queue
                .insert_with_tiebreak(h.deadline.as_nanos(), order, h.entry);
            let Some(st) = self.packs[slot].as_mut().map(|ps| &mut ps.ins[i]) else {
                continue;
            };
            if let Some(p) = st.pending.as_mut().filter(|(t, _)| *t == old) {
                p.0 = timer;
            }
            for r in st.catching.iter_mut().filter(|r| r.timer == Some(old)) {
                r.timer = Some(timer);
            }
        }
    }

    /// The switch replaced a fenced version: each occurrence it held that
    /// was due by `now`, of an instruction whose state did not carry over
    /// (`carried_old`), would have fired under it; the new version's grid
    /// starts after the switch, so it is reported not run (`replaced`).
    pub(super) fn report_held(
        old: &PackState,
        carried_old: &HashSet<usize>,
        new_version: u64,
        now: RefTime,
        out: &mut Vec<Output>,
    ) -> Vec<(String, RefTime)> {
        let mut reported = Vec::new();
        let Some(fence) = old.fence.as_ref() else {
            return reported;
        };
        for h in &fence.held {
            if h.deadline > now || carried_old.contains(&h.entry.instr) {
                continue;
            }
            let Some(occ) = h.live_occurrence(old) else {
                continue;
            };
            let detail = format!(
                "not run: held past the switch instant {} and version {new_version} replaced the pack (its schedule starts after the switch)",
                fence.at
            );
            let instruction = old.pack.instructions[h.entry.instr].id.clone();
            reported.push((instruction.clone(), occ));
            out.push(Output::Event(Event {
                t: now,
                pack: old.key.clone(),
                instruction: Some(instruction),
                id: None,
                occurrence: Some(occ),
                version: Some(old.pack.version),
                kind: EventKind::Skip {
                    reason: Reason::Replaced,
                    detail,
                },
                once: None,
            }));
        }
        reported
    }
}
