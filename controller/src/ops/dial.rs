//! How operator commands dial a controller over mTLS, so that a failure
//! says what failed instead of "transport error".
//!
//! - Before dialling, the PEM files are read and checked here: each file
//!   named in its error, the operator's certificate within its validity
//!   period, the key the certificate's own ([`Files::read`]).
//! - The TLS handshake is ours (tokio-rustls, then handed to tonic as a
//!   connection), so rustls's typed error is at hand: the controller's
//!   certificate expired, not signed by `--ca`, not for this host name; the
//!   port answering in plaintext; the controller busy (its TLS alert
//!   `user_canceled`, sent when its handshake budget is used up).
//! - With TLS 1.3 a client's certificate is judged by the server only
//!   after the client's side of the handshake is done, and a refusal
//!   arrives as an alert on the first read — which tonic would report as a
//!   cancelled call. So the dial waits for the controller's first bytes
//!   (HTTP/2 servers speak first) and reads the verdict there: accepted, or
//!   refused as unknown CA, expired, revoked.
//!
//! The explanations are pure functions of rustls's errors and the files'
//! facts ([`explain_handshake`], [`explain_verdict`]), tested below.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::{AlertDescription, CertificateError, DigitallySignedStruct, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use baton_link_client::TlsFiles;

use super::error::OpError;

/// Each step of a dial: TCP connect, TLS handshake, the controller's
/// verdict.
const STEP_TIMEOUT: Duration = Duration::from_secs(5);

/// What a certificate says about itself, for messages.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CertFacts {
    /// The baton identity (`operator ann (tenant t, role admin)`) or the
    /// subject's common name.
    pub who: String,
    /// The issuer's common name (or whole name).
    pub issuer: String,
    /// The subject's common name (or whole name).
    pub subject: String,
    /// Validity, seconds since the Unix epoch.
    pub not_before: i64,
    /// Validity, seconds since the Unix epoch.
    pub not_after: i64,
}

impl CertFacts {
    /// Read from DER.
    pub fn of(der: &[u8]) -> Result<CertFacts, String> {
        let (_, c) = x509_parser::parse_x509_certificate(der)
            .map_err(|e| format!("not a readable certificate: {e}"))?;
        let cn = |n: &x509_parser::x509::X509Name<'_>| {
            n.iter_common_name()
                .next()
                .and_then(|cn| cn.as_str().ok())
                .map_or_else(|| n.to_string(), str::to_string)
        };
        let subject = cn(c.subject());
        let who = match baton_pki::identity::from_cert_der(der) {
            Ok(p) => p.identity.to_string(),
            Err(_) => format!("`{subject}`"),
        };
        Ok(CertFacts {
            who,
            issuer: cn(c.issuer()),
            subject,
            not_before: c.validity().not_before.timestamp(),
            not_after: c.validity().not_after.timestamp(),
        })
    }
}

/// Seconds since the epoch as RFC 3339.
fn when(secs: i64) -> String {
    jiff::Timestamp::from_second(secs)
        .map_or_else(|_| format!("{secs} s since 1970"), |t| t.to_string())
}

/// The operator's TLS files, read and checked.
#[derive(Debug)]
pub struct Files {
    /// `--cert`.
    pub cert_path: PathBuf,
    /// `--key`.
    pub key_path: PathBuf,
    /// `--ca`.
    pub ca_path: PathBuf,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    roots: rustls::RootCertStore,
    /// The operator's certificate.
    pub mine: CertFacts,
    /// The CA certificate (the first in `--ca`).
    pub ca: CertFacts,
}

