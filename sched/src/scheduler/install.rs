//! Taking a pack: the version decision, carrying state over from the
//! replaced version, settling one-shots, first occurrences.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use baton_proto::RefTime;
use baton_proto::pack::{Instruction, Pack, Schedule, dependents, upstream};
use jiff::tz::TimeZone;

use super::fence::Fence;
use super::{
    AcceptError, Accepted, EntryKind, InstrState, PackState, Scheduler, Status, just_before,
};
use crate::id::PackKey;
use crate::output::{Event, EventKind, Output, Reason, SafeReason};

/// What to do with an offered version, given what is held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Take {
    /// Older than the held version `.0`: refused.
    Older(u64),
    /// Same version, still meaningful: nothing changes.
    Unchanged,
    /// Install it.
    Install(Accepted),
}

/// Versions only go up; the same version again is a no-op, unless the held
/// one was stopped by a cancel or a lease loss (then it runs again).
fn version_decision(held: Option<(u64, Status)>, offered: u64) -> Take {
    let Some((v, status)) = held else {
        return Take::Install(Accepted::New);
    };
    let reinstall_same = matches!(
        status,
        Status::Stopped(SafeReason::Cancel | SafeReason::LeaseLost | SafeReason::ClockLost)
    );
    if offered < v {
        Take::Older(v)
    } else if offered > v {
        Take::Install(Accepted::Replaced { from: v })
    } else if reinstall_same {
        Take::Install(Accepted::New)
    } else {
        Take::Unchanged
    }
}

/// What an instruction of the new version takes from the replaced one.
#[derive(Debug, Default)]
struct Carried {
    /// Per new instruction: its next occurrence under the old version.
    next: Vec<Option<RefTime>>,
    /// Per new instruction that changed (a repeating one): it starts after
    /// this instant (the replacement's). What the old version handed out
    /// ahead is asked back (`detach_old`): the occurrences it gives back
    /// fire under the new version, the others stay the old one's.
    floor: Vec<Option<RefTime>>,
    /// Per new instruction: its state came over from the old version.
    kept: Vec<bool>,
    /// Old instructions whose state moved over.
    old: HashSet<usize>,
}

/// Carry the state of unchanged instructions (same id, action and schedule)
/// over from an active replaced version (a stopped one only sets floors):
/// a one-shot that already fired does not fire again, an unchanged periodic
/// keeps its next occurrence, its retries and its catch-up replays.
fn carry_over(old: Option<&PackState>, ps: &mut PackState, now: RefTime) -> Carried {
    let mut c = Carried {
        next: vec![None; ps.ins.len()],
        floor: vec![None; ps.ins.len()],
        kept: vec![false; ps.ins.len()],
        old: HashSet::new(),
    };
    let Some(o) = old else {
        return c;
    };
    if o.status != Status::Active {
        // A stopped version carries nothing over, but it may have run an
        // occurrence at this very instant (its result already in): a
        // repeating instruction it also had starts after now, as a changed
        // one does. One-shots are settled by `settle_one_shots`/`shots_of`.
        for (i, ins) in ps.pack.instructions.iter().enumerate() {
            if o.position(&ins.id).is_some() {
                c.floor[i] = Some(now);
            }
        }
        return c;
    }
    for (i, ins) in ps.pack.instructions.iter().enumerate() {
        let Some(j) = o.position(&ins.id) else {
            continue;
        };
        let prev = &o.pack.instructions[j];
        if prev.action != ins.action || prev.schedule != ins.schedule {
            // Its old attempts are asked back (`detach_old`). A repeating
            // one starts after now: an occurrence of the old version at or
            // before now may have run.
            c.floor[i] = Some(now);
            continue;
        }
        let st = &o.ins[j];
        c.old.insert(j);
        c.kept[i] = true;
        let new = &mut ps.ins[i];
        new.done = st.done || (!ins.schedule.is_repeating() && !st.attempts.is_empty());
        new.fired = st.fired;
        new.satisfied = st.satisfied.clone();
        new.round_occ = st.round_occ;
        new.attempts = st.attempts.clone();
        new.catching = st.catching.clone();
        c.next[i] = st.pending.map(|(_, occ)| occ);
    }
    c
}

