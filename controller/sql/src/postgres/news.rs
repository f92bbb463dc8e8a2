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

/// The other side: tells the listeners that something was committed, from
/// a thread and connection of its own, after the commit. A `NOTIFY` inside
/// the writing transaction would make its commit take the database's
/// notification lock, which every notifying commit holds through its
/// flush to disk: the writer's and the lane's commits would then wait
/// for each other's. Pokes that come while one is being sent are sent as
/// one.
pub(super) struct Notifier {
    state: Arc<(std::sync::Mutex<Poked>, std::sync::Condvar)>,
    thread: Option<JoinHandle<()>>,
    /// Counted always (one atomic add per notification), read by tests.
    #[cfg_attr(not(test), allow(dead_code))]
    sent: Arc<std::sync::atomic::AtomicU64>,
}

#[derive(Default)]
struct Poked {
    pending: bool,
    stop: bool,
}

impl Notifier {
    /// Starts the notifying thread on `target` (it connects when first
    /// poked, and again after a lost connection).
    pub fn start(target: Target) -> StoreResult<Notifier> {
        let state = Arc::new((
            std::sync::Mutex::new(Poked::default()),
            std::sync::Condvar::new(),
        ));
        let sent = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (s, n) = (Arc::clone(&state), Arc::clone(&sent));
        let thread = std::thread::Builder::new()
            .name("store-notify".into())
            .spawn(move || tell(&target, &s, &n))
            .map_err(|e| StoreError::unavailable("start the store's notifier", e))?;
        Ok(Notifier {
            state,
            thread: Some(thread),
            sent,
        })
    }

    /// Something was committed: the listeners are told soon.
    pub fn poke(&self) {
        let (lock, cv) = &*self.state;
        lock.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pending = true;
        cv.notify_one();
    }

    /// Notifications sent so far (pokes coalesce).
    #[cfg(test)]
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::SeqCst)
    }
}

impl Drop for Notifier {
    fn drop(&mut self) {
        let (lock, cv) = &*self.state;
        lock.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .stop = true;
        cv.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The notifier's thread: waits for a poke, sends one notification for
/// every poke since, until stopped.
fn tell(
    target: &Target,
    state: &(std::sync::Mutex<Poked>, std::sync::Condvar),
    sent: &std::sync::atomic::AtomicU64,
) {
    let mut conn: Option<postgres::Client> = None;
    let mut warned = false;
    loop {
        {
            let (lock, cv) = state;
            let mut p = lock
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            while !p.pending && !p.stop {
                p = cv
                    .wait(p)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
            if p.stop {
                break;
            }
            p.pending = false;
        }
        if conn.as_ref().is_none_or(postgres::Client::is_closed) {
            conn = connect(target).ok();
        }
        let told = conn.as_mut().map(|c| {
            c.batch_execute(&format!("SELECT pg_notify('{CHANNEL}', '')"))
                .map_err(|e| detailed(&e))
        });
        match told {
            Some(Ok(())) => {
                sent.fetch_add(1, Ordering::SeqCst);
                warned = false;
            }
            failed => {
                // The followers poll meanwhile; the next poke tries again.
                if !warned {
                    let why = match failed {
                        Some(Err(e)) => e,
                        _ => "no connection".into(),
                    };
                    tracing::warn!(
                        "store: not telling the other replicas of commits ({why}); they poll until it is back"
                    );
                    warned = true;
                }
                conn = None;
            }
        }
    }
    if let Some(c) = conn {
        let _ = c.close();
    }
}
