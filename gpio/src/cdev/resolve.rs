//! Resolving a line reference the way libgpiod does: an offset on a chip,
//! a name on a chip, or a name searched on every chip (refused if found
//! more than once).

use baton_proto::pack::{Line, LineRef};

use super::ChipSet;
use crate::{GpioError, describe_ref};

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
    match (&line.chip, &line.line) {
        (chip, Line::Offset(o)) => {
            by_offset(chips, chip.as_deref().unwrap_or(default_chip), *o, desc)
        }
        (Some(chip), Line::Name(n)) => by_name_on(chips, chip, n, desc),
        (None, Line::Name(n)) => by_name_anywhere(chips, n),
    }
}

/// Offset `o` on `chip`, with the line's name if it has one.
fn by_offset(
    chips: &dyn ChipSet,
    chip: &str,
    o: u32,
    desc: impl Fn() -> String,
) -> Result<Resolved, GpioError> {
    let names = chips.line_names(chip)?;
    if o as usize >= names.len() {
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
        offset: o,
        name: names.get(o as usize).filter(|n| !n.is_empty()).cloned(),
    })
}

/// The one line named `n` on `chip`.
fn by_name_on(
    chips: &dyn ChipSet,
    chip: &str,
    n: &str,
    desc: impl Fn() -> String,
) -> Result<Resolved, GpioError> {
    let names = chips.line_names(chip)?;
    let found: Vec<u32> = offsets_named(&names, n).collect();
    match found.as_slice() {
        [] => Err(GpioError::NoSuchLine {
            line: desc(),
            reason: format!("{chip} has no line named {n:?}"),
        }),
        [o] => Ok(Resolved {
            chip: chip.to_owned(),
            offset: *o,
            name: Some(n.to_owned()),
        }),
        many => Err(GpioError::AmbiguousName {
            name: n.to_owned(),
            found: many
                .iter()
                .map(|o| format!("{chip}:{o}"))
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

/// The one line named `n` on any chip; chips that cannot be read are named
/// in the error if none has it.
fn by_name_anywhere(chips: &dyn ChipSet, n: &str) -> Result<Resolved, GpioError> {
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
                name: Some(n.to_owned()),
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
                line: n.to_owned(),
                reason,
            })
        }
        _ => Err(GpioError::AmbiguousName {
            name: n.to_owned(),
            found: found
                .iter()
                .map(|(c, o)| format!("{c}:{o}"))
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

fn offsets_named<'a>(names: &'a [String], n: &'a str) -> impl Iterator<Item = u32> + 'a {
    names
        .iter()
        .enumerate()
        .filter(move |(_, name)| *name == n)
        .filter_map(|(o, _)| u32::try_from(o).ok())
}
