//! The dispatcher thread as the control loop sees it: the real
//! [`Dispatcher::start`] over the sim GPIO backend, the system clock, and
//! normal scheduling (no SCHED_FIFO, no pinning, no mlockall).
//!
//! The test thread is the control thread: it is the one unparked when a
//! result is ready, and it waits for results with `park_timeout` until a
//! deadline (an event with a bound, never a sleep). Deadlines are tens of
//! milliseconds ahead so a loaded machine cannot make a job due before the
//! test has set up what the job is checked against.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::{Duration, Instant};

use baton_agent::dispatcher::{
    ATTEMPT_CREDITS, DispatchError, Dispatcher, Done, Job, JobKind, JobOutcome, NotRun, Op,
    QUEUE_CAPACITY,
};
use baton_agent::ledger::Slot;
use baton_agent::rt::RtConfig;
use baton_clock::{ClockEstimate, MonoTime, mono_now};
use baton_gpio::sim::SimGpio;
use baton_gpio::{Allowlist, Direction, Gpio, GpioError, LineHandle, parse_line_ref};
use baton_proto::pack::LineRef;

/// Upper bound on any wait for a result.
const WAIT: Duration = Duration::from_secs(10);
const MS: i64 = 1_000_000;

/// No real-time set-up: tests run unprivileged and share two CPUs.
fn no_rt() -> RtConfig {
    RtConfig {
        priority: None,
        cpu: None,
        mlockall: false,
        spin_budget_ppm: baton_agent::rt::DEFAULT_SPIN_BUDGET_PPM,
        idle_latency_us: None,
    }
}

/// `ms` milliseconds from now on the monotonic clock.
fn in_ms(ms: i64) -> MonoTime {
    mono_now().add_nanos(ms * MS)
}

fn line(s: &str) -> LineRef {
    parse_line_ref(s).expect("line reference")
}

/// An attempt (or any kind) due at `deadline`, runnable until a second
/// after it.
fn job(ticket: u64, kind: JobKind, op: Op, deadline: MonoTime) -> Job {
    Job {
        deadline,
        not_after: deadline.add_nanos(1_000 * MS),
        ticket,
        kind,
        op,
        id: Arc::from(format!("job-{ticket}")),
        live: None,
        prompt: false,
    }
}

/// A job's own ledger slot (its withdrawal flag).
fn live_flag() -> Slot {
    Slot::standalone()
}

/// One line of the sim log.
#[derive(Debug, PartialEq)]
struct Change {
    t: i64,
    line: String,
    value: u64,
    id: String,
}

struct Rig {
    d: Dispatcher,
    _direct: Arc<baton_gpio::DirectLines>,
    clock: Arc<ClockEstimate>,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Rig {
    fn start() -> Rig {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("gpio.jsonl");
        let gpio = SimGpio::open(&log, Allowlist::all()).expect("sim backend");
        let clock = Arc::new(ClockEstimate::from_system());
        let (d, direct) = Dispatcher::start(
            Box::new(gpio),
            clock.clone(),
            no_rt(),
            std::thread::current(),
        )
        .expect("dispatcher thread");
        Rig {
            d,
            _direct: direct,
            clock,
            log,
            _dir: dir,
        }
    }

    fn outputs(&self, lines: &[&str]) -> Vec<LineHandle> {
        let req: Vec<_> = lines.iter().map(|l| (line(l), Direction::Output)).collect();
        self.d.request_lines(&req, WAIT).expect("lines requested")
    }

    fn submit(&mut self, j: Job) {
        let t = j.ticket;
        self.d
            .submit(j)
            .unwrap_or_else(|e| panic!("job {t} refused: {e}"));
    }

    /// Exactly `n` results, in the order the thread produced them; fails
    /// if they do not all come within [`WAIT`].
    fn wait(&mut self, n: usize) -> Vec<Done> {
        let until = Instant::now() + WAIT;
        let mut got = Vec::with_capacity(n);
        loop {
            while got.len() < n
                && let Some(d) = self.d.try_done()
            {
                got.push(d);
            }
            if got.len() == n {
                return got;
            }
            let left = until.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "{} of {n} results within {WAIT:?}: {got:?}",
                got.len()
            );
            std::thread::park_timeout(left);
        }
    }

