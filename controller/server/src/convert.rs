//! Between wire messages and store rows. Everything that arrives from an
//! agent is checked here (ids, sizes, enum values) so the rest of the server
//! handles only well-formed values; a bad value is an error that closes the
//! offending stream, never a panic.

use std::collections::BTreeMap;

use baton_proto::wire;

use tonic::Status;

use baton_app::AppError;
use baton_model::HelloRow;
use baton_model::time;
use baton_model::{ClockRow, DeliveryRow, DeliveryState, ErrorRow, FeedbackRow, HeldPackRow};
use baton_model::{RefTime, SpanNanos, TrustRow};

/// Longest label key or value, and most labels.
const MAX_LABEL_LEN: usize = 256;
const MAX_LABELS: usize = 64;
/// Longest free text kept from an agent (detail, event words).
const MAX_TEXT: usize = 4096;

/// Why a message from an agent is refused.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadMessage(pub String);

fn bad(msg: impl Into<String>) -> BadMessage {
    BadMessage(msg.into())
}

/// An id as the pack language spells them (agent, tenant, pack,
/// instruction), with the pack language's own message.
pub fn check_ident(what: &str, s: &str) -> Result<(), BadMessage> {
    baton_proto::pack::check_ident(what, s).map_err(BadMessage)
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

fn clean_text(s: &str) -> String {
    truncate(s, MAX_TEXT)
}

/// A label key an operator names: non-empty, bounded, printable.
pub fn label_key(k: &str) -> Result<(), BadMessage> {
    if k.is_empty() {
        return Err(bad("a label with an empty key"));
    }
    if k.len() > MAX_LABEL_LEN || k.chars().any(char::is_control) {
        return Err(bad(format!(
            "label {:?}: longer than {MAX_LABEL_LEN} bytes or has control characters",
            truncate(k, 40)
        )));
    }
    Ok(())
}

/// Labels from a hello: bounded, printable.
pub fn labels(
    l: &std::collections::HashMap<String, String>,
) -> Result<BTreeMap<String, String>, BadMessage> {
    if l.len() > MAX_LABELS {
        return Err(bad(format!("{} labels (at most {MAX_LABELS})", l.len())));
    }
    let mut out = BTreeMap::new();
    for (k, v) in l {
        if k.is_empty() {
            return Err(bad("a label with an empty key"));
        }
        for s in [k, v] {
            if s.len() > MAX_LABEL_LEN || s.chars().any(char::is_control) {
                return Err(bad(format!(
                    "label {:?}: longer than {MAX_LABEL_LEN} bytes or has control characters",
                    truncate(k, 40)
                )));
            }
        }
        out.insert(k.clone(), v.clone());
    }
    Ok(out)
}

/// A pack reference from an agent.
pub fn pack_ref(r: Option<&wire::PackRef>) -> Result<(String, String, u64), BadMessage> {
    let r = r.ok_or_else(|| bad("pack reference missing"))?;
    check_ident("tenant", &r.tenant)?;
    check_ident("pack", &r.pack)?;
    Ok((r.tenant.clone(), r.pack.clone(), r.version))
}

/// Packs held, from a hello or a held update: at most `max`.
pub fn held(packs: &[wire::HeldPack], max: usize) -> Result<Vec<HeldPackRow>, BadMessage> {
    if packs.len() > max {
        return Err(bad(format!(
            "{} held packs: more than the {max} this agent may hold (its max-packs, at most the controller's --max-held-packs)",
            packs.len()
        )));
    }
    packs
        .iter()
        .map(|h| {
            let (tenant, pack, version) = pack_ref(h.pack.as_ref())?;
            Ok(HeldPackRow {
                tenant,
                pack,
                version,
                stopped: h.stopped,
            })
        })
        .collect()
}

/// Held packs back to the wire.
pub fn held_to_wire(rows: &[HeldPackRow]) -> Vec<wire::HeldPack> {
    rows.iter()
        .map(|h| wire::HeldPack {
            pack: Some(wire_ref(&h.tenant, &h.pack, h.version)),
            stopped: h.stopped,
        })
        .collect()
}

/// A pack reference for the wire.
pub fn wire_ref(tenant: &str, pack: &str, version: u64) -> wire::PackRef {
    wire::PackRef {
        tenant: tenant.to_string(),
        pack: pack.to_string(),
        version,
    }
}

/// Most packs a hello may list: the agent's own `max-packs` when it says
/// one, never more than the controller's `max`.
pub fn held_cap(h: &wire::Hello, max: usize) -> usize {
    match h.max_packs {
        0 => max,
        n => (n as usize).min(max),
    }
}

/// The store's record of a hello (held packs not yet filtered to the
/// agent's tenants), checked.
pub fn hello(h: &wire::Hello, max_held: usize, now_ns: i64) -> Result<HelloRow, BadMessage> {
    check_ident("agent id", &h.agent_id)?;
    if h.journal_id.is_empty() || h.journal_id.len() > 128 {
        return Err(bad("journal_id missing or longer than 128 bytes"));
    }
    if h.feedback_first_seq > h.feedback_last_seq {
        return Err(bad(format!(
            "feedback range {}..{} is backwards",
            h.feedback_first_seq, h.feedback_last_seq
        )));
    }
    Ok(HelloRow {
        id: h.agent_id.clone(),
        labels: labels(&h.labels)?,
        agent_version: truncate(&h.agent_version, 64),
        journal_id: h.journal_id.clone(),
        cert_tenants: None,
        held: held(&h.packs, held_cap(h, max_held))?,
        session_gen_seen: session_gen_seen(h.session_gen)?,
        trust: h.trust.as_ref().map(trust),
        arch: arch(&h.arch),
        update: h.update.as_ref().and_then(|u| update(u, now_ns)),
        at: RefTime::from_nanos(now_ns),
    })
}

/// An architecture as a hello says it: the word a release names (Rust's
/// `std::env::consts::ARCH`), bounded; empty for an older agent, and for
/// one that says something else (it is then offered no release: never a
/// reason to refuse the box its stream).
fn arch(a: &str) -> String {
    let ok = a.len() <= 32
        && a.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if ok { a.to_string() } else { String::new() }
}

/// The wire's phase of an update as the model's (`None`: unspecified, or
/// a phase a newer agent says that this controller does not know).
pub fn update_phase(p: i32) -> Option<baton_model::UpdatePhase> {
    use baton_model::UpdatePhase as P;
    use wire::update_state::Phase;
    Some(match Phase::try_from(p).ok()? {
        Phase::Unspecified => return None,
        Phase::Downloading => P::Downloading,
        Phase::Installed => P::Installed,
        Phase::Restarting => P::Restarting,
        Phase::Refused => P::Refused,
        Phase::RolledBack => P::RolledBack,
        Phase::Running => P::Running,
    })
}

/// What a box says of an update, its words bounded (`None`: a phase this
/// controller does not know, said by a newer agent: not stored).
pub fn update(u: &wire::UpdateState, now_ns: i64) -> Option<baton_model::UpdateRow> {
    let phase = update_phase(u.phase)?;
    Some(baton_model::UpdateRow {
        version: truncate(&u.version, 64),
        phase,
        held_bytes: u.held_bytes.min(i64::MAX as u64),
        size: u.size.min(i64::MAX as u64),
        reason: clean_text(&u.reason),
        at: RefTime::from_nanos(now_ns),
    })
}

/// What a box said of an update, for the operators' API.
pub fn update_to_wire(u: &baton_model::UpdateRow) -> wire::UpdateState {
    use baton_model::UpdatePhase as P;
    use wire::update_state::Phase;
    let phase = match u.phase {
        P::Downloading => Phase::Downloading,
        P::Installed => Phase::Installed,
        P::Restarting => Phase::Restarting,
        P::Refused => Phase::Refused,
        P::RolledBack => Phase::RolledBack,
        P::Running => Phase::Running,
    };
    wire::UpdateState {
        version: u.version.clone(),
        phase: phase as i32,
        held_bytes: u.held_bytes,
        size: u.size,
        reason: u.reason.clone(),
    }
}

/// What an agent said of its trust, for the operators' API.
pub fn trust_to_wire(t: TrustRow) -> wire::TrustState {
    wire::TrustState {
        root: t.root,
        list_version: t.list_version,
        list_expires_ns: t.list_expires_ns,
        signed_tenants: t.signed_tenants,
        nothing_runs: t.nothing_runs,
        refused: t.refused,
    }
}

/// Tenants a trust report may name at most.
const MAX_SIGNED_TENANTS: usize = 1_000;

/// What an agent says it checks packs against, kept within bounds: the
/// tenant names that are ids (a list may name others: a root-signed typo
/// must not cost a box its stream), at most [`MAX_SIGNED_TENANTS`] of
/// them; its words cut to a readable length. Never a reason to refuse
/// the stream: it is the agent's report, and a box refused here could
/// never be relayed the list that mends it.
pub fn trust(t: &wire::TrustState) -> TrustRow {
    TrustRow {
        root: t.root,
        list_version: t.list_version,
        list_expires_ns: t.list_expires_ns,
        signed_tenants: t
            .signed_tenants
            .iter()
            .filter(|n| check_ident("tenant", n).is_ok())
            .take(MAX_SIGNED_TENANTS)
            .cloned()
            .collect(),
        nothing_runs: clean_text(&t.nothing_runs),
        refused: clean_text(&t.refused),
    }
}

/// The generation the agent says it has seen: the store starts the next
/// one above it, so it must leave room (a BIGINT, and one more).
fn session_gen_seen(g: u64) -> Result<u64, BadMessage> {
    if g >= i64::MAX as u64 {
        return Err(BadMessage(format!(
            "hello: session generation {g} is past what a controller can raise"
        )));
    }
    Ok(g)
}

/// A clock report, with its enum values checked.
pub fn clock(c: &wire::ClockReport) -> Result<ClockRow, BadMessage> {
    let source = wire::ClockSource::try_from(c.source)
        .map_err(|_| bad(format!("clock source {} unknown", c.source)))?;
    let state = wire::ClockState::try_from(c.state)
        .map_err(|_| bad(format!("clock state {} unknown", c.state)))?;
    if !c.frequency_ppm.is_finite() {
        return Err(bad("clock frequency is not a finite number"));
    }
    Ok(ClockRow {
        source: source_word(source).into(),
        state: state_word(state).into(),
        offset: time::span(c.offset_ns),
        jitter: time::span(c.jitter_ns),
        uncertainty: time::span(c.uncertainty_ns),
        frequency_ppm: c.frequency_ppm,
        at: RefTime::from_nanos(c.at_ns),
    })
}

fn source_word(s: wire::ClockSource) -> &'static str {
    match s {
        wire::ClockSource::Unspecified => "unknown",
        wire::ClockSource::Ptp => "ptp",
        wire::ClockSource::Ntp => "ntp",
        wire::ClockSource::Link => "link",
        wire::ClockSource::System => "system",
    }
}

