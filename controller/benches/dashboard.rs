//! The dashboard's fleet page, server time, with a large fleet stored, on
//! each store: `GET /` (a page of 50, counts at the top) rendered by the
//! real router over the real SQLite and PostgreSQL stores, in-process (no
//! socket, no browser: the server's own share).
//!
//! The fleet is written straight into the store's tables in a few
//! statements (a hello each would take minutes at 100 000): agents of one
//! tenant, nine in ten connected, one in twenty without a clock report
//! and one in twenty in holdover, label `line=common` but for a handful
//! (five) with `line=rare`. PostgreSQL is then `ANALYZE`d (what its
//! autovacuum does after a load); SQLite is left as the store leaves it.
//!
//! Cases: the counts alone (every tenant's, a tenant's); `GET /` (counts
//! and the first page), as a caller of every tenant and as a tenant's
//! operator (bearer token, and session cookie: the session read from the
//! store per request); the rare-label filter (both callers); the common
//! label (every agent but those five); a text that only those five carry
//! as a label value (no index can find it: every agent is looked at); the
//! offline agents. The peers, in the same run: what the application did
//! before the filters and counts moved into the store (a scan of the
//! store's agent pages, filtered in the application, until a page of
//! matches or the end; a count over every page), and the application
//! call behind `baton-controller agents` for one page of 50 (the CLI's
//! cost for the same rows).
//!
//! `cargo bench -p baton-controller --bench dashboard`; `DASHBOARD_AGENTS`
//! (default 10 000), `DASHBOARD_REQUESTS` (default 200) and
//! `DASHBOARD_STORES` (default `sqlite,pg`; `pg` needs PostgreSQL
//! installed, and starts a throwaway cluster) change the load.

use std::error::Error;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, header};
use baton_app::fleet::FleetFilter;
use baton_app::{App, AppConfig, Caller};
use baton_model::identity::{Identity, Role};
use baton_model::{AgentFilter, Binding, FleetCounts, LabelMatch, MAX_PAGE};
use baton_pki::ca::{self, CaDir, Validity};
use baton_server::web::{Web, auth::Auth, router};
use baton_sql::postgres::{PgStore, Target};
use baton_sql::sqlite::{DB_FILE, SqliteStore};
use baton_store::Store;
use tower::ServiceExt;

type Res<T> = Result<T, Box<dyn Error + Send + Sync>>;

const TENANT: &str = "plant";
/// Agents that carry `line=rare`.
const RARE: usize = 5;

fn env_or(name: &str, default: usize) -> Res<usize> {
    match std::env::var(name) {
        Ok(v) => Ok(v.parse()?),
        Err(_) => Ok(default),
    }
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Prints p50 and p99 of `d` under `what`; returns p50.
fn report(what: &str, mut d: Vec<Duration>) -> Duration {
    d.sort();
    let (p50, p99) = (pct(&d, 0.5), pct(&d, 0.99));
    println!(
        "  {what:<58} p50 {:>9.2} ms   p99 {:>9.2} ms",
        p50.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3
    );
    p50
}

async fn get(web: &Arc<Web>, path: &str, auth: Option<(&str, &str)>) -> Res<(Duration, String)> {
    // A plaintext dashboard answers to an address as its host only.
    let mut req = Request::get(path).header(header::HOST, "127.0.0.1");
    if let Some((name, value)) = auth {
        req = req.header(name, value);
    }
    let t = Instant::now();
    let r = router(web.clone())
        .oneshot(req.body(Body::empty())?)
        .await?;
    let status = r.status();
    let body = axum::body::to_bytes(r.into_body(), 1 << 24).await?;
    let took = t.elapsed();
    if !status.is_success() || body.len() < 100 {
        return Err(format!("{path}: {status}").into());
    }
    Ok((took, String::from_utf8_lossy(&body).into_owned()))
}

/// `n` timings of `f`.
async fn times<F, Fut>(n: usize, mut f: F) -> Res<Vec<Duration>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Res<Duration>>,
{
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(f().await?);
    }
    Ok(out)
}