    /// Every change the sim backend logged so far.
    fn changes(&self) -> Vec<Change> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).expect("JSON line");
                Change {
                    t: v["t"].as_i64().expect("t"),
                    line: v["line"].to_string(),
                    value: v["value"].as_u64().expect("value"),
                    id: v["execution_id"].as_str().expect("id").to_owned(),
                }
            })
            .collect()
    }

    /// The reference time the sim log gives a monotonic instant.
    fn ref_ns(&self, m: MonoTime) -> i64 {
        self.clock.to_ref(m).as_nanos()
    }

    /// Nothing lost, nothing left in flight, no futex trouble.
    fn assert_settled(&self) {
        assert_eq!(self.d.credits().in_flight(), 0, "credits not all returned");
        assert_eq!(self.d.stats().lost_results.load(Ordering::Relaxed), 0);
        assert_eq!(baton_agent::rt::futex_errors().0, 0);
    }
}

fn assert_ok(d: &Done) {
    assert!(matches!(d.outcome, JobOutcome::Ok(_)), "{d:?}");
}

fn assert_not_run(d: &Done, why: NotRun) {
    assert!(
        matches!(d.outcome, JobOutcome::NotRun(w) if w == why),
        "expected NotRun({why:?}): {d:?}"
    );
}

/// (a) A job fires at its deadline, never before.
#[test]
fn a_job_fires_at_its_deadline_never_before() {
    let mut r = Rig::start();
    let [a, b] = r.outputs(&["5", "6"])[..] else {
        panic!("two lines")
    };
    let deadlines = [in_ms(30), in_ms(40), in_ms(41)];
    r.submit(job(1, JobKind::Attempt, Op::Write(a, 1), deadlines[0]));
    // Submitted out of order: the heap orders them.
    r.submit(job(3, JobKind::Attempt, Op::Toggle(b), deadlines[2]));
    r.submit(job(2, JobKind::Safe, Op::Write(a, 0), deadlines[1]));
    let done = r.wait(3);
    let seen = mono_now();
    assert_eq!(done.iter().map(|d| d.ticket).collect::<Vec<_>>(), [1, 2, 3]);
    for (d, deadline) in done.iter().zip(deadlines) {
        assert_ok(d);
        assert_eq!(d.deadline, deadline);
        assert!(d.actual >= d.deadline, "fired early: {d:?}");
        assert!(d.actual <= seen);
    }
    let log = r.changes();
    assert_eq!(
        log.iter()
            .map(|c| (c.id.as_str(), c.value))
            .collect::<Vec<_>>(),
        [("job-1", 1), ("job-2", 0), ("job-3", 1)]
    );
    for (c, d) in log.iter().zip(&done) {
        // Dated by the instant the line changed, never before the deadline.
        assert_eq!(c.t, r.ref_ns(d.actual));
        assert!(c.t >= r.ref_ns(d.deadline));
    }
    assert_eq!(r.d.stats().jobs.load(Ordering::Relaxed), 3);
    assert_eq!(r.d.stats().arrived_late.load(Ordering::Relaxed), 0);
    r.assert_settled();
}

