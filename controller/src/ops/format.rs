//! Tables and JSON lines for operator output.

use baton_proto::wire;

pub use baton_model::display::{instant, outcome, reason, span};

/// `tenant/pack v3`.
pub fn pack_ref(r: Option<&wire::PackRef>) -> String {
    r.map_or_else(
        || "-".into(),
        |r| format!("{}/{} v{}", r.tenant, r.pack, r.version),
    )
}

/// Columns padded to the widest cell; the last column is not padded.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let n = header.len();
    let mut w: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate().take(n) {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut l = String::new();
        for (i, c) in cells.enumerate() {
            if i + 1 < n {
                l.push_str(c);
                l.push_str(&" ".repeat(w[i] - c.chars().count() + 2));
            } else {
                l.push_str(c);
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(&mut header.iter().copied());
    for r in rows {
        line(&mut r.iter().map(String::as_str));
    }
    out
}

/// Clock source and state words.
pub fn clock(c: Option<&wire::ClockReport>) -> (String, String, String) {
    let Some(c) = c else {
        return ("-".into(), "-".into(), "-".into());
    };
    let source = wire::ClockSource::try_from(c.source)
        .map(|s| {
            s.as_str_name()
                .trim_start_matches("CLOCK_SOURCE_")
                .to_lowercase()
        })
        .unwrap_or_else(|_| "?".into());
    let state = wire::ClockState::try_from(c.state)
        .map(|s| {
            s.as_str_name()
                .trim_start_matches("CLOCK_STATE_")
                .to_lowercase()
                .replace('_', "-")
        })
        .unwrap_or_else(|_| "?".into());
    (source, state, span(c.offset_ns))
}

/// What an agent checks packs against, in a few words: a box that takes
/// no pack first (what needs a look), then its list and the tenants it requires
/// signed packs of.
pub fn trust(t: Option<&wire::TrustState>) -> String {
    let Some(t) = t else {
        // An agent older than signed packs.
        return "-".into();
    };
    if !t.nothing_runs.is_empty() {
        return format!("TAKES NO PACK: {}", t.nothing_runs);
    }
    if !t.root {
        return "no root: not checked".into();
    }
    let mut s = match t.list_version {
        0 => "no list".to_string(),
        v => format!("list v{v}"),
    };
    if !t.signed_tenants.is_empty() {
        s.push_str(&format!(", signed: {}", t.signed_tenants.join(",")));
    }
    if !t.refused.is_empty() {
        s.push_str(&format!(" (refused a list: {})", t.refused));
    }
    s
}

/// The operator's word for a delivery state.
pub fn delivery_state(s: i32) -> &'static str {
    match wire::DeliveryState::try_from(s) {
        Ok(wire::DeliveryState::Pending) => "pending",
        Ok(wire::DeliveryState::Acked) => "acked",
        Ok(wire::DeliveryState::Nacked) => "nacked",
        Ok(wire::DeliveryState::Cancelled) => "cancelled",
        _ => "unknown",
    }
}

/// One feedback record as a JSON object (the keys `feedback --json`
/// documents).
pub fn feedback_json(r: &wire::FeedbackRecord) -> serde_json::Value {
    let e = r.entry.clone().unwrap_or_default();
    let p = e.pack.clone().unwrap_or_default();
    serde_json::json!({
        "execution_id": e.execution_id,
        "agent": r.agent_id,
        "tenant": p.tenant,
        "pack": p.pack,
        "version": p.version,
        "instruction": e.instruction,
        "attempt": e.attempt,
        "scheduled": instant(e.scheduled_ns),
        "actual": instant(e.actual_ns),
        "scheduled_ns": e.scheduled_ns,
        "actual_ns": e.actual_ns,
        "lateness_ns": e.lateness_ns,
        "outcome": outcome(e.outcome),
        "reason": reason(e.reason),
        "event": e.event,
        "detail": e.detail,
        "value": e.value,
        "uncertainty_ns": e.uncertainty_ns,
        "clock_source": baton_proto::feedback::ClockSource::from_code(e.clock_source).map(|s| s.as_str()),
        "clock_state": baton_proto::feedback::ClockState::from_code(e.clock_state).map(|s| s.as_str()),
        "occurrence": if e.occurrence_ns == 0 { serde_json::Value::Null } else { instant(e.occurrence_ns).into() },
        "dropped_before": e.dropped_before,
        "seq": e.seq,
        "received": instant(r.received_ns),
    })
}

/// The line a gap in an agent's feedback gets (entries it dropped because
/// its outbox was full), if the entry follows one.
pub fn gap_line(r: &wire::FeedbackRecord) -> Option<String> {
    let e = r.entry.as_ref()?;
    (e.dropped_before > 0).then(|| {
        format!(
            "{} entries dropped at the agent {} (outbox full) between seq {} and {}",
            e.dropped_before,
            r.agent_id,
            e.seq.saturating_sub(e.dropped_before + 1),
            e.seq
        )
    })
}

/// One feedback record as a table row.
pub fn feedback_row(r: &wire::FeedbackRecord) -> Vec<String> {
    let e = r.entry.clone().unwrap_or_default();
    vec![
        instant(e.scheduled_ns),
        r.agent_id.clone(),
        pack_ref(e.pack.as_ref()),
        if e.instruction.is_empty() {
            "-".into()
        } else {
            e.instruction.clone()
        },
        e.attempt.to_string(),
        if e.actual_ns == 0 {
            "-".into()
        } else {
            span(e.lateness_ns)
        },
        match reason(e.reason) {
            Some(why) => format!("{} ({why})", outcome(e.outcome)),
            None => outcome(e.outcome).into(),
        },
        e.detail.clone(),
    ]
}

/// Header of [`feedback_row`].
pub const FEEDBACK_HEADER: [&str; 8] = [
    "SCHEDULED",
    "AGENT",
    "PACK",
    "INSTRUCTION",
    "ATTEMPT",
    "LATENESS",
    "OUTCOME",
    "DETAIL",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_and_instants() {
        assert_eq!(span(250), "250ns");
        assert_eq!(span(-1_500), "-1.5µs");
        assert_eq!(span(2_340_000), "2.3ms");
        assert_eq!(span(3_000_000_000), "3.00s");
        assert_eq!(instant(0), "-");
        assert_eq!(
            instant(1_000_000_000_001_000_000),
            "2001-09-09T01:46:40.001Z"
        );
    }

    #[test]
    fn tables_align() {
        let t = table(
            &["A", "BB", "C"],
            &[vec!["xxx".into(), "y".into(), "z".into()]],
        );
        assert_eq!(t, "A    BB  C\nxxx  y   z\n");
    }
}
