//! `cancel`, `packs`, `agents` (`label`, `forget`, `grant`), `feedback`,
//! `audit`, `clock`: each states its request and its rows;
//! [`print_listing`] prints them as JSON lines or a table.

use std::io::Write;

use baton_proto::wire;

use super::conn::{Conn, client};
use super::error::OpError;
use super::format::{self, table};

/// Writes `s` to the operator's output.
pub(super) fn line(out: &mut dyn Write, s: &str) -> Result<(), OpError> {
    // A closed stdout (a pager quit) ends the command quietly.
    out.write_all(s.as_bytes())
        .and_then(|_| out.flush())
        .map_err(|_| OpError {
            message: String::new(),
            code: 0,
        })
}

/// `cancel PACK [--tenant T] [--agent ID]...`.
pub async fn cancel(
    conn: &Conn,
    tenant: &str,
    pack: &str,
    agents: &[String],
    out: &mut dyn Write,
) -> Result<(), OpError> {
    let request = wire::CancelRequest {
        tenant: tenant.into(),
        pack: pack.into(),
        agents: agents.to_vec(),
    };
    let r = client(conn).await?.cancel(request).await?.into_inner();
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

/// What every listing command prints: one JSON object per line with
/// `--json`, else one table under `header`.
fn print_listing<T>(
    out: &mut dyn Write,
    json: bool,
    items: &[T],
    header: &[&str],
    to_json: impl Fn(&T) -> serde_json::Value,
    to_row: impl Fn(&T) -> Vec<String>,
) -> Result<(), OpError> {
    if json {
        for item in items {
            line(out, &format!("{}\n", to_json(item)))?;
        }
        return Ok(());
    }
    let rows: Vec<Vec<String>> = items.iter().map(to_row).collect();
    line(out, &table(header, &rows))
}

/// `packs [--json]`.
pub async fn packs(conn: &Conn, json: bool, out: &mut dyn Write) -> Result<(), OpError> {
    let request = wire::ListPacksRequest::default();
    let r = client(conn).await?.list_packs(request).await?.into_inner();
    print_listing(out, json, &r.packs, &PACKS_HEADER, pack_json, pack_row)
}

const PACKS_HEADER: [&str; 5] = ["PACK", "STATE", "ACKED/NACKED/PENDING", "PUSHED", "TARGETS"];

fn pack_json(p: &wire::PackSummary) -> serde_json::Value {
    let pr = p.pack.clone().unwrap_or_default();
    serde_json::json!({
        "tenant": pr.tenant, "pack": pr.pack, "version": pr.version,
        "targets": p.targets, "pushed": format::instant(p.pushed_ns),
        "cancelled": p.cancelled, "acked": p.acked, "nacked": p.nacked,
        "pending": p.pending, "ahead": p.ahead,
    })
}

fn pack_row(p: &wire::PackSummary) -> Vec<String> {
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
    let agents = all_agents(conn).await?;
    print_listing(out, json, &agents, &AGENTS_HEADER, agent_json, agent_row)
}

const AGENTS_HEADER: [&str; 11] = [
    "ID",
    "VERSION",
    "CONNECTED",
    "LAST SEEN",
    "CLOCK",
    "OFFSET",
    "LATENESS P99",
    "LABELS",
    "PACKS",
    "TRUST",
    "UPDATE",
];

fn agent_json(a: &wire::AgentSummary) -> serde_json::Value {
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
    serde_json::json!({
        "id": a.id, "labels": labels, "version": a.agent_version, "arch": a.arch,
        "update": a.update.as_ref().map(|u| serde_json::json!({
            "version": u.version,
            "phase": super::phase_word(u.phase),
            "held_bytes": u.held_bytes, "size": u.size, "reason": u.reason,
        })),
        "connected": a.connected, "last_seen": format::instant(a.last_seen_ns),
        "clock_source": source, "clock_state": state,
        "clock_offset_ns": a.clock.as_ref().map(|c| c.offset_ns),
        "clock_uncertainty_ns": a.clock.as_ref().map(|c| c.uncertainty_ns),
        "packs": packs, "lateness_p99_ns": a.lateness_p99_ns,
        "tenants": a.tenants,
        "trust": a.trust.as_ref().map(|t| serde_json::json!({
            "root": t.root,
            "list_version": t.list_version,
            "list_expires": (t.list_expires_ns != 0).then(|| format::instant(t.list_expires_ns)),
            "signed_tenants": t.signed_tenants,
            "nothing_runs": (!t.nothing_runs.is_empty()).then_some(&t.nothing_runs),
            "refused": (!t.refused.is_empty()).then_some(&t.refused),
        })),
        "conflict": if a.conflict.is_empty() { None } else { Some(&a.conflict) },
        "deliveries": a.deliveries.iter().map(|d| serde_json::json!({
            "pack": format::pack_ref(d.pack.as_ref()),
            "state": format::delivery_state(d.state),
            "reason": d.reason,
        })).collect::<Vec<_>>(),
    })
}

fn agent_row(a: &wire::AgentSummary) -> Vec<String> {
    let (source, state, offset) = format::clock(a.clock.as_ref());
    let mut labels: Vec<String> = a.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
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
    let or_dash = |v: Vec<String>, sep: &str| {
        if v.is_empty() {
            "-".to_string()
        } else {
            v.join(sep)
        }
    };
    vec![
        a.id.clone(),
        if a.arch.is_empty() {
            a.agent_version.clone()
        } else {
            format!("{} ({})", a.agent_version, a.arch)
        },
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
        or_dash(labels, ","),
        or_dash(packs, ", "),
        format::trust(a.trust.as_ref()),
        match super::update_text(a.update.as_ref()) {
            t if t.is_empty() => "-".into(),
            t => t,
        },
    ]
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
    let request = wire::FeedbackQuery {
        tenant: tenant.into(),
        pack: pack.into(),
        agent_id: agent.unwrap_or_default().into(),
        since_ns,
        limit,
    };
    let mut s = client(conn)
        .await?
        .query_feedback(request)
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

/// `audit [--since T] [--limit N] [--json]`.
pub async fn audit(
    conn: &Conn,
    since_ns: i64,
    limit: u32,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), OpError> {
    let request = wire::AuditQuery { since_ns, limit };
    let r = client(conn).await?.audit(request).await?.into_inner();
    print_listing(out, json, &r.records, &AUDIT_HEADER, audit_json, audit_row)
}

const AUDIT_HEADER: [&str; 7] = ["AT", "WHO", "TENANT", "ROLE", "ACTION", "TARGET", "RESULT"];

fn audit_json(a: &wire::AuditRecord) -> serde_json::Value {
    serde_json::json!({
        "at": format::instant(a.at_ns), "at_ns": a.at_ns, "who": a.who,
        "tenant": a.tenant, "role": a.role, "action": a.action,
        "target": a.target, "result": a.result,
    })
}

fn audit_row(a: &wire::AuditRecord) -> Vec<String> {
    vec![
        format::instant(a.at_ns),
        a.who.clone(),
        a.tenant.clone(),
        a.role.clone(),
        a.action.clone(),
        a.target.clone(),
        a.result.clone(),
    ]
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
    let request = wire::LabelAgentRequest {
        agent_id: agent.into(),
        tenant: tenant.into(),
        set: change.set.into_iter().collect(),
        remove: change.remove,
        reset: change.reset,
    };
    let r = client(conn).await?.label_agent(request).await?.into_inner();
    let text = if json {
        format!(
            "{}\n",
            serde_json::json!({
                "id": r.agent_id, "tenant": r.tenant,
                "labels": r.labels, "agent_labels": r.agent_labels,
            })
        )
    } else {
        format!(
            "agent {}: packs of tenant {} now target on {} (the agent's own: {})\n",
            r.agent_id,
            r.tenant,
            kv_list(&r.labels),
            kv_list(&r.agent_labels)
        )
    };
    line(out, &text)
}

/// `agents forget AGENT [--tenant T]`.
pub async fn forget_agent(
    conn: &Conn,
    agent: &str,
    tenant: &str,
    out: &mut dyn Write,
) -> Result<(), OpError> {
    let request = wire::ForgetAgentRequest {
        agent_id: agent.into(),
        tenant: tenant.into(),
    };
    let r = client(conn)
        .await?
        .forget_agent(request)
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
    let request = wire::GrantAgentRequest {
        agent_id: agent.into(),
        tenant: tenant.into(),
        revoke,
    };
    let r = client(conn).await?.grant_agent(request).await?.into_inner();
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
    let request = wire::ClockHistoryRequest {
        agent: agent.to_string(),
        since_ns,
        limit,
    };
    let r = client(conn)
        .await?
        .clock_history(request)
        .await?
        .into_inner();
    print_listing(out, json, &r.reports, &CLOCK_HEADER, clock_json, clock_row)
}

const CLOCK_HEADER: [&str; 7] = [
    "AT",
    "SOURCE",
    "STATE",
    "OFFSET",
    "JITTER",
    "UNCERTAINTY",
    "FREQ PPM",
];

fn clock_json(c: &wire::ClockReport) -> serde_json::Value {
    let (source, state, _) = format::clock(Some(c));
    serde_json::json!({
        "at": format::instant(c.at_ns), "at_ns": c.at_ns,
        "source": source, "state": state,
        "offset_ns": c.offset_ns, "jitter_ns": c.jitter_ns,
        "uncertainty_ns": c.uncertainty_ns,
        "frequency_ppm": c.frequency_ppm,
    })
}

fn clock_row(c: &wire::ClockReport) -> Vec<String> {
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
}
