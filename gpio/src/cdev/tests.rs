//! The backend against a fake board, and the hardware round trip
//! `tests/vm-gpio` runs by name (`cdev::tests::hardware_round_trip`).

use std::path::Path;
use std::sync::{Arc, Mutex};

use baton_proto::pack::Line;

use super::system::describe_holder;
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
