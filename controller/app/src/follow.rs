//! Replicas hear of each other through the store.
//!
//! Every replica writes what its watchers and the other replicas' streams
//! must learn (a delivery row changed, an agent connected, left, reported
//! its clock) as pointer rows in the store's `events` table ([`relay`]),
//! and reads every replica's back, in [`Mark`] order, from where it
//! started ([`follow`]): replicas write in parallel, and a row committed
//! late is read once every older transaction has ended, never skipped.
//! Watchers on any replica thus see every replica's events, once; and an
//! agent's stream hears of a push made through another replica within a
//! commit (the store's news), or its next poll ([`FOLLOW_EVERY`]), not at its
//! next resync. Feedback is followed
//! from the feedback table itself, the same way, and only while someone
//! watches.
//!
//! A follower reads rows as they are when it reads them: a delivery that
//! went pending → acked in between is seen acked twice.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::app::App;
use crate::events::{ActionEvent, AgentEvent, AgentEventKind, Event};
use crate::hub::SessionCmd;
use crate::texts::PackText;
use baton_model::{DeliveryRow, EventKind, EventRow, Intent, PackKey};
use baton_store::StoreOps;
use baton_store::{FeedbackScope, MAX_PAGE, Mark, StoreResult};

/// After stop, the relay ends once nothing was queued this long.
const STOP_QUIET: Duration = Duration::from_millis(300);
/// Events per store write at most.
const RELAY_BATCH: usize = 512;
/// How long a follower waits between reads at most: it reads as soon as
/// the store hears another replica's commit (PostgreSQL's notifications),
/// and this often when it hears nothing (or cannot listen just now).
pub const FOLLOW_EVERY: Duration = Duration::from_millis(200);
/// Events a follower takes a page at most: a push's few groups of a
/// thousand agents each in one page, their rows read at once (a group a
/// page was three reads in a row before the last group's agents heard of
/// a push to 3 000, some 90 ms in the fleet bench).
const FOLLOW_PAGE: u32 = 10 * MAX_PAGE;
/// How long events are kept for followers (a replica further behind than
/// this misses some: its streams catch up at their resync).
const KEEP_EVENTS: Duration = Duration::from_secs(600);
/// How often old events are deleted.
const TRIM_EVERY: Duration = Duration::from_secs(60);

/// Writes this replica's events to the store, in batches, until `stop`
/// and then until the streams ending with it have said so (nothing
/// queued for `STOP_QUIET`).
pub async fn relay(app: Arc<App>, mut stop: watch::Receiver<bool>) {
    let Some(mut rx) = app.take_relay() else {
        return;
    };
    let mut batch = Vec::with_capacity(RELAY_BATCH);
    let mut stopping = false;
    loop {
        let n = if stopping {
            match tokio::time::timeout(STOP_QUIET, rx.recv_many(&mut batch, RELAY_BATCH)).await {
                Ok(n) => n,
                Err(_) => return,
            }
        } else {
            tokio::select! {
                n = rx.recv_many(&mut batch, RELAY_BATCH) => n,
                _ = stop.changed() => {
                    stopping = true;
                    continue;
                }
            }
        };
        if n == 0 {
            return;
        }
        let n = batch.len() as u64;
        if let Err(e) = app.store.put_events(std::mem::take(&mut batch)).await {
            app.metrics.relay_dropped(n);
            tracing::warn!(
                events = n,
                "store: events for the other replicas not stored: {e}"
            );
        }
    }
}

/// Where a follower is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Cursor {
    events: Mark,
    feedback: Mark,
}

/// Reads every replica's events (and, while watched, the feedback stored)
/// from the store and tells this replica's streams and watchers, until
/// `stop`.
pub async fn follow(app: Arc<App>, stop: watch::Receiver<bool>) {
    follow_from(app, None, stop).await;
}

/// [`follow`] from the first event and feedback row stored, not from the
/// newest: a replica that must replay all that is stored (a test's fresh
/// database).
pub async fn follow_everything(app: Arc<App>, stop: watch::Receiver<bool>) {
    follow_from(app, Some(Cursor::default()), stop).await;
}

