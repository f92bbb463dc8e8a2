//! Who is asking the dashboard.
//!
//! On a TLS controller an operator logs in with the token `ca
//! issue-operator NAME --token` printed ([`baton_pki::tokens`]): the login
//! page exchanges it for a session cookie (HttpOnly, Secure,
//! SameSite=Strict), and scripts may send it as `Authorization: Bearer`
//! on every request instead. Either way the caller is the token's
//! certificate's identity, checked against the revocation list on every
//! request (a revoked operator's open pages and live streams stop at
//! once). Forms and htmx requests of a cookie session carry its CSRF
//! token; a bearer request carries no ambient credential and needs none.
//! On a plaintext controller (`--insecure`, loopback) there is no log-in:
//! every caller acts for every tenant, as on the gRPC side.
//!
//! Sessions live in the store ([`baton_app::sessions`]), so replicas
//! behind one address share them: a session made on one replica is valid
//! on every other, and a log-out, or a revocation any replica records,
//! ends it on all of them at once, since every request reads its session
//! from the store (one look-up by key; nothing is cached here that a
//! revocation could outlive). A session lasts 12 hours at most, never past
//! its certificate's expiry, and survives a controller's restart. The
//! store keeps only the SHA-256 of the cookie's value, so whoever reads
//! the database cannot replay a cookie. Failed log-ins are counted per
//! source address, and per token prefix, in the store too
//! ([`baton_app::sessions::LoginThrottle`]): past the allowance a source,
//! or a token tried from many sources, waits, whichever replica it tries.
//! Each failed log-in looked at is audited and logged for a log watcher
//! ([`login`]).
//!
//! The cookie itself is `axum-extra`'s (parsed from `Cookie`, written to
//! `Set-Cookie` with typed attributes). The sessions and the CSRF token
//! stay ours, short and written for this: no crate does what they must. A
//! session is an identity bounded by its certificate (expiry, revocation
//! checked on every request, at most [`SESSIONS_PER_IDENTITY`] per
//! certificate), which `tower-sessions` (a serialised key-value bag per
//! session, a store behind its own trait) does not model; the CSRF token
//! is the session's own (synchroniser token), checked in constant time, so
//! no second cookie and no signing key are needed.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::extract::{Extension, FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Form, extract::Query};
use axum_extra::extract::cookie::{Cookie, CookieJar, SameSite};
use maud::html;
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use super::Web;
use super::pages::layout;
use baton_app::sessions::{LoginAttempt, NewSession, Throttled, ThrottledBy};
pub use baton_app::sessions::{MAX_SESSIONS, SESSION_TTL, SESSIONS_PER_IDENTITY};
use baton_app::{App, AppError, Caller};
use baton_model::RefTime;
use baton_pki::identity::Identity;
use baton_pki::tokens::{self, TokenGrant};

/// The session cookie's name: `__Host-` makes browsers take it only
/// from this host, over HTTPS, for the whole site (a sibling subdomain
/// cannot plant one).
pub const COOKIE: &str = "__Host-baton_session";
/// Largest log-in form.
pub const MAX_LOGIN_BODY: usize = 8 * 1024;
/// The header htmx requests carry the CSRF token in.
pub const CSRF_HEADER: &str = "x-csrf-token";

/// The peer address of a dashboard connection, which the accept loop
/// puts on each of its requests: whom failed log-ins are counted against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer(pub SocketAddr);

type Stamp = Option<(u64, SystemTime)>;

#[derive(Debug)]
struct TokenFile {
    path: PathBuf,
    cache: Mutex<(Stamp, Arc<HashMap<String, TokenGrant>>)>,
}

impl TokenFile {
    /// The tokens, re-read when the file changed.
    fn current(&self) -> Arc<HashMap<String, TokenGrant>> {
        let stamp = std::fs::metadata(&self.path)
            .ok()
            .and_then(|m| Some((m.len(), m.modified().ok()?)));
        let mut c = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if c.0 != stamp {
            // Stamped either way: a damaged file is read again when it
            // changes, not at every request.
            c.0 = stamp;
            match tokens::read(&self.path) {
                Ok(t) => c.1 = Arc::new(t),
                // Keep what was read last: a file being rewritten must not
                // log everyone out, nor let anyone in.
                Err(e) => tracing::warn!("dashboard tokens: {e}; the last good list stays"),
            }
        }
        c.1.clone()
    }
}

