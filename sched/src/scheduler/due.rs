//! What an occurrence does when its instant comes: fire, fire late, or —
//! past `max_lateness`, after a restart or a clock step — count as a gap
//! that `catch_up` decides (see `crate::catchup`); and how journal records
//! from before a restart resolve an occurrence instead.

use std::collections::BTreeSet;
use std::ops::Bound;
use std::sync::Arc;

use baton_proto::RefTime;
use baton_proto::pack::{CatchUp, Schedule};

use super::{
    Attempt, EntryKind, Occurrence, PRUNE_MARGIN, Replay, Scheduler, Status, fmt_d, just_before,
};
use crate::catchup::{occurrences_between, plan, releases};
use crate::id::ExecutionId;
use crate::once::{OnceKind, PriorOutcome};
use crate::output::{EventKind, Firing, Output, Reason};

/// Missed occurrences of one instruction: those strictly between `after`
/// and `before`. `covered`: an occurrence later than the gap fires now
/// anyway (see `catchup::plan`).
#[derive(Clone, Copy, Debug)]
struct Gap {
    after: RefTime,
    before: RefTime,
    covered: bool,
}

fn mode(c: CatchUp) -> &'static str {
    match c {
        CatchUp::None => "none",
        CatchUp::Last => "last",
        CatchUp::All => "all",
    }
}

impl Scheduler {
    /// Occurrence `occ` of instruction `i` is due (`release`: when it was
    /// queued for; for `after` rounds possibly later than `occ`).
    pub(super) fn occurrence_due(
        &mut self,
        o: Occurrence,
        release: RefTime,
        now: RefTime,
        out: &mut Vec<Output>,
    ) {
        let Some(ps) = self.packs[o.slot].as_ref() else {
            return;
        };
        if ps.pack.instructions[o.instr].schedule.is_repeating() {
            self.repeating_due(o, now, out);
        } else {
            self.one_shot_due(o, release, now, out);
        }
    }

    /// `at` and `after` rounds: one occurrence, fired once if within
    /// `max_lateness` of its release, else missed (the failure path).
    fn one_shot_due(
        &mut self,
        o: Occurrence,
        release: RefTime,
        now: RefTime,
        out: &mut Vec<Output>,
    ) {
        let Occurrence {
            slot,
            instr: i,
            at: occ,
        } = o;
        let Some(ps) = self.packs[slot].as_ref() else {
            return;
        };
        if ps.ins[i].done || self.resolve_prior(o, now, out) {
            return;
        }
        let Some(ps) = self.packs[slot].as_mut() else {
            return;
        };
        // After a restart, a round planned while the agent was still up was
        // handled then; without a journal record it is settled.
        if ps.resumed.is_some_and(|alive| occ <= alive) {
            ps.ins[i].done = true;
            return;
        }
        let max_late = ps.pack.instructions[i].policy.max_lateness;
        if now.since(release) > max_late {
            let detail = format!(
                "missed: late by {} (max_lateness {})",
                fmt_d(now.since(occ)),
                fmt_d(max_late)
            );
            // Named by the attempt that would have run: the report carries
            // an execution id and its occurrence like any other give-up.
            let id = Some(self.make_id(slot, i, occ, 1));
            self.give_up(o, id, (Reason::Late, detail), now, out);
            return;
        }
        let id = self.make_id(slot, i, occ, 1);
        self.fire(o, id, occ, release, now, out);
    }

