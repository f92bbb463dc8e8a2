//! The exec pool against real child processes (`/bin/sh`).
//!
//! No test sleeps to wait: results arrive on a channel (`recv_timeout`), a
//! child's "I am running" arrives on a FIFO read with a deadline, and a
//! grandchild's death is observed through a pidfd, which polls readable
//! when the process exits.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use baton_clock::MonoTime;
use baton_exec::{
    ExecError, ExecOutcome, ExecPolicy, ExecPool, ExecRequest, ExecResult, NotStartedReason,
};

const SH: &str = "/bin/sh";
const LONG: Duration = Duration::from_secs(20);

fn policy(allow: &[&str]) -> ExecPolicy {
    ExecPolicy::from_programs(allow.iter().copied()).expect("valid allowlist")
}

fn pool_with(workers: usize, policy: ExecPolicy) -> (ExecPool, Receiver<ExecResult>) {
    let (tx, rx) = mpsc::channel();
    let pool = ExecPool::new(workers, policy, tx, Arc::new(|| {}));
    (pool, rx)
}

fn pool(workers: usize, allow: &[&str]) -> (ExecPool, Receiver<ExecResult>) {
    pool_with(workers, policy(allow))
}

fn sh(id: &str, script: &str, timeout: Duration) -> ExecRequest {
    ExecRequest {
        execution_id: id.into(),
        idempotency_key: format!("key-{id}"),
        attempt: 2,
        scheduled_at: "2026-12-01T10:00:00.000Z".into(),
        program: SH.into(),
        args: vec!["-c".into(), script.into()],
        env: BTreeMap::new(),
        timeout,
        not_after: None,
        live: None,
    }
}

fn recv(rx: &Receiver<ExecResult>) -> ExecResult {
    match rx.recv_timeout(LONG) {
        Ok(r) => r,
        Err(e) => panic!("no exec result within {LONG:?}: {e}"),
    }
}

/// `CLOCK_MONOTONIC` read directly, independent of the agent's helpers.
#[allow(
    clippy::useless_conversion,
    reason = "`time_t` and `c_long` are i32 on armv7 gnueabihf, i64 here"
)]
fn clock_monotonic() -> MonoTime {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid, writable timespec.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(r, 0, "clock_gettime");
    // `time_t` and `c_long` are 32 bits on armv7: widen first.
    MonoTime::from_nanos(i64::from(ts.tv_sec) * 1_000_000_000 + i64::from(ts.tv_nsec))
}

fn read_pid(path: &Path) -> libc::pid_t {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{} not written: {e}", path.display()));
    text.trim()
        .parse()
        .unwrap_or_else(|e| panic!("{text:?} is not a pid: {e}"))
}

/// Wait (on an event, not a sleep) until `pid` has exited, up to `limit`.
/// A pidfd polls readable once the process is dead (zombie or reaped).
fn wait_dead(pid: libc::pid_t, limit: Duration) -> bool {
    // SAFETY: pidfd_open takes plain integers.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        // ESRCH: already gone (reaped).
        return std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
    }
    let fd = fd as libc::c_int;
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let r = unsafe { libc::poll(&mut p, 1, limit.as_millis() as libc::c_int) };
    // SAFETY: closing the descriptor we opened.
    unsafe { libc::close(fd) };
    r == 1
}

#[test]
fn program_outside_the_allowlist_is_refused() {
    let (p, rx) = pool(1, &["/bin/true"]);
    let err = p.submit(sh("e", "exit 0", LONG));
    assert!(
        matches!(err, Err(ExecError::NotAllowed { ref program, .. }) if program == SH),
        "{err:?}"
    );
    assert!(!p.is_allowed(SH));
    assert!(p.is_allowed("/bin/true"));
    let mut rel = sh("e", "exit 0", LONG);
    rel.program = "sh".into();
    assert!(matches!(p.submit(rel), Err(ExecError::NotAllowed { .. })));
    p.shutdown();
    assert!(rx.try_recv().is_err(), "a refused request sends no result");
}

