//! The dashboard's routes in-process, on a TLS-mode controller (tokens,
//! tenants, roles): who gets in, and what each tenant sees.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use baton_model::RefTime;
use std::collections::HashSet;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use tower::ServiceExt;

use super::{Web, auth, router};
use baton_app::{App, AppConfig};
use baton_model::Binding;
use baton_pki::ca::{self, CaDir, Validity};
use baton_pki::identity::{Identity, Role};
use baton_store::memory::MemoryStore;
use baton_store::{Store, StoreOps, contract};

mod actions;

struct Fixture {
    _dir: tempfile::TempDir,
    /// The application's store, for a test to write what agents would.
    store: Arc<dyn Store>,
    ca: CaDir,
    web: Arc<Web>,
    revoked: tokio::sync::watch::Sender<Arc<HashSet<String>>>,
    _stop: tokio::sync::watch::Sender<bool>,
}

fn token(ca: &CaDir, name: &str, tenant: &str, role: Role) -> String {
    let now = jiff::Timestamp::now();
    let who = Identity::Operator {
        name: name.into(),
        tenant: tenant.into(),
        role,
    };
    let cert = ca::issue(ca, &who, Validity::days(now, 1), ca::Existing::Refuse)
        .unwrap()
        .cert;
    baton_pki::tokens::issue(ca, &cert).unwrap()
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let ca = CaDir::new(dir.path());
    ca::init(&ca, &[], jiff::Timestamp::now()).unwrap();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new(Binding::Tenants));
    let app = App::new(store.clone(), AppConfig::new(Binding::Tenants));
    for (id, tenant) in [("press-a", "plant-a"), ("press-b", "plant-b")] {
        let hello = contract::hello_in(id, &[tenant], &[("line", "3")], 1);
        store.agent_hello(hello).await.unwrap();
    }
    // No stream holds them (as after a controller's start).
    store.all_disconnected().await.unwrap();
    let revoked = tokio::sync::watch::Sender::new(Arc::new(HashSet::new()));
    let (stop, shutdown) = tokio::sync::watch::channel(false);
    let web = Arc::new(Web {
        app,
        auth: auth::Auth::new(Some(&ca), revoked.subscribe()),
        shutdown,
        counts: Default::default(),
    });
    Fixture {
        _dir: dir,
        store,
        ca,
        web,
        revoked,
        _stop: stop,
    }
}

async fn call(web: &Arc<Web>, req: Request<Body>) -> (StatusCode, axum::http::HeaderMap, String) {
    let r = router(web.clone()).oneshot(req).await.unwrap();
    let (parts, body) = r.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 24).await.unwrap();
    (
        parts.status,
        parts.headers,
        String::from_utf8_lossy(&bytes).into_owned(),
    )
}

