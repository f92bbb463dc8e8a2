//! Link → control thread: a bounded std channel plus an unpark.
//!
//! The control thread never waits on the link; the link waits on the
//! control thread only when the channel is full, and then without
//! blocking its runtime: the message is handed to a blocking send on
//! tokio's blocking pool, which the link awaits (so order is kept and
//! nothing is dropped), while a stop request still ends the wait.

use std::sync::mpsc::{SyncSender, TrySendError};
use std::thread::Thread;

use tokio::sync::watch;

use super::FromLink;

/// Why a message could not be handed over.
#[derive(Debug)]
pub(super) enum RelayClosed {
    /// The control side is gone (the agent is stopping).
    Gone,
    /// A stop was requested while waiting for room.
    Stopping,
}

/// The link's end of the channel to the control thread.
#[derive(Debug, Clone)]
pub(super) struct Relay {
    tx: SyncSender<FromLink>,
    control: Thread,
}

impl Relay {
    pub(super) fn new(tx: SyncSender<FromLink>, control: Thread) -> Self {
        Relay { tx, control }
    }

    /// Hand `msg` over and wake the control thread. Returns whether the
    /// send had to wait for room (the control thread was busy).
    pub(super) async fn send(
        &self,
        msg: FromLink,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<bool, RelayClosed> {
        let waited = match self.tx.try_send(msg) {
            Ok(()) => false,
            Err(TrySendError::Disconnected(_)) => return Err(RelayClosed::Gone),
            Err(TrySendError::Full(msg)) => {
                let tx = self.tx.clone();
                let blocking = tokio::task::spawn_blocking(move || tx.send(msg).is_ok());
                tokio::select! {
                    sent = blocking => match sent {
                        Ok(true) => true,
                        _ => return Err(RelayClosed::Gone),
                    },
                    _ = stop.wait_for(|s| *s) => return Err(RelayClosed::Stopping),
                }
            }
        };
        self.control.unpark();
        Ok(waited)
    }
}
