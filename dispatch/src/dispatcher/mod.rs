//! The dispatcher: one thread that drives GPIO at exact instants.
//!
//! It sleeps on a futex with an absolute `CLOCK_MONOTONIC` deadline until a
//! margin before the next job, then spins to the deadline. The margin is
//! learned from the wake-up latencies it observes, within a CPU budget
//! ([`margin_within`]: by default spinning may take 1 % of a core, so at
//! 1 000 firings a second a firing spins about 10 µs, at 100 a second
//! about 100 µs): a firing whose wake-up came later than the margin is
//! that much late, never later than the wake-up itself (what `cyclictest`
//! measures). An earlier job arriving wakes it at once (futex wake — no
//! polling).
//!
//! # Ownership and queues (why nothing here can deadlock)
//!
//! - The thread **owns the GPIO backend**. The control thread never touches
//!   it: line requests at pack acceptance are messages ([`Dispatcher::request_lines`])
//!   that this thread serves between firings. So the real-time thread never
//!   waits on a lock held by a thread doing IO, and the backend has no lock
//!   at all. The safe state's last resort (the way out when this thread is
//!   stuck, the panic hook) reaches the lines another way: each output line's
//!   [`baton_gpio::DirectLine`] (its own handle on the kernel's line),
//!   registered in [`DirectLines`] as lines are requested; the [`Fence`]
//!   keeps this thread's jobs off the lines from then on, and says whether a
//!   device call of this thread is still in progress.
//! - Jobs arrive and results leave through pre-allocated lock-free queues.
//!   The control thread keeps a **credit count** ([`Credits`]): it never has
//!   more jobs in flight than the result queue can hold, so a result push
//!   never finds the queue full and this thread never waits for the control
//!   thread. Only the control thread may wait (for a line request's answer,
//!   bounded), never the other way round.
//! - [`Dispatcher::stop`] waits for the thread a bounded time and then lets
//!   it go: `Drop` never blocks on a thread that may be stuck.
//!
//! After start-up nothing here allocates or blocks on IO on the firing path:
//! the local heap is pre-sized, execution ids are shared `Arc<str>` whose
//! last reference stays with the control thread. The one exception is the
//! sim backend, whose log write is a syscall.

mod margin;
mod thread;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering, fence};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, sync_channel};
use std::thread::{JoinHandle, Thread};
use std::time::Duration;

use baton_proto::pack::LineRef;
use crossbeam_queue::ArrayQueue;

use baton_service::watchdog::Heartbeat;

use crate::ledger::Slot;
use crate::rt::{RtConfig, RtStatus, futex_wait, futex_wake};
use baton_clock::{ClockEstimate, MonoTime};
use baton_gpio::{DirectLines, Direction, Gpio, GpioError, LineHandle};

/// What to do to a line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Drive to a level.
    Write(LineHandle, u8),
    /// Invert.
    Toggle(LineHandle),
    /// Drive to `value` for `width_ns`, then back (the end is its own
    /// timed job, never a sleep).
    Pulse {
        /// The line.
        line: LineHandle,
        /// Level during the pulse.
        value: u8,
        /// Length.
        width_ns: i64,
    },
    /// Sample.
    Read(LineHandle),
    /// Touch nothing: a `noop` is done at its instant like any firing (not
    /// when armed, up to an arming horizon earlier), and withdrawn by a
    /// safe state like one.
    Noop,
}

impl Op {
    /// The line this op touches (none for a noop).
    pub fn line(&self) -> Option<LineHandle> {
        match *self {
            Op::Write(h, _) | Op::Toggle(h) | Op::Read(h) => Some(h),
            Op::Pulse { line, .. } => Some(line),
            Op::Noop => None,
        }
    }

    /// Credits this op takes: a pulse yields two results (start and end).
    pub fn credits(&self) -> usize {
        match self {
            Op::Pulse { .. } => 2,
            _ => 1,
        }
    }
}

/// What a job is, by type (the control thread routes its result by this).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobKind {
    /// An attempt of an instruction: may be withdrawn or late.
    Attempt,
    /// A safe-state or on_failure write: never withdrawn, never late.
    Safe,
    /// The trailing edge of a pulse (made by this thread).
    PulseEnd,
}

