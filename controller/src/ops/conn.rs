//! How an operator command reaches a controller: its address and TLS
//! files, the transport they make, the Admin client; a failed call in the
//! words an operator reads.

use std::path::PathBuf;

use baton_link_client::plaintext::{NOT_LOOPBACK, NOT_LOOPBACK_REMEDY, url_host};
use baton_link_client::{
    EndpointPolicy, Plaintext, PlaintextRefused, TlsFiles, admin_client, check_plaintext,
};
use baton_proto::wire::admin_client::AdminClient;

use tonic::transport::{Channel, Endpoint};

use baton_proto::wire::error_chain;

use super::dial;
use super::error::OpError;

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
    /// The three files an `https://` controller needs, as the link client
    /// names them; a missing one is a usage error naming the flags.
    pub fn files(&self) -> Result<TlsFiles, OpError> {
        let (Some(cert), Some(key), Some(ca)) = (&self.cert, &self.key, &self.ca) else {
            return Err(OpError::usage(
                "https:// needs --cert, --key and --ca (or BATON_CERT, BATON_KEY, BATON_CA)",
            ));
        };
        Ok(TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            ca: ca.clone(),
        })
    }
}

impl From<tonic::Status> for OpError {
    fn from(s: tonic::Status) -> OpError {
        OpError::fail(describe_status(&s))
    }
}

/// A status as an operator reads it: a failed dial's own explanation when
/// the status carries one (a reconnection that failed mid-command).
pub fn describe_status(s: &tonic::Status) -> String {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(s);
    while let Some(e) = cur {
        if let Some(d) = e.downcast_ref::<dial::DialError>() {
            return d.to_string();
        }
        cur = e.source();
    }
    match s.code() {
        tonic::Code::Unavailable => format!("controller unavailable: {}", s.message()),
        tonic::Code::InvalidArgument => s.message().to_string(),
        // A refusal of the connection (over the controller's limit), or of
        // the call: the controller's words.
        tonic::Code::ResourceExhausted => format!("refused: {}", s.message()),
        tonic::Code::Internal if s.message().contains("h2 protocol error") => format!(
            "{:?}: {} (an HTTP/2 protocol error on a plaintext http:// connection usually means the port speaks TLS: dial https:// with --cert, --key and --ca)",
            s.code(),
            s.message()
        ),
        _ => format!("{:?}: {}", s.code(), s.message()),
    }
}

/// How a command reaches the controller.
#[derive(Debug)]
pub enum Transport {
    /// `http://` (with `--insecure`): tonic's own connector.
    Plain(Endpoint),
    /// `https://`: the files checked, dialled by [`dial::Dialer`].
    Tls(Endpoint, dial::Dialer),
}

/// Check that the URL may be used (`https://` with the client's
/// certificate, read and checked now; plaintext only with `--insecure`)
/// and how it is dialled.
pub fn transport(conn: &Conn) -> Result<Transport, OpError> {
    let plain = if conn.url.starts_with("https://") {
        false
    } else if conn.url.starts_with("http://") {
        check_plain(conn)?;
        true
    } else {
        return Err(OpError::usage(format!(
            "--controller {}: expected https://HOST:PORT (or http:// with --insecure)",
            conn.url
        )));
    };
    let policy = EndpointPolicy::OPERATOR;
    if plain {
        let e = Endpoint::from_shared(conn.url.clone())
            .map_err(|e| OpError::usage(format!("--controller {}: {e}", conn.url)))?;
        return Ok(Transport::Plain(policy.with_connect_timeout(e)));
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let files = dial::Files::read(&conn.tls.files()?, now)?;
    let dialer = dial::Dialer::new(&conn.url, &files)?;
    // tonic would dial TLS itself for an https:// URI; the dialer does
    // (each of its steps has its own timeout), and requests still say
    // `https` and the controller's authority.
    let origin: tonic::transport::Uri = conn
        .url
        .parse()
        .map_err(|e| OpError::usage(format!("--controller {}: {e}", conn.url)))?;
    let authority = origin
        .authority()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let e = Endpoint::from_shared(format!("http://{authority}"))
        .map_err(|e| OpError::usage(format!("--controller {}: {e}", conn.url)))?
        .origin(origin);
    // The dialer times each of its steps itself: no connect timeout here.
    Ok(Transport::Tls(policy.tune(e), dialer))
}

/// The shared plaintext rule ([`baton_link_client::plaintext`]), in the
/// operator's words.
fn check_plain(conn: &Conn) -> Result<(), OpError> {
    let allowed = Plaintext {
        insecure: conn.insecure,
        insecure_any: conn.insecure_any,
    };
    let host = url_host(&conn.url);
    check_plaintext(host.as_deref(), allowed).map_err(|refused| match refused {
        PlaintextRefused::NotAllowed => OpError::usage(format!(
            "{} is plaintext: use https:// with --cert, --key and --ca, or pass --insecure",
            conn.url
        )),
        PlaintextRefused::NotLoopback => OpError::usage(format!(
            "{}: {NOT_LOOPBACK} would send this operator's actions in the clear; {NOT_LOOPBACK_REMEDY}",
            conn.url
        )),
    })
}

/// An Admin client.
pub async fn client(conn: &Conn) -> Result<AdminClient<Channel>, OpError> {
    let ch = match transport(conn)? {
        Transport::Plain(e) => e.connect().await.map_err(|e| {
            OpError::fail(format!(
                "cannot reach the controller at {}: {}",
                conn.url,
                error_chain(&e)
            ))
        })?,
        Transport::Tls(e, dialer) => {
            e.connect_with_connector(dialer.clone())
                .await
                .map_err(|e| match dialer.failure() {
                    Some(d) => OpError::fail(d.0),
                    None => OpError::fail(format!(
                        "cannot reach the controller at {}: {}",
                        conn.url,
                        error_chain(&e)
                    )),
                })?
        }
    };
    Ok(admin_client(ch))
}
