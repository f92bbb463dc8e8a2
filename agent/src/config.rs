//! The agent's configuration: a YAML file (`--config`), every common key
//! also a flag that overrides it, so a test or a new user needs no file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use baton_proto::time::parse_duration;
use baton_proto::yaml::{self, Limits};
use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

use crate::exec::policy::ExecPolicy;
use crate::rt::RtConfig;
pub use baton_clock::settings::{ClockConfig, DEFAULT_CLOCK_LIMIT, PtpConfig, SystemClock};
use baton_gpio::{Allowlist, BackendSpec};

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
    /// dispatcher (default 50ms): under a dense load the firings of one
    /// horizon share one fdatasync. Smaller means fewer firings a crash
    /// can leave `outcome unknown`, at more fsyncs (CPU, flash writes).
    pub arm_horizon: Option<String>,
    /// How long before a firing the pass that arms it starts (default
    /// 2.5ms, or half the horizon if less; at most the horizon): its
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
}

/// `clock:` section (DESIGN.md "Clock sources, best first").
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
    /// PTP domain (default 0).
    #[serde(default)]
    pub domain: u8,
    /// Steer the system clock too (needs CAP_SYS_TIME). Default false: a
    /// virtual clock, the system clock untouched.
    #[serde(default)]
    pub discipline_system_clock: bool,
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
        }
    }
}

/// The effective configuration.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// Agent id.
    pub id: String,
    /// Journal directory.
    pub data_dir: PathBuf,
    /// GPIO backend.
    pub gpio: BackendSpec,
    /// Lines packs may touch.
    pub allowed_lines: Allowlist,
    /// Programs `exec` may run, and the environment keys packs may set for
    /// each (from `exec-allowlist`).
    pub exec_allowlist: ExecPolicy,
    /// Packs to load at start.
    pub packs: Vec<PathBuf>,
    /// Dispatcher real-time settings.
    pub rt: RtConfig,
    /// Arming horizon (see `ConfigFile::arm_horizon`).
    pub arm_horizon: Duration,
    /// Arming lead (see `ConfigFile::arm_lead`), at most the horizon.
    pub arm_lead: Duration,
    /// The dispatch ledger's file (see `ConfigFile::ledger`).
    pub ledger: PathBuf,
    /// Outbox cap.
    pub outbox_cap: usize,
    /// Exec workers.
    pub exec_workers: usize,
    /// Start a fresh journal where one existed but its log is missing.
    pub reset_journal: bool,
    /// The controllers' URLs (each checked, all of one scheme), in the
    /// order the link tries them; empty: no link, and nothing of the link
    /// runs (no thread, no lease).
    pub controllers: Vec<String>,
    /// A plaintext link was allowed (`--insecure`); required for `http://`.
    pub insecure: bool,
    /// The certificate files of an `https://` link.
    pub tls: Option<baton_link_client::TlsFiles>,
    /// Labels sent in the link's hello (keys and values checked).
    pub labels: BTreeMap<String, String>,
    /// Most packs held at once (pushes beyond: resource exhausted).
    pub max_packs: usize,
    /// Clock sources and the admission limit.
    pub clock: ClockConfig,
    /// Log output on stderr.
    pub log_format: baton_service::log::LogFormat,
    /// Where `/metrics` is served (`None`: not served).
    pub metrics: Option<std::net::SocketAddr>,
}

/// Default [`AgentConfig::arm_horizon`]. The cost of a firing pass is
/// mostly its fdatasync: at 1 000 firings/s, arming 5 ms ahead meant ~100
/// passes a second and ~4 % of a core outside the dispatcher; 50 ms means
/// ~20 and 1.65–1.90 % (README, "The agent under load"). The price is what
/// one crash can leave `outcome unknown`: the firings due within about a
/// horizon either side of it (README, "Guarantees").
pub const DEFAULT_ARM_HORIZON: Duration = Duration::from_millis(50);

/// Default [`AgentConfig::arm_lead`] (half the horizon if that is less).
pub const DEFAULT_ARM_LEAD: Duration = Duration::from_micros(2_500);

/// Default [`AgentConfig::max_packs`].
pub const DEFAULT_MAX_PACKS: usize = 256;
/// Longest label key or value, bytes.
pub const MAX_LABEL_LEN: usize = 256;

