//! The real [`ChipSet`]: `gpiocdev` on the character devices in `/dev`.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use gpiocdev::line::Value;

use super::{CONSUMER, CdevLine, ChipSet};
use crate::{Direction, GpioError};

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
pub(super) fn describe_holder(consumer: &str) -> String {
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
