//! What the controller asks its store for and hands it, apart from the
//! records themselves: an agent's hello, an answer to a push, the filters
//! and page sizes of list queries.

use crate::identity::DEFAULT_TENANT;
use crate::records::{AgentRow, Answer, Binding, FeedbackRow, HeldPackRow, PackKey};
use crate::time::RefTime;

/// Most rows one page of a list query returns, whatever is asked: a
/// request can never make the store (or the controller) hold more.
pub const MAX_PAGE: u32 = 1000;

/// An agent's hello, as the store records it.
#[derive(Clone, Debug, PartialEq)]
pub struct HelloRow {
    /// Agent id.
    pub id: String,
    /// Its own labels.
    pub labels: std::collections::BTreeMap<String, String>,
    /// Agent software version.
    pub agent_version: String,
    /// Its journal's id.
    pub journal_id: String,
    /// The tenants its certificate names (`None`: no certificate, leave
    /// what is stored).
    pub cert_tenants: Option<Vec<String>>,
    /// The packs it says it holds (already filtered to its tenants).
    pub held: Vec<HeldPackRow>,
    /// The highest session generation the agent has journalled: its new
    /// generation is above both this and the stored one.
    pub session_gen_seen: u64,
    /// What it checks packs against (`None`: it did not say).
    pub trust: Option<crate::TrustRow>,
    /// Its architecture (empty: it did not say).
    pub arch: String,
    /// Its last update when it was rolled back, as its hello says
    /// (`None`: leave what is stored).
    pub update: Option<crate::UpdateRow>,
    /// When.
    pub at: RefTime,
}

/// An agent's answer to the push of a version.
#[derive(Clone, Debug, PartialEq)]
pub struct AnswerRow {
    /// Agent.
    pub agent_id: String,
    /// Pack.
    pub key: PackKey,
    /// The version it answers about.
    pub version: u64,
    /// What it said.
    pub answer: Answer,
    /// Times the version was sent to it.
    pub attempts: u32,
    /// The generation of the stream that heard it (see
    /// `Store::agent_hello`).
    pub session_gen: u64,
    /// When.
    pub at: RefTime,
}

/// Which stored feedback to read, one page at a time. Rows come in storage
/// order (which for one agent is its sequence order).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FeedbackFilter {
    /// Only this tenant.
    pub tenant: Option<String>,
    /// Only this pack.
    pub pack: Option<String>,
    /// Only this agent.
    pub agent_id: Option<String>,
    /// Stored at or after.
    pub since: Option<RefTime>,
    /// Only rows stored after this one (its [`FeedbackRow::id`]): the
    /// next page.
    pub after_id: u64,
    /// At most this many (capped at [`MAX_PAGE`]).
    pub limit: u32,
}

/// Which agents to list, one page at a time, by id: the CLI's `agents`
/// (a tenant, a page) and the dashboard's fleet (also a label, a state, a
/// piece of text). Every condition is the store's to evaluate, with its
/// indexes, so a filter that matches a handful of agents in a large fleet
/// costs a handful of rows, not a scan of every page in the application.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AgentFilter {
    /// Only agents serving this tenant (see [`Binding`]; with
    /// [`Binding::Open`], every agent). Also whose operator labels the
    /// label and text conditions read ([`AgentFilter::labels_of`]).
    pub tenant: Option<String>,
    /// Only agents whose labels, as the tenant's packs see them, match.
    pub label: Option<LabelMatch>,
    /// Only agents in this state.
    pub state: Option<FleetState>,
    /// Only agents with this text in their id or in one of their label
    /// values (as the tenant sees them), ASCII letters in either case. An
    /// empty text matches every agent.
    pub text: Option<String>,
    /// Only ids after this one: the next page.
    pub after_id: Option<String>,
    /// At most this many (capped at [`MAX_PAGE`]).
    pub limit: u32,
}

/// A label condition: `key=value`, or `key` with any value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabelMatch {
    /// The label's key.
    pub key: String,
    /// Its value (`None`: any).
    pub value: Option<String>,
}

/// An agent's state, as the fleet page filters and counts it. All three
/// are what the store holds, so every replica answers alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FleetState {
    /// A stream is open, on this controller or another replica: the
    /// agent's stored `connected` (set by its hello, cleared when its
    /// stream ends, when its replica's lease runs out or at a single
    /// controller's start).
    Connected,
    /// No stream.
    Offline,
    /// Its clock is not locked (no report, syncing, holdover,
    /// free-running), by its latest stored report, or it is offline (its
    /// last report says nothing of its clock now).
    ClockNotLocked,
    /// Needs a look: its clock is not locked or it is offline (as
    /// [`FleetState::ClockNotLocked`]), its stream measured an outbox
    /// that only grows or a late firing ([`crate::StreamHealth`]), or it
    /// refused a delivery (of the filter's tenant).
    Unhealthy,
}

impl FleetState {
    /// The word in URLs and on the page.
    pub fn as_str(self) -> &'static str {
        match self {
            FleetState::Connected => "connected",
            FleetState::Offline => "offline",
            FleetState::ClockNotLocked => "clock-not-locked",
            FleetState::Unhealthy => "unhealthy",
        }
    }

    /// From [`FleetState::as_str`].
    pub fn parse(s: &str) -> Option<FleetState> {
        [
            FleetState::Connected,
            FleetState::Offline,
            FleetState::ClockNotLocked,
            FleetState::Unhealthy,
        ]
        .into_iter()
        .find(|f| f.as_str() == s)
    }
}

