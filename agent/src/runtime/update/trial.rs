//! A new agent version on trial (`baton-agent launch`, `baton_update::boot`):
//! it confirms itself once a controller welcomes it (its journal restored,
//! its loop running, its link up: what the next update needs), and stops
//! when that has not happened within `update.confirm-within`, so the launcher
//! runs the version before it again. A trial that crashes or hangs comes
//! back to the launcher unconfirmed too (systemd's restart, its watchdog).

use std::time::Duration;

use baton_clock::MonoTime;
use baton_update::{BootState, RolledBack, Versions, boot};

use super::super::agent::Agent;
use super::super::error::RuntimeError;

/// A trial this agent is, until confirmed.
#[derive(Debug)]
pub(in crate::runtime) struct Trial {
    versions: Versions,
    version: String,
    deadline: MonoTime,
    within: Duration,
}

impl Trial {
    /// The trial this start is, if the launcher's state says so (this
    /// build's version, started by the launcher and not yet confirmed),
    /// with `within` to be welcomed; and the last rollback the launcher
    /// made, for the Hello to say.
    pub(in crate::runtime) fn at_start(
        data_dir: &std::path::Path,
        now: MonoTime,
        within: Duration,
    ) -> (Option<Trial>, Option<RolledBack>) {
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
        let rolled_back = state.rolled_back.clone();
        let trial = state
            .trial
            .as_ref()
            .filter(|t| t.version == crate::version::version() && t.started);
        let Some(trial) = trial else {
            return (None, rolled_back);
        };
        tracing::info!(
            version = %trial.version,
            within_s = within.as_secs(),
            "agent update: this version is on trial until a controller welcomes it"
        );
        let trial = Trial {
            versions,
            version: trial.version.clone(),
            deadline: now + within,
            within,
        };
        (Some(trial), rolled_back)
    }
}

impl Agent {
    /// A welcomed link confirms a trial: the launcher settles on this
    /// version. A state that cannot be written is said and tried again at
    /// the next welcome (the trial's deadline still stands).
    pub(in crate::runtime) fn confirm_trial(&mut self) {
        let Some(t) = &self.upkeep.trial else {
            return;
        };
        let written =
            t.versions
                .read_state()
                .and_then(|s| match boot::confirm(s.as_ref(), &t.version) {
                    Some(next) => t.versions.write_state(&next).map(|()| true),
                    None => Ok(false),
                });
        match written {
            Ok(true) => {
                tracing::info!(version = %t.version, "agent update: welcomed by a controller; this version is settled");
                let keep = boot::kept(t.versions.read_state().ok().flatten().as_ref());
                if let Err(e) = t.versions.prune(&keep) {
                    tracing::warn!("agent update: removing versions no longer kept: {e}");
                }
                self.upkeep.trial = None;
            }
            // Not the trial any more (the state was changed by hand).
            Ok(false) => self.upkeep.trial = None,
            Err(e) => tracing::error!("agent update: confirming version {}: {e}", t.version),
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
