//! The dashboard's scripts and styles, embedded in the binary: one
//! binary, no JavaScript build step, nothing fetched from the internet.
//! The vendored files (htmx, its SSE extension, uPlot) are kept in
//! `controller/server/assets/vendor` with their licences, exactly as their
//! packages ship them, and pinned here by SHA-256: a changed byte fails
//! the test before it reaches a browser.

use axum::extract::Path;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

/// One embedded file.
#[derive(Debug)]
pub struct Asset {
    /// Its name under `/assets/`.
    pub name: &'static str,
    /// Its bytes.
    pub body: &'static [u8],
    /// `Content-Type`.
    pub content_type: &'static str,
    /// SHA-256 of a vendored file as its package ships it (`None`: ours).
    pub pinned: Option<&'static str>,
}

/// Every file served under `/assets/`.
pub const ASSETS: &[Asset] = &[
    Asset {
        name: "htmx.min.js",
        body: include_bytes!("../../assets/vendor/htmx.min.js"),
        content_type: "text/javascript; charset=utf-8",
        // htmx.org 2.0.11 (npm), dist/htmx.min.js; 0BSD.
        pinned: Some("d6fdc75f204e6bdefa99b69bf1e6d4ac69b8a364f77929f45c13476b4000f717"),
    },
    Asset {
        name: "sse.min.js",
        body: include_bytes!("../../assets/vendor/sse.min.js"),
        content_type: "text/javascript; charset=utf-8",
        // htmx-ext-sse 2.2.4 (npm), dist/sse.min.js; 0BSD.
        pinned: Some("98a46496de0c3605fbffdce9167ba427bdd9553184f83f149c261891a92c0136"),
    },
    Asset {
        name: "uPlot.iife.min.js",
        body: include_bytes!("../../assets/vendor/uPlot.iife.min.js"),
        content_type: "text/javascript; charset=utf-8",
        // uplot 1.6.32 (npm), dist/uPlot.iife.min.js; MIT.
        pinned: Some("19c8d4c6ad88929a79f4ae49d6f7161566dfd0ba3d15cc495e974f787eb78f1f"),
    },
    Asset {
        name: "uPlot.min.css",
        body: include_bytes!("../../assets/vendor/uPlot.min.css"),
        content_type: "text/css; charset=utf-8",
        // uplot 1.6.32 (npm), dist/uPlot.min.css; MIT.
        pinned: Some("df630c6a8d6f8eeaff264b50f73ce5b114f646ffd9a0bb74f049b0a00135fa04"),
    },
    Asset {
        name: "app.css",
        body: include_bytes!("../../assets/app.css"),
        content_type: "text/css; charset=utf-8",
        pinned: None,
    },
    Asset {
        name: "favicon.svg",
        body: include_bytes!("../../assets/favicon.svg"),
        content_type: "image/svg+xml",
        pinned: None,
    },
    Asset {
        name: "app.js",
        body: include_bytes!("../../assets/app.js"),
        content_type: "text/javascript; charset=utf-8",
        pinned: None,
    },
];

/// `GET /assets/NAME`: no log-in needed (nothing in them is a tenant's).
pub async fn serve(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|a| a.name == name) {
        Some(a) => (
            [
                (header::CONTENT_TYPE, a.content_type),
                (header::CACHE_CONTROL, "public, max-age=3600"),
            ],
            a.body,
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "no such asset").into_response(),
    }
}

/// `GET /favicon.ico`: browsers ask for it whatever the page links; the
/// same icon (a page's log would otherwise carry a 404 per visit).
pub async fn favicon() -> Response {
    serve(Path("favicon.svg".to_string())).await
}

#[cfg(test)]
mod tests {
    use sha2::{Digest, Sha256};

    #[test]
    fn the_vendored_files_are_the_pinned_ones_and_carry_their_licences() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/vendor");
        for a in super::ASSETS {
            let Some(pin) = a.pinned else { continue };
            let got: String = Sha256::digest(a.body)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            assert_eq!(
                got, pin,
                "{} changed: re-vendor and re-pin it on purpose",
                a.name
            );
        }
        for licence in ["htmx.LICENSE", "htmx-ext-sse.LICENSE", "uPlot.LICENSE"] {
            let text = std::fs::read_to_string(dir.join(licence)).expect(licence);
            assert!(text.contains("Permission"), "{licence}");
        }
    }
}
