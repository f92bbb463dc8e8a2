//! Who is connected: one live stream per agent id. A second stream for the
//! same id replaces the first (the older one is told to close), never both:
//! two streams would deliver every push twice and interleave feedback.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::mpsc;

use crate::store::PackVersionRow;

/// What the rest of the server asks of an agent's stream.
#[derive(Debug)]
pub enum SessionCmd {
    /// Deliver this version (pushed, or retried).
    Deliver(PackVersionRow),
    /// Cancel the agent's copy of this pack.
    Cancel {
        /// Tenant.
        tenant: String,
        /// Pack id.
        pack: String,
        /// Version (the latest known).
        version: u64,
    },
    /// A newer stream for the same agent took over: close this one.
    Replaced,
    /// An admin changed the agent's labels: re-read them, reconcile.
    Relabelled,
    /// An admin forgot the agent: close the stream (it may say hello
    /// again, as a new agent).
    Forgotten,
}

#[derive(Debug)]
struct Entry {
    generation: u64,
    tx: mpsc::Sender<SessionCmd>,
}

/// The live streams, by agent id.
#[derive(Debug, Default)]
pub struct Hub {
    sessions: Mutex<HashMap<String, Entry>>,
    next_generation: std::sync::atomic::AtomicU64,
}

impl Hub {
    /// Register the stream of `agent`; returns its generation. An older
    /// stream of the same agent is told to close.
    pub fn register(&self, agent: &str, tx: mpsc::Sender<SessionCmd>) -> u64 {
        let generation = self
            .next_generation
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        let old = self
            .lock()
            .insert(agent.to_string(), Entry { generation, tx });
        if let Some(old) = old {
            tracing::info!(agent, "a newer stream replaces the agent's open stream");
            // If its queue is full it is stuck; its own timers end it.
            let _ = old.tx.try_send(SessionCmd::Replaced);
        }
        generation
    }

    /// Remove the stream of `agent` if it is still `generation` (a replaced
    /// stream ending must not unregister its successor). Whether it was.
    pub fn unregister(&self, agent: &str, generation: u64) -> bool {
        let mut s = self.lock();
        if s.get(agent).is_some_and(|e| e.generation == generation) {
            s.remove(agent);
            true
        } else {
            false
        }
    }

    /// Whether `agent` has a live stream.
    pub fn is_connected(&self, agent: &str) -> bool {
        self.lock().contains_key(agent)
    }

    /// Number of live streams.
    pub fn connected(&self) -> usize {
        self.lock().len()
    }

    /// Send a command to `agent`'s stream if it has one. Never waits: a
    /// stream whose queue is full gets it from a task (order among such
    /// sends is not kept; every command is idempotent on the agent).
    /// Whether the agent is connected.
    pub fn send(&self, agent: &str, cmd: SessionCmd) -> bool {
        let Some(tx) = self.lock().get(agent).map(|e| e.tx.clone()) else {
            return false;
        };
        match tx.try_send(cmd) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(cmd)) => {
                tokio::spawn(async move {
                    let _ = tx.send(cmd).await;
                });
                true
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_second_stream_replaces_the_first() {
        let hub = Hub::default();
        let (tx1, mut rx1) = mpsc::channel(4);
        let (tx2, mut rx2) = mpsc::channel(4);
        let g1 = hub.register("a", tx1);
        let g2 = hub.register("a", tx2);
        assert!(matches!(rx1.recv().await, Some(SessionCmd::Replaced)));
        // The old stream ending leaves the new one registered.
        assert!(!hub.unregister("a", g1));
        assert!(hub.is_connected("a"));
        assert!(hub.send(
            "a",
            SessionCmd::Cancel {
                tenant: "t".into(),
                pack: "p".into(),
                version: 1
            }
        ));
        assert!(matches!(rx2.recv().await, Some(SessionCmd::Cancel { .. })));
        assert!(hub.unregister("a", g2));
        assert!(!hub.is_connected("a"));
        assert!(!hub.send("a", SessionCmd::Replaced));
    }
}
