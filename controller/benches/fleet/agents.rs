//! The simulated agents: each on its own TCP connection and Link stream,
//! in this process. They answer pings and time exchanges, ack every push
//! and then send `Held` (as the protocol asks of an agent whose held set
//! changed; without it the controller re-pushes at every 30 s resync),
//! send feedback when told, and when their controller goes away dial the
//! next one with the agent's own failover rules. They do not validate or
//! journal packs: the figures are the controllers'.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use baton_agent::link::backoff::BackoffConfig;
use baton_agent::link::failover::Failover;
use baton_proto::wire::{
    self, agent_message::Body as In, controller_message::Body as Out, link_client::LinkClient,
};
use rand::seq::SliceRandom;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use crate::{CONNECTING, MAX_MESSAGE, PHASE_TIMEOUT, Tls, endpoint, t_base};

pub fn now_ns() -> i64 {
    baton_server::now_ns()
}

pub fn msg(body: In) -> wire::AgentMessage {
    wire::AgentMessage { body: Some(body) }
}

pub fn agent_id(ix: usize) -> String {
    format!("sim-{:04}", ix + 1)
}

pub fn journal_id(ix: usize) -> String {
    format!("journal-{}-0b6f3c", agent_id(ix))
}

pub fn pack_ref(version: u64) -> wire::PackRef {
    wire::PackRef {
        tenant: "default".into(),
        pack: "bench".into(),
        version,
    }
}

pub fn pack_yaml(version: u64) -> String {
    format!(
        "pack: bench\nversion: {version}\ntargets: {{labels: {{bench: \"1\"}}}}\n\
         description: fleet bench, one toggle a second\n\
         safe_state:\n  - {{action: gpio.write, params: {{line: 4, value: 0}}}}\n\
         instructions:\n  - {{id: tick, action: gpio.toggle, params: {{line: 4}}, every: 1s}}\n"
    )
}

/// One feedback entry as an agent running `pack_yaml(version)` sends it.
pub fn entry(ix: usize, seq: u64, version: u64) -> wire::Feedback {
    let scheduled = t_base() + i64::try_from(seq).unwrap_or(i64::MAX / 2) * 1_000_000_000;
    let lateness = 15_000 + ((seq as i64 * 7919 + ix as i64 * 104_729) % 20_000);
    wire::Feedback {
        seq,
        execution_id: format!("default/bench/v{version}/tick/{scheduled}/a1"),
        pack: Some(pack_ref(version)),
        instruction: "tick".into(),
        attempt: 1,
        scheduled_ns: scheduled,
        actual_ns: scheduled + lateness,
        lateness_ns: lateness,
        outcome: wire::Outcome::Ok as i32,
        detail: String::new(),
        value: None,
        dropped_before: 0,
        event: "executed".into(),
        action: "gpio.toggle".into(),
        uncertainty_ns: 1_500,
        ..Default::default()
    }
}

/// An agent's feedback batches for one round, each with its last seq.
pub type Batches = Vec<(u64, wire::AgentMessage)>;

/// What the bench asks of an agent.
pub enum Cmd {
    /// Send these batches (last seq of each with it), at most `window`
    /// unacknowledged; answer when the last one is acknowledged.
    Ingest {
        batches: Batches,
        window: usize,
        done: oneshot::Sender<Instant>,
    },
}

/// What an agent tells the bench.
pub enum Event {
    /// A push arrived and was acknowledged.
    PackAcked {
        version: u64,
        /// When the ack was handed to the link.
        acked_ns: i64,
        /// The controller it came through (an index into the fleet's
        /// URLs): a push made through one replica reaches the others'
        /// agents later, through the store.
        via: usize,
    },
    /// The agent failed (a protocol surprise, or no controller would take
    /// it): its task is over.
    Failed { agent: usize, error: String },
    /// The agent's stream ended (its controller went away): it dials the
    /// next controller, as the agent's link does.
    Lost { agent: usize, error: String },
    /// Welcomed again after a loss, by controller `url` (an index into
    /// the fleet's URLs), at `at`, after `refused` refused or failed
    /// attempts.
    Rewelcomed {
        agent: usize,
        url: usize,
        at: Instant,
        refused: u32,
    },
}

/// What an agent keeps across its sessions (a real agent journals it).
#[derive(Clone, Copy, Debug, Default)]
struct Kept {
    /// The version of `bench` it holds.
    held: Option<u64>,
    /// The highest session generation a welcome carried.
    session_gen: u64,
}

