//! The dashboard's actions: each confirmed on a page that says what it
//! will do and to how many agents, done by a CSRF-checked form through
//! the application (role-checked, audited, announced to open pages), and
//! the rollout's and fleet's health as the pages state it.

use super::*;
use baton_app::events::Event;
use baton_app::now_ns;
use baton_model::{Intent, SeenRow, StreamHealth};

const BLINK: &str = "tenant: plant-a\npack: blink\nversion: 1\ntargets: {agents: [press-a]}\ninstructions:\n  - {id: t, action: noop, every: 1s}\n";

fn form_post(path: &str, cookie: &str, body: String) -> Request<Body> {
    Request::post(path)
        .header(header::COOKIE, cookie)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(body))
        .unwrap()
}

async fn push_as(f: &Fixture, token: &str, yaml: &str) {
    let req = Request::post("/push")
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(format!(
            "yaml={}",
            auth::percent(yaml).replace('/', "%2F")
        )))
        .unwrap();
    let (code, _, body) = call(&f.web, req).await;
    assert_eq!(code, StatusCode::OK, "{body}");
}

/// The next operator action announced on `rx`, as its words.
fn announced(rx: &mut tokio::sync::broadcast::Receiver<Event>) -> Vec<String> {
    let mut out = Vec::new();
    while let Ok(e) = rx.try_recv() {
        if let Event::Action(a) = e {
            out.push(format!("{}/{}: {}", a.tenant, a.pack, a.text));
        }
    }
    out
}

#[tokio::test]
async fn a_pack_is_cancelled_from_its_page_after_a_confirmation() {
    let f = fixture().await;
    let olga = token(&f.ca, "olga", "plant-a", Role::Operator);
    push_as(&f, &olga, BLINK).await;
    // The pack page offers it to an operator, not to a viewer.
    let (_, _, page) = call(&f.web, get("/packs/blink", Some(&olga))).await;
    assert!(
        page.contains("/packs/blink/cancel?tenant=plant-a"),
        "{page}"
    );
    let ann = token(&f.ca, "ann", "plant-a", Role::Viewer);
    let (_, _, page) = call(&f.web, get("/packs/blink", Some(&ann))).await;
    assert!(!page.contains("Cancel pack…"), "a viewer has no action");
    // The confirmation: what it does, to how many agents.
    let (code, _, page) = call(&f.web, get("/packs/blink/cancel", Some(&olga))).await;
    assert_eq!(code, StatusCode::OK, "{page}");
    assert!(
        page.contains("<strong>0 agent(s)</strong> hold a version of it now")
            && page.contains("1 agent(s) are meant to hold it"),
        "{page}"
    );
    assert!(page.contains("id=\"confirm-form\""), "{page}");
    // A viewer's confirmation page says why not, with no button.
    let (code, _, page) = call(&f.web, get("/packs/blink/cancel", Some(&ann))).await;
    assert_eq!(code, StatusCode::FORBIDDEN);
    assert!(
        !page.contains("confirm-form") && page.contains("viewer"),
        "{page}"
    );
    // Another tenant's operator: no such pack, as for a pack that does not exist.
    let bob = token(&f.ca, "bob", "plant-b", Role::Operator);
    let (code, _, _) = call(
        &f.web,
        get("/packs/blink/cancel?tenant=plant-a", Some(&bob)),
    )
    .await;
    assert_eq!(code, StatusCode::NOT_FOUND);
    // The form's post: refused without the session's CSRF token...
    let cookie = log_in(&f.web, &olga).await;
    let (code, _, _) = call(
        &f.web,
        form_post("/packs/blink/cancel", &cookie, "tenant=plant-a".into()),
    )
    .await;
    assert_eq!(code, StatusCode::FORBIDDEN, "no CSRF token");
    let row = contract::row(&*f.store, "press-a", &contract::key("plant-a", "blink")).await;
    assert_eq!(row.intent, Intent::Hold, "nothing done without the token");
    // ... and done with it: the agent's row withdrawn, audited, announced.
    let mut rx = f.web.app.subscribe();
    let csrf = csrf_of(&f.web, &cookie).await;
    let (code, _, page) = call(
        &f.web,
        form_post(
            "/packs/blink/cancel",
            &cookie,
            format!("tenant=plant-a&csrf={csrf}"),
        ),
    )
    .await;
    assert_eq!(code, StatusCode::OK, "{page}");
    assert!(page.contains("Cancelled plant-a/blink (v1)"), "{page}");
    let row = contract::row(&*f.store, "press-a", &contract::key("plant-a", "blink")).await;
    assert_eq!(row.intent, Intent::Withdraw);
    assert_eq!(
        announced(&mut rx),
        ["plant-a/blink: olga cancelled the pack on 1 agent(s)"]
    );
    let audit = f
        .store
        .audit(Some("plant-a"), RefTime::from_nanos(0), 100)
        .await
        .unwrap();
    assert!(
        audit
            .iter()
            .any(|r| r.action == "cancel" && r.who == "olga" && r.result == "ok"),
        "{audit:?}"
    );
    // bob's refused try is audited under his own tenant.
    let bob_cookie = log_in(&f.web, &bob).await;
    let bob_csrf = csrf_of(&f.web, &bob_cookie).await;
    let (code, _, _) = call(
        &f.web,
        form_post(
            "/packs/blink/cancel",
            &bob_cookie,
            format!("tenant=plant-a&csrf={bob_csrf}"),
        ),
    )
    .await;
    assert_eq!(code, StatusCode::NOT_FOUND);
    let audit = f
        .store
        .audit(Some("plant-b"), RefTime::from_nanos(0), 100)
        .await
        .unwrap();
    assert!(
        audit
            .iter()
            .any(|r| r.action == "cancel" && r.who == "bob" && r.result.starts_with("NotFound")),
        "{audit:?}"
    );
}

