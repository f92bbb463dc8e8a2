//! The control loop: a loop over events (core outputs, device results,
//! exec results, time) with **one way out**: [`Agent::run`] always ends in
//! `Agent::wind_down`, which drives every held pack's safe state through
//! the device before it touches the journal, whatever ended the loop (a
//! stop request, a journal error, a full disk). `Agent` holds the loop's
//! parts, grouped by job; the other files of `runtime/` are its methods
//! by subject.

use std::sync::Arc;
use std::time::Duration;

use baton_control::admission::Admission;
use baton_control::clock_watch::ClockWatch;
use baton_control::held::HeldPacks;
use baton_journal::{Journal, JournalError, Outcome};
use baton_proto::RefTime;
use baton_proto::time::fmt_ns;
use baton_sched::{AttemptResult, OnceKey, Scheduler};

use super::arming::Arming;
use super::buffers::{Batch, OutputBufs};
use super::error::RuntimeError;
use super::feedback::Tally;
use super::firing::Firing;
use super::heap_trim::HeapTrim;
use super::parts::Parts;
use super::plane::Plane;
use super::ports::{Clock, Ports};
use super::safe_states::SafeStates;
use super::stop::{StopCause, StopFlag};
use super::upkeep::{Systemd, Upkeep};
use super::{restart, safety};
use crate::config::AgentConfig;

/// How long the way out waits for safe-state writes to land.
pub(super) const SAFE_STATE_WAIT: Duration = Duration::from_secs(2);
/// How long the way out waits for the dispatcher thread to end.
pub(super) const DEVICE_STOP_WAIT: Duration = Duration::from_secs(2);
/// On the way out, a dispatcher busy this long without progress is stalled
/// (its safe-state writes are then written directly, see `exit.rs`).
pub(super) const STALL_GRACE: Duration = Duration::from_millis(250);
/// Journal heartbeat (last-alive instant, group commit of lazy records).
pub(super) const HEARTBEAT: Duration = Duration::from_millis(100);

/// How long a firing's result may wait for the loop's next pass: the
/// horizon, within 10–50 ms. Its passes for results write the journal's lazy
/// records but sync nothing and arm nothing (the arming passes, a horizon
/// apart, do): so a longer horizon means fewer fdatasyncs, not later
/// feedback.
pub(super) fn results_window(arm_horizon: Duration) -> Duration {
    // Never under the dispatcher's own deferral (10 ms): a horizon of 0
    // would otherwise make the loop pass without pause while anything is
    // in flight (a pulse's width, a slow device call).
    arm_horizon.clamp(Duration::from_millis(10), Duration::from_millis(50))
}
/// How long the journal remembers attempts and once-only keys, by their
/// reference instant. After a restart the core consults the journal only
/// for occurrences after the last durable heartbeat (earlier ones are
/// settled as handled), which is at most the heartbeat period plus the
/// journal's lazy sync interval (1 s) old; the attempts the dispatch
/// ledger resolves were armed within a horizon (at most 1 s) of the stop.
/// Twice the first is room to spare. Not longer: at 10 000 firings/s
/// memory is proportional to it (5 s held ~60 000 ids, ~5 MB).
pub(super) const JOURNAL_RETENTION: Duration = Duration::from_millis(2500);
/// Jobs waiting for dispatcher credit above which no more are armed.
pub(super) const MAX_BACKLOG: usize = 4096;
/// Longest sleep of an idle loop.
pub(super) const MAX_IDLE: Duration = Duration::from_secs(1);

/// The running agent (control side): its parts, grouped by job.
pub struct Agent {
    pub(super) cfg: AgentConfig,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) core: Scheduler,
    pub(super) journal: Journal,
    /// The device and the exec pool.
    pub(super) ports: Ports,
    /// What is armed, tallied, and the buffers reused between passes.
    pub(super) firing: Firing,
    /// Admission, the held packs, the clock's watch, the controller link.
    pub(super) plane: Plane,
    /// The safe-state book: the panic hook's table, the last-resort
    /// driver, what was driven, how the way out went.
    pub(super) safe: SafeStates,
    /// Heap trimming, the heartbeat, systemd, `/metrics`.
    pub(super) upkeep: Upkeep,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent").field("id", &self.cfg.id).finish()
    }
}