#[test]
fn timed_out_program_is_killed_with_its_process_group() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pids = dir.path().join("pids");
    let (p, rx) = pool(1, &[SH]);
    // The leader writes its own pid and a backgrounded grandchild's, then
    // waits for the grandchild (30 s).
    let script = format!(
        "sleep 30 & echo \"$$ $!\" > {0}.tmp && mv {0}.tmp {0}; wait",
        pids.display()
    );
    let t0 = Instant::now();
    p.submit(sh("slow", &script, Duration::from_millis(200)))
        .expect("submitted");
    let r = recv(&rx);
    let took = t0.elapsed();
    assert_eq!(r.execution_id, "slow");
    assert_eq!(r.outcome, ExecOutcome::TimedOut);
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert!(r.started.is_some_and(|s| r.finished >= s));

    let text = std::fs::read_to_string(&pids).expect("script wrote its pids");
    let mut it = text.split_whitespace().map(|s| s.parse::<libc::pid_t>());
    let (leader, grandchild) = match (it.next(), it.next()) {
        (Some(Ok(a)), Some(Ok(b))) => (a, b),
        _ => panic!("bad pid file {text:?}"),
    };
    // The leader was reaped by the pool before it reported: no zombie.
    // SAFETY: kill with signal 0 only checks existence.
    let alive = unsafe { libc::kill(leader, 0) };
    assert_eq!(alive, -1, "leader {leader} still exists (zombie?)");
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::ESRCH)
    );
    // The grandchild got the group's SIGKILL (it is not our child, so init
    // reaps it; we wait for its death event).
    assert!(
        wait_dead(grandchild, Duration::from_secs(5)),
        "grandchild {grandchild} survived the timeout"
    );
    p.shutdown();
}

#[test]
fn baton_env_and_request_env_are_passed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("env");
    let mut pol = ExecPolicy::new();
    pol.allow(SH, ["MODE"]).expect("valid");
    let (p, rx) = pool_with(1, pol);
    let mut r = sh(
        "exec-42",
        &format!(
            "{{ echo \"id=$BATON_EXECUTION_ID\"; echo \"key=$BATON_IDEMPOTENCY_KEY\"; \
             echo \"attempt=$BATON_ATTEMPT\"; echo \"at=$BATON_SCHEDULED_AT\"; \
             echo \"mode=$MODE\"; echo \"home=${{HOME-unset}}\"; echo \"path=$PATH\"; }} > {}",
            out.display()
        ),
        LONG,
    );
    r.env.insert("MODE".into(), "night shift".into());
    p.submit(r).expect("submitted");
    let res = recv(&rx);
    assert_eq!(res.outcome, ExecOutcome::Ok);
    let text = std::fs::read_to_string(&out).expect("script wrote env");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines,
        [
            "id=exec-42",
            "key=key-exec-42",
            "attempt=2",
            "at=2026-12-01T10:00:00.000Z",
            "mode=night shift",
            "home=unset",
            "path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        ]
    );
    p.shutdown();
}

#[test]
fn non_zero_exit_is_failed_with_code_and_stderr_tail() {
    let (p, rx) = pool(2, &[SH]);
    // 10 000 lines of noise, then the interesting end.
    let script = "i=0; while [ $i -lt 10000 ]; do echo \"noise $i\" >&2; i=$((i+1)); done; \
                  echo 'relay driver: EIO on /dev/relay0' >&2; exit 3";
    p.submit(sh("fail", script, LONG)).expect("submitted");
    let r = recv(&rx);
    match r.outcome {
        ExecOutcome::Failed { code, stderr_tail } => {
            assert_eq!(code, Some(3));
            assert!(
                stderr_tail.ends_with("noise 9999\nrelay driver: EIO on /dev/relay0\n"),
                "{stderr_tail:?}"
            );
            assert!(stderr_tail.len() <= baton_exec::STDERR_TAIL);
            assert!(!stderr_tail.contains("noise 0\n"));
        }
        other => panic!("expected Failed, got {other:?}"),
    }
    p.shutdown();
}

#[test]
fn killed_by_a_signal_is_failed_without_code() {
    let (p, rx) = pool(1, &[SH]);
    p.submit(sh("sig", "echo bye >&2; kill -TERM $$", LONG))
        .expect("submitted");
    assert_eq!(
        recv(&rx).outcome,
        ExecOutcome::Failed {
            code: None,
            stderr_tail: "bye\n".into()
        }
    );
    p.shutdown();
}

#[test]
fn missing_program_is_a_spawn_error() {
    let (p, rx) = pool(1, &["/nonexistent/baton-test-tool"]);
    let mut r = sh("x", "", LONG);
    r.program = "/nonexistent/baton-test-tool".into();
    r.args.clear();
    p.submit(r).expect("submitted");
    match recv(&rx).outcome {
        ExecOutcome::SpawnError(m) => {
            assert!(m.starts_with("/nonexistent/baton-test-tool: "), "{m}");
        }
        other => panic!("expected SpawnError, got {other:?}"),
    }
    p.shutdown();
}

