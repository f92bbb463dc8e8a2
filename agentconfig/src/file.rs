//! The configuration file as written: its YAML schema (kebab-case keys,
//! unknown keys refused) and its decoding, with each error at a position.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use baton_proto::yaml::{self, Limits};
use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

use super::ConfigError;

/// The file as written. Keys are kebab-case; unknown keys are errors.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ConfigFile {
    /// Agent id (default: the host name).
    pub id: Option<String>,
    /// Directory of the journal (default: ./baton-data).
    pub data_dir: Option<PathBuf>,
    /// GPIO backend: `cdev` (default), `sysfs`, or `sim:FILE`.
    pub gpio: Option<String>,
    /// Lines packs may touch, e.g. `gpiochip0:17`, `RELAY_MAIN`. Absent:
    /// every line (only sensible on the sim backend).
    pub allowed_lines: Option<Vec<String>>,
    /// Programs `exec` may run (absolute paths), each a plain path or
    /// `{program: PATH, env: [KEY, ...]}` with the environment keys a pack
    /// may set for it (none otherwise).
    #[serde(default)]
    pub exec_allowlist: Vec<ExecAllowEntry>,
    /// Packs loaded at start, before any controller link.
    #[serde(default)]
    pub packs: Vec<PathBuf>,
    /// Dispatcher real-time settings.
    #[serde(default)]
    pub realtime: RealtimeFile,
    /// How far ahead one pass journals firings and hands them to the
    /// dispatcher (default 150ms): under a dense load the firings of one
    /// horizon share one fdatasync. Smaller means fewer firings a power cut
    /// can leave `outcome unknown`, at more fsyncs (CPU, flash writes);
    /// feedback is collected every 50 ms whatever the horizon.
    pub arm_horizon: Option<String>,
    /// How long before a firing the pass that arms it starts (default
    /// 20ms, or half the horizon if less; at most the horizon): its
    /// journal write and fsync must fit in it. A disk whose fdatasync takes
    /// longer (an SD card) needs more, or the first firing of each pass
    /// arrives late.
    pub arm_lead: Option<String>,
    /// Where the dispatch ledger lives: the file the dispatcher marks each
    /// armed firing in as it runs it, so that after a `kill -9` every
    /// armed firing is known to have run or not. Default: in `/dev/shm`
    /// (named after the data directory), else in the data directory. Keep
    /// it on a tmpfs: stores into a mapped disk file can fault and wait on
    /// the disk on the real-time path.
    pub ledger: Option<PathBuf>,
    /// Feedback kept for the controller before the oldest is dropped (and
    /// counted). Default 100 000.
    pub outbox_cap: Option<usize>,
    /// Worker threads for `exec` (default 2).
    pub exec_workers: Option<usize>,
    /// The controller to dial: `https://HOST:PORT` (mTLS, with `cert`,
    /// `key` and `ca`), or `http://HOST:PORT` (plaintext, only with
    /// `insecure: true`); or a list of them, `[URL, URL, ...]` (replicas:
    /// on the loss of one the agent dials the next, and every address a
    /// name resolves to). All of one scheme. Absent: no link; the agent
    /// runs the packs it has on its own.
    #[serde(default, deserialize_with = "one_or_many")]
    pub controller: Option<Vec<String>>,
    /// Allow a plaintext (`http://`) controller link. Default false.
    pub insecure: Option<bool>,
    /// Allow that plaintext link toward a non-loopback controller too.
    pub insecure_any: Option<bool>,
    /// This agent's certificate (PEM, made by `baton-controller ca
    /// issue-agent`); its name is the agent's identity on the link.
    pub cert: Option<PathBuf>,
    /// Its private key (PEM).
    pub key: Option<PathBuf>,
    /// The fleet's CA certificate (PEM), which signed the controller's.
    pub ca: Option<PathBuf>,
    /// Labels the controller picks agents by (`targets: {labels: ..}`).
    /// Values may be written unquoted (`line: 3`); they are kept as text.
    #[serde(default)]
    pub labels: BTreeMap<String, serde_json::Value>,
    /// Most packs held at once; a push beyond it is refused as "resource
    /// exhausted" (the controller retries later). Default 256.
    pub max_packs: Option<usize>,
    /// Clock sources and the admission limit.
    #[serde(default)]
    pub clock: ClockFile,
    /// Log output on stderr: `auto` (default: `journald` when stderr is
    /// the journal, else `text`), `text`, `json` (one object per line) or
    /// `journald` (plain lines with a `<N>` priority prefix).
    pub log_format: Option<String>,
    /// Serve Prometheus metrics on `HOST:PORT` (`/metrics`, plaintext and
    /// unauthenticated; read-only). Default: none.
    pub metrics: Option<String>,
    /// Where the fleet's trust lives (`/etc/baton/trust`): `root.pub`, the
    /// root's public key (base64), installed with the agent; `trust.json`,
    /// the chain of root-signed trust lists. With it, a pack runs only if
    /// it passes the newest list (signed by one of its tenant's keys where
    /// the tenant requires it). Default: none (packs are not checked for
    /// signatures).
    pub trust_dir: Option<PathBuf>,
    /// Agent updates (`download-rate`, `quiet-margin`, `confirm-within`).
    #[serde(default)]
    pub update: crate::update::UpdateFile,
}

