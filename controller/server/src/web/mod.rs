//! The web dashboard (`serve --http ADDR`) and `/metrics`, over axum on
//! the server's runtime: HTTPS with the controller's own certificate
//! whenever the gRPC side is TLS (plaintext only with `--insecure`, under
//! the same loopback rule), HTTP/1.1 and HTTP/2 on one port, so several
//! tabs with live streams share one connection.
//!
//! Every page reads through the application layer ([`baton_app`]) with
//! the caller's identity, exactly as the CLI's calls do: a page never shows
//! what `agents`, `packs` or `feedback` would not.
//!
//! Parts, each with one job:
//! - [`auth`]: who is asking (session cookie, bearer token, or nobody on
//!   a plaintext controller); log-in, log-out, CSRF;
//! - [`assets`]: the scripts and styles, embedded, the vendored ones
//!   pinned by SHA-256;
//! - [`pages`]: the HTML pages and the JSON behind them;
//! - [`live`]: server-sent events for the live parts;
//! - [`markup`]: the small pieces of markup the pages and `live` share;
//! - [`downsample`]: long series cut to a plot's width, extremes kept;
//! - [`listen`]: the accept loop (TLS, HTTP/1.1 + HTTP/2, a connection cap).

pub mod assets;
pub mod auth;
pub mod downsample;
pub mod listen;
pub mod live;
pub mod markup;
pub mod pages;

#[cfg(test)]
mod tests;

use std::sync::Arc;

use axum::Router;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use baton_app::{App, AppError};

/// What every handler shares.
#[derive(Debug)]
pub struct Web {
    /// The application.
    pub app: Arc<App>,
    /// Sessions and tokens.
    pub auth: auth::Auth,
    /// Set once the controller stops: live streams end.
    pub shutdown: tokio::sync::watch::Receiver<bool>,
    /// The fleet counts per tenant, kept a few seconds.
    pub counts: pages::fleet::CountsCache,
}

/// The dashboard's routes (and `/metrics`, admins or plaintext only).
pub fn router(web: Arc<Web>) -> Router {
    let https = web.auth.required();
    Router::new()
        .route("/", get(pages::fleet::page))
        .route("/api/agents", get(pages::fleet::json))
        .route("/agents/{id}", get(pages::agent::page))
        .route("/api/agents/{id}/clock", get(pages::agent::clock_json))
        .route("/packs", get(pages::pack::list))
        .route("/packs/{name}", get(pages::pack::page))
        .route(
            "/api/packs/{name}/timeline",
            get(pages::pack::timeline_json),
        )
        .route(
            "/packs/{name}/cancel",
            get(pages::actions::cancel_page).post(pages::actions::cancel),
        )
        .route(
            "/packs/{name}/rollout/{command}",
            get(pages::actions::rollout_page).post(pages::actions::rollout),
        )
        .route(
            "/agents/{id}/grant",
            get(pages::actions::grant_page).post(pages::actions::grant),
        )
        .route("/push", get(pages::push::page).post(pages::push::submit))
        .route("/push/check", post(pages::push::check))
        .route("/audit", get(pages::audit::page))
        .route("/updates", get(pages::updates::page))
        .route("/live", get(live::stream))
        .route(
            "/login",
            get(auth::login_page)
                .post(auth::login)
                // A token and a path: nobody unauthenticated sends more.
                .layer(axum::extract::DefaultBodyLimit::max(auth::MAX_LOGIN_BODY)),
        )
        .route("/logout", post(auth::logout))
        .route("/assets/{name}", get(assets::serve))
        .route("/favicon.ico", get(assets::favicon))
        .route("/metrics", get(pages::metrics::guarded))
        .fallback(|| async { (StatusCode::NOT_FOUND, "no such page") })
        .layer(axum::extract::DefaultBodyLimit::max(pages::push::MAX_BODY))
        .layer(axum::middleware::map_response(security_headers))
        .layer(axum::middleware::map_response(
            move |mut r: Response| async move {
                // Served over HTTPS: browsers stay on it.
                if https {
                    r.headers_mut().insert(
                        header::STRICT_TRANSPORT_SECURITY,
                        HeaderValue::from_static("max-age=31536000"),
                    );
                }
                r
            },
        ))
        .layer(axum::middleware::map_request(host_from_authority))
        .with_state(web)
}

/// The headers every answer carries: scripts only from here (no inline
/// script can run), never framed, no referrer to other sites, no sniffing;
/// pages are not
/// cached (they show a tenant's data).
async fn security_headers(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
        ),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        // Not `no-referrer`: under it browsers send `Origin: null` on
        // this site's own form posts, which the same-origin check refuses.
        HeaderValue::from_static("same-origin"),
    );
    if !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    r
}

/// HTTP/2 carries the host as the URI's authority, not a `Host` header:
/// copied there so one same-origin check serves both.
async fn host_from_authority(mut r: axum::extract::Request) -> axum::extract::Request {
    if !r.headers().contains_key(header::HOST)
        && let Some(v) = r
            .uri()
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
    {
        r.headers_mut().insert(header::HOST, v);
    }
    r
}

/// An application error as an HTTP answer (the same words the CLI gets).
pub fn app_error(e: AppError) -> Response {
    (status_of(&e), e.to_string()).into_response()
}

/// The HTTP status of an application error.
pub fn status_of(e: &AppError) -> StatusCode {
    match e {
        AppError::Invalid(_) => StatusCode::BAD_REQUEST,
        AppError::NotFound(_) => StatusCode::NOT_FOUND,
        AppError::Denied(_) => StatusCode::FORBIDDEN,
        AppError::Conflict(_) => StatusCode::CONFLICT,
        AppError::Limit(_) => StatusCode::PAYLOAD_TOO_LARGE,
        AppError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
    }
}
