//! The memory store's feedback: one journal's rows stored once per seq,
//! and retention's deletes.

use super::state::State;
use crate::{FeedbackRow, FeedbackStored, StoreError, StoreResult, fits};
use baton_model::RefTime;

/// Stores one journal's rows (a re-send is a duplicate that only keeps a
/// count of drops it now carries).
pub(super) fn put(s: &mut State, rows: &[FeedbackRow]) -> StoreResult<FeedbackStored> {
    let mut out = FeedbackStored::default();
    let Some(first) = rows.first() else {
        return Ok(out);
    };
    let jkey = (first.agent_id.clone(), first.journal_id.clone());
    for r in rows {
        if (r.agent_id.as_str(), r.journal_id.as_str()) != (jkey.0.as_str(), jkey.1.as_str()) {
            return Err(StoreError::Invalid(
                "one put_feedback call takes one journal's rows".into(),
            ));
        }
        fits(r.seq, "feedback seq")?;
        fits(r.version, "feedback pack version")?;
        fits(r.dropped_before, "dropped_before")?;
    }
    let before = s.journals.get(&jkey).copied().unwrap_or(0);
    let mut acked = before;
    for r in rows {
        acked = acked.max(r.seq);
        let k = (r.agent_id.clone(), r.journal_id.clone(), r.seq);
        // At or below the acked seq: stored once, maybe deleted by
        // retention since.
        if r.seq <= before || !s.feedback_keys.insert(k) {
            out.duplicates += 1;
            // A re-sent entry now carrying a count of drops: the
            // stored row keeps the count, held to the entries
            // missing right before it.
            if r.dropped_before > 0 {
                let below = s
                    .feedback
                    .values()
                    .filter(|f| {
                        f.agent_id == r.agent_id && f.journal_id == r.journal_id && f.seq < r.seq
                    })
                    .map(|f| f.seq)
                    .max()
                    .unwrap_or(0);
                let count = r.dropped_before.min(r.seq - below - 1);
                if let Some(stored) = s.feedback.values_mut().find(|f| {
                    f.agent_id == r.agent_id && f.journal_id == r.journal_id && f.seq == r.seq
                }) {
                    stored.dropped_before = stored.dropped_before.max(count);
                }
            }
            continue;
        }
        s.next_feedback_id += 1;
        let id = s.next_feedback_id;
        s.feedback.insert(id, FeedbackRow { id, ..r.clone() });
        out.inserted += 1;
    }
    s.journals.insert(jkey, acked);
    out.acked_seq = acked;
    Ok(out)
}

/// Deletes at most `max` rows stored before `before`, oldest first.
pub(super) fn delete_before(s: &mut State, before: RefTime, max: u32) -> u64 {
    let mut old: Vec<(RefTime, u64)> = s
        .feedback
        .iter()
        .filter(|(_, r)| r.received < before)
        .map(|(id, r)| (r.received, *id))
        .collect();
    old.sort_unstable();
    let ids: Vec<u64> = old
        .into_iter()
        .take(max as usize)
        .map(|(_, id)| id)
        .collect();
    for id in &ids {
        if let Some(r) = s.feedback.remove(id) {
            s.feedback_keys.remove(&(r.agent_id, r.journal_id, r.seq));
        }
    }
    ids.len() as u64
}
