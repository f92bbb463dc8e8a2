//! `/packs` and `/packs/NAME`: the packs the caller sees; one pack's
//! stored versions, one version's (the latest by default) per-agent
//! delivery state with refusal messages, its rollout (state, stage, each
//! verdict with its inputs, the cohort's and the baseline's figures), and
//! an execution timeline (lateness of its recent firings, with the
//! rollout's verdicts marked) read from `/api/packs/NAME/timeline`.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};

use super::agent::WINDOW_NS;
use super::layout::{self, Nav};
use super::{instant, span};
use crate::web::auth::{Who, percent};
use crate::web::downsample;
use crate::web::{Web, app_error};
use baton_app::feedback::FeedbackQuery;
use baton_app::packs::DeliveriesPage;
use baton_app::rollouts::RolloutStatus;
use baton_app::{AppError, now_ns};
use baton_model::{CohortFigures, DeliveryState, PackVersionRow};
use baton_model::{RefTime, SpanNanos};

/// `?tenant=` (empty: the caller's own).
#[derive(Clone, Debug, Default, serde::Deserialize)]
pub struct TenantQuery {
    /// Tenant.
    #[serde(default)]
    pub tenant: String,
    /// Deliveries after this agent id.
    #[serde(default)]
    pub after: String,
    /// The version whose deliveries are shown (0: the latest).
    #[serde(default)]
    pub version: u64,
}

/// Versions listed on a pack's page.
pub const VERSIONS: u32 = 20;

/// A pack's feedback, at most `limit` rows.
fn of_pack(tenant: &str, pack: &str, limit: u64) -> FeedbackQuery {
    FeedbackQuery {
        tenant: tenant.to_string(),
        pack: Some(pack.to_string()),
        limit,
        ..FeedbackQuery::default()
    }
}

/// `GET /packs`.
pub async fn list(State(web): State<Arc<Web>>, who: Who) -> Response {
    let packs = match web.app.packs(&who.caller, "").await {
        Ok(p) => p,
        Err(e) => return app_error(e),
    };
    let body = html! {
        h1 { "Packs" }
        table {
            thead { tr {
                th scope="col" { "Pack" } th scope="col" { "Latest" } th scope="col" { "Targets" }
                th scope="col" { "Pushed" } th scope="col" { "Acked" } th scope="col" { "Refused" } th scope="col" { "Pending" }
            } }
            tbody {
                @for p in &packs {
                    tr {
                        th scope="row" { a href=(format!("/packs/{}?tenant={}", percent(&p.pack), percent(&p.tenant))) { (p.tenant) "/" (p.pack) } }
                        td { "v" (p.latest) @if p.cancelled.is_some() { " (cancelled)" } }
                        td { (p.targets) }
                        td { (instant(p.pushed.as_nanos())) }
                        td { (p.acked) } td { (p.nacked) } td { (p.pending) }
                    }
                }
                @if packs.is_empty() { tr { td colspan="7" { "No pack yet." } } }
            }
        }
    };
    layout::page("Packs", who.viewer(), Nav::Packs, None, body).into_response()
}

fn figures(f: &CohortFigures) -> Markup {
    html! {
        (f.agents) " agent(s), " (f.settled) " settled, " (f.failed) " failed, " (f.unknown) " unknown"
        @if let Some(p) = f.lateness_p99.map(SpanNanos::nanos) { ", lateness p99 " (span(p)) }
        @if let Some(o) = f.offset_max.map(SpanNanos::nanos) { ", offset max " (span(o)) }
    }
}