/// One timed action.
#[derive(Clone, Debug)]
pub struct Job {
    /// When (monotonic).
    pub deadline: MonoTime,
    /// If it cannot run by then, it must not run at all.
    pub not_after: MonoTime,
    /// The control thread's handle for the result.
    pub ticket: u64,
    /// What kind of job.
    pub kind: JobKind,
    /// What.
    pub op: Op,
    /// Execution id (for the sim log and messages).
    pub id: Arc<str>,
    /// The attempt's slot in the dispatch ledger (`crate::ledger`): claimed
    /// right before the device call, so an attempt the control thread
    /// withdrew (a newer version, a timeout, its pack's safe state) never
    /// runs, and marked done right after (what a restart after `kill -9`
    /// reads). `None` for safe-state and on_failure actions; a pulse's end
    /// carries its pulse's slot (withdrawn: it ends at once).
    pub live: Option<Slot>,
    /// The control thread needs the result at once (an instruction of the
    /// pack waits on this one with `after:`). Other successful results may
    /// wait for its next pass, when that is at most the deferral window
    /// away ([`Dispatcher::defer_results_within`]).
    pub prompt: bool,
}

impl Job {
    fn withdrawn(&self) -> bool {
        self.live.as_ref().is_some_and(Slot::withdrawn)
    }
}

/// Why a job did not run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotRun {
    /// Reached after `not_after`.
    Late,
    /// Its pack entered its safe state before it was due.
    Withdrawn,
    /// The dispatcher stopped before it was due.
    Stopped,
    /// Withdrawn by the control thread before it started: a newer version
    /// of its pack does not keep it (never made by this thread).
    Replaced,
    /// Withdrawn by the control thread at its timeout, before it could
    /// start (never made by this thread).
    TimedOut,
}

/// How a job ended.
#[derive(Debug)]
pub enum JobOutcome {
    /// Done; `Some(level)` for reads.
    Ok(Option<u8>),
    /// The backend refused or failed.
    Failed(GpioError),
    /// Never touched the device.
    NotRun(NotRun),
}

/// A finished job.
#[derive(Debug)]
pub struct Done {
    /// From the job (a pulse end carries its pulse's ticket).
    pub ticket: u64,
    /// From the job.
    pub kind: JobKind,
    /// When it was due.
    pub deadline: MonoTime,
    /// When the line changed (or the job was given up).
    pub actual: MonoTime,
    /// Result.
    pub outcome: JobOutcome,
    /// Where its lateness came from (`bench-latency`'s breakdown).
    pub timing: Timing,
}

/// One job's way through this thread, ns: where a firing's lateness came
/// from, measured rather than guessed (`baton-agent bench-latency` reports
/// each as percentiles). Zero where a step did not happen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Timing {
    /// How far before its deadline the job reached this thread (negative:
    /// after it): the control thread's arming, seen from here.
    pub lead_ns: i64,
    /// How late the thread's timed wake-up before the job came, against
    /// the time it asked to wake at (the kernel's wake-up latency).
    pub wake_late_ns: i64,
    /// How long the thread spun to the deadline.
    pub spin_ns: i64,
    /// How long the device call took.
    pub call_ns: i64,
}

/// Counters the dispatcher keeps for telemetry.
#[derive(Debug, Default)]
pub struct Stats {
    /// Nanoseconds spent spinning before deadlines.
    pub spin_ns: AtomicU64,
    /// Jobs run.
    pub jobs: AtomicU64,
    /// Current sleep margin, ns.
    pub margin_ns: AtomicU64,
    /// Jobs that reached this thread already past their deadline: lateness
    /// caused upstream (arming), not by the dispatcher.
    pub arrived_late: AtomicU64,
    /// Results that found the result queue full (a credit-accounting bug;
    /// always 0, checked by tests).
    pub lost_results: AtomicU64,
    /// Progress for the systemd watchdog: bumped on every result and on
    /// every futex wait entered and left, with the wait's deadline noted.
    /// The control loop pings only while it moves or the thread waits
    /// legitimately (`baton_service::watchdog` says why that catches a
    /// thread stuck in a GPIO call or spinning without progress, but not an
    /// idle one).
    pub heartbeat: Heartbeat,
}

