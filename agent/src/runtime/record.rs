//! What the runtime reports of each attempt it performed or withheld.

use baton_proto::RefTime;

use crate::dispatcher::NotRun;

/// How an attempt ended, as the live view and feedback say it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FiringResult {
    /// Done; `value` for `gpio.read`.
    Ok {
        /// The sampled level.
        value: Option<u8>,
    },
    /// The device or program failed.
    Failed(String),
    /// Never touched the device.
    NotRun(NotRun),
}

impl FiringResult {
    /// Whether the device was touched (only those count towards lateness).
    pub fn ran(&self) -> bool {
        !matches!(self, FiringResult::NotRun(_))
    }

    /// The word used in feedback (`result`).
    pub fn word(&self) -> &'static str {
        match self {
            FiringResult::Ok { .. } => "ok",
            FiringResult::Failed(_) => "failed",
            FiringResult::NotRun(NotRun::Late) => "late",
            FiringResult::NotRun(NotRun::Withdrawn | NotRun::Replaced | NotRun::TimedOut) => {
                "withdrawn"
            }
            FiringResult::NotRun(NotRun::Stopped) => "stopped",
        }
    }

    /// Particulars in words (failure reason, sampled value).
    pub fn detail(&self) -> String {
        match self {
            FiringResult::Ok { value: Some(v) } => format!("value={v}"),
            FiringResult::Failed(m) => m.clone(),
            FiringResult::NotRun(NotRun::Withdrawn) => "its pack entered its safe state".into(),
            FiringResult::NotRun(NotRun::Replaced) => {
                "withdrawn before it started: a newer version of its pack replaced it".into()
            }
            FiringResult::NotRun(NotRun::TimedOut) => {
                "withdrawn at its timeout, before it could start".into()
            }
            FiringResult::NotRun(NotRun::Stopped) => "the agent stopped first".into(),
            FiringResult::NotRun(NotRun::Late) => "reached after its max_lateness".into(),
            FiringResult::Ok { value: None } => String::new(),
        }
    }
}

/// Who asked for an action.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// An attempt of an instruction.
    Attempt,
    /// A pack's safe state, and why it was entered.
    SafeState(baton_sched::SafeReason),
    /// An instruction's on_failure.
    OnFailure,
}

/// One executed (or withheld) action, for the live view and feedback.
/// Borrowed: reporting a firing allocates nothing of its own.
#[derive(Clone, Debug)]
pub struct FiringRecord<'a> {
    /// The execution id (or `<pack> safe_state (reason)@<ns>` for side actions).
    pub id: &'a str,
    /// The attempt, for attempts (its parts go to feedback; the text is
    /// not parsed back).
    pub execution: Option<&'a baton_sched::ExecutionId>,
    /// The pack.
    pub pack: &'a baton_sched::PackKey,
    /// Instruction id (or `safe_state` / `on_failure`).
    pub instruction: &'a str,
    /// Who asked.
    pub origin: Origin,
    /// Action name.
    pub action: &'static str,
    /// When it was due (reference).
    pub scheduled: RefTime,
    /// When it happened (reference).
    pub actual: RefTime,
    /// `actual − scheduled`, ns (negative: early).
    pub lateness_ns: i64,
    /// How it ended.
    pub result: FiringResult,
}

impl<'a> FiringRecord<'a> {
    /// An attempt of an instruction; lateness is `actual − scheduled`.
    pub fn attempt(
        id: &'a baton_sched::ExecutionId,
        text: &'a str,
        action: &'static str,
        scheduled: RefTime,
        actual: RefTime,
        result: FiringResult,
    ) -> Self {
        FiringRecord {
            id: text,
            execution: Some(id),
            pack: &id.pack,
            instruction: &id.instruction,
            origin: Origin::Attempt,
            action,
            scheduled,
            actual,
            lateness_ns: actual.as_nanos().saturating_sub(scheduled.as_nanos()),
            result,
        }
    }
}
