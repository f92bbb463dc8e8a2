//! Who may see and do what: tenants and roles.
//!
//! An operator acts in one tenant (from its certificate): it sees only that
//! tenant's packs, deliveries and feedback, and only the agents that serve
//! that tenant (from their certificates and admins' grants). `viewer`
//! reads; `operator` also pushes and cancels; `admin` also reads the audit
//! log and manages agents (labels, grants, forget). A plaintext controller
//! (`--insecure`) has no identities: every caller acts for every tenant.
//! Refusals never name another tenant's packs or agents: a pack or agent
//! of another tenant is "not found", exactly like one that does not exist.

use crate::app::AppError;
use baton_model::identity::{Identity, Role};
use baton_model::{AgentRow, Binding};

/// The caller of one operation.
#[derive(Clone, Debug)]
pub struct Caller {
    /// Its identity.
    pub who: Identity,
}

impl Caller {
    /// A caller with this identity.
    pub fn new(who: Identity) -> Caller {
        Caller { who }
    }

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

    /// Whether the caller sees this agent: every agent without a tenant;
    /// otherwise those serving its tenant.
    pub fn sees_agent(&self, agent: &AgentRow, binding: Binding) -> bool {
        self.tenant().is_none_or(|t| agent.serves(t, binding))
    }

    /// Pushing and cancelling need role `operator` or `admin`.
    pub fn may_change(&self) -> Result<(), AppError> {
        match self.role() {
            Role::Viewer => Err(AppError::Denied(format!(
                "{}: role viewer may read, not push or cancel",
                self.who
            ))),
            _ => Ok(()),
        }
    }

    /// Reading the audit log needs role `admin`.
    pub fn may_audit(&self) -> Result<(), AppError> {
        match self.role() {
            Role::Admin => Ok(()),
            _ => Err(AppError::Denied(format!(
                "{}: the audit log needs role admin",
                self.who
            ))),
        }
    }

    /// Labelling, granting and forgetting agents needs role `admin`.
    pub fn may_manage_agents(&self) -> Result<(), AppError> {
        match self.role() {
            Role::Admin => Ok(()),
            r => Err(AppError::Denied(format!(
                "{}: role {} may not label, grant or forget agents (role admin may)",
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
            Identity::Agent { id, .. } => {
                (format!("agent {id}"), tenant.to_string(), "none".into())
            }
            Identity::Insecure => ("insecure".into(), tenant.to_string(), "admin".into()),
        }
    }

    /// The tenant an audit record of a request names: the one asked for,
    /// else the caller's (`default` without identities). A tenant operator
    /// naming another tenant is recorded under its own (the other name is
    /// not its to read back).
    pub fn audit_tenant(&self, requested: &str) -> String {
        match (self.tenant(), requested) {
            (Some(own), _) => own.to_string(),
            (None, "") => "default".to_string(),
            (None, r) => r.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(tenant: &str, role: Role) -> Caller {
        Caller::new(Identity::Operator {
            name: "ann".into(),
            tenant: tenant.into(),
            role,
        })
    }

    #[test]
    fn tenants_confine_and_roles_gate() {
        let a = op("plant-a", Role::Viewer);
        assert_eq!(a.tenant_of("").as_deref(), Some("plant-a"));
        assert_eq!(a.tenant_of("plant-a").as_deref(), Some("plant-a"));
        assert_eq!(a.tenant_of("plant-b"), None);
        assert!(a.sees("plant-a") && !a.sees("plant-b"));
        assert!(matches!(a.may_change(), Err(AppError::Denied(_))));
        assert!(op("plant-a", Role::Operator).may_change().is_ok());
        assert!(op("plant-a", Role::Operator).may_audit().is_err());
        assert!(op("plant-a", Role::Admin).may_audit().is_ok());
        assert!(op("plant-a", Role::Operator).may_manage_agents().is_err());
        assert!(op("plant-a", Role::Admin).may_manage_agents().is_ok());
        let open = Caller::new(Identity::Insecure);
        assert_eq!(open.tenant_of("").as_deref(), Some("default"));
        assert_eq!(open.tenant_of("plant-b").as_deref(), Some("plant-b"));
        assert!(open.may_change().is_ok() && open.may_audit().is_ok());
        assert_eq!(open.audit_tenant(""), "default");
        assert_eq!(a.audit_tenant("plant-b"), "plant-a");
    }

    #[test]
    fn agents_are_seen_by_the_tenants_they_serve() {
        let mut x = AgentRow::new("x", "j");
        x.tenants.insert("plant-a".into());
        let a = op("plant-a", Role::Viewer);
        let b = op("plant-b", Role::Viewer);
        assert!(a.sees_agent(&x, Binding::Tenants));
        assert!(!b.sees_agent(&x, Binding::Tenants));
        // Without identities every agent serves every tenant.
        assert!(b.sees_agent(&x, Binding::Open));
        assert!(Caller::new(Identity::Insecure).sees_agent(&x, Binding::Tenants));
    }
}
