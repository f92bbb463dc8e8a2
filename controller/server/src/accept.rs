//! One accept loop for the listener, plaintext (`--insecure`) or mTLS, that
//! a hostile or broken peer cannot turn against the controller or the rest
//! of the fleet. The decisions are pure, in [`limits`]; this is the shell.
//!
//! - **Failed accepts never spin.** Out of file descriptors (EMFILE,
//!   ENFILE) and the like, the loop waits 10 ms, doubling up to 1 s, until
//!   an accept succeeds; one warning per episode and one line when it ends,
//!   every failure counted in `baton_controller_accept_errors_total`. The
//!   connections wait in the kernel's backlog meanwhile; live ones are
//!   untouched. A connection that died in the backlog (a peer can cause
//!   those at will) is counted but never slows the loop.
//! - **Live connections are capped** (`serve --max-connections`, default
//!   [`DEFAULT_MAX_CONNECTIONS`]; a handshake in progress counts). A
//!   connection over the cap is not dropped in silence: it is served by a
//!   tiny HTTP/2 server of its own that answers every call with
//!   `RESOURCE_EXHAUSTED` "controller at its connection limit (N)", for
//!   [`REFUSAL_LIFETIME`] at most, and never reaches the services. At most
//!   [`MAX_REFUSALS`] refusals are served at once, [`REFUSALS_PER_SOURCE`]
//!   to one source; beyond that a connection is closed at once.
//! - **TLS handshakes are budgeted** ([`limits::HandshakeBudget`]: overall,
//!   per IPv4 address or IPv6 /64, a shorter timeout when crowded). A
//!   handshake refused by the budget gets a TLS alert `user_canceled`
//!   before any cryptography (cheap, and distinct: the controller sends it
//!   for nothing else), which `baton-controller` commands read as "the
//!   controller is at its limit of TLS handshakes".
//! - **Plaintext HTTP/2 on the TLS port** (an `http://` URL) is answered
//!   with `UNAUTHENTICATED` "this port speaks mTLS ..." by the same refusal
//!   server rather than a TLS error the client reads as an HTTP/2 protocol
//!   error.
//!
//! Accepted connections go to tonic as [`Conn`]s carrying their connect
//! info: [`tls::Peer`] (identity from the verified certificate) with mTLS,
//! tonic's own [`TcpConnectInfo`] in plaintext.

pub mod limits;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

use self::limits::{
    AcceptBackoff, AcceptFailure, HandshakeBudget, HandshakeLimits, HandshakeRefusal, Source,
    Throttle,
};
use super::tls::{self, TlsState};
use baton_app::App;
use baton_pki::identity;

/// Live connections by default (`serve --max-connections`): four times a
/// fleet of ~1 000 agents, with room for operators; at ~60 KB of memory
/// per idle connection (docs/bench/fleet.md, "Cost of mTLS") about 250 MB
/// at the cap.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Refusals (over the connection cap, over the handshake budget, plaintext
/// on the TLS port) served at once; more are closed without a word.
pub const MAX_REFUSALS: usize = 128;
/// Refusals served at once to one source (IPv4 address or IPv6 /64): a
/// flood from a few hosts cannot keep everyone else from being told.
pub const REFUSALS_PER_SOURCE: usize = 8;
/// How long a refused connection is served its refusal at most.
pub const REFUSAL_LIFETIME: Duration = Duration::from_secs(5);
/// How long a connection refused by the handshake budget is kept, after
/// its alert, for the client to read it and close first.
const ALERT_LINGER: Duration = Duration::from_secs(1);
/// Backoff after failed accepts: first wait, and the most.
const BACKOFF_FIRST: Duration = Duration::from_millis(10);
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// TCP keepalive on accepted connections: a peer that vanished (power
/// lost) before its first HTTP/2 ping is found out (tonic's own listener
/// set the same).
const TCP_KEEPALIVE: Duration = Duration::from_secs(30);
/// Repeated refusals are logged once per this interval, with a count.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// A TLS record: fatal alert `user_canceled` (90). rustls clients report
/// it as "received fatal alert: UserCanceled"; it precedes the handshake,
/// so it is plaintext as every first record is.
pub const BUSY_ALERT: [u8; 7] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 90];

/// How many connections, how many handshakes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AcceptOptions {
    /// Live connections at most (handshakes in progress included).
    pub max_connections: usize,
    /// The TLS handshake budget (mTLS only).
    pub handshakes: HandshakeLimits,
}

impl Default for AcceptOptions {
    fn default() -> AcceptOptions {
        AcceptOptions {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            handshakes: HandshakeLimits::default(),
        }
    }
}

