//! Deterministic execution ids: the same occurrence of the same instruction
//! gets the same id on every run, so a re-delivered pack or a restart can be
//! recognised and never fires twice (docs/design.md principle 4).

use std::fmt;

use baton_proto::RefTime;

/// Identifies a pack on an agent: tenant and pack id.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PackKey {
    /// Tenant.
    pub tenant: String,
    /// Pack id.
    pub pack: String,
}

impl PackKey {
    /// The key of a pack: its tenant and id.
    pub fn of(pack: &baton_proto::Pack) -> PackKey {
        PackKey {
            tenant: pack.tenant.clone(),
            pack: pack.id.clone(),
        }
    }
}

impl fmt::Display for PackKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.tenant, self.pack)
    }
}

/// One attempt of one occurrence of one instruction of one pack version.
///
/// For `after` instructions the occurrence is the *planned* instant (the
/// latest upstream occurrence plus the delay), not the moment the upstream
/// result arrived: that keeps the id the same across a restart.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExecutionId {
    /// Tenant and pack.
    pub pack: PackKey,
    /// Pack version.
    pub version: u64,
    /// Instruction id.
    pub instruction: String,
    /// Occurrence instant (reference time).
    pub occurrence: RefTime,
    /// Attempt number, from 1.
    pub attempt: u32,
}

impl ExecutionId {
    /// The id without the attempt: what a program receives as
    /// `BATON_IDEMPOTENCY_KEY`, equal across retries of one occurrence.
    pub fn idempotency_key(&self) -> String {
        format!(
            "{}/{}/v{}/{}/{}",
            self.pack.tenant,
            self.pack.pack,
            self.version,
            self.instruction,
            self.occurrence.as_nanos()
        )
    }

    /// Parse the text form back (the journal stores ids as text).
    pub fn parse(text: &str) -> Option<ExecutionId> {
        let p = baton_proto::feedback::parse_execution_id(text)?;
        Some(ExecutionId {
            pack: PackKey {
                tenant: p.tenant.into(),
                pack: p.pack.into(),
            },
            version: p.version,
            instruction: p.instruction.into(),
            occurrence: p.occurrence,
            attempt: p.attempt,
        })
    }
}

impl fmt::Display for ExecutionId {
    /// `tenant/pack/v7/instruction/occurrence_ns/a1`: ids never contain `/`
    /// (the pack language forbids it), so the form parses back unambiguously.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Written out rather than through `idempotency_key`: made once per
        // firing, and that would build an intermediate string.
        write!(
            f,
            "{}/{}/v{}/{}/{}/a{}",
            self.pack.tenant,
            self.pack.pack,
            self.version,
            self.instruction,
            self.occurrence.as_nanos(),
            self.attempt
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_text() {
        let id = ExecutionId {
            pack: PackKey {
                tenant: "plant-a".into(),
                pack: "line3.press".into(),
            },
            version: 7,
            instruction: "press-1".into(),
            occurrence: RefTime::from_nanos(-5),
            attempt: 3,
        };
        let text = id.to_string();
        assert_eq!(text, "plant-a/line3.press/v7/press-1/-5/a3");
        assert_eq!(ExecutionId::parse(&text), Some(id));
        assert_eq!(ExecutionId::parse("a/b/v1/c/5/a1/x"), None);
        assert_eq!(ExecutionId::parse("a/b/1/c/5/a1"), None);
    }
}
