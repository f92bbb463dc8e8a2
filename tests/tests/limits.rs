//! The controller under hostile peers and exhausted resources, end to end
//! (real binaries, loopback; issue 26, items 3 and 6):
//!
//! - 300 slow TLS handshakes from five addresses take 80 of the 256
//!   handshake slots (16 each); the rest are told "busy" (a TLS alert) or
//!   closed; an operator still gets in at once and a connected agent keeps
//!   streaming; once its own address holds its share, the CLI says the
//!   controller is at its limit;
//! - a crowded budget (three quarters in use) shortens every handshake's
//!   timeout, and a busy source is refused while a new one gets in;
//! - over `--max-connections`, calls are answered RESOURCE_EXHAUSTED with
//!   the limit, and the CLI prints it, while the agent's stream goes on;
//! - out of file descriptors, the accept loop backs off: the controller's
//!   CPU stays under 5 %, the agent's feedback is still stored, the
//!   failures are counted, and accepts resume once descriptors are free.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use baton_e2e::fleet::{Controller, json_lines, start_agent, start_certified_agent, start_mtls};
use baton_e2e::{Running, bin, wait_until};

const WAIT: Duration = Duration::from_secs(30);

/// The controller's "busy" alert (fatal `user_canceled`).
const BUSY_ALERT: [u8; 7] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 90];
/// The start of a TLS record, and nothing more: a handshake that stalls.
const SLOW_HELLO: [u8; 5] = [0x16, 0x03, 0x01, 0x02, 0x00];

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn blink(name: &str, agent: &str, every: &str) -> String {
    format!(
        "pack: {name}\nversion: 1\ntargets: {{agents: [{agent}]}}\n\
         safe_state:\n  - {{action: gpio.write, params: {{line: 5, value: 0}}}}\n\
         instructions:\n  - id: tick\n    action: gpio.toggle\n    params: {{line: 5}}\n    every: {every}\n"
    )
}

fn push(c: &Controller, dir: &Path, agent: &str, every: &str) {
    let pack = dir.join("p.yaml");
    std::fs::write(&pack, blink("p", agent, every)).expect("write pack");
    let o = c.ctl(&["push", pack.to_str().expect("utf-8")]);
    assert!(o.status.success(), "push: {}", stderr(&o));
}

/// Connections from chosen loopback addresses (the kernel routes all of
/// 127.0.0.0/8 to lo), bound before connecting.
struct Dialer(tokio::runtime::Runtime);

impl Dialer {
    fn new() -> Dialer {
        Dialer(
            tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .build()
                .expect("runtime"),
        )
    }

    fn from(&self, src: &str, to: SocketAddr) -> TcpStream {
        let s = self.0.block_on(async {
            let s = tokio::net::TcpSocket::new_v4()?;
            s.bind(format!("{src}:0").parse().expect("address"))?;
            s.connect(to).await?.into_std()
        });
        let s = s.unwrap_or_else(|e| panic!("connect from {src}: {e}"));
        s.set_nonblocking(false).expect("blocking");
        s
    }

    /// A handshake that says five bytes and stalls.
    fn slow(&self, src: &str, to: SocketAddr) -> TcpStream {
        let mut s = self.from(src, to);
        // A refused connection may already be closed: that is its answer.
        let _ = s.write_all(&SLOW_HELLO);
        s
    }
}

/// What a slow handshake got so far.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum Fate {
    /// Nothing yet: its handshake is in progress.
    Held,
    /// The busy alert.
    Busy,
    /// Closed without it.
    Closed,
}

fn fate(s: &mut TcpStream) -> Fate {
    s.set_nonblocking(true).expect("nonblocking");
    let mut buf = [0u8; 16];
    let f = match s.read(&mut buf) {
        Ok(n) if n >= BUSY_ALERT.len() && buf[..BUSY_ALERT.len()] == BUSY_ALERT => Fate::Busy,
        Ok(_) => Fate::Closed,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Fate::Held,
        Err(_) => Fate::Closed,
    };
    s.set_nonblocking(false).expect("blocking");
    f
}

fn count(fates: &[Fate], f: Fate) -> usize {
    fates.iter().filter(|x| **x == f).count()
}

fn ok_feedback(c: &Controller) -> usize {
    c.feedback("p")
        .iter()
        .filter(|f| f["outcome"] == "ok")
        .count()
}