fn state_word(s: wire::ClockState) -> &'static str {
    match s {
        wire::ClockState::Unspecified => "unknown",
        wire::ClockState::Syncing => "syncing",
        wire::ClockState::Locked => "locked",
        wire::ClockState::Holdover => "holdover",
        wire::ClockState::FreeRunning => "free-running",
    }
}

/// A stored clock row back to the wire.
pub fn clock_to_wire(c: &ClockRow) -> wire::ClockReport {
    let source = match c.source.as_str() {
        "ptp" => wire::ClockSource::Ptp,
        "ntp" => wire::ClockSource::Ntp,
        "link" => wire::ClockSource::Link,
        "system" => wire::ClockSource::System,
        _ => wire::ClockSource::Unspecified,
    };
    let state = match c.state.as_str() {
        "syncing" => wire::ClockState::Syncing,
        "locked" => wire::ClockState::Locked,
        "holdover" => wire::ClockState::Holdover,
        "free-running" => wire::ClockState::FreeRunning,
        _ => wire::ClockState::Unspecified,
    };
    wire::ClockReport {
        source: source as i32,
        state: state as i32,
        offset_ns: c.offset.nanos(),
        jitter_ns: c.jitter.nanos(),
        uncertainty_ns: c.uncertainty.nanos(),
        frequency_ppm: c.frequency_ppm,
        at_ns: c.at.as_nanos(),
        // Not kept with the clock history (see `App::outbox`).
        outbox_entries: None,
    }
}