/// Journal an attempt's result: one typed record.
pub(super) fn journal_result(
    journal: &mut Journal,
    id: &str,
    r: &AttemptResult,
) -> Result<(), JournalError> {
    let outcome = match r {
        AttemptResult::Ok { .. } => Outcome::Succeeded,
        AttemptResult::Late { .. } => Outcome::NotRun,
        AttemptResult::Failed(_) => Outcome::Failed,
    };
    journal.record_finished(id, outcome)
}

/// Journal a once-only action's key (durable) before it is taken.
pub(super) fn journal_once(journal: &mut Journal, key: &OnceKey) -> Result<(), JournalError> {
    journal
        .record_once(&key.to_string(), key.occurrence.as_nanos())
        .map(|_| ())
}

/// Large buffers (a burst's outputs, a big journal record) come from
/// `mmap` and go back to the kernel when freed. glibc otherwise raises its
/// mmap threshold after the first such free (up to 32 MiB), and later
/// bursts land on the heap, whose freed middle is never returned: a burst
/// of 10 000 firings then left ~25 MB resident for good. glibc only; other
/// allocators return large blocks anyway.
pub(super) fn keep_large_allocations_returnable() {
    if cfg!(target_env = "gnu") && !baton_sys::heap::set_mmap_threshold(256 * 1024) {
        tracing::warn!("mallopt(M_MMAP_THRESHOLD) refused: bursts may leave memory resident");
    }
}

impl Agent {
    /// Assemble the loop from its parts, restore the journalled packs (a
    /// pack that no longer passes this agent's checks is kept stopped in
    /// its safe state and reported; the others run) and load `cfg.packs`.
    pub fn new(cfg: AgentConfig, parts: Parts) -> Result<Agent, RuntimeError> {
        let started = parts.clock.to_mono(parts.clock.now());
        let Parts {
            clock,
            journal,
            recovered,
            device,
            exec,
            exec_rx,
            safe_table,
            ledger,
            safe_driver,
        } = parts;
        let mut journal = journal;
        let mut recovered = recovered;
        let mut tally = Tally::default();
        let slots = match &ledger {
            Some(path) => restart::resolve_armed(
                path,
                &cfg.data_dir,
                &mut journal,
                &mut recovered,
                &mut tally,
            )?,
            None => crate::ledger::Slots::anonymous(),
        };
        restart::log_opened(&recovered);
        let now = clock.now();
        let trust = match &cfg.trust_dir {
            Some(dir) => Some(super::trust::load(dir, &cfg.data_dir)?),
            None => None,
        };
        let mut agent = Agent {
            core: restart::core_for(&recovered, now),
            cfg,
            clock,
            journal,
            ports: Ports {
                device,
                exec,
                exec_rx,
            },
            firing: Firing {
                arming: Arming::new(slots),
                tally,
                lead_pass_for: None,
                bufs: OutputBufs::default(),
                batch: Batch::default(),
                first_pass: true,
                exit_after: None,
            },
            plane: Plane {
                admission: Admission::default(),
                held: HeldPacks::default(),
                clock_watch: ClockWatch::new(started),
                uplink: None,
                trust,
                update: Default::default(),
            },
            safe: SafeStates::new(safe_table, safe_driver),
            upkeep: Upkeep {
                heap_trim: HeapTrim::default(),
                last_heartbeat: now,
                systemd: Systemd::default(),
                metrics: None,
                trial: None,
                rolled_back: None,
            },
        };
        // Before anything is restored (and so armed): a failure here leaves
        // nothing that would need the way out.
        let (trial, boot) = super::update::state::Trial::at_start(
            &agent.cfg.data_dir,
            agent.mono_now(),
            agent.cfg.update.confirm_within,
        );
        agent.upkeep.trial = trial;
        if let Some(b) = boot {
            agent.upkeep.rolled_back = b.rolled_back;
            agent.plane.update.given_up = b.given_up;
        }
        agent.start_uplink()?;
        if safety::marker(&agent.cfg.data_dir).exists() {
            agent.drive_owed_safe_states(&recovered)?;
        }
        agent.restore(recovered)?;
        Ok(agent)
    }

