//! The agent under faults and load, as a hostile tester runs it: every way
//! out drives the safe state, nothing hangs, and nothing of a pack touches
//! a line after its safe state. Each test reads the sim GPIO log (one JSON
//! line per change, written before the change is reported) for the final
//! levels.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use baton_e2e::local::{TOGGLE, agent, base, setup, sim_lines, stderr_of};
use baton_e2e::{Running, bin, lines, signal, wait_exit, wait_until};

const T: Duration = Duration::from_secs(30);

/// Index of the first safe-state write in the log.
fn first_safe(log: &[serde_json::Value]) -> Option<usize> {
    log.iter().position(|l| {
        l["execution_id"]
            .as_str()
            .is_some_and(|s| s.contains("safe_state") || s.contains("-safe-state"))
    })
}

/// The final level of every line in the log.
fn final_levels(log: &[serde_json::Value]) -> std::collections::BTreeMap<i64, i64> {
    let mut m = std::collections::BTreeMap::new();
    for l in log {
        if let (Some(line), Some(v)) = (l["line"].as_i64(), l["value"].as_i64()) {
            m.insert(line, v);
        }
    }
    m
}

/// After the first safe-state write, only safe-state writes.
fn nothing_after_safe_state(log: &[serde_json::Value]) {
    let i = first_safe(log).expect("a safe-state write in the log");
    for l in &log[i..] {
        let id = l["execution_id"].as_str().unwrap_or("");
        assert!(
            id.contains("safe_state") || id.contains("-safe-state"),
            "a write after the safe state: {l}"
        );
    }
}

fn wait_first_write(log: &Path) {
    assert!(
        wait_until(T, || sim_lines(log).iter().any(|l| l["value"] == 1)),
        "the pack never fired"
    );
}

#[test]
fn every_stop_signal_enters_the_safe_state_and_exits_0() {
    for sig in [
        libc::SIGHUP,
        libc::SIGQUIT,
        libc::SIGUSR1,
        libc::SIGUSR2,
        libc::SIGINT,
    ] {
        let s = setup(TOGGLE);
        let mut child = Running(agent(&s, &[]).spawn().expect("spawn"));
        wait_first_write(&s.log);
        signal(&child, sig);
        let status = wait_exit(&mut child, T).expect("exits after the signal");
        assert!(status.success(), "signal {sig}: {status:?}");
        let log = sim_lines(&s.log);
        nothing_after_safe_state(&log);
        assert_eq!(final_levels(&log)[&5], 0, "signal {sig}");
    }
}

#[test]
fn thousands_of_firings_due_at_one_instant_all_fire_then_exit() {
    // 3 000 one-shots at the same instant: more than the dispatcher's
    // queues hold. They wait for credit on the control side, fire (late if
    // they must), each reported, and the agent exits when idle.
    let at = jiff::Timestamp::now() + jiff::SignedDuration::from_millis(800);
    let mut y = String::from(
        "pack: burst\nversion: 1\ndefaults: {max_lateness: 30s}\nsafe_state:\n  - {action: gpio.write, params: {line: 0, value: 0}}\ninstructions:\n",
    );
    for i in 0..3000 {
        y.push_str(&format!(
            "  - {{id: b{i}, action: gpio.write, params: {{line: {}, value: 1}}, at: {at:.9}}}\n",
            i % 50
        ));
    }
    let s = setup(&y);
    let mut child = Running(agent(&s, &["--exit-when-idle"]).spawn().expect("spawn"));
    let status = wait_exit(&mut child, Duration::from_secs(60)).expect("exits when idle");
    let err = stderr_of(&mut child);
    assert!(status.success(), "{status:?}\n{err}");
    let log = sim_lines(&s.log);
    let fired: std::collections::HashSet<&str> = log
        .iter()
        .filter_map(|l| l["execution_id"].as_str())
        .filter(|id| id.contains("/burst/v1/b"))
        .collect();
    assert_eq!(fired.len(), 3000, "every firing ran once");
    let writes = log
        .iter()
        .filter(|l| {
            l["execution_id"]
                .as_str()
                .is_some_and(|id| id.contains("/burst/v1/b"))
        })
        .count();
    assert_eq!(writes, 3000, "no firing ran twice");
    // The way out (idle) drove the safe state last.
    assert_eq!(final_levels(&log)[&0], 0);
}

