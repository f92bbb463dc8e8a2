//! `cancel`, `packs`, `agents` (`label`, `forget`), `watch`, `feedback`,
//! `audit`.

use std::io::Write;

use baton_proto::wire::{self, watch_event::Body as Ev};

use super::format::{self, table};
use super::{Conn, OpError, client};

pub(super) fn line(out: &mut dyn Write, s: &str) -> Result<(), OpError> {
    // A closed stdout (a pager quit) ends the command quietly.
    out.write_all(s.as_bytes())
        .and_then(|_| out.flush())
        .map_err(|_| OpError {
            message: String::new(),
            code: 0,
        })
}

/// `cancel PACK [--tenant T]`.
pub async fn cancel(
    conn: &Conn,
    tenant: &str,
    pack: &str,
    out: &mut dyn Write,
) -> Result<(), OpError> {
    let mut c = client(conn).await?;
    let r = c
        .cancel(wire::CancelRequest {
            tenant: tenant.into(),
            pack: pack.into(),
        })
        .await?
        .into_inner();
    line(
        out,
        &format!(
            "{} cancelled; {} agent{} told: {}\n",
            format::pack_ref(r.pack.as_ref()),
            r.agents.len(),
            if r.agents.len() == 1 { "" } else { "s" },
            r.agents.join(", ")
        ),
    )
}

/// `packs [--json]`.
pub async fn packs(conn: &Conn, json: bool, out: &mut dyn Write) -> Result<(), OpError> {
    let mut c = client(conn).await?;
    let r = c
        .list_packs(wire::ListPacksRequest::default())
        .await?
        .into_inner();
    if json {
        for p in &r.packs {
            let pr = p.pack.clone().unwrap_or_default();
            line(
                out,
                &format!(
                    "{}\n",
                    serde_json::json!({
                        "tenant": pr.tenant, "pack": pr.pack, "version": pr.version,
                        "targets": p.targets, "pushed": format::instant(p.pushed_ns),
                        "cancelled": p.cancelled, "acked": p.acked, "nacked": p.nacked,
                        "pending": p.pending, "ahead": p.ahead,
                    })
                ),
            )?;
        }
        return Ok(());
    }
    let rows: Vec<Vec<String>> = r
        .packs
        .iter()
        .map(|p| {
            vec![
                format::pack_ref(p.pack.as_ref()),
                match (p.cancelled, p.ahead) {
                    (true, _) => "cancelled".into(),
                    (false, 0) => "live".into(),
                    // Agents run a version this store does not know.
                    (false, n) => format!("live, {n} agent{} ahead", if n == 1 { "" } else { "s" }),
                },
                format!("{}/{}/{}", p.acked, p.nacked, p.pending),
                format::instant(p.pushed_ns),
                p.targets.clone(),
            ]
        })
        .collect();
    line(
        out,
        &table(
            &["PACK", "STATE", "ACKED/NACKED/PENDING", "PUSHED", "TARGETS"],
            &rows,
        ),
    )
}

/// Every agent, page by page.
async fn all_agents(conn: &Conn) -> Result<Vec<wire::AgentSummary>, OpError> {
    let mut c = client(conn).await?;
    let mut out = Vec::new();
    let mut after = String::new();
    loop {
        let r = c
            .list_agents(wire::ListAgentsRequest {
                after: after.clone(),
                limit: 0,
            })
            .await?
            .into_inner();
        out.extend(r.agents);
        if r.next.is_empty() || r.next == after {
            return Ok(out);
        }
        after = r.next;
    }
}