/// Most credits in flight (jobs handed over whose results were not yet
/// taken back). Both queues hold this many, so neither can be full when the
/// credit rule is kept.
pub const QUEUE_CAPACITY: usize = 2048;
/// Credits attempts may use; the rest is kept for safe-state writes, so a
/// safe state never waits behind a burst of ordinary firings.
pub const ATTEMPT_CREDITS: usize = 1536;

/// The control thread's count of jobs in flight (see the module docs).
#[derive(Debug, Default)]
pub struct Credits {
    in_flight: usize,
}

impl Credits {
    /// Whether a job of `kind` taking `n` credits may be handed over now.
    pub fn available(&self, kind: JobKind, n: usize) -> bool {
        let limit = match kind {
            JobKind::Attempt => ATTEMPT_CREDITS,
            JobKind::Safe | JobKind::PulseEnd => QUEUE_CAPACITY,
        };
        self.in_flight + n <= limit
    }

    /// Jobs in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// `n` credits taken by a job handed over. Public for the agent's
    /// device ports, which account for the jobs they hand over as the
    /// dispatcher itself does.
    pub fn take(&mut self, n: usize) {
        self.in_flight += n;
    }

    /// A job's result came back: its credit is free again.
    pub fn give_back(&mut self) {
        debug_assert!(self.in_flight > 0, "more results than jobs");
        self.in_flight = self.in_flight.saturating_sub(1);
    }
}

/// Why a job or request could not be handed over.
#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    /// The caller ignored [`Credits`]: a bug, reported rather than hidden.
    #[error("no dispatcher credit for the job of {0}: too many jobs in flight")]
    NoCredit(Arc<str>),
    /// The dispatcher thread is gone or did not answer in time.
    #[error("the dispatcher thread did not answer a line request within {0:?}")]
    NoAnswer(Duration),
    /// The backend refused a line.
    #[error(transparent)]
    Gpio(#[from] GpioError),
}

/// A line request, served by the dispatcher thread between firings.
struct Request {
    lines: Vec<(LineRef, Direction)>,
    reply: SyncSender<Result<Vec<LineHandle>, GpioError>>,
}

struct Shared {
    inbox: ArrayQueue<Job>,
    done: ArrayQueue<Done>,
    requests: ArrayQueue<Request>,
    word: AtomicU32,
    /// Set while the thread is in (or about to enter) `futex_wait`: a
    /// submit only makes the wake-up syscall then. Both sides use SeqCst
    /// (a store-load pair, as in Dekker's algorithm): either the submitter
    /// sees the flag and wakes the thread, or the thread's wait sees the
    /// bumped word and returns at once.
    sleeping: AtomicBool,
    /// When the control thread wakes by itself (monotonic ns), while it is
    /// parked; [`CONTROL_AWAKE`] while it runs. A successful result is not
    /// worth a wake-up of its own when that pass comes soon anyway.
    control_wake: AtomicI64,
    /// How far away that wake may be for a success to wait for it (ns):
    /// see [`Dispatcher::defer_results_within`].
    result_defer_ns: AtomicI64,
    stop: AtomicBool,
    /// How much of a core spinning before deadlines may take (millionths).
    spin_budget_ppm: u32,
    /// Set by [`Dispatcher::fence`] or the panic hook ([`Fence`]): no job
    /// touches a line any more; and whether this thread is inside a device
    /// call (so the safe state's direct writes come after it).
    fence: Arc<FenceState>,
    /// Each requested output line's direct writer.
    direct: Arc<DirectLines>,
    stats: Stats,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("inbox", &self.inbox.len())
            .field("done", &self.done.len())
            .finish()
    }
}

impl Shared {
    fn bump(&self) {
        self.word.fetch_add(1, Ordering::SeqCst);
        // A thread spinning or running sees the new word by itself; only a
        // sleeping one needs the syscall (one per firing before this).
        if self.sleeping.load(Ordering::SeqCst) {
            futex_wake(&self.word);
        }
    }

