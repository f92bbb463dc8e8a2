//! Who is connected: one live stream per agent id, and what the rest of
//! the controller asks of it.
//!
//! A second stream for the same id *and the same journal* is the agent
//! reconnecting (the old stream is dead and not yet noticed): it replaces
//! the first. A second stream for the same id from *another* journal is
//! another machine using the same identity (a cloned disk, a copied
//! certificate): it is refused, counted and shown by `agents`, never
//! allowed to replace the first — two boxes driving the same presses under
//! one name is a bug in the physical world.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;

use tokio::sync::mpsc;

use baton_model::{DeliveryRow, RefTime};

use crate::texts::PackText;

/// What the rest of the controller asks of an agent's stream.
#[derive(Debug)]
pub enum SessionCmd {
    /// These rows of the agent changed (a push, a cancel, a label change,
    /// a grant): act on them. `pack` is the pushed version's text when the
    /// change was a push, so the stream need not read it.
    Rows {
        /// The rows as they are now.
        rows: Vec<DeliveryRow>,
        /// The version pushed, if any.
        pack: Option<Arc<PackText>>,
    },
    /// A newer stream for the same agent and journal took over: close.
    Replaced,
    /// An admin forgot the agent: close the stream (it may say hello
    /// again, as a new agent).
    Forgotten,
    /// The agent's tenants changed (a grant): re-read them.
    Regranted,
    /// The fleet's trust lists changed: relay them to the agent.
    TrustLists(Arc<str>),
    /// The release the agent is to be offered may have changed (an
    /// update admitted it, or was withdrawn): read it again.
    Release,
}

#[derive(Debug)]
struct Entry {
    generation: u64,
    journal_id: String,
    tx: mpsc::Sender<SessionCmd>,
}

/// A stream refused because another machine holds the id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    /// The journal of the stream that holds the id.
    pub holder_journal: String,
    /// The journal of the one refused.
    pub refused_journal: String,
    /// How many streams were refused so far.
    pub refused: u64,
    /// When the last was.
    pub at: RefTime,
}

/// The live streams, by agent id.
#[derive(Debug, Default)]
pub struct Hub {
    sessions: Mutex<HashMap<String, Entry>>,
    conflicts: Mutex<HashMap<String, Conflict>>,
    next_generation: std::sync::atomic::AtomicU64,
}

impl Hub {
    /// Register the stream of `agent` from `journal_id`; its generation,
    /// or the conflict when another journal's stream holds the id. An
    /// older stream of the same journal is told to close.
    pub fn register(
        &self,
        agent: &str,
        journal_id: &str,
        tx: mpsc::Sender<SessionCmd>,
        at: RefTime,
    ) -> Result<u64, Conflict> {
        let mut s = self.lock();
        if let Some(held) = s.get(agent)
            && held.journal_id != journal_id
            && !held.tx.is_closed()
        {
            let mut c = self.conflicts.lock().unwrap_or_else(|p| p.into_inner());
            let e = c.entry(agent.to_string()).or_insert(Conflict {
                holder_journal: held.journal_id.clone(),
                refused_journal: String::new(),
                refused: 0,
                at,
            });
            e.holder_journal = held.journal_id.clone();
            e.refused_journal = journal_id.to_string();
            e.refused += 1;
            e.at = at;
            return Err(e.clone());
        }
        let generation = self
            .next_generation
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        let old = s.insert(
            agent.to_string(),
            Entry {
                generation,
                journal_id: journal_id.to_string(),
                tx,
            },
        );
        if let Some(old) = old {
            tracing::info!(agent, "a newer stream replaces the agent's open stream");
            // If its queue is full it is stuck; its own timers end it.
            let _ = old.tx.try_send(SessionCmd::Replaced);
        }
        Ok(generation)
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

    /// The last refused duplicate of `agent`, if any since the controller
    /// started.
    pub fn conflict(&self, agent: &str) -> Option<Conflict> {
        self.conflicts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(agent)
            .cloned()
    }

    /// An agent forgotten: its conflict record goes too.
    pub fn forget(&self, agent: &str) {
        self.conflicts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(agent);
    }

    /// Send a command to `agent`'s stream if it has one. Never waits: a
    /// stream whose queue is full gets it from a task (order among such
    /// sends is not kept; every command is idempotent on the agent).
    /// Whether the agent is connected.
    pub fn send(&self, agent: &str, cmd: SessionCmd) -> bool {
        let Some(tx) = self.lock().get(agent).map(|e| e.tx.clone()) else {
            return false;
        };
        deliver(&tx, cmd)
    }

    /// Send `cmd()` to every stream (as [`Hub::send`] does to one); how
    /// many.
    pub fn send_all(&self, cmd: impl Fn() -> SessionCmd) -> usize {
        let txs: Vec<mpsc::Sender<SessionCmd>> =
            self.lock().values().map(|e| e.tx.clone()).collect();
        txs.into_iter().filter(|tx| deliver(tx, cmd())).count()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// `cmd` to a stream's queue without waiting (a full queue gets it from a
/// task); whether the stream is still there.
fn deliver(tx: &mpsc::Sender<SessionCmd>, cmd: SessionCmd) -> bool {
    match tx.try_send(cmd) {
        Ok(()) => true,
        Err(mpsc::error::TrySendError::Full(cmd)) => {
            let tx = tx.clone();
            tokio::spawn(async move {
                let _ = tx.send(cmd).await;
            });
            true
        }
        Err(mpsc::error::TrySendError::Closed(_)) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_reconnect_replaces_another_journal_is_refused() {
        let hub = Hub::default();
        let (tx1, mut rx1) = mpsc::channel(4);
        let (tx2, mut rx2) = mpsc::channel(4);
        let (tx3, _rx3) = mpsc::channel(4);
        let g1 = hub
            .register("a", "j1", tx1, RefTime::from_nanos(1))
            .expect("first");
        // Another machine with the same id: refused, recorded.
        let c = hub
            .register("a", "j2", tx3, RefTime::from_nanos(2))
            .expect_err("duplicate");
        assert_eq!((c.holder_journal.as_str(), c.refused), ("j1", 1));
        assert_eq!(
            hub.conflict("a").map(|c| c.refused_journal),
            Some("j2".into())
        );
        assert_eq!(hub.conflict("a").map(|c| c.refused), Some(1));
        // The same journal again: the agent reconnecting replaces it.
        let g2 = hub
            .register("a", "j1", tx2, RefTime::from_nanos(3))
            .expect("reconnect");
        assert!(matches!(rx1.recv().await, Some(SessionCmd::Replaced)));
        // The old stream ending leaves the new one registered.
        assert!(!hub.unregister("a", g1));
        assert!(hub.is_connected("a"));
        assert!(hub.send("a", SessionCmd::Regranted));
        assert!(matches!(rx2.recv().await, Some(SessionCmd::Regranted)));
        assert!(hub.unregister("a", g2));
        assert!(!hub.is_connected("a"));
        assert!(!hub.send("a", SessionCmd::Replaced));
        // Gone: another journal may take the id now.
        let (tx4, _rx4) = mpsc::channel(4);
        assert!(hub.register("a", "j2", tx4, RefTime::from_nanos(4)).is_ok());
    }
}
