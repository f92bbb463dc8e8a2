//! The scheduler state machine.
//!
//! Inputs: packs, `now`, attempt results, lease loss, shutdown, downtime.
//! Outputs: [`Output`]s in the order the runtime must act on them, each
//! entry point's returned as an [`Outputs`] value (must be used; filled in
//! a buffer the core keeps, so no call allocates in steady state). It never
//! reads a clock or touches a device, so tests drive it on simulated time
//! and every run with the same inputs and seed gives the same outputs.
//!
//! The pieces: `install` (taking a pack: version decision, carry-over from
//! the replaced version, first occurrences), `due` (what an occurrence does
//! when its instant comes: fire, late, gap and `catch_up`, journal records),
//! `outcome` (results, retries, dependents, give-up, safe state), `tick`
//! (what comes due in the queue, handed to `due` and `outcome`), `stop`
//! (cancel, lease or clock lost, shutdown: packs sent to their safe state),
//! `fence` (a staged switch's instant: nothing of the held version due
//! after it is released).

mod attempts;
mod due;
mod fence;
mod install;
mod outcome;
mod stop;
mod tick;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use attempts::Attempts;
use std::sync::Arc;
use std::time::Duration;

use baton_proto::RefTime;
use baton_proto::pack::{Action, Pack};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::id::{ExecutionId, PackKey};
use crate::once::{OnceKey, OnceKind, Prior, PriorOutcome};
use crate::output::{Event, EventKind, Output, SafeReason};
use crate::outputs::{Outputs, WithOutputs};
use crate::timing::{TimerId, TimingWheel};

/// Tunables of the core.
#[derive(Clone, Debug)]
pub struct Config {
    /// Seed of the jitter RNG: the same seed gives the same retry instants.
    pub seed: u64,
    /// `catch_up: all` fires at most this many missed occurrences per
    /// gap (the most recent ones); the rest are skipped and the count
    /// reported.
    pub catch_up_cap: usize,
    /// Emit the routine events, `Fire` and `Ok` (default: yes). A runtime
    /// whose own records say that every attempt started and how it ended,
    /// and that does not log these, turns them off: two events per firing,
    /// each a handful of allocations, were a tenth of its CPU.
    pub routine_events: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            seed: 0,
            catch_up_cap: 100,
            routine_events: true,
        }
    }
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
    /// The instruction's pending occurrence (for `after`, due at its
    /// release: the planned instant, or the upstream's success if later).
    Occurrence(RefTime),
    /// A missed occurrence replayed by `catch_up: all` / `last`.
    CatchUp(RefTime),
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

impl Entry {
    /// The occurrence at `at` of the instruction this entry is for.
    fn occurrence(&self, at: RefTime) -> Occurrence {
        Occurrence {
            slot: self.slot,
            instr: self.instr,
            at,
        }
    }
}

/// One occurrence of one instruction of a held pack: what nearly every
/// decision about an occurrence needs, passed as one value rather than
/// three loose arguments (whose order a call could swap). A handle, not
/// the state: the state stays in [`Scheduler::packs`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Occurrence {
    /// The pack's slot in [`Scheduler::packs`].
    slot: usize,
    /// The instruction's index in its pack.
    instr: usize,
    /// The occurrence's instant (the one its execution ids carry).
    at: RefTime,
}

#[derive(Clone, Debug)]
struct Attempt {
    id: ExecutionId,
    running: bool,
    timer: Option<TimerId>,
    /// When its timeout expires (running) or its retry is due (waiting):
    /// kept so that a version carrying it over re-arms the same instant,
    /// not one counted from the replacement (an attempt armed ahead would
    /// otherwise time out before its own instant).
    deadline: RefTime,
    /// A device attempt past its timeout that the runtime could not
    /// withdraw (the device had it): its own result decides if it comes
    /// within one more timeout, else it is ended, outcome unknown.
    too_late: bool,
}