/// `GET /packs/NAME`.
pub async fn page(
    State(web): State<Arc<Web>>,
    who: Who,
    Path(name): Path<String>,
    Query(q): Query<TenantQuery>,
) -> Response {
    let after = Some(q.after.as_str()).filter(|a| !a.is_empty());
    let page = match web
        .app
        .deliveries(&who.caller, &q.tenant, &name, q.version, after, 200)
        .await
    {
        Ok(p) => p,
        Err(e) => return app_error(e),
    };
    let rollout = match web.app.rollout_status(&who.caller, &q.tenant, &name).await {
        Ok(r) => Some(r),
        Err(AppError::NotFound(_)) => None,
        Err(e) => return app_error(e),
    };
    let tenant = page.key.tenant.clone();
    let versions = match web
        .app
        .pack_versions(&who.caller, &tenant, &name, VERSIONS)
        .await
    {
        Ok(v) => v,
        Err(e) => return app_error(e),
    };
    let now = now_ns();
    let (rows, span_ns) =
        match super::newest(&web, &who, of_pack(&tenant, &name, 2_000), now, WINDOW_NS).await {
            Ok(r) => r,
            Err(e) => return app_error(e),
        };
    let body = html! {
        h1 { "Pack " (page.key) }
        (versions_section(versions, &page, &name, &tenant))
        (rollout_section(rollout.as_ref()))
        (deliveries_section(&page, &name, &tenant))
        section aria-labelledby="tl-h" {
            h2 #tl-h { "Execution timeline, last " (super::window(span_ns)) }
            div #timeline-plot .plot data-src=(format!("/api/packs/{}/timeline?tenant={}", percent(&name), percent(&tenant))) role="img" aria-label="Lateness of each execution over time" {}
            (super::exec_table(&rows))
        }
    };
    let live = format!("pack={}", percent(&name));
    layout::page(
        &format!("Pack {}", page.key),
        who.viewer(),
        Nav::Packs,
        Some(&live),
        body,
    )
    .into_response()
}

/// The pack's stored versions, the one shown unlinked.
fn versions_section(
    versions: Vec<PackVersionRow>,
    page: &DeliveriesPage,
    name: &str,
    tenant: &str,
) -> Markup {
    html! {
        section aria-labelledby="versions-h" {
            h2 #versions-h { "Versions" }
            table {
                thead { tr { th scope="col" { "Version" } th scope="col" { "Pushed" } th scope="col" { "Targets" } th scope="col" { "Rollout" } } }
                tbody {
                    @for v in &versions {
                        tr {
                            th scope="row" {
                                @if v.version == page.version { "v" (v.version) " (shown)" }
                                @else { a href=(format!("/packs/{}?tenant={}&version={}", percent(name), percent(tenant), v.version)) { "v" (v.version) } }
                            }
                            td { (instant(v.pushed.as_nanos())) }
                            td { (v.targets) }
                            td { @if v.rollout { "yes" } @else { "no" } }
                        }
                    }
                }
            }
        }
    }
}

