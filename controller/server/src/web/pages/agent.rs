//! `/agents/ID`: one agent. Its clock offset over time with the
//! uncertainty band (the plot reads `/api/agents/ID/clock`, downsampled on
//! the server by [`crate::web::downsample`]), source and state changes
//! listed (and marked on the plot), its recent executions with outcome
//! and reason, and a lateness histogram of them; live without reload.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};

use super::layout::{self, Nav};
use super::{ago, badge, instant, span};
use crate::web::auth::{Who, percent};
use crate::web::downsample;
use crate::web::markup::{clock_cell, delivery_tone};
use crate::web::{Web, app_error};
use baton_app::agents::AgentView;
use baton_app::feedback::FeedbackQuery;
use baton_app::now_ns;
use baton_app::rollout_view::Tone;
use baton_model::DeliveryState;
use baton_model::SpanNanos;
use baton_model::{ClockRow, FeedbackRow};

/// The plot's width in buckets (each keeps its extremes).
pub const BUCKETS: usize = 600;
/// Clock reports read for the plot at most.
pub const CLOCK_ROWS: u32 = 20_000;
/// How far back the page looks by default.
pub const WINDOW_NS: i64 = 3600 * 1_000_000_000;
/// Executions read for the histogram and table at most.
pub const EXEC_ROWS: u64 = 5_000;

/// `?since_ns=` (default: the last hour).
#[derive(Clone, Copy, Debug, Default, serde::Deserialize)]
pub struct Since {
    /// ns since the epoch.
    pub since_ns: Option<i64>,
}

/// Lateness bucket upper bounds, ns (the last is open).
const LATENESS_BOUNDS: [(i64, &str); 8] = [
    (10_000, "< 10 µs"),
    (50_000, "10–50 µs"),
    (100_000, "50–100 µs"),
    (500_000, "100–500 µs"),
    (1_000_000, "0.5–1 ms"),
    (5_000_000, "1–5 ms"),
    (10_000_000, "5–10 ms"),
    (i64::MAX, "≥ 10 ms"),
];

/// How many executions fall in each lateness bucket.
pub fn histogram(rows: &[FeedbackRow]) -> [u64; 8] {
    let mut h = [0u64; 8];
    for r in rows.iter().filter(|r| r.actual.as_nanos() > 0) {
        let l = r.lateness.nanos().max(0);
        let i = LATENESS_BOUNDS
            .iter()
            .position(|(b, _)| l < *b)
            .unwrap_or(LATENESS_BOUNDS.len() - 1);
        h[i] += 1;
    }
    h
}

