//! Freed heap given back after a burst. A thousand agents' feedback
//! decoded at once leaves glibc's arenas holding what the burst freed
//! (it returns memory by itself only from the top of each arena): the
//! fleet bench read ~160 KB per connected agent after its ingest rounds,
//! three times what the same streams hold at rest. Once the controller
//! has been quiet for a moment after a burst, the free pages go back
//! (`baton_sys::release_free_heap`). Continuous traffic never triggers
//! it: there the freed memory is reused.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::app::App;

/// How long without new feedback batches, streams or pushes counts as
/// quiet.
pub const QUIET: Duration = Duration::from_secs(2);

/// Until `stop`: after activity, once quiet for [`QUIET`], give freed heap
/// back.
pub async fn release_after_bursts(app: Arc<App>, mut stop: watch::Receiver<bool>) {
    let mut last = app.activity();
    let mut busy = false;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(QUIET) => {}
            _ = stop.changed() => return,
        }
        let now = app.activity();
        if now != last {
            busy = true;
            last = now;
            continue;
        }
        if busy {
            busy = false;
            // Off the async workers: it walks every arena.
            let gave = tokio::task::spawn_blocking(baton_sys::release_free_heap)
                .await
                .unwrap_or(false);
            tracing::debug!(gave, "freed heap given back after a burst");
        }
    }
}
