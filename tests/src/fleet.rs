//! A controller and agents as real processes on loopback, for the fleet's
//! end-to-end tests: start, kill, restart, and run operator commands.
//! Plaintext (`--insecure`) by default; the `_tls` variants use
//! certificates made by `baton-controller ca` ([`Ca`]).

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
    /// mTLS: the CA directory it serves and the operator credentials
    /// `ctl` uses (`None`: plaintext).
    pub tls: Option<ControllerTls>,
    /// Extra `serve` flags (kept across restarts).
    pub serve_args: Vec<String>,
}

/// How a TLS controller is run and called.
#[derive(Debug, Clone)]
pub struct ControllerTls {
    /// `serve --tls-dir`.
    pub dir: PathBuf,
    /// Operator certificate and key for [`Controller::ctl`].
    pub operator: (PathBuf, PathBuf),
    /// Extra `serve` flags (e.g. `--tls-handshake-timeout 1s`).
    pub serve_args: Vec<String>,
}

/// A CA directory made by `baton-controller ca`.
#[derive(Debug, Clone)]
pub struct Ca {
    /// The directory.
    pub dir: PathBuf,
}

fn ca_cmd(args: &[&str]) -> Output {
    let o = run(
        Command::new(bin("baton-controller")).arg("ca").args(args),
        Duration::from_secs(30),
    );
    assert!(
        o.status.success(),
        "ca {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

impl Ca {
    /// `ca init --dir DIR` (hosts localhost, 127.0.0.1).
    pub fn init(dir: &Path) -> Ca {
        ca_cmd(&["init", "--dir", &dir.display().to_string()]);
        Ca {
            dir: dir.to_path_buf(),
        }
    }

    /// `DIR/ca.pem`.
    pub fn ca_pem(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// `ca issue-agent NAME` with `extra` flags; (cert, key).
    pub fn agent(&self, name: &str, extra: &[&str]) -> (PathBuf, PathBuf) {
        let mut args = vec!["issue-agent", name, "--dir"];
        let dir = self.dir.display().to_string();
        args.push(&dir);
        args.extend_from_slice(extra);
        ca_cmd(&args);
        (
            self.dir.join("agents").join(format!("{name}.pem")),
            self.dir.join("agents").join(format!("{name}-key.pem")),
        )
    }

    fn issue_operator(&self, name: &str, tenant: &str, role: &str, extra: &[&str]) -> Output {
        let dir = self.dir.display().to_string();
        let mut args = vec![
            "issue-operator",
            name,
            "--tenant",
            tenant,
            "--role",
            role,
            "--dir",
            &dir,
        ];
        args.extend_from_slice(extra);
        ca_cmd(&args)
    }

    /// `ca issue-operator NAME --tenant T --role R`; (cert, key).
    pub fn operator(&self, name: &str, tenant: &str, role: &str) -> (PathBuf, PathBuf) {
        self.issue_operator(name, tenant, role, &[]);
        (
            self.dir.join("operators").join(format!("{name}.pem")),
            self.dir.join("operators").join(format!("{name}-key.pem")),
        )
    }

    /// `ca issue-operator NAME --tenant T --role R --token`: the token it
    /// printed (for the web dashboard).
    pub fn operator_token(&self, name: &str, tenant: &str, role: &str) -> String {
        let o = self.issue_operator(name, tenant, role, &["--token"]);
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .find_map(|l| l.strip_prefix("token "))
            .unwrap_or_else(|| panic!("no token printed for {name}"))
            .to_string()
    }

    /// Agent-side TLS files from a (cert, key) pair this CA issued.
    pub fn agent_tls(&self, cert: (PathBuf, PathBuf)) -> AgentTls {
        AgentTls {
            cert: cert.0,
            key: cert.1,
            ca: self.ca_pem(),
        }
    }

    /// `ca revoke NAME`.
    pub fn revoke(&self, name: &str) -> Output {
        ca_cmd(&["revoke", name, "--dir", &self.dir.display().to_string()])
    }
}

/// Start a controller on `listen` (`127.0.0.1:0` for any port) with its
/// store in `data`; wait until it listens. Ping interval 1 s, so dead
/// links are noticed within seconds in tests.
pub fn start_controller(data: &Path, listen: &str) -> Controller {
    start_controller_with(data, listen, None, &[])
}

/// [`start_controller`] (plaintext) with `serve_args` added.
pub fn start_controller_args(data: &Path, listen: &str, serve_args: &[&str]) -> Controller {
    start_controller_with(data, listen, None, serve_args)
}

/// [`start_controller`] with mTLS: `serve --tls-dir`, and `ctl` calls it
/// over `https://` with the given operator credentials.
pub fn start_controller_tls(data: &Path, listen: &str, tls: ControllerTls) -> Controller {
    start_controller_with(data, listen, Some(tls), &[])
}

/// A new CA in `dir/ca`, an operator `admin` (tenant `default`, role
/// admin) whose credentials `ctl` uses, and a controller in `dir/ctl`
/// serving that CA over mTLS with `serve_args` added.
pub fn start_mtls(dir: &Path, admin: &str, serve_args: &[&str]) -> (Ca, Controller) {
    let ca = Ca::init(&dir.join("ca"));
    let operator = ca.operator(admin, "default", "admin");
    let c = start_controller_tls(
        &dir.join("ctl"),
        "127.0.0.1:0",
        ControllerTls {
            dir: ca.dir.clone(),
            operator,
            serve_args: serve_args.iter().map(|s| s.to_string()).collect(),
        },
    );
    (ca, c)
}

fn start_controller_with(
    data: &Path,
    listen: &str,
    tls: Option<ControllerTls>,
    serve_args: &[&str],
) -> Controller {
    std::fs::create_dir_all(data).expect("controller data dir");
    let addr_file = data.join("listen.addr");
    let _ = std::fs::remove_file(&addr_file);
    let log = std::fs::File::create(data.join("controller.log")).expect("log file");
    let mut cmd = Command::new(bin("baton-controller"));
    cmd.args(["serve", "--ping-interval", "1s", "--listen", listen]);
    match &tls {
        None => {
            cmd.arg("--insecure");
        }
        Some(t) => {
            cmd.arg("--tls-dir").arg(&t.dir).args(&t.serve_args);
        }
    }
    cmd.args(serve_args);
    let proc = cmd
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
        url: format!("{}://{addr}", if tls.is_some() { "https" } else { "http" }),
        addr,
        tls,
        serve_args: serve_args.iter().map(|s| s.to_string()).collect(),
    }
}

impl Controller {
    /// The dashboard's address (`serve --http`), from `DATA/http.addr`.
    pub fn http_addr(&self) -> String {
        std::fs::read_to_string(self.data.join("http.addr"))
            .map(|s| s.trim().to_string())
            .expect("http.addr: was the controller started with --http?")
    }

    /// Run an operator subcommand as another operator (cert, key) of the
    /// controller's CA.
    pub fn ctl_as(&self, operator: &(PathBuf, PathBuf), args: &[&str]) -> Output {
        let t = self.tls.as_ref().expect("ctl_as needs a TLS controller");
        let mut cmd = Command::new(bin("baton-controller"));
        cmd.args(args)
            .args(["--controller", &self.url])
            .arg("--cert")
            .arg(&operator.0)
            .arg("--key")
            .arg(&operator.1)
            .arg("--ca")
            .arg(t.dir.join("ca.pem"));
        run(&mut cmd, Duration::from_secs(60))
    }

    /// Run an operator subcommand against this controller (over mTLS as
    /// its admin operator, or plaintext).
    pub fn ctl(&self, args: &[&str]) -> Output {
        if let Some(t) = &self.tls {
            return self.ctl_as(&t.operator, args);
        }
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
        let args: Vec<&str> = self.serve_args.iter().map(String::as_str).collect();
        let next = start_controller_with(&self.data, &self.addr, self.tls.clone(), &args);
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

    /// Whether agent `id` is connected now. Over TLS the operator sees
    /// only agents of its tenant's packs, so this reads the controller's
    /// log (its last line about the agent's stream).
    pub fn connected(&self, id: &str) -> bool {
        if self.tls.is_some() {
            let needle = format!("agent={id}");
            return self
                .log()
                .lines()
                .rfind(|l| {
                    l.contains(&needle)
                        && (l.contains("agent connected") || l.contains("link stream ended"))
                })
                .is_some_and(|l| l.contains("agent connected"));
        }
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
    tls: Option<AgentTls>,
    extra: Vec<String>,
}

/// An agent's certificate, key and CA (`--cert`, `--key`, `--ca`).
#[derive(Debug, Clone)]
pub struct AgentTls {
    /// Certificate.
    pub cert: PathBuf,
    /// Key.
    pub key: PathBuf,
    /// CA.
    pub ca: PathBuf,
}

/// Start agent `id` in `dir` (journal in `dir/data`, sim GPIO log
/// `dir/gpio.jsonl`, log `dir/agent.log`) dialling `url`, with `labels`
/// as `k=v`.
pub fn start_agent(dir: &Path, id: &str, url: &str, labels: &[&str]) -> Agent {
    let labels: Vec<String> = labels.iter().map(|s| s.to_string()).collect();
    spawn_agent(dir, id, url, &labels, None, &[])
}

/// [`start_agent`] (plaintext) with more `run` flags; with
/// `--system-clock` among them (e.g. `untrusted`: the agent must sync
/// through the link, NTP or PTP) instead of the default `reference`.
pub fn start_agent_clock(dir: &Path, id: &str, url: &str, clock_args: &[&str]) -> Agent {
    let args: Vec<String> = clock_args.iter().map(|s| s.to_string()).collect();
    spawn_agent(dir, id, url, &[], None, &args)
}

/// [`start_agent`] over mTLS (`url` is `https://`).
pub fn start_agent_tls(dir: &Path, id: &str, url: &str, labels: &[&str], tls: AgentTls) -> Agent {
    start_agent_tls_with(dir, id, url, labels, tls, &[])
}

/// Agent `id` in `dir/id` with a certificate of its own from `ca` (no
/// tenant named: it serves `default`), on the mTLS controller at `url`.
pub fn start_certified_agent(dir: &Path, ca: &Ca, url: &str, id: &str) -> Agent {
    start_agent_tls(&dir.join(id), id, url, &[], ca.agent_tls(ca.agent(id, &[])))
}

/// [`start_agent_tls`] with more `baton-agent run` flags (e.g. `--config`).
pub fn start_agent_tls_with(
    dir: &Path,
    id: &str,
    url: &str,
    labels: &[&str],
    tls: AgentTls,
    extra: &[&str],
) -> Agent {
    let labels: Vec<String> = labels.iter().map(|s| s.to_string()).collect();
    let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    spawn_agent(dir, id, url, &labels, Some(tls), &extra)
}

fn spawn_agent(
    dir: &Path,
    id: &str,
    url: &str,
    labels: &[String],
    tls: Option<AgentTls>,
    extra: &[String],
) -> Agent {
    std::fs::create_dir_all(dir).expect("agent dir");
    let data = dir.join("data");
    let gpio = dir.join("gpio.jsonl");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("agent.log"))
        .expect("agent log");
    let mut cmd = Command::new(bin("baton-agent"));
    // One host: its clock is the controller's, reference time. The clock
    // tests start agents that must sync (`--system-clock untrusted`).
    cmd.args(["run", "--no-rt", "--id", id, "--controller", url]);
    if !extra.iter().any(|a| a == "--system-clock") {
        cmd.args(["--system-clock", "reference"]);
    }
    match &tls {
        None => {
            cmd.arg("--insecure");
        }
        Some(t) => {
            cmd.arg("--cert")
                .arg(&t.cert)
                .arg("--key")
                .arg(&t.key)
                .arg("--ca")
                .arg(&t.ca);
        }
    }
    cmd.arg("--data")
        .arg(&data)
        .arg("--gpio")
        .arg(format!("sim:{}", gpio.display()));
    for l in labels {
        cmd.args(["--label", l]);
    }
    cmd.args(extra);
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
        tls,
        extra: extra.to_vec(),
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
        let next = spawn_agent(
            &dir,
            &self.id,
            &self.url,
            &self.labels,
            self.tls.clone(),
            &self.extra,
        );
        *self = next;
    }

    /// The agent's log so far.
    pub fn log(&self) -> String {
        let dir = self.data.parent().expect("agent dir");
        std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default()
    }

    /// The sim GPIO writes so far, parsed.
    pub fn writes(&self) -> Vec<serde_json::Value> {
        crate::local::sim_lines(&self.gpio)
    }
}
