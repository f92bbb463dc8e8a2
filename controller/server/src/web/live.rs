//! `/live`: server-sent events for the live parts of a page, from the
//! application's event stream filtered exactly as `watch` filters it (the
//! caller's tenant, and the page's agent or pack). Each event is a small
//! HTML fragment htmx swaps in, or a name that makes a part reload
//! itself. A watcher too slow for the events is told how many it missed
//! (`lagged`), never silently left behind; a stream whose session ends
//! (log-out, revocation, expiry) or whose controller stops is closed,
//! and the page says so in words.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use maud::html;
use tokio::sync::broadcast::error::RecvError;

use super::auth::Who;
use super::{Web, app_error};
use baton_app::events::{ActionEvent, Event, WatchFilter, visible};
use baton_model::FeedbackRow;
use baton_model::SpanNanos;

/// What a page listens to.
#[derive(Clone, Debug, Default, serde::Deserialize)]
pub struct LiveQuery {
    /// An agent page.
    #[serde(default)]
    pub agent: String,
    /// A pack page.
    #[serde(default)]
    pub pack: String,
    /// The fleet page.
    #[serde(default)]
    pub fleet: String,
}

/// How often a session is checked again on an open stream.
const RECHECK: Duration = Duration::from_secs(5);

/// `GET /live?agent=ID | pack=NAME | fleet=1`.
pub async fn stream(
    State(web): State<Arc<Web>>,
    who: Who,
    headers: HeaderMap,
    Query(q): Query<LiveQuery>,
) -> Response {
    // The same answer as the page for what the caller may not see.
    if !q.agent.is_empty()
        && let Err(e) = web.app.visible_agent(&who.caller, &q.agent).await
    {
        return app_error(e);
    }
    let filter = WatchFilter {
        tenant: who.caller.tenant().map(str::to_string),
        pack: Some(q.pack.clone()).filter(|p| !p.is_empty()),
    };
    let binding = web.app.cfg.binding;
    let mut rx = web.app.subscribe();
    let mut shutdown = web.shutdown.clone();
    let (tx, out) = tokio::sync::mpsc::channel::<SseEvent>(64);
    let web2 = web.clone();
    tokio::spawn(async move {
        let mut recheck = tokio::time::interval(RECHECK);
        loop {
            // What to do, decided before any await on the channel (the
            // shutdown flag's guard must not live across one).
            let ev: Result<Option<SseEvent>, &'static str> = tokio::select! {
                r = rx.recv() => match r {
                    Ok(ev) if visible(&ev, &filter, binding) => Ok(render(&ev, &q)),
                    Ok(_) => Ok(None),
                    Err(RecvError::Lagged(n)) => {
                        Ok(Some(SseEvent::default().event("lagged").data(n.to_string())))
                    }
                    Err(RecvError::Closed) => return,
                },
                _ = shutdown.changed() => Err("the controller is stopping"),
                _ = recheck.tick() => {
                    if web2.auth.still_valid(&web2.app, &headers).await {
                        Ok(None)
                    } else {
                        Err("your session ended: log in again")
                    }
                }
                () = tx.closed() => return,
            };
            match ev {
                Ok(None) => {}
                Ok(Some(e)) => {
                    if tx.send(e).await.is_err() {
                        return;
                    }
                }
                Err(why) => {
                    let _ = tx.send(SseEvent::default().event("ended").data(why)).await;
                    return;
                }
            }
        }
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(out);
    let stream = tokio_stream::StreamExt::map(stream, Ok::<_, Infallible>);
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

/// The SSE event for `ev` on a page asking `q`, if it concerns it.
fn render(ev: &Event, q: &LiveQuery) -> Option<SseEvent> {
    match ev {
        Event::Feedback(f) => {
            if !q.agent.is_empty() && f.agent_id != q.agent {
                return None;
            }
            if q.agent.is_empty() && q.pack.is_empty() {
                return None;
            }
            Some(
                SseEvent::default()
                    .event("exec")
                    .data(exec_row(f).into_string()),
            )
        }
        Event::Delivery(d) => {
            if !q.agent.is_empty() && d.agent_id != q.agent {
                return None;
            }
            Some(SseEvent::default().event("fleet").data(d.agent_id.clone()))
        }
        Event::Action(a) => {
            // A pack's page hears of its pack, an agent's of its agent,
            // the fleet page of agents (grants).
            let concerns = if !q.pack.is_empty() {
                a.pack == q.pack
            } else if !q.agent.is_empty() {
                a.agent == q.agent
            } else {
                !a.agent.is_empty()
            };
            if !concerns {
                return None;
            }
            Some(
                SseEvent::default()
                    .event("action")
                    .data(action_note(a).into_string()),
            )
        }
        Event::Agent(a) => {
            if !q.agent.is_empty() && a.agent_id != q.agent {
                return None;
            }
            if !q.pack.is_empty() {
                return None;
            }
            let name = match a.kind {
                baton_app::events::AgentEventKind::Clock if !q.agent.is_empty() => "clock",
                _ => "fleet",
            };
            let data = match &a.clock {
                Some(c) if name == "clock" => serde_json::json!({
                    "at_ns": c.at.as_nanos(), "offset_ns": c.offset.nanos(),
                    "uncertainty_ns": c.uncertainty.nanos(), "source": c.source, "state": c.state,
                })
                .to_string(),
                _ => a.agent_id.clone(),
            };
            Some(SseEvent::default().event(name).data(data))
        }
    }
}

/// An operator's action as the line a page adds to its notices.
pub fn action_note(a: &ActionEvent) -> maud::Markup {
    html! {
        li { (super::markup::when(a.at.as_nanos())) ": " (a.text) "." }
    }
}

/// One execution as a table row (the agent and pack pages' "recent
/// executions"); `data-received-ns` is when the controller stored it.
pub fn exec_row(f: &FeedbackRow) -> maud::Markup {
    html! {
        tr data-received-ns=(f.received.as_nanos()) {
            td { (super::markup::when(f.scheduled.as_nanos())) }
            td { (f.agent_id) }
            td { (f.pack) " v" (f.version) }
            td { (f.instruction) }
            td { (baton_model::display::outcome(f.outcome as i32)) }
            td { (baton_model::display::span(f.lateness.nanos())) }
            td { (baton_model::display::reason(f.reason as i32).unwrap_or("")) " " (f.detail) }
        }
    }
}
