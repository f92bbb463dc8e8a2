//! One agent's stream: the tokio shell around the application's link
//! session ([`baton_app::link::Session`], where the protocol's rules
//! live). The shell reads the stream, the hub's commands and the clock,
//! converts the wire to the session's inputs and its messages back to the
//! wire, performs its effects through the application and sends what it
//! asks, paced. Every way out of [`run`] ends in the same place
//! (`close`): the agent is marked disconnected and unregistered.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use baton_proto::wire::{self, agent_message::Body as In};
use tokio::sync::mpsc;
use tokio_stream::{Stream, StreamExt};
use tonic::Status;

use super::convert;
use crate::shared::Shared;
use baton_app::link::{self, Action, Closing, Input, LinkConfig, Now, Session};
use baton_app::{App, now, now_ns};
use baton_model::HelloRow;

mod end;
mod stream;
mod wire_io;

use end::End;

/// Outbound queue of one stream.
pub type Outbound = mpsc::Sender<Result<wire::ControllerMessage, Status>>;

/// How long a send to a slow agent may take before its stream is closed.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// Who opened a link stream, as its TLS certificate says (nothing on a
/// plaintext controller).
#[derive(Clone, Debug, Default)]
pub struct LinkPeer {
    /// The agent id of the certificate: the Hello must say the same.
    pub agent_id: Option<String>,
    /// The certificate's serial: the stream ends when it is revoked.
    pub serial: Option<String>,
    /// The tenants the certificate names (`None`: none named).
    pub tenants: Option<Vec<String>>,
}

/// One live stream: the session and what performs its actions.
struct Shell {
    shared: Arc<Shared>,
    app: Arc<App>,
    out: Outbound,
    session: Session,
    /// The hello's agent id and journal (the stream's for its life).
    agent_id: String,
    journal_id: String,
    /// Most packs its Held may list (its max-packs, at most the
    /// controller's).
    held_cap: usize,
}

/// Both clocks, now.
fn clocks() -> Now {
    Now {
        // tokio's clock, so paused-time tests drive the deadlines.
        mono: tokio::time::Instant::now().into_std(),
        wall: now(),
    }
}

/// Serve one stream to its end.
pub async fn run<S>(shared: Arc<Shared>, mut inbound: S, out: Outbound, peer: LinkPeer)
where
    S: Stream<Item = Result<wire::AgentMessage, Status>> + Unpin + Send,
{
    let (hello, hello_row) = match first_hello(&shared, &mut inbound, &peer).await {
        Ok(h) => h,
        Err(end) => {
            tracing::warn!("link stream refused before hello: {}", end.describe());
            if let Some(s) = end.status() {
                let _ = out.send(Err(s)).await;
            }
            return;
        }
    };
    let agent_id = hello.agent_id.clone();
    let app = shared.app.clone();
    let (cmd_tx, cmd_rx) = mpsc::channel(64);
    let generation = match app
        .hub
        .register(&agent_id, &hello.journal_id, cmd_tx, now())
    {
        Ok(g) => g,
        Err(c) => {
            let msg = app.duplicate_refused(&agent_id, &c).await;
            let end = End::Link(link::End::Duplicate(msg));
            let status = end.status().unwrap_or_else(|| Status::already_exists(""));
            let _ = out.send(Err(status)).await;
            return;
        }
    };
    let cfg = LinkConfig {
        ping_interval: shared.cfg.ping_interval,
        binding: app.cfg.binding,
        trust_chain: shared.cfg.trust_chain.borrow().clone(),
    };
    let (session, first) = Session::start(
        clocks(),
        cfg,
        hello_row,
        peer.tenants.clone(),
        hello.feedback_first_seq,
    );
    let mut shell = Shell {
        shared: shared.clone(),
        app,
        out: out.clone(),
        session,
        agent_id,
        journal_id: hello.journal_id.clone(),
        held_cap: convert::held_cap(&hello, shared.app.cfg.max_held),
    };
    let end = match shell.perform(first).await {
        Ok(()) => shell.serve(inbound, cmd_rx, peer.serial).await,
        Err(e) => e,
    };
    close(&shell, end, generation).await;
}

