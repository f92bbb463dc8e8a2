//! What an agent should be told when it (re)connects: desired state (the
//! stored packs that target it) against what it says it holds. Sans-IO: a
//! pure function of the agent's hello and the store's rows, so every rule
//! is a unit test.
//!
//! Rules:
//! - a pack that targets the agent, live, and not held at its latest
//!   version (absent or older) is pushed, unless that version was already
//!   refused by this agent (a final nack: pushing it again changes nothing);
//! - held at the latest version: the delivery is acknowledged (it may have
//!   been accepted while the ack was lost with the link);
//! - held, but cancelled or no longer targeting the agent (a newer version
//!   with other targets): cancelled on the agent;
//! - held packs the controller never stored (loaded from the agent's own
//!   configuration) are left alone.

use std::collections::{BTreeMap, HashSet};

use crate::store::{HeldPackRow, LabelOverrides, PackRow, PackVersionRow, labels_for};

/// One thing to do for the agent.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Send this version.
    Push(PackVersionRow),
    /// Tell the agent to cancel its copy (the version it holds).
    Cancel {
        /// Tenant.
        tenant: String,
        /// Pack id.
        pack: String,
        /// The version the agent holds.
        version: u64,
    },
    /// The agent holds this version already: its delivery is acked.
    Acked {
        /// Tenant.
        tenant: String,
        /// Pack id.
        pack: String,
        /// Version.
        version: u64,
    },
}

/// A (tenant, pack, version) an agent refused for good.
pub type Refused = HashSet<(String, String, u64)>;

