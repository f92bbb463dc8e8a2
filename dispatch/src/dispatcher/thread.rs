//! The dispatcher thread itself: its loop over a local heap of jobs
//! (wait, spin, perform, report), the line requests it serves between
//! firings, and the test hook that stalls it.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
#[cfg(feature = "fault-injection")]
use std::sync::atomic::AtomicU64;
use std::sync::atomic::{Ordering, fence};
use std::thread::Thread;

use baton_clock::{ClockEstimate, MonoTime, mono_now};
use baton_gpio::{Direction, Gpio, GpioError, LineHandle};

use super::margin::Pacing;
use super::{
    Done, Job, JobKind, JobOutcome, NotRun, Op, QUEUE_CAPACITY, Shared, Timing, apply, results_now,
};

/// Heap entry: min-order by (deadline, arrival sequence).
struct Queued {
    key: Reverse<(i64, u64)>,
    job: Job,
    /// How far before its deadline it reached this thread.
    lead_ns: i64,
}

impl PartialEq for Queued {
    fn eq(&self, o: &Self) -> bool {
        self.key == o.key
    }
}
impl Eq for Queued {}
impl PartialOrd for Queued {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Queued {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.key.cmp(&o.key)
    }
}

/// Results after which a long run of due jobs unparks the control thread
/// anyway (a sixth of the attempt credits: credits keep coming back).
const NOTIFY_BATCH: usize = 256;
/// A line request is served only when the next firing is at least this far
/// away (opening a line is a few syscalls)...
const REQUEST_GUARD_NS: i64 = 2_000_000;
/// ...or once it has waited this long (a steady 10 kHz load never leaves a
/// 2 ms gap; the request then costs one firing some lateness, reported).
const REQUEST_MAX_WAIT_NS: i64 = 50_000_000;

/// The thread's state between iterations.
struct Local<'a> {
    s: &'a Shared,
    gpio: Box<dyn Gpio>,
    /// Dates the sim backend's log lines on reference time.
    clock: &'a ClockEstimate,
    notify: &'a Thread,
    heap: BinaryHeap<Queued>,
    seq: u64,
    request_seen: Option<i64>,
    /// Results pushed since the control thread was last unparked.
    unnotified: std::cell::Cell<usize>,
    /// One of them must be seen at once.
    urgent: std::cell::Cell<bool>,
    /// The sleep margin and what it learns from.
    pace: Pacing,
    /// The last timed wake-up's lateness and the last spin, for the next
    /// job's [`Timing`] (then cleared).
    woke_late: std::cell::Cell<i64>,
    spun: std::cell::Cell<i64>,
}

/// The thread's loop: take new jobs, serve line requests, then sleep, spin
/// or perform the earliest job, until stopped with nothing left to run.
pub(super) fn run(s: &Shared, gpio: Box<dyn Gpio>, clock: &ClockEstimate, notify: &Thread) {
    let mut l = Local {
        s,
        gpio,
        clock,
        notify,
        heap: BinaryHeap::with_capacity(QUEUE_CAPACITY),
        seq: 0,
        request_seen: None,
        unnotified: std::cell::Cell::new(0),
        urgent: std::cell::Cell::new(false),
        pace: Pacing::new(s.spin_budget_ppm),
        woke_late: std::cell::Cell::new(0),
        spun: std::cell::Cell::new(0),
    };
    loop {
        let seen = s.word.load(Ordering::Acquire);
        l.take_inbox();
        let now = mono_now();
        l.serve_requests(now);
        let stopping = s.stop.load(Ordering::Acquire);
        let Some(top) = l.heap.peek() else {
            if l.idle(seen, stopping) {
                return;
            }
            continue;
        };
        let deadline = top.job.deadline.as_nanos();
        if stopping {
            l.run_down_one(deadline, now);
            continue;
        }
        if deadline - now.as_nanos() > l.pace.margin {
            l.wait(seen, deadline);
            continue;
        }
        let t = l.spin(seen, deadline, now);
        if t < deadline {
            continue; // an earlier job may have arrived
        }
        if let Some(q) = l.heap.pop() {
            l.execute(q.job, q.lead_ns, MonoTime::from_nanos(t));
        }
    }
}

