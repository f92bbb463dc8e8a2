//! Which GPIO lines the agent may touch, whatever a pack says.

use std::fmt;
use std::str::FromStr;

use baton_proto::pack::{Line, LineRef};

use super::{GpioError, describe_ref, parse_line_ref};

/// The lines this agent may request. `None` inside means everything.
///
/// An entry is a [`LineRef`]; it matches a requested line *after* the backend
/// resolved it, so an entry given by offset also covers the same line
/// requested by name and vice versa (cdev knows both; sim and sysfs only
/// know what was written):
///
/// | entry          | matches                                              |
/// |----------------|------------------------------------------------------|
/// | `chip:12`      | offset 12 on `chip`                                  |
/// | `12`           | offset 12 on the backend's default chip (sysfs: global number 12) |
/// | `chip:NAME`    | the line named `NAME` on `chip`                      |
/// | `NAME`         | the line named `NAME`, on whichever chip it is found |
/// There is deliberately no `Default`: "allow everything" must be asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allowlist {
    entries: Option<Vec<LineRef>>,
}

/// A requested line as resolved by a backend, for matching.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Target<'a> {
    /// Chip the line is on; `None` only for sysfs global numbers.
    pub chip: Option<&'a str>,
    /// Offset on that chip (sysfs: global number), if known.
    pub offset: Option<u32>,
    /// Line name, if known.
    pub name: Option<&'a str>,
}

impl Allowlist {
    /// Every line is allowed (development, sim).
    pub fn all() -> Self {
        Allowlist { entries: None }
    }

    /// Only these lines.
    pub fn only(entries: impl IntoIterator<Item = LineRef>) -> Self {
        Allowlist {
            entries: Some(entries.into_iter().collect()),
        }
    }

    /// True when nothing is restricted.
    pub fn is_unrestricted(&self) -> bool {
        self.entries.is_none()
    }

    /// Whether the resolved line `t` is allowed; `default_chip` is what an
    /// entry without chip means for an offset.
    pub(crate) fn permits(&self, default_chip: Option<&str>, t: Target<'_>) -> bool {
        let Some(entries) = &self.entries else {
            return true;
        };
        entries.iter().any(|e| {
            let chip_ok = match (&e.chip, &e.line) {
                (Some(c), _) => t.chip == Some(c.as_str()),
                (None, Line::Offset(_)) => t.chip == default_chip,
                (None, Line::Name(_)) => true,
            };
            let line_ok = match &e.line {
                Line::Offset(o) => t.offset == Some(*o),
                Line::Name(n) => t.name == Some(n.as_str()),
            };
            chip_ok && line_ok
        })
    }

    /// The refusal for `line`, naming it and the allowlist.
    pub(crate) fn refuse(&self, line: &LineRef, default_chip: Option<&str>) -> GpioError {
        GpioError::NotAllowed {
            line: describe_ref(line, default_chip),
            allowlist: self.to_string(),
        }
    }
}

impl fmt::Display for Allowlist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.entries {
            None => f.write_str("every line"),
            Some(e) if e.is_empty() => f.write_str("no line"),
            Some(entries) => {
                for (i, e) in entries.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    f.write_str(&describe_ref(e, None))?;
                }
                Ok(())
            }
        }
    }
}

impl FromStr for Allowlist {
    type Err = GpioError;

    /// `*` allows everything; otherwise a comma-separated list of
    /// `chip:line` / `line` entries (see [`parse_line_ref`]). An empty string
    /// allows nothing.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s == "*" {
            return Ok(Allowlist::all());
        }
        if s.is_empty() {
            return Ok(Allowlist::only([]));
        }
        s.split(',')
            .map(|e| parse_line_ref(e.trim()))
            .collect::<Result<Vec<_>, _>>()
            .map(Allowlist::only)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t<'a>(chip: Option<&'a str>, offset: Option<u32>, name: Option<&'a str>) -> Target<'a> {
        Target { chip, offset, name }
    }

    #[test]
    fn entries_match_chip_and_offset_or_name() {
        let a: Allowlist = "gpiochip1:3, 12, RELAY_MAIN, gpiochip2:VALVE"
            .parse()
            .expect("parses");
        let d = Some("gpiochip0");
        assert!(a.permits(d, t(Some("gpiochip1"), Some(3), None)));
        assert!(!a.permits(d, t(Some("gpiochip0"), Some(3), None)));
        // An entry without chip is the default chip for offsets...
        assert!(a.permits(d, t(Some("gpiochip0"), Some(12), None)));
        assert!(!a.permits(d, t(Some("gpiochip1"), Some(12), None)));
        // ...and any chip for names.
        assert!(a.permits(d, t(Some("gpiochip7"), Some(40), Some("RELAY_MAIN"))));
        assert!(a.permits(d, t(Some("gpiochip2"), Some(1), Some("VALVE"))));
        assert!(!a.permits(d, t(Some("gpiochip0"), Some(1), Some("VALVE"))));
        // A line allowed by offset is allowed under its name too (resolved).
        assert!(a.permits(d, t(Some("gpiochip1"), Some(3), Some("PRESS"))));
        assert!(!a.permits(d, t(Some("gpiochip0"), Some(5), Some("PRESS"))));
    }

    #[test]
    fn unrestricted_and_empty() {
        let d = Some("gpiochip0");
        assert!(Allowlist::all().permits(d, t(Some("x"), Some(1), None)));
        assert!(!Allowlist::only([]).permits(d, t(Some("gpiochip0"), Some(1), None)));
        assert_eq!("*".parse::<Allowlist>().ok(), Some(Allowlist::all()));
        assert_eq!("".parse::<Allowlist>().ok(), Some(Allowlist::only([])));
        assert!("a,,b".parse::<Allowlist>().is_err());
    }

    #[test]
    fn refusal_names_line_and_allowlist() {
        let a: Allowlist = "gpiochip0:17,RELAY".parse().expect("parses");
        let line = LineRef {
            chip: None,
            line: Line::Offset(4),
        };
        let msg = a.refuse(&line, Some("gpiochip0")).to_string();
        assert!(msg.contains("gpiochip0:4"), "{msg}");
        assert!(msg.contains("gpiochip0:17, RELAY"), "{msg}");
    }
}
