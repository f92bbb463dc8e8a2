//! `baton-agent simulate`: a pack run through the real scheduler core on
//! simulated time (see `baton_sched::sim`); this module only formats events.

use std::io::Write;

use baton_sched::{Event, EventKind};

pub use baton_sched::sim::{FailSpec, SimOptions, simulate};

/// One event as the JSON object `simulate --json` prints.
pub fn event_json(e: &Event) -> serde_json::Value {
    let mut v = serde_json::json!({
        "t": e.t.to_rfc3339(),
        "event": e.kind.name(),
        "instruction": e.instruction,
        "attempt": e.id.as_ref().map(|i| i.attempt),
        "execution_id": e.id.as_ref().map(|i| i.to_string()),
    });
    let obj = v
        .as_object_mut()
        .expect("json! of an object literal is an object");
    if let Some(occ) = e.occurrence {
        obj.insert("occurrence".into(), occ.to_rfc3339().into());
    }
    match &e.kind {
        EventKind::Retry { at } => {
            obj.insert("at".into(), at.to_rfc3339().into());
        }
        // `reason` stays the words it always was; the typed reason, as
        // feedback carries it, is `reason_code`.
        EventKind::Skip { detail, .. }
        | EventKind::GiveUp { detail, .. }
        | EventKind::Fail { detail, .. } => {
            obj.insert("reason".into(), detail.clone().into());
        }
        EventKind::SafeState { reason } => {
            obj.insert("reason".into(), reason.as_str().into());
        }
        EventKind::Ok { value: Some(v) } => {
            obj.insert("value".into(), (*v).into());
        }
        _ => {}
    }
    if let Some(code) = e.kind.reason() {
        obj.insert("reason_code".into(), code.as_str().into());
    }
    v
}

/// One event as a readable line.
pub fn event_line(e: &Event) -> String {
    let detail = e.detail();
    format!(
        "{}  {:<15} {:<20} {:<3} {}",
        e.t,
        e.kind.name(),
        e.instruction.as_deref().unwrap_or("-"),
        e.id.as_ref()
            .map_or("-".to_string(), |i| format!("a{}", i.attempt)),
        detail
    )
}

/// Write events to `out` as JSON lines or readable lines.
pub fn write_event(out: &mut dyn Write, e: &Event, json: bool) -> std::io::Result<()> {
    if json {
        writeln!(out, "{}", event_json(e))
    } else {
        writeln!(out, "{}", event_line(e))
    }
}