/// Flags that override the file.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    /// `--id`.
    pub id: Option<String>,
    /// `--data`.
    pub data_dir: Option<PathBuf>,
    /// `--gpio`.
    pub gpio: Option<String>,
    /// `--pack` (added to the file's packs).
    pub packs: Vec<PathBuf>,
    /// `--no-rt`: do not even try SCHED_FIFO / mlockall.
    pub no_rt: bool,
    /// `--reset-journal`: start fresh where a journal's log went missing.
    pub reset_journal: bool,
    /// `--controller URL` (repeatable; replaces the file's list).
    pub controllers: Vec<String>,
    /// `--insecure`: allow a plaintext link.
    pub insecure: bool,
    /// `--insecure-any`: allow it toward a non-loopback controller.
    pub insecure_any: bool,
    /// `--cert FILE`.
    pub cert: Option<PathBuf>,
    /// `--key FILE`.
    pub key: Option<PathBuf>,
    /// `--ca FILE`.
    pub ca: Option<PathBuf>,
    /// `--label KEY=VALUE` (repeatable): set or override a label.
    pub labels: Vec<(String, String)>,
    /// `--ptp-interface IFACE`: be a PTP slave on it (domain from the file,
    /// else 0).
    pub ptp_interface: Option<String>,
    /// `--ntp-server HOST[:PORT]` (repeatable; replaces the file's list).
    pub ntp_servers: Vec<String>,
    /// `--clock-limit DURATION`.
    pub clock_limit: Option<String>,
    /// `--system-clock kernel|reference`.
    pub system_clock: Option<String>,
    /// `--log-format auto|text|json|journald`.
    pub log_format: Option<String>,
    /// `--metrics ADDR`.
    pub metrics: Option<String>,
}

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Could not read the file.
    #[error("{path}: cannot read: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A problem at a position.
    #[error("{path}:{line}:{col}: {message}")]
    At {
        /// The file.
        path: String,
        /// 1-based line.
        line: u32,
        /// 1-based column.
        col: u32,
        /// What.
        message: String,
    },
    /// A problem with a value (flag or file).
    #[error("{0}")]
    Value(String),
}

/// Read and decode a config file.
pub fn read_file(path: &Path) -> Result<ConfigFile, ConfigError> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: name.clone(),
        source,
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

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "agent".into())
}

/// Merge file and flags into the effective configuration, checking values.
pub fn resolve(file: ConfigFile, o: Overrides) -> Result<AgentConfig, ConfigError> {
    let gpio_text = o.gpio.or(file.gpio).unwrap_or_else(|| "cdev".into());
    let gpio: BackendSpec = gpio_text
        .parse()
        .map_err(|e| ConfigError::Value(format!("gpio `{gpio_text}`: {e}")))?;
    let allowed_lines = match &file.allowed_lines {
        None => Allowlist::all(),
        Some(list) => list
            .join(",")
            .parse()
            .map_err(|e| ConfigError::Value(format!("allowed-lines: {e}")))?,
    };
    let mut exec_allowlist = ExecPolicy::new();
    for e in file.exec_allowlist {
        exec_allowlist
            .allow(e.program, e.env)
            .map_err(|e| ConfigError::Value(format!("exec-allowlist: {e}")))?;
    }
    let arm_horizon = duration_or(
        "arm-horizon",
        file.arm_horizon.as_deref(),
        DEFAULT_ARM_HORIZON,
    )?;
    if arm_horizon > Duration::from_secs(1) {
        return Err(ConfigError::Value(
            "arm-horizon must be at most 1s: firings armed ahead are the ones a crash can leave `outcome unknown`".into(),
        ));
    }
    let arm_lead = duration_or(
        "arm-lead",
        file.arm_lead.as_deref(),
        DEFAULT_ARM_LEAD.min(arm_horizon / 2),
    )?;
    if arm_lead > arm_horizon {
        return Err(ConfigError::Value(format!(
            "arm-lead ({arm_lead:?}) must be at most arm-horizon ({arm_horizon:?}): a pass arms what is due within the horizon"
        )));
    }
    let priority = file.realtime.priority;
    if priority > 99 {
        return Err(ConfigError::Value(format!(
            "realtime.priority must be 0..=99, found {priority}"
        )));
    }
    if let Some(cpu) = file.realtime.cpu {
        let n = std::thread::available_parallelism().map_or(1, usize::from);
        if cpu >= n {
            return Err(ConfigError::Value(format!(
                "realtime.cpu {cpu}: this machine has CPUs 0..={} only",
                n - 1
            )));
        }
    }
    let mut packs = file.packs;
    packs.extend(o.packs);
    let insecure = o.insecure || file.insecure.unwrap_or(false);
    let insecure_any = o.insecure_any || file.insecure_any.unwrap_or(false);
    let urls = if o.controllers.is_empty() {
        match file.controller {
            Some(urls) if urls.is_empty() => {
                return Err(ConfigError::Value(
                    "controller: an empty list; leave the key out for no controller".into(),
                ));
            }
            urls => urls.unwrap_or_default(),
        }
    } else {
        o.controllers
    };
    let controllers = check_controllers(&urls, insecure, insecure_any)?;
    let tls = check_tls(
        controllers.first().map(String::as_str),
        o.cert.or(file.cert),
        o.key.or(file.key),
        o.ca.or(file.ca),
    )?;
    let mut labels = BTreeMap::new();
    for (k, v) in file.labels {
        let v = match v {
            serde_json::Value::String(s) => s,
            serde_json::Value::Number(n) => n.to_string(),
            serde_json::Value::Bool(b) => b.to_string(),
            other => {
                return Err(ConfigError::Value(format!(
                    "labels.{k} must be a string, found {}",
                    match other {
                        serde_json::Value::Null => "nothing",
                        serde_json::Value::Array(_) => "a list",
                        _ => "a mapping",
                    }
                )));
            }
        };
        labels.insert(k, v);
    }
    labels.extend(o.labels);
    for (k, v) in &labels {
        check_label(k, v)?;
    }
    let max_packs = file.max_packs.unwrap_or(DEFAULT_MAX_PACKS);
    if max_packs == 0 {
        return Err(ConfigError::Value("max-packs must be at least 1".into()));
    }
    let clock = resolve_clock(
        file.clock,
        ClockOverrides {
            ptp_interface: o.ptp_interface,
            ntp_servers: o.ntp_servers,
            limit: o.clock_limit,
            system: o.system_clock,
        },
    )?;
    let log_format = match o.log_format.or(file.log_format) {
        Some(f) => f
            .parse()
            .map_err(|e: baton_service::log::UnknownLogFormat| ConfigError::Value(e.to_string()))?,
        None => baton_service::log::LogFormat::Auto,
    };
    let metrics = match o.metrics.or(file.metrics) {
        Some(a) => Some(a.parse::<std::net::SocketAddr>().map_err(|e| {
            ConfigError::Value(format!(
                "metrics: {a:?} is not an address to listen on (IP:PORT, e.g. 127.0.0.1:9187): {e}"
            ))
        })?),
        None => None,
    };
    let spin_budget_ppm = match file.realtime.spin_budget.as_deref() {
        None => crate::rt::DEFAULT_SPIN_BUDGET_PPM,
        Some(t) => parse_share(t).ok_or_else(|| {
            ConfigError::Value(format!(
                "realtime.spin-budget: {t:?} is not a share of a core between 0% and 50% (e.g. 1%)"
            ))
        })?,
    };
    let data_dir = o
        .data_dir
        .or(file.data_dir)
        .unwrap_or_else(|| PathBuf::from("baton-data"));
    let ledger = file.ledger.unwrap_or_else(|| default_ledger(&data_dir));
    Ok(AgentConfig {
        log_format,
        metrics,
        id: o.id.or(file.id).unwrap_or_else(host_name),
        ledger,
        data_dir,
        gpio,
        allowed_lines,
        exec_allowlist,
        packs,
        rt: RtConfig {
            priority: (priority > 0 && !o.no_rt).then_some(i32::from(priority)),
            cpu: file.realtime.cpu,
            mlockall: file.realtime.mlockall && !o.no_rt,
            spin_budget_ppm,
        },
        arm_horizon,
        arm_lead,
        outbox_cap: file.outbox_cap.unwrap_or(100_000).max(1),
        exec_workers: file.exec_workers.unwrap_or(2).max(1),
        reset_journal: o.reset_journal,
        controllers,
        insecure,
        tls,
        labels,
        max_packs,
        clock,
    })
}

