//! The wire and the session's values: an agent's message checked and
//! converted to a [`FromAgent`], a [`ToAgent`] to a message.

use baton_proto::wire::{self, agent_message::Body as In, controller_message::Body as Out};

use super::End;
use crate::convert;
use baton_app::link::{FromAgent, ToAgent};
use baton_app::now_ns;
use baton_model::time::span_ns;
use baton_model::{PackKey, RefTime};

/// An agent's message on a live stream (`agent`, journal `journal`), as
/// the session takes it; an invalid one ends the stream.
pub(super) fn from_wire(
    m: wire::AgentMessage,
    agent: &str,
    journal: &str,
    held_cap: usize,
) -> Result<FromAgent, End> {
    Ok(match m.body {
        None => return Err(End::bad("empty message")),
        Some(In::Hello(_)) => return Err(End::bad("a second hello on the same stream")),
        Some(In::PackAck(a)) => {
            let (tenant, pack, version) = convert::pack_ref(a.pack.as_ref())?;
            FromAgent::Ack {
                key: PackKey::new(tenant, pack),
                version,
                staged: a.staged.then(|| RefTime::from_nanos(a.activate_at_ns)),
                unchanged: a.unchanged,
            }
        }
        Some(In::PackNack(n)) => {
            let (tenant, pack, version) = convert::pack_ref(n.pack.as_ref())?;
            FromAgent::Nack {
                key: PackKey::new(tenant, pack),
                version,
                reason: wire::NackReason::try_from(n.reason)
                    .unwrap_or(wire::NackReason::Unspecified),
                errors: convert::nack_errors(&n.errors),
                message: n.message,
            }
        }
        Some(In::Feedback(batch)) => {
            let received = now_ns();
            let rows = batch
                .entries
                .into_iter()
                .map(|e| convert::feedback_owned(agent, journal, e, received))
                .collect::<Result<Vec<_>, _>>()?;
            FromAgent::Feedback(rows)
        }
        Some(In::ClockReport(c)) => FromAgent::Clock {
            row: convert::clock(&c)?,
            outbox: c.outbox_entries,
        },
        Some(In::Held(h)) => FromAgent::Held(convert::held(&h.packs, held_cap)?),
        Some(In::TrustState(t)) => FromAgent::Trust(convert::trust(&t)),
        Some(In::TimeRequest(r)) => FromAgent::TimeRequest {
            id: r.id,
            t1_ns: r.t1_ns,
        },
        Some(In::TimeExchangeReply(_)) | Some(In::Pong(_)) => FromAgent::Heard,
        // Whether a release was offered on this stream is the session's
        // to check.
        Some(In::ReleaseRequest(r)) => FromAgent::ReleaseRequest {
            version: r.version,
            offset: r.offset,
            length: r.length,
        },
        Some(In::UpdateState(u)) => match convert::update(&u, now_ns()) {
            Some(row) => FromAgent::Update(row),
            None => FromAgent::Heard,
        },
    })
}

/// A session's message for the wire (times that are stamped as it
/// leaves, stamped now).
pub(super) fn to_wire(m: ToAgent) -> Out {
    match m {
        ToAgent::TrustLists(chain) => Out::TrustLists(wire::TrustLists {
            chain: chain.to_string(),
        }),
        ToAgent::Welcome {
            agent_id,
            feedback_acked_seq,
            ping_interval,
            session_gen,
        } => Out::Welcome(wire::Welcome {
            agent_id,
            feedback_acked_seq,
            controller_time_ns: now_ns(),
            ping_interval_ms: u32::try_from(ping_interval.as_millis()).unwrap_or(u32::MAX),
            session_gen,
        }),
        ToAgent::Push {
            pack,
            session_gen,
            staged,
            activate_at,
            max_uncertainty,
        } => Out::PackPush(wire::PackPush {
            pack: Some(convert::wire_ref(
                &pack.row.tenant,
                &pack.row.pack,
                pack.row.version,
            )),
            yaml: pack.row.yaml.clone(),
            session_gen,
            staged,
            activate_at_ns: activate_at.map_or(0, RefTime::as_nanos),
            max_uncertainty_ns: span_ns(max_uncertainty),
        }),
        ToAgent::Cancel {
            key,
            version,
            session_gen,
        } => Out::PackCancel(wire::PackCancel {
            pack: Some(convert::wire_ref(&key.tenant, &key.pack, version)),
            session_gen,
        }),
        ToAgent::FeedbackAck(seq) => Out::FeedbackAck(wire::FeedbackAck { seq }),
        ToAgent::TimeReply { id, t1_ns, t2 } => Out::TimeReply(wire::TimeExchangeReply {
            id,
            t1_ns,
            t2_ns: t2.as_nanos(),
            t3_ns: now_ns(),
        }),
        ToAgent::Ping(id) => Out::Ping(wire::Ping { id }),
        ToAgent::ReleaseOffer(r) => Out::ReleaseOffer(wire::ReleaseOffer {
            manifest: r.manifest.clone(),
            key: r.key.clone(),
            signature: r.signature.clone(),
        }),
        ToAgent::ReleaseWithdraw(version) => {
            Out::ReleaseWithdraw(wire::ReleaseWithdraw { version })
        }
        ToAgent::ReleaseChunk {
            version,
            offset,
            data,
        } => Out::ReleaseChunk(wire::ReleaseChunk {
            version,
            offset,
            data,
        }),
    }
}