/// (b) A withdrawn job never touches its line.
#[test]
fn a_withdrawn_job_is_not_run_and_never_touches_the_line() {
    let mut r = Rig::start();
    let [a] = r.outputs(&["7"])[..] else {
        panic!("one line")
    };
    let slots = [live_flag(), live_flag()];
    let deadline = in_ms(40);
    for (live, (ticket, op)) in slots.iter().zip([
        (1, Op::Write(a, 1)),
        (
            2,
            Op::Pulse {
                line: a,
                value: 1,
                width_ns: MS,
            },
        ),
    ]) {
        let mut j = job(ticket, JobKind::Attempt, op, deadline);
        j.live = Some(live.clone());
        r.submit(j);
    }
    // Another job after them: it runs, so the two were reached.
    r.submit(job(3, JobKind::Attempt, Op::Write(a, 0), in_ms(50)));
    for live in &slots {
        assert!(live.withdraw(), "withdrawn before its instant");
    }
    let done = r.wait(4);
    assert_eq!(
        done.iter().map(|d| (d.ticket, d.kind)).collect::<Vec<_>>(),
        [
            (1, JobKind::Attempt),
            (2, JobKind::Attempt),
            // The pulse's second credit comes back as a not-run end.
            (2, JobKind::PulseEnd),
            (3, JobKind::Attempt),
        ]
    );
    for d in &done[..3] {
        assert_not_run(d, NotRun::Withdrawn);
        assert!(d.actual >= deadline);
    }
    assert_ok(&done[3]);
    let ids: Vec<_> = r.changes().into_iter().map(|c| c.id).collect();
    assert_eq!(ids, ["job-3"], "only the live job touched the line");
    r.assert_settled();
}

/// (c) Past `not_after` when reached: not run.
#[test]
fn a_job_past_not_after_is_late_and_not_run() {
    let mut r = Rig::start();
    let [a] = r.outputs(&["8"])[..] else {
        panic!("one line")
    };
    // Arrives already past both its deadline and its `not_after`.
    let past = in_ms(-10);
    let mut stale = job(1, JobKind::Attempt, Op::Write(a, 1), past);
    stale.not_after = past.add_nanos(5 * MS);
    r.submit(stale);
    // Reached at its deadline, after its `not_after` (an impossible window).
    let deadline = in_ms(30);
    let mut j = job(
        2,
        JobKind::Attempt,
        Op::Pulse {
            line: a,
            value: 1,
            width_ns: MS,
        },
        deadline,
    );
    j.not_after = deadline.add_nanos(-1);
    r.submit(j);
    // A safe write is never late, however stale.
    let mut safe = job(3, JobKind::Safe, Op::Write(a, 0), past);
    safe.not_after = past;
    r.submit(safe);
    let done = r.wait(4);
    let by = |t: u64, k: JobKind| {
        done.iter()
            .find(|d| d.ticket == t && d.kind == k)
            .unwrap_or_else(|| panic!("no result for {t} {k:?}: {done:?}"))
    };
    assert_not_run(by(1, JobKind::Attempt), NotRun::Late);
    assert_not_run(by(2, JobKind::Attempt), NotRun::Late);
    assert!(by(2, JobKind::Attempt).actual >= deadline);
    // The pulse's second credit.
    assert!(matches!(
        by(2, JobKind::PulseEnd).outcome,
        JobOutcome::NotRun(_)
    ));
    assert_ok(by(3, JobKind::Safe));
    assert_eq!(r.d.stats().arrived_late.load(Ordering::Relaxed), 2);
    let ids: Vec<_> = r.changes().into_iter().map(|c| c.id).collect();
    assert_eq!(ids, ["job-3"]);
    r.assert_settled();
}