/// The operator's word for an outcome (the shared feedback record's).
pub fn outcome_word(o: wire::Outcome) -> &'static str {
    baton_proto::feedback::Outcome::from_code(o as i32).map_or("unspecified", |o| o.as_str())
}

/// The operator's word for a reason (`""` for none).
pub fn reason_word(r: wire::Reason) -> &'static str {
    baton_proto::feedback::Reason::from_code(r as i32).map_or("", |r| r.as_str())
}

/// The occurrence an execution id names (`tenant/pack/vV/instr/OCC/aA`),
/// for agents that send the id but not the occurrence.
fn occurrence_of(execution_id: &str) -> Option<i64> {
    let mut parts = execution_id.rsplitn(3, '/');
    let attempt = parts.next()?;
    let occ = parts.next()?;
    attempt.strip_prefix('a')?.parse::<u32>().ok()?;
    occ.parse().ok()
}

/// One feedback entry from `agent` (journal `journal`), received now.
pub fn feedback(
    agent: &str,
    journal: &str,
    f: &wire::Feedback,
    received_ns: i64,
) -> Result<FeedbackRow, BadMessage> {
    feedback_owned(agent, journal, f.clone(), received_ns)
}

/// [`feedback`] taking the entry: its strings move into the row instead
/// of being copied (the ingest path: thousands of entries a second).
pub fn feedback_owned(
    agent: &str,
    journal: &str,
    f: wire::Feedback,
    received_ns: i64,
) -> Result<FeedbackRow, BadMessage> {
    if f.seq == 0 || f.seq > i64::MAX as u64 {
        return Err(bad(format!("feedback seq {} out of range", f.seq)));
    }
    let (tenant, pack, version) = pack_ref_owned(f.pack)?;
    let outcome = wire::Outcome::try_from(f.outcome).map_err(|_| {
        bad(format!(
            "feedback seq {}: outcome {} unknown",
            f.seq, f.outcome
        ))
    })?;
    if version > i64::MAX as u64 || f.dropped_before > i64::MAX as u64 {
        return Err(bad(format!(
            "feedback seq {}: version or dropped_before out of range",
            f.seq
        )));
    }
    let occurrence_ns = match f.occurrence_ns {
        0 => occurrence_of(&f.execution_id),
        n => Some(n),
    };
    Ok(FeedbackRow {
        id: 0,
        agent_id: agent.to_string(),
        journal_id: journal.to_string(),
        seq: f.seq,
        execution_id: cut(f.execution_id, 512),
        tenant,
        pack,
        version,
        instruction: cut(f.instruction, 128),
        occurrence: occurrence_ns.map(RefTime::from_nanos),
        attempt: f.attempt,
        scheduled: RefTime::from_nanos(f.scheduled_ns),
        actual: RefTime::from_nanos(f.actual_ns),
        lateness: time::span(f.lateness_ns),
        outcome,
        // A newer agent's reason this build does not know: unspecified.
        reason: wire::Reason::try_from(f.reason).unwrap_or(wire::Reason::Unspecified),
        event: cut(f.event, 64),
        action: cut(f.action, 64),
        detail: cut(f.detail, MAX_TEXT),
        value: f.value,
        dropped_before: f.dropped_before,
        uncertainty: time::span(f.uncertainty_ns),
        clock_source: wire::ClockSource::try_from(f.clock_source)
            .unwrap_or(wire::ClockSource::Unspecified),
        clock_state: wire::ClockState::try_from(f.clock_state)
            .unwrap_or(wire::ClockState::Unspecified),
        received: RefTime::from_nanos(received_ns),
    })
}