/// `1%`, `0.5%`: a share of a core in millionths (at most 50 %).
fn parse_share(t: &str) -> Option<u32> {
    let v: f64 = t.trim().strip_suffix('%')?.trim().parse().ok()?;
    (0.0..=50.0)
        .contains(&v)
        .then(|| (v * 10_000.0).round() as u32)
}

/// Where the dispatch ledger of the journal in `data_dir` goes by default:
/// `/dev/shm` (a tmpfs: the real-time thread's stores never wait on a
/// disk), named after the data directory, else the data directory itself.
pub fn default_ledger(data_dir: &std::path::Path) -> PathBuf {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        let abs = std::path::absolute(data_dir).unwrap_or_else(|_| data_dir.to_owned());
        let print = crate::ledger::fingerprint(&abs.to_string_lossy());
        shm.join(format!("baton-{print:016x}.ledger"))
    } else {
        data_dir.join("dispatch.ledger")
    }
}

/// The clock flags, split out of [`Overrides`] for [`resolve_clock`].
struct ClockOverrides {
    ptp_interface: Option<String>,
    ntp_servers: Vec<String>,
    limit: Option<String>,
    system: Option<String>,
}

/// The duration setting `key` if given (an error names the key), else
/// `default`.
fn duration_or(key: &str, value: Option<&str>, default: Duration) -> Result<Duration, ConfigError> {
    value.map_or(Ok(default), |t| {
        parse_duration(t).map_err(|e| ConfigError::Value(format!("{key}: {e}")))
    })
}

/// Longest admission limit: beyond it "absolute time" means nothing.
const MAX_CLOCK_LIMIT: Duration = Duration::from_secs(3600);