/// The fleet's rows, as statements of `dialect` (`sqlite`, `pg`): a series
/// of `n` numbers, and from it agents, their own labels and their tenant.
fn fleet_sql(dialect: &str, n: usize) -> Vec<String> {
    let (series, id) = match dialect {
        "pg" => (
            format!("WITH s(i) AS (SELECT generate_series(0, {n} - 1))"),
            "'press-' || lpad(i::text, 6, '0')",
        ),
        _ => (
            format!(
                "WITH RECURSIVE s(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM s WHERE i < {n} - 1)"
            ),
            "printf('press-%06d', i)",
        ),
    };
    let every = (n / RARE).max(1);
    let line = format!("CASE WHEN i % {every} = 7 THEN 'rare' ELSE 'common' END");
    vec![
        format!(
            "{series} INSERT INTO agents (id, labels, agent_version, journal_id, connected, \
             last_seen_ns, clock_source, clock_state, clock_offset_ns, clock_jitter_ns, \
             clock_uncertainty_ns, clock_frequency_ppm, clock_at_ns) \
             SELECT {id}, '{{\"line\":\"' || {line} || '\"}}', 'bench', 'j-' || i, \
             CASE WHEN i % 10 = 3 THEN 0 ELSE 1 END, 1, \
             CASE WHEN i % 20 = 0 THEN NULL ELSE 'ntp' END, \
             CASE WHEN i % 20 = 0 THEN NULL WHEN i % 20 = 1 THEN 'holdover' ELSE 'locked' END, \
             CASE WHEN i % 20 = 0 THEN NULL ELSE 1000 END, CASE WHEN i % 20 = 0 THEN NULL ELSE 10 END, \
             CASE WHEN i % 20 = 0 THEN NULL ELSE 50000 END, CASE WHEN i % 20 = 0 THEN NULL ELSE 0.5 END, \
             CASE WHEN i % 20 = 0 THEN NULL ELSE 1 END FROM s"
        ),
        format!(
            "{series} INSERT INTO agent_own_labels (agent_id, key, value) \
             SELECT {id}, 'line', {line} FROM s"
        ),
        format!(
            "{series} INSERT INTO agent_tenants (agent_id, tenant, source, at_ns) \
             SELECT {id}, '{TENANT}', 'certificate', 1 FROM s"
        ),
    ]
}

/// A store of `kind` holding `n` agents, and what must outlive it.
fn open(kind: &str, n: usize) -> Res<(Arc<dyn Store>, Box<dyn std::any::Any>)> {
    let t = Instant::now();
    let opened: (Arc<dyn Store>, Box<dyn std::any::Any>) = match kind {
        "sqlite" => {
            let dir = tempfile::tempdir()?;
            let store = SqliteStore::open(dir.path(), Binding::Tenants)?;
            let conn = rusqlite::Connection::open(dir.path().join(DB_FILE))?;
            for sql in fleet_sql("sqlite", n) {
                conn.execute(&sql, [])?;
            }
            (Arc::new(store), Box::new(dir))
        }
        "pg" => {
            // The sync client runs a runtime of its own: not inside ours.
            let store = std::thread::spawn(move || -> Res<PgStore> {
                let url = baton_testpg::fresh_database().ok_or("no PostgreSQL here")?;
                let store = PgStore::open(&Target::new(&url, None)?, Binding::Tenants)?;
                let mut c = postgres::Client::connect(&url, postgres::NoTls)?;
                for sql in fleet_sql("pg", n) {
                    c.batch_execute(&sql)?;
                }
                c.batch_execute("ANALYZE")?;
                Ok(store)
            })
            .join()
            .map_err(|_| "the loading thread panicked")??;
            (Arc::new(store), Box::new(()))
        }
        other => return Err(format!("DASHBOARD_STORES: unknown store {other:?}").into()),
    };
    println!(
        "{n} agents written into {kind} in {:.2} s",
        t.elapsed().as_secs_f64()
    );
    Ok(opened)
}

/// What [`App::fleet`] did before the store filtered: the caller's
/// agents a store page (1 000) at a time, filtered here, until a page of
/// 50 matched or the fleet ended.
async fn scan_page(store: &dyn Store, tenant: Option<&str>, f: &AgentFilter) -> Res<usize> {
    let mut found = 0;
    let mut after = None;
    loop {
        let rows = store
            .agents(AgentFilter {
                tenant: tenant.map(str::to_owned),
                after_id: after,
                limit: MAX_PAGE,
                ..AgentFilter::default()
            })
            .await?;
        let full = rows.len() == MAX_PAGE as usize;
        after = rows.last().map(|a| a.id.clone());
        for a in &rows {
            if f.matches(a, Binding::Tenants, false) {
                found += 1;
                if found == 51 {
                    return Ok(50);
                }
            }
        }
        if !full {
            return Ok(found);
        }
    }
}

