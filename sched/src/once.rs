//! Once-only actions across restarts, and what the core is told at start-up.
//!
//! The core asks for some things on its own — a give-up report, an
//! instruction's `on_failure`, the safe state a give-up leads to, an
//! `outcome_unknown` report. Each such output carries a [`OnceKey`]. The
//! runtime journals the key durably *before* it performs the output (an
//! action), or *after* it reports it and the events that came with it (a
//! report: the key's durable write carries the buffered reports ahead of
//! it, as a key without them would lose them); after a restart it hands
//! the journalled keys back in [`Prior::done`], and the core never emits
//! them again — it still updates its state as though they had happened
//! (dependents skipped, pack stopped).

use std::collections::{HashMap, HashSet};
use std::fmt;

use baton_proto::RefTime;

use crate::id::PackKey;

/// What the journal knows about an attempt from before a restart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PriorOutcome {
    /// It ran and succeeded.
    Succeeded,
    /// It ran and failed.
    Failed,
    /// It started (durable start record) but has no result: it may or may
    /// not have touched the device, so it is never fired again.
    Unknown,
    /// It was armed but provably never touched the device (withdrawn at a
    /// safe state or shutdown, or reached too late): it may fire again.
    NotRun,
}

/// Everything the core must know from before a restart.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Prior {
    /// Attempts by [`crate::ExecutionId`] text: never fired again (unless
    /// [`PriorOutcome::NotRun`]).
    pub attempts: HashMap<String, PriorOutcome>,
    /// [`OnceKey`] texts already journalled: those outputs are not emitted
    /// again.
    pub done: HashSet<String>,
}

impl From<HashMap<String, PriorOutcome>> for Prior {
    fn from(attempts: HashMap<String, PriorOutcome>) -> Self {
        Prior {
            attempts,
            done: HashSet::new(),
        }
    }
}

/// Which once-only output a [`OnceKey`] names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OnceKind {
    /// The give-up report of an occurrence.
    GiveUp,
    /// The instruction's `on_failure` action after that give-up.
    OnFailure,
    /// The pack's safe state entered because of that give-up (its
    /// `safe_state` event and the [`crate::Output::SafeState`]).
    SafeState,
    /// The `outcome_unknown` report of an occurrence.
    OutcomeUnknown,
}

impl OnceKind {
    /// The last segment of the key's text.
    pub fn as_str(self) -> &'static str {
        match self {
            OnceKind::GiveUp => "give_up",
            OnceKind::OnFailure => "on_failure",
            OnceKind::SafeState => "safe_state",
            OnceKind::OutcomeUnknown => "outcome_unknown",
        }
    }
}

/// Deterministic key of a once-only output: the same occurrence gives the
/// same key on every run. Its text, `tenant/pack/vN/instruction/occ_ns/kind`
/// (e.g. `plant-a/press/v3/clamp/1796119200000000000/give_up`), is what the
/// runtime journals and passes back in [`Prior::done`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct OnceKey {
    /// Tenant and pack.
    pub pack: PackKey,
    /// Pack version.
    pub version: u64,
    /// The instruction the output stems from.
    pub instruction: String,
    /// Its occurrence (planned instant).
    pub occurrence: RefTime,
    /// Which output.
    pub kind: OnceKind,
}

impl fmt::Display for OnceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}/v{}/{}/{}/{}",
            self.pack.tenant,
            self.pack.pack,
            self.version,
            self.instruction,
            self.occurrence.as_nanos(),
            self.kind.as_str()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_text_is_stable() {
        let k = OnceKey {
            pack: PackKey {
                tenant: "plant-a".into(),
                pack: "press".into(),
            },
            version: 3,
            instruction: "clamp".into(),
            occurrence: RefTime::from_nanos(-7),
            kind: OnceKind::GiveUp,
        };
        assert_eq!(k.to_string(), "plant-a/press/v3/clamp/-7/give_up");
        let k = OnceKey {
            kind: OnceKind::OutcomeUnknown,
            ..k
        };
        assert_eq!(k.to_string(), "plant-a/press/v3/clamp/-7/outcome_unknown");
    }
}
