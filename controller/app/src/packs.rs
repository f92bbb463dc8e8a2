//! Push, cancel, and what is stored of packs and their deliveries.
//!
//! A push is validated with the agent's own parser, stored, then planned:
//! the store decides which agents should hold which version (the
//! planner, inside its serialization point) and returns the rows that
//! changed; each agent's stream acts on its own. The answer comes only
//! once the version is stored, so an operator who saw "stored" can rely on
//! it surviving a controller crash.

use std::sync::Arc;

use baton_proto::pack::{Pack, Targets, parse_pack};

use crate::app::{App, AppError, AppResult, now};
use crate::texts::PackText;

use crate::caller::Caller;
use baton_model::{
    Binding, DeliveryRow, Intent, PackKey, PackSummaryRow, PackVersionRow, PutPack, TargetsRow,
};
use baton_store::StoreOps;
use baton_store::{MAX_PAGE, StoreError};

/// What a push did.
#[derive(Clone, Debug, PartialEq)]
pub struct Pushed {
    /// The pack.
    pub key: PackKey,
    /// Its version.
    pub version: u64,
    /// This exact version and content was stored already.
    pub unchanged: bool,
    /// Agents that should hold this version now (more may match later).
    pub agents: Vec<String>,
    /// A rollout gives it to its targets stage by stage.
    pub rollout: bool,
}

/// What a cancel did.
#[derive(Clone, Debug, PartialEq)]
pub struct Cancelled {
    /// The pack.
    pub key: PackKey,
    /// The version withdrawn (the newest stored, or held when the store
    /// did not know the pack).
    pub version: u64,
    /// Agents told to cancel it (now, or when they next connect).
    pub agents: Vec<String>,
}

/// One page of a pack's deliveries.
#[derive(Clone, Debug, PartialEq)]
pub struct DeliveriesPage {
    /// The pack.
    pub key: PackKey,
    /// The version they are about.
    pub version: u64,
    /// By agent.
    pub rows: Vec<DeliveryRow>,
    /// The agent to continue after, when there may be more.
    pub next: Option<String>,
    /// The key whose signature this version's text carries (`push
    /// --sign`): each agent checks it against its trust list; the
    /// controller only reads whose it says it is. `None`: unsigned.
    pub signed_by: Option<String>,
}

/// The targets as stored.
pub fn targets(p: &Pack) -> TargetsRow {
    match &p.targets {
        None => TargetsRow::Nobody,
        Some(Targets::Agents(a)) => TargetsRow::Agents(a.clone()),
        Some(Targets::Labels(l)) => TargetsRow::Labels(l.clone()),
    }
}

impl App {
    /// Validate, store and deliver a pack. `source` names the YAML in
    /// error positions.
    pub async fn push(&self, caller: &Caller, yaml: String, source: &str) -> AppResult<Pushed> {
        caller.may_change()?;
        let mut pack = parse_pack(&yaml)
            .map_err(|e| AppError::Invalid(e.render(source).trim_end().to_string()))?;
        if !caller.sees(&pack.tenant) {
            return Err(AppError::Denied(format!(
                "{}: pack {} is of tenant {}, not the caller's",
                caller.who, pack.id, pack.tenant
            )));
        }
        let now = crate::app::now();
        pack.check_live(now)
            .map_err(|e| AppError::Invalid(e.render(source).trim_end().to_string()))?;
        let targets = targets(&pack);
        self.check_targets(&pack.tenant, &targets).await?;
        let row = PackVersionRow {
            tenant: pack.tenant.clone(),
            pack: pack.id.clone(),
            version: pack.version,
            yaml,
            targets,
            pushed: now,
            rollout: pack.rollout.is_some(),
        };
        let key = row.key();
        // Parsed once, here: the rollout driver and the staged pushes use
        // this spec rather than the text.
        let rollout = self.specs.keep(&key, row.version, pack.rollout.take());
        let text = Arc::new(PackText { row, rollout });
        let row = &text.row;
        let put = self.store.put_pack(row.clone()).await?;
        let changed = self.store.reconcile_pack(&key, now).await?;
        self.delivered(&changed, Some(&text));
        // A new version's holders are rows the reconcile just wrote (each
        // of them changed to it): no read of every delivery of the pack.
        // The same version again changes no row: its holders are read.
        let agents = match put {
            PutPack::Stored => {
                let mut a: Vec<String> = changed
                    .iter()
                    .filter(|r| r.version == row.version && r.intent == Intent::Hold)
                    .map(|r| r.agent_id.clone())
                    .collect();
                a.sort_unstable();
                a
            }
            PutPack::Unchanged => self.holders(&key, Some(row.version), Intent::Hold).await?,
        };
        tracing::info!(
            pack = %key,
            version = row.version,
            agents = agents.len(),
            unchanged = put == PutPack::Unchanged,
            "pushed"
        );
        Ok(Pushed {
            key,
            version: row.version,
            unchanged: put == PutPack::Unchanged,
            agents,
            rollout: row.rollout,
        })
    }

