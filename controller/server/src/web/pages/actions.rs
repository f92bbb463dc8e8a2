//! What an operator does from the dashboard: cancel a pack, pause,
//! resume or abort its rollout, grant an agent to a tenant or take it
//! back. Each is two steps: a `GET` page that says what it will do and to
//! how many agents (read from the application, with the caller's
//! identity: another tenant's pack is "not found" here as everywhere),
//! and a `POST` from that page's form (CSRF token, same origin) that runs
//! it through the application layer, which checks the role, audits it,
//! refusals too, and tells every open page. Plain forms: they work from
//! the keyboard and without the page's script.

use std::sync::Arc;

use axum::Form;
use axum::extract::{Path, Query, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};

use super::layout::{self, Nav};
use crate::web::auth::{Who, percent};
use crate::web::{Web, app_error, status_of};
use baton_app::AppError;
use baton_app::rollouts::{RolloutCommand, RolloutStatus};
use baton_proto::pack::rollout::OnAbort;

/// `?tenant=` (and, for a grant, what to do).
#[derive(Clone, Debug, Default, serde::Deserialize)]
pub struct Asked {
    /// The pack's tenant (empty: the caller's own); for a grant, the
    /// tenant granted or taken back.
    #[serde(default)]
    pub tenant: String,
    /// A grant: `grant` or `revoke`.
    #[serde(default)]
    pub op: String,
}

/// The confirmation form's fields.
#[derive(Clone, Debug, Default, serde::Deserialize)]
pub struct Confirmed {
    /// The session's CSRF token.
    #[serde(default)]
    pub csrf: String,
    /// As [`Asked::tenant`].
    #[serde(default)]
    pub tenant: String,
    /// As [`Asked::op`].
    #[serde(default)]
    pub op: String,
    /// A cancel limited to these agents, comma-separated (ids hold no
    /// comma); empty: the whole pack.
    #[serde(default)]
    pub agents: String,
}

/// The agents a cancel is limited to, from a query: `agent=` repeated
/// (the deliveries table's check boxes) or `agents=a,b`. Read by hand:
/// the query extractor's decoder takes no repeated key.
fn chosen(query: Option<&str>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (k, v) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        if k == "agent" || k == "agents" {
            out.extend(split_ids(&v));
        }
    }
    out.sort();
    out.dedup();
    out
}

fn split_ids(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|id| !id.is_empty())
        .map(str::to_owned)
        .collect()
}

fn pack_href(name: &str, tenant: &str) -> String {
    format!("/packs/{}?tenant={}", percent(name), percent(tenant))
}

/// A confirmation page: what the action will do, and one button that
/// does it (none, and 403, for a caller whose role may not: the words
/// say why).
struct Confirm<'a> {
    title: String,
    what: Markup,
    post_to: String,
    fields: Vec<(&'static str, String)>,
    button: &'a str,
    back: String,
    denied: Option<AppError>,
}

impl Confirm<'_> {
    fn page(self, who: &Who, nav: Nav) -> Response {
        let code = if self.denied.is_some() {
            StatusCode::FORBIDDEN
        } else {
            StatusCode::OK
        };
        let body = html! {
            h1 { (self.title) }
            section.confirm aria-labelledby="what-h" {
                h2 #what-h { "What it does" }
                (self.what)
            }
            @if let Some(e) = &self.denied {
                p.error role="alert" { (e.to_string()) }
            } @else {
                form #confirm-form method="post" action=(self.post_to) {
                    input type="hidden" name="csrf" value=(who.csrf);
                    @for (k, v) in &self.fields { input type="hidden" name=(k) value=(v); }
                    button.danger type="submit" autofocus { (self.button) }
                    " "
                    a href=(self.back) { "Back, do nothing" }
                }
            }
        };
        (
            code,
            layout::page(&self.title, who.viewer(), nav, None, body),
        )
            .into_response()
    }
}

/// The page after an action: what happened, or why not, and the way back.
fn outcome(
    who: &Who,
    nav: Nav,
    title: &str,
    result: Result<Markup, AppError>,
    back: &str,
) -> Response {
    let (code, body) = match result {
        Ok(done) => (
            StatusCode::OK,
            html! {
                h1 { (title) ": done" }
                p #outcome role="status" { (done) }
                p { a href=(back) { "Back" } }
            },
        ),
        Err(e) => (
            status_of(&e),
            html! {
                h1 { (title) ": not done" }
                p #outcome .error role="alert" { (e.to_string()) }
                p { a href=(back) { "Back" } }
            },
        ),
    };
    (code, layout::page(title, who.viewer(), nav, None, body)).into_response()
}

