//! A worker pool for `exec` actions.
//!
//! The dispatcher thread must never block on a child process, so `exec`
//! actions are handed to a small pool of worker threads ([`ExecPool::submit`]
//! only validates and enqueues) and their results come back on a channel.
//!
//! # What a child gets
//!
//! - Only allowlisted programs: an absolute path, without `..`, equal byte
//!   for byte to an allowlist entry. No canonicalisation (which would follow
//!   symlinks an attacker may control); what the operator wrote is what runs.
//! - A clean environment: `PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin`,
//!   the request's `env`, then `BATON_EXECUTION_ID`, `BATON_IDEMPOTENCY_KEY`,
//!   `BATON_ATTEMPT` and `BATON_SCHEDULED_AT` (set last, so a pack cannot
//!   forge them). The agent's own environment is not inherited: it may hold
//!   credentials, and a pack's behaviour must not depend on how the agent was
//!   started. `LD_*` variables are refused: they would let a pack run code
//!   other than the allowlisted program (principle 2).
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

mod sys;

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// How much of a child's stderr is kept (the end of it, where errors are).
pub const STDERR_TAIL: usize = 4096;

/// How often the exit is checked when the kernel has no pidfd.
pub const FALLBACK_SLICE: Duration = Duration::from_millis(20);

/// Queued (not yet running) requests per worker before `submit` says no.
pub const QUEUE_PER_WORKER: usize = 16;

/// `PATH` given to children (they do not inherit the agent's environment).
pub const CHILD_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Time source for `started_ns` / `finished_ns` (the agent passes its
/// reference clock; the default is `CLOCK_MONOTONIC`).
pub type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

/// One `exec` firing.
#[derive(Clone, Debug, PartialEq, Eq)]
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
    /// Extra environment.
    pub env: BTreeMap<String, String>,
    /// Killed (with its process group) after this long.
    pub timeout: Duration,
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
    /// Ran past its timeout; the process group was killed.
    TimedOut,
    /// The program is not on the allowlist. [`ExecPool::submit`] refuses
    /// such requests synchronously and never sends this; it exists so the
    /// caller can report a refused submission through the same feedback path.
    NotAllowed,
    /// Could not be started (missing, not executable, bad argument).
    SpawnError(String),
    /// The pool shut down first: the child was killed (or never started).
    /// The action may or may not have had its effect.
    Cancelled,
}

/// What the pool sends back for every accepted request, exactly once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecResult {
    /// From the request.
    pub execution_id: String,
    /// How it ended.
    pub outcome: ExecOutcome,
    /// Clock just before spawning.
    pub started_ns: i64,
    /// Clock after the child was reaped.
    pub finished_ns: i64,
}

/// Why [`ExecPool::submit`] refused a request (nothing was started).
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// Not runnable under the allowlist rules.
    #[error("exec of {program:?} refused: {reason}")]
    NotAllowed {
        /// The program as requested.
        program: String,
        /// Which rule it broke.
        reason: &'static str,
    },
    /// An environment entry that cannot or must not be passed.
    #[error("exec of {program:?} refused: environment variable {key:?} {reason}")]
    BadEnv {
        /// The program.
        program: String,
        /// The variable.
        key: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// An argument with a NUL byte.
    #[error("exec of {program:?} refused: argument {index} contains a NUL byte")]
    BadArg {
        /// The program.
        program: String,
        /// Which argument (0-based).
        index: usize,
    },
    /// All workers busy and the queue full: a schedule fires faster than its
    /// programs finish. Refused rather than queued without bound.
    #[error("exec queue full ({capacity} waiting): programs finish slower than they are scheduled")]
    QueueFull {
        /// Queue capacity.
        capacity: usize,
    },
    /// The pool could not start (no worker thread, no stop pipe) or has stopped.
    #[error("exec pool unavailable: {0}")]
    Unavailable(String),
}

struct Job {
    req: ExecRequest,
}

struct Shared {
    results: Sender<ExecResult>,
    clock: Clock,
    stopping: AtomicBool,
    /// Read end of the stop pipe; readable (EOF) once the pool stops.
    stop_rx: OwnedFd,
    /// Wait on pidfds; off only to test the old-kernel fallback.
    use_pidfd: bool,
}

/// A fixed set of worker threads running allowlisted programs.
pub struct ExecPool {
    allowlist: Vec<PathBuf>,
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
            .field("allowlist", &self.allowlist)
            .field("workers", &self.workers.len())
            .field("capacity", &self.capacity)
            .field("broken", &self.broken)
            .finish_non_exhaustive()
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds.
pub fn monotonic_ns() -> i64 {
    // Instant is CLOCK_MONOTONIC on Linux; measure from a process-wide origin.
    static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let origin = *ORIGIN.get_or_init(Instant::now);
    i64::try_from(origin.elapsed().as_nanos()).unwrap_or(i64::MAX)
}

impl ExecPool {
    /// `workers` threads (at least 1), timestamps from [`monotonic_ns`].
    pub fn new(workers: usize, allowlist: Vec<PathBuf>, results: Sender<ExecResult>) -> Self {
        Self::with_clock(workers, allowlist, results, Arc::new(monotonic_ns))
    }

