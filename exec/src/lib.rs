//! A worker pool for `exec` actions.
//!
//! The dispatcher thread must never block on a child process, so `exec`
//! actions are handed to a small pool of worker threads ([`ExecPool::submit`]
//! only validates and enqueues) and their results come back on a channel;
//! after each result is sent the pool calls the `notify` hook it was built
//! with, so the control loop can wait on events instead of polling.
//!
//! # What may run
//!
//! [`ExecPolicy`] (the agent's `exec-allowlist`): programs matched byte for
//! byte, and per program the environment keys a pack may set. The runtime
//! checks every `exec` action of a pack with [`ExecPolicy::check`] when it
//! accepts the pack; [`ExecPool::submit`] checks again (defence in depth).
//!
//! # What a child gets
//!
//! - A clean environment: `PATH=`[`CHILD_PATH`], the request's `env` (only
//!   keys the policy allows for the program; `PATH` is replaced only if the
//!   policy allows it), then `BATON_EXECUTION_ID`, `BATON_IDEMPOTENCY_KEY`,
//!   `BATON_ATTEMPT` and `BATON_SCHEDULED_AT` (set last, and refused in a
//!   request, so a pack cannot forge them). The agent's own environment is
//!   not inherited: it may hold credentials, and a pack's behaviour must not
//!   depend on how the agent was started.
//! - stdin `/dev/null`, stdout discarded, the last [`STDERR_TAIL`] bytes of
//!   stderr kept for the failure report.
//! - Its own process group. On timeout the whole group is `SIGKILL`ed and
//!   the child reaped: no zombie, no grandchild left holding a relay. The
//!   group is also killed after a normal exit, to clean up stragglers a
//!   script backgrounded. The group is killed *before* the leader is reaped
//!   (we wait with `WNOWAIT`), so its id cannot have been recycled for an
//!   unrelated process. Descendants that leave the group (`setsid`, double
//!   fork into a new group) are out of reach; that is what an allowlist of
//!   trusted programs is for.
//!
//! # Waiting for a worker is not running
//!
//! A request may wait in the queue while every worker is busy. Its
//! `timeout` counts from the spawn, never from the submit. A worker that
//! picks it up after its `not_after`, or finds its ledger slot withdrawn
//! (its pack entered its safe state, a newer version replaced it), does not start it and reports
//! [`ExecOutcome::NotStarted`]: the program certainly did not run.
//!
//! # Time
//!
//! `not_after`, `started` and `finished` are on the pool's clock:
//! `CLOCK_MONOTONIC` nanoseconds ([`baton_clock::mono_now`], the agent's
//! [`MonoTime`] scale) unless a test injects another with
//! [`ExecPool::with_clock`].
//!
//! The agent must not set `SIGCHLD` to `SIG_IGN` (children would be reaped
//! by the kernel and their exit status lost) and must not `waitpid(-1)`.
//!
//! # Waiting without sleeping
//!
//! Each worker `poll`s on the child's stderr pipe, a pidfd for the child's
//! exit (Linux ≥ 5.3) and the pool's stop pipe, with the request's deadline
//! as timeout: every wake-up is an event. On kernels without `pidfd_open`
//! the exit is checked every [`FALLBACK_SLICE`] instead — no event exists
//! there short of a process-wide `SIGCHLD` handler.

#![forbid(unsafe_code)]

mod error;
pub mod policy;
mod supervise;
mod sys;

pub use error::ExecError;
pub use policy::{ExecPolicy, ExecPolicyError};

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use baton_clock::{MonoTime, mono_now};

use supervise::{End, supervise};

/// How much of a child's stderr is kept (the end of it, where errors are).
pub const STDERR_TAIL: usize = 4096;

/// How often the exit is checked when the kernel has no pidfd.
pub const FALLBACK_SLICE: Duration = Duration::from_millis(20);

/// Queued (not yet running) requests per worker before `submit` says no.
pub const QUEUE_PER_WORKER: usize = 16;