/// `GET /agents/ID`.
pub async fn page(State(web): State<Arc<Web>>, who: Who, Path(id): Path<String>) -> Response {
    let v = match web.app.agent_view(&who.caller, &id).await {
        Ok(v) => v,
        Err(e) => return app_error(e),
    };
    let now = now_ns();
    let q = FeedbackQuery {
        agent_id: Some(id.clone()),
        limit: EXEC_ROWS,
        ..FeedbackQuery::default()
    };
    let (rows, span_ns) = match super::newest(&web, &who, q, now, WINDOW_NS).await {
        Ok(r) => r,
        Err(e) => return app_error(e),
    };
    let last = super::window(span_ns);
    let h = histogram(&rows);
    let most = h.iter().copied().max().unwrap_or(0).max(1);
    let dropped: u64 = rows.iter().map(|r| r.dropped_before).sum();
    let a = &v.agent;
    let body = html! {
        h1 { "Agent " (a.id) }
        (refusals(&v))
        section aria-label="Status" #agent-status {
            dl.facts {
                div { dt { "Connection" } dd { @if v.connected { (badge(Tone::Good, "connected")) } @else { (badge(Tone::Bad, "offline")) } } }
                div { dt { "Last seen" } dd title=(instant(a.last_seen.as_nanos())) { (ago(a.last_seen.as_nanos(), now)) } }
                div { dt { "Agent version" } dd #version { (a.agent_version) @if !a.arch.is_empty() { " (" (a.arch) ")" } } }
                div { dt { "Agent update" } dd #update { (update_cell(a.update.as_ref())) } }
                div { dt { "Pack signatures" } dd #trust { (trust_cell(a.trust.as_ref())) } }
                div { dt { "Labels" } dd { @for (k, val) in &a.labels { code { (k) "=" (val) } " " } } }
                div { dt { "Clock" } dd #clock-now {
                    (clock_cell(&v, now))
                    @if let Some(c) = &a.clock { ": " (span(c.offset.nanos())) " ± " (span(c.uncertainty.nanos())) }
                } }
                div { dt { "Lateness p99" } dd { @if v.lateness_p99.nanos() > 0 { (span(v.lateness_p99.nanos())) } @else { "-" } } }
                div { dt { "Outbox backlog" } dd #outbox {
                    @if a.health.outbox_growing { (badge(Tone::Bad, "growing")) " " }
                    @match web.app.outbox_of(&a.id) {
                        Some((n, at)) => { (entries(n)) " not yet acknowledged (" (ago(at.as_nanos(), now)) ")" }
                        // Streaming to another replica: as that one last wrote it.
                        None if v.connected => { (entries(a.health.outbox_entries)) " not yet acknowledged (as of " (ago(a.last_seen.as_nanos(), now)) ")" }
                        None => { "not reported (agent offline, or older than this controller)" }
                    }
                } }
                div { dt { "Late firings" } dd #late {
                    @if a.health.late_recently { (badge(Tone::Bad, "late")) " a firing was skipped as later than its max_lateness within the last minute" }
                    @else { "none in the last minute" }
                } }
                div { dt { "Dropped at the agent (outbox full), last " (last) } dd { (dropped) } }
            }
        }
        section aria-labelledby="clock-h" {
            h2 #clock-h { "Clock offset, last hour" }
            p.note { "Offset with its uncertainty band; source and state changes are marked. Long series keep each bucket's lowest and highest point." }
            div #clock-plot .plot data-src=(format!("/api/agents/{}/clock", percent(&a.id))) role="img" aria-label="Clock offset over time" {}
            div #clock-changes {}
        }
        @if who.caller.may_manage_agents().is_ok() {
            section aria-labelledby="tenants-h" {
                h2 #tenants-h { "Tenants" }
                p { "Serves: " @if a.tenants.is_empty() { "no tenant (every tenant, without identities)" } @else { (a.tenants.iter().cloned().collect::<Vec<_>>().join(", ")) } }
                form #grant-form .filters method="get" action=(format!("/agents/{}/grant", percent(&a.id))) {
                    label { "Tenant " input name="tenant" required pattern="[A-Za-z0-9._-]+"; }
                    label { "Action "
                        select name="op" { option value="grant" { "grant it the agent" } option value="revoke" { "take the agent back" } }
                    }
                    button type="submit" { "Review…" }
                }
            }
        }
        (lateness_section(&rows, &last, &h, most))
        section aria-labelledby="exec-h" {
            h2 #exec-h { "Recent executions" }
            (super::exec_table(&rows))
        }
        (packs_section(&v))
    };
    let live = format!("agent={}", percent(&a.id));
    layout::plotted_page(
        &format!("Agent {}", a.id),
        who.viewer(),
        Nav::Fleet,
        Some(&live),
        body,
    )
    .into_response()
}

/// The lateness of the agent's recent executions, as a histogram.
fn lateness_section(rows: &[FeedbackRow], last: &str, h: &[u64], most: u64) -> Markup {
    html! {
        section aria-labelledby="lat-h" {
            h2 #lat-h { "Start lateness, last " (last) " (" (rows.len()) " executions)" }
            table.histogram {
                thead { tr { th scope="col" { "Lateness" } th scope="col" { "Executions" } th scope="col" { "Share" } } }
                tbody {
                    @for (i, (_, label)) in LATENESS_BOUNDS.iter().enumerate() {
                        tr {
                            th scope="row" { (label) }
                            td { (h[i]) }
                            td { progress value=(h[i]) max=(most) { (h[i] * 100 / most) "%" } }
                        }
                    }
                }
            }
        }
    }
}

