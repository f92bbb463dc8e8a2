//! The agent and the controller under systemd: the units in `systemd/`
//! pass `systemd-analyze verify`; the agent speaks the notify protocol
//! (READY=1, WATCHDOG=1 at half `WATCHDOG_USEC` while it and its
//! dispatcher are alive, STOPPING=1 on the way out) and stops pinging when
//! its dispatcher hangs; its log lines carry a syslog priority and no
//! timestamp when stderr is the journal, and parse as JSON with
//! `--log-format json`. The service manager is played by the test: a Unix
//! datagram socket it binds (every wait is a receive with a timeout).

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use baton_e2e::local::{Setup, TOGGLE, base, setup};
use baton_e2e::{Running, bin, lines, root, signal, wait_exit, wait_until};

const T: Duration = Duration::from_secs(30);

/// The units with their `/usr/bin/...` binaries pointed at the built
/// ones (verify checks that every command exists and is executable).
fn units_in(dir: &Path) -> Vec<PathBuf> {
    let agent = bin("baton-agent");
    let controller = bin("baton-controller");
    ["baton-agent.service", "baton-controller.service"]
        .iter()
        .map(|name| {
            let text =
                std::fs::read_to_string(root().join("systemd").join(name)).expect("read unit");
            let text = text
                .replace("/usr/bin/baton-agent", &agent.display().to_string())
                .replace(
                    "/usr/bin/baton-controller",
                    &controller.display().to_string(),
                );
            let p = dir.join(name);
            std::fs::write(&p, text).expect("write unit");
            p
        })
        .collect()
}

fn verify(units: &[PathBuf]) -> Option<std::process::Output> {
    let exe = Path::new("/usr/bin/systemd-analyze");
    if !exe.exists() {
        return None;
    }
    Some(
        Command::new(exe)
            .args(["verify", "--man=no"])
            .args(units)
            .output()
            .expect("running systemd-analyze"),
    )
}

#[test]
fn units_pass_systemd_analyze_verify() {
    let dir = tempfile::tempdir().expect("tempdir");
    let units = units_in(dir.path());
    let Some(out) = verify(&units) else {
        baton_testenv::missing(
            "units_pass_systemd_analyze_verify",
            None,
            "/usr/bin/systemd-analyze is not installed (Debian: systemd)",
        );
        return;
    };
    // verify exits 0 on a setting it cannot parse (it ignores the line),
    // so any message at all is a failure.
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && err.trim().is_empty(),
        "systemd-analyze verify: {:?}\n{err}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
    for u in &units {
        let text = std::fs::read_to_string(u).expect("unit");
        for want in ["Type=notify", "NotifyAccess=main"] {
            assert!(text.contains(want), "{}: no {want}", u.display());
        }
    }
    let agent = std::fs::read_to_string(&units[0]).expect("agent unit");
    for want in [
        "WatchdogSec=",
        "CAP_SYS_NICE",
        "CAP_IPC_LOCK",
        "CAP_NET_BIND_SERVICE",
    ] {
        assert!(agent.contains(want), "agent unit: no {want}");
    }
    assert!(
        !agent
            .lines()
            .any(|l| l.trim_start().starts_with("RestrictRealtime=yes")),
        "it forbids SCHED_FIFO"
    );

    // The check has teeth: a misspelt setting is reported.
    let bad = dir.path().join("baton-agent.service");
    let text = std::fs::read_to_string(&bad).expect("unit");
    std::fs::write(&bad, text.replace("Type=notify", "Type=notfy")).expect("write");
    let out = verify(&units).expect("installed");
    assert!(
        !String::from_utf8_lossy(&out.stderr).trim().is_empty(),
        "a bad Type= went unnoticed"
    );
}

/// The test's end of `NOTIFY_SOCKET`.
struct Manager {
    sock: UnixDatagram,
    path: PathBuf,
    /// Every message received, with when.
    seen: Vec<(Instant, String)>,
}

impl Manager {
    fn bind(dir: &Path) -> Manager {
        let path = dir.join("notify.sock");
        let sock = UnixDatagram::bind(&path).expect("bind notify socket");
        Manager {
            sock,
            path,
            seen: Vec::new(),
        }
    }

    /// The next message, waiting at most `timeout`.
    fn next(&mut self, timeout: Duration) -> Option<String> {
        self.sock
            .set_read_timeout(Some(timeout.max(Duration::from_millis(1))))
            .expect("timeout");
        let mut buf = [0u8; 4096];
        let n = self.sock.recv(&mut buf).ok()?;
        let m = String::from_utf8_lossy(&buf[..n]).into_owned();
        self.seen.push((Instant::now(), m.clone()));
        Some(m)
    }

    /// Receive until a message has the line `line`; `None` after `timeout`.
    fn until(&mut self, line: &str, timeout: Duration) -> Option<String> {
        let end = Instant::now() + timeout;
        loop {
            let left = end.checked_duration_since(Instant::now())?;
            let m = self.next(left)?;
            if m.lines().any(|l| l == line || l.starts_with(line)) {
                return Some(m);
            }
        }
    }

