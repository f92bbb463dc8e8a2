//! Staged versions (`activate: together`), their rules sans IO.
//!
//! A pushed version checked as it would be accepted is kept aside while
//! the held version runs on, and switched to at the instant the
//! controller names. While it is kept with an instant, the core holds the
//! held version back from that instant on (its switch fence,
//! [`SwitchFence`]): nothing of the old program due after the instant can
//! reach the device, however late the loop gets to the switch. Every way a
//! staged version leaves (superseded by a push or a new staging,
//! cancelled, switched or refused at its instant) says what becomes of
//! the fence, so the agent cannot forget to lift it, or lift it before a
//! switch took the version it fences.
//!
//! At most one version is staged per pack; a staged version switches only
//! at or after its instant, and once.

use std::collections::BTreeMap;

use baton_proto::RefTime;
use baton_sched::PackKey;

/// The core's switch fence on `key`'s held version: set at `at`, or lifted
/// (`None`). The agent passes it to `Scheduler::switch_fence`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub struct SwitchFence {
    /// The pack.
    pub key: PackKey,
    /// Where the fence stands (`None`: lifted).
    pub at: Option<RefTime>,
}

/// A version kept aside, with what the agent needs to switch it (`body`:
/// its text, its checked pack, its reference on the wire).
#[derive(Debug)]
pub struct Staged<B> {
    /// Its version.
    pub version: u64,
    /// When to switch (`None`: not named yet).
    pub at: Option<RefTime>,
    /// Not switched while the clock is less certain than this (ns; 0: the
    /// agent's own limit).
    pub max_uncertainty_ns: i64,
    /// The pack ran (held and active) when this version was staged: if it
    /// is stopped by the instant (a local cancel, its lease or the clock
    /// lost), the switch must not bring it back without the controller.
    pub replaces_running: bool,
    /// The agent's part.
    pub body: B,
}

/// What a staged push meets in the core.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StageVerdict {
    /// The version already runs (a re-sent push): nothing to stage, and
    /// whatever was staged of the pack goes.
    Running,
    /// Older than the version held: refused (versions only go up).
    Older {
        /// The version held.
        held: u64,
    },
    /// To check and keep; `replaces_running`: the pack runs now.
    Stage {
        /// See [`Staged::replaces_running`].
        replaces_running: bool,
    },
}

/// Whether a staged `version` of a pack whose core state is `held`
/// (version, active) may be staged.
pub fn stage_verdict(held: Option<(u64, bool)>, version: u64) -> StageVerdict {
    match held {
        Some((v, true)) if v == version => StageVerdict::Running,
        Some((v, _)) if v > version => StageVerdict::Older { held: v },
        Some((_, active)) => StageVerdict::Stage {
            replaces_running: active,
        },
        None => StageVerdict::Stage {
            replaces_running: false,
        },
    }
}

/// What a staged version whose instant came does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SwitchVerdict {
    /// Accept it as of `at` (however late the loop got there).
    Switch {
        /// The stage's instant.
        at: RefTime,
    },
    /// The version it replaces was stopped since it was staged: it stays
    /// stopped until the controller pushes again.
    Stopped,
    /// The clock is less certain than the bound: the held version runs on.
    ClockUncertain {
        /// The clock's uncertainty now (ns).
        uncertainty_ns: i64,
        /// The rollout's bound, or the agent's limit (ns).
        bound_ns: i64,
    },
}

/// Whether `s` switches now: `held_active`, the pack runs; the clock's
/// `uncertainty_ns` against the rollout's bound (or `limit_ns`).
pub fn switch_verdict<B>(
    s: &Staged<B>,
    now: RefTime,
    held_active: bool,
    uncertainty_ns: i64,
    limit_ns: i64,
) -> SwitchVerdict {
    if s.replaces_running && !held_active {
        return SwitchVerdict::Stopped;
    }
    let bound_ns = match s.max_uncertainty_ns {
        0 => limit_ns,
        b => b,
    };
    if uncertainty_ns > bound_ns {
        return SwitchVerdict::ClockUncertain {
            uncertainty_ns,
            bound_ns,
        };
    }
    SwitchVerdict::Switch {
        at: s.at.unwrap_or(now),
    }
}

/// The staged versions, by pack.
#[derive(Debug)]
pub struct Staging<B> {
    staged: BTreeMap<PackKey, Staged<B>>,
}

impl<B> Default for Staging<B> {
    fn default() -> Self {
        Staging {
            staged: BTreeMap::new(),
        }
    }
}

impl<B> Staging<B> {
    /// Keep `s` for `key`, replacing whatever was staged of it; the fence
    /// goes to its instant.
    pub fn keep(&mut self, key: PackKey, s: Staged<B>) -> SwitchFence {
        let at = s.at;
        self.staged.insert(key.clone(), s);
        SwitchFence { key, at }
    }

    /// Drop what is staged of `key` without switching (superseded by a
    /// push or a new staging, cancelled): the fence lifts, and what it held
    /// goes out late or is reported skipped. `None`: nothing was staged.
    pub fn drop(&mut self, key: &PackKey) -> Option<SwitchFence> {
        self.staged.remove(key).map(|_| SwitchFence {
            key: key.clone(),
            at: None,
        })
    }

    /// The first staged version (in pack order) whose instant came, taken
    /// out; one at a time, so a switch that fails (and ends the loop)
    /// leaves the others staged. The fence stays: the switch replaces the
    /// version it is on; the agent lifts it once the switch is done or
    /// refused ([`lift`]).
    pub fn take_next_due(&mut self, now: RefTime) -> Option<(PackKey, Staged<B>)> {
        let key = self
            .staged
            .iter()
            .find(|(_, s)| s.at.is_some_and(|at| at <= now))
            .map(|(k, _)| k.clone())?;
        self.staged.remove(&key).map(|s| (key, s))
    }

    /// The earliest instant a staged version switches at.
    pub fn next_switch(&self) -> Option<RefTime> {
        self.staged.values().filter_map(|s| s.at).min()
    }

    /// The version staged for `key`, if any.
    pub fn version(&self, key: &PackKey) -> Option<u64> {
        self.staged.get(key).map(|s| s.version)
    }
}

/// The fence of a pack whose staged version was taken by
/// [`Staging::take_next_due`],
/// lifted once its switch is done or refused.
pub fn lift(key: &PackKey) -> SwitchFence {
    SwitchFence {
        key: key.clone(),
        at: None,
    }
}