/// `GET /packs/NAME/cancel` (`?agent=ID` repeated: only on those).
pub async fn cancel_page(
    State(web): State<Arc<Web>>,
    who: Who,
    Path(name): Path<String>,
    Query(q): Query<Asked>,
    RawQuery(raw): RawQuery,
) -> Response {
    let only = chosen(raw.as_deref());
    let reach = match web.app.reach(&who.caller, &q.tenant, &name, &only).await {
        Ok(r) => r,
        Err(e) => return app_error(e),
    };
    let tenant = who.caller.tenant_of(&q.tenant).unwrap_or_default();
    let (title, what, button) = if only.is_empty() {
        (
            format!("Cancel pack {tenant}/{name}"),
            html! {
                p #confirm-what {
                    strong { (reach.holding) " agent(s)" } " hold a version of it now: each runs the pack's safe state and removes it. "
                    (reach.meant) " agent(s) are meant to hold it; none will, until a new version is pushed."
                }
            },
            "Cancel the pack",
        )
    } else {
        (
            format!("Cancel pack {tenant}/{name} on {} agent(s)", only.len()),
            html! {
                p #confirm-what {
                    "On " strong { (only.join(", ")) } ": "
                    (reach.holding) " of them hold a version of it now: each runs the pack's safe state and removes it. "
                    "The pack's other agents keep it. These get no version of it again until a newer one is pushed."
                }
            },
            "Cancel on these agents",
        )
    };
    Confirm {
        title,
        what,
        post_to: format!("/packs/{}/cancel", percent(&name)),
        fields: vec![("tenant", tenant.clone()), ("agents", only.join(","))],
        button,
        back: pack_href(&name, &tenant),
        denied: who.caller.may_change().err(),
    }
    .page(&who, Nav::Packs)
}

/// `POST /packs/NAME/cancel`.
pub async fn cancel(
    State(web): State<Arc<Web>>,
    who: Who,
    headers: HeaderMap,
    Path(name): Path<String>,
    Form(f): Form<Confirmed>,
) -> Response {
    if let Err(r) = who.check_post(&headers, Some(&f.csrf)) {
        return r.into_response();
    }
    let only = split_ids(&f.agents);
    let done = web
        .app
        .cancel_as(&who.caller, &f.tenant, &name, &only)
        .await
        .map(|c| {
            if only.is_empty() {
                html! { "Cancelled " (c.key) " (v" (c.version) "): " (c.agents.len()) " agent(s) told to run its safe state and remove it." }
            } else {
                html! { "Cancelled " (c.key) " (v" (c.version) ") on " (c.agents.join(", ")) ": each told to run its safe state and remove it; the pack's other agents keep it." }
            }
        });
    outcome(
        &who,
        Nav::Packs,
        &format!("Cancel pack {name}"),
        done,
        &pack_href(&name, &f.tenant),
    )
}

fn holders(s: &RolloutStatus) -> usize {
    s.agents
        .iter()
        .filter(|a| a.stage.is_some() && a.view.holds)
        .count()
}

fn rollout_words(cmd: RolloutCommand, s: &RolloutStatus) -> Markup {
    let (v, stage, stages) = (s.row.version, s.row.stage + 1, s.stages);
    let took = holders(s);
    let from = s
        .row
        .from
        .map_or("no version".to_string(), |f| format!("v{f}"));
    html! {
        p #confirm-what {
            @match cmd {
                RolloutCommand::Pause => {
                    "Holds the rollout of v" (v) " at stage " (stage) " of " (stages) ": no further agent is admitted and no stage is judged until it is resumed. "
                    strong { (took) " agent(s)" } " that took v" (v) " keep running it."
                }
                RolloutCommand::Resume => {
                    "Lets the rollout of v" (v) " go on from stage " (stage) " of " (stages) "."
                    @if !s.row.reason.is_empty() { " It was held because: " (s.row.reason) "." }
                }
                RolloutCommand::Abort => {
                    "Ends the rollout of v" (v) " for good. "
                    @match s.spec.on_abort {
                        OnAbort::Rollback => { strong { (took) " agent(s)" } " that took v" (v) " get " (from) "'s content back, as a new version; the others keep " (from) "." }
                        OnAbort::SafeState => { "v" (v) " is cancelled on the " strong { (took) " agent(s)" } " that took it: its safe state runs there; the others keep " (from) "." }
                    }
                }
            }
        }
    }
}

