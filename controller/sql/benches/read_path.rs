//! What a read costs on the PostgreSQL store's path (a turn of the
//! bounded reads, the shared SQL replayed on the asynchronous client over
//! the store's shared connections; `postgres/reads.rs`) beside the same
//! query sent by the asynchronous client from the runtime itself, in the
//! same run, on the same database.
//!
//! `cargo bench -p baton-sql --bench read_path` (needs Debian's
//! postgresql: a throwaway cluster is started). Prints, for 1 and for 16
//! reads at once, reads per second and the p50 / p99 of one read, each
//! path in turn, A B A B, and the ratios.

use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_sql::postgres::{PgStore, Target};
use baton_store::contract::hello;
use baton_store::{Binding, Store, StoreOps};

const READS: usize = 4_000;
/// The columns of the store's agent row (`sql/agents.rs`).
const AGENT_COLUMNS: &str = "id, labels, agent_version, journal_id, connected, last_seen_ns, \
     session_gen, owner, lateness_p99_ns, clock_source, clock_state, clock_offset_ns, clock_jitter_ns, clock_uncertainty_ns, \
     clock_frequency_ppm, clock_at_ns";
/// Which labels and tenants `attach` reads for one agent.
const WHICH: &str = "x.agent_id >= $1 AND x.agent_id <= $2 \
     AND (CAST($3 AS TEXT) IS NULL OR EXISTS (SELECT 1 FROM agent_tenants t \
     WHERE t.agent_id = x.agent_id AND t.tenant = $3))";

fn main() {
    let Some(url) = baton_testpg::fresh_database() else {
        eprintln!("read_path: no PostgreSQL cluster (Debian's postgresql) here");
        std::process::exit(1);
    };
    let store = {
        let url = url.clone();
        std::thread::spawn(move || {
            // `READ_PATH_READERS`, `READ_PATH_CONNECTIONS`: the store's
            // bound on reads at once and the connections they share (its
            // defaults otherwise).
            let setting = |name: &str, default: usize| {
                std::env::var(name)
                    .ok()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(default)
            };
            let target = Target::new(&url, None)
                .expect("url")
                .readers(setting(
                    "READ_PATH_READERS",
                    baton_sql::postgres::DEFAULT_READERS,
                ))
                .read_connections(setting(
                    "READ_PATH_CONNECTIONS",
                    baton_sql::postgres::DEFAULT_READ_CONNECTIONS,
                ));
            PgStore::open(&target, Binding::Open).expect("open")
        })
        .join()
        .expect("open thread")
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let store = Arc::new(store);
        store.agent_hello(hello("a1", 1)).await.expect("hello");
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .expect("async client");
        tokio::spawn(conn);
        let client = Arc::new(client);
        // The store's `agent` read is three statements (the row, its
        // operator labels and its tenants, `sql/agents.rs`): the same three
        // here, prepared once, so the two paths differ only in how they
        // reach the database.
        let stmts = Arc::new([
            client
                .prepare(&format!("SELECT {AGENT_COLUMNS} FROM agents WHERE id = $1"))
                .await
                .expect("prepare"),
            client
                .prepare(&format!(
                    "SELECT agent_id, tenant, key, value FROM agent_labels x WHERE {WHICH} \
                     ORDER BY agent_id, tenant, key"
                ))
                .await
                .expect("prepare"),
            client
                .prepare(&format!(
                    "SELECT agent_id, tenant FROM agent_tenants x WHERE {WHICH}"
                ))
                .await
                .expect("prepare"),
        ]);
        println!("| reads at once | path | reads/s | p50 | p99 |");
        println!("|---|---|---|---|---|");
        for at_once in [1usize, 16] {
            let mut figures = Vec::new();
            for round in 0..4 {
                let store_path = round % 2 == 0;
                let (s0, c0, st0) = (store.clone(), client.clone(), stmts.clone());
                let lat = run(at_once, move |_| {
                    let (s, c, st) = (s0.clone(), c0.clone(), st0.clone());
                    async move {
                        if store_path {
                            s.agent("a1").await.expect("read").expect("a1");
                        } else {
                            let row = c.query_one(&st[0], &[&"a1"]).await.expect("read");
                            let id: String = row.get("id");
                            let none: Option<&str> = None;
                            for q in &st[1..] {
                                c.query(q, &[&id, &id, &none]).await.expect("read");
                            }
                        }
                    }
                })
                .await;
                let name = if store_path {
                    "store (its turn, replayed on shared connections)"
                } else {
                    "async client on the runtime"
                };
                println!(
                    "| {at_once} | {name} | {:.0} | {:.0} µs | {:.0} µs |",
                    lat.0,
                    lat.1.as_secs_f64() * 1e6,
                    lat.2.as_secs_f64() * 1e6
                );
                figures.push((store_path, lat));
            }
            let mean = |want: bool, f: fn(&(f64, Duration, Duration)) -> f64| {
                let v: Vec<f64> = figures
                    .iter()
                    .filter(|x| x.0 == want)
                    .map(|x| f(&x.1))
                    .collect();
                v.iter().sum::<f64>() / v.len() as f64
            };
            println!(
                "| {at_once} | store / async | {:.2}× the rate | {:.2}× | {:.2}× |",
                mean(true, |x| x.0) / mean(false, |x| x.0),
                mean(true, |x| x.1.as_secs_f64()) / mean(false, |x| x.1.as_secs_f64()),
                mean(true, |x| x.2.as_secs_f64()) / mean(false, |x| x.2.as_secs_f64()),
            );
        }
    });
}

/// `READS` reads, `at_once` at a time: reads per second, p50, p99.
async fn run<F, Fut>(at_once: usize, read: F) -> (f64, Duration, Duration)
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let read = Arc::new(read);
    let start = Instant::now();
    let tasks: Vec<_> = (0..at_once)
        .map(|w| {
            let read = read.clone();
            tokio::spawn(async move {
                let mut lat = Vec::with_capacity(READS / at_once);
                for i in 0..READS / at_once {
                    let t = Instant::now();
                    read(w * READS + i).await;
                    lat.push(t.elapsed());
                }
                lat
            })
        })
        .collect();
    let mut lat = Vec::with_capacity(READS);
    for t in tasks {
        lat.extend(t.await.expect("reader"));
    }
    let took = start.elapsed();
    lat.sort();
    let pct = |p: f64| lat[((lat.len() - 1) as f64 * p) as usize];
    (lat.len() as f64 / took.as_secs_f64(), pct(0.5), pct(0.99))
}