fn get(path: &str, bearer: Option<&str>) -> Request<Body> {
    let mut b = Request::get(path);
    if let Some(t) = bearer {
        b = b.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    b.body(Body::empty()).unwrap()
}

#[tokio::test]
async fn a_token_logs_in_and_a_tenant_sees_only_its_own() {
    let f = fixture().await;
    let ann = token(&f.ca, "ann", "plant-a", Role::Viewer);
    // Nobody: the page sends to the log-in, the JSON says 401.
    let (code, h, _) = call(&f.web, get("/agents/press-a", None)).await;
    assert_eq!(code, StatusCode::SEE_OTHER);
    assert!(
        h[header::LOCATION]
            .to_str()
            .unwrap()
            .starts_with("/login?next=/agents/press-a")
    );
    let (code, _, _) = call(&f.web, get("/api/agents", None)).await;
    assert_eq!(code, StatusCode::UNAUTHORIZED);
    // The log-in form: a cookie, HttpOnly, Secure, SameSite=Strict.
    let login = Request::post("/login")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(format!("token={ann}&next=/")))
        .unwrap();
    let (code, h, _) = call(&f.web, login).await;
    assert_eq!(code, StatusCode::SEE_OTHER, "logged in");
    let cookie = h[header::SET_COOKIE].to_str().unwrap().to_string();
    for attr in ["HttpOnly", "Secure", "SameSite=Strict"] {
        assert!(cookie.contains(attr), "{cookie}");
    }
    let session = cookie.split(';').next().unwrap().to_string();
    let with_cookie = |path: &str| {
        Request::get(path)
            .header(header::COOKIE, session.clone())
            .body(Body::empty())
            .unwrap()
    };
    let (code, _, page) = call(&f.web, with_cookie("/")).await;
    assert_eq!(code, StatusCode::OK);
    assert!(
        page.contains("press-a") && !page.contains("press-b"),
        "{page}"
    );
    // Another tenant's agent: "no agent", page and JSON alike.
    let (code, _, body) = call(&f.web, with_cookie("/agents/press-b")).await;
    assert_eq!(
        (code, body.as_str()),
        (StatusCode::NOT_FOUND, "no agent press-b")
    );
    let (code, _, _) = call(&f.web, with_cookie("/api/agents/press-b/clock")).await;
    assert_eq!(code, StatusCode::NOT_FOUND);
    let (_, _, json) = call(&f.web, get("/api/agents", Some(&ann))).await;
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let ids: Vec<&str> = v["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["press-a"]);
    // A filter that matches nothing, and one that matches.
    let (_, _, json) = call(&f.web, get("/api/agents?label=line%3D4", Some(&ann))).await;
    assert!(json.contains(r#""agents":[]"#), "{json}");
    let (_, _, json) = call(
        &f.web,
        get("/api/agents?label=line%3D3&state=offline", Some(&ann)),
    )
    .await;
    assert!(json.contains("press-a"), "{json}");
    // A viewer: no push form, no audit, and the endpoint refuses.
    let (_, _, page) = call(&f.web, with_cookie("/push")).await;
    assert!(!page.contains("<form id=\"push-form\""), "{page}");
    let (code, _, _) = call(&f.web, with_cookie("/audit")).await;
    assert_eq!(code, StatusCode::FORBIDDEN);
    let csrf = page
        .split("X-CSRF-Token&quot;:&quot;")
        .nth(1)
        .and_then(|s| s.split("&quot;").next())
        .unwrap()
        .to_string();
    let push = |csrf: &str| {
        Request::post("/push")
            .header(header::COOKIE, session.clone())
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::from(format!("csrf={csrf}&yaml=pack%3A+p")))
            .unwrap()
    };
    let (code, _, body) = call(&f.web, push("wrong")).await;
    assert_eq!(code, StatusCode::FORBIDDEN, "{body}");
    assert!(body.contains("CSRF"));
    let (code, _, _) = call(&f.web, push(&csrf)).await;
    assert_eq!(code, StatusCode::FORBIDDEN, "a viewer may not push");
    // Revoked: the session and the token stop at once.
    let serial = token_serial(&f.ca);
    f.revoked.send_replace(Arc::new([serial].into()));
    let (code, _, _) = call(&f.web, with_cookie("/")).await;
    assert_eq!(code, StatusCode::SEE_OTHER);
    let (code, _, _) = call(&f.web, get("/api/agents", Some(&ann))).await;
    assert_eq!(code, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn an_operator_pushes_from_the_page_and_an_admin_reads_the_audit() {
    let f = fixture().await;
    let bob = token(&f.ca, "bob", "plant-b", Role::Admin);
    let yaml = "tenant: plant-b\npack: blink\nversion: 1\ntargets: {agents: [press-b]}\ninstructions:\n  - {id: t, action: noop, every: 1s}\n";
    let form = format!("yaml={}", auth::percent(yaml).replace('/', "%2F"));
    let req = Request::post("/push")
        .header(header::AUTHORIZATION, format!("Bearer {bob}"))
        .header(header::ACCEPT, "application/json")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(form))
        .unwrap();
    let (code, _, body) = call(&f.web, req).await;
    assert_eq!(code, StatusCode::OK, "{body}");
    assert!(body.contains(r#""agents":["press-b"]"#), "{body}");
    let (code, _, page) = call(&f.web, get("/packs/blink", Some(&bob))).await;
    assert_eq!(code, StatusCode::OK);
    assert!(page.contains("press-b"), "{page}");
    // A version with a rollout: the pack page shows it, stage and state.
    let v2 = format!(
        "{}rollout:\n  stages: [{{percent: 100}}]\n",
        yaml.replace("version: 1", "version: 2")
    );
    let req = Request::post("/push")
        .header(header::AUTHORIZATION, format!("Bearer {bob}"))
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(format!(
            "yaml={}",
            auth::percent(&v2).replace('/', "%2F")
        )))
        .unwrap();
    let (code, _, body) = call(&f.web, req).await;
    assert_eq!(code, StatusCode::OK, "{body}");
    assert!(body.contains("through its rollout"), "{body}");
    let (_, _, page) = call(&f.web, get("/packs/blink", Some(&bob))).await;
    assert!(
        page.contains("Rollout of v2") && page.contains("Stage"),
        "{page}"
    );
    // Both versions listed, newest first; the older one's deliveries on
    // asking.
    let v2_at = page.find("v2 (shown)").expect("v2 listed as shown");
    let v1_at = page.find("version=1\">v1").expect("v1 linked");
    assert!(v2_at < v1_at, "newest first");
    let (code, _, page) = call(&f.web, get("/packs/blink?version=1", Some(&bob))).await;
    assert_eq!(code, StatusCode::OK);
    assert!(
        page.contains("Deliveries of v1") && page.contains("v1 (shown)"),
        "{page}"
    );
    // A version never stored: not found, not an empty table.
    let (code, _, _) = call(&f.web, get("/packs/blink?version=99", Some(&bob))).await;
    assert_eq!(code, StatusCode::NOT_FOUND);
    let (code, _, page) = call(&f.web, get("/audit", Some(&bob))).await;
    assert_eq!(code, StatusCode::OK);
    assert!(page.contains("plant-b/blink v1"), "{page}");
    // A cross-site form post is refused before anything else.
    let req = Request::post("/push/check")
        .header(header::AUTHORIZATION, format!("Bearer {bob}"))
        .header(header::HOST, "127.0.0.1:1")
        .header(header::ORIGIN, "https://evil.example")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from("yaml=x"))
        .unwrap();
    assert_eq!(call(&f.web, req).await.0, StatusCode::FORBIDDEN);
    // Another tenant's pack: not found.
    let ann = token(&f.ca, "ann", "plant-a", Role::Admin);
    let (code, _, _) = call(&f.web, get("/packs/blink?tenant=plant-b", Some(&ann))).await;
    assert_eq!(code, StatusCode::NOT_FOUND);
    // A wrong token: the log-in page says so, with a 401.
    let req = Request::post("/login")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from("token=baton_00"))
        .unwrap();
    let (code, _, page) = call(&f.web, req).await;
    assert_eq!(code, StatusCode::UNAUTHORIZED);
    assert!(page.contains("unknown token"), "{page}");
}

/// More executions in the hour than a page reads: the page shows the
/// newest ones (a shorter window, stated), not the hour's first.
#[tokio::test]
async fn the_agent_page_shows_the_newest_executions_and_says_over_what_window() {
    let f = fixture().await;
    let ann = token(&f.ca, "ann", "plant-a", Role::Viewer);
    let now = baton_app::now_ns();
    let n = 6_000u64;
    let rows: Vec<baton_model::FeedbackRow> = (1..=n)
        .map(|seq| baton_model::FeedbackRow {
            id: 0,
            agent_id: "press-a".into(),
            journal_id: "j-press-a".into(),
            seq,
            execution_id: format!("e{seq}"),
            tenant: "plant-a".into(),
            pack: "p".into(),
            version: 1,
            instruction: "tick".into(),
            occurrence: Some(RefTime::from_nanos(seq as i64)),
            attempt: 1,
            scheduled: RefTime::from_nanos(now - (n - seq) as i64 * 100_000_000),
            actual: RefTime::from_nanos(now - (n - seq) as i64 * 100_000_000 + 5_000),
            lateness: baton_model::time::span(5_000),
            outcome: baton_proto::wire::Outcome::Ok,
            reason: baton_proto::wire::Reason::Unspecified,
            event: "executed".into(),
            action: "noop".into(),
            detail: String::new(),
            value: None,
            dropped_before: 0,
            uncertainty: baton_model::time::span(0),
            clock_source: baton_proto::wire::ClockSource::Unspecified,
            clock_state: baton_proto::wire::ClockState::Unspecified,
            received: RefTime::from_nanos(now - (n - seq) as i64 * 100_000_000),
        })
        .collect();
    f.store.put_feedback(1, rows).await.unwrap();
    let (code, _, page) = call(&f.web, get("/agents/press-a", Some(&ann))).await;
    assert_eq!(code, StatusCode::OK, "{page}");
    let newest = format!("data-received-ns=\"{now}\"");
    assert!(
        page.contains(&newest),
        "the newest execution is on the page"
    );
    assert!(
        page.contains("Start lateness, last 3 min"),
        "the window is stated"
    );
}

/// Another controller (a replica) over the fixture's store: its own
/// application, its own dashboard, the same CA.
fn replica(f: &Fixture) -> Arc<Web> {
    let app = App::new(f.store.clone(), AppConfig::new(Binding::Tenants));
    Arc::new(Web {
        app,
        auth: auth::Auth::new(Some(&f.ca), f.revoked.subscribe()),
        shutdown: f.web.shutdown.clone(),
        counts: Default::default(),
    })
}

fn login_from(token: &str, peer: &str) -> Request<Body> {
    let mut r = Request::post("/login")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(format!("token={token}&next=/")))
        .unwrap();
    r.extensions_mut().insert(auth::Peer(peer.parse().unwrap()));
    r
}

/// The `name=value` of a log-in's `Set-Cookie`.
/// The serial of the certificate behind the (one) token issued in `ca`.
fn token_serial(ca: &CaDir) -> String {
    baton_pki::tokens::read(&baton_pki::tokens::path(ca))
        .unwrap()
        .values()
        .next()
        .unwrap()
        .serial
        .clone()
}

async fn log_in(web: &Arc<Web>, token: &str) -> String {
    let (code, h, body) = call(web, login_from(token, "192.0.2.1:4000")).await;
    assert_eq!(code, StatusCode::SEE_OTHER, "{body}");
    h[header::SET_COOKIE]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string()
}

fn with_cookie(path: &str, cookie: &str) -> Request<Body> {
    Request::get(path)
        .header(header::COOKIE, cookie)
        .body(Body::empty())
        .unwrap()
}

/// The CSRF token a page gives its session.
async fn csrf_of(web: &Arc<Web>, cookie: &str) -> String {
    let (_, _, page) = call(web, with_cookie("/push", cookie)).await;
    page.split("X-CSRF-Token&quot;:&quot;")
        .nth(1)
        .and_then(|s| s.split("&quot;").next())
        .unwrap()
        .to_string()
}

/// Sessions are the store's: one made through replica A is valid through
/// B, with its CSRF token; a log-out through B ends it on A; a
/// revocation recorded in the store by any replica ends it everywhere,
/// though neither replica's own list has heard of it. The store holds
/// the cookie's hash, never the cookie.
#[tokio::test]
async fn a_session_is_valid_on_every_replica_and_ended_on_all() {
    let f = fixture().await;
    let b = replica(&f);
    let ann = token(&f.ca, "ann", "plant-a", Role::Operator);
    let cookie = log_in(&f.web, &ann).await;
    let value = cookie.split_once('=').unwrap().1.to_string();
    let (code, _, page) = call(&b, with_cookie("/", &cookie)).await;
    assert_eq!(code, StatusCode::OK, "replica B takes A's session");
    assert!(page.contains("press-a"), "{page}");
    // The CSRF token is the session's, whichever replica asks.
    assert_eq!(csrf_of(&f.web, &cookie).await, csrf_of(&b, &cookie).await);
    // The store knows the hash only.
    let now = RefTime::from_nanos(baton_app::now_ns());
    assert_eq!(f.store.session(&value, now).await.unwrap(), None);
    let stored = f
        .store
        .session(&auth::session_hash(&value), now)
        .await
        .unwrap();
    assert!(stored.is_some_and(|s| s.csrf.len() == 32 && !s.csrf.contains(&value)));
    // Log-out through B ends it on A.
    let csrf = csrf_of(&b, &cookie).await;
    let logout = Request::post("/logout")
        .header(header::COOKIE, cookie.clone())
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(format!("csrf={csrf}")))
        .unwrap();
    assert_eq!(call(&b, logout).await.0, StatusCode::SEE_OTHER);
    for web in [&f.web, &b] {
        let (code, _, _) = call(web, with_cookie("/", &cookie)).await;
        assert_eq!(code, StatusCode::SEE_OTHER, "logged out everywhere");
    }
    // A revocation recorded in the store (by a third replica, say) ends
    // a session on both, at once.
    let cookie = log_in(&b, &ann).await;
    assert_eq!(
        call(&f.web, with_cookie("/", &cookie)).await.0,
        StatusCode::OK
    );
    let serial = token_serial(&f.ca);
    let rev = baton_model::RevocationRow {
        serial,
        kind: "operator".into(),
        name: "ann".into(),
        at: now,
    };
    f.store.revoke(vec![(rev, Vec::new())]).await.unwrap();
    for web in [&f.web, &b] {
        let (code, _, _) = call(web, with_cookie("/", &cookie)).await;
        assert_eq!(code, StatusCode::SEE_OTHER, "revoked everywhere");
    }
}

