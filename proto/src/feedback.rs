//! The typed feedback record agent and controller share.
//!
//! One shape from the scheduler core to the controller's store: the core
//! says *what* happened ([`Event`]) and *why* ([`Reason`]); the agent adds
//! the times, the clock it had, and how it ended ([`Outcome`]); the wire
//! carries all of it without folding a reason into free text
//! (`wire::Feedback`, conversions below with the `wire` feature). Words
//! ([`Outcome::as_str`], [`Reason::as_str`], [`Event::as_str`]) are what
//! logs, JSON output and a store's text columns use; [`Outcome::parse`]
//! and friends read them back. Codes (`code` / `from_code`) are the wire's
//! enum numbers, and what compact encodings (the agent's outbox) store.
//!
//! Not behind the `wire` feature: the scheduler core, which builds without
//! the gRPC stack, produces these reasons.

use std::fmt;

use crate::RefTime;

/// Defines a fieldless enum with its words and stable codes, and the
/// `as_str` / `parse` / `code` / `from_code` / `ALL` / `Display` that go
/// with them, so a word or a number is written once per value.
macro_rules! words {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $code:literal, $word:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            /// Every value, in code order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The value's word (`snake_case`), as logs, JSON and stores
            /// spell it.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $word,)+ }
            }

            /// The value a word names ([`Self::as_str`] read back).
            pub fn parse(word: &str) -> Option<$name> {
                match word { $($word => Some($name::$variant),)+ _ => None }
            }

            /// The value's stable number (the wire enum's; never 0, which
            /// the wire keeps for "unspecified").
            pub fn code(self) -> i32 {
                match self { $($name::$variant => $code,)+ }
            }

            /// The value a number names; `None` for 0 and for numbers this
            /// build does not know (a newer peer's).
            pub fn from_code(code: i32) -> Option<$name> {
                match code { $($code => Some($name::$variant),)+ _ => None }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

words! {
    /// How a feedback entry ended: the fixed set a controller stores and
    /// filters on (`feedback --json` prints one of these words).
    pub enum Outcome {
        /// The action ran and succeeded.
        Ok = 1, "ok",
        /// The action ran (or was tried) and failed.
        Failed = 2, "failed",
        /// Another attempt is scheduled.
        Retry = 3, "retry",
        /// The instruction gave up on this occurrence (or its `on_failure`
        /// was issued for a give-up).
        GiveUp = 4, "give_up",
        /// It did not run; [`Record::reason`] says why.
        Skipped = 5, "skipped",
        /// Started before a crash with no result recorded: never fired again.
        Unknown = 6, "unknown",
        /// The pack entered its safe state.
        SafeState = 7, "safe_state",
    }
}

words! {
    /// Why: for [`Outcome::Skipped`] why it did not run; for
    /// [`Outcome::SafeState`] what triggered it; for give-ups, failures and
    /// unknowns the class of cause. Codes are the wire's `Reason` numbers
    /// (`REASON_LATE` = 1 ...). Free text goes in [`Record::detail`] beside
    /// it, never as a prefix a reader must parse.
    pub enum Reason {
        /// Later than `max_lateness` (or a one-shot missed while down).
        Late = 1, "late",
        /// Armed, then withdrawn before its instant (its pack entered its
        /// safe state, was cancelled or replaced).
        Withdrawn = 2, "withdrawn",
        /// Its pack was already stopped in its safe state.
        Stopped = 3, "stopped",
        /// The clock stepped, stalled or lost sync.
        Clock = 4, "clock",
        /// The controller lease ran out.
        Lease = 5, "lease",
        /// The pack was cancelled.
        Cancel = 6, "cancel",
        /// An instruction gave up (retries exhausted).
        GiveUp = 7, "give_up",
        /// The agent was stopping.
        Shutdown = 8, "shutdown",
        /// A newer version of the pack replaced this one.
        Replaced = 9, "replaced",
        /// A dependency (`after:`) gave up.
        UpstreamFailed = 10, "upstream_failed",
        /// A dependency's outcome is unknown (it started before a crash).
        UpstreamUnknown = 11, "upstream_unknown",
        /// Missed while the agent was down or the pack undelivered, and its
        /// `catch_up` policy does not fire it.
        CatchUp = 12, "catch_up",
        /// Started before a crash, no result recorded.
        Crash = 13, "crash",
        /// The attempt ran out of its `timeout`.
        Timeout = 14, "timeout",
        /// Its attempts failed: retries exhausted.
        Failed = 15, "failed",
        /// The execution had fired already (a re-delivery, a restart): it
        /// is never fired twice.
        Duplicate = 16, "duplicate",
    }
}

words! {
    /// The agent's own word for an entry: which of its reports it is.
    pub enum Event {
        /// An attempt or side action reached the device (or was withheld:
        /// its outcome says which).
        Executed = 1, "executed",
        /// Another attempt is scheduled.
        Retry = 2, "retry",
        /// An occurrence did not run.
        Skip = 3, "skip",
        /// An attempt failed.
        Fail = 4, "fail",
        /// The instruction gave up on an occurrence.
        GiveUp = 5, "give_up",
        /// The instruction's `on_failure` action was issued.
        OnFailure = 6, "on_failure",
        /// The pack's `safe_state` was issued.
        SafeState = 7, "safe_state",
        /// An attempt started before a crash has no result.
        OutcomeUnknown = 8, "outcome_unknown",
    }
}

words! {
    /// Where the agent's reference time came from.
    pub enum ClockSource {
        /// PTP (IEEE 1588).
        Ptp = 1, "ptp",
        /// NTP servers.
        Ntp = 2, "ntp",
        /// The time exchange with the controller over the link.
        Link = 3, "link",
        /// The system clock as it is.
        System = 4, "system",
    }
}

words! {
    /// How well the clock source was followed.
    pub enum ClockState {
        /// Samples are arriving, not yet trusted.
        Syncing = 1, "syncing",
        /// Following the source within its bounds.
        Locked = 2, "locked",
        /// The source went quiet; coasting on its last estimate.
        Holdover = 3, "holdover",
        /// No source: the local clock alone.
        FreeRunning = 4, "free_running",
    }
}

impl Event {
    /// The outcome an event reports when it is not an execution (whose
    /// outcome is its result's): `None` for [`Event::Executed`].
    pub fn outcome(self) -> Option<Outcome> {
        Some(match self {
            Event::Executed => return None,
            Event::Retry => Outcome::Retry,
            Event::Skip => Outcome::Skipped,
            Event::Fail => Outcome::Failed,
            // `on_failure` is issued only on a give-up.
            Event::GiveUp | Event::OnFailure => Outcome::GiveUp,
            Event::SafeState => Outcome::SafeState,
            Event::OutcomeUnknown => Outcome::Unknown,
        })
    }
}

/// One feedback entry, typed: what the agent journals in its outbox and
/// the controller stores. The execution id is not kept as text: it is
/// rebuilt from its parts ([`Record::execution_id`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The pack's tenant.
    pub tenant: String,
    /// The pack's id.
    pub pack: String,
    /// The pack version the entry is about.
    pub version: u64,
    /// The instruction (`safe_state` / `on_failure` for side actions;
    /// empty for pack-wide events).
    pub instruction: String,
    /// Attempt number from 1; 0 when the entry is about no attempt (a
    /// side action, a skipped occurrence, a pack-wide event).
    pub attempt: u32,
    /// The occurrence (reference time) the entry is about, when it is
    /// about one.
    pub occurrence: Option<RefTime>,
    /// When it was due (executions), or the occurrence it concerns (core
    /// events); reference time.
    pub scheduled: RefTime,
    /// When it happened (executions), or when the core decided (events).
    pub actual: RefTime,
    /// `actual − scheduled` for executions (negative: early); 0 for events.
    pub lateness_ns: i64,
    /// The clock's uncertainty when the entry was taken, ns (0: not known).
    pub uncertainty_ns: i64,
    /// The clock source followed then, if known.
    pub clock_source: Option<ClockSource>,
    /// Its state then, if known.
    pub clock_state: Option<ClockState>,
    /// Which report this is.
    pub event: Event,
    /// How it ended.
    pub outcome: Outcome,
    /// Why, when there is a class of cause.
    pub reason: Option<Reason>,
    /// Free text beside the reason (an error message, a count of missed
    /// occurrences...).
    pub detail: String,
    /// A `gpio.read`'s level.
    pub value: Option<u32>,
    /// The action (`gpio.write`, `exec`, ...) for executions; empty else.
    pub action: String,
}

