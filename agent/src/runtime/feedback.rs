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

use baton_proto::RefTime;
use baton_proto::feedback::{
    ClockSource, ClockState, Event as FeedbackEvent, Outcome, Reason, Record,
};
use baton_sched::{Event, EventKind, PackKey};
use hdrhistogram::Histogram;

use crate::dispatcher::NotRun;
use crate::outbox;
use crate::runtime::breakdown::lateness_histogram;
use crate::runtime::record::{FiringRecord, FiringResult, Origin};
use baton_journal::{Journal, JournalError};

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
    /// Where each firing's time went, when measured.
    pub breakdown: Option<Box<crate::runtime::breakdown::Breakdown>>,
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
            hist: lateness_histogram(),
            early: 0,
            failed: 0,
            not_run: 0,
            executions: HashMap::default(),
            lateness: crate::metrics::Lateness::default(),
            retries: 0,
            skips: 0,
            give_ups: 0,
            safe_states: HashMap::new(),
            breakdown: None,
            buf: Vec::with_capacity(512),
        }
    }
}

/// The clock as a feedback record states it: taken once per report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClockStamp {
    /// The uncertainty when the result was taken (microseconds to
    /// milliseconds after the firing: the estimate moves far slower), ns.
    pub uncertainty_ns: i64,
    /// The source followed then, if known.
    pub source: Option<ClockSource>,
    /// Its state then, if known.
    pub state: Option<ClockState>,
}

/// Journal and announce one executed attempt (`version`: the pack's
/// version, recorded when the record's id does not carry it).
pub fn executed(
    journal: &mut Journal,
    tally: &mut Tally,
    rec: &FiringRecord<'_>,
    version: Option<u64>,
    clock: ClockStamp,
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
    if matches!(rec.result, FiringResult::Failed(_)) {
        tally.failed += 1;
    }
    tally.count_execution(rec.pack, rec.result.word());
    let (outcome, reason, value) = match &rec.result {
        FiringResult::Ok { value } => (Outcome::Ok, None, value.map(u32::from)),
        FiringResult::Failed(_) => (Outcome::Failed, None, None),
        FiringResult::NotRun(why) => (Outcome::Skipped, Some(not_run_reason(*why)), None),
    };
    let detail = match &rec.result {
        FiringResult::Ok { .. } => String::new(),
        r => r.detail(),
    };
    let reason = match rec.origin {
        // A side action says what called for it.
        Origin::SafeState(why) => reason.or(Some(why.reason())),
        Origin::OnFailure => reason.or(Some(Reason::GiveUp)),
        Origin::Attempt => reason,
    };
    let id = rec.execution;
    let fb = Record {
        tenant: rec.pack.tenant.clone(),
        pack: rec.pack.pack.clone(),
        version: id.map(|i| i.version).or(version).unwrap_or_default(),
        instruction: rec.instruction.to_string(),
        attempt: id.map_or(0, |i| i.attempt),
        occurrence: id.map(|i| i.occurrence),
        scheduled: rec.scheduled,
        actual: rec.actual,
        lateness_ns: rec.lateness_ns,
        uncertainty_ns: clock.uncertainty_ns,
        clock_source: clock.source,
        clock_state: clock.state,
        event: FeedbackEvent::Executed,
        outcome,
        reason,
        detail,
        value,
        action: rec.action.to_string(),
    };
    let r = push(journal, tally, &fb);
    tracing::debug!(
        target: FIRING_TARGET,
        execution_id = rec.id,
        pack = %rec.pack,
        instruction = rec.instruction,
        action = rec.action,
        scheduled_ns = rec.scheduled.as_nanos(),
        lateness_ns = rec.lateness_ns,
        result = rec.result.word(),
        detail = %fb.detail,
    );
    r
}

/// The typed reason of an attempt the device never ran.
pub fn not_run_reason(why: NotRun) -> Reason {
    match why {
        NotRun::Late => Reason::Late,
        NotRun::Withdrawn => Reason::Withdrawn,
        NotRun::Replaced => Reason::Replaced,
        NotRun::TimedOut => Reason::Timeout,
        // The dispatcher (or the exec pool) stopped first: the agent was
        // stopping.
        NotRun::Stopped => Reason::Shutdown,
    }
}

/// Encodes `fb` (binary, `crate::outbox`) into the tally's kept buffer and
/// pushes it to the outbox.
fn push(journal: &mut Journal, tally: &mut Tally, fb: &Record) -> Result<(), JournalError> {
    tally.buf.clear();
    outbox::encode(fb, &mut tally.buf);
    journal.push_feedback(&tally.buf).map(|_| ())
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
    clock: ClockStamp,
) -> Result<(), JournalError> {
    tally.count_event(&e.kind);
    let Some(word) = e.kind.feedback_event() else {
        // The executed record already says it fired and how it ended.
        announce(e, "");
        return Ok(());
    };
    let occurrence = e.occurrence.or(e.id.as_ref().map(|i| i.occurrence));
    let fb = Record {
        tenant: e.pack.tenant.clone(),
        pack: e.pack.pack.clone(),
        version: e
            .id
            .as_ref()
            .map(|i| i.version)
            .or(e.version)
            .or(version)
            .unwrap_or_default(),
        instruction: e.instruction.clone().unwrap_or_default(),
        attempt: e.id.as_ref().map_or(0, |i| i.attempt),
        occurrence,
        // A core event: about which occurrence, decided when.
        scheduled: occurrence.unwrap_or(RefTime::from_nanos(0)),
        actual: e.t,
        lateness_ns: 0,
        uncertainty_ns: clock.uncertainty_ns,
        clock_source: clock.source,
        clock_state: clock.state,
        event: word,
        // Every event but `executed` has its outcome.
        outcome: word.outcome().unwrap_or(Outcome::Ok),
        reason: e.kind.reason(),
        detail: e.detail(),
        value: None,
        action: String::new(),
    };
    let r = push(journal, tally, &fb);
    announce(e, &fb.detail);
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