/// The packs the agent refused, once, at the top.
fn refusals(v: &AgentView) -> Markup {
    crate::web::markup::refusals(
        &v.packs,
        |n| html! { "Refused " (n) " pack(s)" },
        |d| html! { (d.tenant) "/" (d.pack) " v" (d.version) },
    )
}

/// The agent's packs: desired and held versions, state, why.
fn packs_section(v: &AgentView) -> Markup {
    html! {
        section aria-labelledby="packs-h" {
            h2 #packs-h { "Packs" }
            table {
                thead { tr { th scope="col" { "Pack" } th scope="col" { "Desired" } th scope="col" { "Held" } th scope="col" { "State" } th scope="col" { "Why" } } }
                tbody {
                    @for d in &v.packs {
                        tr {
                            th scope="row" { a href=(format!("/packs/{}?tenant={}", percent(&d.pack), percent(&d.tenant))) { (d.tenant) "/" (d.pack) } }
                            td { "v" (d.version) }
                            td { @match &d.held { Some(h) => { "v" (h.version) @if h.stopped { " (stopped)" } } None => { "none" } } }
                            td { (badge(delivery_tone(d.state), d.state.as_str())) }
                            td {
                                @if d.state == DeliveryState::Nacked { "refused: see above" }
                                @else {
                                    (d.reason)
                                    @if let Some(f) = d.refusal.as_ref().filter(|f| f.message != d.reason) { " " (f.message) }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The plot's data: times in seconds, offset and band edges in µs, and
/// every source/state change (from the whole series, before downsampling).
pub fn clock_series(rows: &[ClockRow]) -> serde_json::Value {
    let xs: Vec<i64> = rows.iter().map(|r| r.at.as_nanos()).collect();
    let us = |ns: i64| ns as f64 / 1e3;
    let off: Vec<f64> = rows.iter().map(|r| us(r.offset.nanos())).collect();
    let lo: Vec<f64> = rows
        .iter()
        .map(|r| us(r.offset.nanos().saturating_sub(r.uncertainty.nanos())))
        .collect();
    let hi: Vec<f64> = rows
        .iter()
        .map(|r| us(r.offset.nanos().saturating_add(r.uncertainty.nanos())))
        .collect();
    let keep = downsample::keep(&xs, &[&off, &lo, &hi], BUCKETS);
    let pick = |v: &[f64]| keep.iter().map(|&i| v[i]).collect::<Vec<f64>>();
    let mut changes = Vec::new();
    for w in rows.windows(2) {
        if w[0].source != w[1].source || w[0].state != w[1].state {
            changes.push(serde_json::json!({
                "t": w[1].at.as_nanos() as f64 / 1e9, "source": w[1].source, "state": w[1].state,
            }));
        }
    }
    serde_json::json!({
        "t": keep.iter().map(|&i| xs[i] as f64 / 1e9).collect::<Vec<f64>>(),
        "offset_us": pick(&off),
        "low_us": pick(&lo),
        "high_us": pick(&hi),
        "points": rows.len(),
        "changes": changes,
    })
}

/// `GET /api/agents/ID/clock`.
pub async fn clock_json(
    State(web): State<Arc<Web>>,
    who: Who,
    Path(id): Path<String>,
    Query(s): Query<Since>,
) -> Response {
    let since = s.since_ns.unwrap_or_else(|| now_ns() - WINDOW_NS);
    match web
        .app
        .clock_history(
            &who.caller,
            &id,
            baton_model::RefTime::from_nanos(since),
            CLOCK_ROWS,
        )
        .await
    {
        Ok(rows) => Json(clock_series(&rows)).into_response(),
        Err(e) => app_error(e),
    }
}

/// A count of outbox entries in words.
fn entries(n: u64) -> String {
    format!("{n} entr{}", if n == 1 { "y" } else { "ies" })
}

/// The box's last word on an agent update: a refusal or a rollback
/// stands out, with its reason; a download shows how far it got.
pub(super) fn update_cell(u: Option<&baton_model::UpdateRow>) -> Markup {
    use baton_model::UpdatePhase as P;
    let Some(u) = u else {
        return html! { "none offered" };
    };
    let tone = match u.phase {
        P::Refused | P::RolledBack => Tone::Bad,
        P::Running => Tone::Good,
        _ => Tone::Neutral,
    };
    html! {
        (badge(tone, u.phase.as_str())) " " (u.version)
        @if u.phase == P::Downloading && u.size > 0 {
            " (" (u.held_bytes.saturating_mul(100) / u.size) "%)"
        }
        @if !u.reason.is_empty() { ": " (u.reason) }
    }
}

/// What the agent checks packs against, as it last said: a box that takes
/// no pack (and why) stands out; then its trust list and the tenants
/// whose packs it requires signed.
fn trust_cell(t: Option<&baton_model::TrustRow>) -> Markup {
    let Some(t) = t else {
        return html! { "not reported (an agent older than signed packs)" };
    };
    html! {
        @if !t.nothing_runs.is_empty() {
            (badge(Tone::Bad, "takes no pack")) " " (t.nothing_runs)
        } @else if !t.root {
            (badge(Tone::Neutral, "not checked")) " no trust root installed: packs run unsigned"
        } @else {
            @if t.list_version == 0 { "no trust list yet" } @else {
                "trust list v" (t.list_version)
                @if t.list_expires_ns > 0 { ", expires " (instant(t.list_expires_ns)) }
            }
            @if t.signed_tenants.is_empty() {
                "; signatures checked where present, none required"
            } @else {
                "; signed packs required for " (t.signed_tenants.join(", "))
            }
        }
        @if !t.refused.is_empty() {
            br; (badge(Tone::Bad, "list refused")) " " (t.refused)
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // a failed unwrap is a failed test
    use super::*;
    use baton_model::{RefTime, time};

    fn clock(at_s: i64, offset_ns: i64, state: &str) -> ClockRow {
        ClockRow {
            source: "link".into(),
            state: state.into(),
            offset: time::span(offset_ns),
            jitter: time::span(0),
            uncertainty: time::span(1_000),
            frequency_ppm: 0.0,
            at: RefTime::from_nanos(at_s * 1_000_000_000),
        }
    }

    #[test]
    fn an_update_cell_says_how_far_and_why_escaped() {
        use baton_model::{UpdatePhase, UpdateRow};
        let mut u = UpdateRow {
            version: "2.0.0".into(),
            phase: UpdatePhase::Downloading,
            held_bytes: 250,
            size: 1000,
            reason: String::new(),
            at: RefTime::from_nanos(0),
        };
        let html = update_cell(Some(&u)).into_string();
        assert!(
            html.contains("downloading") && html.contains("2.0.0 (25%)"),
            "{html}"
        );
        u.phase = UpdatePhase::RolledBack;
        u.reason = "<b>not welcomed</b>".into();
        let html = update_cell(Some(&u)).into_string();
        assert!(html.contains("rolled_back"), "{html}");
        assert!(html.contains("&lt;b&gt;not welcomed"), "escaped: {html}");
        assert!(!html.contains("%)"), "{html}");
        assert_eq!(update_cell(None).into_string(), "none offered");
    }

    #[test]
    fn the_plot_keeps_a_spike_and_marks_every_state_change() {
        let mut rows: Vec<ClockRow> = (0..5_000).map(|i| clock(i, 0, "locked")).collect();
        rows[1234].offset = time::span(9_000_000);
        rows[4000].state = "holdover".into();
        let s = clock_series(&rows);
        let t = s["t"].as_array().unwrap();
        assert!(
            t.len() <= 6 * BUCKETS && t.len() < rows.len(),
            "{}",
            t.len()
        );
        let peak = s["offset_us"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v.as_f64())
            .fold(f64::MIN, f64::max);
        assert_eq!(peak, 9_000.0, "the spike survives downsampling");
        let changes = s["changes"].as_array().unwrap();
        assert_eq!(changes.len(), 2, "into holdover and back: {changes:?}");
        assert_eq!(s["points"], 5_000);
    }
}
