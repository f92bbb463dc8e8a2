//! Prometheus metrics end to end: a real controller (`serve --metrics`)
//! and a real agent (`run --metrics`) on loopback. Both expositions pass
//! `promtool check metrics` (Debian's `prometheus` package; that check is
//! skipped, and says so, when promtool is missing), and the values move:
//! executions as a pushed pack fires, feedback ingested on the controller,
//! the link and clock gauges.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use baton_e2e::fleet::{Controller, start_agent_clock, start_controller_args};
use baton_e2e::{bin, signal, wait_until};

const WAIT: Duration = Duration::from_secs(30);

/// `GET path` on `addr`: (status line, body).
fn get(addr: &str, path: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes())
        .expect("write request");
    let mut r = String::new();
    s.read_to_string(&mut r).expect("read response");
    let (head, body) = r.split_once("\r\n\r\n").expect("a response head");
    (
        head.lines().next().unwrap_or_default().to_string(),
        body.to_string(),
    )
}

fn scrape(addr: &str) -> String {
    let (status, body) = get(addr, "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK", "{body}");
    body
}

/// The value of one series (`name{labels}` exactly as exposed).
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// `promtool check metrics` on `text`: a format error or a naming lint
/// fails the test. `false` if promtool is not installed.
fn promtool(text: &str, what: &str) -> bool {
    let child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            baton_testenv::missing(
                &format!("promtool check of the {what} exposition"),
                None,
                "promtool is not installed (Debian package `prometheus`; scripts/test.sh installs it)",
            );
            return false;
        }
        Err(e) => panic!("promtool: {e}"),
    };
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("feed promtool");
    let o = child.wait_with_output().expect("promtool output");
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        o.status.success() && out.trim().is_empty(),
        "promtool check metrics on the {what} exposition: {}\n{out}\n--- exposition ---\n{text}",
        o.status
    );
    true
}