/// An agent's open stream.
struct Link {
    tx: mpsc::Sender<wire::AgentMessage>,
    rx: tonic::Streaming<wire::ControllerMessage>,
    /// Held for the stream's life (its own TCP connection).
    _channel: Channel,
}

/// Why a session ended.
enum Ended {
    /// The bench is done with the agent: the stream was closed cleanly.
    Closed,
    /// The controller went away (the stream failed or ended).
    Lost(anyhow::Error),
    /// The agent saw what no controller should send.
    Failed(anyhow::Error),
}

impl Link {
    /// Half-close, then read until the controller ends the stream too (a
    /// clean end on both sides, as an agent going away politely).
    async fn close(self) -> Result<()> {
        let Link {
            tx,
            mut rx,
            _channel,
        } = self;
        drop(tx);
        let end = async {
            loop {
                match rx.message().await {
                    Ok(Some(_)) => {}
                    Ok(None) => return Ok(()),
                    Err(s) => bail!("stream ended with {s}"),
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(10), end)
            .await
            .context("controller did not end the stream within 10 s")?
    }

    /// Queues `m`; the stream gone is a lost session.
    async fn send(&self, m: wire::AgentMessage) -> Result<(), Ended> {
        self.tx
            .send(m)
            .await
            .map_err(|_| Ended::Lost(anyhow!("link stream closed")))
    }
}

/// An attempt to open a session that did not come up.
enum Attempt {
    /// Refused by a controller admitting sessions at a bounded rate, with
    /// the slot it handed out, if any.
    Refused(Option<Duration>),
    /// No connection, or the stream failed before its welcome.
    Failed(anyhow::Error),
}

/// Dial `url` (a connection of its own), hello, wait for the welcome.
async fn connect(
    ix: usize,
    url: &str,
    tls: Option<&Tls>,
    kept: &mut Kept,
) -> Result<Link, Attempt> {
    let fail = |e: anyhow::Error| Attempt::Failed(e.context(url.to_owned()));
    let channel = endpoint(url, tls.map(|t| t.client(&t.agents[ix])))
        .map_err(fail)?
        .connect_timeout(Duration::from_secs(10))
        .tcp_nodelay(true)
        .connect()
        .await
        .map_err(|e| fail(anyhow!(e).context("connect")))?;
    let mut client = LinkClient::new(channel.clone())
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE);
    let (tx, rx) = mpsc::channel(32);
    let mut labels = std::collections::HashMap::new();
    labels.insert("bench".to_string(), "1".to_string());
    let packs = kept
        .held
        .map(|v| wire::HeldPack {
            pack: Some(pack_ref(v)),
            stopped: false,
        })
        .into_iter()
        .collect();
    tx.send(msg(In::Hello(wire::Hello {
        agent_id: agent_id(ix),
        labels,
        agent_version: "fleet-bench".into(),
        capabilities: Vec::new(),
        packs,
        journal_id: journal_id(ix),
        // Every entry sent was acknowledged before any loss the bench
        // causes: the outbox is empty.
        feedback_first_seq: 0,
        feedback_last_seq: 0,
        max_packs: 0,
        session_gen: kept.session_gen,
        trust: None,
        update: None,
        arch: String::new(),
    })))
    .await
    .map_err(|_| fail(anyhow!("hello not queued")))?;
    let rx = match client.connect(ReceiverStream::new(rx)).await {
        Ok(r) => r.into_inner(),
        Err(s)
            if matches!(
                s.code(),
                tonic::Code::Unavailable | tonic::Code::ResourceExhausted
            ) =>
        {
            let slot = s
                .metadata()
                .get(baton_server::RETRY_AFTER_MS)
                .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
                .map(Duration::from_millis);
            return Err(Attempt::Refused(slot));
        }
        Err(s) => return Err(fail(anyhow!(s).context("open Link.Connect"))),
    };
    let mut link = Link {
        tx,
        rx,
        _channel: channel,
    };
    loop {
        let m = link
            .rx
            .message()
            .await
            .map_err(|s| fail(anyhow!(s).context("waiting for welcome")))?;
        match m {
            Some(wire::ControllerMessage {
                body: Some(Out::Welcome(w)),
            }) => {
                if w.agent_id != agent_id(ix) || w.session_gen <= kept.session_gen {
                    return Err(fail(anyhow!("unexpected welcome {w:?}")));
                }
                kept.session_gen = w.session_gen;
                return Ok(link);
            }
            Some(wire::ControllerMessage {
                body: Some(Out::Ping(p)),
            }) => {
                if link
                    .send(msg(In::Pong(wire::Pong { id: p.id })))
                    .await
                    .is_err()
                {
                    return Err(fail(anyhow!("stream closed before the welcome")));
                }
            }
            other => return Err(fail(anyhow!("expected welcome, got {other:?}"))),
        }
    }
}

/// Attempts refused or failed in a row after which an agent gives up (a
/// bench misconfigured, not a figure).
const GIVE_UP_AFTER: u32 = 200;

/// One agent for the life of the fleet: dial its home controller
/// (`urls[ix % n]`), serve the session, and when the stream is lost dial
/// the next controller as the agent's own link does
/// (`baton_agent::link::failover`: the next target at once within a round,
/// a jittered backoff between rounds and after a loss, a refusing
/// replica's slot honoured). `first` hears of the first welcome; later
/// ones are [`Event::Rewelcomed`].
async fn run(
    ix: usize,
    ctx: Arc<Dial>,
    mut cmds: mpsc::UnboundedReceiver<Cmd>,
    events: mpsc::UnboundedSender<Event>,
    first: oneshot::Sender<Result<()>>,
) {
    let n = ctx.urls.len();
    let mut failover = Failover::new(BackoffConfig::default());
    // Seeded per agent: runs are comparable, agents still independent.
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(ix as u64);
    let epoch = Instant::now();
    let mut kept = Kept::default();
    let mut first = Some(first);
    let mut refused = 0u32;
    let fail = |events: &mpsc::UnboundedSender<Event>,
                first: &mut Option<oneshot::Sender<Result<()>>>,
                e: anyhow::Error| {
        match first.take() {
            Some(w) => {
                let _ = w.send(Err(e.context(agent_id(ix))));
            }
            None => {
                let _ = events.send(Event::Failed {
                    agent: ix,
                    error: format!("{e:#}"),
                });
            }
        }
    };
    loop {
        if failover.needs_targets() {
            // Home first, the others in an order of the agent's own (as
            // a name resolving to several replicas hands them out): a
            // dead replica's agents spread over the survivors.
            let home = ix % n;
            let mut rest: Vec<usize> = (0..n).filter(|&k| k != home).collect();
            rest.shuffle(&mut rng);
            failover.set_targets(std::iter::once(home).chain(rest).collect());
        }
        let target = *failover.current().expect("targets were just set");
        // The fleet's first connections are gated (a fleet coming up, not
        // a SYN flood); a failover is the agents' own backoff's to pace.
        let permit = match first.is_some() {
            true => match ctx.gate.clone().acquire_owned().await {
                Ok(p) => Some(p),
                Err(_) => return,
            },
            false => None,
        };
        let attempt = connect(ix, &ctx.urls[target], ctx.tls.as_deref(), &mut kept).await;
        drop(permit);
        match attempt {
            Ok(link) => {
                failover.up(epoch.elapsed());
                match first.take() {
                    Some(w) => {
                        let _ = w.send(Ok(()));
                    }
                    None => {
                        let _ = events.send(Event::Rewelcomed {
                            agent: ix,
                            url: target,
                            at: Instant::now(),
                            refused,
                        });
                    }
                }
                refused = 0;
                match session(link, target, &mut cmds, &events, &mut kept).await {
                    Ended::Closed => return,
                    Ended::Failed(e) => return fail(&events, &mut first, e),
                    Ended::Lost(e) => {
                        let _ = events.send(Event::Lost {
                            agent: ix,
                            error: format!("{e:#}"),
                        });
                        tokio::time::sleep(failover.ended(epoch.elapsed(), &mut rng)).await;
                    }
                }
            }
            Err(a) => {
                refused += 1;
                let error = match a {
                    Attempt::Refused(slot) => {
                        if let Some(slot) = slot {
                            failover.retry_after(slot);
                        }
                        anyhow!("refused over the admission rate")
                    }
                    Attempt::Failed(e) => e,
                };
                if refused >= GIVE_UP_AFTER {
                    return fail(
                        &events,
                        &mut first,
                        error.context(format!("{refused} attempts in a row")),
                    );
                }
                tokio::time::sleep(failover.failed(epoch.elapsed(), &mut rng)).await;
            }
        }
    }
}

/// What every agent dials with.
struct Dial {
    urls: Vec<String>,
    tls: Option<Arc<Tls>>,
    gate: Arc<Semaphore>,
}

/// An ingest in progress on one agent.
struct Ingest {
    queue: VecDeque<(u64, wire::AgentMessage)>,
    in_flight: VecDeque<u64>,
    window: usize,
    done: Option<oneshot::Sender<Instant>>,
}

/// Serve one session until the bench drops its command sender (a clean
/// close) or the stream is lost.
async fn session(
    mut link: Link,
    via: usize,
    cmds: &mut mpsc::UnboundedReceiver<Cmd>,
    events: &mpsc::UnboundedSender<Event>,
    kept: &mut Kept,
) -> Ended {
    let mut ingest: Option<Ingest> = None;
    loop {
        tokio::select! {
            m = link.rx.message() => {
                let m = match m {
                    Ok(Some(m)) => m,
                    Ok(None) => return Ended::Lost(anyhow!("link stream closed by the controller")),
                    Err(s) => return Ended::Lost(anyhow!(s).context("link stream")),
                };
                match m.body {
                    Some(Out::Ping(p)) => {
                        if let Err(e) = link.send(msg(In::Pong(wire::Pong { id: p.id }))).await {
                            return e;
                        }
                    }
                    Some(Out::PackPush(p)) => {
                        let Some(r) = p.pack else {
                            return Ended::Failed(anyhow!("push without a pack reference"));
                        };
                        let version = r.version;
                        let ack = msg(In::PackAck(wire::PackAck {
                            pack: Some(r.clone()),
                            unchanged: false,
                            ..Default::default()
                        }));
                        if let Err(e) = link.send(ack).await {
                            return e;
                        }
                        let acked_ns = now_ns();
                        kept.held = Some(version);
                        // As a real agent does when the set it holds changes.
                        let held = msg(In::Held(wire::Held {
                            packs: vec![wire::HeldPack {
                                pack: Some(r),
                                stopped: false,
                            }],
                        }));
                        if let Err(e) = link.send(held).await {
                            return e;
                        }
                        let _ = events.send(Event::PackAcked {
                            version,
                            acked_ns,
                            via,
                        });
                    }
                    Some(Out::FeedbackAck(a)) => {
                        let Some(ing) = ingest.as_mut() else {
                            return Ended::Failed(anyhow!("feedback ack {} with nothing sent", a.seq));
                        };
                        while ing.in_flight.front().is_some_and(|&s| s <= a.seq) {
                            ing.in_flight.pop_front();
                        }
                        if let Err(e) = top_up(&link, ing).await {
                            return e;
                        }
                        if ing.in_flight.is_empty()
                            && ing.queue.is_empty()
                            && let Some(done) = ing.done.take()
                        {
                            let _ = done.send(Instant::now());
                        }
                    }
                    Some(Out::Welcome(_)) => return Ended::Failed(anyhow!("a second welcome")),
                    Some(Out::TimeReply(r)) => {
                        return Ended::Failed(anyhow!("a time reply {r:?} to no request"));
                    }
                    Some(Out::PackCancel(c)) => {
                        return Ended::Failed(anyhow!("unexpected cancel {c:?}"));
                    }
                    Some(Out::TimeExchangeRequest(t)) => {
                        let now = now_ns();
                        let reply = msg(In::TimeExchangeReply(wire::TimeExchangeReply {
                            id: t.id,
                            t1_ns: t.t1_ns,
                            t2_ns: now,
                            t3_ns: now,
                        }));
                        if let Err(e) = link.send(reply).await {
                            return e;
                        }
                    }
                    // The simulated agents hold no trust root.
                    Some(Out::TrustLists(_)) => {}
                    Some(Out::ReleaseOffer(_) | Out::ReleaseChunk(_) | Out::ReleaseWithdraw(_)) => {
                        return Ended::Failed(anyhow!("a release offered in the fleet bench"));
                    }
                    None => return Ended::Failed(anyhow!("empty controller message")),
                }
            }
            c = cmds.recv() => match c {
                Some(Cmd::Ingest { batches, window, done }) => {
                    let mut ing = Ingest {
                        queue: batches.into(),
                        in_flight: VecDeque::new(),
                        window,
                        done: Some(done),
                    };
                    if let Err(e) = top_up(&link, &mut ing).await {
                        return e;
                    }
                    ingest = Some(ing);
                }
                // The bench is done with this agent: close the stream.
                None => {
                    return match link.close().await {
                        Ok(()) => Ended::Closed,
                        Err(e) => Ended::Failed(e),
                    };
                }
            },
        }
    }
}

async fn top_up(link: &Link, ing: &mut Ingest) -> Result<(), Ended> {
    while ing.in_flight.len() < ing.window {
        let Some((last, m)) = ing.queue.pop_front() else {
            break;
        };
        link.send(m).await?;
        ing.in_flight.push_back(last);
    }
    Ok(())
}

/// The simulated fleet: a command channel per agent, their events.
pub struct Fleet {
    pub cmds: Vec<mpsc::UnboundedSender<Cmd>>,
    pub events: mpsc::UnboundedReceiver<Event>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Fleet {
    /// Connect every agent to its home controller (`urls[ix % n]`; at
    /// most [`CONNECTING`] dialling at once) and wait for every welcome.
    pub async fn connect(urls: &[String], agents: usize, tls: Option<Arc<Tls>>) -> Result<Fleet> {
        let ctx = Arc::new(Dial {
            urls: urls.to_vec(),
            tls,
            gate: Arc::new(Semaphore::new(CONNECTING)),
        });
        let (ev_tx, events) = mpsc::unbounded_channel();
        let mut cmds = Vec::with_capacity(agents);
        let mut welcomed = Vec::with_capacity(agents);
        let mut tasks = Vec::with_capacity(agents);
        for ix in 0..agents {
            let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
            let (w_tx, w_rx) = oneshot::channel::<Result<()>>();
            cmds.push(cmd_tx);
            welcomed.push(w_rx);
            tasks.push(tokio::spawn(run(
                ix,
                ctx.clone(),
                cmd_rx,
                ev_tx.clone(),
                w_tx,
            )));
        }
        for w in welcomed {
            tokio::time::timeout(PHASE_TIMEOUT, w)
                .await
                .context("agents not welcomed in time")?
                .context("agent task gone")??;
        }
        Ok(Fleet {
            cmds,
            events,
            tasks,
        })
    }

    /// Every agent closes its stream; how many did not end cleanly.
    pub async fn close(self) -> Result<usize> {
        let Fleet {
            cmds,
            mut events,
            tasks,
        } = self;
        drop(cmds);
        for t in tasks {
            tokio::time::timeout(Duration::from_secs(30), t)
                .await
                .context("agents still closing after 30 s")??;
        }
        let mut failed = 0;
        while let Ok(ev) = events.try_recv() {
            if let Event::Failed { agent, error } | Event::Lost { agent, error } = ev {
                if failed < 3 {
                    eprintln!("closing {}: {error}", agent_id(agent));
                }
                failed += 1;
            }
        }
        Ok(failed)
    }

    /// The next push acknowledged, failing on an agent's failure or loss.
    pub async fn next_event(&mut self, until: Instant) -> Result<(u64, i64, usize)> {
        let ev = tokio::time::timeout_at(until.into(), self.events.recv())
            .await
            .context("timed out waiting for the agents")?
            .context("every agent task ended")?;
        match ev {
            Event::PackAcked {
                version,
                acked_ns,
                via,
            } => Ok((version, acked_ns, via)),
            other => Err(unexpected(other)),
        }
    }

    /// Any agent failure or loss so far.
    pub fn check(&mut self) -> Result<()> {
        while let Ok(ev) = self.events.try_recv() {
            if !matches!(ev, Event::PackAcked { .. }) {
                return Err(unexpected(ev));
            }
        }
        Ok(())
    }
}

/// An event no phase but a failover expects, as the bench's error.
pub fn unexpected(ev: Event) -> anyhow::Error {
    match ev {
        Event::Failed { agent, error } => anyhow!("agent {}: {error}", agent_id(agent)),
        Event::Lost { agent, error } => {
            anyhow!("agent {} lost its stream: {error}", agent_id(agent))
        }
        Event::Rewelcomed { agent, url, .. } => {
            anyhow!(
                "agent {} welcomed again by controller {url}",
                agent_id(agent)
            )
        }
        Event::PackAcked { version, .. } => anyhow!("an unexpected ack of v{version}"),
    }
}