/// `s` kept, or cut to [`truncate`]'s form when longer than `max`.
fn cut(s: String, max: usize) -> String {
    if s.len() <= max { s } else { truncate(&s, max) }
}

/// [`pack_ref`] taking the reference.
fn pack_ref_owned(r: Option<wire::PackRef>) -> Result<(String, String, u64), BadMessage> {
    let r = r.ok_or_else(|| bad("pack reference missing"))?;
    check_ident("tenant", &r.tenant)?;
    check_ident("pack", &r.pack)?;
    Ok((r.tenant, r.pack, r.version))
}

/// A stored feedback row for an operator.
pub fn feedback_to_wire(r: &FeedbackRow) -> wire::FeedbackRecord {
    wire::FeedbackRecord {
        agent_id: r.agent_id.clone(),
        received_ns: r.received.as_nanos(),
        entry: Some(wire::Feedback {
            seq: r.seq,
            execution_id: r.execution_id.clone(),
            pack: Some(wire_ref(&r.tenant, &r.pack, r.version)),
            instruction: r.instruction.clone(),
            attempt: r.attempt,
            scheduled_ns: r.scheduled.as_nanos(),
            actual_ns: r.actual.as_nanos(),
            lateness_ns: r.lateness.nanos(),
            outcome: r.outcome as i32,
            detail: r.detail.clone(),
            value: r.value,
            dropped_before: r.dropped_before,
            event: r.event.clone(),
            action: r.action.clone(),
            uncertainty_ns: r.uncertainty.nanos(),
            reason: r.reason as i32,
            clock_source: r.clock_source as i32,
            clock_state: r.clock_state as i32,
            occurrence_ns: r.occurrence.map(RefTime::as_nanos).unwrap_or(0),
        }),
    }
}

