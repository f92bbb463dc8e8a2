//! The lines a backend holds, indexed by [`LineHandle`]: what
//! [`Gpio::level`] and [`Gpio::describe`] read, written once for every
//! backend (each keeps its own per-line record and says only how to name
//! it).

#[cfg(doc)]
use crate::Gpio;
use crate::LineHandle;

/// One requested line as a backend keeps it.
pub(crate) trait HeldLine {
    /// Whether the line was requested as an output.
    fn is_output(&self) -> bool;
    /// The level last written (meaningful for an output only).
    fn last_level(&self) -> u8;
    /// The line's name in messages.
    fn name(&self) -> String;
}

/// [`Gpio::level`] over a backend's lines: the last level written to an
/// output line, `None` for an input or an unknown handle.
pub(crate) fn level<L: HeldLine>(lines: &[L], h: LineHandle) -> Option<u8> {
    lines
        .get(h.0 as usize)
        .filter(|l| l.is_output())
        .map(HeldLine::last_level)
}

/// [`Gpio::describe`] over a backend's lines: the line's name, or a
/// placeholder naming an unknown handle.
pub(crate) fn describe<L: HeldLine>(lines: &[L], h: LineHandle) -> String {
    match lines.get(h.0 as usize) {
        Some(l) => l.name(),
        None => format!("<unknown line handle {}>", h.0),
    }
}
