//! The one place that decides which version of which pack each agent
//! should hold, and what to tell it. Pure: a function of the pack (its
//! latest version, targets, cancellation), the agent (id, labels, operator
//! labels, tenants) and the stored row (what the agent holds, its last
//! refusal). The store runs it inside its own serialization point for
//! every (agent, pack) a change can affect, so two decisions never
//! overwrite each other; the sessions run [`action`] on the rows to know
//! what to send.
//!
//! Rules:
//! - a live pack that targets an agent serving its tenant is wanted at its
//!   latest version; the agent is sent that version unless it holds it,
//!   refused it for good, or holds a newer one (then the row is nacked
//!   with the reason: the agent refuses lower versions, and a push never
//!   waits for ever);
//! - a pack the store knows that the agent holds but should not (cancelled,
//!   retargeted, another tenant's) is withdrawn: cancelled on the agent;
//! - a pack the store does not know is the agent's own (`local`) and left
//!   alone (its row stays after the agent drops it, so late feedback of
//!   it is still the agent's), unless an operator cancelled it by name
//!   (the row is then `withdraw`, so every holder is told, even after a
//!   store was lost);
//! - an operator may withdraw a live pack from chosen agents: no version
//!   up to the latest at that moment is wanted there again (a rollout's
//!   `from` included); a newer version is;
//! - a refusal counts only for the version it refused: a newer version is
//!   sent again; and only until the agent holds that version.
//!
//! - a rollout gates the latest version (`Gate`): its
//!   cohort holds the latest (or has it withdrawn, after an abort with
//!   `on_abort: safe_state`); every other target keeps what it holds
//!   between the rollout's `from` and the latest, or gets `from` (nothing
//!   when the pack was new or cancelled): never a version lower than it
//!   holds, and never again an aborted rollout's version or a cancelled
//!   pack's (those are withdrawn).

use crate::records::{
    Activation, AgentRow, Answer, Binding, DeliveryRow, DeliveryState, Held, Intent, PackKey,
    PackTargets, Refusal, StagedRow,
};

use crate::time::RefTime;

/// The version `agent` should hold of `pack`, or `None`, given what it
/// holds.
pub fn wanted(
    agent: &AgentRow,
    pack: &PackTargets,
    held: Option<Held>,
    binding: Binding,
) -> Option<u64> {
    wanted_unless_stopped(agent, pack, held, binding).filter(|&v| !pack.stopped_at(&agent.id, v))
}

fn wanted_unless_stopped(
    agent: &AgentRow,
    pack: &PackTargets,
    held: Option<Held>,
    binding: Binding,
) -> Option<u64> {
    let live = pack.cancelled.is_none();
    let targeted = live
        && agent.serves(&pack.tenant, binding)
        && pack
            .targets
            .matches(&agent.id, &agent.labels_for(&pack.tenant));
    if !targeted {
        return None;
    }
    let Some(gate) = &pack.gate else {
        return Some(pack.latest);
    };
    if gate.admitted.contains(&agent.id) {
        return gate.row.members_hold.then_some(pack.latest);
    }
    // Outside the cohort: what it holds stays if it is newer than `from`
    // (an agent of a superseded rollout keeps its newer copy rather than
    // be told to go back, which it would refuse), unless it is a version
    // that must not run again (an aborted rollout's, or a cancelled
    // pack's): that is withdrawn.
    let g = &gate.row;
    let dead = |v: u64| g.banned.contains(&v) || g.keep_above.is_some_and(|k| v <= k);
    match held {
        Some(h) if dead(h.version) => None,
        Some(h) if g.from.is_none_or(|f| h.version > f) => Some(h.version.min(pack.latest)),
        _ => g.from,
    }
}