    /// Sleep until the word moves from `seen` or `deadline_ns` passes.
    fn sleep(&self, seen: u32, deadline_ns: Option<i64>) {
        self.sleeping.store(true, Ordering::SeqCst);
        if self.word.load(Ordering::SeqCst) == seen {
            futex_wait(&self.word, seen, deadline_ns);
        }
        self.sleeping.store(false, Ordering::SeqCst);
    }
}

/// The fence between this thread's jobs and the safe state's direct
/// writes: a store-load pair on both sides (SeqCst), as in Dekker's
/// algorithm. The thread raises `in_call` and then reads `fenced` before
/// each device call; the fencer raises `fenced` and then reads `in_call`:
/// either the thread sees the fence and does not call, or the fencer sees
/// the call in progress (and waits for it, bounded).
#[derive(Debug, Default)]
pub struct FenceState {
    fenced: AtomicBool,
    in_call: AtomicBool,
}

/// Lets no job of the dispatcher touch a line any more, from any thread
/// (see [`Dispatcher::fence_handle`]).
#[derive(Debug, Clone)]
pub struct Fence(Arc<FenceState>);

impl Fence {
    /// From now on, jobs end not run (`stopped`).
    pub fn close(&self) {
        self.0.fenced.store(true, Ordering::SeqCst);
    }