    /// Whether the core holds `key` and runs it (not stopped in its safe
    /// state): what the leases and the clock's loss may stop.
    pub(super) fn running(&self, key: &baton_sched::PackKey) -> bool {
        self.core.held(key).is_some_and(|(_, active)| active)
    }

    pub fn idle(&self) -> bool {
        self.core.next_wake().is_none()
            && self.firing.arming.idle()
            && self.plane.clock_watch.nothing_waits()
    }

    /// Run until `stop` is set or, with `exit_when_idle`, until nothing is
    /// left to do; then, whatever ended the loop, drive the safe state,
    /// stop the threads and flush the journal. The one way out.
    pub fn run(&mut self, stop: &StopFlag, exit_when_idle: bool) -> StopCause {
        let cause = match self.run_loop(stop, exit_when_idle) {
            Ok(c) => c,
            Err(e) => StopCause::Fault(e),
        };
        if let StopCause::Fault(e) = &cause {
            tracing::error!("stopping on a fault: {}", super::error::Chain(e));
        }
        match &cause {
            StopCause::Update(version) => self.wind_down_to_restart(version),
            _ => self.wind_down(),
        }
        self.safe.exit_cause(cause)
    }

    pub(super) fn run_loop(
        &mut self,
        stop: &StopFlag,
        exit_when_idle: bool,
    ) -> Result<StopCause, RuntimeError> {
        // The journal is open and the packs restored and loaded.
        self.systemd_ready();
        loop {
            if let Some(sig) = stop.requested() {
                return Ok(StopCause::Requested(sig));
            }
            if exit_when_idle && self.idle() {
                return Ok(StopCause::Idle);
            }
            if self
                .firing
                .exit_after
                .is_some_and(|n| (self.firing.tally.hist.len() + self.firing.tally.not_run) >= n)
            {
                return Ok(StopCause::Idle);
            }
            self.step()?;
            if let Some(version) = self.update_restart_due() {
                return Ok(StopCause::Update(version));
            }
            self.systemd_tick();
            self.wait();
        }
    }

    /// Sleep until the next thing to do; results, exec completions and
    /// stop requests unpark this thread earlier.
    pub(super) fn wait(&mut self) {
        let Some(until) = self.next_pass() else {
            return;
        };
        let d = until.since(self.clock.now());
        if d.is_zero() {
            return;
        }
        // Successful results may be left for the pass at `until` (see
        // `Dispatcher::defer_results_within`); any that came since this
        // pass collected make it run again at once. With a backlog waiting
        // for credits, every result wakes the loop (its credit is needed).
        let wake = (self.firing.arming.backlog_len() == 0).then(|| self.clock.to_mono(until));
        if self.ports.device.plan_wake(wake) {
            self.ports.device.plan_wake(None);
            return;
        }
        std::thread::park_timeout(d);
        self.ports.device.plan_wake(None);
    }

    /// When the loop's next pass is due: `None` at once, else the instant
    /// it parks until (results, exec completions and stop requests unpark
    /// it earlier).
    pub fn next_pass(&mut self) -> Option<RefTime> {
        let now = self.clock.now();
        let mut until = now + MAX_IDLE;
        // While the device's backlog is full the core is not ticked (see
        // `step`): its overdue entries wait for credits, which come back
        // with results (and unpark the loop), not for a pass that could do
        // nothing but spin.
        let throttled = self.firing.arming.backlog_len() >= MAX_BACKLOG;
        if let Some(w) = self.core.next_wake().filter(|_| !throttled) {
            // A pass starts a lead before the first firing it arms (room
            // for its fsync) and arms a whole horizon from there: under a
            // dense load one fsync covers a horizon of firings (group
            // commit). An entry already within its lead gets a pass now
            // (one queued since the last pass: a retry, a new pack); if
            // one such pass left it, it is a timeout (those are not taken
            // ahead): wake when it is due rather than spin through the lead.
            let lead_start = w.saturating_sub(self.cfg.arm_lead);
            if lead_start > now {
                until = until.min(lead_start);
            } else if self.firing.lead_pass_for == Some(w) {
                until = until.min(w);
            } else {
                self.firing.lead_pass_for = Some(w);
                return None;
            }
        }
        // Results of what is armed are collected (journalled, written, sent)
        // a results window apart, not only on the arming passes a horizon
        // apart: feedback is no later for a longer horizon.
        if self.ports.device.credits().in_flight() > 0 {
            until = until.min(now + results_window(self.cfg.arm_horizon));
        }
        if let Some(e) = self.firing.arming.next_exec() {
            until = until.min(e);
        }
        if let Some(l) = self.uplink_wake(now) {
            until = until.min(l);
        }
        if let Some(w) = self.systemd_wake(now) {
            until = until.min(w);
        }
        // The heartbeat rides a pass that comes anyway within half its
        // period after it is due (under a dense load, always the next
        // arming pass): a wake-up of its own only when none does.
        let heartbeat = self.upkeep.last_heartbeat + HEARTBEAT;
        if until > heartbeat + HEARTBEAT / 2 {
            until = heartbeat;
        }
        (until > now).then_some(until)
    }

