//! Why a stream ended: what the log says and what the agent is told.

use tonic::Status;

use crate::convert::BadMessage;
use baton_app::link;

/// Why a stream ended (for the log and the agent): the transport's
/// reasons here, the protocol's in [`link::End`].
#[derive(Debug)]
pub(super) enum End {
    /// The agent closed it.
    Closed,
    /// A transport error (reset, keep-alive timeout).
    Transport(Status),
    /// The controller is stopping.
    Shutdown,
    /// The agent stopped reading.
    Stuck,
    /// Not allowed (a Hello for another identity than the certificate's).
    Denied(String),
    /// The stream's certificate was revoked.
    Revoked(String),
    /// The session ended it.
    Link(link::End),
}

impl End {
    /// The agent sent something invalid.
    pub(super) fn bad(m: impl Into<String>) -> End {
        End::Link(link::End::Bad(m.into()))
    }

    pub(super) fn status(&self) -> Option<Status> {
        Some(match self {
            End::Closed => return None,
            // A message that could not be decoded (too large, garbage) is
            // the peer's to know about; on a dead connection this is moot.
            End::Transport(s) => s.clone(),
            End::Shutdown => Status::unavailable("controller shutting down"),
            End::Stuck => Status::unavailable("agent not reading its stream"),
            End::Denied(m) => Status::permission_denied(m.clone()),
            End::Revoked(serial) => {
                Status::permission_denied(format!("certificate {serial} is revoked"))
            }
            End::Link(e) => match e {
                link::End::Bad(m) => Status::invalid_argument(m.clone()),
                link::End::Dead(d) => Status::unavailable(format!("nothing received for {d:?}")),
                link::End::Replaced => {
                    Status::aborted("a newer stream for the same agent replaced this one")
                }
                link::End::Unavailable(e) => Status::unavailable(format!("controller store: {e}")),
                link::End::Forgotten => {
                    Status::aborted("an admin made the controller forget this agent")
                }
                link::End::Duplicate(m) => Status::already_exists(m.clone()),
                link::End::Fenced(m) => Status::aborted(m.clone()),
            },
        })
    }

    pub(super) fn describe(&self) -> String {
        match self {
            End::Closed => "closed by the agent".into(),
            End::Transport(s) => format!("transport: {}", s.message()),
            End::Shutdown => "controller shutting down".into(),
            End::Stuck => "agent not reading".into(),
            End::Denied(m) => format!("refused: {m}"),
            End::Revoked(serial) => format!("certificate {serial} revoked"),
            End::Link(e) => e.to_string(),
        }
    }
}

impl From<BadMessage> for End {
    fn from(e: BadMessage) -> End {
        End::bad(e.0)
    }
}
