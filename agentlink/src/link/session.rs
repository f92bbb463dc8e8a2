//! The link's async side: connect, run one stream, reconnect.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use baton_proto::wire;
use baton_proto::wire::agent_message::Body as Out;
use baton_proto::wire::controller_message::Body as In;
use baton_proto::wire::link_client::LinkClient;
use rand::SeedableRng;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;

use super::failover::Failover;
use super::relay::Relay;
use super::watchdog::Silence;
use super::{FromLink, LinkConfig, Outgoing, ToLink, convert};
use baton_clock::exchange::Exchange;
use baton_clock::port::Clock;
use baton_clock::sample::SampleSender;
use baton_clock::{MonoTime, mono_now};
use baton_link_client::policy::CONNECT_TIMEOUT;
use baton_link_client::{Resolved, connect_link};
use baton_proto::wire::error_chain;

/// Messages waiting to enter the request stream (the stream's own channel
/// is small: a full one means HTTP/2 flow control is holding us back).
const OUT_QUEUE: usize = 8;
/// Depth of the request stream's channel.
const STREAM_DEPTH: usize = 4;
/// Replies the link makes itself (pongs) beyond which more are dropped
/// while the stream cannot take them: a flood of pings must not grow memory.
const MAX_OWN_REPLIES: usize = 64;
/// At most one [`FromLink::Alive`] per this long.
const ALIVE_EVERY: Duration = Duration::from_secs(1);

/// Link events waiting for the control thread beyond which the stream is
/// not read (and no new session starts).
const RELAY_BACKLOG: usize = 16;

/// How a session ended.
enum End {
    /// A stop was requested, or the control side is gone: leave.
    Stop,
    /// The session is over; reconnect. `up`: when the stream was open.
    Lost {
        reason: String,
        up: Option<Instant>,
        /// The control thread was told `Connected` (it must hear
        /// `Disconnected` too).
        connected: bool,
        /// The controller refused the stream and said when to come back
        /// (`retry-after-ms`).
        retry_after: Option<Duration>,
    },
}

/// One address of one controller: what an attempt dials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Target {
    /// The controller's URL as configured (its host names the server for
    /// TLS and in the request's authority).
    url: String,
    /// The host of `url`, brackets removed.
    host: String,
    /// The address the name resolved to; `None` when the URL's host is an
    /// IP address (dialled as it is).
    addr: Option<SocketAddr>,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.addr {
            Some(a) => write!(f, "{} ({a})", self.url),
            None => f.write_str(&self.url),
        }
    }
}

/// Every address of every controller, in the configured order (a name's
/// addresses as the resolver gives them, each once). A name that does not
/// resolve is logged and left out of this round.
async fn resolve_all(urls: &[String]) -> Vec<Target> {
    let mut out = Vec::new();
    for url in urls {
        let Ok(uri) = url.parse::<tonic::transport::Uri>() else {
            tracing::warn!(controller = %url, "controller link: not a URL, skipped");
            continue;
        };
        let host = uri
            .host()
            .unwrap_or_default()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        if host.parse::<std::net::IpAddr>().is_ok() {
            out.push(Target {
                url: url.clone(),
                host,
                addr: None,
            });
            continue;
        }
        let https = uri.scheme_str() == Some("https");
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        match tokio::time::timeout(
            CONNECT_TIMEOUT,
            tokio::net::lookup_host((host.as_str(), port)),
        )
        .await
        {
            Ok(Ok(addrs)) => {
                let before = out.len();
                for addr in addrs {
                    let t = Target {
                        url: url.clone(),
                        host: host.clone(),
                        addr: Some(addr),
                    };
                    if !out[before..].contains(&t) {
                        out.push(t);
                    }
                }
                if out.len() == before {
                    tracing::warn!(controller = %url, "controller link: {host} resolves to no address");
                }
            }
            Ok(Err(e)) => {
                tracing::warn!(controller = %url, "controller link: cannot resolve {host}: {e}")
            }
            Err(_) => tracing::warn!(
                controller = %url,
                "controller link: resolving {host} timed out after {CONNECT_TIMEOUT:?}"
            ),
        }
    }
    out
}