    /// One pass: arm due firings, hand over what credits allow, collect
    /// results, start due programs, heartbeat.
    pub fn step(&mut self) -> Result<(), RuntimeError> {
        // Results first: a success left for this pass (see
        // `Dispatcher::defer_results_within`) must settle its attempt
        // before the core sees that attempt's timeout come due.
        self.collect()?;
        let now = self.clock.now();
        let mut out = self.firing.bufs.take();
        if let Some(step) = self.clock.resample() {
            tracing::warn!(
                step = %fmt_ns(step),
                "clock step detected: packs on absolute time stay on reference time (a forward step is downtime, a backward one an early wake); packs of intervals follow the local clock"
            );
            // Forward: the skipped span is downtime for packs on absolute
            // time, handled by catch_up (never a burst); backward needs
            // nothing (nothing fires early). Packs of intervals move with
            // the step: they never skip for it (`Scheduler::clock_stepped`).
            self.core
                .clock_stepped(step, self.clock.now())
                .drain_into(&mut out);
        }
        // Back-pressure: while the device has a backlog, the core is not
        // asked for more. What falls behind stays in the core, which then
        // fires it late within max_lateness or reports it skipped; memory
        // stays bounded however far the load exceeds what the box can do.
        // Arm only on a pass the core asks for (its next entry within the
        // lead): a pass for results, the link or the heartbeat arms
        // nothing, so under a dense load one fdatasync of start records
        // covers a whole horizon of firings whatever else wakes the loop
        // (each fdatasync rewrites the log's last flash page:
        // docs/bench/load.md).
        let core_due = self
            .core
            .next_wake()
            .is_some_and(|w| w <= now + self.cfg.arm_lead);
        if core_due && self.firing.arming.backlog_len() < MAX_BACKLOG {
            self.core
                .tick_ahead(now, self.cfg.arm_horizon)
                .drain_into(&mut out);
        }
        if std::mem::take(&mut self.firing.first_pass) {
            report_catch_up(&out, now);
        }
        self.process_in(&mut out)?;
        self.firing.bufs.give_back(out);
        self.pump()?;
        self.collect()?;
        self.start_due_exec()?;
        // The controller link: its events, leases, feedback (bounded).
        self.uplink_step()?;
        // Lines let go of are free once nothing armed may touch them.
        if self.plane.admission.has_lingering() {
            let arming = &self.firing.arming;
            self.plane
                .admission
                .settle_lingering(|p| arming.busy_lines(p));
        }
        // This pass's lazy records (results, feedback) in one write; the
        // ledger slots of attempts whose results it holds may be reused.
        self.journal.flush()?;
        self.firing.arming.journal_written();
        if now.since(self.upkeep.last_heartbeat) >= HEARTBEAT {
            let hb = self.journal.heartbeat(now.as_nanos())?;
            if let Some(e) = hb.compaction_error {
                tracing::error!("journal compaction failed (will retry): {e}");
            }
            self.upkeep.last_heartbeat = now;
            // A pass arms only when the core has something due; what it
            // keeps against repeats is pruned whether or not.
            self.core.prune_if_due(now);
            self.firing.arming.release_lingering(now);
            self.serve_cancel_requests()?;
            self.check_clock_loss()?;
            self.check_trial_deadline(self.mono_now())?;
            self.retry_clock_wait()?;
            self.publish_metrics();
            self.maybe_return_free_heap();
        }
        Ok(())
    }

