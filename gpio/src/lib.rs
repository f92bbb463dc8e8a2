//! GPIO: one small trait, three backends.
//!
//! The dispatcher drives lines through [`Gpio`]; which backend sits behind it
//! is chosen once, from the `--gpio` flag ([`BackendSpec`]):
//!
//! - [`BackendSpec::Sim`] — no hardware. Line state lives in memory and every
//!   write is appended to a JSON-lines log, one `write(2)` per change, so an
//!   end-to-end test that `kill -9`s the agent still sees every change that
//!   happened before the kill.
//! - [`BackendSpec::Cdev`] — the GPIO character device (`/dev/gpiochipN`,
//!   uAPI v2) through the `gpiocdev` crate. The backend to use on real boxes.
//! - [`BackendSpec::Sysfs`] — the legacy `/sys/class/gpio` interface, for old
//!   vendor kernels that have nothing else.
//!
//! # The contract every backend keeps
//!
//! - **Lines are requested once and kept.** [`Gpio::request`] (outputs) and
//!   [`Gpio::request_input`] run at start-up / pack acceptance. They resolve
//!   the line, check the [`Allowlist`], and open whatever file descriptor the
//!   backend needs. [`Gpio::write`] and [`Gpio::read`] then only index a `Vec`
//!   and make one system call: no allocation, no path lookup, no reopen on
//!   the real-time path (errors allocate their message; they are off the
//!   fast path by definition).
//! - **Requesting never moves a line.** A line taken as an output keeps the
//!   level it had (cdev: requested as-is, read, then switched to output at that
//!   level; sysfs: `direction` is written `high`/`low`, which the kernel
//!   applies glitch-free). Choosing a level for an untouched device is the
//!   pack's `safe_state`'s job, not a side effect of accepting a pack: driving
//!   every requested line low would energise an active-low relay.
//! - **Releasing never moves a line either.** Dropping a backend closes its
//!   descriptors (the kernel then keeps or releases the level as the driver
//!   does) and never unexports sysfs lines. Driving the safe state before the
//!   agent exits is the dispatcher's job.
//! - **The allowlist is enforced at request time** (principle 2: the agent is
//!   the last line of defence); a refused line is [`GpioError::NotAllowed`],
//!   naming the line and the allowlist.
//! - **One line, one handle.** Requesting the same line again — by the same
//!   [`LineRef`], or in cdev/sysfs by another spelling of the same physical
//!   line (name vs. offset) — returns the same [`LineHandle`]. A line
//!   requested both as input and as output is an output; reads read back the
//!   driven level.

#![forbid(unsafe_code)]

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use baton_proto::pack::{Line, LineRef};

mod allow;
pub mod cdev;
mod held;
pub mod sim;
pub mod sysfs;

pub use allow::Allowlist;

/// The chip a line without `chip:` is on, in the sim and cdev backends
/// (libgpiod's usual first chip).
pub const DEFAULT_CHIP: &str = "gpiochip0";

/// Where the legacy sysfs GPIO interface lives on a real system.
pub const DEFAULT_SYSFS_ROOT: &str = "/sys/class/gpio";

/// Opaque handle to a requested line; cheap `Copy`, used on the real-time path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LineHandle(pub u32);

/// How a line is used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Sampled only (`gpio.read`).
    Input,
    /// Driven (`gpio.write`, `gpio.toggle`, `gpio.pulse`, safe state).
    Output,
}

/// A set of GPIO lines the agent drives or samples.
///
/// `Send` so the dispatcher thread can own it; not `Sync`, because only that
/// one thread touches hardware.
pub trait Gpio: Send + std::fmt::Debug {
    /// Request a line as an output, once (at start-up / pack acceptance), and
    /// keep it. Idempotent for the same line (returns the same handle); an
    /// input line requested again here becomes an output at its current
    /// level. Refuses lines not on the allowlist.
    fn request(&mut self, line: &LineRef) -> Result<LineHandle, GpioError>;

    /// Request a line that is only sampled (`gpio.read`). Kept as an input
    /// because driving a sensor's line would fight the sensor; a line already
    /// requested as an output stays an output (reads read back its level).
    fn request_input(&mut self, line: &LineRef) -> Result<LineHandle, GpioError>;