/// The message of a call refused on a connection over the cap.
pub fn over_limit_message(max: usize) -> String {
    format!(
        "controller at its connection limit ({max} connections, serve --max-connections): try again later"
    )
}

/// The message of a call made in plaintext to the mTLS port.
pub const PLAINTEXT_ON_TLS: &str = "this controller's port speaks mTLS, and this call came in plaintext: dial https://HOST:PORT with a certificate (--cert, --key, --ca), not http://";

/// One accepted connection, handed to tonic.
#[derive(Debug)]
pub struct Conn<I> {
    io: Io,
    info: I,
    _slot: ConnSlot,
}

#[derive(Debug)]
enum Io {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl<I: Clone + Send + Sync + 'static> Connected for Conn<I> {
    type ConnectInfo = I;

    fn connect_info(&self) -> I {
        self.info.clone()
    }
}

impl<I: Unpin> AsyncRead for Conn<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl<I: Unpin> AsyncWrite for Conn<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }
}

/// Connections the loop yields; the loop ends when this is dropped.
pub type Incoming<I> = ReceiverStream<Result<Conn<I>, std::io::Error>>;

/// Live connections, at most `max`.
#[derive(Debug)]
struct ConnLimit {
    max: usize,
    live: AtomicUsize,
}

/// One live connection's place; given back when dropped.
#[derive(Debug)]
struct ConnSlot(Arc<ConnLimit>);

impl ConnLimit {
    fn try_take(self: &Arc<Self>) -> Option<ConnSlot> {
        self.live
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .ok()
            .map(|_| ConnSlot(self.clone()))
    }
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Whether a new connection is taken in, or only told it is refused.
enum Admission {
    /// Within the cap.
    Slot(ConnSlot),
    /// Over the cap: served a refusal (this ticket bounds how many).
    Refuse(Ticket),
}

/// Repeated events logged through a [`Throttle`].
#[derive(Clone, Copy)]
enum Noisy {
    OverLimit,
    RefusalsFull,
    Budget,
    Crowded,
    Timeout,
    Plaintext,
    Garbage,
}

const NOISY: usize = 7;

/// What the loop and the handshake tasks share.
struct Shell {
    app: Arc<App>,
    conns: Arc<ConnLimit>,
    refusals: Arc<SharedBudget>,
    logs: Mutex<[Throttle; NOISY]>,
}

impl std::fmt::Debug for Shell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shell")
            .field("max_connections", &self.conns.max)
            .field("live", &self.conns.live.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Shell {
    fn new(app: Arc<App>, max_connections: usize) -> Arc<Shell> {
        Arc::new(Shell {
            app,
            conns: Arc::new(ConnLimit {
                max: max_connections,
                live: AtomicUsize::new(0),
            }),
            refusals: SharedBudget::new(HandshakeLimits {
                total: MAX_REFUSALS,
                per_source: REFUSALS_PER_SOURCE,
                ..HandshakeLimits::default()
            }),
            logs: Mutex::new(std::array::from_fn(|_| Throttle::new(LOG_EVERY))),
        })
    }

    /// `Some(n)` when a line about `what` is due (`n` events since the
    /// last).
    fn due(&self, what: Noisy) -> Option<u64> {
        let mut logs = self.logs.lock().unwrap_or_else(|p| p.into_inner());
        logs[what as usize].hit(std::time::Instant::now())
    }

    /// A new connection's admission; `None`: closed at once (over the cap
    /// and too many refusals already).
    fn admit(&self, remote: SocketAddr) -> Option<Admission> {
        if let Some(slot) = self.conns.try_take() {
            return Some(Admission::Slot(slot));
        }
        match self.refusals.try_enter(remote) {
            Ok((p, _)) => {
                if let Some(n) = self.due(Noisy::OverLimit) {
                    tracing::warn!(%remote, "at the connection limit ({} live, serve --max-connections): new connections are answered RESOURCE_EXHAUSTED{}", self.conns.max, tally(n));
                }
                Some(Admission::Refuse(p))
            }
            Err(_) => {
                if let Some(n) = self.due(Noisy::RefusalsFull) {
                    tracing::warn!(%remote, "at the connection limit, and {MAX_REFUSALS} refusals are being served ({REFUSALS_PER_SOURCE} at most to one source): new connections closed at once{}", tally(n));
                }
                None
            }
        }
    }

    /// A ticket to serve `remote` a refusal: the one `admission` holds,
    /// else a new one if the source's share allows.
    fn refusal_permit(&self, admission: Admission, remote: SocketAddr) -> Option<Ticket> {
        match admission {
            Admission::Refuse(p) => Some(p),
            Admission::Slot(slot) => {
                drop(slot);
                self.refusals.try_enter(remote).ok().map(|(t, _)| t)
            }
        }
    }

    fn over_limit_status(&self) -> tonic::Status {
        tonic::Status::resource_exhausted(over_limit_message(self.conns.max))
    }
}

/// The end of a throttled line: how many more happened since the last.
fn tally(n: u64) -> String {
    if n > 1 {
        format!(" ({} more like it since the last such line)", n - 1)
    } else {
        String::new()
    }
}

/// Accept until the returned stream is dropped: what to do with each new
/// connection is `take`'s business.
async fn accept_loop<F>(
    listener: TcpListener,
    shell: Arc<Shell>,
    closed: impl std::future::Future<Output = ()>,
    mut take: F,
) where
    F: FnMut(TcpStream, SocketAddr),
{
    let mut backoff = AcceptBackoff::new(BACKOFF_FIRST, BACKOFF_MAX);
    tokio::pin!(closed);
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            () = &mut closed => return,
        };
        match accepted {
            Ok((tcp, remote)) => {
                let _ = tcp.set_nodelay(true);
                let _ = socket2::SockRef::from(&tcp)
                    .set_tcp_keepalive(&socket2::TcpKeepalive::new().with_time(TCP_KEEPALIVE));
                if let Some(e) = backoff.accepted(std::time::Instant::now()) {
                    tracing::info!(
                        "accepting connections again after {} failed accepts over {:.1} s",
                        e.failures,
                        e.lasted.as_secs_f64()
                    );
                }
                take(tcp, remote);
            }
            Err(e) => {
                shell.app.metrics.accept_error();
                let kind = AcceptFailure::of(&e);
                let next = backoff.failed(kind, std::time::Instant::now());
                if next.log {
                    let why = if kind == AcceptFailure::Exhausted {
                        " (out of file descriptors or memory: raise LimitNOFILE, or lower --max-connections)"
                    } else {
                        ""
                    };
                    tracing::warn!(
                        "accept failed: {e}{why}; new connections wait in the backlog and accepts are retried after a growing wait (at most {BACKOFF_MAX:?}); live connections are served; failures counted in baton_controller_accept_errors_total"
                    );
                } else if kind == AcceptFailure::Connection {
                    tracing::debug!("accept: a connection died in the backlog: {e}");
                }
                if !next.wait.is_zero() {
                    tokio::select! {
                        () = tokio::time::sleep(next.wait) => {}
                        () = &mut closed => return,
                    }
                }
            }
        }
    }
}