/// Errors of a nack from an agent.
pub fn nack_errors(errors: &[wire::PackError]) -> Vec<ErrorRow> {
    errors
        .iter()
        .take(1000)
        .map(|e| ErrorRow {
            line: e.line,
            column: e.column,
            instruction: truncate(&e.instruction, 128),
            message: clean_text(&e.message),
        })
        .collect()
}

/// A delivery for an operator.
pub fn delivery_to_wire(d: &DeliveryRow) -> wire::Delivery {
    let state = match d.state {
        DeliveryState::Pending => wire::DeliveryState::Pending,
        DeliveryState::Acked => wire::DeliveryState::Acked,
        DeliveryState::Nacked => wire::DeliveryState::Nacked,
        DeliveryState::Cancelled => wire::DeliveryState::Cancelled,
        // Not a delivery: never listed as one.
        DeliveryState::Local => wire::DeliveryState::Unspecified,
    };
    wire::Delivery {
        agent_id: d.agent_id.clone(),
        pack: Some(wire_ref(&d.tenant, &d.pack, d.version)),
        state: state as i32,
        reason: d.reason.clone(),
        errors: d
            .errors()
            .iter()
            .map(|e| wire::PackError {
                line: e.line,
                column: e.column,
                instruction: e.instruction.clone(),
                message: e.message.clone(),
            })
            .collect(),
        updated_ns: d.updated.as_nanos(),
        attempts: d.attempts,
    }
}

