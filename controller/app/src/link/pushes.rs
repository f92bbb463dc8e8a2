//! What the agent should hold, sent: pushes, stagings, switches and
//! cancels as the planner asks for each row, with retries for refusals
//! that are only for now, and the agent's answers stored.

use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_proto::wire;

use super::{Effect, Note, Now, Session, ToAgent, Wait};
use crate::metrics::PushResult;
use crate::texts::PackText;
use baton_model::planner::{self, Action as Planned};
use baton_model::{Answer, ErrorRow, PackKey, RefTime, Refusal, SignedDuration};
use baton_store::AnswerRow;

/// A push without an answer this long is sent again at the next resync.
pub const UNANSWERED: Duration = Duration::from_secs(60);
/// First retry of a push the agent refused for now (at capacity, clock,
/// disk); doubling up to [`RETRY_MAX`].
pub const RETRY_FIRST: Duration = Duration::from_secs(1);
/// Longest wait between retries of a refusal for now.
pub const RETRY_MAX: Duration = Duration::from_secs(60);

/// A push sent and not yet answered, or waiting to be retried.
#[derive(Debug)]
pub(super) struct InFlight {
    /// What was sent (its version, staged or not, the instant).
    pub(super) action: Planned,
    pub(super) sent: Instant,
    pub(super) retries: u32,
    pub(super) retry_at: Option<Instant>,
}

/// Work queued behind an effect, done in order.
#[derive(Debug)]
pub(super) enum Work {
    /// Do what the row of this pack asks.
    Act(PackKey),
    /// Send this version (a push, a staging, a switch).
    Push {
        key: PackKey,
        action: Planned,
        retries: u32,
    },
    /// Mark the agent seen.
    Seen,
    /// Store the agent's trust report held back by the rate.
    Trust,
    /// Send again what was refused for now and is due.
    RetriesDue,
    /// Read every row again, and act on them.
    Resync,
    /// Acknowledge feedback up to this seq (stored).
    Ack(u64),
    /// Read the release the agent is to be offered, and offer it.
    Offer,
    /// Serve the release request that waited for the pace, if any.
    ReleaseDue,
    /// Store what the agent says of an update.
    Update(baton_model::UpdateRow),
}

impl Session {
    /// Every row acted on, before anything queued.
    pub(super) fn act_all(&mut self) {
        for key in self.rows.keys().rev() {
            self.work.push_front(Work::Act(key.clone()));
        }
    }

    /// What the row asks of the agent, unless it was just done.
    pub(super) fn act(&mut self, now: Now, key: &PackKey) {
        let Some(row) = self.rows.get(key) else {
            return;
        };
        match planner::action(row) {
            Some(a @ (Planned::Push(_) | Planned::Stage(_) | Planned::Switch(..))) => {
                let recent = self.in_flight.get(key).is_some_and(|f| {
                    f.action == a
                        && (f.retry_at.is_some()
                            || now.mono.saturating_duration_since(f.sent) < UNANSWERED)
                });
                if !recent {
                    self.push(
                        now,
                        Work::Push {
                            key: key.clone(),
                            action: a,
                            retries: 0,
                        },
                    );
                }
            }
            Some(Planned::Cancel(version)) => {
                self.in_flight.remove(key);
                let session_gen = self.agent.session_gen;
                self.send(ToAgent::Cancel {
                    key: key.clone(),
                    version,
                    session_gen,
                });
            }
            None => {
                if self
                    .in_flight
                    .get(key)
                    .is_some_and(|f| f.retry_at.is_none())
                {
                    self.in_flight.remove(key);
                }
            }
        }
    }

    /// Send a pack version (`work` is a [`Work::Push`]), its text read
    /// first when the session does not have it.
    pub(super) fn push(&mut self, now: Now, work: Work) {
        let Work::Push { key, action, .. } = &work else {
            return;
        };
        let Some(version) = pushed_version(*action) else {
            return;
        };
        match self.texts.get(key).filter(|t| t.row.version == version) {
            Some(t) => {
                let t = t.clone();
                self.send_push(now, work, t);
            }
            None => {
                let e = Effect::Pack {
                    key: key.clone(),
                    version,
                };
                self.effect(e, Wait::Text(work));
            }
        }
    }

    /// A pack text read for `work`: sent, or nothing when the store no
    /// longer has it (a withdrawn pack it lost).
    pub(super) fn text_read(&mut self, now: Now, work: Work, text: Option<Arc<PackText>>) {
        let (Work::Push { key, .. }, Some(t)) = (&work, text) else {
            return;
        };
        self.texts.insert(key.clone(), t.clone());
        self.send_push(now, work, t);
    }

    fn send_push(&mut self, now: Now, work: Work, pack: Arc<PackText>) {
        let Work::Push {
            key,
            action,
            retries,
        } = work
        else {
            return;
        };
        let (staged, activate_at) = match action {
            Planned::Push(_) => (false, None),
            Planned::Stage(_) => (true, None),
            Planned::Switch(_, t) => (true, Some(t)),
            Planned::Cancel(_) => return,
        };
        // The pack's bound, checked again by the agent at the switch (the
        // controller names no instant to an agent whose last report was
        // less certain, but that report is seconds old).
        let max_uncertainty = if staged {
            pack.max_uncertainty()
        } else {
            SignedDuration::ZERO
        };
        self.note(Note::PushSent);
        let session_gen = self.agent.session_gen;
        self.send(ToAgent::Push {
            pack,
            session_gen,
            staged,
            activate_at,
            max_uncertainty,
        });
        self.in_flight.insert(
            key,
            InFlight {
                action,
                sent: now.mono,
                retries,
                retry_at: None,
            },
        );
    }

