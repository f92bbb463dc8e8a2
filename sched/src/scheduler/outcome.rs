//! How attempts end and what follows: retries, dependents released,
//! give-ups (with their once-only outputs), skipped dependents, the safe
//! state.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use baton_proto::RefTime;
use baton_proto::pack::{OnGiveUp, Schedule, upstream};
use rand::Rng;

use super::{Attempt, AttemptResult, EntryKind, Occurrence, PackState, Scheduler, Status, fmt_d};
use crate::id::ExecutionId;
use crate::once::{OnceKey, OnceKind};
use crate::output::{Event, EventKind, Output, Reason, SafeReason, Withdrawal};
use crate::outputs::Outputs;

impl Scheduler {
    /// Report how an attempt ended. Results for attempts the core no longer
    /// waits for (timed out, replaced version) are ignored.
    pub fn attempt_result(
        &mut self,
        id: &ExecutionId,
        result: AttemptResult,
        now: RefTime,
    ) -> Outputs<'_> {
        self.outputs(|s, out| s.attempt_result_into(id, result, now, out))
    }

    fn attempt_result_into(
        &mut self,
        id: &ExecutionId,
        result: AttemptResult,
        now: RefTime,
        out: &mut Vec<Output>,
    ) {
        if let Some(timer) = self.detached.remove(id) {
            if let Some(t) = timer {
                self.queue.cancel(t);
            }
            self.end_detached(id, result, None, now, out);
            return;
        }
        let Some(o) = self.running_attempt(id) else {
            return;
        };
        self.finish_attempt(o, id, result, None, now, out);
    }

    /// The occurrence attempt `id` runs for, while the core still waits
    /// for its result; `None` once it ended, or for an attempt of a pack
    /// or instruction no longer held.
    fn running_attempt(&self, id: &ExecutionId) -> Option<Occurrence> {
        let &slot = self.by_key.get(&id.pack)?;
        let ps = self.packs[slot].as_ref()?;
        let i = ps.position(&id.instruction)?;
        ps.ins[i]
            .attempts
            .get(&id.occurrence)
            .is_some_and(|a| a.running && a.id == *id)
            .then_some(Occurrence {
                slot,
                instr: i,
                at: id.occurrence,
            })
    }

    /// A device attempt past its timeout that the runtime could not
    /// withdraw: its own result decides if it comes within one more
    /// timeout; if not, [`Scheduler::timeout_due`] ends it (a device call
    /// that hangs must not leave the occurrence open for ever). Never
    /// retried: the call may still reach the device.
    fn await_result(&mut self, id: &ExecutionId, now: RefTime) {
        let Some(o) = self.running_attempt(id) else {
            return;
        };
        let Some(ps) = self.packs[o.slot].as_mut() else {
            return;
        };
        let at = now + ps.pack.instructions[o.instr].policy.timeout;
        let kind = EntryKind::Timeout {
            occ: o.at,
            attempt: id.attempt,
        };
        let timer = Self::enqueue(&mut self.queue, ps, o.slot, o.instr, at, kind);
        if let Some(a) = ps.ins[o.instr].attempts.get_mut(&o.at) {
            if let Some(old) = a.timer.replace(timer) {
                self.queue.cancel(old);
            }
            a.deadline = at;
            a.too_late = true;
        }
    }

    /// The runtime's answer to an [`Output::Withdraw`] of attempt `id`.
    ///
    /// - An attempt of a replaced version: withdrawn, the occurrence is the
    ///   newer version's to fire (if it still has it); too late, the old
    ///   attempt is the occurrence's one execution (its result is reported
    ///   as it comes) and the newer version reports its own not run.
    /// - A timed-out attempt of the held version: withdrawn, it failed by
    ///   its timeout without touching the device, and a retry follows as
    ///   for any failure; too late, it is running and its own result
    ///   decides (nothing runs beside it).
    pub fn withdrawal(
        &mut self,
        id: &ExecutionId,
        answer: Withdrawal,
        now: RefTime,
    ) -> Outputs<'_> {
        self.outputs(|s, out| s.withdrawal_into(id, answer, now, out))
    }

    fn withdrawal_into(
        &mut self,
        id: &ExecutionId,
        answer: Withdrawal,
        now: RefTime,
        out: &mut Vec<Output>,
    ) {
        if let Some(timer) = self.detached.get(id).copied() {
            if answer == Withdrawal::Withdrawn {
                self.detached.remove(id);
                if let Some(t) = timer {
                    self.queue.cancel(t);
                }
                if let Some(&slot) = self.by_key.get(&id.pack) {
                    let key = (slot, id.instruction.clone(), id.occurrence);
                    self.claimed.remove(&key);
                }
            }
            return;
        }
        if answer == Withdrawal::TooLate {
            self.await_result(id, now);
            return;
        }
        let Some(o) = self.running_attempt(id) else {
            return;
        };
        let Some(ps) = self.packs[o.slot].as_ref() else {
            return;
        };
        let timeout = ps.pack.instructions[o.instr].policy.timeout;
        let detail = format!(
            "timed out after {} before it could start: withdrawn, not run",
            fmt_d(timeout)
        );
        let result = AttemptResult::Failed(detail);
        self.finish_attempt(o, id, result, Some(Reason::Timeout), now, out);
    }

    /// Whether occurrence `occ` of instruction `i` was handed out by a
    /// replaced version that could not withdraw it: then it is reported not
    /// run here (`duplicate`) and true is returned — it must not fire.
    pub(super) fn claimed_by_older(
        &mut self,
        o: Occurrence,
        now: RefTime,
        out: &mut Vec<Output>,
    ) -> bool {
        let Occurrence {
            slot,
            instr: i,
            at: occ,
        } = o;
        if self.claimed.is_empty() {
            return false;
        }
        let Some(ps) = self.packs[slot].as_ref() else {
            return false;
        };
        let key = (slot, ps.pack.instructions[i].id.clone(), occ);
        let Some(version) = self.claimed.remove(&key) else {
            return false;
        };
        let detail = format!(
            "not run: version {version} had already started this occurrence (armed ahead, too late to withdraw); it is the occurrence's one execution"
        );
        let ev = EventKind::Skip {
            reason: Reason::Duplicate,
            detail,
        };
        out.push(self.event(slot, Some(i), None, Some(occ), ev, now));
        true
    }

    /// A detached attempt ended: report it; a failure is not retried.
    /// `fail`: the class of a failure the core itself declared (a timeout).
    pub(super) fn end_detached(
        &mut self,
        id: &ExecutionId,
        result: AttemptResult,
        fail: Option<Reason>,
        now: RefTime,
        out: &mut Vec<Output>,
    ) {
        let ev = |kind| {
            Output::Event(Event {
                t: now,
                pack: id.pack.clone(),
                instruction: Some(id.instruction.clone()),
                id: Some(id.clone()),
                occurrence: Some(id.occurrence),
                kind,
                version: None,
                once: None,
            })
        };
        match result {
            AttemptResult::Ok { value } => {
                if self.cfg.routine_events {
                    out.push(ev(EventKind::Ok { value }));
                }
            }
            AttemptResult::Failed(detail) => {
                out.push(ev(EventKind::Fail {
                    reason: fail,
                    detail,
                }));
                out.push(ev(EventKind::Skip {
                    reason: Reason::Replaced,
                    detail: "no retry: its pack version was replaced or stopped".into(),
                }));
            }
            AttemptResult::Late { .. } => out.push(ev(EventKind::Skip {
                reason: Reason::Late,
                detail: "not run: late, and its pack version was replaced or stopped".into(),
            })),
        }
    }

    /// `fail`: the class of a failure the core itself declared (a timeout).
    /// `o` is the occurrence `id` is an attempt of.
    pub(super) fn finish_attempt(
        &mut self,
        o: Occurrence,
        id: &ExecutionId,
        result: AttemptResult,
        fail: Option<Reason>,
        now: RefTime,
        out: &mut Vec<Output>,
    ) {
        let (slot, i, occ) = (o.slot, o.instr, id.occurrence);
        debug_assert_eq!(o.at, occ, "finished as an attempt of another occurrence");
        let o = Occurrence { at: occ, ..o };
        let Some(ps) = self.packs[slot].as_mut() else {
            return;
        };
        if let Some(a) = ps.ins[i].take_attempt(occ)
            && let Some(t) = a.timer
        {
            self.queue.cancel(t);
        }
        let active = ps.status == Status::Active;
        let repeating = ps.pack.instructions[i].schedule.is_repeating();
        match result {
            AttemptResult::Ok { value } => {
                if self.cfg.routine_events {
                    out.push(self.attempt_event(o, id, EventKind::Ok { value }, now));
                }
                if active {
                    self.succeeded(o, Some(now), now, out);
                }
            }
            AttemptResult::Failed(detail) => {
                out.push(self.attempt_event(
                    o,
                    id,
                    EventKind::Fail {
                        reason: fail,
                        detail,
                    },
                    now,
                ));
                if active {
                    let cause = fail.unwrap_or(Reason::Failed);
                    self.schedule_retry(slot, i, id.clone(), cause, now, out);
                } else {
                    out.push(self.attempt_event(
                        o,
                        id,
                        EventKind::Skip {
                            reason: Reason::Stopped,
                            detail: "no retry: the pack is in its safe state".into(),
                        },
                        now,
                    ));
                }
            }
            AttemptResult::Late { actual } => {
                let lateness = actual.since(id.occurrence.max(RefTime::from_nanos(0)));
                let detail = format!(
                    "not run: the runtime reached it {} after it was due",
                    fmt_d(lateness)
                );
                if repeating || !active {
                    out.push(self.attempt_event(
                        o,
                        id,
                        EventKind::Skip {
                            reason: Reason::Late,
                            detail,
                        },
                        now,
                    ));
                } else {
                    let id = Some(id.clone());
                    self.give_up(o, id, (Reason::Late, detail), now, out);
                }
            }
        }
    }

    /// An event about attempt `id` of occurrence `o`.
    pub(super) fn attempt_event(
        &self,
        o: Occurrence,
        id: &ExecutionId,
        kind: EventKind,
        now: RefTime,
    ) -> Output {
        self.event(
            o.slot,
            Some(o.instr),
            Some(id.clone()),
            Some(o.at),
            kind,
            now,
        )
    }

    /// After failed attempt number `attempt`: retry with backoff, or give up
    /// (`cause`: the class of the last failure, what a give-up reports).
    pub(super) fn schedule_retry(
        &mut self,
        slot: usize,
        i: usize,
        failed: ExecutionId,
        cause: Reason,
        now: RefTime,
        out: &mut Vec<Output>,
    ) {
        let Some(ps) = self.packs[slot].as_ref() else {
            return;
        };
        let policy = ps.pack.instructions[i].policy.retry;
        let (occ, attempt) = (failed.occurrence, failed.attempt);
        if attempt >= policy.max_attempts {
            let detail = format!("failed after {attempt} attempt(s)");
            let o = Occurrence {
                slot,
                instr: i,
                at: occ,
            };
            self.give_up(o, Some(failed), (cause, detail), now, out);
            return;
        }
        let unit: f64 = self.rng.random();
        let at = now + policy.delay(attempt, unit);
        let next_id = ExecutionId {
            attempt: attempt + 1,
            ..failed.clone()
        };
        let timer = self.arm(
            slot,
            i,
            at,
            EntryKind::Retry {
                occ,
                attempt: attempt + 1,
            },
        );
        if let Some(ps) = self.packs[slot].as_mut() {
            ps.ins[i].attempts.insert(
                occ,
                Attempt {
                    id: next_id,
                    running: false,
                    timer,
                    deadline: at,
                    too_late: false,
                },
            );
        }
        out.push(self.event(
            slot,
            Some(i),
            Some(failed),
            Some(occ),
            EventKind::Retry { at },
            now,
        ));
    }

    /// Occurrence `occ` of `i` succeeded (at `success`; `None`: known
    /// from the journal, time unknown): release dependents whose upstreams
    /// have all succeeded. A dependent's occurrence is its planned instant,
    /// the latest upstream occurrence plus its delay; it is queued for that
    /// instant, or for the success if that came later (a slow action, a
    /// retried upstream), so its `max_lateness` never counts time the
    /// upstream spent — while its reported `scheduled` stays the plan.
    pub(super) fn succeeded(
        &mut self,
        o: Occurrence,
        success: Option<RefTime>,
        now: RefTime,
        out: &mut Vec<Output>,
    ) {
        let Occurrence {
            slot,
            instr: i,
            at: occ,
        } = o;
        let _ = (now, &out);
        let Some(ps) = self.packs[slot].as_mut() else {
            return;
        };
        if !ps.pack.instructions[i].schedule.is_repeating() {
            ps.ins[i].done = true;
        }
        let id = ps.pack.instructions[i].id.clone();
        let deps = ps.deps[i].clone();
        for d in deps {
            let Some(ps) = self.packs[slot].as_mut() else {
                return;
            };
            let ups = upstream(&ps.pack.instructions[d]);
            let st = &mut ps.ins[d];
            for (k, up) in ups.iter().enumerate() {
                if *up == id {
                    st.satisfied[k] = true;
                }
            }
            st.round_occ = Some(st.round_occ.map_or(occ, |r| r.max(occ)));
            if !st.satisfied.iter().all(|s| *s) || st.done {
                continue;
            }
            st.satisfied.iter_mut().for_each(|s| *s = false);
            let round = st.round_occ.take().unwrap_or(occ);
            let Schedule::After { delay, .. } = ps.pack.instructions[d].schedule else {
                continue;
            };
            if st.pending.is_some() {
                // The previous round has not fired yet: coalesce.
                continue;
            }
            let planned = round + delay;
            let release = success.map_or(planned, |s| s.max(planned));
            // Due at once (zero delay, or late): handled by the caller's
            // tick loop on the next pass, or by the next `tick`.
            self.arm_occurrence(slot, d, planned, release);
        }
    }

    /// Occurrence `occ` of `i` gives up: the report, `on_failure`, then
    /// its dependents are skipped (`on_give_up: continue`) or the pack
    /// fails safe. Each once-only output carries its [`OnceKey`]; when the
    /// give-up was journalled before a restart, nothing of it is reported
    /// again (outputs whose own keys are not journalled yet still come),
    /// but the state follows as though it happened. `id`: the attempt it
    /// is reported under; `(reason, detail)`: why it gave up.
    pub(super) fn give_up(
        &mut self,
        o: Occurrence,
        id: Option<ExecutionId>,
        (reason, detail): (Reason, String),
        now: RefTime,
        out: &mut Vec<Output>,
    ) {
        let Occurrence {
            slot,
            instr: i,
            at: occ,
        } = o;
        let Some(ps) = self.packs[slot].as_mut() else {
            return;
        };
        if let Some(a) = ps.ins[i].take_attempt(occ)
            && let Some(t) = a.timer
        {
            self.queue.cancel(t);
        }
        let Some(ps) = self.packs[slot].as_mut() else {
            return;
        };
        if !ps.pack.instructions[i].schedule.is_repeating() {
            ps.ins[i].done = true;
        }
        let ps = &*ps;
        let policy = ps.pack.instructions[i].policy.clone();
        let keys = [OnceKind::GiveUp, OnceKind::OnFailure, OnceKind::SafeState]
            .map(|k| ps.once(i, occ, k));
        let [gave_up, on_failure, safe] = keys;
        let (pack, instruction) = (ps.key.clone(), ps.pack.instructions[i].id.clone());
        let mark = out.len();
        let muted = self.is_done(&gave_up);
        let ev = self.event(
            slot,
            Some(i),
            id,
            Some(occ),
            EventKind::GiveUp { reason, detail },
            now,
        );
        out.push(with_once(ev, gave_up));
        if let Some(action) = policy.on_failure.clone()
            && !self.is_done(&on_failure)
        {
            let ev = self.event(slot, Some(i), None, Some(occ), EventKind::OnFailure, now);
            out.push(with_once(ev, on_failure.clone()));
            out.push(Output::OnFailure {
                pack,
                instruction,
                action: Arc::new(action),
                once: on_failure,
            });
        }
        match policy.on_give_up {
            OnGiveUp::Continue => {
                let from = &self.packs[slot]
                    .as_ref()
                    .map(|p| p.pack.instructions[i].id.clone())
                    .unwrap_or_default();
                let why = (Reason::UpstreamFailed, format!("upstream `{from}` gave up"));
                self.skip_dependents(slot, i, why, true, now, out)
            }
            OnGiveUp::SafeState => self.fail_safe(slot, SafeReason::GiveUp, Some(safe), now, out),
        }
        if muted {
            // Reported before the restart: keep only what carries a key
            // of its own that is not journalled yet.
            let tail = out.split_off(mark);
            out.extend(tail.into_iter().filter(|o| match o {
                Output::Event(e) => e.once.as_ref().is_some_and(|k| !self.is_done(k)),
                _ => true,
            }));
        }
    }

    /// Every instruction downstream of `i` misses this round (`i` gave up
    /// with `on_give_up: continue`, or its outcome is unknown after a
    /// crash), each reported once with `why` (`report`: false when the
    /// report was made before a restart). Downstream of a one-shot there
    /// is no later round: they are finished (not reported again as still
    /// waiting when the pack stops).
    pub(super) fn skip_dependents(
        &mut self,
        slot: usize,
        i: usize,
        (reason, detail): (Reason, String),
        report: bool,
        now: RefTime,
        out: &mut Vec<Output>,
    ) {
        let Some(ps) = self.packs[slot].as_ref() else {
            return;
        };
        let last_round = !ps.pack.instructions[i].schedule.is_repeating();
        let mut seen = HashSet::new();
        let mut queue: VecDeque<usize> = ps.deps[i].iter().copied().collect();
        while let Some(d) = queue.pop_front() {
            if !seen.insert(d) {
                continue;
            }
            let Some(ps) = self.packs[slot].as_mut() else {
                return;
            };
            queue.extend(ps.deps[d].iter().copied());
            let st = &mut ps.ins[d];
            st.satisfied.iter_mut().for_each(|s| *s = false);
            st.round_occ = None;
            if last_round {
                st.done = true;
            }
            if report {
                out.push(self.event(
                    slot,
                    Some(d),
                    None,
                    None,
                    EventKind::Skip {
                        reason,
                        detail: detail.clone(),
                    },
                    now,
                ));
            }
        }
    }

    /// The pack stops: pending firings are skipped (and reported), running
    /// attempts finish but are not retried, and `safe_state` is issued.
    /// `once`: the key of a safe state the core enters on its own (a
    /// give-up); when it was journalled before a restart the state still
    /// stops, but the safe state is not asked for again.
    pub(super) fn fail_safe(
        &mut self,
        slot: usize,
        reason: SafeReason,
        once: Option<OnceKey>,
        now: RefTime,
        out: &mut Vec<Output>,
    ) {
        let Some(mut ps) = self.packs[slot].take() else {
            return;
        };
        if ps.status != Status::Active {
            // Already safe; a cancel of a failed pack still runs safe_state
            // again (idempotent writes) so the operator sees it happen.
            if reason != SafeReason::Cancel {
                self.packs[slot] = Some(ps);
                return;
            }
        }
        ps.status = Status::Stopped(reason);
        // What waited at a fence is pending still: withdrawn and reported
        // below with the rest.
        ps.fence = None;
        let why = format!("pack entered its safe state ({})", reason.as_str());
        let skips = self.withdraw(&mut ps);
        let actions = ps.safe.clone();
        let key = ps.key.clone();
        self.packs[slot] = Some(ps);
        for (i, id, occ) in skips {
            // At shutdown an occurrence not yet due is not missed yet: if the
            // agent stays down past it, the restart reports it as missed
            // during the downtime. Reporting it here too counted it twice.
            if reason == SafeReason::Shutdown && id.is_none() && occ.is_some_and(|o| o > now) {
                continue;
            }
            out.push(self.event(
                slot,
                Some(i),
                id,
                occ,
                EventKind::Skip {
                    reason: reason.reason(),
                    detail: why.clone(),
                },
                now,
            ));
        }
        if once.as_ref().is_some_and(|k| self.is_done(k)) {
            return;
        }
        let ev = self.event(slot, None, None, None, EventKind::SafeState { reason }, now);
        out.push(match once.clone() {
            Some(k) => with_once(ev, k),
            None => ev,
        });
        out.push(Output::SafeState {
            pack: key,
            actions,
            reason,
            once,
        });
    }
}

