//! `/`: the fleet. Counts by state at the top, then a table paged and
//! filtered by the store (label, state, text): the browser never holds
//! more than a page, however large the fleet, and a filter costs the
//! rows it finds. `/api/agents` is the same page as JSON.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};

use super::layout::{self, Nav};
use super::{ago, badge, span};
use crate::web::auth::{Who, percent};
use crate::web::markup::{clock_cell, delivery_tone};
use crate::web::{Web, app_error};
use baton_app::agents::AgentView;
use baton_app::fleet::{FleetCounts, FleetFilter, FleetPage, FleetState};
use baton_app::rollout_view::Tone;
use baton_app::{AppResult, now_ns};
use baton_model::DeliveryState;
use baton_model::SpanNanos;

/// Rows a page shows unless asked otherwise.
pub const PAGE: u32 = 50;
/// Most rows a page shows.
pub const MAX_ROWS: u32 = 500;
/// How old fleet counts may be before they are counted again (in the
/// background: the stale ones are shown meanwhile). Under an agent's
/// clock report interval (5 s), so an agent that went away is counted
/// as not locked within one.
pub const COUNTS_FOR: Duration = Duration::from_secs(2);

/// Fleet counts by tenant (`""`: a caller of every tenant), a few
/// seconds old at most. Counting is one store query, but one that looks
/// at every agent the caller sees, where a page looks at a page (at
/// 100 000 agents ~10 ms for a caller of every tenant, 35–45 ms for a
/// tenant's operator, whose agents' tenants are looked up one by one;
/// docs/bench/dashboard.md): so a stale count is served while a fresh
/// one is counted in the background, and a page's time stays a page's.
#[derive(Debug, Default)]
pub struct CountsCache(Mutex<HashMap<String, Counted>>);

#[derive(Clone, Copy, Debug)]
struct Counted {
    at: Instant,
    fleet: FleetCounts,
    pending: u64,
    refused: u64,
    refreshing: bool,
}

/// The query of the fleet page.
#[derive(Clone, Debug, Default, serde::Deserialize)]
pub struct FleetQuery {
    /// `key=value` or `key`.
    #[serde(default)]
    pub label: String,
    /// `connected`, `offline`, `clock-not-locked` (empty: any).
    #[serde(default)]
    pub state: String,
    /// Part of an id or label value.
    #[serde(default)]
    pub q: String,
    /// Continue after this agent id.
    #[serde(default)]
    pub after: String,
    /// Rows (default [`PAGE`], at most [`MAX_ROWS`]).
    #[serde(default)]
    pub limit: Option<u32>,
    /// `table`: only the table (the live refresh).
    #[serde(default)]
    pub part: String,
}

impl FleetQuery {
    fn filter(&self) -> Result<FleetFilter, String> {
        let label = match self.label.trim() {
            "" => None,
            l => Some(match l.split_once('=') {
                Some((k, v)) => (k.trim().to_string(), Some(v.trim().to_string())),
                None => (l.to_string(), None),
            }),
        };
        let state = match self.state.as_str() {
            "" => None,
            s => Some(FleetState::parse(s).ok_or_else(|| {
                format!("state `{s}`: expected connected, offline, clock-not-locked or unhealthy")
            })?),
        };
        let text = Some(self.q.trim().to_string()).filter(|t| !t.is_empty());
        Ok(FleetFilter { label, state, text })
    }

    /// The query string, with `after` replaced.
    fn with_after(&self, after: &str) -> String {
        format!(
            "label={}&state={}&q={}&after={}&limit={}",
            percent(&self.label),
            percent(&self.state),
            percent(&self.q),
            percent(after),
            self.limit.unwrap_or(PAGE)
        )
    }
}

async fn load(web: &Web, who: &Who, q: &FleetQuery) -> AppResult<FleetPage> {
    let filter = q.filter().map_err(baton_app::AppError::Invalid)?;
    let after = Some(q.after.clone()).filter(|a| !a.is_empty());
    let limit = q.limit.unwrap_or(PAGE).clamp(1, MAX_ROWS);
    web.app.fleet(&who.caller, &filter, after, limit).await
}