    /// Drive a requested output line to `value` (0 or 1).
    ///
    /// `t_ns` (reference time of the change) and `execution_id` are for the
    /// sim log; real backends ignore them. Never allocates in cdev/sysfs.
    fn write(
        &mut self,
        h: LineHandle,
        value: u8,
        t_ns: i64,
        execution_id: &str,
    ) -> Result<(), GpioError>;

    /// Sample a requested line (an output reads back its level).
    fn read(&mut self, h: LineHandle) -> Result<u8, GpioError>;

    /// Current output level as last driven (or as found at request time), so
    /// `gpio.toggle` needs no read-back round trip. `None` for input lines and
    /// unknown handles.
    fn level(&self, h: LineHandle) -> Option<u8>;

    /// The line for messages, e.g. `gpiochip0:12`.
    fn describe(&self, h: LineHandle) -> String;

    /// A second way to drive output line `h` that does not go through
    /// this object (its own handle on the kernel's line: cdev the line
    /// request's descriptor, sysfs the value file, sim the log file), for
    /// the safe state when the thread that owns this object is stuck
    /// inside a call. `None`: the line is not an output, or the backend
    /// has no such way.
    fn direct(&self, _h: LineHandle) -> Option<Arc<dyn DirectLine>> {
        None
    }
}

/// One output line, driven without the backend object ([`Gpio::direct`]):
/// the kernel serialises it with the backend's own writes to the line, so
/// a write here waits for one in progress (bounded by its caller, the
/// safe-state driver), and nothing of the process it would wait on.
pub trait DirectLine: Send + Sync + std::fmt::Debug {
    /// Drive the line to `value` (`t_ns`, `label`: for the sim log).
    fn write(&self, value: u8, t_ns: i64, label: &str) -> Result<(), GpioError>;
}

/// Every output line's [`DirectLine`], by handle, filled as lines are
/// requested (by the thread that owns the backend). Its lock is held only
/// to add or look up an entry, never across a device call.
#[derive(Debug, Default)]
pub struct DirectLines {
    lines: Mutex<Vec<Option<Arc<dyn DirectLine>>>>,
}

impl DirectLines {
    /// Line `h` is driven directly through `d`.
    pub fn set(&self, h: LineHandle, d: Arc<dyn DirectLine>) {
        let mut lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        let i = h.0 as usize;
        if lines.len() <= i {
            lines.resize(i + 1, None);
        }
        lines[i] = Some(d);
    }

    /// Register what `gpio` offers for `h` (nothing if it offers nothing).
    pub fn learn(&self, gpio: &dyn Gpio, h: LineHandle) {
        if let Some(d) = gpio.direct(h) {
            self.set(h, d);
        }
    }

    /// The direct way to line `h`, if there is one.
    pub fn get(&self, h: LineHandle) -> Option<Arc<dyn DirectLine>> {
        let lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        lines.get(h.0 as usize).cloned().flatten()
    }
}

