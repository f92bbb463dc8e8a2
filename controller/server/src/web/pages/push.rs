//! `/push`: paste or upload a pack's YAML; it is validated as you type
//! (`/push/check`, nothing stored or sent), each error shown at its line
//! and column, and pushed only when the operator says so. A viewer sees
//! no form, and `POST /push` refuses it (the application layer's rule).

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Form, Json};
use baton_proto::RefTime;
use baton_proto::pack::{PackErrors, parse_pack};
use maud::{Markup, html};

use super::layout::{self, Nav};
use crate::web::auth::{Who, percent};
use crate::web::{Web, app_error};
use baton_app::now_ns;

/// Largest request body (a pack's YAML, a form).
pub const MAX_BODY: usize = 4 * 1024 * 1024;

/// The push form.
#[derive(Clone, Debug, Default, serde::Deserialize)]
pub struct PushForm {
    /// The pack's YAML.
    #[serde(default)]
    pub yaml: String,
    /// The session's CSRF token.
    #[serde(default)]
    pub csrf: String,
}

/// Every problem of `yaml` as a pack, with positions, checked as a push
/// would check it (live against the controller's clock too); empty: valid.
pub fn problems(yaml: &str) -> Vec<(u32, u32, String)> {
    let errs: Result<(), PackErrors> = parse_pack(yaml)
        .and_then(|p| p.check_live(RefTime::from_nanos(now_ns())).map(|_| p))
        .map(|_| ());
    match errs {
        Ok(()) => Vec::new(),
        Err(e) => {
            e.0.iter()
                .map(|e| {
                    let msg = match &e.instruction {
                        Some(i) => format!("instruction {i}: {}", e.message),
                        None => e.message.clone(),
                    };
                    (e.pos.line, e.pos.col, msg)
                })
                .collect()
        }
    }
}

fn report(yaml: &str) -> Markup {
    let found = problems(yaml);
    html! {
        div #check role="status" aria-live="polite" {
            @if yaml.trim().is_empty() {
                p { "Paste a pack to check it." }
            } @else if found.is_empty() {
                p.ok { "Valid: ready to push." }
            } @else {
                p.error { (found.len()) " problem(s); nothing is pushed until they are fixed:" }
                ol.errors {
                    @for (line, col, msg) in &found {
                        li data-line=(line) { "line " (line) ", column " (col) ": " (msg) }
                    }
                }
            }
        }
    }
}

/// `?from=NAME&tenant=T&version=V`: start from a stored version.
#[derive(Clone, Debug, Default, serde::Deserialize)]
pub struct FromStored {
    /// The pack.
    #[serde(default)]
    pub from: String,
    /// Its tenant (empty: the caller's).
    #[serde(default)]
    pub tenant: String,
    /// The stored version to start from.
    #[serde(default)]
    pub version: u64,
}

/// `GET /push`, empty or (`?from=`) holding a stored version's YAML as
/// the next version: every byte kept but the version, to push as it is
/// or edited; nothing is pushed until the operator says so.
pub async fn page(State(web): State<Arc<Web>>, who: Who, Query(q): Query<FromStored>) -> Response {
    let start = if q.from.is_empty() || !who.may_change() {
        None
    } else {
        match web
            .app
            .next_from_stored(&who.caller, &q.tenant, &q.from, q.version)
            .await
        {
            Ok(s) => Some(s),
            Err(e) => return app_error(e),
        }
    };
    let yaml = start.as_ref().map_or("", |s| s.yaml.as_str());
    let body = if who.may_change() {
        html! {
            h1 { "Push a pack" }
            @if let Some(s) = &start {
                p #from-stored role="status" { "Version " (q.version) " of " (q.from) " as version " (s.version) ": check it, change what you need, then push." }
                @if let Some(key) = &s.dropped_signature {
                    p #signature-dropped role="status" { "Version " (q.version) " was signed (key " code { (key) } "); the signature covered its bytes, not these, and is left out. Agents whose tenant requires signed packs refuse this one: sign it with " code { "baton-controller push --sign KEY" } " instead." }
                }
            }
            form #push-form method="post" action="/push" {
                input type="hidden" name="csrf" value=(who.csrf);
                label for="pack-file" { "Upload a file " }
                input #pack-file type="file" accept=".yaml,.yml,text/yaml";
                label for="yaml" { "or paste its YAML" }
                textarea #yaml name="yaml" rows="20" spellcheck="false"
                    hx-post="/push/check" hx-trigger="input changed delay:400ms, load" hx-target="#check" hx-swap="outerHTML" { (yaml) }
                (report(""))
                button type="submit" { "Push" }
            }
        }
    } else {
        html! {
            h1 { "Push a pack" }
            p { "Your role (" (who.caller.who) ") reads only: pushing needs the operator or admin role." }
        }
    };
    layout::page("Push", who.viewer(), Nav::Push, None, body).into_response()
}

/// `POST /push/check`: the problems of the YAML, as a fragment.
pub async fn check(who: Who, headers: HeaderMap, Form(f): Form<PushForm>) -> Response {
    if let Err(r) = who.check_post(&headers, None) {
        return r.into_response();
    }
    // Who may not push has no form to check.
    if let Err(e) = who.caller.may_change() {
        return app_error(e);
    }
    report(&f.yaml).into_response()
}

/// `POST /push`: through the application layer, as `push` does.
pub async fn submit(
    State(web): State<Arc<Web>>,
    who: Who,
    headers: HeaderMap,
    Form(f): Form<PushForm>,
) -> Response {
    if let Err(r) = who.check_post(&headers, Some(&f.csrf)) {
        return r.into_response();
    }
    let pushed = web.app.push_as(&who.caller, f.yaml, "dashboard").await;
    if headers.get("accept").and_then(|v| v.to_str().ok()) == Some("application/json") {
        return match pushed {
            Ok(p) => Json(serde_json::json!({
                "pack": p.key.to_string(), "version": p.version, "unchanged": p.unchanged,
                "agents": p.agents, "rollout": p.rollout,
            }))
            .into_response(),
            Err(e) => app_error(e),
        };
    }
    let (code, body) = match pushed {
        Ok(p) => (
            StatusCode::OK,
            html! {
                h1 { "Pushed" }
                p role="status" {
                    (p.key) " v" (p.version)
                    @if p.unchanged { " (unchanged: that version was stored already)" }
                    ": " (p.agents.len()) " agent(s) targeted"
                    @if p.rollout { ", through its rollout" } "."
                }
                p { a href=(format!("/packs/{}?tenant={}", percent(&p.key.pack), percent(&p.key.tenant))) { "To the pack" } }
            },
        ),
        Err(e) => (
            crate::web::status_of(&e),
            html! {
                h1 { "Not pushed" }
                pre.error role="alert" { (e.to_string()) }
                p { a href="/push" { "Back" } }
            },
        ),
    };
    (
        code,
        layout::page("Push", who.viewer(), Nav::Push, None, body),
    )
        .into_response()
}