/// `PATH` given to children (they do not inherit the agent's environment),
/// unless the policy lets a pack set `PATH` for the program and it does.
pub const CHILD_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The pool's clock, for `not_after`, `started` and `finished`. The default
/// is [`mono_now`] (`CLOCK_MONOTONIC`); tests inject fakes.
pub type Clock = Arc<dyn Fn() -> MonoTime + Send + Sync>;

/// Called by a worker after each result is sent (the runtime unparks its
/// control thread), so results wake the control loop at once. Runs on the
/// worker thread: keep it short; it must not block or panic.
pub type Notify = Arc<dyn Fn() + Send + Sync>;

/// One `exec` firing.
#[derive(Clone, Debug)]
pub struct ExecRequest {
    /// Deterministic execution id (`BATON_EXECUTION_ID`).
    pub execution_id: String,
    /// Stable across attempts, for the program's own dedup (`BATON_IDEMPOTENCY_KEY`).
    pub idempotency_key: String,
    /// 1 for the first attempt (`BATON_ATTEMPT`).
    pub attempt: u32,
    /// Scheduled reference time, RFC 3339 (`BATON_SCHEDULED_AT`).
    pub scheduled_at: String,
    /// Absolute path, on the allowlist.
    pub program: String,
    /// Arguments.
    pub args: Vec<String>,
    /// Extra environment: only keys the policy allows for `program`.
    pub env: BTreeMap<String, String>,
    /// Killed (with its process group) this long after it was spawned.
    /// Time spent queued does not count.
    pub timeout: Duration,
    /// Not started if no worker picked it up by this instant (pool clock);
    /// reported as [`NotStartedReason::Expired`]. `None`: no limit.
    pub not_after: Option<MonoTime>,
    /// The attempt's slot in the dispatch ledger: claimed right before the
    /// spawn; withdrawn before that, the request is not started and is
    /// reported as [`NotStartedReason::Withdrawn`]. `None`: always live.
    pub live: Option<baton_dispatch::ledger::Slot>,
}

/// Why a request was never started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotStartedReason {
    /// A worker was free only after the request's `not_after`.
    Expired {
        /// The request's limit.
        not_after: MonoTime,
        /// When a worker picked it up.
        picked_up: MonoTime,
    },
    /// Its `live` flag was cleared before a worker could start it.
    Withdrawn,
    /// The pool shut down while it was queued.
    PoolStopped,
}

impl std::fmt::Display for NotStartedReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotStartedReason::Expired {
                not_after,
                picked_up,
            } => write!(
                f,
                "no exec worker was free in time ({} past its start limit)",
                baton_proto::time::fmt_ns(picked_up.nanos_since(*not_after))
            ),
            NotStartedReason::Withdrawn => {
                f.write_str("withdrawn (its pack entered its safe state)")
            }
            NotStartedReason::PoolStopped => f.write_str("the exec pool stopped first"),
        }
    }
}

/// How an execution ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExecOutcome {
    /// Exit status 0.
    Ok,
    /// Non-zero exit (`code`), or killed by a signal we did not send (`code: None`).
    Failed {
        /// Exit code, if it exited.
        code: Option<i32>,
        /// The last [`STDERR_TAIL`] bytes of stderr (lossy UTF-8).
        stderr_tail: String,
    },
    /// Ran past its timeout (counted from the spawn); the process group was
    /// killed.
    TimedOut,
    /// Not run: no process was started, the action had no effect.
    NotStarted {
        /// Why.
        reason: NotStartedReason,
    },
    /// Could not be started (missing, not executable): the action had no
    /// effect.
    SpawnError(String),
    /// The pool shut down while it ran: the process group was killed. The
    /// action may or may not have had its effect.
    Cancelled,
}

