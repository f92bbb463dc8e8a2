//! `rollout status|list|pause|resume|abort`: a table (or JSON) of what
//! the controller says of a pack's rollout.

use std::io::Write;

use baton_proto::wire::{self, RolloutCommand};
use serde_json::json;

use super::conn::{Conn, client};
use super::error::OpError;
use super::format::{self, table};

/// What the operator asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RolloutOp {
    /// One pack's rollout, with its agents.
    Status,
    /// Every rollout.
    List,
    /// Hold it.
    Pause,
    /// Let a paused one go on.
    Resume,
    /// End it.
    Abort,
}

/// Runs `op` on `pack` (ignored for `List`).
pub async fn rollout(
    conn: &Conn,
    op: RolloutOp,
    tenant: &str,
    pack: &str,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), OpError> {
    let command = match op {
        RolloutOp::Status => RolloutCommand::Status,
        RolloutOp::List => RolloutCommand::List,
        RolloutOp::Pause => RolloutCommand::Pause,
        RolloutOp::Resume => RolloutCommand::Resume,
        RolloutOp::Abort => RolloutCommand::Abort,
    };
    let mut c = client(conn).await?;
    let r = c
        .rollout(wire::RolloutRequest {
            command: command as i32,
            tenant: tenant.into(),
            pack: pack.into(),
        })
        .await?
        .into_inner();
    let text = if json {
        r.rollouts
            .iter()
            .map(|i| format!("{}\n", info_json(i)))
            .collect()
    } else if op == RolloutOp::Status {
        r.rollouts.first().map(status_text).unwrap_or_default()
    } else {
        list_text(&r.rollouts)
    };
    super::query::line(out, &text)
}

fn figures_json(f: &wire::RolloutFigures) -> serde_json::Value {
    json!({
        "agents": f.agents, "settled": f.settled, "failed": f.failed,
        "unknown": f.unknown, "lateness_p99_ns": f.lateness_p99_ns,
        "offset_max_ns": f.offset_max_ns,
    })
}

fn info_json(i: &wire::RolloutInfo) -> serde_json::Value {
    json!({
        "tenant": i.tenant, "pack": i.pack, "version": i.version, "from": i.from,
        "state": i.state, "stage": i.stage + 1, "stages": i.stages, "reason": i.reason,
        "rollback": i.rollback, "members": i.members,
        "created_ns": i.created_ns, "updated_ns": i.updated_ns,
        "stage_started_ns": i.stage_started_ns, "soak_from_ns": i.soak_from_ns,
        "cohort": i.cohort.as_ref().map(figures_json),
        "baseline": i.baseline.as_ref().map(figures_json),
        "verdicts": i.verdicts.iter().map(|v| json!({
            "stage": v.stage + 1, "verdict": v.kind, "reason": v.reason,
            "cohort": v.cohort.as_ref().map(figures_json),
            "baseline": v.baseline.as_ref().map(figures_json),
            "missing": v.missing, "since_ns": v.since_ns, "at_ns": v.at_ns,
        })).collect::<Vec<_>>(),
        "agents": i.agents.iter().map(|a| json!({
            "id": a.id, "stage": a.stage.map(|s| s + 1), "skipped": a.skipped,
            "held": a.held, "connected": a.connected, "canary": a.canary,
            "refused": a.refused,
        })).collect::<Vec<_>>(),
    })
}

fn figures_text(f: Option<&wire::RolloutFigures>) -> String {
    let Some(f) = f else {
        return "-".into();
    };
    format!(
        "{} agent(s), {} settled, {} failed, {} unknown, lateness p99 {}, offset max {}",
        f.agents,
        f.settled,
        f.failed,
        f.unknown,
        f.lateness_p99_ns.map_or("-".into(), format::span),
        f.offset_max_ns.map_or("-".into(), format::span),
    )
}

fn status_text(i: &wire::RolloutInfo) -> String {
    let mut s = format!(
        "{}/{} v{} (from {}): {}, stage {} of {}{}\n",
        i.tenant,
        i.pack,
        i.version,
        i.from.map_or("nothing".into(), |v| format!("v{v}")),
        i.state,
        i.stage + 1,
        i.stages,
        if i.reason.is_empty() {
            String::new()
        } else {
            format!(": {}", i.reason)
        }
    );
    if let Some(b) = i.rollback {
        s.push_str(&format!("rolled back as v{b}\n"));
    }
    s.push_str(&format!("cohort:   {}\n", figures_text(i.cohort.as_ref())));
    s.push_str(&format!(
        "baseline: {}\n",
        figures_text(i.baseline.as_ref())
    ));
    s.push_str(&verdict_lines(&i.verdicts));
    let rows: Vec<Vec<String>> = i
        .agents
        .iter()
        .map(|a| {
            vec![
                a.id.clone(),
                cohort_cell(a.stage, a.skipped),
                a.held.map_or("-".into(), |v| format!("v{v}")),
                if a.connected { "yes" } else { "no" }.into(),
                if a.canary { "yes" } else { "" }.into(),
                a.refused.clone(),
            ]
        })
        .collect();
    s.push_str(&table(
        &["AGENT", "COHORT", "HELD", "CONNECTED", "CANARY", "REFUSED"],
        &rows,
    ));
    s
}

/// A rollout's (or an agent update's) verdicts, a line each.
pub(super) fn verdict_lines(verdicts: &[wire::RolloutVerdict]) -> String {
    verdicts
        .iter()
        .map(|v| {
            format!(
                "stage {} {} at {}: {}\n",
                v.stage + 1,
                v.kind,
                format::instant(v.at_ns),
                v.reason
            )
        })
        .collect()
}

/// The stage that admitted an agent into a cohort, in a table's cell.
pub(super) fn cohort_cell(stage: Option<u32>, skipped: bool) -> String {
    match (stage, skipped) {
        (Some(st), false) => format!("stage {}", st + 1),
        (Some(st), true) => format!("stage {} (skipped)", st + 1),
        (None, _) => "-".into(),
    }
}

fn list_text(rows: &[wire::RolloutInfo]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|i| {
            vec![
                format!("{}/{}", i.tenant, i.pack),
                format!("v{}", i.version),
                i.state.clone(),
                format!("{}", i.stage + 1),
                format!("{}", i.members),
                format::instant(i.updated_ns),
                i.reason.clone(),
            ]
        })
        .collect();
    table(
        &[
            "PACK", "VERSION", "STATE", "STAGE", "COHORT", "UPDATED", "REASON",
        ],
        &rows,
    )
}