/// What [`App::fleet_counts`] did before: every page, counted here.
async fn scan_counts(store: &dyn Store, tenant: Option<&str>) -> Res<FleetCounts> {
    let mut c = FleetCounts::default();
    let mut after = None;
    loop {
        let rows = store
            .agents(AgentFilter {
                tenant: tenant.map(str::to_owned),
                after_id: after,
                limit: MAX_PAGE,
                ..AgentFilter::default()
            })
            .await?;
        let full = rows.len() == MAX_PAGE as usize;
        after = rows.last().map(|a| a.id.clone());
        for a in &rows {
            c.total += 1;
            if a.connected {
                c.connected += 1;
            } else {
                c.offline += 1;
            }
            if !baton_model::clock_locked(a) {
                c.clock_not_locked += 1;
            }
        }
        if !full {
            return Ok(c);
        }
    }
}

/// A CA in `dir` and a bearer token of an operator of [`TENANT`].
fn operator_token(dir: &std::path::Path) -> Res<(CaDir, String)> {
    let ca = CaDir::new(dir);
    let now = jiff::Timestamp::now();
    ca::init(&ca, &[], now)?;
    let who = Identity::Operator {
        name: "bench".into(),
        tenant: TENANT.into(),
        role: Role::Viewer,
    };
    let cert = ca::issue(&ca, &who, Validity::days(now, 1), ca::Existing::Refuse)?.cert;
    let token = baton_pki::tokens::issue(&ca, &cert)?;
    Ok((ca, token))
}