impl Files {
    /// Read `--cert`, `--key`, `--ca` and check them at `now` (Unix
    /// seconds): the certificate is valid now, the key is its own, the CA
    /// file holds a certificate valid now.
    pub fn read(tls: &TlsFiles, now: i64) -> Result<Files, OpError> {
        let TlsFiles {
            cert: cert_path,
            key: key_path,
            ca: ca_path,
        } = tls;
        let named = |flag: &str, p: &Path, e: &dyn std::fmt::Display| {
            OpError::fail(format!("{flag} {}: {e}", p.display()))
        };
        let certs = |flag: &str, p: &Path| -> Result<Vec<CertificateDer<'static>>, OpError> {
            std::fs::metadata(p).map_err(|e| named(flag, p, &e))?;
            let v = CertificateDer::pem_file_iter(p)
                .map_err(|e| named(flag, p, &e))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| named(flag, p, &e))?;
            if v.is_empty() {
                return Err(named(flag, p, &"no PEM certificate in it"));
            }
            Ok(v)
        };
        let chain = certs("--cert", cert_path)?;
        let mine = CertFacts::of(&chain[0]).map_err(|e| named("--cert", cert_path, &e))?;
        std::fs::metadata(key_path).map_err(|e| named("--key", key_path, &e))?;
        let key = PrivateKeyDer::from_pem_file(key_path).map_err(|e| {
            named(
                "--key",
                key_path,
                &format!("no usable PEM private key in it ({e})"),
            )
        })?;
        let ca_certs = certs("--ca", ca_path)?;
        let ca = CertFacts::of(&ca_certs[0]).map_err(|e| named("--ca", ca_path, &e))?;
        let mut roots = rustls::RootCertStore::empty();
        for c in ca_certs {
            roots.add(c).map_err(|e| named("--ca", ca_path, &e))?;
        }
        let files = Files {
            cert_path: cert_path.clone(),
            key_path: key_path.clone(),
            ca_path: ca_path.clone(),
            chain,
            key,
            roots,
            mine,
            ca,
        };
        files.check(now)?;
        Ok(files)
    }

    /// The local checks: dates, and the key against the certificate.
    fn check(&self, now: i64) -> Result<(), OpError> {
        let cert = self.cert_path.display();
        if now > self.mine.not_after {
            return Err(OpError::fail(format!(
                "the operator certificate --cert {cert} ({}) expired at {} (now {}): ask for a new one (`baton-controller ca issue-operator NAME --tenant T --role R --dir CA_DIR`)",
                self.mine.who,
                when(self.mine.not_after),
                when(now)
            )));
        }
        if now < self.mine.not_before {
            return Err(OpError::fail(format!(
                "the operator certificate --cert {cert} ({}) is not valid before {} (now {}): is this machine's clock right?",
                self.mine.who,
                when(self.mine.not_before),
                when(now)
            )));
        }
        if now > self.ca.not_after {
            return Err(OpError::fail(format!(
                "the CA certificate --ca {} (`{}`) expired at {}: every certificate it signed is refused; the fleet needs a new CA",
                self.ca_path.display(),
                self.ca.subject,
                when(self.ca.not_after)
            )));
        }
        let signer = rustls::crypto::ring::sign::any_supported_type(&self.key).map_err(|e| {
            OpError::fail(format!(
                "--key {}: not a key this client can sign with: {e}",
                self.key_path.display()
            ))
        })?;
        let certified = rustls::sign::CertifiedKey::new(self.chain.clone(), signer);
        if let Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) =
            certified.keys_match()
        {
            return Err(OpError::fail(format!(
                "--key {} does not belong to --cert {cert} ({}): their public keys differ; pass the key that was issued with the certificate (`NAME-key.pem` beside `NAME.pem`)",
                self.key_path.display(),
                self.mine.who
            )));
        }
        Ok(())
    }

    /// The rustls configuration (ALPN h2), recording the certificate the
    /// controller presents into `seen`.
    fn client_config(
        &self,
        seen: Arc<Mutex<Option<CertFacts>>>,
    ) -> Result<rustls::ClientConfig, OpError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(self.roots.clone()),
            provider.clone(),
        )
        .build()
        .map_err(|e| OpError::fail(format!("--ca {}: {e}", self.ca_path.display())))?;
        let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| OpError::fail(format!("TLS: {e}")))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Recording { inner, seen }))
            .with_client_auth_cert(self.chain.clone(), self.key.clone_key())
            .map_err(|e| {
                OpError::fail(format!(
                    "--cert {} with --key {}: {e}",
                    self.cert_path.display(),
                    self.key_path.display()
                ))
            })?;
        cfg.alpn_protocols = vec![b"h2".to_vec()];
        Ok(cfg)
    }
}