#[tokio::test]
async fn a_pack_is_cancelled_on_chosen_agents_only() {
    let f = fixture().await;
    let hello = contract::hello_in("press-c", &["plant-a"], &[], 2);
    f.store.agent_hello(hello).await.unwrap();
    let olga = token(&f.ca, "olga", "plant-a", Role::Operator);
    let two = BLINK.replace("[press-a]", "[press-a, press-c]");
    push_as(&f, &olga, &two).await;
    let k = contract::key("plant-a", "blink");
    // The deliveries table lets an operator choose agents, not a viewer.
    let (_, _, page) = call(&f.web, get("/packs/blink", Some(&olga))).await;
    assert!(
        page.contains("id=\"choose\"") && page.contains("name=\"agent\" value=\"press-c\""),
        "{page}"
    );
    let ann = token(&f.ca, "ann", "plant-a", Role::Viewer);
    let (_, _, page) = call(&f.web, get("/packs/blink", Some(&ann))).await;
    assert!(!page.contains("name=\"agent\""), "a viewer chooses nothing");
    // The confirmation names the chosen agents and says the others keep it.
    let (code, _, page) = call(
        &f.web,
        get(
            "/packs/blink/cancel?tenant=plant-a&agent=press-a",
            Some(&olga),
        ),
    )
    .await;
    assert_eq!(code, StatusCode::OK, "{page}");
    assert!(
        page.contains("On <strong>press-a</strong>")
            && page.contains("other agents keep it")
            && page.contains("name=\"agents\" value=\"press-a\""),
        "{page}"
    );
    // An agent the pack is not for (another tenant's) is not found.
    for q in ["agent=press-b", "agent=press-a&agent=ghost"] {
        let (code, _, _) = call(
            &f.web,
            get(
                &format!("/packs/blink/cancel?tenant=plant-a&{q}"),
                Some(&olga),
            ),
        )
        .await;
        assert_eq!(code, StatusCode::NOT_FOUND, "{q}");
    }
    // Done: press-a withdrawn, press-c keeps it; audited, announced.
    let cookie = log_in(&f.web, &olga).await;
    let csrf = csrf_of(&f.web, &cookie).await;
    let mut rx = f.web.app.subscribe();
    let (code, _, page) = call(
        &f.web,
        form_post(
            "/packs/blink/cancel",
            &cookie,
            format!("tenant=plant-a&agents=press-a&csrf={csrf}"),
        ),
    )
    .await;
    assert_eq!(code, StatusCode::OK, "{page}");
    assert!(page.contains("on press-a: each told"), "{page}");
    let a = contract::row(&*f.store, "press-a", &k).await;
    let c = contract::row(&*f.store, "press-c", &k).await;
    assert_eq!((a.intent, c.intent), (Intent::Withdraw, Intent::Hold));
    assert_eq!(
        announced(&mut rx),
        ["plant-a/blink: olga cancelled the pack on press-a"]
    );
    let audit = f
        .store
        .audit(Some("plant-a"), RefTime::from_nanos(0), 100)
        .await
        .unwrap();
    assert!(
        audit.iter().any(|r| r.action == "cancel"
            && r.target == "plant-a/blink on press-a"
            && r.result == "ok"),
        "{audit:?}"
    );
    // A newer version reaches press-a again.
    push_as(&f, &olga, &two.replace("version: 1", "version: 2")).await;
    let a = contract::row(&*f.store, "press-a", &k).await;
    assert_eq!((a.intent, a.version), (Intent::Hold, 2));
}