async fn follow_from(app: Arc<App>, mut at: Option<Cursor>, mut stop: watch::Receiver<bool>) {
    let Some(me) = app.replica().map(str::to_owned) else {
        return;
    };
    let mut trimmed = tokio::time::Instant::now();
    let mut failing = false;
    loop {
        tokio::select! {
            () = app.store.news(FOLLOW_EVERY) => {}
            _ = stop.changed() => return,
        }
        let read = async {
            let cursor = match at {
                Some(c) => c,
                None => {
                    let (events, feedback) = app.store.high_water().await?;
                    Cursor { events, feedback }
                }
            };
            at = Some(cursor);
            let next = step(&app, &me, cursor).await?;
            at = Some(next);
            StoreResult::Ok(())
        }
        .await;
        match read {
            Ok(()) if failing => {
                failing = false;
                tracing::info!("following the other replicas' events again");
            }
            Ok(()) => {}
            Err(e) if !failing => {
                failing = true;
                tracing::warn!("cannot read the other replicas' events: {e}");
            }
            Err(_) => {}
        }
        if trimmed.elapsed() >= TRIM_EVERY {
            trimmed = tokio::time::Instant::now();
            let before = crate::app::now() - KEEP_EVENTS;
            if let Err(e) = app.store.delete_events_before(before, 10_000).await {
                tracing::warn!("store: deleting old events: {e}");
            }
        }
    }
}

/// Everything new after `at`; where that leaves the cursor.
async fn step(app: &App, me: &str, mut at: Cursor) -> StoreResult<Cursor> {
    loop {
        let began = std::time::Instant::now();
        let (page, next) = app.store.events_after(at.events, FOLLOW_PAGE).await?;
        let paged = began.elapsed();
        let read = read_told(app, me, &page).await?;
        let rows_read = began.elapsed();
        for e in &page {
            told(app, me, e, &read).await?;
        }
        if let Some(first) = page.iter().find(|e| e.replica != me) {
            // How long another replica's change took to reach the streams
            // here, and where: the figure behind a push's tail on
            // replicas (a commit held back by an older transaction shows
            // as `behind` well above the reads).
            tracing::debug!(
                events = page.len(),
                rows = read.rows.len(),
                behind_ms = crate::app::now().since(first.at).as_secs_f64() * 1e3,
                page_ms = paged.as_secs_f64() * 1e3,
                rows_ms = (rows_read - paged).as_secs_f64() * 1e3,
                told_ms = (began.elapsed() - rows_read).as_secs_f64() * 1e3,
                "followed a page of other replicas' events"
            );
        }
        at.events = next;
        if page.len() < MAX_PAGE as usize {
            break;
        }
    }
    if app.watched() {
        loop {
            let (rows, next) = app
                .store
                .feedback_after(at.feedback, FeedbackScope::All, MAX_PAGE)
                .await?;
            let full = rows.len() == MAX_PAGE as usize;
            for r in rows {
                app.broadcast(Event::Feedback(Arc::new(r)));
            }
            at.feedback = next;
            if !full {
                break;
            }
        }
    } else {
        // Nobody to tell: a watcher sees what is stored from when it came.
        at.feedback = app.store.high_water().await?.1;
    }
    Ok(at)
}

/// Whether a delivery event goes to a stream here: another replica's
/// change to an agent streaming to this one.
fn for_a_stream(app: &App, me: &str, e: &EventRow) -> bool {
    e.replica != me && app.hub.is_connected(&e.agent_id)
}

/// What a page of events needs read: the delivery rows it names that
/// someone here is told of (a stream, or watchers), as they are now, and
/// the text of each version they hold an agent streaming here to.
#[derive(Default)]
struct Told {
    rows: HashMap<(String, PackKey), DeliveryRow>,
    /// Read once per version, not once per stream: a push through another
    /// replica to thousands of agents streaming here.
    texts: HashMap<(PackKey, u64), Arc<PackText>>,
}