/// The loop's steps, named; each inlined into it.
impl Local<'_> {
    /// Nothing queued: sleep until a job comes. When stopping, nothing
    /// sleeps: true once nothing is left (the thread ends).
    #[inline]
    fn idle(&mut self, seen: u32, stopping: bool) -> bool {
        let s = self.s;
        if stopping {
            // A job handed over just before `stop` may have reached the
            // inbox after `take_inbox` above (e.g. while a line request
            // was served); having seen the flag, it is visible now. It
            // must get its result like any other, not vanish.
            self.take_inbox();
            if self.heap.is_empty() {
                self.notify_results();
                return true;
            }
            return false;
        }
        self.notify_results();
        s.stats.heartbeat.waiting(None);
        s.sleep(seen, None);
        s.stats.heartbeat.awake();
        false
    }

    /// Stopping: run the earliest job if it is due or a pulse end (every
    /// pulse end runs); the rest is not run.
    #[inline]
    fn run_down_one(&mut self, deadline: i64, now: MonoTime) {
        let Some(q) = self.heap.pop() else { return };
        if q.job.kind == JobKind::PulseEnd || deadline <= now.as_nanos() {
            self.execute(q.job, q.lead_ns, now);
        } else {
            self.not_run(q.job, now, NotRun::Stopped);
        }
    }

    /// The earliest job is further than the margin: sleep until the margin
    /// before it (or a line request's guard), or until a job arrives; a
    /// timed wake-up teaches the margin.
    #[inline]
    fn wait(&mut self, seen: u32, deadline: i64) {
        let s = self.s;
        let mut wake_at = deadline - self.pace.margin;
        if self.request_seen.is_some() {
            wake_at = wake_at.min(deadline - REQUEST_GUARD_NS);
        }
        self.notify_results();
        s.stats.heartbeat.waiting(Some(wake_at));
        s.sleep(seen, Some(wake_at));
        s.stats.heartbeat.awake();
        let woke = mono_now().as_nanos();
        self.woke_late.set((woke - wake_at).max(0));
        if woke >= wake_at && s.word.load(Ordering::Acquire) == seen {
            // Timed wake: learn the latency, and the pace.
            let margin = self.pace.learn(woke - wake_at, deadline);
            s.stats.margin_ns.store(margin as u64, Ordering::Relaxed);
        }
    }

    /// Spin to the deadline, still watching for an earlier job: the time
    /// reached, before the deadline if a job arrived meanwhile.
    #[inline]
    fn spin(&self, seen: u32, deadline: i64, now: MonoTime) -> i64 {
        let s = self.s;
        if deadline > now.as_nanos() {
            self.notify_results();
        }
        let spin_start = now.as_nanos();
        let mut t = now.as_nanos();
        while t < deadline {
            if s.word.load(Ordering::Acquire) != seen {
                break;
            }
            std::hint::spin_loop();
            t = mono_now().as_nanos();
        }
        let spun = (t - spin_start).max(0);
        self.spun.set(self.spun.get() + spun);
        s.stats.spin_ns.fetch_add(spun as u64, Ordering::Relaxed);
        t
    }
}