/// `fut`, while the relay and the control thread's channel are served
/// (nothing can be for a session yet); `None`: stop.
async fn serving<F: std::future::Future>(
    fut: F,
    to_link: &mut mpsc::Receiver<Outgoing>,
    relay: &mut Relay,
    stop: &mut watch::Receiver<bool>,
) -> Option<F::Output> {
    let mut fut = std::pin::pin!(fut);
    loop {
        if relay.is_gone() {
            return None;
        }
        tokio::select! {
            r = &mut fut => return Some(r),
            _ = stop.wait_for(|s| *s) => return None,
            sent = relay.wait(), if relay.is_blocked() => relay.done(sent),
            // Nothing can be for a session yet: dropped.
            m = to_link.recv() => {
                m?;
            }
        }
    }
}

/// Connect, run, fail over and reconnect with backoff, until stopped.
pub(super) async fn run(
    cfg: LinkConfig,
    clock: Arc<dyn Clock>,
    mut to_link: mpsc::Receiver<Outgoing>,
    mut relay: Relay,
    mut stop: watch::Receiver<bool>,
) {
    let mut attempts = Attempts {
        epoch: Instant::now(),
        failover: Failover::new(cfg.backoff),
        rng: rand::rngs::StdRng::from_os_rng(),
        session: 0,
    };
    tracing::info!(
        controllers = %cfg.urls.join(", "),
        agent = %cfg.agent_id,
        "controller link starting"
    );
    loop {
        if attempts.failover.needs_targets() {
            let Some(targets) =
                serving(resolve_all(&cfg.urls), &mut to_link, &mut relay, &mut stop).await
            else {
                return;
            };
            attempts.failover.set_targets(targets);
        }
        let target = attempts.failover.current().cloned();
        let end = match &target {
            Some(t) => {
                attempts.session += 1;
                let session = attempts.session;
                let control = Control {
                    to_link: &mut to_link,
                    relay: &mut relay,
                    stop: &mut stop,
                };
                one(&cfg, t, &clock, session, control).await
            }
            None => End::Lost {
                reason: format!(
                    "no address of any controller resolved ({})",
                    cfg.urls.join(", ")
                ),
                up: None,
                connected: false,
                retry_after: None,
            },
        };
        let End::Lost {
            reason,
            up,
            connected,
            retry_after,
        } = end
        else {
            return;
        };
        if let Some(d) = retry_after {
            attempts.failover.retry_after(d);
        }
        if connected {
            relay.push(FromLink::Disconnected {
                session: attempts.session,
                reason: reason.clone(),
            });
        }
        let delay = attempts.next_delay(&cfg, target.as_ref(), &reason, up);
        if !wait_out(delay, &mut to_link, &mut relay, &mut stop).await {
            return;
        }
    }
}

/// The reconnect loop's state: which address is next, and when.
struct Attempts {
    /// Instants of the loop are kept as durations since this.
    epoch: Instant,
    failover: Failover<Target>,
    rng: rand::rngs::StdRng,
    /// The last session's number (each attempt takes the next).
    session: u64,
}

impl Attempts {
    /// The wait before the next attempt, after a stream that was up since
    /// `up` ended or an attempt failed (`up` is `None`; refused streams
    /// included: a replica admitting sessions at a bounded rate answers
    /// UNAVAILABLE or RESOURCE_EXHAUSTED). Logged with `reason`.
    fn next_delay(
        &mut self,
        cfg: &LinkConfig,
        target: Option<&Target>,
        reason: &str,
        up: Option<Instant>,
    ) -> Duration {
        let now = Instant::now() - self.epoch;
        let delay = match up {
            Some(up) => {
                self.failover.up(up - self.epoch);
                self.failover.ended(now, &mut self.rng)
            }
            None => self.failover.failed(now, &mut self.rng),
        };
        let next = self.failover.current().map_or_else(
            || "the controllers, resolved again".to_string(),
            |t| t.to_string(),
        );
        tracing::warn!(
            controller = %target.map_or_else(|| cfg.urls.join(", "), |t| t.to_string()),
            session = self.session,
            "controller link: {reason}; next attempt in {}, to {next}",
            baton_proto::time::format_duration(Duration::from_millis(delay.as_millis() as u64))
        );
        delay
    }
}

