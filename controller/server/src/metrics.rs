//! `serve --metrics ADDR`: the listener, bound before READY (a busy
//! address is an error at start); [`crate::web::pages::metrics`] answers
//! on it, through the dashboard's HTTP stack.

use std::net::SocketAddr;

/// Bind the metrics listener.
pub async fn bind(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("metrics: cannot listen on {addr}: {e}"))
}
