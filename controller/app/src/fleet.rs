//! The fleet as a page of agents filtered on the server (label, state,
//! text), and the counts by state above it: what the dashboard's fleet
//! page shows. The store is read a page at a time and only the agents
//! shown get their deliveries read, so a page costs one store page per
//! thousand agents scanned, whatever the fleet's size.

use crate::agents::AgentView;
use crate::app::{App, AppResult};
use crate::caller::Caller;
use baton_model::AgentRow;
use baton_store::{AgentFilter, MAX_PAGE, page};

/// An agent's state, as the fleet page filters and counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FleetState {
    /// A stream is open (here or on another replica).
    Connected,
    /// No stream.
    Offline,
    /// Its clock is not locked (no report, syncing, holdover,
    /// free-running).
    ClockNotLocked,
}

impl FleetState {
    /// The word in URLs and on the page.
    pub fn as_str(self) -> &'static str {
        match self {
            FleetState::Connected => "connected",
            FleetState::Offline => "offline",
            FleetState::ClockNotLocked => "clock-not-locked",
        }
    }

    /// From [`FleetState::as_str`].
    pub fn parse(s: &str) -> Option<FleetState> {
        [
            FleetState::Connected,
            FleetState::Offline,
            FleetState::ClockNotLocked,
        ]
        .into_iter()
        .find(|f| f.as_str() == s)
    }
}

/// What the fleet page asks for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FleetFilter {
    /// `key=value` (as the caller's tenant's packs see the labels), or
    /// just `key` (any value).
    pub label: Option<(String, Option<String>)>,
    /// Only agents in this state.
    pub state: Option<FleetState>,
    /// Part of the id or of a label value.
    pub text: Option<String>,
}

/// Agents by state (of those the caller sees).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FleetCounts {
    /// All of them.
    pub total: u64,
    /// With a stream open.
    pub connected: u64,
    /// Without.
    pub offline: u64,
    /// Clock not locked.
    pub clock_not_locked: u64,
}

/// One page of the filtered fleet.
#[derive(Clone, Debug, PartialEq)]
pub struct FleetPage {
    /// By id.
    pub agents: Vec<AgentView>,
    /// The id to continue after, when there may be more.
    pub next: Option<String>,
}

impl App {
    fn connected_now(&self, a: &AgentRow) -> bool {
        self.hub.is_connected(&a.id) || (self.replica().is_some() && a.connected)
    }

    fn fleet_matches(&self, caller: &Caller, a: &AgentRow, f: &FleetFilter) -> bool {
        let tenant = caller.tenant().unwrap_or("default");
        let labels = a.labels_for(tenant);
        if let Some((k, v)) = &f.label {
            match (labels.get(k), v) {
                (None, _) => return false,
                (Some(have), Some(want)) if have != want => return false,
                _ => {}
            }
        }
        if let Some(s) = f.state {
            let ok = match s {
                FleetState::Connected => self.connected_now(a),
                FleetState::Offline => !self.connected_now(a),
                FleetState::ClockNotLocked => !clock_locked(a),
            };
            if !ok {
                return false;
            }
        }
        if let Some(t) = &f.text {
            let t = t.to_lowercase();
            if !a.id.to_lowercase().contains(&t)
                && !labels.values().any(|v| v.to_lowercase().contains(&t))
            {
                return false;
            }
        }
        true
    }

    /// One page of the agents the caller sees that match `filter`, after
    /// `after`: the store is scanned a page at a time until `limit` match
    /// (or it ends).
    pub async fn fleet(
        &self,
        caller: &Caller,
        filter: &FleetFilter,
        after: Option<String>,
        limit: u32,
    ) -> AppResult<FleetPage> {
        let limit = page(limit, MAX_PAGE) as usize;
        let mut picked = Vec::with_capacity(limit);
        let mut more = false;
        self.scan_agents(caller, after, |a| {
            if !self.fleet_matches(caller, a, filter) {
                return true;
            }
            if picked.len() == limit {
                more = true;
                return false;
            }
            picked.push(a.clone());
            true
        })
        .await?;
        let next = more.then(|| picked.last().map(|a| a.id.clone())).flatten();
        let mut agents = Vec::with_capacity(picked.len());
        for a in picked {
            agents.push(self.view(caller, a).await?);
        }
        Ok(FleetPage { agents, next })
    }

    /// The caller's fleet counted by state: one pass over the store's
    /// agent pages (the dashboard keeps the answer a few seconds).
    pub async fn fleet_counts(&self, caller: &Caller) -> AppResult<FleetCounts> {
        let mut c = FleetCounts::default();
        self.scan_agents(caller, None, |a| {
            c.total += 1;
            if self.connected_now(a) {
                c.connected += 1;
            } else {
                c.offline += 1;
            }
            if !clock_locked(a) {
                c.clock_not_locked += 1;
            }
            true
        })
        .await?;
        Ok(c)
    }

    /// The caller's agents after `after`, by id, a store page at a time,
    /// each given to `each` until it says stop (`false`) or they end.
    async fn scan_agents(
        &self,
        caller: &Caller,
        after: Option<String>,
        mut each: impl FnMut(&AgentRow) -> bool,
    ) -> AppResult<()> {
        let mut cursor = after;
        loop {
            let rows = self
                .store
                .agents(AgentFilter {
                    tenant: caller.tenant().map(str::to_string),
                    after_id: cursor,
                    limit: MAX_PAGE,
                })
                .await?;
            let full = rows.len() == MAX_PAGE as usize;
            cursor = rows.last().map(|a| a.id.clone());
            for a in &rows {
                if !each(a) {
                    return Ok(());
                }
            }
            if !full {
                return Ok(());
            }
        }
    }
}

fn clock_locked(a: &AgentRow) -> bool {
    a.clock.as_ref().is_some_and(|c| c.state == "locked")
}