/// `clock:` section (docs/design.md "Clock sources, best first").
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ClockFile {
    /// Largest uncertainty at which packs that need absolute time (`at`,
    /// `cron`) are accepted (default 10ms).
    pub limit: Option<String>,
    /// `kernel` (default): the system clock is a source whose quality the
    /// kernel reports (`adjtimex`: synchronised by chrony, ptp4l + phc2sys,
    /// timesyncd... or not). `reference`: the operator asserts the system
    /// clock *is* reference time (a box whose clock is disciplined by means
    /// the kernel does not know of, a test rig). `untrusted`: never a
    /// source, only PTP, NTP or the link count.
    pub system: Option<String>,
    /// PTP slave (statime).
    pub ptp: Option<PtpFile>,
    /// NTP servers, `HOST[:PORT]`.
    #[serde(default)]
    pub ntp_servers: Vec<String>,
    /// Time exchange with the controller over the link (default true when
    /// a controller is set).
    pub link: Option<bool>,
}

/// `clock.ptp:` section.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct PtpFile {
    /// Network interface to listen on.
    pub interface: String,
    /// PTP domain (default 0). The PTP source steers a virtual clock of
    /// the agent's own; it never steers the system clock (there is no
    /// option for it: one that always refused was removed, issue 37).
    #[serde(default)]
    pub domain: u8,
}

/// One `exec-allowlist` entry: `/usr/bin/x`, or
/// `{program: /usr/bin/x, env: [KEY1, KEY2]}`.
///
/// A key listed in `env` lets a pack choose its value for that program:
/// never list keys that name code to run (`PATH`, `BASH_ENV`, `ENV`,
/// `PYTHONPATH`, `PERL5OPT`, `NODE_OPTIONS`, ...). `LD_*` and `BATON_*` keys
/// are refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecAllowEntry {
    /// Absolute path, matched byte for byte.
    pub program: String,
    /// Environment keys a pack may set for it.
    pub env: Vec<String>,
}

/// The map form of [`ExecAllowEntry`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct ExecAllowMap {
    program: String,
    #[serde(default)]
    env: Vec<String>,
}

impl<'de> Deserialize<'de> for ExecAllowEntry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct EntryVisitor;
        impl<'de> Visitor<'de> for EntryVisitor {
            type Value = ExecAllowEntry;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a program path, or {program: PATH, env: [KEY, ...]}")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
                Ok(ExecAllowEntry {
                    program: s.to_owned(),
                    env: Vec::new(),
                })
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                // Derived, so unknown keys are refused by name.
                let m = ExecAllowMap::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(ExecAllowEntry {
                    program: m.program,
                    env: m.env,
                })
            }
        }
        d.deserialize_any(EntryVisitor)
    }
}

/// `controller: URL` or `controller: [URL, ...]` (the single form is what
/// configurations before failover have).
fn one_or_many<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Option<Vec<String>>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a controller URL, or a list of them")
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
            Ok(Some(vec![s.to_owned()]))
        }
        fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut urls = Vec::new();
            while let Some(u) = seq.next_element::<String>()? {
                urls.push(u);
            }
            Ok(Some(urls))
        }
    }
    d.deserialize_any(V)
}

/// `realtime:` section.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RealtimeFile {
    /// SCHED_FIFO priority, 1..=99 (default 80); 0 disables SCHED_FIFO.
    #[serde(default = "default_priority")]
    pub priority: u8,
    /// CPU to pin the dispatcher to.
    pub cpu: Option<usize>,
    /// Lock memory (default true).
    #[serde(default = "default_true")]
    pub mlockall: bool,
    /// How much of a core the dispatcher may spend spinning just before
    /// deadlines, e.g. `1%` (the default) or `0.5%`: it sleeps until a
    /// margin before each firing and spins the rest, and the margin it
    /// learns from its wake-up latencies is the largest that keeps the
    /// spinning within this at the rate firings come. More: more firings
    /// exactly on their instant; `0%`: no spinning (each firing as late as
    /// its wake-up).
    pub spin_budget: Option<String>,
    /// The slowest CPU idle state to leave while the agent runs: `0us`
    /// (the default: the CPUs poll when idle, so a firing's wake-up costs
    /// the timer and nothing else, as cyclictest measures it), a longer
    /// bound (e.g. `50us`), or `off` (the kernel's idle governor decides:
    /// less power, wake-ups later by each idle state's exit latency).
    pub idle_latency: Option<String>,
}

fn default_priority() -> u8 {
    80
}
fn default_true() -> bool {
    true
}

impl Default for RealtimeFile {
    fn default() -> Self {
        RealtimeFile {
            priority: default_priority(),
            cpu: None,
            mlockall: true,
            spin_budget: None,
            idle_latency: None,
        }
    }
}

/// Read and decode a config file.
pub fn read_file(path: &Path) -> Result<ConfigFile, ConfigError> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|cause| ConfigError::Read {
        path: name.clone(),
        cause,
    })?;
    parse_file(&name, &text)
}

/// Decode config text (`name` is for messages).
pub fn parse_file(name: &str, text: &str) -> Result<ConfigFile, ConfigError> {
    let root = yaml::parse(text, Limits::default()).map_err(|e| ConfigError::At {
        path: name.into(),
        line: e.pos.line,
        col: e.pos.col,
        message: e.message,
    })?;
    serde_json::from_value(yaml::to_json(&root)).map_err(|e| {
        let message = e.to_string();
        // serde names the offending key; find it in the tree for a position.
        let pos = message
            .split('`')
            .nth(1)
            .and_then(|key| yaml::find_key(&root, key))
            .unwrap_or(root.pos);
        ConfigError::At {
            path: name.into(),
            line: pos.line,
            col: pos.col,
            message,
        }
    })
}
