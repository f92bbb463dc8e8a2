//! Why the runtime failed, as a value: callers decide on the variant
//! (a journal failure ends the loop, a refusal is the requester's answer,
//! a hung chip has its own exit status) instead of recovering a type from
//! an opaque error. The binary turns these into its report at its edge.

use std::fmt;

use baton_journal::JournalError;
use baton_sched::PackKey;

use baton_proto::time::fmt_ns;

use super::safety::GpioHung;
use crate::dispatcher::DispatchError;
use baton_control::admission::AdmissionError;

/// A failure of the control loop, its start or its way out.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The journal failed: nothing more may be made durable, so the loop
    /// ends through its one way out.
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// The dispatcher thread refused or did not answer.
    #[error(transparent)]
    Dispatch(#[from] DispatchError),
    /// A pack was not taken (and the caller cannot answer a sender).
    /// Boxed, as every `AcceptError` in here: a `Result` of the hot path
    /// stays small.
    #[error(transparent)]
    Accept(Box<AcceptError>),
    /// The GPIO chip did not take the safe-state writes: the agent exits
    /// with [`super::safety::EXIT_GPIO_HUNG`]. `why` says what was tried.
    #[error("{why}")]
    GpioHung {
        /// What did not land.
        why: String,
        /// The hung chip, as the report's last words.
        #[source]
        hung: GpioHung,
    },
    /// The way out had to bypass a stuck dispatcher: a fault whatever
    /// asked for the stop (`cause`: the fault that ended the loop, if one
    /// did).
    #[error("{why}")]
    Degraded {
        /// How the safe state was driven instead.
        why: String,
        /// What ended the loop, if it was a fault.
        #[source]
        cause: Option<Box<RuntimeError>>,
    },
    /// The controller link's thread could not be started.
    #[error("starting the controller link thread: {0}")]
    LinkStart(std::io::Error),
    /// A configured pack file cannot be read or parsed (the message names
    /// the file and each problem's position).
    #[error("{0}")]
    PackFile(String),
    /// A configured pack file was refused.
    #[error("{file}: pack {key} refused")]
    PackRefused {
        /// The file, as given.
        file: String,
        /// The pack it holds.
        key: PackKey,
        /// Why.
        #[source]
        error: Box<AcceptError>,
    },
    /// A pack file that waited for the clock failed to be taken in a way
    /// that is the loop's fault (its journal).
    #[error("{file}")]
    ClockWaitFault {
        /// The file, as given.
        file: String,
        /// The fault.
        #[source]
        error: Box<AcceptError>,
    },
    /// A cancel of a pack this agent does not hold.
    #[error("pack {0} is not held by this agent")]
    NotHeld(PackKey),
    /// This agent is a new version on trial and was not welcomed by a
    /// controller in time: it stops (safe state first) so the launcher
    /// runs the version before it again.
    #[error(
        "agent update: version {version} on trial was not welcomed by a controller within {within_s} s; stopping so the launcher rolls it back"
    )]
    TrialUnconfirmed {
        /// This build's version.
        version: String,
        /// The deadline, seconds after the start.
        within_s: u64,
    },
    /// A part of the real agent could not be started (`what`: which).
    #[error("{what}")]
    Start {
        /// The part, in words ("opening the journal in …").
        what: String,
        /// Why.
        #[source]
        cause: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl From<AcceptError> for RuntimeError {
    fn from(e: AcceptError) -> Self {
        RuntimeError::Accept(Box::new(e))
    }
}

impl RuntimeError {
    /// Whether the GPIO chip is hung (the binary's own exit status).
    pub fn is_gpio_hung(&self) -> bool {
        matches!(self, RuntimeError::GpioHung { .. })
    }

    /// The chip is hung; `why` says what did not land.
    pub(super) fn gpio_hung(why: impl Into<String>) -> Self {
        RuntimeError::GpioHung {
            why: why.into(),
            hung: GpioHung,
        }
    }

    /// A part of the real agent that did not start.
    pub(super) fn start(
        what: impl Into<String>,
        cause: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        RuntimeError::Start {
            what: what.into(),
            cause: Box::new(cause),
        }
    }
}

/// An error and its causes on one line, `a: b: c` (as the binary reports
/// them): for the loop's own log lines and answers.
#[derive(Debug)]
pub struct Chain<'a>(pub &'a (dyn std::error::Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut next = self.0.source();
        while let Some(e) = next {
            write!(f, ": {e}")?;
            next = e.source();
        }
        Ok(())
    }
}

/// Why a pack was not taken by `Agent::accept`. The variants say who
/// must act: the sender (`Refused`, `NotLive`, `Core`), time (`Clock`:
/// retry once the clock is known), or the agent itself (`Journal`,
/// `Fault`: the control loop cannot go on, see [`AcceptError::is_fault`]).
#[derive(Debug, thiserror::Error)]
pub enum AcceptError {
    /// The clock is not known well enough to honour the pack (docs/design.md
    /// principle 3).
    #[error(
        "the pack needs absolute time (at, cron, start_at or until) and the clock's uncertainty {} exceeds the agent's limit {} ({}); it is accepted once a clock source is locked",
        fmt_ns(*uncertainty_ns),
        baton_proto::time::format_duration(std::time::Duration::from_nanos((*limit_ns).max(0) as u64)),
        clock
    )]
    Clock {
        /// The clock's uncertainty now, ns.
        uncertainty_ns: i64,
        /// The agent's limit (`clock.limit`), ns.
        limit_ns: i64,
        /// Which source, in which state (`system clock, free-running`).
        clock: String,
    },
    /// The pack can never fire again (a cron of past years, say); each
    /// problem with its position.
    #[error("{}", .0.render("pack").trim_end())]
    NotLive(baton_proto::PackErrors),
    /// This agent's own checks refuse it: versions, exec allowlist, lines,
    /// line owners.
    #[error(transparent)]
    Refused(#[from] AdmissionError),
    /// The core refuses it (an older version than held).
    #[error(transparent)]
    Core(#[from] baton_sched::AcceptError),
    /// The pack could not be made durable: nothing of it took effect, and
    /// the journal is broken (the loop's fault).
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// The pack was taken, but performing its first outputs failed (a
    /// journal or device error): the loop's fault.
    #[error(transparent)]
    Fault(Box<RuntimeError>),
}

impl AcceptError {
    /// Whether the control loop must stop on it (through its one way out),
    /// as on any journal failure: not the pack's fault.
    pub fn is_fault(&self) -> bool {
        matches!(self, AcceptError::Journal(_) | AcceptError::Fault(_))
    }
}
