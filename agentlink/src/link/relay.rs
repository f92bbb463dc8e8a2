//! Link → control thread: a bounded std channel plus an unpark, with a
//! small queue on the link's side.
//!
//! The control thread never waits on the link. The link must not wait on
//! the control thread *in a way that stops it from draining the control
//! thread's messages*: the control thread stops taking link events while
//! its own outgoing queue is full, so a link blocked on a full channel
//! while not reading the control thread's channel would be a cycle (STYLE
//! habit 13: one direction may block, never both). So a handover never
//! blocks the link's event loop: what the channel cannot take waits here,
//! in order, behind at most one blocking send running on tokio's blocking
//! pool, which the loop polls like any other event. The session stops
//! reading the stream while this queue is long ([`Relay::len`]): back
//! pressure reaches the controller through HTTP/2 flow control. Nothing is
//! ever dropped while the control side exists.

use std::collections::VecDeque;
use std::sync::mpsc::{SyncSender, TrySendError};
use std::thread::Thread;

use tokio::task::JoinHandle;

use super::FromLink;

/// The link's end of the channel to the control thread.
#[derive(Debug)]
pub(super) struct Relay {
    tx: SyncSender<FromLink>,
    control: Thread,
    /// Waiting for room, in order (behind `blocked`).
    queue: VecDeque<FromLink>,
    /// The one message being handed over by a blocking send.
    blocked: Option<JoinHandle<bool>>,
    /// The control side is gone (the agent is stopping).
    gone: bool,
}

impl Relay {
    pub(super) fn new(tx: SyncSender<FromLink>, control: Thread) -> Self {
        Relay {
            tx,
            control,
            queue: VecDeque::new(),
            blocked: None,
            gone: false,
        }
    }

    /// Hand `msg` over, now if the channel has room, else in turn. Never
    /// waits.
    pub(super) fn push(&mut self, msg: FromLink) {
        if !self.gone {
            self.queue.push_back(msg);
            self.pump();
        }
    }

    /// Messages not yet handed over.
    pub(super) fn len(&self) -> usize {
        self.queue.len() + usize::from(self.blocked.is_some())
    }

    /// Whether the control side is gone.
    pub(super) fn is_gone(&self) -> bool {
        self.gone
    }

    /// Whether a blocking send is under way (poll [`Relay::wait`]).
    pub(super) fn is_blocked(&self) -> bool {
        self.blocked.is_some()
    }

    /// Completes when the blocking send ends (never, if there is none).
    /// Cancel-safe: the send stays under way if this is dropped. Pass the
    /// result to [`Relay::done`].
    pub(super) async fn wait(&mut self) -> bool {
        match &mut self.blocked {
            Some(h) => h.await.unwrap_or(false),
            None => std::future::pending().await,
        }
    }

    /// The blocking send ended (`sent`: it was taken); go on with the rest.
    pub(super) fn done(&mut self, sent: bool) {
        self.blocked = None;
        if sent {
            self.control.unpark();
        } else {
            self.close();
        }
        self.pump();
    }

    fn close(&mut self) {
        self.gone = true;
        self.queue.clear();
    }

    /// Hand over in order what fits; the first that does not goes to a
    /// blocking send on the blocking pool.
    fn pump(&mut self) {
        while self.blocked.is_none() && !self.gone {
            let Some(msg) = self.queue.pop_front() else {
                break;
            };
            match self.tx.try_send(msg) {
                Ok(()) => self.control.unpark(),
                Err(TrySendError::Full(msg)) => {
                    let tx = self.tx.clone();
                    self.blocked = Some(tokio::task::spawn_blocking(move || tx.send(msg).is_ok()));
                }
                Err(TrySendError::Disconnected(_)) => self.close(),
            }
        }
    }
}