    /// A pack may name only its tenant's agents (when agents belong to
    /// tenants): a push naming an agent known to serve only other tenants
    /// is refused whole, nothing stored. An agent not known yet is
    /// accepted (a box flashed later, or granted later, gets the pack when
    /// it serves the tenant; until then the push targets nobody there).
    async fn check_targets(&self, tenant: &str, targets: &TargetsRow) -> AppResult<()> {
        let (Binding::Tenants, TargetsRow::Agents(ids)) = (self.cfg.binding, targets) else {
            return Ok(());
        };
        let mut foreign = Vec::new();
        for id in ids {
            let elsewhere = self
                .store
                .agent(id)
                .await?
                .is_some_and(|a| !a.serves(tenant, self.cfg.binding));
            if elsewhere {
                foreign.push(id.as_str());
            }
        }
        if foreign.is_empty() {
            return Ok(());
        }
        Err(AppError::Denied(format!(
            "targets: {} {} not an agent of tenant {tenant} (an admin grants agents to tenants: `agents grant AGENT {tenant}`, or the agent's certificate names the tenant); nothing stored",
            foreign.join(", "),
            if foreign.len() == 1 { "is" } else { "are" }
        )))
    }

    /// Agents whose row for `key` has `intent` (about `version` when
    /// given), read page by page.
    async fn holders(
        &self,
        key: &PackKey,
        version: Option<u64>,
        intent: Intent,
    ) -> AppResult<Vec<String>> {
        let rows = self.all_deliveries(key, version).await?;
        Ok(rows
            .into_iter()
            .filter(|r| r.intent == intent)
            .map(|r| r.agent_id)
            .collect())
    }

    /// Withdraw a pack: every agent holding it enters its safe state and
    /// removes it. Works for a pack the store lost, as long as an agent
    /// reports holding it.
    pub async fn cancel(&self, caller: &Caller, tenant: &str, pack: &str) -> AppResult<Cancelled> {
        caller.may_change()?;
        // Another tenant's pack is "not found", like one that does not exist.
        let tenant = caller
            .tenant_of(tenant)
            .ok_or_else(|| AppError::NotFound(format!("no pack {tenant}/{pack}")))?;
        let key = PackKey::new(&tenant, pack);
        let changed = self
            .store
            .cancel_pack(&key, now())
            .await
            .map_err(|e| match e {
                StoreError::NoSuchPack { .. } => AppError::NotFound(format!("no pack {key}")),
                e => e.into(),
            })?;
        self.delivered(&changed, None);
        let rows = self.all_deliveries(&key, None).await?;
        let version = rows
            .iter()
            .filter(|r| r.intent == Intent::Withdraw)
            .map(|r| r.version)
            .max()
            .unwrap_or_default();
        let mut agents: Vec<String> = rows
            .into_iter()
            .filter(|r| r.held.is_some() || changed.iter().any(|c| c.agent_id == r.agent_id))
            .map(|r| r.agent_id)
            .collect();
        agents.sort();
        agents.dedup();
        let version = match self.store.pack_version(&key, None).await? {
            Some(v) => v.version,
            None => version,
        };
        tracing::info!(pack = %key, agents = agents.len(), "cancelled");
        Ok(Cancelled {
            key,
            version,
            agents,
        })
    }

    /// Withdraw a pack from chosen agents only: each holder among them
    /// enters its safe state and removes it, the pack's other agents keep
    /// it, and no version up to the latest goes to the chosen ones again
    /// (a newer push does). Each must have a delivery of the pack: an
    /// agent it was never for is "not found", like another tenant's.
    pub async fn cancel_on(
        &self,
        caller: &Caller,
        tenant: &str,
        pack: &str,
        agents: &[String],
    ) -> AppResult<Cancelled> {
        caller.may_change()?;
        let tenant = caller
            .tenant_of(tenant)
            .ok_or_else(|| AppError::NotFound(format!("no pack {tenant}/{pack}")))?;
        let key = PackKey::new(&tenant, pack);
        if agents.is_empty() {
            return Err(AppError::Invalid(format!(
                "cancel {key} on which agents? none was named"
            )));
        }
        let rows = self.all_deliveries(&key, None).await?;
        if rows.is_empty() && self.store.pack_version(&key, None).await?.is_none() {
            return Err(AppError::NotFound(format!("no pack {key}")));
        }
        let mut chosen: Vec<String> = agents.to_vec();
        chosen.sort();
        chosen.dedup();
        each_delivered(&key, &rows, &chosen)?;
        let changed = self
            .store
            .withdraw_from(&key, &chosen, now())
            .await
            .map_err(|e| match e {
                StoreError::NoSuchPack { .. } => AppError::NotFound(format!("no pack {key}")),
                e => e.into(),
            })?;
        self.delivered(&changed, None);
        let version = match self.store.pack_version(&key, None).await? {
            Some(v) => v.version,
            None => 0,
        };
        tracing::info!(pack = %key, agents = %chosen.join(","), "cancelled on chosen agents");
        Ok(Cancelled {
            key,
            version,
            agents: chosen,
        })
    }

