//! Agent updates end to end (issue 39 item 3), with the real binaries: a
//! controller; boxes each started by `baton-agent launch` from a
//! "packaged" copy of the agent, with a trust directory naming a release
//! key; a release uploaded with `release upload --sign` (the same build
//! stamped with another version, as a release pipeline does); and
//! `agent-update start` with a staged plan.
//!
//! Checked: the update moves stage by stage, each box restarting into
//! the new version in its own process and reporting it on its link, the
//! controller showing each box's word on the update; the packs keep
//! firing, nothing twice (feedback against each box's sim GPIO log); a
//! build that exits at start is rolled back by the box and the update
//! aborts at its first stage, the other boxes never offered it.
//!
//! Not here: aarch64 (the `.deb` path under qemu is the packaging
//! step's); a controller over PostgreSQL replicas (the store contract
//! runs the same operations on it).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use baton_e2e::fleet::{Controller, json_lines, start_controller};
use baton_e2e::{bin, controller_tool as tool, new_key, output_text as text, run, wait_until};

const WAIT: Duration = Duration::from_secs(120);
const DAY_NS: i64 = 86_400_000_000_000;

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8")
}

/// A site's keys: a root, a release key, and the root-signed list naming
/// the release key (no tenant requires signed packs).
struct Keys {
    dir: PathBuf,
    root_pub: String,
    chain: PathBuf,
}