impl Scheduler {
    /// A stopping pack's waiting work is withdrawn: pending occurrences,
    /// catch-up replays, retries, `after` rounds still waiting on their
    /// upstreams. Running attempts finish (not retried). Returns what to
    /// report skipped.
    fn withdraw(
        &mut self,
        ps: &mut PackState,
    ) -> Vec<(usize, Option<ExecutionId>, Option<RefTime>)> {
        let mut skips = Vec::new();
        for (i, st) in ps.ins.iter_mut().enumerate() {
            let repeating = ps.pack.instructions[i].schedule.is_repeating();
            if let Some((t, occ)) = st.pending.take() {
                self.queue.cancel(t);
                skips.push((i, None, Some(occ)));
            } else if !st.done && st.attempts.is_empty() && !repeating {
                // An `after` instruction still waiting on its upstreams.
                skips.push((i, None, None));
            }
            for r in st.catching.drain(..) {
                if let Some(t) = r.timer {
                    self.queue.cancel(t);
                }
                skips.push((i, None, Some(r.occ)));
            }
            for (occ, a) in st.attempts.iter_mut() {
                if !a.running {
                    if let Some(t) = a.timer.take() {
                        self.queue.cancel(t);
                    }
                    skips.push((i, Some(a.id.clone()), Some(*occ)));
                }
            }
            st.attempts.retain(|_, a| a.running);
            st.release_empty();
            st.done = st.done || !repeating;
        }
        skips
    }
}

/// Mark an event output as once-only.
fn with_once(mut o: Output, key: OnceKey) -> Output {
    if let Output::Event(e) = &mut o {
        e.once = Some(key);
    }
    o
}
