//! The fleet end to end: a real controller and real agents on loopback.
//! push → ack → feedback; refusals with positions; targets by label with an
//! agent that joins later; cancel; reconciliation after restarts of either
//! side; garbage and protocol violations on the stream.

use std::time::Duration;

use baton_e2e::fleet::{Controller, json_lines, start_agent, start_controller};
use baton_e2e::wait_until;

const WAIT: Duration = Duration::from_secs(30);

fn write(dir: &std::path::Path, name: &str, yaml: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, yaml).expect("write pack");
    p
}

fn blink(name: &str, version: u64, targets: &str, line: u32) -> String {
    format!(
        "pack: {name}\nversion: {version}\ntargets: {targets}\n\
         safe_state:\n  - {{action: gpio.write, params: {{line: {line}, value: 0}}}}\n\
         instructions:\n  - id: tick\n    action: gpio.toggle\n    params: {{line: {line}}}\n    every: 100ms\n"
    )
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn held(c: &Controller, agent: &str) -> Vec<(String, u64, bool)> {
    c.agents()
        .iter()
        .filter(|a| a["id"] == agent)
        .flat_map(|a| a["packs"].as_array().cloned().unwrap_or_default())
        .map(|p| {
            (
                p["pack"].as_str().unwrap_or_default().to_string(),
                p["version"].as_u64().unwrap_or_default(),
                p["stopped"].as_bool().unwrap_or_default(),
            )
        })
        .collect()
}

#[test]
fn push_ack_feedback_and_cancel() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = start_controller(&dir.path().join("ctl"), "127.0.0.1:0");
    let a = start_agent(&dir.path().join("a1"), "a1", &c.url, &[]);
    assert!(
        wait_until(WAIT, || c.connected("a1")),
        "agent never connected; agent log:\n{}",
        a.log()
    );
    let pack = write(dir.path(), "p.yaml", &blink("p", 1, "{agents: [a1]}", 5));
    let o = c.ctl(&["push", pack.to_str().expect("utf-8")]);
    assert!(o.status.success(), "push: {}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).contains("a1") && stdout(&o).contains("acked"),
        "{}",
        stdout(&o)
    );

    // Feedback of executed firings reaches the store, once each.
    assert!(
        wait_until(WAIT, || c
            .feedback("p")
            .iter()
            .filter(|f| f["outcome"] == "ok")
            .count()
            >= 5),
        "no feedback; agent log:\n{}",
        a.log()
    );
    let fb = c.feedback("p");
    let mut ids: Vec<&str> = fb
        .iter()
        .filter(|f| f["event"] == "executed")
        .filter_map(|f| f["execution_id"].as_str())
        .collect();
    let n = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), n, "an execution id stored twice");
    for f in &fb {
        assert_eq!(f["agent"], "a1");
        assert_eq!(f["pack"], "p");
    }
    assert_eq!(held(&c, "a1"), [("p".to_string(), 1, false)]);

    // Cancel: the agent drives the safe state and no longer holds it.
    let o = c.ctl(&["cancel", "p"]);
    assert!(o.status.success(), "cancel: {}", stderr(&o));
    assert!(
        wait_until(WAIT, || held(&c, "a1").is_empty()),
        "still held after cancel: {:?}",
        held(&c, "a1")
    );
    let last = a
        .writes()
        .into_iter()
        .rfind(|w| w["line"] == 5)
        .expect("writes to line 5");
    assert_eq!(last["value"], 0, "safe state left the line at 0");
    let o = c.ctl(&["packs", "--json"]);
    let packs = json_lines(&o.stdout);
    assert_eq!(packs.len(), 1);
    assert_eq!(packs[0]["cancelled"], true);
}