impl std::fmt::Display for ExecOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExecOutcome::Ok => f.write_str("ok"),
            ExecOutcome::Failed { code, stderr_tail } => {
                match code {
                    Some(c) => write!(f, "exit {c}")?,
                    None => f.write_str("killed by a signal")?,
                }
                match stderr_tail.trim() {
                    "" => Ok(()),
                    tail => write!(f, ": {tail}"),
                }
            }
            ExecOutcome::TimedOut => f.write_str("timed out (process group killed)"),
            ExecOutcome::NotStarted { reason } => write!(f, "not run: {reason}"),
            ExecOutcome::SpawnError(e) => write!(f, "could not start: {e}"),
            ExecOutcome::Cancelled => f.write_str("killed: the exec pool stopped"),
        }
    }
}

/// What the pool sends back for every accepted request, exactly once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecResult {
    /// From the request.
    pub execution_id: String,
    /// How it ended.
    pub outcome: ExecOutcome,
    /// Pool clock just before the spawn; `None` if no process was started
    /// ([`ExecOutcome::NotStarted`], [`ExecOutcome::SpawnError`]).
    pub started: Option<MonoTime>,
    /// Pool clock once the outcome was known (the child reaped, or the
    /// decision not to start it taken).
    pub finished: MonoTime,
}

struct Job {
    req: ExecRequest,
}

struct Shared {
    results: Sender<ExecResult>,
    notify: Notify,
    clock: Clock,
    stopping: AtomicBool,
    /// Read end of the stop pipe; readable (EOF) once the pool stops.
    stop_rx: OwnedFd,
    /// Wait on pidfds; off only to test the old-kernel fallback.
    use_pidfd: bool,
}

/// A fixed set of worker threads running allowlisted programs.
pub struct ExecPool {
    policy: ExecPolicy,
    /// Bounded: at most `capacity` requests wait; `submit` only `try_send`s.
    tx: Option<SyncSender<Job>>,
    capacity: usize,
    workers: Vec<JoinHandle<()>>,
    shared: Option<Arc<Shared>>,
    /// Write end of the stop pipe; dropped to wake every worker.
    stop_tx: Option<OwnedFd>,
    /// Why the pool is unusable, if it is.
    broken: Option<String>,
}

impl std::fmt::Debug for ExecPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecPool")
            .field("policy", &self.policy)
            .field("workers", &self.workers.len())
            .field("capacity", &self.capacity)
            .field("broken", &self.broken)
            .finish_non_exhaustive()
    }
}

impl ExecPool {
    /// `workers` threads (at least 1) running what `policy` allows; results
    /// on `results`, each followed by a call of `notify`; timestamps from
    /// [`mono_now`] (`CLOCK_MONOTONIC`).
    ///
    /// Never fails: if the OS refuses a thread or the stop pipe, the pool is
    /// built broken and every [`submit`](Self::submit) says why.
    pub fn new(
        workers: usize,
        policy: ExecPolicy,
        results: Sender<ExecResult>,
        notify: Notify,
    ) -> Self {
        Self::with_clock(workers, policy, results, notify, Arc::new(mono_now))
    }

    /// As [`ExecPool::new`], with another clock for `not_after`, `started`
    /// and `finished` (tests).
    pub fn with_clock(
        workers: usize,
        policy: ExecPolicy,
        results: Sender<ExecResult>,
        notify: Notify,
        clock: Clock,
    ) -> Self {
        Self::build(workers, policy, results, notify, clock, true)
    }