/// The row (agent, `key`) should have now, from the pack as stored
/// (`None`: the store does not know it), the agent, the row as it was
/// (`None`: no row yet; its refusal and attempts are kept while they
/// concern the same version) and what the agent holds. `None`: no row is
/// needed. `updated` is kept when nothing else changed, so re-planning
/// an unchanged row changes nothing.
pub fn plan(
    agent: &AgentRow,
    key: &PackKey,
    pack: Option<&PackTargets>,
    row: Option<&DeliveryRow>,
    held: Option<Held>,
    binding: Binding,
    now: RefTime,
) -> Option<DeliveryRow> {
    let (intent, version) = intent_of(agent, pack, row, held, binding)?;
    // A refusal is over once the agent holds the version it refused (it
    // took it after all): kept, it would make a later drop of that
    // version nacked or "retrying" for a reason that no longer holds.
    let refusal = row.and_then(|r| r.refusal.clone()).filter(|f| {
        intent == Intent::Hold && f.version == version && held.is_none_or(|h| h.version != version)
    });
    let behind = held.is_none_or(|h| h.version < version);
    // A member of a stage that switches together: staged first, then the
    // instant once every member staged it (none for one held back).
    let activate = if intent == Intent::Hold && behind {
        activation(agent, pack)
    } else {
        Activation::OnArrival
    };
    // What the agent staged: kept while it is what this row wants, and
    // also while it carries an instant the row no longer wants (an abort,
    // a supersede, a cancel, a retarget): that copy would switch in at
    // its instant, so it is disarmed first ([`action`]).
    let staged = row.and_then(|r| r.staged).filter(|st| {
        let wanted = st.version == version && behind && activate != Activation::OnArrival;
        wanted || armed_unwanted(*st, intent, version, activate, held)
    });
    let (state, mut reason) = state_of(intent, version, held, refusal.as_ref());
    if state == DeliveryState::Pending && reason.is_empty() {
        reason = staging_reason(activate, staged);
    }
    let attempts = match row {
        Some(r) if r.version == version && r.intent == intent => r.attempts,
        _ => 0,
    };
    let mut next = DeliveryRow {
        agent_id: agent.id.clone(),
        tenant: key.tenant.clone(),
        pack: key.pack.clone(),
        version,
        intent,
        held,
        refusal,
        state,
        reason,
        attempts,
        updated: now,
        activate,
        staged,
    };
    if let Some(r) = row {
        next.updated = r.updated;
        if *r != next {
            next.updated = now;
        }
    }
    Some(next)
}

/// What the controller wants of the agent for the pack, and the version
/// it is about; `None`: no row is needed.
fn intent_of(
    agent: &AgentRow,
    pack: Option<&PackTargets>,
    row: Option<&DeliveryRow>,
    held: Option<Held>,
    binding: Binding,
) -> Option<(Intent, u64)> {
    Some(match pack {
        Some(p) => match wanted(agent, p, held, binding) {
            Some(v) => (Intent::Hold, v),
            None => match (row, held) {
                // Held but not wanted: withdrawn at the version held. Once
                // decided, a withdrawal stays on record.
                (_, Some(h)) => (Intent::Withdraw, h.version),
                (Some(r), None) if r.intent != Intent::Local => (Intent::Withdraw, r.version),
                _ => return None,
            },
        },
        None => match (row, held) {
            (Some(r), _) if r.intent == Intent::Withdraw => (Intent::Withdraw, r.version),
            (_, Some(h)) => (Intent::Local, h.version),
            // No longer held: the row stays, so feedback of the pack's
            // last moments (its safe state) is still the agent's own.
            (Some(r), None) => (Intent::Local, r.version),
            _ => return None,
        },
    })
}

/// How an agent behind the wanted version runs it: a member of a stage
/// that switches together is staged first, then given the instant once
/// every member staged it (none for one held back); anyone else runs it
/// on arrival.
fn activation(agent: &AgentRow, pack: Option<&PackTargets>) -> Activation {
    match pack.and_then(|p| p.gate.as_ref()) {
        Some(g) if g.row.together && g.row.members_hold && g.admitted.contains(&agent.id) => {
            match g.row.switch_at {
                Some(t) if !g.row.held_back.contains(&agent.id) => Activation::At(t),
                _ => Activation::Staged,
            }
        }
        _ => Activation::OnArrival,
    }
}

/// A staged copy with an instant that the row does not want switched
/// (any more), on an agent that holds an older version: left alone, it
/// would switch in at its instant.
fn armed_unwanted(
    st: StagedRow,
    intent: Intent,
    version: u64,
    activate: Activation,
    held: Option<Held>,
) -> bool {
    let wanted_instant =
        intent == Intent::Hold && st.version == version && activate == Activation::At(st.at);
    st.at.as_nanos() != 0 && !wanted_instant && held.is_none_or(|h| h.version < st.version)
}

/// Why a staged row waits, in words (empty on arrival).
fn staging_reason(activate: Activation, staged: Option<StagedRow>) -> String {
    match (activate, staged) {
        (Activation::OnArrival, _) => String::new(),
        (Activation::Staged, Some(_)) => "staged, waiting for the stage's instant".into(),
        (Activation::Staged, None) => "to be staged".into(),
        (Activation::At(t), Some(st)) if st.at == t => {
            format!("staged, switching at {} ns", t.as_nanos())
        }
        (Activation::At(t), _) => format!("to switch at {} ns", t.as_nanos()),
    }
}

