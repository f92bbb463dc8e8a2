//! The control loop's test rig: a manual clock, the in-memory device over
//! the sim GPIO backend, a real journal in a temp dir and a real exec pool.
#![allow(dead_code)] // each test binary uses its own part of the rig

pub mod fake;
pub mod update_site;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_agent::config::{self, AgentConfig, ConfigFile, Overrides};
use baton_agent::dispatcher::{Credits, DispatchError, Done, Job};
use baton_agent::exec::ExecPool;
use baton_agent::runtime::admission::Verdict;
use baton_agent::runtime::ports::{Clock, Device, DirectDevice, ManualClock};
use baton_agent::runtime::safety::SafeTable;
use baton_agent::runtime::{Agent, Parts};
use baton_gpio::Allowlist;
use baton_gpio::sim::SimGpio;
use baton_journal::{Journal, JournalConfig};
use baton_proto::{RefTime, parse_pack};

pub const T0: i64 = 1_796_000_000_000_000_000;

pub struct Rig {
    pub _dir: tempfile::TempDir,
    pub data: PathBuf,
    pub log: PathBuf,
    pub clock: Arc<ManualClock>,
    pub agent: Agent,
}

pub fn t(ms: i64) -> RefTime {
    RefTime::from_nanos(T0 + ms * 1_000_000)
}

/// The rig's configuration (agent `t`, journal in `dir/data`, sim GPIO
/// logging to `dir/gpio.jsonl`), over `file` and `o`.
pub fn config(dir: &Path, file: ConfigFile, o: Overrides) -> AgentConfig {
    config::resolve(
        file,
        Overrides {
            id: Some("t".into()),
            data_dir: Some(dir.join("data")),
            gpio: Some(format!("sim:{}", dir.join("gpio.jsonl").display())),
            no_rt: true,
            ..o
        },
    )
    .expect("config")
}

pub fn build(dir: &Path, clock: Arc<ManualClock>) -> Agent {
    build_with(
        dir,
        clock,
        config(dir, ConfigFile::default(), Overrides::default()),
    )
}

/// An agent of `cfg` (see [`config`]) on `clock`.
pub fn build_with(dir: &Path, clock: Arc<ManualClock>, cfg: AgentConfig) -> Agent {
    build_with_device(dir, clock, cfg, |d| Box::new(d))
}

/// A test's device double: each job goes to `answer` first, which either
/// answers it (`Some`: the job goes no further: a failed hand-over, a
/// call that never returns) or lets it through (`None`) to the in-memory
/// device, which serves every other call.
pub struct Intercept<F> {
    pub inner: DirectDevice,
    pub answer: F,
}

impl<F> Device for Intercept<F>
where
    F: FnMut(&Job) -> Option<Result<(), DispatchError>> + Send,
{
    fn credits(&self) -> &Credits {
        self.inner.credits()
    }
    fn submit(&mut self, job: Job) -> Result<(), DispatchError> {
        match (self.answer)(&job) {
            Some(answer) => answer,
            None => self.inner.submit(job),
        }
    }
    fn wake(&mut self) {
        self.inner.wake()
    }
    fn try_done(&mut self) -> Option<Done> {
        self.inner.try_done()
    }
    fn request_lines(
        &mut self,
        lines: &[(baton_proto::pack::LineRef, baton_gpio::Direction)],
    ) -> Result<Vec<baton_gpio::LineHandle>, DispatchError> {
        self.inner.request_lines(lines)
    }
    fn stop(&mut self, timeout: Duration) -> bool {
        self.inner.stop(timeout)
    }
}

/// [`build_with`], its in-memory device wrapped by `wrap` (a test's
/// double that fails or stalls some jobs).
pub fn build_with_device(
    dir: &Path,
    clock: Arc<ManualClock>,
    cfg: AgentConfig,
    wrap: impl FnOnce(DirectDevice) -> Box<dyn Device>,
) -> Agent {
    let data = dir.join("data");
    let log = dir.join("gpio.jsonl");
    let jcfg = JournalConfig {
        outbox_cap: cfg.outbox_cap,
        ..JournalConfig::new(&data)
    };
    let (journal, recovered) = Journal::open(jcfg).expect("journal");
    let gpio = SimGpio::open(&log, Allowlist::all()).expect("sim");
    let device = DirectDevice::new(Box::new(gpio), clock.clone());
    let (tx, exec_rx) = std::sync::mpsc::channel();
    let exec = ExecPool::new(1, cfg.exec_allowlist.clone(), tx, Arc::new(|| {}));
    Agent::new(
        cfg,
        Parts {
            clock,
            journal,
            recovered,
            device: wrap(device),
            exec,
            exec_rx,
            safe_table: Arc::new(Mutex::new(SafeTable::default())),
            ledger: Some(dir.join("dispatch.ledger")),
            safe_driver: None,
        },
    )
    .expect("agent")
}

pub fn rig() -> Rig {
    rig_with(ConfigFile::default(), Overrides::default())
}

/// A rig whose agent's configuration adds `file` and `o`.
pub fn rig_with(file: ConfigFile, o: Overrides) -> Rig {
    rig_with_clock(file, o, ManualClock::new(t(0)))
}

/// [`rig_with`] on a clock of the test's making.
#[allow(dead_code)]
pub fn rig_with_clock(file: ConfigFile, o: Overrides, clock: ManualClock) -> Rig {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(clock);
    let cfg = config(dir.path(), file, o);
    let agent = build_with(dir.path(), clock.clone(), cfg);
    Rig {
        data: dir.path().join("data"),
        log: dir.path().join("gpio.jsonl"),
        _dir: dir,
        clock,
        agent,
    }
}

impl Rig {
    pub fn accept(&mut self, yaml: &str) -> anyhow::Result<Verdict> {
        let pack = parse_pack(yaml).map_err(|e| anyhow::anyhow!("{}", e.render("pack")))?;
        Ok(self.agent.accept(yaml.to_string(), pack)?)
    }

    /// Step every `every` until `until` (simulated).
    pub fn run_until(&mut self, until: RefTime, every: Duration) {
        while self.clock.now() < until {
            self.agent.step().expect("step");
            self.clock.advance(every);
        }
        self.agent.step().expect("step");
    }

    pub fn writes(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("json"))
            .collect()
    }

    pub fn level(&self, line: i64) -> Option<i64> {
        self.writes()
            .iter()
            .rev()
            .find(|w| w["line"] == line)
            .and_then(|w| w["value"].as_i64())
    }
}

pub fn pack(id: &str, version: u64, body: &str) -> String {
    format!("pack: {id}\nversion: {version}\n{body}")
}