/// `agents [--json]`.
pub async fn agents(conn: &Conn, json: bool, out: &mut dyn Write) -> Result<(), OpError> {
    let r = wire::ListAgentsReply {
        agents: all_agents(conn).await?,
        next: String::new(),
    };
    if json {
        for a in &r.agents {
            let (source, state, _) = format::clock(a.clock.as_ref());
            let labels: std::collections::BTreeMap<_, _> = a.labels.iter().collect();
            let packs: Vec<serde_json::Value> = a
                .packs
                .iter()
                .map(|h| {
                    let p = h.pack.clone().unwrap_or_default();
                    serde_json::json!({"tenant": p.tenant, "pack": p.pack,
                        "version": p.version, "stopped": h.stopped})
                })
                .collect();
            line(
                out,
                &format!(
                    "{}\n",
                    serde_json::json!({
                        "id": a.id, "labels": labels, "version": a.agent_version,
                        "connected": a.connected, "last_seen": format::instant(a.last_seen_ns),
                        "clock_source": source, "clock_state": state,
                        "clock_offset_ns": a.clock.as_ref().map(|c| c.offset_ns),
                        "clock_uncertainty_ns": a.clock.as_ref().map(|c| c.uncertainty_ns),
                        "packs": packs, "lateness_p99_ns": a.lateness_p99_ns,
                        "tenants": a.tenants,
                        "conflict": if a.conflict.is_empty() { None } else { Some(&a.conflict) },
                        "deliveries": a.deliveries.iter().map(|d| serde_json::json!({
                            "pack": format::pack_ref(d.pack.as_ref()),
                            "state": format::delivery_state(d.state),
                            "reason": d.reason,
                        })).collect::<Vec<_>>(),
                    })
                ),
            )?;
        }
        return Ok(());
    }
    let rows: Vec<Vec<String>> = r
        .agents
        .iter()
        .map(|a| {
            let (source, state, offset) = format::clock(a.clock.as_ref());
            let mut labels: Vec<String> =
                a.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            labels.sort();
            let packs: Vec<String> = a
                .packs
                .iter()
                .map(|h| {
                    let p = h.pack.clone().unwrap_or_default();
                    format!(
                        "{}/{} v{}{}",
                        p.tenant,
                        p.pack,
                        p.version,
                        if h.stopped { " (stopped)" } else { "" }
                    )
                })
                .collect();
            vec![
                a.id.clone(),
                match (a.connected, a.conflict.is_empty()) {
                    (true, true) => "yes".into(),
                    (false, true) => "no".into(),
                    // Two machines under one id: say so where it is seen.
                    (c, false) => format!(
                        "{} (DUPLICATE ID: {})",
                        if c { "yes" } else { "no" },
                        a.conflict
                    ),
                },
                format::instant(a.last_seen_ns),
                format!("{source}/{state}"),
                offset,
                if a.lateness_p99_ns == 0 {
                    "-".into()
                } else {
                    format::span(a.lateness_p99_ns)
                },
                if labels.is_empty() {
                    "-".into()
                } else {
                    labels.join(",")
                },
                if packs.is_empty() {
                    "-".into()
                } else {
                    packs.join(", ")
                },
            ]
        })
        .collect();
    line(
        out,
        &table(
            &[
                "ID",
                "CONNECTED",
                "LAST SEEN",
                "CLOCK",
                "OFFSET",
                "LATENESS P99",
                "LABELS",
                "PACKS",
            ],
            &rows,
        ),
    )
}

