//! What the control thread keeps of updates: the release being
//! downloaded, the one installed, the versions given up, and the trial
//! this start is. Plain values (the plane and the upkeep hold them); what
//! acts on them is the `update` module's `impl Agent`.

use std::time::Duration;

use baton_clock::MonoTime;
use baton_update::{BootState, Fetch, Versions};

use super::worker::Worker;

/// The box's side of updates.
#[derive(Debug, Default)]
pub(in crate::runtime) struct Update {
    /// Started at the first offer.
    pub(super) worker: Option<Worker>,
    /// The release being downloaded.
    pub(super) offer: Option<Offer>,
    /// Installed and on trial: the loop ends at the next quiet moment.
    pub(super) installed: Option<String>,
    /// The quiet moment was found: the loop's way out runs now.
    pub(super) restarting: bool,
    /// The installed version's withdrawal is being written (the worker
    /// undoes its trial): no restart into it meanwhile.
    pub(super) withdrawing: bool,
    /// Versions given up on this box (the launcher's state at start):
    /// never taken again.
    pub(in crate::runtime) given_up: Vec<String>,
}

/// A release being downloaded.
#[derive(Debug)]
pub(super) struct Offer {
    pub(super) version: String,
    pub(super) size: u64,
    /// The stream it came on: requests and states go there.
    pub(super) session: u64,
    /// Paced requests, once the worker said what it holds.
    pub(super) fetch: Option<Fetch>,
    /// When progress was last said.
    pub(super) said_at: Option<MonoTime>,
}

/// A trial this agent is, until confirmed.
#[derive(Debug)]
pub(in crate::runtime) struct Trial {
    pub(super) version: String,
    pub(super) deadline: MonoTime,
    pub(super) within: Duration,
    /// The worker was asked to confirm it.
    pub(super) asked: bool,
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
