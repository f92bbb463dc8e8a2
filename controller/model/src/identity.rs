//! Who is on the other end of a connection: an agent, an operator, or
//! nobody in particular (a plaintext `--insecure` controller).
//!
//! On a TLS connection the identity is the peer certificate's, made by
//! `baton-controller ca`: exactly one subject alternative name URI of the
//! `baton:` scheme says who it is.
//!
//! - an agent: `baton:agent:NAME`, or `baton:agent:NAME?tenant=A&tenant=B`
//!   for an agent that serves those tenants (none named: `default`);
//! - an operator: `baton:operator:NAME?tenant=TENANT&role=ROLE`, ROLE one
//!   of `viewer`, `operator`, `admin`.
//!
//! NAME and TENANT follow the pack language's id rule
//! ([`baton_proto::pack::is_ident`]: `[a-z0-9][a-z0-9._-]*`), so neither
//! can contain `:`, `?`, `&` or `=` and the two kinds cannot be confused.
//! The certificate's common name is NAME too, for people reading it; only
//! the URI counts.

use std::fmt;

use baton_proto::pack::is_ident;

/// URI prefix of an agent identity.
pub const AGENT_PREFIX: &str = "baton:agent:";
/// URI prefix of an operator identity.
pub const OPERATOR_PREFIX: &str = "baton:operator:";

/// What an operator may do (enforced by the tenants-and-roles work; carried
/// in the certificate now).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// Reads.
    Viewer,
    /// Reads, pushes and cancels.
    Operator,
    /// Also manages agents.
    Admin,
}

impl Role {
    /// The name in certificates and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }
}

impl std::str::FromStr for Role {
    type Err = IdentityError;

    fn from_str(s: &str) -> Result<Role, IdentityError> {
        match s {
            "viewer" => Ok(Role::Viewer),
            "operator" => Ok(Role::Operator),
            "admin" => Ok(Role::Admin),
            _ => Err(IdentityError(format!(
                "role `{s}`: expected viewer, operator or admin"
            ))),
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who a connection speaks for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Identity {
    /// An agent; its id on the link is `id`, whatever its Hello says.
    Agent {
        /// The agent id.
        id: String,
        /// The tenants it serves, as its certificate names them (empty:
        /// none named, which means `default`).
        tenants: Vec<String>,
    },
    /// An operator of one tenant.
    Operator {
        /// Who (for the log and the audit).
        name: String,
        /// The tenant it acts in.
        tenant: String,
        /// What it may do.
        role: Role,
    },
    /// A plaintext connection to a controller started with `--insecure`:
    /// no identity is checked.
    Insecure,
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Identity::Agent { id, .. } => write!(f, "agent {id}"),
            Identity::Operator { name, tenant, role } => {
                write!(f, "operator {name} (tenant {tenant}, role {role})")
            }
            Identity::Insecure => f.write_str("insecure peer"),
        }
    }
}

/// A certificate that does not say who it is in a way baton reads.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct IdentityError(pub String);

fn bad(m: impl Into<String>) -> IdentityError {
    IdentityError(m.into())
}

/// Check a name (agent, operator, tenant) against the id rule (the pack
/// language's, with its message).
pub fn check_name(what: &str, name: &str) -> Result<(), IdentityError> {
    debug_assert_eq!(
        is_ident(name),
        baton_proto::pack::check_ident(what, name).is_ok()
    );
    baton_proto::pack::check_ident(what, name).map_err(IdentityError)
}

/// The tenant an agent certificate naming none serves.
pub const DEFAULT_TENANT: &str = "default";

impl Identity {
    /// An agent's tenants as the controller binds them: those its
    /// certificate names, or `default` when it names none.
    pub fn agent_tenants(tenants: &[String]) -> Vec<String> {
        if tenants.is_empty() {
            vec![DEFAULT_TENANT.to_string()]
        } else {
            tenants.to_vec()
        }
    }
}

impl Identity {
    /// The SAN URI that carries this identity (`None` for
    /// [`Identity::Insecure`]).
    pub fn to_uri(&self) -> Option<String> {
        match self {
            Identity::Agent { id, tenants } if tenants.is_empty() => {
                Some(format!("{AGENT_PREFIX}{id}"))
            }
            Identity::Agent { id, tenants } => {
                let q: Vec<String> = tenants.iter().map(|t| format!("tenant={t}")).collect();
                Some(format!("{AGENT_PREFIX}{id}?{}", q.join("&")))
            }
            Identity::Operator { name, tenant, role } => Some(format!(
                "{OPERATOR_PREFIX}{name}?tenant={tenant}&role={role}"
            )),
            Identity::Insecure => None,
        }
    }

