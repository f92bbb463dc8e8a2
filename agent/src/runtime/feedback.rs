//! Feedback: every executed attempt and every core event goes to the
//! journal's outbox (for the controller link) and out as a `tracing` event
//! (for the live view and logs). One place decides both, so what an
//! operator sees on the terminal is what the controller will receive.
//!
//! Tracing targets: `baton::firing` (one per executed attempt, DEBUG: no
//! line per firing at INFO) and `baton::event` (core events: DEBUG for ok,
//! INFO for skips and retries, WARN for failures, give-ups, safe states and
//! unknown outcomes).

use std::collections::HashMap;

use baton_sched::{Event, EventKind, PackKey};
use hdrhistogram::Histogram;

use crate::journal::{Journal, JournalError};
use crate::runtime::record::{FiringRecord, FiringResult};

/// Tracing target of executed attempts.
pub const FIRING_TARGET: &str = "baton::firing";
/// Tracing target of core events.
pub const EVENT_TARGET: &str = "baton::event";

/// Lateness and outcome counters of this run.
#[derive(Debug)]
pub struct Tally {
    /// Lateness of what touched the device, ns.
    pub hist: Histogram<u64>,
    /// Attempts that ran before their instant.
    pub early: u64,
    /// Attempts that failed.
    pub failed: u64,
    /// Attempts not run (late, withdrawn, stopped).
    pub not_run: u64,
    /// For `/metrics` (`crate::metrics`): executions by pack and result
    /// word (a pack's map is made once, at its first execution).
    pub executions: crate::FastMap<PackKey, Vec<(&'static str, u64)>>,
    /// For `/metrics`: start lateness in the exposition's buckets.
    pub lateness: crate::metrics::Lateness,
    /// Retries scheduled.
    pub retries: u64,
    /// Occurrences skipped.
    pub skips: u64,
    /// Occurrences given up on.
    pub give_ups: u64,
    /// Safe-state entries by reason (`SafeReason::as_str`).
    pub safe_states: HashMap<&'static str, u64>,
    /// Reused for encoding feedback records.
    buf: Vec<u8>,
}

impl Tally {
    /// Count one execution of `pack` ending in `result` (no allocation
    /// after a pack's first executions).
    fn count_execution(&mut self, pack: &PackKey, result: &'static str) {
        let by = match self.executions.get_mut(pack) {
            Some(by) => by,
            None => self.executions.entry(pack.clone()).or_default(),
        };
        match by.iter_mut().find(|(r, _)| *r == result) {
            Some((_, n)) => *n += 1,
            None => by.push((result, 1)),
        }
    }

    /// Count a core event for `/metrics`.
    fn count_event(&mut self, kind: &EventKind) {
        match kind {
            EventKind::Retry { .. } => self.retries += 1,
            EventKind::Skip { .. } => self.skips += 1,
            EventKind::GiveUp { .. } => self.give_ups += 1,
            EventKind::SafeState { reason } => {
                *self.safe_states.entry(reason.as_str()).or_default() += 1
            }
            _ => {}
        }
    }
}

impl Default for Tally {
    fn default() -> Self {
        Tally {
            // 1 ns .. 60 s at 2 significant digits: a fixed bound.
            hist: Histogram::new_with_bounds(1, 60_000_000_000, 2)
                .unwrap_or_else(|_| Histogram::new(2).unwrap_or_else(|_| unreachable!())),
            early: 0,
            failed: 0,
            not_run: 0,
            executions: HashMap::default(),
            lateness: crate::metrics::Lateness::default(),
            retries: 0,
            skips: 0,
            give_ups: 0,
            safe_states: HashMap::new(),
            buf: Vec::with_capacity(512),
        }
    }
}

/// The feedback record of one executed attempt, as the controller will
/// receive it (JSON, encoded without intermediate values; the link turns it
/// into a `wire::Feedback`, `crate::link::convert`).
#[derive(serde::Serialize)]
struct Executed<'a> {
    event: &'static str,
    execution_id: &'a str,
    #[serde(serialize_with = "as_display")]
    pack: &'a baton_sched::PackKey,
    /// The pack version, for side actions (safe state, on_failure) whose
    /// id does not carry it; an attempt's execution id does.
    #[serde(skip_serializing_if = "Option::is_none")]
    version: Option<u64>,
    instruction: &'a str,
    action: &'static str,
    scheduled_ns: i64,
    actual_ns: i64,
    lateness_ns: i64,
    result: &'static str,
    #[serde(skip_serializing_if = "str::is_empty")]
    detail: &'a str,
    value: Option<u8>,
    /// The clock's uncertainty when the result was taken (microseconds to
    /// milliseconds after the firing: the estimate moves far slower), ns.
    uncertainty_ns: i64,
}

fn as_display<S: serde::Serializer, T: std::fmt::Display>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

