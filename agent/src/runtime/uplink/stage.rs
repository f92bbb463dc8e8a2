//! Staged versions (`activate: together`): a pushed version checked as it
//! would be accepted, kept aside while the held version runs on, and
//! switched to at the instant the controller names, on this agent's
//! aligned clock. A stage's agents all switch at that instant, so a line
//! of presses changes program between two strokes, not one press at a
//! time.
//!
//! While a version is staged with an instant, the held version is fenced
//! there ([`baton_sched::Scheduler::switch_fence`]; not the session's
//! fencing of `baton_control::session::fence`): nothing of it due after
//! the instant is armed ahead or handed out, so a loop that gets to the
//! switch late (under load) cannot have given the device an old-program
//! stroke past it. A staged version that goes without switching lifts
//! the fence ([`Agent::drop_staged`]; a refused switch too): what was
//! held then fires late within `max_lateness` or is reported skipped.
//!
//! A staged copy lives in memory only: a restart drops it (the held
//! version runs on, as it would have until the instant) and the
//! controller, which learns of the restart from the Hello, stages it
//! again. No staged version ever runs early: it runs only through
//! [`Agent::accept_as_of`] at its instant, with every check of an
//! acceptance made again there.

use baton_control::staging::{self, StageVerdict, Staged, SwitchFence, SwitchVerdict};
use baton_proto::RefTime;
use baton_proto::pack::Pack;
use baton_proto::wire;
use baton_sched::PackKey;

use super::nack;
use crate::link::{StageAt, ToLink};
use crate::runtime::agent::Agent;
use crate::runtime::error::{AcceptError, RuntimeError};
use crate::runtime::link_state::{StagedBody, Uplink};
use baton_control::admission::Verdict;

impl Agent {
    /// A staged push, parsed and matched to its reference by the caller:
    /// checked as an acceptance would check it (version, clock, liveness,
    /// programs, lines), nothing committed; the answer for the link.
    pub(in crate::runtime) fn on_stage(
        &mut self,
        up: &mut Uplink,
        r: &wire::PackRef,
        yaml: String,
        pack: Pack,
        stage: StageAt,
    ) -> ToLink {
        use wire::NackReason as R;
        let label = format!("{}/{} v{}", r.tenant, r.pack, r.version);
        let key = PackKey::of(&pack);
        let replaces_running = match staging::stage_verdict(self.core.held(&key), pack.version) {
            StageVerdict::Running => {
                // Switched already (a re-sent push): nothing to stage.
                self.drop_staged(up, &key);
                return ToLink::Ack(wire::PackAck {
                    pack: Some(r.clone()),
                    unchanged: true,
                    staged: false,
                    activate_at_ns: 0,
                });
            }
            StageVerdict::Older { held } => {
                let message = format!(
                    "pack {label}: version {} is older than version {held} held by this agent (versions only go up)",
                    pack.version
                );
                return nack(r, R::Refused, message, Vec::new());
            }
            StageVerdict::Stage { replaces_running } => replaces_running,
        };
        let uncertainty = self.clock.uncertainty_ns();
        if pack.needs_absolute_time() && uncertainty > self.clock_limit_ns() {
            let message = format!(
                "pack {label}: not staged: clock uncertainty {uncertainty} ns is above this agent's limit"
            );
            return nack(r, R::Clock, message, Vec::new());
        }
        if let Err(errs) = pack.check_live(self.clock.now()) {
            let message = format!("pack {label}: {errs}");
            return nack(r, R::Invalid, message, Vec::new());
        }
        if let Err(e) = self.admit_checks(&pack, &yaml) {
            let reason = if e.is_transient() {
                R::ResourceExhausted
            } else {
                R::Refused
            };
            tracing::warn!(pack = %label, "staged pack refused: {e}");
            return nack(r, reason, format!("pack {label}: {e}"), Vec::new());
        }
        let at = (stage.at_ns > 0).then(|| RefTime::from_nanos(stage.at_ns));
        tracing::info!(
            pack = %label,
            at = ?at,
            "staged: the held version runs until the switch"
        );
        let staged = Staged {
            version: pack.version,
            at,
            max_uncertainty_ns: stage.max_uncertainty_ns,
            replaces_running,
            body: StagedBody {
                yaml,
                pack,
                wire_ref: r.clone(),
            },
        };
        self.keep_staged(up, key, staged);
        ToLink::Ack(wire::PackAck {
            pack: Some(r.clone()),
            unchanged: false,
            staged: true,
            activate_at_ns: stage.at_ns.max(0),
        })
    }

    /// The earliest instant a staged version switches at.
    pub(in crate::runtime) fn next_switch(up: &Uplink) -> Option<RefTime> {
        up.staged.next_switch()
    }

