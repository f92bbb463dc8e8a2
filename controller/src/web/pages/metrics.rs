//! `/metrics` (Prometheus text): on the dashboard's server for admins (it
//! names every tenant's agents) or anyone on a plaintext controller, and
//! on `serve --metrics ADDR` for a scraper, unauthenticated (bind it
//! where only the scraper reaches), on the same HTTP stack.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::app::App;
use crate::web::Web;
use crate::web::auth::Who;

/// The exposition's content type.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The metrics as an answer; the store is asked for deliveries by state.
pub async fn render(app: &App) -> Response {
    let deliveries = match app.store.delivery_counts().await {
        Ok(d) => Some(d),
        Err(e) => {
            tracing::warn!("metrics: deliveries by state: {e}");
            None
        }
    };
    let body = app
        .metrics
        .render(app.hub.connected(), deliveries.as_deref());
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], body).into_response()
}

/// `GET /metrics` on the dashboard: admins only.
pub async fn guarded(State(web): State<Arc<Web>>, who: Who) -> Response {
    if !who.may_audit() {
        return (
            StatusCode::FORBIDDEN,
            "metrics name every tenant's agents: admins only",
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
