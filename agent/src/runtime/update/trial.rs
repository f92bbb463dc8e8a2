//! A new agent version on trial (`baton-agent launch`, `baton_update::boot`):
//! it confirms itself once a controller welcomes it (its journal restored,
//! its loop running, its link up: what the next update needs), and stops
//! when that has not happened within `update.confirm-within`, so the launcher
//! runs the version before it again. A trial that crashes or hangs comes
//! back to the launcher unconfirmed too (systemd's restart, its watchdog).

use baton_clock::MonoTime;

use super::super::agent::Agent;
use super::super::error::RuntimeError;

impl Agent {
    /// A welcomed link confirms a trial: the update worker settles the
    /// launcher on this version (the state's file is the worker's alone;
    /// no file IO on this thread). A confirmation that fails is said and
    /// asked again at the next welcome (the trial's deadline still stands).
    pub(in crate::runtime) fn confirm_trial(&mut self) {
        let Some(version) = self
            .upkeep
            .trial
            .as_ref()
            .filter(|t| !t.asked)
            .map(|t| t.version.clone())
        else {
            return;
        };
        if self.ask_worker(super::worker::Job::Confirm { version })
            && let Some(t) = self.upkeep.trial.as_mut()
        {
            t.asked = true;
        }
    }

    /// The worker's answer to a confirmation.
    pub(in crate::runtime) fn trial_confirmed(
        &mut self,
        version: &str,
        result: Result<(), String>,
    ) {
        match result {
            Ok(()) => {
                tracing::info!(
                    version,
                    "agent update: welcomed by a controller; this version is settled"
                );
                self.upkeep.trial = None;
            }
            Err(e) => {
                tracing::error!("agent update: confirming version {version}: {e}");
                if let Some(t) = self.upkeep.trial.as_mut() {
                    t.asked = false;
                }
            }
        }
    }

    /// A trial past its deadline ends the loop (through the one way out).
    pub(in crate::runtime) fn check_trial_deadline(
        &self,
        now: MonoTime,
    ) -> Result<(), RuntimeError> {
        match &self.upkeep.trial {
            Some(t) if now >= t.deadline => Err(RuntimeError::TrialUnconfirmed {
                version: t.version.clone(),
                within_s: t.within.as_secs(),
            }),
            _ => Ok(()),
        }
    }
}
