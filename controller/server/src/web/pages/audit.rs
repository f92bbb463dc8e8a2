//! `/audit`: the audit log, for admins (the application layer refuses
//! the others, as it refuses `audit` on the command line).

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use maud::html;

use super::layout::{self, Nav};
use super::when;
use crate::web::auth::Who;
use crate::web::{Web, app_error};

/// Records shown (the newest).
pub const ROWS: u32 = 500;

/// `GET /audit`.
pub async fn page(State(web): State<Arc<Web>>, who: Who) -> Response {
    let rows = match web
        .app
        .audit(&who.caller, baton_model::RefTime::from_nanos(0), ROWS)
        .await
    {
        Ok(r) => r,
        Err(e) => return app_error(e),
    };
    let body = html! {
        h1 { "Audit log" }
        p { "The newest " (rows.len()) " record(s)." }
        table {
            thead { tr {
                th scope="col" { "At" } th scope="col" { "Who" } th scope="col" { "Tenant" } th scope="col" { "Role" }
                th scope="col" { "Action" } th scope="col" { "Target" } th scope="col" { "Result" }
            } }
            tbody {
                @for r in rows.iter().rev() {
                    tr {
                        td { (when(r.at.as_nanos())) } td { (r.who) } td { (r.tenant) } td { (r.role) }
                        td { (r.action) } td { (r.target) } td { (r.result) }
                    }
                }
            }
        }
    };
    layout::page("Audit", who.viewer(), Nav::Audit, None, body).into_response()
}
