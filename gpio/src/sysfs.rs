//! The legacy sysfs backend (`/sys/class/gpio`: `export`, `gpioN/direction`,
//! `gpioN/value`), for old vendor kernels without the character device.
//!
//! # Why our own ~200 lines and not the `sysfs_gpio` crate
//!
//! - `sysfs_gpio` hard-codes `/sys/class/gpio`; we need a root parameter so
//!   tests (a tempdir, or tmpfs mounted in a private mount namespace) and
//!   boxes that bind-mount the tree elsewhere can use it.
//! - It reopens `gpioN/value` on every `set_value`, which allocates a path
//!   and costs an `open`/`close` per change on the real-time path. We open
//!   the value file once at request time and `pwrite` one byte at offset 0
//!   (`pread` for reads), which sysfs attributes support without a seek.
//! - Its edge-polling path has a known bug, and we need none of it.
//! - Its `set_direction(Out)` writes `out`, which drives the line low on
//!   the spot; we write `high`/`low` (the kernel's glitch-free form) with
//!   the level the line already has, so requesting never moves a line.
//!
//! # Lines
//!
//! - `chip: None`, offset `N` → the global sysfs number `N` (`gpioN`), which
//!   is what sysfs users write. Allowlist entries without chip mean global
//!   numbers here.
//! - `chip: Some(C)`, offset `O` → `base(C) + O`, where `base` is read from
//!   `ROOT/C/base` and `O` is checked against `ROOT/C/ngpio`. Note sysfs names
//!   chip directories by *base* (`gpiochip512` on a Raspberry Pi 5), not by
//!   the cdev index.
//! - Line names: sysfs has none, so named lines are refused
//!   ([`GpioError::Unsupported`]); use the cdev backend for names.
//!
//! Lines are never unexported: unexporting may turn an output back into an
//! input and drop whatever it drives. `active_low` is left as configured.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use baton_proto::pack::{Line, LineRef};

use super::allow::Target;
use super::held::{self, HeldLine};
use super::{
    Allowlist, DirectLine, Direction, Gpio, GpioError, LineHandle, check_value, describe_ref,
};

/// Lines exported through a sysfs GPIO tree rooted at `root`.
#[derive(Debug)]
pub struct SysfsGpio {
    root: PathBuf,
    allow: Allowlist,
    lines: Vec<SysfsLine>,
    by_ref: HashMap<LineRef, LineHandle>,
    by_number: HashMap<u32, LineHandle>,
}

#[derive(Debug)]
struct SysfsLine {
    number: u32,
    /// `chip:offset` as requested, when a chip was given (for messages).
    label: Option<String>,
    /// `gpioN/value`, open read-write for the life of the backend (shared
    /// with the line's direct writer).
    value: std::sync::Arc<File>,
    output: bool,
    level: u8,
}

impl HeldLine for SysfsLine {
    fn is_output(&self) -> bool {
        self.output
    }
    fn last_level(&self) -> u8 {
        self.level
    }
    fn name(&self) -> String {
        match &self.label {
            Some(l) => format!("{l} (gpio{})", self.number),
            None => format!("gpio{}", self.number),
        }
    }
}

impl SysfsGpio {
    /// Use the tree at `root`; fails if `root/export` is missing (no sysfs
    /// GPIO support in this kernel, or the wrong root).
    pub fn open(root: &Path, allow: Allowlist) -> Result<Self, GpioError> {
        let export = root.join("export");
        if !export.exists() {
            return Err(GpioError::NoSuchChip {
                chip: "sysfs".to_owned(),
                reason: format!(
                    "{} does not exist (kernel without CONFIG_GPIO_SYSFS? use the cdev backend)",
                    export.display()
                ),
            });
        }
        Ok(SysfsGpio {
            root: root.to_owned(),
            allow,
            lines: Vec::new(),
            by_ref: HashMap::new(),
            by_number: HashMap::new(),
        })
    }