#[test]
fn slow_handshakes_from_five_hosts_leave_room_for_an_operator() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca, c) = start_mtls(dir.path(), "ann", &[]);
    let a = start_certified_agent(dir.path(), &ca, &c.url, "a1");
    assert!(wait_until(WAIT, || c.connected("a1")), "{}", a.log());
    push(&c, dir.path(), "a1", "100ms");
    assert!(wait_until(WAIT, || ok_feedback(&c) >= 3), "{}", a.log());
    let addr: SocketAddr = c.addr.parse().expect("addr");

    // 300 slow handshakes, round robin from 127.0.0.2 .. 127.0.0.6.
    let d = Dialer::new();
    let t0 = Instant::now();
    let mut slow: Vec<TcpStream> = (0..300)
        .map(|i| d.slow(&format!("127.0.0.{}", 2 + i % 5), addr))
        .collect();
    let opened = t0.elapsed();
    assert!(
        wait_until(WAIT, || c
            .log()
            .contains("16 TLS handshakes in progress from 127.0.0.")),
        "{}",
        c.log()
    );

    // The operator, from 127.0.0.1, gets in at once.
    let before = ok_feedback(&c);
    let t1 = Instant::now();
    let o = c.ctl(&["packs"]);
    let took = t1.elapsed();
    assert!(o.status.success(), "packs refused: {}", stderr(&o));
    assert!(took < Duration::from_secs(5), "packs took {took:?}");

    // Each of the five holds its share, 16; the rest were told the
    // controller is busy, or (past the refusals served at once) closed.
    let mut fates = Vec::new();
    assert!(
        wait_until(Duration::from_secs(5), || {
            fates = slow.iter_mut().map(fate).collect();
            count(&fates, Fate::Held) == 80
        }),
        "held {} (want 80), busy {}, closed {}",
        count(&fates, Fate::Held),
        count(&fates, Fate::Busy),
        count(&fates, Fate::Closed)
    );
    let busy = count(&fates, Fate::Busy);
    assert!(busy >= 1, "no busy alert");
    assert_eq!(busy + count(&fates, Fate::Closed), 220);
    eprintln!(
        "300 slow handshakes opened in {opened:?}: 80 held, {busy} told busy, {} closed; `packs` took {took:?}",
        220 - busy
    );

    // The agent's stream never noticed.
    assert!(
        wait_until(WAIT, || ok_feedback(&c) > before + 5),
        "feedback stopped; agent log:\n{}",
        a.log()
    );
    assert!(!a.log().contains("session=2"), "{}", a.log());

    // The operator's own address at its share: the CLI says why it is
    // refused.
    let mine: Vec<TcpStream> = (0..16).map(|_| d.slow("127.0.0.1", addr)).collect();
    let o = c.ctl(&["packs"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("is at its limit of TLS handshakes in progress"),
        "{}\ncontroller log:\n{}",
        stderr(&o),
        c.log()
    );
    drop(mine);
    assert!(
        wait_until(WAIT, || c.ctl(&["packs"]).status.success()),
        "packs still refused"
    );
    drop(slow);
}

#[test]
fn a_crowded_budget_shortens_every_handshake_and_keeps_room_for_newcomers() {
    let dir = tempfile::tempdir().expect("tempdir");
    // 8 slots (crowded from 6), 4 per source; 30 s normally, 1 s crowded.
    let (_ca, c) = start_mtls(
        dir.path(),
        "ann",
        &[
            "--max-handshakes",
            "8",
            "--max-handshakes-per-source",
            "4",
            "--tls-handshake-timeout",
            "30s",
            "--tls-handshake-timeout-crowded",
            "1s",
        ],
    );
    let addr: SocketAddr = c.addr.parse().expect("addr");
    let d = Dialer::new();
    let mut held: Vec<TcpStream> = (0..4).map(|_| d.slow("127.0.0.2", addr)).collect();
    held.push(d.slow("127.0.0.3", addr));
    held.push(d.slow("127.0.0.3", addr));
    let crowded_at = Instant::now();
    assert!(
        wait_until(WAIT, || c.log().contains(
            "TLS handshakes crowded: 6 of 8 in progress from 2 sources"
        )),
        "{}",
        c.log()
    );
    // Crowded: a source with two in progress is refused, a new one is not.
    let mut third = d.slow("127.0.0.3", addr);
    assert!(
        wait_until(Duration::from_secs(5), || fate(&mut third) != Fate::Held),
        "not refused"
    );
    let mut newcomer = d.slow("127.0.0.4", addr);
    assert_eq!(fate(&mut newcomer), Fate::Held);
    held.push(newcomer);
    // Every handshake in progress now has 1 s from its start, not 30.
    assert!(
        wait_until(Duration::from_secs(10), || held
            .iter_mut()
            .all(|s| fate(s) == Fate::Closed)),
        "still held: {:?}",
        held.iter_mut().map(fate).collect::<Vec<_>>()
    );
    let closed_after = crowded_at.elapsed();
    assert!(
        closed_after < Duration::from_secs(5),
        "closed after {closed_after:?}"
    );
    eprintln!(
        "crowded: 7 slow handshakes closed {closed_after:?} after crowding (timeout 30 s, crowded 1 s)"
    );
    assert!(
        c.log().contains("TLS handshake not done within 1s"),
        "{}",
        c.log()
    );
}

