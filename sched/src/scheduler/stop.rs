//! Stopping packs from outside the schedule: a cancel, a lease or the
//! clock lost, the agent shutting down. Each sends the packs it stops to
//! their safe state (`outcome::fail_safe`).

use baton_proto::RefTime;

use super::{Scheduler, Status};
use crate::id::PackKey;
use crate::output::{Output, SafeReason};
use crate::outputs::{Outputs, WithOutputs};

impl Scheduler {
    /// Remove a pack: its safe state runs and its pending firings are
    /// reported as skipped.
    pub fn cancel(&mut self, key: &PackKey, now: RefTime) -> WithOutputs<'_, bool> {
        self.decide(|s, out| {
            let Some(&slot) = s.by_key.get(key) else {
                return false;
            };
            s.fail_safe(slot, SafeReason::Cancel, None, now, out);
            true
        })
    }

    /// The controller lease is gone: every active pack goes to its safe state.
    pub fn lease_lost(&mut self, now: RefTime) -> Outputs<'_> {
        self.outputs(|s, out| s.all_safe(SafeReason::LeaseLost, now, out))
    }

    /// The controller lease of one pack ran out (its `lease` passed without
    /// contact with the controller): that pack alone goes to its safe state
    /// (reason [`SafeReason::LeaseLost`]), its pending firings reported as
    /// skipped; every other pack keeps running. The pack stays held,
    /// stopped, until it is accepted again (as after a cancel, even the same
    /// version reinstalls it here; the agent's admission only passes a
    /// higher version, so on an agent that is what brings it back). Returns
    /// whether the pack
    /// was active (false: not held, or already in its safe state — then
    /// nothing is output, so calling it again is harmless).
    pub fn lease_lost_pack(&mut self, key: &PackKey, now: RefTime) -> WithOutputs<'_, bool> {
        self.decide(|s, out| s.stop_pack(key, SafeReason::LeaseLost, now, out))
    }

    /// The agent's clock lost sync past its limit and this pack asked for
    /// its safe state then (`on_clock_loss: safe_state`): as
    /// [`Scheduler::lease_lost_pack`], with reason [`SafeReason::ClockLost`].
    pub fn clock_lost_pack(&mut self, key: &PackKey, now: RefTime) -> WithOutputs<'_, bool> {
        self.decide(|s, out| s.stop_pack(key, SafeReason::ClockLost, now, out))
    }

    fn stop_pack(
        &mut self,
        key: &PackKey,
        reason: SafeReason,
        now: RefTime,
        out: &mut Vec<Output>,
    ) -> bool {
        let Some(&slot) = self.by_key.get(key) else {
            return false;
        };
        let active = self.packs[slot]
            .as_ref()
            .is_some_and(|p| p.status == Status::Active);
        if active {
            self.fail_safe(slot, reason, None, now, out);
        }
        active
    }

    /// The agent is stopping: every active pack goes to its safe state.
    pub fn shutdown(&mut self, now: RefTime) -> Outputs<'_> {
        self.outputs(|s, out| s.all_safe(SafeReason::Shutdown, now, out))
    }

    fn all_safe(&mut self, reason: SafeReason, now: RefTime, out: &mut Vec<Output>) {
        for slot in 0..self.packs.len() {
            if self.packs[slot]
                .as_ref()
                .is_some_and(|p| p.status == Status::Active)
            {
                self.fail_safe(slot, reason, None, now, out);
            }
        }
    }
}