/// Tokens, and what a session is checked against beside the store.
#[derive(Debug)]
pub struct Auth {
    tokens: Option<TokenFile>,
    revoked: watch::Receiver<Arc<HashSet<String>>>,
    secure_cookie: bool,
}

/// How a request proved who it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// A plaintext controller: nobody logs in.
    Open,
    /// The session cookie.
    Cookie,
    /// `Authorization: Bearer`.
    Bearer,
}

/// The caller of one request.
#[derive(Clone, Debug)]
pub struct Who {
    /// For the application layer.
    pub caller: Caller,
    /// The session's CSRF token (empty unless [`Via::Cookie`]).
    pub csrf: String,
    /// How.
    pub via: Via,
}

impl Auth {
    /// Tokens from `DIR/tokens.txt` of the TLS directory (`None`: a
    /// plaintext controller), revocations from `revoked` (this host's
    /// list and the store's, which sessions are also checked against in
    /// the store itself).
    pub fn new(
        tls_dir: Option<&baton_pki::ca::CaDir>,
        revoked: watch::Receiver<Arc<HashSet<String>>>,
    ) -> Auth {
        Auth {
            secure_cookie: tls_dir.is_some(),
            tokens: tls_dir.map(|d| TokenFile {
                path: tokens::path(d),
                cache: Mutex::new((None, Arc::new(HashMap::new()))),
            }),
            revoked,
        }
    }

    /// Whether callers must log in.
    pub fn required(&self) -> bool {
        self.tokens.is_some()
    }

    /// What `token` speaks for, or why not (with whose it is, when it
    /// is known: a failed log-in is audited under its operator).
    fn grant(&self, token: &str) -> Result<TokenGrant, Refusal> {
        let Some(file) = &self.tokens else {
            return Err(Refusal::NoLogIn);
        };
        let token = token.trim();
        if !token.starts_with(tokens::PREFIX) {
            return Err(Refusal::NotAToken);
        }
        let grant = file
            .current()
            .get(&tokens::digest(token))
            .cloned()
            .ok_or(Refusal::Unknown)?;
        if self.revoked.borrow().contains(&grant.serial) {
            return Err(Refusal::Revoked(grant.identity));
        }
        if unix_now() > grant.not_after {
            return Err(Refusal::Expired(grant.identity));
        }
        Ok(grant)
    }

    /// The caller of a request with `headers`, if it proved who it is.
    /// A cookie's session is read from the store (`Err`: the store could
    /// not say).
    pub async fn who(&self, app: &App, headers: &HeaderMap) -> Result<Option<Who>, AppError> {
        if self.tokens.is_none() {
            if !plain_host_ok(headers) {
                return Ok(None);
            }
            return Ok(Some(Who {
                caller: Caller::new(Identity::Insecure),
                csrf: String::new(),
                via: Via::Open,
            }));
        }
        if let Some(token) = bearer(headers) {
            return Ok(self.grant(token).ok().map(|g| Who {
                caller: Caller::new(g.identity),
                csrf: String::new(),
                via: Via::Bearer,
            }));
        }
        let jar = CookieJar::from_headers(headers);
        let Some(id) = jar
            .get(COOKIE)
            .map(Cookie::value)
            .filter(|v| is_session_id(v))
        else {
            return Ok(None);
        };
        let Some(s) = app.session(&session_hash(id)).await? else {
            return Ok(None);
        };
        // The store refuses the serials recorded as revoked; this host's
        // list may have one not recorded yet.
        if self.revoked.borrow().contains(&s.serial) {
            return Ok(None);
        }
        Ok(Some(Who {
            caller: Caller::new(s.who),
            csrf: s.csrf,
            via: Via::Cookie,
        }))
    }

    /// Whether the session behind `headers` still stands (live streams ask
    /// as they go). A store that cannot say leaves it standing until the
    /// stream's next question (only a cookie's session needs the store).
    pub async fn still_valid(&self, app: &App, headers: &HeaderMap) -> bool {
        match self.who(app, headers).await {
            Ok(who) => who.is_some(),
            Err(e) => {
                tracing::warn!("dashboard: a live stream's session not checked: {e}");
                true
            }
        }
    }
}