/// `feedback --pack P [--tenant T] [--agent A] [--since T] [--json]`.
#[allow(clippy::too_many_arguments)]
pub async fn feedback(
    conn: &Conn,
    tenant: &str,
    pack: &str,
    agent: Option<&str>,
    since_ns: i64,
    limit: u32,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), OpError> {
    let mut c = client(conn).await?;
    let mut s = c
        .query_feedback(wire::FeedbackQuery {
            tenant: tenant.into(),
            pack: pack.into(),
            agent_id: agent.unwrap_or_default().into(),
            since_ns,
            limit,
        })
        .await?
        .into_inner();
    let mut rows = Vec::new();
    while let Some(r) = s.message().await? {
        if json {
            line(out, &format!("{}\n", format::feedback_json(&r)))?;
        } else {
            if let Some(gap) = format::gap_line(&r) {
                let mut g = vec![String::from("…"); format::FEEDBACK_HEADER.len()];
                if let Some(last) = g.last_mut() {
                    *last = gap;
                }
                rows.push(g);
            }
            rows.push(format::feedback_row(&r));
        }
    }
    if !json {
        line(out, &table(&format::FEEDBACK_HEADER, &rows))?;
    }
    Ok(())
}

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
            Watch::Lost(super::describe_status(&s))
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
        let text = match ev.body {
            Some(Ev::Feedback(r)) if json => format!("{}\n", format::feedback_json(&r)),
            Some(Ev::Feedback(r)) => {
                let row = format::feedback_row(&r);
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
            Some(Ev::Agent(a)) => agent_line(&a, json),
            Some(Ev::Delivery(d)) if json => format!(
                "{}\n",
                serde_json::json!({"event": "delivery", "agent": d.agent_id,
                    "pack": format::pack_ref(d.pack.as_ref()),
                    "state": format::delivery_state(d.state), "reason": d.reason})
            ),
            Some(Ev::Delivery(d)) => format!(
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
            ),
            Some(Ev::Lagged(n)) if json => {
                format!("{}\n", serde_json::json!({"event": "lagged", "missed": n}))
            }
            Some(Ev::Lagged(n)) => format!("… {n} events not shown (this watcher fell behind)\n"),
            None => continue,
        };
        line(out, &text)?;
    }
    Ok(())
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

/// `audit [--since T] [--limit N] [--json]`.
pub async fn audit(
    conn: &Conn,
    since_ns: i64,
    limit: u32,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), OpError> {
    let mut c = client(conn).await?;
    let r = c
        .audit(wire::AuditQuery { since_ns, limit })
        .await?
        .into_inner();
    if json {
        for a in &r.records {
            line(
                out,
                &format!(
                    "{}\n",
                    serde_json::json!({
                        "at": format::instant(a.at_ns), "at_ns": a.at_ns, "who": a.who,
                        "tenant": a.tenant, "role": a.role, "action": a.action,
                        "target": a.target, "result": a.result,
                    })
                ),
            )?;
        }
        return Ok(());
    }
    let rows: Vec<Vec<String>> = r
        .records
        .iter()
        .map(|a| {
            vec![
                format::instant(a.at_ns),
                a.who.clone(),
                a.tenant.clone(),
                a.role.clone(),
                a.action.clone(),
                a.target.clone(),
                a.result.clone(),
            ]
        })
        .collect();
    line(
        out,
        &table(
            &["AT", "WHO", "TENANT", "ROLE", "ACTION", "TARGET", "RESULT"],
            &rows,
        ),
    )
}

/// What `agents label` changes.
#[derive(Clone, Debug, Default)]
pub struct LabelChange {
    /// `k=v` to set.
    pub set: Vec<(String, String)>,
    /// Keys to hide.
    pub remove: Vec<String>,
    /// Keys back to the agent's own.
    pub reset: Vec<String>,
}

impl LabelChange {
    /// From the command line: `k=v` words, `--remove k`, `--reset k`.
    pub fn parse(set: &[String], remove: &[String], reset: &[String]) -> Result<Self, OpError> {
        let set = set
            .iter()
            .map(|kv| match kv.split_once('=') {
                Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
                _ => Err(OpError::usage(format!(
                    "label {kv:?}: expected KEY=VALUE (hide a key with --remove KEY)"
                ))),
            })
            .collect::<Result<Vec<_>, _>>()?;
        if set.is_empty() && remove.is_empty() && reset.is_empty() {
            return Err(OpError::usage(
                "nothing to change: give KEY=VALUE, --remove KEY or --reset KEY",
            ));
        }
        Ok(LabelChange {
            set,
            remove: remove.to_vec(),
            reset: reset.to_vec(),
        })
    }
}

fn kv_list(m: &std::collections::HashMap<String, String>) -> String {
    let mut kv: Vec<String> = m.iter().map(|(k, v)| format!("{k}={v}")).collect();
    kv.sort();
    if kv.is_empty() {
        "(none)".into()
    } else {
        kv.join(", ")
    }
}

