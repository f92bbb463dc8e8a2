//! The scheduler state machine.
//!
//! Inputs: packs, `now`, attempt results, lease loss, shutdown. Outputs:
//! [`Output`]s in the order the runtime must act on them. It never reads a
//! clock or touches a device, so tests drive it on simulated time and every
//! run with the same inputs and seed gives the same outputs.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use baton_proto::RefTime;
use baton_proto::pack::{Action, CatchUp, OnGiveUp, Pack, Schedule, dependents, upstream};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::id::{ExecutionId, PackKey};
use crate::output::{Event, EventKind, Firing, Output, SafeReason};
use crate::timing::{TimerId, TimingWheel};

/// Tunables of the core.
#[derive(Clone, Debug)]
pub struct Config {
    /// Seed of the jitter RNG: the same seed gives the same retry instants.
    pub seed: u64,
    /// `catch_up: all` fires at most this many missed occurrences per
    /// downtime; the rest are skipped and the count reported.
    pub catch_up_cap: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            seed: 0,
            catch_up_cap: 100,
        }
    }
}

/// What the journal knows about an attempt from before a restart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PriorOutcome {
    /// It ran and succeeded.
    Succeeded,
    /// It ran and failed.
    Failed,
    /// It started (durable start record) but has no result: it may or may
    /// not have touched the device, so it is never fired again.
    Unknown,
    /// It was armed but provably never touched the device (withdrawn at a
    /// safe state or shutdown, or reached too late): it may fire again.
    NotRun,
}

/// How an attempt ended, as the runtime reports it.
#[derive(Clone, Debug, PartialEq)]
pub enum AttemptResult {
    /// Done (`value`: a `gpio.read` sample).
    Ok {
        /// Sampled level.
        value: Option<u8>,
    },
    /// Failed, with a reason.
    Failed(String),
    /// The runtime could not start it before `not_after`: it did not run.
    Late {
        /// When the runtime got to it.
        actual: RefTime,
    },
}

/// How a pack was taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accepted {
    /// A pack this agent did not hold.
    New,
    /// A higher version replaced the held one atomically.
    Replaced {
        /// The version it replaced.
        from: u64,
    },
    /// Same version again: nothing changed.
    Unchanged,
}

/// Why a pack was refused by the core (validation happens before).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AcceptError {
    /// Versions only go up.
    #[error("pack {key} version {offered} is older than version {held} held by this agent")]
    Older {
        /// The pack.
        key: PackKey,
        /// What was offered.
        offered: u64,
        /// What is held.
        held: u64,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    Active,
    /// In its safe state; fires nothing more until replaced.
    Stopped(SafeReason),
}

#[derive(Debug)]
enum EntryKind {
    Occurrence(RefTime),
    Retry {
        occ: RefTime,
        attempt: u32,
    },
    Timeout {
        occ: RefTime,
        attempt: u32,
    },
    /// Timeout of an attempt whose pack version was replaced or stopped.
    Detached(Box<ExecutionId>),
}

#[derive(Debug)]
struct Entry {
    slot: usize,
    generation: u64,
    instr: usize,
    kind: EntryKind,
}

#[derive(Clone, Debug)]
struct Attempt {
    id: ExecutionId,
    running: bool,
    timer: Option<TimerId>,
}

#[derive(Clone, Debug, Default)]
struct InstrState {
    /// The next occurrence waiting in the queue.
    pending: Option<(TimerId, RefTime)>,
    /// A one-shot (`at` / `after` round) that has finished for good.
    done: bool,
    /// `after` instructions: which upstreams succeeded this round.
    satisfied: Vec<bool>,
    /// `after` instructions: latest upstream occurrence this round.
    round_occ: Option<RefTime>,
    /// Occurrences with an attempt running or a retry waiting.
    attempts: BTreeMap<RefTime, Attempt>,
}

impl InstrState {
    /// Remove an occurrence's attempt record.
    fn take_attempt(&mut self, occ: RefTime) -> Option<Attempt> {
        let a = self.attempts.remove(&occ);
        self.release_empty();
        a
    }

    /// An empty `BTreeMap` keeps its root node allocated (over a kilobyte
    /// here); with 10 000 instructions that is most of the agent's memory,
    /// so give it back once the last attempt is gone.
    fn release_empty(&mut self) {
        if self.attempts.is_empty() {
            self.attempts = BTreeMap::new();
        }
    }
}

impl PackState {
    /// The execution id of an attempt of instruction `i` of this version.
    fn id(&self, i: usize, occurrence: RefTime, attempt: u32) -> ExecutionId {
        ExecutionId {
            pack: self.key.clone(),
            version: self.pack.version,
            instruction: self.pack.instructions[i].id.clone(),
            occurrence,
            attempt,
        }
    }
}