#[test]
fn over_the_connection_limit_calls_are_refused_and_the_agent_is_served() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca, c) = start_mtls(dir.path(), "ann", &["--max-connections", "3"]);
    let a = start_certified_agent(dir.path(), &ca, &c.url, "a1");
    assert!(wait_until(WAIT, || c.connected("a1")), "{}", a.log());
    push(&c, dir.path(), "a1", "100ms");
    // Two `watch` commands hold the other two connections.
    let tls = c.tls.clone().expect("tls");
    let watch = |name: &str| {
        let path = dir.path().join(name);
        let start = || {
            let out = std::fs::File::create(&path).expect("out");
            Running(
                Command::new(bin("baton-controller"))
                    .args(["watch", "--json", "--controller", &c.url, "--cert"])
                    .arg(&tls.operator.0)
                    .arg("--key")
                    .arg(&tls.operator.1)
                    .arg("--ca")
                    .arg(ca.ca_pem())
                    .stdout(out)
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("watch"),
            )
        };
        // A call that has just returned may hold its slot a moment longer
        // (the server sees the close after the client), so a watch can be
        // refused then: it is live once it streams a line, else start it
        // again.
        let mut w = start();
        let live = wait_until(WAIT, || {
            if std::fs::metadata(&path).is_ok_and(|m| m.len() > 0) {
                return true;
            }
            if matches!(w.try_wait(), Ok(Some(_))) {
                w = start();
            }
            false
        });
        assert!(live, "{name} never streamed");
        w
    };
    let w1 = watch("w1.out");
    let mut w2 = watch("w2.out");
    let refused = |o: &std::process::Output| {
        stderr(o).contains(
            "refused: controller at its connection limit (3 connections, serve --max-connections)",
        )
    };
    let mut last = None;
    assert!(
        wait_until(WAIT, || {
            let o = c.ctl(&["packs"]);
            let r = refused(&o);
            last = Some(o);
            r
        }),
        "{:?}",
        last.as_ref().map(stderr)
    );
    let o = last.expect("output");
    assert_eq!(o.status.code(), Some(1));
    assert!(
        c.log().contains("at the connection limit (3 live"),
        "{}",
        c.log()
    );
    // The agent keeps streaming meanwhile (its feedback reaches the
    // watches, which see only what the limit lets through: read the GPIO).
    let writes = a.writes().len();
    assert!(
        wait_until(WAIT, || a.writes().len() > writes + 5),
        "{}",
        a.log()
    );
    assert!(!a.log().contains("session=2"), "{}", a.log());
    // A connection freed: calls go through again.
    let _ = w2.kill();
    let _ = w2.wait();
    assert!(
        wait_until(WAIT, || c.ctl(&["packs"]).status.success()),
        "still refused"
    );
    drop(w1);
    assert!(
        !c.feedback("p").is_empty(),
        "no feedback stored; agent log:\n{}",
        a.log()
    );
}

/// utime + stime of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    // After the command name (in parentheses, which may hold spaces).
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 of stat(5), counted from the state (field 3).
    f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime")
}

fn metric(addr: &str, name: &str) -> Option<f64> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    body.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

fn parse_instant(s: &serde_json::Value) -> Option<jiff::Timestamp> {
    s.as_str()?.parse().ok()
}

