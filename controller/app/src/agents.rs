//! Agents: the list, labels, grants, forget, clock history.

use std::collections::BTreeMap;

use crate::app::{App, AppError, AppResult, now};
use crate::caller::Caller;
use crate::hub::{Conflict, SessionCmd};
use baton_model::RefTime;
use baton_model::{AgentRow, ClockRow, DeliveryRow, LabelOverrides, SignedDuration};
use baton_store::StoreOps;
use baton_store::{AgentFilter, MAX_PAGE, page};

/// An agent as an operator sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentView {
    /// The record (labels as the caller's tenant's packs target on them).
    pub agent: AgentRow,
    /// A stream is open now (on this controller).
    pub connected: bool,
    /// Start lateness p99 of its feedback on its current stream (zero:
    /// none).
    pub lateness_p99: SignedDuration,
    /// Its deliveries and held packs (the caller's tenants only).
    pub packs: Vec<DeliveryRow>,
    /// A second machine that tried its id, if any.
    pub conflict: Option<Conflict>,
}

/// One page of agents.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentsPage {
    /// By id.
    pub agents: Vec<AgentView>,
    /// The id to continue after, when there may be more.
    pub next: Option<String>,
}

/// A label change: set (`Some`) or hide (`None`) keys, reset others.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelChange {
    /// Keys set or hidden.
    pub set: LabelOverrides,
    /// Keys back to the agent's own.
    pub reset: Vec<String>,
}

/// The labels after a change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Labelled {
    /// Agent.
    pub agent_id: String,
    /// Tenant.
    pub tenant: String,
    /// What the tenant's packs now target on.
    pub labels: BTreeMap<String, String>,
    /// The agent's own.
    pub agent_labels: BTreeMap<String, String>,
}

/// What a forget did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Forgotten {
    /// The whole record went.
    pub record_deleted: bool,
    /// Its stream was closed.
    pub disconnected: bool,
}