    fn build(
        workers: usize,
        policy: ExecPolicy,
        results: Sender<ExecResult>,
        notify: Notify,
        clock: Clock,
        use_pidfd: bool,
    ) -> Self {
        let n = workers.max(1);
        let capacity = n * QUEUE_PER_WORKER;
        let mut pool = ExecPool {
            policy,
            tx: None,
            capacity,
            workers: Vec::new(),
            shared: None,
            stop_tx: None,
            broken: None,
        };
        let (stop_rx, stop_tx) = match sys::pipe() {
            Ok(p) => p,
            Err(e) => {
                pool.broken = Some(format!("cannot create stop pipe: {e}"));
                return pool;
            }
        };
        let shared = Arc::new(Shared {
            results,
            notify,
            clock,
            stopping: AtomicBool::new(false),
            stop_rx,
            use_pidfd,
        });
        let (tx, rx) = mpsc::sync_channel::<Job>(capacity);
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..n {
            let (shared, rx) = (shared.clone(), rx.clone());
            match thread::Builder::new()
                .name(format!("baton-exec-{i}"))
                .spawn(move || worker(&shared, &rx))
            {
                Ok(h) => pool.workers.push(h),
                Err(e) => {
                    pool.broken = Some(format!("cannot start exec worker thread: {e}"));
                    break;
                }
            }
        }
        pool.tx = Some(tx);
        pool.shared = Some(shared);
        pool.stop_tx = Some(stop_tx);
        if pool.broken.is_some() {
            pool.stop();
        }
        pool
    }

    /// What may run.
    pub fn policy(&self) -> &ExecPolicy {
        &self.policy
    }

    /// Whether `program` may run (see [`ExecPolicy::is_allowed`]).
    pub fn is_allowed(&self, program: &str) -> bool {
        self.policy.is_allowed(program)
    }

    /// Requests that may wait for a worker before [`submit`](Self::submit)
    /// answers [`ExecError::QueueFull`].
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Check against the policy and enqueue, without blocking; the result
    /// arrives on the results channel. An `Err` means nothing was queued and
    /// no result will be sent.
    pub fn submit(&self, req: ExecRequest) -> Result<(), ExecError> {
        self.policy.check(&req.program, &req.args, &req.env)?;
        if let Some(why) = &self.broken {
            return Err(ExecError::Unavailable(why.clone()));
        }
        let Some(tx) = &self.tx else {
            return Err(ExecError::Unavailable("the pool has stopped".to_owned()));
        };
        match tx.try_send(Job { req }) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(ExecError::QueueFull {
                capacity: self.capacity,
            }),
            Err(TrySendError::Disconnected(_)) => Err(ExecError::Unavailable(
                "every exec worker has exited".to_owned(),
            )),
        }
    }

    /// Kill running children (whole process groups) and report them as
    /// [`ExecOutcome::Cancelled`], report every queued request as
    /// [`NotStartedReason::PoolStopped`], and join the workers.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(shared) = &self.shared {
            shared.stopping.store(true, Ordering::SeqCst);
        }
        // Closing the queue ends idle workers' recv once it is drained;
        // closing the stop pipe wakes the busy ones out of poll.
        self.tx = None;
        self.stop_tx = None;
        for h in self.workers.drain(..) {
            // A worker that panicked has nothing left to clean up here.
            let _ = h.join();
        }
    }
}

impl Drop for ExecPool {
    /// Dropping the pool stops it like [`ExecPool::shutdown`]: a child must
    /// never outlive the agent's interest in it.
    fn drop(&mut self) {
        self.stop();
    }
}

fn worker(shared: &Shared, rx: &Mutex<Receiver<Job>>) {
    loop {
        let job = {
            // A poisoned lock only means another worker panicked while
            // holding it; the receiver itself is fine.
            let rx = rx.lock().unwrap_or_else(|e| e.into_inner());
            rx.recv()
        };
        let Ok(Job { req }) = job else {
            return; // queue closed and drained: the pool is stopping
        };
        let result = run(&req, shared);
        // The receiver is gone only when the agent is going down; there is
        // no one left to tell.
        if shared.results.send(result).is_ok() {
            (shared.notify)();
        }
    }
}

/// Why a request picked up now must not start, if it must not.
fn must_not_start(req: &ExecRequest, shared: &Shared, now: MonoTime) -> Option<NotStartedReason> {
    if shared.stopping.load(Ordering::SeqCst) {
        return Some(NotStartedReason::PoolStopped);
    }
    if req.live.as_ref().is_some_and(|l| l.withdrawn()) {
        return Some(NotStartedReason::Withdrawn);
    }
    match req.not_after {
        Some(not_after) if now > not_after => Some(NotStartedReason::Expired {
            not_after,
            picked_up: now,
        }),
        _ => None,
    }
}