/// A missed occurrence waiting to be replayed.
#[derive(Clone, Copy, Debug)]
struct Replay {
    occ: RefTime,
    release: RefTime,
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
    attempts: Attempts,
    /// Missed occurrences waiting to be replayed (catch-up), oldest first.
    catching: Vec<Replay>,
    /// A one-shot (`at`) was handed to the runtime under this state. Kept
    /// while its pack is stopped, so that the same version installed again
    /// after a cancel (the core allows it; the agent's admission does
    /// not), however long after, neither fires it again nor reports it
    /// missed: its give-up would name an execution that ran.
    fired: bool,
}

impl InstrState {
    /// Remove an occurrence's attempt record.
    fn take_attempt(&mut self, occ: RefTime) -> Option<Attempt> {
        let a = self.attempts.remove(&occ);
        self.release_empty();
        a
    }

    /// Give buffers back once empty: with 10 000 instructions their
    /// capacity would be most of the agent's memory.
    fn release_empty(&mut self) {
        if self.catching.is_empty() && self.catching.capacity() > 0 {
            self.catching = Vec::new();
        }
    }
}

#[derive(Debug)]
struct PackState {
    key: PackKey,
    pack: Arc<Pack>,
    generation: u64,
    /// First acceptance: the anchor of `every` schedules without `start_at`,
    /// kept across versions and restarts so neither shifts the phase.
    anchor: RefTime,
    status: Status,
    deps: Vec<Vec<usize>>,
    safe: Arc<Vec<Action>>,
    ins: Vec<InstrState>,
    /// Restored after a restart: the agent was up until this instant.
    /// One-shots due before it were handled then.
    resumed: Option<RefTime>,
    /// A staged switch's instant: nothing of this version due after it is
    /// released ([`Scheduler::switch_fence`]). Goes with the version.
    fence: Option<fence::Fence>,
    /// Each instruction's position by the fingerprint of its id
    /// ([`print`]): a result names its instruction by id, and a search
    /// per result cost 18 µs at 10 000 instructions. Of two ids with one
    /// fingerprint the first is kept ([`PackState::position`] checks).
    by_id: HashMap<u64, u32, foldhash::fast::FixedState>,
}

impl PackState {
    /// The position of the instruction with id `id`.
    fn position(&self, id: &str) -> Option<usize> {
        let search = || self.pack.instructions.iter().position(|x| x.id == id);
        match self.by_id.get(&print(id)) {
            Some(&i)
                if self
                    .pack
                    .instructions
                    .get(i as usize)
                    .is_some_and(|x| x.id == id) =>
            {
                Some(i as usize)
            }
            // Another id with the same fingerprint was kept.
            Some(_) => search(),
            // Every id is in the map: `id` is none of them.
            None if self.by_id.len() == self.pack.instructions.len() => None,
            // Fingerprints shared (or a pack past u32 instructions).
            None => search(),
        }
    }

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

    /// The once-only key of an output about occurrence `occ` of `i`.
    fn once(&self, i: usize, occurrence: RefTime, kind: OnceKind) -> OnceKey {
        OnceKey {
            pack: self.key.clone(),
            version: self.pack.version,
            instruction: self.pack.instructions[i].id.clone(),
            occurrence,
            kind,
        }
    }

    /// Key of the journal-record index for instruction `i`.
    fn ran_key(&self, i: usize) -> String {
        ran_key(&self.key, self.pack.version, &self.pack.instructions[i].id)
    }
}

fn ran_key(pack: &PackKey, version: u64, instruction: &str) -> String {
    format!("{}/{}/v{version}/{instruction}", pack.tenant, pack.pack)
}