impl Default for Record {
    /// An empty executed-and-ok entry at the epoch: a base for building one.
    fn default() -> Self {
        Record {
            tenant: String::new(),
            pack: String::new(),
            version: 0,
            instruction: String::new(),
            attempt: 0,
            occurrence: None,
            scheduled: RefTime::from_nanos(0),
            actual: RefTime::from_nanos(0),
            lateness_ns: 0,
            uncertainty_ns: 0,
            clock_source: None,
            clock_state: None,
            event: Event::Executed,
            outcome: Outcome::Ok,
            reason: None,
            detail: String::new(),
            value: None,
            action: String::new(),
        }
    }
}

impl Record {
    /// Whether the entry names one attempt: then it has an execution id.
    pub fn has_execution_id(&self) -> bool {
        self.attempt >= 1 && self.occurrence.is_some() && !self.instruction.is_empty()
    }

    /// The execution id, `tenant/pack/vVERSION/instruction/occurrence_ns/aATTEMPT`,
    /// when the entry names one attempt ([`Record::has_execution_id`]).
    pub fn execution_id(&self) -> Option<String> {
        self.has_execution_id().then(|| {
            let mut s = String::with_capacity(64);
            // Writing into a String cannot fail.
            let _ = self.write_execution_id(&mut s);
            s
        })
    }