/// Waits out `delay` (and until the control thread has taken most of what
/// waits for it), dropping whatever it still sends for the session that
/// ended. `false`: stop.
async fn wait_out(
    delay: Duration,
    to_link: &mut mpsc::Receiver<Outgoing>,
    relay: &mut Relay,
    stop: &mut watch::Receiver<bool>,
) -> bool {
    let until = Instant::now() + delay;
    let mut slept = false;
    while !slept || relay.len() >= RELAY_BACKLOG {
        if relay.is_gone() {
            return false;
        }
        tokio::select! {
            _ = tokio::time::sleep_until(until), if !slept => slept = true,
            _ = stop.wait_for(|s| *s) => return false,
            sent = relay.wait(), if relay.is_blocked() => relay.done(sent),
            m = to_link.recv() => if m.is_none() { return false },
        }
    }
    true
}

/// The transport to one controller address, with the link's limits
/// (`baton_link_client`'s agent policy). A resolved address is dialled
/// with the URL's host as the TLS server name (the certificate is checked
/// against the name, not the address) and as the requests' authority.
async fn connect(
    target: &Target,
    tls: Option<&super::TlsFiles>,
) -> Result<LinkClient<tonic::transport::Channel>, String> {
    let resolved = target.addr.map(|addr| Resolved {
        addr,
        host: &target.host,
    });
    connect_link(&target.url, resolved, tls, target).await
}

/// The next message on the stream once it is open; pending before.
async fn next_in(
    inbound: &mut Option<tonic::Streaming<wire::ControllerMessage>>,
) -> Result<Option<wire::ControllerMessage>, tonic::Status> {
    match inbound {
        Some(s) => s.message().await,
        None => std::future::pending().await,
    }
}

/// The control thread's side of the link, as a session uses it.
struct Control<'a> {
    /// What the control thread sends.
    to_link: &'a mut mpsc::Receiver<Outgoing>,
    /// What goes back to it.
    relay: &'a mut Relay,
    /// Set when the link is to stop.
    stop: &'a mut watch::Receiver<bool>,
}

/// One session: connect, tell the control thread, pump the stream until it
/// ends.
async fn one(
    cfg: &LinkConfig,
    target: &Target,
    clock: &Arc<dyn Clock>,
    session: u64,
    control: Control<'_>,
) -> End {
    let dial = connect(target, cfg.tls.as_ref());
    let Some(client) = serving(dial, control.to_link, control.relay, control.stop).await else {
        return End::Stop;
    };
    let client = match client {
        Ok(c) => c,
        Err(reason) => {
            return End::Lost {
                reason,
                up: None,
                connected: false,
                retry_after: None,
            };
        }
    };
    let s = Session::new(session, clock, cfg.time_exchange);
    control.relay.push(FromLink::Connected { session });
    pump(s, client, control).await
}

/// A session that ended after the control thread was told `Connected`
/// (`up`: when the stream was open, if it was).
fn lost(reason: String, up: Option<Instant>) -> End {
    End::Lost {
        reason,
        up,
        connected: true,
        retry_after: None,
    }
}

/// The controller refused the stream (with when to come back, if it said).
fn refused(status: &tonic::Status) -> End {
    End::Lost {
        reason: format!("the controller refused the stream: {}", status_text(status)),
        up: None,
        connected: true,
        retry_after: retry_after(status),
    }
}