/// Why a GPIO operation failed. Every message names the chip and line.
#[derive(Debug, thiserror::Error)]
pub enum GpioError {
    /// The line is not on the agent's allowlist.
    #[error("GPIO line {line} is not on the agent's allowlist (allowed: {allowlist})")]
    NotAllowed {
        /// The line as requested.
        line: String,
        /// The allowlist, for the operator.
        allowlist: String,
    },
    /// The chip does not exist or cannot be opened.
    #[error("no GPIO chip {chip}: {reason}")]
    NoSuchChip {
        /// The chip as named.
        chip: String,
        /// What was looked for and what is missing.
        reason: String,
    },
    /// The line does not exist.
    #[error("no GPIO line {line}: {reason}")]
    NoSuchLine {
        /// The line as requested.
        line: String,
        /// What was searched.
        reason: String,
    },
    /// A line name matches more than one line; driving "the first" could move
    /// the wrong actuator, so the request is refused.
    #[error("GPIO line name {name:?} is ambiguous: it names {found}; give the chip or an offset")]
    AmbiguousName {
        /// The name.
        name: String,
        /// Every `chip:offset` carrying it.
        found: String,
    },
    /// A system call on the line failed.
    #[error("GPIO {op} on {line} failed: {source}")]
    Io {
        /// What was being done (`export`, `set value`, ...).
        op: &'static str,
        /// The line.
        line: String,
        /// The OS (or gpiocdev) error.
        #[source]
        source: std::io::Error,
    },
    /// A write to a line that was requested as an input only.
    #[error("GPIO line {line} was requested as an input and cannot be driven")]
    NotOutput {
        /// The line.
        line: String,
    },
    /// A level other than 0 or 1.
    #[error("invalid level {value} for GPIO line {line}: must be 0 or 1")]
    InvalidValue {
        /// The line.
        line: String,
        /// The level given.
        value: u8,
    },
    /// A handle this backend never handed out.
    #[error("unknown GPIO line handle {}", .0.0)]
    UnknownHandle(LineHandle),
    /// The backend cannot do this at all.
    #[error("the {backend} GPIO backend cannot {what}")]
    Unsupported {
        /// Backend name.
        backend: &'static str,
        /// What was asked, with the line.
        what: String,
    },
    /// A `--gpio` flag that does not parse.
    #[error(
        "invalid GPIO backend {spec:?}: {reason} (expected sim:FILE, cdev[:CHIP] or sysfs[:ROOT])"
    )]
    BadSpec {
        /// The flag value.
        spec: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// An allowlist entry that does not parse.
    #[error("invalid GPIO allowlist entry {entry:?}: {reason}")]
    BadAllowlist {
        /// The entry.
        entry: String,
        /// What is wrong.
        reason: &'static str,
    },
}

/// Which backend to open, as given on the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendSpec {
    /// No hardware; changes are logged to this JSON-lines file.
    Sim {
        /// The log, appended to.
        log: PathBuf,
    },
    /// GPIO character device.
    Cdev {
        /// Chip for lines given without one (normally `gpiochip0`).
        default_chip: String,
    },
    /// Legacy sysfs interface.
    Sysfs {
        /// Normally [`DEFAULT_SYSFS_ROOT`]; configurable for tests and for
        /// boxes that bind-mount it elsewhere.
        root: PathBuf,
    },
}

impl FromStr for BackendSpec {
    type Err = GpioError;

    /// Parses `sim:FILE`, `cdev`, `cdev:CHIP`, `sysfs` or `sysfs:ROOT`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |reason| GpioError::BadSpec {
            spec: s.to_owned(),
            reason,
        };
        let (kind, arg) = match s.split_once(':') {
            Some((k, a)) => (k, Some(a)),
            None => (s, None),
        };
        match (kind, arg) {
            ("sim", Some(file)) if !file.is_empty() => Ok(BackendSpec::Sim { log: file.into() }),
            ("sim", _) => Err(bad("sim needs a log file: sim:FILE")),
            ("cdev", None) => Ok(BackendSpec::Cdev {
                default_chip: DEFAULT_CHIP.to_owned(),
            }),
            ("cdev", Some(chip)) if !chip.is_empty() => Ok(BackendSpec::Cdev {
                default_chip: chip.to_owned(),
            }),
            ("sysfs", None) => Ok(BackendSpec::Sysfs {
                root: DEFAULT_SYSFS_ROOT.into(),
            }),
            ("sysfs", Some(root)) if !root.is_empty() => {
                Ok(BackendSpec::Sysfs { root: root.into() })
            }
            ("cdev" | "sysfs", Some(_)) => Err(bad("empty argument after ':'")),
            _ => Err(bad("unknown backend")),
        }
    }
}

impl fmt::Display for BackendSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendSpec::Sim { log } => write!(f, "sim:{}", log.display()),
            BackendSpec::Cdev { default_chip } => write!(f, "cdev:{default_chip}"),
            BackendSpec::Sysfs { root } => write!(f, "sysfs:{}", root.display()),
        }
    }
}