/// The gRPC status of an application error.
pub fn status(e: AppError) -> Status {
    match e {
        AppError::Invalid(m) => Status::invalid_argument(m),
        AppError::NotFound(m) => Status::not_found(m),
        AppError::Denied(m) => Status::permission_denied(m),
        AppError::Conflict(m) => Status::failed_precondition(m),
        AppError::Limit(m) => Status::resource_exhausted(m),
        AppError::Unavailable(m) => Status::unavailable(m),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trust_report_keeps_tenants_that_are_ids_and_its_words_are_cut() {
        let mut t = wire::TrustState {
            root: true,
            list_version: 3,
            signed_tenants: vec!["plant-a".into()],
            refused: "x".repeat(10 * MAX_TEXT),
            ..Default::default()
        };
        let row = trust(&t);
        assert_eq!(row.signed_tenants, ["plant-a"]);
        assert!(row.refused.len() <= MAX_TEXT + '…'.len_utf8(), "cut");
        // A name that is no id is left out, never a refused stream.
        t.signed_tenants.push("Not An Id".into());
        assert_eq!(trust(&t).signed_tenants, ["plant-a"]);
        t.signed_tenants = vec!["t".into(); MAX_SIGNED_TENANTS + 1];
        assert_eq!(trust(&t).signed_tenants.len(), MAX_SIGNED_TENANTS);
    }

    fn entry(seq: u64, outcome: i32) -> wire::Feedback {
        wire::Feedback {
            seq,
            execution_id: "default/p/v1/a/5/a1".into(),
            pack: Some(wire_ref("default", "p", 1)),
            instruction: "a".into(),
            attempt: 1,
            outcome,
            ..Default::default()
        }
    }

    #[test]
    fn feedback_is_checked_and_round_trips() {
        let row =
            feedback("ag", "j1", &entry(7, wire::Outcome::Unknown as i32), 99).expect("valid");
        assert_eq!(row.outcome, wire::Outcome::Unknown);
        assert_eq!((row.seq, row.received.as_nanos()), (7, 99));
        // An agent that sends no occurrence: read from its execution id.
        assert_eq!(row.occurrence.map(RefTime::as_nanos), Some(5));
        let back = feedback_to_wire(&row);
        assert_eq!(
            back.entry.expect("entry").outcome,
            wire::Outcome::Unknown as i32
        );
        // A reason this build does not know reads as unspecified.
        let mut e = entry(8, wire::Outcome::Skipped as i32);
        e.reason = 999;
        e.occurrence_ns = 6;
        let row = feedback("ag", "j1", &e, 0).expect("valid");
        assert_eq!(
            (row.reason, row.occurrence.map(RefTime::as_nanos)),
            (wire::Reason::Unspecified, Some(6))
        );
        e.reason = wire::Reason::Late as i32;
        let row = feedback("ag", "j1", &e, 0).expect("valid");
        assert_eq!(reason_word(row.reason), "late");
        assert_eq!(
            feedback_to_wire(&row).entry.map(|e| e.reason),
            Some(wire::Reason::Late as i32)
        );

        assert!(feedback("ag", "j1", &entry(0, 1), 0).is_err(), "seq 0");
        assert!(
            feedback("ag", "j1", &entry(1, 42), 0).is_err(),
            "unknown outcome"
        );
        let mut e = entry(1, 1);
        e.pack = Some(wire_ref("Default!", "p", 1));
        assert!(feedback("ag", "j1", &e, 0).is_err(), "bad tenant");
        e.pack = None;
        assert!(feedback("ag", "j1", &e, 0).is_err(), "no pack");
    }

    #[test]
    fn hello_is_checked() {
        let mut h = wire::Hello {
            agent_id: "press-01".into(),
            journal_id: "j".into(),
            ..Default::default()
        };
        h.labels.insert("line".into(), "3".into());
        let row = hello(&h, 8, 5).expect("valid");
        assert_eq!(row.labels.get("line").map(String::as_str), Some("3"));
        assert_eq!(row.arch, "", "an agent older than updates says none");
        // Its architecture and its last rollback; an architecture that is
        // no word a release names is none (no offer), never a refusal.
        h.arch = "aarch64".into();
        h.update = Some(wire::UpdateState {
            version: "2.0.0".into(),
            phase: wire::update_state::Phase::RolledBack as i32,
            reason: "x".repeat(10 * MAX_TEXT),
            ..Default::default()
        });
        let row = hello(&h, 8, 5).expect("valid");
        assert_eq!(row.arch, "aarch64");
        let u = row.update.expect("said");
        assert_eq!(u.phase, baton_model::UpdatePhase::RolledBack);
        assert!(u.reason.len() <= MAX_TEXT + 4, "cut: {}", u.reason.len());
        h.arch = "Z80; DROP".into();
        h.update.as_mut().expect("set").phase = 99;
        let row = hello(&h, 8, 5).expect("never a refusal");
        assert_eq!((row.arch.as_str(), row.update), ("", None));
        h.arch.clear();
        h.update = None;
        // Held packs: at most the agent's own max-packs, at most the
        // controller's cap.
        let held = |n: usize| {
            (0..n)
                .map(|i| wire::HeldPack {
                    pack: Some(wire_ref("default", &format!("p{i}"), 1)),
                    stopped: false,
                })
                .collect::<Vec<_>>()
        };
        h.packs = held(8);
        assert!(hello(&h, 8, 5).is_ok());
        h.max_packs = 4;
        let e = hello(&h, 8, 5).expect_err("over the agent's max-packs");
        assert!(e.0.contains("8 held packs: more than the 4"), "{e}");
        h.max_packs = 0;
        h.packs = held(9);
        assert!(hello(&h, 8, 5).is_err(), "over the controller's cap");
        h.packs.clear();
        h.agent_id = "../etc".into();
        let e = hello(&h, 8, 5).expect_err("bad id");
        assert!(e.0.contains("at most 128 characters"), "one id rule: {e}");
        h.agent_id = "a".into();
        h.labels.insert("x".into(), "bad\nvalue".into());
        assert!(hello(&h, 8, 5).is_err());
        h.labels.clear();
        h.labels.insert(String::new(), "v".into());
        assert!(hello(&h, 8, 5).is_err(), "empty key");
        h.labels.clear();
        h.journal_id.clear();
        assert!(hello(&h, 8, 5).is_err(), "no journal id");
    }

    #[test]
    fn clock_enums_are_checked() {
        let c = wire::ClockReport {
            source: wire::ClockSource::Ptp as i32,
            state: wire::ClockState::Holdover as i32,
            offset_ns: -3,
            ..Default::default()
        };
        let row = clock(&c).expect("valid");
        assert_eq!(
            (row.source.as_str(), row.state.as_str()),
            ("ptp", "holdover")
        );
        assert_eq!(clock_to_wire(&row), c);
        assert!(clock(&wire::ClockReport { source: 99, ..c }).is_err());
        assert!(
            clock(&wire::ClockReport {
                frequency_ppm: f64::NAN,
                ..c
            })
            .is_err()
        );
    }
}
