//! `/metrics` (Prometheus text): on the dashboard's server for a caller
//! of every tenant only (a plaintext controller's: it names every
//! tenant's agents), and
//! on `serve --metrics ADDR` for a scraper, unauthenticated (bind it
//! where only the scraper reaches), on the same HTTP stack.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::web::Web;
use crate::web::auth::Who;
use baton_app::App;

/// The metrics as an answer.
pub async fn render(app: &App) -> Response {
    let body = app.metrics_text().await;
    (
        [(header::CONTENT_TYPE, baton_app::metrics::CONTENT_TYPE)],
        body,
    )
        .into_response()
}

/// `GET /metrics` on the dashboard: only for a caller of every tenant
/// (a plaintext controller's): the metrics name every tenant's agents,
/// and every logged-in operator belongs to one tenant. A TLS controller's
/// scraper uses `serve --metrics`.
pub async fn guarded(State(web): State<Arc<Web>>, who: Who) -> Response {
    if who.caller.tenant().is_some() {
        return (
            StatusCode::FORBIDDEN,
            "metrics name every tenant's agents: scrape `serve --metrics ADDR` instead",
        )
            .into_response();
    }
    render(&web.app).await
}

/// The router of `serve --metrics ADDR`: `/metrics` only (GET and HEAD).
pub fn open_router(app: Arc<App>) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|State(app): State<Arc<App>>| async move { render(&app).await }),
        )
        .fallback(|| async {
            (
                StatusCode::NOT_FOUND,
                "not found: metrics are at /metrics\n",
            )
        })
        .with_state(app)
}
