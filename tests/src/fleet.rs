//! A controller and agents as real processes on loopback, for the fleet's
//! end-to-end tests: start, kill, restart, and run operator commands.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::{Running, bin, run, wait_until};

/// A controller process and its data directory.
#[derive(Debug)]
pub struct Controller {
    /// The process.
    pub proc: Running,
    /// Its store directory.
    pub data: PathBuf,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// The address it listens on (kept across restarts).
    pub addr: String,
}

/// Start a controller on `listen` (`127.0.0.1:0` for any port) with its
/// store in `data`; wait until it listens. Ping interval 1 s, so dead
/// links are noticed within seconds in tests.
pub fn start_controller(data: &Path, listen: &str) -> Controller {
    std::fs::create_dir_all(data).expect("controller data dir");
    let addr_file = data.join("listen.addr");
    let _ = std::fs::remove_file(&addr_file);
    let log = std::fs::File::create(data.join("controller.log")).expect("log file");
    let proc = Command::new(bin("baton-controller"))
        .args([
            "serve",
            "--insecure",
            "--ping-interval",
            "1s",
            "--listen",
            listen,
        ])
        .arg("--data")
        .arg(data)
        .env(
            "RUST_LOG",
            std::env::var("BATON_TEST_LOG").unwrap_or_else(|_| "info".into()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn controller");
    let mut proc = Running(proc);
    let up = wait_until(Duration::from_secs(20), || {
        addr_file.exists() || matches!(proc.try_wait(), Ok(Some(_)))
    });
    let addr = std::fs::read_to_string(&addr_file)
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    assert!(
        up && !addr.is_empty(),
        "controller did not start; log:\n{}",
        std::fs::read_to_string(data.join("controller.log")).unwrap_or_default()
    );
    Controller {
        proc,
        data: data.to_path_buf(),
        url: format!("http://{addr}"),
        addr,
    }
}

impl Controller {
    /// Run an operator subcommand against this controller.
    pub fn ctl(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new(bin("baton-controller"));
        cmd.args(args)
            .args(["--controller", &self.url, "--insecure"]);
        run(&mut cmd, Duration::from_secs(60))
    }

    /// `kill -9`.
    pub fn kill9(&mut self) {
        let _ = self.proc.kill();
        let _ = self.proc.wait();
    }

    /// Start again on the same address and store.
    pub fn restart(&mut self) {
        self.kill9();
        let next = start_controller(&self.data, &self.addr);
        *self = next;
    }

    /// The controller's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.data.join("controller.log")).unwrap_or_default()
    }

    /// `feedback --pack P --json` as parsed objects.
    pub fn feedback(&self, pack: &str) -> Vec<serde_json::Value> {
        let o = self.ctl(&["feedback", "--pack", pack, "--json"]);
        assert!(
            o.status.success(),
            "feedback: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        json_lines(&o.stdout)
    }

    /// `agents --json` as parsed objects.
    pub fn agents(&self) -> Vec<serde_json::Value> {
        let o = self.ctl(&["agents", "--json"]);
        assert!(
            o.status.success(),
            "agents: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        json_lines(&o.stdout)
    }

    /// Whether agent `id` is connected now.
    pub fn connected(&self, id: &str) -> bool {
        self.agents()
            .iter()
            .any(|a| a["id"] == id && a["connected"] == true)
    }
}

/// Parse JSON lines.
pub fn json_lines(bytes: &[u8]) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(bytes)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// An agent process dialling a controller.
#[derive(Debug)]
pub struct Agent {
    /// The process.
    pub proc: Running,
    /// Its id.
    pub id: String,
    /// Journal directory.
    pub data: PathBuf,
    /// Sim GPIO log.
    pub gpio: PathBuf,
    /// Where it dials.
    pub url: String,
    labels: Vec<String>,
}

/// Start agent `id` in `dir` (journal in `dir/data`, sim GPIO log
/// `dir/gpio.jsonl`, log `dir/agent.log`) dialling `url`, with `labels`
/// as `k=v`.
pub fn start_agent(dir: &Path, id: &str, url: &str, labels: &[&str]) -> Agent {
    let labels: Vec<String> = labels.iter().map(|s| s.to_string()).collect();
    spawn_agent(dir, id, url, &labels)
}

fn spawn_agent(dir: &Path, id: &str, url: &str, labels: &[String]) -> Agent {
    std::fs::create_dir_all(dir).expect("agent dir");
    let data = dir.join("data");
    let gpio = dir.join("gpio.jsonl");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("agent.log"))
        .expect("agent log");
    let mut cmd = Command::new(bin("baton-agent"));
    cmd.args([
        "run",
        "--no-rt",
        "--insecure",
        "--id",
        id,
        "--controller",
        url,
    ])
    .arg("--data")
    .arg(&data)
    .arg("--gpio")
    .arg(format!("sim:{}", gpio.display()));
    for l in labels {
        cmd.args(["--label", l]);
    }
    let proc = cmd
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn agent");
    Agent {
        proc: Running(proc),
        id: id.to_string(),
        data,
        gpio,
        url: url.to_string(),
        labels: labels.to_vec(),
    }
}

impl Agent {
    /// `kill -9`.
    pub fn kill9(&mut self) {
        let _ = self.proc.kill();
        let _ = self.proc.wait();
    }

    /// Start again with the same id, journal and GPIO log.
    pub fn restart(&mut self) {
        self.kill9();
        let dir = self.data.parent().expect("agent dir").to_path_buf();
        let next = spawn_agent(&dir, &self.id, &self.url, &self.labels);
        *self = next;
    }

    /// The agent's log so far.
    pub fn log(&self) -> String {
        let dir = self.data.parent().expect("agent dir");
        std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default()
    }

    /// The sim GPIO writes so far, parsed.
    pub fn writes(&self) -> Vec<serde_json::Value> {
        crate::lines(&self.gpio)
            .iter()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}
