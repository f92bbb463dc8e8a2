//! The live stream's loop: the agent's messages, the commands of the
//! hub, and a tick that pings, marks the agent seen, retries and resyncs,
//! until something ends it.

use std::time::Duration;

use baton_proto::wire::{self, controller_message::Body as Out};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::{Stream, StreamExt};
use tonic::Status;

use super::{End, Session};
use crate::app::hub::SessionCmd;
use crate::app::now_ns;
use crate::model::SpanNanos;

/// How often the agent's rows are read again on a live stream (catches a
/// command lost to a full queue, and re-sends pushes never answered).
const RESYNC: Duration = Duration::from_secs(30);
/// How often last-seen is written to the store while connected.
const SEEN_EVERY: Duration = Duration::from_secs(10);

impl Session {
    pub(super) async fn serve<S>(
        &mut self,
        mut inbound: S,
        mut cmds: mpsc::Receiver<SessionCmd>,
        serial: Option<String>,
    ) -> End
    where
        S: Stream<Item = Result<wire::AgentMessage, Status>> + Unpin + Send,
    {
        let mut shutdown = self.shared.shutdown.clone();
        let mut revoked = self.shared.revoked.subscribe();
        if let Some(s) = &serial
            && revoked.borrow_and_update().contains(s)
        {
            return End::Revoked(s.clone());
        }
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let ping_every = self.shared.cfg.ping_interval;
        let mut next_ping = Instant::now() + ping_every;
        let mut next_resync = Instant::now() + RESYNC;
        let mut next_seen = Instant::now() + SEEN_EVERY;
        loop {
            let r = tokio::select! {
                m = inbound.next() => match m {
                    Some(Ok(m)) => {
                        self.last_heard = Instant::now();
                        self.on_message(m).await
                    }
                    None => Err(End::Closed),
                    Some(Err(s)) => Err(End::Transport(s)),
                },
                c = cmds.recv() => match c {
                    Some(c) => self.on_command(c).await,
                    None => Err(End::Shutdown),
                },
                _ = tick.tick() => {
                    let now = Instant::now();
                    let silent = now.saturating_duration_since(self.last_heard);
                    if silent >= ping_every * 3 {
                        Err(End::Dead(silent))
                    } else {
                        let mut r = Ok(());
                        if now >= next_ping {
                            next_ping = now + ping_every;
                            let id = self.next_ping;
                            self.next_ping += 1;
                            r = self.send(Out::Ping(wire::Ping { id })).await;
                        }
                        if r.is_ok() && now >= next_seen {
                            next_seen = now + SEEN_EVERY;
                            let p99 = Some(self.app.lateness_p99(&self.agent.id).nanos());
                            r = self.app.store.agent_seen(&self.agent.id, self.agent.session_gen, true, now_ns(), p99).await.map_err(End::from);
                        }
                        if r.is_ok() {
                            r = self.retry_due(now).await;
                        }
                        if r.is_ok() && now >= next_resync {
                            next_resync = now + RESYNC;
                            r = self.resync().await;
                        }
                        r
                    }
                },
                _ = shutdown.changed() => Err(End::Shutdown),
                r = revoked.changed(), if serial.is_some() => match (r, &serial) {
                    (Ok(()), Some(s)) if revoked.borrow_and_update().contains(s) => {
                        Err(End::Revoked(s.clone()))
                    }
                    // The sender lives as long as the shared state.
                    (Err(_), _) => Err(End::Shutdown),
                    _ => Ok(()),
                },
            };
            if let Err(end) = r {
                return end;
            }
        }
    }

    async fn on_command(&mut self, c: SessionCmd) -> Result<(), End> {
        match c {
            SessionCmd::Rows { rows, pack } => {
                if let Some(p) = pack {
                    self.texts.insert(p.key(), p);
                }
                for r in rows {
                    let key = r.key();
                    self.rows.insert(key.clone(), r);
                    self.act(&key).await?;
                }
                Ok(())
            }
            SessionCmd::Replaced => Err(End::Replaced),
            SessionCmd::Forgotten => Err(End::Forgotten),
            SessionCmd::Regranted => {
                if let Some(a) = self.app.store.agent(&self.agent.id).await? {
                    self.set_agent(a);
                }
                Ok(())
            }
        }
    }

    /// Every row read again from the store, and acted on.
    async fn resync(&mut self) -> Result<(), End> {
        let rows = self.app.store.deliveries_of_agent(&self.agent.id).await?;
        self.rows = rows.into_iter().map(|r| (r.key(), r)).collect();
        self.texts.clear();
        self.act_all().await
    }
}
