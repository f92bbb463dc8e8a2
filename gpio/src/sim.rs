//! The simulated backend: no hardware, every change logged.
//!
//! End-to-end tests run the real agent binary with `--gpio sim:FILE`, then
//! read `FILE` to see what the device would have done, including after they
//! `kill -9` the agent. So each write is formatted into a buffer and handed to
//! the kernel with a single `write(2)` on an `O_APPEND` descriptor: no
//! user-space buffer that a SIGKILL could lose, and no interleaving with
//! another writer of the same file. No `fsync`: a killed process loses nothing
//! that reached the page cache, and the sim does not model power loss.
//!
//! Log format, one JSON object per line:
//! `{"t":NS,"chip":"gpiochip0","line":12,"value":1,"execution_id":"..."}`
//! where `line` is the offset number or the name string as written, and
//! `chip` the chip as written or [`DEFAULT_CHIP`]. Every write is logged, also
//! one that repeats the current level: the log is the record of what the agent
//! *drove*, and a safe-state write of 0 must show even on a line already at 0.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use baton_proto::pack::{Line, LineRef};
use serde::Serialize;

use super::allow::Target;
use super::held::{self, HeldLine};
use super::{
    Allowlist, DEFAULT_CHIP, DirectLine, Direction, Gpio, GpioError, LineHandle, check_value,
};
use std::sync::Arc;
#[cfg(feature = "fault-injection")]
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// In-memory lines plus an append-only change log.
#[derive(Debug)]
pub struct SimGpio {
    log: File,
    log_path: PathBuf,
    allow: Allowlist,
    lines: Vec<SimLine>,
    by_ref: HashMap<(String, Line), LineHandle>,
    buf: Vec<u8>,
}

#[derive(Debug)]
struct SimLine {
    chip: String,
    line: Line,
    output: bool,
    level: u8,
}

impl HeldLine for SimLine {
    fn is_output(&self) -> bool {
        self.output
    }
    fn last_level(&self) -> u8 {
        self.level
    }
    fn name(&self) -> String {
        format!("{}:{}", self.chip, self.line)
    }
}

#[derive(Serialize)]
struct Record<'a> {
    t: i64,
    chip: &'a str,
    line: LineJson<'a>,
    value: u8,
    execution_id: &'a str,
}

#[derive(Serialize)]
#[serde(untagged)]
enum LineJson<'a> {
    Offset(u32),
    Name(&'a str),
}

impl SimGpio {
    /// Open (create if needed) the log for appending.
    pub fn open(log: &Path, allow: Allowlist) -> Result<Self, GpioError> {
        let file = OpenOptions::new()
            .append(true)
            .create(true)
            .open(log)
            .map_err(|source| GpioError::Io {
                op: "open sim log",
                line: log.display().to_string(),
                source,
            })?;
        Ok(SimGpio {
            log: file,
            log_path: log.to_owned(),
            allow,
            lines: Vec::new(),
            by_ref: HashMap::new(),
            buf: Vec::with_capacity(256),
        })
    }

    fn request_dir(&mut self, line: &LineRef, dir: Direction) -> Result<LineHandle, GpioError> {
        let chip = line.chip.as_deref().unwrap_or(DEFAULT_CHIP);
        let key = (chip.to_owned(), line.line.clone());
        if let Some(&h) = self.by_ref.get(&key) {
            if dir == Direction::Output
                && let Some(l) = self.lines.get_mut(h.0 as usize)
            {
                l.output = true;
            }
            return Ok(h);
        }
        let (offset, name) = match &line.line {
            Line::Offset(o) => (Some(*o), None),
            Line::Name(n) => (None, Some(n.as_str())),
        };
        let target = Target {
            chip: Some(chip),
            offset,
            name,
        };
        if !self.allow.permits(Some(DEFAULT_CHIP), target) {
            return Err(self.allow.refuse(line, Some(DEFAULT_CHIP)));
        }
        let h =
            LineHandle(
                u32::try_from(self.lines.len()).map_err(|_| GpioError::Unsupported {
                    backend: "sim",
                    what: "request more than 2^32 lines".to_owned(),
                })?,
            );
        self.lines.push(SimLine {
            chip: key.0.clone(),
            line: key.1.clone(),
            output: dir == Direction::Output,
            level: 0,
        });
        self.by_ref.insert(key, h);
        Ok(h)
    }

    fn line(&self, h: LineHandle) -> Result<&SimLine, GpioError> {
        self.lines
            .get(h.0 as usize)
            .ok_or(GpioError::UnknownHandle(h))
    }
}

impl Gpio for SimGpio {
    fn request(&mut self, line: &LineRef) -> Result<LineHandle, GpioError> {
        self.request_dir(line, Direction::Output)
    }

    fn request_input(&mut self, line: &LineRef) -> Result<LineHandle, GpioError> {
        self.request_dir(line, Direction::Input)
    }

