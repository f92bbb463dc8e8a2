//! Why a stream ended: what the log says and what the agent is told.

use std::time::Duration;

use tonic::Status;

use crate::server::convert::BadMessage;
use crate::store::StoreError;

/// Why a stream ended (for the log and the agent).
pub(super) enum End {
    /// The agent closed it.
    Closed,
    /// A transport error (reset, keep-alive timeout).
    Transport(Status),
    /// The agent sent something invalid.
    Bad(String),
    /// Silent for too long.
    Dead(Duration),
    /// A newer stream for the same agent.
    Replaced,
    /// The store failed: the agent will re-send.
    Store(StoreError),
    /// The controller is stopping.
    Shutdown,
    /// The agent stopped reading.
    Stuck,
    /// Not allowed (a Hello for another identity than the certificate's).
    Denied(String),
    /// The stream's certificate was revoked.
    Revoked(String),
    /// An admin forgot the agent.
    Forgotten,
    /// Another machine's stream holds the id.
    Duplicate(String),
    /// A later stream of the agent (on this replica or another) owns it
    /// now: this one may write nothing more for it.
    Fenced(String),
}

impl End {
    pub(super) fn status(&self) -> Option<Status> {
        Some(match self {
            End::Closed => return None,
            // A message that could not be decoded (too large, garbage) is
            // the peer's to know about; on a dead connection this is moot.
            End::Transport(s) => s.clone(),
            End::Bad(m) => Status::invalid_argument(m.clone()),
            End::Dead(d) => Status::unavailable(format!("nothing received for {d:?}")),
            End::Replaced => Status::aborted("a newer stream for the same agent replaced this one"),
            End::Store(e) => Status::unavailable(format!("controller store: {e}")),
            End::Shutdown => Status::unavailable("controller shutting down"),
            End::Stuck => Status::unavailable("agent not reading its stream"),
            End::Denied(m) => Status::permission_denied(m.clone()),
            End::Revoked(serial) => {
                Status::permission_denied(format!("certificate {serial} is revoked"))
            }
            End::Forgotten => Status::aborted("an admin made the controller forget this agent"),
            End::Duplicate(m) => Status::already_exists(m.clone()),
            End::Fenced(m) => Status::aborted(m.clone()),
        })
    }

    pub(super) fn describe(&self) -> String {
        match self {
            End::Closed => "closed by the agent".into(),
            End::Transport(s) => format!("transport: {}", s.message()),
            End::Bad(m) => format!("invalid message: {m}"),
            End::Dead(d) => format!("silent for {d:?}"),
            End::Replaced => "replaced by a newer stream".into(),
            End::Store(e) => format!("store: {e}"),
            End::Shutdown => "controller shutting down".into(),
            End::Stuck => "agent not reading".into(),
            End::Denied(m) => format!("refused: {m}"),
            End::Revoked(serial) => format!("certificate {serial} revoked"),
            End::Forgotten => "forgotten by an admin".into(),
            End::Duplicate(m) => format!("refused: {m}"),
            End::Fenced(m) => format!("fenced: {m}"),
        }
    }
}

impl From<BadMessage> for End {
    fn from(e: BadMessage) -> End {
        End::Bad(e.0)
    }
}

impl From<StoreError> for End {
    fn from(e: StoreError) -> End {
        match e {
            StoreError::Fenced { .. } => End::Fenced(e.to_string()),
            StoreError::IdInUse { .. } => End::Duplicate(e.to_string()),
            e => End::Store(e),
        }
    }
}
