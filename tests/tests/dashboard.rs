//! The web dashboard in a real browser: Debian's chromium, driven through
//! chromedriver (WebDriver) by fantoccini, against a real controller
//! (`serve --tls-dir --http`, HTTPS with the fleet CA's certificate) and
//! real agents on simulated GPIO, in three tenants' worth of roles.
//!
//! One browser for the whole binary (its steps run in order, each named
//! in its assertion messages): log in with a token; the fleet page lists
//! the tenant's agents and filters by label; an agent page's plot holds
//! the points the store holds (under the stated downsampling they are
//! all kept); a live execution reaches the page within 2 s of being
//! stored; the push page shows a bad pack's error at its line and a
//! viewer gets no form (and the endpoint refuses); keyboard traversal
//! reaches every control; a tenant never sees another's agent or pack,
//! page or JSON; the fleet page fits a phone-sized screen. Screenshots of
//! each page go to `target/dashboard-screenshots/` (or
//! `BATON_SCREENSHOTS`).
//!
//! Without chromium and chromedriver the test says SKIPPED, unless
//! `BATON_REQUIRE_BROWSER` is set (scripts/test.sh installs them and sets
//! it): then it fails.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use baton_e2e::fleet::{Ca, Controller, ControllerTls, start_agent_tls, start_controller_tls};
use baton_e2e::{Running, root, wait_until};
use fantoccini::actions::{InputSource, KeyAction, KeyActions};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);
const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

fn available() -> bool {
    let ok = Path::new(CHROMIUM).exists() && Path::new(CHROMEDRIVER).exists();
    if !ok {
        baton_testenv::missing(
            "dashboard browser test",
            Some("BATON_REQUIRE_BROWSER"),
            &format!(
                "{CHROMIUM} or {CHROMEDRIVER} missing (Debian packages chromium, chromium-driver; scripts/test.sh installs them)"
            ),
        );
    }
    ok
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn start_chromedriver(dir: &Path) -> (Running, u16) {
    let port = free_port();
    let log = std::fs::File::create(dir.join("chromedriver.log")).expect("log");
    let child = Command::new(CHROMEDRIVER)
        .arg(format!("--port={port}"))
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("spawn chromedriver");
    let up = wait_until(WAIT, || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    assert!(up, "chromedriver did not listen on {port}");
    (Running(child), port)
}

async fn browser(port: u16, profile: &Path) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert("browserName".into(), json!("chrome"));
    // The controller's certificate is from the fleet's own CA, which this
    // throwaway profile does not trust: WebDriver's standard switch.
    caps.insert("acceptInsecureCerts".into(), json!(true));
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": CHROMIUM,
            "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage",
                format!("--user-data-dir={}", profile.display()),
                "--window-size=1280,800",
            ],
        }),
    );
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    ClientBuilder::new(connector)
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{port}"))
        .await
        .expect("a chromium session")
}

fn shots_dir() -> PathBuf {
    let d = std::env::var_os("BATON_SCREENSHOTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target").join("dashboard-screenshots"));
    std::fs::create_dir_all(&d).expect("screenshots dir");
    d
}

async fn shot(c: &Client, name: &str) {
    let png = c.screenshot().await.expect("screenshot");
    std::fs::write(shots_dir().join(format!("{name}.png")), png).expect("save screenshot");
}

/// Evaluate `body` (a function body returning a value) in the page.
async fn js(c: &Client, body: &str) -> Value {
    c.execute(body, Vec::new()).await.expect("script")
}

/// `fetch(path)` from the page (its cookie, its origin): (status, text).
async fn fetch(c: &Client, path: &str, method: &str) -> (u64, String) {
    let script = r#"
        const [path, method, done] = arguments;
        const h = JSON.parse(document.body.getAttribute("hx-headers") || "{}");
        fetch(path, {method, credentials: "same-origin",
                     headers: {"Content-Type": "application/x-www-form-urlencoded",
                               "X-CSRF-Token": h["X-CSRF-Token"] || ""},
                     body: method === "POST" ? "yaml=pack%3A+p" : undefined})
          .then(async r => done([r.status, await r.text()]))
          .catch(e => done([0, String(e)]));
    "#;
    let v = c
        .execute_async(script, vec![json!(path), json!(method)])
        .await
        .expect("fetch in the page");
    (
        v[0].as_u64().unwrap_or(0),
        v[1].as_str().unwrap_or("").to_string(),
    )
}

