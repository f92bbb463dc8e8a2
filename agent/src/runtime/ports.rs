//! What the control loop is handed from outside: a clock and a device.
//! Real implementations wrap the clock estimate and the dispatcher thread;
//! tests pass a manual clock and an in-memory device, and drive the whole
//! control loop on simulated time.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use baton_proto::RefTime;
use baton_proto::pack::LineRef;

pub use baton_clock::port::Clock;

use crate::dispatcher::{Credits, DispatchError, Dispatcher, Done, Job, Stats};
use baton_clock::MonoTime;
use baton_clock::sample::SampleSender;
use baton_gpio::{Direction, LineHandle};

/// A clock that moves only when told (tests). Reference and monotonic time
/// coincide; its uncertainty is whatever the test sets (0 at first).
#[derive(Debug, Default)]
pub struct ManualClock {
    now: AtomicI64,
    uncertainty: AtomicI64,
    /// Where sources (the link's time exchange) send samples, when asked
    /// for ([`ManualClock::taking_samples`]); they are kept, unused.
    samples: Option<(
        SampleSender,
        std::sync::Mutex<std::sync::mpsc::Receiver<baton_clock::sample::Sample>>,
    )>,
}

impl ManualClock {
    /// Starting at `t`.
    pub fn new(t: RefTime) -> Self {
        ManualClock {
            now: AtomicI64::new(t.as_nanos()),
            uncertainty: AtomicI64::new(0),
            samples: None,
        }
    }
    /// Offers a sample channel, so clock sources run (the link asks the
    /// controller for time); the samples do not move this clock.
    pub fn taking_samples(mut self) -> Self {
        let (tx, rx) = baton_clock::sample::sample_channel();
        self.samples = Some((tx, std::sync::Mutex::new(rx)));
        self
    }

    /// Claim this uncertainty from now on (a lost or regained sync).
    pub fn set_uncertainty(&self, ns: i64) {
        self.uncertainty.store(ns, Ordering::Release);
    }
    /// Move to `t`.
    pub fn set(&self, t: RefTime) {
        self.now.store(t.as_nanos(), Ordering::Release);
    }
    /// Move forward.
    pub fn advance(&self, d: Duration) {
        let ns = i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
        self.now.fetch_add(ns, Ordering::AcqRel);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> RefTime {
        RefTime::from_nanos(self.now.load(Ordering::Acquire))
    }
    fn to_mono(&self, t: RefTime) -> MonoTime {
        MonoTime::from_nanos(t.as_nanos())
    }
    fn to_ref(&self, m: MonoTime) -> RefTime {
        RefTime::from_nanos(m.as_nanos())
    }
    fn resample(&self) -> Option<i64> {
        None
    }
    fn uncertainty_ns(&self) -> i64 {
        self.uncertainty.load(Ordering::Acquire)
    }
    fn samples(&self) -> Option<SampleSender> {
        self.samples.as_ref().map(|(tx, _)| tx.clone())
    }
}

/// Where timed GPIO jobs go: the dispatcher thread, or a test double.
pub trait Device: Send {
    /// The credit count (see `dispatcher::Credits`).
    fn credits(&self) -> &Credits;
    /// Hand a job over. It may wait, unseen, until [`Device::wake`]:
    /// a batch of jobs then costs the device one wake-up, not one each.
    fn submit(&mut self, job: Job) -> Result<(), DispatchError>;
    /// Make everything submitted so far seen.
    fn wake(&mut self) {}
    /// The control thread is about to park until `wake` (`None`: it runs
    /// again); whether results already wait (then it must not park long).
    /// A device that never defers a result returns false.
    fn plan_wake(&self, _wake: Option<MonoTime>) -> bool {
        false
    }
    /// Let nothing more of the device's thread touch a line (the way out
    /// is about to write the safe state directly).
    fn fence(&mut self) {}
    /// After [`Device::fence`]: wait at most `timeout` for a device call in
    /// progress to return; whether none is left (a call that never returns
    /// keeps it false).
    fn quiet_within(&self, _timeout: Duration) -> bool {
        true
    }
    /// Next result, if any.
    fn try_done(&mut self) -> Option<Done>;
    /// Request lines from the backend.
    fn request_lines(
        &mut self,
        lines: &[(LineRef, Direction)],
    ) -> Result<Vec<LineHandle>, DispatchError>;
    /// Stop, waiting at most `timeout`; whether the device has stopped.
    fn stop(&mut self, timeout: Duration) -> bool;
    /// Telemetry, where there is any.
    fn stats(&self) -> Option<&Stats> {
        None
    }
}

/// How long acceptance waits for the dispatcher to open lines.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

impl Device for Dispatcher {
    fn credits(&self) -> &Credits {
        Dispatcher::credits(self)
    }
    fn submit(&mut self, job: Job) -> Result<(), DispatchError> {
        Dispatcher::submit_unseen(self, job)
    }
    fn wake(&mut self) {
        Dispatcher::wake(self)
    }
    fn plan_wake(&self, wake: Option<MonoTime>) -> bool {
        Dispatcher::plan_control_wake(self, wake)
    }
    fn fence(&mut self) {
        Dispatcher::fence(self)
    }
    fn quiet_within(&self, timeout: Duration) -> bool {
        self.fence_handle().quiet_within(timeout)
    }
    fn try_done(&mut self) -> Option<Done> {
        Dispatcher::try_done(self)
    }
    fn request_lines(
        &mut self,
        lines: &[(LineRef, Direction)],
    ) -> Result<Vec<LineHandle>, DispatchError> {
        Dispatcher::request_lines(self, lines, REQUEST_TIMEOUT)
    }
    fn stop(&mut self, timeout: Duration) -> bool {
        Dispatcher::stop(self, timeout)
    }
    fn stats(&self) -> Option<&Stats> {
        Some(Dispatcher::stats(self))
    }
}

/// A device without a thread: jobs run when [`Device::try_done`] is called
/// at or after their deadline on `clock`. Drives a real backend (the sim
/// backend in tests, any backend for `check-config`'s line requests) on
/// simulated time; pulses end in the same way, at their own deadline.
pub struct DirectDevice {
    gpio: Box<dyn baton_gpio::Gpio>,
    clock: std::sync::Arc<dyn Clock>,
    jobs: Vec<(u64, Job)>,
    seq: u64,
    credits: Credits,
    stopped: bool,
}

impl std::fmt::Debug for DirectDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectDevice")
            .field("jobs", &self.jobs.len())
            .finish_non_exhaustive()
    }
}

