//! The control thread's link state: the link thread's handle, the
//! session's rules (`baton_control::Session`), the messages waiting for
//! room in the link's channel, and the staged versions. The loop's side of
//! the link (`uplink`) works on it.

use std::collections::VecDeque;

use baton_control::Session;
use baton_control::staging::Staging;
use baton_proto::pack::Pack;
use baton_proto::wire;
use baton_sched::PackKey;

use crate::link::{Link, Outgoing, SendError, ToLink};

/// The agent's part of a version kept aside.
#[derive(Debug)]
pub(super) struct StagedBody {
    /// Its source, as pushed.
    pub(super) yaml: String,
    /// Checked.
    pub(super) pack: Pack,
    /// As the controller named it.
    pub(super) wire_ref: wire::PackRef,
}

/// Staged versions by pack (`baton_control::staging`'s rules).
pub(super) type StagedPacks = Staging<StagedBody>;

/// The control thread's link state.
#[derive(Debug)]
pub(super) struct Uplink {
    pub(super) link: Link,
    /// The session's rules and state (sans IO).
    pub(super) session: Session,
    /// Messages the link's channel had no room for, in order.
    pub(super) pending: VecDeque<Outgoing>,
    /// The last step left link events waiting: step again at once.
    pub(super) backlog: bool,
    /// The link thread is gone (logged once).
    pub(super) closed: bool,
    /// Versions staged for a switch at an instant (`activate: together`).
    pub(super) staged: StagedPacks,
    /// The box's trust as the current session was last told it (its
    /// Hello, then each change).
    pub(super) trust_told: Option<super::trust::TrustStatus>,
}

impl Uplink {
    /// Queue `msg` for `session`, behind what waits already.
    pub(super) fn queue(&mut self, session: u64, msg: ToLink) {
        self.pending.push_back(Outgoing { session, msg });
    }

    /// Hand queued messages to the link, in order, as far as it has room.
    pub(super) fn flush(&mut self) {
        while let Some(o) = self.pending.pop_front() {
            match self.link.try_send(o) {
                Ok(()) => {}
                Err(SendError::Full(o)) => {
                    self.pending.push_front(o);
                    break;
                }
                Err(SendError::Closed(_)) => {
                    if !self.closed {
                        tracing::error!(
                            "the controller link thread ended: running without a controller (leases will run out)"
                        );
                        self.closed = true;
                    }
                    self.pending.clear();
                    break;
                }
            }
        }
    }

    /// The version staged for `key`, if any.
    pub(super) fn staged_version(&self, key: &PackKey) -> Option<u64> {
        self.staged.version(key)
    }
}