/// What one install is, the same for each of its instructions' first
/// occurrences.
#[derive(Clone, Copy, Debug)]
struct Installing {
    /// The phase of `every` schedules without `start_at`.
    anchor: RefTime,
    /// A version was replaced: a changed instruction starts from `now`
    /// (nothing before the replacement is "missed").
    replaced: bool,
    /// A restart: repeating occurrences before `now` are the gap's
    /// business (see `restore`).
    resumed: bool,
    /// When the install happens.
    now: RefTime,
}

/// The first occurrence an instruction waits for after an install.
///
/// `carried`: its next occurrence under a replaced version;
/// `replaced_floor`: the last occurrence its old version still has in
/// flight (a repeating one starts after it: a toggle armed under both
/// versions at one instant would cancel itself).
fn first_occurrence(
    ins: &Instruction,
    st: &InstrState,
    tz: &TimeZone,
    how: Installing,
    carried: Option<RefTime>,
    replaced_floor: Option<RefTime>,
) -> Option<RefTime> {
    let Installing {
        anchor,
        replaced,
        resumed,
        now,
    } = how;
    match &ins.schedule {
        _ if st.done => None,
        Schedule::At(t) => Some(*t),
        Schedule::After { .. } => carried,
        s @ (Schedule::Every { start_at, .. } | Schedule::Cron { start_at, .. }) => {
            let mut after = just_before(start_at.unwrap_or(anchor));
            if let Some(occ) = carried {
                after = after.max(just_before(occ));
            } else if replaced {
                after = after.max(just_before(now));
                if let Some(f) = replaced_floor {
                    after = after.max(f);
                }
            }
            if resumed {
                after = after.max(just_before(now));
            }
            s.next_after(tz, anchor, after)
        }
    }
}

/// [`first_occurrence`] of each instruction of `ps`.
fn first_occurrences(ps: &PackState, how: Installing, carried: &Carried) -> Vec<Option<RefTime>> {
    (0..ps.ins.len())
        .map(|i| {
            first_occurrence(
                &ps.pack.instructions[i],
                &ps.ins[i],
                &ps.pack.timezone,
                how,
                carried.next[i],
                carried.floor[i],
            )
        })
        .collect()
}

/// The occurrences a late switch's new version missed: per changed
/// repeating instruction (not carried over), those of its grid from the
/// stage's instant `at` up to its first armed one (at or after `now`).
/// Reported, one event each, under the new version; not replayed (a burst
/// at the switch would be worse than the gap).
fn missed_since_instant(
    ps: &PackState,
    carried: &Carried,
    firsts: &[Option<RefTime>],
    held: &[(String, RefTime)],
    at: RefTime,
    now: RefTime,
) -> Vec<(usize, crate::catchup::Gap, RefTime)> {
    let mut out = Vec::new();
    for (i, ins) in ps.pack.instructions.iter().enumerate() {
        if carried.kept[i] || !ins.schedule.is_repeating() {
            continue;
        }
        let before = firsts[i].unwrap_or(now);
        // An instant the old version's held occurrence of this instruction
        // was reported at already (`replaced`, under the old version) is
        // not reported twice: the gap starts after it when it is the
        // grid's first.
        let mut after = at;
        for &(_, h) in held.iter().filter(|(id, _)| *id == ins.id) {
            if ins.schedule.next_after(&ps.pack.timezone, ps.anchor, after) == Some(h) {
                after = h;
            }
        }
        let gap = crate::catchup::occurrences_between(
            &ins.schedule,
            &ps.pack.timezone,
            ps.anchor,
            after,
            before,
            1,
        );
        if gap.count > 0 {
            out.push((i, gap, at));
        }
    }
    out
}

/// A late switch's carried-over repeating instructions (unchanged, so
/// their state goes on under the new version): when more than one of
/// an instruction's occurrences is due already at the switch, the latest
/// fires (the least late) and those before it are reported, one event
/// each, not fired: each would otherwise fire at once, one after the
/// other, a burst of late strokes no schedule asked for. Sets the
/// instruction's first occurrence to that latest one.
fn carried_burst(
    ps: &PackState,
    carried: &Carried,
    firsts: &mut [Option<RefTime>],
    at: RefTime,
    now: RefTime,
) -> Vec<(usize, crate::catchup::Gap, RefTime)> {
    let mut out = Vec::new();
    for (i, ins) in ps.pack.instructions.iter().enumerate() {
        if !carried.kept[i] || !ins.schedule.is_repeating() {
            continue;
        }
        let Some(first) = firsts[i].filter(|f| *f < now) else {
            continue;
        };
        let (tz, anchor) = (&ps.pack.timezone, ps.anchor);
        // Every one due (from the first to now), the last two kept: the
        // latest fires, the rest is the gap (one walk of the schedule).
        let mut due = crate::catchup::occurrences_between(
            &ins.schedule,
            tz,
            anchor,
            just_before(first),
            RefTime::from_nanos(now.as_nanos().saturating_add(1)),
            2,
        );
        if due.count < 2 {
            continue;
        }
        let Some(latest) = due.tail.pop_back() else {
            continue;
        };
        firsts[i] = Some(latest);
        due.count -= 1;
        out.push((i, due, at));
    }
    out
}