/// The scheduler core.
#[derive(Debug)]
pub struct Scheduler {
    cfg: Config,
    packs: Vec<Option<PackState>>,
    by_key: HashMap<PackKey, usize>,
    queue: TimingWheel<Entry>,
    prior: HashMap<String, PriorOutcome>,
    /// Occurrences that started before a restart (any attempt not
    /// `NotRun`), per instruction: never counted as missed.
    ran: OccurrencesBy,
    /// Occurrences reported not run before a restart (withdrawn, stopped,
    /// too late), per instruction: `catch_up` may still replay them, but a
    /// gap does not report them missed a second time.
    not_run: OccurrencesBy,
    /// Once-only outputs already journalled: not emitted again.
    done: HashSet<String>,
    /// Ids fired in this run, by a 64-bit fingerprint of their text
    /// ([`print`]), each with the instant after which no path can derive
    /// it again (its occurrence plus the instruction's `max_lateness`,
    /// plus a margin): pruned past that, so a long-running agent's memory
    /// does not grow with every firing. A fingerprint, not the text: 16
    /// bytes an entry and no allocation of its own (holding the text kept
    /// every firing's id alive, scattered over the heap, for that window:
    /// megabytes at 10 000 firings/s, which no trim could give back). Two
    /// ids of one fingerprint (odds of 2^-64 a pair) would only keep the
    /// second from firing, reported.
    fired: HashMap<u64, RefTime, foldhash::fast::RandomState>,
    /// Where a firing's id is formatted (see `fire`).
    id_buf: String,
    /// When `fired` and `prior` were last pruned.
    last_prune: RefTime,
    rng: ChaCha8Rng,
    next_generation: u64,
    /// Attempts still running for a pack version that is gone (replaced,
    /// or stopped and pushed again): their results still end their
    /// occurrence, but nothing follows from them.
    detached: HashMap<ExecutionId, Option<TimerId>>,
    /// Occurrences (pack slot, instruction, instant) that a replaced
    /// version had handed out when the newer one came, with that version:
    /// asked to be withdrawn ([`Output::Withdraw`]). Removed when the
    /// runtime withdrew it (the newer version fires the occurrence); one
    /// left when the newer version's occurrence comes due was too late to
    /// withdraw: the old attempt is the occurrence's execution, and the
    /// newer one is reported not run (`duplicate`).
    claimed: BTreeMap<(usize, String, RefTime), u64>,
    /// One-shots (pack slot, instruction id) whose `at` instant fired and
    /// ended under a replaced version: a newer version with the same
    /// instant does not fire it again (once per occurrence, whatever the
    /// version), it reports it not run (`duplicate`).
    shots: HashMap<(usize, String), Vec<RefTime>>,
    /// The output buffer every entry point fills and lends back as its
    /// [`Outputs`]: kept, so a call does not allocate in steady state.
    out: Vec<Output>,
}

const NS: i64 = 1;

/// Safety margin past the last instant an id could be derived again. The
/// core never moves an instruction's next occurrence backwards (a clock
/// step back only delays it), so an id cannot come back after its
/// `max_lateness`; the margin only absorbs rounding. Small, because the
/// record is proportional to it: 10 000 firings/s × 60 s was 600 000 ids.
const PRUNE_MARGIN: Duration = Duration::from_secs(2);
/// How often (in reference time) the id records are pruned.
const PRUNE_EVERY: Duration = Duration::from_secs(1);
/// Journal records of attempts older than this are dropped from memory once
/// the agent runs: restored packs resolve their recent occurrences from them
/// at start-up; older one-shots are settled by `last_alive` (see `restore`).
const PRIOR_KEEP: Duration = Duration::from_secs(24 * 3600);

fn fmt_d(d: Duration) -> String {
    baton_proto::time::format_duration(d)
}

fn just_before(t: RefTime) -> RefTime {
    RefTime::from_nanos(t.as_nanos().saturating_sub(NS))
}

/// The queue's order among equal deadlines: higher priority first, then
/// pack order (slots are handed out at first acceptance), then instruction
/// order.
fn tiebreak(ps: &PackState, slot: usize, i: usize) -> u64 {
    let priority = ps.pack.instructions.get(i).map_or(0, |ins| ins.priority);
    let prio = u64::from(255 - priority);
    (prio << 48) | ((slot as u64 & 0xffff_ffff) << 16) | (i as u64 & 0xffff)
}