    fn write(
        &mut self,
        h: LineHandle,
        value: u8,
        t_ns: i64,
        execution_id: &str,
    ) -> Result<(), GpioError> {
        #[cfg(feature = "fault-injection")]
        hang_point();
        // Field access, not `self.line(h)`: `l` must not borrow all of `self`
        // while the write buffer is borrowed mutably below.
        let l = self
            .lines
            .get(h.0 as usize)
            .ok_or(GpioError::UnknownHandle(h))?;
        check_value(value, || self.describe(h))?;
        if !l.output {
            return Err(GpioError::NotOutput {
                line: self.describe(h),
            });
        }
        let rec = Record {
            t: t_ns,
            chip: &l.chip,
            line: match &l.line {
                Line::Offset(o) => LineJson::Offset(*o),
                Line::Name(n) => LineJson::Name(n),
            },
            value,
            execution_id,
        };
        // The buffer is reused across writes; taken out so `self` stays
        // borrowable for the record and the error message.
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        let res = serde_json::to_writer(&mut buf, &rec)
            .map_err(std::io::Error::from)
            .and_then(|()| {
                buf.push(b'\n');
                // One write(2): a regular file on O_APPEND takes the whole
                // record or fails (a short write needs ENOSPC or a signal
                // mid-copy; write_all then finishes the line rather than
                // leave it torn).
                (&self.log).write_all(&buf)
            });
        self.buf = buf;
        res.map_err(|source| GpioError::Io {
            op: "append to sim log",
            line: format!("{} ({})", self.describe(h), self.log_path.display()),
            source,
        })?;
        if let Some(l) = self.lines.get_mut(h.0 as usize) {
            l.level = value;
        }
        Ok(())
    }

    fn read(&mut self, h: LineHandle) -> Result<u8, GpioError> {
        Ok(self.line(h)?.level)
    }

    fn level(&self, h: LineHandle) -> Option<u8> {
        held::level(&self.lines, h)
    }

    fn describe(&self, h: LineHandle) -> String {
        held::describe(&self.lines, h)
    }

    fn direct(&self, h: LineHandle) -> Option<Arc<dyn DirectLine>> {
        let l = self.lines.get(h.0 as usize).filter(|l| l.output)?;
        let log = self.log.try_clone().ok()?;
        Some(Arc::new(SimDirect {
            log,
            chip: l.chip.clone(),
            line: l.line.clone(),
        }))
    }
}

/// A sim line driven directly: its own descriptor on the log (`dup`),
/// one `write(2)` per change, as the backend's.
#[derive(Debug)]
struct SimDirect {
    log: File,
    chip: String,
    line: Line,
}

impl DirectLine for SimDirect {
    fn write(&self, value: u8, t_ns: i64, label: &str) -> Result<(), GpioError> {
        #[cfg(feature = "fault-injection")]
        if HANG_ALL.load(Ordering::Acquire) && HUNG.load(Ordering::Acquire) {
            hang();
        }
        check_value(value, || format!("{}:{}", self.chip, self.line))?;
        let rec = Record {
            t: t_ns,
            chip: &self.chip,
            line: match &self.line {
                Line::Offset(o) => LineJson::Offset(*o),
                Line::Name(n) => LineJson::Name(n),
            },
            value,
            execution_id: label,
        };
        let mut buf = serde_json::to_vec(&rec).map_err(|e| GpioError::Io {
            op: "append to sim log",
            line: format!("{}:{}", self.chip, self.line),
            source: e.into(),
        })?;
        buf.push(b'\n');
        (&self.log).write_all(&buf).map_err(|source| GpioError::Io {
            op: "append to sim log",
            line: format!("{}:{}", self.chip, self.line),
            source,
        })
    }
}

/// Writes through the backend left before the injected hang (0: off).
#[cfg(feature = "fault-injection")]
static HANG_AFTER: AtomicU64 = AtomicU64::new(0);
/// The injected hang has begun.
#[cfg(feature = "fault-injection")]
static HUNG: AtomicBool = AtomicBool::new(false);
/// The hang takes the direct writes too (a hung chip, not a hung call).
#[cfg(feature = "fault-injection")]
static HANG_ALL: AtomicBool = AtomicBool::new(false);

/// Test hook (`run --inject-gpio-hang-after N [--inject-gpio-hang-all]`,
/// hidden): after N writes through the backend, its next write never
/// returns (the dispatcher thread stays inside the call), like a driver
/// wedged on a dead I²C expander. With `all`, the direct writes
/// ([`Gpio::direct`]) hang too, from then on: the chip itself is hung.
#[cfg(feature = "fault-injection")]
pub fn inject_hang(after: u64, all: bool) {
    HANG_ALL.store(all, Ordering::Release);
    HANG_AFTER.store(after.saturating_add(1), Ordering::Release);
}

#[cfg(feature = "fault-injection")]
fn hang_point() {
    let left = HANG_AFTER.load(Ordering::Acquire);
    match left {
        0 => {}
        1 => {
            HUNG.store(true, Ordering::Release);
            hang();
        }
        n => HANG_AFTER.store(n - 1, Ordering::Release),
    }
}

