//! Agents' answers decided in batches: every answer waiting when the
//! previous batch is done goes into the next, one store transaction for
//! all of them ([`StoreOps::answers`]), so a push to thousands of agents
//! costs a few transactions of acks, not one each.
//!
//! No task of its own: the caller that finds no batch running runs one
//! with what is queued (its own answer among them), on a spawned task
//! that holds the turn until it is done, so a caller that goes away
//! (its stream ended) cancels no one else's answer.

use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;

use baton_model::{AnswerRow, DeliveryRow};
use baton_store::{Store, StoreError, StoreOps, StoreResult};

/// Answers per transaction at most.
pub const MAX_BATCH: usize = 256;

type Reply = oneshot::Sender<StoreResult<Option<DeliveryRow>>>;

/// The queue of answers and whose turn it is.
#[derive(Debug, Default)]
pub(crate) struct Answers {
    queue: Mutex<Vec<(AnswerRow, Reply)>>,
    turn: Arc<tokio::sync::Mutex<()>>,
}

impl Answers {
    /// `answer` decided (with whatever else is waiting): its row as it is
    /// now, as [`StoreOps::answer`] says.
    pub(crate) async fn decide(
        &self,
        store: &Arc<dyn Store>,
        answer: AnswerRow,
    ) -> StoreResult<Option<DeliveryRow>> {
        let (reply, mine) = oneshot::channel();
        self.queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((answer, reply));
        let turn = Arc::clone(&self.turn).lock_owned().await;
        let queued =
            std::mem::take(&mut *self.queue.lock().unwrap_or_else(PoisonError::into_inner));
        if !queued.is_empty() {
            let store = Arc::clone(store);
            tokio::spawn(async move {
                let _turn = turn;
                let mut queued = queued;
                while !queued.is_empty() {
                    let rest = queued.split_off(queued.len().min(MAX_BATCH));
                    let (rows, replies): (Vec<_>, Vec<_>) = queued.into_iter().unzip();
                    match store.answers(rows).await {
                        Ok(each) => {
                            for (reply, r) in replies.into_iter().zip(each) {
                                let _ = reply.send(r);
                            }
                        }
                        Err(e) => {
                            for reply in replies {
                                let _ = reply.send(Err(e.again()));
                            }
                        }
                    }
                    queued = rest;
                }
            });
        }
        // Else an earlier turn took it: its answer comes from there.
        mine.await.map_err(|_| StoreError::Closed)?
    }
}