    fn request_dir(&mut self, line: &LineRef, dir: Direction) -> Result<LineHandle, GpioError> {
        if let Some(&h) = self.by_ref.get(line) {
            self.upgrade(h, dir)?;
            return Ok(h);
        }
        let desc = || describe_ref(line, None);
        let offset = offset_of(line)?;
        let target = Target {
            chip: line.chip.as_deref(),
            offset: Some(offset),
            name: None,
        };
        if !self.allow.permits(None, target) {
            return Err(self.allow.refuse(line, None));
        }
        let number = match &line.chip {
            None => offset,
            Some(chip) => self.chip_number(chip, offset, &desc())?,
        };
        if let Some(&h) = self.by_number.get(&number) {
            self.by_ref.insert(line.clone(), h);
            self.upgrade(h, dir)?;
            return Ok(h);
        }

        let label = line.chip.as_ref().map(|_| desc());
        let name = match &label {
            Some(l) => format!("{l} (gpio{number})"),
            None => format!("gpio{number}"),
        };
        let (value, level) = self.export_and_open(number, name)?;
        let h =
            LineHandle(
                u32::try_from(self.lines.len()).map_err(|_| GpioError::Unsupported {
                    backend: "sysfs",
                    what: "request more than 2^32 lines".to_owned(),
                })?,
            );
        let value = std::sync::Arc::new(value);
        self.lines.push(SysfsLine {
            number,
            label,
            value,
            output: false,
            level,
        });
        self.set_direction(h, dir)?;
        self.by_ref.insert(line.clone(), h);
        self.by_number.insert(number, h);
        Ok(h)
    }

    /// Exports line `number` (named `name` in errors) and opens its value
    /// file. Returns the file and the level read from it.
    fn export_and_open(&self, number: u32, name: String) -> Result<(File, u8), GpioError> {
        let gdir = self.root.join(format!("gpio{number}"));
        // Always export: on a real kernel an already-exported line answers
        // EBUSY, which is fine when its directory is there (ours from a
        // previous run, or exported by hand).
        if let Err(source) = write_attr(&self.root.join("export"), &number.to_string())
            && !gdir.exists()
        {
            return Err(GpioError::Io {
                op: "export",
                line: name,
                source,
            });
        }
        if !gdir.exists() {
            return Err(GpioError::NoSuchLine {
                line: name,
                reason: format!("export succeeded but {} did not appear", gdir.display()),
            });
        }
        let value = OpenOptions::new()
            .read(true)
            .write(true)
            .open(gdir.join("value"))
            .map_err(|source| GpioError::Io {
                op: "open value",
                line: name.clone(),
                source,
            })?;
        let level = read_level(&value).map_err(|source| GpioError::Io {
            op: "read value",
            line: name,
            source,
        })?;
        Ok((value, level))
    }

    /// Global number of `offset` on the chip directory `chip`.
    fn chip_number(&self, chip: &str, offset: u32, line: &str) -> Result<u32, GpioError> {
        let cdir = self.root.join(chip);
        let read_u32 = |attr: &str| -> Result<u32, GpioError> {
            let p = cdir.join(attr);
            let text = fs::read_to_string(&p).map_err(|e| GpioError::NoSuchChip {
                chip: chip.to_owned(),
                reason: format!(
                    "cannot read {}: {e} (sysfs names chips by base number, e.g. gpiochip512)",
                    p.display()
                ),
            })?;
            text.trim().parse().map_err(|_| GpioError::NoSuchChip {
                chip: chip.to_owned(),
                reason: format!("{} holds {:?}, not a number", p.display(), text.trim()),
            })
        };
        let base = read_u32("base")?;
        let ngpio = read_u32("ngpio")?;
        if offset >= ngpio {
            return Err(GpioError::NoSuchLine {
                line: line.to_owned(),
                reason: format!("{chip} has {ngpio} lines (offsets 0..{ngpio})"),
            });
        }
        base.checked_add(offset)
            .ok_or_else(|| GpioError::NoSuchLine {
                line: line.to_owned(),
                reason: format!("base {base} + offset {offset} overflows"),
            })
    }

    /// An input line requested as an output becomes one, at its level.
    fn upgrade(&mut self, h: LineHandle, dir: Direction) -> Result<(), GpioError> {
        match self.lines.get(h.0 as usize) {
            Some(l) if dir == Direction::Output && !l.output => self.set_direction(h, dir),
            _ => Ok(()),
        }
    }

    /// Apply `dir` to a freshly exported or input line without moving it.
    fn set_direction(&mut self, h: LineHandle, dir: Direction) -> Result<(), GpioError> {
        let name = self.describe(h);
        let Some(l) = self.lines.get_mut(h.0 as usize) else {
            return Err(GpioError::UnknownHandle(h));
        };
        let path = self.root.join(format!("gpio{}/direction", l.number));
        let io = |op, source| GpioError::Io {
            op,
            line: name.clone(),
            source,
        };
        let current = fs::read_to_string(&path).map_err(|e| io("read direction", e))?;
        let is_out = current.trim() == "out";
        match dir {
            Direction::Output if is_out => {
                // Already driven (say, by a previous run): keep it, and its level.
                l.level = read_level(&l.value).map_err(|e| io("read value", e))?;
            }
            Direction::Output => {
                l.level = read_level(&l.value).map_err(|e| io("read value", e))?;
                let v = if l.level == 1 { "high" } else { "low" };
                write_attr(&path, v).map_err(|e| io("set direction", e))?;
            }
            Direction::Input if is_out => {
                write_attr(&path, "in").map_err(|e| io("set direction", e))?;
            }
            Direction::Input => {}
        }
        l.output = dir == Direction::Output;
        Ok(())
    }