/// (d) Stop: a pulse in progress ends at once; future jobs are not run.
#[test]
fn stop_ends_a_pulse_at_once_and_does_not_run_future_jobs() {
    let mut r = Rig::start();
    let [a, b] = r.outputs(&["9", "10"])[..] else {
        panic!("two lines")
    };
    let width = 60_000 * MS; // a minute: only `stop` can end it in time
    let mut p = job(
        1,
        JobKind::Attempt,
        Op::Pulse {
            line: a,
            value: 1,
            width_ns: width,
        },
        in_ms(20),
    );
    p.live = Some(live_flag());
    r.submit(p);
    let start = r.wait(1);
    assert_ok(&start[0]);
    assert_eq!(start[0].kind, JobKind::Attempt);
    r.submit(job(2, JobKind::Attempt, Op::Write(b, 1), in_ms(60_000)));
    r.submit(job(
        3,
        JobKind::Attempt,
        Op::Pulse {
            line: b,
            value: 1,
            width_ns: MS,
        },
        in_ms(60_000),
    ));
    let asked = Instant::now();
    assert!(r.d.stop(WAIT), "the thread ended");
    assert!(asked.elapsed() < WAIT);
    let done = r.wait(4);
    let end = done
        .iter()
        .find(|d| d.ticket == 1)
        .unwrap_or_else(|| panic!("no pulse end: {done:?}"));
    assert_eq!(end.kind, JobKind::PulseEnd);
    assert_ok(end);
    assert!(
        end.actual.as_nanos() < start[0].actual.as_nanos() + width,
        "ended early"
    );
    for d in done.iter().filter(|d| d.ticket != 1) {
        if d.kind == JobKind::PulseEnd {
            // The never-started pulse's second credit.
            assert!(matches!(d.outcome, JobOutcome::NotRun(_)), "{d:?}");
        } else {
            assert_not_run(d, NotRun::Stopped);
        }
    }
    assert_eq!(
        r.changes()
            .iter()
            .map(|c| (c.id.as_str(), c.value))
            .collect::<Vec<_>>(),
        [("job-1", 1), ("job-1", 0)],
        "the pulse started and ended; nothing else moved"
    );
    r.assert_settled();
}

/// (e) A withdrawn pack's pulse ends before the safe write that follows.
#[test]
fn a_withdrawn_pulse_ends_before_a_later_safe_write() {
    let mut r = Rig::start();
    let [a] = r.outputs(&["11"])[..] else {
        panic!("one line")
    };
    let live = live_flag();
    let width = 60_000 * MS;
    let mut p = job(
        1,
        JobKind::Attempt,
        Op::Pulse {
            line: a,
            value: 1,
            width_ns: width,
        },
        in_ms(20),
    );
    p.live = Some(live.clone());
    r.submit(p);
    let start = r.wait(1);
    assert_ok(&start[0]);
    // The pack enters its safe state: withdrawn (too late for the
    // leading edge, which ran), then its safe write.
    assert!(!live.withdraw());
    let safe_at = in_ms(10);
    r.submit(job(2, JobKind::Safe, Op::Write(a, 0), safe_at));
    let done = r.wait(2);
    assert_eq!(
        done.iter().map(|d| (d.ticket, d.kind)).collect::<Vec<_>>(),
        [(1, JobKind::PulseEnd), (2, JobKind::Safe)]
    );
    assert_ok(&done[0]);
    assert_ok(&done[1]);
    assert!(done[0].actual <= done[1].actual);
    assert!(done[1].actual >= safe_at);
    assert_eq!(
        r.changes()
            .iter()
            .map(|c| (c.id.as_str(), c.value))
            .collect::<Vec<_>>(),
        [("job-1", 1), ("job-1", 0), ("job-2", 0)],
        "pulse start, pulse end, safe write"
    );
    r.assert_settled();
}