#[test]
fn steady_load_with_compactions_never_hangs_and_stops_on_sigterm() {
    // 20 instructions every 10 ms (2 000 firings/s, what a debug build
    // sustains on a shared 2-core machine; the release build's 10 000/s is
    // measured by scripts/load-figures.sh): the load that used to hang
    // after a journal compaction. The agent runs, and SIGTERM still ends it
    // through the safe state.
    let mut y = String::from(
        "pack: load\nversion: 1\nsafe_state:\n  - {action: gpio.write, params: {line: 0, value: 0}}\ninstructions:\n",
    );
    for i in 0..20 {
        y.push_str(&format!(
            "  - {{id: l{i}, action: gpio.toggle, params: {{line: {i}}}, every: 10ms}}\n"
        ));
    }
    let s = setup(&y);
    let mut child = Running(agent(&s, &[]).spawn().expect("spawn"));
    assert!(
        wait_until(T, || lines(&s.log).len() > 6_000),
        "the load did not run"
    );
    signal(&child, libc::SIGTERM);
    let status = wait_exit(&mut child, T).expect("exits after SIGTERM under load");
    let err = stderr_of(&mut child);
    assert!(status.success(), "{status:?}\n{err}");
    let log = sim_lines(&s.log);
    nothing_after_safe_state(&log);
    assert_eq!(final_levels(&log)[&0], 0);
}

#[test]
fn a_closed_stdout_neither_kills_the_agent_nor_skips_the_safe_state() {
    let s = setup(TOGGLE);
    let mut cmd = base(&s);
    // Not --quiet: a line per firing to a pipe nobody reads.
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = Running(cmd.spawn().expect("spawn"));
    drop(child.stdout.take());
    wait_first_write(&s.log);
    // Several more firings print to the closed pipe.
    let n = sim_lines(&s.log).len();
    assert!(wait_until(T, || sim_lines(&s.log).len() > n + 5));
    assert!(
        child.try_wait().expect("try_wait").is_none(),
        "the agent died"
    );
    signal(&child, libc::SIGTERM);
    let status = wait_exit(&mut child, T).expect("exits");
    assert!(status.success(), "{status:?}");
    let log = sim_lines(&s.log);
    nothing_after_safe_state(&log);
    assert_eq!(final_levels(&log)[&5], 0);
}

#[test]
fn a_panic_drives_the_safe_state_through_the_backend() {
    let s = setup(TOGGLE);
    let mut child = agent(&s, &["--inject-panic-after", "5"])
        .spawn()
        .expect("spawn");
    let status = wait_exit(&mut child, T).expect("the injected panic ends it");
    let err = stderr_of(&mut child);
    assert!(!status.success(), "a panic is a fault: {status:?}");
    assert!(err.contains("injected panic"), "{err}");
    let log = sim_lines(&s.log);
    let last = log.last().expect("writes");
    assert_eq!(last["execution_id"], "panic-safe-state", "{last}");
    assert_eq!(final_levels(&log)[&5], 0);
}

#[test]
fn a_stuck_dispatcher_still_gets_the_safe_state_written_and_exits_non_zero() {
    // After 3 toggles (line 5: 1, 0, 1) the dispatcher hangs for good, as
    // in a GPIO call that never returns: the safe state it is handed on
    // SIGTERM could never land through it.
    let s = setup(TOGGLE);
    let mut child = Running(
        agent(&s, &["--inject-dispatcher-stall-after", "3"])
            .spawn()
            .expect("spawn"),
    );
    assert!(
        wait_until(T, || sim_lines(&s.log).len() >= 3),
        "the pack never fired 3 times"
    );
    assert_eq!(
        final_levels(&sim_lines(&s.log))[&5],
        1,
        "stalled with the line high"
    );
    signal(&child, libc::SIGTERM);
    let status = wait_exit(&mut child, T).expect("exits despite the stuck dispatcher");
    let err = stderr_of(&mut child.0);
    assert!(
        !status.success(),
        "a stuck dispatcher is a fault: {status:?}\n{err}"
    );
    assert!(err.contains("did not land"), "{err}");
    let log = sim_lines(&s.log);
    nothing_after_safe_state(&log);
    let last = log.last().expect("writes");
    assert_eq!(
        last["execution_id"], "stuck-dispatcher-safe-state",
        "{last}"
    );
    assert_eq!(final_levels(&log)[&5], 0, "{err}");
}

#[test]
fn a_pulse_in_progress_at_sigterm_ends_before_the_safe_state() {
    let y = "pack: p\nversion: 1\nsafe_state:\n  - {action: gpio.write, params: {line: 9, value: 0}}\n\
             instructions:\n  - {id: hold, action: gpio.pulse, params: {line: 7, width: 10s}, every: 20s}\n";
    let s = setup(y);
    let mut child = Running(agent(&s, &[]).spawn().expect("spawn"));
    wait_first_write(&s.log);
    signal(&child, libc::SIGTERM);
    let status = wait_exit(&mut child, T).expect("exits");
    assert!(status.success(), "{status:?}");
    let log = sim_lines(&s.log);
    // The pulse's trailing edge ran at once, before the safe state; no
    // line was left mid-pulse.
    let end = log
        .iter()
        .position(|l| l["line"] == 7 && l["value"] == 0)
        .expect("the pulse ended");
    let safe = first_safe(&log).expect("safe state");
    assert!(end < safe, "pulse end after the safe state: {log:?}");
    assert_eq!(final_levels(&log)[&7], 0);
    assert_eq!(final_levels(&log)[&9], 0);
}

