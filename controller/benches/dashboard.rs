//! The dashboard's fleet page, server time, with a large fleet stored:
//! `GET /` (a page of 50, counts at the top) rendered by the real router
//! over the real SQLite store, in-process (no socket, no browser: the
//! server's own share). Cases: counts already kept (the usual request),
//! steady viewing for 12 s (counts go stale every 5 s and are recounted
//! in the background while the stale ones are shown), a tenant's first
//! request (counted inline), and a label filter that matches one agent
//! in a thousand (the store's pages are scanned until a page of matches
//! is found). The peer, in the same run:
//! the application call behind `baton-controller agents` for one page of
//! 50 (what the CLI costs the controller for the same rows).
//!
//! `cargo bench -p baton-controller --bench dashboard`; `DASHBOARD_AGENTS`
//! (default 10 000) and `DASHBOARD_REQUESTS` (default 200) change the load.

use std::error::Error;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::Request;
use baton_app::{App, AppConfig, Caller};
use baton_model::{Binding, RefTime};
use baton_pki::identity::Identity;
use baton_server::web::{Web, auth::Auth, router};
use baton_sql::sqlite::SqliteStore;
use baton_store::{HelloRow, StoreOps};
use tower::ServiceExt;

type Res<T> = Result<T, Box<dyn Error + Send + Sync>>;

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

fn report(what: &str, mut d: Vec<Duration>) -> Duration {
    d.sort();
    let (p50, p99) = (pct(&d, 0.5), pct(&d, 0.99));
    println!(
        "{what:<46} p50 {:>8.2} ms   p99 {:>8.2} ms",
        p50.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3
    );
    p50
}

async fn get(web: &Arc<Web>, path: &str) -> Res<Duration> {
    let t = Instant::now();
    let r = router(web.clone())
        .oneshot(Request::get(path).body(Body::empty())?)
        .await?;
    let status = r.status();
    let body = axum::body::to_bytes(r.into_body(), 1 << 24).await?;
    let took = t.elapsed();
    if !status.is_success() || body.len() < 100 {
        return Err(format!("{path}: {status}").into());
    }
    Ok(took)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Res<()> {
    let agents = env_or("DASHBOARD_AGENTS", 10_000)?;
    let requests = env_or("DASHBOARD_REQUESTS", 200)?;
    let dir = tempfile::tempdir()?;
    let store = Arc::new(SqliteStore::open(dir.path(), Binding::Open)?);
    let t = Instant::now();
    for i in 0..agents {
        let line = if i % 1000 == 7 { "rare" } else { "common" };
        store
            .agent_hello(HelloRow {
                id: format!("press-{i:06}"),
                labels: [("line".to_string(), line.to_string())].into(),
                agent_version: "bench".into(),
                journal_id: format!("j-{i}"),
                cert_tenants: None,
                session_gen_seen: 0,
                held: Vec::new(),
                at: RefTime::from_nanos(1),
            })
            .await?;
    }
    println!(
        "{agents} agents stored in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let app = App::new(store, AppConfig::new(Binding::Open));
    let (_stop, shutdown) = tokio::sync::watch::channel(false);
    let revoked = tokio::sync::watch::Sender::new(Arc::new(Default::default()));
    let web = Arc::new(Web {
        app: app.clone(),
        auth: Auth::new(None, revoked.subscribe()),
        shutdown,
        counts: Default::default(),
    });
    get(&web, "/").await?; // warm: counts kept from here
    let mut warm = Vec::new();
    for _ in 0..requests {
        warm.push(get(&web, "/").await?);
    }
    // Steady viewing for 12 s: the counts go stale twice and are
    // recounted in the background while the stale ones are served.
    let mut steady = Vec::new();
    let until = Instant::now() + Duration::from_secs(12);
    while Instant::now() < until {
        steady.push(get(&web, "/").await?);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut cold = Vec::new();
    for _ in 0..requests.div_ceil(10) {
        let fresh = Arc::new(Web {
            app: app.clone(),
            auth: Auth::new(None, revoked.subscribe()),
            shutdown: web.shutdown.clone(),
            counts: Default::default(),
        });
        cold.push(get(&fresh, "/").await?);
    }
    let mut rare = Vec::new();
    for _ in 0..requests.div_ceil(10) {
        rare.push(get(&web, "/?label=line%3Drare").await?);
    }
    let caller = Caller::new(Identity::Insecure);
    let mut peer = Vec::new();
    for _ in 0..requests {
        let t = Instant::now();
        let page = app.agents(&caller, None, 50).await?;
        peer.push(t.elapsed());
        assert_eq!(page.agents.len(), 50.min(agents));
    }
    println!("fleet page, {agents} agents stored (SQLite), server time:");
    let w = report("GET / (counts kept)", warm);
    let s = report("GET / over 12 s (stale counts recounted aside)", steady);
    let c = report("GET / first of a tenant (counts counted inline)", cold);
    let r = report("GET /?label=line=rare (1 in 1000 matches)", rare);
    let p = report("peer: the `agents` call, one page of 50", peer);
    let ratio = |x: Duration| x.as_secs_f64() / p.as_secs_f64();
    println!(
        "p50 against the peer: kept {:.2}x, steady {:.2}x, first {:.2}x, rare filter {:.2}x",
        ratio(w),
        ratio(s),
        ratio(c),
        ratio(r)
    );
    Ok(())
}
