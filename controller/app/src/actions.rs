//! What an operator does to packs and agents, one path for every door
//! (the CLI over gRPC, the dashboard): the operation, its audit record
//! (refusals too, written before the answer), and, once done, an
//! [`Event::Action`] so that every open page showing the pack or agent
//! says so at once. Rollout commands take the same path in
//! [`crate::rollouts`].

use crate::app::{App, AppError, AppResult, now};
use crate::caller::Caller;
use crate::events::{ActionEvent, Event};
use crate::packs::{Cancelled, Pushed};
use baton_model::{Intent, PackKey};
use baton_proto::pack::with_version;

/// How far a cancel reaches: what the confirmation says before it runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reach {
    /// Agents the pack is meant for now (the latest version's holders
    /// and those it is on its way to).
    pub meant: usize,
    /// Agents that report holding some version of it.
    pub holding: usize,
}

/// A stored version as the next one, to push (`next_from_stored`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FromStored {
    /// Its text, every byte kept but the version (and a signature line).
    pub yaml: String,
    /// The version it is now.
    pub version: u64,
    /// The key whose signature the stored version carried and this text
    /// no longer does.
    pub dropped_signature: Option<String>,
}

impl App {
    /// [`App::push`], audited and announced.
    pub async fn push_as(&self, caller: &Caller, yaml: String, source: &str) -> AppResult<Pushed> {
        let r = self.push(caller, yaml, source).await;
        let (tenant, target) = match &r {
            Ok(p) => (p.key.tenant.clone(), format!("{} v{}", p.key, p.version)),
            Err(_) => (caller.audit_tenant(""), source.to_string()),
        };
        let p = self.audited(caller, &tenant, "push", &target, r).await?;
        if !p.unchanged {
            let what = format!("pushed v{} to {} agent(s)", p.version, p.agents.len());
            self.announce(caller, &p.key, "", what);
        }
        Ok(p)
    }

    /// [`App::cancel`] (`only` empty) or [`App::cancel_on`] those agents,
    /// audited and announced.
    pub async fn cancel_as(
        &self,
        caller: &Caller,
        tenant: &str,
        pack: &str,
        only: &[String],
    ) -> AppResult<Cancelled> {
        let named = caller.audit_tenant(tenant);
        let (target, r) = if only.is_empty() {
            let r = self.cancel(caller, tenant, pack).await;
            (format!("{named}/{pack}"), r)
        } else {
            let r = self.cancel_on(caller, tenant, pack, only).await;
            (format!("{named}/{pack} on {}", only.join(", ")), r)
        };
        let c = self.audited(caller, &named, "cancel", &target, r).await?;
        let what = if only.is_empty() {
            format!("cancelled the pack on {} agent(s)", c.agents.len())
        } else {
            format!("cancelled the pack on {}", c.agents.join(", "))
        };
        self.announce(caller, &c.key, "", what);
        Ok(c)
    }

    /// [`App::grant`], audited (`grant` or `ungrant`) and announced.
    pub async fn grant_as(
        &self,
        caller: &Caller,
        id: &str,
        tenant: &str,
        granted: bool,
    ) -> AppResult<Vec<String>> {
        let named = caller.audit_tenant("");
        let (action, word) = if granted {
            ("grant", "to")
        } else {
            ("ungrant", "from")
        };
        let target = format!("agent {id} {word} tenant {tenant}");
        let r = self.grant(caller, id, tenant, granted).await;
        let tenants = self.audited(caller, &named, action, &target, r).await?;
        let what = if granted {
            format!("granted agent {id} to tenant {tenant}")
        } else {
            format!("took agent {id} back from tenant {tenant}")
        };
        // Told to the acting tenant's pages only: the other tenant learns
        // of its new agent from its own fleet page, not who acted.
        self.publish(Event::Action(ActionEvent {
            tenant: named.clone(),
            pack: String::new(),
            agent: id.to_string(),
            text: format!("{} {what}", who(caller, &named)),
            at: now(),
        }));
        Ok(tenants)
    }

    /// How many agents cancelling `pack` concerns (only the agents in
    /// `only`, when any are named: each must have a delivery of it), for
    /// its confirmation.
    pub async fn reach(
        &self,
        caller: &Caller,
        tenant: &str,
        pack: &str,
        only: &[String],
    ) -> AppResult<Reach> {
        let tenant = caller
            .tenant_of(tenant)
            .ok_or_else(|| AppError::NotFound(format!("no pack {tenant}/{pack}")))?;
        let key = PackKey::new(&tenant, pack);
        let mut rows = self.all_deliveries(&key, None).await?;
        if !only.is_empty() {
            crate::packs::each_delivered(&key, &rows, only)?;
            rows.retain(|r| only.contains(&r.agent_id));
        }
        Ok(Reach {
            meant: rows.iter().filter(|r| r.intent == Intent::Hold).count(),
            holding: rows.iter().filter(|r| r.held.is_some()).count(),
        })
    }

    /// A stored version's YAML as the next version (the newest stored
    /// plus one), for an operator to push again, edited or not: every
    /// byte but the version kept.
    pub async fn next_from_stored(
        &self,
        caller: &Caller,
        tenant: &str,
        pack: &str,
        version: u64,
    ) -> AppResult<FromStored> {
        caller.may_change()?;
        let newest = self.pack_versions(caller, tenant, pack, 1).await?;
        let key = newest[0].key();
        let next = newest[0].version + 1;
        let text = self
            .store
            .pack_version(&key, Some(version))
            .await?
            .ok_or_else(|| AppError::NotFound(format!("{key} v{version} is not stored")))?;
        // A signature covered the stored version's bytes, never the next
        // one's: it is left out (boxes that require one refuse the pack
        // until its operator signs it, `push --sign`).
        let (body, dropped) = match baton_trust::pack::split(&text.yaml) {
            Ok((body, sig)) => (body, sig.map(|s| s.key.to_string())),
            Err(_) => (text.yaml.as_str(), None),
        };
        let yaml = with_version(body, next)
            .map_err(|e| AppError::Invalid(e.render("stored pack").trim_end().to_string()))?;
        Ok(FromStored {
            yaml,
            version: next,
            dropped_signature: dropped,
        })
    }

    /// Tell the pack's pages what `caller` did.
    pub(crate) fn announce(&self, caller: &Caller, key: &PackKey, agent: &str, what: String) {
        self.publish(Event::Action(ActionEvent {
            tenant: key.tenant.clone(),
            pack: key.pack.clone(),
            agent: agent.to_string(),
            text: format!("{} {what}", who(caller, &key.tenant)),
            at: now(),
        }));
    }
}

/// The caller's name as the audit log records it.
fn who(caller: &Caller, tenant: &str) -> String {
    caller.audit_fields(tenant).0
}