async fn count(web: &Web, who: &Who) -> AppResult<Counted> {
    let fleet = web
        .app
        .fleet_counts(&who.caller, &FleetFilter::default())
        .await?;
    let packs = web.app.packs(&who.caller, "").await?;
    Ok(Counted {
        at: Instant::now(),
        fleet,
        pending: packs.iter().map(|p| u64::from(p.pending)).sum(),
        refused: packs.iter().map(|p| u64::from(p.nacked)).sum(),
        refreshing: false,
    })
}

async fn counts(web: &Arc<Web>, who: &Who) -> AppResult<(FleetCounts, u64, u64)> {
    let key = who.caller.tenant().unwrap_or("").to_string();
    let cached = {
        let mut cache = web.counts.0.lock().unwrap_or_else(|p| p.into_inner());
        let entry = cache.get_mut(&key);
        let stale = entry
            .as_ref()
            .is_some_and(|c| c.at.elapsed() >= COUNTS_FOR && !c.refreshing);
        if let Some(c) = entry {
            if stale {
                c.refreshing = true;
                let (web, who, key) = (web.clone(), who.clone(), key.clone());
                tokio::spawn(async move {
                    let fresh = count(&web, &who).await;
                    let mut cache = web.counts.0.lock().unwrap_or_else(|p| p.into_inner());
                    match fresh {
                        Ok(f) => {
                            cache.insert(key, f);
                        }
                        Err(e) => {
                            tracing::warn!("dashboard: fleet counts: {e}");
                            if let Some(c) = cache.get_mut(&key) {
                                c.refreshing = false;
                            }
                        }
                    }
                });
            }
            Some(*c)
        } else {
            None
        }
    };
    let c = match cached {
        Some(c) => c,
        None => {
            let c = count(web, who).await?;
            let mut cache = web.counts.0.lock().unwrap_or_else(|p| p.into_inner());
            if cache.len() > 10_000 {
                cache.clear();
            }
            cache.insert(key, c);
            c
        }
    };
    Ok((c.fleet, c.pending, c.refused))
}

/// `GET /`.
pub async fn page(State(web): State<Arc<Web>>, who: Who, Query(q): Query<FleetQuery>) -> Response {
    let fleet = match load(&web, &who, &q).await {
        Ok(f) => f,
        Err(e) => return app_error(e),
    };
    if q.part == "table" {
        return table(&q, &fleet).into_response();
    }
    let (c, pending, refused) = match counts(&web, &who).await {
        Ok(c) => c,
        Err(e) => return app_error(e),
    };
    let body = html! {
        h1 { "Fleet" }
        section aria-label="Counts" {
            // Each count links to the agents (or packs) it counts.
            dl.counts {
                (card("Agents", "count-total", c.total, "/", Tone::Neutral))
                (card("Connected", "count-connected", c.connected, "/?state=connected", Tone::Neutral))
                (card("Offline", "count-offline", c.offline, "/?state=offline", if c.offline > 0 { Tone::Bad } else { Tone::Good }))
                (card("Clock not locked", "count-unlocked", c.clock_not_locked, "/?state=clock-not-locked", if c.clock_not_locked > 0 { Tone::Bad } else { Tone::Good }))
                (card("Deliveries pending", "count-pending", pending, "/packs", Tone::Neutral))
                (card("Deliveries refused", "count-refused", refused, "/?state=unhealthy", if refused > 0 { Tone::Bad } else { Tone::Good }))
            }
            p { a #show-unhealthy href="/?state=unhealthy" { "Show agents that need a look" } " (offline, clock not locked or stale, a late firing, an outbox that keeps growing, or a refused delivery)" }
        }
        form.filters method="get" action="/" role="search" {
            label { "Label " input name="label" value=(q.label) placeholder="line=3"; }
            label { "State "
                select name="state" {
                    @for (v, t) in [("", "any"), ("unhealthy", "needs a look"), ("connected", "connected"), ("offline", "offline"), ("clock-not-locked", "clock not locked")] {
                        option value=(v) selected[q.state == v] { (t) }
                    }
                }
            }
            label { "Text " input name="q" type="search" value=(q.q) placeholder="press-"; }
            button type="submit" { "Filter" }
        }
        (table(&q, &fleet))
    };
    layout::page("Fleet", who.viewer(), Nav::Fleet, Some("fleet=1"), body).into_response()
}

fn table(q: &FleetQuery, fleet: &FleetPage) -> Markup {
    let now = now_ns();
    let refresh = format!("/?{}&part=table", q.with_after(&q.after));
    html! {
        div #fleet-table hx-get=(refresh) hx-trigger="sse:fleet throttle:2s" hx-swap="outerHTML" {
            table.cards {
                caption { "Agents" @if !q.state.is_empty() { " (" (q.state) ")" } @if !q.after.is_empty() { " after " (q.after) } }
                thead { tr {
                    th scope="col" { "Agent" } th scope="col" { "Connection" } th scope="col" { "Last seen" }
                    th scope="col" { "Clock" } th scope="col" { "Offset ± uncertainty" }
                    th scope="col" { "Lateness p99" } th scope="col" { "Packs: desired / held" }
                } }
                tbody {
                    @for a in &fleet.agents { (row(a, now)) }
                    @if fleet.agents.is_empty() { tr { td colspan="7" { "No agent matches." } } }
                }
            }
            @if let Some(next) = &fleet.next {
                p { a href=(format!("/?{}", q.with_after(next))) rel="next" { "Next page" } }
            }
        }
    }
}

