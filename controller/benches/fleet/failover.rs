//! The failover phase: one controller killed with `kill -9` while every
//! agent is connected and idle, and the time until its agents are back.
//!
//! With replicas, the last one dies and its agents move to the survivors
//! (each agent's own failover rules, the survivors' admission bound);
//! with a single controller, a supervisor starts it again at once on the
//! same address and store, and every agent comes back to it. Timed from
//! just before the kill to each agent's welcome; then the store is asked
//! whether every agent is recorded connected to a live controller.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use baton_proto::wire::{self, admin_client::AdminClient};
use tonic::transport::Channel;

use crate::PHASE_TIMEOUT;
use crate::agents::{Event, Fleet, unexpected};
use crate::controller::Controller;
use crate::statements::Statements;

#[derive(Clone, Debug, Default)]
pub struct FailoverFig {
    /// Agents whose controller died.
    pub moved: usize,
    /// Kill → each moved agent's welcome (s): p50, p99, max.
    pub p50: f64,
    pub p99: f64,
    pub all: f64,
    /// Kill → the store showing every agent connected to a live
    /// controller (s).
    pub recorded: f64,
    /// Attempts refused (over a survivor's admission rate) or failed (no
    /// controller there yet) before the welcomes.
    pub refused: u64,
    /// Pushes the controllers sent the moved agents (0: each hello said
    /// what the agent held, and nothing was missing).
    pub repushed: usize,
    /// Kill → the restarted controller listening (a single controller).
    pub restart: Option<f64>,
    /// Statements per moved agent, counted by PostgreSQL.
    pub statements_per_agent: Option<f64>,
}

/// Kills the last controller and waits for its agents (see the module
/// doc); `admin` is a survivor's (the restarted controller's, alone).
pub async fn failover(
    fleet: &mut Fleet,
    ctls: &mut [Controller],
    agents: usize,
    stmts: Option<&Statements>,
    admin: &mut AdminClient<Channel>,
) -> Result<FailoverFig> {
    fleet.check()?;
    let n = ctls.len();
    let victim = n - 1;
    let moved: Vec<usize> = (0..agents).filter(|ix| ix % n == victim).collect();
    if let Some(s) = stmts {
        s.reset().await?;
    }
    let t0 = Instant::now();
    ctls[victim].kill9()?;
    let restart = if n == 1 {
        ctls[0].start_again()?;
        Some(t0.elapsed().as_secs_f64())
    } else {
        None
    };

    let until = Instant::now() + PHASE_TIMEOUT;
    let mut welcomed = vec![None; agents];
    let mut left = moved.len();
    let (mut refused, mut repushed) = (0u64, 0usize);
    while left > 0 {
        let ev = tokio::time::timeout_at(until.into(), fleet.events.recv())
            .await
            .with_context(|| format!("{left} agents not back in time"))?
            .context("every agent task ended")?;
        match ev {
            Event::Lost { agent, .. } if agent % n == victim => {}
            Event::Rewelcomed {
                agent,
                at,
                refused: r,
                ..
            } if agent % n == victim && welcomed[agent].is_none() => {
                welcomed[agent] = Some(at - t0);
                refused += u64::from(r);
                left -= 1;
            }
            Event::PackAcked { .. } => repushed += 1,
            other => return Err(unexpected(other)),
        }
    }
    let mut times: Vec<Duration> = welcomed.into_iter().flatten().collect();
    times.sort_unstable();

    // What the store says: every agent connected (to a live controller:
    // a dead replica's rows stay "connected" until a survivor's lease
    // sweep, so with replicas the owner is asked of the database too).
    let recorded = loop {
        // The channel dials again by itself; a restarted controller may
        // refuse the first calls.
        let connected = connected(admin).await.unwrap_or(0);
        let owned = match (ctls.len(), ctls[0].store()) {
            (n, Some(url)) if n > 1 => owned_by_others(url, &format!("r{victim}"), agents).await?,
            _ => true,
        };
        if connected == agents && owned {
            break t0.elapsed();
        }
        if Instant::now() > until {
            bail!("the store shows {connected} of {agents} agents connected");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let statements_per_agent = match stmts {
        Some(s) => Some(s.count().await? as f64 / moved.len().max(1) as f64),
        None => None,
    };
    let secs = |q: f64| crate::pct_d(&times, q).as_secs_f64();
    Ok(FailoverFig {
        moved: moved.len(),
        p50: secs(0.50),
        p99: secs(0.99),
        all: secs(1.0),
        recorded: recorded.as_secs_f64(),
        refused,
        repushed,
        restart,
        statements_per_agent,
    })
}

/// Agents the controller's `agents` listing shows connected.
async fn connected(admin: &mut AdminClient<Channel>) -> Result<usize> {
    let mut after = String::new();
    let mut n = 0;
    loop {
        let page = admin
            .list_agents(wire::ListAgentsRequest {
                after: after.clone(),
                limit: 0,
            })
            .await
            .context("Admin.ListAgents")?
            .into_inner();
        n += page.agents.iter().filter(|a| a.connected).count();
        if page.next.is_empty() {
            return Ok(n);
        }
        after = page.next;
    }
}

/// Whether every agent's row names a live owner (not `victim`).
async fn owned_by_others(url: &str, victim: &str, agents: usize) -> Result<bool> {
    let (url, victim) = (url.to_owned(), victim.to_owned());
    tokio::task::spawn_blocking(move || -> Result<bool> {
        let mut c = postgres::Client::connect(&url, postgres::NoTls)?;
        let n: i64 = c
            .query_one(
                "SELECT COUNT(*) FROM agents WHERE connected <> 0 AND owner <> '' AND owner <> $1",
                &[&victim],
            )?
            .try_get(0)?;
        Ok(n == agents as i64)
    })
    .await?
}
