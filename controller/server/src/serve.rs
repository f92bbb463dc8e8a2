//! `serve`: bind, start the gRPC and HTTP sides and the background
//! tasks, serve until shutdown, then close every stream.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use baton_proto::wire;
use tokio::sync::watch;

use crate::admin;
use crate::config::ServerConfig;
use crate::link::LinkService;
use crate::shared::Shared;
use crate::{accept, metrics, revocations, tls};
use baton_app::App;
use baton_proto::wire::MAX_MESSAGE_BYTES;

/// Bind, serve `app` (made with [`ServerConfig::app_config`]) until
/// `shutdown` resolves, then close every stream. Writes the bound address
/// to `DATA/listen.addr` (tests and scripts read it when listening on
/// port 0).
pub async fn serve(
    app: Arc<App>,
    cfg: ServerConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", cfg.listen))?;
    let addr = listener.local_addr()?;
    let metrics_listener = bind_metrics(&cfg).await?;
    let http_listener = bind_http(&cfg).await?;
    // Last of the address files: whoever waits for it (a script, a test)
    // finds the dashboard's and the metrics' written already.
    write_addr(&cfg.data_dir, addr)?;
    app.mark_all_disconnected().await?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let shared = Shared::new(app, cfg, stop_rx.clone());
    let background = Background::spawn(&shared, &stop_rx);
    tokio::spawn(relay_trust_chain(shared.clone(), stop_rx.clone()));
    let tls_state = match &shared.cfg.tls {
        Some(t) => {
            let state =
                tls::TlsState::load(baton_pki::ca::CaDir::new(&t.dir), shared.revoked.clone())?;
            Some((Arc::new(state), t.clone()))
        }
        None => None,
    };

    let router = grpc_router(&shared).await?;
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let done = async move {
        let _ = done_rx.await;
    };
    // The dashboard's HTTPS is re-read with the gRPC configuration.
    let web_tls = tls_state.as_ref().map(|(state, _)| state.clone());
    let (accept_task, server) =
        spawn_grpc(listener, addr, tls_state, router, done, &shared, &stop_rx);
    let metrics_task = metrics_listener.map(|l| {
        tokio::spawn(crate::web::listen::serve(
            l,
            None,
            crate::web::pages::metrics::open_router(shared.app.clone()),
            false,
            stop_rx.clone(),
        ))
    });
    let web_task = spawn_web(http_listener, web_tls, &shared, &stop_rx);
    // systemd (`Type=notify`): the listener is bound and the store open.
    // Nothing is sent without NOTIFY_SOCKET; nothing here blocks.
    let notifier = baton_service::notify::Notifier::from_env();
    let status = format!("listening on {addr}");
    notifier.notify(&[
        baton_service::notify::State::Ready,
        baton_service::notify::State::Status(&status),
    ]);
    shutdown.await;
    notifier.notify(&[
        baton_service::notify::State::Stopping,
        baton_service::notify::State::Status("stopping: closing agent streams"),
    ]);
    accept_task.abort();
    if let Some(t) = metrics_task {
        t.abort();
    }
    if let Some(t) = web_task {
        t.abort();
    }
    tracing::info!("stopping: closing agent streams and watchers");
    let _ = stop_tx.send(true);
    let _ = done_tx.send(());
    // Streams end on the stop signal; a peer that does not read gets a
    // bounded wait, not a hang.
    match tokio::time::timeout(Duration::from_secs(5), server).await {
        Ok(Ok(r)) => r.map_err(|e| anyhow::anyhow!("server: {e}"))?,
        Ok(Err(e)) => anyhow::bail!("server task: {e}"),
        Err(_) => tracing::warn!("streams still open after 5 s; stopping anyway"),
    }
    background.finish().await;
    Ok(())
}

/// A new trust chain (the binary re-read `--trust-chain`) relayed to
/// every stream open, until `stop`; streams welcomed later read it at
/// their Welcome.
async fn relay_trust_chain(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    // A chain sent before this task first looks is relayed again:
    // harmless (an agent takes only lists newer than its own).
    let mut chain = shared.cfg.trust_chain.clone();
    loop {
        tokio::select! {
            changed = chain.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            _ = stop.changed() => return,
        }
        let Some(c) = chain.borrow_and_update().clone() else {
            continue;
        };
        let n = shared
            .app
            .hub
            .send_all(|| baton_app::hub::SessionCmd::TrustLists(c.clone()));
        tracing::info!(
            streams = n,
            "new trust lists relayed to the agents connected"
        );
    }
}

