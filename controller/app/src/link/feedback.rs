//! Feedback intake: a batch checked for order, sorted into what to store,
//! stored, and acknowledged cumulatively once stored.

use super::{Effect, Note, Now, Session, Wait, pushes::Work};
use crate::events::AgentEventKind;
use baton_model::{FeedbackRow, FeedbackStored, PackKey, SpanNanos};

/// What follows the store's answer for a batch.
#[derive(Debug)]
pub(super) struct Pending {
    /// The highest seq of the batch: the ack to send once all is stored.
    high: u64,
    /// Re-sent entries carrying a count of drops, stored next.
    carriers: Vec<FeedbackRow>,
    /// Whether the answer is the new entries' (counted) or the carriers'.
    new_rows: bool,
}

/// One feedback batch, sorted by [`Session::sort_feedback`].
struct Sorted {
    /// New entries of the agent's own packs, to store.
    rows: Vec<FeedbackRow>,
    /// Entries already stored that come back with a count of drops.
    carriers: Vec<FeedbackRow>,
    /// The highest seq of the batch (the ack to send).
    high: u64,
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

    /// A batch of the agent's outbox, in the order it sent it.
    pub(super) fn on_feedback(&mut self, now: Now, entries: Vec<FeedbackRow>) {
        if entries.is_empty() {
            return;
        }
        let Sorted {
            rows,
            carriers,
            high,
            first_new,
            foreign,
            dropped_at_agent,
        } = match self.sort_feedback(entries) {
            Ok(s) => s,
            Err(e) => return self.end(e),
        };
        self.drop_foreign(foreign, "feedback");
        if dropped_at_agent > 0 {
            self.note(Note::DroppedAtAgent(dropped_at_agent));
        }
        // The gap is settled by the first batch, new entries or not.
        if let (Some((acked, first)), Some(first_new)) = (self.gap.take(), first_new) {
            self.account_gap(now, acked, first.min(first_new), &rows);
        }
        if rows.is_empty() {
            self.store_carriers(high, carriers);
            return;
        }
        let lateness: Vec<i64> = rows
            .iter()
            .filter(|r| r.event == "executed")
            .map(|r| r.lateness.nanos())
            .collect();
        self.note(Note::Lateness(lateness));
        if rows
            .iter()
            .any(|r| r.reason == baton_proto::wire::Reason::Late)
        {
            self.note(Note::Late);
        }
        let session = self.agent.session_gen;
        self.effect(
            Effect::Feedback {
                session,
                rows,
                publish: true,
            },
            Wait::Feedback(Pending {
                high,
                carriers,
                new_rows: true,
            }),
        );
    }

    /// A batch (or its carriers) stored.
    pub(super) fn feedback_stored(&mut self, p: Pending, stored: FeedbackStored) {
        if p.new_rows {
            if stored.duplicates > 0 {
                tracing::debug!(agent = %self.agent.id, duplicates = stored.duplicates, "feedback re-sent");
            }
            self.note(Note::FeedbackStored(stored));
        }
        self.store_carriers(p.high, p.carriers);
    }

    /// The re-sent entries that carry a count of drops stored (if any),
    /// then the batch acknowledged.
    fn store_carriers(&mut self, high: u64, carriers: Vec<FeedbackRow>) {
        if carriers.is_empty() {
            self.work.push_front(Work::Ack(high));
            return;
        }
        let session = self.agent.session_gen;
        self.effect(
            Effect::Feedback {
                session,
                rows: carriers,
                publish: false,
            },
            Wait::Feedback(Pending {
                high,
                carriers: Vec::new(),
                new_rows: false,
            }),
        );
    }

    /// A batch's entries sorted: the new ones to store, the re-sent ones
    /// that carry a count of drops, and what the rest adds up to. An
    /// out-of-order seq ends the stream.
    fn sort_feedback(&self, entries: Vec<FeedbackRow>) -> Result<Sorted, super::End> {
        let mut rows = Vec::with_capacity(entries.len());
        let mut prev = self.last_seq;
        let mut first_new = None;
        let mut foreign = 0;
        let mut dropped_at_agent = 0;
        let mut carriers = Vec::new();
        for mut row in entries {
            if row.seq <= prev {
                // A re-send of what is stored is fine only as a prefix of
                // the stream (before anything new); within the new part
                // every seq must grow.
                if first_new.is_some() {
                    return Err(super::End::Bad(format!(
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
            high: prev,
            first_new,
            foreign,
            dropped_at_agent,
        })
    }

    /// Entries between what the store acknowledged and the agent's first
    /// held one are either dropped by the agent (the first entry's
    /// `dropped_before` counts them) or were acknowledged by a store that
    /// was since rolled back: those are lost, and said so.
    fn account_gap(&mut self, now: Now, acked: u64, first: u64, rows: &[FeedbackRow]) {
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
        self.note(Note::FeedbackLost(lost));
        self.agent_event(now, AgentEventKind::Conflict, None, msg);
    }
}
