//! The box's side of agent updates (issue 39): a signed release's binary
//! downloaded in chunks and checked against its manifest ([`download`]),
//! asked for one piece at a time at a configured rate ([`fetch`]),
//! kept beside the running one in a versions directory ([`versions`]), and
//! which binary each start runs — the trial of a new version, its
//! confirmation once healthy, the rollback when it is not ([`boot`]).
//!
//! No network and no process control here: the agent's link brings the
//! chunks, the launcher (`baton-agent launch`) acts on [`boot`]'s decision.

#![forbid(unsafe_code)]

pub mod boot;
pub mod download;
pub mod fetch;
pub mod files;
pub mod versions;

pub use boot::{BootState, Launch, RolledBack, Trial};
pub use download::{Download, DownloadError};
pub use fetch::{Fetch, Request};
pub use versions::{Partial, UpdateError, Versions};
