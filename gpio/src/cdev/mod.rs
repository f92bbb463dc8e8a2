//! The character-device backend (`/dev/gpiochipN`, uAPI v2, via `gpiocdev`).
//!
//! Lines are named as libgpiod names them: an offset on a chip, or a line
//! name. A name with a chip is looked up on that chip; a name without one is
//! searched on every chip, and a name found more than once is refused
//! ([`GpioError::AmbiguousName`]) rather than "first match wins", because the
//! first match could be the wrong actuator.
//!
//! Each line gets its own `gpiocdev::Request`, made once and kept open; a
//! write is then one `GPIO_V2_LINE_SET_VALUES_IOCTL` with a stack-allocated
//! value struct. Outputs are requested *as-is*, read, and only then switched
//! to output at the level read, so accepting a pack never moves a line.
//!
//! # Testing, and the gap
//!
//! Everything above the kernel sits behind a small seam, [`ChipSet`] (list
//! chips, list a chip's line names, open one line) and [`CdevLine`] (set /
//! get / make output), so name resolution, allowlisting, idempotent handles,
//! input→output upgrades and error messages are unit-tested against a fake.
//! [`SystemChips`], the thin `gpiocdev` implementation of the seam, is only
//! tested for its "no such chip" error: this machine and CI have no GPIO chip
//! and no `gpio-sim` kernel module. **Untested by `cargo test`**: the real
//! request (as-is → read → reconfigure to output), `set_lone_value`/
//! `lone_value` against a kernel, `EBUSY` from a line held by another
//! consumer, and line info from a real chip. `tests/vm-gpio/run.sh` covers
//! all but line names against a real driver (qemu's PL061 under Debian's
//! arm64 kernel, whose lines have no names), this ignored test included.
//! On a box that has a chip (or `gpio-sim`: `modprobe gpio-sim` plus a
//! configfs bank), run the ignored test
//! `cdev::tests::hardware_round_trip` (`cargo test -p baton-gpio --lib -- --ignored`) with
//! `BATON_TEST_GPIO_LINE=gpiochipN:OFFSET` naming a line that is safe to
//! toggle.

use std::collections::HashMap;
use std::io;

use baton_proto::pack::LineRef;

use super::allow::Target;
use super::held::{self, HeldLine};
use super::{Allowlist, DirectLine, Direction, Gpio, GpioError, LineHandle, check_value};
use std::sync::Arc;

/// Consumer label the kernel shows for our lines (`gpioinfo`).
pub const CONSUMER: &str = "baton-agent";

/// The seam between resolution logic and the kernel: chips and their lines.
pub trait ChipSet: Send + std::fmt::Debug {
    /// Chip names (`gpiochip0`, ...) in natural order.
    fn chip_names(&self) -> Result<Vec<String>, GpioError>;
    /// Names of the lines of `chip`, indexed by offset (`""` for unnamed).
    fn line_names(&self, chip: &str) -> Result<Vec<String>, GpioError>;
    /// Request one line. `Output` takes it without changing its level.
    fn open_line(
        &self,
        chip: &str,
        offset: u32,
        dir: Direction,
    ) -> Result<Box<dyn CdevLine>, io::Error>;
}

/// One requested line.
pub trait CdevLine: Send + std::fmt::Debug {
    /// Drive the line (must not allocate).
    fn set(&self, value: u8) -> io::Result<()>;
    /// Sample the line (an output reads back its level).
    fn get(&self) -> io::Result<u8>;
    /// Turn an input into an output at its current level; returns the level.
    fn make_output(&mut self) -> io::Result<u8>;
    /// A writer of the same line that does not go through this object (the
    /// same kernel line request), for [`Gpio::direct`].
    fn direct(&self) -> Option<Arc<dyn Fn(u8) -> io::Result<()> + Send + Sync>> {
        None
    }
}

mod resolve;
mod system;
#[cfg(test)]
mod tests;

pub use resolve::{Resolved, resolve};
pub use system::SystemChips;

/// GPIO lines on character devices.
#[derive(Debug)]
pub struct CdevGpio<C: ChipSet = SystemChips> {
    chips: C,
    default_chip: String,
    allow: Allowlist,
    lines: Vec<CdevEntry>,
    by_ref: HashMap<LineRef, LineHandle>,
    by_phys: HashMap<(String, u32), LineHandle>,
}

#[derive(Debug)]
struct CdevEntry {
    /// `chip:offset` plus the name if it has one, for messages.
    label: String,
    line: Box<dyn CdevLine>,
    output: bool,
    level: u8,
}

impl HeldLine for CdevEntry {
    fn is_output(&self) -> bool {
        self.output
    }
    fn last_level(&self) -> u8 {
        self.level
    }
    fn name(&self) -> String {
        self.label.clone()
    }
}

impl CdevGpio<SystemChips> {
    /// Open on the real `/dev`, failing now if `default_chip` cannot be read.
    pub fn open(default_chip: &str, allow: Allowlist) -> Result<Self, GpioError> {
        Self::with_chips(SystemChips::new("/dev"), default_chip, allow)
    }
}

