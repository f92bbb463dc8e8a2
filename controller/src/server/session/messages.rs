//! What the agent sends, by kind: acks, clock reports, held sets and
//! time requests here; refusals and feedback in their own modules.

use baton_proto::wire::{self, agent_message::Body as In, controller_message::Body as Out};
use tokio::time::Instant;

use super::{End, Session};
use crate::app::events::AgentEventKind;
use crate::app::metrics::{AgentClock, PushResult};
use crate::app::now_ns;
use crate::model::{Answer, PackKey};
use crate::model::{RefTime, SpanNanos};
use crate::server::convert;

impl Session {
    pub(super) async fn on_message(&mut self, m: wire::AgentMessage) -> Result<(), End> {
        match m.body {
            None => Err(End::Bad("empty message".into())),
            Some(In::Hello(_)) => Err(End::Bad("a second hello on the same stream".into())),
            Some(In::PackAck(a)) => self.on_ack(a).await,
            Some(In::PackNack(n)) => self.on_nack(n).await,
            Some(In::Feedback(batch)) => self.on_feedback(batch).await,
            Some(In::ClockReport(c)) => self.on_clock_report(c).await,
            Some(In::Held(h)) => self.on_held(h).await,
            Some(In::TimeRequest(r)) => self.on_time_request(r).await,
            Some(In::TimeExchangeReply(_)) | Some(In::Pong(_)) => Ok(()),
        }
    }

    /// An agent acknowledged a push: its answer stored, the push no longer in flight.
    async fn on_ack(&mut self, a: wire::PackAck) -> Result<(), End> {
        let (tenant, pack, version) = convert::pack_ref(a.pack.as_ref())?;
        let key = PackKey::new(tenant, pack);
        if !self.rows.contains_key(&key) {
            self.drop_foreign(1, "ack");
            return Ok(());
        }
        self.app.metrics.push_result(if a.unchanged {
            PushResult::Unchanged
        } else {
            PushResult::Acked
        });
        let answer = if a.staged {
            Answer::Staged(RefTime::from_nanos(a.activate_at_ns))
        } else {
            Answer::Acked
        };
        self.answered(key.clone(), version, answer).await?;
        self.in_flight.remove(&key);
        Ok(())
    }

    /// A clock report: metrics, the store and watchers, within its rate limit.
    async fn on_clock_report(&mut self, c: wire::ClockReport) -> Result<(), End> {
        let row = convert::clock(&c)?;
        if !self.clock_reports.allow(&self.agent.id, Instant::now()) {
            return Ok(());
        }
        if let Some(n) = c.outbox_entries {
            self.app.record_outbox(&self.agent.id, n, row.at.as_nanos());
        }
        self.app.metrics.clock(
            &self.agent.id,
            AgentClock {
                offset_ns: row.offset.nanos(),
                uncertainty_ns: row.uncertainty.nanos(),
                locked: row.state == "locked",
            },
        );
        self.app
            .store
            .record_clock(&self.agent.id, self.agent.session_gen, row.clone())
            .await?;
        self.agent_event(AgentEventKind::Clock, Some(row), String::new());
        Ok(())
    }

    /// What the agent holds now: the store re-plans its rows, and they are acted on.
    async fn on_held(&mut self, h: wire::Held) -> Result<(), End> {
        let held = convert::held(&h.packs, self.held_cap)?;
        let held = self.own_held(held);
        let changed = self
            .app
            .store
            .agent_held(&self.agent.id, self.agent.session_gen, held, now_ns())
            .await?;
        for r in changed {
            let key = r.key();
            self.app.row_changed(&r);
            self.rows.insert(key.clone(), r);
            self.act(&key).await?;
        }
        Ok(())
    }

    /// A time request answered with the controller's clock, within its rate limit.
    async fn on_time_request(&mut self, r: wire::TimeExchangeRequest) -> Result<(), End> {
        // t2 as soon as the request is seen, t3 as the reply leaves:
        // the controller's clock is reference time.
        let t2 = now_ns();
        if !self.time_requests.allow(&self.agent.id, Instant::now()) {
            return Ok(());
        }
        self.send(Out::TimeReply(wire::TimeExchangeReply {
            id: r.id,
            t1_ns: r.t1_ns,
            t2_ns: t2,
            t3_ns: now_ns(),
        }))
        .await
    }
}
