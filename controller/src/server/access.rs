//! Who may see and do what on the operators' API: tenants and roles.
//!
//! An operator acts in one tenant (from its certificate): it sees only that
//! tenant's packs, deliveries and feedback, and only the agents that hold
//! or are targeted by that tenant's packs (or carry its operator labels).
//! `viewer` reads; `operator` also pushes and cancels; `admin` also reads
//! the audit log and manages agents (labels, forget). A plaintext
//! controller (`--insecure`) has no identities: every caller acts for every
//! tenant. Refusals never name another tenant's packs or agents: a pack of
//! another tenant is "not found", exactly like one that does not exist.

use std::collections::HashSet;

use tonic::Status;

use crate::identity::{Identity, Role};
use crate::store::{AgentRow, PackRow};

/// The caller of one Admin call.
#[derive(Clone, Debug)]
pub struct Caller {
    /// Its identity.
    pub who: Identity,
}

impl Caller {
    /// The tenant the caller is confined to (`None`: every tenant).
    pub fn tenant(&self) -> Option<&str> {
        match &self.who {
            Identity::Operator { tenant, .. } => Some(tenant),
            _ => None,
        }
    }

    fn role(&self) -> Role {
        match &self.who {
            Identity::Operator { role, .. } => *role,
            _ => Role::Admin,
        }
    }

    /// The tenant a request means: the one it names, or the caller's own
    /// (`default` without identities). `None` when it names a tenant the
    /// caller may not see (answer as if the object did not exist).
    pub fn tenant_of(&self, requested: &str) -> Option<String> {
        match (self.tenant(), requested) {
            (Some(own), "") => Some(own.to_string()),
            (Some(own), r) if r == own => Some(own.to_string()),
            (Some(_), _) => None,
            (None, "") => Some("default".to_string()),
            (None, r) => Some(r.to_string()),
        }
    }

    /// Whether the caller sees this tenant.
    pub fn sees(&self, tenant: &str) -> bool {
        self.tenant().is_none_or(|t| t == tenant)
    }

    /// Pushing and cancelling need role `operator` or `admin`.
    pub fn may_change(&self) -> Result<(), Status> {
        match self.role() {
            Role::Viewer => Err(Status::permission_denied(format!(
                "{}: role viewer may read, not push or cancel",
                self.who
            ))),
            _ => Ok(()),
        }
    }

    /// Reading the audit log needs role `admin`.
    pub fn may_audit(&self) -> Result<(), Status> {
        match self.role() {
            Role::Admin => Ok(()),
            _ => Err(Status::permission_denied(format!(
                "{}: the audit log needs role admin",
                self.who
            ))),
        }
    }

    /// Labelling and forgetting agents needs role `admin`.
    pub fn may_manage_agents(&self) -> Result<(), Status> {
        match self.role() {
            Role::Admin => Ok(()),
            r => Err(Status::permission_denied(format!(
                "{}: role {} may not label or forget agents (role admin may)",
                self.who,
                r.as_str()
            ))),
        }
    }

    /// Who, tenant and role as the audit log records them.
    pub fn audit_fields(&self, tenant: &str) -> (String, String, String) {
        match &self.who {
            Identity::Operator { name, tenant, role } => {
                (name.clone(), tenant.clone(), role.as_str().to_string())
            }
            Identity::Agent { id } => (format!("agent {id}"), tenant.to_string(), "none".into()),
            Identity::Insecure => ("insecure".into(), tenant.to_string(), "admin".into()),
        }
    }

    /// The agents the caller may see: every agent without a tenant;
    /// otherwise those holding or targeted by a live pack of its tenant,
    /// or carrying its operator labels.
    pub fn visible_agents(&self, agents: &[AgentRow], packs: &[PackRow]) -> HashSet<String> {
        let Some(t) = self.tenant() else {
            return agents.iter().map(|a| a.id.clone()).collect();
        };
        agents
            .iter()
            .filter(|a| {
                a.held.iter().any(|h| h.tenant == t)
                    || a.overrides.contains_key(t)
                    || packs.iter().any(|p| {
                        p.latest.tenant == t && p.cancelled_ns.is_none() && a.targeted_by(&p.latest)
                    })
            })
            .map(|a| a.id.clone())
            .collect()
    }
}

