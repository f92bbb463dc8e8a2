//! A site for the agent-update tests (`tests/agent_updates.rs` on this
//! host's architecture, `tests/agent_update_aarch64.rs` with an arm64
//! `.deb` under qemu): the keys, boxes run by `launch` from a packaged
//! agent, a ticking pack, and the controller's commands for releases and
//! updates.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use crate::fleet::{Controller, json_lines};
use crate::{controller_tool as tool, new_key, output_text as text, run, wait_until};

pub const WAIT: Duration = Duration::from_secs(120);
const DAY_NS: i64 = 86_400_000_000_000;

pub fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8")
}

/// A site's keys: a root, a release key, and the root-signed list naming
/// the release key (no tenant requires signed packs).
#[derive(Debug)]
pub struct Keys {
    pub dir: PathBuf,
    pub root_pub: String,
    pub chain: PathBuf,
}

pub fn keys(d: &Path) -> Keys {
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

/// A box: a packaged agent (a copy of `agent`: the real binary, or the
/// one an arm64 `.deb` holds), its trust, its configuration; run by
/// `launch` as systemd's unit does.
#[derive(Debug)]
pub struct EdgeBox {
    pub id: String,
    pub dir: PathBuf,
    pub child: Option<Child>,
}

impl EdgeBox {
    pub fn new(d: &Path, id: &str, keys: &Keys, url: &str, agent: &Path) -> EdgeBox {
        let dir = d.join(id);
        std::fs::create_dir_all(dir.join("bin")).expect("mkdir");
        std::fs::create_dir_all(dir.join("trust")).expect("mkdir");
        // Copied by another process: a file this process held open for
        // writing could be inherited by a child another test thread forks
        // meanwhile, and executing it would fail (ETXTBSY).
        let o = run(
            Command::new("cp")
                .arg(agent)
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
        let mut b = EdgeBox {
            id: id.to_string(),
            dir,
            child: None,
        };
        b.launch();
        b
    }

    /// `launch` (systemd's `ExecStart`; its `Restart=` is the test's).
    pub fn launch(&mut self) {
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

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("agent.log")).unwrap_or_default()
    }

    /// Line 7's writes of 1 in the sim GPIO log.
    pub fn ones(&self) -> usize {
        std::fs::read_to_string(self.dir.join("gpio.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|w| w["line"] == 7 && w["value"] == 1)
            .count()
    }

    /// SIGTERM (its way out, as systemd stops it), then wait.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            let _ = crate::wait_exit(&mut c, Duration::from_secs(30));
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for EdgeBox {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub fn push_tick(c: &Controller, d: &Path, ids: &[&str]) {
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
pub fn fired(c: &Controller, agent: &str) -> usize {
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
pub fn settle_and_compare(c: &Controller, boxes: &[EdgeBox]) {
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

pub fn agent<'a>(agents: &'a [serde_json::Value], id: &str) -> &'a serde_json::Value {
    agents
        .iter()
        .find(|a| a["id"] == id)
        .unwrap_or_else(|| panic!("no agent {id} in {agents:?}"))
}

pub fn update_status(c: &Controller) -> serde_json::Value {
    let o = c.ctl(&["agent-update", "status", "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    json_lines(&o.stdout).pop().expect("one update")
}

/// The release: `binary` (a build stamped `version`) for `arch`, uploaded
/// signed by the site's release key.
pub fn upload(
    c: &Controller,
    d: &Path,
    keys: &Keys,
    name: &str,
    binary: &[u8],
    (version, arch): (&str, &str),
) {
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
        arch,
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains(&format!("stored release {version}")),
        "{}",
        text(&o)
    );
}

pub fn start_update(c: &Controller, d: &Path, version: &str, plan: &str) -> Output {
    let p = d.join("plan.yaml");
    std::fs::write(&p, plan).expect("plan");
    c.ctl(&["agent-update", "start", version, "--plan", s(&p)])
}
