//! `/updates`: agent updates as the dashboard shows them — the newest
//! update's state, stage, verdicts and each target box with its version
//! and its word on the update (downloading, installed, restarting,
//! running, refused or rolled back and why), and the updates before it.
//! What operators may do to an update is the CLI's (`agent-update`);
//! this page reads, like `agent-update status`, through the application
//! layer's rules (a tenant's operator sees the updates over its boxes).

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};

use super::agent::update_cell;
use super::layout::{self, Nav};
use super::{badge, when};
use crate::web::auth::{Who, percent};
use crate::web::{Web, app_error};
use baton_app::AppError;
use baton_app::rollout_view::Tone;
use baton_app::updates::UpdateStatus;
use baton_model::{AgentUpdateRow, RolloutState};

/// `GET /updates`.
pub async fn page(State(web): State<Arc<Web>>, who: Who) -> Response {
    // The newest update the caller sees (not the newest of all: another
    // tenant's may be newer).
    let list = match web.app.agent_update_list(&who.caller).await {
        Ok(l) => l,
        Err(e) => return app_error(e),
    };
    let current = match list.first() {
        None => None,
        Some(u) => match web.app.agent_update_status(&who.caller, Some(u.id)).await {
            Ok(s) => Some(s),
            Err(AppError::NotFound(_)) => None,
            Err(e) => return app_error(e),
        },
    };
    let body = html! {
        h1 { "Agent updates" }
        @match &current {
            None => p { "No agent update yet. Upload a release and start one with the CLI (" code { "release upload" } ", " code { "agent-update start" } ")." },
            Some(s) => (status(s)),
        }
        @if list.len() > 1 {
            section aria-labelledby="before-h" {
                h2 #before-h { "Before it" }
                (history(&list[1..]))
            }
        }
    };
    layout::page("Agent updates", who.viewer(), Nav::Updates, None, body).into_response()
}

fn state_tone(s: RolloutState) -> Tone {
    match s {
        RolloutState::Completed => Tone::Good,
        RolloutState::Aborted => Tone::Bad,
        _ => Tone::Neutral,
    }
}

fn status(s: &UpdateStatus) -> Markup {
    let m = &s.row.machine;
    html! {
        section #update aria-labelledby="update-h" {
            h2 #update-h { "Update " (s.row.id) " to " (s.row.version) }
            dl.facts {
                div { dt { "State" } dd #update-state { (badge(state_tone(m.state), m.state.as_str())) @if !m.reason.is_empty() { " " (m.reason) } } }
                div { dt { "Stage" } dd { (m.stage + 1) " of " (s.stages) } }
                div { dt { "Boxes" } dd { (m.members.len()) " admitted of " (s.row.targets.len()) } }
                div { dt { "Started" } dd { (when(m.created.as_nanos())) " by " (s.row.by) } }
            }
            @if !m.verdicts.is_empty() {
                h3 { "Verdicts" }
                ul {
                    @for v in &m.verdicts {
                        li { "stage " (v.stage + 1) " " (v.kind.as_str()) " at " (when(v.at.as_nanos())) ": " (v.reason) }
                    }
                }
            }
            table #update-agents {
                thead { tr {
                    th scope="col" { "Agent" } th scope="col" { "Stage" } th scope="col" { "Version" }
                    th scope="col" { "Connected" } th scope="col" { "Its word on the update" }
                } }
                tbody {
                    @for a in &s.agents {
                        tr {
                            td { a href=(format!("/agents/{}", percent(&a.view.id))) { (a.view.id) } }
                            td { @match a.stage { Some(st) => { (st + 1) @if a.skipped { " (skipped)" } }, None => "-" } }
                            td { (a.agent.agent_version) @if !a.agent.arch.is_empty() { " (" (a.agent.arch) ")" } }
                            td { @if a.view.connected { "yes" } @else { (badge(Tone::Bad, "offline")) } }
                            td { @match &a.agent.update {
                                Some(u) if u.version == s.row.version => (update_cell(Some(u))),
                                _ => "-",
                            } }
                        }
                    }
                }
            }
        }
    }
}

fn history(rows: &[AgentUpdateRow]) -> Markup {
    html! {
        table {
            thead { tr {
                th scope="col" { "Id" } th scope="col" { "Version" } th scope="col" { "State" }
                th scope="col" { "Boxes" } th scope="col" { "Updated" } th scope="col" { "Reason" }
            } }
            tbody {
                @for r in rows {
                    tr {
                        td { (r.id) } td { (r.version) }
                        td { (badge(state_tone(r.machine.state), r.machine.state.as_str())) }
                        td { (r.machine.members.len()) " of " (r.targets.len()) }
                        td { (when(r.machine.updated.as_nanos())) } td { (r.machine.reason) }
                    }
                }
            }
        }
    }
}
