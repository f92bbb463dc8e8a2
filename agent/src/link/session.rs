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
    let epoch = Instant::now();
    let mut failover = Failover::new(cfg.backoff);
    let mut rng = rand::rngs::StdRng::from_os_rng();
    let mut session = 0u64;
    tracing::info!(
        controllers = %cfg.urls.join(", "),
        agent = %cfg.agent_id,
        "controller link starting"
    );
    loop {
        if failover.needs_targets() {
            let Some(targets) =
                serving(resolve_all(&cfg.urls), &mut to_link, &mut relay, &mut stop).await
            else {
                return;
            };
            failover.set_targets(targets);
        }
        let target = failover.current().cloned();
        let end = match &target {
            Some(t) => {
                session += 1;
                one(
                    &cfg,
                    t,
                    &clock,
                    session,
                    &mut to_link,
                    &mut relay,
                    &mut stop,
                )
                .await
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
        let (reason, up, connected) = match end {
            End::Stop => return,
            End::Lost {
                reason,
                up,
                connected,
                retry_after,
            } => {
                if let Some(d) = retry_after {
                    failover.retry_after(d);
                }
                (reason, up, connected)
            }
        };
        if connected {
            relay.push(FromLink::Disconnected {
                session,
                reason: reason.clone(),
            });
        }
        let now = Instant::now() - epoch;
        // A stream that was up and ended, or an attempt that failed
        // (refused streams included: a replica admitting sessions at a
        // bounded rate answers UNAVAILABLE or RESOURCE_EXHAUSTED).
        let delay = match up {
            Some(up) => {
                failover.up(up - epoch);
                failover.ended(now, &mut rng)
            }
            None => failover.failed(now, &mut rng),
        };
        let next = failover.current().map_or_else(
            || "the controllers, resolved again".to_string(),
            |t| t.to_string(),
        );
        tracing::warn!(
            controller = %target.as_ref().map_or_else(|| cfg.urls.join(", "), |t| t.to_string()),
            session,
            "controller link: {reason}; next attempt in {}, to {next}",
            baton_proto::time::format_duration(Duration::from_millis(delay.as_millis() as u64))
        );
        // Wait out the delay (and until the control thread has taken most
        // of what waits for it), dropping whatever it still sends for the
        // session that ended.
        let until = Instant::now() + delay;
        let mut slept = false;
        while !slept || relay.len() >= RELAY_BACKLOG {
            if relay.is_gone() {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(until), if !slept => slept = true,
                _ = stop.wait_for(|s| *s) => return,
                sent = relay.wait(), if relay.is_blocked() => relay.done(sent),
                m = to_link.recv() => if m.is_none() { return },
            }
        }
    }
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

/// One session: connect, tell the control thread, pump the stream until it
/// ends.
async fn one(
    cfg: &LinkConfig,
    target: &Target,
    clock: &Arc<dyn Clock>,
    session: u64,
    to_link: &mut mpsc::Receiver<Outgoing>,
    relay: &mut Relay,
    stop: &mut watch::Receiver<bool>,
) -> End {
    let lost = |reason: String| End::Lost {
        reason,
        up: None,
        connected: false,
        retry_after: None,
    };
    let Some(client) = serving(connect(target, cfg.tls.as_ref()), to_link, relay, stop).await
    else {
        return End::Stop;
    };
    let mut client = match client {
        Ok(c) => c,
        Err(reason) => return lost(reason),
    };
    let mut s = Session {
        id: session,
        epoch: Instant::now(),
        clock: clock.clone(),
        silence: Silence::new(Duration::ZERO),
        last_alive: None,
        hello_sent: false,
        outq: VecDeque::new(),
        exchange: if cfg.time_exchange {
            clock.samples().map(|tx| (Exchange::new(), tx))
        } else {
            None
        },
    };
    relay.push(FromLink::Connected { session });
    // The request stream is fed from a channel, so Hello flows as soon as
    // the control thread sends it, even before the controller's response
    // headers arrive (a controller may wait for Hello before answering).
    let (out_tx, out_rx) = mpsc::channel::<wire::AgentMessage>(STREAM_DEPTH);
    let mut call = Box::pin(client.connect(ReceiverStream::new(out_rx)));
    let mut inbound = None;
    let mut up = None;
    let lost = |reason: String, up: Option<Instant>| End::Lost {
        reason,
        up,
        connected: true,
        retry_after: None,
    };
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
                Err(status) => return End::Lost {
                    reason: format!("the controller refused the stream: {}", status_text(&status)),
                    up: None,
                    connected: true,
                    retry_after: retry_after(&status),
                },
            },
            sent = relay.wait(), if relay.is_blocked() => {
                relay.done(sent);
                // Not read meanwhile: that silence was ours.
                s.silence.heard(s.now());
            }
            // Read only while the control thread keeps up.
            m = next_in(&mut inbound), if relay.len() < RELAY_BACKLOG => match m {
                Ok(Some(msg)) => {
                    // t4 of a time exchange: before anything else.
                    let t4 = mono_now();
                    s.silence.heard(s.now());
                    if let Some(ev) = s.inbound(msg, t4) {
                        relay.push(ev);
                    }
                }
                Ok(None) => return lost("the controller closed the stream".into(), up),
                Err(status) => return lost(format!("stream error: {}", status_text(&status)), up),
            },
            // Always drained while the stream takes messages, whatever the
            // relay's state: the control thread may be waiting for room.
            o = to_link.recv(), if s.outq.len() < OUT_QUEUE => match o {
                None => return End::Stop,
                // The control thread refused this session (a stale
                // controller): a failed attempt, never a stream that was up.
                Some(Outgoing { session: s_, msg: ToLink::Refuse(reason) }) if s_ == session => {
                    return lost(reason, None);
                }
                Some(o) if o.session == session => {
                    if let Some(m) = encode(o.msg) {
                        s.outq.push_back(m);
                    }
                }
                // For a session that is over: the next Hello covers it.
                Some(_) => {}
            },
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
            _ = tokio::time::sleep_until(deadline) => return lost(
                format!(
                    "no message from the controller for {} (three ping intervals): dead peer",
                    baton_proto::time::format_duration(s.silence.limit())
                ),
                up,
            ),
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
        ToLink::Refuse(_) => return None,
    };
    Some(wire::AgentMessage { body: Some(body) })
}
