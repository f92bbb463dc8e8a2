//! The single writer every SQL engine's store runs its commands on.
//!
//! * **One writer.** A dedicated OS thread owns the write connection.
//!   Callers send it closures over a *bounded* channel (a flood of writes
//!   pushes back on the senders instead of growing memory) and await a
//!   oneshot answer.
//! * **Group commit.** The writer takes everything queued (up to the
//!   engine's batch size) and runs it in one transaction, each command in
//!   its own savepoint: a command that fails or is refused leaves no trace
//!   and does not disturb its neighbours. Every caller is answered only
//!   after the `COMMIT` returned, so `Ok` means "committed"; a failed
//!   commit answers every caller of that batch with the error.
//! * **Background work rides along.** Work that may wait (retention)
//!   joins the next batch of other writes, or runs alone after
//!   [`BACKGROUND_WAIT`] without any: it never adds a commit of its own to
//!   a busy store.
//!
//! How a batch is run (its transaction, savepoints, locks) is the
//! engine's: a [`Batches`].

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::{StoreError, StoreResult};

/// Commands that may wait for the writer. Past this, senders wait
/// (back-pressure) rather than queue without bound.
const QUEUE_DEPTH: usize = 1024;

/// How long background work (retention) waits for other writes to share
/// a commit with before it runs alone.
pub const BACKGROUND_WAIT: Duration = Duration::from_millis(50);

/// Counts of committed work, for metrics and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// Transactions committed.
    pub batches: u64,
    /// Commands answered from committed transactions (refused ones
    /// included).
    pub commands: u64,
}

/// A write command, type-erased so one channel carries them all; `C` is
/// what it runs on.
pub(crate) trait Job<C: ?Sized>: Send {
    /// Runs inside the batch transaction; `Err` if it failed (its
    /// savepoint is then rolled back): `Err(true)` when the database
    /// aborted it for a conflicting transaction, and it may run again.
    fn run(&mut self, conn: &C) -> Result<(), bool>;
    /// Tells the caller: its own result if the batch committed, else the
    /// batch's error.
    fn answer(self: Box<Self>, batch: Result<(), &StoreError>);
}

/// A batch of jobs as the engine runs them.
pub(crate) type Batch<C> = Vec<Box<dyn Job<C>>>;

/// The engine's side of the writer: it owns the write connection.
pub(crate) trait Batches<C: ?Sized>: Send + 'static {
    /// Runs every job in one transaction, each in its own savepoint;
    /// `Ok` once committed, else why nothing of it was.
    fn run(&mut self, batch: &mut Batch<C>) -> StoreResult<()>;
    /// After a failed batch: whether the connection can go on (`false`
    /// stops the writer; every later write fails with `Closed`).
    fn recover(&mut self) -> bool;
    /// The writer stops: close the connection.
    fn close(self);
}

enum Msg<C: ?Sized> {
    Job(Box<dyn Job<C>>),
    /// Work that need not be fast (retention): it rides the next commit of
    /// other writes instead of costing a commit of its own.
    Background(Box<dyn Job<C>>),
    /// Stop after the commands queued before this one; answer when done.
    Close(oneshot::Sender<()>),
}

struct Call<T, F> {
    f: F,
    out: Option<StoreResult<T>>,
    reply: oneshot::Sender<StoreResult<T>>,
}

impl<C, T, F> Job<C> for Call<T, F>
where
    C: ?Sized,
    T: Send,
    F: FnMut(&C) -> StoreResult<T> + Send,
{
    fn run(&mut self, conn: &C) -> Result<(), bool> {
        let out = (self.f)(conn);
        let status = match &out {
            Ok(_) => Ok(()),
            Err(e) => Err(matches!(e, StoreError::Contended(_))),
        };
        self.out = Some(out);
        status
    }

    fn answer(self: Box<Self>, batch: Result<(), &StoreError>) {
        let Call { out, reply, .. } = *self;
        let out = match batch {
            Err(e) => Err(e.again()),
            Ok(()) => out.unwrap_or_else(|| {
                Err(StoreError::corrupt("the store writer", "a write never ran"))
            }),
        };
        // The caller may have stopped waiting; the write stands regardless.
        let _ = reply.send(out);
    }
}

#[derive(Debug, Default)]
struct Stats {
    batches: AtomicU64,
    commands: AtomicU64,
}

/// The writer's handle: dropping the last one stops and joins the thread.
pub(crate) struct Writer<C: ?Sized> {
    /// `None` only while dropping.
    tx: Option<mpsc::Sender<Msg<C>>>,
    thread: Option<JoinHandle<()>>,
    stats: Arc<Stats>,
}