#[test]
fn out_of_file_descriptors_the_accept_loop_backs_off_and_agents_are_served() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("ctl");
    std::fs::create_dir_all(&data).expect("data");
    let log = std::fs::File::create(data.join("controller.log")).expect("log");
    // 128 descriptors, and a connection cap far above: accepts fail with
    // EMFILE long before the cap refuses anything.
    let mut cmd = Command::new(bin("baton-controller"));
    cmd.args([
        "serve",
        "--insecure",
        "--listen",
        "127.0.0.1:0",
        "--ping-interval",
        "1s",
        "--metrics",
        "127.0.0.1:0",
        "--max-connections",
        "100000",
        "--data",
    ])
    .arg(&data)
    .env("RUST_LOG", "info")
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(log);
    // SAFETY: between fork and exec only setrlimit(2) runs, which is
    // async-signal-safe and touches nothing of the parent's.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: 128,
                rlim_max: 128,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut proc = Running(cmd.spawn().expect("spawn controller"));
    let addr_file = data.join("listen.addr");
    let metrics_file = data.join("metrics.addr");
    assert!(
        wait_until(WAIT, || (addr_file.exists() && metrics_file.exists())
            || matches!(proc.try_wait(), Ok(Some(_)))),
        "controller did not start"
    );
    let read = |p: &Path| std::fs::read_to_string(p).expect("addr").trim().to_string();
    let addr = read(&addr_file);
    let metrics_addr = read(&metrics_file);
    let pid = proc.id();
    let c = Controller {
        proc,
        data: data.clone(),
        url: format!("http://{addr}"),
        addr: addr.clone(),
        tls: None,
        serve_args: Vec::new(),
    };
    assert!(
        c.log()
            .contains("RLIMIT_NOFILE is 128 but --max-connections 100000"),
        "{}",
        c.log()
    );
    let a = start_agent(&dir.path().join("a1"), "a1", &c.url, &[]);
    assert!(wait_until(WAIT, || c.connected("a1")), "{}", a.log());
    push(&c, dir.path(), "a1", "200ms");
    assert!(wait_until(WAIT, || ok_feedback(&c) >= 3), "{}", a.log());

    // Idle connections until accepts fail.
    let mut held = Vec::new();
    let mut exhausted = false;
    for i in 0..600 {
        held.push(TcpStream::connect(&addr).expect("connect (the backlog takes it)"));
        if i % 10 == 9
            && wait_until(Duration::from_millis(200), || {
                c.log().contains("accept failed")
            })
        {
            exhausted = true;
            break;
        }
    }
    assert!(exhausted, "accepts never failed:\n{}", c.log());
    // An accept fails as soon as the descriptors are gone, queue or not:
    // twenty more clients wait in the backlog.
    for _ in 0..20 {
        held.push(TcpStream::connect(&addr).expect("connect (the backlog takes it)"));
    }
    assert!(c.log().contains("Too many open files"), "{}", c.log());

    // Hold ~10 s: the controller's CPU meanwhile, and the agent's feedback
    // stored meanwhile (each stored entry is acknowledged to the agent).
    let start = jiff::Timestamp::now();
    let ticks0 = cpu_ticks(pid);
    let t0 = Instant::now();
    // The measurement is the interval itself: nothing to wait for.
    std::thread::sleep(Duration::from_secs(10));
    let ticks = cpu_ticks(pid) - ticks0;
    let secs = t0.elapsed().as_secs_f64();
    let end = jiff::Timestamp::now();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let cpu = ticks as f64 / hz / secs * 100.0;
    eprintln!(
        "out of descriptors for {secs:.1} s with {} connections opened: controller CPU {cpu:.2} % of one core ({ticks} ticks at {hz} Hz)",
        held.len()
    );
    assert!(
        cpu < 5.0,
        "controller CPU {cpu:.2} % while out of descriptors"
    );
    // One warning for the whole episode, not one per failure.
    assert_eq!(c.log().matches("accept failed").count(), 1, "{}", c.log());

    // Release: accepts resume, and the operator gets in.
    drop(held);
    assert!(
        wait_until(WAIT, || c
            .log()
            .contains("accepting connections again after")),
        "{}",
        c.log()
    );
    let o = c.ctl(&["packs"]);
    assert!(o.status.success(), "packs: {}", stderr(&o));
    let stored_meanwhile = c
        .feedback("p")
        .iter()
        .filter_map(|f| parse_instant(&f["received"]))
        .filter(|t| *t > start && *t < end)
        .count();
    eprintln!("feedback entries stored while out of descriptors: {stored_meanwhile}");
    assert!(
        stored_meanwhile >= 20,
        "only {stored_meanwhile} feedback entries stored while out of descriptors"
    );
    assert!(!a.log().contains("session=2"), "{}", a.log());
    let errors = metric(&metrics_addr, "baton_controller_accept_errors_total").unwrap_or(0.0);
    eprintln!("baton_controller_accept_errors_total {errors}");
    assert!(errors >= 5.0, "accept errors counted: {errors}");
    let lines = json_lines(&c.ctl(&["packs", "--json"]).stdout);
    assert_eq!(lines.len(), 1, "{lines:?}");
}