/// Why a token does not log in. The words are shown on the log-in page,
/// logged and audited; a known token's operator is kept so that its
/// refusal is audited under that operator's name and tenant.
#[derive(Debug, thiserror::Error)]
enum Refusal {
    /// A plaintext controller.
    #[error("this controller has no log-in")]
    NoLogIn,
    /// Not even the shape of one.
    #[error("not a baton token")]
    NotAToken,
    /// No certificate was issued with it (or its line left tokens.txt).
    #[error("unknown token")]
    Unknown,
    /// Its certificate is on the revocation list.
    #[error("its certificate is revoked")]
    Revoked(Identity),
    /// Its certificate's validity has ended.
    #[error("its certificate has expired")]
    Expired(Identity),
}

impl Refusal {
    /// The operator the token was issued to, when it is known.
    fn whose(&self) -> Option<&Identity> {
        match self {
            Refusal::Revoked(id) | Refusal::Expired(id) => Some(id),
            Refusal::NoLogIn | Refusal::NotAToken | Refusal::Unknown => None,
        }
    }
}

/// A session id as this dashboard makes them: 64 lowercase hex digits
/// (anything else is not looked up).
fn is_session_id(v: &str) -> bool {
    v.len() == 64
        && v.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// What the store keys a session by: the SHA-256 of its cookie's value,
/// lowercase hex (the value itself is never stored).
pub fn session_hash(id: &str) -> String {
    Sha256::digest(id.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Whom failed log-ins from `peer` are counted against: its address, an
/// IPv6 one by its /64 (what one host is given), an IPv4-mapped one as
/// IPv4; `unknown` for a request the accept loop did not mark.
pub fn source_of(peer: Option<Peer>) -> String {
    let Some(Peer(addr)) = peer else {
        return "unknown".into();
    };
    match addr.ip() {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => {
                let s = v6.segments();
                let net = std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0);
                format!("{net}/64")
            }
        },
    }
}

/// The session cookie for `id`: for this host only (`__Host-`: Secure,
/// `Path=/`, no `Domain`; only a TLS controller has sessions), out of
/// scripts' reach, never sent with a request another site starts.
fn session_cookie(id: String) -> Cookie<'static> {
    Cookie::build((COOKIE, id))
        .path("/")
        .http_only(true)
        .same_site(SameSite::Strict)
        .secure(true)
        .max_age(max_age(SESSION_TTL))
        .build()
}

/// cookie's `Max-Age` is a `time::Duration`: the one place the server
/// names `time` (the controller's own instants and spans are jiff's).
fn max_age(d: Duration) -> time::Duration {
    time::Duration::try_from(d).unwrap_or(time::Duration::MAX)
}

impl Who {
    /// A state-changing request must come from this site: its `Origin`
    /// (when sent) names this host, and a cookie session's request
    /// carries the session's CSRF token (form field or header).
    pub fn check_post(&self, headers: &HeaderMap, form_csrf: Option<&str>) -> Result<(), Refused> {
        same_origin(headers, self.via != Via::Open)?;
        if self.via != Via::Cookie {
            return Ok(());
        }
        let sent = form_csrf
            .filter(|s| !s.is_empty())
            .or_else(|| headers.get(CSRF_HEADER).and_then(|v| v.to_str().ok()))
            .unwrap_or("");
        if constant_time_eq(sent.as_bytes(), self.csrf.as_bytes()) {
            Ok(())
        } else {
            Err((
                StatusCode::FORBIDDEN,
                "missing or wrong CSRF token: reload the page",
            ))
        }
    }

    /// What the page frame shows of this caller.
    pub fn viewer(&self) -> layout::Viewer<'_> {
        layout::Viewer {
            name: self.caller.who.to_string(),
            csrf: &self.csrf,
            logout: self.via == Via::Cookie,
            may_change: self.may_change(),
            may_audit: self.may_audit(),
        }
    }

    /// Whether the caller may push and cancel.
    pub fn may_change(&self) -> bool {
        self.caller.may_change().is_ok()
    }

    /// Whether the caller may read the audit log.
    pub fn may_audit(&self) -> bool {
        self.caller.may_audit().is_ok()
    }
}

