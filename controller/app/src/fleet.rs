//! The fleet as a page of agents filtered on the server (label, state,
//! text), and the counts by state above it: what the dashboard's fleet
//! page shows. Both are one store query each ([`baton_store::Store::agents`]
//! with the filter, [`baton_store::Store::agent_counts`]), evaluated by
//! the store with its indexes, so a label few agents carry costs a few
//! rows however large the fleet; only the agents shown get their
//! deliveries read.
//!
//! "Connected" is the agent's stored state, the same on every replica
//! (see [`FleetState::Connected`]); the page's rows show connection as
//! [`App::agents`] does (this replica's streams, and the store's word for
//! the others'), which differs only while a stream's start or end is
//! being written.

use crate::agents::AgentView;
use crate::app::{App, AppResult};
use crate::caller::Caller;
use baton_store::{AgentFilter, LabelMatch, MAX_PAGE, page};

pub use baton_store::{FleetCounts, FleetState};

/// What the fleet page asks for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FleetFilter {
    /// `key=value` (as the caller's tenant's packs see the labels), or
    /// just `key` (any value).
    pub label: Option<(String, Option<String>)>,
    /// Only agents in this state.
    pub state: Option<FleetState>,
    /// Part of the id or of a label value (ASCII letters in either case).
    pub text: Option<String>,
}

/// One page of the filtered fleet.
#[derive(Clone, Debug, PartialEq)]
pub struct FleetPage {
    /// By id.
    pub agents: Vec<AgentView>,
    /// The id to continue after, when there may be more.
    pub next: Option<String>,
}

impl FleetFilter {
    /// The store's filter for `caller`: only the agents it sees, their
    /// labels as its tenant's packs see them.
    fn for_store(&self, caller: &Caller, after: Option<String>, limit: u32) -> AgentFilter {
        AgentFilter {
            tenant: caller.tenant().map(str::to_string),
            label: self.label.as_ref().map(|(key, value)| LabelMatch {
                key: key.clone(),
                value: value.clone(),
            }),
            state: self.state,
            text: self.text.clone(),
            after_id: after,
            limit,
        }
    }
}

impl App {
    /// One page of the agents the caller sees that match `filter`, after
    /// `after`.
    pub async fn fleet(
        &self,
        caller: &Caller,
        filter: &FleetFilter,
        after: Option<String>,
        limit: u32,
    ) -> AppResult<FleetPage> {
        // One more than the page (within the store's): whether there is
        // a next one.
        let limit = page(limit, MAX_PAGE - 1);
        let mut rows = self
            .store
            .agents(filter.for_store(caller, after, limit + 1))
            .await?;
        let more = rows.len() > limit as usize;
        rows.truncate(limit as usize);
        let next = more.then(|| rows.last().map(|a| a.id.clone())).flatten();
        let mut agents = Vec::with_capacity(rows.len());
        for a in rows {
            agents.push(self.view(caller, a).await?);
        }
        Ok(FleetPage { agents, next })
    }

    /// The agents the caller sees (of them, those `filter`'s label and
    /// text match; its state is ignored), counted by state: one store
    /// query.
    pub async fn fleet_counts(
        &self,
        caller: &Caller,
        filter: &FleetFilter,
    ) -> AppResult<FleetCounts> {
        Ok(self
            .store
            .agent_counts(filter.for_store(caller, None, 0))
            .await?)
    }
}
