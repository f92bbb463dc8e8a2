//! What the agent should hold, sent: pushes, stagings, switches and
//! cancels as the planner asks for each row, paced, with retries for
//! refusals that are only for now, and the agent's answers stored.

use std::sync::Arc;
use std::time::Duration;

use baton_proto::wire::{self, controller_message::Body as Out};
use tokio::time::Instant;

use super::{End, Session, max_uncertainty_ns};
use crate::app::metrics::PushResult;
use crate::app::now_ns;
use crate::model::RefTime;
use crate::model::{Answer, PackKey, Refusal};
use crate::planner::{self, Action};
use crate::server::convert;
use crate::store::AnswerRow;

/// A push without an answer this long is sent again at the next resync.
const UNANSWERED: Duration = Duration::from_secs(60);
/// Retry of a push the agent refused for now (at capacity, clock, disk).
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(60);

/// A push sent and not yet answered, or waiting to be retried.
#[derive(Debug)]
pub(super) struct InFlight {
    /// What was sent (its version, staged or not, the instant).
    action: Action,
    sent: Instant,
    retries: u32,
    retry_at: Option<Instant>,
}

impl Session {
    pub(super) async fn act_all(&mut self) -> Result<(), End> {
        let keys: Vec<PackKey> = self.rows.keys().cloned().collect();
        for k in keys {
            self.act(&k).await?;
        }
        Ok(())
    }

    /// What the row asks of the agent, unless it was just done.
    pub(super) async fn act(&mut self, key: &PackKey) -> Result<(), End> {
        let Some(row) = self.rows.get(key) else {
            return Ok(());
        };
        match planner::action(row) {
            Some(a @ (Action::Push(_) | Action::Stage(_) | Action::Switch(..))) => {
                let recent = self.in_flight.get(key).is_some_and(|f| {
                    f.action == a && (f.retry_at.is_some() || f.sent.elapsed() < UNANSWERED)
                });
                if !recent {
                    self.push(key, a, 0).await?;
                }
                Ok(())
            }
            Some(Action::Cancel(version)) => {
                self.in_flight.remove(key);
                self.send(Out::PackCancel(wire::PackCancel {
                    pack: Some(convert::wire_ref(&key.tenant, &key.pack, version)),
                    session_gen: self.agent.session_gen,
                }))
                .await
            }
            None => {
                if self
                    .in_flight
                    .get(key)
                    .is_some_and(|f| f.retry_at.is_none())
                {
                    self.in_flight.remove(key);
                }
                Ok(())
            }
        }
    }

    /// Send a pack version (to run, to stage, or to switch to at an
    /// instant), paced by the controller-wide token bucket.
    async fn push(&mut self, key: &PackKey, action: Action, retries: u32) -> Result<(), End> {
        let (version, staged, activate_at_ns) = match action {
            Action::Push(v) => (v, false, 0),
            Action::Stage(v) => (v, true, 0),
            Action::Switch(v, t) => (v, true, t.as_nanos()),
            // Not a push.
            Action::Cancel(_) => return Ok(()),
        };
        let text = match self.texts.get(key).filter(|t| t.version == version) {
            Some(t) => t.clone(),
            None => match self.app.store.pack_version(key, Some(version)).await? {
                Some(t) => {
                    let t = Arc::new(t);
                    self.texts.insert(key.clone(), t.clone());
                    t
                }
                // Gone from the store (a withdrawn pack it lost): nothing
                // to send.
                None => return Ok(()),
            },
        };
        self.app.pace().await;
        self.app.metrics.push_sent();
        self.send(Out::PackPush(wire::PackPush {
            pack: Some(convert::wire_ref(&key.tenant, &key.pack, version)),
            yaml: text.yaml.clone(),
            session_gen: self.agent.session_gen,
            staged,
            activate_at_ns,
            // The pack's bound, checked again by the agent at the switch
            // (the controller names no instant to an agent whose last
            // report was less certain, but that report is seconds old).
            max_uncertainty_ns: if staged {
                max_uncertainty_ns(&text.yaml)
            } else {
                0
            },
        }))
        .await?;
        self.in_flight.insert(
            key.clone(),
            InFlight {
                action,
                sent: Instant::now(),
                retries,
                retry_at: None,
            },
        );
        Ok(())
    }

    pub(super) async fn retry_due(&mut self, now: Instant) -> Result<(), End> {
        let due: Vec<(PackKey, Action, u32)> = self
            .in_flight
            .iter()
            .filter(|(_, f)| f.retry_at.is_some_and(|t| t <= now))
            .map(|(k, f)| (k.clone(), f.action, f.retries))
            .collect();
        for (key, action, retries) in due {
            self.in_flight.remove(&key);
            let still = self
                .rows
                .get(&key)
                .is_some_and(|r| planner::action(r) == Some(action));
            if still {
                self.push(&key, action, retries).await?;
            }
        }
        Ok(())
    }

    /// The agent answered a push: the store re-plans the row.
    pub(super) async fn answered(
        &mut self,
        key: PackKey,
        version: u64,
        answer: Answer,
    ) -> Result<(), End> {
        let attempts = self.in_flight.get(&key).map_or(1, |f| f.retries + 1);
        let row = self
            .app
            .store
            .answer(AnswerRow {
                agent_id: self.agent.id.clone(),
                key: key.clone(),
                version,
                answer,
                session_gen: self.agent.session_gen,
                attempts,
                at: RefTime::from_nanos(now_ns()),
            })
            .await?;
        if let Some(r) = row {
            let changed = self.rows.get(&key) != Some(&r);
            self.rows.insert(key.clone(), r.clone());
            if changed {
                self.app.row_changed(&r);
            }
        }
        Ok(())
    }

    pub(super) async fn on_nack(&mut self, n: wire::PackNack) -> Result<(), End> {
        let (tenant, pack, version) = convert::pack_ref(n.pack.as_ref())?;
        let key = PackKey::new(tenant, pack);
        if !self.rows.contains_key(&key) {
            self.drop_foreign(1, "nack");
            return Ok(());
        }
        let errors = convert::nack_errors(&n.errors);
        let reason = wire::NackReason::try_from(n.reason).unwrap_or(wire::NackReason::Unspecified);
        let message = if n.message.is_empty() {
            reason.as_str_name().to_string()
        } else {
            n.message.chars().take(1000).collect()
        };
        let retryable = matches!(
            reason,
            wire::NackReason::ResourceExhausted
                | wire::NackReason::Clock
                | wire::NackReason::Unavailable
        );
        self.app.metrics.push_result(if retryable {
            PushResult::Retry
        } else {
            PushResult::Nacked
        });
        let pack_name = format!("{key} v{version}");
        if retryable {
            // Kept pending with the reason; pushed again with backoff.
            let retries = self.in_flight.get(&key).map_or(0, |f| f.retries) + 1;
            let wait = RETRY_FIRST
                .saturating_mul(1 << retries.min(6))
                .min(RETRY_MAX);
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
                .unwrap_or(Action::Push(version));
            self.in_flight.insert(
                key.clone(),
                InFlight {
                    action,
                    sent: Instant::now(),
                    retries,
                    retry_at: Some(Instant::now() + wait),
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
        self.answered(key.clone(), version, Answer::Refused(refusal))
            .await?;
        if !retryable {
            self.in_flight.remove(&key);
        }
        Ok(())
    }
}