#[tokio::test]
async fn a_rollout_is_paused_resumed_and_aborted_from_its_page() {
    let f = fixture().await;
    let olga = token(&f.ca, "olga", "plant-a", Role::Operator);
    push_as(&f, &olga, BLINK).await;
    let v2 = format!(
        "{}rollout:\n  stages: [{{percent: 100}}]\n  soak: 1m\n",
        BLINK.replace("version: 1", "version: 2")
    );
    push_as(&f, &olga, &v2).await;
    f.web.app.step_rollouts().await.unwrap();
    // press-a is offline (no stream): the page says it holds the stage up.
    let (_, _, page) = call(&f.web, get("/packs/blink", Some(&olga))).await;
    let blockers = page
        .split("id=\"blockers\"")
        .nth(1)
        .expect("a blocker named at the top of the rollout")
        .split("</p>")
        .next()
        .unwrap();
    assert!(
        blockers.contains("press-a") && blockers.contains("offline"),
        "{blockers}"
    );
    assert!(page.contains("data-state=\"offline\""), "{page}");
    assert!(page.contains("/packs/blink/rollout/pause?tenant=plant-a"));
    let (code, _, page) = call(&f.web, get("/packs/blink/rollout/pause", Some(&olga))).await;
    assert_eq!(code, StatusCode::OK);
    assert!(
        page.contains("Holds the rollout of v2 at stage 1 of 1"),
        "{page}"
    );
    let cookie = log_in(&f.web, &olga).await;
    let csrf = csrf_of(&f.web, &cookie).await;
    let mut rx = f.web.app.subscribe();
    for (cmd, state) in [
        ("pause", "paused"),
        ("resume", "running"),
        ("abort", "aborted"),
    ] {
        let (code, _, page) = call(
            &f.web,
            form_post(
                &format!("/packs/blink/rollout/{cmd}"),
                &cookie,
                format!("tenant=plant-a&csrf={csrf}"),
            ),
        )
        .await;
        assert_eq!(code, StatusCode::OK, "{cmd}: {page}");
        assert!(page.contains(&format!("v2 is {state}")), "{cmd}: {page}");
    }
    assert_eq!(
        announced(&mut rx),
        [
            "plant-a/blink: olga paused the rollout of v2 (now paused)",
            "plant-a/blink: olga resumed the rollout of v2 (now running)",
            "plant-a/blink: olga aborted the rollout of v2 (now aborted)",
        ]
    );
    // Final: no action on the rollout is offered, and a second abort is
    // refused (and audited).
    let (_, _, page) = call(&f.web, get("/packs/blink?part=rollout", Some(&olga))).await;
    assert!(
        page.contains("aborted") && !page.contains("id=\"blockers\""),
        "{page}"
    );
    let (code, _, _) = call(
        &f.web,
        form_post(
            "/packs/blink/rollout/abort",
            &cookie,
            format!("tenant=plant-a&csrf={csrf}"),
        ),
    )
    .await;
    assert_eq!(code, StatusCode::CONFLICT);
    let (code, _, _) = call(&f.web, get("/packs/blink/rollout/explode", Some(&olga))).await;
    assert_eq!(code, StatusCode::NOT_FOUND);
    let audit = f
        .store
        .audit(Some("plant-a"), RefTime::from_nanos(0), 100)
        .await
        .unwrap();
    let rollout: Vec<(&str, bool)> = audit
        .iter()
        .filter(|r| r.action.starts_with("rollout."))
        .map(|r| (r.action.as_str(), r.result == "ok"))
        .collect();
    assert_eq!(
        rollout,
        [
            ("rollout.pause", true),
            ("rollout.resume", true),
            ("rollout.abort", true),
            ("rollout.abort", false)
        ]
    );
    // Push again from a stored version: the form holds its YAML as the
    // next version (the rollback made v3: the next is v4).
    let (code, _, page) = call(
        &f.web,
        get("/push?from=blink&tenant=plant-a&version=1", Some(&olga)),
    )
    .await;
    assert_eq!(code, StatusCode::OK, "{page}");
    assert!(
        page.contains("version: 4") && page.contains("Version 1 of blink as version 4"),
        "{page}"
    );
}