fn resolve_clock(file: ClockFile, o: ClockOverrides) -> Result<ClockConfig, ConfigError> {
    let limit = match o.limit.or(file.limit) {
        Some(t) => {
            let d =
                parse_duration(&t).map_err(|e| ConfigError::Value(format!("clock limit: {e}")))?;
            if d.is_zero() || d > MAX_CLOCK_LIMIT {
                return Err(ConfigError::Value(format!(
                    "clock limit `{t}` must be more than 0 and at most 1h"
                )));
            }
            d
        }
        None => DEFAULT_CLOCK_LIMIT,
    };
    let system = match o.system.or(file.system).as_deref() {
        None | Some("kernel") => SystemClock::Kernel,
        Some("reference") => SystemClock::Reference,
        Some("untrusted") => SystemClock::Untrusted,
        Some(other) => {
            return Err(ConfigError::Value(format!(
                "clock.system `{other}`: expected `kernel`, `reference` or `untrusted`"
            )));
        }
    };
    let mut ptp = file.ptp.map(|p| PtpConfig {
        interface: p.interface,
        domain: p.domain,
        discipline_system_clock: p.discipline_system_clock,
    });
    if let Some(iface) = o.ptp_interface {
        match &mut ptp {
            Some(p) => p.interface = iface,
            None => {
                ptp = Some(PtpConfig {
                    interface: iface,
                    domain: 0,
                    discipline_system_clock: false,
                })
            }
        }
    }
    if let Some(p) = &ptp {
        check_interface_name(&p.interface)?;
        if p.domain > 127 {
            return Err(ConfigError::Value(format!(
                "clock.ptp.domain {} : PTP domains are 0..=127",
                p.domain
            )));
        }
    }
    let ntp_servers = if o.ntp_servers.is_empty() {
        file.ntp_servers
    } else {
        o.ntp_servers
    };
    for s in &ntp_servers {
        check_host_port(s).map_err(|e| ConfigError::Value(format!("ntp server `{s}`: {e}")))?;
    }
    Ok(ClockConfig {
        limit,
        system,
        ptp,
        ntp_servers,
        link: file.link.unwrap_or(true),
    })
}

/// A Linux interface name: 1..=15 bytes, no `/`, no whitespace.
fn check_interface_name(name: &str) -> Result<(), ConfigError> {
    let ok = !name.is_empty()
        && name.len() <= 15
        && name != "."
        && name != ".."
        && !name
            .bytes()
            .any(|b| b == b'/' || b == b':' || b.is_ascii_whitespace() || b == 0);
    if ok {
        Ok(())
    } else {
        Err(ConfigError::Value(format!(
            "ptp interface `{name}` is not a network interface name (1 to 15 characters, no `/`, `:` or spaces)"
        )))
    }
}

/// `HOST[:PORT]` or `[V6]:PORT`, shape only (resolution happens at use).
fn check_host_port(s: &str) -> Result<(), String> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (h, tail) = rest.split_once(']').ok_or("missing `]`")?;
        let port = match tail {
            "" => None,
            t => Some(t.strip_prefix(':').ok_or("expected `:PORT` after `]`")?),
        };
        (h, port)
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => (h, Some(p)),
            Some(_) => return Err("an IPv6 address needs brackets: `[ADDR]:PORT`".into()),
            None => (s, None),
        }
    };
    if host.is_empty() || host.bytes().any(|b| b.is_ascii_whitespace() || b == b'/') {
        return Err("expected HOST[:PORT]".into());
    }
    if let Some(p) = port {
        match p.parse::<u16>() {
            Ok(0) | Err(_) => return Err(format!("port `{p}` must be 1..=65535")),
            Ok(_) => {}
        }
    }
    Ok(())
}

/// A controller URL the link can dial: `https://HOST[:PORT]` (mTLS; the
/// certificate files are checked by [`check_tls`]), or `http://HOST[:PORT]`
/// with `insecure`. Returns it without a trailing `/`.
pub fn check_controller_url(
    url: &str,
    insecure: bool,
    insecure_any: bool,
) -> Result<String, ConfigError> {
    let bad = |why: &str| ConfigError::Value(format!("controller `{url}`: {why}"));
    let uri: tonic::transport::Uri = url
        .parse()
        .map_err(|e| bad(&format!("not a URL ({e}); write https://HOST:PORT")))?;
    let https = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        Some(other) => {
            return Err(bad(&format!(
                "unknown scheme `{other}`; write https://HOST:PORT"
            )));
        }
        None => return Err(bad("no scheme; write https://HOST:PORT")),
    };
    if uri.host().is_none_or(str::is_empty) {
        return Err(bad("no host; write https://HOST:PORT"));
    }
    if uri.path() != "/" && !uri.path().is_empty() || uri.query().is_some() {
        return Err(bad("a controller URL has no path; write https://HOST:PORT"));
    }
    if !https && !insecure {
        return Err(bad(
            "plaintext link needs --insecure (or use https:// with --cert, --key and --ca)",
        ));
    }
    if !https && !insecure_any && !uri.host().is_some_and(baton_proto::wire::is_loopback_host) {
        return Err(bad(
            "plaintext toward a non-loopback controller: anyone on the path could push to this agent or read its feedback; use https:// with --cert, --key and --ca, or add --insecure-any on a network you trust",
        ));
    }
    Ok(url.trim_end_matches('/').to_string())
}

/// Every controller URL checked ([`check_controller_url`]), none twice, all
/// of one scheme: a list mixing `https://` and `http://` would fall back
/// to plaintext when the TLS controllers are down (a downgrade an attacker
/// on the path could force).
pub fn check_controllers(
    urls: &[String],
    insecure: bool,
    insecure_any: bool,
) -> Result<Vec<String>, ConfigError> {
    let mut out: Vec<String> = Vec::with_capacity(urls.len());
    for url in urls {
        let u = check_controller_url(url, insecure, insecure_any)?;
        if out.contains(&u) {
            return Err(ConfigError::Value(format!(
                "controller `{u}` is listed twice"
            )));
        }
        if let Some(first) = out.first()
            && first.starts_with("https://") != u.starts_with("https://")
        {
            return Err(ConfigError::Value(format!(
                "controllers `{first}` and `{u}`: all https:// or all http://, never a plaintext fallback"
            )));
        }
        out.push(u);
    }
    Ok(out)
}