    /// Refusals for now whose retry is due, sent again (before anything
    /// queued) if the row still asks for the same.
    pub(super) fn retries_due(&mut self, now: Now) {
        let mut due: Vec<(PackKey, Planned, u32)> = self
            .in_flight
            .iter()
            .filter(|(_, f)| f.retry_at.is_some_and(|t| t <= now.mono))
            .map(|(k, f)| (k.clone(), f.action, f.retries))
            .collect();
        due.sort_by(|a, b| a.0.cmp(&b.0));
        for (key, action, retries) in due.into_iter().rev() {
            self.in_flight.remove(&key);
            let still = self
                .rows
                .get(&key)
                .is_some_and(|r| planner::action(r) == Some(action));
            if still {
                self.work.push_front(Work::Push {
                    key,
                    action,
                    retries,
                });
            }
        }
    }

    /// The agent acknowledged a push: its answer stored, the push no
    /// longer in flight.
    pub(super) fn on_ack(
        &mut self,
        now: Now,
        key: PackKey,
        version: u64,
        staged: Option<RefTime>,
        unchanged: bool,
    ) {
        if !self.rows.contains_key(&key) {
            self.drop_foreign(1, "ack");
            return;
        }
        self.note(Note::PushResult(if unchanged {
            PushResult::Unchanged
        } else {
            PushResult::Acked
        }));
        let answer = match staged {
            Some(at) => Answer::Staged(at),
            None => Answer::Acked,
        };
        self.answered(now, key, version, answer, true);
    }

    /// The agent refused a push: for now (kept pending with the reason,
    /// pushed again with backoff) or for good.
    pub(super) fn on_nack(
        &mut self,
        now: Now,
        key: PackKey,
        version: u64,
        reason: wire::NackReason,
        message: String,
        errors: Vec<ErrorRow>,
    ) {
        if !self.rows.contains_key(&key) {
            self.drop_foreign(1, "nack");
            return;
        }
        let message = if message.is_empty() {
            reason.as_str_name().to_string()
        } else {
            message.chars().take(1000).collect()
        };
        let retryable = matches!(
            reason,
            wire::NackReason::ResourceExhausted
                | wire::NackReason::Clock
                | wire::NackReason::Unavailable
        );
        self.note(Note::PushResult(if retryable {
            PushResult::Retry
        } else {
            PushResult::Nacked
        }));
        let pack_name = format!("{key} v{version}");
        if retryable {
            let retries = self.in_flight.get(&key).map_or(0, |f| f.retries) + 1;
            let wait = retry_wait(retries);
            // The first refusal is news; the retries that follow (every
            // RETRY_MAX at most, for as long as the agent refuses) are not
            // worth a periodic line at info.
            if retries == 1 {
                tracing::info!(agent = %self.agent.id, pack = %pack_name, "agent refused for now ({message}); retry in {wait:?}");
            } else {
                tracing::debug!(agent = %self.agent.id, pack = %pack_name, retries, "agent refused for now ({message}); retry in {wait:?}");
            }
            // Retried as the row asks now (a push, a staging, a switch).
            let action = self
                .rows
                .get(&key)
                .and_then(planner::action)
                .filter(|a| a.version() == version)
                .unwrap_or(Planned::Push(version));
            self.in_flight.insert(
                key.clone(),
                InFlight {
                    action,
                    sent: now.mono,
                    retries,
                    retry_at: Some(now.mono + wait),
                },
            );
        } else {
            tracing::warn!(agent = %self.agent.id, pack = %pack_name, "agent refused the pack: {message}");
        }
        let refusal = Refusal {
            version,
            last: !retryable,
            message,
            errors,
        };
        self.answered(now, key, version, Answer::Refused(refusal), !retryable);
    }

    /// Store the agent's answer (the store re-plans the row); `clear`:
    /// the push is no longer in flight once stored.
    fn answered(&mut self, now: Now, key: PackKey, version: u64, answer: Answer, clear: bool) {
        let attempts = self.in_flight.get(&key).map_or(1, |f| f.retries + 1);
        let row = AnswerRow {
            agent_id: self.agent.id.clone(),
            key: key.clone(),
            version,
            answer,
            attempts,
            session_gen: self.agent.session_gen,
            at: now.wall,
        };
        self.effect(Effect::Answer(row), Wait::Answered { key, clear });
    }
}

/// How long after its `retries`-th refusal for now a push is sent again.
pub(super) fn retry_wait(retries: u32) -> Duration {
    RETRY_FIRST
        .saturating_mul(1 << retries.min(6))
        .min(RETRY_MAX)
}

/// The version a planned action sends (`None`: a cancel).
fn pushed_version(a: Planned) -> Option<u64> {
    match a {
        Planned::Push(v) | Planned::Stage(v) | Planned::Switch(v, _) => Some(v),
        Planned::Cancel(_) => None,
    }
}
