//! Statements the controllers send PostgreSQL, counted by the server
//! itself (`pg_stat_statements`, loaded by the bench's cluster): every
//! statement of every connection to the store's database, the replicas'
//! lease renewals and event follows included, `BEGIN` / `COMMIT` /
//! `SAVEPOINT` too (each is a round trip).

use std::time::Duration;

use anyhow::{Context, Result};

/// The counted statements: the store's database's, not the bench's own
/// reads of the counts.
macro_rules! counted {
    () => {
        "FROM pg_stat_statements \
         WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) \
         AND query NOT LIKE '%pg_stat_statements%'"
    };
}

/// The store's database, for counting.
pub struct Statements {
    url: String,
    /// The server's postmaster (its backends are its children).
    postmaster: u32,
}

impl Statements {
    /// Makes the counts readable in the store's database.
    pub async fn open(url: &str) -> Result<Statements> {
        let u = url.to_owned();
        let dir: String = tokio::task::spawn_blocking(move || -> Result<String> {
            let mut c = postgres::Client::connect(&u, postgres::NoTls)?;
            Ok(c.query_one("SHOW data_directory", &[])?.get(0))
        })
        .await??;
        let pid = std::fs::read_to_string(format!("{dir}/postmaster.pid"))?;
        let postmaster = pid
            .lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .context("postmaster.pid")?;
        let s = Statements {
            url: url.to_owned(),
            postmaster,
        };
        s.on_connection(|c| {
            Ok(c.batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")?)
        })
        .await
        .context("pg_stat_statements (loaded by baton_testpg's durable cluster)")?;
        Ok(s)
    }

    /// The database server's CPU time so far: the postmaster (with the
    /// backends it has reaped) and each backend still running. The
    /// server runs on the same two cores as the controllers: rows per
    /// CPU second count its share too.
    pub fn server_cpu(&self) -> Result<Duration> {
        let mut total = crate::controller::cpu_time_with_children(self.postmaster)?;
        for e in std::fs::read_dir("/proc")?.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else {
                continue;
            };
            if crate::controller::parent_of(pid) == Some(self.postmaster) {
                // A backend that ended meanwhile is counted by its parent.
                total += crate::controller::cpu_time(pid).unwrap_or_default();
            }
        }
        Ok(total)
    }

    /// Forgets what was counted so far.
    pub async fn reset(&self) -> Result<()> {
        self.on_connection(|c| Ok(c.batch_execute("SELECT pg_stat_statements_reset()")?))
            .await
    }

    /// Statements run in the store's database since the last reset (the
    /// reset's own excluded).
    pub async fn count(&self) -> Result<u64> {
        self.on_connection(|c| {
            let n: i64 = c
                .query_one(
                    concat!("SELECT COALESCE(SUM(calls), 0)::bigint ", counted!()),
                    &[],
                )?
                .try_get(0)?;
            Ok(u64::try_from(n).unwrap_or(0))
        })
        .await
    }

    /// The `n` statements that took the most time since the last reset:
    /// calls, total milliseconds, and the statement's start.
    pub async fn top(&self, n: i64) -> Result<Vec<(i64, f64, String)>> {
        self.on_connection(move |c| {
            let rows = c.query(
                concat!(
                    "SELECT calls, total_exec_time, left(regexp_replace(query, '\\s+', ' ', 'g'), 90) ",
                    counted!(),
                    " ORDER BY total_exec_time DESC LIMIT $1"
                ),
                &[&n],
            )?;
            Ok(rows
                .iter()
                .map(|r| (r.get(0), r.get(1), r.get(2)))
                .collect())
        })
        .await
    }

    /// `f` on a connection of its own, off the runtime (the client blocks).
    async fn on_connection<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut postgres::Client) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let url = self.url.clone();
        tokio::task::spawn_blocking(move || {
            f(&mut postgres::Client::connect(&url, postgres::NoTls)?)
        })
        .await?
    }
}