/// (f) Credits bound what is in flight; every accepted job gets its
/// results; a refusal is immediate.
#[test]
fn credits_refuse_instead_of_blocking_and_every_job_gets_its_results() {
    let mut r = Rig::start();
    let lines = r.outputs(&["20", "21", "22", "23"]);
    let base = in_ms(30);
    let mut expected = std::collections::HashMap::new();
    let mut ticket = 0u64;
    // Attempts, one pulse in four, until the attempt credits run out.
    loop {
        ticket += 1;
        let h = lines[ticket as usize % lines.len()];
        let op = if ticket.is_multiple_of(4) {
            Op::Pulse {
                line: h,
                value: 1,
                width_ns: 50_000,
            }
        } else {
            Op::Write(h, (ticket % 2) as u8)
        };
        let at = base.add_nanos(ticket as i64 * 5_000);
        if !r.d.credits().available(JobKind::Attempt, op.credits()) {
            // What the control loop would never do: the dispatcher says no.
            let t0 = Instant::now();
            let e = r.d.submit(job(ticket, JobKind::Attempt, op, at));
            assert!(matches!(e, Err(DispatchError::NoCredit(_))), "{e:?}");
            assert!(t0.elapsed() < Duration::from_secs(1));
            break;
        }
        r.submit(job(ticket, JobKind::Attempt, op, at));
        expected.insert(ticket, op.credits());
    }
    assert!(r.d.credits().in_flight() <= ATTEMPT_CREDITS);
    assert!(r.d.credits().in_flight() >= ATTEMPT_CREDITS - 1);
    // A plain write too: the last attempt credit may be left.
    while r.d.credits().available(JobKind::Attempt, 1) {
        ticket += 1;
        r.submit(job(ticket, JobKind::Attempt, Op::Write(lines[0], 1), base));
        expected.insert(ticket, 1);
    }
    assert_eq!(r.d.credits().in_flight(), ATTEMPT_CREDITS);
    ticket += 1;
    assert!(matches!(
        r.d.submit(job(ticket, JobKind::Attempt, Op::Write(lines[0], 1), base)),
        Err(DispatchError::NoCredit(_))
    ));
    // Safe writes still have their reserve, up to the queue's size.
    while r.d.credits().available(JobKind::Safe, 1) {
        ticket += 1;
        r.submit(job(ticket, JobKind::Safe, Op::Write(lines[1], 0), base));
        expected.insert(ticket, 1);
    }
    assert_eq!(r.d.credits().in_flight(), QUEUE_CAPACITY);
    ticket += 1;
    assert!(matches!(
        r.d.submit(job(ticket, JobKind::Safe, Op::Write(lines[1], 0), base)),
        Err(DispatchError::NoCredit(_))
    ));
    let total: usize = expected.values().sum();
    assert_eq!(total, QUEUE_CAPACITY);
    let done = r.wait(total);
    let mut count = std::collections::HashMap::new();
    for d in &done {
        assert_ok(d);
        *count.entry(d.ticket).or_insert(0usize) += 1;
    }
    assert_eq!(count, expected, "one result per credit, per job");
    assert_eq!(
        done.iter().filter(|d| d.kind == JobKind::PulseEnd).count(),
        expected.values().filter(|&&n| n == 2).count()
    );
    assert!(r.d.try_done().is_none(), "no result beyond the credits");
    r.assert_settled();
}

/// (g) A line request is served between firings, and its handle works.
#[test]
fn line_requests_are_served_between_firings() {
    let mut r = Rig::start();
    let [a] = r.outputs(&["30"])[..] else {
        panic!("one line")
    };
    // A dense stream: never the quiet gap a request prefers, so the thread
    // must serve it mid-stream once it has waited long enough.
    let n = 300u64;
    let first = in_ms(20);
    let last = first.add_nanos((n as i64 - 1) * MS);
    for i in 0..n {
        let at = first.add_nanos(i as i64 * MS);
        r.submit(job(i + 1, JobKind::Attempt, Op::Toggle(a), at));
    }
    // The stream has begun: from now on the next firing is always near.
    assert_ok(&r.wait(1)[0]);
    let handles =
        r.d.request_lines(
            &[
                (line("31"), Direction::Output),
                (line("32"), Direction::Input),
            ],
            WAIT,
        )
        .expect("served");
    let answered = mono_now();
    assert!(
        answered < last,
        "the request waited for the whole stream to end"
    );
    let b = handles[0];
    assert_ne!(b, a);
    // The new handle works, in the middle of the stream.
    let at = in_ms(5);
    r.submit(job(1000, JobKind::Attempt, Op::Write(b, 1), at));
    r.submit(job(1001, JobKind::Attempt, Op::Read(handles[1]), at));
    let done = r.wait(n as usize + 1);
    done.iter().for_each(assert_ok);
    let read = done.iter().find(|d| d.ticket == 1001).expect("read");
    assert!(matches!(read.outcome, JobOutcome::Ok(Some(0))), "{read:?}");
    let log = r.changes();
    assert_eq!(log.len(), n as usize + 1);
    assert!(log.iter().any(|c| c.id == "job-1000" && c.line == "31"));
    r.assert_settled();
}