    /// After a burst or a parsed pack, once nothing is due soon: see
    /// `heap_trim`.
    pub(super) fn maybe_return_free_heap(&mut self) {
        // Now, not the pass's start: the pass may have compacted the journal.
        let now = self.clock.now();
        let ended =
            self.firing.tally.hist.len() + self.firing.tally.not_run + self.firing.tally.failed;
        let next_due = [self.core.next_wake(), self.firing.arming.next_exec()]
            .into_iter()
            .flatten()
            .min();
        if self
            .upkeep
            .heap_trim
            .due(now, ended, next_due, self.firing.arming.idle())
        {
            let t0 = std::time::Instant::now();
            match crate::rt::return_free_heap() {
                Ok(heap) => {
                    tracing::debug!(?heap, took = ?t0.elapsed(), "free heap returned to the kernel");
                }
                Err(e) => tracing::error!(
                    "could not lock the heap again on fault after trimming it ({e}): it is locked whole, or not at all"
                ),
            }
            self.upkeep.heap_trim.done(now, ended);
        }
    }

    /// Stop once `n` attempts have ended, ran or not (a benchmark's pack
    /// that has no end of its own).
    pub fn exit_after(&mut self, n: u64) {
        self.firing.exit_after = Some(n);
    }

    /// Lateness histogram and counters so far.
    pub fn tally(&self) -> &Tally {
        &self.firing.tally
    }

    /// Keep the breakdown of each firing's time from now on
    /// ([`breakdown::Breakdown`], read through [`Agent::tally`]).
    pub fn measure_breakdown(&mut self) {
        self.firing.tally.breakdown = Some(Box::default());
    }

    /// Dispatcher telemetry.
    pub fn dispatcher_stats(&self) -> Option<&crate::dispatcher::Stats> {
        self.ports.device.stats()
    }

    /// Pending entries in the core.
    pub fn pending(&self) -> usize {
        self.core.pending()
    }

    /// The journal, read-only (outbox, id): for tests and telemetry.
    pub fn journal(&self) -> &Journal {
        &self.journal
    }
}

/// Attempts left before the test hook panics (0: off).
#[cfg(feature = "fault-injection")]
static PANIC_AFTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Test hook (`run --inject-panic-after N`, hidden): panic on the control
/// thread after N executed attempts, to prove the panic hook drives the
/// safe state. Off unless asked for.
#[cfg(feature = "fault-injection")]
pub fn inject_panic_after(n: u64) {
    PANIC_AFTER.store(n, std::sync::atomic::Ordering::Release);
}

#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub(super) fn panic_hook_test_point() {}

#[cfg(feature = "fault-injection")]
pub(super) fn panic_hook_test_point() {
    let left = PANIC_AFTER.load(std::sync::atomic::Ordering::Acquire);
    if left == 0 {
        return;
    }
    if left == 1 {
        panic!("injected panic (--inject-panic-after)");
    }
    PANIC_AFTER.store(left - 1, std::sync::atomic::Ordering::Release);
}

/// When the dispatcher surely holds no reference to a job's id any more.
pub(super) fn linger_until(scheduled: RefTime, width_ns: i64) -> RefTime {
    RefTime::from_nanos(
        scheduled
            .as_nanos()
            .saturating_add(width_ns)
            .saturating_add(1_000_000_000),
    )
}

/// What the first pass of a run arms that came due while the agent was
/// down: one batch, one start record, so after a power cut in the window
/// before their results are written these are `outcome unknown` together
/// (beyond the horizon's worth of the documented bound). Said once, so an
/// operator (and the crash test) can tell that batch's size.
pub(super) fn report_catch_up(out: &[baton_sched::Output], now: RefTime) {
    let overdue = out
        .iter()
        .filter(|o| matches!(o, baton_sched::Output::Fire(f) if f.scheduled < now))
        .count();
    if overdue > 0 {
        tracing::info!(
            overdue,
            "first pass: {overdue} firings already due (missed while the agent was down or starting) armed together"
        );
    }
}