fn keys(d: &Path) -> Keys {
    let dir = d.join("keys");
    let root_pub = new_key(&dir, "root");
    let release_pub = new_key(&dir, "release");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos() as i64;
    let list = d.join("list.json");
    std::fs::write(
        &list,
        serde_json::json!({
            "version": 1,
            "expires_ns": now + DAY_NS,
            "tenants": {"default": {"require_signed": false, "pack_keys": []}},
            "release_keys": [release_pub],
        })
        .to_string(),
    )
    .expect("list");
    let chain = d.join("chain.json");
    let o = tool(&[
        "keys",
        "sign-list",
        "--root",
        s(&dir.join("root.key")),
        "--list",
        s(&list),
        "--chain",
        s(&chain),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    Keys {
        dir,
        root_pub,
        chain,
    }
}

/// A box: a packaged agent (a copy of the real binary), its trust, its
/// configuration; run by `launch` as systemd's unit does.
struct Box_ {
    id: String,
    dir: PathBuf,
    child: Option<Child>,
}

impl Box_ {
    fn new(d: &Path, id: &str, keys: &Keys, url: &str) -> Box_ {
        let dir = d.join(id);
        std::fs::create_dir_all(dir.join("bin")).expect("mkdir");
        std::fs::create_dir_all(dir.join("trust")).expect("mkdir");
        // Copied by another process: a file this process held open for
        // writing could be inherited by a child another test thread forks
        // meanwhile, and executing it would fail (ETXTBSY).
        let o = run(
            Command::new("cp")
                .arg(bin("baton-agent"))
                .arg(dir.join("bin/baton-agent")),
            Duration::from_secs(60),
        );
        assert!(o.status.success(), "packaged copy: {}", text(&o));
        std::fs::write(dir.join("trust/root.pub"), format!("{}\n", keys.root_pub)).expect("root");
        std::fs::copy(&keys.chain, dir.join("trust/trust.json")).expect("trust list");
        std::fs::write(
            dir.join("agent.yaml"),
            format!(
                "id: {id}\ndata-dir: {data}\ngpio: sim:{gpio}\ncontroller: {url}\ninsecure: true\n\
                 trust-dir: {trust}\nupdate: {{download-rate: 33554432, quiet-margin: 100ms, confirm-within: 60s}}\n",
                data = dir.join("data").display(),
                gpio = dir.join("gpio.jsonl").display(),
                trust = dir.join("trust").display(),
            ),
        )
        .expect("config");
        let mut b = Box_ {
            id: id.to_string(),
            dir,
            child: None,
        };
        b.launch();
        b
    }

    /// `launch` (systemd's `ExecStart`; its `Restart=` is the test's).
    fn launch(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("agent.log"))
            .expect("log");
        let child = Command::new(self.dir.join("bin/baton-agent"))
            .arg("launch")
            .arg("--config")
            .arg(self.dir.join("agent.yaml"))
            .args(["--system-clock", "reference", "--no-rt"])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn");
        self.child = Some(child);
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("agent.log")).unwrap_or_default()
    }

    /// Line 7's writes of 1 in the sim GPIO log.
    fn ones(&self) -> usize {
        std::fs::read_to_string(self.dir.join("gpio.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|w| w["line"] == 7 && w["value"] == 1)
            .count()
    }

    /// SIGTERM (its way out, as systemd stops it), then wait.
    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            let _ = baton_e2e::wait_exit(&mut c, Duration::from_secs(30));
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Box_ {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn push_tick(c: &Controller, d: &Path, ids: &[&str]) {
    let p = d.join("tick.yaml");
    std::fs::write(
        &p,
        format!(
            "pack: tick\nversion: 1\ntargets: {{agents: [{}]}}\n\
             safe_state:\n  - {{action: gpio.write, params: {{line: 7, value: 0}}}}\n\
             instructions:\n  - {{id: on, action: gpio.write, params: {{line: 7, value: 1}}, every: 400ms}}\n",
            ids.join(", ")
        ),
    )
    .expect("pack");
    let o = c.ctl(&["push", s(&p), "--wait", "30s"]);
    assert!(o.status.success(), "{}", text(&o));
}

/// Each occurrence of `on` that ran, per agent: never twice.
fn fired(c: &Controller, agent: &str) -> usize {
    let ok: Vec<String> = c
        .feedback("tick")
        .into_iter()
        .filter(|f| f["agent"] == agent && f["instruction"] == "on" && f["outcome"] == "ok")
        .map(|f| f["occurrence"].to_string())
        .collect();
    let unique: std::collections::BTreeSet<&String> = ok.iter().collect();
    assert_eq!(unique.len(), ok.len(), "{agent}: an occurrence fired twice");
    ok.len()
}

/// The pack cancelled (its safe state), then each box's sim log against
/// the controller's feedback once it has it all: one write of 1 per
/// firing reported, nothing twice.
fn settle_and_compare(c: &Controller, boxes: &[Box_]) {
    let o = c.ctl(&["cancel", "tick"]);
    assert!(o.status.success(), "{}", text(&o));
    for b in boxes {
        let same = wait_until(WAIT, || b.ones() == fired(c, &b.id));
        assert!(
            same,
            "{}: sim log {} against feedback {}",
            b.id,
            b.ones(),
            fired(c, &b.id)
        );
    }
}

fn agent<'a>(agents: &'a [serde_json::Value], id: &str) -> &'a serde_json::Value {
    agents
        .iter()
        .find(|a| a["id"] == id)
        .unwrap_or_else(|| panic!("no agent {id} in {agents:?}"))
}

fn update_status(c: &Controller) -> serde_json::Value {
    let o = c.ctl(&["agent-update", "status", "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    json_lines(&o.stdout).pop().expect("one update")
}

/// The release: this build stamped `version`, uploaded signed by the
/// site's release key.
fn upload(c: &Controller, d: &Path, keys: &Keys, name: &str, binary: &[u8], version: &str) {
    let file = d.join(name);
    std::fs::write(&file, binary).expect("release");
    let o = c.ctl(&[
        "release",
        "upload",
        s(&file),
        "--sign",
        s(&keys.dir.join("release.key")),
        "--version",
        version,
        "--arch",
        std::env::consts::ARCH,
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains(&format!("stored release {version}")),
        "{}",
        text(&o)
    );
}

fn start_update(c: &Controller, d: &Path, version: &str, plan: &str) -> Output {
    let p = d.join("plan.yaml");
    std::fs::write(&p, plan).expect("plan");
    c.ctl(&["agent-update", "start", version, "--plan", s(&p)])
}

#[test]
fn a_staged_update_reaches_every_box_each_in_its_own_process_with_nothing_twice() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let keys = keys(d);
    let c = start_controller(&d.join("ctl"), "127.0.0.1:0");
    let ids = ["b1", "b2", "b3"];
    let mut boxes: Vec<Box_> = ids
        .iter()
        .map(|id| Box_::new(d, id, &keys, &c.url))
        .collect();
    for b in &boxes {
        assert!(wait_until(WAIT, || c.connected(&b.id)), "{}", b.log());
    }
    let pids: Vec<u32> = boxes.iter().map(Box_::pid).collect();
    push_tick(&c, d, &ids);
    for id in ids {
        assert!(wait_until(WAIT, || fired(&c, id) >= 2));
    }

    let stamped =
        baton_trust::release::stamp(&std::fs::read(bin("baton-agent")).expect("agent"), "9.9.9")
            .expect("one version slot");
    upload(&c, d, &keys, "baton-agent-9.9.9", &stamped, "9.9.9");
    let o = c.ctl(&["release", "list", "--json"]);
    let listed = json_lines(&o.stdout);
    assert_eq!(listed.len(), 1, "{}", text(&o));
    assert_eq!(listed[0]["size"], stamped.len() as u64);

    // One box first, then the rest; each stage passes once its boxes run
    // the version, are back on their link with their clock locked, and
    // have fired on it.
    let o = start_update(
        &c,
        d,
        "9.9.9",
        "rollout:\n  stages: [{agents: 1}, {percent: 100}]\n  soak: 1s\n  min_firings: 1\n  stage_deadline: {after: 90s, then: abort}\n",
    );
    assert!(o.status.success(), "{}", text(&o));
    let done = wait_until(Duration::from_secs(240), || {
        update_status(&c)["state"] == "completed"
    });
    let st = update_status(&c);
    assert!(
        done,
        "{st}\n{}\n---\n{}",
        c.log(),
        boxes
            .iter()
            .map(Box_::log)
            .collect::<Vec<_>>()
            .join("\n---\n")
    );
    let verdicts = st["verdicts"].as_array().expect("verdicts");
    assert_eq!(verdicts.len(), 2, "{st}");
    assert!(verdicts.iter().all(|v| v["verdict"] == "pass"), "{st}");

    let agents = c.agents();
    for (b, pid) in boxes.iter().zip(&pids) {
        let a = agent(&agents, &b.id);
        assert_eq!(a["version"], "9.9.9", "{a}");
        assert_eq!(a["update"]["phase"], "running", "{a}");
        assert_eq!(b.pid(), *pid);
        assert_eq!(
            std::fs::read_link(format!("/proc/{pid}/exe")).expect("exe"),
            b.dir.join("data/agent-versions/9.9.9/baton-agent"),
            "{}: the same process, now the installed build",
            b.id
        );
    }
    // Firing on after the restart, the journal carried over (the pack
    // held, not pushed again): nothing twice, the sim log against
    // feedback.
    let before: Vec<usize> = ids.iter().map(|id| fired(&c, id)).collect();
    for (id, n) in ids.iter().zip(&before) {
        assert!(wait_until(WAIT, || fired(&c, id) >= n + 2));
    }
    settle_and_compare(&c, &boxes);
    for b in &mut boxes {
        b.stop();
        assert!(
            b.log()
                .contains("a quiet moment; restarting into the new version"),
            "{}",
            b.log()
        );
    }
    // Audited: the upload, the start, each stage.
    let o = c.ctl(&["audit", "--json"]);
    let audit = String::from_utf8_lossy(&o.stdout);
    assert!(audit.contains("release.upload"), "{audit}");
    assert!(audit.contains("update.start"), "{audit}");
    assert!(audit.contains("completed: every stage passed"), "{audit}");
}

#[test]
fn a_build_that_exits_at_start_is_rolled_back_and_the_update_aborts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let keys = keys(d);
    let c = start_controller(&d.join("ctl"), "127.0.0.1:0");
    let ids = ["b1", "b2"];
    let mut boxes: Vec<Box_> = ids
        .iter()
        .map(|id| Box_::new(d, id, &keys, &c.url))
        .collect();
    for b in &boxes {
        assert!(wait_until(WAIT, || c.connected(&b.id)), "{}", b.log());
    }
    push_tick(&c, d, &ids);
    for id in ids {
        assert!(wait_until(WAIT, || fired(&c, id) >= 2));
    }
    // A script that reports 9.9.9 (its version slot after the exit).
    let mut broken = b"#!/bin/sh\necho 'this build cannot start' >&2\nexit 1\n# ".to_vec();
    let at = broken.len();
    broken.extend_from_slice(baton_trust::release::SLOT_MARK);
    broken.extend_from_slice(b"9.9.9");
    broken.resize(at + baton_trust::release::SLOT_LEN, 0);
    upload(&c, d, &keys, "broken", &broken, "9.9.9");

    let o = start_update(
        &c,
        d,
        "9.9.9",
        "rollout:\n  stages: [{agents: 1}, {percent: 100}]\n  soak: 1s\n  stage_deadline: {after: 90s, then: abort}\n",
    );
    assert!(o.status.success(), "{}", text(&o));
    // The first stage's box (b1, by id) runs the build once, in its own
    // process: it exits. systemd's Restart=on-failure starts it again,
    // and the launcher rolls it back to the packaged agent.
    let status = baton_e2e::wait_exit(boxes[0].child.as_mut().expect("b1"), WAIT)
        .unwrap_or_else(|| panic!("b1 never ran the broken build\n{}", boxes[0].log()));
    assert_eq!(status.code(), Some(1), "{}", boxes[0].log());
    boxes[0].launch();
    let aborted = wait_until(WAIT, || update_status(&c)["state"] == "aborted");
    let st = update_status(&c);
    assert!(aborted, "{st}\n{}", boxes[0].log());
    assert!(
        st["reason"]
            .as_str()
            .unwrap_or("")
            .contains("agent b1 refused the version: rolled_back"),
        "{st}"
    );
    let agents = c.agents();
    let b1 = agent(&agents, "b1");
    assert_eq!(b1["version"], env!("CARGO_PKG_VERSION"), "{b1}");
    assert_eq!(b1["update"]["phase"], "rolled_back", "{b1}");
    let b2 = agent(&agents, "b2");
    assert_eq!(b2["update"], serde_json::Value::Null, "never offered: {b2}");
    assert!(wait_until(WAIT, || c.connected("b1")));
    let n = fired(&c, "b1");
    assert!(wait_until(WAIT, || fired(&c, "b1") >= n + 2), "b1 fires on");
    settle_and_compare(&c, &boxes);
    for b in &mut boxes {
        b.stop();
    }
    let o = c.ctl(&["audit", "--json"]);
    let audit = String::from_utf8_lossy(&o.stdout);
    assert!(audit.contains("offers of 9.9.9 withdrawn"), "{audit}");
    // The command line: an abort names its update; an upload says how it
    // is signed; a resume of an aborted update is refused (final).
    let o = c.ctl(&["agent-update", "abort"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("name the update"), "{}", text(&o));
    let o = c.ctl(&["release", "upload", s(&d.join("broken"))]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("--manifest M.json, or --sign KEY"),
        "{}",
        text(&o)
    );
    let o = c.ctl(&["agent-update", "resume", "1"]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("only a paused rollout can be resumed"),
        "{}",
        text(&o)
    );
}