impl Scheduler {
    pub(super) fn install(
        &mut self,
        pack: Pack,
        anchor: Option<RefTime>,
        resume_after: Option<RefTime>,
        now: RefTime,
        out: &mut Vec<Output>,
    ) -> Result<Accepted, AcceptError> {
        let key = PackKey::of(&pack);
        let held = self
            .by_key
            .get(&key)
            .and_then(|&s| self.packs[s].as_ref())
            .map(|p| (p.pack.version, p.status));
        let accepted = match version_decision(held, pack.version) {
            Take::Older(held) => {
                return Err(AcceptError::Older {
                    key,
                    offered: pack.version,
                    held,
                });
            }
            Take::Unchanged => return Ok(Accepted::Unchanged),
            Take::Install(a) => a,
        };
        let (slot, old) = self.take_slot(&key);
        // A switch as of an instant (`accept_at`) that comes after it.
        let switched_late =
            anchor.filter(|at| old.is_some() && resume_after.is_none() && *at < now);
        // Replaced to run now (`accept`: a local pack file, a clock wait
        // ended), not switched nor restored.
        let plain = anchor.is_none();
        let anchor = anchor.or(old.as_ref().map(|o| o.anchor)).unwrap_or(now);
        let mut ps = self.new_state(key, pack, anchor, resume_after);
        if plain {
            // A staged version still waits to switch at the old one's
            // fence: the replacement keeps it, or its occurrences after
            // the instant would be armed ahead and could lose the race
            // with the switch's withdrawal.
            ps.fence = old
                .as_ref()
                .and_then(|o| o.fence.as_ref())
                .map(Fence::carried);
        }
        let carried = carry_over(old.as_ref(), &mut ps, now);
        let mut held = Vec::new();
        if let Some(o) = old.as_ref() {
            held = Self::report_held(o, &carried.old, ps.pack.version, now, out);
            self.detach_old(slot, o, &ps, &carried.old, now, out);
        }
        self.settle_one_shots(&mut ps, resume_after, old.as_ref());
        let repeat_shots = self.shots_of(slot, &mut ps, &carried.kept);
        let how = Installing {
            anchor,
            replaced: old.is_some(),
            resumed: resume_after.is_some(),
            now,
        };
        let mut firsts = first_occurrences(&ps, how, &carried);
        let mut missed = switched_late
            .map(|at| missed_since_instant(&ps, &carried, &firsts, &held, at, now))
            .unwrap_or_default();
        if let Some(at) = switched_late {
            missed.extend(carried_burst(&ps, &carried, &mut firsts, at, now));
        }
        for i in 0..ps.ins.len() {
            self.rearm(&mut ps, slot, i, now);
        }
        let n = ps.ins.len();
        self.packs[slot] = Some(ps);
        // A restart's gaps first: their replays come before on-time
        // occurrences at the same instant (oldest first).
        if let Some(alive) = resume_after {
            for i in 0..n {
                self.resume_gap(slot, i, alive, now, out);
            }
        }
        for (i, gap, at) in missed {
            let detail = format!(
                "not run: {} occurrence(s) from {} to {} of the stage's grid came before this agent switched (at {now}, the instant was {at}); not replayed",
                gap.count,
                gap.first.unwrap_or(at),
                gap.last().unwrap_or(at),
            );
            let ev = EventKind::Skip {
                reason: Reason::Replaced,
                detail,
            };
            out.push(self.event(slot, Some(i), None, gap.first, ev, now));
        }
        for (i, occ) in repeat_shots {
            let detail = "not run: an earlier version of the pack already fired this occurrence";
            let ev = EventKind::Skip {
                reason: Reason::Duplicate,
                detail: detail.into(),
            };
            out.push(self.event(slot, Some(i), None, Some(occ), ev, now));
        }
        let active = self.packs[slot]
            .as_ref()
            .is_some_and(|p| p.status == Status::Active);
        for (i, first) in firsts.into_iter().enumerate() {
            if let Some(t) = first.filter(|_| active) {
                self.arm_occurrence(slot, i, t, t);
            }
        }
        Ok(accepted)
    }