/// Hand a connection to tonic (waiting for room in a task if the channel
/// is full).
fn deliver<I: Send + 'static>(tx: &mpsc::Sender<Result<Conn<I>, std::io::Error>>, c: Conn<I>) {
    match tx.try_send(Ok(c)) {
        Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {}
        Err(mpsc::error::TrySendError::Full(c)) => {
            let tx = tx.clone();
            tokio::spawn(async move {
                let _ = tx.send(c).await;
            });
        }
    }
}

/// Serve `io` a refusal: every call answered `status` (trailers only), for
/// [`REFUSAL_LIFETIME`] at most. The services never see it.
async fn serve_refusal<T>(io: T, status: tonic::Status, permit: Ticket)
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let code = status.code();
    let message = status.message().to_string();
    let svc = hyper::service::service_fn(move |_req: hyper::Request<hyper::body::Incoming>| {
        let s = tonic::Status::new(code, message.clone());
        async move { Ok::<_, Infallible>(s.into_http::<tonic::body::Body>()) }
    });
    let conn = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
        .max_concurrent_streams(8)
        .serve_connection(hyper_util::rt::TokioIo::new(io), svc);
    let _ = tokio::time::timeout(REFUSAL_LIFETIME, conn).await;
    drop(permit);
}

/// The plaintext listener (`--insecure`).
pub fn plaintext(
    listener: TcpListener,
    opts: AcceptOptions,
    app: Arc<App>,
) -> (Incoming<TcpConnectInfo>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel(64);
    let shell = Shell::new(app, opts.max_connections);
    let closer = tx.clone();
    let task = tokio::spawn(accept_loop(
        listener,
        shell.clone(),
        async move { closer.closed().await },
        move |tcp, remote| match shell.admit(remote) {
            Some(Admission::Slot(slot)) => {
                let info = TcpConnectInfo {
                    local_addr: tcp.local_addr().ok(),
                    remote_addr: Some(remote),
                };
                deliver(
                    &tx,
                    Conn {
                        io: Io::Plain(tcp),
                        info,
                        _slot: slot,
                    },
                );
            }
            Some(Admission::Refuse(permit)) => {
                tokio::spawn(serve_refusal(tcp, shell.over_limit_status(), permit));
            }
            None => {}
        },
    ));
    (ReceiverStream::new(rx), task)
}

