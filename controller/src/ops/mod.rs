//! Operator subcommands that talk to a running controller: `push`,
//! `cancel`, `packs`, `agents`, `watch`, `feedback`. Readable tables by
//! default; `--json` prints one object per line.
//!
//! Plaintext is spelled `--insecure` from the start so scripts keep
//! working when TLS becomes the default.

mod format;
mod push;
mod query;

use std::time::Duration;

use baton_proto::wire::admin_client::AdminClient;
use tonic::transport::{Channel, Endpoint};

pub use push::{PushOpts, push};
pub use query::{agents, cancel, feedback, packs, watch};

use crate::server::MAX_MESSAGE_BYTES;

/// Default controller address for operators and agents.
pub const DEFAULT_URL: &str = "http://127.0.0.1:7411";

/// Where the controller is and how to reach it.
#[derive(Clone, Debug)]
pub struct Conn {
    /// `http://HOST:PORT`.
    pub url: String,
    /// Plaintext allowed.
    pub insecure: bool,
}

/// A failure of an operator command: message, exit code.
#[derive(Debug)]
pub struct OpError {
    /// What went wrong, for stderr.
    pub message: String,
    /// Exit code (1: refused / failed, 2: usage, 3: still pending).
    pub code: u8,
}

impl OpError {
    /// Code 1.
    pub fn fail(message: impl Into<String>) -> OpError {
        OpError {
            message: message.into(),
            code: 1,
        }
    }

    /// Code 2: the command line is wrong.
    pub fn usage(message: impl Into<String>) -> OpError {
        OpError {
            message: message.into(),
            code: 2,
        }
    }
}

impl From<tonic::Status> for OpError {
    fn from(s: tonic::Status) -> OpError {
        OpError::fail(describe_status(&s))
    }
}

/// A status as an operator reads it.
pub fn describe_status(s: &tonic::Status) -> String {
    match s.code() {
        tonic::Code::Unavailable => format!("controller unavailable: {}", s.message()),
        tonic::Code::InvalidArgument => s.message().to_string(),
        _ => format!("{:?}: {}", s.code(), s.message()),
    }
}

/// Check that the URL may be used: plaintext only with `--insecure`
/// (TLS arrives with the security work).
pub fn endpoint(conn: &Conn) -> Result<Endpoint, OpError> {
    if let Some(rest) = conn.url.strip_prefix("https://") {
        return Err(OpError::usage(format!(
            "https://{rest}: TLS is not available yet; use http:// with --insecure"
        )));
    }
    if !conn.url.starts_with("http://") {
        return Err(OpError::usage(format!(
            "--controller {}: expected http://HOST:PORT",
            conn.url
        )));
    }
    if !conn.insecure {
        return Err(OpError::usage(format!(
            "{} is plaintext: pass --insecure (TLS arrives with the security work)",
            conn.url
        )));
    }
    Endpoint::from_shared(conn.url.clone())
        .map(|e| {
            e.connect_timeout(Duration::from_secs(5))
                .tcp_nodelay(true)
                .http2_keep_alive_interval(Duration::from_secs(10))
                .keep_alive_timeout(Duration::from_secs(10))
        })
        .map_err(|e| OpError::usage(format!("--controller {}: {e}", conn.url)))
}

/// An Admin client.
pub async fn client(conn: &Conn) -> Result<AdminClient<Channel>, OpError> {
    let ch = endpoint(conn)?
        .connect()
        .await
        .map_err(|e| OpError::fail(format!("cannot reach the controller at {}: {e}", conn.url)))?;
    Ok(AdminClient::new(ch)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES))
}
