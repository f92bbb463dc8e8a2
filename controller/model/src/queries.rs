//! What the controller asks its store for and hands it, apart from the
//! records themselves: an agent's hello, an answer to a push, the filters
//! and page sizes of list queries.

use crate::records::{Answer, HeldPackRow, PackKey};

#[cfg(doc)]
use crate::records::{Binding, FeedbackRow};
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

/// Which agents to list, one page at a time, by id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AgentFilter {
    /// Only agents serving this tenant (see [`Binding`]; with
    /// [`Binding::Open`], every agent).
    pub tenant: Option<String>,
    /// Only ids after this one: the next page.
    pub after_id: Option<String>,
    /// At most this many (capped at [`MAX_PAGE`]).
    pub limit: u32,
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
