//! A new agent version on trial (`baton-agent launch`, `baton_update::boot`):
//! it confirms itself once a controller welcomes it (its journal restored,
//! its loop running, its link up: what the next update needs), and stops
//! when that has not happened within `update.confirm-within`, so the launcher
//! runs the version before it again. A trial that crashes or hangs comes
//! back to the launcher unconfirmed too (systemd's restart, its watchdog).

use std::time::Duration;

use baton_clock::MonoTime;
use baton_update::{BootState, Versions};

use super::super::agent::Agent;
use super::super::error::RuntimeError;

/// A trial this agent is, until confirmed.
#[derive(Debug)]
pub(in crate::runtime) struct Trial {
    version: String,
    deadline: MonoTime,
    within: Duration,
    /// The worker was asked to confirm it.
    asked: bool,
}

impl Trial {
    /// The trial this start is, if the launcher's state says so (this
    /// build's version, started by the launcher and not yet confirmed),
    /// with `within` to be welcomed; and the launcher's state, for the
    /// last rollback the Hello says and the versions given up.
    pub(in crate::runtime) fn at_start(
        data_dir: &std::path::Path,
        now: MonoTime,
        within: Duration,
    ) -> (Option<Trial>, Option<BootState>) {
        let versions = Versions::of_data_dir(data_dir);
        let state: Option<BootState> = match versions.read_state() {
            Ok(s) => s,
            Err(e) => {
                tracing::error!("agent update: {e}");
                return (None, None);
            }
        };
        let Some(state) = state else {
            return (None, None);
        };
        let boot = Some(state.clone());
        let trial = state
            .trial
            .as_ref()
            .filter(|t| t.version == crate::version::version() && t.started);
        let Some(trial) = trial else {
            return (None, boot);
        };
        tracing::info!(
            version = %trial.version,
            within_s = within.as_secs(),
            "agent update: this version is on trial until a controller welcomes it"
        );
        let trial = Trial {
            version: trial.version.clone(),
            deadline: now + within,
            within,
            asked: false,
        };
        (Some(trial), boot)
    }
}

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