    /// After [`Fence::close`]: wait (bounded, spinning politely) until no
    /// device call of the dispatcher is in progress; whether none is. A
    /// call that never returns (a hung driver) makes this false.
    pub fn quiet_within(&self, timeout: Duration) -> bool {
        let end = std::time::Instant::now() + timeout;
        loop {
            if !self.0.in_call.load(Ordering::SeqCst) {
                return true;
            }
            if std::time::Instant::now() >= end {
                return false;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// Handle to the running dispatcher thread.
#[derive(Debug)]
pub struct Dispatcher {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    /// Disconnected when the thread has left its loop.
    exited: Receiver<()>,
    rt: RtStatus,
    credits: Credits,
    /// Jobs were submitted that the thread has not been woken for.
    unseen: bool,
}

/// How long [`Drop`] waits for the thread before letting it go.
const DROP_WAIT: Duration = Duration::from_secs(2);

impl Dispatcher {
    /// Start the thread, which takes ownership of `gpio`. `notify` is
    /// unparked whenever a result is ready.
    pub fn start(
        gpio: Box<dyn Gpio>,
        clock: Arc<ClockEstimate>,
        rt: RtConfig,
        notify: Thread,
    ) -> std::io::Result<(Dispatcher, Arc<DirectLines>)> {
        let shared = Arc::new(Shared {
            inbox: ArrayQueue::new(QUEUE_CAPACITY),
            done: ArrayQueue::new(QUEUE_CAPACITY),
            requests: ArrayQueue::new(4),
            word: AtomicU32::new(0),
            sleeping: AtomicBool::new(false),
            control_wake: AtomicI64::new(CONTROL_AWAKE),
            result_defer_ns: AtomicI64::new(RESULT_DEFER_NS),
            fence: Arc::new(FenceState::default()),
            direct: Arc::new(DirectLines::default()),
            stop: AtomicBool::new(false),
            spin_budget_ppm: rt.spin_budget_ppm,
            stats: Stats::default(),
        });
        let (status_tx, status_rx) = sync_channel(1);
        let (exit_tx, exited) = sync_channel::<()>(0);
        let s = shared.clone();
        let direct = shared.direct.clone();
        let thread = std::thread::Builder::new()
            .name("baton-dispatch".into())
            // Small and fixed: with mlockall every stack page is resident.
            .stack_size(256 * 1024)
            .spawn(move || {
                let _exit = exit_tx; // dropped when the thread ends
                let mut status = crate::rt::apply_to_current_thread(&rt);
                // Held while this thread runs: released when it ends.
                let _idle = rt
                    .idle_latency_us
                    .and_then(|us| crate::rt::hold_idle_latency(us, &mut status));
                baton_sys::pages::prefault_stack(64 * 1024);
                let _ = status_tx.send(status);
                thread::run(&s, gpio, &clock, &notify);
            })?;
        let rt = status_rx.recv().unwrap_or_default();
        Ok((
            Dispatcher {
                shared,
                thread: Some(thread),
                exited,
                rt,
                credits: Credits::default(),
                unseen: false,
            },
            direct,
        ))
    }

    /// What real-time set-up was granted.
    pub fn rt_status(&self) -> &RtStatus {
        &self.rt
    }

    /// The credit count: check [`Credits::available`] before [`Self::submit`].
    pub fn credits(&self) -> &Credits {
        &self.credits
    }

    /// Hand a job over; wakes the thread if it is sleeping.
    pub fn submit(&mut self, job: Job) -> Result<(), DispatchError> {
        self.submit_unseen(job)?;
        self.wake();
        Ok(())
    }

    /// Hand a job over without waking the thread: [`Self::wake`] after a
    /// batch. Until then the thread may not see it (if it sleeps).
    pub fn submit_unseen(&mut self, job: Job) -> Result<(), DispatchError> {
        let n = job.op.credits();
        if !self.credits.available(job.kind, n) {
            return Err(DispatchError::NoCredit(job.id));
        }
        self.shared
            .inbox
            .push(job)
            .map_err(|j| DispatchError::NoCredit(j.id))?;
        self.credits.take(n);
        self.unseen = true;
        Ok(())
    }

    /// The control thread is about to park until `wake` (monotonic ns;
    /// `None`: it runs again). Returns whether results already wait, in
    /// which case it must not park at all: the thread may have seen the
    /// old wake-up time and left them for this pass.
    pub fn plan_control_wake(&self, wake: Option<MonoTime>) -> bool {
        let w = wake.map_or(CONTROL_AWAKE, |w| w.as_nanos().max(CONTROL_AWAKE + 1));
        self.shared.control_wake.store(w, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        !self.shared.done.is_empty()
    }

    /// Successful results wait for the control thread's next pass when it
    /// is at most `window` away (never less than [`RESULT_DEFER_NS`]). The
    /// control thread sets its arming window here: its passes are that far
    /// apart under a dense load, and results then ride them instead of
    /// waking it once per firing instant.
    pub fn defer_results_within(&self, window: Duration) {
        let ns = i64::try_from(window.as_nanos()).unwrap_or(i64::MAX);
        self.shared
            .result_defer_ns
            .store(ns.max(RESULT_DEFER_NS), Ordering::Relaxed);
    }

    /// The fence alone, for the panic hook: set before it drives the safe
    /// state, so no job armed ahead lands after its writes while the
    /// process dies.
    pub fn fence_handle(&self) -> Fence {
        Fence(self.shared.fence.clone())
    }

    /// Stop, and let no job touch a line from now on (one in progress
    /// finishes): the way out then writes the safe state through the
    /// backend itself, and nothing of this thread may follow it.
    pub fn fence(&mut self) {
        self.shared.fence.fenced.store(true, Ordering::SeqCst);
        self.shared.stop.store(true, Ordering::Release);
        self.shared.bump();
    }

    /// Make the jobs submitted so far seen (one wake-up, if it sleeps).
    pub fn wake(&mut self) {
        if std::mem::take(&mut self.unseen) {
            self.shared.bump();
        }
    }

    /// Next finished job, if any.
    pub fn try_done(&mut self) -> Option<Done> {
        let d = self.shared.done.pop()?;
        self.credits.give_back();
        Some(d)
    }

    /// Request lines (outputs or inputs) from the backend the thread owns.
    /// The thread serves it between firings; the caller waits at most
    /// `timeout` (the only wait in this direction, and bounded).
    pub fn request_lines(
        &self,
        lines: &[(LineRef, Direction)],
        timeout: Duration,
    ) -> Result<Vec<LineHandle>, DispatchError> {
        if lines.is_empty() {
            return Ok(Vec::new());
        }
        let (reply, answer) = sync_channel(1);
        let req = Request {
            lines: lines.to_vec(),
            reply,
        };
        if self.shared.requests.push(req).is_err() {
            return Err(DispatchError::NoAnswer(Duration::ZERO));
        }
        self.shared.bump();
        match answer.recv_timeout(timeout) {
            Ok(r) => Ok(r?),
            Err(_) => Err(DispatchError::NoAnswer(timeout)),
        }
    }

    /// Telemetry counters.
    pub fn stats(&self) -> &Stats {
        &self.shared.stats
    }

    /// Stop: jobs already due run, pending pulse ends run at once (no line
    /// is left mid-pulse), other future jobs are reported not run. Waits for
    /// the thread at most `timeout`; returns whether it ended (if not, it
    /// is left behind, never waited on forever). Calling it again after a
    /// `false` asks again (and waits again at most its own timeout).
    pub fn stop(&mut self, timeout: Duration) -> bool {
        self.shared.stop.store(true, Ordering::Release);
        self.unseen = false;
        self.shared.bump();
        // The handle is kept until the thread has ended: a second call after
        // one that timed out must not report a stuck thread as ended.
        if self.thread.is_none() {
            return true;
        }
        match self.exited.recv_timeout(timeout) {
            Err(RecvTimeoutError::Disconnected) | Ok(()) => {
                if let Some(t) = self.thread.take() {
                    let _ = t.join();
                }
                true
            }
            Err(RecvTimeoutError::Timeout) => false,
        }
    }
}

impl Drop for Dispatcher {
    fn drop(&mut self) {
        // After a `stop` that gave up on the thread, do not wait again.
        let wait = if self.shared.stop.load(Ordering::Acquire) {
            Duration::ZERO
        } else {
            DROP_WAIT
        };
        self.stop(wait);
    }
}

/// Perform a job's op on the backend, dated `t_ref` (reference ns, for the
/// sim log): its result, and for a pulse whose leading edge was written, its
/// trailing edge as a job of its own (never a sleep). Shared by the
/// dispatcher thread and the threadless `runtime::ports::DirectDevice`.
pub fn apply(
    g: &mut dyn Gpio,
    job: &Job,
    t_ref: i64,
) -> (Result<Option<u8>, GpioError>, Option<Job>) {
    let mut pulse_end = None;
    let outcome = match job.op {
        Op::Write(h, v) => g.write(h, v, t_ref, &job.id).map(|()| None),
        Op::Toggle(h) => {
            let v = 1 - g.level(h).unwrap_or(0).min(1);
            g.write(h, v, t_ref, &job.id).map(|()| None)
        }
        Op::Read(h) => g.read(h).map(Some),
        Op::Noop => Ok(None),
        Op::Pulse {
            line,
            value,
            width_ns,
        } => {
            let r = g.write(line, value, t_ref, &job.id);
            if r.is_ok() {
                pulse_end = Some(Job {
                    deadline: job.deadline.add_nanos(width_ns),
                    not_after: MonoTime::MAX,
                    ticket: job.ticket,
                    kind: JobKind::PulseEnd,
                    op: Op::Write(line, 1 - value.min(1)),
                    id: job.id.clone(),
                    // Its pack's flag: a withdrawn pulse ends early, before
                    // the safe state (see `Local::take_inbox`).
                    live: job.live.clone(),
                    prompt: job.prompt,
                });
            }
            r.map(|()| None)
        }
    };
    (outcome, pulse_end)
}

/// [`Shared::control_wake`] while the control thread runs.
const CONTROL_AWAKE: i64 = i64::MIN;

/// How long a successful result may wait for the control thread's next
/// pass instead of waking it, at least (10 ms; more with a wider arming
/// window, [`Dispatcher::defer_results_within`]): under a dense load
/// results ride the next arming pass, one wake-up and one journal write per
/// pass instead of per instant. Feedback and the journal's result records
/// come that much later; nothing acts on a success sooner.
pub const RESULT_DEFER_NS: i64 = 10_000_000;

/// Whether results pushed now should wake the control thread, given
/// whether one is urgent, when it wakes by itself, and how long a success
/// may wait.
fn results_now(urgent: bool, control_wake: i64, now: i64, defer_ns: i64) -> bool {
    urgent || control_wake == CONTROL_AWAKE || control_wake.saturating_sub(now) > defer_ns
}

pub use margin::margin_within;
#[cfg(feature = "fault-injection")]
pub use thread::inject_stall_after;
