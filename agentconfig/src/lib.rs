//! The agent's configuration: a YAML file (`--config`), every common key
//! also a flag that overrides it, so a test or a new user needs no file.
//!
//! `file` is the file as written and its decoding; [`resolve`] merges it
//! with the flags ([`Overrides`]) into the effective [`AgentConfig`], each
//! settings group checked by its own module: what packs may touch
//! (`actuators`), arming and the dispatcher's real-time settings
//! (`dispatch`), the controller link and labels (`controller`), and the
//! clock sources (`clock`), agent updates (`update`).

#![forbid(unsafe_code)]

mod actuators;
mod clock;
mod controller;
mod dispatch;
mod file;
mod update;
mod value;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

pub use baton_clock::settings::{ClockConfig, DEFAULT_CLOCK_LIMIT, PtpConfig, SystemClock};
use baton_dispatch::rt::RtConfig;
use baton_exec::policy::ExecPolicy;
use baton_gpio::{Allowlist, BackendSpec};

use clock::{ClockOverrides, resolve_clock};
pub use controller::{
    check_controller_url, check_controllers, check_label, check_tls, parse_label_arg,
};
pub use file::{
    ClockFile, ConfigFile, ExecAllowEntry, PtpFile, RealtimeFile, parse_file, read_file,
};
pub use update::{DEFAULT_DOWNLOAD_RATE, UpdateConfig, UpdateFile};

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
    /// Where the fleet's trust lives (see `ConfigFile::trust_dir`); `None`:
    /// packs are not checked for signatures.
    pub trust_dir: Option<PathBuf>,
    /// Agent updates: download rate, quiet margin, the trial's deadline.
    pub update: UpdateConfig,
}

/// Default [`AgentConfig::arm_horizon`]. The cost of an arming pass is
/// mostly its fdatasync, and each fdatasync rewrites the log's last flash
/// page: at 1 000 firings/s, arming 5 ms ahead meant ~100 passes a second
/// and ~4 % of a core outside the dispatcher; 50 ms meant ~20 passes and
/// 108 bytes written to the disk per firing; 150 ms means ~7 and 50 bytes
/// (docs/bench/load.md, "Flash wear"). The price is what a power cut can
/// leave `outcome unknown`: the firings due within about a horizon either
/// side of it (README, "Guarantees"); `kill -9` leaves none (the ledger).
pub const DEFAULT_ARM_HORIZON: Duration = Duration::from_millis(150);

/// Default [`AgentConfig::arm_lead`] (half the horizon if that is less).
/// The arming pass must have journalled (fdatasync) and handed over its
/// first firing by then, on a control thread that shares its CPU: at
/// 2.5 ms, with a busy loop on that CPU, the first firing of most passes
/// reached the dispatcher late (17 of 20 passes; the p99 lateness went from
/// 9 µs to 25–250 µs); an SD card's fdatasync alone takes milliseconds.
pub const DEFAULT_ARM_LEAD: Duration = Duration::from_millis(20);

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
    /// `--trust-dir DIR`.
    pub trust_dir: Option<PathBuf>,
}

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Could not read the file.
    #[error("{path}: cannot read: {cause}")]
    Read {
        /// The file.
        path: String,
        /// Why. Not the error's `source()`: the message already says it,
        /// and a report printing the chain would say it twice.
        cause: std::io::Error,
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

/// Merge file and flags into the effective configuration, checking values
/// (in this order, so that of several mistakes the same one is reported).
pub fn resolve(file: ConfigFile, o: Overrides) -> Result<AgentConfig, ConfigError> {
    let gpio = actuators::gpio_backend(o.gpio.or(file.gpio))?;
    let allowed_lines = actuators::allowed_lines(file.allowed_lines.as_deref())?;
    let exec_allowlist = actuators::exec_policy(file.exec_allowlist)?;
    let (arm_horizon, arm_lead) =
        dispatch::arming(file.arm_horizon.as_deref(), file.arm_lead.as_deref())?;
    dispatch::check_realtime(&file.realtime)?;
    let mut packs = file.packs;
    packs.extend(o.packs);
    let insecure = o.insecure || file.insecure.unwrap_or(false);
    let insecure_any = o.insecure_any || file.insecure_any.unwrap_or(false);
    let urls = controller::controller_urls(o.controllers, file.controller)?;
    let controllers = check_controllers(&urls, insecure, insecure_any)?;
    let tls = check_tls(
        controllers.first().map(String::as_str),
        o.cert.or(file.cert),
        o.key.or(file.key),
        o.ca.or(file.ca),
    )?;
    let labels = controller::labels(file.labels, o.labels)?;
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
    let update = update::resolve_update(file.update)?;
    let log_format = log_format(o.log_format.or(file.log_format))?;
    let metrics = metrics_address(o.metrics.or(file.metrics))?;
    let rt = dispatch::rt_config(&file.realtime, o.no_rt)?;
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
        rt,
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
        trust_dir: o.trust_dir.or(file.trust_dir),
        update,
    })
}

/// The log format named (default `auto`).
fn log_format(name: Option<String>) -> Result<baton_service::log::LogFormat, ConfigError> {
    match name {
        Some(f) => f
            .parse()
            .map_err(|e: baton_service::log::UnknownLogFormat| ConfigError::Value(e.to_string())),
        None => Ok(baton_service::log::LogFormat::Auto),
    }
}

/// The address `/metrics` is served on, if one is given.
fn metrics_address(addr: Option<String>) -> Result<Option<std::net::SocketAddr>, ConfigError> {
    match addr {
        Some(a) => Ok(Some(a.parse::<std::net::SocketAddr>().map_err(|e| {
            ConfigError::Value(format!(
                "metrics: {a:?} is not an address to listen on (IP:PORT, e.g. 127.0.0.1:9187): {e}"
            ))
        })?)),
        None => Ok(None),
    }
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "agent".into())
}

/// Where the dispatch ledger of the journal in `data_dir` goes by default:
/// `/dev/shm` (a tmpfs: the real-time thread's stores never wait on a
/// disk), named after the data directory, else the data directory itself.
pub fn default_ledger(data_dir: &std::path::Path) -> PathBuf {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        let abs = std::path::absolute(data_dir).unwrap_or_else(|_| data_dir.to_owned());
        let print = baton_dispatch::ledger::fingerprint(&abs.to_string_lossy());
        shm.join(format!("baton-{print:016x}.ledger"))
    } else {
        data_dir.join("dispatch.ledger")
    }
}

#[cfg(test)]
mod tests;