/// rustls's own verification, noting what the controller presented (for
/// messages: who issued it, which names it has).
#[derive(Debug)]
struct Recording {
    inner: Arc<rustls::client::WebPkiServerVerifier>,
    seen: Arc<Mutex<Option<CertFacts>>>,
}

impl ServerCertVerifier for Recording {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if let Ok(f) = CertFacts::of(end_entity) {
            *self.seen.lock().unwrap_or_else(|p| p.into_inner()) = Some(f);
        }
        self.inner
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// Everything a message about a failed dial may name.
#[derive(Clone, Debug, Default)]
pub struct Context {
    /// The URL as given.
    pub url: String,
    /// `--cert`, `--ca` and their facts (empty in tests that need none).
    pub cert_path: String,
    /// `--ca`.
    pub ca_path: String,
    /// The operator's certificate.
    pub mine: CertFacts,
    /// The CA certificate.
    pub ca: CertFacts,
    /// The certificate the controller presented, if it got that far.
    pub seen: Option<CertFacts>,
}

/// The rustls error inside an IO error, if any.
fn rustls_error(e: &std::io::Error) -> Option<&rustls::Error> {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
}

/// Why the TLS handshake failed, for an operator.
pub fn explain_handshake(e: &std::io::Error, cx: &Context) -> String {
    let url = &cx.url;
    let ca = format!("--ca {} (`{}`)", cx.ca_path, cx.ca.subject);
    match rustls_error(e) {
        Some(rustls::Error::AlertReceived(AlertDescription::UserCanceled)) => format!(
            "the controller at {url} is at its limit of TLS handshakes in progress and refused this one before it started (too many connections at once, a flood?): try again in a few seconds; its log says which limit"
        ),
        Some(rustls::Error::AlertReceived(a)) => explain_alert(*a, cx),
        Some(rustls::Error::InvalidCertificate(c)) => match c {
            CertificateError::UnknownIssuer | CertificateError::BadSignature => {
                let issued = cx.seen.as_ref().map_or(String::new(), |s| {
                    format!(" (it was issued by `{}`)", s.issuer)
                });
                format!(
                    "the controller's certificate is not signed by the CA in {ca}{issued}: pass the ca.pem of the CA directory the controller serves (`serve --tls-dir DIR`)"
                )
            }
            CertificateError::ExpiredContext { not_after, .. } => format!(
                "the controller's certificate at {url} expired at {}: the controller needs a new server.pem in its --tls-dir",
                when(not_after.as_secs() as i64)
            ),
            CertificateError::Expired => {
                let at = cx
                    .seen
                    .as_ref()
                    .map_or(String::new(), |s| format!(" at {}", when(s.not_after)));
                format!(
                    "the controller's certificate at {url} expired{at}: the controller needs a new server.pem in its --tls-dir"
                )
            }
            CertificateError::NotValidYetContext { not_before, .. } => format!(
                "the controller's certificate at {url} is not valid before {}: is this machine's clock (or the controller's) right?",
                when(not_before.as_secs() as i64)
            ),
            CertificateError::NotValidForNameContext {
                expected,
                presented,
            } => format!(
                "the controller's certificate is not valid for the host in {url} ({}): it names {}; use one of those in the URL, or issue the server certificate for this name (`ca init --host`)",
                expected.to_str(),
                presented.join(", ")
            ),
            CertificateError::NotValidForName => format!(
                "the controller's certificate is not valid for the host in {url}: use a name it was issued for (`ca init --host`)"
            ),
            other => format!("the controller's certificate at {url} was refused: {other:?}"),
        },
        Some(rustls::Error::InvalidMessage(_)) => format!(
            "{url} did not answer in TLS: the controller there serves plaintext (`serve --insecure`)? then dial http://… with --insecure; else check the port"
        ),
        Some(other) => format!("TLS handshake with the controller at {url} failed: {other}"),
        None if e.kind() == std::io::ErrorKind::UnexpectedEof => format!(
            "the controller at {url} closed the connection during the TLS handshake without saying why (not a baton controller, or one at its limit of handshakes)"
        ),
        None => format!("TLS handshake with the controller at {url} failed: {e}"),
    }
}

/// A TLS alert from the controller about this client's certificate.
fn explain_alert(a: AlertDescription, cx: &Context) -> String {
    let cert = format!(
        "the operator certificate --cert {} ({})",
        cx.cert_path, cx.mine.who
    );
    match a {
        AlertDescription::UnknownCA => {
            let hint = if !cx.ca.subject.is_empty() && cx.mine.issuer != cx.ca.subject {
                format!(
                    " (it was issued by `{}`; --ca is `{}`)",
                    cx.mine.issuer, cx.ca.subject
                )
            } else {
                format!(" (it was issued by `{}`)", cx.mine.issuer)
            };
            format!(
                "the controller refused {cert}: not signed by the CA it trusts{hint}; use a certificate issued from the controller's CA directory"
            )
        }
        AlertDescription::CertificateExpired => format!(
            "the controller refused {cert} as expired or not yet valid (valid {} to {} by this machine's clock): check the controller's clock, or ask for a new certificate",
            when(cx.mine.not_before),
            when(cx.mine.not_after)
        ),
        AlertDescription::CertificateRevoked => {
            format!("the controller refused {cert}: it is revoked")
        }
        AlertDescription::UnsupportedCertificate | AlertDescription::BadCertificate => format!(
            "the controller refused {cert}: not a client certificate it accepts (TLS alert {a:?}); use one made by `ca issue-operator`"
        ),
        AlertDescription::CertificateRequired => format!(
            "the controller at {} wants a client certificate and got none",
            cx.url
        ),
        AlertDescription::UserCanceled => format!(
            "the controller at {} is at its limit of TLS handshakes in progress: try again in a few seconds",
            cx.url
        ),
        other => format!(
            "the controller at {} ended the TLS connection with alert {other:?} (its log says why)",
            cx.url
        ),
    }
}

/// What came instead of the controller's first bytes after the handshake.
#[derive(Debug)]
pub enum Verdict<'a> {
    /// A read error (a refusal alert, most likely).
    Error(&'a std::io::Error),
    /// The connection closed.
    Closed,
    /// Nothing within the wait.
    Silent(Duration),
}

/// Why the controller's first bytes did not come, for an operator.
pub fn explain_verdict(v: Verdict<'_>, cx: &Context) -> String {
    match v {
        Verdict::Error(e) => match rustls_error(e) {
            Some(rustls::Error::AlertReceived(a)) => explain_alert(*a, cx),
            _ => format!(
                "the controller at {} broke the connection right after the TLS handshake: {e} (its log says why: an unknown CA, an expired or revoked certificate)",
                cx.url
            ),
        },
        Verdict::Closed => format!(
            "the controller at {} closed the connection right after the TLS handshake without a word (its log says why)",
            cx.url
        ),
        Verdict::Silent(d) => format!(
            "the controller at {} finished the TLS handshake but said nothing within {d:?}: it may be overloaded",
            cx.url
        ),
    }
}

/// A failed dial; its text is the operator's message.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{0}")]
pub struct DialError(pub String);

/// A connection whose first bytes were read already (to learn the
/// controller's verdict) and are given back first.
#[derive(Debug)]
pub struct Dialed {
    first: Vec<u8>,
    pos: usize,
    io: tokio_rustls::client::TlsStream<TcpStream>,
}

impl AsyncRead for Dialed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.pos < self.first.len() {
            let n = (self.first.len() - self.pos).min(buf.remaining());
            let start = self.pos;
            buf.put_slice(&self.first[start..start + n]);
            self.pos += n;
            if self.pos == self.first.len() {
                self.first = Vec::new();
                self.pos = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Dialed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Dials the controller for tonic (`Endpoint::connect_with_connector`):
/// TCP, TLS, the verdict; the last failure kept for [`Dialer::failure`].
#[derive(Clone, Debug)]
pub struct Dialer {
    host: String,
    port: u16,
    name: ServerName<'static>,
    config: Arc<rustls::ClientConfig>,
    cx: Arc<Context>,
    seen: Arc<Mutex<Option<CertFacts>>>,
    last: Arc<Mutex<Option<DialError>>>,
}

impl Dialer {
    /// For `url` (`https://HOST:PORT`) with the checked `files`.
    pub fn new(url: &str, files: &Files) -> Result<Dialer, OpError> {
        let uri: tonic::transport::Uri = url
            .parse()
            .map_err(|e| OpError::usage(format!("--controller {url}: {e}")))?;
        let host = uri
            .host()
            .ok_or_else(|| OpError::usage(format!("--controller {url}: no host")))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let port = uri.port_u16().unwrap_or(443);
        let name = ServerName::try_from(host.clone())
            .map_err(|e| OpError::usage(format!("--controller {url}: {e}")))?;
        let seen = Arc::new(Mutex::new(None));
        let config = files.client_config(seen.clone())?;
        Ok(Dialer {
            host,
            port,
            name,
            config: Arc::new(config),
            cx: Arc::new(Context {
                url: url.to_string(),
                cert_path: files.cert_path.display().to_string(),
                ca_path: files.ca_path.display().to_string(),
                mine: files.mine.clone(),
                ca: files.ca.clone(),
                seen: None,
            }),
            seen,
            last: Arc::new(Mutex::new(None)),
        })
    }

    /// Why the last dial failed, if it did.
    pub fn failure(&self) -> Option<DialError> {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    async fn dial(self) -> Result<hyper_util::rt::TokioIo<Dialed>, DialError> {
        let r = self.try_dial().await;
        if let Err(e) = &r {
            *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.clone());
        }
        r
    }

    async fn try_dial(&self) -> Result<hyper_util::rt::TokioIo<Dialed>, DialError> {
        let url = &self.cx.url;
        let fail = |m: String| DialError(m);
        let tcp = tokio::time::timeout(
            STEP_TIMEOUT,
            TcpStream::connect((self.host.as_str(), self.port)),
        )
        .await
        .map_err(|_| {
            fail(format!(
                "cannot reach the controller at {url}: no TCP answer within {STEP_TIMEOUT:?}"
            ))
        })?
        .map_err(|e| fail(format!("cannot reach the controller at {url}: {e}")))?;
        let _ = tcp.set_nodelay(true);
        let connector = tokio_rustls::TlsConnector::from(self.config.clone());
        let shake = tokio::time::timeout(STEP_TIMEOUT, connector.connect(self.name.clone(), tcp))
            .await
            .map_err(|_| {
                fail(format!(
                    "the controller at {url} accepted the connection but did not finish the TLS handshake within {STEP_TIMEOUT:?}: overloaded, or out of file descriptors (its log says \"accept failed\")"
                ))
            })?;
        let mut tls = match shake {
            Ok(t) => t,
            Err(e) => {
                let mut cx = (*self.cx).clone();
                cx.seen = self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
                return Err(fail(explain_handshake(&e, &cx)));
            }
        };
        let mut first = vec![0u8; 16 * 1024];
        let n = match tokio::time::timeout(STEP_TIMEOUT, tls.read(&mut first)).await {
            Err(_) => {
                return Err(fail(explain_verdict(
                    Verdict::Silent(STEP_TIMEOUT),
                    &self.cx,
                )));
            }
            Ok(Err(e)) => return Err(fail(explain_verdict(Verdict::Error(&e), &self.cx))),
            Ok(Ok(0)) => return Err(fail(explain_verdict(Verdict::Closed, &self.cx))),
            Ok(Ok(n)) => n,
        };
        first.truncate(n);
        Ok(hyper_util::rt::TokioIo::new(Dialed {
            first,
            pos: 0,
            io: tls,
        }))
    }
}

impl tonic::codegen::Service<tonic::transport::Uri> for Dialer {
    type Response = hyper_util::rt::TokioIo<Dialed>;
    type Error = DialError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, DialError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context2<'_>) -> Poll<Result<(), DialError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: tonic::transport::Uri) -> Self::Future {
        Box::pin(self.clone().dial())
    }
}

type Context2<'a> = std::task::Context<'a>;

#[cfg(test)]
mod tests {
    use super::*;

