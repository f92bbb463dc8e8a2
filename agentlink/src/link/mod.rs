//! The controller link: the agent's one bidirectional gRPC stream to its
//! controller (`baton.v1.Link/Connect`), on a thread of its own.
//!
//! # Threads and channels
//!
//! The link runs on its own OS thread, `baton-link`, inside a tokio
//! *current-thread* runtime: nothing async ever runs on the control or
//! dispatcher threads (docs/design.md habit 15). Two bounded channels join it
//! to the control thread, and neither side can block the other for good:
//!
//! - **link → control**: a `std::sync::mpsc::sync_channel` of [`FromLink`]
//!   (depth [`FROM_LINK_DEPTH`]), each send followed by an unpark of the
//!   control thread. When it is full the link hands the next message to a
//!   blocking send on tokio's blocking pool (never blocking its runtime),
//!   keeps later ones in order in a short queue, and stops reading the
//!   stream while that queue is long: back-pressure reaches the controller
//!   through HTTP/2 flow control. It keeps draining the control thread's
//!   messages meanwhile, so the two can never wait on each other. Nothing
//!   is dropped.
//! - **control → link**: a tokio `mpsc` of [`Outgoing`] (depth
//!   [`TO_LINK_DEPTH`]) that the control thread only `try_send`s; what does
//!   not fit waits in the control thread's own small queue
//!   (`runtime::uplink`).
//!
//! # Sessions
//!
//! Each connection is a *session*, numbered from 1. The link says
//! [`FromLink::Connected`] once the transport is up; the control thread
//! answers with [`ToLink::Hello`], which opens the stream (Hello is the
//! first message on every stream). Everything the control thread sends is
//! tagged with the session it answers; messages for a session that ended
//! are dropped by the link, never sent on a later stream (the next Hello
//! tells the controller the state instead). The session ends with
//! [`FromLink::Disconnected`] (the control thread may end it with
//! [`ToLink::Refuse`]: a stale controller, see `runtime::uplink`), then
//! the link reconnects forever, to the next controller address, with
//! exponential backoff and full jitter between rounds ([`failover`],
//! [`backoff`]).
//!
//! # What the link does on its own
//!
//! Answers pings (Pong) and time-exchange requests (t2/t3 from the agent's
//! clock), detects a dead peer ([`watchdog`]: three ping intervals without
//! a message), and turns outbox records into `wire::Feedback`
//! ([`convert`]). Everything that touches the agent's state (packs, the
//! journal, leases) happens on the control thread (`runtime::uplink`).

pub mod backoff;
pub mod convert;
pub mod failover;
mod relay;
mod session;
pub mod watchdog;

/// The link's PEM files: the shared client's, so the agent's configuration
/// names them without importing the link.
pub use baton_link_client::TlsFiles;

use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender};
use std::thread::JoinHandle;
use std::time::Duration;

use baton_proto::wire;
use tokio::sync::{mpsc, watch};

use baton_clock::port::Clock;

/// Depth of the link → control channel.
pub const FROM_LINK_DEPTH: usize = 256;
/// Depth of the control → link channel.
pub const TO_LINK_DEPTH: usize = 64;

/// A staged push's instant and bound (see `PackPush.staged`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StageAt {
    /// Switch at this reference instant (ns since the epoch); 0: not yet
    /// named.
    pub at_ns: i64,
    /// Not switched when the clock is less certain than this (ns; 0: the
    /// agent's own limit).
    pub max_uncertainty_ns: i64,
}