/// Why a state-changing request is refused (an HTTP answer).
pub type Refused = (StatusCode, &'static str);

/// A cross-site POST is refused before anything else is read: its
/// `Origin` (when sent: browsers do on posts) must be this site, scheme
/// included (`https` when `secure`).
fn same_origin(headers: &HeaderMap, secure: bool) -> Result<(), Refused> {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return Ok(());
    };
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let scheme = if secure { "https" } else { "http" };
    if !host.is_empty() && origin == format!("{scheme}://{host}") {
        Ok(())
    } else {
        Err((StatusCode::FORBIDDEN, "cross-site request refused"))
    }
}

/// On a plaintext controller nobody logs in, so a page of another site
/// whose name was rebound to this address (DNS rebinding) would act for
/// every tenant: only an address, or `localhost`, is taken as the host.
pub fn plain_host_ok(headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(header::HOST).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let name = match host.strip_prefix('[') {
        // [v6]:port
        Some(rest) => {
            return rest
                .split(']')
                .next()
                .is_some_and(|a| a.parse::<std::net::Ipv6Addr>().is_ok());
        }
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::Ipv4Addr>().is_ok()
}

impl FromRequestParts<Arc<Web>> for Who {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, web: &Arc<Web>) -> Result<Who, Response> {
        match web.auth.who(&web.app, &parts.headers).await {
            Ok(Some(who)) => return Ok(who),
            Ok(None) => {}
            Err(e) => return Err(super::app_error(e)),
        }
        if !web.auth.required() {
            return Err((
                StatusCode::MISDIRECTED_REQUEST,
                "this plaintext dashboard answers to its address (or localhost) only",
            )
                .into_response());
        }
        let path = parts.uri.path();
        let api = ["/api/", "/live", "/metrics"]
            .iter()
            .any(|p| path.starts_with(p));
        if parts.method == Method::GET && !api {
            let next = parts
                .uri
                .path_and_query()
                .map_or("/", |p| p.as_str())
                .to_string();
            let to = format!("/login?next={}", percent(&next));
            Err(Redirect::to(&to).into_response())
        } else {
            Err((
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
                "log in first (or send Authorization: Bearer TOKEN)",
            )
                .into_response())
        }
    }
}

/// `GET /login`.
#[derive(Debug, serde::Deserialize)]
pub struct LoginQuery {
    #[serde(default)]
    next: String,
}

/// `GET /login`: the token form.
pub async fn login_page(State(web): State<Arc<Web>>, Query(q): Query<LoginQuery>) -> Response {
    login_form(&web, &q.next, None, StatusCode::OK)
}

fn login_form(web: &Web, next: &str, error: Option<&str>, code: StatusCode) -> Response {
    let body = if web.auth.required() {
        html! {
            h1 { "Log in" }
            p { "Paste the token " code { "baton-controller ca issue-operator NAME --tenant T --role R --token" } " printed." }
            @if let Some(e) = error { p.error role="alert" { "Not accepted: " (e) "." } }
            form method="post" action="/login" {
                input type="hidden" name="next" value=(safe_next(next));
                label for="token" { "Token" }
                input #token type="password" name="token" autocomplete="off" required autofocus;
                button type="submit" { "Log in" }
            }
        }
    } else {
        html! {
            h1 { "No log-in here" }
            p { "This controller is plaintext (" code { "--insecure" } ", loopback): every caller acts for every tenant. " a href="/" { "To the fleet" } }
        }
    };
    (code, layout::bare("Log in", body)).into_response()
}

/// `POST /login` form.
#[derive(serde::Deserialize)]
pub struct LoginForm {
    token: String,
    #[serde(default)]
    next: String,
}

impl std::fmt::Debug for LoginForm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token.
        f.debug_struct("LoginForm")
            .field("next", &self.next)
            .finish()
    }
}