    /// Writes the execution id (nothing when there is none).
    pub fn write_execution_id(&self, out: &mut impl fmt::Write) -> fmt::Result {
        match self.occurrence {
            Some(occ) if self.has_execution_id() => write!(
                out,
                "{}/{}/v{}/{}/{}/a{}",
                self.tenant,
                self.pack,
                self.version,
                self.instruction,
                occ.as_nanos(),
                self.attempt
            ),
            _ => Ok(()),
        }
    }
}

/// The parts of an execution id's text (`tenant/pack/vV/instr/occ_ns/aA`);
/// `None` when the text is not one.
pub fn parse_execution_id(text: &str) -> Option<ExecutionIdParts<'_>> {
    let mut parts = text.split('/');
    let tenant = parts.next()?;
    let pack = parts.next()?;
    let version = parts.next()?.strip_prefix('v')?.parse().ok()?;
    let instruction = parts.next()?;
    let occurrence = RefTime::from_nanos(parts.next()?.parse().ok()?);
    let attempt = parts.next()?.strip_prefix('a')?.parse().ok()?;
    if parts.next().is_some() {
        return None;
    }
    Some(ExecutionIdParts {
        tenant,
        pack,
        version,
        instruction,
        occurrence,
        attempt,
    })
}

/// An execution id's text, split (see [`parse_execution_id`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExecutionIdParts<'a> {
    /// Tenant.
    pub tenant: &'a str,
    /// Pack id.
    pub pack: &'a str,
    /// Pack version.
    pub version: u64,
    /// Instruction id.
    pub instruction: &'a str,
    /// Occurrence.
    pub occurrence: RefTime,
    /// Attempt, from 1.
    pub attempt: u32,
}

/// Why a wire entry is not a typed [`Record`].
#[cfg(feature = "wire")]
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FromWireError {
    /// `OUTCOME_UNSPECIFIED`: the agent could not read its own record (its
    /// text is in `detail`), or a peer left it out.
    #[error("outcome unspecified (an unreadable agent record: {detail:?})")]
    Unspecified {
        /// The entry's `detail`.
        detail: String,
    },
    /// An outcome number this build does not know.
    #[error("unknown outcome {0}")]
    UnknownOutcome(i32),
    /// An event word this build does not know.
    #[error("unknown event {0:?}")]
    UnknownEvent(String),
    /// No pack reference.
    #[error("no pack")]
    NoPack,
    /// An execution id that is not `tenant/pack/vV/instr/occ_ns/aA`, or
    /// whose parts disagree with the entry's own fields.
    #[error(
        "execution id {0:?} does not match the entry's pack, version, instruction, occurrence and attempt"
    )]
    ExecutionId(String),
    /// A `gpio.read` value out of range.
    #[error("value {0} out of range")]
    Value(u32),
}

#[cfg(feature = "wire")]
mod wire_conv {
    use super::*;
    use crate::wire;

    impl Record {
        /// The wire form, with the outbox's `seq` and the count of
        /// entries the agent dropped just before it. Lossless:
        /// [`Record::from_wire`] gives `self` back.
        pub fn to_wire(&self, seq: u64, dropped_before: u64) -> wire::Feedback {
            wire::Feedback {
                seq,
                execution_id: self.execution_id().unwrap_or_default(),
                pack: Some(wire::PackRef {
                    tenant: self.tenant.clone(),
                    pack: self.pack.clone(),
                    version: self.version,
                }),
                instruction: self.instruction.clone(),
                attempt: self.attempt,
                scheduled_ns: self.scheduled.as_nanos(),
                actual_ns: self.actual.as_nanos(),
                lateness_ns: self.lateness_ns,
                outcome: self.outcome.code(),
                detail: self.detail.clone(),
                value: self.value,
                dropped_before,
                event: self.event.as_str().to_string(),
                action: self.action.clone(),
                uncertainty_ns: self.uncertainty_ns,
                reason: self.reason.map_or(0, Reason::code),
                clock_source: self.clock_source.map_or(0, ClockSource::code),
                clock_state: self.clock_state.map_or(0, ClockState::code),
                occurrence_ns: self.occurrence.map_or(0, RefTime::as_nanos),
            }
        }