impl<C: ?Sized + 'static> Writer<C> {
    /// Starts the writer thread `name` on `engine`, `max_batch` commands
    /// per transaction at most.
    pub fn start<B: Batches<C>>(name: &str, engine: B, max_batch: usize) -> StoreResult<Writer<C>> {
        let stats = Arc::new(Stats::default());
        let (tx, rx) = mpsc::channel(QUEUE_DEPTH);
        let thread_stats = Arc::clone(&stats);
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || writer_loop(engine, rx, &thread_stats, max_batch))
            .map_err(|e| StoreError::unavailable("start the store writer thread", e))?;
        Ok(Writer {
            tx: Some(tx),
            thread: Some(thread),
            stats,
        })
    }

    /// What the writer has committed so far.
    pub fn stats(&self) -> WriterStats {
        WriterStats {
            batches: self.stats.batches.load(Ordering::Relaxed),
            commands: self.stats.commands.load(Ordering::Relaxed),
        }
    }

    /// Stops the writer once everything queued before this call is
    /// committed; later writes fail with [`StoreError::Closed`].
    pub async fn close(&self) {
        let Some(tx) = self.tx.as_ref() else {
            return;
        };
        let (reply, done) = oneshot::channel();
        if tx.send(Msg::Close(reply)).await.is_ok() {
            // An error here means the writer stopped anyway.
            let _ = done.await;
        }
    }

    /// Runs `f` inside the next batch's transaction; its result once that
    /// transaction is committed.
    pub async fn write<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnMut(&C) -> StoreResult<T> + Send + 'static,
    {
        self.submit(Msg::Job, f).await
    }

    /// [`Writer::write`] for work that may wait (see the module doc).
    pub async fn write_background<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnMut(&C) -> StoreResult<T> + Send + 'static,
    {
        self.submit(Msg::Background, f).await
    }

    /// Queues `f` for the writer as `kind` and waits for its answer.
    async fn submit<T, F>(&self, kind: fn(Box<dyn Job<C>>) -> Msg<C>, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnMut(&C) -> StoreResult<T> + Send + 'static,
    {
        let tx = self.tx.as_ref().ok_or(StoreError::Closed)?;
        let (reply, answer) = oneshot::channel();
        let job = Box::new(Call {
            f,
            out: None,
            reply,
        });
        tx.send(kind(job)).await.map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// Commands waiting for the writer (tests drive batching with it).
    #[cfg(test)]
    pub fn queued(&self) -> usize {
        self.tx
            .as_ref()
            .map_or(0, |tx| tx.max_capacity() - tx.capacity())
    }
}

impl<C: ?Sized> Drop for Writer<C> {
    fn drop(&mut self) {
        // Closing the channel lets the writer drain what is queued and
        // return.
        self.tx = None;
        if let Some(thread) = self.thread.take() {
            // A write closure that owned the last handle would drop it on
            // the writer itself; joining oneself would never return.
            if thread.thread().id() == std::thread::current().id() {
                return;
            }
            if thread.join().is_err() {
                tracing::error!("store writer thread panicked");
            }
        }
    }
}

fn writer_loop<C: ?Sized, B: Batches<C>>(
    mut engine: B,
    mut rx: mpsc::Receiver<Msg<C>>,
    stats: &Stats,
    max_batch: usize,
) {
    let mut msgs: Vec<Msg<C>> = Vec::with_capacity(max_batch);
    let mut batch: Batch<C> = Vec::with_capacity(max_batch);
    let mut parked: VecDeque<Box<dyn Job<C>>> = VecDeque::new();
    let mut closing: Option<oneshot::Sender<()>> = None;
    let mut alive = true;
    while alive && closing.is_none() {
        let waited = !parked.is_empty();
        let got = if parked.is_empty() {
            rx.blocking_recv_many(&mut msgs, max_batch)
        } else {
            recv_within(&mut rx, &mut msgs, BACKGROUND_WAIT, max_batch)
        };
        if got == 0 && parked.is_empty() {
            break; // every handle is gone and the queue is empty
        }
        // Nothing else came within the wait: a background command runs
        // alone.
        let alone = waited && got == 0;
        for msg in msgs.drain(..) {
            match msg {
                Msg::Job(job) if closing.is_none() => batch.push(job),
                Msg::Background(job) if closing.is_none() => parked.push_back(job),
                // Queued after a close: dropped, its caller gets `Closed`.
                Msg::Job(_) | Msg::Background(_) => {}
                Msg::Close(reply) => closing = closing.or(Some(reply)),
            }
        }
        // One background command rides each commit of other writes, or
        // runs alone once nothing else came within the wait.
        if (!batch.is_empty() || alone)
            && let Some(job) = parked.pop_front()
        {
            batch.push(job);
        }
        if !batch.is_empty() {
            alive = run_batch(&mut engine, &mut batch, stats);
        }
    }
    // Refuse what is still queued (its callers see `Closed`) and anything
    // sent later.
    drop(parked);
    drop(rx);
    engine.close();
    if let Some(reply) = closing {
        let _ = reply.send(());
    }
}

/// Like `blocking_recv_many`, but gives up after `wait` (0: nothing came,
/// or every sender is gone). Polls: it runs only while background work
/// waits for company, never on an idle store.
fn recv_within<C: ?Sized>(
    rx: &mut mpsc::Receiver<Msg<C>>,
    msgs: &mut Vec<Msg<C>>,
    wait: Duration,
    max_batch: usize,
) -> usize {
    let deadline = std::time::Instant::now() + wait;
    loop {
        match rx.try_recv() {
            Ok(m) => {
                msgs.push(m);
                while msgs.len() < max_batch {
                    match rx.try_recv() {
                        Ok(m) => msgs.push(m),
                        Err(_) => break,
                    }
                }
                return msgs.len();
            }
            Err(mpsc::error::TryRecvError::Disconnected) => return 0,
            Err(mpsc::error::TryRecvError::Empty) => {
                if std::time::Instant::now() >= deadline {
                    return 0;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }
}

/// Commits one batch and answers its callers. Returns whether the writer
/// can go on.
fn run_batch<C: ?Sized, B: Batches<C>>(
    engine: &mut B,
    batch: &mut Batch<C>,
    stats: &Stats,
) -> bool {
    let outcome = engine.run(batch);
    let mut alive = true;
    match &outcome {
        Ok(()) => {
            stats.batches.fetch_add(1, Ordering::Relaxed);
            stats
                .commands
                .fetch_add(batch.len() as u64, Ordering::Relaxed);
        }
        Err(e) => {
            tracing::error!(error = %e, commands = batch.len(), "store: write batch failed");
            alive = engine.recover();
        }
    }
    let shared = outcome.as_ref().map(|_| ());
    for job in batch.drain(..) {
        job.answer(shared);
    }
    alive
}