/// The gRPC side served on `listener`, plaintext or mTLS (then with the
/// watchers of its certificate files and revocations): the accept loop's
/// task and the server's.
fn spawn_grpc(
    listener: tokio::net::TcpListener,
    addr: SocketAddr,
    tls_state: Option<(Arc<tls::TlsState>, tls::TlsOptions)>,
    router: tonic::transport::server::Router,
    done: impl std::future::Future<Output = ()> + Send + 'static,
    shared: &Arc<Shared>,
    stop_rx: &watch::Receiver<bool>,
) -> (
    tokio::task::JoinHandle<()>,
    tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
) {
    let accept_opts = shared.cfg.accept;
    let accept_task;
    let server = match tls_state {
        None => {
            tracing::info!(%addr, max_connections = accept_opts.max_connections, "controller listening (plaintext, --insecure)");
            let (incoming, task) = accept::plaintext(listener, accept_opts, shared.app.clone());
            accept_task = task;
            tokio::spawn(router.serve_with_incoming_shutdown(incoming, done))
        }
        Some((state, opts)) => {
            let h = accept_opts.handshakes;
            tracing::info!(
                %addr,
                dir = %opts.dir.display(),
                max_connections = accept_opts.max_connections,
                max_handshakes = h.total,
                per_source = h.per_source,
                "controller listening (mTLS)"
            );
            tokio::spawn(tls::watch_files(
                state.clone(),
                opts.reload_every,
                stop_rx.clone(),
            ));
            tokio::spawn(revocations::audit_revocations(
                shared.clone(),
                baton_pki::ca::CaDir::new(&opts.dir),
            ));
            if shared.app.replica().is_some() {
                tokio::spawn(revocations::follow_revocations(
                    shared.clone(),
                    state.clone(),
                ));
            }
            let (incoming, task) = accept::tls(listener, state, accept_opts, shared.app.clone());
            accept_task = task;
            tokio::spawn(router.serve_with_incoming_shutdown(incoming, done))
        }
    };
    (accept_task, server)
}

/// `serve --metrics`: bound, its address written to `DATA/metrics.addr`.
async fn bind_metrics(cfg: &ServerConfig) -> anyhow::Result<Option<tokio::net::TcpListener>> {
    Ok(match cfg.metrics {
        Some(a) => {
            let l = metrics::bind(a).await?;
            let bound = l.local_addr()?;
            write_file_atomic(&cfg.data_dir, "metrics.addr", &format!("{bound}\n"))?;
            tracing::info!("metrics on http://{bound}/metrics");
            Some(l)
        }
        None => None,
    })
}

/// `serve --http`: the dashboard's listener bound, its address written to
/// `DATA/http.addr`.
async fn bind_http(cfg: &ServerConfig) -> anyhow::Result<Option<tokio::net::TcpListener>> {
    Ok(match cfg.http {
        Some(a) => {
            let l = tokio::net::TcpListener::bind(a)
                .await
                .map_err(|e| anyhow::anyhow!("dashboard: cannot listen on {a}: {e}"))?;
            let bound = l.local_addr()?;
            write_file_atomic(&cfg.data_dir, "http.addr", &format!("{bound}\n"))?;
            let scheme = if cfg.tls.is_some() { "https" } else { "http" };
            tracing::info!("dashboard on {scheme}://{bound}/");
            Some(l)
        }
        None => None,
    })
}

/// The gRPC services (health, reflection, Link, Admin) on one router,
/// with the transport's keep-alives and flow-control windows.
async fn grpc_router(shared: &Arc<Shared>) -> anyhow::Result<tonic::transport::server::Router> {
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<wire::link_server::LinkServer<LinkService>>()
        .await;
    health
        .set_serving::<wire::admin_server::AdminServer<admin::AdminService>>()
        .await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(baton_proto::wire::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| anyhow::anyhow!("reflection: {e}"))?;

    let link = wire::link_server::LinkServer::new(LinkService::new(shared.clone()))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let admin = wire::admin_server::AdminServer::new(admin::AdminService::new(shared.clone()))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);

    Ok(tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(10)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        // What a peer may send that the controller has not read yet: 256 KB
        // per stream, 512 KB per connection (hyper's default is 1 MB each).
        // An agent's outbox page is ~15 KB; a message is at most 16 MB and
        // still arrives (flow control paces it, it does not refuse it).
        .initial_stream_window_size(Some(256 * 1024))
        .initial_connection_window_size(Some(512 * 1024))
        .add_service(health_service)
        .add_service(reflection)
        .add_service(link)
        .add_service(admin))
}