#[derive(Debug)]
struct PackState {
    key: PackKey,
    pack: Arc<Pack>,
    generation: u64,
    /// First acceptance: the anchor of `every` schedules without `start_at`,
    /// kept across versions so a replacement does not shift the phase.
    anchor: RefTime,
    status: Status,
    deps: Vec<Vec<usize>>,
    safe: Arc<Vec<Action>>,
    ins: Vec<InstrState>,
}

/// The scheduler core.
#[derive(Debug)]
pub struct Scheduler {
    cfg: Config,
    packs: Vec<Option<PackState>>,
    by_key: HashMap<PackKey, usize>,
    queue: TimingWheel<Entry>,
    prior: HashMap<String, PriorOutcome>,
    /// Ids fired in this run, each with the instant after which no path can
    /// derive it again (its occurrence plus the instruction's
    /// `max_lateness`, plus a margin): pruned past that, so a long-running
    /// agent's memory does not grow with every firing.
    fired: HashMap<String, RefTime>,
    /// When `fired` and `prior` were last pruned.
    last_prune: RefTime,
    rng: ChaCha8Rng,
    next_generation: u64,
    /// Attempts still running for a pack version that is gone (replaced,
    /// or stopped and pushed again): their results still end their
    /// occurrence, but nothing follows from them.
    detached: HashMap<ExecutionId, Option<TimerId>>,
}

const NS: i64 = 1;

/// Safety margin past the last instant an id could be derived again.
const PRUNE_MARGIN: Duration = Duration::from_secs(60);
/// How often (in reference time) the id records are pruned.
const PRUNE_EVERY: Duration = Duration::from_secs(10);
/// Journal records of attempts older than this are dropped from memory once
/// the agent runs: restored packs resolve their recent occurrences from them
/// at start-up; older one-shots are settled by `last_alive` (see `restore`).
const PRIOR_KEEP: Duration = Duration::from_secs(24 * 3600);