/// A certificate's seventeenth session ends its first; the others stand.
#[tokio::test]
async fn a_certificate_holds_at_most_its_cap_of_sessions() {
    let f = fixture().await;
    let ann = token(&f.ca, "ann", "plant-a", Role::Viewer);
    let mut cookies = Vec::new();
    for _ in 0..=auth::SESSIONS_PER_IDENTITY {
        cookies.push(log_in(&f.web, &ann).await);
    }
    let code = |c: &String| {
        let req = with_cookie("/api/agents", c);
        let web = f.web.clone();
        async move { call(&web, req).await.0 }
    };
    assert_eq!(
        code(&cookies[0]).await,
        StatusCode::UNAUTHORIZED,
        "the oldest went"
    );
    for c in &cookies[1..] {
        assert_eq!(code(c).await, StatusCode::OK);
    }
}

/// Failed log-ins are counted per address in the store: past the
/// allowance an address is refused (429, Retry-After) even with a good
/// token, on every replica; another address is not.
#[tokio::test]
async fn failed_log_ins_are_throttled_per_address_across_replicas() {
    let f = fixture().await;
    let b = replica(&f);
    let ann = token(&f.ca, "ann", "plant-a", Role::Viewer);
    let allowed = AppConfig::new(Binding::Tenants).login.failures;
    for i in 0..allowed {
        // Spread over both replicas.
        let web = if i % 2 == 0 { &f.web } else { &b };
        let (code, _, _) = call(web, login_from("baton_wrong", "198.51.100.7:1000")).await;
        assert_eq!(code, StatusCode::UNAUTHORIZED);
    }
    for web in [&f.web, &b] {
        let (code, h, page) = call(web, login_from(&ann, "198.51.100.7:2000")).await;
        assert_eq!(code, StatusCode::TOO_MANY_REQUESTS, "{page}");
        let wait: u64 = h[header::RETRY_AFTER].to_str().unwrap().parse().unwrap();
        assert!((1..=301).contains(&wait), "{wait}");
        assert!(page.contains("too many failed log-ins"), "{page}");
    }
    // An IPv6 host is its /64; another address logs in.
    let (code, _, _) = call(&b, login_from(&ann, "198.51.100.8:2000")).await;
    assert_eq!(code, StatusCode::SEE_OTHER);
    assert_eq!(
        auth::source_of(Some(auth::Peer(
            "[2001:db8:1:2:3:4:5:6]:1".parse().unwrap()
        ))),
        "2001:db8:1:2::/64"
    );
    assert_eq!(
        auth::source_of(Some(auth::Peer("[::ffff:192.0.2.9]:1".parse().unwrap()))),
        "192.0.2.9"
    );
}

