//! `baton-agent cancel PACK --data DIR`: the pack's safe state, then it is
//! gone from the journal — with the agent running or not.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use baton_e2e::{Running, bin, lines, run, signal, wait_exit, wait_until};

const T: Duration = Duration::from_secs(30);

fn writes(log: &Path) -> Vec<serde_json::Value> {
    lines(log)
        .iter()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

const PACK: &str = "pack: p\nversion: 1\nsafe_state:\n  - {action: gpio.write, params: {line: 4, value: 0}}\ninstructions:\n  - {id: t, action: gpio.toggle, params: {line: 4}, every: 20ms}\n";

fn cancel(dir: &Path) -> std::process::Output {
    run(
        Command::new(bin("baton-agent"))
            .args(["cancel", "p", "--data"])
            .arg(dir.join("data"))
            .arg("--gpio")
            .arg(format!("sim:{}", dir.join("gpio.jsonl").display())),
        T,
    )
}

/// An agent running the pack, past its first toggles.
fn started(dir: &Path) -> Running {
    std::fs::write(dir.join("p.yaml"), PACK).expect("pack");
    let child = Running(
        Command::new(bin("baton-agent"))
            .args(["run", "--system-clock", "reference", "--quiet", "--no-rt"])
            .arg("--data")
            .arg(dir.join("data"))
            .arg("--gpio")
            .arg(format!("sim:{}", dir.join("gpio.jsonl").display()))
            .arg("--pack")
            .arg(dir.join("p.yaml"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn"),
    );
    assert!(wait_until(T, || writes(&dir.join("gpio.jsonl")).len() > 3));
    child
}

#[test]
fn cancel_with_the_agent_running_drives_the_safe_state_and_removes_the_pack() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let log = dir.join("gpio.jsonl");
    let mut child = started(dir);
    let out = cancel(dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("cancelled"));
    // The safe state was the pack's last write, and the agent still runs.
    let n = writes(&log).len();
    let last = writes(&log).last().cloned().expect("writes");
    assert_eq!(last["value"], 0);
    assert!(
        last["execution_id"]
            .as_str()
            .is_some_and(|s| s.contains("safe_state (cancel)")),
        "{last}"
    );
    assert!(
        child.try_wait().expect("try_wait").is_none(),
        "the agent keeps running"
    );
    signal(&child, libc::SIGTERM);
    let status = wait_exit(&mut child, T).expect("exits");
    assert!(status.success());
    assert_eq!(
        writes(&log).len(),
        n,
        "nothing of the pack after its cancel"
    );
    // The journal no longer holds it.
    let again = cancel(dir);
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("not held"));
}

#[test]
fn cancel_without_a_running_agent_drives_the_safe_state_and_removes_the_pack() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let log = dir.join("gpio.jsonl");
    let mut child = started(dir);
    // kill -9: the line is left wherever it was.
    child.kill().expect("kill");
    let _ = child.wait();
    let out = cancel(dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("removed") && text.contains("1 safe-state write"),
        "{text}"
    );
    assert_eq!(writes(&log).last().expect("writes")["value"], 0);
    // Cancelling again: not held any more.
    let again = cancel(dir);
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("not held"));
}

#[test]
fn cancel_refuses_an_id_that_is_not_one() {
    let tmp = tempfile::tempdir().expect("tempdir");
    for bad in ["../../etc/x", "Upper", ""] {
        let out = run(
            Command::new(bin("baton-agent"))
                .args(["cancel", bad, "--data"])
                .arg(tmp.path().join("data")),
            T,
        );
        assert_eq!(out.status.code(), Some(1), "{bad:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("pack id") && err.contains("not valid"),
            "{bad:?}: {err}"
        );
    }
    assert!(
        !tmp.path().join("data").exists(),
        "nothing written for a bad id"
    );
}
