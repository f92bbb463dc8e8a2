//! An agent update end to end on the box, with the real binary: started
//! by `launch` from a "packaged" copy, linked to a fake controller (in
//! this process) that pushes a pack, offers a release and serves its
//! pieces. The release is the same build stamped with another version
//! (`baton_agent::version::stamp`: what a release pipeline does; a second
//! compile would cost the suite a full build), or a build that exits at
//! start.
//!
//! What is checked: the box downloads, installs and restarts into the new
//! version at a quiet moment in the same process (its PID, now running
//! the installed binary), whose Hello reports the new version and the
//! pack held, and which settles once welcomed; a build that exits at start
//! is rolled back at the next start and the Hello says so; across each
//! restart the pack's line is driven to its safe state, and no occurrence
//! fires twice (feedback, deduplicated by seq, against the sim GPIO log).
//! Not here: the controller's side (upload, rollout, gates) — a fake
//! stands in for it.

mod rig;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

use baton_proto::wire::agent_message::Body as A;
use baton_proto::wire::controller_message::Body as C;
use baton_proto::wire::update_state::Phase;
use baton_proto::wire::{self, ControllerMessage};
use baton_trust::{SignedList, SigningKey, TrustList};
use rig::fake::{Ev, Fake, ToAgent, fake};

const AGENT: &str = env!("CARGO_BIN_EXE_baton-agent");
const PATIENCE: Duration = Duration::from_secs(60);

const TICK: &str = "pack: tick\nversion: 1\nsafe_state:\n  - {action: gpio.write, params: {line: 7, value: 0}}\ninstructions:\n  - {id: on, action: gpio.write, params: {line: 7, value: 1}, every: 400ms}\n";

fn msg(body: C) -> ControllerMessage {
    ControllerMessage { body: Some(body) }
}

/// A box: a packaged agent, its trust naming a release key, its config.
struct Site {
    dir: tempfile::TempDir,
    release_key: SigningKey,
    fake: Fake,
}

