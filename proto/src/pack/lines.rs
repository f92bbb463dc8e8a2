//! Which GPIO lines a pack drives, and line ownership between packs.
//!
//! # The rule (`shared_lines`)
//!
//! A line is *driven* by a pack when one of its `gpio.write`, `gpio.toggle`
//! or `gpio.pulse` actions writes it — in an instruction, an `on_failure`
//! or `safe_state`. `gpio.read` only samples a line and drives nothing.
//!
//! Two packs on one agent may drive the same line only if **both** list it
//! in `shared_lines`. A pack may list only lines it drives (so a listing is
//! a statement about the pack's own writes, not a blanket permission), and
//! each line once. Entries are written like the `line`/`chip` params of the
//! actions: `5` (offset 5 on the default chip), `RELAY_MAIN` (a line name),
//! `"gpiochip1:7"` (offset 7 on `gpiochip1`; the digits after `:` are an
//! offset even inside quotes) or `{line: "7", chip: gpiochip1}` (the exact
//! params form, for a numeric line *name*). An entry must be written the
//! way the actions write the line — `5` and `gpiochip0:5` differ here,
//! because only the agent knows its default chip.
//!
//! The agent enforces the rule at acceptance with
//! [`Pack::line_conflicts`], giving its default chip so that `5` and
//! `gpiochip0:5` compare equal there. A line name and an offset that
//! happen to be the same line on the hardware are only matched by the
//! agent, which can resolve names.

use std::collections::BTreeSet;

use super::model::{Action, LineRef, Pack};

impl LineRef {
    /// The form lines are compared in: the chip trimmed and without a
    /// leading `/dev/` (`/dev/gpiochip1` and `gpiochip1` are one chip), an
    /// empty chip as none. Line names are kept exactly (libgpiod names are
    /// case-sensitive).
    pub fn normalized(&self) -> LineRef {
        let chip = self
            .chip
            .as_deref()
            .map(str::trim)
            .map(|c| c.strip_prefix("/dev/").unwrap_or(c))
            .filter(|c| !c.is_empty())
            .map(str::to_string);
        LineRef {
            chip,
            line: self.line.clone(),
        }
    }

    /// Normalised, with an offset given without a chip placed on
    /// `default_chip` (the agent's). Names without a chip stay chip-less:
    /// they are found by name on any chip.
    pub fn on_default_chip(&self, default_chip: &str) -> LineRef {
        let mut r = self.normalized();
        if r.chip.is_none() && matches!(r.line, super::model::Line::Offset(_)) {
            r.chip = LineRef {
                chip: Some(default_chip.to_string()),
                line: r.line.clone(),
            }
            .normalized()
            .chip;
        }
        r
    }

    /// `chip:line`, or `line` without a chip: for messages.
    pub fn display(&self) -> String {
        match &self.chip {
            Some(c) => format!("{c}:{}", self.line),
            None => self.line.to_string(),
        }
    }
}

impl Action {
    /// The line this action drives (writes): `gpio.write`, `gpio.toggle`,
    /// `gpio.pulse`. `None` for `gpio.read`, `exec` and `noop`.
    pub fn driven_line(&self) -> Option<&LineRef> {
        match self {
            Action::GpioWrite { line, .. }
            | Action::GpioToggle { line }
            | Action::GpioPulse { line, .. } => Some(line),
            Action::GpioRead { .. } | Action::Exec { .. } | Action::Noop => None,
        }
    }
}

/// The normalised lines these actions drive.
pub(crate) fn driven_by<'a>(actions: impl IntoIterator<Item = &'a Action>) -> BTreeSet<LineRef> {
    actions
        .into_iter()
        .filter_map(Action::driven_line)
        .map(LineRef::normalized)
        .collect()
}

impl Pack {
    /// Every line the pack drives (see the module docs: writes in
    /// instructions, `on_failure` and `safe_state`; not reads), normalised
    /// with [`LineRef::normalized`], sorted, each once.
    pub fn driven_lines(&self) -> BTreeSet<LineRef> {
        driven_by(self.all_actions().map(|(_, a)| a))
    }

    /// The lines both packs drive that are not listed in `shared_lines` by
    /// both: if this is not empty, the two packs must not run side by side
    /// on one agent. `default_chip` is the agent's chip for lines written
    /// without one (`None`: compare them as written). Sorted, each once.
    pub fn line_conflicts(&self, other: &Pack, default_chip: Option<&str>) -> Vec<LineRef> {
        let norm = |l: &LineRef| match default_chip {
            Some(c) => l.on_default_chip(c),
            None => l.normalized(),
        };
        let driven =
            |p: &Pack| -> BTreeSet<LineRef> { p.driven_lines().iter().map(norm).collect() };
        let shared = |p: &Pack| -> BTreeSet<LineRef> { p.shared_lines.iter().map(norm).collect() };
        let (mine, theirs) = (driven(self), driven(other));
        let both_shared: BTreeSet<LineRef> =
            shared(self).intersection(&shared(other)).cloned().collect();
        mine.intersection(&theirs)
            .filter(|l| !both_shared.contains(*l))
            .cloned()
            .collect()
    }
}