#[test]
fn background_stragglers_are_killed_after_a_normal_exit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pidf = dir.path().join("pid");
    let (p, rx) = pool(1, &[SH]);
    // Leaves a 30 s sleeper behind (stderr closed so it does not hold the pipe).
    let script = format!(
        "sleep 30 2>/dev/null & echo $! > {0}.tmp && mv {0}.tmp {0}; exit 0",
        pidf.display()
    );
    p.submit(sh("bg", &script, LONG)).expect("submitted");
    assert_eq!(recv(&rx).outcome, ExecOutcome::Ok);
    let straggler = read_pid(&pidf);
    assert!(
        wait_dead(straggler, Duration::from_secs(5)),
        "straggler {straggler} survived"
    );
    p.shutdown();
}

/// A FIFO the test reads with a deadline: the event a child's "I am
/// running" message arrives on (no sleeping, no file polling).
struct Fifo {
    path: PathBuf,
    file: std::fs::File,
}

impl Fifo {
    fn new(dir: &Path, name: &str) -> Fifo {
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::fs::OpenOptionsExt;
        let path = dir.join(name);
        let c = std::ffi::CString::new(path.as_os_str().as_bytes()).expect("no NUL");
        // SAFETY: a valid C string and a mode.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
        // Non-blocking open of the read end succeeds with no writer yet.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)
            .expect("open fifo");
        Fifo { path, file }
    }

    /// The first line written, waiting at most `limit`.
    fn line(&mut self, limit: Duration) -> String {
        use std::io::Read;
        use std::os::fd::AsRawFd;
        let deadline = Instant::now() + limit;
        let mut got = Vec::new();
        while !got.contains(&b'\n') {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "nothing on {} within {limit:?}",
                self.path.display()
            );
            let mut p = libc::pollfd {
                fd: self.file.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut p, 1, left.as_millis() as libc::c_int + 1) };
            let mut buf = [0u8; 64];
            match self.file.read(&mut buf) {
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("read fifo: {e}"),
            }
        }
        String::from_utf8_lossy(&got).trim().to_owned()
    }
}

/// A running child that reported its pid on `started` and then waits 30 s:
/// it holds a worker until the test kills it (or the pool does).
fn blocker(started: &Fifo) -> ExecRequest {
    let script = format!("echo $$ > {}; exec sleep 30", started.path.display());
    sh("blocker", &script, LONG)
}

fn kill(pid: libc::pid_t) {
    // SAFETY: plain integers.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0, "kill {pid}");
}

#[test]
fn shutdown_kills_running_and_reports_queued_as_not_started() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut started = Fifo::new(dir.path(), "started");
    let (p, rx) = pool(1, &[SH]);
    let script = format!("echo $$ > {}; exec sleep 30", started.path.display());
    p.submit(sh("running", &script, LONG)).expect("submitted");
    p.submit(sh("queued", "exit 0", LONG)).expect("submitted");
    let pid: libc::pid_t = started.line(LONG).parse().expect("a pid");
    let t0 = Instant::now();
    p.shutdown();
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "shutdown took {:?}",
        t0.elapsed()
    );
    let mut got: Vec<(String, ExecOutcome)> =
        rx.try_iter().map(|r| (r.execution_id, r.outcome)).collect();
    got.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        got,
        [
            (
                "queued".to_string(),
                ExecOutcome::NotStarted {
                    reason: NotStartedReason::PoolStopped
                }
            ),
            ("running".to_string(), ExecOutcome::Cancelled)
        ]
    );
    // Killed and reaped before shutdown returned.
    assert_eq!(
        // SAFETY: signal 0 only checks that `pid` exists; no memory passed.
        unsafe { libc::kill(pid, 0) },
        -1,
        "child {pid} still exists"
    );
}

#[test]
fn workers_run_in_parallel() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("rendezvous");
    let c = std::ffi::CString::new(f.to_string_lossy().as_bytes()).expect("no NUL");
    // SAFETY: a valid C string and a mode.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    let (p, rx) = pool(2, &[SH]);
    // Opening a FIFO blocks until the other end opens: the two children
    // only finish if two workers run them at once (one worker: time-out).
    let t = Duration::from_secs(10);
    p.submit(sh("w", &format!("echo hi > {}", f.display()), t))
        .expect("submitted");
    p.submit(sh(
        "r",
        &format!("read x < {}; [ \"$x\" = hi ]", f.display()),
        t,
    ))
    .expect("submitted");
    assert_eq!(recv(&rx).outcome, ExecOutcome::Ok);
    assert_eq!(recv(&rx).outcome, ExecOutcome::Ok);
    p.shutdown();
}