/// The fingerprint [`Scheduler`] keeps of a fired id (FNV-1a, 64 bits).
fn print(id: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in id.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Occurrences per instruction ([`ran_key`]).
type OccurrencesBy = HashMap<String, BTreeSet<RefTime>>;

/// Index the journal's records, per instruction: which occurrences started,
/// and which were only reported not run.
fn index_prior(attempts: &HashMap<String, PriorOutcome>) -> (OccurrencesBy, OccurrencesBy) {
    let (mut ran, mut not_run) = (OccurrencesBy::new(), OccurrencesBy::new());
    for (text, outcome) in attempts {
        if let Some(id) = ExecutionId::parse(text) {
            let into = if *outcome == PriorOutcome::NotRun {
                &mut not_run
            } else {
                &mut ran
            };
            into.entry(ran_key(&id.pack, id.version, &id.instruction))
                .or_default()
                .insert(id.occurrence);
        }
    }
    (ran, not_run)
}

impl Scheduler {
    /// A core that knows what happened before a restart (from the journal):
    /// it never fires any of those attempts again, and never emits a
    /// once-only output whose key is in [`Prior::done`]. A plain
    /// `HashMap<String, PriorOutcome>` converts into a [`Prior`] with no
    /// done keys.
    pub fn new(cfg: Config, prior: impl Into<Prior>) -> Self {
        let prior = prior.into();
        let (ran, not_run) = index_prior(&prior.attempts);
        Scheduler {
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            cfg,
            packs: Vec::new(),
            by_key: HashMap::new(),
            queue: TimingWheel::new(),
            ran,
            not_run,
            prior: prior.attempts,
            done: prior.done,
            fired: HashMap::default(),
            id_buf: String::new(),
            last_prune: RefTime::MIN,
            next_generation: 1,
            detached: HashMap::new(),
            claimed: BTreeMap::new(),
            shots: HashMap::new(),
            out: Vec::new(),
        }
    }

    /// Run one entry point's decisions into the core's output buffer
    /// (taken out of `self` meanwhile), and hand them back with its answer.
    fn decide<T>(
        &mut self,
        entry: impl FnOnce(&mut Self, &mut Vec<Output>) -> T,
    ) -> WithOutputs<'_, T> {
        let mut out = std::mem::take(&mut self.out);
        out.clear();
        let value = entry(self, &mut out);
        self.out = out;
        WithOutputs {
            value,
            outputs: Outputs::new(&mut self.out),
        }
    }

    /// [`Scheduler::decide`] for an entry point that answers nothing else.
    fn outputs(&mut self, entry: impl FnOnce(&mut Self, &mut Vec<Output>)) -> Outputs<'_> {
        self.decide(entry).outputs
    }

    /// The earliest instant at which [`Scheduler::tick`] has work.
    pub fn next_wake(&self) -> Option<RefTime> {
        self.queue.next_deadline().map(RefTime::from_nanos)
    }

    /// Entries waiting in the timing structure (one per repeating
    /// instruction, plus retries, timeouts and catch-up replays in flight).
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

    /// The pack's anchor: its *first* acceptance, kept across versions. It
    /// is the phase of `every` schedules without `start_at`; the runtime
    /// journals it (not the latest version's acceptance) and passes it back
    /// to [`Scheduler::restore`].
    pub fn anchor(&self, key: &PackKey) -> Option<RefTime> {
        Some(self.packs[*self.by_key.get(key)?].as_ref()?.anchor)
    }

    /// Take a validated pack at `now`.
    pub fn accept(
        &mut self,
        pack: Pack,
        now: RefTime,
    ) -> WithOutputs<'_, Result<Accepted, AcceptError>> {
        self.decide(|s, out| s.install(pack, None, None, now, out))
    }

    /// Take a validated pack as of the instant `at`, its schedule anchored
    /// there: what a stage's agents do to switch together
    /// (`activate: together`). Call it once the clock reached `at` (a
    /// little after, by the wake-up's lateness): the replaced version ran
    /// everything up to `at` as usual; every changed or new instruction of
    /// this one starts after `at`, as after any replacement (an `every`
    /// without `start_at` fires at `at + period`, `at + 2 period`, ...:
    /// the same instants on every agent that switches at `at`, whatever
    /// phase its old version had). Unchanged instructions carry over, and
    /// what the old version handed out past `at` is asked back
    /// ([`Output::Withdraw`]), exactly as [`Scheduler::accept`] does.
    ///
    /// `now` is when the switch really happens (at or after `at`): what
    /// the old version fired up to `now` stays fired, and the new grid
    /// starts after `now`, so an occurrence between the instant and a
    /// late switch never fires under both versions. A runtime that fenced
    /// the old version at `at` ([`Scheduler::switch_fence`], as the agent
    /// does while a version is staged) had it fire nothing after `at`:
    /// then such an occurrence of a changed instruction is reported not
    /// run (`replaced`) and fires under neither, and one of an unchanged
    /// instruction fires under the new version, late.
    pub fn accept_at(
        &mut self,
        pack: Pack,
        at: RefTime,
        now: RefTime,
    ) -> WithOutputs<'_, Result<Accepted, AcceptError>> {
        self.decide(|s, out| s.install(pack, Some(at), None, now.max(at), out))
    }

    /// Take a pack back after a restart: `anchor` is what
    /// [`Scheduler::anchor`] said before (its first acceptance), and the
    /// agent was up until at least `last_alive`.
    ///
    /// Repeating occurrences whose instant passed while the agent was down
    /// (after `last_alive`, before `now`) follow `catch_up` (see
    /// `catchup`): `none` drops them, `last` fires the latest one not past
    /// `until`, `all` replays them at the schedule's own pace; `max_lateness`
    /// plays no part. The next occurrence at or after `now` fires on time.
    /// Occurrences with a journal record are resolved from it, never counted
    /// as missed. Missed one-shots (`at`, and `after` rounds whose planned
    /// instant passed) fire once if still within `max_lateness`, else are
    /// reported missed and the failure path runs.
    pub fn restore(
        &mut self,
        pack: Pack,
        anchor: RefTime,
        last_alive: RefTime,
        now: RefTime,
    ) -> WithOutputs<'_, Result<Accepted, AcceptError>> {
        self.decide(|s, out| s.install(pack, Some(anchor), Some(last_alive), now, out))
    }

    /// Take back a pack that had entered its safe state for good before the
    /// restart (give-up, cancel): it is held, stopped, fires nothing, and
    /// its safe state is asserted again — the device may have lost it — as
    /// one [`Output::SafeState`] with `once: None` and no feedback event (it
    /// is not a new give-up). A higher version replaces it as usual.
    pub fn restore_stopped(
        &mut self,
        pack: Pack,
        anchor: RefTime,
        reason: SafeReason,
        now: RefTime,
    ) -> WithOutputs<'_, Result<Accepted, AcceptError>> {
        self.decide(|s, out| {
            let key = PackKey::of(&pack);
            let r = s.install(pack, Some(anchor), Some(now), now, out)?;
            if let Some(&slot) = s.by_key.get(&key) {
                s.stop_quietly(slot, reason, out);
            }
            Ok(r)
        })
    }

    /// The core could not act until `now` (a forward clock step, a suspend,
    /// a stalled runtime): every repeating occurrence now overdue is treated
    /// as missed during downtime and follows `catch_up`, exactly as at a
    /// restart — no burst, no silence; the schedule resumes on time.
    /// Without this call, `tick` treats an occurrence later than its
    /// `max_lateness` the same way (and fires the in-bound ones late).
    pub fn downtime(&mut self, now: RefTime) -> Outputs<'_> {
        self.outputs(|s, out| s.downtime_into(now, out))
    }

    fn downtime_into(&mut self, now: RefTime, out: &mut Vec<Output>) {
        for slot in 0..self.packs.len() {
            let n = match self.packs[slot].as_ref() {
                Some(ps) if ps.status == Status::Active => ps.ins.len(),
                _ => continue,
            };
            for i in 0..n {
                self.gap_until(slot, i, now, out);
            }
        }
    }

    /// The reference clock (the agent's estimate of it) stepped by
    /// `step_ns` (`reference − monotonic` after minus before), seen at
    /// `now` (after the step). What a step means depends on the pack:
    ///
    /// - a pack placed on absolute time (`at`, `cron`, `start_at`,
    ///   `until`: [`Pack::needs_absolute_time`]) keeps its instants: a
    ///   forward step is downtime for it ([`Scheduler::downtime`]:
    ///   `catch_up`, reason `clock`), a backward one an early wake
    ///   (nothing fires early);
    /// - a pack of intervals only (`every` without `start_at`/`until`,
    ///   `after`) runs on the local clock, which did not step: its schedule
    ///   moves with the step (its phase anchor and next occurrences), so
    ///   its next firing comes when it would have come. Nothing of it is
    ///   skipped, nothing fires twice: a jittery reference (a link clock
    ///   still syncing) cannot make a plain `every` miss a beat.
    ///
    /// Retries and catch-up replays keep their instants.
    pub fn clock_stepped(&mut self, step_ns: i64, now: RefTime) -> Outputs<'_> {
        self.outputs(|s, out| s.clock_stepped_into(step_ns, now, out))
    }

    fn clock_stepped_into(&mut self, step_ns: i64, now: RefTime, out: &mut Vec<Output>) {
        for slot in 0..self.packs.len() {
            let (n, absolute) = match self.packs[slot].as_ref() {
                Some(ps) if ps.status == Status::Active => {
                    (ps.ins.len(), ps.pack.needs_absolute_time())
                }
                _ => continue,
            };
            if absolute {
                if step_ns > 0 {
                    for i in 0..n {
                        self.gap_until(slot, i, now, out);
                    }
                }
            } else {
                self.shift(slot, step_ns);
            }
        }
    }

    /// Moves a pack's schedule by `step_ns` on the reference scale (see
    /// [`Scheduler::clock_stepped`]).
    fn shift(&mut self, slot: usize, step_ns: i64) {
        let by = |t: RefTime| RefTime::from_nanos(t.as_nanos().saturating_add(step_ns));
        let Some(ps) = self.packs[slot].as_mut() else {
            return;
        };
        ps.anchor = by(ps.anchor);
        let mut moved = Vec::new();
        for (i, st) in ps.ins.iter_mut().enumerate() {
            st.round_occ = st.round_occ.map(by);
            if let Some((timer, occ)) = st.pending.take() {
                moved.push((i, timer, by(occ)));
            }
        }
        for (i, timer, occ) in moved {
            self.queue.cancel(timer);
            self.arm_occurrence(slot, i, occ, occ);
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
            version: None,
            once: None,
        })
    }

    /// Whether a once-only output was journalled before a restart.
    fn is_done(&self, key: &OnceKey) -> bool {
        !self.done.is_empty() && self.done.contains(&key.to_string())
    }

    fn make_id(&self, slot: usize, i: usize, occ: RefTime, attempt: u32) -> ExecutionId {
        self.packs[slot]
            .as_ref()
            .expect("ids are only made for held packs")
            .id(i, occ, attempt)
    }

    /// Queue an entry for instruction `i` of `ps`, the pack in `slot`.
    ///
    /// Takes the queue rather than `self`, so that `ps` may be borrowed from
    /// `self.packs` meanwhile.
    fn enqueue(
        queue: &mut TimingWheel<Entry>,
        ps: &PackState,
        slot: usize,
        i: usize,
        at: RefTime,
        kind: EntryKind,
    ) -> TimerId {
        queue.insert_with_tiebreak(
            at.as_nanos(),
            tiebreak(ps, slot, i),
            Entry {
                slot,
                generation: ps.generation,
                instr: i,
                kind,
            },
        )
    }

    /// Queue an entry for instruction `i` of the pack in `slot`.
    fn arm(&mut self, slot: usize, i: usize, at: RefTime, kind: EntryKind) -> Option<TimerId> {
        let ps = self.packs[slot].as_ref()?;
        Some(Self::enqueue(&mut self.queue, ps, slot, i, at, kind))
    }

    /// Make occurrence `occ`, due `at`, the instruction's pending one.
    fn arm_occurrence(&mut self, slot: usize, i: usize, occ: RefTime, at: RefTime) {
        let id = self.arm(slot, i, at, EntryKind::Occurrence(occ));
        if let (Some(id), Some(ps)) = (id, self.packs[slot].as_mut()) {
            ps.ins[i].pending = Some((id, occ));
        }
    }

    /// Remove a pack version's entries from the queue. The state keeps
    /// which occurrence was next, so unchanged instructions carry it over.
    fn cancel_timers(&mut self, ps: &PackState) {
        for st in &ps.ins {
            if let Some((id, _)) = st.pending {
                self.queue.cancel(id);
            }
            for id in st.attempts.values().filter_map(|a| a.timer) {
                self.queue.cancel(id);
            }
            for id in st.catching.iter().filter_map(|r| r.timer) {
                self.queue.cancel(id);
            }
        }
    }
}
