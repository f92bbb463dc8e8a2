//! Agent releases and agent updates as the controller keeps them (issue
//! 39): a release is relayed, never judged — the boxes check its
//! signature against their own trust lists — so the controller keeps the
//! signed manifest exactly as signed, the binary in pieces any replica
//! serves, what each box last said of an update, and the update rollouts
//! that decide which box is offered which release.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::rollout_rows::{Member, RolloutRow};
use crate::time::{RefTime, ns};

/// The size of a stored piece of a release's binary: the box asks for at
/// most this much at once (its fetch window is four of them), so a piece
/// is read from the store whole and answered whole.
pub const RELEASE_PIECE: u64 = 64 * 1024;

/// A stored release: its signed manifest as signed, and what the
/// controller checked of its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReleaseRow {
    /// Its version (a safe directory name: the boxes install by it).
    pub version: String,
    /// The architecture it is built for.
    pub arch: String,
    /// The manifest's exact text (what the signature covers).
    pub manifest: String,
    /// The release key's id.
    pub key: String,
    /// The signature (base64).
    pub signature: String,
    /// The binary's length.
    pub size: u64,
    /// Its SHA-256 (hex).
    pub sha256: String,
    /// When it was stored.
    pub uploaded: RefTime,
    /// Who stored it.
    pub by: String,
}

impl ReleaseRow {
    /// How many pieces of [`RELEASE_PIECE`] its binary is stored in.
    pub fn pieces(&self) -> u64 {
        self.size.div_ceil(RELEASE_PIECE)
    }
}

/// Where an update stands on a box, as it last said.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UpdatePhase {
    /// Being downloaded.
    Downloading,
    /// Installed beside the running version; it restarts at a quiet moment.
    Installed,
    /// Restarting into it.
    Restarting,
    /// Not taken (signature, architecture, bytes, no trust list): final.
    Refused,
    /// Ran on trial and was rolled back.
    RolledBack,
    /// It is what runs.
    Running,
}

impl UpdatePhase {
    /// Its word.
    pub fn as_str(self) -> &'static str {
        match self {
            UpdatePhase::Downloading => "downloading",
            UpdatePhase::Installed => "installed",
            UpdatePhase::Restarting => "restarting",
            UpdatePhase::Refused => "refused",
            UpdatePhase::RolledBack => "rolled_back",
            UpdatePhase::Running => "running",
        }
    }

    /// The box gave the version up for good (it ran and did not come up
    /// healthy): it never takes it again, and a rollout's member that says
    /// so fails its stage. A refusal is not: the box may take the version
    /// when offered again (it was itself on trial, another version waited
    /// to run, a download stalled, its trust list was mended).
    pub fn gives_up(self) -> bool {
        self == UpdatePhase::RolledBack
    }
}

/// What a box last said of an update.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpdateRow {
    /// The version it speaks of.
    pub version: String,
    /// Where it stands.
    pub phase: UpdatePhase,
    /// Bytes held (downloading).
    #[serde(default)]
    pub held_bytes: u64,
    /// The release's size.
    #[serde(default)]
    pub size: u64,
    /// Why (refused, rolled back), or what it waits for (installed).
    #[serde(default)]
    pub reason: String,
    /// When the controller heard it.
    #[serde(rename = "at_ns", with = "ns::instant")]
    pub at: RefTime,
}

/// An update rollout: a release rolled out over a fixed set of agents in
/// stages, moved by the same pure machine as a pack's rollout
/// ([`crate::rollout`]): `machine` is its state in that machine's terms
/// (its `tenant` empty, its `pack` [`AgentUpdateRow::PACK`], its
/// `version` this update's id).
#[derive(Clone, Debug, PartialEq)]
pub struct AgentUpdateRow {
    /// Store-assigned, increasing (0 before it is stored).
    pub id: u64,
    /// The release's version.
    pub version: String,
    /// The plan as the operator wrote it (YAML).
    pub plan: String,
    /// The agents it may admit, fixed when it starts.
    pub targets: Vec<String>,
    /// Who started it.
    pub by: String,
    /// Its state in the rollout machine's terms; `machine.rev` is the
    /// compare-and-set counter, `machine.members` the cohort.
    pub machine: RolloutRow,
}

impl AgentUpdateRow {
    /// The machine's pack name for updates (no pack has it: pack ids
    /// cannot start with `@`).
    pub const PACK: &'static str = "@agent-update";

    /// A new update of release `version` over `targets`, waiting to
    /// start its first stage.
    pub fn new(
        version: impl Into<String>,
        plan: impl Into<String>,
        targets: Vec<String>,
        by: impl Into<String>,
        at: RefTime,
    ) -> AgentUpdateRow {
        let key = crate::PackKey::new("", Self::PACK);
        AgentUpdateRow {
            id: 0,
            version: version.into(),
            plan: plan.into(),
            targets,
            by: by.into(),
            machine: RolloutRow::new(&key, 0, crate::Base::default(), at),
        }
    }

    /// The cohort.
    pub fn members(&self) -> &BTreeMap<String, Member> {
        &self.machine.members
    }
}

/// What a box is to be offered: the release a rollout admitted it to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReleaseTarget {
    /// The agent.
    pub agent_id: String,
    /// The release's version.
    pub version: String,
    /// The update that admitted it.
    pub update: u64,
}
