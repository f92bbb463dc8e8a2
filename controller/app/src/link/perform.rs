//! The application's side of a link session: each [`Effect`] performed
//! against the store, each [`Note`] applied to the counters and watchers,
//! and what every way out of a stream must do.

use std::sync::Arc;

use super::{Done, Effect, End, Note};
use crate::app::{App, now};
use crate::events::{AgentEvent, AgentEventKind, Event};
use crate::hub::Conflict;
use baton_model::SeenRow;
use baton_store::StoreError;
use baton_store::StoreOps;

impl From<StoreError> for End {
    fn from(e: StoreError) -> End {
        match e {
            StoreError::Fenced { .. } => End::Fenced(e.to_string()),
            StoreError::IdInUse { .. } => End::Duplicate(e.to_string()),
            e => End::Unavailable(e.to_string()),
        }
    }
}

/// How a stream ended, as far as the application must know.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Closing {
    /// The agent is no longer connected through this stream: mark it so.
    Disconnected,
    /// Its record is gone (an admin forgot it), or a later stream owns it
    /// (fenced): nothing of it is this stream's to write.
    NotOurs,
}

impl App {
    /// Perform `effect` of `agent`'s session; its answer for
    /// [`super::Input::Done`], or why the stream must end.
    pub async fn perform(&self, agent: &str, effect: Effect) -> Result<Done, End> {
        let s = &self.store;
        Ok(match effect {
            Effect::Known => Done::Known {
                agent: s.agent(agent).await?.map(Box::new),
                rows: s.deliveries_of_agent(agent).await?,
            },
            Effect::Hello(row) => {
                let (agent, rows) = s.agent_hello(row).await?;
                let acked = s.feedback_acked(&agent.id, &agent.journal_id).await?;
                Done::Hello {
                    agent: Box::new(agent),
                    rows,
                    acked,
                }
            }
            Effect::Seen { session, at } => {
                let seen = SeenRow {
                    connected: true,
                    at,
                    lateness_p99: Some(self.lateness_p99(agent)),
                    health: Some(self.measured(agent).health(at)),
                };
                s.agent_seen(agent, session, seen).await?;
                Done::Written
            }
            Effect::Clock { session, row } => {
                s.record_clock(agent, session, row).await?;
                Done::Written
            }
            Effect::Trust { session, row } => {
                s.record_trust(agent, session, row).await?;
                Done::Written
            }
            Effect::Held { session, held, at } => {
                Done::Rows(s.agent_held(agent, session, held, at).await?)
            }
            Effect::Answer(row) => Done::Answer(self.answers.decide(&self.store, row).await?),
            Effect::Feedback {
                session,
                rows,
                publish,
            } => {
                // Watchers see only what is stored; the batch is copied for
                // them only when someone watches.
                let watched = (publish && self.watched()).then(|| rows.clone());
                let stored = s.put_feedback(session, rows).await?;
                for r in watched.into_iter().flatten() {
                    self.publish(Event::Feedback(Arc::new(r)));
                }
                Done::Feedback(stored)
            }
            Effect::Rows => Done::Rows(s.deliveries_of_agent(agent).await?),
            Effect::Agent => Done::Agent(s.agent(agent).await?.map(Box::new)),
            Effect::Pack { key, version } => Done::Pack(self.pack_text(&key, version).await?),
            Effect::Offer => Done::Offer(s.release_offer(agent).await?.map(Arc::new)),
            Effect::Piece {
                version,
                arch,
                index,
            } => Done::Piece(s.release_piece(&version, &arch, index).await?),
            Effect::Update { session, row } => {
                s.record_update(agent, session, row).await?;
                Done::Written
            }
        })
    }

    /// Apply `note` of `agent`'s session.
    pub fn note(&self, agent: &str, note: Note) {
        let m = &self.metrics;
        match note {
            Note::Event(e) => self.publish(e),
            Note::RowChanged(r) => self.row_changed(&r),
            Note::PushSent => m.push_sent(),
            Note::PushResult(r) => m.push_result(r),
            Note::Foreign(n) => m.foreign(n),
            Note::DroppedAtAgent(n) => m.dropped_at_agent(n),
            Note::FeedbackLost(n) => m.feedback_lost(n),
            Note::FeedbackStored(s) => m.feedback(s.inserted, s.duplicates),
            Note::Lateness(ns) => self.record_lateness(agent, ns.into_iter()),
            Note::Clock(c) => m.clock(agent, c),
            Note::Outbox { entries, at } => self.record_outbox(agent, entries, at),
            Note::Late => self.record_late(agent, now()),
        }
    }

    /// Every way out of an agent's stream of hub `generation` (session
    /// generation `session_gen`): unregistered; if no newer stream of the
    /// agent replaced it, what the controller held in memory for it goes
    /// and, unless `closing` says it is not this stream's, the agent is
    /// marked disconnected and watchers told `reason`.
    pub async fn stream_closed(
        &self,
        agent: &str,
        generation: u64,
        session_gen: u64,
        tenants: Arc<std::collections::BTreeSet<String>>,
        closing: Closing,
        reason: &str,
    ) {
        let still_current = self.hub.unregister(agent, generation);
        if !still_current {
            return;
        }
        self.agent_gone(agent);
        if closing == Closing::NotOurs {
            return;
        }
        let ours = match self
            .store
            .agent_seen(agent, session_gen, SeenRow::ended(now()))
            .await
        {
            Ok(()) => true,
            // Taken over (elsewhere) while this stream ended: the agent is
            // connected, to its new stream; watchers must not hear
            // otherwise.
            Err(StoreError::Fenced { .. }) => false,
            Err(e) => {
                tracing::error!(agent = %agent, "store: marking disconnected: {e}");
                true
            }
        };
        if ours {
            self.publish(Event::Agent(AgentEvent {
                agent_id: agent.to_string(),
                tenants,
                kind: AgentEventKind::Disconnected,
                clock: None,
                detail: reason.to_string(),
                at: now(),
            }));
        }
    }

    /// Another machine's stream holds `agent`'s id on this replica: the
    /// stream is counted, logged and shown as a conflict; the refusal's
    /// words for the agent.
    pub async fn duplicate_refused(&self, agent: &str, c: &Conflict) -> String {
        self.metrics.duplicate_stream();
        let msg = format!(
            "agent id {agent} is connected from another journal ({}): two machines under one identity; this stream (journal {}) is refused",
            c.holder_journal, c.refused_journal
        );
        tracing::warn!(agent = %agent, refused = c.refused, "{msg}");
        let tenants = self
            .store
            .agent(agent)
            .await
            .ok()
            .flatten()
            .map(|a| a.tenants)
            .unwrap_or_default();
        self.publish(Event::Agent(AgentEvent {
            agent_id: agent.to_string(),
            tenants: Arc::new(tenants),
            kind: AgentEventKind::Conflict,
            clock: None,
            detail: msg.clone(),
            at: now(),
        }));
        msg
    }
}