/// What the link tells the control thread. Every variant names the session
/// it belongs to.
#[derive(Debug, Clone, PartialEq)]
pub enum FromLink {
    /// A transport to the controller is up: send [`ToLink::Hello`] for this
    /// session. Not yet contact: the controller has not answered.
    Connected {
        /// The new session.
        session: u64,
    },
    /// The controller's answer to Hello.
    Welcome {
        /// Session.
        session: u64,
        /// Feedback up to this seq is stored by the controller.
        acked_seq: u64,
        /// How often the controller pings (as the link honours it).
        ping_interval: Duration,
        /// The stream's session generation (0: a controller that does not
        /// fence); the control thread decides whether to accept it.
        session_gen: u64,
    },
    /// A pack pushed (its YAML, validated by the control thread).
    Push {
        /// Session.
        session: u64,
        /// What the controller says it is (empty if it said nothing).
        pack: wire::PackRef,
        /// The pack's YAML source.
        yaml: String,
        /// The generation the controller sent it on (fencing).
        session_gen: u64,
        /// Staged for a switch at one instant (`activate: together`);
        /// `None`: run it on arrival.
        stage: Option<StageAt>,
    },
    /// A pack withdrawn.
    Cancel {
        /// Session.
        session: u64,
        /// Which pack (version as the controller knows it).
        pack: wire::PackRef,
        /// The generation the controller sent it on (fencing).
        session_gen: u64,
    },
    /// Feedback up to `seq` is stored by the controller.
    FeedbackAck {
        /// Session.
        session: u64,
        /// Cumulative.
        seq: u64,
    },
    /// The controller is there (a ping or time exchange; at most one per
    /// second): renews leases like any other message.
    Alive {
        /// Session.
        session: u64,
    },
    /// The fleet's trust lists as the controller relays them (a JSON
    /// chain of root-signed lists): the control thread takes those newer
    /// than its own that its root verifies; the sender is not trusted.
    TrustLists {
        /// Session.
        session: u64,
        /// The chain's text.
        chain: String,
    },
    /// An agent release offered (its signed manifest): the control thread
    /// checks it against the box's trust list; the sender is not trusted.
    ReleaseOffer {
        /// Session.
        session: u64,
        /// The offer.
        offer: wire::ReleaseOffer,
    },
    /// A piece of an offered release's binary.
    ReleaseChunk {
        /// Session.
        session: u64,
        /// The piece.
        chunk: wire::ReleaseChunk,
    },
    /// A release no longer offered to this box.
    ReleaseWithdraw {
        /// Session.
        session: u64,
        /// Its version.
        version: String,
    },
    /// The session ended (stream closed, refused, dead peer...). Sent once
    /// per session that was [`FromLink::Connected`].
    Disconnected {
        /// Session.
        session: u64,
        /// In words, for the log.
        reason: String,
    },
}

impl FromLink {
    /// The session the message belongs to.
    pub fn session(&self) -> u64 {
        match self {
            FromLink::Connected { session }
            | FromLink::Welcome { session, .. }
            | FromLink::Push { session, .. }
            | FromLink::Cancel { session, .. }
            | FromLink::FeedbackAck { session, .. }
            | FromLink::Alive { session }
            | FromLink::TrustLists { session, .. }
            | FromLink::ReleaseOffer { session, .. }
            | FromLink::ReleaseChunk { session, .. }
            | FromLink::ReleaseWithdraw { session, .. }
            | FromLink::Disconnected { session, .. } => *session,
        }
    }
}

/// What the control thread sends to the controller.
#[derive(Debug, Clone, PartialEq)]
pub enum ToLink {
    /// The first message of a session.
    Hello(Box<wire::Hello>),
    /// A pushed pack was accepted.
    Ack(wire::PackAck),
    /// A pushed pack was refused.
    Nack(wire::PackNack),
    /// The packs held now (after any change).
    Held(Vec<wire::HeldPack>),
    /// Outbox records in seq order; the link converts them
    /// ([`convert::feedback`]).
    Feedback(FeedbackPage),
    /// The clock's state.
    ClockReport(wire::ClockReport),
    /// The box's trust, changed since the Hello.
    TrustState(wire::TrustState),
    /// Ask for a piece of an offered release.
    ReleaseRequest(wire::ReleaseRequest),
    /// Where an offered release stands on the box.
    UpdateState(wire::UpdateState),
    /// End this session now, for this reason (a controller whose Welcome
    /// the control thread refused: a stale generation). Counted as a failed
    /// attempt: the link backs off and dials the next controller.
    Refuse(String),
}

/// A page of outbox records for the controller.
#[derive(Debug, Clone, PartialEq)]
pub struct FeedbackPage {
    /// `(seq, record bytes)` in seq order (`crate::outbox` formats).
    pub records: Vec<(u64, Vec<u8>)>,
    /// `(seq, count)`: the record that carries the count of entries
    /// dropped at the outbox cap (`Journal::carry_drops`), sent on it as
    /// `dropped_before`.
    pub carried: Option<(u64, u64)>,
}

/// A [`ToLink`] for one session (dropped if that session is over).
#[derive(Debug, Clone, PartialEq)]
pub struct Outgoing {
    /// The session it answers.
    pub session: u64,
    /// The message.
    pub msg: ToLink,
}

