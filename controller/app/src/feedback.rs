//! Stored feedback, read page by page: whatever a query asks for, the
//! controller holds one page of it at a time, and a slow reader slows the
//! reading, never grows memory.

use tokio::sync::mpsc;

use crate::app::{App, AppError, AppResult};

use crate::caller::Caller;
use baton_model::{FeedbackRow, RefTime};
use baton_store::{FeedbackFilter, MAX_PAGE};

/// What feedback to read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FeedbackQuery {
    /// Tenant (empty: the caller's own, `default` without identities).
    pub tenant: String,
    /// Only this pack.
    pub pack: Option<String>,
    /// Only this agent.
    pub agent_id: Option<String>,
    /// Stored at or after.
    pub since: Option<RefTime>,
    /// At most this many rows, oldest first (0: all).
    pub limit: u64,
}

/// Rows in flight between the store and a slow reader.
const BUFFERED: usize = 256;

impl App {
    /// Stored feedback, oldest first, as a channel of rows fed one store
    /// page at a time (the reader's pace sets the store's). Another
    /// tenant's feedback: as if there were none.
    pub fn feedback(
        self: &std::sync::Arc<Self>,
        caller: &Caller,
        q: FeedbackQuery,
    ) -> mpsc::Receiver<AppResult<FeedbackRow>> {
        let (tx, rx) = mpsc::channel(BUFFERED);
        let Some(tenant) = caller.tenant_of(&q.tenant) else {
            return rx;
        };
        let app = self.clone();
        tokio::spawn(async move {
            let mut filter = FeedbackFilter {
                tenant: Some(tenant),
                pack: q.pack,
                agent_id: q.agent_id,
                since: q.since,
                after_id: 0,
                limit: MAX_PAGE,
            };
            let mut left = if q.limit == 0 { u64::MAX } else { q.limit };
            while left > 0 {
                filter.limit = MAX_PAGE.min(u32::try_from(left).unwrap_or(MAX_PAGE));
                let page = match app.store.feedback(filter.clone()).await {
                    Ok(p) => p,
                    Err(e) => {
                        let _ = tx.send(Err(AppError::from(e))).await;
                        return;
                    }
                };
                let full = page.len() as u32 == filter.limit;
                for row in page {
                    filter.after_id = row.id;
                    left -= 1;
                    if tx.send(Ok(row)).await.is_err() {
                        return; // the reader went away
                    }
                }
                if !full {
                    return;
                }
            }
        });
        rx
    }
}