    /// Every delivery row of the pack (about `version` when given), all
    /// pages.
    pub(super) async fn all_deliveries(
        &self,
        key: &PackKey,
        version: Option<u64>,
    ) -> AppResult<Vec<DeliveryRow>> {
        let mut out = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = self
                .store
                .deliveries_of_pack(key, version, after.as_deref(), MAX_PAGE)
                .await?;
            let full = page.len() as u32 == MAX_PAGE;
            after = page.last().map(|r| r.agent_id.clone());
            out.extend(page);
            if !full {
                return Ok(out);
            }
        }
    }

    /// The packs the caller sees (of `tenant`, or its own), with delivery
    /// counts.
    pub async fn packs(&self, caller: &Caller, tenant: &str) -> AppResult<Vec<PackSummaryRow>> {
        let tenant = match (caller.tenant(), tenant) {
            (None, "") => None,
            _ => Some(caller.tenant_of(tenant).ok_or_else(|| {
                // Another tenant's packs: as if there were none.
                AppError::NotFound(format!("no tenant {tenant}"))
            })?),
        };
        Ok(self.store.packs(tenant.as_deref()).await?)
    }

    /// A pack's stored versions, newest first (at most `limit`), without
    /// their YAML; another tenant's pack: "no pack", as if none existed.
    pub async fn pack_versions(
        &self,
        caller: &Caller,
        tenant: &str,
        pack: &str,
        limit: u32,
    ) -> AppResult<Vec<PackVersionRow>> {
        let tenant = caller
            .tenant_of(tenant)
            .ok_or_else(|| AppError::NotFound(format!("no pack {tenant}/{pack}")))?;
        let key = PackKey::new(&tenant, pack);
        let rows = self
            .store
            .pack_versions(&key, baton_store::page(limit, MAX_PAGE))
            .await?;
        if rows.is_empty() {
            return Err(AppError::NotFound(format!("no pack {key}")));
        }
        Ok(rows)
    }

    /// One page of a pack version's deliveries (`version` 0: the latest).
    pub async fn deliveries(
        &self,
        caller: &Caller,
        tenant: &str,
        pack: &str,
        version: u64,
        after: Option<&str>,
        limit: u32,
    ) -> AppResult<DeliveriesPage> {
        let tenant = caller
            .tenant_of(tenant)
            .ok_or_else(|| AppError::NotFound(format!("no pack {tenant}/{pack}")))?;
        let key = PackKey::new(&tenant, pack);
        let stored = if version == 0 {
            self.store
                .pack_version(&key, None)
                .await?
                .ok_or_else(|| AppError::NotFound(format!("no pack {key}")))?
        } else {
            // A version never stored is not an empty page (issue 36: it
            // answered 200 with no rows).
            self.store
                .pack_version(&key, Some(version))
                .await?
                .ok_or_else(|| AppError::NotFound(format!("no version {version} of pack {key}")))?
        };
        let version = stored.version;
        let signed_by = baton_trust::pack::split(&stored.yaml)
            .ok()
            .and_then(|(_, s)| s)
            .map(|s| s.key.to_string());
        let limit = baton_store::page(limit, MAX_PAGE);
        let rows: Vec<DeliveryRow> = self
            .store
            .deliveries_of_pack(&key, Some(version), after, limit)
            .await?
            .into_iter()
            .map(|r| self.decorate(r))
            .collect();
        let next = (rows.len() as u32 == limit)
            .then(|| rows.last().map(|r| r.agent_id.clone()))
            .flatten();
        Ok(DeliveriesPage {
            key,
            version,
            rows,
            next,
            signed_by,
        })
    }
}

/// Every agent of `chosen` has a row among `rows` (the pack's): an agent
/// the pack was never for is "not found", like another tenant's.
pub(crate) fn each_delivered(
    key: &PackKey,
    rows: &[DeliveryRow],
    chosen: &[String],
) -> AppResult<()> {
    match chosen
        .iter()
        .find(|id| !rows.iter().any(|r| r.agent_id == **id))
    {
        Some(id) => Err(AppError::NotFound(format!(
            "{key} has no delivery to agent {id}"
        ))),
        None => Ok(()),
    }
}