impl Local<'_> {
    fn push(&mut self, job: Job) {
        self.seq += 1;
        let lead_ns = job.deadline.as_nanos() - mono_now().as_nanos();
        self.heap.push(Queued {
            key: Reverse((job.deadline.as_nanos(), self.seq)),
            job,
            lead_ns,
        });
    }

    fn take_inbox(&mut self) {
        while let Some(job) = self.s.inbox.pop() {
            if job.deadline.as_nanos() < mono_now().as_nanos() {
                self.s.stats.arrived_late.fetch_add(1, Ordering::Relaxed);
            }
            if job.kind == JobKind::Safe {
                // A safe-state write: pulses of withdrawn packs end first,
                // so no trailing edge lands after the safe state.
                self.end_withdrawn_pulses();
            }
            self.push(job);
        }
    }

    /// Run now every pulse end whose pack was withdrawn. Rare (safe state
    /// only); reuses the heap's buffer, allocates nothing.
    fn end_withdrawn_pulses(&mut self) {
        if !self
            .heap
            .iter()
            .any(|q| q.job.kind == JobKind::PulseEnd && q.job.withdrawn())
        {
            return;
        }
        let mut v = std::mem::take(&mut self.heap).into_vec();
        let now = mono_now();
        let mut i = v.len();
        while i > 0 {
            i -= 1;
            if v[i].job.kind == JobKind::PulseEnd && v[i].job.withdrawn() {
                let q = v.swap_remove(i);
                self.execute(q.job, q.lead_ns, now);
            }
        }
        self.heap = BinaryHeap::from(v);
    }

    fn serve_requests(&mut self, now: MonoTime) {
        if self.s.requests.is_empty() {
            self.request_seen = None;
            return;
        }
        let since = *self.request_seen.get_or_insert(now.as_nanos());
        let room = self
            .heap
            .peek()
            .is_none_or(|q| q.job.deadline.nanos_since(now) > REQUEST_GUARD_NS);
        if !room && now.as_nanos() - since < REQUEST_MAX_WAIT_NS {
            return;
        }
        while let Some(req) = self.s.requests.pop() {
            let g = &mut self.gpio;
            let r: Result<Vec<LineHandle>, GpioError> = req
                .lines
                .iter()
                .map(|(line, dir)| match dir {
                    Direction::Output => g.request(line),
                    Direction::Input => g.request_input(line),
                })
                .collect();
            if let Ok(handles) = &r {
                for h in handles {
                    self.s.direct.learn(&**g, *h);
                }
            }
            // The requester may have given up: nothing waits on this.
            let _ = req.reply.try_send(r);
        }
        self.request_seen = None;
    }

    /// `job`'s result (as `kind`: a pulse's end reports under its pulse's
    /// ticket), reached at `now`.
    fn push_done(&self, job: &Job, kind: JobKind, now: MonoTime, outcome: JobOutcome) {
        self.push_done_timed(job, kind, now, outcome, Timing::default());
    }

    /// [`Local::push_done`] of a job that ran, with where its time went.
    fn push_done_timed(
        &self,
        job: &Job,
        kind: JobKind,
        now: MonoTime,
        outcome: JobOutcome,
        timing: Timing,
    ) {
        // Failures, safe-state writes and not-run jobs are rare and acted on
        // (retries, reports): never deferred.
        let prompt = job.prompt || kind == JobKind::Safe || !matches!(outcome, JobOutcome::Ok(_));
        let d = Done {
            ticket: job.ticket,
            kind,
            deadline: job.deadline,
            actual: now,
            outcome,
            timing,
        };
        // The credit rule makes a full queue impossible; if it ever were,
        // count the loss rather than wait for the control thread.
        if self.s.done.push(d).is_err() {
            self.s.stats.lost_results.fetch_add(1, Ordering::Relaxed);
        }
        self.s.stats.heartbeat.progress();
        // The control thread is woken once per run of due jobs (before this
        // thread waits or spins), not once per result: ten firings due at
        // one instant cost it one pass and one journal write, not ten. A
        // long burst still hands results (and so credits) back every
        // NOTIFY_BATCH results, so it keeps flowing.
        let n = self.unnotified.get() + 1;
        self.unnotified.set(n);
        self.urgent.set(self.urgent.get() || prompt);
        if n >= NOTIFY_BATCH {
            self.urgent.set(true);
            self.notify_results();
        }
    }

    /// Unpark the control thread if results wait for it and it should see
    /// them now (see [`results_now`]); otherwise its next pass takes them.
    fn notify_results(&self) {
        if self.unnotified.replace(0) == 0 {
            return;
        }
        let urgent = self.urgent.replace(false);
        // Pairs with the fence in `Dispatcher::plan_control_wake`: either
        // the control thread sees the results queued before it parks, or
        // this sees the wake-up time it published.
        fence(Ordering::SeqCst);
        let wake = self.s.control_wake.load(Ordering::SeqCst);
        let defer = self.s.result_defer_ns.load(Ordering::Relaxed);
        if results_now(urgent, wake, mono_now().as_nanos(), defer) {
            self.notify.unpark();
        }
    }

    fn not_run(&self, job: Job, now: MonoTime, why: NotRun) {
        self.push_done(&job, job.kind, now, JobOutcome::NotRun(why));
        if matches!(job.op, Op::Pulse { .. }) {
            self.give_back_pulse_end(&job, now);
        }
    }

    /// A pulse took two credits; when its end will never be queued, the
    /// second comes back as a not-run pulse end.
    fn give_back_pulse_end(&self, job: &Job, now: MonoTime) {
        self.push_done(
            job,
            JobKind::PulseEnd,
            now,
            JobOutcome::NotRun(NotRun::Withdrawn),
        );
    }

    fn execute(&mut self, job: Job, lead_ns: i64, now: MonoTime) {
        // Where this job's time went since it was queued, then cleared for
        // the next one.
        let mut timing = Timing {
            lead_ns,
            wake_late_ns: self.woke_late.replace(0),
            spin_ns: self.spun.replace(0),
            call_ns: 0,
        };
        // Not run at all: withdrawn (a newer version, a timeout, its pack's
        // safe state), or past the instant after which it must not run.
        // (A started pulse always ends.)
        let attempt = job.kind == JobKind::Attempt;
        if attempt {
            if job.withdrawn() {
                return self.not_run(job, now, NotRun::Withdrawn);
            }
            if now > job.not_after {
                return self.not_run(job, now, NotRun::Late);
            }
        }
        let t_ref = self.clock.to_ref(now).as_nanos();
        let fence = &self.s.fence;
        fence.in_call.store(true, Ordering::SeqCst);
        if fence.fenced.load(Ordering::SeqCst) {
            fence.in_call.store(false, Ordering::SeqCst);
            return self.not_run(job, now, NotRun::Stopped);
        }
        // The one moment the attempt is taken: a withdrawal that came
        // first wins, one that comes later is too late.
        if attempt && job.live.as_ref().is_some_and(|s| !s.claim()) {
            fence.in_call.store(false, Ordering::SeqCst);
            return self.not_run(job, now, NotRun::Withdrawn);
        }
        let call = mono_now();
        let (outcome, pulse_end) = apply(&mut *self.gpio, &job, t_ref);
        timing.call_ns = mono_now().nanos_since(call);
        if attempt && let Some(s) = &job.live {
            s.finish(outcome.is_ok());
        }
        self.s.fence.in_call.store(false, Ordering::SeqCst);
        self.s.stats.jobs.fetch_add(1, Ordering::Relaxed);
        let failed_pulse = matches!(job.op, Op::Pulse { .. }) && outcome.is_err();
        // The line changed at `now` (the write is a syscall or two after).
        let outcome = match outcome {
            Ok(v) => JobOutcome::Ok(v),
            Err(e) => JobOutcome::Failed(e),
        };
        self.push_done_timed(&job, job.kind, now, outcome, timing);
        if failed_pulse {
            self.give_back_pulse_end(&job, now);
        }
        if let Some(end) = pulse_end {
            self.push(end);
        }
        stall_test_point();
    }
}

/// Executed jobs left before the test hook stalls this thread (0: off).
#[cfg(feature = "fault-injection")]
static STALL_AFTER: AtomicU64 = AtomicU64::new(0);

/// Test hook (`run --inject-dispatcher-stall-after N`, hidden): after N
/// executed jobs the dispatcher thread hangs for good, to prove the
/// systemd watchdog pings stop and the way out writes the safe state
/// itself. Off unless asked for; it holds no lock while hung (a GPIO call
/// hung in the kernel would keep the backend's, see `runtime/exit.rs`).
#[cfg(feature = "fault-injection")]
pub fn inject_stall_after(n: u64) {
    STALL_AFTER.store(n, Ordering::Release);
}

#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
fn stall_test_point() {}

#[cfg(feature = "fault-injection")]
fn stall_test_point() {
    let left = STALL_AFTER.load(Ordering::Acquire);
    if left == 0 {
        return;
    }
    if left > 1 {
        STALL_AFTER.store(left - 1, Ordering::Release);
        return;
    }
    loop {
        std::thread::park();
    }
}