async fn wait_js(c: &Client, what: &str, body: &str) -> Value {
    // Checked at once and again on every change of the document (a
    // MutationObserver), resolved the moment it holds: the wait is on the
    // page's own event, bounded by what is left of WAIT. A navigation
    // (a form's answer, a redirect) ends the script with the old
    // document: it is run again on the new one.
    let script = format!(
        r#"
        const [ms, done] = arguments;
        const check = () => {{ {body} }};
        let obs = null;
        const finish = v => {{ if (obs) obs.disconnect(); clearTimeout(timer); done(v); }};
        const holds = () => {{
            const v = check();
            if (v !== null && v !== undefined && v !== false) {{ finish(v); return true; }}
            return false;
        }};
        const timer = setTimeout(() => finish(null), ms);
        if (!holds()) {{
            obs = new MutationObserver(() => {{ holds(); }});
            obs.observe(document, {{subtree: true, childList: true, characterData: true, attributes: true}});
        }}
    "#
    );
    let start = Instant::now();
    loop {
        let left = WAIT.saturating_sub(start.elapsed());
        if left.is_zero() {
            let at = js(c, "return [location.href, document.body ? document.body.innerText.slice(0, 2000) : ''];").await;
            panic!("timed out waiting for {what}; the page: {at}");
        }
        // Under the session's script timeout (30 s by default).
        let ms = left.min(Duration::from_secs(20)).as_millis() as u64;
        if let Ok(v) = c.execute_async(&script, vec![json!(ms)]).await
            && !v.is_null()
        {
            return v;
        }
    }
}

async fn login(c: &Client, base: &str, token: &str) {
    c.goto(&format!("{base}/login")).await.expect("login page");
    let field = c.find(Locator::Css("#token")).await.expect("token field");
    field.send_keys(token).await.expect("type token");
    c.find(Locator::Css("form button[type=submit]"))
        .await
        .expect("log-in button")
        .click()
        .await
        .expect("click");
    wait_js(
        c,
        "the fleet page after log-in",
        "return location.pathname === '/' && !!document.querySelector('#fleet-table');",
    )
    .await;
}

async fn logout(c: &Client) {
    c.find(Locator::Css(".whoami button"))
        .await
        .expect("log-out button")
        .click()
        .await
        .expect("click");
    wait_js(
        c,
        "the log-in page",
        "return location.pathname === '/login';",
    )
    .await;
}

async fn fleet_ids(c: &Client) -> Vec<String> {
    let v = js(
        c,
        "return [...document.querySelectorAll('#fleet-table tbody tr[data-agent]')].map(r => r.dataset.agent);",
    )
    .await;
    serde_json::from_value(v).expect("ids")
}

struct Fleet {
    dir: tempfile::TempDir,
    ctl: Controller,
    admin: (PathBuf, PathBuf),
    agents: Vec<baton_e2e::fleet::Agent>,
    base: String,
    ann: String,
    olga: String,
    ben: String,
    root_admin: String,
}

/// The pack the tests push (VERSION and ROLLOUT filled in): a toggle
/// every 200 ms, its safe state the line low.
const BLINK: &str = "tenant: plant-a\npack: blink\nversion: VERSION\ntargets: {agents: [press-1, press-2]}\nsafe_state:\n  - {action: gpio.write, params: {line: 12, value: 0}}\nROLLOUTinstructions:\n  - {id: blink, action: gpio.toggle, params: {line: 12}, every: 200ms}\n";

/// Press Tab until `selector` has the focus (at most 200 times), then
/// Enter: a control reached and used from the keyboard alone.
async fn tab_to_and_enter(c: &Client, selector: &str) {
    tab_to_and_press(c, selector, '\u{E007}').await;
}

/// A cancel's safe state drove a line low in these GPIO writes.
fn cancel_ran_safe_state(writes: &[serde_json::Value]) -> bool {
    writes.iter().any(|w| {
        w["value"] == 0
            && w["execution_id"]
                .as_str()
                .is_some_and(|e| e.contains("safe_state (cancel)"))
    })
}