/// The dashboard's log-in rows of the audit log, oldest first (read
/// fleet-wide: a token nobody was issued is recorded in no tenant).
/// Who, tenant, role, target and result of an audit row.
fn said(r: &baton_model::AuditRow) -> (&str, &str, &str, &str, &str) {
    (&r.who, &r.tenant, &r.role, &r.target, &r.result)
}

async fn login_audit(f: &Fixture) -> Vec<baton_model::AuditRow> {
    let mut rows = f
        .store
        .audit(None, RefTime::from_nanos(0), 1_000)
        .await
        .unwrap();
    rows.retain(|r| r.action == "login");
    rows.sort_by_key(|r| r.at);
    rows
}

/// A token of the right shape that nobody was issued, its first 16
/// characters after `baton_` given.
fn wrong_token(first: &str) -> String {
    assert_eq!(first.len(), 16);
    format!("baton_{first}{}", "0".repeat(48))
}

/// Each failed log-in whose token was looked at is audited with the
/// client's address, before the address is throttled: the 11th wrong
/// log-in from one address in a row is refused (429) and not audited, and
/// the ten before it are in the audit log (who `unknown`, no tenant, role
/// `none`). A known token that is refused (revoked) is audited under its
/// operator. No row holds any part of a token.
#[tokio::test]
async fn failed_log_ins_are_audited_with_the_address_until_it_is_throttled() {
    let f = fixture().await;
    let allowed = AppConfig::new(Binding::Tenants).login.failures;
    // A different token each time: the address, not a token, is what is
    // throttled here.
    let tokens: Vec<String> = (0..=allowed)
        .map(|i| wrong_token(&format!("{i:016x}")))
        .collect();
    for t in &tokens[..allowed as usize] {
        let (code, _, page) = call(&f.web, login_from(t, "198.51.100.20:3000")).await;
        assert_eq!(code, StatusCode::UNAUTHORIZED, "{page}");
    }
    let (code, h, page) = call(
        &f.web,
        login_from(&tokens[allowed as usize], "198.51.100.20:3001"),
    )
    .await;
    assert_eq!(code, StatusCode::TOO_MANY_REQUESTS, "{page}");
    assert!(h.contains_key(header::RETRY_AFTER));
    assert!(page.contains("from your address"), "{page}");
    let rows = login_audit(&f).await;
    assert_eq!(
        rows.len(),
        allowed as usize,
        "the throttled one is not audited: {rows:?}"
    );
    for r in &rows {
        assert_eq!(
            said(r),
            (
                "unknown",
                "",
                "none",
                "dashboard from 198.51.100.20",
                "Unauthenticated: unknown token"
            )
        );
    }
    // A revoked operator's token, from another address: audited under
    // the operator, in its tenant, with its role.
    let ann = token(&f.ca, "ann", "plant-a", Role::Operator);
    f.revoked
        .send_replace(Arc::new([token_serial(&f.ca)].into()));
    let (code, _, page) = call(&f.web, login_from(&ann, "203.0.113.5:4000")).await;
    assert_eq!(code, StatusCode::UNAUTHORIZED, "{page}");
    let rows = login_audit(&f).await;
    let last = rows.last().unwrap();
    assert_eq!(
        said(last),
        (
            "ann",
            "plant-a",
            "operator",
            "dashboard from 203.0.113.5",
            "Unauthenticated: its certificate is revoked"
        )
    );
    // Nothing of any token: neither its prefix nor its first characters.
    for r in &rows {
        let text = format!(
            "{} {} {} {} {}",
            r.who, r.tenant, r.role, r.target, r.result
        );
        assert!(!text.contains("baton_"), "{text}");
        for t in tokens.iter().chain([&ann]) {
            assert!(!text.contains(&t["baton_".len()..][..8]), "{text}");
        }
    }
}