/// Every way out of a stream: the end logged and told to the agent, the
/// stream unregistered, the agent marked disconnected if it is still this
/// stream's.
async fn close(shell: &Shell, end: End, generation: u64) {
    let app = &shell.app;
    let agent_id = &shell.agent_id;
    let reason = end.describe();
    match end {
        End::Link(link::End::Fenced(_)) => app.metrics.fenced_stream(),
        // Another replica's stream holds the id (the store said so).
        End::Link(link::End::Duplicate(_)) => app.metrics.duplicate_stream(),
        _ => {}
    }
    for (what, n) in shell.session.dropped() {
        if n > 0 {
            tracing::warn!(agent = %agent_id, "{n} {what} dropped on this stream");
        }
    }
    if let Some(s) = end.status() {
        let _ = tokio::time::timeout(Duration::from_secs(1), shell.out.send(Err(s))).await;
    }
    // A forgotten agent has no record left to mark; a fenced stream's
    // agent is another stream's to mark.
    let closing = match end {
        End::Link(link::End::Forgotten | link::End::Fenced(_)) => Closing::NotOurs,
        _ => Closing::Disconnected,
    };
    let s = &shell.session;
    app.stream_closed(
        agent_id,
        generation,
        s.agent().session_gen,
        s.tenants().clone(),
        closing,
        &reason,
    )
    .await;
    match end {
        End::Closed
        | End::Shutdown
        | End::Link(link::End::Replaced | link::End::Forgotten | link::End::Fenced(_)) => {
            tracing::info!(agent = %agent_id, "link stream ended: {reason}")
        }
        _ => tracing::warn!(agent = %agent_id, "link stream ended: {reason}"),
    }
}

/// The first message must be a valid hello, within the hello timeout:
/// it and what the store will keep of it.
async fn first_hello<S>(
    shared: &Shared,
    inbound: &mut S,
    peer: &LinkPeer,
) -> Result<(wire::Hello, HelloRow), End>
where
    S: Stream<Item = Result<wire::AgentMessage, Status>> + Unpin + Send,
{
    let first = tokio::time::timeout(shared.cfg.hello_timeout, inbound.next())
        .await
        .map_err(|_| End::bad(format!("no hello within {:?}", shared.cfg.hello_timeout)))?;
    let msg = match first {
        Some(Ok(m)) => m,
        None => return Err(End::Closed),
        Some(Err(s)) => return Err(End::Transport(s)),
    };
    match msg.body {
        Some(In::Hello(h)) => {
            if let Some(id) = &peer.agent_id
                && h.agent_id != *id
            {
                return Err(End::Denied(format!(
                    "hello as agent `{}` on a certificate of agent `{id}`",
                    h.agent_id
                )));
            }
            // Checked here so a bad hello never registers a stream.
            let row = convert::hello(&h, shared.app.cfg.max_held, now_ns())?;
            Ok((h, row))
        }
        _ => Err(End::bad("the first message on a link stream must be hello")),
    }
}

impl Shell {
    /// Perform the session's actions in order: each effect's answer goes
    /// back to the session before anything else, and what it asks next
    /// is performed in turn.
    async fn perform(&mut self, actions: Vec<Action>) -> Result<(), End> {
        let mut queue = VecDeque::from(actions);
        while let Some(a) = queue.pop_front() {
            match a {
                Action::Send(m) => self.send(m).await?,
                Action::Note(n) => self.app.note(&self.agent_id, n),
                Action::End(e) => return Err(End::Link(e)),
                Action::Effect(e) => {
                    // An effect is the last thing the session asks before
                    // its answer.
                    debug_assert!(queue.is_empty(), "actions after an effect: {queue:?}");
                    let done = self
                        .app
                        .perform(&self.agent_id, e)
                        .await
                        .map_err(End::Link)?;
                    queue.extend(self.session.handle(clocks(), Input::Done(done)));
                }
            }
        }
        Ok(())
    }

    /// Send one message, within [`SEND_TIMEOUT`].
    async fn send(&self, m: link::ToAgent) -> Result<(), End> {
        if matches!(m, link::ToAgent::Push { .. }) {
            // Every stream shares one pace of pushes.
            self.app.pace().await;
        }
        let body = wire_io::to_wire(m);
        match tokio::time::timeout(
            SEND_TIMEOUT,
            self.out
                .send(Ok(wire::ControllerMessage { body: Some(body) })),
        )
        .await
        {
            Ok(Ok(())) => Ok(()),
            // The response stream was dropped: the agent is gone.
            Ok(Err(_)) => Err(End::Closed),
            Err(_) => Err(End::Stuck),
        }
    }
}

#[cfg(test)]
mod tests;