impl Site {
    fn new() -> Site {
        let dir = tempfile::tempdir().expect("tmp");
        let d = dir.path();
        std::fs::create_dir_all(d.join("bin")).expect("mkdir");
        std::fs::copy(AGENT, d.join("bin/baton-agent")).expect("packaged copy");
        let release_key = SigningKey::generate().expect("key");
        let root = SigningKey::generate().expect("root");
        std::fs::create_dir_all(d.join("trust")).expect("mkdir");
        std::fs::write(d.join("trust/root.pub"), root.public().to_base64()).expect("root.pub");
        let list = TrustList {
            version: 1,
            expires_ns: i64::MAX,
            next_root: None,
            tenants: [("default".to_string(), Default::default())]
                .into_iter()
                .collect(),
            release_keys: vec![release_key.public()],
        };
        std::fs::write(
            d.join("trust/trust.json"),
            serde_json::to_string(&[SignedList::sign(&list, &root)]).expect("json"),
        )
        .expect("trust.json");
        let fake = fake();
        std::fs::write(
            d.join("agent.yaml"),
            format!(
                "id: box\ndata-dir: {data}\ngpio: sim:{gpio}\ncontroller: http://{addr}\ninsecure: true\ntrust-dir: {trust}\nupdate: {{download-rate: 33554432, quiet-margin: 100ms}}\n",
                data = d.join("data").display(),
                gpio = d.join("gpio.jsonl").display(),
                addr = fake.addr,
                trust = d.join("trust").display(),
            ),
        )
        .expect("config");
        Site {
            dir,
            release_key,
            fake,
        }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    /// `launch`, as systemd starts it.
    fn launch(&self) -> Agent {
        Agent(
            Command::new(self.path("bin/baton-agent"))
                .arg("launch")
                .arg("--config")
                .arg(self.path("agent.yaml"))
                .args(["--system-clock", "reference", "--no-rt", "--quiet"])
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("spawn"),
        )
    }

    fn offer(&self, version: &str, bin: &[u8]) -> ControllerMessage {
        let m = baton_trust::ReleaseManifest::of(version, std::env::consts::ARCH, bin)
            .expect("manifest");
        let s = baton_trust::SignedRelease::sign(&m, &self.release_key);
        msg(C::ReleaseOffer(wire::ReleaseOffer {
            manifest: s.body,
            key: s.key.to_string(),
            signature: s.signature.to_base64(),
        }))
    }

    fn state(&self) -> Option<baton_update::BootState> {
        baton_update::Versions::of_data_dir(&self.path("data"))
            .read_state()
            .expect("state")
    }

    /// Line 7's writes, in order.
    fn writes(&self) -> Vec<i64> {
        std::fs::read_to_string(self.path("gpio.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("json"))
            .filter(|w| w["line"] == 7)
            .filter_map(|w| w["value"].as_i64())
            .collect()
    }
}

/// The fake controller's side of one run: each stream welcomed, feedback
/// acknowledged and kept by seq, release pieces served from `release`.
struct Controller {
    tx: Option<ToAgent>,
    stream: u64,
    feedback: BTreeMap<u64, wire::Feedback>,
    release: Vec<u8>,
}

/// What the test waits for.
enum Seen {
    Hello(Box<wire::Hello>),
    Update(wire::UpdateState),
    Feedback,
    Closed,
}

impl Controller {
    fn new(release: Vec<u8>) -> Controller {
        Controller {
            tx: None,
            stream: 0,
            feedback: BTreeMap::new(),
            release,
        }
    }

    fn send(&self, m: ControllerMessage) {
        self.tx
            .as_ref()
            .expect("a stream")
            .try_send(Ok(m))
            .expect("room towards the agent");
    }

    /// Handles what comes until something the test waits for.
    fn next(&mut self, fake: &Fake) -> Seen {
        let end = Instant::now() + PATIENCE;
        loop {
            assert!(
                Instant::now() < end,
                "nothing awaited from the agent within {PATIENCE:?}; feedback so far: {:?}",
                self.feedback
                    .values()
                    .map(|f| (&f.event, &f.instruction, f.outcome))
                    .collect::<Vec<_>>()
            );
            let ev = match fake.events.recv_timeout(Duration::from_millis(100)) {
                Ok(ev) => ev,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => panic!("the fake controller is gone"),
            };
            match ev {
                Ev::Opened { stream, tx } => {
                    self.stream = stream;
                    self.tx = Some(tx);
                }
                Ev::Closed { stream } if stream == self.stream => return Seen::Closed,
                Ev::Msg { stream, msg: m } if stream == self.stream => match m.body {
                    Some(A::Hello(h)) => {
                        self.send(msg_welcome());
                        return Seen::Hello(Box::new(h));
                    }
                    Some(A::Feedback(b)) => {
                        let last = b.entries.iter().map(|e| e.seq).max().unwrap_or(0);
                        for e in b.entries {
                            self.feedback.insert(e.seq, e);
                        }
                        self.send(msg(C::FeedbackAck(wire::FeedbackAck { seq: last })));
                        return Seen::Feedback;
                    }
                    Some(A::ReleaseRequest(r)) => {
                        let from = r.offset as usize;
                        let to = (from + r.length as usize).min(self.release.len());
                        self.send(msg(C::ReleaseChunk(wire::ReleaseChunk {
                            version: r.version,
                            offset: r.offset,
                            data: self.release[from..to].to_vec(),
                        })));
                    }
                    Some(A::UpdateState(u)) => return Seen::Update(u),
                    _ => {}
                },
                _ => {}
            }
        }
    }

    fn hello(&mut self, fake: &Fake) -> wire::Hello {
        loop {
            if let Seen::Hello(h) = self.next(fake) {
                return *h;
            }
        }
    }

    fn update(&mut self, fake: &Fake, phase: Phase) -> wire::UpdateState {
        loop {
            match self.next(fake) {
                Seen::Update(u) if u.phase == phase as i32 => return u,
                Seen::Update(u) if u.phase == Phase::Refused as i32 => panic!("refused: {u:?}"),
                _ => {}
            }
        }
    }

    /// Feedback of line 7's successful firings: each occurrence once.
    fn fired(&self) -> Vec<i64> {
        let ok: Vec<i64> = self
            .feedback
            .values()
            .filter(|f| f.instruction == "on" && f.outcome == wire::Outcome::Ok as i32)
            .map(|f| f.occurrence_ns)
            .collect();
        let unique: BTreeSet<i64> = ok.iter().copied().collect();
        assert_eq!(unique.len(), ok.len(), "an occurrence fired twice: {ok:?}");
        ok
    }

    /// Waits until `n` firings are in feedback.
    fn until_fired(&mut self, fake: &Fake, n: usize) {
        while self.fired().len() < n {
            let _ = self.next(fake);
        }
    }
}

fn msg_welcome() -> ControllerMessage {
    msg(C::Welcome(wire::Welcome {
        session_gen: 0,
        agent_id: "box".into(),
        feedback_acked_seq: 0,
        controller_time_ns: 0,
        ping_interval_ms: 0,
    }))
}

fn push_tick(c: &Controller) {
    c.send(msg(C::PackPush(wire::PackPush {
        session_gen: 0,
        pack: Some(wire::PackRef {
            tenant: "default".into(),
            pack: "tick".into(),
            version: 1,
        }),
        yaml: TICK.into(),
        ..Default::default()
    })));
}

fn exe_of(pid: u32) -> PathBuf {
    std::fs::read_link(format!("/proc/{pid}/exe")).expect("exe")
}

/// The agent's process: killed if the test ends before it stops it.
struct Agent(Child);

impl Agent {
    fn id(&self) -> u32 {
        self.0.id()
    }

    fn wait(&mut self) -> std::process::ExitStatus {
        self.0.wait().expect("wait")
    }

    /// SIGTERM: its way out, as systemd stops it.
    fn stop(mut self) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.0.id()).expect("pid"));
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.0.wait();
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn held(h: &wire::Hello) -> Vec<(String, u64)> {
    h.packs
        .iter()
        .filter_map(|p| p.pack.as_ref().map(|r| (r.pack.clone(), r.version)))
        .collect()
}

/// The box restarts into a new version in the same process, at a quiet
/// moment, its pack held and still firing, nothing twice; the new version
/// is settled once welcomed.
#[test]
fn a_new_version_is_installed_and_restarted_into_with_its_pack_and_nothing_twice() {
    let site = Site::new();
    let release = baton_agent::version::stamp(&std::fs::read(AGENT).expect("agent"), "9.9.9")
        .expect("one slot");
    let mut c = Controller::new(release.clone());
    let child = site.launch();
    let pid = child.id();
    let hello = c.hello(&site.fake);
    assert_eq!(hello.agent_version, env!("CARGO_PKG_VERSION"));
    push_tick(&c);
    c.until_fired(&site.fake, 3);
    c.send(site.offer("9.9.9", &release));
    c.update(&site.fake, Phase::Installed);
    // The way out, then the launcher, then the new version's hello.
    let hello = c.hello(&site.fake);
    assert_eq!(hello.agent_version, "9.9.9");
    assert_eq!(held(&hello), vec![("tick".to_string(), 1)]);
    assert_eq!(
        exe_of(pid),
        site.path("data/agent-versions/9.9.9/baton-agent"),
        "the same process, now the installed binary"
    );
    // Settled once welcomed; firing on.
    let before = c.fired().len();
    c.until_fired(&site.fake, before + 3);
    let end = Instant::now() + PATIENCE;
    while site.state().and_then(|s| s.settled).as_deref() != Some("9.9.9") {
        assert!(Instant::now() < end, "not settled: {:?}", site.state());
        let _ = c.next(&site.fake);
    }
    child.stop();
    // The line was driven to its safe state at the restart (a 0 between
    // the two runs' firings), and the log holds one write of 1 per
    // firing the feedback reports.
    let writes = site.writes();
    let ones = writes.iter().filter(|&&v| v == 1).count();
    assert!(writes.windows(2).any(|w| w == [0, 1]), "{writes:?}");
    assert_eq!(ones, c.fired().len(), "sim log against feedback");
}

/// A build that exits at start runs once; the next start (systemd's)
/// rolls it back to the packaged agent, whose hello says so; the pack
/// runs on, nothing twice.
#[test]
fn a_build_that_exits_at_start_is_rolled_back_and_the_hello_says_so() {
    let site = Site::new();
    let broken = b"#!/bin/sh\necho 'this build cannot start' >&2\nexit 1\n".to_vec();
    let mut c = Controller::new(broken.clone());
    let mut child = site.launch();
    c.hello(&site.fake);
    push_tick(&c);
    c.until_fired(&site.fake, 2);
    c.send(site.offer("9.9.9", &broken));
    c.update(&site.fake, Phase::Installed);
    let status = child.wait();
    assert_eq!(
        status.code(),
        Some(1),
        "the broken build ran, in the same process"
    );
    // systemd's Restart=on-failure: launch again.
    let child = site.launch();
    let hello = c.hello(&site.fake);
    assert_eq!(hello.agent_version, env!("CARGO_PKG_VERSION"));
    let u = hello.update.clone().expect("the rollback said");
    assert_eq!(
        (u.version.as_str(), u.phase),
        ("9.9.9", Phase::RolledBack as i32)
    );
    assert!(
        u.reason.contains("rolled back to the packaged agent"),
        "{}",
        u.reason
    );
    assert_eq!(held(&hello), vec![("tick".to_string(), 1)]);
    let before = c.fired().len();
    c.until_fired(&site.fake, before + 2);
    child.stop();
    let s = site.state().expect("state");
    assert_eq!((s.trial, s.settled), (None, None));
    let ones = site.writes().iter().filter(|&&v| v == 1).count();
    assert_eq!(ones, c.fired().len(), "sim log against feedback");
}