impl App {
    /// Every agent (of `tenant`'s, or all) that `keep` keeps, reading all
    /// pages and holding only those kept: what a rollout and an agent
    /// update observe each step.
    pub(crate) async fn agents_where(
        &self,
        tenant: Option<String>,
        mut keep: impl FnMut(&AgentRow) -> bool,
    ) -> AppResult<Vec<AgentRow>> {
        let mut out = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = self
                .store
                .agents(AgentFilter {
                    tenant: tenant.clone(),
                    after_id: after.clone(),
                    limit: MAX_PAGE,
                    ..AgentFilter::default()
                })
                .await?;
            let done = page.len() < MAX_PAGE as usize;
            after = page.last().map(|a| a.id.clone());
            out.extend(page.into_iter().filter(|a| keep(a)));
            if done {
                return Ok(out);
            }
        }
    }

    /// The agent `id` if the caller sees it; otherwise "no agent", word for
    /// word like one that does not exist.
    pub async fn visible_agent(&self, caller: &Caller, id: &str) -> AppResult<AgentRow> {
        let missing = || AppError::NotFound(format!("no agent {id}"));
        let agent = self.store.agent(id).await?.ok_or_else(missing)?;
        if caller.sees_agent(&agent, self.cfg.binding) {
            Ok(agent)
        } else {
            Err(missing())
        }
    }

    /// One page of the agents the caller sees, after `after`.
    pub async fn agents(
        &self,
        caller: &Caller,
        after: Option<String>,
        limit: u32,
    ) -> AppResult<AgentsPage> {
        let limit = page(limit, MAX_PAGE);
        let rows = self
            .store
            .agents(AgentFilter {
                tenant: caller.tenant().map(str::to_string),
                after_id: after,
                limit,
                ..AgentFilter::default()
            })
            .await?;
        let next = (rows.len() as u32 == limit)
            .then(|| rows.last().map(|a| a.id.clone()))
            .flatten();
        let mut agents = Vec::with_capacity(rows.len());
        for a in rows {
            agents.push(self.view(caller, a).await?);
        }
        Ok(AgentsPage { agents, next })
    }

    /// One agent as the caller sees it ("no agent" when it may not).
    pub async fn agent_view(&self, caller: &Caller, id: &str) -> AppResult<AgentView> {
        let a = self.visible_agent(caller, id).await?;
        self.view(caller, a).await
    }

    /// `a` as `caller` may see it: labels as its tenant's packs target
    /// on them, only its tenants' deliveries, connection and lateness as
    /// this controller (or the replica it streams to) knows them.
    pub(super) async fn view(&self, caller: &Caller, mut a: AgentRow) -> AppResult<AgentView> {
        let tenant = caller.tenant().unwrap_or("default");
        let packs = self
            .store
            .deliveries_of_agent(&a.id)
            .await?
            .into_iter()
            .filter(|d| caller.sees(&d.tenant))
            .map(|d| self.decorate(d))
            .collect();
        // As the caller's tenant's packs target on them; another
        // tenant's labels and tenants are not the caller's to see.
        a.labels = a.labels_for(tenant).into_owned();
        a.overrides.clear();
        if let Some(t) = caller.tenant() {
            a.tenants.retain(|x| x == t);
            // Which other tenants' packs it requires signed is theirs.
            if let Some(trust) = &mut a.trust {
                trust.signed_tenants.retain(|x| x == t);
            }
        }
        // An agent streaming to another replica: as that replica last
        // wrote it.
        let here = self.hub.is_connected(&a.id);
        let elsewhere = !here && self.replica().is_some() && a.connected;
        Ok(AgentView {
            connected: here || elsewhere,
            lateness_p99: if elsewhere {
                a.lateness_p99
            } else {
                self.lateness_p99(&a.id)
            },
            conflict: self.hub.conflict(&a.id),
            packs,
            agent: a,
        })
    }

    /// Change the caller's tenant's operator labels on an agent.
    pub async fn label(
        &self,
        caller: &Caller,
        id: &str,
        tenant: &str,
        change: LabelChange,
    ) -> AppResult<Labelled> {
        caller.may_manage_agents()?;
        let tenant = caller
            .tenant_of(tenant)
            .ok_or_else(|| AppError::NotFound(format!("no agent {id}")))?;
        if change.set.is_empty() && change.reset.is_empty() {
            return Err(AppError::Invalid(
                "nothing to change: give labels to set (k=v), remove or reset".into(),
            ));
        }
        if let Some(k) = change.reset.iter().find(|k| change.set.contains_key(*k)) {
            return Err(AppError::Invalid(format!(
                "label {k:?} is both set and removed or reset"
            )));
        }
        self.visible_agent(caller, id).await?;
        let (a, changed) = self
            .store
            .label_agent(id, &tenant, change.set, change.reset, now())
            .await?;
        // Its stream acts on the rows that changed (a pack may now target
        // it, or no longer); offline, its next hello does.
        self.delivered(&changed, None);
        tracing::info!(agent = %id, tenant = %tenant, "agent labels changed");
        Ok(Labelled {
            agent_id: id.to_string(),
            labels: a.labels_for(&tenant).into_owned(),
            agent_labels: a.labels,
            tenant,
        })
    }

    /// Grant (or take back) a tenant on an agent. An admin of a tenant the
    /// agent serves may share it with another tenant; a certificate's
    /// tenants cannot be taken back here (issue a new certificate). On a
    /// plaintext controller every caller may.
    pub async fn grant(
        &self,
        caller: &Caller,
        id: &str,
        tenant: &str,
        granted: bool,
    ) -> AppResult<Vec<String>> {
        caller.may_manage_agents()?;
        baton_proto::pack::check_ident("tenant", tenant).map_err(AppError::Invalid)?;
        baton_proto::pack::check_ident("agent id", id).map_err(AppError::Invalid)?;
        if caller.tenant().is_some() {
            // Only an agent the caller's tenant holds can be shared.
            self.visible_agent(caller, id).await?;
        }
        let changed = self.store.grant(id, tenant, granted, now()).await?;
        self.hub.send(id, SessionCmd::Regranted);
        self.delivered(&changed, None);
        let mut tenants: Vec<String> = self
            .store
            .agent(id)
            .await?
            .map(|a| a.tenants.into_iter().collect())
            .unwrap_or_else(|| {
                if granted {
                    vec![tenant.to_string()]
                } else {
                    Vec::new()
                }
            });
        // The caller learns its own tenant and the one it named, never
        // which other tenants share the agent (as `agents` hides them).
        if let Some(t) = caller.tenant() {
            tenants.retain(|x| x == t || x == tenant);
        }
        tracing::info!(agent = %id, tenant, granted, "agent tenants changed");
        Ok(tenants)
    }

    /// Forget an agent: the caller's tenant's part of it, or (without a
    /// tenant, or when no other tenant uses it) its whole record.
    pub async fn forget(&self, caller: &Caller, id: &str, tenant: &str) -> AppResult<Forgotten> {
        caller.may_manage_agents()?;
        // Without identities and without a tenant named: the whole fleet's.
        let tenant = match (caller.tenant(), tenant) {
            (None, "") => None,
            _ => Some(
                caller
                    .tenant_of(tenant)
                    .ok_or_else(|| AppError::NotFound(format!("no agent {id}")))?,
            ),
        };
        let agent = self.visible_agent(caller, id).await?;
        let whole = match &tenant {
            None => true,
            Some(t) => {
                let rows = self.store.deliveries_of_agent(id).await?;
                agent.stakeholders(&rows).iter().all(|x| x == t)
            }
        };
        let mut disconnected = false;
        if whole {
            // Close the stream first, so that it writes nothing after.
            disconnected = self.hub.send(id, SessionCmd::Forgotten);
            self.store.forget_agent(id, None).await?;
            self.hub.forget(id);
        } else {
            self.store.forget_agent(id, tenant.as_deref()).await?;
            self.hub.send(id, SessionCmd::Regranted);
        }
        tracing::info!(agent = %id, whole, disconnected, "agent forgotten");
        Ok(Forgotten {
            record_deleted: whole,
            disconnected,
        })
    }

    /// An agent's clock reports, oldest first: the newest `limit`.
    pub async fn clock_history(
        &self,
        caller: &Caller,
        id: &str,
        since: RefTime,
        limit: u32,
    ) -> AppResult<Vec<ClockRow>> {
        // The same answer for an agent that does not exist and one of
        // another tenant: nothing leaks.
        self.visible_agent(caller, id).await?;
        Ok(self.store.clock_history(id, since, limit).await?)
    }
}
