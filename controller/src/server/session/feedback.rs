//! Feedback intake: a batch converted, checked for order, sorted into
//! what to store, stored, published, and acknowledged cumulatively.

use std::sync::Arc;

use baton_proto::wire::{self, controller_message::Body as Out};

use super::{End, Session};
use crate::app::events::{AgentEventKind, Event};
use crate::app::now_ns;
use crate::model::SpanNanos;
use crate::model::{FeedbackRow, PackKey};
use crate::server::convert;

/// One feedback batch, sorted by [`Session::sort_feedback`].
struct Sorted {
    /// New entries of the agent's own packs, to store.
    rows: Vec<FeedbackRow>,
    /// Entries already stored that come back with a count of drops.
    carriers: Vec<FeedbackRow>,
    /// The highest seq of the batch (the ack to send).
    prev: u64,
    /// The first seq not stored before, if any.
    first_new: Option<u64>,
    /// New entries for packs not the agent's (acknowledged, not stored).
    foreign: u64,
    /// Entries the agent says it dropped before these.
    dropped_at_agent: u64,
}

impl Session {
    /// Whether a feedback entry is the agent's to send: a pack of a tenant
    /// it serves, delivered to it or declared by it (held).
    fn owns(&self, tenant: &str, pack: &str) -> bool {
        // Rows exist only for packs delivered to the agent or declared by
        // it for a tenant it serves (see `own_held`).
        self.rows
            .contains_key(&PackKey::new(tenant.to_string(), pack.to_string()))
    }

    pub(super) async fn on_feedback(&mut self, batch: wire::FeedbackBatch) -> Result<(), End> {
        if batch.entries.is_empty() {
            return Ok(());
        }
        let now = now_ns();
        // Few batches converted at once across the controller's busiest
        // moments is what memory can take: the permit bounds how many
        // streams hold converted rows at once (the rest wait with their
        // bytes in HTTP/2's flow control, compact), and is kept until the
        // rows are stored.
        let app = self.app.clone();
        let _permit = app.ingest_permit().await;
        let Sorted {
            rows,
            carriers,
            prev,
            first_new,
            foreign,
            dropped_at_agent,
        } = self.sort_feedback(batch.entries, now)?;
        self.drop_foreign(foreign, "feedback");
        if dropped_at_agent > 0 {
            self.app.metrics.dropped_at_agent(dropped_at_agent);
        }
        if let (Some((acked, first)), Some(first_new)) = (self.gap.take(), first_new) {
            self.account_gap(acked, first.min(first_new), &rows);
        }
        let high = prev;
        if !rows.is_empty() {
            self.app.record_lateness(
                &self.agent.id,
                rows.iter()
                    .filter(|r| r.event == "executed")
                    .map(|r| r.lateness.nanos()),
            );
            // Watchers see only what is stored; the batch is copied for
            // them only when someone watches.
            let watched = self.app.watched().then(|| rows.clone());
            let stored = self
                .app
                .store
                .put_feedback(self.agent.session_gen, rows)
                .await?;
            self.app
                .metrics
                .feedback(stored.inserted, stored.duplicates);
            if stored.duplicates > 0 {
                tracing::debug!(agent = %self.agent.id, duplicates = stored.duplicates, "feedback re-sent");
            }
            for r in watched.into_iter().flatten() {
                self.app.publish(Event::Feedback(Arc::new(r)));
            }
        }
        if !carriers.is_empty() {
            self.app
                .store
                .put_feedback(self.agent.session_gen, carriers)
                .await?;
        }
        self.last_seq = high;
        self.send(Out::FeedbackAck(wire::FeedbackAck { seq: high }))
            .await
    }

    /// A batch's entries converted and sorted: the new ones to store,
    /// the re-sent ones that carry a count of drops, and what the rest
    /// adds up to. An out-of-order seq ends the stream.
    fn sort_feedback(&self, entries: Vec<wire::Feedback>, now: i64) -> Result<Sorted, End> {
        let mut rows = Vec::with_capacity(entries.len());
        let mut prev = self.last_seq;
        let mut first_new = None;
        let mut foreign = 0;
        let mut dropped_at_agent = 0;
        let mut carriers = Vec::new();
        for e in entries {
            let mut row = convert::feedback_owned(&self.agent.id, &self.agent.journal_id, e, now)?;
            if row.seq <= prev {
                // A re-send of what is stored is fine only as a prefix of
                // the stream (before anything new); within the new part
                // every seq must grow.
                if first_new.is_some() {
                    return Err(End::Bad(format!(
                        "feedback seq {} after {prev}: out of order",
                        row.seq
                    )));
                }
                // A stored entry may come back carrying a count of drops
                // made since it was first sent: the store keeps the count.
                if row.dropped_before > 0 && self.owns(&row.tenant, &row.pack) {
                    carriers.push(row);
                }
                continue;
            }
            first_new.get_or_insert(row.seq);
            // An agent counts drops it cannot see the fate of: an entry it
            // had sent, and then dropped at its cap before the ack came
            // back, was stored here all the same, and its count rides on a
            // later entry again. What is missing is what the stream skipped
            // right before this entry: a count is never more than that.
            let skipped = row.seq - prev - 1;
            if row.dropped_before > skipped {
                tracing::debug!(
                    agent = %self.agent.id,
                    seq = row.seq,
                    claimed = row.dropped_before,
                    skipped,
                    "feedback: drops claimed beyond the entries skipped (already stored); counted as skipped"
                );
                row.dropped_before = skipped;
            }
            prev = row.seq;
            if !self.owns(&row.tenant, &row.pack) {
                // Not stored; still acknowledged (the agent must not keep
                // re-sending it).
                foreign += 1;
                continue;
            }
            if row.dropped_before > 0 {
                dropped_at_agent += row.dropped_before;
                tracing::warn!(
                    agent = %self.agent.id,
                    "{} feedback entries dropped at the agent (outbox full) before seq {}",
                    row.dropped_before,
                    row.seq
                );
            }
            rows.push(row);
        }
        Ok(Sorted {
            rows,
            carriers,
            prev,
            first_new,
            foreign,
            dropped_at_agent,
        })
    }

    /// Entries between what the store acknowledged and the agent's first
    /// held one are either dropped by the agent (the first entry's
    /// `dropped_before` counts them) or were acknowledged by a store that
    /// was since rolled back: those are lost, and said so.
    fn account_gap(&self, acked: u64, first: u64, rows: &[crate::model::FeedbackRow]) {
        let missing = first.saturating_sub(acked + 1);
        let dropped = rows
            .first()
            .filter(|r| r.seq == first)
            .map_or(0, |r| r.dropped_before);
        let lost = missing.saturating_sub(dropped);
        if lost == 0 {
            return;
        }
        let msg = format!(
            "feedback seq {}..={} of journal {} was acknowledged by a store since rolled back (restored from an older copy): {lost} entries lost",
            acked + 1,
            first - 1,
            self.agent.journal_id
        );
        tracing::warn!(agent = %self.agent.id, "{msg}");
        self.app.metrics.feedback_lost(lost);
        self.agent_event(AgentEventKind::Conflict, None, msg);
    }
}