/// One token tried from many addresses (a leaked or revoked token
/// replayed) is throttled by its first 16 characters, whatever the
/// address: the 11th address is refused (429) without the token being
/// looked at, and so is a token that shares those characters; another
/// token from that address still logs in.
#[tokio::test]
async fn a_token_tried_from_many_addresses_is_throttled() {
    let f = fixture().await;
    let allowed = AppConfig::new(Binding::Tenants).login.failures;
    let replayed = wrong_token("0123456789abcdef");
    for i in 1..=allowed {
        let (code, _, page) = call(
            &f.web,
            login_from(&replayed, &format!("198.51.100.{i}:5000")),
        )
        .await;
        assert_eq!(code, StatusCode::UNAUTHORIZED, "address {i}: {page}");
    }
    let eleventh = "198.51.100.111:5000";
    let (code, h, page) = call(&f.web, login_from(&replayed, eleventh)).await;
    assert_eq!(code, StatusCode::TOO_MANY_REQUESTS, "{page}");
    let wait: u64 = h[header::RETRY_AFTER].to_str().unwrap().parse().unwrap();
    assert!((1..=301).contains(&wait), "{wait}");
    assert!(page.contains("with this token"), "{page}");
    // The same first 16 characters, another ending: refused alike.
    let sibling = format!("baton_0123456789abcdef{}", "f".repeat(48));
    let (code, _, _) = call(&f.web, login_from(&sibling, eleventh)).await;
    assert_eq!(code, StatusCode::TOO_MANY_REQUESTS);
    // One character fewer in common: looked at (and refused as unknown).
    let cousin = wrong_token("0123456789abcdee");
    let (code, _, _) = call(&f.web, login_from(&cousin, eleventh)).await;
    assert_eq!(code, StatusCode::UNAUTHORIZED);
    // The address itself is not throttled: a good token logs in there.
    let ann = token(&f.ca, "ann", "plant-a", Role::Viewer);
    let (code, _, page) = call(&f.web, login_from(&ann, eleventh)).await;
    assert_eq!(code, StatusCode::SEE_OTHER, "{page}");
    // Each address's failures are audited once; the refusals are not.
    let rows = login_audit(&f).await;
    let failed: Vec<&str> = rows
        .iter()
        .filter(|r| r.result.starts_with("Unauthenticated"))
        .map(|r| r.target.as_str())
        .collect();
    let mut expected: Vec<String> = (1..=allowed)
        .map(|i| format!("dashboard from 198.51.100.{i}"))
        .collect();
    expected.push("dashboard from 198.51.100.111".into());
    assert_eq!(failed, expected);
}