    fn cx() -> Context {
        Context {
            url: "https://ctl:7411".into(),
            cert_path: "ann.pem".into(),
            ca_path: "ca.pem".into(),
            mine: CertFacts {
                who: "operator ann (tenant t, role admin)".into(),
                issuer: "baton fleet CA 0001".into(),
                subject: "ann".into(),
                not_before: 1_700_000_000,
                not_after: 1_800_000_000,
            },
            ca: CertFacts {
                subject: "baton fleet CA 0002".into(),
                issuer: "baton fleet CA 0002".into(),
                ..CertFacts::default()
            },
            seen: None,
        }
    }

    fn io(e: rustls::Error) -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::InvalidData, e)
    }

    #[test]
    fn handshake_failures_say_what_failed() {
        let c = cx();
        let m = explain_handshake(
            &io(rustls::Error::AlertReceived(AlertDescription::UserCanceled)),
            &c,
        );
        assert!(m.contains("at its limit of TLS handshakes"), "{m}");
        let m = explain_handshake(
            &io(rustls::Error::InvalidCertificate(
                CertificateError::UnknownIssuer,
            )),
            &Context {
                seen: Some(CertFacts {
                    issuer: "baton fleet CA 0003".into(),
                    ..CertFacts::default()
                }),
                ..c.clone()
            },
        );
        assert!(
            m.contains("not signed by the CA in --ca ca.pem (`baton fleet CA 0002`)")
                && m.contains("issued by `baton fleet CA 0003`"),
            "{m}"
        );
        let m = explain_handshake(
            &io(rustls::Error::InvalidCertificate(
                CertificateError::ExpiredContext {
                    time: UnixTime::since_unix_epoch(Duration::from_secs(1_800_000_000)),
                    not_after: UnixTime::since_unix_epoch(Duration::from_secs(1_704_067_200)),
                },
            )),
            &c,
        );
        assert!(
            m.contains(
                "the controller's certificate at https://ctl:7411 expired at 2024-01-01T00:00:00Z"
            ),
            "{m}"
        );
        let m = explain_handshake(
            &io(rustls::Error::InvalidMessage(
                rustls::InvalidMessage::InvalidContentType,
            )),
            &c,
        );
        assert!(
            m.contains("did not answer in TLS") && m.contains("--insecure"),
            "{m}"
        );
    }

    #[test]
    fn refusals_of_this_certificate_name_it() {
        let c = cx();
        let m = explain_verdict(
            Verdict::Error(&io(rustls::Error::AlertReceived(
                AlertDescription::UnknownCA,
            ))),
            &c,
        );
        assert!(
            m.contains("the controller refused the operator certificate --cert ann.pem (operator ann (tenant t, role admin)): not signed by the CA it trusts (it was issued by `baton fleet CA 0001`; --ca is `baton fleet CA 0002`)"),
            "{m}"
        );
        let m = explain_verdict(
            Verdict::Error(&io(rustls::Error::AlertReceived(
                AlertDescription::CertificateExpired,
            ))),
            &c,
        );
        assert!(
            m.contains("as expired") && m.contains("2027-01-15T08:00:00Z"),
            "{m}"
        );
        let m = explain_verdict(Verdict::Closed, &c);
        assert!(m.contains("closed the connection right after"), "{m}");
    }
}
