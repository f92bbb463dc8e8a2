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
use super::{ago, badge, span, when};
use crate::web::auth::{Who, percent};
use crate::web::downsample;
use crate::web::markup::delivery_tone;
use crate::web::{Web, app_error};
use baton_app::feedback::FeedbackQuery;
use baton_app::packs::DeliveriesPage;
use baton_app::rollout_view::{self as view, Tone};
use baton_app::rollouts::RolloutStatus;
use baton_app::{AppError, now_ns};
use baton_model::RolloutState;
use baton_model::{CohortFigures, DeliveryRow, DeliveryState, Intent, PackVersionRow};
use baton_model::{RefTime, SpanNanos};
use baton_proto::time::format_duration;
use std::time::Duration;

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
    /// `rollout`: only the rollout section (its live refresh).
    #[serde(default)]
    pub part: String,
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
                        td { (when(p.pushed.as_nanos())) }
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
    let now = now_ns();
    if q.part == "rollout" {
        return rollout_section(rollout.as_ref(), &name, &tenant, now).into_response();
    }
    let versions = match web
        .app
        .pack_versions(&who.caller, &tenant, &name, VERSIONS)
        .await
    {
        Ok(v) => v,
        Err(e) => return app_error(e),
    };
    let (rows, span_ns) =
        match super::newest(&web, &who, of_pack(&tenant, &name, 2_000), now, WINDOW_NS).await {
            Ok(r) => r,
            Err(e) => return app_error(e),
        };
    let body = html! {
        h1 { "Pack " (page.key) }
        p #signature {
            "v" (page.version) ": "
            @match &page.signed_by {
                Some(key) => { "signed with key " code { (key) } " (each agent checks it against its trust list)" }
                None => { "unsigned (agents whose tenant requires signed packs refuse it)" }
            }
        }
        (refusals(&page))
        @if who.may_change() { (actions_bar(rollout.as_ref(), &name, &tenant)) }
        (rollout_section(rollout.as_ref(), &name, &tenant, now))
        (versions_section(versions, &page, &name, &tenant, who.may_change()))
        (deliveries_section(&page, &name, &tenant, who.may_change()))
        section aria-labelledby="tl-h" {
            h2 #tl-h { "Execution timeline, last " (super::window(span_ns)) }
            div #timeline-plot .plot data-src=(format!("/api/packs/{}/timeline?tenant={}", percent(&name), percent(&tenant))) role="img" aria-label="Lateness of each execution over time" {}
            (super::exec_table(&rows))
        }
    };
    let live = format!("pack={}", percent(&name));
    layout::plotted_page(
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
    may_push: bool,
) -> Markup {
    html! {
        section aria-labelledby="versions-h" {
            h2 #versions-h { "Versions" }
            table {
                thead { tr {
                    th scope="col" { "Version" } th scope="col" { "Pushed" } th scope="col" { "Targets" } th scope="col" { "Rollout" }
                    @if may_push { th scope="col" { "Push again" } }
                } }
                tbody {
                    @for v in &versions {
                        tr {
                            th scope="row" {
                                @if v.version == page.version { "v" (v.version) " (shown)" }
                                @else { a href=(format!("/packs/{}?tenant={}&version={}", percent(name), percent(tenant), v.version)) { "v" (v.version) } }
                            }
                            td { (when(v.pushed.as_nanos())) }
                            td { (v.targets) }
                            td { @if v.rollout { "yes" } @else { "no" } }
                            @if may_push {
                                td { a href=(format!("/push?from={}&tenant={}&version={}", percent(name), percent(tenant), v.version)) { "as a new version…" } }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// What an operator may do to the pack and its rollout: each a link to
/// a page that says what it will do before it does it.
fn actions_bar(rollout: Option<&RolloutStatus>, name: &str, tenant: &str) -> Markup {
    let to = |what: &str| format!("/packs/{}/{what}?tenant={}", percent(name), percent(tenant));
    let state = rollout.map(|r| r.row.state);
    html! {
        nav.actions aria-label="Actions on this pack" {
            @if let Some(st) = state {
                @if st.is_moving() { a.button href=(to("rollout/pause")) { "Pause rollout…" } }
                @if st == RolloutState::Paused { a.button href=(to("rollout/resume")) { "Resume rollout…" } }
                @if !st.is_final() { a.button.danger href=(to("rollout/abort")) { "Abort rollout…" } }
            }
            a.button.danger href=(to("cancel")) { "Cancel pack…" }
        }
    }
}

/// Every refusal of the shown version, once, near the top.
fn refusals(page: &DeliveriesPage) -> Markup {
    crate::web::markup::refusals(
        &page.rows,
        |n| html! { (n) " agent(s) refused v" (page.version) },
        |d| html! { a href=(format!("/agents/{}", percent(&d.agent_id))) { (d.agent_id) } },
    )
}

/// A version's rollout, if it has one: who holds its stage up (at the
/// top), its state, each stage's progress, the soak left, every gate
/// beside its figure, each member's state in words, and every verdict.
/// Read again when the pack's rows change or an operator acts.
fn rollout_section(rollout: Option<&RolloutStatus>, name: &str, tenant: &str, now: i64) -> Markup {
    let refresh = format!(
        "/packs/{}?tenant={}&part=rollout",
        percent(name),
        percent(tenant)
    );
    let Some(r) = rollout else {
        return html! { div #rollout {} };
    };
    let lines = view::members(r);
    let bars = view::stage_bars(r, &lines);
    let blockers: Vec<&view::MemberLine> = lines.iter().filter(|l| l.blocks).collect();
    let soak = view::soak_left(r, RefTime::from_nanos(now));
    let state_tone = match r.row.state {
        RolloutState::Completed => Tone::Good,
        RolloutState::Running | RolloutState::WaitingWindow | RolloutState::Superseded => {
            Tone::Neutral
        }
        RolloutState::Paused | RolloutState::Aborted => Tone::Bad,
    };
    // Read again on the pack's rows and operators' actions, and, while
    // the rollout moves, every few seconds: a stage that starts or soaks
    // changes no row (and the soak counts down).
    let trigger = if r.row.state.is_final() {
        "sse:action, sse:fleet throttle:2s"
    } else {
        "sse:action, sse:fleet throttle:2s, every 5s"
    };
    html! {
        section #rollout aria-labelledby="rollout-h" hx-get=(refresh) hx-trigger=(trigger) hx-swap="outerHTML" {
            h2 #rollout-h { "Rollout of v" (r.row.version) }
            @if !blockers.is_empty() {
                p #blockers .alert role="alert" {
                    "Stage " (r.row.stage + 1) " waits for: "
                    @for (i, l) in blockers.iter().enumerate() {
                        @if i > 0 { "; " }
                        strong { (l.id) } " (" (l.words)
                        @if let Some(t) = l.since { ", since " (ago(t.as_nanos(), now)) }
                        ")"
                    }
                    "."
                }
            }
            dl.facts {
                div { dt { "State" } dd #rollout-state { (badge(state_tone, r.row.state.as_str())) } }
                div { dt { "Stage" } dd { (r.row.stage + 1) " of " (r.stages) } }
                @if !r.row.reason.is_empty() { div { dt { "Why" } dd { (r.row.reason) } } }
                @if let Some(t) = r.row.switch_at.map(RefTime::as_nanos) { div { dt { "Switch instant" } dd { (when(t)) } } }
                div { dt { "Soak" } dd #soak {
                    @match soak {
                        Some(left) => { (format_duration(Duration::from_secs(left.as_secs()))) " left of " (format_duration(r.spec.soak)) }
                        None => { (format_duration(r.spec.soak)) ", from when every member of the stage holds v" (r.row.version) }
                    }
                } }
                div { dt { "Firings judged" } dd { (r.cohort.stage_settled) " settled of the stage's agents (at least " (r.spec.min_firings) " needed)" } }
                div { dt { "Cohort so far" } dd { (figures(&r.cohort)) } }
                @if let Some(b) = &r.baseline { div { dt { "Baseline" } dd { (figures(b)) } } }
            }
            h3 { "Stages" }
            table #stages {
                thead { tr { th scope="col" { "Stage" } th scope="col" { "Progress" } th scope="col" { "Members" } } }
                tbody {
                    @for (k, b) in bars.iter().enumerate() {
                        tr {
                            th scope="row" { (k + 1) @if k as u32 == r.row.stage && !r.row.state.is_final() { " (current)" } }
                            td {
                                @if b.members > 0 {
                                    progress max=(b.members) value=(b.holds) aria-label=(format!("stage {}: {} of {} hold v{}", k + 1, b.holds, b.members, r.row.version)) {}
                                }
                            }
                            td {
                                @if b.members == 0 { "not started" }
                                @else {
                                    (b.holds) " of " (b.members) " hold v" (r.row.version)
                                    @if b.staged > 0 { ", " (b.staged) " staged" }
                                    @if b.refused > 0 { ", " (b.refused) " refused" }
                                    @if b.skipped > 0 { ", " (b.skipped) " left out" }
                                    @if b.pending > 0 { ", " (b.pending) " pending" }
                                }
                            }
                        }
                    }
                }
            }
            h3 { "Gates" }
            table #gates {
                thead { tr { th scope="col" { "A stage fails on" } th scope="col" { "above" } th scope="col" { "now" } } }
                tbody {
                    @for g in view::gates(r) {
                        tr {
                            th scope="row" { (g.name) }
                            td { (g.fails_above) }
                            td {
                                @if g.crossed { (badge(Tone::Bad, "crossed")) } @else { (badge(Tone::Good, "within")) }
                                " " (g.now)
                            }
                        }
                    }
                }
            }
            h3 { "Members" }
            table #members {
                thead { tr { th scope="col" { "Agent" } th scope="col" { "Stage" } th scope="col" { "State" } th scope="col" { "What" } th scope="col" { "Since" } } }
                tbody {
                    @for l in &lines {
                        tr data-agent=(l.id) data-state=(l.state.badge()) {
                            th scope="row" { a href=(format!("/agents/{}", percent(&l.id))) { (l.id) } }
                            td { @match l.stage { Some(k) => { (k + 1) } None => { "-" } } }
                            td { (badge(l.state.tone(), l.state.badge())) @if l.blocks { " " (badge(Tone::Bad, "blocks the stage")) } }
                            td { (l.words) }
                            td { @match l.since { Some(t) => { span title=(super::instant(t.as_nanos())) { (ago(t.as_nanos(), now)) } } None => { "-" } } }
                        }
                    }
                }
            }
            h3 { "Verdicts" }
            table {
                thead { tr { th scope="col" { "Stage" } th scope="col" { "Verdict" } th scope="col" { "At" } th scope="col" { "Why" } th scope="col" { "Cohort" } th scope="col" { "Baseline" } } }
                tbody {
                    @for v in &r.row.verdicts {
                        tr {
                            td { (v.stage + 1) } td { (v.kind.as_str()) } td { (when(v.at.as_nanos())) }
                            td { (v.reason) @if !v.missing.is_empty() { " (missing: " (v.missing.join(", ")) ")" } }
                            td { (figures(&v.cohort)) }
                            td { @if let Some(b) = &v.baseline { (figures(b)) } @else { "-" } }
                        }
                    }
                    @if r.row.verdicts.is_empty() { tr { td colspan="6" { "No verdict yet." } } }
                }
            }
        }
    }
}

/// One version's deliveries, a page at a time, with refusal messages;
/// for a caller who may change things, a check box on each agent that
/// holds it or is meant to, to cancel it on the chosen ones only.
fn deliveries_section(page: &DeliveriesPage, name: &str, tenant: &str, may_change: bool) -> Markup {
    let choosable = |d: &DeliveryRow| may_change && (d.intent == Intent::Hold || d.held.is_some());
    let table = html! {
        table #deliveries {
            thead { tr {
                @if may_change { th scope="col" { "Choose" } }
                th scope="col" { "Agent" } th scope="col" { "Desired" } th scope="col" { "Held" } th scope="col" { "State" } th scope="col" { "Why" }
            } }
            tbody {
                @for d in &page.rows {
                    tr {
                        @if may_change {
                            td { @if choosable(d) { input type="checkbox" name="agent" value=(d.agent_id) aria-label=(format!("choose {}", d.agent_id)); } }
                        }
                        th scope="row" { a href=(format!("/agents/{}", percent(&d.agent_id))) { (d.agent_id) } }
                        td { "v" (d.version) }
                        td { @match &d.held { Some(h) => { "v" (h.version) } None => { "none" } } }
                        td { (badge(delivery_tone(d.state), d.state.as_str())) }
                        td {
                            @if d.state == DeliveryState::Nacked { "refused: see above" }
                            @else {
                                (d.reason)
                                // A refusal it may still get over (retried): once, here.
                                @if let Some(f) = d.refusal.as_ref().filter(|f| d.state == DeliveryState::Pending && f.message != d.reason) {
                                    " " (f.message)
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    html! {
        section aria-labelledby="deliv-h" {
            h2 #deliv-h { "Deliveries of v" (page.version) }
            @if may_change && page.rows.iter().any(choosable) {
                // A GET: the next page says what it will do before it does it.
                form #choose method="get" action=(format!("/packs/{}/cancel", percent(name))) {
                    input type="hidden" name="tenant" value=(tenant);
                    (table)
                    button.danger type="submit" { "Cancel on the chosen agents…" }
                }
            } @else {
                (table)
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