/// `cancel PACK --agent ID`: that agent runs the safe state and drops the
/// pack, the other keeps firing it; pushing the same version again does
/// not send it back, a newer version does.
#[test]
fn cancel_on_one_agent_leaves_the_others_running() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = start_controller(&dir.path().join("ctl"), "127.0.0.1:0");
    let a1 = start_agent(&dir.path().join("a1"), "a1", &c.url, &[]);
    let a2 = start_agent(&dir.path().join("a2"), "a2", &c.url, &[]);
    assert!(
        wait_until(WAIT, || c.connected("a1") && c.connected("a2")),
        "agents never connected:\n{}\n{}",
        a1.log(),
        a2.log()
    );
    let v1 = write(
        dir.path(),
        "p.yaml",
        &blink("p", 1, "{agents: [a1, a2]}", 5),
    );
    let o = c.ctl(&["push", v1.to_str().expect("utf-8")]);
    assert!(o.status.success(), "push: {}{}", stdout(&o), stderr(&o));

    let o = c.ctl(&["cancel", "p", "--agent", "a1"]);
    assert!(o.status.success(), "cancel: {}", stderr(&o));
    assert!(stdout(&o).contains("1 agent told: a1"), "{}", stdout(&o));
    assert!(
        wait_until(WAIT, || held(&c, "a1").is_empty()),
        "a1 still holds it: {:?}",
        held(&c, "a1")
    );
    let last = a1.writes().into_iter().rfind(|w| w["line"] == 5);
    assert_eq!(
        last.expect("a1 wrote line 5")["value"],
        0,
        "a1's safe state"
    );
    // a2 keeps it, and keeps firing it.
    assert_eq!(held(&c, "a2"), [("p".to_string(), 1, false)]);
    let before = a2.writes().len();
    assert!(
        wait_until(WAIT, || a2.writes().len() >= before + 3),
        "a2 stopped firing"
    );
    // An unknown agent is refused with its name.
    let o = c.ctl(&["cancel", "p", "--agent", "ghost"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("ghost"), "{}", stderr(&o));

    // The same version pushed again does not reach a1; v2 does.
    let o = c.ctl(&["push", v1.to_str().expect("utf-8")]);
    assert!(o.status.success(), "push again: {}", stderr(&o));
    assert_eq!(held(&c, "a1"), []);
    let v2 = write(
        dir.path(),
        "p2.yaml",
        &blink("p", 2, "{agents: [a1, a2]}", 5),
    );
    let o = c.ctl(&["push", v2.to_str().expect("utf-8")]);
    assert!(o.status.success(), "push v2: {}{}", stdout(&o), stderr(&o));
    assert!(
        wait_until(WAIT, || held(&c, "a1") == [("p".to_string(), 2, false)]),
        "a1 never got v2: {:?}",
        held(&c, "a1")
    );
}

#[test]
fn invalid_packs_are_refused_with_positions_and_nothing_is_stored() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = start_controller(&dir.path().join("ctl"), "127.0.0.1:0");
    let bad = write(
        dir.path(),
        "bad.yaml",
        "pack: bad\nversion: 1\ninstructions:\n  - id: x\n    action: gpio.toggle\n    params: {line: 1}\n    every: 0ms\n",
    );
    let good = write(
        dir.path(),
        "good.yaml",
        &blink("good", 1, "{agents: [a1]}", 1),
    );
    let o = c.ctl(&[
        "push",
        good.to_str().expect("utf-8"),
        bad.to_str().expect("utf-8"),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("bad.yaml:7:"), "position of the error: {err}");
    assert!(err.contains("nothing pushed"), "{err}");
    // Neither file was stored: one bad file refuses the whole push.
    let o = c.ctl(&["packs", "--json"]);
    assert!(json_lines(&o.stdout).is_empty(), "{}", stdout(&o));
}

#[test]
fn an_agent_refusal_is_a_nack_with_its_reason() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = start_controller(&dir.path().join("ctl"), "127.0.0.1:0");
    let a = start_agent(&dir.path().join("a1"), "a1", &c.url, &[]);
    assert!(wait_until(WAIT, || c.connected("a1")), "{}", a.log());
    // Valid pack language, but the agent has no exec allowlist.
    let pack = write(
        dir.path(),
        "x.yaml",
        "pack: x\nversion: 1\ntargets: {agents: [a1]}\ninstructions:\n  - id: run\n    action: exec\n    params: {program: /bin/true}\n    every: 1s\n",
    );
    let o = c.ctl(&["push", pack.to_str().expect("utf-8"), "--json"]);
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let lines = json_lines(&o.stdout);
    let d = lines
        .iter()
        .find(|l| l["event"] == "delivery")
        .expect("delivery line");
    assert_eq!(d["state"], "nacked");
    assert!(
        d["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("/bin/true"),
        "{d}"
    );
    assert!(held(&c, "a1").is_empty());
}