/// The session's stream, pumped both ways until it ends.
async fn pump(
    mut s: Session,
    mut client: LinkClient<tonic::transport::Channel>,
    control: Control<'_>,
) -> End {
    let Control {
        to_link,
        relay,
        stop,
    } = control;
    // The request stream is fed from a channel, so Hello flows as soon as
    // the control thread sends it, even before the controller's response
    // headers arrive (a controller may wait for Hello before answering).
    let (out_tx, out_rx) = mpsc::channel::<wire::AgentMessage>(STREAM_DEPTH);
    let mut call = Box::pin(client.connect(ReceiverStream::new(out_rx)));
    let mut inbound = None;
    let mut up = None;
    loop {
        if relay.is_gone() {
            return End::Stop;
        }
        let deadline = s.epoch + s.silence.deadline();
        let exchange_due = s.exchange_due();
        // Unbiased: no branch (a flood of pushes, a stream of feedback)
        // starves another.
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return End::Stop,
            r = &mut call, if inbound.is_none() => match r {
                Ok(resp) => {
                    inbound = Some(resp.into_inner());
                    up = Some(Instant::now());
                    s.silence.heard(s.now());
                }
                Err(status) => return refused(&status),
            },
            sent = relay.wait(), if relay.is_blocked() => {
                relay.done(sent);
                // Not read meanwhile: that silence was ours.
                s.silence.heard(s.now());
            }
            // Read only while the control thread keeps up.
            m = next_in(&mut inbound), if relay.len() < RELAY_BACKLOG => match m {
                Ok(Some(msg)) => {
                    if let Some(ev) = s.received(msg) {
                        relay.push(ev);
                    }
                }
                Ok(None) => return lost("the controller closed the stream".into(), up),
                Err(status) => return lost(format!("stream error: {}", status_text(&status)), up),
            },
            // Always drained while the stream takes messages, whatever the
            // relay's state: the control thread may be waiting for room.
            o = to_link.recv(), if s.outq.len() < OUT_QUEUE => {
                if let Some(end) = s.take(o) {
                    return end;
                }
            }
            permit = out_tx.reserve(), if s.can_send() => match permit {
                Ok(p) => {
                    if let Some(mut m) = s.next_out() {
                        s.stamp_t1(&mut m);
                        p.send(m);
                    }
                }
                Err(_) => return lost("the request stream closed".into(), up),
            },
            _ = tokio::time::sleep_until(exchange_due.unwrap_or(deadline)), if exchange_due.is_some() && inbound.is_some() && s.hello_sent => {
                s.ask_time();
            }
            _ = tokio::time::sleep_until(deadline) => return lost(s.dead_peer(), up),
        }
    }
}

/// When a controller that refused a stream said to come back: its
/// `retry-after-ms` (a replica admitting sessions at a bounded rate hands
/// each refused agent a slot of its own).
fn retry_after(s: &tonic::Status) -> Option<Duration> {
    let ms: u64 = s
        .metadata()
        .get(RETRY_AFTER_MS)?
        .to_str()
        .ok()?
        .parse()
        .ok()?;
    Some(Duration::from_millis(ms))
}

/// The metadata key of [`retry_after`] (the controller's spelling too).
const RETRY_AFTER_MS: &str = "retry-after-ms";

fn status_text(s: &tonic::Status) -> String {
    let mut text = if s.message().is_empty() {
        format!("{:?}", s.code())
    } else {
        format!("{:?}: {}", s.code(), s.message())
    };
    // A transport error says why only in its causes (a TLS alert: an
    // unknown, expired or revoked certificate).
    if let Some(src) = std::error::Error::source(s) {
        let chain = error_chain(src);
        if !text.contains(&chain) {
            text.push_str(": ");
            text.push_str(&chain);
        }
    }
    text
}

/// One stream's state on the link side.
struct Session {
    id: u64,
    epoch: Instant,
    clock: Arc<dyn Clock>,
    silence: Silence,
    last_alive: Option<Instant>,
    /// The Hello went into the request stream. Until then nothing else may
    /// ([`Session::next_out`]): a controller refuses a stream whose first
    /// message is anything else, and the agent would back off for up to
    /// 30 s (issue 26.11: a time request, queued ahead of everything once
    /// the response headers came, overtook a Hello the busy control thread
    /// had not handed over yet).
    hello_sent: bool,
    /// Encoded messages waiting for room in the request stream.
    outq: VecDeque<wire::AgentMessage>,
    /// Time exchange with the controller, and where its samples go (none
    /// when disabled, `clock.link: false`).
    exchange: Option<(Exchange, SampleSender)>,
}

impl Session {
    /// A session just connected: nothing heard, nothing sent yet.
    fn new(id: u64, clock: &Arc<dyn Clock>, time_exchange: bool) -> Session {
        Session {
            id,
            epoch: Instant::now(),
            clock: clock.clone(),
            silence: Silence::new(Duration::ZERO),
            last_alive: None,
            hello_sent: false,
            outq: VecDeque::new(),
            exchange: if time_exchange {
                clock.samples().map(|tx| (Exchange::new(), tx))
            } else {
                None
            },
        }
    }