impl DirectDevice {
    /// Over `gpio`, on `clock`.
    pub fn new(gpio: Box<dyn baton_gpio::Gpio>, clock: std::sync::Arc<dyn Clock>) -> Self {
        DirectDevice {
            gpio,
            clock,
            jobs: Vec::new(),
            seq: 0,
            credits: Credits::default(),
            stopped: false,
        }
    }

    /// Jobs waiting.
    pub fn pending(&self) -> usize {
        self.jobs.len()
    }

    fn run(&mut self, job: Job, now: MonoTime) -> Done {
        use crate::dispatcher::{JobKind, JobOutcome, NotRun, Op};
        let attempt = job.kind == JobKind::Attempt;
        let withdrawn = job.live.as_ref().is_some_and(|s| s.withdrawn());
        let mut not_run = if !attempt {
            None
        } else if withdrawn {
            Some(NotRun::Withdrawn)
        } else if self.stopped && job.deadline > now {
            Some(NotRun::Stopped)
        } else if now > job.not_after {
            Some(NotRun::Late)
        } else {
            None
        };
        if not_run.is_none() && attempt && job.live.as_ref().is_some_and(|s| !s.claim()) {
            not_run = Some(NotRun::Withdrawn);
        }
        let mut done = Done {
            ticket: job.ticket,
            kind: job.kind,
            deadline: job.deadline,
            actual: now,
            outcome: JobOutcome::Ok(None),
            timing: Default::default(),
        };
        if let Some(why) = not_run {
            if matches!(job.op, Op::Pulse { .. }) {
                // Its second credit: the end that will never come.
                self.credits.give_back();
            }
            done.outcome = JobOutcome::NotRun(why);
            return done;
        }
        let t = self.clock.to_ref(now).as_nanos();
        let (r, pulse_end) = crate::dispatcher::apply(&mut *self.gpio, &job, t);
        if attempt && let Some(s) = &job.live {
            s.finish(r.is_ok());
        }
        match pulse_end {
            Some(end) => {
                self.seq += 1;
                self.jobs.push((self.seq, end));
            }
            // A pulse whose leading edge failed: its second credit back.
            None if matches!(job.op, Op::Pulse { .. }) => self.credits.give_back(),
            None => {}
        }
        done.outcome = match r {
            Ok(v) => JobOutcome::Ok(v),
            Err(e) => JobOutcome::Failed(e),
        };
        done
    }
}

impl Device for DirectDevice {
    fn credits(&self) -> &Credits {
        &self.credits
    }
    fn submit(&mut self, job: Job) -> Result<(), DispatchError> {
        let n = job.op.credits();
        if !self.credits.available(job.kind, n) {
            return Err(DispatchError::NoCredit(job.id));
        }
        self.credits.take(n);
        self.seq += 1;
        self.jobs.push((self.seq, job));
        Ok(())
    }
    fn try_done(&mut self) -> Option<Done> {
        let now = self.clock.to_mono(self.clock.now());
        let (i, _) = self
            .jobs
            .iter()
            .enumerate()
            .filter(|(_, (_, j))| j.deadline <= now || self.stopped)
            .min_by_key(|(_, (s, j))| (j.deadline, *s))?;
        let (_, job) = self.jobs.remove(i);
        self.credits.give_back();
        Some(self.run(job, now))
    }
    fn request_lines(
        &mut self,
        lines: &[(LineRef, Direction)],
    ) -> Result<Vec<LineHandle>, DispatchError> {
        lines
            .iter()
            .map(|(l, d)| match d {
                Direction::Output => self.gpio.request(l),
                Direction::Input => self.gpio.request_input(l),
            })
            .collect::<Result<_, _>>()
            .map_err(DispatchError::from)
    }
    fn stop(&mut self, _timeout: Duration) -> bool {
        self.stopped = true;
        true
    }
}

/// The ports the loop drives: the device (the dispatcher thread, or a
/// test's double) and the exec pool with its results.
pub(super) struct Ports {
    /// Where GPIO jobs go.
    pub(super) device: Box<dyn Device>,
    /// Exec workers.
    pub(super) exec: crate::exec::ExecPool,
    /// Their results.
    pub(super) exec_rx: std::sync::mpsc::Receiver<crate::exec::ExecResult>,
}

impl std::fmt::Debug for Ports {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ports").finish_non_exhaustive()
    }
}