    fn history(&self) -> String {
        self.seen
            .iter()
            .map(|(_, m)| m.replace('\n', " | "))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// [`base`] for a test that plays the service manager: quiet, with
/// none of the service manager's or the log filter's variables inherited
/// from the shell that runs the tests.
fn agent(s: &Setup, extra: &[&str]) -> Command {
    let mut c = base(s);
    c.arg("--quiet")
        .args(extra)
        .env_remove("NOTIFY_SOCKET")
        .env_remove("WATCHDOG_USEC")
        .env_remove("WATCHDOG_PID")
        .env_remove("JOURNAL_STREAM")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    c
}

fn wait_first_write(log: &Path) {
    assert!(
        wait_until(T, || lines(log).iter().any(|l| l.contains("\"value\":1"))),
        "the pack never fired"
    );
}

#[test]
fn agent_notifies_ready_pings_the_watchdog_and_says_stopping() {
    let s = setup(TOGGLE);
    let mut m = Manager::bind(s.dir.path());
    let mut child = Running(
        agent(&s, &[])
            .env("NOTIFY_SOCKET", &m.path)
            .env("WATCHDOG_USEC", "400000")
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn"),
    );
    let ready = m
        .until("READY=1", T)
        .unwrap_or_else(|| panic!("no READY=1; got:\n{}", m.history()));
    assert!(ready.contains("STATUS=running: 1 pack(s) held"), "{ready}");
    // The pack is loaded (and armed) before READY: it fires.
    wait_first_write(&s.log);
    // Pings every ~200 ms (half of 400 ms).
    let mut pings = Vec::new();
    while pings.len() < 5 {
        m.until("WATCHDOG=1", Duration::from_secs(5))
            .unwrap_or_else(|| panic!("pings stopped; got:\n{}", m.history()));
        pings.push(Instant::now());
    }
    // About every half period; the bound on the largest gap leaves room
    // for a loaded test machine (a real watchdog is seconds, not 400 ms).
    let mut gaps: Vec<Duration> = pings.windows(2).map(|w| w[1] - w[0]).collect();
    gaps.sort();
    let median = gaps[gaps.len() / 2];
    assert!(
        median >= Duration::from_millis(100) && median <= Duration::from_millis(300),
        "ping gaps {gaps:?}: not about half of 400 ms"
    );
    assert!(
        gaps.iter().all(|g| *g < Duration::from_secs(1)),
        "ping gaps {gaps:?}"
    );
    signal(&child, libc::SIGTERM);
    let stopping = m
        .until("STOPPING=1", T)
        .unwrap_or_else(|| panic!("no STOPPING=1; got:\n{}", m.history()));
    assert!(stopping.contains("STATUS=stopping"), "{stopping}");
    let status = wait_exit(&mut child, T).expect("exits after SIGTERM");
    assert!(status.success(), "{status:?}");
    // Nothing but the safe state after STOPPING: no more pings.
    while let Some(msg) = m.next(Duration::from_millis(1)) {
        assert!(!msg.contains("WATCHDOG=1"), "a ping after STOPPING=1");
    }
}

#[test]
fn a_hung_dispatcher_stops_the_watchdog_pings() {
    let s = setup(TOGGLE);
    let mut m = Manager::bind(s.dir.path());
    let mut child = Running(
        agent(&s, &["--inject-dispatcher-stall-after", "3"])
            .env("NOTIFY_SOCKET", &m.path)
            .env("WATCHDOG_USEC", "400000")
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn"),
    );
    m.until("READY=1", T)
        .unwrap_or_else(|| panic!("no READY=1; got:\n{}", m.history()));
    m.until("STATUS=dispatcher stalled", T)
        .unwrap_or_else(|| panic!("the stall went unnoticed; got:\n{}", m.history()));
    // With pings every 200 ms, a second without one is five missed.
    let quiet_until = Instant::now() + Duration::from_secs(1);
    while let Some(left) = quiet_until.checked_duration_since(Instant::now()) {
        if let Some(msg) = m.next(left) {
            assert!(
                !msg.contains("WATCHDOG=1"),
                "a ping while the dispatcher hangs; got:\n{}",
                m.history()
            );
        }
    }
    // The control loop itself still answers: the way out runs (its waits
    // on the hung dispatcher are bounded).
    signal(&child, libc::SIGTERM);
    m.until("STOPPING=1", T)
        .unwrap_or_else(|| panic!("no STOPPING=1; got:\n{}", m.history()));
    wait_exit(&mut child, T).expect("exits after SIGTERM");
}

/// Whether a line starts with a date (`2026-11-30T...`), as the text
/// format's timestamp does.
fn starts_with_timestamp(line: &str) -> bool {
    let b = line.trim_start().as_bytes();
    b.len() >= 11
        && b[..4].iter().all(u8::is_ascii_digit)
        && b[4] == b'-'
        && b[5..7].iter().all(u8::is_ascii_digit)
        && b[7] == b'-'
        && b[10] == b'T'
}

#[test]
fn under_journald_lines_carry_a_priority_and_no_timestamp() {
    use std::os::unix::fs::MetadataExt;
    let s = setup(TOGGLE);
    let path = s.dir.path().join("stderr.log");
    let file = std::fs::File::create(&path).expect("stderr file");
    let meta = file.metadata().expect("stat");
    let mut child = Running(
        agent(&s, &[])
            .env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()))
            .stderr(file)
            .spawn()
            .expect("spawn"),
    );
    wait_first_write(&s.log);
    signal(&child, libc::SIGTERM);
    assert!(wait_exit(&mut child, T).is_some_and(|s| s.success()));
    let out = lines(&path);
    assert!(!out.is_empty(), "no log lines");
    for l in &out {
        let p = l.get(..3).unwrap_or("");
        assert!(
            matches!(p, "<3>" | "<4>" | "<6>" | "<7>"),
            "no priority prefix: {l}\n{out:#?}"
        );
        assert!(!starts_with_timestamp(&l[3..]), "a timestamp: {l}");
    }
    // Info (journal opened, the signal) and warning (the safe state).
    assert!(out.iter().any(|l| l.starts_with("<6>")), "{out:#?}");
    assert!(
        out.iter()
            .any(|l| l.starts_with("<4>") && l.contains("safe_state")),
        "{out:#?}"
    );