    /// The pack's slot (a new one at first acceptance: slots give pack
    /// order), and the state it held, its timers cancelled.
    fn take_slot(&mut self, key: &PackKey) -> (usize, Option<PackState>) {
        if let Some(&slot) = self.by_key.get(key) {
            let old = self.packs[slot].take();
            if let Some(o) = old.as_ref() {
                self.cancel_timers(o);
            }
            return (slot, old);
        }
        self.packs.push(None);
        let slot = self.packs.len() - 1;
        self.by_key.insert(key.clone(), slot);
        (slot, None)
    }

    fn new_state(
        &mut self,
        key: PackKey,
        pack: Pack,
        anchor: RefTime,
        resumed: Option<RefTime>,
    ) -> PackState {
        let generation = self.next_generation;
        self.next_generation += 1;
        PackState {
            key,
            generation,
            anchor,
            status: Status::Active,
            deps: dependents(&pack.instructions),
            safe: Arc::new(pack.safe_state.clone()),
            ins: pack
                .instructions
                .iter()
                .map(|i| InstrState {
                    satisfied: vec![false; upstream(i).len()],
                    ..InstrState::default()
                })
                .collect(),
            by_id: by_id(&pack),
            pack: Arc::new(pack),
            resumed,
            fence: None,
        }
    }

    /// Attempts of the old version that were not carried over (their
    /// instruction changed or is gone) are asked back: each one handed out
    /// is withdrawn if it has not started ([`Output::Withdraw`]; the
    /// runtime's answer comes to [`Scheduler::withdrawal`]) and stays
    /// detached until then (its result, if it ran, still arrives and ends
    /// it); the new version's occurrence at its instant waits for that
    /// answer (`claimed`). Waiting retries are dropped and reported.
    fn detach_old(
        &mut self,
        slot: usize,
        o: &PackState,
        new: &PackState,
        carried_old: &HashSet<usize>,
        now: RefTime,
        out: &mut Vec<Output>,
    ) {
        let new_version = new.pack.version;
        for (j, st) in o.ins.iter().enumerate() {
            if carried_old.contains(&j) {
                continue;
            }
            let ins = &o.pack.instructions[j];
            if let Schedule::At(at) = ins.schedule
                && st.fired
                && st.attempts.is_empty()
            {
                // Fired and ended: once per occurrence, whatever the
                // version.
                self.shots
                    .entry((slot, ins.id.clone()))
                    .or_default()
                    .push(at);
            }
            for (occ, a) in &st.attempts {
                if a.running {
                    let timer = self.queue.insert_with_tiebreak(
                        (now + ins.policy.timeout).as_nanos(),
                        0,
                        super::Entry {
                            slot,
                            generation: 0,
                            instr: j,
                            kind: EntryKind::Detached(Box::new(a.id.clone())),
                        },
                    );
                    self.detached.insert(a.id.clone(), Some(timer));
                    self.claimed
                        .insert((slot, ins.id.clone(), *occ), o.pack.version);
                    out.push(Output::Withdraw {
                        id: a.id.clone(),
                        reason: Reason::Replaced,
                    });
                    continue;
                }
                out.push(Output::Event(Event {
                    t: now,
                    pack: o.key.clone(),
                    instruction: Some(ins.id.clone()),
                    id: Some(a.id.clone()),
                    occurrence: Some(*occ),
                    kind: EventKind::Skip {
                        reason: Reason::Replaced,
                        detail: format!("retry dropped: version {new_version} replaced the pack"),
                    },
                    version: None,
                    once: None,
                }));
            }
        }
    }