/// A budget behind a lock (handshakes in progress, or refusals being
/// served), and whether it is crowded for the handshakes in progress to
/// watch.
#[derive(Debug)]
struct SharedBudget {
    budget: Mutex<HandshakeBudget>,
    crowded: watch::Sender<bool>,
}

/// One handshake's slot; given back when dropped.
#[derive(Debug)]
struct Ticket {
    owner: Arc<SharedBudget>,
    source: Source,
}

impl SharedBudget {
    fn new(limits: HandshakeLimits) -> Arc<SharedBudget> {
        Arc::new(SharedBudget {
            budget: Mutex::new(HandshakeBudget::new(limits)),
            crowded: watch::Sender::new(false),
        })
    }

    fn try_enter(self: &Arc<Self>, remote: SocketAddr) -> Result<(Ticket, bool), HandshakeRefusal> {
        let mut b = self.budget.lock().unwrap_or_else(|p| p.into_inner());
        let source = b.try_enter(remote.ip())?;
        let crowded = b.crowded();
        let became = self
            .crowded
            .send_if_modified(|c| std::mem::replace(c, crowded) != crowded);
        Ok((
            Ticket {
                owner: self.clone(),
                source,
            },
            became && crowded,
        ))
    }

    fn in_use(&self) -> (usize, usize) {
        let b = self.budget.lock().unwrap_or_else(|p| p.into_inner());
        (b.in_use(), b.sources())
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut b = self.owner.budget.lock().unwrap_or_else(|p| p.into_inner());
        b.leave(self.source);
        let crowded = b.crowded();
        self.owner
            .crowded
            .send_if_modified(|c| std::mem::replace(c, crowded) != crowded);
    }
}

/// The mTLS listener: handshakes budgeted and timed, identities read.
pub fn tls(
    listener: TcpListener,
    state: Arc<TlsState>,
    opts: AcceptOptions,
    app: Arc<App>,
) -> (Incoming<tls::Peer>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel(64);
    let shell = Shell::new(app, opts.max_connections);
    let limits = opts.handshakes;
    let budget = SharedBudget::new(limits);
    let closer = tx.clone();
    let task = tokio::spawn(accept_loop(
        listener,
        shell.clone(),
        async move { closer.closed().await },
        move |tcp, remote| {
            let Some(admission) = shell.admit(remote) else {
                return;
            };
            let ticket = match budget.try_enter(remote) {
                Ok((t, became_crowded)) => {
                    if became_crowded && shell.due(Noisy::Crowded).is_some() {
                        let (n, sources) = budget.in_use();
                        tracing::warn!(
                            "TLS handshakes crowded: {n} of {} in progress from {sources} sources; handshakes in progress now time out after {:?}, and each source may start one only while it has fewer than {} in progress",
                            limits.total,
                            limits.timeout(true),
                            limits::CROWDED_PER_SOURCE
                        );
                    }
                    t
                }
                Err(r) => {
                    refuse_handshake(&shell, tcp, remote, r, admission);
                    return;
                }
            };
            tokio::spawn(handshake(
                shell.clone(),
                tcp,
                remote,
                ticket,
                admission,
                tokio_rustls::TlsAcceptor::from(state.current()),
                budget.crowded.subscribe(),
                limits,
                tx.clone(),
            ));
        },
    ));
    (ReceiverStream::new(rx), task)
}

/// Over the handshake budget: the busy alert, then close (after the client
/// has read it and closed, or [`ALERT_LINGER`]).
fn refuse_handshake(
    shell: &Arc<Shell>,
    mut tcp: TcpStream,
    remote: SocketAddr,
    why: HandshakeRefusal,
    admission: Admission,
) {
    if let Some(n) = shell.due(Noisy::Budget) {
        tracing::warn!(%remote, "TLS handshake refused before it started: {why}; the client is told the controller is busy (TLS alert user_canceled){}", tally(n));
    }
    let Some(permit) = shell.refusal_permit(admission, remote) else {
        return;
    };
    tokio::spawn(async move {
        let _ = tokio::time::timeout(ALERT_LINGER, async {
            tcp.write_all(&BUSY_ALERT).await?;
            tcp.shutdown().await?;
            let mut sink = [0u8; 1024];
            while tcp.read(&mut sink).await? > 0 {}
            Ok::<_, std::io::Error>(())
        })
        .await;
        drop(permit);
    });
}

