//! `watch`: the controller's live events, reconnected across restarts.

use std::io::Write;

use baton_proto::wire::{self, watch_event::Body as Ev};

use super::conn::{Conn, client};
use super::error::OpError;
use super::format;
use super::query::line;

/// `watch [--tenant T] [--pack P] [--json]`: live until interrupted. A
/// lost controller (a restart) is reconnected to with backoff, and said
/// so; events while away are not replayed (`feedback` has them).
pub async fn watch(
    conn: &Conn,
    tenant: &str,
    pack: &str,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), OpError> {
    let mut backoff = std::time::Duration::from_millis(250);
    let mut connected_once = false;
    loop {
        let lost = match watch_once(conn, tenant, pack, json, out, &mut connected_once).await {
            // The controller closed the stream (it stops): come back.
            Ok(()) if connected_once => "the controller closed the stream".to_string(),
            Ok(()) => return Ok(()),
            Err(Watch::Lost(why)) if connected_once => why,
            Err(Watch::Lost(why)) => return Err(OpError::fail(why)),
            // Refused (revoked, not allowed, a closed stdout): final.
            Err(Watch::Fatal(e)) => return Err(e),
        };
        let note = if json {
            format!(
                "{}\n",
                serde_json::json!({"event": "reconnecting", "error": lost,
                    "in_ms": backoff.as_millis() as u64})
            )
        } else {
            format!(
                "… controller lost ({lost}); reconnecting in {:.1}s\n",
                backoff.as_secs_f64()
            )
        };
        line(out, &note)?;
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(std::time::Duration::from_secs(10));
    }
}

/// Why a watch stream ended.
enum Watch {
    /// The controller went away (restart, network): try again.
    Lost(String),
    /// Refused, or the output closed: stop.
    Fatal(OpError),
}

impl From<OpError> for Watch {
    fn from(e: OpError) -> Watch {
        Watch::Fatal(e)
    }
}

/// A stream error: the controller gone (retry) or a refusal (final).
fn watch_status(s: tonic::Status) -> Watch {
    match s.code() {
        tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled => {
            Watch::Lost(super::conn::describe_status(&s))
        }
        _ => Watch::Fatal(OpError::from(s)),
    }
}

/// One watch stream until it ends (`Ok`: the controller closed it).
async fn watch_once(
    conn: &Conn,
    tenant: &str,
    pack: &str,
    json: bool,
    out: &mut dyn Write,
    connected_once: &mut bool,
) -> Result<(), Watch> {
    let mut c = client(conn).await.map_err(|e| {
        if *connected_once {
            Watch::Lost(e.message)
        } else {
            Watch::Fatal(e)
        }
    })?;
    let mut s = c
        .watch(wire::WatchRequest {
            tenant: tenant.into(),
            pack: pack.into(),
        })
        .await
        .map_err(watch_status)?
        .into_inner();
    if *connected_once {
        line(
            out,
            if json {
                "{\"event\":\"reconnected\"}\n"
            } else {
                "… reconnected\n"
            },
        )?;
    }
    *connected_once = true;
    while let Some(ev) = s.message().await.map_err(watch_status)? {
        if let Some(text) = event_text(ev, json) {
            line(out, &text)?;
        }
    }
    Ok(())
}

/// One watch event as printed (`None`: an event without a body).
fn event_text(ev: wire::WatchEvent, json: bool) -> Option<String> {
    Some(match ev.body? {
        Ev::Feedback(r) if json => format!("{}\n", format::feedback_json(&r)),
        Ev::Feedback(r) => feedback_line(&r),
        Ev::Agent(a) => agent_line(&a, json),
        Ev::Delivery(d) => delivery_line(&d, json),
        Ev::Lagged(n) if json => {
            format!("{}\n", serde_json::json!({"event": "lagged", "missed": n}))
        }
        Ev::Lagged(n) => format!("… {n} events not shown (this watcher fell behind)\n"),
    })
}

/// A feedback record as one line of the live view.
fn feedback_line(r: &wire::FeedbackRecord) -> String {
    let row = format::feedback_row(r);
    format!(
        "{}  {:<12} {:<24} {:<14} a{} {:>9}  {}{}\n",
        row[0],
        row[1],
        row[2],
        row[3],
        row[4],
        row[5],
        row[6],
        if row[7].is_empty() {
            String::new()
        } else {
            format!("  {}", row[7])
        }
    )
}

/// A delivery's change of state.
fn delivery_line(d: &wire::Delivery, json: bool) -> String {
    if json {
        return format!(
            "{}\n",
            serde_json::json!({"event": "delivery", "agent": d.agent_id,
                "pack": format::pack_ref(d.pack.as_ref()),
                "state": format::delivery_state(d.state), "reason": d.reason})
        );
    }
    format!(
        "{}  {:<12} {} {}{}\n",
        format::instant(d.updated_ns),
        d.agent_id,
        format::pack_ref(d.pack.as_ref()),
        format::delivery_state(d.state),
        if d.reason.is_empty() {
            String::new()
        } else {
            format!(": {}", d.reason)
        }
    )
}

fn agent_line(a: &wire::AgentEvent, json: bool) -> String {
    let kind = match wire::AgentEventKind::try_from(a.kind) {
        Ok(wire::AgentEventKind::Connected) => "connected",
        Ok(wire::AgentEventKind::Disconnected) => "disconnected",
        Ok(wire::AgentEventKind::Clock) => "clock",
        Ok(wire::AgentEventKind::Conflict) => "conflict",
        _ => "event",
    };
    let (source, state, offset) = format::clock(a.clock.as_ref());
    if json {
        return format!(
            "{}\n",
            serde_json::json!({"event": kind, "agent": a.agent_id, "at": format::instant(a.at_ns),
                "clock_source": source, "clock_state": state,
                "clock_offset_ns": a.clock.as_ref().map(|c| c.offset_ns),
                "clock_uncertainty_ns": a.clock.as_ref().map(|c| c.uncertainty_ns),
                "detail": a.detail})
        );
    }
    if kind == "clock" {
        let unc = a
            .clock
            .as_ref()
            .map_or_else(|| "-".into(), |c| format::span(c.uncertainty_ns));
        format!(
            "{}  {:<12} clock {source}/{state} offset {offset} ±{unc}\n",
            format::instant(a.at_ns),
            a.agent_id
        )
    } else {
        format!(
            "{}  {:<12} {kind}{}\n",
            format::instant(a.at_ns),
            a.agent_id,
            if a.detail.is_empty() {
                String::new()
            } else {
                format!(" ({})", a.detail)
            }
        )
    }
}