#[test]
fn labels_target_agents_including_one_that_joins_later() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = start_controller(&dir.path().join("ctl"), "127.0.0.1:0");
    let a1 = start_agent(&dir.path().join("a1"), "a1", &c.url, &["line=3"]);
    let a2 = start_agent(&dir.path().join("a2"), "a2", &c.url, &["line=4"]);
    assert!(
        wait_until(WAIT, || c.connected("a1") && c.connected("a2")),
        "{}\n{}",
        a1.log(),
        a2.log()
    );
    let pack = write(
        dir.path(),
        "l.yaml",
        &blink("l", 1, "{labels: {line: \"3\"}}", 2),
    );
    let o = c.ctl(&["push", pack.to_str().expect("utf-8")]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(held(&c, "a1"), [("l".to_string(), 1, false)]);
    assert!(held(&c, "a2").is_empty());

    let a3 = start_agent(&dir.path().join("a3"), "a3", &c.url, &["line=3", "zone=b"]);
    assert!(
        wait_until(WAIT, || held(&c, "a3") == [("l".to_string(), 1, false)]),
        "late joiner never got the pack; log:\n{}",
        a3.log()
    );
    assert!(held(&c, "a2").is_empty());
}

#[test]
fn reconciliation_after_restarts_of_either_side() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut c = start_controller(&dir.path().join("ctl"), "127.0.0.1:0");
    let mut a = start_agent(&dir.path().join("a1"), "a1", &c.url, &[]);
    assert!(wait_until(WAIT, || c.connected("a1")), "{}", a.log());
    let v1 = write(dir.path(), "v1.yaml", &blink("r", 1, "{agents: [a1]}", 3));
    assert!(
        c.ctl(&["push", v1.to_str().expect("utf-8")])
            .status
            .success()
    );

    // Agent offline: v2 is stored and stays pending, with the reason.
    a.kill9();
    assert!(wait_until(WAIT, || !c.connected("a1")));
    let v2 = write(dir.path(), "v2.yaml", &blink("r", 2, "{agents: [a1]}", 3));
    let o = c.ctl(&["push", v2.to_str().expect("utf-8"), "--wait", "1s"]);
    assert_eq!(o.status.code(), Some(3), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("not connected"), "{}", stdout(&o));

    // Controller killed too, then both back: the agent reconnects by itself
    // and gets v2 (the pending delivery survived the controller crash).
    c.restart();
    a.restart();
    assert!(
        wait_until(WAIT, || held(&c, "a1") == [("r".to_string(), 2, false)]),
        "v2 never delivered; agent log:\n{}\ncontroller log:\n{}",
        a.log(),
        c.log()
    );
    // Controller killed while the agent runs: it reconnects on its own.
    c.restart();
    assert!(
        wait_until(WAIT, || c.connected("a1")),
        "agent did not reconnect:\n{}",
        a.log()
    );
    // Re-delivery of the same version is a no-op on the agent.
    let o = c.ctl(&["push", v2.to_str().expect("utf-8")]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("unchanged"), "{}", stdout(&o));
}

#[test]
fn plaintext_needs_insecure_everywhere() {
    let bin = baton_e2e::bin("baton-controller");
    let o = baton_e2e::run(
        std::process::Command::new(&bin).args(["packs", "--controller", "http://127.0.0.1:1"]),
        Duration::from_secs(10),
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--insecure"), "{}", stderr(&o));
    let dir = tempfile::tempdir().expect("tempdir");
    let o = baton_e2e::run(
        std::process::Command::new(&bin)
            .args(["serve", "--listen", "127.0.0.1:0", "--data"])
            .arg(dir.path()),
        Duration::from_secs(10),
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("--insecure"), "{}", stderr(&o));
    let o = baton_e2e::run(
        std::process::Command::new(baton_e2e::bin("baton-agent"))
            .args([
                "run",
                "--no-rt",
                "--controller",
                "http://127.0.0.1:1",
                "--gpio",
            ])
            .arg(format!("sim:{}", dir.path().join("g").display()))
            .arg("--data")
            .arg(dir.path().join("d")),
        Duration::from_secs(10),
    );
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--insecure"), "{}", stderr(&o));

    // Plaintext toward a non-loopback address needs --insecure-any too, on
    // operators and agents alike (refused before any connection is tried).
    let o = baton_e2e::run(
        std::process::Command::new(&bin).args([
            "packs",
            "--insecure",
            "--controller",
            "http://192.0.2.7:7411",
        ]),
        Duration::from_secs(10),
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--insecure-any"), "{}", stderr(&o));
    let o = baton_e2e::run(
        std::process::Command::new(baton_e2e::bin("baton-agent"))
            .args([
                "run",
                "--no-rt",
                "--insecure",
                "--controller",
                "http://192.0.2.7:7411",
                "--gpio",
            ])
            .arg(format!("sim:{}", dir.path().join("g").display()))
            .arg("--data")
            .arg(dir.path().join("d2")),
        Duration::from_secs(10),
    );
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--insecure-any"), "{}", stderr(&o));
}
