//! The exec pool against real child processes (`/bin/sh`).
//!
//! No test sleeps to wait: results arrive on a channel (`recv_timeout`), and
//! a grandchild's death is observed through a pidfd, which polls readable
//! when the process exits.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use baton_agent::exec::{ExecError, ExecOutcome, ExecPool, ExecRequest, ExecResult};

const SH: &str = "/bin/sh";
const LONG: Duration = Duration::from_secs(20);

fn pool(workers: usize, allow: &[&str]) -> (ExecPool, Receiver<ExecResult>) {
    let (tx, rx) = mpsc::channel();
    let pool = ExecPool::new(workers, allow.iter().map(PathBuf::from).collect(), tx);
    (pool, rx)
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
    }
}

fn recv(rx: &Receiver<ExecResult>) -> ExecResult {
    match rx.recv_timeout(LONG) {
        Ok(r) => r,
        Err(e) => panic!("no exec result within {LONG:?}: {e}"),
    }
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
    assert!(r.finished_ns >= r.started_ns);

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
    let (p, rx) = pool(1, &[SH]);
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
            assert!(stderr_tail.len() <= baton_agent::exec::STDERR_TAIL);
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

#[test]
fn shutdown_kills_running_and_cancels_queued() {
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
            ("queued".to_string(), ExecOutcome::Cancelled),
            ("running".to_string(), ExecOutcome::Cancelled)
        ]
    );
    // Killed and reaped before shutdown returned.
    // SAFETY: existence check only.
    assert_eq!(
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