async fn run(kind: &str, agents: usize, requests: usize) -> Res<()> {
    let (store, guard) = open(kind, agents)?;
    let app = App::new(store.clone(), AppConfig::new(Binding::Tenants));
    let (_stop, shutdown) = tokio::sync::watch::channel(false);
    let revoked = tokio::sync::watch::Sender::new(Arc::new(Default::default()));
    // Every tenant's (plaintext, nobody logs in), and a tenant's operator.
    let open_web = Arc::new(Web {
        app: app.clone(),
        auth: Auth::new(None, revoked.subscribe()),
        shutdown: shutdown.clone(),
        counts: Default::default(),
    });
    let ca_dir = tempfile::tempdir()?;
    let (ca, token) = operator_token(ca_dir.path())?;
    let tls_web = Arc::new(Web {
        app: app.clone(),
        auth: Auth::new(Some(&ca), revoked.subscribe()),
        shutdown,
        counts: Default::default(),
    });
    let bearer = format!("Bearer {token}");
    let bearer = Some((header::AUTHORIZATION.as_str(), bearer.as_str()));
    let login = Request::post("/login")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(format!("token={token}&next=/")))?;
    let r = router(tls_web.clone()).oneshot(login).await?;
    let cookie = r
        .headers()
        .get(header::SET_COOKIE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .ok_or("no session cookie")?
        .to_string();
    let cookie = Some((header::COOKIE.as_str(), cookie.as_str()));

    // Warm, and check what each case finds.
    let (_, page) = get(&open_web, "/?label=line%3Drare", None).await?;
    let rare_rows = page.matches("<tr data-agent=").count();
    assert_eq!(rare_rows, RARE.min(agents), "the rare label's agents");
    let (_, page) = get(&tls_web, "/?q=RARE", bearer).await?;
    assert_eq!(page.matches("<tr data-agent=").count(), rare_rows);

    let everyone = Caller::new(Identity::Insecure);
    let few = requests.div_ceil(10);
    let counts = times(requests, || async {
        let t = Instant::now();
        app.fleet_counts(&everyone, &FleetFilter::default()).await?;
        Ok(t.elapsed())
    })
    .await?;
    let operator = Caller::new(Identity::Operator {
        name: "bench".into(),
        tenant: TENANT.into(),
        role: Role::Viewer,
    });
    let counts_tenant = times(few, || async {
        let t = Instant::now();
        app.fleet_counts(&operator, &FleetFilter::default()).await?;
        Ok(t.elapsed())
    })
    .await?;
    let page = times(requests, || async {
        Ok(get(&open_web, "/", None).await?.0)
    })
    .await?;
    let page_bearer = times(requests, || async {
        Ok(get(&tls_web, "/", bearer).await?.0)
    })
    .await?;
    let page_cookie = times(requests, || async {
        Ok(get(&tls_web, "/", cookie).await?.0)
    })
    .await?;
    let rare = times(requests, || async {
        Ok(get(&open_web, "/?label=line%3Drare", None).await?.0)
    })
    .await?;
    let rare_tenant = times(requests, || async {
        Ok(get(&tls_web, "/?label=line%3Drare", bearer).await?.0)
    })
    .await?;
    let common = times(requests, || async {
        Ok(get(&tls_web, "/?label=line%3Dcommon", bearer).await?.0)
    })
    .await?;
    let text = times(few, || async {
        Ok(get(&open_web, "/?q=rare", None).await?.0)
    })
    .await?;
    let offline = times(requests, || async {
        Ok(get(&open_web, "/?state=offline", None).await?.0)
    })
    .await?;
    let unhealthy = times(requests, || async {
        Ok(get(&open_web, "/?state=unhealthy", None).await?.0)
    })
    .await?;
    let unhealthy_tenant = times(requests, || async {
        Ok(get(&tls_web, "/?state=unhealthy", bearer).await?.0)
    })
    .await?;
    // The peers.
    let rare_filter = AgentFilter {
        label: Some(LabelMatch {
            key: "line".into(),
            value: Some("rare".into()),
        }),
        ..AgentFilter::default()
    };
    let scanned = times(few, || async {
        let t = Instant::now();
        let n = scan_page(store.as_ref(), None, &rare_filter).await?;
        assert_eq!(n, rare_rows);
        Ok(t.elapsed())
    })
    .await?;
    let scanned_counts = times(few, || async {
        let t = Instant::now();
        let c = scan_counts(store.as_ref(), None).await?;
        assert_eq!(c.total as usize, agents);
        Ok(t.elapsed())
    })
    .await?;
    let cli = times(requests, || async {
        let t = Instant::now();
        let page = app.agents(&everyone, None, 50).await?;
        assert_eq!(page.agents.len(), 50.min(agents));
        Ok(t.elapsed())
    })
    .await?;

    println!("fleet page, {agents} agents stored ({kind}), server time:");
    let c = report("counts (one query), every tenant", counts);
    report("counts (one query), a tenant's operator", counts_tenant);
    let p = report("GET / (counts and a page of 50), every tenant", page);
    report("GET /, a tenant's operator, bearer token", page_bearer);
    report("GET /, a tenant's operator, session cookie", page_cookie);
    let r = report(
        &format!("GET /?label=line=rare ({RARE} match), every tenant"),
        rare,
    );
    report("GET /?label=line=rare, a tenant's operator", rare_tenant);
    report(
        "GET /?label=line=common (all but 5), a tenant's operator",
        common,
    );
    report("GET /?q=rare (label values: no index)", text);
    report("GET /?state=offline (1 in 10)", offline);
    report(
        "GET /?state=unhealthy (offline or not locked: 1 in 10), every tenant",
        unhealthy,
    );
    report(
        "GET /?state=unhealthy, a tenant's operator (refusals of its own)",
        unhealthy_tenant,
    );
    let s = report(
        "peer: the application's scan for line=rare (before)",
        scanned,
    );
    let sc = report(
        "peer: the application's count over every page (before)",
        scanned_counts,
    );
    let cl = report("peer: the `agents` call, one page of 50", cli);
    let ratio = |x: Duration, y: Duration| x.as_secs_f64() / y.as_secs_f64();
    println!(
        "  p50 ratios: rare filter {:.3}x the scan it replaces, counts {:.3}x; \
         GET / {:.2}x and rare filter {:.2}x the `agents` call",
        ratio(r, s),
        ratio(c, sc),
        ratio(p, cl),
        ratio(r, cl),
    );
    drop(app);
    drop(store);
    drop(guard);
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Res<()> {
    let agents = env_or("DASHBOARD_AGENTS", 10_000)?;
    let requests = env_or("DASHBOARD_REQUESTS", 200)?;
    let stores = std::env::var("DASHBOARD_STORES").unwrap_or_else(|_| "sqlite,pg".into());
    for kind in stores.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if kind == "pg"
            && !std::thread::spawn(baton_testpg::available)
                .join()
                .unwrap_or(false)
        {
            println!("pg: no PostgreSQL here (skipped)");
            continue;
        }
        run(kind, agents, requests).await?;
    }
    Ok(())
}
