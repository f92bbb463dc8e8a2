//! What the core hands back: commands for the runtime to perform, and
//! events for feedback. The core never performs anything itself.

use std::sync::Arc;
use std::time::Duration;

use baton_proto::RefTime;
pub use baton_proto::feedback::Reason;
use baton_proto::pack::Action;

use crate::id::{ExecutionId, PackKey};
use crate::once::OnceKey;

/// Run one attempt of an action now.
#[derive(Clone, Debug, PartialEq)]
pub struct Firing {
    /// Deterministic id of this attempt.
    pub id: ExecutionId,
    /// The id as text (`id.to_string()`), made once by the core, which
    /// keys its record of fired ids by it: the runtime journals it, hands
    /// it to the dispatcher and reports under it without formatting again.
    pub text: Arc<str>,
    /// What to do.
    pub action: Arc<Action>,
    /// The instant it was due (lateness is measured from here).
    pub scheduled: RefTime,
    /// If the runtime can only perform it after this instant, it must not:
    /// it reports [`crate::AttemptResult::Late`] instead.
    pub not_after: RefTime,
    /// Per-attempt timeout (the core also enforces it).
    pub timeout: Duration,
}

/// The runtime's answer to an [`Output::Withdraw`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Withdrawal {
    /// It never touched the device and never will.
    Withdrawn,
    /// It had started (or run): its result comes as usual.
    TooLate,
}

/// Why a pack entered its safe state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SafeReason {
    /// An instruction gave up (retries exhausted, or a missed one-shot).
    GiveUp,
    /// The pack was cancelled.
    Cancel,
    /// The controller lease was lost.
    LeaseLost,
    /// The agent's clock lost sync past its limit, and the pack needs
    /// absolute time with `on_clock_loss: safe_state`.
    ClockLost,
    /// The agent is stopping.
    Shutdown,
}

impl SafeReason {
    /// Word used in feedback.
    pub fn as_str(self) -> &'static str {
        match self {
            SafeReason::GiveUp => "give_up",
            SafeReason::Cancel => "cancel",
            SafeReason::LeaseLost => "lease_lost",
            SafeReason::ClockLost => "clock_lost",
            SafeReason::Shutdown => "shutdown",
        }
    }

    /// The typed reason feedback carries for it (and for what it skips).
    pub fn reason(self) -> Reason {
        match self {
            SafeReason::GiveUp => Reason::GiveUp,
            SafeReason::Cancel => Reason::Cancel,
            SafeReason::LeaseLost => Reason::Lease,
            SafeReason::ClockLost => Reason::Clock,
            SafeReason::Shutdown => Reason::Shutdown,
        }
    }
}

/// What happened, for feedback and for `simulate`.
#[derive(Clone, Debug, PartialEq)]
pub enum EventKind {
    /// An attempt was handed to the runtime.
    Fire,
    /// The attempt succeeded (`value`: a `gpio.read` sample).
    Ok {
        /// Sampled level, for reads.
        value: Option<u8>,
    },
    /// The attempt failed.
    Fail {
        /// The class of cause, when there is one (a timeout).
        reason: Option<Reason>,
        /// What failed, in words (the device's or program's error).
        detail: String,
    },
    /// Another attempt is scheduled.
    Retry {
        /// When.
        at: RefTime,
    },
    /// The instruction gave up on this occurrence.
    GiveUp {
        /// Why (late, failed, timeout).
        reason: Reason,
        /// Particulars in words.
        detail: String,
    },
    /// An occurrence did not run.
    Skip {
        /// Why.
        reason: Reason,
        /// Particulars in words (how late, how many missed...).
        detail: String,
    },
    /// The instruction's `on_failure` action was issued.
    OnFailure,
    /// The pack's `safe_state` was issued.
    SafeState {
        /// Why.
        reason: SafeReason,
    },
    /// An attempt started before a crash and has no result: it is never
    /// fired again.
    OutcomeUnknown,
}

impl EventKind {
    /// The event's name in feedback and `simulate --json`.
    pub fn name(&self) -> &'static str {
        match self {
            EventKind::Fire => "fire",
            EventKind::Ok { .. } => "ok",
            EventKind::Fail { .. } => "fail",
            EventKind::Retry { .. } => "retry",
            EventKind::GiveUp { .. } => "give_up",
            EventKind::Skip { .. } => "skip",
            EventKind::OnFailure => "on_failure",
            EventKind::SafeState { .. } => "safe_state",
            EventKind::OutcomeUnknown => "outcome_unknown",
        }
    }

    /// The feedback record's event word; `None` for the routine `Fire`
    /// and `Ok`, which an agent reports through its execution records.
    pub fn feedback_event(&self) -> Option<baton_proto::feedback::Event> {
        use baton_proto::feedback::Event as E;
        Some(match self {
            EventKind::Fire | EventKind::Ok { .. } => return None,
            EventKind::Fail { .. } => E::Fail,
            EventKind::Retry { .. } => E::Retry,
            EventKind::GiveUp { .. } => E::GiveUp,
            EventKind::Skip { .. } => E::Skip,
            EventKind::OnFailure => E::OnFailure,
            EventKind::SafeState { .. } => E::SafeState,
            EventKind::OutcomeUnknown => E::OutcomeUnknown,
        })
    }

    /// The typed reason, when the event has one.
    pub fn reason(&self) -> Option<Reason> {
        match self {
            EventKind::Fail { reason, .. } => *reason,
            EventKind::GiveUp { reason, .. } | EventKind::Skip { reason, .. } => Some(*reason),
            EventKind::SafeState { reason } => Some(reason.reason()),
            EventKind::OutcomeUnknown => Some(Reason::Crash),
            EventKind::Fire
            | EventKind::Ok { .. }
            | EventKind::Retry { .. }
            | EventKind::OnFailure => None,
        }
    }
}