/// The certificate files of the link: all three for an `https://`
/// controller (each readable now; the link reads them again at every
/// connection, so a renewed certificate is used without a restart), none
/// for `http://` (never a silent downgrade of a configured certificate).
pub fn check_tls(
    controller: Option<&str>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    ca: Option<PathBuf>,
) -> Result<Option<baton_link_client::TlsFiles>, ConfigError> {
    let given = cert.is_some() || key.is_some() || ca.is_some();
    let Some(url) = controller.filter(|u| u.starts_with("https://")) else {
        return match (controller, given) {
            (Some(url), true) => Err(ConfigError::Value(format!(
                "cert, key and ca are for an https:// controller, not `{url}`"
            ))),
            (None, true) => Err(ConfigError::Value(
                "cert, key and ca given without a controller".into(),
            )),
            (_, false) => Ok(None),
        };
    };
    let (Some(cert), Some(key), Some(ca)) = (cert, key, ca) else {
        return Err(ConfigError::Value(format!(
            "controller `{url}`: mTLS needs cert, key and ca (--cert, --key, --ca or the config keys)"
        )));
    };
    for p in [&cert, &key, &ca] {
        std::fs::metadata(p).map_err(|e| ConfigError::Read {
            path: p.display().to_string(),
            source: e,
        })?;
    }
    Ok(Some(baton_link_client::TlsFiles { cert, key, ca }))
}

/// A label as the controller will match it: key and value non-empty, at
/// most [`MAX_LABEL_LEN`] bytes, no control characters (they would corrupt
/// logs and the operators' listings).
pub fn check_label(key: &str, value: &str) -> Result<(), ConfigError> {
    for (what, text) in [("key", key), ("value", value)] {
        let why = if text.is_empty() {
            Some("is empty".to_string())
        } else if text.len() > MAX_LABEL_LEN {
            Some(format!("is longer than {MAX_LABEL_LEN} bytes"))
        } else if text.chars().any(char::is_control) {
            Some("contains a control character".to_string())
        } else {
            None
        };
        if let Some(why) = why {
            return Err(ConfigError::Value(format!(
                "label {key:?}: its {what} {why}"
            )));
        }
    }
    Ok(())
}