    /// A repeating occurrence: on time or late within `max_lateness`, it
    /// fires and the next one is queued; later than that, everything up to
    /// `now - max_lateness` is a gap for `catch_up`.
    fn repeating_due(&mut self, o: Occurrence, now: RefTime, out: &mut Vec<Output>) {
        let Occurrence {
            slot,
            instr: i,
            at: occ,
        } = o;
        let Some(ps) = self.packs[slot].as_ref() else {
            return;
        };
        let ins = &ps.pack.instructions[i];
        let max_late = ins.policy.max_lateness;
        let lateness = now.since(occ);
        if lateness <= max_late {
            self.schedule_next(slot, i, occ);
            if !self.resolve_prior(o, now, out) {
                let id = self.make_id(slot, i, occ, 1);
                self.fire(o, id, occ, occ, now, out);
            }
            return;
        }
        let bound = now.saturating_sub(max_late);
        let next = ins
            .schedule
            .next_after(&ps.pack.timezone, ps.anchor, just_before(bound));
        let covered = next.is_some_and(|n| n <= now);
        let cause = format!(
            "late by {}, max_lateness {}",
            fmt_d(lateness),
            fmt_d(max_late)
        );
        let cause = (Reason::Late, cause.as_str());
        let gap = Gap {
            after: just_before(occ),
            before: bound,
            covered,
        };
        self.catch_up_gap(slot, i, gap, cause, now, out);
        if let Some(n) = next {
            self.arm_occurrence(slot, i, n, n);
        }
    }

    /// Restart: the occurrences of a repeating instruction between
    /// `alive` and `now` passed while the agent was down.
    pub(super) fn resume_gap(
        &mut self,
        slot: usize,
        i: usize,
        alive: RefTime,
        now: RefTime,
        out: &mut Vec<Output>,
    ) {
        let Some(ps) = self.packs[slot].as_ref() else {
            return;
        };
        if ps.status != Status::Active || !ps.pack.instructions[i].schedule.is_repeating() {
            return;
        }
        let cause = (Reason::CatchUp, "the agent was down");
        let gap = Gap {
            after: alive,
            before: now,
            covered: false,
        };
        self.catch_up_gap(slot, i, gap, cause, now, out);
    }

    /// [`Scheduler::downtime`] for one instruction: its overdue pending
    /// occurrence and those after it, up to `now`, are a gap.
    pub(super) fn gap_until(&mut self, slot: usize, i: usize, now: RefTime, out: &mut Vec<Output>) {
        let Some(ps) = self.packs[slot].as_mut() else {
            return;
        };
        let ins = &ps.pack.instructions[i];
        let Some((timer, occ)) = ps.ins[i].pending.filter(|(_, o)| *o < now) else {
            return;
        };
        if !ins.schedule.is_repeating() {
            return;
        }
        let next = ins
            .schedule
            .next_after(&ps.pack.timezone, ps.anchor, just_before(now));
        ps.ins[i].pending = None;
        self.queue.cancel(timer);
        let cause = (
            Reason::Clock,
            "the core could not act (clock step or stall)",
        );
        let gap = Gap {
            after: just_before(occ),
            before: now,
            covered: false,
        };
        self.catch_up_gap(slot, i, gap, cause, now, out);
        if let Some(n) = next {
            self.arm_occurrence(slot, i, n, n);
        }
    }

    /// Occurrences of instruction `i` in `by` (`ran`: those that started
    /// before a restart; `not_run`: those reported not run), strictly
    /// between `after` and `before`.
    fn between(
        &self,
        by: &super::OccurrencesBy,
        slot: usize,
        i: usize,
        after: RefTime,
        before: RefTime,
    ) -> BTreeSet<RefTime> {
        let Some(ps) = self.packs[slot].as_ref() else {
            return BTreeSet::new();
        };
        if by.is_empty() || after >= before {
            return BTreeSet::new();
        }
        by.get(&ps.ran_key(i)).map_or_else(BTreeSet::new, |s| {
            s.range((Bound::Excluded(after), Bound::Excluded(before)))
                .copied()
                .collect()
        })
    }