    /// New one-shots (not carried over) whose instant an earlier version
    /// of the same instruction already fired: finished, reported not run.
    fn shots_of(&self, slot: usize, ps: &mut PackState, kept: &[bool]) -> Vec<(usize, RefTime)> {
        let mut repeat = Vec::new();
        if self.shots.is_empty() {
            return repeat;
        }
        for (i, ins) in ps.pack.instructions.iter().enumerate() {
            let Schedule::At(at) = ins.schedule else {
                continue;
            };
            if kept[i] || ps.ins[i].done {
                continue;
            }
            let before = self
                .shots
                .get(&(slot, ins.id.clone()))
                .is_some_and(|v| v.contains(&at));
            if before {
                ps.ins[i].done = true;
                ps.ins[i].fired = true;
                repeat.push((i, at));
            }
        }
        repeat
    }

    /// One-shots that are finished before they are armed.
    fn settle_one_shots(
        &self,
        ps: &mut PackState,
        resume_after: Option<RefTime>,
        old: Option<&PackState>,
    ) {
        for i in 0..ps.ins.len() {
            let Schedule::At(at) = ps.pack.instructions[i].schedule else {
                continue;
            };
            // The same version again (after a cancel): a one-shot it fired
            // is finished, whenever that was.
            let ins = &ps.pack.instructions[i];
            let fired_before = old.is_some_and(|o| {
                o.pack.version == ps.pack.version
                    && o.position(&ins.id).is_some_and(|j| {
                        o.ins[j].fired && o.pack.instructions[j].schedule == ins.schedule
                    })
            });
            if fired_before {
                ps.ins[i].done = true;
                ps.ins[i].fired = true;
                continue;
            }
            let first = ps.id(i, at, 1).to_string();
            // A one-shot that already fired in this run (the pack was
            // cancelled and pushed again) is finished: it neither fires nor
            // reports again.
            let fired_here = self.fired.contains_key(&super::print(&first));
            // After a restart, a one-shot due while the agent was still up
            // was handled then (fired, or missed and reported). Only the
            // journal's record of it matters (it may release dependents);
            // without one it is settled — never "missed" again on every
            // later restart.
            let settled =
                resume_after.is_some_and(|alive| at <= alive) && !self.prior.contains_key(&first);
            if fired_here || settled {
                ps.ins[i].done = true;
            }
        }
    }

    /// Re-arm carried retries, timeouts and catch-up replays under the new
    /// generation.
    fn rearm(&mut self, ps: &mut PackState, slot: usize, i: usize, now: RefTime) {
        let occs: Vec<(RefTime, u32, bool, RefTime)> = ps.ins[i]
            .attempts
            .iter()
            .map(|(occ, a)| (*occ, a.id.attempt, a.running, a.deadline))
            .collect();
        for (occ, attempt, running, deadline) in occs {
            // The instants it had: an attempt armed ahead times out after
            // its own instant, a retry comes when it was due (at once if
            // that passed).
            let (at, kind) = if running {
                (deadline, EntryKind::Timeout { occ, attempt })
            } else {
                (deadline.max(now), EntryKind::Retry { occ, attempt })
            };
            let id = Self::enqueue(&mut self.queue, ps, slot, i, at, kind);
            if let Some(a) = ps.ins[i].attempts.get_mut(&occ) {
                a.timer = Some(id);
            }
        }
        let mut replays = std::mem::take(&mut ps.ins[i].catching);
        for r in &mut replays {
            r.timer = Some(Self::enqueue(
                &mut self.queue,
                ps,
                slot,
                i,
                r.release,
                EntryKind::CatchUp(r.occ),
            ));
        }
        ps.ins[i].catching = replays;
    }

    /// A restored pack that was stopped before the restart: everything
    /// armed is dropped without a report, and its safe state is asserted
    /// again (no event: it is not a new give-up).
    pub(super) fn stop_quietly(&mut self, slot: usize, reason: SafeReason, out: &mut Vec<Output>) {
        let Some(mut ps) = self.packs[slot].take() else {
            return;
        };
        self.cancel_timers(&ps);
        ps.fence = None;
        for st in &mut ps.ins {
            st.pending = None;
            st.done = true;
            st.attempts.clear();
            st.catching.clear();
            st.release_empty();
        }
        ps.status = Status::Stopped(reason);
        out.push(Output::SafeState {
            pack: ps.key.clone(),
            actions: ps.safe.clone(),
            reason,
            once: None,
        });
        self.packs[slot] = Some(ps);
    }
}