    /// What the control thread sent: queued for the stream when it is for
    /// this session. `Some`: the session ends.
    fn take(&mut self, o: Option<Outgoing>) -> Option<End> {
        match o {
            None => Some(End::Stop),
            // The control thread refused this session (a stale
            // controller): a failed attempt, never a stream that was up.
            Some(Outgoing {
                session,
                msg: ToLink::Refuse(reason),
            }) if session == self.id => Some(lost(reason, None)),
            Some(o) if o.session == self.id => {
                if let Some(m) = encode(o.msg) {
                    self.outq.push_back(m);
                }
                None
            }
            // For a session that is over: the next Hello covers it.
            Some(_) => None,
        }
    }

    /// A message from the controller: heard (its t4 of a time exchange
    /// taken before anything else), and what it tells the control thread.
    fn received(&mut self, msg: wire::ControllerMessage) -> Option<FromLink> {
        let t4 = mono_now();
        self.silence.heard(self.now());
        self.inbound(msg, t4)
    }

    /// Why a silent controller is given up.
    fn dead_peer(&self) -> String {
        format!(
            "no message from the controller for {} (three ping intervals): dead peer",
            baton_proto::time::format_duration(self.silence.limit())
        )
    }

    fn now(&self) -> Duration {
        Instant::now() - self.epoch
    }

    /// When the next time request is due, on tokio's clock (both are
    /// `CLOCK_MONOTONIC`).
    fn exchange_due(&self) -> Option<Instant> {
        let (x, _) = self.exchange.as_ref()?;
        let wait = x
            .next_due()
            .as_nanos()
            .saturating_sub(mono_now().as_nanos())
            .max(0);
        Some(Instant::now() + Duration::from_nanos(wait as u64))
    }

    /// Whether a message may go into the request stream now: any once the
    /// Hello went, else only the Hello.
    fn can_send(&self) -> bool {
        if self.hello_sent {
            !self.outq.is_empty()
        } else {
            self.outq.iter().any(is_hello)
        }
    }

    /// The next message for the request stream: the Hello first, whatever
    /// was queued before it (a pong, a time request); then in order.
    fn next_out(&mut self) -> Option<wire::AgentMessage> {
        if self.hello_sent {
            return self.outq.pop_front();
        }
        let i = self.outq.iter().position(is_hello)?;
        self.hello_sent = true;
        self.outq.remove(i)
    }

    /// Queue a time request ahead of everything else (but a Hello not yet
    /// sent): time in our queue would count as path delay one way only.
    fn ask_time(&mut self) {
        let Some((x, _)) = self.exchange.as_mut() else {
            return;
        };
        if let Some(r) = x.poll(mono_now()) {
            let body = Out::TimeRequest(wire::TimeExchangeRequest { id: r.id, t1_ns: 0 });
            self.outq
                .push_front(wire::AgentMessage { body: Some(body) });
        }
    }

    /// A time request's t1 is the instant it leaves for the stream.
    fn stamp_t1(&mut self, m: &mut wire::AgentMessage) {
        if let Some(Out::TimeRequest(r)) = &mut m.body
            && let Some((x, _)) = self.exchange.as_mut()
        {
            let t1 = mono_now();
            r.t1_ns = t1.as_nanos();
            x.sent(r.id, t1);
        }
    }