/// [`Told`] for `page`, in a few queries.
async fn read_told(app: &App, me: &str, page: &[EventRow]) -> StoreResult<Told> {
    let watched = app.watched();
    let pairs: Vec<(String, PackKey)> = page
        .iter()
        .filter(|e| e.kind == EventKind::Delivery && (watched || for_a_stream(app, me, e)))
        .map(|e| {
            (
                e.agent_id.clone(),
                PackKey::new(e.tenant.clone(), e.pack.clone()),
            )
        })
        .collect();
    if pairs.is_empty() {
        return Ok(Told::default());
    }
    let rows: HashMap<(String, PackKey), DeliveryRow> = app
        .store
        .deliveries_of(&pairs)
        .await?
        .into_iter()
        .map(|r| ((r.agent_id.clone(), r.key()), r))
        .collect();
    let versions: HashSet<(PackKey, u64)> = rows
        .values()
        .filter(|r| r.intent == Intent::Hold && app.hub.is_connected(&r.agent_id))
        .map(|r| (r.key(), r.version))
        .collect();
    let mut texts = HashMap::new();
    for (key, version) in versions {
        if let Some(t) = app.pack_text(&key, version).await? {
            texts.insert((key, version), t);
        }
    }
    Ok(Told { rows, texts })
}

/// Acts on one event: another replica's change to an agent streaming here
/// goes to its stream; every event to the watchers here. `rows`: the
/// page's reads ([`read_told`]).
async fn told(app: &App, me: &str, e: &EventRow, read: &Told) -> StoreResult<()> {
    let watched = app.watched();
    match e.kind {
        EventKind::Delivery => {
            let stream = for_a_stream(app, me, e);
            if !stream && !watched {
                return Ok(());
            }
            let pair = (
                e.agent_id.clone(),
                PackKey::new(e.tenant.clone(), e.pack.clone()),
            );
            let row = match read.rows.get(&pair) {
                Some(r) => Some(r.clone()),
                // Not read with the page (a watcher came meanwhile), or
                // gone: asked alone.
                None => app.store.deliveries_of(&[pair]).await?.pop(),
            };
            let Some(row) = row else {
                return Ok(());
            };
            if watched {
                app.broadcast(Event::Delivery(app.decorate(row.clone())));
            }
            if stream {
                let pack = read.texts.get(&(row.key(), row.version)).cloned();
                app.hub.send(
                    &e.agent_id,
                    SessionCmd::Rows {
                        rows: vec![row],
                        pack,
                    },
                );
            }
        }
        // Told here when it was done here.
        EventKind::Action if watched && e.replica != me => {
            app.broadcast(Event::Action(ActionEvent {
                tenant: e.tenant.clone(),
                pack: e.pack.clone(),
                agent: e.agent_id.clone(),
                text: e.detail.clone(),
                at: e.at,
            }));
        }
        EventKind::Action => {}
        EventKind::Release if e.replica != me => {
            if e.agent_id.is_empty() {
                app.hub.send_all(|| SessionCmd::Release);
            } else {
                app.hub.send(&e.agent_id, SessionCmd::Release);
            }
        }
        EventKind::Release => {}
        kind => {
            if !watched {
                return Ok(());
            }
            let agent = app.store.agent(&e.agent_id).await?;
            let kind = match kind {
                EventKind::Connected => AgentEventKind::Connected,
                EventKind::Disconnected => AgentEventKind::Disconnected,
                EventKind::Clock => AgentEventKind::Clock,
                _ => AgentEventKind::Conflict,
            };
            let clock = match kind {
                AgentEventKind::Clock => agent.as_ref().and_then(|a| a.clock.clone()),
                _ => None,
            };
            app.broadcast(Event::Agent(AgentEvent {
                agent_id: e.agent_id.clone(),
                tenants: Arc::new(agent.map(|a| a.tenants).unwrap_or_default()),
                kind,
                clock,
                detail: e.detail.clone(),
                at: e.at,
            }));
        }
    }
    Ok(())
}