/// Whether a tenant other than `tenant` uses the agent: holds one of its
/// packs on it, targets it with a live pack, or has labels on it. Such an
/// agent's record is not `tenant`'s alone to forget.
pub fn used_by_other_tenant(agent: &AgentRow, packs: &[PackRow], tenant: &str) -> bool {
    agent.held.iter().any(|h| h.tenant != tenant)
        || agent.overrides.keys().any(|t| t != tenant)
        || packs.iter().any(|p| {
            p.latest.tenant != tenant && p.cancelled_ns.is_none() && agent.targeted_by(&p.latest)
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{HeldPackRow, PackVersionRow, TargetsRow};

    fn op(tenant: &str, role: Role) -> Caller {
        Caller {
            who: Identity::Operator {
                name: "ann".into(),
                tenant: tenant.into(),
                role,
            },
        }
    }

    #[test]
    fn tenants_confine_and_roles_gate() {
        let a = op("plant-a", Role::Viewer);
        assert_eq!(a.tenant_of("").as_deref(), Some("plant-a"));
        assert_eq!(a.tenant_of("plant-a").as_deref(), Some("plant-a"));
        assert_eq!(a.tenant_of("plant-b"), None);
        assert!(a.sees("plant-a") && !a.sees("plant-b"));
        assert_eq!(
            a.may_change().expect_err("viewer").code(),
            tonic::Code::PermissionDenied
        );
        assert!(op("plant-a", Role::Operator).may_change().is_ok());
        assert!(op("plant-a", Role::Operator).may_audit().is_err());
        assert!(op("plant-a", Role::Admin).may_audit().is_ok());
        assert!(op("plant-a", Role::Operator).may_manage_agents().is_err());
        assert!(op("plant-a", Role::Admin).may_manage_agents().is_ok());
        let open = Caller {
            who: Identity::Insecure,
        };
        assert_eq!(open.tenant_of("").as_deref(), Some("default"));
        assert_eq!(open.tenant_of("plant-b").as_deref(), Some("plant-b"));
        assert!(open.may_change().is_ok() && open.may_audit().is_ok());
    }

    #[test]
    fn agents_visible_through_their_packs() {
        let agent = |id: &str, held_tenant: Option<&str>| AgentRow {
            id: id.into(),
            labels: Default::default(),
            agent_version: String::new(),
            journal_id: "j".into(),
            connected: true,
            last_seen_ns: 0,
            held: held_tenant
                .map(|t| HeldPackRow {
                    tenant: t.into(),
                    pack: "p".into(),
                    version: 1,
                    stopped: false,
                })
                .into_iter()
                .collect(),
            clock: None,
            overrides: Default::default(),
        };
        let agents = [
            agent("x", Some("plant-a")),
            agent("y", None),
            agent("z", Some("plant-b")),
        ];
        let packs = [PackRow {
            latest: PackVersionRow {
                tenant: "plant-a".into(),
                pack: "q".into(),
                version: 1,
                yaml: String::new(),
                targets: TargetsRow::Agents(vec!["y".into()]),
                pushed_ns: 0,
            },
            cancelled_ns: None,
        }];
        let mut seen: Vec<String> = op("plant-a", Role::Viewer)
            .visible_agents(&agents, &packs)
            .into_iter()
            .collect();
        seen.sort();
        assert_eq!(seen, ["x", "y"]);
        let seen = op("plant-b", Role::Viewer).visible_agents(&agents, &packs);
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), ["z"]);
        // x holds only plant-a's packs, y is targeted only by them.
        assert!(!used_by_other_tenant(&agents[0], &packs, "plant-a"));
        assert!(!used_by_other_tenant(&agents[1], &packs, "plant-a"));
        assert!(used_by_other_tenant(&agents[1], &packs, "plant-b"));
        assert!(used_by_other_tenant(&agents[2], &packs, "plant-a"));
        // Labels of plant-b on y make it visible to plant-b, and used by it.
        let mut y = agents[1].clone();
        y.overrides.insert("plant-b".into(), Default::default());
        assert!(used_by_other_tenant(&y, &[], "plant-a"));
        let seen = op("plant-b", Role::Viewer).visible_agents(&[y], &packs);
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), ["y"]);
    }
}
