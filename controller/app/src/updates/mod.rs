//! Agent updates (issue 39): releases uploaded and listed, and update
//! rollouts started, shown, paused, resumed and aborted. A release is
//! relayed, never judged: the controller checks the bytes against the
//! signed manifest (a mistyped upload is refused here rather than by
//! every box), and the boxes check the signature against their own trust
//! lists. An update rollout is moved by the same pure machine as a pack's
//! ([`baton_model::rollout`], see [`drive`]); every operator action and
//! every step is audited.

mod drive;

use std::collections::BTreeSet;

use baton_model::rollout::{self, AgentView};
use baton_model::{AgentRow, AgentUpdateRow, CohortFigures, RELEASE_PIECE, ReleaseRow};
use baton_proto::pack::UpdatePlan;
use baton_store::StoreOps;
use baton_trust::release::SignedRelease;

use crate::app::{App, AppError, AppResult, now};
use crate::caller::Caller;
use crate::rollouts::RolloutCommand;

pub use drive::{run, run_step as step_agent_updates};

/// The largest release the controller stores (an agent binary is tens of
/// MB; this leaves room and bounds what one upload holds in memory).
pub const MAX_RELEASE_BYTES: u64 = 256 * 1024 * 1024;

/// The longest signed manifest a box takes (its `MANIFEST_MAX`): a longer
/// one is refused here rather than by every box.
pub const MAX_MANIFEST_BYTES: usize = 4096;

/// One target of an update, as its status shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct UpdateAgent {
    /// The agent as stored (its version, architecture, last word on the
    /// update).
    pub agent: AgentRow,
    /// As the machine saw it.
    pub view: AgentView,
    /// The stage that admitted it (`None`: not yet).
    pub stage: Option<u32>,
    /// Left out of verdicts (`skip_offline`).
    pub skipped: bool,
}

/// An update as `agent-update status` shows it.
#[derive(Clone, Debug)]
pub struct UpdateStatus {
    /// As stored.
    pub row: AgentUpdateRow,
    /// Stages of its plan.
    pub stages: usize,
    /// Every target, cohort first.
    pub agents: Vec<UpdateAgent>,
    /// The current stage's figures so far.
    pub cohort: CohortFigures,
    /// The baseline's (targets not yet updated), same window.
    pub baseline: Option<CohortFigures>,
}

/// The plan of an update, checked: a pack's `rollout:` section and the
/// targets. `activate: together` is for packs (an update restarts each
/// box at its own quiet moment).
pub(crate) fn plan_of(text: &str) -> AppResult<UpdatePlan> {
    let plan = baton_proto::pack::parse_update_plan(text)
        .map_err(|e| AppError::Invalid(e.render("plan").trim_end().to_string()))?;
    if plan.rollout.activate == baton_proto::pack::rollout::Activate::Together {
        return Err(AppError::Invalid(
            "plan: rollout.activate: together is for packs; an update restarts each box at its own quiet moment"
                .into(),
        ));
    }
    Ok(plan)
}