/// Runs `script` as root in a private mount namespace (`unshare -m`), or
/// returns false (and says so) where that is not possible.
fn have_mount_namespaces() -> bool {
    let ok = Command::new("unshare")
        .args(["-m", "true"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        baton_testenv::missing(
            "full-disk fault tests",
            None,
            "needs root and `unshare -m` (private mount namespace)",
        );
    }
    ok
}

#[test]
fn a_full_disk_enters_the_safe_state_and_exits_non_zero() {
    if !have_mount_namespaces() {
        return;
    }
    let s = setup(TOGGLE);
    let data = s.dir.path().join("small");
    std::fs::create_dir_all(&data).expect("mkdir");
    // The journal on a 64 KiB tmpfs that fills up; the sim log elsewhere.
    let script = format!(
        "mount -t tmpfs -o size=64k tmpfs {data} && exec {agent} run --quiet --no-rt --id t --data {data}/j --gpio sim:{log} --pack {pack}",
        data = data.display(),
        agent = bin("baton-agent").display(),
        log = s.log.display(),
        pack = s.pack.display(),
    );
    let mut child = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    wait_first_write(&s.log);
    let status =
        wait_exit(&mut child, Duration::from_secs(120)).expect("stops when the disk is full");
    let err = stderr_of(&mut child);
    assert!(
        !status.success(),
        "a full disk is a fault: {status:?}\n{err}"
    );
    assert!(err.contains("No space left on device"), "{err}");
    let log = sim_lines(&s.log);
    nothing_after_safe_state(&log);
    assert_eq!(final_levels(&log)[&5], 0, "{err}");
}

#[test]
fn a_program_queued_behind_a_busy_worker_never_starts_after_the_safe_state() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let marker = dir.join("ran");
    let at = jiff::Timestamp::now() + jiff::SignedDuration::from_millis(1500);
    let later = at + jiff::SignedDuration::from_millis(100);
    let pack = dir.join("p.yaml");
    std::fs::write(
        &pack,
        format!(
            "pack: ex\nversion: 1\ndefaults: {{max_lateness: 1h, timeout: 1h}}\nsafe_state:\n  - {{action: gpio.write, params: {{line: 2, value: 0}}}}\ninstructions:\n  - {{id: slow, action: exec, params: {{program: /bin/sleep, args: ['2']}}, at: {at:.9}}}\n  - {{id: touch, action: exec, params: {{program: /usr/bin/touch, args: [{}]}}, at: {later:.9}}}\n",
            marker.display()
        ),
    )
    .expect("pack");
    let cfg = dir.join("agent.yaml");
    std::fs::write(
        &cfg,
        "exec-allowlist: [/bin/sleep, /usr/bin/touch]\nexec-workers: 1\n",
    )
    .expect("config");
    let mut child = Running(
        Command::new(bin("baton-agent"))
            .args([
                "run",
                "--system-clock",
                "reference",
                "--quiet",
                "--no-rt",
                "--config",
            ])
            .arg(&cfg)
            .arg("--data")
            .arg(dir.join("data"))
            .arg("--gpio")
            .arg(format!("sim:{}", dir.join("g.jsonl").display()))
            .arg("--pack")
            .arg(&pack)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn"),
    );
    // `slow` holds the only worker; `touch` waits behind it in the pool.
    // A child of any of the agent's threads (the exec worker spawns it).
    let children = |pid: u32| {
        std::fs::read_dir(format!("/proc/{pid}/task")).is_ok_and(|tasks| {
            tasks.filter_map(|t| t.ok()).any(|t| {
                std::fs::read_to_string(t.path().join("children"))
                    .is_ok_and(|c| !c.trim().is_empty())
            })
        })
    };
    assert!(
        wait_until(T, || children(child.id())),
        "sleep never started"
    );
    assert!(wait_until(T, || jiff::Timestamp::now() > later));
    // Cancel the pack while `touch` waits: its safe state runs now; when
    // `sleep` ends, the worker must not start `touch`.
    let out = baton_e2e::run(
        Command::new(bin("baton-agent"))
            .args(["cancel", "ex", "--data"])
            .arg(dir.join("data")),
        T,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(wait_until(T, || !children(child.id())), "sleep never ended");
    // The worker is free: had `touch` been started, it would have run by
    // the time the agent has stopped.
    signal(&child, libc::SIGTERM);
    let status = wait_exit(&mut child, T).expect("exits");
    let err = stderr_of(&mut child);
    assert!(status.success(), "{status:?}\n{err}");
    assert!(
        !marker.exists(),
        "a queued program ran after the safe state\n{err}"
    );
}
