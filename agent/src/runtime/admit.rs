//! What admission (`baton_control::admission`, sans IO) asks of the
//! agent's ports: the device opens the lines a pack needs, the exec pool's
//! policy checks its programs; and a GPIO action in the dispatcher's
//! terms, from the lines admission holds.

use std::collections::BTreeMap;

use baton_control::admission::{Admission, AdmissionError, LineToOpen, Resolved};
use baton_proto::pack::{Action, LineRef, Pack};

use super::ports::Device;
use crate::dispatcher::Op;
use crate::exec::ExecPool;

/// Step 3 of admission: the device opens, in order, the lines `pack`
/// needs that it has not opened yet (the first that fails refuses the
/// pack, naming where the pack names the line); then the pack is resolved
/// against them. Opening never moves a line: what a refused pack opened is
/// kept for a later one.
pub(super) fn open_and_resolve(
    adm: &mut Admission,
    pack: &Pack,
    device: &mut dyn Device,
) -> Result<Resolved, AdmissionError> {
    for l in adm.lines_to_open(pack) {
        open_line(adm, &l, device)?;
    }
    Ok(adm.resolve(pack))
}

/// The device opens one line, and admission learns its handle (so the
/// dispatcher's ops can name it); the device's refusal names where the
/// pack names the line.
pub(super) fn open_line(
    adm: &mut Admission,
    l: &LineToOpen,
    device: &mut dyn Device,
) -> Result<(), AdmissionError> {
    let handles = device
        .request_lines(&[(l.line.clone(), l.direction)])
        .map_err(|source| AdmissionError::Line {
            place: l.place.clone(),
            source: Box::new(source),
        })?;
    if let Some(&h) = handles.first() {
        adm.opened(l, h);
    }
    Ok(())
}

/// The dispatcher op for a GPIO action (`None`: not GPIO, or its line was
/// never opened).
pub(super) fn op_for(adm: &Admission, action: &Action) -> Option<Op> {
    let h = |l: &LineRef| adm.handle(l);
    Some(match action {
        Action::GpioWrite { line, value } => Op::Write(h(line)?, *value),
        Action::GpioToggle { line } => Op::Toggle(h(line)?),
        Action::GpioRead { line } => Op::Read(adm.read_handle(line)?),
        Action::GpioPulse { line, width, value } => Op::Pulse {
            line: h(line)?,
            value: *value,
            width_ns: i64::try_from(width.as_nanos()).unwrap_or(i64::MAX),
        },
        Action::Exec { .. } | Action::Noop => return None,
    })
}

/// Whether the exec allowlist lets `program` run with `args` and `env`.
pub(super) fn exec_check(
    exec: &ExecPool,
    program: &str,
    args: &[String],
    env: &BTreeMap<String, String>,
) -> Result<(), String> {
    exec.policy()
        .check(program, args, env)
        .map_err(|e| e.to_string())
}