    /// The occurrences in `missed` were missed: resolve those with a
    /// journal record, report the dropped ones in one event, and queue the
    /// replays `catch_up` asks for.
    fn catch_up_gap(
        &mut self,
        slot: usize,
        i: usize,
        missed: Gap,
        (why, cause): (Reason, &str),
        now: RefTime,
        out: &mut Vec<Output>,
    ) {
        let Gap {
            after,
            before,
            covered,
        } = missed;
        let ran = self.between(&self.ran, slot, i, after, before);
        let Some(ps) = self.packs[slot].as_ref() else {
            return;
        };
        let ins = &ps.pack.instructions[i];
        let catch_up = ins.policy.catch_up;
        let keep = self.cfg.catch_up_cap.saturating_add(ran.len()).max(1);
        let gap = occurrences_between(
            &ins.schedule,
            &ps.pack.timezone,
            ps.anchor,
            after,
            before,
            keep,
        );
        if gap.count == 0 {
            return;
        }
        let mut plan = plan(catch_up, &gap, &ran, covered, self.cfg.catch_up_cap);
        // Those reported not run before the restart and not replayed now
        // were reported once already.
        let reported = self
            .between(&self.not_run, slot, i, after, before)
            .into_iter()
            .filter(|o| !ran.contains(o) && !plan.replay.contains(o))
            .count() as u64;
        plan.skipped = plan.skipped.saturating_sub(reported);
        if plan.skipped > 0 {
            let detail = format!(
                "missed {} occurrence(s) between {} and {} ({cause}; catch_up {})",
                plan.skipped,
                gap.first.unwrap_or(before),
                gap.last().unwrap_or(before),
                mode(catch_up)
            );
            let ev = EventKind::Skip {
                reason: why,
                detail,
            };
            out.push(self.event(slot, Some(i), None, gap.first, ev, now));
        }
        for occ in ran {
            let o = Occurrence {
                slot,
                instr: i,
                at: occ,
            };
            self.resolve_prior(o, now, out);
        }
        let active = self.packs[slot]
            .as_ref()
            .is_some_and(|p| p.status == Status::Active);
        if active {
            self.arm_replays(slot, i, &plan.replay, now);
        }
    }

    fn arm_replays(&mut self, slot: usize, i: usize, replay: &[RefTime], now: RefTime) {
        for (occ, release) in replay.iter().copied().zip(releases(replay, now)) {
            let timer = self.arm(slot, i, release, EntryKind::CatchUp(occ));
            if let Some(ps) = self.packs[slot].as_mut() {
                ps.ins[i].catching.push(Replay {
                    occ,
                    release,
                    timer,
                });
            }
        }
    }

    /// A replayed missed occurrence is released.
    pub(super) fn replay_due(
        &mut self,
        o: Occurrence,
        release: RefTime,
        now: RefTime,
        out: &mut Vec<Output>,
    ) {
        let Occurrence {
            slot,
            instr: i,
            at: occ,
        } = o;
        let Some(ps) = self.packs[slot].as_ref() else {
            return;
        };
        let max_late = ps.pack.instructions[i].policy.max_lateness;
        if now.since(release) > max_late {
            let detail = format!(
                "catch-up firing reached {} after its release (max_lateness {})",
                fmt_d(now.since(release)),
                fmt_d(max_late)
            );
            out.push(self.event(
                slot,
                Some(i),
                None,
                Some(occ),
                EventKind::Skip {
                    reason: Reason::Late,
                    detail,
                },
                now,
            ));
            return;
        }
        if !self.resolve_prior(o, now, out) {
            let id = self.make_id(slot, i, occ, 1);
            self.fire(o, id, occ, release, now, out);
        }
    }

    fn schedule_next(&mut self, slot: usize, i: usize, after: RefTime) -> Option<RefTime> {
        let ps = self.packs[slot].as_ref()?;
        let next =
            ps.pack.instructions[i]
                .schedule
                .next_after(&ps.pack.timezone, ps.anchor, after)?;
        self.arm_occurrence(slot, i, next, next);
        Some(next)
    }

