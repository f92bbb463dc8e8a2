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
use std::path::{Path, PathBuf};

use baton_proto::pack::{Line, LineRef};
use gpiocdev::line::Value;

use super::allow::Target;
use super::{
    Allowlist, DirectLine, Direction, Gpio, GpioError, LineHandle, check_value, describe_ref,
};
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

/// Where a [`LineRef`] resolved to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    /// Chip name.
    pub chip: String,
    /// Offset on it.
    pub offset: u32,
    /// Its name, if the chip names it.
    pub name: Option<String>,
}

/// Resolve `line` the way libgpiod does, with `default_chip` for lines given
/// without chip by offset.
pub fn resolve(
    chips: &dyn ChipSet,
    default_chip: &str,
    line: &LineRef,
) -> Result<Resolved, GpioError> {
    let desc = || describe_ref(line, Some(default_chip));
    let named = |names: &[String], o: u32| names.get(o as usize).filter(|n| !n.is_empty()).cloned();
    match (&line.chip, &line.line) {
        (chip, Line::Offset(o)) => {
            let chip = chip.as_deref().unwrap_or(default_chip);
            let names = chips.line_names(chip)?;
            if *o as usize >= names.len() {
                return Err(GpioError::NoSuchLine {
                    line: desc(),
                    reason: format!(
                        "{chip} has {} lines (offsets 0..{})",
                        names.len(),
                        names.len()
                    ),
                });
            }
            Ok(Resolved {
                chip: chip.to_owned(),
                offset: *o,
                name: named(&names, *o),
            })
        }
        (Some(chip), Line::Name(n)) => {
            let names = chips.line_names(chip)?;
            let found: Vec<u32> = offsets_named(&names, n).collect();
            match found.as_slice() {
                [] => Err(GpioError::NoSuchLine {
                    line: desc(),
                    reason: format!("{chip} has no line named {n:?}"),
                }),
                [o] => Ok(Resolved {
                    chip: chip.clone(),
                    offset: *o,
                    name: Some(n.clone()),
                }),
                many => Err(GpioError::AmbiguousName {
                    name: n.clone(),
                    found: many
                        .iter()
                        .map(|o| format!("{chip}:{o}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                }),
            }
        }
        (None, Line::Name(n)) => {
            let all = chips.chip_names()?;
            let mut found = Vec::new();
            let mut unreadable = Vec::new();
            for chip in &all {
                match chips.line_names(chip) {
                    Ok(names) => found.extend(offsets_named(&names, n).map(|o| (chip.clone(), o))),
                    Err(e) => unreadable.push(format!("{chip} ({e})")),
                }
            }
            match found.len() {
                1 => {
                    let (chip, offset) = found.swap_remove(0);
                    Ok(Resolved {
                        chip,
                        offset,
                        name: Some(n.clone()),
                    })
                }
                0 => {
                    let mut reason = if all.is_empty() {
                        "no GPIO chips found in /dev".to_owned()
                    } else {
                        format!("no line named {n:?} on {}", all.join(", "))
                    };
                    if !unreadable.is_empty() {
                        reason += &format!("; could not read {}", unreadable.join(", "));
                    }
                    Err(GpioError::NoSuchLine {
                        line: n.clone(),
                        reason,
                    })
                }
                _ => Err(GpioError::AmbiguousName {
                    name: n.clone(),
                    found: found
                        .iter()
                        .map(|(c, o)| format!("{c}:{o}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                }),
            }
        }
    }
}

fn offsets_named<'a>(names: &'a [String], n: &'a str) -> impl Iterator<Item = u32> + 'a {
    names
        .iter()
        .enumerate()
        .filter(move |(_, name)| *name == n)
        .filter_map(|(o, _)| u32::try_from(o).ok())
}

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
        self.lines
            .get(h.0 as usize)
            .filter(|e| e.output)
            .map(|e| e.level)
    }

    fn describe(&self, h: LineHandle) -> String {
        match self.lines.get(h.0 as usize) {
            Some(e) => e.label.clone(),
            None => format!("<unknown line handle {}>", h.0),
        }
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

/// The real [`ChipSet`]: character devices under a directory (`/dev`).
#[derive(Debug)]
pub struct SystemChips {
    dev: PathBuf,
}

impl SystemChips {
    /// Chips under `dev` (normally `/dev`).
    pub fn new(dev: impl Into<PathBuf>) -> Self {
        SystemChips { dev: dev.into() }
    }

    fn path(&self, chip: &str) -> PathBuf {
        if chip.contains('/') {
            PathBuf::from(chip)
        } else {
            self.dev.join(chip)
        }
    }

    fn open_chip(&self, chip: &str) -> Result<gpiocdev::Chip, GpioError> {
        let path = self.path(chip);
        match path.symlink_metadata() {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(GpioError::NoSuchChip {
                    chip: chip.to_owned(),
                    reason: format!(
                        "{} does not exist: no GPIO character device (GPIO driver not loaded, \
                         or wrong chip; `gpiodetect` lists chips; old kernels need the sysfs backend)",
                        path.display()
                    ),
                });
            }
            Err(e) => {
                return Err(GpioError::NoSuchChip {
                    chip: chip.to_owned(),
                    reason: format!("cannot stat {}: {e}", path.display()),
                });
            }
            Ok(_) => {}
        }
        gpiocdev::Chip::from_path(&path).map_err(|e| GpioError::NoSuchChip {
            chip: chip.to_owned(),
            reason: format!("cannot open {}: {e}", path.display()),
        })
    }
}

fn cdev_io(e: gpiocdev::Error) -> io::Error {
    io::Error::other(e)
}

impl SystemChips {
    /// The consumer label of a line in use, if it is.
    fn holder(&self, chip: &str, offset: u32) -> Option<String> {
        let info = gpiocdev::Chip::from_path(self.path(chip))
            .ok()?
            .line_info(offset)
            .ok()?;
        info.used.then_some(info.consumer)
    }
}

/// Who holds a line, for a refused request: the legacy sysfs interface
/// (a line exported there stays held until unexported, e.g. by an agent
/// run earlier with `gpio: sysfs`), or another program or driver.
fn describe_holder(consumer: &str) -> String {
    match consumer {
        "sysfs" => "the sysfs interface (exported in /sys/class/gpio, e.g. by an agent run \
                    with `gpio: sysfs`: write its number to /sys/class/gpio/unexport)"
            .to_owned(),
        "" => "another consumer (unnamed: a driver or another program)".to_owned(),
        c => format!("consumer {c:?} (another program or a driver)"),
    }
}

impl ChipSet for SystemChips {
    fn chip_names(&self) -> Result<Vec<String>, GpioError> {
        if self.dev != Path::new("/dev") {
            return Err(GpioError::Unsupported {
                backend: "cdev",
                what: format!("search {} for chips (only /dev)", self.dev.display()),
            });
        }
        let chips = gpiocdev::chip::chips().map_err(|e| GpioError::NoSuchChip {
            chip: "*".to_owned(),
            reason: format!("cannot list GPIO chips in /dev: {e}"),
        })?;
        Ok(chips
            .iter()
            .filter_map(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .collect())
    }

    fn line_names(&self, chip: &str) -> Result<Vec<String>, GpioError> {
        let c = self.open_chip(chip)?;
        let err = |e: gpiocdev::Error| GpioError::NoSuchChip {
            chip: chip.to_owned(),
            reason: format!("cannot read line info: {e}"),
        };
        let n = c.info().map_err(err)?.num_lines;
        (0..n)
            .map(|o| c.line_info(o).map(|i| i.name).map_err(err))
            .collect()
    }

    fn open_line(
        &self,
        chip: &str,
        offset: u32,
        dir: Direction,
    ) -> Result<Box<dyn CdevLine>, io::Error> {
        let mut b = gpiocdev::Request::builder();
        b.on_chip(self.path(chip)).with_consumer(CONSUMER);
        match dir {
            // As-is: the kernel leaves direction and level alone; we switch
            // to output below at the level we read.
            Direction::Output => b.as_is(),
            Direction::Input => b.as_input(),
        };
        let req = b.with_line(offset).request().map_err(|e| {
            // The kernel only says EBUSY; who holds the line is in its
            // info (looked up on this error path only).
            match self.holder(chip, offset) {
                Some(consumer) => io::Error::other(format!(
                    "{e}: the line is held by {}",
                    describe_holder(&consumer)
                )),
                None => cdev_io(e),
            }
        })?;
        let mut line = SystemLine {
            req: Arc::new(req),
            offset,
        };
        if dir == Direction::Output {
            line.make_output()?;
        }
        Ok(Box::new(line))
    }
}

#[derive(Debug)]
struct SystemLine {
    /// Shared with the line's direct writer: `set_lone_value` takes
    /// `&self` and is one ioctl on the request's descriptor.
    req: Arc<gpiocdev::Request>,
    offset: u32,
}

impl CdevLine for SystemLine {
    fn set(&self, value: u8) -> io::Result<()> {
        let v = if value == 0 {
            Value::Inactive
        } else {
            Value::Active
        };
        self.req.set_lone_value(v).map_err(cdev_io)
    }

    fn get(&self) -> io::Result<u8> {
        match self.req.lone_value().map_err(cdev_io)? {
            Value::Active => Ok(1),
            Value::Inactive => Ok(0),
        }
    }

    fn make_output(&mut self) -> io::Result<u8> {
        let level = self.get()?;
        let v = if level == 0 {
            Value::Inactive
        } else {
            Value::Active
        };
        let mut cfg = gpiocdev::request::Config::default();
        cfg.with_line(self.offset).as_output(v);
        self.req.reconfigure(&cfg).map_err(cdev_io)?;
        Ok(level)
    }

    fn direct(&self) -> Option<Arc<dyn Fn(u8) -> io::Result<()> + Send + Sync>> {
        let req = self.req.clone();
        Some(Arc::new(move |value| {
            let v = if value == 0 {
                Value::Inactive
            } else {
                Value::Active
            };
            req.set_lone_value(v).map_err(cdev_io)
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[test]
    fn a_busy_line_names_its_holder() {
        assert!(describe_holder("sysfs").contains("/sys/class/gpio/unexport"));
        assert_eq!(
            describe_holder("baton-agent"),
            "consumer \"baton-agent\" (another program or a driver)"
        );
        assert!(describe_holder("").starts_with("another consumer"));
    }

    /// (chip, offset) -> (is_output, level), shared by the fake and its lines.
    type Board = Arc<Mutex<HashMap<(String, u32), (bool, u8)>>>;

    /// A fake board: chips with named lines, recording what was driven.
    #[derive(Debug, Default, Clone)]
    struct FakeChips {
        chips: Vec<(String, Vec<String>)>,
        state: Board,
        busy: Vec<(String, u32)>,
    }

    #[derive(Debug)]
    struct FakeLine {
        key: (String, u32),
        state: Board,
    }

    impl FakeChips {
        fn board() -> Self {
            let names = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
            FakeChips {
                chips: vec![
                    (
                        "gpiochip0".into(),
                        names(&["", "RELAY_MAIN", "", "NC", "NC"]),
                    ),
                    ("gpiochip1".into(), names(&["VALVE", "PRESS", "LED"])),
                    ("gpiochip2".into(), names(&["LED", ""])),
                ],
                ..Default::default()
            }
        }

        fn get(&self, chip: &str, o: u32) -> Option<(bool, u8)> {
            self.state
                .lock()
                .ok()
                .and_then(|s| s.get(&(chip.to_owned(), o)).copied())
        }

        fn preset(&self, chip: &str, o: u32, level: u8) {
            if let Ok(mut s) = self.state.lock() {
                s.insert((chip.to_owned(), o), (false, level));
            }
        }
    }

    impl ChipSet for FakeChips {
        fn chip_names(&self) -> Result<Vec<String>, GpioError> {
            Ok(self.chips.iter().map(|(c, _)| c.clone()).collect())
        }

        fn line_names(&self, chip: &str) -> Result<Vec<String>, GpioError> {
            self.chips
                .iter()
                .find(|(c, _)| c == chip)
                .map(|(_, n)| n.clone())
                .ok_or_else(|| GpioError::NoSuchChip {
                    chip: chip.to_owned(),
                    reason: format!("/dev/{chip} does not exist"),
                })
        }

        fn open_line(&self, chip: &str, o: u32, dir: Direction) -> io::Result<Box<dyn CdevLine>> {
            let key = (chip.to_owned(), o);
            if self.busy.contains(&key) {
                return Err(io::Error::from_raw_os_error(libc::EBUSY));
            }
            let mut s = self
                .state
                .lock()
                .map_err(|_| io::Error::other("poisoned"))?;
            let e = s.entry(key.clone()).or_insert((false, 0));
            e.0 = dir == Direction::Output;
            Ok(Box::new(FakeLine {
                key,
                state: self.state.clone(),
            }))
        }
    }

    impl CdevLine for FakeLine {
        fn set(&self, value: u8) -> io::Result<()> {
            let mut s = self
                .state
                .lock()
                .map_err(|_| io::Error::other("poisoned"))?;
            let e = s.entry(self.key.clone()).or_insert((true, 0));
            assert!(e.0, "fake: set on an input line");
            e.1 = value;
            Ok(())
        }

        fn get(&self) -> io::Result<u8> {
            let s = self
                .state
                .lock()
                .map_err(|_| io::Error::other("poisoned"))?;
            Ok(s.get(&self.key).map_or(0, |e| e.1))
        }

        fn make_output(&mut self) -> io::Result<u8> {
            let mut s = self
                .state
                .lock()
                .map_err(|_| io::Error::other("poisoned"))?;
            let e = s.entry(self.key.clone()).or_insert((false, 0));
            e.0 = true;
            Ok(e.1)
        }
    }

    fn off(chip: Option<&str>, o: u32) -> LineRef {
        LineRef {
            chip: chip.map(str::to_owned),
            line: Line::Offset(o),
        }
    }

    fn name(chip: Option<&str>, n: &str) -> LineRef {
        LineRef {
            chip: chip.map(str::to_owned),
            line: Line::Name(n.to_owned()),
        }
    }

    fn msg<T: std::fmt::Debug>(r: Result<T, GpioError>) -> String {
        match r {
            Ok(v) => format!("unexpected Ok({v:?})"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn resolves_offsets_and_names_like_libgpiod() {
        let b = FakeChips::board();
        let r = |l: &LineRef| resolve(&b, "gpiochip0", l);
        assert_eq!(
            r(&off(None, 1)).ok(),
            Some(Resolved {
                chip: "gpiochip0".into(),
                offset: 1,
                name: Some("RELAY_MAIN".into())
            })
        );
        assert_eq!(
            r(&off(Some("gpiochip1"), 2)).ok(),
            Some(Resolved {
                chip: "gpiochip1".into(),
                offset: 2,
                name: Some("LED".into())
            })
        );
        assert_eq!(r(&off(None, 0)).ok().and_then(|x| x.name), None);
        // Searched on every chip when no chip is given.
        assert_eq!(
            r(&name(None, "PRESS")).ok(),
            Some(Resolved {
                chip: "gpiochip1".into(),
                offset: 1,
                name: Some("PRESS".into())
            })
        );
        // A chip narrows the search and so disambiguates.
        assert_eq!(
            r(&name(Some("gpiochip2"), "LED"))
                .ok()
                .map(|x| (x.chip, x.offset)),
            Some(("gpiochip2".into(), 0))
        );
    }

    #[test]
    fn resolution_errors_name_chip_and_line() {
        let b = FakeChips::board();
        let r = |l: &LineRef| resolve(&b, "gpiochip0", l);
        assert_eq!(
            msg(r(&off(None, 5))),
            "no GPIO line gpiochip0:5: gpiochip0 has 5 lines (offsets 0..5)"
        );
        assert_eq!(
            msg(r(&off(Some("gpiochip9"), 0))),
            "no GPIO chip gpiochip9: /dev/gpiochip9 does not exist"
        );
        assert_eq!(
            msg(r(&name(None, "LED"))),
            "GPIO line name \"LED\" is ambiguous: it names gpiochip1:2, gpiochip2:0; give the chip or an offset"
        );
        assert_eq!(
            msg(r(&name(Some("gpiochip0"), "NC"))),
            "GPIO line name \"NC\" is ambiguous: it names gpiochip0:3, gpiochip0:4; give the chip or an offset"
        );
        assert_eq!(
            msg(r(&name(None, "PUMP"))),
            "no GPIO line PUMP: no line named \"PUMP\" on gpiochip0, gpiochip1, gpiochip2"
        );
        assert_eq!(
            msg(r(&name(Some("gpiochip1"), "PUMP"))),
            "no GPIO line gpiochip1:PUMP: gpiochip1 has no line named \"PUMP\""
        );
        let empty = FakeChips::default();
        assert_eq!(
            msg(resolve(&empty, "gpiochip0", &name(None, "X"))),
            "no GPIO line X: no GPIO chips found in /dev"
        );
    }

    #[test]
    fn one_handle_per_physical_line() -> Result<(), GpioError> {
        let b = FakeChips::board();
        let mut g = CdevGpio::with_chips(b.clone(), "gpiochip0", Allowlist::all())?;
        let h = g.request(&off(None, 1))?;
        assert_eq!(g.request(&off(None, 1))?, h);
        assert_eq!(g.request(&off(Some("gpiochip0"), 1))?, h);
        assert_eq!(g.request(&name(None, "RELAY_MAIN"))?, h);
        assert_eq!(g.request(&name(Some("gpiochip0"), "RELAY_MAIN"))?, h);
        let other = g.request(&name(None, "VALVE"))?;
        assert_ne!(other, h);
        assert_eq!(g.describe(h), "gpiochip0:1 (RELAY_MAIN)");
        assert_eq!(g.describe(other), "gpiochip1:0 (VALVE)");
        Ok(())
    }

    #[test]
    fn requesting_keeps_the_level_and_writes_drive_it() -> Result<(), GpioError> {
        let b = FakeChips::board();
        b.preset("gpiochip1", 1, 1);
        let mut g = CdevGpio::with_chips(b.clone(), "gpiochip0", Allowlist::all())?;
        let h = g.request(&name(None, "PRESS"))?;
        assert_eq!(b.get("gpiochip1", 1), Some((true, 1)), "still high");
        assert_eq!(g.level(h), Some(1));
        g.write(h, 0, 0, "x")?;
        assert_eq!(b.get("gpiochip1", 1), Some((true, 0)));
        assert_eq!(g.level(h), Some(0));
        assert_eq!(g.read(h)?, 0);
        assert_eq!(
            msg(g.write(h, 3, 0, "x")),
            "invalid level 3 for GPIO line gpiochip1:1 (PRESS): must be 0 or 1"
        );
        Ok(())
    }

    #[test]
    fn inputs_stay_inputs_until_requested_as_outputs() -> Result<(), GpioError> {
        let b = FakeChips::board();
        b.preset("gpiochip1", 0, 1);
        let mut g = CdevGpio::with_chips(b.clone(), "gpiochip0", Allowlist::all())?;
        let h = g.request_input(&off(Some("gpiochip1"), 0))?;
        assert_eq!(b.get("gpiochip1", 0), Some((false, 1)));
        assert_eq!(g.level(h), None);
        assert_eq!(g.read(h)?, 1);
        assert_eq!(
            msg(g.write(h, 0, 0, "x")),
            "GPIO line gpiochip1:0 (VALVE) was requested as an input and cannot be driven"
        );
        // The same line by name, as an output: upgraded in place, level kept.
        assert_eq!(g.request(&name(None, "VALVE"))?, h);
        assert_eq!(b.get("gpiochip1", 0), Some((true, 1)));
        assert_eq!(g.level(h), Some(1));
        // And an input request afterwards leaves it an output.
        assert_eq!(g.request_input(&off(Some("gpiochip1"), 0))?, h);
        g.write(h, 0, 0, "x")?;
        assert_eq!(b.get("gpiochip1", 0), Some((true, 0)));
        Ok(())
    }

    #[test]
    fn allowlist_matches_the_resolved_line() -> Result<(), GpioError> {
        let b = FakeChips::board();
        let allow: Allowlist = "1, gpiochip1:PRESS".parse()?;
        let mut g = CdevGpio::with_chips(b.clone(), "gpiochip0", allow)?;
        // Offset entry covers the name, and the name entry covers the offset.
        g.request(&name(None, "RELAY_MAIN"))?;
        g.request(&off(Some("gpiochip1"), 1))?;
        let e = g.request(&name(None, "VALVE"));
        assert!(matches!(e, Err(GpioError::NotAllowed { .. })));
        assert_eq!(
            msg(e),
            "GPIO line gpiochip0:VALVE is not on the agent's allowlist (allowed: 1, gpiochip1:PRESS)"
        );
        assert!(
            b.get("gpiochip1", 0).is_none(),
            "refused lines are never opened"
        );
        Ok(())
    }

    #[test]
    fn busy_lines_report_the_os_error() -> Result<(), GpioError> {
        let mut b = FakeChips::board();
        b.busy.push(("gpiochip0".into(), 2));
        let mut g = CdevGpio::with_chips(b, "gpiochip0", Allowlist::all())?;
        let m = msg(g.request(&off(None, 2)));
        assert!(
            m.starts_with("GPIO request on gpiochip0:2 failed: Device or resource busy"),
            "{m}"
        );
        Ok(())
    }

    #[test]
    fn missing_default_chip_fails_at_open() {
        let m = msg(CdevGpio::with_chips(
            FakeChips::board(),
            "gpiochip7",
            Allowlist::all(),
        ));
        assert_eq!(m, "no GPIO chip gpiochip7: /dev/gpiochip7 does not exist");
    }

    /// The real device layer on a machine without GPIO: the error must say
    /// which device is missing and what to do about it.
    #[test]
    fn real_backend_without_a_chip_says_so() {
        let dir = tempfile::tempdir().ok();
        let dev = dir.as_ref().map_or(Path::new("/nonexistent"), |d| d.path());
        let m = msg(CdevGpio::with_chips(
            SystemChips::new(dev),
            "gpiochip0",
            Allowlist::all(),
        ));
        assert!(m.starts_with("no GPIO chip gpiochip0: "), "{m}");
        assert!(
            m.contains("/gpiochip0 does not exist: no GPIO character device"),
            "{m}"
        );
        assert!(m.contains("sysfs backend"), "{m}");
        // And on /dev itself when this machine has no chip (CI has none).
        if !Path::new("/dev/gpiochip0").exists() {
            let m = msg(super::super::open_backend(
                &super::super::BackendSpec::Cdev {
                    default_chip: "gpiochip0".into(),
                },
                Allowlist::all(),
            ));
            assert!(
                m.starts_with("no GPIO chip gpiochip0: /dev/gpiochip0 does not exist"),
                "{m}"
            );
        }
    }

    /// The real kernel path, on hardware only: `BATON_TEST_GPIO_LINE=chip:offset`
    /// (a line nothing is wired to, or a gpio-sim line).
    #[test]
    #[ignore = "needs a GPIO chip: set BATON_TEST_GPIO_LINE=gpiochipN:OFFSET"]
    fn hardware_round_trip() -> Result<(), GpioError> {
        let Ok(spec) = std::env::var("BATON_TEST_GPIO_LINE") else {
            println!("SKIP hardware_round_trip: BATON_TEST_GPIO_LINE not set");
            return Ok(());
        };
        let line = super::super::parse_line_ref(&spec)?;
        let chip = line.chip.clone().unwrap_or_else(|| "gpiochip0".into());
        let mut g = CdevGpio::open(&chip, Allowlist::all())?;
        // As input first, then upgraded in place (reconfigure), level kept.
        let h = g.request_input(&line)?;
        let before = g.read(h)?;
        assert_eq!(g.request(&line)?, h);
        assert_eq!(g.level(h), Some(before), "requesting moved the line");
        for v in [1 - before, before, 1, 0] {
            g.write(h, v, 0, "hw")?;
            assert_eq!(g.read(h)?, v, "read-back after writing {v}");
        }
        // A second request of a held line is the same handle, not EBUSY.
        assert_eq!(g.request(&line)?, h);
        Ok(())
    }
}