/// `POST /login`: a token for a session cookie.
///
/// Refused without looking at the token (429, `Retry-After`; neither
/// logged as a failure nor audited, so a flood fills neither) while its
/// source, or the token's first characters from any source, has failed
/// too often ([`LoginAttempt`]). A token looked at and refused counts
/// against both, is audited (`login`, `dashboard from SOURCE`,
/// `Unauthenticated: WHY`, under the token's operator when it is known)
/// and logged at WARN with one fixed phrase and the source as a field,
/// for a log watcher such as fail2ban:
///
/// ```text
/// dashboard log-in failed source=SOURCE reason="WHY"
/// ```
///
/// SOURCE is what the throttle counts: an IPv4 address, an IPv6 host's
/// /64 (`2001:db8:1:2::/64`), or `unknown`.
pub async fn login(
    State(web): State<Arc<Web>>,
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    jar: CookieJar,
    Form(f): Form<LoginForm>,
) -> Response {
    if let Err(r) = same_origin(&headers, web.auth.secure_cookie) {
        return r.into_response();
    }
    let source = source_of(peer.map(|Extension(p)| p));
    let offered = f.token.trim();
    let attempt = LoginAttempt::new(
        &source,
        offered.strip_prefix(tokens::PREFIX).unwrap_or(offered),
    );
    match web.app.login_allowed(&attempt).await {
        Ok(Ok(())) => {}
        Ok(Err(Throttled { by, wait })) => {
            let secs = wait.as_secs() + 1;
            let (by, whose) = match by {
                ThrottledBy::Source => ("source", "from your address"),
                ThrottledBy::Token => ("token", "with this token"),
            };
            tracing::info!(%source, by, "dashboard log-in refused: too many failed log-ins");
            let mut r = login_form(
                &web,
                &f.next,
                Some(&format!(
                    "too many failed log-ins {whose}; try again in {secs} s"
                )),
                StatusCode::TOO_MANY_REQUESTS,
            );
            if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
                r.headers_mut().insert(header::RETRY_AFTER, v);
            }
            return r;
        }
        Err(e) => return super::app_error(e),
    }
    let grant = match web.auth.grant(&f.token) {
        Ok(g) => g,
        Err(refused) => {
            let why = refused.to_string();
            // The phrase and the field are what log watchers match (see
            // above, and docs): change neither lightly.
            tracing::warn!(source = %source, reason = why.as_str(), "dashboard log-in failed");
            if let Err(e) = web.app.login_failed(&attempt, refused.whose(), &why).await {
                tracing::warn!("dashboard: a failed log-in not counted or not audited: {e}");
            }
            return login_form(&web, &f.next, Some(&why), StatusCode::UNAUTHORIZED);
        }
    };
    let caller = Caller::new(grant.identity.clone());
    let id = random_hex::<32>();
    let opened = web
        .app
        .open_session(NewSession {
            id_hash: session_hash(&id),
            who: grant.identity,
            serial: grant.serial,
            not_after: RefTime::from_nanos(grant.not_after.saturating_mul(1_000_000_000)),
            csrf: random_hex::<16>(),
        })
        .await;
    if let Err(e) = opened {
        let code = super::status_of(&e);
        return login_form(&web, &f.next, Some(&e.to_string()), code);
    }
    let tenant = caller.tenant().unwrap_or_default().to_string();
    // Recorded like every other action; a log-in that cannot be audited
    // is not granted.
    if let Err(e) = web
        .app
        .audited(&caller, &tenant, "login", "dashboard", Ok(()))
        .await
    {
        if let Err(e) = web.app.close_session(&session_hash(&id)).await {
            tracing::warn!("dashboard: a session whose log-in was not audited stays open: {e}");
        }
        return super::app_error(e);
    }
    let jar = jar.add(session_cookie(id));
    (jar, Redirect::to(&safe_next(&f.next))).into_response()
}

/// `POST /logout` form.
#[derive(Debug, serde::Deserialize)]
pub struct LogoutForm {
    #[serde(default)]
    csrf: String,
}

/// `POST /logout`: the session closed, and the browser told to drop its
/// cookie (a removal with the same attributes, or a `__Host-` cookie's
/// removal is itself refused).
pub async fn logout(
    State(web): State<Arc<Web>>,
    who: Who,
    headers: HeaderMap,
    jar: CookieJar,
    Form(f): Form<LogoutForm>,
) -> Response {
    if let Err(r) = who.check_post(&headers, Some(&f.csrf)) {
        return r.into_response();
    }
    if let Some(c) = jar.get(COOKIE)
        && let Err(e) = web.app.close_session(&session_hash(c.value())).await
    {
        return super::app_error(e);
    }
    let jar = jar.remove(session_cookie(String::new()));
    (jar, Redirect::to("/login")).into_response()
}