/// Run one request to completion: last checks, spawn, supervise, kill the
/// group, reap.
fn run(req: &ExecRequest, shared: &Shared) -> ExecResult {
    let result = |outcome, started| ExecResult {
        execution_id: req.execution_id.clone(),
        outcome,
        started,
        finished: (shared.clock)(),
    };
    let mut cmd = Command::new(&req.program);
    cmd.args(&req.args)
        .env_clear()
        .env("PATH", CHILD_PATH)
        .envs(&req.env)
        .env("BATON_EXECUTION_ID", &req.execution_id)
        .env("BATON_IDEMPOTENCY_KEY", &req.idempotency_key)
        .env("BATON_ATTEMPT", req.attempt.to_string())
        .env("BATON_SCHEDULED_AT", &req.scheduled_at)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0);
    // Last checks right before the spawn: a flag cleared while we were
    // building the command still stops it.
    let now = (shared.clock)();
    if let Some(reason) = must_not_start(req, shared, now) {
        return result(ExecOutcome::NotStarted { reason }, None);
    }
    // Taken now: a withdrawal from here on is too late (the program is
    // about to run; a crash from here leaves it `outcome unknown`).
    if req.live.as_ref().is_some_and(|l| !l.claim()) {
        let reason = NotStartedReason::Withdrawn;
        return result(ExecOutcome::NotStarted { reason }, None);
    }
    let started = Some(now);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return result(
                ExecOutcome::SpawnError(format!("{}: {e}", req.program)),
                None,
            );
        }
    };
    let (end, status, tail) = supervise(&mut child, req.timeout, shared);
    let outcome = match (end, status) {
        (End::TimedOut, _) => ExecOutcome::TimedOut,
        (End::Cancelled, _) => ExecOutcome::Cancelled,
        (End::Exited, Ok(s)) if s.success() => ExecOutcome::Ok,
        (End::Exited, Ok(s)) => ExecOutcome::Failed {
            code: s.code(),
            stderr_tail: tail,
        },
        (End::Exited, Err(e)) => ExecOutcome::Failed {
            code: None,
            stderr_tail: format!("{tail}[baton: exit status lost: {e}]"),
        },
    };
    result(outcome, started)
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::supervise::Tail;
    use super::*;

    fn no_notify() -> Notify {
        Arc::new(|| {})
    }

    fn pool(allow: &[&str]) -> (ExecPool, Receiver<ExecResult>) {
        let (tx, rx) = mpsc::channel();
        let policy = ExecPolicy::from_programs(allow.iter().copied()).expect("valid allowlist");
        (ExecPool::new(1, policy, tx, no_notify()), rx)
    }

    fn req(program: &str) -> ExecRequest {
        ExecRequest {
            execution_id: "e1".into(),
            idempotency_key: "k1".into(),
            attempt: 1,
            scheduled_at: "2026-12-01T10:00:00Z".into(),
            program: program.into(),
            args: vec![],
            env: BTreeMap::new(),
            timeout: Duration::from_secs(10),
            not_after: None,
            live: None,
        }
    }

    #[test]
    fn submit_checks_the_policy_again() {
        let (p, rx) = pool(&["/bin/true"]);
        assert!(p.is_allowed("/bin/true"));
        assert!(matches!(
            p.submit(req("/bin/false")),
            Err(ExecError::NotAllowed { .. })
        ));
        for key in ["LD_PRELOAD", "BASH_ENV", "PATH"] {
            let mut r = req("/bin/true");
            r.env.insert(key.into(), "x".into());
            assert!(
                matches!(p.submit(r), Err(ExecError::EnvNotAllowed { .. })),
                "{key:?}"
            );
        }
        for key in ["BATON_ATTEMPT", "A=B", ""] {
            let mut r = req("/bin/true");
            r.env.insert(key.into(), "x".into());
            assert!(
                matches!(p.submit(r), Err(ExecError::BadEnv { .. })),
                "{key:?}"
            );
        }
        let mut r = req("/bin/true");
        r.args = vec!["ok".into(), "a\0b".into()];
        assert!(matches!(
            p.submit(r),
            Err(ExecError::BadArg { index: 1, .. })
        ));
        p.shutdown();
        assert!(rx.try_recv().is_err(), "a refused request sends no result");
    }

    #[test]
    fn tail_keeps_the_end() {
        let mut t = Tail::default();
        for i in 0..10_000u32 {
            t.push(format!("{i}\n").as_bytes());
        }
        let s = t.into_string();
        assert_eq!(s.len(), STDERR_TAIL);
        assert!(s.ends_with("9998\n9999\n"));
    }

    /// The old-kernel path (no pidfd: exit checked every slice) behaves the same.
    #[test]
    fn without_pidfd_exit_and_timeout_still_work() {
        let (tx, rx) = mpsc::channel();
        let policy = ExecPolicy::from_programs(["/bin/sh"]).expect("valid");
        let p = ExecPool::build(1, policy, tx, no_notify(), Arc::new(mono_now), false);
        let mut fail = req("/bin/sh");
        fail.args = vec!["-c".into(), "echo oops >&2; exit 7".into()];
        let mut slow = req("/bin/sh");
        slow.args = vec!["-c".into(), "sleep 30".into()];
        slow.timeout = Duration::from_millis(100);
        assert!(p.submit(fail).is_ok());
        assert!(p.submit(slow).is_ok());
        let t0 = Instant::now();
        let got: Vec<_> = (0..2)
            .filter_map(|_| rx.recv_timeout(Duration::from_secs(20)).ok())
            .map(|r| r.outcome)
            .collect();
        assert_eq!(
            got,
            [
                ExecOutcome::Failed {
                    code: Some(7),
                    stderr_tail: "oops\n".into()
                },
                ExecOutcome::TimedOut
            ]
        );
        assert!(t0.elapsed() < Duration::from_secs(10));
        p.shutdown();
    }

    /// With a fake clock standing at 42: `not_after` 42 still starts (the
    /// limit is inclusive), 41 does not; timestamps come from the clock.
    #[test]
    fn clock_is_injected_and_not_after_is_inclusive() {
        let (tx, rx) = mpsc::channel();
        let policy = ExecPolicy::from_programs(["/bin/true"]).expect("valid");
        let p = ExecPool::with_clock(
            1,
            policy,
            tx,
            no_notify(),
            Arc::new(|| MonoTime::from_nanos(42)),
        );
        let mut on_time = req("/bin/true");
        on_time.not_after = Some(MonoTime::from_nanos(42));
        let mut late = req("/bin/true");
        late.execution_id = "e2".into();
        late.not_after = Some(MonoTime::from_nanos(41));
        assert!(p.submit(on_time).is_ok());
        assert!(p.submit(late).is_ok());
        let got: Vec<_> = (0..2)
            .filter_map(|_| rx.recv_timeout(Duration::from_secs(10)).ok())
            .collect();
        assert_eq!(
            got,
            [
                ExecResult {
                    execution_id: "e1".into(),
                    outcome: ExecOutcome::Ok,
                    started: Some(MonoTime::from_nanos(42)),
                    finished: MonoTime::from_nanos(42)
                },
                ExecResult {
                    execution_id: "e2".into(),
                    outcome: ExecOutcome::NotStarted {
                        reason: NotStartedReason::Expired {
                            not_after: MonoTime::from_nanos(41),
                            picked_up: MonoTime::from_nanos(42)
                        }
                    },
                    started: None,
                    finished: MonoTime::from_nanos(42)
                }
            ]
        );
        assert_eq!(
            got[1].outcome.to_string(),
            "not run: no exec worker was free in time (1ns past its start limit)"
        );
    }
}