    /// Attempts of this occurrence known from before a restart: resolve
    /// the occurrence from them instead of firing again. Returns true when
    /// the occurrence is fully handled. A success is settled silently (it
    /// was reported before the restart); an unknown outcome and a give-up
    /// are once-only reports.
    pub(super) fn resolve_prior(
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
        if self.prior.is_empty() {
            return false;
        }
        let max = self.packs[slot]
            .as_ref()
            .map_or(1, |p| p.pack.instructions[i].policy.retry.max_attempts);
        let mut attempt = 1;
        loop {
            let id = self.make_id(slot, i, occ, attempt);
            let outcome = self.prior.get(&id.to_string()).copied();
            if outcome == Some(PriorOutcome::NotRun) && attempt < max {
                // Withdrawn at its timeout, and a retry followed: that
                // retry's record says what happened next.
                let next = self.make_id(slot, i, occ, attempt + 1).to_string();
                if self.prior.contains_key(&next) {
                    attempt += 1;
                    continue;
                }
            }
            match outcome {
                None | Some(PriorOutcome::NotRun) if attempt == 1 => return false,
                None | Some(PriorOutcome::NotRun) => {
                    // Earlier attempts failed before the restart: go on
                    // with the next one, after its backoff from now.
                    let failed = self.make_id(slot, i, occ, attempt - 1);
                    self.schedule_retry(slot, i, failed, Reason::Failed, now, out);
                    return true;
                }
                Some(PriorOutcome::Succeeded) => {
                    self.succeeded(o, None, now, out);
                    return true;
                }
                Some(PriorOutcome::Unknown) => {
                    self.outcome_unknown(slot, i, id, now, out);
                    return true;
                }
                Some(PriorOutcome::Failed) if attempt >= max => {
                    let detail = format!("failed after {attempt} attempt(s) (before the restart)");
                    // Named by its last attempt, like a give-up in one run.
                    let id = Some(id);
                    self.give_up(o, id, (Reason::Failed, detail), now, out);
                    return true;
                }
                Some(PriorOutcome::Failed) => attempt += 1,
            }
        }
    }

    fn outcome_unknown(
        &mut self,
        slot: usize,
        i: usize,
        id: ExecutionId,
        now: RefTime,
        out: &mut Vec<Output>,
    ) {
        let Some(ps) = self.packs[slot].as_mut() else {
            return;
        };
        let occ = id.occurrence;
        if !ps.pack.instructions[i].schedule.is_repeating() {
            ps.ins[i].done = true;
        }
        let key = ps.once(i, occ, OnceKind::OutcomeUnknown);
        let name = ps.pack.instructions[i].id.clone();
        // Reported once: after a later restart the state follows, silently.
        let report = !self.is_done(&key);
        if report {
            let mut ev = self.event(
                slot,
                Some(i),
                Some(id),
                Some(occ),
                EventKind::OutcomeUnknown,
                now,
            );
            if let Output::Event(e) = &mut ev {
                e.once = Some(key);
            }
            out.push(ev);
        }
        // Its dependents cannot know whether their upstream succeeded: they
        // miss this round (the rule in docs/design.md, "Time semantics"), reported once with it.
        let why = (
            Reason::UpstreamUnknown,
            format!("upstream `{name}` started before a crash and its outcome is unknown"),
        );
        self.skip_dependents(slot, i, why, report, now, out);
    }

    pub(super) fn attempt_due(
        &mut self,
        o: Occurrence,
        deadline: RefTime,
        now: RefTime,
        out: &mut Vec<Output>,
    ) {
        let Occurrence {
            slot,
            instr: i,
            at: occ,
        } = o;
        let Some(ps) = self.packs[slot].as_ref() else {
            return;
        };
        // The stored id: a retry keeps the version its occurrence started
        // under, even across a replacement.
        let Some(id) = ps.ins[i].attempts.get(&occ).map(|a| a.id.clone()) else {
            return;
        };
        let max_late = ps.pack.instructions[i].policy.max_lateness;
        let lateness = now.since(deadline);
        if lateness > max_late {
            let detail = format!(
                "retry missed: late by {} (max_lateness {})",
                fmt_d(lateness),
                fmt_d(max_late)
            );
            self.give_up(o, Some(id), (Reason::Late, detail), now, out);
            return;
        }
        self.fire(o, id, deadline, deadline, now, out);
    }

