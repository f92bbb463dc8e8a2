//! The dashboard behind one address over several replicas: two real
//! controllers (`serve --tls-dir --http --store URL --replica-id`) on one
//! throwaway PostgreSQL database, each with its own copy of the CA
//! directory (as on two hosts), spoken to over HTTPS as a browser behind
//! a load balancer would: a log-in on one replica gives a cookie the other
//! takes; a log-out on the other ends it on the first; a revocation made
//! in one host's CA directory ends a new session on both; failed log-ins
//! spread over both replicas add up, and past the allowance the address
//! is refused by either.
//!
//! The HTTP client is a few lines over rustls (HTTP/1.1, one request per
//! connection), trusting the fleet's CA.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use baton_e2e::fleet::{Ca, Controller, ControllerTls, start_controller_tls};
use baton_e2e::wait_until;

const WAIT: Duration = Duration::from_secs(30);

/// One HTTP answer: status, headers (lower-case names), body.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The `name=value` of the session cookie it sets.
    fn session_cookie(&self) -> String {
        self.header("set-cookie")
            .and_then(|c| c.split(';').next())
            .filter(|c| c.starts_with("__Host-baton_session=") && c.len() > 30)
            .unwrap_or_else(|| panic!("no session cookie set: {:?}", self.headers))
            .to_string()
    }
}

/// An HTTPS client of the dashboards, trusting the fleet's CA.
struct Client {
    tls: Arc<rustls::ClientConfig>,
}

impl Client {
    fn new(ca: &Ca) -> Client {
        let mut roots = rustls::RootCertStore::empty();
        use rustls::pki_types::pem::PemObject;
        for cert in rustls::pki_types::CertificateDer::pem_file_iter(ca.ca_pem()).expect("ca.pem") {
            roots.add(cert.expect("a certificate")).expect("a root");
        }
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
        Client { tls: Arc::new(tls) }
    }

    /// `method path` on `addr` (`127.0.0.1:PORT`), with a cookie and a
    /// form body if given.
    fn call(
        &self,
        addr: &str,
        method: &str,
        path: &str,
        cookie: Option<&str>,
        form: Option<&str>,
    ) -> Answer {
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1")
            .expect("name")
            .to_owned();
        let conn = rustls::ClientConnection::new(self.tls.clone(), name).expect("TLS client");
        let tcp = TcpStream::connect(addr).expect("connect to the dashboard");
        tcp.set_read_timeout(Some(WAIT)).expect("timeout");
        let mut s = rustls::StreamOwned::new(conn, tcp);
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
        if let Some(c) = cookie {
            req += &format!("Cookie: {c}\r\n");
        }
        let body = form.unwrap_or("");
        if form.is_some() {
            req += "Content-Type: application/x-www-form-urlencoded\r\n";
            req += &format!("Content-Length: {}\r\n", body.len());
        }
        req += "\r\n";
        req += body;
        s.write_all(req.as_bytes()).expect("send the request");
        let mut raw = Vec::new();
        if let Err(e) = s.read_to_end(&mut raw) {
            // A server that closes without TLS's close_notify: the answer
            // is complete all the same (Connection: close).
            assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof, "read: {e}");
        }
        let raw = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP answer");
        let mut lines = head.lines();
        let status = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|c| c.parse().ok())
            .expect("a status line");
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        Answer {
            status,
            headers,
            body: body.to_string(),
        }
    }

    fn log_in(&self, addr: &str, token: &str) -> Answer {
        self.call(
            addr,
            "POST",
            "/login",
            None,
            Some(&format!("token={token}&next=/")),
        )
    }

    fn fleet(&self, addr: &str, cookie: &str) -> u16 {
        self.call(addr, "GET", "/", Some(cookie), None).status
    }
}

/// A copy of the CA directory `from` at `to` (another host's).
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read the CA directory") {
        let e = e.expect("entry");
        let target = to.join(e.file_name());
        if e.file_type().expect("type").is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).expect("copy");
        }
    }
}