/// A job handed over just before `stop` gets its result by the time `stop`
/// says the thread ended. (The thread used to look at its inbox, serve a
/// line request, then see the stop flag and leave: a job that arrived in
/// between vanished, its credit with it. The request's answer wakes this
/// thread right inside that window: with the bug, 1000 tries lose a job
/// nearly every run.)
#[test]
fn a_job_handed_over_just_before_stop_is_not_lost() {
    for i in 0..1000 {
        let mut r = Rig::start();
        let [a] = r.outputs(&["50"])[..] else {
            panic!("one line")
        };
        r.submit(job(1, JobKind::Attempt, Op::Write(a, 1), in_ms(60_000)));
        assert!(r.d.stop(WAIT));
        let d =
            r.d.try_done()
                .unwrap_or_else(|| panic!("try {i}: the job vanished at stop"));
        assert_not_run(&d, NotRun::Stopped);
        r.assert_settled();
    }
}

/// A backend whose writes block until the test lets them go: a stuck
/// device driver.
#[derive(Debug)]
struct Stuck {
    entered: Sender<()>,
    release: Receiver<()>,
}

impl Gpio for Stuck {
    fn request(&mut self, _: &LineRef) -> Result<LineHandle, GpioError> {
        Ok(LineHandle(0))
    }
    fn request_input(&mut self, _: &LineRef) -> Result<LineHandle, GpioError> {
        Ok(LineHandle(0))
    }
    fn write(&mut self, _: LineHandle, _: u8, _: i64, _: &str) -> Result<(), GpioError> {
        let _ = self.entered.send(());
        // Bounded, so a failed test cannot leave the thread stuck forever.
        let _ = self.release.recv_timeout(Duration::from_secs(30));
        Ok(())
    }
    fn read(&mut self, _: LineHandle) -> Result<u8, GpioError> {
        Ok(0)
    }
    fn level(&self, _: LineHandle) -> Option<u8> {
        Some(0)
    }
    fn describe(&self, h: LineHandle) -> String {
        format!("stuck:{}", h.0)
    }
}

/// (h) `stop` returns within its timeout, promptly when the thread is idle
/// and at the timeout when it is stuck in the device.
#[test]
fn stop_returns_within_its_timeout() {
    // Idle, with a job a minute away.
    let mut r = Rig::start();
    let [a] = r.outputs(&["40"])[..] else {
        panic!("one line")
    };
    r.submit(job(1, JobKind::Attempt, Op::Write(a, 1), in_ms(60_000)));
    let t0 = Instant::now();
    assert!(r.d.stop(Duration::from_secs(5)));
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert_not_run(&r.wait(1)[0], NotRun::Stopped);
    assert!(r.d.stop(Duration::ZERO), "stopped stays stopped");
    r.assert_settled();

    // Stuck in a write.
    let (entered, entered_rx) = channel();
    let (release_tx, release) = channel();
    let gpio = Stuck { entered, release };
    let clock = Arc::new(ClockEstimate::from_system());
    let (mut d, _emergency) =
        Dispatcher::start(Box::new(gpio), clock, no_rt(), std::thread::current())
            .expect("dispatcher thread");
    d.submit(job(
        1,
        JobKind::Safe,
        Op::Write(LineHandle(0), 1),
        mono_now(),
    ))
    .expect("submitted");
    entered_rx.recv_timeout(WAIT).expect("the write started");
    let limit = Duration::from_millis(200);
    let t0 = Instant::now();
    assert!(!d.stop(limit), "a stuck thread is reported, not waited on");
    let took = t0.elapsed();
    assert!(
        took >= limit && took < limit + Duration::from_secs(2),
        "{took:?}"
    );
    assert!(!d.stop(Duration::ZERO), "still stuck");
    // Unstuck: it finishes the write and ends.
    release_tx.send(()).expect("release");
    assert!(d.stop(WAIT), "ended once unstuck");
}

