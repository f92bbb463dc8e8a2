//! Time passing: what comes due in the queue by `now` (occurrences,
//! catch-up replays, retries, timeouts) handed to the part that decides
//! it, timeouts taken early put back, and the id records pruned.

use std::time::Duration;

use baton_proto::RefTime;
use baton_proto::pack::Action;

use super::{
    AttemptResult, Entry, EntryKind, Occurrence, PRIOR_KEEP, PRUNE_EVERY, Scheduler, Status, fmt_d,
    tiebreak,
};
use crate::id::ExecutionId;
use crate::output::{EventKind, Output, Reason};
use crate::outputs::Outputs;
use crate::timing::TimerId;

impl Scheduler {
    /// Handle everything due at or before `now`, in one order whatever
    /// span the call covers: due instant (for a catch-up replay, its
    /// release), then priority (higher first), then pack order (first
    /// acceptance), then instruction order in the pack.
    pub fn tick(&mut self, now: RefTime) -> Outputs<'_> {
        self.outputs(|s, out| s.tick_into(now, out))
    }

    fn tick_into(&mut self, now: RefTime, out: &mut Vec<Output>) {
        while let Some((deadline, timer, entry)) = self.queue.pop_due(now.as_nanos()) {
            let at = RefTime::from_nanos(deadline);
            if let Some(entry) = self.hold_at_fence(at, timer, entry) {
                self.handle_entry(at, timer, entry, now, out);
            }
        }
        self.prune_if_due(now);
    }

    /// [`Scheduler::tick`] for a runtime that arms firings ahead: handle
    /// what is due by `now`, and also the firings that fall due within
    /// `horizon` after it, each decided as of its own instant — a firing
    /// armed 50 ms early is on time, not 50 ms late (ticking at `now +
    /// horizon` made every occurrence look late by up to the horizon, and a
    /// `max_lateness` below it skipped them all). Timeouts are not taken
    /// ahead: one expires only once `now` reaches it, so an attempt is never
    /// declared timed out (and retried beside itself) before its result
    /// could have arrived. Nothing past a pack's fence is armed, whatever
    /// the horizon ([`Scheduler::switch_fence`]).
    pub fn tick_ahead(&mut self, now: RefTime, horizon: Duration) -> Outputs<'_> {
        self.outputs(|s, out| s.tick_ahead_into(now, horizon, out))
    }

    fn tick_ahead_into(&mut self, now: RefTime, horizon: Duration, out: &mut Vec<Output>) {
        let limit = now + horizon;
        let mut later = Vec::new();
        while let Some((deadline, timer, entry)) = self.queue.pop_due(limit.as_nanos()) {
            let at = RefTime::from_nanos(deadline);
            let Some(entry) = self.hold_at_fence(at, timer, entry) else {
                continue;
            };
            if at > now
                && matches!(
                    entry.kind,
                    EntryKind::Timeout { .. } | EntryKind::Detached(_)
                )
            {
                later.push((deadline, entry));
                continue;
            }
            self.handle_entry(at, timer, entry, now.max(at), out);
        }
        for (deadline, entry) in later {
            self.requeue_timeout(deadline, entry);
        }
        self.prune_if_due(now);
    }

    /// Forgets what only guards against repeats long past, at most once
    /// per `PRUNE_EVERY`. [`Self::tick`] and [`Self::tick_ahead`] do it; a
    /// caller that ticks only when an entry is due calls this on its
    /// heartbeat too, so that memory follows the retained set down while
    /// nothing is due (after a burst, once every pack is done).
    pub fn prune_if_due(&mut self, now: RefTime) {
        if now > self.last_prune + PRUNE_EVERY {
            self.last_prune = now;
            self.prune(now);
        }
    }

    fn prune(&mut self, now: RefTime) {
        self.fired.retain(|_, expiry| *expiry > now);
        let horizon = now.saturating_sub(PRIOR_KEEP);
        self.prior
            .retain(|id, _| ExecutionId::parse(id).is_none_or(|e| e.occurrence > horizon));
        for by in [&mut self.ran, &mut self.not_run] {
            by.retain(|_, occs| {
                occs.retain(|o| *o > horizon);
                !occs.is_empty()
            });
        }
        // A claim on an occurrence the newer version never reaches (its
        // schedule changed) would stay forever.
        self.claimed.retain(|(_, _, occ), _| *occ > horizon);
        self.shots.retain(|_, at| {
            at.retain(|t| *t > horizon);
            !at.is_empty()
        });
        // A burst (catch-up, many packs at once) must not pin its peak.
        if self.fired.capacity() > 4 * self.fired.len().max(256) {
            self.fired.shrink_to_fit();
        }
        if self.prior.capacity() > 4 * self.prior.len().max(256) {
            self.prior.shrink_to_fit();
        }
    }

    fn handle_entry(
        &mut self,
        deadline: RefTime,
        timer: TimerId,
        e: Entry,
        now: RefTime,
        out: &mut Vec<Output>,
    ) {
        if let EntryKind::Detached(id) = e.kind {
            if self.detached.remove(&*id).is_some() {
                out.push(Output::Abort((*id).clone()));
                let timed_out = AttemptResult::Failed("timed out".into());
                self.end_detached(&id, timed_out, Some(Reason::Timeout), now, out);
            }
            return;
        }
        let Some(ps) = self.packs.get_mut(e.slot).and_then(|p| p.as_mut()) else {
            return;
        };
        if ps.generation != e.generation {
            return;
        }
        let active = ps.status == Status::Active;
        let st = &mut ps.ins[e.instr];
        match e.kind {
            EntryKind::Occurrence(occ) => {
                if st.pending.is_some_and(|(t, _)| t == timer) {
                    st.pending = None;
                }
                if active {
                    self.occurrence_due(e.occurrence(occ), deadline, now, out);
                }
            }
            EntryKind::CatchUp(occ) => {
                st.catching.retain(|r| r.timer != Some(timer));
                st.release_empty();
                if active {
                    self.replay_due(e.occurrence(occ), deadline, now, out);
                }
            }
            EntryKind::Retry { occ, attempt } => {
                let live = st
                    .attempts
                    .get(&occ)
                    .is_some_and(|a| a.id.attempt == attempt && !a.running);
                if live && active {
                    if let Some(a) = st.attempts.get_mut(&occ) {
                        a.timer = None;
                    }
                    self.attempt_due(e.occurrence(occ), deadline, now, out);
                }
            }
            EntryKind::Detached(_) => {}
            EntryKind::Timeout { occ, attempt } => {
                self.timeout_due(e.occurrence(occ), attempt, now, out);
            }
        }
    }

    /// Put back a timeout [`Scheduler::tick_ahead`] took early, and point
    /// its attempt at the new timer (so a result still cancels it).
    fn requeue_timeout(&mut self, deadline: i64, e: Entry) {
        let (slot, instr) = (e.slot, e.instr);
        match &e.kind {
            EntryKind::Detached(id) => {
                let id = (**id).clone();
                let timer = self.queue.insert_with_tiebreak(deadline, 0, e);
                if let Some(t) = self.detached.get_mut(&id) {
                    *t = Some(timer);
                }
            }
            EntryKind::Timeout { occ, attempt } => {
                let (occ, attempt) = (*occ, *attempt);
                let Some(ps) = self.packs.get(slot).and_then(|p| p.as_ref()) else {
                    return;
                };
                let timer = self
                    .queue
                    .insert_with_tiebreak(deadline, tiebreak(ps, slot, instr), e);
                if let Some(a) = self.packs[slot]
                    .as_mut()
                    .and_then(|ps| ps.ins[instr].attempts.get_mut(&occ))
                    .filter(|a| a.id.attempt == attempt)
                {
                    a.timer = Some(timer);
                }
            }
            _ => {}
        }
    }

    fn timeout_due(&mut self, o: Occurrence, attempt: u32, now: RefTime, out: &mut Vec<Output>) {
        let Occurrence {
            slot,
            instr: i,
            at: occ,
        } = o;
        let Some(ps) = self.packs[slot].as_ref() else {
            return;
        };
        let Some(a) = ps.ins[i].attempts.get(&occ) else {
            return;
        };
        if a.id.attempt != attempt || !a.running {
            return;
        }
        let (id, too_late) = (a.id.clone(), a.too_late);
        let active = ps.status == Status::Active;
        let ins = &ps.pack.instructions[i];
        let timeout = ins.policy.timeout;
        if too_late {
            // Its device call has not returned one more timeout after it
            // could not be withdrawn: ended, outcome unknown, never retried
            // (the call may still reach the device).
            let detail = format!(
                "the device call did not return within {} after its timeout: outcome unknown, not retried",
                fmt_d(timeout)
            );
            out.push(Output::Abort(id.clone()));
            let failed = AttemptResult::Failed(detail.clone());
            if active {
                let fail = EventKind::Fail {
                    reason: Some(Reason::Timeout),
                    detail: detail.clone(),
                };
                out.push(self.attempt_event(o, &id, fail, now));
                self.give_up(o, Some(id), (Reason::Timeout, detail), now, out);
            } else {
                // In its safe state already: ended, nothing retried.
                self.finish_attempt(o, &id, failed, Some(Reason::Timeout), now, out);
            }
            return;
        }
        if !matches!(ins.action, Action::Exec { .. }) {
            // A device attempt cannot be killed, only kept from starting:
            // the runtime withdraws it if it can, and a retry follows only
            // then (`withdrawal`); one that started is the occurrence's
            // execution and its own result decides. Never two of one
            // occurrence on the device.
            if let Some(a) = self.packs[slot]
                .as_mut()
                .and_then(|p| p.ins[i].attempts.get_mut(&occ))
            {
                a.timer = None;
            }
            out.push(Output::Withdraw {
                id,
                reason: Reason::Timeout,
            });
            return;
        }
        let reason = format!("timed out after {}", fmt_d(timeout));
        out.push(Output::Abort(id.clone()));
        let (result, fail) = (AttemptResult::Failed(reason), Some(Reason::Timeout));
        self.finish_attempt(o, &id, result, fail, now, out);
    }
}