/// Parse a `--label KEY=VALUE` argument (checked again by [`resolve`]).
pub fn parse_label_arg(arg: &str) -> Result<(String, String), String> {
    let (k, v) = arg
        .split_once('=')
        .ok_or_else(|| format!("`{arg}`: write KEY=VALUE"))?;
    check_label(k, v).map_err(|e| e.to_string())?;
    Ok((k.to_string(), v.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spin_budget_is_a_share_of_a_core() {
        assert_eq!(parse_share("1%"), Some(10_000));
        assert_eq!(parse_share("0.5 %"), Some(5_000));
        assert_eq!(parse_share("0%"), Some(0));
        assert_eq!(parse_share("60%"), None);
        assert_eq!(parse_share("1"), None);
        let f = parse_file("a.yaml", "realtime: {spin-budget: 2%}\n").expect("syntax ok");
        let c = resolve(f, Overrides::default()).expect("valid");
        assert_eq!(c.rt.spin_budget_ppm, 20_000);
        let f = parse_file("a.yaml", "realtime: {spin-budget: lots}\n").expect("syntax ok");
        assert!(resolve(f, Overrides::default()).is_err());
    }

    #[test]
    fn metrics_address_from_the_file_or_the_flag() {
        let f = parse_file("agent.yaml", "metrics: 127.0.0.1:9187\n").expect("valid");
        let c = resolve(f.clone(), Overrides::default()).expect("resolves");
        assert_eq!(c.metrics, Some("127.0.0.1:9187".parse().expect("addr")));
        let o = Overrides {
            metrics: Some("[::1]:9000".into()),
            ..Overrides::default()
        };
        assert_eq!(
            resolve(f, o).expect("ok").metrics,
            Some("[::1]:9000".parse().expect("addr"))
        );
        let d = resolve(ConfigFile::default(), Overrides::default()).expect("ok");
        assert_eq!(d.metrics, None);
        let bad = parse_file("agent.yaml", "metrics: localhost\n").expect("a string");
        let e = resolve(bad, Overrides::default()).expect_err("refused");
        assert!(e.to_string().contains("metrics"), "{e}");
    }

    #[test]
    fn log_format_from_the_file_or_the_flag() {
        use baton_service::log::LogFormat;
        let f = parse_file("agent.yaml", "log-format: json\n").expect("valid");
        let c = resolve(f.clone(), Overrides::default()).expect("resolves");
        assert_eq!(c.log_format, LogFormat::Json);
        let o = Overrides {
            log_format: Some("journald".into()),
            ..Overrides::default()
        };
        assert_eq!(resolve(f, o).expect("ok").log_format, LogFormat::Journald);
        let d = resolve(ConfigFile::default(), Overrides::default()).expect("ok");
        assert_eq!(d.log_format, LogFormat::Auto);
        let bad = parse_file("agent.yaml", "log-format: syslog\n").expect("a string");
        let e = resolve(bad, Overrides::default()).expect_err("refused");
        assert!(e.to_string().contains("syslog"), "{e}");
    }

    #[test]
    fn a_full_file_parses_and_flags_override_it() {
        let f = parse_file(
            "agent.yaml",
            "id: press-01\ndata-dir: /var/lib/baton\ngpio: sim:/tmp/x.jsonl\nallowed-lines: [\"gpiochip0:17\", RELAY_MAIN]\nexec-allowlist: [/usr/sbin/logrotate]\nrealtime: {priority: 70, cpu: 1}\narm-horizon: 2ms\n",
        )
        .expect("valid");
        let c = resolve(
            f,
            Overrides {
                id: Some("other".into()),
                ..Overrides::default()
            },
        )
        .expect("resolves");
        assert_eq!(c.id, "other");
        assert_eq!(c.data_dir, PathBuf::from("/var/lib/baton"));
        assert_eq!(c.rt.priority, Some(70));
        assert_eq!(c.rt.cpu, Some(1));
        assert_eq!(c.arm_horizon, Duration::from_millis(2));
        assert!(!c.allowed_lines.is_unrestricted());
    }

    #[test]
    fn unknown_keys_are_refused_with_their_position() {
        let e = parse_file("agent.yaml", "id: a\nrealtime:\n  prio: 3\n").expect_err("unknown");
        let text = e.to_string();
        assert!(
            text.starts_with("agent.yaml:3:3: unknown field `prio`"),
            "{text}"
        );
    }

    #[test]
    fn bad_values_are_refused() {
        let f = parse_file("a.yaml", "gpio: gpu\n").expect("syntax ok");
        let e = resolve(f, Overrides::default()).expect_err("bad backend");
        assert!(e.to_string().starts_with("gpio `gpu`"), "{e}");
        let f = parse_file("a.yaml", "exec-allowlist: [bin/true]\n").expect("syntax ok");
        let e = resolve(f, Overrides::default()).expect_err("relative");
        assert_eq!(
            e.to_string(),
            "exec-allowlist: `bin/true`: not an absolute path"
        );
        let f = parse_file("a.yaml", "arm-horizon: 5 s\n").expect("syntax ok");
        assert!(resolve(f, Overrides::default()).is_err());
    }

    #[test]
    fn the_arming_lead_defaults_to_2_5ms_within_the_horizon_and_never_exceeds_it() {
        let lead = |yaml: &str| {
            let f = parse_file("a.yaml", yaml).expect("syntax ok");
            resolve(f, Overrides::default()).map(|c| (c.arm_horizon, c.arm_lead))
        };
        let ms = Duration::from_millis;
        assert_eq!(
            lead("{}\n").expect("defaults"),
            (ms(50), Duration::from_micros(2_500))
        );
        assert_eq!(lead("arm-horizon: 2ms\n").expect("short"), (ms(2), ms(1)));
        assert_eq!(
            lead("arm-horizon: 100ms\narm-lead: 20ms\n").expect("slow disk"),
            (ms(100), ms(20))
        );
        let e = lead("arm-horizon: 10ms\narm-lead: 20ms\n").expect_err("lead past the horizon");
        assert!(e.to_string().contains("arm-lead"), "{e}");
    }

    #[test]
    fn the_controller_link_is_plaintext_only_with_insecure() {
        let f = parse_file(
            "a.yaml",
            "controller: http://ctl.plant:7700\ninsecure: true\ninsecure-any: true\nlabels: {line: 3, site: plant-a, edge: true}\nmax-packs: 10\n",
        )
        .expect("valid");
        let c = resolve(f, Overrides::default()).expect("resolves");
        assert_eq!(c.controllers, ["http://ctl.plant:7700"]);
        assert!(c.insecure);
        assert_eq!(c.max_packs, 10);
        let labels: Vec<(&str, &str)> = c
            .labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            labels,
            [("edge", "true"), ("line", "3"), ("site", "plant-a")]
        );

        // Without a controller: no link, default limits.
        let c = resolve(ConfigFile::default(), Overrides::default()).expect("resolves");
        assert!(c.controllers.is_empty());
        assert_eq!(c.max_packs, DEFAULT_MAX_PACKS);

        let plain = |url: &str, insecure: bool| {
            resolve(
                ConfigFile::default(),
                Overrides {
                    controllers: vec![url.into()],
                    insecure,
                    ..Overrides::default()
                },
            )
            .map(|c| c.controllers.first().cloned())
            .map_err(|e| e.to_string())
        };
        let far = resolve(
            ConfigFile::default(),
            Overrides {
                controllers: vec!["http://10.0.0.5:7700".into()],
                insecure: true,
                ..Overrides::default()
            },
        )
        .expect_err("plaintext off loopback needs --insecure-any");
        assert!(far.to_string().contains("--insecure-any"), "{far}");
        let far = resolve(
            ConfigFile::default(),
            Overrides {
                controllers: vec!["http://10.0.0.5:7700".into()],
                insecure: true,
                insecure_any: true,
                ..Overrides::default()
            },
        )
        .expect("allowed with --insecure-any");
        assert_eq!(far.controllers, ["http://10.0.0.5:7700"]);
        let e = plain("http://127.0.0.1:7700", false).expect_err("needs --insecure");
        assert_eq!(
            e,
            "controller `http://127.0.0.1:7700`: plaintext link needs --insecure (or use https:// with --cert, --key and --ca)"
        );
        assert_eq!(
            plain("http://127.0.0.1:7700/", true).expect("ok"),
            Some("http://127.0.0.1:7700".into())
        );
        let e = plain("https://ctl:7700", true).expect_err("no certificate");
        assert!(e.contains("mTLS needs cert, key and ca"), "{e}");
        for bad in [
            "ctl:7700",
            "ftp://ctl",
            "http://ctl/x",
            "http://",
            "not a url",
        ] {
            assert!(plain(bad, true).is_err(), "{bad}");
        }
        // The flag alone turns insecure on; a file setting it is enough too.
        let f = parse_file("a.yaml", "controller: http://c:1\n").expect("valid");
        let e = resolve(f, Overrides::default()).expect_err("needs insecure");
        assert!(e.to_string().contains("needs --insecure"), "{e}");
    }

    /// Several controllers: a list in the file (or the single string, as
    /// before), the repeated flag replacing it; each URL checked, none
    /// twice, never a mix of schemes, never an empty list.
    #[test]
    fn several_controllers_from_a_list_or_the_repeated_flag() {
        let file = |text: &str| parse_file("a.yaml", text).expect("valid");
        let urls = |f: ConfigFile, o: Overrides| {
            resolve(f, o)
                .map(|c| c.controllers)
                .map_err(|e| e.to_string())
        };
        let insecure = || Overrides {
            insecure: true,
            ..Overrides::default()
        };
        assert_eq!(
            urls(
                file(
                    "controller: [http://127.0.0.1:1/, http://localhost:2]
"
                ),
                insecure()
            )
            .expect("list"),
            ["http://127.0.0.1:1", "http://localhost:2"]
        );
        assert_eq!(
            urls(
                file(
                    "controller: http://127.0.0.1:1
"
                ),
                insecure()
            )
            .expect("one"),
            ["http://127.0.0.1:1"]
        );
        // The flags replace the file's list, in their order.
        assert_eq!(
            urls(
                file(
                    "controller: [http://127.0.0.1:1]
"
                ),
                Overrides {
                    controllers: vec!["http://127.0.0.1:3".into(), "http://127.0.0.1:2".into()],
                    ..insecure()
                }
            )
            .expect("flags"),
            ["http://127.0.0.1:3", "http://127.0.0.1:2"]
        );
        let e = urls(
            file(
                "controller: [http://127.0.0.1:1, http://10.0.0.9:1]
",
            ),
            insecure(),
        )
        .expect_err("each is checked");
        assert!(
            e.contains("`http://10.0.0.9:1`") && e.contains("--insecure-any"),
            "{e}"
        );
        let e = urls(
            file(
                "controller: [http://127.0.0.1:1, http://127.0.0.1:1/]
",
            ),
            insecure(),
        )
        .expect_err("twice");
        assert!(e.contains("listed twice"), "{e}");
        let e = urls(
            file(
                "controller: [https://ctl:1, http://127.0.0.1:1]
",
            ),
            insecure(),
        )
        .expect_err("mixed");
        assert!(e.contains("never a plaintext fallback"), "{e}");
        let e = urls(
            file(
                "controller: []
",
            ),
            insecure(),
        )
        .expect_err("empty");
        assert!(e.contains("empty list"), "{e}");
        assert!(
            parse_file(
                "a.yaml",
                "controller: {url: x}
"
            )
            .is_err()
        );
    }

    #[test]
    fn an_https_link_needs_all_three_certificate_files_and_http_none() {
        let tmp = tempfile::tempdir().expect("tmp");
        let [cert, key, ca] = ["a.pem", "a-key.pem", "ca.pem"].map(|n| {
            let p = tmp.path().join(n);
            std::fs::write(&p, "x").expect("write");
            p
        });
        let file = format!(
            "controller: https://ctl:7700\ncert: {}\nkey: {}\nca: {}\n",
            cert.display(),
            key.display(),
            ca.display()
        );
        let c = resolve(
            parse_file("a.yaml", &file).expect("valid"),
            Overrides::default(),
        )
        .expect("resolves");
        assert_eq!(c.controllers, ["https://ctl:7700"]);
        let tls = c.tls.expect("tls");
        assert_eq!((tls.cert, tls.key, tls.ca), (cert.clone(), key.clone(), ca));
        // A missing file is named.
        let with = |url: &str, key: PathBuf| {
            resolve(
                ConfigFile::default(),
                Overrides {
                    controllers: vec![url.into()],
                    insecure: true,
                    cert: Some(cert.clone()),
                    key: Some(key),
                    ca: Some(cert.clone()),
                    ..Overrides::default()
                },
            )
            .map_err(|e| e.to_string())
        };
        let e = with("https://ctl:1", tmp.path().join("nope.pem")).expect_err("missing");
        assert!(e.contains("nope.pem: cannot read"), "{e}");
        // Certificates with a plaintext URL: refused, never a silent downgrade.
        let e = with("http://127.0.0.1:1", key.clone()).expect_err("http");
        assert!(e.contains("for an https:// controller"), "{e}");
    }

    #[test]
    fn labels_are_checked_and_flags_override_the_file() {
        let f = parse_file("a.yaml", "labels: {line: \"3\", site: a}\n").expect("valid");
        let c = resolve(
            f,
            Overrides {
                labels: vec![("line".into(), "4".into())],
                ..Overrides::default()
            },
        )
        .expect("resolves");
        assert_eq!(c.labels.get("line").map(String::as_str), Some("4"));
        assert_eq!(c.labels.get("site").map(String::as_str), Some("a"));
        assert_eq!(parse_label_arg("a=b=c"), Ok(("a".into(), "b=c".into())));
        assert!(parse_label_arg("novalue").is_err());
        assert!(
            parse_label_arg("=v")
                .expect_err("empty key")
                .contains("its key is empty")
        );
        assert!(
            parse_label_arg("k=")
                .expect_err("empty value")
                .contains("its value is empty")
        );
        assert!(
            parse_label_arg("k=a\u{7}b")
                .expect_err("bell")
                .contains("control character")
        );
        for text in [
            "labels: {\"\": x}\n",
            "labels: {k: \"a\\nb\"}\n",
            "labels: {k: [1]}\n",
            "labels: {k: }\n",
            "max-packs: 0\n",
        ] {
            let f = parse_file("a.yaml", text).expect(text);
            assert!(resolve(f, Overrides::default()).is_err(), "{text}");
        }
    }

    #[test]
    fn exec_allowlist_entries_are_paths_or_programs_with_env_keys() {
        let f = parse_file(
            "agent.yaml",
            "exec-allowlist:\n  - /usr/sbin/logrotate\n  - {program: /opt/plant/flush.sh, env: [MODE, LANG]}\n  - program: /usr/bin/true\n",
        )
        .expect("valid");
        assert_eq!(
            f.exec_allowlist,
            [
                ExecAllowEntry {
                    program: "/usr/sbin/logrotate".into(),
                    env: vec![]
                },
                ExecAllowEntry {
                    program: "/opt/plant/flush.sh".into(),
                    env: vec!["MODE".into(), "LANG".into()]
                },
                ExecAllowEntry {
                    program: "/usr/bin/true".into(),
                    env: vec![]
                },
            ]
        );
        let c = resolve(f, Overrides::default()).expect("resolves");
        let p = &c.exec_allowlist;
        assert!(p.is_allowed("/usr/sbin/logrotate"));
        assert_eq!(
            p.allowed_env("/opt/plant/flush.sh")
                .map(|k| k.iter().map(String::as_str).collect::<Vec<_>>()),
            Some(vec!["LANG", "MODE"])
        );
        assert_eq!(
            p.allowed_env("/usr/sbin/logrotate").map(|k| k.len()),
            Some(0)
        );
        assert_eq!(p.allowed_env("/bin/sh"), None);
    }

    #[test]
    fn bad_exec_allowlist_entries_are_refused() {
        let e = parse_file(
            "agent.yaml",
            "exec-allowlist:\n  - {program: /bin/sh, envs: [A]}\n",
        )
        .expect_err("unknown key");
        assert!(
            e.to_string()
                .starts_with("agent.yaml:2:24: unknown field `envs`, expected `program` or `env`"),
            "{e}"
        );
        let e = parse_file("agent.yaml", "exec-allowlist: [{env: [A]}]\n").expect_err("no program");
        assert!(e.to_string().contains("missing field `program`"), "{e}");
        let e = parse_file("agent.yaml", "exec-allowlist: [[/bin/sh]]\n").expect_err("a list");
        assert!(
            e.to_string()
                .contains("expected a program path, or {program: PATH, env: [KEY, ...]}"),
            "{e}"
        );
        for (text, msg) in [
            (
                "exec-allowlist: [{program: /bin/sh, env: [LD_PRELOAD]}]\n",
                "exec-allowlist: `/bin/sh`: environment key \"LD_PRELOAD\" is a dynamic-loader variable",
            ),
            (
                "exec-allowlist: [{program: /bin/sh, env: [BATON_ATTEMPT]}]\n",
                "exec-allowlist: `/bin/sh`: environment key \"BATON_ATTEMPT\" is reserved for the agent",
            ),
            (
                "exec-allowlist: [/bin/sh, {program: /bin/sh, env: [A]}]\n",
                "exec-allowlist: `/bin/sh` is listed twice",
            ),
        ] {
            let f = parse_file("a.yaml", text).expect("syntax ok");
            let e = resolve(f, Overrides::default()).expect_err(text);
            assert!(e.to_string().starts_with(msg), "{e}");
        }
    }
}
