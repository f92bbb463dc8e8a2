//! An endpoint to one controller address, and the clients over it with
//! the message caps.

use std::fmt::Display;
use std::net::SocketAddr;

use baton_proto::wire::admin_client::AdminClient;
use baton_proto::wire::error_chain;
use baton_proto::wire::link_client::LinkClient;
use tonic::transport::{Channel, Endpoint};

use crate::policy::{CONNECT_TIMEOUT, EndpointPolicy, MAX_MESSAGE_BYTES};
use crate::tls::TlsFiles;

/// An address a controller's name resolved to, dialled in its place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resolved<'a> {
    /// The address to dial.
    pub addr: SocketAddr,
    /// The URL's host, brackets removed: the TLS server name (the
    /// certificate is checked against the name, not the address).
    pub host: &'a str,
}

/// The endpoint for `url` (or for `resolved`, an address of its host),
/// with TLS from `tls` and `policy`'s settings, tonic's connector timed
/// out after [`CONNECT_TIMEOUT`]. A resolved address keeps the URL as the
/// requests' origin (their authority) and its host as the TLS name.
/// `shown` names the target in errors.
pub fn endpoint(
    url: &str,
    resolved: Option<Resolved<'_>>,
    tls: Option<&TlsFiles>,
    policy: EndpointPolicy,
    shown: &dyn Display,
) -> Result<Endpoint, String> {
    let dial = match resolved {
        Some(r) => {
            let scheme = url.split("://").next().unwrap_or("https");
            format!("{scheme}://{}", r.addr)
        }
        None => url.to_string(),
    };
    let mut endpoint =
        Endpoint::from_shared(dial).map_err(|e| format!("bad controller URL {shown}: {e}"))?;
    if resolved.is_some() {
        let origin = url
            .parse()
            .map_err(|e| format!("bad controller URL {url}: {e}"))?;
        endpoint = endpoint.origin(origin);
    }
    if let Some(t) = tls {
        let mut config = t.client_config().map_err(|e| e.to_string())?;
        if let Some(r) = resolved {
            config = config.domain_name(r.host.to_string());
        }
        endpoint = endpoint
            .tls_config(config)
            .map_err(|e| format!("TLS for {shown}: {}", error_chain(&e)))?;
    }
    Ok(policy.with_connect_timeout(endpoint))
}

/// A connection over `endpoint`, the whole attempt bounded by
/// [`CONNECT_TIMEOUT`] (the resolver and the TLS handshake included).
pub async fn connect(endpoint: &Endpoint, shown: &dyn Display) -> Result<Channel, String> {
    tokio::time::timeout(CONNECT_TIMEOUT, endpoint.connect())
        .await
        .map_err(|_| format!("connect to {shown} timed out after {CONNECT_TIMEOUT:?}"))?
        .map_err(|e| format!("connect to {shown} failed: {}", error_chain(&e)))
}

/// The agent's transport to one controller address: [`endpoint`] with
/// [`EndpointPolicy::AGENT`], [`connect`], and the Link client with the
/// caps.
pub async fn connect_link(
    url: &str,
    resolved: Option<Resolved<'_>>,
    tls: Option<&TlsFiles>,
    shown: &dyn Display,
) -> Result<LinkClient<Channel>, String> {
    let e = endpoint(url, resolved, tls, EndpointPolicy::AGENT, shown)?;
    Ok(link_client(connect(&e, shown).await?))
}

/// The Link client over `channel`, with the message caps both ends share.
pub fn link_client(channel: Channel) -> LinkClient<Channel> {
    LinkClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES)
}

/// The Admin client over `channel`, with the message caps both ends share.
pub fn admin_client(channel: Channel) -> AdminClient<Channel> {
    AdminClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(url: &str) -> Result<Endpoint, String> {
        endpoint(url, None, None, EndpointPolicy::AGENT, &url)
    }

    #[test]
    fn a_bad_url_is_named() {
        let e = plain("http://[not-closed").expect_err("not a URI");
        assert!(
            e.starts_with("bad controller URL http://[not-closed: "),
            "{e}"
        );
    }

    #[test]
    fn a_resolved_address_is_dialled_under_the_name() {
        let addr: SocketAddr = "192.0.2.7:7411".parse().expect("addr");
        let r = Resolved {
            addr,
            host: "ctl.example",
        };
        let e = endpoint(
            "http://ctl.example:7411",
            Some(r),
            None,
            EndpointPolicy::AGENT,
            &"ctl",
        )
        .expect("endpoint");
        assert_eq!(e.uri().to_string(), "http://192.0.2.7:7411/");
    }

    #[test]
    fn missing_tls_files_are_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let tls = TlsFiles {
            cert: dir.path().join("c.pem"),
            key: dir.path().join("k.pem"),
            ca: dir.path().join("ca.pem"),
        };
        let e = endpoint(
            "https://ctl.example:7411",
            None,
            Some(&tls),
            EndpointPolicy::AGENT,
            &"ctl",
        )
        .expect_err("no files");
        assert!(e.starts_with(&format!("{}: ", tls.ca.display())), "{e}");
    }

    #[tokio::test]
    async fn a_refused_connection_says_where() {
        // A port that was free a moment ago: nothing listens there.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let url = format!("http://127.0.0.1:{port}");
        let e = connect_link(&url, None, None, &url)
            .await
            .expect_err("nothing listens");
        assert!(e.starts_with(&format!("connect to {url} failed: ")), "{e}");
    }
}