/// Open the backend `spec` names, enforcing `allow` on every request.
///
/// Fails at start-up rather than at the first firing when the hardware is
/// missing: the cdev backend checks that its default chip opens, the sysfs
/// backend that `ROOT/export` exists, the sim backend that its log opens.
pub fn open_backend(spec: &BackendSpec, allow: Allowlist) -> Result<Box<dyn Gpio>, GpioError> {
    Ok(match spec {
        BackendSpec::Sim { log } => Box::new(sim::SimGpio::open(log, allow)?),
        BackendSpec::Cdev { default_chip } => Box::new(cdev::CdevGpio::open(default_chip, allow)?),
        BackendSpec::Sysfs { root } => Box::new(sysfs::SysfsGpio::open(root, allow)?),
    })
}

/// `chip:line` for messages; a line without chip shows the chip it defaults to.
pub(crate) fn describe_ref(line: &LineRef, default_chip: Option<&str>) -> String {
    match (line.chip.as_deref().or(default_chip), &line.line) {
        (Some(chip), l) => format!("{chip}:{l}"),
        (None, l) => l.to_string(),
    }
}

/// Parse `chip:line` or `line`; a line of digits is an offset, anything else
/// a name (so a numeric *name* cannot be written here, only in a pack).
pub fn parse_line_ref(s: &str) -> Result<LineRef, GpioError> {
    let bad = |reason| GpioError::BadAllowlist {
        entry: s.to_owned(),
        reason,
    };
    let (chip, line) = match s.split_once(':') {
        Some((c, l)) => {
            if c.is_empty() {
                return Err(bad("empty chip before ':'"));
            }
            (Some(c.to_owned()), l)
        }
        None => (None, s),
    };
    if line.is_empty() {
        return Err(bad("empty line"));
    }
    let line = if line.bytes().all(|b| b.is_ascii_digit()) {
        Line::Offset(line.parse().map_err(|_| bad("offset out of range"))?)
    } else {
        Line::Name(line.to_owned())
    };
    Ok(LineRef { chip, line })
}

/// Validate a level before it reaches hardware: the pack validator already
/// checks it, but the agent does not trust that (principle 2).
pub(crate) fn check_value(value: u8, line: impl FnOnce() -> String) -> Result<(), GpioError> {
    if value > 1 {
        return Err(GpioError::InvalidValue {
            line: line(),
            value,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_spec_parses_the_cli_forms() {
        assert_eq!(
            "sim:/tmp/x.log".parse::<BackendSpec>().ok(),
            Some(BackendSpec::Sim {
                log: "/tmp/x.log".into()
            })
        );
        assert_eq!(
            "cdev".parse::<BackendSpec>().ok(),
            Some(BackendSpec::Cdev {
                default_chip: "gpiochip0".into()
            })
        );
        assert_eq!(
            "cdev:gpiochip2".parse::<BackendSpec>().ok(),
            Some(BackendSpec::Cdev {
                default_chip: "gpiochip2".into()
            })
        );
        assert_eq!(
            "sysfs".parse::<BackendSpec>().ok(),
            Some(BackendSpec::Sysfs {
                root: "/sys/class/gpio".into()
            })
        );
        assert_eq!(
            "sysfs:/tmp/g".parse::<BackendSpec>().ok(),
            Some(BackendSpec::Sysfs {
                root: "/tmp/g".into()
            })
        );
        for bad in ["sim", "sim:", "cdev:", "gpio", "", "sysfs:"] {
            let err = bad.parse::<BackendSpec>().err().map(|e| e.to_string());
            assert!(
                err.as_deref()
                    .is_some_and(|e| e.contains("expected sim:FILE")),
                "{bad:?} -> {err:?}"
            );
        }
    }

    #[test]
    fn line_refs_parse_offsets_and_names() {
        let r = parse_line_ref("gpiochip1:12").ok();
        assert_eq!(
            r,
            Some(LineRef {
                chip: Some("gpiochip1".into()),
                line: Line::Offset(12)
            })
        );
        let r = parse_line_ref("RELAY_MAIN").ok();
        assert_eq!(
            r,
            Some(LineRef {
                chip: None,
                line: Line::Name("RELAY_MAIN".into())
            })
        );
        assert!(parse_line_ref(":3").is_err());
        assert!(parse_line_ref("gpiochip0:").is_err());
        assert!(parse_line_ref("99999999999").is_err());
    }
}