/// `GET /packs/NAME/rollout/{pause,resume,abort}`.
pub async fn rollout_page(
    State(web): State<Arc<Web>>,
    who: Who,
    Path((name, word)): Path<(String, String)>,
    Query(q): Query<Asked>,
) -> Response {
    let Some(cmd) = RolloutCommand::parse(&word) else {
        return (StatusCode::NOT_FOUND, "no such page").into_response();
    };
    let s = match web.app.rollout_status(&who.caller, &q.tenant, &name).await {
        Ok(s) => s,
        Err(e) => return app_error(e),
    };
    let tenant = s.row.tenant.clone();
    let title = format!(
        "{} the rollout of {tenant}/{name} v{}",
        capital(cmd.word()),
        s.row.version
    );
    Confirm {
        what: rollout_words(cmd, &s),
        post_to: format!("/packs/{}/rollout/{}", percent(&name), cmd.word()),
        fields: vec![("tenant", tenant.clone())],
        button: match cmd {
            RolloutCommand::Pause => "Pause the rollout",
            RolloutCommand::Resume => "Resume the rollout",
            RolloutCommand::Abort => "Abort the rollout",
        },
        back: pack_href(&name, &tenant),
        denied: who.caller.may_change().err(),
        title,
    }
    .page(&who, Nav::Packs)
}

/// `POST /packs/NAME/rollout/{pause,resume,abort}`.
pub async fn rollout(
    State(web): State<Arc<Web>>,
    who: Who,
    headers: HeaderMap,
    Path((name, word)): Path<(String, String)>,
    Form(f): Form<Confirmed>,
) -> Response {
    let Some(cmd) = RolloutCommand::parse(&word) else {
        return (StatusCode::NOT_FOUND, "no such page").into_response();
    };
    if let Err(r) = who.check_post(&headers, Some(&f.csrf)) {
        return r.into_response();
    }
    let done = web
        .app
        .rollout_command(&who.caller, &f.tenant, &name, cmd)
        .await
        .map(|r| {
            html! { "The rollout of " (r.tenant) "/" (r.pack) " v" (r.version) " is " (r.state.as_str()) ", at stage " (r.stage + 1) "." }
        });
    let title = format!("{} the rollout of {name}", capital(cmd.word()));
    outcome(&who, Nav::Packs, &title, done, &pack_href(&name, &f.tenant))
}

fn capital(word: &str) -> String {
    let mut c = word.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
}

/// Whether `op` grants (`grant`) or takes back (`revoke`).
fn granting(op: &str) -> Result<bool, AppError> {
    match op {
        "grant" => Ok(true),
        "revoke" => Ok(false),
        o => Err(AppError::Invalid(format!(
            "`{o}`: expected grant or revoke"
        ))),
    }
}

/// `GET /agents/ID/grant?tenant=T&op=grant|revoke`.
pub async fn grant_page(
    State(web): State<Arc<Web>>,
    who: Who,
    Path(id): Path<String>,
    Query(q): Query<Asked>,
) -> Response {
    if let Err(e) = web.app.visible_agent(&who.caller, &id).await {
        return app_error(e);
    }
    let grant = match granting(&q.op) {
        Ok(g) => g,
        Err(e) => return app_error(e),
    };
    if let Err(e) = baton_proto::pack::check_ident("tenant", &q.tenant) {
        return app_error(AppError::Invalid(e));
    }
    let t = &q.tenant;
    let (title, what) = if grant {
        (
            format!("Grant agent {id} to tenant {t}"),
            html! { p #confirm-what { "Agent " (id) " will also serve tenant " strong { (t) } ": its packs that target the agent are delivered to it, and its operators see it." } },
        )
    } else {
        (
            format!("Take agent {id} back from tenant {t}"),
            html! { p #confirm-what { "Agent " (id) " stops serving tenant " strong { (t) } ": that tenant's packs on it are withdrawn (their safe state runs there) and its operators no longer see it. A tenant its certificate names cannot be taken back here." } },
        )
    };
    Confirm {
        title,
        what,
        post_to: format!("/agents/{}/grant", percent(&id)),
        fields: vec![("tenant", t.clone()), ("op", q.op.clone())],
        button: if grant { "Grant" } else { "Take back" },
        back: format!("/agents/{}", percent(&id)),
        denied: who.caller.may_manage_agents().err(),
    }
    .page(&who, Nav::Fleet)
}

/// `POST /agents/ID/grant`.
pub async fn grant(
    State(web): State<Arc<Web>>,
    who: Who,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(f): Form<Confirmed>,
) -> Response {
    if let Err(r) = who.check_post(&headers, Some(&f.csrf)) {
        return r.into_response();
    }
    let done = match granting(&f.op) {
        Ok(g) => web
            .app
            .grant_as(&who.caller, &id, &f.tenant, g)
            .await
            .map(|tenants| html! { "Agent " (id) " serves: " (tenants.join(", ")) "." }),
        Err(e) => Err(e),
    };
    outcome(
        &who,
        Nav::Fleet,
        &format!("Tenants of agent {id}"),
        done,
        &format!("/agents/{}", percent(&id)),
    )
}