/// A `MakeWriter` into a shared buffer: what a log line looks like.
#[derive(Clone, Default)]
struct LogBuf(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogBuf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogBuf {
    type Writer = LogBuf;
    fn make_writer(&'a self) -> LogBuf {
        self.clone()
    }
}

/// The line a failed log-in writes is the one the docs give log watchers
/// (fail2ban): `dashboard log-in failed source=ADDR`, in the text and
/// journald formats (WARN: `<4>`), and as the message and `source` field
/// in JSON.
#[tokio::test]
async fn a_failed_log_in_writes_the_line_log_watchers_match() {
    use baton_service::log::{Output, layer_to};
    use tracing_subscriber::layer::SubscriberExt;
    let f = fixture().await;
    let line = |out: Output, peer: &'static str| {
        let web = f.web.clone();
        async move {
            let buf = LogBuf::default();
            let sub = tracing_subscriber::registry().with(layer_to(out, false, buf.clone()));
            let _on = tracing::subscriber::set_default(sub);
            let (code, _, _) = call(&web, login_from("baton_nope", peer)).await;
            assert_eq!(code, StatusCode::UNAUTHORIZED);
            let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
            text.lines()
                .find(|l| l.contains("dashboard log-in failed"))
                .unwrap_or_else(|| panic!("no failure line in {text:?}"))
                .to_string()
        }
    };
    let text = line(Output::Text, "198.51.100.40:1").await;
    assert!(text.contains(" WARN "), "{text}");
    assert!(
        text.contains("dashboard log-in failed source=198.51.100.40 reason=\"unknown token\""),
        "{text}"
    );
    let journald = line(Output::Journald, "198.51.100.41:1").await;
    assert!(journald.starts_with("<4>"), "{journald}");
    assert!(
        journald.contains("dashboard log-in failed source=198.51.100.41 "),
        "{journald}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&line(Output::Json, "198.51.100.42:1").await).unwrap();
    assert_eq!(json["fields"]["message"], "dashboard log-in failed");
    assert_eq!(json["fields"]["source"], "198.51.100.42");
    assert_eq!(json["level"], "WARN");
}

/// An admin of `tenant`, as the application takes a caller.
fn admin_of(name: &str, tenant: &str) -> baton_app::Caller {
    baton_app::Caller::new(baton_model::identity::Identity::Operator {
        name: name.into(),
        tenant: tenant.into(),
        role: baton_model::identity::Role::Admin,
    })
}

#[tokio::test]
async fn the_updates_page_shows_the_update_and_each_boxs_word_to_its_tenant_only() {
    let f = fixture().await;
    let ann = token(&f.ca, "ann", "plant-a", Role::Viewer);
    let bob = token(&f.ca, "bob", "plant-b", Role::Viewer);
    let (code, _, page) = call(&f.web, get("/updates", Some(&ann))).await;
    assert_eq!(code, StatusCode::OK);
    assert!(page.contains("No agent update yet"), "{page}");
    let release = baton_model::ReleaseRow {
        version: "2.0.0".into(),
        arch: "x86_64".into(),
        manifest: "{}".into(),
        key: "00112233aabbccdd".into(),
        signature: "c2ln".into(),
        size: 4,
        sha256: "ab".repeat(32),
        uploaded: RefTime::from_nanos(1),
        by: "ann".into(),
    };
    f.store
        .put_release(release, vec![vec![1, 2, 3, 4]])
        .await
        .unwrap();
    let admin = admin_of("ada", "plant-a");
    f.web
        .app
        .start_agent_update(&admin, "2.0.0", "rollout:\n  stages: [{percent: 100}]\n")
        .await
        .unwrap();
    let a = f.store.agent("press-a").await.unwrap().unwrap();
    f.store
        .record_update(
            "press-a",
            a.session_gen,
            baton_model::UpdateRow {
                version: "2.0.0".into(),
                phase: baton_model::UpdatePhase::Downloading,
                held_bytes: 2,
                size: 4,
                reason: String::new(),
                at: RefTime::from_nanos(2),
            },
        )
        .await
        .unwrap();
    let (code, _, page) = call(&f.web, get("/updates", Some(&ann))).await;
    assert_eq!(code, StatusCode::OK);
    for want in [
        "Update 1 to 2.0.0",
        "press-a",
        "downloading",
        "50%",
        "waiting_window",
    ] {
        assert!(page.contains(want), "{want}: {page}");
    }
    assert!(!page.contains("press-b"), "{page}");
    // Another tenant's operator does not see it.
    let (code, _, page) = call(&f.web, get("/updates", Some(&bob))).await;
    assert_eq!(code, StatusCode::OK);
    assert!(page.contains("No agent update yet"), "{page}");
    assert!(!page.contains("2.0.0"), "{page}");
    // Ended, and plant-b's own newer one started: each tenant's page shows
    // its own newest, never the other's.
    f.web
        .app
        .agent_update_command(
            &admin,
            Some(1),
            baton_app::rollouts::RolloutCommand::Abort,
            "",
        )
        .await
        .unwrap();
    let admin_b = admin_of("bea", "plant-b");
    f.web
        .app
        .start_agent_update(&admin_b, "2.0.0", "rollout:\n  stages: [{percent: 100}]\n")
        .await
        .unwrap();
    let (_, _, page) = call(&f.web, get("/updates", Some(&ann))).await;
    assert!(
        page.contains("Update 1 to 2.0.0") && page.contains("aborted"),
        "{page}"
    );
    assert!(
        !page.contains("press-b") && !page.contains("Update 2"),
        "{page}"
    );
    let (_, _, page) = call(&f.web, get("/updates", Some(&bob))).await;
    assert!(
        page.contains("Update 2 to 2.0.0") && page.contains("press-b"),
        "{page}"
    );
    assert!(!page.contains("press-a"), "{page}");
}