    fn line(&self, h: LineHandle) -> Result<&SysfsLine, GpioError> {
        self.lines
            .get(h.0 as usize)
            .ok_or(GpioError::UnknownHandle(h))
    }
}

/// Write a whole attribute like `echo V > FILE` does (truncate, one write).
fn write_attr(path: &Path, v: &str) -> io::Result<()> {
    OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)?
        .write_all(v.as_bytes())
}

/// `pread` the first byte of a value file; sysfs answers `0\n` or `1\n`.
fn read_level(f: &File) -> io::Result<u8> {
    let mut b = [0u8; 1];
    match f.read_at(&mut b, 0)? {
        1 if b[0] == b'0' => Ok(0),
        1 if b[0] == b'1' => Ok(1),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("value file holds {:?}, not 0 or 1", b[0] as char),
        )),
    }
}

/// The line's offset: sysfs numbers lines, it has no names.
fn offset_of(line: &LineRef) -> Result<u32, GpioError> {
    match &line.line {
        Line::Offset(o) => Ok(*o),
        Line::Name(n) => Err(GpioError::Unsupported {
            backend: "sysfs",
            what: format!(
                "resolve line name {n:?} (sysfs has no line names; use an offset or the cdev backend)"
            ),
        }),
    }
}

impl Gpio for SysfsGpio {
    fn request(&mut self, line: &LineRef) -> Result<LineHandle, GpioError> {
        self.request_dir(line, Direction::Output)
    }

    fn request_input(&mut self, line: &LineRef) -> Result<LineHandle, GpioError> {
        self.request_dir(line, Direction::Input)
    }

    fn write(&mut self, h: LineHandle, value: u8, _t: i64, _id: &str) -> Result<(), GpioError> {
        let l = self.line(h)?;
        check_value(value, || self.describe(h))?;
        if !l.output {
            return Err(GpioError::NotOutput {
                line: self.describe(h),
            });
        }
        // One pwrite(2) at offset 0 of the descriptor opened at request time:
        // no path, no allocation, no seek.
        let byte: &[u8; 1] = if value == 1 { b"1" } else { b"0" };
        match l.value.write_at(byte, 0) {
            Ok(1) => {}
            Ok(_) => {
                return Err(GpioError::Io {
                    op: "write value",
                    line: self.describe(h),
                    source: io::ErrorKind::WriteZero.into(),
                });
            }
            Err(source) => {
                return Err(GpioError::Io {
                    op: "write value",
                    line: self.describe(h),
                    source,
                });
            }
        }
        if let Some(l) = self.lines.get_mut(h.0 as usize) {
            l.level = value;
        }
        Ok(())
    }

    fn read(&mut self, h: LineHandle) -> Result<u8, GpioError> {
        read_level(&self.line(h)?.value).map_err(|source| GpioError::Io {
            op: "read value",
            line: self.describe(h),
            source,
        })
    }

    fn level(&self, h: LineHandle) -> Option<u8> {
        held::level(&self.lines, h)
    }

    fn describe(&self, h: LineHandle) -> String {
        held::describe(&self.lines, h)
    }

    fn direct(&self, h: LineHandle) -> Option<std::sync::Arc<dyn DirectLine>> {
        let l = self.lines.get(h.0 as usize).filter(|l| l.output)?;
        Some(std::sync::Arc::new(SysfsDirect {
            value: l.value.clone(),
            label: self.describe(h),
        }))
    }
}

/// A sysfs line driven directly: a `pwrite` on its value file (the
/// kernel's to serialise with the backend's).
#[derive(Debug)]
struct SysfsDirect {
    value: std::sync::Arc<File>,
    label: String,
}

impl DirectLine for SysfsDirect {
    fn write(&self, value: u8, _t_ns: i64, _label: &str) -> Result<(), GpioError> {
        check_value(value, || self.label.clone())?;
        let byte: &[u8; 1] = if value == 1 { b"1" } else { b"0" };
        match self.value.write_at(byte, 0) {
            Ok(1) => Ok(()),
            Ok(_) => Err(GpioError::Io {
                op: "write value",
                line: self.label.clone(),
                source: io::ErrorKind::WriteZero.into(),
            }),
            Err(source) => Err(GpioError::Io {
                op: "write value",
                line: self.label.clone(),
                source,
            }),
        }
    }
}