        /// The typed record of a wire entry (its `seq` and
        /// `dropped_before` are the transport's, not the record's). A
        /// reason, clock source or state this build does not know reads
        /// as absent (the wire's rule for new values); an entry from an
        /// agent that sent no `occurrence_ns` gets it from its execution
        /// id.
        pub fn from_wire(f: &wire::Feedback) -> Result<Record, FromWireError> {
            let outcome = match f.outcome {
                0 => {
                    return Err(FromWireError::Unspecified {
                        detail: f.detail.clone(),
                    });
                }
                n => Outcome::from_code(n).ok_or(FromWireError::UnknownOutcome(n))?,
            };
            let event = Event::parse(&f.event)
                .ok_or_else(|| FromWireError::UnknownEvent(f.event.clone()))?;
            let pack = f.pack.as_ref().ok_or(FromWireError::NoPack)?;
            let mut occurrence =
                (f.occurrence_ns != 0).then(|| RefTime::from_nanos(f.occurrence_ns));
            if !f.execution_id.is_empty() {
                let bad = || FromWireError::ExecutionId(f.execution_id.clone());
                let id = parse_execution_id(&f.execution_id).ok_or_else(bad)?;
                let occ = *occurrence.get_or_insert(id.occurrence);
                let agrees = id.tenant == pack.tenant
                    && id.pack == pack.pack
                    && id.version == pack.version
                    && id.instruction == f.instruction
                    && id.occurrence == occ
                    && id.attempt == f.attempt
                    && id.attempt >= 1;
                if !agrees {
                    return Err(bad());
                }
            }
            let r = Record {
                tenant: pack.tenant.clone(),
                pack: pack.pack.clone(),
                version: pack.version,
                instruction: f.instruction.clone(),
                attempt: f.attempt,
                occurrence,
                scheduled: RefTime::from_nanos(f.scheduled_ns),
                actual: RefTime::from_nanos(f.actual_ns),
                lateness_ns: f.lateness_ns,
                uncertainty_ns: f.uncertainty_ns,
                clock_source: ClockSource::from_code(f.clock_source),
                clock_state: ClockState::from_code(f.clock_state),
                event,
                outcome,
                reason: Reason::from_code(f.reason),
                detail: f.detail.clone(),
                value: f.value,
                action: f.action.clone(),
            };
            if f.execution_id.is_empty() && r.has_execution_id() {
                // The agent named no execution, yet the fields would make
                // one up: keep the fields, but a reader must not see an id
                // the agent never sent.
                return Err(FromWireError::ExecutionId(String::new()));
            }
            Ok(r)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_and_codes_round_trip_and_are_distinct() {
        fn check<T: Copy + PartialEq + std::fmt::Debug>(
            all: &[T],
            word: fn(T) -> &'static str,
            parse: fn(&str) -> Option<T>,
            code: fn(T) -> i32,
            from: fn(i32) -> Option<T>,
        ) {
            let mut words = std::collections::HashSet::new();
            let mut codes = std::collections::HashSet::new();
            for &v in all {
                assert_eq!(parse(word(v)), Some(v));
                assert_eq!(from(code(v)), Some(v));
                assert!(code(v) > 0, "0 is the wire's unspecified");
                assert!(words.insert(word(v)) && codes.insert(code(v)));
            }
            assert_eq!(from(0), None);
            assert_eq!(from(9999), None);
            assert_eq!(parse("nonsense"), None);
        }
        check(
            Outcome::ALL,
            Outcome::as_str,
            Outcome::parse,
            Outcome::code,
            Outcome::from_code,
        );
        check(
            Reason::ALL,
            Reason::as_str,
            Reason::parse,
            Reason::code,
            Reason::from_code,
        );
        check(
            Event::ALL,
            Event::as_str,
            Event::parse,
            Event::code,
            Event::from_code,
        );
        check(
            ClockSource::ALL,
            ClockSource::as_str,
            ClockSource::parse,
            ClockSource::code,
            ClockSource::from_code,
        );
        check(
            ClockState::ALL,
            ClockState::as_str,
            ClockState::parse,
            ClockState::code,
            ClockState::from_code,
        );
        let outcomes: Vec<_> = Outcome::ALL.iter().map(|o| o.as_str()).collect();
        assert_eq!(
            outcomes,
            [
                "ok",
                "failed",
                "retry",
                "give_up",
                "skipped",
                "unknown",
                "safe_state"
            ],
            "the fixed set a controller stores"
        );
    }

    #[test]
    fn an_execution_id_is_rebuilt_from_its_parts() {
        let mut r = Record {
            tenant: "plant-a".into(),
            pack: "press".into(),
            version: 7,
            instruction: "stamp".into(),
            attempt: 2,
            occurrence: Some(RefTime::from_nanos(-5)),
            ..Record::default()
        };
        let id = r.execution_id().expect("an attempt");
        assert_eq!(id, "plant-a/press/v7/stamp/-5/a2");
        let p = parse_execution_id(&id).expect("parses");
        assert_eq!((p.tenant, p.version, p.attempt), ("plant-a", 7, 2));
        r.attempt = 0;
        assert_eq!(r.execution_id(), None, "no attempt, no id");
        assert_eq!(parse_execution_id("a/b/7/c/5/a1"), None);
        assert_eq!(parse_execution_id("a/b/v7/c/5/a1/x"), None);
    }

    #[cfg(feature = "wire")]
    #[test]
    fn the_wire_carries_a_record_losslessly() {
        let exec = Record {
            tenant: "plant-a".into(),
            pack: "press".into(),
            version: 7,
            instruction: "stamp".into(),
            attempt: 2,
            occurrence: Some(RefTime::from_nanos(1_796_000_000_000_000_000)),
            scheduled: RefTime::from_nanos(1_796_000_000_100_000_000),
            actual: RefTime::from_nanos(1_796_000_000_100_120_000),
            lateness_ns: 120_000,
            uncertainty_ns: 2_500,
            clock_source: Some(ClockSource::Link),
            clock_state: Some(ClockState::Syncing),
            event: Event::Executed,
            outcome: Outcome::Skipped,
            reason: Some(Reason::Withdrawn),
            detail: "its pack entered its safe state".into(),
            value: Some(1),
            action: "gpio.write".into(),
        };
        let pack_wide = Record {
            instruction: String::new(),
            attempt: 0,
            occurrence: None,
            event: Event::SafeState,
            outcome: Outcome::SafeState,
            reason: Some(Reason::Lease),
            value: None,
            action: String::new(),
            ..exec.clone()
        };
        for r in [exec, pack_wide] {
            let w = r.to_wire(41, 3);
            assert_eq!((w.seq, w.dropped_before), (41, 3));
            assert_eq!(w.reason, r.reason.map_or(0, Reason::code));
            assert_eq!(w.detail, r.detail, "never a word folded into detail");
            assert_eq!(Record::from_wire(&w), Ok(r));
        }
    }

    #[cfg(feature = "wire")]
    #[test]
    fn wire_entries_that_are_no_record_say_why() {
        use crate::wire;
        let ok = Record {
            tenant: "t".into(),
            pack: "p".into(),
            version: 1,
            instruction: "i".into(),
            attempt: 1,
            occurrence: Some(RefTime::from_nanos(5)),
            action: "noop".into(),
            ..Record::default()
        }
        .to_wire(1, 0);
        let unspecified = wire::Feedback {
            outcome: 0,
            detail: "raw".into(),
            ..ok.clone()
        };
        assert!(matches!(
            Record::from_wire(&unspecified),
            Err(FromWireError::Unspecified { .. })
        ));
        let forged = wire::Feedback {
            execution_id: "t/p/v1/other/5/a1".into(),
            ..ok.clone()
        };
        assert!(matches!(
            Record::from_wire(&forged),
            Err(FromWireError::ExecutionId(_))
        ));
        // An older agent sent no occurrence: it is read from the id.
        let older = wire::Feedback {
            occurrence_ns: 0,
            ..ok.clone()
        };
        assert_eq!(
            Record::from_wire(&older).map(|r| r.occurrence),
            Ok(Some(RefTime::from_nanos(5)))
        );
        // A reason from a newer peer reads as none.
        let newer = wire::Feedback { reason: 999, ..ok };
        assert_eq!(Record::from_wire(&newer).map(|r| r.reason), Ok(None));
    }
}