#[test]
fn a_request_that_waits_past_not_after_is_not_started() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut started = Fifo::new(dir.path(), "started");
    let marker = dir.path().join("ran");
    let (p, rx) = pool(1, &[SH]);
    p.submit(blocker(&started)).expect("submitted");
    let pid: libc::pid_t = started.line(LONG).parse().expect("a pid");
    // The only worker is busy: this one waits, and its limit is now.
    let mut late = sh("late", &format!("touch {}", marker.display()), LONG);
    let not_after = clock_monotonic();
    late.not_after = Some(not_after);
    p.submit(late).expect("submitted");
    kill(pid);
    let r = recv(&rx);
    assert_eq!(r.execution_id, "blocker");
    let r = recv(&rx);
    assert_eq!(r.execution_id, "late");
    match r.outcome {
        ExecOutcome::NotStarted {
            reason:
                NotStartedReason::Expired {
                    not_after: n,
                    picked_up,
                },
        } => {
            assert_eq!(n, not_after);
            assert!(picked_up > not_after);
            assert!(r.finished >= picked_up);
        }
        other => panic!("expected NotStarted(Expired), got {other:?}"),
    }
    assert_eq!(r.started, None);
    p.shutdown();
    assert!(!marker.exists(), "the late program ran");
}

#[test]
fn the_timeout_counts_from_the_spawn_not_from_the_submit() {
    let (p, rx) = pool(1, &[SH]);
    let t0 = clock_monotonic();
    // Holds the only worker for 300 ms (its own timeout), while the next
    // request, whose timeout is 100 ms, waits in the queue.
    p.submit(sh("blocker", "exec sleep 30", Duration::from_millis(300)))
        .expect("submitted");
    p.submit(sh("quick", "exit 0", Duration::from_millis(100)))
        .expect("submitted");
    assert_eq!(recv(&rx).outcome, ExecOutcome::TimedOut);
    let r = recv(&rx);
    assert_eq!(r.execution_id, "quick");
    assert_eq!(r.outcome, ExecOutcome::Ok);
    let waited = r.started.expect("started").as_nanos() - t0.as_nanos();
    assert!(waited >= 300_000_000, "started after {waited} ns");
    p.shutdown();
}

#[test]
fn a_withdrawn_request_never_starts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut started = Fifo::new(dir.path(), "started");
    let marker = dir.path().join("ran");
    let (p, rx) = pool(1, &[SH]);
    p.submit(blocker(&started)).expect("submitted");
    let live = baton_dispatch::ledger::Slot::standalone();
    let mut queued = sh("queued", &format!("touch {}", marker.display()), LONG);
    queued.live = Some(live.clone());
    p.submit(queued).expect("submitted");
    let pid: libc::pid_t = started.line(LONG).parse().expect("a pid");
    // The pack entered its safe state while the request waited.
    assert!(live.withdraw());
    kill(pid);
    assert_eq!(recv(&rx).execution_id, "blocker");
    let r = recv(&rx);
    assert_eq!(
        (r.execution_id.as_str(), &r.outcome, r.started),
        (
            "queued",
            &ExecOutcome::NotStarted {
                reason: NotStartedReason::Withdrawn
            },
            None
        )
    );
    assert_eq!(
        r.outcome.to_string(),
        "not run: withdrawn (its pack entered its safe state)"
    );
    p.shutdown();
    assert!(!marker.exists(), "the withdrawn program ran");
}