#[tokio::test]
async fn an_admin_grants_and_takes_back_an_agent() {
    let f = fixture().await;
    let boss = token(&f.ca, "boss", "plant-a", Role::Admin);
    let olga = token(&f.ca, "olga", "plant-a", Role::Operator);
    let (_, _, page) = call(&f.web, get("/agents/press-a", Some(&boss))).await;
    assert!(page.contains("id=\"grant-form\""), "{page}");
    let (_, _, page) = call(&f.web, get("/agents/press-a", Some(&olga))).await;
    assert!(
        !page.contains("grant-form"),
        "an operator has no grant form"
    );
    let (code, _, page) = call(
        &f.web,
        get("/agents/press-a/grant?tenant=plant-c&op=grant", Some(&boss)),
    )
    .await;
    assert_eq!(code, StatusCode::OK, "{page}");
    assert!(
        page.contains("will also serve tenant <strong>plant-c</strong>"),
        "{page}"
    );
    let (code, _, _) = call(
        &f.web,
        get("/agents/press-a/grant?tenant=plant-c&op=grant", Some(&olga)),
    )
    .await;
    assert_eq!(code, StatusCode::FORBIDDEN);
    let bob = token(&f.ca, "bob", "plant-b", Role::Admin);
    let (code, _, _) = call(
        &f.web,
        get("/agents/press-a/grant?tenant=plant-b&op=grant", Some(&bob)),
    )
    .await;
    assert_eq!(code, StatusCode::NOT_FOUND, "another tenant's agent");
    let (code, _, _) = call(
        &f.web,
        get("/agents/press-a/grant?tenant=plant-c&op=steal", Some(&boss)),
    )
    .await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    let cookie = log_in(&f.web, &boss).await;
    let csrf = csrf_of(&f.web, &cookie).await;
    for (op, serves) in [("grant", "plant-a, plant-c"), ("revoke", "plant-a")] {
        let (code, _, page) = call(
            &f.web,
            form_post(
                "/agents/press-a/grant",
                &cookie,
                format!("tenant=plant-c&op={op}&csrf={csrf}"),
            ),
        )
        .await;
        assert_eq!(code, StatusCode::OK, "{op}: {page}");
        assert!(page.contains(&format!("serves: {serves}.")), "{op}: {page}");
    }
    let audit = f
        .store
        .audit(Some("plant-a"), RefTime::from_nanos(0), 100)
        .await
        .unwrap();
    let actions: Vec<&str> = audit
        .iter()
        .filter(|r| r.target.contains("plant-c"))
        .map(|r| r.action.as_str())
        .collect();
    assert_eq!(actions, ["grant", "ungrant"]);
}

#[tokio::test]
async fn an_offline_agent_is_not_locked_and_needs_a_look() {
    let f = fixture().await;
    let boss = token(&f.ca, "boss", "plant-a", Role::Admin);
    // press-a reported a locked clock, then went offline.
    let (agent, _) = f
        .store
        .agent_hello(contract::hello_in("press-a", &["plant-a"], &[], 2))
        .await
        .unwrap();
    f.store
        .record_clock("press-a", agent.session_gen, contract::clock(3))
        .await
        .unwrap();
    f.store.all_disconnected().await.unwrap();
    let (_, _, page) = call(&f.web, get("/", Some(&boss))).await;
    let unlocked = page
        .split("id=\"count-unlocked\">")
        .nth(1)
        .and_then(|s| s.split('<').next())
        .unwrap();
    assert_eq!(unlocked, "1", "an offline agent's clock is not locked");
    assert!(
        page.contains("href=\"/?state=clock-not-locked\""),
        "cards link"
    );
    let row = page
        .split("data-agent=\"press-a\"")
        .nth(1)
        .and_then(|s| s.split("</tr>").next())
        .unwrap();
    assert!(
        row.contains(">stale<") && row.contains("last known"),
        "the last report, marked: {row}"
    );
    let (code, _, page) = call(&f.web, get("/?state=unhealthy", Some(&boss))).await;
    assert_eq!(code, StatusCode::OK);
    assert!(page.contains("data-agent=\"press-a\""), "{page}");
    // The favicon: an icon, not a 404 in every page's log.
    let (code, h, _) = call(&f.web, get("/favicon.ico", None)).await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(h[header::CONTENT_TYPE], "image/svg+xml");
}