/// The actions for agent `id` with `labels` (its own) and operator labels
/// `overrides` (per tenant, for that tenant's packs) that holds `held`.
pub fn reconcile(
    id: &str,
    labels: &BTreeMap<String, String>,
    overrides: &BTreeMap<String, LabelOverrides>,
    held: &[HeldPackRow],
    packs: &[PackRow],
    refused: &Refused,
) -> Vec<Action> {
    let mut out = Vec::new();
    for p in packs {
        let latest = &p.latest;
        let h = held
            .iter()
            .find(|h| h.tenant == latest.tenant && h.pack == latest.pack);
        let wanted = p.cancelled_ns.is_none()
            && latest
                .targets
                .matches(id, &labels_for(labels, overrides, &latest.tenant));
        match (wanted, h) {
            (false, Some(h)) => out.push(Action::Cancel {
                tenant: h.tenant.clone(),
                pack: h.pack.clone(),
                version: h.version,
            }),
            (false, None) => {}
            (true, Some(h)) if h.version == latest.version => out.push(Action::Acked {
                tenant: latest.tenant.clone(),
                pack: latest.pack.clone(),
                version: latest.version,
            }),
            // The agent holds a newer version than the store knows (a
            // controller restored from an old backup): leave it be.
            (true, Some(h)) if h.version > latest.version => {}
            (true, _) => {
                let key = (latest.tenant.clone(), latest.pack.clone(), latest.version);
                if !refused.contains(&key) {
                    out.push(Action::Push(latest.clone()));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::TargetsRow;

    fn pack(name: &str, version: u64, targets: TargetsRow, cancelled: bool) -> PackRow {
        PackRow {
            latest: PackVersionRow {
                tenant: "default".into(),
                pack: name.into(),
                version,
                yaml: format!("pack: {name}"),
                targets,
                pushed_ns: 1,
            },
            cancelled_ns: cancelled.then_some(2),
        }
    }

    fn held(name: &str, version: u64) -> HeldPackRow {
        HeldPackRow {
            tenant: "default".into(),
            pack: name.into(),
            version,
            stopped: false,
        }
    }

    fn to(ids: &[&str]) -> TargetsRow {
        TargetsRow::Agents(ids.iter().map(|s| s.to_string()).collect())
    }

    fn names(actions: &[Action]) -> Vec<String> {
        actions
            .iter()
            .map(|a| match a {
                Action::Push(p) => format!("push {} v{}", p.pack, p.version),
                Action::Cancel { pack, version, .. } => format!("cancel {pack} v{version}"),
                Action::Acked { pack, version, .. } => format!("acked {pack} v{version}"),
            })
            .collect()
    }

    #[test]
    fn missing_or_older_is_pushed_same_is_acked() {
        let packs = [
            pack("a", 2, to(&["x"]), false),
            pack("b", 3, to(&["x"]), false),
            pack("c", 1, to(&["x"]), false),
        ];
        let got = reconcile(
            "x",
            &BTreeMap::new(),
            &BTreeMap::new(),
            &[held("a", 1), held("b", 3)],
            &packs,
            &Refused::new(),
        );
        assert_eq!(names(&got), ["push a v2", "acked b v3", "push c v1"]);
    }

    #[test]
    fn withdrawn_or_retargeted_is_cancelled_unknown_left_alone() {
        let mut labels = BTreeMap::new();
        labels.insert("line".to_string(), "3".to_string());
        let mut want = BTreeMap::new();
        want.insert("line".to_string(), "4".to_string());
        let packs = [
            pack("gone", 1, to(&["x"]), true),
            pack("moved", 2, TargetsRow::Labels(want), false),
        ];
        let got = reconcile(
            "x",
            &labels,
            &BTreeMap::new(),
            &[held("gone", 1), held("moved", 1), held("local", 9)],
            &packs,
            &Refused::new(),
        );
        assert_eq!(names(&got), ["cancel gone v1", "cancel moved v1"]);
    }

    #[test]
    fn operator_labels_retarget_for_their_tenant_only() {
        let mut own = BTreeMap::new();
        own.insert("line".to_string(), "3".to_string());
        let want: BTreeMap<String, String> = [("line".to_string(), "4".to_string())].into();
        let packs = [
            pack("moved", 1, TargetsRow::Labels(want), false),
            pack("here", 1, TargetsRow::Labels(own.clone()), false),
        ];
        // The default tenant's admin says line=4: `moved` now targets x.
        let mut o: BTreeMap<String, LabelOverrides> = BTreeMap::new();
        o.entry("default".into())
            .or_default()
            .insert("line".into(), Some("4".into()));
        let got = reconcile("x", &own, &o, &[held("here", 1)], &packs, &Refused::new());
        assert_eq!(names(&got), ["push moved v1", "cancel here v1"]);
        // Hiding the agent's own key untargets both.
        o.insert("default".into(), [("line".to_string(), None)].into());
        let got = reconcile("x", &own, &o, &[held("here", 1)], &packs, &Refused::new());
        assert_eq!(names(&got), ["cancel here v1"]);
        // Another tenant's labels change nothing for these packs.
        let mut other: BTreeMap<String, LabelOverrides> = BTreeMap::new();
        other
            .entry("plant-b".into())
            .or_default()
            .insert("line".into(), Some("4".into()));
        let got = reconcile(
            "x",
            &own,
            &other,
            &[held("here", 1)],
            &packs,
            &Refused::new(),
        );
        assert_eq!(names(&got), ["acked here v1"]);
    }

    #[test]
    fn refused_version_is_not_pushed_again_newer_held_is_left() {
        let packs = [
            pack("a", 2, to(&["x"]), false),
            pack("b", 1, to(&["x"]), false),
            pack("n", 1, TargetsRow::Nobody, false),
        ];
        let refused: Refused = [("default".to_string(), "a".to_string(), 2)].into();
        let got = reconcile(
            "x",
            &BTreeMap::new(),
            &BTreeMap::new(),
            &[held("b", 5)],
            &packs,
            &refused,
        );
        assert!(got.is_empty(), "{got:?}");
        // Another agent is not targeted at all.
        let got = reconcile(
            "y",
            &BTreeMap::new(),
            &BTreeMap::new(),
            &[],
            &packs,
            &Refused::new(),
        );
        assert!(got.is_empty(), "{got:?}");
    }
}