/// `agents label AGENT k=v... [--remove k] [--reset k] [--tenant T]`.
pub async fn label_agent(
    conn: &Conn,
    agent: &str,
    tenant: &str,
    change: LabelChange,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), OpError> {
    let mut c = client(conn).await?;
    let r = c
        .label_agent(wire::LabelAgentRequest {
            agent_id: agent.into(),
            tenant: tenant.into(),
            set: change.set.into_iter().collect(),
            remove: change.remove,
            reset: change.reset,
        })
        .await?
        .into_inner();
    if json {
        return line(
            out,
            &format!(
                "{}\n",
                serde_json::json!({
                    "id": r.agent_id, "tenant": r.tenant,
                    "labels": r.labels, "agent_labels": r.agent_labels,
                })
            ),
        );
    }
    line(
        out,
        &format!(
            "agent {}: packs of tenant {} now target on {} (the agent's own: {})\n",
            r.agent_id,
            r.tenant,
            kv_list(&r.labels),
            kv_list(&r.agent_labels)
        ),
    )
}

/// `agents forget AGENT [--tenant T]`.
pub async fn forget_agent(
    conn: &Conn,
    agent: &str,
    tenant: &str,
    out: &mut dyn Write,
) -> Result<(), OpError> {
    let mut c = client(conn).await?;
    let r = c
        .forget_agent(wire::ForgetAgentRequest {
            agent_id: agent.into(),
            tenant: tenant.into(),
        })
        .await?
        .into_inner();
    let what = if r.record_deleted {
        "forgotten (its record, deliveries and labels)"
    } else {
        "forgotten by this tenant (its deliveries and labels; other tenants still use it)"
    };
    let conn_note = if r.disconnected {
        "; its stream was closed"
    } else {
        ""
    };
    line(out, &format!("agent {}: {what}{conn_note}\n", r.agent_id))
}

/// `agents grant AGENT TENANT [--revoke]`.
pub async fn grant_agent(
    conn: &Conn,
    agent: &str,
    tenant: &str,
    revoke: bool,
    out: &mut dyn Write,
) -> Result<(), OpError> {
    let mut c = client(conn).await?;
    let r = c
        .grant_agent(wire::GrantAgentRequest {
            agent_id: agent.into(),
            tenant: tenant.into(),
            revoke,
        })
        .await?
        .into_inner();
    line(
        out,
        &format!(
            "agent {}: {} tenant {tenant}; it serves {}\n",
            r.agent_id,
            if revoke {
                "grant taken back from"
            } else {
                "granted to"
            },
            if r.tenants.is_empty() {
                "no tenant".to_string()
            } else {
                r.tenants.join(", ")
            }
        ),
    )
}

/// One agent's clock history: `clock AGENT`.
pub async fn clock(
    conn: &Conn,
    agent: &str,
    since_ns: i64,
    limit: u32,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), OpError> {
    let mut c = client(conn).await?;
    let r = c
        .clock_history(wire::ClockHistoryRequest {
            agent: agent.to_string(),
            since_ns,
            limit,
        })
        .await?
        .into_inner();
    if json {
        for c in &r.reports {
            let (source, state, _) = format::clock(Some(c));
            line(
                out,
                &format!(
                    "{}\n",
                    serde_json::json!({
                        "at": format::instant(c.at_ns), "at_ns": c.at_ns,
                        "source": source, "state": state,
                        "offset_ns": c.offset_ns, "jitter_ns": c.jitter_ns,
                        "uncertainty_ns": c.uncertainty_ns,
                        "frequency_ppm": c.frequency_ppm,
                    })
                ),
            )?;
        }
        return Ok(());
    }
    let rows: Vec<Vec<String>> = r
        .reports
        .iter()
        .map(|c| {
            let (source, state, offset) = format::clock(Some(c));
            vec![
                format::instant(c.at_ns),
                source,
                state,
                offset,
                format::span(c.jitter_ns),
                format::span(c.uncertainty_ns),
                format!("{:+.3}", c.frequency_ppm),
            ]
        })
        .collect();
    line(
        out,
        &table(
            &[
                "AT",
                "SOURCE",
                "STATE",
                "OFFSET",
                "JITTER",
                "UNCERTAINTY",
                "FREQ PPM",
            ],
            &rows,
        ),
    )
}