    /// Switches every staged version whose instant came: accepted as of
    /// that instant however late the loop gets to it (a stalled or
    /// stopped process, a push that came late), so a late member joins
    /// the stage's grid rather than starting one of its own; the
    /// occurrences it missed are not replayed (no burst) but reported,
    /// `Scheduler::accept_at`. The `Held` that
    /// follows telling the controller. One that cannot switch (its clock
    /// too uncertain then, a check that fails now) stays on the held
    /// version and is nacked. A journal fault ends the loop, as anywhere.
    pub(in crate::runtime) fn switch_due(&mut self, up: &mut Uplink) -> Result<(), RuntimeError> {
        let now = self.clock.now();
        // Taken out without lifting the fence: the switch replaces the
        // version the fence is on (what it held that was due by now is
        // reported not run, `Scheduler::accept_at`); lifted after a switch
        // that did not happen, what it held goes out late.
        while let Some((key, s)) = up.staged.take_next_due(now) {
            let switched = self.switch_one(up, &key, s, now);
            self.set_fence(staging::lift(&key));
            switched?;
        }
        Ok(())
    }

    /// Switch one staged version whose instant came (see
    /// [`Agent::switch_due`]); an error is a journal fault.
    fn switch_one(
        &mut self,
        up: &mut Uplink,
        key: &PackKey,
        s: Staged<StagedBody>,
        now: RefTime,
    ) -> Result<(), RuntimeError> {
        let label = format!("{key} v{}", s.version);
        let active = self.running(key);
        let uncertainty = self.clock.uncertainty_ns();
        let at = match staging::switch_verdict(&s, now, active, uncertainty, self.clock_limit_ns())
        {
            SwitchVerdict::Switch { at } => at,
            SwitchVerdict::Stopped => {
                // Stopped since it was staged (cancelled on the box, its
                // lease or the clock lost): it stays stopped, in its safe
                // state, until the controller pushes again.
                let message = format!(
                    "pack {label}: not switched at its instant: the version it replaces was stopped (cancelled, lease or clock lost) since it was staged; push again to bring the pack back"
                );
                tracing::warn!(pack = %label, "{message}");
                let reply = nack(
                    &s.body.wire_ref,
                    wire::NackReason::Refused,
                    message,
                    Vec::new(),
                );
                self.answer_later(up, reply);
                return Ok(());
            }
            SwitchVerdict::ClockUncertain {
                uncertainty_ns,
                bound_ns,
            } => {
                let message = format!(
                    "pack {label}: not switched at its instant: clock uncertainty {uncertainty_ns} ns is above the rollout's bound of {bound_ns} ns; the held version runs on"
                );
                tracing::warn!(pack = %label, "{message}");
                let reply = nack(
                    &s.body.wire_ref,
                    wire::NackReason::Clock,
                    message,
                    Vec::new(),
                );
                self.answer_later(up, reply);
                return Ok(());
            }
        };
        let late = now.since(at);
        let StagedBody {
            yaml,
            pack,
            wire_ref,
        } = s.body;
        match self.accept_as_of(yaml, pack, Some(at)) {
            Ok(Verdict::Unchanged) => {}
            Ok(_) => {
                self.plane.held.mark_changed();
                tracing::info!(
                    pack = %label,
                    late_ns = late.as_nanos() as u64,
                    "switched at the rollout's instant"
                );
            }
            Err(e) => {
                let reason = switch_nack_reason(&e);
                tracing::warn!(pack = %label, "staged version not switched: {e}");
                let fault = e.is_fault();
                let message = format!("pack {label}: not switched: {e}");
                self.answer_later(up, nack(&wire_ref, reason, message, Vec::new()));
                if fault {
                    return Err(RuntimeError::from(e));
                }
            }
        }
        Ok(())
    }

    /// Keep a version aside (replacing any staged before it), and fence
    /// the held version at its instant ([`Scheduler::switch_fence`]):
    /// nothing of it due after the instant is released, so an old-program
    /// stroke cannot follow the switch however late the loop gets to it.
    ///
    /// [`Scheduler::switch_fence`]: baton_sched::Scheduler::switch_fence
    pub(in crate::runtime) fn keep_staged(
        &mut self,
        up: &mut Uplink,
        key: PackKey,
        s: Staged<StagedBody>,
    ) {
        let fence = up.staged.keep(key, s);
        self.set_fence(fence);
    }

    /// Drop a staged version that goes without switching (superseded by a
    /// push, a new staging or a cancel): the fence on the held version
    /// lifts, and what it held goes out late (or is reported skipped) on
    /// the next pass, as anything that comes due late.
    pub(in crate::runtime) fn drop_staged(&mut self, up: &mut Uplink, key: &PackKey) {
        if let Some(fence) = up.staged.drop(key) {
            self.set_fence(fence);
        }
    }

    /// The core's switch fence where the staging rules put it.
    fn set_fence(&mut self, f: SwitchFence) {
        self.core.switch_fence(&f.key, f.at);
    }

    /// An answer that comes after the push it answers (a switch), on the
    /// current session; none: the Hello of the next one says where things
    /// stand.
    fn answer_later(&mut self, up: &mut Uplink, msg: ToLink) {
        if let Some(session) = up.session.current() {
            up.queue(session, msg);
        }
    }
}

/// The nack of a switch the acceptance refused.
fn switch_nack_reason(e: &AcceptError) -> wire::NackReason {
    match e {
        AcceptError::Clock { .. } => wire::NackReason::Clock,
        AcceptError::Journal(_) | AcceptError::Fault(_) => wire::NackReason::Unavailable,
        AcceptError::Refused(a) if a.is_transient() => wire::NackReason::ResourceExhausted,
        _ => wire::NackReason::Refused,
    }
}