/// One feedback event.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// When the core decided it.
    pub t: RefTime,
    /// Which pack.
    pub pack: PackKey,
    /// Which instruction (none for pack-level events such as `safe_state`).
    pub instruction: Option<String>,
    /// The attempt it concerns, if any.
    pub id: Option<ExecutionId>,
    /// The occurrence it concerns, if any (set even when no attempt exists,
    /// e.g. a skipped occurrence).
    pub occurrence: Option<RefTime>,
    /// The version it is about when it has no attempt and that is not
    /// the pack's version held now: the old version's occurrence a switch
    /// replaced is the old version's (`None`: the pack's held version).
    pub version: Option<u64>,
    /// What happened.
    pub kind: EventKind,
    /// Set on once-only reports (`give_up`, `on_failure`, a give-up's
    /// `safe_state`, `outcome_unknown`): journal the key durably after the
    /// report and the events emitted with it (an `outcome_unknown`'s
    /// dependents skipped), never before (a crash between would leave them
    /// done for the core yet never made; see [`OnceKey`]).
    pub once: Option<OnceKey>,
}

impl Event {
    /// The event's particulars in words (reason, retry instant, sampled
    /// value…), for the views that print events as lines.
    pub fn detail(&self) -> String {
        match &self.kind {
            EventKind::Skip { detail, .. }
            | EventKind::GiveUp { detail, .. }
            | EventKind::Fail { detail, .. } => detail.clone(),
            EventKind::Retry { at } => format!("retry at {at}"),
            EventKind::SafeState { reason } => format!("safe state ({})", reason.as_str()),
            EventKind::Ok { value: Some(v) } => format!("value {v}"),
            EventKind::OutcomeUnknown => format!(
                "{}: started before a crash, no result recorded; never fired again",
                self.id.as_ref().map(|i| i.to_string()).unwrap_or_default()
            ),
            EventKind::Ok { value: None } | EventKind::Fire | EventKind::OnFailure => String::new(),
        }
    }
}

/// Everything the core asks of the runtime, in order.
#[derive(Clone, Debug, PartialEq)]
#[must_use]
pub enum Output {
    /// Perform an attempt; report with [`crate::Scheduler::attempt_result`].
    Fire(Firing),
    /// An attempt ran out of time: kill it (exec) and ignore its result;
    /// for a device attempt, its call has not returned one timeout after
    /// it could not be withdrawn: the core ended it (outcome unknown),
    /// and its result, if the call ever returns, is ignored.
    Abort(ExecutionId),
    /// Keep an attempt handed out earlier (armed ahead) from the device:
    /// a newer version of its pack does not keep it, or it timed out before
    /// it could start. The runtime answers with
    /// [`crate::Scheduler::withdrawal`] before its next `tick`:
    /// [`Withdrawal::Withdrawn`] if the attempt never touched the device and
    /// never will (then no result of it comes), [`Withdrawal::TooLate`] if
    /// it has started or run (then its result comes as usual, and it is the
    /// occurrence's one execution).
    Withdraw {
        /// The attempt.
        id: ExecutionId,
        /// Why: [`Reason::Replaced`] or [`Reason::Timeout`] (what the
        /// runtime reports the withdrawn attempt not run with).
        reason: Reason,
    },
    /// Perform an instruction's `on_failure` action (best effort, no retry).
    OnFailure {
        /// The pack.
        pack: PackKey,
        /// The instruction that gave up.
        instruction: String,
        /// What to do.
        action: Arc<Action>,
        /// Journal this key before performing it (the `on_failure` event
        /// just before carries the same key: one unit).
        once: OnceKey,
    },
    /// Drive the pack's lines to its safe state, now.
    SafeState {
        /// The pack.
        pack: PackKey,
        /// The pack's `safe_state` actions, in order.
        actions: Arc<Vec<Action>>,
        /// Why.
        reason: SafeReason,
        /// Set when the core enters it on its own (a give-up): journal the
        /// key before performing it (the `safe_state` event just before
        /// carries the same key). `None` for cancel, lease loss, shutdown and
        /// the re-assertion of a restored stopped pack: those run every time.
        once: Option<OnceKey>,
    },
    /// Feedback.
    Event(Event),
}