/// What the first bytes turned out to be.
enum Handshaken {
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
    /// `PRI * HTTP/2.0`: a plaintext HTTP/2 client.
    Plaintext(TcpStream),
}

/// One connection's TLS handshake, within the budget's timeout (the
/// shorter one as soon as the budget is crowded, counted from its start,
/// and for good).
#[allow(clippy::too_many_arguments)]
async fn handshake(
    shell: Arc<Shell>,
    tcp: TcpStream,
    remote: SocketAddr,
    ticket: Ticket,
    admission: Admission,
    acceptor: tokio_rustls::TlsAcceptor,
    crowded: watch::Receiver<bool>,
    limits: HandshakeLimits,
    tx: mpsc::Sender<Result<Conn<tls::Peer>, std::io::Error>>,
) {
    let done = handshake_in_time(tcp, acceptor, crowded, limits).await;
    drop(ticket);
    let io = match done {
        Err(timeout) => {
            if let Some(n) = shell.due(Noisy::Timeout) {
                tracing::warn!(%remote, "TLS handshake not done within {timeout:?}; connection closed{}", tally(n));
            }
            return;
        }
        Ok(Err(e)) => {
            log_failed_handshake(&shell, remote, &e);
            return;
        }
        Ok(Ok(Handshaken::Plaintext(tcp))) => {
            if let Some(n) = shell.due(Noisy::Plaintext) {
                tracing::warn!(%remote, "plaintext HTTP/2 on the mTLS port: every call answered UNAUTHENTICATED{}", tally(n));
            }
            if let Some(permit) = shell.refusal_permit(admission, remote) {
                serve_refusal(
                    tcp,
                    tonic::Status::unauthenticated(PLAINTEXT_ON_TLS),
                    permit,
                )
                .await;
            }
            return;
        }
        Ok(Ok(Handshaken::Tls(io))) => io,
    };
    let slot = match admission {
        Admission::Slot(slot) => slot,
        Admission::Refuse(permit) => {
            serve_refusal(io, shell.over_limit_status(), permit).await;
            return;
        }
    };
    let cert = match io.get_ref().1.peer_certificates().and_then(|c| c.first()) {
        Some(c) => identity::from_cert_der(c).map_err(|e| e.0),
        None => Err("no client certificate".to_string()),
    };
    if let Err(e) = &cert {
        tracing::warn!(%remote, "client certificate without a usable identity: {e}");
    }
    deliver(
        &tx,
        Conn {
            io: Io::Tls(io),
            info: tls::Peer { remote, cert },
            _slot: slot,
        },
    );
}

/// The first bytes read (`PRI`: plaintext HTTP/2) and else the TLS
/// handshake, racing the budget's timeout (`Err`: the timeout that
/// passed).
async fn handshake_in_time(
    tcp: TcpStream,
    acceptor: tokio_rustls::TlsAcceptor,
    mut crowded: watch::Receiver<bool>,
    limits: HandshakeLimits,
) -> Result<std::io::Result<Handshaken>, Duration> {
    let started = tokio::time::Instant::now();
    let work = async move {
        let mut first = [0u8; 1];
        if tcp.peek(&mut first).await? == 0 {
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
        }
        if first[0] == b'P' {
            return Ok(Handshaken::Plaintext(tcp));
        }
        acceptor
            .accept(tcp)
            .await
            .map(|s| Handshaken::Tls(Box::new(s)))
    };
    tokio::pin!(work);
    let mut watching = true;
    // Once in progress while crowded, always the shorter timeout: the
    // budget uncrowds as soon as the first of a flood's handshakes time
    // out, and the rest must not get the long one back.
    let mut short = false;
    loop {
        short |= *crowded.borrow_and_update();
        let timeout = limits.timeout(short);
        tokio::select! {
            r = &mut work => break Ok(r),
            () = tokio::time::sleep_until(started + timeout) => break Err(timeout),
            c = crowded.changed(), if watching => watching = c.is_ok(),
        }
    }
}

/// A refused certificate is worth a line each (it names a real peer's
/// problem, and costs a full handshake); garbage is logged once per
/// interval.
fn log_failed_handshake(shell: &Shell, remote: SocketAddr, e: &std::io::Error) {
    let tls = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>());
    match tls {
        Some(
            rustls::Error::InvalidCertificate(_)
            | rustls::Error::NoCertificatesPresented
            | rustls::Error::AlertReceived(_),
        ) => tracing::warn!(%remote, "TLS handshake refused: {e}"),
        _ => {
            if let Some(n) = shell.due(Noisy::Garbage) {
                tracing::warn!(%remote, "TLS handshake refused: {e}{}", tally(n));
            }
        }
    }
}
