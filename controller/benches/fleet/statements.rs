//! Statements the controllers send PostgreSQL, counted by the server
//! itself (`pg_stat_statements`, loaded by the bench's cluster): every
//! statement of every connection to the store's database, the replicas'
//! lease renewals and event follows included, `BEGIN` / `COMMIT` /
//! `SAVEPOINT` too (each is a round trip).

use anyhow::{Context, Result};

/// The store's database, for counting.
pub struct Statements {
    url: String,
}

impl Statements {
    /// Makes the counts readable in the store's database.
    pub async fn open(url: &str) -> Result<Statements> {
        let s = Statements {
            url: url.to_owned(),
        };
        let url = s.url.clone();
        tokio::task::spawn_blocking(move || -> Result<()> {
            let mut c = postgres::Client::connect(&url, postgres::NoTls)?;
            c.batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")?;
            Ok(())
        })
        .await?
        .context("pg_stat_statements (loaded by baton_testpg's durable cluster)")?;
        Ok(s)
    }

    /// Forgets what was counted so far.
    pub async fn reset(&self) -> Result<()> {
        self.run("SELECT pg_stat_statements_reset()").await?;
        Ok(())
    }

    /// Statements run in the store's database since the last reset (the
    /// reset's own excluded).
    pub async fn count(&self) -> Result<u64> {
        let n = self
            .run(
                "SELECT COALESCE(SUM(calls), 0)::bigint FROM pg_stat_statements \
                 WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                 AND query NOT LIKE '%pg_stat_statements%'",
            )
            .await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// The `n` statements that took the most time since the last reset:
    /// calls, total milliseconds, and the statement's start.
    pub async fn top(&self, n: i64) -> Result<Vec<(i64, f64, String)>> {
        let url = self.url.clone();
        tokio::task::spawn_blocking(move || -> Result<Vec<(i64, f64, String)>> {
            let mut c = postgres::Client::connect(&url, postgres::NoTls)?;
            let rows = c.query(
                "SELECT calls, total_exec_time, left(regexp_replace(query, '\\s+', ' ', 'g'), 90) \
                 FROM pg_stat_statements \
                 WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                 AND query NOT LIKE '%pg_stat_statements%' \
                 ORDER BY total_exec_time DESC LIMIT $1",
                &[&n],
            )?;
            Ok(rows
                .iter()
                .map(|r| (r.get(0), r.get(1), r.get(2)))
                .collect())
        })
        .await?
    }

    /// One statement on a connection of its own (the client blocks).
    async fn run(&self, sql: &'static str) -> Result<i64> {
        let url = self.url.clone();
        tokio::task::spawn_blocking(move || -> Result<i64> {
            let mut c = postgres::Client::connect(&url, postgres::NoTls)?;
            let row = c.query_one(sql, &[])?;
            Ok(row.try_get::<_, i64>(0).unwrap_or(0))
        })
        .await?
    }
}