    /// Read a `baton:` URI (see the module docs).
    pub fn from_uri(uri: &str) -> Result<Identity, IdentityError> {
        if let Some(rest) = uri.strip_prefix(AGENT_PREFIX) {
            let (id, query) = match rest.split_once('?') {
                Some((id, q)) => (id, Some(q)),
                None => (rest, None),
            };
            check_name("agent", id)?;
            let mut tenants = Vec::new();
            for kv in query.into_iter().flat_map(|q| q.split('&')) {
                match kv.split_once('=') {
                    Some(("tenant", t)) => {
                        check_name("tenant", t)?;
                        if !tenants.iter().any(|x| x == t) {
                            tenants.push(t.to_string());
                        }
                    }
                    _ => return Err(bad(format!("`{uri}`: unexpected `{kv}`"))),
                }
            }
            return Ok(Identity::Agent {
                id: id.to_string(),
                tenants,
            });
        }
        if let Some(rest) = uri.strip_prefix(OPERATOR_PREFIX) {
            let (name, query) = rest
                .split_once('?')
                .ok_or_else(|| bad(format!("`{uri}`: an operator needs ?tenant=T&role=R")))?;
            check_name("operator", name)?;
            let (mut tenant, mut role) = (None, None);
            for kv in query.split('&') {
                match kv.split_once('=') {
                    Some(("tenant", t)) if tenant.is_none() => tenant = Some(t),
                    Some(("role", r)) if role.is_none() => role = Some(r),
                    _ => return Err(bad(format!("`{uri}`: unexpected `{kv}`"))),
                }
            }
            let tenant = tenant.ok_or_else(|| bad(format!("`{uri}`: no tenant")))?;
            check_name("tenant", tenant)?;
            let role = role
                .ok_or_else(|| bad(format!("`{uri}`: no role")))?
                .parse()?;
            return Ok(Identity::Operator {
                name: name.to_string(),
                tenant: tenant.to_string(),
                role,
            });
        }
        Err(bad(format!("`{uri}` is not a baton identity")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_round_trip_and_kinds_cannot_be_confused() {
        let a = Identity::Agent {
            id: "press-01".into(),
            tenants: Vec::new(),
        };
        assert_eq!(a.to_uri().as_deref(), Some("baton:agent:press-01"));
        assert_eq!(Identity::from_uri("baton:agent:press-01"), Ok(a));
        // An agent of two tenants.
        let a = Identity::Agent {
            id: "press-01".into(),
            tenants: vec!["plant-a".into(), "plant-b".into()],
        };
        let uri = a.to_uri().expect("uri");
        assert_eq!(uri, "baton:agent:press-01?tenant=plant-a&tenant=plant-b");
        assert_eq!(Identity::from_uri(&uri), Ok(a));
        assert_eq!(Identity::agent_tenants(&[]), ["default"]);
        let o = Identity::Operator {
            name: "ann".into(),
            tenant: "plant-a".into(),
            role: Role::Viewer,
        };
        let uri = o.to_uri().expect("uri");
        assert_eq!(uri, "baton:operator:ann?tenant=plant-a&role=viewer");
        assert_eq!(Identity::from_uri(&uri), Ok(o));
        // Query order does not matter.
        assert!(matches!(
            Identity::from_uri("baton:operator:ann?role=admin&tenant=t"),
            Ok(Identity::Operator {
                role: Role::Admin,
                ..
            })
        ));
        assert_eq!(Identity::Insecure.to_uri(), None);
    }

    #[test]
    fn bad_uris_are_refused_with_the_reason() {
        for (uri, why) in [
            ("baton:agent:", "agent ``"),
            ("baton:agent:Press", "agent `Press`"),
            (
                "baton:agent:a?tenant=t&role=admin",
                "unexpected `role=admin`",
            ),
            ("baton:agent:a?tenant=T", "tenant `T`"),
            ("baton:operator:ann", "needs ?tenant"),
            ("baton:operator:ann?tenant=t", "no role"),
            ("baton:operator:ann?role=admin", "no tenant"),
            ("baton:operator:ann?tenant=t&role=root", "role `root`"),
            ("baton:operator:ann?tenant=T&role=admin", "tenant `T`"),
            (
                "baton:operator:ann?tenant=t&role=admin&role=viewer",
                "unexpected `role=viewer`",
            ),
            ("baton:operator:ann?tenant=t&role=admin&x", "unexpected `x`"),
            ("baton:root:x", "not a baton identity"),
            ("https://example.com", "not a baton identity"),
        ] {
            let e = Identity::from_uri(uri).expect_err(uri);
            assert!(e.0.contains(why), "{uri}: {e}");
        }
    }
}