/// A connected agent with a locked clock whose stream measured a late
/// firing and an outbox that keeps rising: counted unhealthy, and both
/// named on its fleet row and its page.
#[tokio::test]
async fn a_late_firing_and_a_growing_outbox_need_a_look() {
    let f = fixture().await;
    let boss = token(&f.ca, "boss", "plant-a", Role::Admin);
    let (agent, _) = f
        .store
        .agent_hello(contract::hello_in("press-a", &["plant-a"], &[], 2))
        .await
        .unwrap();
    let session = agent.session_gen;
    f.store
        .record_clock("press-a", session, contract::clock(now_ns()))
        .await
        .unwrap();
    let seen = |health| SeenRow {
        health: Some(health),
        ..contract::seen_live(now_ns())
    };
    f.store
        .agent_seen("press-a", session, seen(StreamHealth::default()))
        .await
        .unwrap();
    let (_, _, page) = call(&f.web, get("/?state=unhealthy", Some(&boss))).await;
    assert!(!page.contains("data-agent=\"press-a\""), "healthy: {page}");
    let sick = StreamHealth {
        outbox_entries: 12_000,
        outbox_growing: true,
        late_recently: true,
    };
    f.store
        .agent_seen("press-a", session, seen(sick))
        .await
        .unwrap();
    let (_, _, page) = call(&f.web, get("/?state=unhealthy", Some(&boss))).await;
    let row = page
        .split("data-agent=\"press-a\"")
        .nth(1)
        .and_then(|s| s.split("</tr>").next())
        .unwrap_or_else(|| panic!("press-a is not listed unhealthy: {page}"));
    assert!(
        row.contains(">late firing<") && row.contains(">outbox growing<"),
        "{row}"
    );
    let (_, _, page) = call(&f.web, get("/agents/press-a", Some(&boss))).await;
    assert!(
        page.contains("id=\"outbox\"><span class=\"badge bad\">growing<"),
        "{page}"
    );
    assert!(
        page.contains("skipped as later than its max_lateness"),
        "{page}"
    );
}

/// Pushing again from a signed stored version leaves the signature out
/// (it covered the old version's bytes) and says so, naming the key.
#[tokio::test]
async fn a_signed_version_pushed_again_drops_its_signature_and_says_so() {
    let f = fixture().await;
    let olga = token(&f.ca, "olga", "plant-a", Role::Operator);
    // A signature line as `push --sign` writes it (its bytes are not
    // checked here: the controller never verifies).
    let signed = format!(
        "{BLINK}# baton-signature: 0123456789abcdef {}\n",
        "A".repeat(86) + "=="
    );
    push_as(&f, &olga, &signed).await;
    let (code, _, page) = call(
        &f.web,
        get("/push?from=blink&tenant=plant-a&version=1", Some(&olga)),
    )
    .await;
    assert_eq!(code, StatusCode::OK, "{page}");
    assert!(page.contains("version: 2"), "{page}");
    assert!(
        !page.contains("baton-signature"),
        "the line is left out: {page}"
    );
    let note = page
        .split("id=\"signature-dropped\"")
        .nth(1)
        .expect("the dropped signature said")
        .split("</p>")
        .next()
        .unwrap();
    assert!(
        note.contains("0123456789abcdef") && note.contains("push --sign"),
        "{note}"
    );
    // An unsigned stored version says nothing of signatures.
    let v2 = BLINK.replace("version: 1", "version: 2");
    push_as(&f, &olga, &v2).await;
    let (_, _, page) = call(
        &f.web,
        get("/push?from=blink&tenant=plant-a&version=2", Some(&olga)),
    )
    .await;
    assert!(!page.contains("signature-dropped"), "{page}");
    // The pack's page says whose signature each version carries.
    let signature = |page: &str| {
        page.split("id=\"signature\"")
            .nth(1)
            .expect("the signature line")
            .split("</p>")
            .next()
            .unwrap()
            .to_string()
    };
    let (_, _, page) = call(
        &f.web,
        get("/packs/blink?tenant=plant-a&version=1", Some(&olga)),
    )
    .await;
    let line = signature(&page);
    assert!(
        line.contains("signed with key") && line.contains("0123456789abcdef"),
        "{line}"
    );
    let (_, _, page) = call(&f.web, get("/packs/blink?tenant=plant-a", Some(&olga))).await;
    assert!(signature(&page).contains("v2: unsigned"), "{page}");
}