    /// Hand an attempt to the runtime: `scheduled` is the instant it was
    /// planned for (lateness is measured from it), `release` when the core
    /// queued it (the two differ for catch-up replays and late `after`
    /// rounds); the runtime may start it until `max_lateness` after the
    /// later of `release` and `now`. `o` is the occurrence `id` is an
    /// attempt of.
    pub(super) fn fire(
        &mut self,
        o: Occurrence,
        id: ExecutionId,
        scheduled: RefTime,
        release: RefTime,
        now: RefTime,
        out: &mut Vec<Output>,
    ) {
        let (slot, i) = (o.slot, o.instr);
        let (occ, attempt) = (id.occurrence, id.attempt);
        debug_assert_eq!(o.at, occ, "fired as an attempt of another occurrence");
        let o = Occurrence { at: occ, ..o };
        if attempt == 1 && self.claimed_by_older(o, now, out) {
            if let Some(ps) = self.packs[slot].as_mut()
                && !ps.pack.instructions[i].schedule.is_repeating()
            {
                ps.ins[i].done = true;
                ps.ins[i].fired = true;
            }
            return;
        }
        let Some((text, fingerprint)) = self.never_fired(o, &id, now, out) else {
            return;
        };
        let Some(ps) = self.packs[slot].as_ref() else {
            return;
        };
        let ins = &ps.pack.instructions[i];
        let (timeout, max_late) = (ins.policy.timeout, ins.policy.max_lateness);
        self.fired
            .insert(fingerprint, occ.max(now) + max_late + PRUNE_MARGIN);
        // Built per firing rather than kept per instruction: memory stays
        // O(instructions) with a small constant.
        let action = Arc::new(ins.action.clone());
        let timer = Self::enqueue(
            &mut self.queue,
            ps,
            slot,
            i,
            now + timeout,
            EntryKind::Timeout { occ, attempt },
        );
        if let Some(ps) = self.packs[slot].as_mut() {
            let a = Attempt {
                id: id.clone(),
                running: true,
                timer: Some(timer),
                deadline: now + timeout,
                too_late: false,
            };
            ps.ins[i].attempts.insert(occ, a);
            if matches!(ps.pack.instructions[i].schedule, Schedule::At(_)) {
                ps.ins[i].fired = true;
            }
        }
        if self.cfg.routine_events {
            let e = self.event(
                slot,
                Some(i),
                Some(id.clone()),
                Some(occ),
                EventKind::Fire,
                now,
            );
            out.push(e);
        }
        out.push(Output::Fire(Firing {
            id,
            text,
            action,
            scheduled,
            not_after: release.max(now) + max_late,
            timeout,
        }));
    }

    /// Attempt `id` (of occurrence `o`) as text, and the fingerprint the
    /// core keeps of it, when it never fired, in this run or before a
    /// restart. Otherwise it must not fire again (a duplicate delivery or a
    /// bug upstream must not reach the device): the occurrence is reported
    /// skipped, `duplicate` (named, not the attempt: that attempt reports
    /// its own end), and `None` is returned.
    fn never_fired(
        &mut self,
        o: Occurrence,
        id: &ExecutionId,
        now: RefTime,
        out: &mut Vec<Output>,
    ) -> Option<(Arc<str>, u64)> {
        // Formatted into a kept buffer, then copied once into the shared
        // text (`to_string` grew a fresh string a few times per firing).
        self.id_buf.clear();
        let _ = std::fmt::Write::write_fmt(&mut self.id_buf, format_args!("{id}"));
        let text: Arc<str> = Arc::from(self.id_buf.as_str());
        let ran_before = self
            .prior
            .get(&*text)
            .is_some_and(|o| *o != PriorOutcome::NotRun);
        let fingerprint = super::print(&text);
        if !self.fired.contains_key(&fingerprint) && !ran_before {
            return Some((text, fingerprint));
        }
        let detail = format!("already fired as {id}: not fired again");
        out.push(self.event(
            o.slot,
            Some(o.instr),
            None,
            Some(o.at),
            EventKind::Skip {
                reason: Reason::Duplicate,
                detail,
            },
            now,
        ));
        None
    }
}