/// Journal and announce one executed attempt (`version`: the pack's
/// version, recorded when the record's id does not carry it).
pub fn executed(
    journal: &mut Journal,
    tally: &mut Tally,
    rec: &FiringRecord<'_>,
    version: Option<u64>,
    uncertainty_ns: i64,
) -> Result<(), JournalError> {
    if rec.result.ran() {
        // Saturating: a catch-up firing an hour late still counts (at the
        // histogram's 60 s bound) instead of vanishing from the summary.
        tally.hist.saturating_record(rec.lateness_ns.max(0) as u64);
        tally.lateness.observe(rec.lateness_ns);
        if rec.lateness_ns < 0 {
            tally.early += 1;
        }
    } else {
        tally.not_run += 1;
    }
    let (value, detail) = match &rec.result {
        FiringResult::Ok { value } => (*value, std::borrow::Cow::Borrowed("")),
        FiringResult::Failed(m) => (None, std::borrow::Cow::Borrowed(m.as_str())),
        r => (None, std::borrow::Cow::Owned(r.detail())),
    };
    if matches!(rec.result, FiringResult::Failed(_)) {
        tally.failed += 1;
    }
    tally.count_execution(rec.pack, rec.result.word());
    tally.buf.clear();
    let fb = Executed {
        event: "executed",
        execution_id: rec.id,
        pack: rec.pack,
        version,
        instruction: rec.instruction,
        action: rec.action,
        scheduled_ns: rec.scheduled.as_nanos(),
        actual_ns: rec.actual.as_nanos(),
        lateness_ns: rec.lateness_ns,
        result: rec.result.word(),
        detail: &detail,
        value,
        uncertainty_ns,
    };
    // Encoding plain fields into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut tally.buf, &fb);
    let r = journal.push_feedback(&tally.buf).map(|_| ());
    tracing::debug!(
        target: FIRING_TARGET,
        execution_id = rec.id,
        pack = %rec.pack,
        instruction = rec.instruction,
        action = rec.action,
        scheduled_ns = rec.scheduled.as_nanos(),
        lateness_ns = rec.lateness_ns,
        result = rec.result.word(),
        detail = %detail,
    );
    r
}

/// Journal and announce one core event (a firing and its success are
/// reported by [`executed`] once it has happened: not journalled twice).
/// `version`: the pack's version held, for pack-wide events (a safe state)
/// whose record has no execution id to carry it.
pub fn event(
    journal: &mut Journal,
    tally: &mut Tally,
    e: &Event,
    version: Option<u64>,
    uncertainty_ns: i64,
) -> Result<(), JournalError> {
    tally.count_event(&e.kind);
    if matches!(e.kind, EventKind::Fire | EventKind::Ok { .. }) {
        // The executed record already says it fired and how it ended.
        announce(e, "");
        return Ok(());
    }
    let mut rec = serde_json::json!({
        "event": e.kind.name(),
        "t_ns": e.t.as_nanos(),
        "pack": e.pack.to_string(),
        "version": e.id.as_ref().map(|i| i.version).or(version),
        "instruction": e.instruction,
        "execution_id": e.id.as_ref().map(|i| i.to_string()),
        "occurrence_ns": e.occurrence.map(|o| o.as_nanos()),
        "uncertainty_ns": uncertainty_ns,
    });
    let detail = e.detail();
    if !detail.is_empty() {
        rec["detail"] = detail.clone().into();
    }
    let r = journal
        .push_feedback(rec.to_string().as_bytes())
        .map(|_| ());
    announce(e, &detail);
    r
}

/// The tracing event of a core event, at a level by its weight.
pub fn announce(e: &Event, detail: &str) {
    if matches!(e.kind, EventKind::Fire | EventKind::Ok { .. })
        && !tracing::enabled!(target: EVENT_TARGET, tracing::Level::DEBUG)
    {
        // Two per firing: not even formatted when nobody listens.
        return;
    }
    let pack = e.pack.to_string();
    let instruction = e.instruction.as_deref().unwrap_or("");
    let id = e.id.as_ref().map(|i| i.to_string()).unwrap_or_default();
    let name = e.kind.name();
    match &e.kind {
        EventKind::Fire | EventKind::Ok { .. } => {
            tracing::debug!(target: EVENT_TARGET, event = name, pack, instruction, execution_id = id, detail)
        }
        EventKind::Retry { .. } | EventKind::Skip { .. } => {
            tracing::info!(target: EVENT_TARGET, event = name, pack, instruction, execution_id = id, detail)
        }
        EventKind::Fail { .. }
        | EventKind::GiveUp { .. }
        | EventKind::OnFailure
        | EventKind::SafeState { .. }
        | EventKind::OutcomeUnknown => {
            tracing::warn!(target: EVENT_TARGET, event = name, pack, instruction, execution_id = id, detail)
        }
    }
}