/// A version's rollout, if it has one: its state, stage, figures and
/// every verdict.
fn rollout_section(rollout: Option<&RolloutStatus>) -> Markup {
    html! {
        @if let Some(r) = &rollout {
            section aria-labelledby="rollout-h" {
                h2 #rollout-h { "Rollout of v" (r.row.version) }
                dl.facts {
                    div { dt { "State" } dd #rollout-state { (r.row.state.as_str()) } }
                    div { dt { "Stage" } dd { (r.row.stage + 1) " of " (r.stages) } }
                    @if !r.row.reason.is_empty() { div { dt { "Why" } dd { (r.row.reason) } } }
                    @if let Some(t) = r.row.switch_at.map(RefTime::as_nanos) { div { dt { "Switch instant" } dd { (instant(t)) } } }
                    div { dt { "Cohort so far" } dd { (figures(&r.cohort)) } }
                    @if let Some(b) = &r.baseline { div { dt { "Baseline" } dd { (figures(b)) } } }
                }
                h3 { "Verdicts" }
                table {
                    thead { tr { th scope="col" { "Stage" } th scope="col" { "Verdict" } th scope="col" { "At" } th scope="col" { "Why" } th scope="col" { "Cohort" } th scope="col" { "Baseline" } } }
                    tbody {
                        @for v in &r.row.verdicts {
                            tr {
                                td { (v.stage + 1) } td { (v.kind.as_str()) } td { (instant(v.at.as_nanos())) }
                                td { (v.reason) @if !v.missing.is_empty() { " (missing: " (v.missing.join(", ")) ")" } }
                                td { (figures(&v.cohort)) }
                                td { @if let Some(b) = &v.baseline { (figures(b)) } @else { "-" } }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// One version's deliveries, a page at a time, with refusal messages.
fn deliveries_section(page: &DeliveriesPage, name: &str, tenant: &str) -> Markup {
    html! {
        section aria-labelledby="deliv-h" {
            h2 #deliv-h { "Deliveries of v" (page.version) }
            table {
                thead { tr { th scope="col" { "Agent" } th scope="col" { "Desired" } th scope="col" { "Held" } th scope="col" { "State" } th scope="col" { "Why" } } }
                tbody {
                    @for d in &page.rows {
                        tr {
                            th scope="row" { a href=(format!("/agents/{}", percent(&d.agent_id))) { (d.agent_id) } }
                            td { "v" (d.version) }
                            td { @match &d.held { Some(h) => { "v" (h.version) } None => { "none" } } }
                            td { (d.state.as_str()) }
                            td {
                                (d.reason)
                                @if let Some(f) = d.refusal.as_ref().filter(|_| d.state == DeliveryState::Nacked || d.state == DeliveryState::Pending) {
                                    " " (f.message)
                                    @for e in &f.errors { br; code { (e.line) ":" (e.column) " " (e.message) } }
                                }
                            }
                        }
                    }
                }
            }
            @if let Some(n) = &page.next {
                p { a rel="next" href=(format!("/packs/{}?tenant={}&after={}", percent(name), percent(tenant), percent(n))) { "Next page" } }
            }
        }
    }
}

/// `GET /api/packs/NAME/timeline`: lateness (µs) of the pack's firings in
/// the last hour, downsampled like the clock plot, and the rollout's
/// verdicts (stage boundaries) as marks.
pub async fn timeline_json(
    State(web): State<Arc<Web>>,
    who: Who,
    Path(name): Path<String>,
    Query(q): Query<TenantQuery>,
) -> Response {
    let Some(tenant) = who.caller.tenant_of(&q.tenant) else {
        return app_error(AppError::NotFound(format!("no pack {}/{name}", q.tenant)));
    };
    let (rows, span_ns) = match super::newest(
        &web,
        &who,
        of_pack(&tenant, &name, 50_000),
        now_ns(),
        WINDOW_NS,
    )
    .await
    {
        Ok(r) => r,
        Err(e) => return app_error(e),
    };
    let fired = rows.iter().filter(|r| r.actual.as_nanos() > 0);
    let (xs, ys): (Vec<i64>, Vec<f64>) = fired
        .map(|r| (r.scheduled.as_nanos(), r.lateness.nanos() as f64 / 1e3))
        .unzip();
    // Firings arrive in storage order; the plot wants time order.
    let mut order: Vec<usize> = (0..xs.len()).collect();
    order.sort_by_key(|&i| xs[i]);
    let xs: Vec<i64> = order.iter().map(|&i| xs[i]).collect();
    let ys: Vec<f64> = order.iter().map(|&i| ys[i]).collect();
    let keep = downsample::keep(&xs, &[&ys], super::agent::BUCKETS);
    let marks = match web.app.rollout_status(&who.caller, &tenant, &name).await {
        Ok(r) => r
            .row
            .verdicts
            .iter()
            .map(|v| {
                serde_json::json!({
                    "t": v.at.as_nanos() as f64 / 1e9,
                    "label": format!("stage {} {}", v.stage + 1, v.kind.as_str()),
                })
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    Json(serde_json::json!({
        "t": keep.iter().map(|&i| xs[i] as f64 / 1e9).collect::<Vec<f64>>(),
        "lateness_us": keep.iter().map(|&i| ys[i]).collect::<Vec<f64>>(),
        "points": xs.len(),
        "window_s": span_ns / 1_000_000_000,
        "marks": marks,
    }))
    .into_response()
}