    // Stderr elsewhere than JOURNAL_STREAM says (redirected): today's
    // text, with timestamps.
    let s = setup(TOGGLE);
    let path = s.dir.path().join("stderr.log");
    let file = std::fs::File::create(&path).expect("stderr file");
    let mut child = Running(
        agent(&s, &[])
            .env("JOURNAL_STREAM", "1:1")
            .stderr(file)
            .spawn()
            .expect("spawn"),
    );
    wait_first_write(&s.log);
    signal(&child, libc::SIGTERM);
    assert!(wait_exit(&mut child, T).is_some_and(|s| s.success()));
    let out = lines(&path);
    assert!(
        !out.is_empty() && out.iter().all(|l| starts_with_timestamp(l)),
        "{out:#?}"
    );
}

#[test]
fn log_format_json_gives_json_lines() {
    let s = setup(TOGGLE);
    let path = s.dir.path().join("stderr.log");
    let file = std::fs::File::create(&path).expect("stderr file");
    let mut child = Running(
        agent(&s, &["--log-format", "json"])
            .stderr(file)
            .spawn()
            .expect("spawn"),
    );
    wait_first_write(&s.log);
    signal(&child, libc::SIGTERM);
    assert!(wait_exit(&mut child, T).is_some_and(|s| s.success()));
    let out = lines(&path);
    assert!(!out.is_empty(), "no log lines");
    let v: Vec<serde_json::Value> = out
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(
        v.iter()
            .any(|j| j["level"] == "INFO" && j["fields"]["message"] == "journal opened"),
        "{out:#?}"
    );
    assert!(v.iter().all(|j| j["timestamp"].is_string()), "{out:#?}");
}

#[test]
fn an_unknown_log_format_is_refused() {
    let s = setup(TOGGLE);
    let out = baton_e2e::run(
        agent(&s, &["--log-format", "syslog"]).stderr(Stdio::piped()),
        T,
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("syslog"), "{err}");
}

#[test]
fn controller_notifies_ready_once_listening_and_logs_for_journald() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut m = Manager::bind(dir.path());
    let data = dir.path().join("data");
    let err = dir.path().join("stderr.log");
    let file = std::fs::File::create(&err).expect("stderr file");
    let meta = file.metadata().expect("stat");
    let mut child = Running(
        Command::new(bin("baton-controller"))
            .args(["serve", "--insecure", "--listen", "127.0.0.1:0", "--data"])
            .arg(&data)
            .env("NOTIFY_SOCKET", &m.path)
            .env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()))
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("spawn"),
    );
    let ready = m
        .until("READY=1", T)
        .unwrap_or_else(|| panic!("no READY=1; got:\n{}", m.history()));
    // Bound before READY: the address it names is the one it listens on.
    let addr = std::fs::read_to_string(data.join("listen.addr")).expect("listen.addr");
    assert!(
        ready.contains(&format!("STATUS=listening on {}", addr.trim())),
        "{ready}"
    );
    std::net::TcpStream::connect(addr.trim()).expect("listening when READY");
    signal(&child, libc::SIGTERM);
    m.until("STOPPING=1", T)
        .unwrap_or_else(|| panic!("no STOPPING=1; got:\n{}", m.history()));
    assert!(wait_exit(&mut child, T).is_some_and(|s| s.success()));
    let out = lines(&err);
    assert!(
        !out.is_empty() && out.iter().all(|l| l.starts_with('<')),
        "{out:#?}"
    );
    assert!(
        out.iter()
            .any(|l| l.starts_with("<6>") && l.contains("controller listening")),
        "{out:#?}"
    );
}