/// Agents by state, of those a filter's tenant sees (and its label and
/// text match): what the fleet page shows above its table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FleetCounts {
    /// All of them.
    pub total: u64,
    /// With a stream open.
    pub connected: u64,
    /// Without.
    pub offline: u64,
    /// Clock not locked, or offline ([`FleetState::ClockNotLocked`]).
    pub clock_not_locked: u64,
}

impl AgentFilter {
    /// Whose operator labels the label and text conditions read: the
    /// filter's tenant, or [`DEFAULT_TENANT`] for a caller of every
    /// tenant (the tenant its requests name by default).
    pub fn labels_of(&self) -> &str {
        self.tenant.as_deref().unwrap_or(DEFAULT_TENANT)
    }

    /// Whether `agent` passes every condition but paging (`after_id`,
    /// `limit`): the rule written out plainly, for a store without indexes
    /// (the memory store). `refused`: the agent refused a delivery of the
    /// filter's tenant (of any, without one).
    pub fn matches(&self, agent: &AgentRow, binding: Binding, refused: bool) -> bool {
        if let Some(t) = &self.tenant
            && !agent.serves(t, binding)
        {
            return false;
        }
        let labels = agent.labels_for(self.labels_of());
        if let Some(m) = &self.label {
            match (labels.get(&m.key), &m.value) {
                (None, _) => return false,
                (Some(have), Some(want)) if have != want => return false,
                _ => {}
            }
        }
        if let Some(s) = self.state {
            let ok = match s {
                FleetState::Connected => agent.connected,
                FleetState::Offline => !agent.connected,
                FleetState::ClockNotLocked => !clock_locked(agent),
                FleetState::Unhealthy => {
                    !clock_locked(agent) || agent.health.needs_a_look() || refused
                }
            };
            if !ok {
                return false;
            }
        }
        if let Some(t) = &self.text
            && !contains_text(&agent.id, t)
            && !labels.values().any(|v| contains_text(v, t))
        {
            return false;
        }
        true
    }
}

/// A clock report more than this older than the agent's last-seen mark
/// is stale: a connected agent reports every few seconds, so one whose
/// reports stopped says nothing of its clock now.
pub const CLOCK_STALE_NS: i64 = 30_000_000_000;

/// Whether the agent is connected and its latest clock report, not stale
/// ([`CLOCK_STALE_NS`] before it was last seen), says `locked`: an
/// offline agent's last report says nothing of its clock now, and
/// counting it as locked would hide the agent that went away.
pub fn clock_locked(agent: &AgentRow) -> bool {
    agent.connected
        && agent.clock.as_ref().is_some_and(|c| {
            c.state == "locked"
                && c.at.as_nanos() >= agent.last_seen.as_nanos().saturating_sub(CLOCK_STALE_NS)
        })
}

/// Whether `hay` contains `needle`, ASCII letters in either case (what
/// SQL's `LOWER(..) LIKE` does on SQLite, and on PostgreSQL whose
/// character type is `C`; there other letters compare as they are, and a
/// database of another character type may fold them too).
pub fn contains_text(hay: &str, needle: &str) -> bool {
    hay.to_ascii_lowercase()
        .contains(&needle.to_ascii_lowercase())
}

/// A page size within bounds: 0 (unset) and anything over `max` mean
/// `max`.
pub fn page(limit: u32, max: u32) -> u32 {
    if limit == 0 || limit > max {
        max
    } else {
        limit
    }
}

/// Where a follower is in a table that writers append to in parallel
/// (events, feedback): after the row stamped `(txid, id)`. Rows are read in
/// that order and only once every transaction that could still add a row
/// before them has ended, so a row committed late is never skipped and
/// none is read twice. A backend whose writes commit in id order (one
/// writer) keeps `txid` at 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Mark {
    /// The writing transaction's id (0 where ids are in commit order).
    pub txid: u64,
    /// The row's id.
    pub id: u64,
}

/// The feedback a follower reads: every row, or one pack's received
/// since an instant (a rollout stage's window, tallied as it is stored:
/// paging such a window by id alone would pass a row a parallel writer
/// committed after a higher id, and the stage's gates would never count
/// it).
#[derive(Clone, Copy, Debug, Default)]
pub enum FeedbackScope<'a> {
    /// Every row.
    #[default]
    All,
    /// One pack's rows received at or after `since`.
    Pack {
        /// The pack.
        key: &'a PackKey,
        /// The window's start.
        since: RefTime,
    },
}

impl FeedbackScope<'_> {
    /// Whether `row` is among the rows followed.
    pub fn takes(&self, row: &FeedbackRow) -> bool {
        match self {
            FeedbackScope::All => true,
            FeedbackScope::Pack { key, since } => {
                row.tenant == key.tenant && row.pack == key.pack && row.received >= *since
            }
        }
    }
}

/// A dashboard session as the store keeps it, so that every replica
/// behind one address knows it: made on one, valid on all, ended on all
/// by a log-out or a revocation of its certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionRow {
    /// SHA-256 of the cookie's value, lowercase hex: never the value
    /// itself, so whoever reads the database cannot replay a cookie.
    pub id_hash: String,
    /// Who logged in (an operator).
    pub who: crate::identity::Identity,
    /// Its certificate's serial: a revocation of it ends the session.
    pub serial: String,
    /// The session's CSRF token (synchroniser token).
    pub csrf: String,
    /// When it was made (the oldest of a certificate's go first).
    pub created: RefTime,
    /// When it ends.
    pub expires: RefTime,
}

/// What became of a new session ([`SessionRow`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionOpened {
    /// Stored.
    Opened,
    /// Its certificate is recorded as revoked (on another replica, just
    /// now): nothing stored.
    Revoked,
    /// As many sessions are open as the store may keep, none of them
    /// expired: nothing stored.
    Full,
}