/// Wait (bounded) until the thread has finished `jobs` jobs and gone back
/// to waiting: by then it has decided whether to unpark this thread.
fn wait_idle_after(r: &Rig, jobs: u64) {
    use baton_service::watchdog::Activity;
    let until = Instant::now() + WAIT;
    while r.d.stats().jobs.load(Ordering::Relaxed) < jobs
        || r.d.stats().heartbeat.pulse().activity == Activity::Busy
    {
        assert!(Instant::now() < until, "the thread never went idle");
        std::thread::yield_now();
    }
}

/// Whether this thread holds an unpark token: parking returns at once
/// with one, after `probe` without.
fn unparked_within(probe: Duration) -> bool {
    let t = Instant::now();
    std::thread::park_timeout(probe);
    t.elapsed() < probe
}

/// A success is left for the control thread's next pass when that pass is
/// near (one wake-up per firing instant, not two); a failure, or a job
/// whose result an `after:` waits on, wakes it at once.
#[test]
fn successes_wait_for_a_near_control_pass_failures_and_prompt_jobs_do_not() {
    let mut r = Rig::start();
    let [a] = r.outputs(&["5"])[..] else {
        panic!("one line")
    };
    let probe = Duration::from_millis(300);
    // The control thread (this one) will run again in 5 ms by itself.
    let near = || Some(mono_now().add_nanos(5 * MS));

    // A plain success: no wake-up.
    assert!(!r.d.plan_control_wake(near()), "no result waits yet");
    std::thread::park_timeout(Duration::ZERO); // drop an old token
    r.submit(job(1, JobKind::Attempt, Op::Write(a, 1), in_ms(20)));
    wait_idle_after(&r, 1);
    assert!(!unparked_within(probe), "a success woke the control thread");
    // Its next pass finds it; and a pass about to park is told it waits.
    assert!(
        r.d.plan_control_wake(near()),
        "the waiting result is reported"
    );
    assert_ok(&r.d.try_done().expect("the result is there"));

    // A failure (an unknown line handle): at once.
    std::thread::park_timeout(Duration::ZERO);
    r.submit(job(
        2,
        JobKind::Attempt,
        Op::Write(LineHandle(999), 1),
        in_ms(20),
    ));
    assert!(
        unparked_within(WAIT),
        "a failure must wake the control thread"
    );
    wait_idle_after(&r, 2);
    assert!(matches!(
        r.d.try_done().expect("the failure").outcome,
        JobOutcome::Failed(_)
    ));

    // A prompt success: at once.
    std::thread::park_timeout(Duration::ZERO);
    let mut j = job(3, JobKind::Attempt, Op::Write(a, 0), in_ms(20));
    j.prompt = true;
    r.submit(j);
    assert!(
        unparked_within(WAIT),
        "a prompt job must wake the control thread"
    );
    wait_idle_after(&r, 3);
    assert_ok(&r.d.try_done().expect("the prompt result"));

    // A far pass (or none planned): every result wakes it, as before.
    r.d.plan_control_wake(Some(mono_now().add_nanos(1_000 * MS)));
    std::thread::park_timeout(Duration::ZERO);
    r.submit(job(4, JobKind::Attempt, Op::Write(a, 1), in_ms(20)));
    assert!(unparked_within(WAIT), "a far pass must not delay results");
    wait_idle_after(&r, 4);
    assert_ok(&r.d.try_done().expect("the result"));
    r.d.plan_control_wake(None);
    r.assert_settled();
}