/// Where and how to dial.
#[derive(Clone, Debug)]
pub struct LinkConfig {
    /// The controllers, each `https://HOST:PORT` or `http://HOST:PORT`
    /// (checked by `config::check_controllers`), in the order they are
    /// tried; each name is resolved and every address tried in turn
    /// ([`failover`]).
    pub urls: Vec<String>,
    /// Certificate files for `https://` (read at every connection).
    pub tls: Option<TlsFiles>,
    /// This agent's id, for the log (the controller learns it from Hello).
    pub agent_id: String,
    /// Reconnect delays.
    pub backoff: backoff::BackoffConfig,
    /// Ask the controller for its time (`clock.link`), feeding the clock
    /// estimator's link source.
    pub time_exchange: bool,
}

impl LinkConfig {
    /// Dial `urls` with the default backoff.
    pub fn new(urls: Vec<String>, agent_id: impl Into<String>) -> Self {
        LinkConfig {
            tls: None,
            urls,
            agent_id: agent_id.into(),
            backoff: backoff::BackoffConfig::default(),
            time_exchange: true,
        }
    }
}

/// Why [`Link::try_send`] did not take a message.
#[derive(Debug)]
pub enum SendError {
    /// The channel is full: keep it and try again later.
    Full(Outgoing),
    /// The link thread is gone.
    Closed(Outgoing),
}

/// The control thread's handle on the link thread. Dropping it asks the
/// thread to stop without waiting for it (a `Drop` never blocks); call
/// [`Link::stop`] to wait, bounded.
#[derive(Debug)]
pub struct Link {
    to_link: mpsc::Sender<Outgoing>,
    from_link: Receiver<FromLink>,
    stop: watch::Sender<bool>,
    done: Receiver<()>,
    thread: Option<JoinHandle<()>>,
}

impl Link {
    /// Start the `baton-link` thread dialling `cfg.urls`. `control` is the
    /// control thread, unparked whenever a [`FromLink`] arrives; `clock`
    /// stamps time-exchange replies.
    pub fn start(
        cfg: LinkConfig,
        clock: Arc<dyn Clock>,
        control: std::thread::Thread,
    ) -> std::io::Result<Link> {
        let (to_link, to_rx) = mpsc::channel(TO_LINK_DEPTH);
        let (from_tx, from_link) = std::sync::mpsc::sync_channel(FROM_LINK_DEPTH);
        let (stop, stop_rx) = watch::channel(false);
        let (done_tx, done) = std::sync::mpsc::sync_channel(1);
        let relay = relay::Relay::new(from_tx, control);
        let thread = std::thread::Builder::new()
            .name("baton-link".into())
            .spawn(move || thread_main(cfg, clock, to_rx, relay, stop_rx, done_tx))?;
        Ok(Link {
            to_link,
            from_link,
            stop,
            done,
            thread: Some(thread),
        })
    }

    /// Queue a message for the controller; never blocks.
    pub fn try_send(&self, msg: Outgoing) -> Result<(), SendError> {
        self.to_link.try_send(msg).map_err(|e| match e {
            mpsc::error::TrySendError::Full(m) => SendError::Full(m),
            mpsc::error::TrySendError::Closed(m) => SendError::Closed(m),
        })
    }

    /// The next message from the link, if any; never blocks.
    pub fn try_recv(&self) -> Option<FromLink> {
        self.from_link.try_recv().ok()
    }

    /// Stop the link thread, waiting at most `wait` for it to end. Returns
    /// whether it ended (if not, it is left behind; it holds nothing the
    /// agent needs).
    pub fn stop(&mut self, wait: Duration) -> bool {
        let _ = self.stop.send(true);
        let Some(thread) = self.thread.take() else {
            return true;
        };
        match self.done.recv_timeout(wait) {
            Ok(()) | Err(RecvTimeoutError::Disconnected) => {
                let _ = thread.join();
                true
            }
            Err(RecvTimeoutError::Timeout) => false,
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

fn thread_main(
    cfg: LinkConfig,
    clock: Arc<dyn Clock>,
    to_rx: mpsc::Receiver<Outgoing>,
    relay: relay::Relay,
    stop: watch::Receiver<bool>,
    done: SyncSender<()>,
) {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => {
            rt.block_on(session::run(cfg, clock, to_rx, relay, stop));
            // A relay still waiting for room on the blocking pool ends when
            // the control side drops its receiver; do not wait for it here.
            rt.shutdown_timeout(Duration::from_millis(100));
        }
        Err(e) => tracing::error!(
            "controller link: cannot start its runtime ({e}); the agent runs without a controller"
        ),
    }
    let _ = done.send(());
}
