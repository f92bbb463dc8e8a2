//! Operator subcommands that talk to a running controller: `push`,
//! `cancel`, `packs`, `agents` (and `agents label`, `agents forget`),
//! `watch`, `feedback`, `audit`, `release`, `agent-update`. Readable tables by
//! default; `--json` prints one object per line.
//!
//! The controller is reached over mTLS (`https://`, with `--cert`,
//! `--key`, `--ca`, or `BATON_CERT`, `BATON_KEY`, `BATON_CA`, or a
//! [`profile`]), or in plaintext (`http://`) only with `--insecure`. The
//! TLS files are checked before dialling and a failed handshake is
//! explained ([`dial`]).

mod conn;
pub mod dial;
mod error;
pub mod format;
pub mod profile;
mod push;
mod query;
mod release;
mod rollout;
mod watch;

pub use conn::{ClientTls, Conn, DEFAULT_URL, Transport, client, describe_status, transport};
pub use error::OpError;
pub use push::{PushOpts, push};
pub use query::{
    LabelChange, agents, audit, cancel, clock, feedback, forget_agent, grant_agent, label_agent,
    packs,
};
pub use release::{UpdateOp, agent_update, phase_word, releases, update_text, upload_release};
pub use rollout::{RolloutOp, rollout};
pub use watch::watch;