#[test]
fn env_keys_are_refused_unless_allowed_and_allowed_ones_reach_the_child() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("env");
    let mut pol = ExecPolicy::new();
    pol.allow(SH, ["MODE", "PATH"]).expect("valid");
    pol.allow("/bin/true", std::iter::empty::<String>())
        .expect("valid");
    let env = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };

    // At acceptance: a pure check with a message that says what to change.
    let e = pol
        .check(SH, &[], &env(&[("MODE", "a"), ("BASH_ENV", "/tmp/evil")]))
        .expect_err("BASH_ENV is not allowed");
    assert_eq!(
        e.to_string(),
        "exec of \"/bin/sh\" refused: environment variable BASH_ENV is not allowed for this \
         program by the agent's exec-allowlist (allowed: MODE, PATH)"
    );
    let e = pol
        .check(
            "/bin/true",
            &[],
            &env(&[("PERL5OPT", "-d"), ("PYTHONPATH", "/tmp")]),
        )
        .expect_err("nothing is allowed for /bin/true");
    assert_eq!(
        e,
        ExecError::EnvNotAllowed {
            program: "/bin/true".into(),
            refused: vec!["PERL5OPT".into(), "PYTHONPATH".into()],
            allowed: vec![],
        }
    );
    assert!(pol.check(SH, &[], &env(&[("MODE", "a")])).is_ok());

    // At submit, again: refused, nothing queued, no result.
    let (p, rx) = pool_with(1, pol);
    let mut r = sh("evil", "exit 0", LONG);
    r.env = env(&[("BASH_ENV", "/tmp/evil")]);
    assert!(matches!(p.submit(r), Err(ExecError::EnvNotAllowed { .. })));
    assert!(rx.try_recv().is_err());

    // Allowed keys reach the child; PATH only because it is allowed here.
    let mut r = sh(
        "ok",
        &format!(
            "{{ echo \"mode=$MODE\"; echo \"path=$PATH\"; }} > {}",
            out.display()
        ),
        LONG,
    );
    r.env = env(&[
        ("MODE", "night shift"),
        ("PATH", "/opt/plant/bin:/usr/bin:/bin"),
    ]);
    p.submit(r).expect("submitted");
    assert_eq!(recv(&rx).outcome, ExecOutcome::Ok);
    let text = std::fs::read_to_string(&out).expect("script wrote env");
    assert_eq!(
        text.lines().collect::<Vec<_>>(),
        ["mode=night shift", "path=/opt/plant/bin:/usr/bin:/bin"]
    );
    p.shutdown();
}

#[test]
fn timestamps_are_on_clock_monotonic() {
    let (p, rx) = pool(1, &["/bin/true"]);
    let mut r = sh("t", "", LONG);
    r.program = "/bin/true".into();
    r.args.clear();
    let before = clock_monotonic();
    p.submit(r).expect("submitted");
    let res = recv(&rx);
    let after = clock_monotonic();
    assert_eq!(res.outcome, ExecOutcome::Ok);
    let started = res.started.expect("started");
    assert!(
        before <= started && started <= res.finished && res.finished <= after,
        "{before:?} <= {started:?} <= {:?} <= {after:?}",
        res.finished
    );
    p.shutdown();
}

#[test]
fn notify_fires_once_per_result_after_it_is_sent() {
    let (tx, rx) = mpsc::channel();
    let (ntx, nrx) = mpsc::channel::<()>();
    let notify = Arc::new(move || {
        let _ = ntx.send(());
    });
    let p = ExecPool::new(2, policy(&[SH]), tx, notify);
    for id in ["a", "b", "c"] {
        p.submit(sh(id, "exit 0", LONG)).expect("submitted");
    }
    let mut ids = Vec::new();
    for _ in 0..3 {
        nrx.recv_timeout(LONG).expect("a notification");
        // Sent before the notification: already waiting.
        let r = rx.try_recv().expect("a result before its notification");
        ids.push(r.execution_id);
    }
    p.shutdown();
    ids.sort();
    assert_eq!(ids, ["a", "b", "c"]);
    assert!(nrx.try_recv().is_err(), "one notification per result");
}

#[test]
fn a_full_queue_refuses_at_submit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut started = Fifo::new(dir.path(), "started");
    let (p, rx) = pool(1, &[SH]);
    p.submit(blocker(&started)).expect("submitted");
    started.line(LONG);
    let capacity = p.capacity();
    assert_eq!(capacity, baton_exec::QUEUE_PER_WORKER);
    for i in 0..capacity {
        p.submit(sh(&format!("q{i}"), "exit 0", LONG))
            .expect("room in the queue");
    }
    let e = p.submit(sh("one-too-many", "exit 0", LONG));
    assert_eq!(e, Err(ExecError::QueueFull { capacity }));
    assert_eq!(
        e.map_err(|e| e.to_string()),
        Err("exec queue full (16 waiting): programs finish slower than they are scheduled".into())
    );
    p.shutdown();
    let got: Vec<ExecOutcome> = rx.try_iter().map(|r| r.outcome).collect();
    assert_eq!(got.len(), capacity + 1, "one result per accepted request");
    assert_eq!(got[0], ExecOutcome::Cancelled);
}