/// [`PackState::by_id`] of `pack`.
fn by_id(pack: &Pack) -> HashMap<u64, u32, foldhash::fast::FixedState> {
    let mut m = HashMap::with_capacity_and_hasher(pack.instructions.len(), Default::default());
    for (i, x) in pack.instructions.iter().enumerate() {
        // Past u32 (never, in practice): found by the search.
        if let Ok(i) = u32::try_from(i) {
            m.entry(super::print(&x.id)).or_insert(i);
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use baton_proto::pack::parse_pack;

    use super::*;

    #[test]
    fn versions_only_go_up_and_a_cancelled_one_runs_again() {
        assert_eq!(version_decision(None, 3), Take::Install(Accepted::New));
        let active = Some((3, Status::Active));
        assert_eq!(version_decision(active, 2), Take::Older(3));
        assert_eq!(version_decision(active, 3), Take::Unchanged);
        assert_eq!(
            version_decision(active, 4),
            Take::Install(Accepted::Replaced { from: 3 })
        );
        let cancelled = Some((3, Status::Stopped(SafeReason::Cancel)));
        assert_eq!(version_decision(cancelled, 3), Take::Install(Accepted::New));
        let gave_up = Some((3, Status::Stopped(SafeReason::GiveUp)));
        assert_eq!(version_decision(gave_up, 3), Take::Unchanged);
    }

    fn t(s: i64) -> RefTime {
        RefTime::from_nanos(s * 1_000_000_000)
    }

    /// An instruction is found by its id's fingerprint, and by a search
    /// when another id shares the fingerprint; an id not held is none.
    #[test]
    fn an_instruction_is_found_by_id_even_when_fingerprints_collide() {
        let p = parse_pack(
            "pack: p\nversion: 1\ninstructions:\n  - {id: a, action: noop, every: 1s}\n  - {id: b, action: noop, every: 1s}\n  - {id: c, action: noop, every: 1s}\n",
        )
        .expect("pack");
        let mut s = Scheduler::new(crate::Config::default(), HashMap::new());
        let mut ps = s.new_state(PackKey::of(&p), p, t(0), None);
        assert_eq!(
            ["a", "b", "c", "zz"].map(|id| ps.position(id)),
            [Some(0), Some(1), Some(2), None]
        );
        // As if "b" and "c" shared "a"'s fingerprint: "a" kept.
        ps.by_id.insert(super::super::print("b"), 0);
        ps.by_id.remove(&super::super::print("c"));
        assert_eq!(
            ["a", "b", "c", "zz"].map(|id| ps.position(id)),
            [Some(0), Some(1), Some(2), None]
        );
    }

    #[test]
    fn first_occurrences_keep_the_phase_and_skip_the_restart_gap() {
        let p = parse_pack(
            "pack: p\nversion: 1\ninstructions:\n  - {id: a, action: noop, every: 10s}\n  - {id: b, action: noop, at: 1970-01-01T00:00:05Z}\n",
        )
        .expect("pack");
        let st = InstrState::default();
        let tz = TimeZone::UTC;
        let every = &p.instructions[0];
        let how = |anchor, replaced, resumed, now| Installing {
            anchor,
            replaced,
            resumed,
            now,
        };
        let first = |carried, replaced, resumed, now| {
            first_occurrence(
                every,
                &st,
                &tz,
                how(t(3), replaced, resumed, now),
                carried,
                None,
            )
        };
        // Anchored at the first acceptance (3 s), whatever `now` is.
        assert_eq!(first(None, false, false, t(3)), Some(t(3)));
        assert_eq!(first(None, true, false, t(27)), Some(t(33)));
        // A carried occurrence stays.
        assert_eq!(first(Some(t(23)), true, false, t(27)), Some(t(23)));
        // A changed instruction whose old version has 33 s and 43 s in
        // flight at 27 s starts after them.
        assert_eq!(
            first_occurrence(
                every,
                &st,
                &tz,
                how(t(3), true, false, t(27)),
                None,
                Some(t(43))
            ),
            Some(t(53))
        );
        // A restart: the first one at or after `now`, on the anchor's grid.
        assert_eq!(first(None, false, true, t(43)), Some(t(43)));
        assert_eq!(first(None, false, true, t(44)), Some(t(53)));
        let at = &p.instructions[1];
        assert_eq!(
            first_occurrence(at, &st, &tz, how(t(0), false, true, t(9)), None, None),
            Some(t(5))
        );
        let done = InstrState {
            done: true,
            ..InstrState::default()
        };
        assert_eq!(
            first_occurrence(at, &done, &tz, how(t(0), false, false, t(0)), None, None),
            None
        );
    }
}