/// State and reason from the decision and the agent's answers.
fn state_of(
    intent: Intent,
    version: u64,
    held: Option<Held>,
    refusal: Option<&Refusal>,
) -> (DeliveryState, String) {
    match intent {
        Intent::Local => (DeliveryState::Local, String::new()),
        Intent::Withdraw => (DeliveryState::Cancelled, String::new()),
        Intent::Hold => match (held, refusal) {
            (Some(h), _) if h.version == version => (DeliveryState::Acked, String::new()),
            (Some(h), _) if h.version > version => (
                DeliveryState::Nacked,
                format!(
                    "the agent holds v{}, newer than v{version} (the store may have been restored from an older copy): push v{} or higher",
                    h.version,
                    h.version + 1
                ),
            ),
            (_, Some(f)) if f.last => (DeliveryState::Nacked, f.message.clone()),
            (_, Some(f)) => (DeliveryState::Pending, format!("{} (retrying)", f.message)),
            _ => (DeliveryState::Pending, String::new()),
        },
    }
}

/// Re-plans a row after the agent answered the push of `version`: an ack
/// means it holds that version now; a refusal counts for the row's version
/// only (an answer about an older push changes nothing else). `updated`
/// moves only when the row changed.
#[allow(clippy::too_many_arguments)] // one decision's inputs, passed through
pub fn answered(
    agent: &AgentRow,
    pack: Option<&PackTargets>,
    row: &DeliveryRow,
    version: u64,
    answer: &Answer,
    attempts: u32,
    binding: Binding,
    now: RefTime,
) -> Option<DeliveryRow> {
    let mut r = row.clone();
    if r.version == version {
        r.attempts = r.attempts.max(attempts);
    }
    let held = match answer {
        Answer::Acked => {
            // A version taken replaces whatever was staged before it.
            if r.staged.is_some_and(|st| st.version <= version) {
                r.staged = None;
            }
            Some(Held {
                version,
                stopped: false,
            })
        }
        Answer::Staged(at) => {
            if r.version == version || r.staged.is_some_and(|st| st.version == version) {
                r.staged = Some(StagedRow { version, at: *at });
            }
            r.held
        }
        Answer::Refused(f) => {
            if r.version == version {
                r.refusal = Some(f.clone());
            }
            // A refused staging drops what the agent had staged of it.
            if r.staged.is_some_and(|st| st.version == version) {
                r.staged = None;
            }
            r.held
        }
    };
    let mut next = plan(agent, &row.key(), pack, Some(&r), held, binding, now)?;
    next.updated = row.updated;
    if next != *row {
        next.updated = now;
    }
    Some(next)
}

/// What to tell an agent about one pack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Send this version of the row's pack.
    Push(u64),
    /// Send it staged: kept aside, the held version runs on.
    Stage(u64),
    /// Send it staged with the instant to switch at.
    Switch(u64, RefTime),
    /// Cancel the agent's copy (the version it holds).
    Cancel(u64),
}

impl Action {
    /// The version it is about.
    pub fn version(self) -> u64 {
        match self {
            Action::Push(v) | Action::Stage(v) | Action::Switch(v, _) | Action::Cancel(v) => v,
        }
    }
}

/// What the row asks of the agent now, if anything. Never a version
/// lower than or equal to what it holds; a staged row asks once per
/// version (and instant) the agent has not said it staged.
pub fn action(row: &DeliveryRow) -> Option<Action> {
    let v = row.version;
    // Before anything else: a copy the agent would switch in at an instant
    // nobody wants any more is sent again staged without one (disarmed).
    if let Some(st) = row.staged
        && armed_unwanted(st, row.intent, v, row.activate, row.held)
    {
        return Some(Action::Stage(st.version));
    }
    match (row.intent, row.state, row.held) {
        (Intent::Hold, DeliveryState::Pending, h) if h.is_none_or(|h| h.version < v) => {
            match row.activate {
                Activation::OnArrival => Some(Action::Push(v)),
                Activation::Staged => {
                    (row.staged.map(|st| st.version) != Some(v)).then_some(Action::Stage(v))
                }
                Activation::At(t) => (row.staged != Some(StagedRow { version: v, at: t }))
                    .then_some(Action::Switch(v, t)),
            }
        }
        (Intent::Withdraw, _, Some(h)) => Some(Action::Cancel(h.version)),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