/// Tab until `selector` has the focus, then press `key` (WebDriver's key
/// code: Enter, Space).
async fn tab_to_and_press(c: &Client, selector: &str, key_code: char) {
    let is_focused =
        format!("return document.activeElement && document.activeElement.matches({selector:?});");
    let key = |k: char| {
        KeyActions::new("keyboard".into())
            .then(KeyAction::Down { value: k })
            .then(KeyAction::Up { value: k })
    };
    for _ in 0..200 {
        if js(c, &is_focused).await == json!(true) {
            c.perform_actions(key(key_code)).await.expect("the key");
            return;
        }
        c.perform_actions(key('\u{E004}')).await.expect("Tab");
    }
    panic!("Tab never reached {selector}");
}

fn fleet() -> Fleet {
    let dir = tempfile::tempdir().expect("tmp");
    let ca = Ca::init(&dir.path().join("ca"));
    let admin = ca.operator("boss", "plant-a", "admin");
    let ctl = start_controller_tls(
        &dir.path().join("ctl"),
        "127.0.0.1:0",
        ControllerTls {
            dir: ca.dir.clone(),
            operator: admin.clone(),
            serve_args: vec!["--http".into(), "127.0.0.1:0".into()],
        },
    );
    let mut agents = Vec::new();
    for (id, tenant, line) in [
        ("press-1", "plant-a", "line=1"),
        ("press-2", "plant-a", "line=2"),
        ("other-1", "plant-b", "line=1"),
    ] {
        let tls = ca.agent_tls(ca.agent(id, &["--tenant", tenant]));
        agents.push(start_agent_tls(
            &dir.path().join(id),
            id,
            &ctl.url,
            &[line],
            tls,
        ));
    }
    assert!(
        wait_until(WAIT, || ["press-1", "press-2"]
            .iter()
            .all(|a| ctl.connected(a))),
        "agents did not connect"
    );
    let pack = dir.path().join("blink.yaml");
    std::fs::write(&pack, BLINK.replace("VERSION", "1").replace("ROLLOUT", "")).expect("pack");
    let o = ctl.ctl_as(&admin, &["push", &pack.display().to_string()]);
    assert!(
        o.status.success(),
        "push: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    Fleet {
        base: format!("https://{}", ctl.http_addr()),
        ann: ca.operator_token("ann", "plant-a", "viewer"),
        olga: ca.operator_token("olga", "plant-a", "operator"),
        ben: ca.operator_token("ben", "plant-b", "viewer"),
        root_admin: ca.operator_token("root", "plant-a", "admin"),
        ctl,
        admin,
        agents,
        dir,
    }
}

#[test]
fn the_dashboard_in_a_real_browser() {
    if !available() {
        return;
    }
    let mut f = fleet();
    let profile = tempfile::tempdir().expect("profile");
    let (_driver, port) = start_chromedriver(profile.path());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let c = browser(port, &profile.path().join("chrome")).await;
        let result = steps(&c, &mut f).await;
        let _ = c.close().await;
        result
    });
}