/// Replica `name` on the database `url`, serving the CA directory `ca`.
fn replica(
    dir: &Path,
    ca: &Path,
    operator: &(std::path::PathBuf, std::path::PathBuf),
    url: &str,
    name: &str,
) -> Controller {
    start_controller_tls(
        &dir.join(name),
        "127.0.0.1:0",
        ControllerTls {
            dir: ca.to_path_buf(),
            operator: operator.clone(),
            serve_args: [
                "--store",
                url,
                "--replica-id",
                name,
                "--http",
                "127.0.0.1:0",
            ]
            .map(String::from)
            .to_vec(),
        },
    )
}

#[test]
fn a_dashboard_session_is_the_sites_not_one_replicas() {
    let Some(url) = baton_testpg::fresh_database() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tmp");
    let ca = Ca::init(&dir.path().join("ca-a"));
    let admin = ca.operator("boss", "default", "admin");
    let ann = ca.operator_token("ann", "default", "viewer");
    let bob = ca.operator_token("bob", "default", "viewer");
    // Host B's copy of the CA directory: a revocation made on host A is
    // in A's list only.
    let ca_b = dir.path().join("ca-b");
    copy_dir(&ca.dir, &ca_b);
    let a = replica(dir.path(), &ca.dir, &admin, &url, "ra");
    let b = replica(dir.path(), &ca_b, &admin, &url, "rb");
    let (a_http, b_http) = (a.http_addr(), b.http_addr());
    let client = Client::new(&ca);
    let logs = || format!("--- ra ---\n{}\n--- rb ---\n{}", a.log(), b.log());

    // Logged in on A: the cookie works on B.
    let login = client.log_in(&a_http, &ann);
    assert_eq!(login.status, 303, "{}\n{}", login.body, logs());
    let cookie = login.session_cookie();
    assert_eq!(client.fleet(&a_http, &cookie), 200);
    let page = client.call(&b_http, "GET", "/", Some(&cookie), None);
    assert_eq!(page.status, 200, "B takes A's session\n{}", logs());
    assert!(
        page.body.contains("operator ann"),
        "the page names who is logged in"
    );
    // Logged out on B (with the session's CSRF token, as B shows it):
    // ended on A.
    let csrf = page
        .body
        .split("X-CSRF-Token&quot;:&quot;")
        .nth(1)
        .and_then(|s| s.split("&quot;").next())
        .expect("the page's CSRF token")
        .to_string();
    let out = client.call(
        &b_http,
        "POST",
        "/logout",
        Some(&cookie),
        Some(&format!("csrf={csrf}")),
    );
    assert_eq!(out.status, 303, "{}", out.body);
    assert_eq!(client.fleet(&a_http, &cookie), 303, "logged out on A too");
    assert_eq!(client.fleet(&b_http, &cookie), 303);

    // Bob logs in on B; his certificate is revoked on host A only: A
    // records it in the store, and his session ends on both.
    let cookie = client.log_in(&b_http, &bob).session_cookie();
    assert_eq!(client.fleet(&a_http, &cookie), 200);
    let o = ca.revoke("bob");
    assert!(o.status.success());
    let ended = wait_until(WAIT, || {
        client.fleet(&a_http, &cookie) == 303 && client.fleet(&b_http, &cookie) == 303
    });
    assert!(ended, "a revoked session still open\n{}", logs());

    // Failed log-ins from this address, spread over both replicas, add
    // up: past the allowance (10), either refuses even a good token.
    for i in 0..10 {
        let via = if i % 2 == 0 { &a_http } else { &b_http };
        assert_eq!(client.log_in(via, "baton_wrong").status, 401);
    }
    for via in [&a_http, &b_http] {
        let r = client.log_in(via, &ann);
        assert_eq!(r.status, 429, "{}", r.body);
        assert!(r.header("retry-after").is_some());
    }
}
