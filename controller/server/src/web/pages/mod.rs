//! The dashboard's pages and the JSON behind them: each handler takes the
//! caller ([`super::auth::Who`]) and asks the application layer, so the
//! tenant and role rules are the CLI's own.

pub mod actions;
pub mod agent;
pub mod audit;
pub mod fleet;
pub mod layout;
pub mod metrics;
pub mod pack;
pub mod push;
pub mod updates;

use std::sync::Arc;

use maud::{Markup, html};

use super::Web;
use super::auth::Who;
use super::live::exec_row;
/// The pieces of markup every part shares.
pub use crate::web::markup::{ago, badge, when};
use baton_app::AppResult;
use baton_app::feedback::FeedbackQuery;
use baton_model::FeedbackRow;
use baton_model::RefTime;
/// Instants and durations as the CLI prints them.
pub use baton_model::display::{instant, span};

/// Stored feedback the caller may see, as `q` asks (bounded by its limit).
pub async fn recent(web: &Arc<Web>, who: &Who, q: FeedbackQuery) -> AppResult<Vec<FeedbackRow>> {
    let mut rx = web.app.feedback(&who.caller, q);
    let mut rows = Vec::new();
    while let Some(r) = rx.recv().await {
        rows.push(r?);
    }
    Ok(rows)
}

/// The newest feedback `q` asks for over the last `window_ns`: the store
/// reads oldest first, so when `q.limit` rows fill the window, it is cut
/// to a quarter and read again, down to a minute. Returns
/// the rows and the window they cover (ns), which the page states.
pub async fn newest(
    web: &Arc<Web>,
    who: &Who,
    mut q: FeedbackQuery,
    now_ns: i64,
    window_ns: i64,
) -> AppResult<(Vec<FeedbackRow>, i64)> {
    const MIN_WINDOW_NS: i64 = 60 * 1_000_000_000;
    let mut window = window_ns.max(MIN_WINDOW_NS);
    loop {
        q.since = Some(RefTime::from_nanos(now_ns - window));
        let rows = recent(web, who, q.clone()).await?;
        if (rows.len() as u64) < q.limit || window <= MIN_WINDOW_NS {
            return Ok((rows, window));
        }
        window = (window / 4).max(MIN_WINDOW_NS);
    }
}

/// A window (ns) in words: `1 h`, `15 min`.
pub fn window(ns: i64) -> String {
    let s = ns / 1_000_000_000;
    if s >= 3600 && s % 3600 == 0 {
        format!("{} h", s / 3600)
    } else if s >= 60 {
        format!("{} min", s / 60)
    } else {
        format!("{s} s")
    }
}

/// The newest 50 of `rows` (oldest first) as the live executions table:
/// new ones arrive on the page's `exec` events, newest on top.
pub fn exec_table(rows: &[FeedbackRow]) -> Markup {
    html! {
        table #execs {
            thead { tr {
                th scope="col" { "Scheduled" } th scope="col" { "Agent" } th scope="col" { "Pack" }
                th scope="col" { "Instruction" } th scope="col" { "Outcome" } th scope="col" { "Lateness" } th scope="col" { "Reason" }
            } }
            tbody sse-swap="exec" hx-swap="afterbegin" {
                @for r in rows.iter().rev().take(50) { (exec_row(r)) }
            }
        }
    }
}