async fn steps(c: &Client, f: &mut Fleet) {
    let base = &f.base;
    // 1. Log in with a token; the fleet page lists the tenant's agents.
    login(c, base, &f.ann).await;
    let ids = fleet_ids(c).await;
    assert_eq!(
        ids,
        ["press-1", "press-2"],
        "fleet page of plant-a's viewer"
    );
    let total = js(
        c,
        "return document.querySelector('#count-total').textContent;",
    )
    .await;
    assert_eq!(total, json!("2"), "the count at the top");
    shot(c, "fleet").await;
    // Page weight without images: every byte the page pulled.
    let weight = js(
        c,
        "const n = performance.getEntriesByType('navigation')[0]; return [n.transferSize, n.encodedBodySize, ...performance.getEntriesByType('resource').map(r => r.encodedBodySize)];",
    )
    .await;
    let sizes: Vec<u64> = serde_json::from_value(weight).expect("sizes");
    let total_bytes: u64 = sizes[1..].iter().sum();
    eprintln!(
        "FIGURE dashboard fleet page weight: {total_bytes} bytes (page {} bytes, {} scripts and styles)",
        sizes[1],
        sizes.len() - 2
    );

    // 2. Filter by label, through the form.
    let label = c
        .find(Locator::Css("input[name=label]"))
        .await
        .expect("label field");
    label.send_keys("line=2").await.expect("type");
    c.find(Locator::Css("form.filters button"))
        .await
        .expect("filter button")
        .click()
        .await
        .expect("click");
    wait_js(
        c,
        "the filtered fleet",
        "return location.search.includes('label=line%3D2') || location.search.includes('label=line=2');",
    )
    .await;
    assert_eq!(fleet_ids(c).await, ["press-2"], "filtered by line=2");

    // 3. Keyboard traversal reaches every control of the fleet page.
    c.goto(&format!("{base}/")).await.expect("fleet");
    let controls = js(
        c,
        "window.__seen = new Set(); document.addEventListener('focusin', e => { const all = [...document.querySelectorAll('a[href],button,input:not([type=hidden]),select,textarea')]; window.__seen.add(all.indexOf(e.target)); }); return document.querySelectorAll('a[href],button,input:not([type=hidden]),select,textarea').length;",
    )
    .await
    .as_u64()
    .expect("count");
    for _ in 0..controls + 3 {
        let tab = KeyActions::new("keyboard".into())
            .then(KeyAction::Down { value: '\u{E004}' })
            .then(KeyAction::Up { value: '\u{E004}' });
        c.perform_actions(tab).await.expect("Tab");
    }
    let seen = js(
        c,
        "return window.__seen.size - (window.__seen.has(-1) ? 1 : 0);",
    )
    .await;
    assert_eq!(
        seen.as_u64(),
        Some(controls),
        "Tab reached every control of the fleet page"
    );

    // 4. An agent page: its outbox backlog as its clock report said, and
    // the plot holds the points the store holds.
    let start = Instant::now();
    let backlog = loop {
        c.goto(&format!("{base}/agents/press-1"))
            .await
            .expect("agent page");
        let t = js(c, "return document.querySelector('#outbox').textContent;").await;
        let t = t.as_str().unwrap_or_default().to_string();
        if t.contains("not yet acknowledged") {
            break t;
        }
        assert!(start.elapsed() < WAIT, "no backlog reported: {t}");
        // The backlog rides on the agent's clock reports, which reach this
        // page as SSE `clock` events: wait for the next one, then read the
        // page again.
        js(
            c,
            "document.body.addEventListener('htmx:sseMessage', e => { if (e.detail && e.detail.type === 'clock') document.body.dataset.clock = '1'; }); return true;",
        )
        .await;
        wait_js(
            c,
            "the agent's next clock report",
            "return document.body.dataset.clock === '1';",
        )
        .await;
    };
    assert!(
        backlog
            .split_whitespace()
            .next()
            .is_some_and(|n| n.parse::<u64>().is_ok()),
        "the backlog is a count: {backlog}"
    );
    // What it checks packs against, as its hello said: a box with no
    // trust root installed runs packs unchecked, and the page says so.
    let trust = js(c, "return document.querySelector('#trust').textContent;").await;
    assert!(
        trust
            .as_str()
            .is_some_and(|t| t.contains("no trust root installed")),
        "{trust}"
    );
    let plotted = wait_js(
        c,
        "the clock plot",
        "const p = document.querySelector('#clock-plot'); return p && p.dataset.points ? Number(p.dataset.points) : null;",
    )
    .await
    .as_u64()
    .expect("points");
    let (code, body) = fetch(c, "/api/agents/press-1/clock", "GET").await;
    assert_eq!(code, 200, "{body}");
    let series: Value = serde_json::from_str(&body).expect("json");
    let stored = series["points"].as_u64().expect("points");
    assert!(stored > 0, "the agent reported its clock");
    // Under 2 × 600 buckets every point is kept; a report may have come
    // between the plot's read and this one.
    assert!(
        plotted == stored || plotted + 1 == stored,
        "plot {plotted} points, store {stored}"
    );
    shot(c, "agent").await;

    // 5. Live: executions reach the page within 2 s of being stored.
    js(
        c,
        "window.__live = []; const tb = document.querySelector('#execs tbody'); new MutationObserver(ms => { for (const m of ms) for (const n of m.addedNodes) if (n.dataset && n.dataset.receivedNs) window.__live.push([Date.now(), Number(n.dataset.receivedNs) / 1e6]); }).observe(tb, {childList: true}); return true;",
    )
    .await;
    let live = wait_js(
        c,
        "five live executions",
        "return window.__live.length >= 5 ? window.__live : null;",
    )
    .await;
    let mut delays: Vec<f64> = live
        .as_array()
        .expect("rows")
        .iter()
        .map(|p| p[0].as_f64().unwrap_or(0.0) - p[1].as_f64().unwrap_or(0.0))
        .collect();
    delays.sort_by(f64::total_cmp);
    let max = delays.last().copied().unwrap_or(f64::MAX);
    eprintln!(
        "FIGURE dashboard feedback stored -> row in the DOM: median {:.1} ms, max {:.1} ms ({} rows)",
        delays[delays.len() / 2],
        max,
        delays.len()
    );
    assert!(
        max < 2_000.0,
        "a live row came {max} ms after it was stored"
    );
    let status = js(
        c,
        "return document.querySelector('#live-status').textContent;",
    )
    .await;
    assert!(
        status.as_str().is_some_and(|s| s.contains("connected")),
        "the page says live updates flow: {status}"
    );

    // 6. A viewer gets no push form, and the endpoint refuses it.
    c.goto(&format!("{base}/push")).await.expect("push page");
    let form = js(c, "return !!document.querySelector('#push-form');").await;
    assert_eq!(form, json!(false), "a viewer sees no push form");
    let (code, body) = fetch(c, "/push", "POST").await;
    assert_eq!(
        code, 403,
        "a viewer's push (with its CSRF token) is refused: {body}"
    );
    assert!(body.contains("viewer"), "refused for its role: {body}");
    logout(c).await;

    // 7. An operator: the push page shows a bad pack's error at its line.
    login(c, base, &f.olga).await;
    c.goto(&format!("{base}/push")).await.expect("push page");
    let area = c.find(Locator::Css("#yaml")).await.expect("the YAML field");
    area.send_keys("pack: p\nversion: 2\ninstructions:\n  - {id: a, action: noop, every: soon}\n")
        .await
        .expect("type a pack");
    let err = wait_js(
        c,
        "the check's errors",
        "const li = document.querySelector('#check li[data-line]'); return li ? [li.dataset.line, li.textContent] : null;",
    )
    .await;
    assert_eq!(err[0], json!("4"), "the error is at line 4: {err}");
    assert!(
        err[1].as_str().is_some_and(|t| t.contains("line 4")),
        "{err}"
    );
    shot(c, "push").await;
    c.goto(&format!("{base}/packs/blink"))
        .await
        .expect("pack page");
    let rows = js(
        c,
        "return document.querySelectorAll('#deliveries tbody tr').length;",
    )
    .await;
    assert_eq!(rows, json!(2), "the pack's two deliveries");
    shot(c, "pack").await;
    logout(c).await;

    // 8. Another tenant sees nothing of plant-a, page or JSON.
    login(c, base, &f.ben).await;
    assert_eq!(fleet_ids(c).await, ["other-1"], "plant-b's fleet");
    let (code, body) = fetch(c, "/agents/press-1", "GET").await;
    assert_eq!((code, body.as_str()), (404, "no agent press-1"));
    let (code, body) = fetch(c, "/api/agents?limit=500", "GET").await;
    assert_eq!(code, 200);
    assert!(
        body.contains("other-1") && !body.contains("press-"),
        "plant-b's JSON: {body}"
    );
    let (code, _) = fetch(c, "/packs/blink?tenant=plant-a", "GET").await;
    assert_eq!(code, 404, "plant-a's pack");
    let (code, _) = fetch(c, "/api/agents/press-1/clock", "GET").await;
    assert_eq!(code, 404, "plant-a's agent's clock");
    logout(c).await;

    // 9. An admin's audit log; the fleet page on a phone-sized screen.
    login(c, base, &f.root_admin).await;
    c.goto(&format!("{base}/audit")).await.expect("audit page");
    let text = js(c, "return document.querySelector('main').textContent;").await;
    assert!(
        text.as_str()
            .is_some_and(|t| t.contains("login") && t.contains("push")),
        "the audit log shows log-ins and the push"
    );
    shot(c, "audit").await;
    c.set_window_size(390, 844).await.expect("phone size");
    c.goto(&format!("{base}/")).await.expect("fleet");
    let overflow = js(
        c,
        "return document.documentElement.scrollWidth - document.documentElement.clientWidth;",
    )
    .await;
    assert!(
        overflow.as_i64().is_some_and(|o| o <= 1),
        "the page scrolls sideways on a phone: {overflow}"
    );
    shot(c, "fleet-phone").await;
    c.set_window_size(1280, 1000).await.expect("desktop size");
    logout(c).await;

    // 10. Actions. A viewer's post is refused, another tenant's page is
    // not found.
    login(c, base, &f.ann).await;
    let (code, _) = fetch(c, "/packs/blink/cancel", "POST").await;
    assert_eq!(code, 403, "a viewer may not cancel");
    logout(c).await;
    login(c, base, &f.ben).await;
    let (code, _) = fetch(c, "/packs/blink/cancel?tenant=plant-a", "GET").await;
    assert_eq!(code, 404, "another tenant's pack");
    logout(c).await;
    // An operator withdraws the pack from press-1 only, choosing it in
    // the deliveries table by keyboard: press-1 runs the safe state,
    // press-2 keeps firing.
    login(c, base, &f.olga).await;
    c.goto(&format!("{base}/packs/blink"))
        .await
        .expect("pack page");
    tab_to_and_press(c, "input[name=agent][value=press-1]", '\u{E00D}').await;
    tab_to_and_enter(c, "#choose button[type=submit]").await;
    let what = wait_js(
        c,
        "the chosen agents' confirmation",
        "const w = document.querySelector('#confirm-what'); return w ? w.textContent : null;",
    )
    .await;
    assert!(
        what.as_str().is_some_and(|w| w.contains("On press-1:")
            && w.contains("1 of them hold a version")
            && w.contains("other agents keep it")),
        "{what}"
    );
    tab_to_and_enter(c, "#confirm-form button[type=submit]").await;
    let done = wait_js(
        c,
        "the chosen agents' outcome",
        "const o = document.querySelector('#outcome'); return o ? o.textContent : null;",
    )
    .await;
    assert!(
        done.as_str()
            .is_some_and(|d| d.contains("Cancelled plant-a/blink (v1) on press-1")),
        "{done}"
    );
    let (p1, p2) = (&f.agents[0], &f.agents[1]);
    assert_eq!(p1.id, "press-1");
    assert!(
        wait_until(WAIT, || cancel_ran_safe_state(&p1.writes())),
        "press-1: no safe state after its cancel: {:?}",
        p1.writes().last()
    );
    let before = p2.writes().len();
    assert!(
        wait_until(WAIT, || p2.writes().len() > before + 2),
        "press-2 stopped firing"
    );
    assert!(
        !p2.writes().iter().any(|w| w["execution_id"]
            .as_str()
            .is_some_and(|e| e.contains("safe_state"))),
        "press-2 ran a safe state"
    );
    // Its row says it holds none once it answered the cancel.
    let asked = Instant::now();
    loop {
        c.goto(&format!("{base}/packs/blink"))
            .await
            .expect("pack page");
        let held = js(
            c,
            "const a = document.querySelector(\"#deliveries a[href='/agents/press-1']\"); \
             return a ? a.closest('tr').querySelectorAll('td')[2].textContent : null;",
        )
        .await;
        if held == json!("none") {
            break;
        }
        assert!(asked.elapsed() < WAIT, "press-1 still holds it: {held}");
    }
    // Then the whole pack, from the pack page, by keyboard, while a
    // second page on the same pack is open: that page says so at once.
    let first = c.window().await.expect("this window");
    let second = c.new_window(false).await.expect("a second window").handle;
    c.switch_to_window(second.clone()).await.expect("to it");
    c.goto(&format!("{base}/packs/blink"))
        .await
        .expect("pack page");
    wait_js(
        c,
        "the second page's live stream",
        "return document.querySelector('#live-status').dataset.state === 'up';",
    )
    .await;
    c.switch_to_window(first.clone()).await.expect("back");
    c.goto(&format!("{base}/packs/blink"))
        .await
        .expect("pack page");
    tab_to_and_enter(c, "a[href^='/packs/blink/cancel']").await;
    let what = wait_js(
        c,
        "the cancel's confirmation",
        "const w = document.querySelector('#confirm-what'); return w ? w.textContent : null;",
    )
    .await;
    assert!(
        what.as_str()
            .is_some_and(|w| w.contains("1 agent(s) hold a version of it now")),
        "the confirmation says what and to how many: {what}"
    );
    shot(c, "confirm").await;
    // The button has the focus: Enter does it.
    tab_to_and_enter(c, "#confirm-form button[type=submit]").await;
    let done = wait_js(
        c,
        "the cancel's outcome",
        "const o = document.querySelector('#outcome'); return o ? o.textContent : null;",
    )
    .await;
    assert!(
        done.as_str()
            .is_some_and(|d| d.contains("Cancelled plant-a/blink (v1): 1 agent(s)")),
        "{done}"
    );
    // On the device: the safe state ran (the line driven low by it).
    assert!(
        wait_until(WAIT, || cancel_ran_safe_state(&p2.writes())),
        "press-2: no safe state after the cancel: {:?}",
        p2.writes().last()
    );
    c.switch_to_window(second.clone())
        .await
        .expect("the second page");
    let note = wait_js(
        c,
        "the action on the second page",
        "const n = document.querySelector('#notices li'); return n ? n.textContent : null;",
    )
    .await;
    assert!(
        note.as_str()
            .is_some_and(|n| n.contains("olga cancelled the pack on 1 agent(s)")),
        "{note}"
    );
    c.close_window().await.expect("close the second window");
    c.switch_to_window(first).await.expect("back");

    // 11. A rollout with one member offline (press-2, killed) and one
    // held back (press-1: no clock is within 1 ns): the page names both
    // at the top, as what holds the stage.
    f.agents[1].kill9();
    let killed = Instant::now();
    // Counted as not locked within one clock report interval (5 s) of
    // going away: its last report said locked.
    let counted = loop {
        c.goto(&format!("{base}/")).await.expect("fleet");
        let n = js(
            c,
            "return document.querySelector('#count-unlocked').textContent;",
        )
        .await;
        if n == json!("1") {
            break killed.elapsed();
        }
        assert!(
            killed.elapsed() < WAIT,
            "press-2 never counted as not locked: {n}"
        );
    };
    eprintln!(
        "FIGURE dashboard agent killed -> counted as not locked: {} ms",
        counted.as_millis()
    );
    assert!(
        counted < Duration::from_secs(5),
        "counted after {counted:?}"
    );
    assert!(!f.ctl.connected("press-2"), "press-2 still connected");
    let v2 = f.dir.path().join("blink-v2.yaml");
    std::fs::write(
        &v2,
        BLINK.replace("VERSION", "2").replace(
            "ROLLOUT",
            "rollout:\n  stages: [{percent: 100}]\n  activate: together\n  max_uncertainty: 1ns\n",
        ),
    )
    .expect("v2");
    let o = f.ctl.ctl_as(&f.admin, &["push", &v2.display().to_string()]);
    assert!(
        o.status.success(),
        "push v2: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    c.goto(&format!("{base}/packs/blink"))
        .await
        .expect("pack page");
    let blockers = wait_js(
        c,
        "both members named as holding the stage up",
        "const b = document.querySelector('#blockers'); return b && b.textContent.includes('press-1') && b.textContent.includes('press-2') ? b.textContent : null;",
    )
    .await;
    let b = blockers.as_str().unwrap_or_default();
    assert!(b.contains("offline"), "press-2 offline: {b}");
    assert!(
        b.contains("held back") && b.contains("1ns"),
        "press-1 held back for its clock: {b}"
    );
    let states = js(c, "return [...document.querySelectorAll('#members tr[data-agent]')].map(r => r.dataset.agent + ' ' + r.dataset.state);").await;
    assert_eq!(states, json!(["press-1 held back", "press-2 offline"]));
    shot(c, "rollout").await;
    // Pause it from the page: the confirmation, then the state.
    tab_to_and_enter(c, "a[href^='/packs/blink/rollout/pause']").await;
    wait_js(c, "the pause's confirmation", "const w = document.querySelector('#confirm-what'); return w && w.textContent.includes('Holds the rollout of v2');").await;
    tab_to_and_enter(c, "#confirm-form button[type=submit]").await;
    let done = wait_js(
        c,
        "the pause's outcome",
        "const o = document.querySelector('#outcome'); return o ? o.textContent : null;",
    )
    .await;
    assert!(
        done.as_str().is_some_and(|d| d.contains("is paused")),
        "{done}"
    );
    // Resume, then abort, each from the pack page by keyboard.
    for (cmd, state) in [("resume", "is running"), ("abort", "is aborted")] {
        c.goto(&format!("{base}/packs/blink"))
            .await
            .expect("pack page");
        tab_to_and_enter(c, &format!("a[href^='/packs/blink/rollout/{cmd}']")).await;
        wait_js(
            c,
            "the confirmation",
            "return !!document.querySelector('#confirm-what');",
        )
        .await;
        tab_to_and_enter(c, "#confirm-form button[type=submit]").await;
        let done = wait_js(
            c,
            "the outcome",
            "const o = document.querySelector('#outcome'); return o ? o.textContent : null;",
        )
        .await;
        assert!(
            done.as_str().is_some_and(|d| d.contains(state)),
            "{cmd}: {done}"
        );
    }
    // Push version 1 again as the next version: the form holds its YAML
    // with the version raised, and pushing it reaches the agents.
    c.goto(&format!("{base}/packs/blink"))
        .await
        .expect("pack page");
    tab_to_and_enter(c, "a[href*='/push?from=blink'][href$='version=1']").await;
    let from = wait_js(
        c,
        "the push form from v1",
        "const f = document.querySelector('#from-stored'); return f ? f.textContent : null;",
    )
    .await;
    let next: u64 = from
        .as_str()
        .and_then(|t| t.split("as version ").nth(1))
        .and_then(|t| t.split(':').next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no version in {from}"));
    let yaml = js(c, "return document.querySelector('#yaml').value;").await;
    assert!(
        yaml.as_str()
            .is_some_and(|y| y.contains(&format!("version: {next}")) && y.contains("every: 200ms")),
        "v1's YAML as v{next}: {yaml}"
    );
    wait_js(
        c,
        "the check of the stored pack",
        "const p = document.querySelector('#check .ok'); return p ? p.textContent : null;",
    )
    .await;
    tab_to_and_enter(c, "#push-form button[type=submit]").await;
    let pushed = wait_js(c, "the push's answer", "const h = document.querySelector('h1'); if (!h || h.textContent !== 'Pushed') return null; return document.querySelector('p[role=status]').textContent;").await;
    assert!(
        pushed
            .as_str()
            .is_some_and(|p| p.contains(&format!("plant-a/blink v{next}"))),
        "{pushed}"
    );
    let press1 = &f.agents[0];
    assert!(
        wait_until(WAIT, || press1.writes().iter().any(|w| {
            w["execution_id"]
                .as_str()
                .is_some_and(|e| e.starts_with(&format!("plant-a/blink/v{next}/")))
        })),
        "press-1 never ran v{next}: {:?}",
        press1.writes().last()
    );
    logout(c).await;
    // An admin grants press-1 to another tenant from its page.
    login(c, base, &f.root_admin).await;
    c.goto(&format!("{base}/agents/press-1"))
        .await
        .expect("agent page");
    c.find(Locator::Css("#grant-form input[name=tenant]"))
        .await
        .expect("tenant field")
        .send_keys("plant-c")
        .await
        .expect("type");
    tab_to_and_enter(c, "#grant-form button[type=submit]").await;
    let what = wait_js(
        c,
        "the grant's confirmation",
        "const w = document.querySelector('#confirm-what'); return w ? w.textContent : null;",
    )
    .await;
    assert!(
        what.as_str()
            .is_some_and(|w| w.contains("will also serve tenant plant-c")),
        "{what}"
    );
    tab_to_and_enter(c, "#confirm-form button[type=submit]").await;
    let done = wait_js(
        c,
        "the grant's outcome",
        "const o = document.querySelector('#outcome'); return o ? o.textContent : null;",
    )
    .await;
    assert!(
        done.as_str()
            .is_some_and(|d| d.contains("serves: plant-a, plant-c")),
        "{done}"
    );
    // Each action in the audit log, with who did it.
    c.goto(&format!("{base}/audit")).await.expect("audit page");
    let text = js(c, "return document.querySelector('main').textContent;").await;
    let text = text.as_str().unwrap_or_default();
    for action in [
        "cancel",
        "rollout.pause",
        "rollout.resume",
        "rollout.abort",
        "grant",
    ] {
        assert!(
            text.contains(action),
            "the audit log shows {action}: {text}"
        );
    }
    assert!(
        text.contains("olga") && text.contains(&format!("plant-a/blink v{next}")),
        "the audit log shows olga's push of v{next}: {text}"
    );
}