#[cfg(feature = "fault-injection")]
fn hang() -> ! {
    loop {
        std::thread::park();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn off(chip: Option<&str>, o: u32) -> LineRef {
        LineRef {
            chip: chip.map(str::to_owned),
            line: Line::Offset(o),
        }
    }

    fn name(n: &str) -> LineRef {
        LineRef {
            chip: None,
            line: Line::Name(n.to_owned()),
        }
    }

    #[test]
    fn writes_are_logged_one_json_line_each() -> Result<(), GpioError> {
        let dir = tempfile::tempdir().map_err(|e| GpioError::Io {
            op: "tempdir",
            line: String::new(),
            source: e,
        })?;
        let path = dir.path().join("gpio.log");
        let mut g = SimGpio::open(&path, Allowlist::all())?;
        let a = g.request(&off(None, 12))?;
        let b = g.request(&name("RELAY_MAIN"))?;
        assert_eq!(g.read(a)?, 0, "lines start low");
        assert_eq!(g.level(a), Some(0));
        g.write(a, 1, 1_000, "exec-1")?;
        g.write(b, 1, 2_000, "exec-2")?;
        g.write(a, 0, 3_000, "exec-3")?;
        assert_eq!(g.read(a)?, 0);
        assert_eq!(g.read(b)?, 1);
        assert_eq!(g.level(b), Some(1));
        assert_eq!(g.describe(b), "gpiochip0:RELAY_MAIN");

        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_default())
            .collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert_eq!(
            lines[0],
            serde_json::json!({"t": 1000, "chip": "gpiochip0", "line": 12, "value": 1, "execution_id": "exec-1"})
        );
        assert_eq!(lines[1]["line"], "RELAY_MAIN");
        assert_eq!(lines[2]["value"], 0);
        // Key order is part of the format people grep for.
        assert!(text.starts_with(r#"{"t":1000,"chip":"gpiochip0","line":12,"value":1,"#));
        Ok(())
    }

    #[test]
    fn reopening_appends() -> Result<(), GpioError> {
        let dir = tempfile::tempdir().map_err(|e| GpioError::Io {
            op: "tempdir",
            line: String::new(),
            source: e,
        })?;
        let path = dir.path().join("gpio.log");
        for i in 0..2 {
            let mut g = SimGpio::open(&path, Allowlist::all())?;
            let h = g.request(&off(Some("gpiochip1"), 3))?;
            g.write(h, 1, i, "x")?;
        }
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        assert_eq!(text.lines().count(), 2);
        assert!(text.contains(r#""chip":"gpiochip1""#));
        Ok(())
    }

    #[test]
    fn handles_are_idempotent_and_directions_upgrade() -> Result<(), GpioError> {
        let dir = tempfile::tempdir().map_err(|e| GpioError::Io {
            op: "tempdir",
            line: String::new(),
            source: e,
        })?;
        let mut g = SimGpio::open(&dir.path().join("l"), Allowlist::all())?;
        let i = g.request_input(&off(None, 5))?;
        assert_eq!(g.level(i), None, "inputs have no driven level");
        let err = g.write(i, 1, 0, "x").err().map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("GPIO line gpiochip0:5 was requested as an input and cannot be driven")
        );
        // `chip: None` and the default chip are the same line.
        let o = g.request(&off(Some("gpiochip0"), 5))?;
        assert_eq!(o, i);
        assert_eq!(g.request(&off(None, 5))?, i);
        g.write(o, 1, 0, "x")?;
        assert_eq!(g.request_input(&off(None, 5))?, i);
        assert_eq!(g.level(i), Some(1), "still an output");

        let err = g.write(o, 2, 0, "x").err().map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("invalid level 2 for GPIO line gpiochip0:5: must be 0 or 1")
        );
        assert!(matches!(
            g.write(LineHandle(99), 1, 0, "x"),
            Err(GpioError::UnknownHandle(LineHandle(99)))
        ));
        Ok(())
    }

    #[test]
    fn allowlist_is_enforced_at_request() -> Result<(), GpioError> {
        let dir = tempfile::tempdir().map_err(|e| GpioError::Io {
            op: "tempdir",
            line: String::new(),
            source: e,
        })?;
        let allow: Allowlist = "17,RELAY_MAIN".parse()?;
        let mut g = SimGpio::open(&dir.path().join("l"), allow)?;
        g.request(&off(None, 17))?;
        g.request(&name("RELAY_MAIN"))?;
        let err = g.request(&off(None, 18)).err();
        let msg = err.as_ref().map(|e| e.to_string()).unwrap_or_default();
        assert!(matches!(err, Some(GpioError::NotAllowed { .. })), "{msg}");
        assert_eq!(
            msg,
            "GPIO line gpiochip0:18 is not on the agent's allowlist (allowed: 17, RELAY_MAIN)"
        );
        assert!(g.request(&off(Some("gpiochip1"), 17)).is_err());
        Ok(())
    }
}
