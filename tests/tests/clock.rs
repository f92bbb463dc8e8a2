//! Clock alignment end to end, with the real controller and agents on
//! loopback: the agent's system clock is `untrusted` (as if nothing
//! synchronised it), so only the link's time exchange can give it reference
//! time. One host, one physical clock: the true offset is zero, so the
//! reported offset is the error.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use baton_e2e::fleet::{Controller, start_agent_clock, start_controller};
use baton_e2e::wait_until;

const WAIT: Duration = Duration::from_secs(30);

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}
fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn agent_clock(c: &Controller, id: &str) -> Option<serde_json::Value> {
    c.agents().into_iter().find(|a| a["id"] == id)
}

/// A one-shot `at:` 2 s from now on `line`: a pack that needs absolute time.
fn one_shot(dir: &std::path::Path, name: &str, agent: &str) -> std::path::PathBuf {
    let at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("time")
        .as_secs()
        + 2;
    let at = jiff::Timestamp::from_second(at as i64).expect("instant");
    let text = format!(
        "pack: {name}\nversion: 1\ntargets: {{agents: [{agent}]}}\n\
         safe_state:\n  - {{action: gpio.write, params: {{line: 4, value: 0}}}}\n\
         instructions:\n  - id: once\n    action: gpio.write\n    params: {{line: 4, value: 1}}\n    at: {at}\n"
    );
    let p = dir.join(format!("{name}.yaml"));
    std::fs::write(&p, text).expect("write pack");
    p
}

#[test]
fn the_link_exchange_locks_the_agent_to_the_controller_and_admits_absolute_packs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = start_controller(&dir.path().join("ctl"), "127.0.0.1:0");
    let a = start_agent_clock(
        &dir.path().join("a1"),
        "a1",
        &c.url,
        &["--system-clock", "untrusted"],
    );
    assert!(
        wait_until(WAIT, || agent_clock(&c, "a1").is_some_and(|a| {
            a["clock_source"] == "link" && a["clock_state"] == "locked"
        })),
        "never locked to the link; agents: {:?}\nagent log:\n{}",
        agent_clock(&c, "a1"),
        a.log()
    );
    let rec = agent_clock(&c, "a1").expect("listed");
    let offset = rec["clock_offset_ns"].as_i64().expect("offset");
    let uncertainty = rec["clock_uncertainty_ns"].as_i64().expect("uncertainty");
    // Same clock on both ends: the offset is the error. Loopback gives
    // tens of microseconds; the bound leaves room for a loaded CI box.
    assert!(offset.abs() < 2_000_000, "offset {offset} ns: {rec}");
    assert!(
        uncertainty > 0 && uncertainty < 10_000_000,
        "uncertainty {uncertainty} ns: {rec}"
    );
    assert!(
        offset.abs() <= uncertainty.max(100_000),
        "the error {offset} ns lies outside the claimed uncertainty {uncertainty} ns"
    );

    // Locked: a pack that needs absolute time is taken.
    let p = one_shot(dir.path(), "once", "a1");
    let o = c.ctl(&["push", p.to_str().expect("utf-8")]);
    assert!(o.status.success(), "push: {}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("acked"), "{}", stdout(&o));
    // It fires, and its feedback carries the uncertainty it fired with.
    assert!(
        wait_until(WAIT, || c
            .feedback("once")
            .iter()
            .any(|f| f["outcome"] == "ok")),
        "never fired: {:?}\n{}",
        c.feedback("once"),
        a.log()
    );
    let fired = c.feedback("once");
    let ok = fired
        .iter()
        .find(|f| f["outcome"] == "ok")
        .expect("ok record");
    let u = ok["uncertainty_ns"].as_i64().unwrap_or(0);
    assert!(u > 0 && u < 10_000_000, "feedback uncertainty {u}: {ok}");

    // The history: `clock AGENT --json`, oldest first, the link among them.
    let o = c.ctl(&["clock", "a1", "--json"]);
    assert!(o.status.success(), "clock: {}", stderr(&o));
    let reports = baton_e2e::fleet::json_lines(&o.stdout);
    assert!(
        reports
            .iter()
            .any(|r| r["source"] == "link" && r["state"] == "locked"),
        "{reports:?}"
    );
    let at: Vec<i64> = reports.iter().filter_map(|r| r["at_ns"].as_i64()).collect();
    assert!(at.windows(2).all(|w| w[0] <= w[1]), "oldest first: {at:?}");
    // An agent nobody knows is not found, and says so.
    let o = c.ctl(&["clock", "nobody"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("no agent nobody"), "{}", stderr(&o));
}

#[test]
fn with_no_clock_source_absolute_packs_wait_and_interval_packs_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = start_controller(&dir.path().join("ctl"), "127.0.0.1:0");
    let cfg = dir.path().join("agent.yaml");
    std::fs::write(&cfg, "clock:\n  link: false\n").expect("config");
    let mut a = start_agent_clock(
        &dir.path().join("a1"),
        "a1",
        &c.url,
        &[
            "--system-clock",
            "untrusted",
            "--config",
            cfg.to_str().expect("utf-8"),
        ],
    );
    assert!(
        wait_until(WAIT, || agent_clock(&c, "a1").is_some_and(|a| {
            a["clock_source"] == "system" && a["clock_state"] == "free-running"
        })),
        "agents: {:?}\n{}",
        agent_clock(&c, "a1"),
        a.log()
    );
    // Needs absolute time: refused for now, with the measured uncertainty
    // and the limit; the controller keeps it pending.
    let p = one_shot(dir.path(), "later", "a1");
    let o = c.ctl(&["push", p.to_str().expect("utf-8"), "--wait", "3s"]);
    assert!(!o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let text = stdout(&o) + &stderr(&o);
    assert!(text.contains("needs absolute time"), "{text}");
    assert!(text.contains("exceeds the agent's limit 10ms"), "{text}");
    // Plain intervals need no absolute time: taken at once.
    let every = dir.path().join("blink.yaml");
    std::fs::write(
        &every,
        "pack: blink\nversion: 1\ntargets: {agents: [a1]}\n\
         safe_state:\n  - {action: gpio.write, params: {line: 5, value: 0}}\n\
         instructions:\n  - {id: t, action: gpio.toggle, params: {line: 5}, every: 100ms}\n",
    )
    .expect("write");
    let o = c.ctl(&["push", every.to_str().expect("utf-8")]);
    assert!(o.status.success(), "push: {}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("acked"), "{}", stdout(&o));
    assert!(
        wait_until(WAIT, || a.writes().len() >= 3),
        "the interval pack does not run: {}",
        a.log()
    );

    // The same agent with the link's time exchange: once locked, the
    // pending pack is delivered by the controller's retries.
    a.kill9();
    std::fs::write(&cfg, "clock:\n  link: true\n").expect("config");
    a.restart();
    assert!(
        wait_until(WAIT, || c
            .feedback("later")
            .iter()
            .any(|f| f["outcome"] == "ok" || f["outcome"] == "skipped")),
        "the pending pack was never delivered once locked: {:?}\nagent log:\n{}\ncontroller log:\n{}",
        c.feedback("later"),
        a.log(),
        c.log()
    );
}