impl<C: ChipSet> CdevGpio<C> {
    /// Open on any [`ChipSet`] (tests use a fake), checking `default_chip`.
    pub fn with_chips(chips: C, default_chip: &str, allow: Allowlist) -> Result<Self, GpioError> {
        chips.line_names(default_chip)?;
        Ok(CdevGpio {
            chips,
            default_chip: default_chip.to_owned(),
            allow,
            lines: Vec::new(),
            by_ref: HashMap::new(),
            by_phys: HashMap::new(),
        })
    }

    fn request_dir(&mut self, line: &LineRef, dir: Direction) -> Result<LineHandle, GpioError> {
        if let Some(&h) = self.by_ref.get(line) {
            self.upgrade(h, dir)?;
            return Ok(h);
        }
        let r = resolve(&self.chips, &self.default_chip, line)?;
        let target = Target {
            chip: Some(&r.chip),
            offset: Some(r.offset),
            name: r.name.as_deref(),
        };
        if !self.allow.permits(Some(&self.default_chip), target) {
            return Err(self.allow.refuse(line, Some(&self.default_chip)));
        }
        let key = (r.chip.clone(), r.offset);
        if let Some(&h) = self.by_phys.get(&key) {
            self.by_ref.insert(line.clone(), h);
            self.upgrade(h, dir)?;
            return Ok(h);
        }
        let label = match &r.name {
            Some(n) => format!("{}:{} ({n})", r.chip, r.offset),
            None => format!("{}:{}", r.chip, r.offset),
        };
        let io = |op, source| GpioError::Io {
            op,
            line: label.clone(),
            source,
        };
        let l = self
            .chips
            .open_line(&r.chip, r.offset, dir)
            .map_err(|e| io("request", e))?;
        let level = match dir {
            Direction::Output => l.get().map_err(|e| io("read back", e))?,
            Direction::Input => 0,
        };
        let h =
            LineHandle(
                u32::try_from(self.lines.len()).map_err(|_| GpioError::Unsupported {
                    backend: "cdev",
                    what: "request more than 2^32 lines".to_owned(),
                })?,
            );
        self.lines.push(CdevEntry {
            label,
            line: l,
            output: dir == Direction::Output,
            level,
        });
        self.by_ref.insert(line.clone(), h);
        self.by_phys.insert(key, h);
        Ok(h)
    }

    fn upgrade(&mut self, h: LineHandle, dir: Direction) -> Result<(), GpioError> {
        let Some(e) = self.lines.get_mut(h.0 as usize) else {
            return Err(GpioError::UnknownHandle(h));
        };
        if dir == Direction::Output && !e.output {
            e.level = e.line.make_output().map_err(|source| GpioError::Io {
                op: "reconfigure as output",
                line: e.label.clone(),
                source,
            })?;
            e.output = true;
        }
        Ok(())
    }

    fn entry(&self, h: LineHandle) -> Result<&CdevEntry, GpioError> {
        self.lines
            .get(h.0 as usize)
            .ok_or(GpioError::UnknownHandle(h))
    }
}

impl<C: ChipSet> Gpio for CdevGpio<C> {
    fn request(&mut self, line: &LineRef) -> Result<LineHandle, GpioError> {
        self.request_dir(line, Direction::Output)
    }

    fn request_input(&mut self, line: &LineRef) -> Result<LineHandle, GpioError> {
        self.request_dir(line, Direction::Input)
    }

    fn write(&mut self, h: LineHandle, value: u8, _t: i64, _id: &str) -> Result<(), GpioError> {
        let Some(e) = self.lines.get_mut(h.0 as usize) else {
            return Err(GpioError::UnknownHandle(h));
        };
        check_value(value, || e.label.clone())?;
        if !e.output {
            return Err(GpioError::NotOutput {
                line: e.label.clone(),
            });
        }
        e.line.set(value).map_err(|source| GpioError::Io {
            op: "set value",
            line: e.label.clone(),
            source,
        })?;
        e.level = value;
        Ok(())
    }

    fn read(&mut self, h: LineHandle) -> Result<u8, GpioError> {
        let e = self.entry(h)?;
        e.line.get().map_err(|source| GpioError::Io {
            op: "get value",
            line: e.label.clone(),
            source,
        })
    }

    fn level(&self, h: LineHandle) -> Option<u8> {
        held::level(&self.lines, h)
    }

    fn describe(&self, h: LineHandle) -> String {
        held::describe(&self.lines, h)
    }

    fn direct(&self, h: LineHandle) -> Option<Arc<dyn DirectLine>> {
        let e = self.lines.get(h.0 as usize).filter(|e| e.output)?;
        Some(Arc::new(CdevDirect {
            set: e.line.direct()?,
            label: e.label.clone(),
        }))
    }
}

/// A cdev line driven directly: `GPIO_V2_LINE_SET_VALUES_IOCTL` on the
/// same line request (the kernel serialises it with the backend's).
struct CdevDirect {
    set: Arc<dyn Fn(u8) -> io::Result<()> + Send + Sync>,
    label: String,
}

impl std::fmt::Debug for CdevDirect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CdevDirect")
            .field("label", &self.label)
            .finish()
    }
}

impl DirectLine for CdevDirect {
    fn write(&self, value: u8, _t_ns: i64, _label: &str) -> Result<(), GpioError> {
        check_value(value, || self.label.clone())?;
        (self.set)(value).map_err(|source| GpioError::Io {
            op: "set value",
            line: self.label.clone(),
            source,
        })
    }
}