/// Where to go after log-in: a path on this site, never another site.
fn safe_next(next: &str) -> String {
    // Visible ASCII only: browsers drop tabs and newlines from URLs, so
    // `/<TAB>/evil.example` would become `//evil.example`.
    let visible = next.bytes().all(|b| (0x21..=0x7e).contains(&b));
    if visible && next.starts_with('/') && !next.starts_with("//") && !next.contains('\\') {
        next.to_string()
    } else {
        "/".to_string()
    }
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
}

fn random_hex<const N: usize>() -> String {
    let b: [u8; N] = rand::random();
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && !b.is_empty() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Percent-encoding of a query value (what is not unreserved).
pub fn percent(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn only_a_local_path_is_followed_after_log_in() {
        assert_eq!(safe_next("/agents/a1?x=1"), "/agents/a1?x=1");
        for evil in [
            "//evil.example/",
            "https://evil.example/",
            "/\\evil",
            "",
            "/\t/evil.example",
            "/\n/evil.example",
            "/ /evil.example",
        ] {
            assert_eq!(safe_next(evil), "/", "{evil}");
        }
    }

    #[test]
    fn cookies_and_bearer_tokens_are_read_from_their_headers() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; __Host-baton_session=abc; b=2"),
        );
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer  baton_x "),
        );
        let jar = CookieJar::from_headers(&h);
        assert_eq!(jar.get(COOKIE).map(Cookie::value), Some("abc"));
        assert!(jar.get("c").is_none());
        assert_eq!(bearer(&h), Some("baton_x"));
        assert!(constant_time_eq(b"ab", b"ab") && !constant_time_eq(b"ab", b"ac"));
        assert!(
            !constant_time_eq(b"", b""),
            "an empty CSRF token never matches"
        );
    }

    #[test]
    fn the_session_cookie_is_set_for_this_host_and_removed_alike() {
        let set = |jar: CookieJar| {
            let r = (jar, ()).into_response();
            let v: Vec<String> = r
                .headers()
                .get_all(header::SET_COOKIE)
                .iter()
                .map(|v| v.to_str().unwrap_or_default().to_string())
                .collect();
            v
        };
        let attrs = |c: &str| {
            let mut a: Vec<String> = c.split("; ").skip(1).map(str::to_string).collect();
            a.retain(|x| !x.starts_with("Expires="));
            a.sort();
            a
        };
        let added = set(CookieJar::new().add(session_cookie("ab12".into())));
        assert_eq!(added.len(), 1);
        assert!(
            added[0].starts_with("__Host-baton_session=ab12; "),
            "{added:?}"
        );
        assert_eq!(
            attrs(&added[0]),
            [
                "HttpOnly",
                "Max-Age=43200",
                "Path=/",
                "SameSite=Strict",
                "Secure"
            ]
        );
        // Log-out: the browser's cookie replaced by an expired one with the
        // same attributes (a `__Host-` cookie without them is refused).
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("__Host-baton_session=ab12"),
        );
        let removed = set(CookieJar::from_headers(&h).remove(session_cookie(String::new())));
        assert_eq!(removed.len(), 1);
        assert!(
            removed[0].starts_with("__Host-baton_session=; "),
            "{removed:?}"
        );
        assert_eq!(
            attrs(&removed[0]),
            [
                "HttpOnly",
                "Max-Age=0",
                "Path=/",
                "SameSite=Strict",
                "Secure"
            ]
        );
    }

    #[test]
    fn a_cross_site_post_is_refused() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8443"));
        assert!(
            same_origin(&h, true).is_ok(),
            "no Origin: a non-browser client"
        );
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://127.0.0.1:8443"),
        );
        assert!(same_origin(&h, true).is_ok());
        assert!(same_origin(&h, false).is_err(), "the scheme counts");
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://evil.example"),
        );
        assert!(same_origin(&h, true).is_err());
    }

    #[test]
    fn a_plaintext_dashboard_answers_to_addresses_only() {
        let host = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(header::HOST, HeaderValue::from_static(v));
            plain_host_ok(&h)
        };
        assert!(host("127.0.0.1:8080") && host("localhost:8080") && host("[::1]:8080"));
        assert!(host("10.0.0.5"));
        assert!(!host("evil.example:8080"), "a rebound name");
        assert!(!host("127.0.0.1.evil.example"));
        assert!(!plain_host_ok(&HeaderMap::new()));
    }
}