/// A count card, a link to what it counts; its tone beside the number.
fn card(label: &str, id: &str, n: u64, href: &str, tone: Tone) -> Markup {
    html! {
        div class=(format!("card {}", tone.as_str())) {
            dt { a href=(href) { (label) } }
            dd id=(id) { (n) }
        }
    }
}

fn row(v: &AgentView, now: i64) -> Markup {
    let a = &v.agent;
    html! {
        tr data-agent=(a.id) {
            th scope="row" data-label="Agent" { a href=(format!("/agents/{}", percent(&a.id))) { (a.id) } }
            td data-label="Connection" { @if v.connected { (badge(Tone::Good, "connected")) } @else { (badge(Tone::Bad, "offline")) } }
            td data-label="Last seen" title=(super::instant(a.last_seen.as_nanos())) { (ago(a.last_seen.as_nanos(), now)) }
            td data-label="Clock" { (clock_cell(v, now)) }
            @match &a.clock {
                Some(c) => { td data-label="Offset" { (span(c.offset.nanos())) " ± " (span(c.uncertainty.nanos())) } }
                None => { td data-label="Offset" { "-" } }
            }
            td data-label="Lateness p99" {
                @if v.lateness_p99.nanos() > 0 { (span(v.lateness_p99.nanos())) } @else { "-" }
                @if a.health.late_recently { " " (badge(Tone::Bad, "late firing")) }
                @if a.health.outbox_growing { " " (badge(Tone::Bad, "outbox growing")) }
            }
            td data-label="Packs" {
                @for d in &v.packs {
                    span.pack {
                        (d.pack) " v" (d.version) " / "
                        @match &d.held { Some(h) => { "v" (h.version) @if h.stopped { " (stopped)" } } None => { "none" } }
                        @if d.state != DeliveryState::Acked { " " (badge(delivery_tone(d.state), d.state.as_str())) }
                    }
                    " "
                }
            }
        }
    }
}

/// `GET /api/agents`: the same page as JSON.
pub async fn json(State(web): State<Arc<Web>>, who: Who, Query(q): Query<FleetQuery>) -> Response {
    let fleet = match load(&web, &who, &q).await {
        Ok(f) => f,
        Err(e) => return app_error(e),
    };
    let agents: Vec<serde_json::Value> = fleet
        .agents
        .iter()
        .map(|v| {
            let a = &v.agent;
            serde_json::json!({
                "id": a.id,
                "labels": a.labels,
                "connected": v.connected,
                "last_seen_ns": a.last_seen.as_nanos(),
                "clock": a.clock.as_ref().map(|c| serde_json::json!({
                    "source": c.source, "state": c.state, "offset_ns": c.offset.nanos(),
                    "uncertainty_ns": c.uncertainty.nanos(),
                })),
                "lateness_p99_ns": v.lateness_p99.nanos(),
                "packs": v.packs.iter().map(|d| serde_json::json!({
                    "tenant": d.tenant, "pack": d.pack, "version": d.version,
                    "held": d.held.as_ref().map(|h| h.version), "state": d.state.as_str(),
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    Json(serde_json::json!({ "agents": agents, "next": fleet.next })).into_response()
}
