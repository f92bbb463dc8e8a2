//! A box for the update tests and figures: a packaged agent (a copy of
//! the real binary), its trust naming a release key, its configuration,
//! and the fake controller's side of a run (each stream welcomed, feedback
//! acknowledged and kept by seq, release pieces served).

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

use super::fake::{Ev, Fake, ToAgent, fake};

/// The longest any wait may take.
pub const PATIENCE: Duration = Duration::from_secs(120);

pub fn msg(body: C) -> ControllerMessage {
    ControllerMessage { body: Some(body) }
}

/// A box: a packaged agent, its trust naming a release key, its config.
pub struct Site {
    dir: tempfile::TempDir,
    release_key: SigningKey,
    pub fake: Fake,
}

impl Site {
    /// A box whose packaged agent is a copy of `agent`, its
    /// configuration's `update:` section `update`.
    pub fn new(agent: &str, update: &str) -> Site {
        let dir = tempfile::tempdir().expect("tmp");
        let d = dir.path();
        std::fs::create_dir_all(d.join("bin")).expect("mkdir");
        std::fs::copy(agent, d.join("bin/baton-agent")).expect("packaged copy");
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
                "id: box\ndata-dir: {data}\ngpio: sim:{gpio}\ncontroller: http://{addr}\ninsecure: true\ntrust-dir: {trust}\nupdate: {update}\n",
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

    pub fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    /// `launch`, as systemd starts it (without real-time priority).
    pub fn launch(&self) -> Agent {
        self.launch_with(&["--no-rt"])
    }

    /// `launch` with `extra` flags.
    pub fn launch_with(&self, extra: &[&str]) -> Agent {
        self.launch_env(extra, &[])
    }

    /// `launch` with `extra` flags and environment `env`.
    pub fn launch_env(&self, extra: &[&str], env: &[(&str, &std::path::Path)]) -> Agent {
        Agent(
            Command::new(self.path("bin/baton-agent"))
                .envs(env.iter().copied())
                .arg("launch")
                .arg("--config")
                .arg(self.path("agent.yaml"))
                .args(["--system-clock", "reference", "--quiet"])
                .args(extra)
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("spawn"),
        )
    }

    pub fn offer(&self, version: &str, bin: &[u8]) -> ControllerMessage {
        let m = baton_trust::ReleaseManifest::of(version, std::env::consts::ARCH, bin)
            .expect("manifest");
        let s = baton_trust::SignedRelease::sign(&m, &self.release_key);
        msg(C::ReleaseOffer(wire::ReleaseOffer {
            manifest: s.body,
            key: s.key.to_string(),
            signature: s.signature.to_base64(),
        }))
    }

    pub fn state(&self) -> Option<baton_update::BootState> {
        baton_update::Versions::of_data_dir(&self.path("data"))
            .read_state()
            .expect("state")
    }

    /// Line 7's writes, in order.
    pub fn writes(&self) -> Vec<i64> {
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
pub struct Controller {
    tx: Option<ToAgent>,
    stream: u64,
    feedback: BTreeMap<u64, wire::Feedback>,
    release: Vec<u8>,
}

/// What the test waits for.
pub enum Seen {
    Hello(Box<wire::Hello>),
    Update(wire::UpdateState),
    Feedback,
    Closed,
}

impl Controller {
    pub fn new(release: Vec<u8>) -> Controller {
        Controller {
            tx: None,
            stream: 0,
            feedback: BTreeMap::new(),
            release,
        }
    }

    pub fn send(&self, m: ControllerMessage) {
        self.tx
            .as_ref()
            .expect("a stream")
            .try_send(Ok(m))
            .expect("room towards the agent");
    }

    /// Handles what comes until something the test waits for.
    pub fn next(&mut self, fake: &Fake) -> Seen {
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

    pub fn hello(&mut self, fake: &Fake) -> wire::Hello {
        loop {
            if let Seen::Hello(h) = self.next(fake) {
                return *h;
            }
        }
    }

    pub fn update(&mut self, fake: &Fake, phase: Phase) -> wire::UpdateState {
        loop {
            match self.next(fake) {
                Seen::Update(u) if u.phase == phase as i32 => return u,
                Seen::Update(u) if u.phase == Phase::Refused as i32 => panic!("refused: {u:?}"),
                _ => {}
            }
        }
    }

    /// The highest feedback seq kept.
    pub fn last_seq(&self) -> u64 {
        self.feedback.keys().next_back().copied().unwrap_or(0)
    }

    /// The feedback kept with seq in `(after, upto]`.
    pub fn feedback_between(&self, after: u64, upto: u64) -> impl Iterator<Item = &wire::Feedback> {
        self.feedback.range(after + 1..=upto).map(|(_, f)| f)
    }

    /// Feedback of line 7's successful firings: each occurrence once.
    pub fn fired(&self) -> Vec<i64> {
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
    pub fn until_fired(&mut self, fake: &Fake, n: usize) {
        while self.fired().len() < n {
            let _ = self.next(fake);
        }
    }
}

pub fn msg_welcome() -> ControllerMessage {
    msg(C::Welcome(wire::Welcome {
        session_gen: 0,
        agent_id: "box".into(),
        feedback_acked_seq: 0,
        controller_time_ns: 0,
        ping_interval_ms: 0,
    }))
}

/// Pushes `yaml`, pack `id` version `version`.
pub fn push(c: &Controller, id: &str, version: u64, yaml: &str) {
    c.send(msg(C::PackPush(wire::PackPush {
        session_gen: 0,
        pack: Some(wire::PackRef {
            tenant: "default".into(),
            pack: id.into(),
            version,
        }),
        yaml: yaml.into(),
        ..Default::default()
    })));
}

/// Cancels pack `id` version `version`.
pub fn cancel(c: &Controller, id: &str, version: u64) {
    c.send(msg(C::PackCancel(wire::PackCancel {
        session_gen: 0,
        pack: Some(wire::PackRef {
            tenant: "default".into(),
            pack: id.into(),
            version,
        }),
    })));
}

/// The agent's process: killed if the test ends before it stops it.
pub struct Agent(Child);

impl Agent {
    pub fn id(&self) -> u32 {
        self.0.id()
    }

    pub fn wait(&mut self) -> std::process::ExitStatus {
        self.0.wait().expect("wait")
    }

    /// SIGTERM: its way out, as systemd stops it.
    pub fn stop(mut self) {
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

pub fn held(h: &wire::Hello) -> Vec<(String, u64)> {
    h.packs
        .iter()
        .filter_map(|p| p.pack.as_ref().map(|r| (r.pack.clone(), r.version)))
        .collect()
}
