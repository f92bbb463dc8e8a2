//! What watchers are told, and who may see it. Every event carries what
//! decides its visibility (the pack's tenant, or the tenants an agent
//! serves), so filtering a watcher's stream never reads the store.

use std::collections::BTreeSet;
use std::sync::Arc;

use baton_model::{Binding, ClockRow, DeliveryRow, FeedbackRow, RefTime};

/// Something that happened, for watchers.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// Feedback stored.
    Feedback(Arc<FeedbackRow>),
    /// A delivery row changed.
    Delivery(DeliveryRow),
    /// An agent connected, disconnected, reported its clock, or a second
    /// machine tried its id.
    Agent(AgentEvent),
    /// An operator acted on a pack, a rollout or an agent (dashboard or
    /// CLI): open pages say so at once and read their parts again. Told
    /// to this replica's watchers at once and, through the store's events,
    /// to the other replicas' (their followers).
    Action(ActionEvent),
}

/// What an operator did, in words, and what it concerns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActionEvent {
    /// The tenant acted in (who may see it).
    pub tenant: String,
    /// The pack it concerns (empty: none).
    pub pack: String,
    /// The agent it concerns (empty: none).
    pub agent: String,
    /// `ann paused the rollout of blink v3`.
    pub text: String,
    /// When.
    pub at: RefTime,
}

/// What happened to an agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentEventKind {
    /// Its stream opened.
    Connected,
    /// Its stream ended.
    Disconnected,
    /// A clock report.
    Clock,
    /// A stream from another journal under its id was refused, or feedback
    /// it had was lost by a store rolled back.
    Conflict,
}

/// An agent's event.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentEvent {
    /// The agent.
    pub agent_id: String,
    /// The tenants it serves (who may see the event).
    pub tenants: Arc<BTreeSet<String>>,
    /// What.
    pub kind: AgentEventKind,
    /// The clock report, for [`AgentEventKind::Clock`].
    pub clock: Option<ClockRow>,
    /// In words.
    pub detail: String,
    /// When.
    pub at: RefTime,
}

/// What a watcher asked to see.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WatchFilter {
    /// Only this tenant (an operator is always confined to its own).
    pub tenant: Option<String>,
    /// Only this pack.
    pub pack: Option<String>,
}

/// Whether a watcher with `filter` (its tenant already confined to the
/// caller's) sees `e`.
pub fn visible(e: &Event, filter: &WatchFilter, binding: Binding) -> bool {
    let (tenant, pack) = (filter.tenant.as_deref(), filter.pack.as_deref());
    let (t, p) = match e {
        Event::Feedback(f) => (f.tenant.as_str(), f.pack.as_str()),
        Event::Delivery(d) => (d.tenant.as_str(), d.pack.as_str()),
        // An agent's grant concerns no pack: every page of the tenant.
        Event::Action(a) if a.pack.is_empty() => return tenant.is_none_or(|t| t == a.tenant),
        Event::Action(a) => (a.tenant.as_str(), a.pack.as_str()),
        Event::Agent(a) => {
            return tenant.is_none_or(|t| binding == Binding::Open || a.tenants.contains(t));
        }
    };
    tenant.is_none_or(|want| want == t) && pack.is_none_or(|want| want == p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_model::{DeliveryState, Intent};

    fn delivery(tenant: &str, pack: &str) -> Event {
        Event::Delivery(DeliveryRow {
            agent_id: "a2".into(),
            tenant: tenant.into(),
            pack: pack.into(),
            version: 1,
            intent: Intent::Hold,
            held: None,
            refusal: None,
            state: DeliveryState::Pending,
            reason: String::new(),
            attempts: 0,
            updated: RefTime::from_nanos(0),
            activate: Default::default(),
            staged: None,
        })
    }

    fn agent(tenants: &[&str]) -> Event {
        Event::Agent(AgentEvent {
            agent_id: "a2".into(),
            tenants: Arc::new(tenants.iter().map(|t| t.to_string()).collect()),
            kind: AgentEventKind::Connected,
            clock: None,
            detail: String::new(),
            at: RefTime::from_nanos(0),
        })
    }

    #[test]
    fn a_tenant_sees_its_packs_and_the_agents_serving_it() {
        let a = WatchFilter {
            tenant: Some("plant-a".into()),
            pack: None,
        };
        let t = Binding::Tenants;
        assert!(visible(&delivery("plant-a", "p"), &a, t));
        assert!(!visible(&delivery("plant-b", "p"), &a, t));
        assert!(visible(&agent(&["plant-a", "plant-b"]), &a, t));
        assert!(!visible(&agent(&["plant-b"]), &a, t));
        // A pack filter narrows packs' events, not agents'.
        let ap = WatchFilter {
            tenant: Some("plant-a".into()),
            pack: Some("q".into()),
        };
        assert!(!visible(&delivery("plant-a", "p"), &ap, t));
        assert!(visible(&delivery("plant-a", "q"), &ap, t));
        // Without a tenant (plaintext) everything.
        let all = WatchFilter::default();
        assert!(visible(&agent(&[]), &all, Binding::Open));
        assert!(visible(&delivery("plant-b", "p"), &all, t));
    }

    #[test]
    fn an_action_is_seen_by_its_tenant_and_its_pack_page() {
        let action = |pack: &str| {
            Event::Action(ActionEvent {
                tenant: "plant-a".into(),
                pack: pack.into(),
                agent: String::new(),
                text: "ann paused".into(),
                at: RefTime::from_nanos(0),
            })
        };
        let t = Binding::Tenants;
        let a = WatchFilter {
            tenant: Some("plant-a".into()),
            pack: None,
        };
        let b = WatchFilter {
            tenant: Some("plant-b".into()),
            pack: None,
        };
        let a_q = WatchFilter {
            tenant: Some("plant-a".into()),
            pack: Some("q".into()),
        };
        assert!(visible(&action("p"), &a, t));
        assert!(!visible(&action("p"), &b, t), "another tenant's action");
        assert!(!visible(&action("p"), &a_q, t), "another pack's page");
        assert!(visible(&action("q"), &a_q, t));
        // An agent's action (no pack) reaches the tenant's pages, not another's.
        assert!(visible(&action(""), &a_q, t));
        assert!(!visible(&action(""), &b, t));
    }
}
