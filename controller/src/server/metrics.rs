//! `/metrics` over HTTP (`serve --metrics ADDR`): a small tokio listener
//! on the server's runtime renders [`crate::app::metrics::Metrics`] on
//! request (the request parsing and the answer are
//! `baton_service::metrics`, shared with the agent). No HTTP framework: one
//! GET every few seconds needs none.

use std::net::SocketAddr;
use std::time::Duration;

use baton_service::metrics::{Request, parse_request, response};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::app::App;

/// Serve `/metrics` on `listener` until the task is aborted: one task
/// per connection, each bounded by the request size and a timeout.
pub async fn serve(listener: tokio::net::TcpListener, app: std::sync::Arc<App>) {
    loop {
        let Ok((mut s, _)) = listener.accept().await else {
            // Out of descriptors, say: do not spin on it.
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let app = app.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(baton_service::metrics::IO_TIMEOUT, async {
                let mut buf = Vec::with_capacity(1024);
                let mut chunk = [0u8; 1024];
                let req = loop {
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            buf.extend_from_slice(&chunk[..n]);
                            match parse_request(&buf) {
                                Request::Incomplete => continue,
                                r => break r,
                            }
                        }
                    }
                };
                // The store is asked only for a scrape (not for a 404).
                let deliveries = match &req {
                    Request::Get { path, .. } if path == "/metrics" => {
                        match app.store.delivery_counts().await {
                            Ok(d) => Some(d),
                            Err(e) => {
                                tracing::warn!("metrics: deliveries by state: {e}");
                                None
                            }
                        }
                    }
                    _ => None,
                };
                let out = response(&req, || {
                    app.metrics
                        .render(app.hub.connected(), deliveries.as_deref())
                });
                let _ = s.write_all(&out).await;
                let _ = s.shutdown().await;
            })
            .await;
        });
    }
}

/// Bind the metrics listener (before READY: a busy address is an error at
/// start).
pub async fn bind(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("metrics: cannot listen on {addr}: {e}"))
}