/// A controller serving metrics on any free port (`DATA/metrics.addr`).
fn controller_with_metrics(data: &Path) -> (Controller, String) {
    let c = start_controller_args(data, "127.0.0.1:0", &["--metrics", "127.0.0.1:0"]);
    let read = || {
        std::fs::read_to_string(data.join("metrics.addr"))
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    let up = wait_until(WAIT, || !read().is_empty());
    let metrics = read();
    assert!(
        up && !metrics.is_empty(),
        "the controller wrote no metrics.addr; log:\n{}",
        std::fs::read_to_string(data.join("controller.log")).unwrap_or_default()
    );
    (c, metrics)
}

#[test]
fn both_expositions_pass_promtool_and_move() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (c, cm) = controller_with_metrics(&dir.path().join("ctl"));
    let a = start_agent_clock(
        &dir.path().join("a1"),
        "a1",
        &c.url,
        &["--system-clock", "reference", "--metrics", "127.0.0.1:0"],
    );
    // The agent logs where it serves (port 0: any free port).
    let mut am = String::new();
    assert!(
        wait_until(WAIT, || {
            am = a
                .log()
                .lines()
                .find_map(|l| {
                    let rest = l.split("metrics on http://").nth(1)?;
                    Some(rest.split('/').next()?.to_string())
                })
                .unwrap_or_default();
            !am.is_empty()
        }),
        "the agent never said where it serves metrics; log:\n{}",
        a.log()
    );
    assert!(
        wait_until(WAIT, || c.connected("a1")),
        "agent never connected; log:\n{}",
        a.log()
    );

    // Before any pack: the families are there, nothing has run.
    let t = scrape(&am);
    assert_eq!(
        value(&t, "baton_execution_start_lateness_seconds_count"),
        Some(0.0),
        "{t}"
    );
    assert!(t.contains("# TYPE baton_executions_total counter"), "{t}");
    let checked = promtool(&t, "agent");
    promtool(&scrape(&cm), "controller");

    // A pack that fires every 100 ms.
    let pack = dir.path().join("p.yaml");
    std::fs::write(
        &pack,
        "pack: p\nversion: 1\ntargets: {agents: [a1]}\n\
         safe_state:\n  - {action: gpio.write, params: {line: 5, value: 0}}\n\
         instructions:\n  - id: tick\n    action: gpio.toggle\n    params: {line: 5}\n    every: 100ms\n",
    )
    .expect("write pack");
    let o = c.ctl(&["push", pack.to_str().expect("utf-8")]);
    assert!(
        o.status.success(),
        "push: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );

    let ok = "baton_executions_total{tenant=\"default\",pack=\"p\",result=\"ok\"}";
    let mut t = String::new();
    assert!(
        wait_until(WAIT, || {
            t = scrape(&am);
            value(&t, ok).is_some_and(|v| v >= 5.0)
        }),
        "executions did not grow:\n{t}\nagent log:\n{}",
        a.log()
    );
    let first = value(&t, ok).unwrap_or_default();
    assert!(
        wait_until(WAIT, || value(&scrape(&am), ok).is_some_and(|v| v > first)),
        "executions stopped growing"
    );
    let t = scrape(&am);
    assert!(
        value(&t, "baton_execution_start_lateness_seconds_count").is_some_and(|v| v >= 5.0),
        "{t}"
    );
    assert_eq!(value(&t, "baton_agent_link_connected"), Some(1.0), "{t}");
    assert_eq!(value(&t, "baton_agent_packs"), Some(1.0), "{t}");
    assert_eq!(
        value(&t, "baton_agent_clock_state{state=\"locked\"}"),
        Some(1.0),
        "--system-clock reference is locked:\n{t}"
    );
    assert!(
        value(&t, "baton_agent_clock_offset_seconds").is_some()
            && value(&t, "baton_agent_clock_uncertainty_seconds").is_some(),
        "{t}"
    );
    assert!(
        value(&t, "baton_dispatcher_jobs_total").is_some_and(|v| v >= 5.0),
        "{t}"
    );
    promtool(&t, "agent");

    // The controller: the agent, the push and its ack, feedback stored.
    let mut ct = String::new();
    assert!(
        wait_until(WAIT, || {
            ct = scrape(&cm);
            value(&ct, "baton_controller_feedback_ingested_total").is_some_and(|v| v >= 5.0)
        }),
        "no feedback ingested:\n{ct}"
    );
    let ingested = value(&ct, "baton_controller_feedback_ingested_total").unwrap_or_default();
    assert_eq!(
        value(&ct, "baton_controller_agents_connected"),
        Some(1.0),
        "{ct}"
    );
    assert!(
        value(&ct, "baton_controller_pushes_total").is_some_and(|v| v >= 1.0),
        "{ct}"
    );
    assert_eq!(
        value(&ct, "baton_controller_push_results_total{result=\"acked\"}"),
        Some(1.0),
        "{ct}"
    );
    assert!(
        value(
            &ct,
            "baton_controller_delivery_updates_total{state=\"acked\"}"
        )
        .is_some_and(|v| v >= 1.0),
        "{ct}"
    );
    assert_eq!(
        value(&ct, "baton_controller_deliveries{state=\"acked\"}"),
        Some(1.0),
        "{ct}"
    );
    assert!(
        wait_until(WAIT, || value(
            &scrape(&cm),
            "baton_controller_feedback_ingested_total"
        )
        .is_some_and(|v| v > ingested)),
        "feedback ingested stopped growing"
    );
    // Per-agent clock series come with the agent's clock reports.
    assert!(
        wait_until(WAIT, || {
            ct = scrape(&cm);
            value(
                &ct,
                "baton_controller_agent_clock_uncertainty_seconds{agent=\"a1\"}",
            )
            .is_some()
        }),
        "no clock report in the metrics:\n{ct}"
    );
    promtool(&ct, "controller");

    // A cancel: the agent counts a safe-state entry, the controller's
    // deliveries move to cancelled.
    let o = c.ctl(&["cancel", "p"]);
    assert!(
        o.status.success(),
        "cancel: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let mut t = String::new();
    assert!(
        wait_until(WAIT, || {
            t = scrape(&am);
            value(&t, "baton_safe_state_entries_total{reason=\"cancel\"}") == Some(1.0)
        }),
        "no safe-state entry counted:\n{t}"
    );
    assert!(
        wait_until(WAIT, || {
            ct = scrape(&cm);
            value(&ct, "baton_controller_deliveries{state=\"cancelled\"}") == Some(1.0)
        }),
        "delivery not cancelled:\n{ct}"
    );
    promtool(&t, "agent");

    // Only /metrics is served.
    let (status, _) = get(&am, "/");
    assert!(status.starts_with("HTTP/1.1 404"), "{status}");
    let (status, _) = get(&cm, "/other");
    assert!(status.starts_with("HTTP/1.1 404"), "{status}");
    if !checked {
        eprintln!("promtool missing: values checked, format not checked");
    }
}

#[test]
fn a_busy_metrics_address_is_refused_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    let o = baton_e2e::run(
        Command::new(bin("baton-agent"))
            .args(["run", "--no-rt", "--system-clock", "reference", "--id", "m"])
            .arg("--data")
            .arg(dir.path().join("data"))
            .arg("--gpio")
            .arg(format!("sim:{}", dir.path().join("gpio.jsonl").display()))
            .args(["--metrics", &addr, "--exit-when-idle"]),
        WAIT,
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("metrics") && err.contains(&addr), "{err}");
}

/// Group commit, seen from outside: under a dense load (1 000 firings/s, ten
/// every 10 ms) one journal fdatasync covers a whole `arm-horizon` (150 ms
/// by default, less its 20 ms lead) of firings, not one firing instant nor
/// one pass of the loop. With `arm-horizon: 5ms` a sync covers one instant
/// (ten firings), and when every pass armed (and synced), ~45: this fails.
#[test]
fn one_journal_sync_covers_a_horizon_of_firings_under_a_dense_load() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pack = dir.path().join("dense.yaml");
    let mut y = String::from("pack: dense\nversion: 1\ninstructions:\n");
    for i in 0..10 {
        y.push_str(&format!(
            "  - {{id: t{i}, action: gpio.toggle, params: {{line: {i}}}, every: 10ms}}\n"
        ));
    }
    std::fs::write(&pack, y).expect("write pack");
    let err_path = dir.path().join("agent.err");
    let mut child = Command::new(bin("baton-agent"))
        .args(["run", "--quiet", "--no-rt", "--system-clock", "reference"])
        .args(["--id", "dense", "--metrics", "127.0.0.1:0"])
        .arg("--data")
        .arg(dir.path().join("data"))
        .arg("--gpio")
        .arg("sim:/dev/null")
        .arg("--pack")
        .arg(&pack)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err_path).expect("stderr file"))
        .spawn()
        .expect("spawn agent");
    let log = || std::fs::read_to_string(&err_path).unwrap_or_default();
    let mut addr = String::new();
    let found = wait_until(WAIT, || {
        addr = log()
            .lines()
            .find_map(|l| {
                Some(
                    l.split("metrics on http://")
                        .nth(1)?
                        .split('/')
                        .next()?
                        .to_string(),
                )
            })
            .unwrap_or_default();
        !addr.is_empty()
    });
    assert!(
        found,
        "the agent never said where it serves metrics:\n{}",
        log()
    );
    let ok = "baton_executions_total{tenant=\"default\",pack=\"dense\",result=\"ok\"}";
    let syncs = "baton_agent_journal_syncs_total";
    let read = || {
        let t = scrape(&addr);
        (value(&t, ok).unwrap_or(0.0), value(&t, syncs))
    };
    // After the start-up's records: a steady stretch of 2 000 firings.
    let mut first = (0.0, None);
    assert!(
        wait_until(WAIT, || {
            first = read();
            first.0 >= 500.0
        }),
        "the pack never got going:\n{}",
        log()
    );
    let mut last = first;
    assert!(
        wait_until(WAIT, || {
            last = read();
            last.0 >= first.0 + 2_000.0
        }),
        "the pack stopped firing:\n{}",
        log()
    );
    signal(&child, libc::SIGTERM);
    let status = baton_e2e::wait_exit(&mut child, WAIT).expect("agent exits on SIGTERM");
    assert!(status.success(), "{status:?}\n{}", log());
    let (Some(s0), Some(s1)) = (first.1, last.1) else {
        panic!("no {syncs} in the exposition");
    };
    let (firings, synced) = (last.0 - first.0, s1 - s0);
    assert!(synced > 0.0, "no journal sync in {firings} firings");
    eprintln!(
        "{synced} journal syncs for {firings} firings: {:.1} firings per sync",
        firings / synced
    );
    // ~8 arming passes a second at 1 000 firings/s: about 130 firings per
    // sync. One sync per pass of the loop (results every 50 ms, heartbeats)
    // was ~45; one per instant would be 10.
    assert!(
        firings / synced >= 80.0,
        "{synced} journal syncs for {firings} firings: {:.1} firings per sync",
        firings / synced
    );
}