/// The dashboard (`serve --http`), over the gRPC side's TLS state.
fn spawn_web(
    http_listener: Option<tokio::net::TcpListener>,
    web_tls: Option<Arc<tls::TlsState>>,
    shared: &Arc<Shared>,
    stop_rx: &watch::Receiver<bool>,
) -> Option<tokio::task::JoinHandle<()>> {
    match http_listener {
        Some(l) => {
            let tls_dir = shared
                .cfg
                .tls
                .as_ref()
                .map(|t| baton_pki::ca::CaDir::new(&t.dir));
            let web = Arc::new(crate::web::Web {
                app: shared.app.clone(),
                auth: crate::web::auth::Auth::new(tls_dir.as_ref(), shared.revoked.subscribe()),
                shutdown: stop_rx.clone(),
                counts: Default::default(),
            });
            Some(tokio::spawn(crate::web::listen::serve(
                l,
                web_tls,
                crate::web::router(web),
                true,
                stop_rx.clone(),
            )))
        }
        None => None,
    }
}

/// The application's tasks beside the listeners, each running until the
/// stop signal.
struct Background {
    retention: tokio::task::JoinHandle<()>,
    rollouts: tokio::task::JoinHandle<()>,
    updates: tokio::task::JoinHandle<()>,
    relay: tokio::task::JoinHandle<()>,
    follow: tokio::task::JoinHandle<()>,
    heap: tokio::task::JoinHandle<()>,
}

impl Background {
    /// Retention, rollouts, agent updates, the relay of events to other replicas and
    /// the follower of theirs, and the heap's release after bursts.
    fn spawn(shared: &Arc<Shared>, stop_rx: &watch::Receiver<bool>) -> Background {
        let retention = tokio::spawn(baton_app::retention::run(
            shared.app.clone(),
            shared.cfg.retention.clone(),
            stop_rx.clone(),
        ));
        // Rollouts move on every replica; the store lets one step through.
        let rollouts = tokio::spawn(baton_app::rollouts::run(
            shared.app.clone(),
            stop_rx.clone(),
        ));
        // Agent updates likewise.
        let updates = tokio::spawn(baton_app::updates::run(shared.app.clone(), stop_rx.clone()));
        // Replicas sharing the store: their events go through it.
        let relay = tokio::spawn(baton_app::follow::relay(
            shared.app.clone(),
            stop_rx.clone(),
        ));
        let follow = tokio::spawn(baton_app::follow::follow(
            shared.app.clone(),
            stop_rx.clone(),
        ));
        let heap = tokio::spawn(baton_app::heap::release_after_bursts(
            shared.app.clone(),
            stop_rx.clone(),
        ));
        Background {
            retention,
            rollouts,
            updates,
            relay,
            follow,
            heap,
        }
    }

    /// Stopped once the streams are closed; the relay is given a bounded
    /// wait to hand the streams' last events to the other replicas.
    async fn finish(self) {
        let Background {
            retention,
            rollouts,
            updates,
            relay,
            follow,
            heap,
        } = self;
        retention.abort();
        rollouts.abort();
        updates.abort();
        heap.abort();
        follow.abort();
        // The streams' last events (disconnected) for the other replicas.
        if tokio::time::timeout(Duration::from_secs(3), relay)
            .await
            .is_err()
        {
            tracing::warn!("events for the other replicas still queued after 3 s; stopping anyway");
        }
    }
}

fn write_addr(dir: &std::path::Path, addr: SocketAddr) -> anyhow::Result<()> {
    write_file_atomic(dir, "listen.addr", &format!("{addr}\n"))
}

fn write_file_atomic(dir: &std::path::Path, name: &str, text: &str) -> anyhow::Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, dir.join(name))?;
    Ok(())
}
