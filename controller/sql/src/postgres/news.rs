//! Other replicas' commits heard as they happen: a connection of its own
//! `LISTEN`s on the channel events are announced on (`sql::tx`'s
//! `pg_notify` in the transaction that stores them), and each
//! notification wakes this replica's follower at once instead of at its
//! next poll. Notifications are a wake-up only: while the connection is
//! down (and reconnecting) they are lost, and the follower's poll is what
//! it falls back on; what it reads is always the table itself.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use postgres::fallible_iterator::FallibleIterator;
use tokio::sync::Notify;

use super::conn::detailed;
use super::{Target, connect};
use baton_store::{StoreError, StoreResult};

/// The channel events are announced on.
pub(crate) const CHANNEL: &str = "baton_events";

/// How often the listening thread looks up from its wait (to stop).
const LOOK_UP: Duration = Duration::from_millis(500);

/// The listener: a thread with its own connection.
pub(super) struct News {
    woken: Arc<Notify>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl News {
    /// Starts listening on `target`.
    pub fn start(target: Target) -> StoreResult<News> {
        let woken = Arc::new(Notify::new());
        let stop = Arc::new(AtomicBool::new(false));
        let (w, s) = (Arc::clone(&woken), Arc::clone(&stop));
        let thread = std::thread::Builder::new()
            .name("store-news".into())
            .spawn(move || listen(&target, &w, &s))
            .map_err(|e| StoreError::unavailable("start the store's listener", e))?;
        Ok(News {
            woken,
            stop,
            thread: Some(thread),
        })
    }

    /// Returns when another commit was announced (one announcement made
    /// while nobody waited is kept for the next wait), or after
    /// `at_most`.
    pub async fn wait(&self, at_most: Duration) {
        let _ = tokio::time::timeout(at_most, self.woken.notified()).await;
    }
}

impl Drop for News {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Listens until `stop`, connecting again (after a pause) whenever the
/// connection is lost.
fn listen(target: &Target, woken: &Notify, stop: &AtomicBool) {
    let mut warned = false;
    while !stop.load(Ordering::SeqCst) {
        match listen_once(target, woken, stop) {
            Ok(()) => return,
            Err(e) => {
                if !warned {
                    tracing::warn!(
                        "store: not hearing other replicas' commits ({e}); following by polling until it is back"
                    );
                    warned = true;
                }
                // Woken anyway: what was announced meanwhile is lost.
                woken.notify_one();
                std::thread::sleep(LOOK_UP);
            }
        }
    }
}

fn listen_once(target: &Target, woken: &Notify, stop: &AtomicBool) -> StoreResult<()> {
    let mut client = connect(target)?;
    client
        .batch_execute(&format!("LISTEN {CHANNEL}"))
        .map_err(|e| StoreError::unavailable("listen for other replicas' commits", detailed(&e)))?;
    while !stop.load(Ordering::SeqCst) {
        let mut n = client.notifications();
        let mut heard = n.timeout_iter(LOOK_UP);
        match heard.next() {
            Ok(Some(_)) => woken.notify_one(),
            Ok(None) => {}
            Err(e) => {
                return Err(StoreError::unavailable(
                    "hear other replicas' commits",
                    detailed(&e),
                ));
            }
        }
    }
    Ok(())
}