    /// As [`ExecPool::new`], with the clock for `started_ns` / `finished_ns`.
    ///
    /// Never fails: if the OS refuses a thread or the stop pipe, the pool is
    /// built broken and every [`submit`](Self::submit) says why.
    pub fn with_clock(
        workers: usize,
        allowlist: Vec<PathBuf>,
        results: Sender<ExecResult>,
        clock: Clock,
    ) -> Self {
        Self::build(workers, allowlist, results, clock, true)
    }

    fn build(
        workers: usize,
        allowlist: Vec<PathBuf>,
        results: Sender<ExecResult>,
        clock: Clock,
        use_pidfd: bool,
    ) -> Self {
        let n = workers.max(1);
        let capacity = n * QUEUE_PER_WORKER;
        let mut pool = ExecPool {
            allowlist,
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

    /// Whether `program` may run: absolute, no `..` component, and exactly
    /// (byte for byte) an allowlist entry.
    pub fn is_allowed(&self, program: &str) -> bool {
        self.check_program(program).is_ok()
    }

    fn check_program(&self, program: &str) -> Result<(), &'static str> {
        if !program.starts_with('/') {
            return Err("not an absolute path");
        }
        if program.split('/').any(|c| c == "..") {
            return Err("path contains '..'");
        }
        if !self
            .allowlist
            .iter()
            .any(|a| a.as_os_str() == std::ffi::OsStr::new(program))
        {
            return Err("not on the agent's exec allowlist");
        }
        Ok(())
    }

    /// Validate and enqueue; the result arrives on the results channel.
    /// An `Err` means nothing was started and no result will be sent.
    pub fn submit(&self, req: ExecRequest) -> Result<(), ExecError> {
        if let Err(reason) = self.check_program(&req.program) {
            return Err(ExecError::NotAllowed {
                program: req.program,
                reason,
            });
        }
        for (key, value) in &req.env {
            let reason = if key.is_empty() {
                Some("has an empty name")
            } else if key.contains(['=', '\0']) {
                Some("has '=' or NUL in its name")
            } else if value.contains('\0') {
                Some("has a NUL byte in its value")
            } else if key.starts_with("LD_") {
                Some(
                    "is a dynamic-loader variable (it could run code other than the allowlisted program)",
                )
            } else if key.starts_with("BATON_") {
                Some("is reserved for the agent")
            } else {
                None
            };
            if let Some(reason) = reason {
                return Err(ExecError::BadEnv {
                    program: req.program.clone(),
                    key: key.clone(),
                    reason,
                });
            }
        }
        if let Some(index) = req.args.iter().position(|a| a.contains('\0')) {
            return Err(ExecError::BadArg {
                program: req.program,
                index,
            });
        }
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

    /// Kill running children (whole process groups), report them and every
    /// queued request as [`ExecOutcome::Cancelled`], and join the workers.
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
        let result = if shared.stopping.load(Ordering::SeqCst) {
            let now = (shared.clock)();
            ExecResult {
                execution_id: req.execution_id,
                outcome: ExecOutcome::Cancelled,
                started_ns: now,
                finished_ns: now,
            }
        } else {
            run(&req, shared)
        };
        // The receiver is gone only when the agent is going down; there is
        // no one left to tell.
        let _ = shared.results.send(result);
    }
}

enum End {
    Exited,
    TimedOut,
    Cancelled,
}

/// Run one request to completion: spawn, supervise, kill the group, reap.
fn run(req: &ExecRequest, shared: &Shared) -> ExecResult {
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
    let started_ns = (shared.clock)();
    let done = |outcome| ExecResult {
        execution_id: req.execution_id.clone(),
        outcome,
        started_ns,
        finished_ns: (shared.clock)(),
    };
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return done(ExecOutcome::SpawnError(format!("{}: {e}", req.program))),
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
    done(outcome)
}

/// Wait for exit, timeout or stop; then kill the group, reap, drain stderr.
fn supervise(
    child: &mut Child,
    timeout: Duration,
    shared: &Shared,
) -> (End, io::Result<ExitStatus>, String) {
    // std's pids fit pid_t; a failure here is impossible in practice, and
    // 0 would make killpg target our own group, so refuse it outright.
    let pid = libc::pid_t::try_from(child.id()).unwrap_or(-1);
    // `None`: a timeout too large to represent, i.e. no deadline.
    let deadline = Instant::now().checked_add(timeout);
    let mut tail = Tail::default();
    let mut stderr = child.stderr.take();
    if let Some(s) = &stderr
        && sys::set_nonblocking(s.as_fd()).is_err()
    {
        // Blocking reads could hang on an escaped grandchild; give up the
        // tail rather than risk it.
        stderr = None;
    }
    let pidfd = if shared.use_pidfd {
        sys::pidfd_open(pid).ok()
    } else {
        None
    };

    let end = loop {
        match sys::exited_nowait(pid) {
            Ok(true) | Err(_) => break End::Exited,
            Ok(false) => {}
        }
        let now = Instant::now();
        let mut wait = match deadline {
            Some(d) if now >= d => break End::TimedOut,
            Some(d) => Some(d - now),
            None => None,
        };
        if pidfd.is_none() {
            wait = Some(wait.map_or(FALLBACK_SLICE, |w| w.min(FALLBACK_SLICE)));
        }
        let fds = [
            Some(shared.stop_rx.as_fd()),
            stderr.as_ref().map(|s| s.as_fd()),
            pidfd.as_ref().map(|p| p.as_fd()),
        ];
        let Ok(revents) = sys::poll(&fds, wait) else {
            // poll itself failed (ENOMEM): pause one slice, then re-check
            // exit and deadline, rather than spin.
            thread::sleep(FALLBACK_SLICE);
            continue;
        };
        if revents[0] & sys::READY != 0 {
            break End::Cancelled;
        }
        if revents[1] & sys::READY != 0 && !tail.drain(&mut stderr) {
            stderr = None; // EOF or error: stop polling it
        }
    };

    // Kill the group while the leader is unreaped: its pid, and so the group
    // id, cannot have been reused. After a normal exit this cleans up
    // background stragglers; after a timeout or stop it is the kill.
    if pid > 0 {
        let _ = sys::kill_group(pid);
    }
    let status = child.wait();
    tail.drain(&mut stderr);
    (end, status, tail.into_string())
}

/// The last [`STDERR_TAIL`] bytes seen.
#[derive(Default)]
struct Tail {
    buf: Vec<u8>,
}

impl Tail {
    /// Read what is available without blocking; false on EOF or error.
    fn drain(&mut self, src: &mut Option<std::process::ChildStderr>) -> bool {
        let Some(s) = src else {
            return false;
        };
        let mut chunk = [0u8; 4096];
        loop {
            match s.read(&mut chunk) {
                Ok(0) => return false,
                Ok(n) => self.push(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
        if self.buf.len() > 2 * STDERR_TAIL {
            let cut = self.buf.len() - STDERR_TAIL;
            self.buf.drain(..cut);
        }
    }

    fn into_string(mut self) -> String {
        if self.buf.len() > STDERR_TAIL {
            let cut = self.buf.len() - STDERR_TAIL;
            self.buf.drain(..cut);
        }
        String::from_utf8_lossy(&self.buf).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(allow: &[&str]) -> (ExecPool, Receiver<ExecResult>) {
        let (tx, rx) = mpsc::channel();
        (
            ExecPool::new(1, allow.iter().map(PathBuf::from).collect(), tx),
            rx,
        )
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
        }
    }

    #[test]
    fn allowlist_is_exact_and_absolute() {
        let (p, _rx) = pool(&["/bin/true", "/usr/bin/logrotate", "bin/rel"]);
        assert!(p.is_allowed("/bin/true"));
        assert!(p.is_allowed("/usr/bin/logrotate"));
        assert!(!p.is_allowed("/bin/false"));
        assert!(!p.is_allowed("true"));
        assert!(!p.is_allowed("bin/rel"), "relative paths never run");
        assert!(!p.is_allowed("/usr/bin/../bin/logrotate"));
        assert!(!p.is_allowed("/usr/bin/./logrotate"), "no normalisation");
        assert!(!p.is_allowed("/usr//bin/logrotate"), "no normalisation");
        assert!(!p.is_allowed("/bin/true/"));
        let e = p.submit(req("/bin/false")).err().map(|e| e.to_string());
        assert_eq!(
            e.as_deref(),
            Some("exec of \"/bin/false\" refused: not on the agent's exec allowlist")
        );
        let e = p.submit(req("/usr/bin/../x")).err().map(|e| e.to_string());
        assert_eq!(
            e.as_deref(),
            Some("exec of \"/usr/bin/../x\" refused: path contains '..'")
        );
    }

    #[test]
    fn env_and_args_are_checked_at_submit() {
        let (p, _rx) = pool(&["/bin/true"]);
        for key in ["LD_PRELOAD", "BATON_ATTEMPT", "A=B", ""] {
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
        let p = ExecPool::build(1, vec!["/bin/sh".into()], tx, Arc::new(monotonic_ns), false);
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

    #[test]
    fn clock_is_injected() {
        let (tx, rx) = mpsc::channel();
        let p = ExecPool::with_clock(1, vec!["/bin/true".into()], tx, Arc::new(|| 42));
        assert!(p.submit(req("/bin/true")).is_ok());
        let r = rx.recv_timeout(Duration::from_secs(10));
        assert_eq!(
            r.ok(),
            Some(ExecResult {
                execution_id: "e1".into(),
                outcome: ExecOutcome::Ok,
                started_ns: 42,
                finished_ns: 42
            })
        );
    }
}