    /// A message from the controller: what the control thread must hear
    /// of it, if anything (pings and time exchanges are answered here).
    fn inbound(&mut self, msg: wire::ControllerMessage, t4: MonoTime) -> Option<FromLink> {
        let session = self.id;
        match msg.body {
            Some(In::Welcome(w)) => {
                let ping_interval = self.silence.set_interval_ms(w.ping_interval_ms);
                tracing::info!(
                    session,
                    controller_agent_id = %w.agent_id,
                    session_gen = w.session_gen,
                    acked_seq = w.feedback_acked_seq,
                    ping_interval = %baton_proto::time::format_duration(ping_interval),
                    "controller link: welcomed"
                );
                Some(FromLink::Welcome {
                    session,
                    acked_seq: w.feedback_acked_seq,
                    ping_interval,
                    session_gen: w.session_gen,
                })
            }
            // A push or cancel without a pack reference still reaches the
            // control thread, which answers it (never a silent drop).
            Some(In::PackPush(p)) => Some(FromLink::Push {
                session,
                pack: p.pack.unwrap_or_default(),
                yaml: p.yaml,
                session_gen: p.session_gen,
                stage: p.staged.then_some(super::StageAt {
                    at_ns: p.activate_at_ns,
                    max_uncertainty_ns: p.max_uncertainty_ns,
                }),
            }),
            Some(In::TrustLists(t)) => Some(FromLink::TrustLists {
                session,
                chain: t.chain,
            }),
            Some(In::ReleaseOffer(offer)) => Some(FromLink::ReleaseOffer { session, offer }),
            Some(In::ReleaseChunk(chunk)) => Some(FromLink::ReleaseChunk { session, chunk }),
            Some(In::ReleaseWithdraw(w)) => Some(FromLink::ReleaseWithdraw {
                session,
                version: w.version,
            }),
            Some(In::PackCancel(c)) => Some(FromLink::Cancel {
                session,
                pack: c.pack.unwrap_or_default(),
                session_gen: c.session_gen,
            }),
            Some(In::FeedbackAck(a)) => Some(FromLink::FeedbackAck {
                session,
                seq: a.seq,
            }),
            Some(In::Ping(p)) => {
                self.reply(Out::Pong(wire::Pong { id: p.id }));
                self.alive()
            }
            Some(In::TimeReply(r)) => {
                if let Some((x, tx)) = self.exchange.as_mut()
                    && let Some(sample) = x.on_reply(r.id, r.t1_ns, r.t2_ns, r.t3_ns, t4)
                {
                    tx.send(sample);
                }
                self.alive()
            }
            Some(In::TimeExchangeRequest(r)) => {
                // t3 is taken as the reply is queued: the time it then
                // waits for the stream counts as path delay, which the
                // controller's exchange filtering is there to reject.
                let t2 = self.clock.now().as_nanos();
                self.reply(Out::TimeExchangeReply(wire::TimeExchangeReply {
                    id: r.id,
                    t1_ns: r.t1_ns,
                    t2_ns: t2,
                    t3_ns: self.clock.now().as_nanos(),
                }));
                self.alive()
            }
            None => self.alive(),
        }
    }

    /// A reply the link makes itself; dropped (logged) past a bound while
    /// the stream cannot take them.
    fn reply(&mut self, body: Out) {
        if self.outq.len() < MAX_OWN_REPLIES {
            self.outq.push_back(wire::AgentMessage { body: Some(body) });
        } else {
            tracing::debug!("controller link: reply dropped, the stream is not draining");
        }
    }

    /// Contact for the lease, at most once per [`ALIVE_EVERY`].
    fn alive(&mut self) -> Option<FromLink> {
        let now = Instant::now();
        if self.last_alive.is_some_and(|t| now - t < ALIVE_EVERY) {
            return None;
        }
        self.last_alive = Some(now);
        Some(FromLink::Alive { session: self.id })
    }
}

fn is_hello(m: &wire::AgentMessage) -> bool {
    matches!(m.body, Some(Out::Hello(_)))
}

/// A control-thread message in its wire form (feedback records converted
/// here, off the control thread); `None` for what is not sent (a refusal
/// ends the session instead).
fn encode(msg: ToLink) -> Option<wire::AgentMessage> {
    let body = match msg {
        ToLink::Hello(h) => Out::Hello(*h),
        ToLink::Ack(a) => Out::PackAck(a),
        ToLink::Nack(n) => Out::PackNack(n),
        ToLink::Held(packs) => Out::Held(wire::Held { packs }),
        ToLink::Feedback(page) => Out::Feedback(wire::FeedbackBatch {
            entries: page
                .records
                .iter()
                .map(|(seq, r)| {
                    let dropped = match page.carried {
                        Some((s, n)) if s == *seq => n,
                        _ => 0,
                    };
                    convert::feedback(*seq, r, dropped)
                })
                .collect(),
        }),
        ToLink::ClockReport(r) => Out::ClockReport(r),
        ToLink::TrustState(t) => Out::TrustState(t),
        ToLink::ReleaseRequest(r) => Out::ReleaseRequest(r),
        ToLink::UpdateState(u) => Out::UpdateState(u),
        ToLink::Refuse(_) => return None,
    };
    Some(wire::AgentMessage { body: Some(body) })
}
