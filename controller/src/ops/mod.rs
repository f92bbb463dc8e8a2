//! Operator subcommands that talk to a running controller: `push`,
//! `cancel`, `packs`, `agents` (and `agents label`, `agents forget`),
//! `watch`, `feedback`, `audit`. Readable tables by
//! default; `--json` prints one object per line.
//!
//! The controller is reached over mTLS (`https://`, with `--cert`,
//! `--key`, `--ca`, or `BATON_CERT`, `BATON_KEY`, `BATON_CA`, or a
//! [`profile`]), or in plaintext (`http://`) only with `--insecure`.

mod format;
pub mod profile;
mod push;
mod query;

use std::time::Duration;

use baton_proto::wire::admin_client::AdminClient;
use std::path::PathBuf;

use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

pub use push::{PushOpts, push};
pub use query::{
    LabelChange, agents, audit, cancel, clock, feedback, forget_agent, grant_agent, label_agent,
    packs, watch,
};

use baton_proto::wire::{MAX_MESSAGE_BYTES, error_chain};

/// Default controller address for operators and agents.
pub const DEFAULT_URL: &str = "http://127.0.0.1:7411";

/// Where the controller is and how to reach it.
#[derive(Clone, Debug)]
pub struct Conn {
    /// `http://HOST:PORT`.
    pub url: String,
    /// Plaintext allowed (toward loopback).
    pub insecure: bool,
    /// Plaintext allowed toward any address.
    pub insecure_any: bool,
    /// The operator's certificate, key and the fleet's CA (for `https://`).
    pub tls: ClientTls,
}

/// PEM files of a TLS client (each may be missing; `https://` needs all).
#[derive(Clone, Debug, Default)]
pub struct ClientTls {
    /// This client's certificate.
    pub cert: Option<PathBuf>,
    /// Its private key.
    pub key: Option<PathBuf>,
    /// The CA that signed the controller's certificate.
    pub ca: Option<PathBuf>,
}

impl ClientTls {
    /// tonic's configuration from the three files (read now).
    pub fn config(&self) -> Result<ClientTlsConfig, OpError> {
        let (Some(cert), Some(key), Some(ca)) = (&self.cert, &self.key, &self.ca) else {
            return Err(OpError::usage(
                "https:// needs --cert, --key and --ca (or BATON_CERT, BATON_KEY, BATON_CA)",
            ));
        };
        let read = |p: &PathBuf| {
            std::fs::read(p).map_err(|e| OpError::fail(format!("{}: {e}", p.display())))
        };
        Ok(ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(read(ca)?))
            .identity(Identity::from_pem(read(cert)?, read(key)?)))
    }
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

/// Check that the URL may be used: `https://` with the client's
/// certificate, plaintext only with `--insecure`.
pub fn endpoint(conn: &Conn) -> Result<Endpoint, OpError> {
    let tls = if conn.url.starts_with("https://") {
        Some(conn.tls.config()?)
    } else if conn.url.starts_with("http://") {
        if !conn.insecure {
            return Err(OpError::usage(format!(
                "{} is plaintext: use https:// with --cert, --key and --ca, or pass --insecure",
                conn.url
            )));
        }
        let host = conn
            .url
            .parse::<tonic::transport::Uri>()
            .ok()
            .and_then(|u| u.host().map(str::to_string))
            .unwrap_or_default();
        if !conn.insecure_any && !baton_proto::wire::is_loopback_host(&host) {
            return Err(OpError::usage(format!(
                "{}: plaintext toward a non-loopback controller would send this operator's actions in the clear; use https:// with --cert, --key and --ca, or add --insecure-any on a network you trust",
                conn.url
            )));
        }
        None
    } else {
        return Err(OpError::usage(format!(
            "--controller {}: expected https://HOST:PORT (or http:// with --insecure)",
            conn.url
        )));
    };
    let e = Endpoint::from_shared(conn.url.clone())
        .map_err(|e| OpError::usage(format!("--controller {}: {e}", conn.url)))?;
    let e = match tls {
        Some(t) => e
            .tls_config(t)
            .map_err(|e| OpError::usage(format!("--controller {}: TLS: {e}", conn.url)))?,
        None => e,
    };
    Ok(e.connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(10)))
}

/// An Admin client.
pub async fn client(conn: &Conn) -> Result<AdminClient<Channel>, OpError> {
    let ch = endpoint(conn)?.connect().await.map_err(|e| {
        OpError::fail(format!(
            "cannot reach the controller at {}: {}",
            conn.url,
            error_chain(&e)
        ))
    })?;
    Ok(AdminClient::new(ch)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES))
}