fn ns(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

fn fmt_d(d: Duration) -> String {
    baton_proto::time::format_duration(d)
}

impl Scheduler {
    /// A core that knows which attempts ran before (from the journal):
    /// it never fires any of those ids again.
    pub fn new(cfg: Config, prior: HashMap<String, PriorOutcome>) -> Self {
        Scheduler {
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            cfg,
            packs: Vec::new(),
            by_key: HashMap::new(),
            queue: TimingWheel::new(),
            prior,
            fired: HashMap::new(),
            last_prune: RefTime::MIN,
            next_generation: 1,
            detached: HashMap::new(),
        }
    }

    /// The earliest instant at which [`Scheduler::tick`] has work.
    pub fn next_wake(&self) -> Option<RefTime> {
        self.queue.next_deadline().map(RefTime::from_nanos)
    }

    /// Entries waiting in the timing structure (one per repeating
    /// instruction, plus retries and timeouts in flight).
    pub fn pending(&self) -> usize {
        self.queue.len()
    }

    /// Sizes of the internal records (for memory tests and telemetry):
    /// fired ids remembered, their table's capacity, prior records, queue.
    pub fn record_counts(&self) -> [usize; 4] {
        [
            self.fired.len(),
            self.fired.capacity(),
            self.prior.len(),
            self.queue.len(),
        ]
    }

    /// Version held for a pack, and whether it is still active.
    pub fn held(&self, key: &PackKey) -> Option<(u64, bool)> {
        let ps = self.packs[*self.by_key.get(key)?].as_ref()?;
        Some((ps.pack.version, ps.status == Status::Active))
    }

    /// Take a validated pack at `now`.
    pub fn accept(
        &mut self,
        pack: Pack,
        now: RefTime,
        out: &mut Vec<Output>,
    ) -> Result<Accepted, AcceptError> {
        self.install(pack, None, None, now, out)
    }

    /// Take a pack back after a restart: it was first accepted at
    /// `accepted`, and the agent was up until at least `last_alive`.
    /// Occurrences missed in between follow `catch_up`.
    pub fn restore(
        &mut self,
        pack: Pack,
        accepted: RefTime,
        last_alive: RefTime,
        now: RefTime,
        out: &mut Vec<Output>,
    ) -> Result<Accepted, AcceptError> {
        self.install(pack, Some(accepted), Some(last_alive), now, out)
    }

    /// Take back a pack that had entered its safe state for good before the
    /// restart (give-up, cancel): it is held, stopped, fires nothing, and
    /// its safe state is asserted again — the device may have lost it. A
    /// higher version replaces it as usual.
    pub fn restore_stopped(
        &mut self,
        pack: Pack,
        accepted: RefTime,
        reason: SafeReason,
        now: RefTime,
        out: &mut Vec<Output>,
    ) -> Result<Accepted, AcceptError> {
        let key = PackKey {
            tenant: pack.tenant.clone(),
            pack: pack.id.clone(),
        };
        let r = self.install(pack, Some(accepted), Some(now), now, out)?;
        if let Some(&slot) = self.by_key.get(&key) {
            if let Some(ps) = self.packs[slot].as_mut() {
                // Nothing of it is pending any more: settle one-shots quietly.
                for st in &mut ps.ins {
                    st.done = true;
                }
            }
            self.fail_safe(slot, reason, now, out);
        }
        Ok(r)
    }

    fn install(
        &mut self,
        pack: Pack,
        anchor: Option<RefTime>,
        resume_after: Option<RefTime>,
        now: RefTime,
        out: &mut Vec<Output>,
    ) -> Result<Accepted, AcceptError> {
        let key = PackKey {
            tenant: pack.tenant.clone(),
            pack: pack.id.clone(),
        };
        let mut old: Option<PackState> = None;
        let mut accepted = Accepted::New;
        if let Some(&slot) = self.by_key.get(&key) {
            if let Some(held) = self.packs[slot].as_ref() {
                let held_v = held.pack.version;
                let reinstall_same = matches!(
                    held.status,
                    Status::Stopped(SafeReason::Cancel | SafeReason::LeaseLost)
                );
                if pack.version < held_v {
                    return Err(AcceptError::Older {
                        key,
                        offered: pack.version,
                        held: held_v,
                    });
                }
                if pack.version == held_v && !reinstall_same {
                    return Ok(Accepted::Unchanged);
                }
                if pack.version > held_v {
                    accepted = Accepted::Replaced { from: held_v };
                }
            }
            old = self.packs[slot].take();
            if let Some(o) = old.as_ref() {
                self.cancel_timers(o);
            }
        }
        let slot = match self.by_key.get(&key) {
            Some(&s) => s,
            None => {
                self.packs.push(None);
                let s = self.packs.len() - 1;
                self.by_key.insert(key.clone(), s);
                s
            }
        };
        let generation = self.next_generation;
        self.next_generation += 1;
        let anchor = anchor.or(old.as_ref().map(|o| o.anchor)).unwrap_or(now);
        let n = pack.instructions.len();
        let mut ps = PackState {
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
            pack: Arc::new(pack),
        };
        // Carry the state of unchanged instructions over from the replaced
        // version: a one-shot that already fired does not fire again, an
        // unchanged periodic keeps its next occurrence.
        let mut carried_next: Vec<Option<RefTime>> = vec![None; n];
        let mut carried_old: HashSet<usize> = HashSet::new();
        if let Some(o) = old.as_ref().filter(|o| o.status == Status::Active) {
            for (i, ins) in ps.pack.instructions.iter().enumerate() {
                let Some(j) = o.pack.instructions.iter().position(|x| x.id == ins.id) else {
                    continue;
                };
                let prev = &o.pack.instructions[j];
                if prev.action != ins.action || prev.schedule != ins.schedule {
                    continue;
                }
                let st = &o.ins[j];
                carried_old.insert(j);
                ps.ins[i].done =
                    st.done || (!ins.schedule.is_repeating() && !st.attempts.is_empty());
                ps.ins[i].satisfied = st.satisfied.clone();
                ps.ins[i].round_occ = st.round_occ;
                ps.ins[i].attempts = st.attempts.clone();
                carried_next[i] = st.pending.map(|(_, occ)| occ);
            }
        }
        // Attempts of the old version that were not carried over end under
        // that version: running ones are detached (their result still
        // arrives), waiting retries are dropped and reported.
        if let Some(o) = old.as_ref() {
            for (j, st) in o.ins.iter().enumerate() {
                if carried_old.contains(&j) {
                    continue;
                }
                for (occ, a) in &st.attempts {
                    if a.running {
                        let timer = self.queue.insert_with_tiebreak(
                            (now + o.pack.instructions[j].policy.timeout).as_nanos(),
                            0,
                            Entry {
                                slot,
                                generation: 0,
                                instr: j,
                                kind: EntryKind::Detached(Box::new(a.id.clone())),
                            },
                        );
                        self.detached.insert(a.id.clone(), Some(timer));
                    } else {
                        out.push(Output::Event(Event {
                            t: now,
                            pack: o.key.clone(),
                            instruction: Some(o.pack.instructions[j].id.clone()),
                            id: Some(a.id.clone()),
                            occurrence: Some(*occ),
                            kind: EventKind::Skip {
                                reason: format!(
                                    "retry dropped: version {} replaced the pack",
                                    ps.pack.version
                                ),
                            },
                        }));
                    }
                }
            }
        }
        for i in 0..n {
            let Schedule::At(at) = ps.pack.instructions[i].schedule else {
                continue;
            };
            let first = ps.id(i, at, 1).to_string();
            // A one-shot that already fired in this run (the pack was
            // cancelled and pushed again) is finished: it neither fires nor
            // reports again.
            let fired_here = self.fired.contains_key(&first);
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
        // First occurrences.
        for (i, carried) in carried_next.iter().copied().enumerate() {
            let ins = &ps.pack.instructions[i];
            let tz = &ps.pack.timezone;
            let first = match &ins.schedule {
                _ if ps.ins[i].done => None,
                Schedule::At(t) => Some(*t),
                Schedule::After { .. } => carried,
                s @ (Schedule::Every { start_at, .. } | Schedule::Cron { start_at, .. }) => {
                    let start = start_at.unwrap_or(anchor);
                    let mut after = RefTime::from_nanos(start.as_nanos() - NS);
                    if let Some(occ) = carried {
                        after = after.max(RefTime::from_nanos(occ.as_nanos() - NS));
                    } else if old.is_some() {
                        // A changed instruction of a replaced pack starts
                        // from now: nothing before the replacement is "missed".
                        after = after.max(RefTime::from_nanos(now.as_nanos() - NS));
                    }
                    if let Some(alive) = resume_after {
                        after = after.max(alive);
                    }
                    s.next_after(tz, anchor, after)
                }
            };
            if let Some(t) = first {
                let id = self.insert(&ps, slot, i, t, EntryKind::Occurrence(t));
                ps.ins[i].pending = Some((id, t));
            }
            // Re-arm carried retries and timeouts under the new generation.
            let occs: Vec<(RefTime, u32, bool)> = ps.ins[i]
                .attempts
                .iter()
                .map(|(occ, a)| (*occ, a.id.attempt, a.running))
                .collect();
            for (occ, attempt, running) in occs {
                let (at, kind) = if running {
                    (
                        now + ps.pack.instructions[i].policy.timeout,
                        EntryKind::Timeout { occ, attempt },
                    )
                } else {
                    (now, EntryKind::Retry { occ, attempt })
                };
                let id = self.insert(&ps, slot, i, at, kind);
                if let Some(a) = ps.ins[i].attempts.get_mut(&occ) {
                    a.timer = Some(id);
                }
            }
        }
        self.packs[slot] = Some(ps);
        Ok(accepted)
    }

    fn insert(
        &self,
        ps: &PackState,
        slot: usize,
        i: usize,
        at: RefTime,
        kind: EntryKind,
    ) -> TimerId {
        // Equal deadlines: higher priority first, then pack order.
        let prio = u64::from(255 - ps.pack.instructions[i].priority);
        let tiebreak = (prio << 48) | ((slot as u64 & 0xffff_ffff) << 16) | (i as u64 & 0xffff);
        self.queue.insert_with_tiebreak(
            at.as_nanos(),
            tiebreak,
            Entry {
                slot,
                generation: ps.generation,
                instr: i,
                kind,
            },
        )
    }

    /// Remove a replaced version's entries from the queue. The state keeps
    /// which occurrence was next, so unchanged instructions carry it over.
    /// Queue an entry for instruction `i` of the pack in `slot`.
    fn arm(&self, slot: usize, i: usize, at: RefTime, kind: EntryKind) -> Option<TimerId> {
        let ps = self.packs[slot].as_ref()?;
        Some(self.insert(ps, slot, i, at, kind))
    }

    /// Make occurrence `occ`, due `at`, the instruction's pending one.
    fn arm_occurrence(&mut self, slot: usize, i: usize, occ: RefTime, at: RefTime) {
        let id = self.arm(slot, i, at, EntryKind::Occurrence(occ));
        if let (Some(id), Some(ps)) = (id, self.packs[slot].as_mut()) {
            ps.ins[i].pending = Some((id, occ));
        }
    }

    fn cancel_timers(&mut self, ps: &PackState) {
        for st in &ps.ins {
            if let Some((id, _)) = st.pending {
                self.queue.cancel(id);
            }
            for id in st.attempts.values().filter_map(|a| a.timer) {
                self.queue.cancel(id);
            }
        }
    }

    /// Remove a pack: its safe state runs and its pending firings are
    /// reported as skipped.
    pub fn cancel(&mut self, key: &PackKey, now: RefTime, out: &mut Vec<Output>) -> bool {
        let Some(&slot) = self.by_key.get(key) else {
            return false;
        };
        self.fail_safe(slot, SafeReason::Cancel, now, out);
        true
    }

    /// The controller lease is gone: every active pack goes to its safe state.
    pub fn lease_lost(&mut self, now: RefTime, out: &mut Vec<Output>) {
        self.all_safe(SafeReason::LeaseLost, now, out);
    }

    /// The agent is stopping: every active pack goes to its safe state.
    pub fn shutdown(&mut self, now: RefTime, out: &mut Vec<Output>) {
        self.all_safe(SafeReason::Shutdown, now, out);
    }

    fn all_safe(&mut self, reason: SafeReason, now: RefTime, out: &mut Vec<Output>) {
        for slot in 0..self.packs.len() {
            if self.packs[slot]
                .as_ref()
                .is_some_and(|p| p.status == Status::Active)
            {
                self.fail_safe(slot, reason, now, out);
            }
        }
    }

    /// Handle everything due at or before `now`.
    pub fn tick(&mut self, now: RefTime, out: &mut Vec<Output>) {
        while let Some((deadline, timer, entry)) = self.queue.pop_due(now.as_nanos()) {
            self.handle_entry(RefTime::from_nanos(deadline), timer, entry, now, out);
        }
        // After the due entries: a restart's first tick still resolves old
        // occurrences from the journal's records before any are dropped.
        if now > self.last_prune + PRUNE_EVERY {
            self.last_prune = now;
            self.fired.retain(|_, expiry| *expiry > now);
            let horizon = now.saturating_sub(PRIOR_KEEP);
            self.prior
                .retain(|id, _| ExecutionId::parse(id).is_none_or(|e| e.occurrence > horizon));
            // A burst (catch-up, many packs at once) must not pin its peak.
            if self.fired.capacity() > 4 * self.fired.len().max(256) {
                self.fired.shrink_to_fit();
            }
            if self.prior.capacity() > 4 * self.prior.len().max(256) {
                self.prior.shrink_to_fit();
            }
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
                self.end_detached(&id, AttemptResult::Failed("timed out".into()), now, out);
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
                    self.occurrence_due(e.slot, e.instr, occ, deadline, now, out);
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
                    self.attempt_due(e.slot, e.instr, occ, deadline, now, out);
                }
            }
            EntryKind::Detached(_) => {}
            EntryKind::Timeout { occ, attempt } => {
                let live = st
                    .attempts
                    .get(&occ)
                    .is_some_and(|a| a.id.attempt == attempt && a.running);
                if live {
                    let ins = &ps.pack.instructions[e.instr];
                    let reason = format!("timed out after {}", fmt_d(ins.policy.timeout));
                    let id = st.attempts.get(&occ).map(|a| a.id.clone());
                    if let Some(id) = id {
                        out.push(Output::Abort(id.clone()));
                        self.finish_attempt(
                            e.slot,
                            e.instr,
                            &id,
                            AttemptResult::Failed(reason),
                            now,
                            out,
                        );
                    }
                }
            }
        }
    }

    fn event(
        &self,
        slot: usize,
        instr: Option<usize>,
        id: Option<ExecutionId>,
        occ: Option<RefTime>,
        kind: EventKind,
        now: RefTime,
    ) -> Output {
        let ps = self.packs[slot]
            .as_ref()
            .expect("events are only made for held packs");
        Output::Event(Event {
            t: now,
            pack: ps.key.clone(),
            instruction: instr.map(|i| ps.pack.instructions[i].id.clone()),
            id,
            occurrence: occ,
            kind,
        })
    }

    fn make_id(&self, slot: usize, i: usize, occ: RefTime, attempt: u32) -> ExecutionId {
        self.packs[slot]
            .as_ref()
            .expect("ids are only made for held packs")
            .id(i, occ, attempt)
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

    fn occurrence_due(
        &mut self,
        slot: usize,
        i: usize,
        occ: RefTime,
        deadline: RefTime,
        now: RefTime,
        out: &mut Vec<Output>,
    ) {
        let Some(ps) = self.packs[slot].as_ref() else {
            return;
        };
        let ins = &ps.pack.instructions[i];
        let lateness = now.since(deadline);
        let max_late = ins.policy.max_lateness;
        if !ins.schedule.is_repeating() {
            // `at` and `after` rounds: one occurrence, fired once.
            if ps.ins[i].done {
                return;
            }
            if self.resolve_prior(slot, i, occ, now, out) {
                return;
            }
            if lateness > max_late {
                let reason = format!(
                    "missed: late by {} (max_lateness {})",
                    fmt_d(lateness),
                    fmt_d(max_late)
                );
                self.give_up(slot, i, occ, None, reason, now, out);
                return;
            }
            let id = self.make_id(slot, i, occ, 1);
            self.fire(slot, i, id, deadline, now, out);
            return;
        }
        if lateness <= max_late {
            self.schedule_next(slot, i, occ);
            if !self.resolve_prior(slot, i, occ, now, out) {
                let id = self.make_id(slot, i, occ, 1);
                self.fire(slot, i, id, deadline, now, out);
            }
            return;
        }
        // Late beyond the bound: the agent was down, the pack arrived late,
        // or the clock stepped. Treat the gap as downtime: no burst, no
        // silence — `catch_up` decides, and the schedule resumes on time.
        let tz = ps.pack.timezone.clone();
        let schedule = ins.schedule.clone();
        let catch_up = ins.policy.catch_up;
        let anchor = ps.anchor;
        let bound = now.saturating_sub(max_late);
        let mut missed: VecDeque<RefTime> = VecDeque::new();
        let mut count: u64 = 0;
        let keep = match catch_up {
            CatchUp::All => self.cfg.catch_up_cap,
            _ => 1,
        };
        let mut cur = occ;
        let mut first_ok = None;
        // Walk the missed occurrences, keeping only what catch_up needs; a
        // week of 500ms blinks is counted in closed form, not walked.
        loop {
            if cur >= bound {
                first_ok = Some(cur);
                break;
            }
            if let (Schedule::Every { period, .. }, true) =
                (&schedule, count > 0 && catch_up != CatchUp::All)
            {
                let p = ns(*period).max(1);
                let skip = (bound.as_nanos() - cur.as_nanos()) / p;
                if skip > 1 {
                    let jump = RefTime::from_nanos(cur.as_nanos() + (skip - 1) * p);
                    count += (skip - 1) as u64;
                    cur = jump;
                    missed.clear();
                }
            }
            count += 1;
            missed.push_back(cur);
            if missed.len() > keep {
                missed.pop_front();
            }
            match schedule.next_after(&tz, anchor, cur) {
                Some(n) => cur = n,
                None => break,
            }
        }
        if let Some(next) = first_ok {
            self.arm_occurrence(slot, i, next, next);
        }
        let span = format!(
            "between {} and {}",
            occ,
            missed.back().copied().unwrap_or(occ)
        );
        let fire: Vec<RefTime> = match catch_up {
            CatchUp::None => Vec::new(),
            // An on-time occurrence is due now anyway: that is the latest.
            CatchUp::Last if first_ok.is_some_and(|n| n <= now) => Vec::new(),
            CatchUp::Last => missed.back().copied().into_iter().collect(),
            CatchUp::All => missed.iter().copied().collect(),
        };
        let skipped = count - fire.len() as u64;
        if skipped > 0 {
            let reason = format!(
                "missed {skipped} occurrence(s) {span} (late by {}, max_lateness {}, catch_up {})",
                fmt_d(lateness),
                fmt_d(max_late),
                match catch_up {
                    CatchUp::None => "none",
                    CatchUp::Last => "last",
                    CatchUp::All => "all",
                }
            );
            out.push(self.event(
                slot,
                Some(i),
                None,
                Some(occ),
                EventKind::Skip { reason },
                now,
            ));
        }
        for m in fire {
            if !self.resolve_prior(slot, i, m, now, out) {
                let id = self.make_id(slot, i, m, 1);
                self.fire(slot, i, id, m, now, out);
            }
        }
    }

    /// Attempts of this occurrence known from before a restart: resolve
    /// the occurrence from them instead of firing again. Returns true when
    /// the occurrence is fully handled.
    fn resolve_prior(
        &mut self,
        slot: usize,
        i: usize,
        occ: RefTime,
        now: RefTime,
        out: &mut Vec<Output>,
    ) -> bool {
        if self.prior.is_empty() {
            return false;
        }
        let max = self.packs[slot]
            .as_ref()
            .map_or(1, |p| p.pack.instructions[i].policy.retry.max_attempts);
        let mut attempt = 1;
        loop {
            let id = self.make_id(slot, i, occ, attempt);
            match self.prior.get(&id.to_string()).copied() {
                None | Some(PriorOutcome::NotRun) if attempt == 1 => return false,
                None | Some(PriorOutcome::NotRun) => {
                    // Earlier attempts failed before the restart: go on
                    // with the next one, after its backoff from now.
                    let failed = self.make_id(slot, i, occ, attempt - 1);
                    self.schedule_retry(slot, i, failed, now, out);
                    return true;
                }
                Some(PriorOutcome::Succeeded) => {
                    out.push(self.event(
                        slot,
                        Some(i),
                        Some(id),
                        Some(occ),
                        EventKind::Skip {
                            reason: "already ran before the restart (ok)".into(),
                        },
                        now,
                    ));
                    self.succeeded(slot, i, occ, now, out);
                    return true;
                }
                Some(PriorOutcome::Unknown) => {
                    out.push(self.event(
                        slot,
                        Some(i),
                        Some(id),
                        Some(occ),
                        EventKind::OutcomeUnknown,
                        now,
                    ));
                    if let Some(ps) = self.packs[slot].as_mut()
                        && !ps.pack.instructions[i].schedule.is_repeating()
                    {
                        ps.ins[i].done = true;
                    }
                    return true;
                }
                Some(PriorOutcome::Failed) if attempt >= max => {
                    self.give_up(
                        slot,
                        i,
                        occ,
                        None,
                        format!("failed after {attempt} attempt(s) (before the restart)"),
                        now,
                        out,
                    );
                    return true;
                }
                Some(PriorOutcome::Failed) => attempt += 1,
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn attempt_due(
        &mut self,
        slot: usize,
        i: usize,
        occ: RefTime,
        deadline: RefTime,
        now: RefTime,
        out: &mut Vec<Output>,
    ) {
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
            let reason = format!(
                "retry missed: late by {} (max_lateness {})",
                fmt_d(lateness),
                fmt_d(max_late)
            );
            self.give_up(slot, i, occ, Some(id), reason, now, out);
            return;
        }
        self.fire(slot, i, id, deadline, now, out);
    }

    fn fire(
        &mut self,
        slot: usize,
        i: usize,
        id: ExecutionId,
        scheduled: RefTime,
        now: RefTime,
        out: &mut Vec<Output>,
    ) {
        let (occ, attempt) = (id.occurrence, id.attempt);
        let text = id.to_string();
        let ran_before = self
            .prior
            .get(&text)
            .is_some_and(|o| *o != PriorOutcome::NotRun);
        if self.fired.contains_key(&text) || ran_before {
            // Never twice: a duplicate delivery or a bug upstream must not
            // reach the device. The note names the occurrence, not the
            // attempt: that attempt reports its own end.
            out.push(self.event(
                slot,
                Some(i),
                None,
                Some(occ),
                EventKind::Skip {
                    reason: format!("already fired as {id}: not fired again"),
                },
                now,
            ));
            return;
        }
        let max_lateness = self.packs[slot].as_ref().map_or(Duration::ZERO, |p| {
            p.pack.instructions[i].policy.max_lateness
        });
        let expiry = occ.max(now) + max_lateness + PRUNE_MARGIN;
        self.fired.insert(text, expiry);
        let Some(ps) = self.packs[slot].as_ref() else {
            return;
        };
        let ins = &ps.pack.instructions[i];
        let timeout = ins.policy.timeout;
        let firing = Firing {
            id: id.clone(),
            // Built per firing rather than kept per instruction: memory
            // stays O(instructions) with a small constant.
            action: Arc::new(ins.action.clone()),
            scheduled,
            not_after: scheduled.max(now) + ins.policy.max_lateness,
            timeout,
        };
        let timer = self.insert(
            ps,
            slot,
            i,
            now + timeout,
            EntryKind::Timeout { occ, attempt },
        );
        if let Some(ps) = self.packs[slot].as_mut() {
            ps.ins[i].attempts.insert(
                occ,
                Attempt {
                    id: id.clone(),
                    running: true,
                    timer: Some(timer),
                },
            );
        }
        out.push(self.event(slot, Some(i), Some(id), Some(occ), EventKind::Fire, now));
        out.push(Output::Fire(firing));
    }

    /// Report how an attempt ended. Results for attempts the core no longer
    /// waits for (timed out, replaced version) are ignored.
    pub fn attempt_result(
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
            self.end_detached(id, result, now, out);
            return;
        }
        let Some(&slot) = self.by_key.get(&id.pack) else {
            return;
        };
        let Some(ps) = self.packs[slot].as_ref() else {
            return;
        };
        let Some(i) = ps
            .pack
            .instructions
            .iter()
            .position(|x| x.id == id.instruction)
        else {
            return;
        };
        let live = ps.ins[i]
            .attempts
            .get(&id.occurrence)
            .is_some_and(|a| a.running && a.id == *id);
        if !live {
            return;
        }
        self.finish_attempt(slot, i, id, result, now, out);
    }

    /// A detached attempt ended: report it; a failure is not retried.
    fn end_detached(
        &mut self,
        id: &ExecutionId,
        result: AttemptResult,
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
            })
        };
        match result {
            AttemptResult::Ok { value } => out.push(ev(EventKind::Ok { value })),
            AttemptResult::Failed(reason) => {
                out.push(ev(EventKind::Fail { reason }));
                out.push(ev(EventKind::Skip {
                    reason: "no retry: its pack version was replaced or stopped".into(),
                }));
            }
            AttemptResult::Late { .. } => out.push(ev(EventKind::Skip {
                reason: "not run: late, and its pack version was replaced or stopped".into(),
            })),
        }
    }

    fn finish_attempt(
        &mut self,
        slot: usize,
        i: usize,
        id: &ExecutionId,
        result: AttemptResult,
        now: RefTime,
        out: &mut Vec<Output>,
    ) {
        let occ = id.occurrence;
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
                out.push(self.event(
                    slot,
                    Some(i),
                    Some(id.clone()),
                    Some(occ),
                    EventKind::Ok { value },
                    now,
                ));
                if active {
                    self.succeeded(slot, i, occ, now, out);
                }
            }
            AttemptResult::Failed(reason) => {
                out.push(self.event(
                    slot,
                    Some(i),
                    Some(id.clone()),
                    Some(occ),
                    EventKind::Fail { reason },
                    now,
                ));
                if active {
                    self.schedule_retry(slot, i, id.clone(), now, out);
                } else {
                    out.push(self.event(
                        slot,
                        Some(i),
                        Some(id.clone()),
                        Some(occ),
                        EventKind::Skip {
                            reason: "no retry: the pack is in its safe state".into(),
                        },
                        now,
                    ));
                }
            }
            AttemptResult::Late { actual } => {
                let lateness = actual.since(id.occurrence.max(RefTime::from_nanos(0)));
                let reason = format!(
                    "not run: the runtime reached it {} after it was due",
                    fmt_d(lateness)
                );
                if repeating || !active {
                    out.push(self.event(
                        slot,
                        Some(i),
                        Some(id.clone()),
                        Some(occ),
                        EventKind::Skip { reason },
                        now,
                    ));
                } else {
                    self.give_up(slot, i, occ, Some(id.clone()), reason, now, out);
                }
            }
        }
    }

    /// After failed attempt number `attempt`: retry with backoff, or give up.
    fn schedule_retry(
        &mut self,
        slot: usize,
        i: usize,
        failed: ExecutionId,
        now: RefTime,
        out: &mut Vec<Output>,
    ) {
        let Some(ps) = self.packs[slot].as_ref() else {
            return;
        };
        let policy = ps.pack.instructions[i].policy.retry;
        let (occ, attempt) = (failed.occurrence, failed.attempt);
        if attempt >= policy.max_attempts {
            let reason = format!("failed after {attempt} attempt(s)");
            self.give_up(slot, i, occ, Some(failed), reason, now, out);
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

    fn succeeded(
        &mut self,
        slot: usize,
        i: usize,
        occ: RefTime,
        now: RefTime,
        out: &mut Vec<Output>,
    ) {
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
            let occ_d = round + delay;
            let at = now + delay;
            self.arm_occurrence(slot, d, occ_d, at);
            // A zero delay is due at once: handled by the caller's tick
            // loop on the next pass, or by the next `tick`.
            let _ = &out;
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn give_up(
        &mut self,
        slot: usize,
        i: usize,
        occ: RefTime,
        id: Option<ExecutionId>,
        reason: String,
        now: RefTime,
        out: &mut Vec<Output>,
    ) {
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
        let on_give_up = ps.pack.instructions[i].policy.on_give_up;
        let on_failure = ps.pack.instructions[i]
            .policy
            .on_failure
            .clone()
            .map(Arc::new);
        let key = ps.key.clone();
        let ins_id = ps.pack.instructions[i].id.clone();
        out.push(self.event(
            slot,
            Some(i),
            id,
            Some(occ),
            EventKind::GiveUp { reason },
            now,
        ));
        if let Some(action) = on_failure {
            out.push(self.event(slot, Some(i), None, Some(occ), EventKind::OnFailure, now));
            out.push(Output::OnFailure {
                pack: key,
                instruction: ins_id,
                action,
            });
        }
        match on_give_up {
            OnGiveUp::Continue => self.skip_dependents(slot, i, now, out),
            OnGiveUp::SafeState => self.fail_safe(slot, SafeReason::GiveUp, now, out),
        }
    }

    /// `on_give_up: continue`: every instruction downstream of `i` misses
    /// this round.
    fn skip_dependents(&mut self, slot: usize, i: usize, now: RefTime, out: &mut Vec<Output>) {
        let Some(ps) = self.packs[slot].as_ref() else {
            return;
        };
        let from = ps.pack.instructions[i].id.clone();
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
            out.push(self.event(
                slot,
                Some(d),
                None,
                None,
                EventKind::Skip {
                    reason: format!("upstream `{from}` gave up"),
                },
                now,
            ));
        }
    }

    /// The pack stops: pending firings are skipped (and reported), running
    /// attempts finish but are not retried, and `safe_state` is issued.
    fn fail_safe(&mut self, slot: usize, reason: SafeReason, now: RefTime, out: &mut Vec<Output>) {
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
        let why = format!("pack entered its safe state ({})", reason.as_str());
        let mut skips = Vec::new();
        for (i, st) in ps.ins.iter_mut().enumerate() {
            if let Some((t, occ)) = st.pending.take() {
                self.queue.cancel(t);
                skips.push((i, None, Some(occ)));
            } else if !st.done
                && st.attempts.is_empty()
                && !matches!(
                    ps.pack.instructions[i].schedule,
                    Schedule::Every { .. } | Schedule::Cron { .. }
                )
            {
                // An `after` instruction still waiting on its upstreams.
                skips.push((i, None, None));
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
            st.done = st.done || !ps.pack.instructions[i].schedule.is_repeating();
        }
        let actions = ps.safe.clone();
        let key = ps.key.clone();
        self.packs[slot] = Some(ps);
        for (i, id, occ) in skips {
            out.push(self.event(
                slot,
                Some(i),
                id,
                occ,
                EventKind::Skip {
                    reason: why.clone(),
                },
                now,
            ));
        }
        out.push(self.event(slot, None, None, None, EventKind::SafeState { reason }, now));
        out.push(Output::SafeState {
            pack: key,
            actions,
            reason,
        });
    }
}