impl App {
    /// Leave to read an upload's bytes: the caller may store releases,
    /// and no other upload is being read (each holds its binary in
    /// memory, up to [`MAX_RELEASE_BYTES`]).
    pub fn upload_permit(&self, caller: &Caller) -> AppResult<tokio::sync::SemaphorePermit<'_>> {
        caller.may_manage_agents()?;
        self.uploads.try_acquire().map_err(|_| {
            AppError::Limit("another release upload is in progress; try again after it".into())
        })
    }

    /// Store a release (`release upload`): admins only; the binary must
    /// match the signed manifest's size and digest. Whether it was new
    /// (the same release again is no change). Audited.
    pub async fn upload_release(
        &self,
        caller: &Caller,
        signed: &SignedRelease,
        binary: Vec<u8>,
    ) -> AppResult<(ReleaseRow, bool)> {
        let target = signed.unverified_manifest().map_or_else(
            |_| "release".to_string(),
            |m| format!("release {} {}", m.version, m.arch),
        );
        let result = self.upload_inner(caller, signed, binary).await;
        let tenant = caller.audit_tenant("");
        let (row, new) = self
            .audited(caller, &tenant, "release.upload", &target, result)
            .await?;
        tracing::info!(version = %row.version, arch = %row.arch, size = row.size, new, "release stored");
        Ok((row, new))
    }

    async fn upload_inner(
        &self,
        caller: &Caller,
        signed: &SignedRelease,
        binary: Vec<u8>,
    ) -> AppResult<(ReleaseRow, bool)> {
        caller.may_manage_agents()?;
        if signed.body.len() > MAX_MANIFEST_BYTES {
            return Err(AppError::Invalid(format!(
                "a release manifest of {} bytes; a box takes at most {MAX_MANIFEST_BYTES}",
                signed.body.len()
            )));
        }
        let m = signed.unverified_manifest().map_err(AppError::Invalid)?;
        if m.arch.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(AppError::Invalid(format!(
                "architecture {:?}: lowercase, as the boxes name theirs (x86_64, aarch64, arm)",
                m.arch
            )));
        }
        if m.size > MAX_RELEASE_BYTES {
            return Err(AppError::Limit(format!(
                "release {} is {} bytes; the controller stores at most {MAX_RELEASE_BYTES}",
                m.version, m.size
            )));
        }
        if binary.len() as u64 != m.size {
            return Err(AppError::Invalid(format!(
                "release {} for {}: the manifest says {} bytes, {} were uploaded",
                m.version,
                m.arch,
                m.size,
                binary.len()
            )));
        }
        let digest = baton_trust::release::ReleaseManifest::of(&m.version, &m.arch, &binary)
            .map_err(AppError::Invalid)?
            .sha256;
        if digest != m.sha256 {
            return Err(AppError::Invalid(format!(
                "release {} for {}: the uploaded bytes' SHA-256 is {digest}, the manifest says {}",
                m.version, m.arch, m.sha256
            )));
        }
        let row = ReleaseRow {
            version: m.version,
            arch: m.arch,
            manifest: signed.body.clone(),
            key: signed.key.to_string(),
            signature: signed.signature.to_base64(),
            size: m.size,
            sha256: m.sha256,
            uploaded: now(),
            by: caller.who.to_string(),
        };
        let pieces = binary
            .chunks(RELEASE_PIECE as usize)
            .map(<[u8]>::to_vec)
            .collect();
        drop(binary);
        let new = self.store.put_release(row.clone(), pieces).await?;
        Ok((row, new))
    }

    /// Every stored release, newest upload first (any operator may read
    /// them: a release names no tenant's data).
    pub async fn releases(&self) -> AppResult<Vec<ReleaseRow>> {
        Ok(self.store.releases().await?)
    }

    /// Start an update of release `version` over the plan's targets
    /// (`agent-update start`): admins only; every open update is
    /// superseded. An operator of one tenant updates only the agents
    /// that serve its tenant alone (a box shared with another tenant is
    /// left out, and said). Agents without a build of the release for
    /// their architecture (or too old to say theirs) are left out, and
    /// said. Audited.
    pub async fn start_agent_update(
        &self,
        caller: &Caller,
        version: &str,
        plan: &str,
    ) -> AppResult<(AgentUpdateRow, Vec<String>)> {
        let result = self.start_inner(caller, version, plan).await;
        let tenant = caller.audit_tenant("");
        let target = format!("agent update to {version}");
        let (row, left_out) = self
            .audited(caller, &tenant, "update.start", &target, result)
            .await?;
        Ok((row, left_out))
    }

    async fn start_inner(
        &self,
        caller: &Caller,
        version: &str,
        text: &str,
    ) -> AppResult<(AgentUpdateRow, Vec<String>)> {
        caller.may_manage_agents()?;
        let plan = plan_of(text)?;
        let archs: BTreeSet<String> = self
            .store
            .releases()
            .await?
            .into_iter()
            .filter(|r| r.version == version)
            .map(|r| r.arch)
            .collect();
        if archs.is_empty() {
            return Err(AppError::NotFound(format!(
                "no release {version} is stored: upload it first (release upload)"
            )));
        }
        let mut targets = Vec::new();
        let mut left_out = Vec::new();
        for a in self.agents_where(None, |_| true).await? {
            if !caller.sees_agent(&a, self.cfg.binding) {
                continue;
            }
            let wanted = match &plan.targets {
                None => true,
                Some(baton_proto::pack::Targets::Agents(ids)) => ids.contains(&a.id),
                Some(baton_proto::pack::Targets::Labels(want)) => {
                    // A tenant's operator targets by its tenant's labels
                    // (its own overrides), as its packs do.
                    let labels = match caller.tenant() {
                        Some(t) => a.labels_for(t).into_owned(),
                        None => a.labels.clone(),
                    };
                    want.iter()
                        .all(|(k, v)| labels.get(k).is_some_and(|x| x == v))
                }
            };
            if !wanted {
                continue;
            }
            if let Some(own) = caller.tenant()
                && a.tenants.iter().any(|t| t != own)
            {
                left_out.push(format!(
                    "{}: serves other tenants too (an operator without a tenant updates it)",
                    a.id
                ));
            } else if a.arch.is_empty() {
                left_out.push(format!(
                    "{}: its agent ({}) is older than updates",
                    a.id, a.agent_version
                ));
            } else if !archs.contains(&a.arch) {
                left_out.push(format!("{}: no build of {version} for {}", a.id, a.arch));
            } else {
                targets.push(a.id);
            }
        }
        if targets.is_empty() {
            return Err(AppError::Invalid(format!(
                "the plan targets no agent that can take release {version}{}",
                if left_out.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", left_out.join("; "))
                }
            )));
        }
        // An operator of one tenant supersedes only its own tenant's
        // update: another's over shared boxes ends first.
        let open = self.store.agent_updates(true).await?;
        for u in &open {
            if !self.owns_update(caller, u).await? {
                return Err(AppError::Denied(format!(
                    "agent update {} to {} is open over boxes that serve other tenants: it ends first (it completes, or an operator without a tenant aborts it)",
                    u.id, u.version
                )));
            }
        }
        let row = AgentUpdateRow::new(version, text, targets, caller.who.to_string(), now());
        // The updates checked above are the ones superseded: if another
        // started or ended meanwhile (another replica), the store refuses
        // and the operator tries again.
        let expect: Vec<u64> = open.iter().map(|u| u.id).collect();
        let id = self.store.start_agent_update(row, expect).await?;
        for u in &open {
            let audit = baton_model::AuditRow {
                at: now(),
                who: caller.who.to_string(),
                tenant: caller.audit_tenant(""),
                role: String::new(),
                action: "update".into(),
                target: format!("agent update {} to {}", u.id, u.version),
                result: format!("superseded by agent update {id} to {version}"),
            };
            if let Err(e) = self.store.put_audit(audit).await {
                tracing::error!(update = u.id, "superseded update not audited: {e}");
            }
        }
        let row = self
            .store
            .agent_update(Some(id))
            .await?
            .ok_or_else(|| AppError::Unavailable(format!("agent update {id} vanished")))?;
        // Superseded updates' offers are gone: streams read theirs again.
        self.hub.send_all(|| crate::hub::SessionCmd::Release);
        self.announce_release_change(None);
        Ok((row, left_out))
    }

    /// Whether the caller may act on `row` (pause, resume, abort,
    /// supersede): an operator without a tenant on any; an operator of
    /// one tenant on those whose boxes serve its tenant alone.
    async fn owns_update(&self, caller: &Caller, row: &AgentUpdateRow) -> AppResult<bool> {
        let Some(own) = caller.tenant() else {
            return Ok(true);
        };
        for t in &row.targets {
            if let Some(a) = self.store.agent(t).await?
                && (a.tenants.iter().any(|x| x != own) || !caller.sees_agent(&a, self.cfg.binding))
            {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// An update the caller may see (`None`: the newest): an operator of
    /// one tenant sees those whose targets it sees all of.
    async fn visible_update(&self, caller: &Caller, id: Option<u64>) -> AppResult<AgentUpdateRow> {
        let missing = || {
            AppError::NotFound(match id {
                Some(id) => format!("no agent update {id}"),
                None => "no agent update".to_string(),
            })
        };
        let row = self.store.agent_update(id).await?.ok_or_else(missing)?;
        if caller.tenant().is_some() {
            for t in &row.targets {
                let seen = self
                    .store
                    .agent(t)
                    .await?
                    .is_none_or(|a| caller.sees_agent(&a, self.cfg.binding));
                if !seen {
                    return Err(missing());
                }
            }
        }
        Ok(row)
    }

    /// `agent-update status`.
    pub async fn agent_update_status(
        &self,
        caller: &Caller,
        id: Option<u64>,
    ) -> AppResult<UpdateStatus> {
        let row = self.visible_update(caller, id).await?;
        let plan = plan_of(&row.plan)?;
        let (obs, agents) = self.observe_update(&plan.rollout, &row).await?;
        Ok(UpdateStatus {
            stages: plan.rollout.stages.len(),
            row,
            agents,
            cohort: obs.cohort,
            baseline: obs.baseline,
        })
    }

    /// `agent-update list`: the newest updates (those the caller sees).
    pub async fn agent_update_list(&self, caller: &Caller) -> AppResult<Vec<AgentUpdateRow>> {
        let mut out = Vec::new();
        for row in self.store.agent_updates(false).await? {
            if self.visible_update(caller, Some(row.id)).await.is_ok() {
                out.push(row);
            }
        }
        Ok(out)
    }

    /// `agent-update pause|resume|abort`: admins only, audited (refused
    /// ones included).
    pub async fn agent_update_command(
        &self,
        caller: &Caller,
        id: Option<u64>,
        command: RolloutCommand,
        why: &str,
    ) -> AppResult<AgentUpdateRow> {
        let result = self.update_command_inner(caller, id, command, why).await;
        let tenant = caller.audit_tenant("");
        let target = id.map_or_else(
            || "the newest agent update".into(),
            |i| format!("agent update {i}"),
        );
        let action = match command {
            RolloutCommand::Pause => "update.pause",
            RolloutCommand::Resume => "update.resume",
            RolloutCommand::Abort => "update.abort",
        };
        self.audited(caller, &tenant, action, &target, result).await
    }

    async fn update_command_inner(
        &self,
        caller: &Caller,
        id: Option<u64>,
        command: RolloutCommand,
        why: &str,
    ) -> AppResult<AgentUpdateRow> {
        caller.may_manage_agents()?;
        for _ in 0..16 {
            let row = self.visible_update(caller, id).await?;
            if !self.owns_update(caller, &row).await? {
                return Err(AppError::Denied(format!(
                    "agent update {} is over boxes that serve other tenants too: an operator without a tenant acts on it",
                    row.id
                )));
            }
            let plan = plan_of(&row.plan)?;
            let who = caller.who.to_string();
            let now = now();
            let reason = |what: &str| {
                if why.is_empty() {
                    format!("{what} by {who}")
                } else {
                    format!("{what} by {who}: {why}")
                }
            };
            let step = match command {
                RolloutCommand::Pause => rollout::pause(&row.machine, &reason("paused"), now),
                RolloutCommand::Resume => rollout::resume(&row.machine, &who, now),
                RolloutCommand::Abort => {
                    rollout::abort(&plan.rollout, &row.machine, &reason("aborted"), now)
                }
            }
            .map_err(|e| {
                AppError::Conflict(e.replace(
                    &format!("rollout of v{}", row.id),
                    &format!("agent update {}", row.id),
                ))
            })?;
            if self.apply_update(&row, step, &who).await? {
                return self
                    .store
                    .agent_update(Some(row.id))
                    .await?
                    .ok_or_else(|| AppError::NotFound(format!("no agent update {}", row.id)));
            }
        }
        Err(AppError::Unavailable(
            "the update kept changing under this command; try again".into(),
        ))
    }
}

#[cfg(test)]
mod tests;
