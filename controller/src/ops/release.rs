//! `release upload|list` and `agent-update start|status|list|pause|
//! resume|abort`: agent releases stored on the controller, and the
//! update rollouts that give them to the fleet.

use std::io::Write;

use baton_proto::wire::{self, AgentUpdateCommand};
use baton_trust::SignedRelease;
use serde_json::json;

use super::conn::{Conn, client};
use super::error::OpError;
use super::format::{self, table};
use super::query::line;

/// Bytes per part of an upload (the server takes up to 1 MiB).
const PART: usize = 256 * 1024;

/// Uploads `binary` with its signed manifest.
pub async fn upload_release(
    conn: &Conn,
    signed: &SignedRelease,
    binary: Vec<u8>,
    out: &mut dyn Write,
) -> Result<(), OpError> {
    use wire::release_upload_part::Part;
    let mut parts = vec![wire::ReleaseUploadPart {
        part: Some(Part::Manifest(wire::ReleaseOffer {
            manifest: signed.body.clone(),
            key: signed.key.to_string(),
            signature: signed.signature.to_base64(),
        })),
    }];
    parts.extend(binary.chunks(PART).map(|c| wire::ReleaseUploadPart {
        part: Some(Part::Data(c.to_vec())),
    }));
    let mut c = client(conn).await?;
    let r = c
        .upload_release(tokio_stream::iter(parts))
        .await?
        .into_inner();
    line(
        out,
        &format!(
            "stored release {} for {} ({} bytes, sha256 {}, release key {})\n",
            r.version, r.arch, r.size, r.sha256, r.key
        ),
    )
}

/// Every stored release.
pub async fn releases(conn: &Conn, json: bool, out: &mut dyn Write) -> Result<(), OpError> {
    let mut c = client(conn).await?;
    let r = c
        .list_releases(wire::ListReleasesRequest {})
        .await?
        .into_inner();
    let text = if json {
        r.releases
            .iter()
            .map(|i| {
                format!(
                    "{}\n",
                    json!({
                        "version": i.version, "arch": i.arch, "size": i.size,
                        "sha256": i.sha256, "key": i.key,
                        "uploaded_ns": i.uploaded_ns, "uploaded_by": i.uploaded_by,
                    })
                )
            })
            .collect()
    } else {
        let rows: Vec<Vec<String>> = r
            .releases
            .iter()
            .map(|i| {
                vec![
                    i.version.clone(),
                    i.arch.clone(),
                    i.size.to_string(),
                    i.sha256.chars().take(16).collect(),
                    i.key.clone(),
                    format::instant(i.uploaded_ns),
                    i.uploaded_by.clone(),
                ]
            })
            .collect();
        table(
            &[
                "VERSION", "ARCH", "BYTES", "SHA256", "KEY", "UPLOADED", "BY",
            ],
            &rows,
        )
    };
    line(out, &text)
}

/// What the operator asks of agent updates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UpdateOp {
    /// Start one: the release's version, and the plan's text.
    Start {
        /// The release.
        version: String,
        /// The plan (YAML).
        plan: String,
    },
    /// One update, with its agents.
    Status,
    /// The newest updates.
    List,
    /// Hold it.
    Pause,
    /// Let a paused one go on.
    Resume,
    /// End it.
    Abort,
}

/// Runs `op` on update `id` (0: the newest).
pub async fn agent_update(
    conn: &Conn,
    op: UpdateOp,
    id: u64,
    reason: &str,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), OpError> {
    let (command, version, plan) = match &op {
        UpdateOp::Start { version, plan } => {
            (AgentUpdateCommand::Start, version.clone(), plan.clone())
        }
        UpdateOp::Status => (AgentUpdateCommand::Status, String::new(), String::new()),
        UpdateOp::List => (AgentUpdateCommand::List, String::new(), String::new()),
        UpdateOp::Pause => (AgentUpdateCommand::Pause, String::new(), String::new()),
        UpdateOp::Resume => (AgentUpdateCommand::Resume, String::new(), String::new()),
        UpdateOp::Abort => (AgentUpdateCommand::Abort, String::new(), String::new()),
    };
    let mut c = client(conn).await?;
    let r = c
        .agent_update(wire::AgentUpdateRequest {
            command: command as i32,
            version,
            plan,
            id,
            reason: reason.into(),
        })
        .await?
        .into_inner();
    let text = if json {
        r.updates
            .iter()
            .map(|i| format!("{}\n", info_json(i)))
            .collect()
    } else {
        match op {
            UpdateOp::Status => r.updates.first().map(status_text).unwrap_or_default(),
            UpdateOp::List => list_text(&r.updates),
            _ => r
                .updates
                .first()
                .map(|i| {
                    let mut s = format!(
                        "agent update {} to {}: {}, stage {}, {} target(s)\n",
                        i.id,
                        i.version,
                        i.state,
                        i.stage + 1,
                        i.targets
                    );
                    if !i.reason.is_empty() {
                        s.push_str(&format!("{}\n", i.reason));
                    }
                    s
                })
                .unwrap_or_default(),
        }
    };
    line(out, &text)
}

/// An update phase's word.
pub fn phase_word(p: i32) -> &'static str {
    baton_server::convert::update_phase(p).map_or("-", baton_model::UpdatePhase::as_str)
}

/// An agent's word on an update, in a few words.
pub fn update_text(u: Option<&wire::UpdateState>) -> String {
    let Some(u) = u else {
        return String::new();
    };
    let mut s = format!("{} {}", u.version, phase_word(u.phase));
    if u.phase == wire::update_state::Phase::Downloading as i32 && u.size > 0 {
        s.push_str(&format!(" {}%", u.held_bytes.saturating_mul(100) / u.size));
    }
    if !u.reason.is_empty() {
        s.push_str(&format!(": {}", u.reason));
    }
    s
}

fn update_json(u: Option<&wire::UpdateState>) -> serde_json::Value {
    u.map_or(serde_json::Value::Null, |u| {
        json!({
            "version": u.version, "phase": phase_word(u.phase),
            "held_bytes": u.held_bytes, "size": u.size, "reason": u.reason,
        })
    })
}

fn info_json(i: &wire::AgentUpdateInfo) -> serde_json::Value {
    json!({
        "id": i.id, "version": i.version, "state": i.state, "stage": i.stage + 1,
        "stages": i.stages, "reason": i.reason, "created_ns": i.created_ns,
        "updated_ns": i.updated_ns, "created_by": i.created_by,
        "targets": i.targets, "members": i.members,
        "verdicts": i.verdicts.iter().map(|v| json!({
            "stage": v.stage + 1, "verdict": v.kind, "reason": v.reason,
            "missing": v.missing, "at_ns": v.at_ns,
        })).collect::<Vec<_>>(),
        "agents": i.agents.iter().map(|a| json!({
            "id": a.id, "agent_version": a.agent_version, "arch": a.arch,
            "connected": a.connected, "stage": a.stage.map(|s| s + 1),
            "skipped": a.skipped, "update": update_json(a.update.as_ref()),
        })).collect::<Vec<_>>(),
    })
}

fn status_text(i: &wire::AgentUpdateInfo) -> String {
    let mut s = format!(
        "agent update {} to {}: {}, stage {} of {}{}\n",
        i.id,
        i.version,
        i.state,
        i.stage + 1,
        i.stages,
        if i.reason.is_empty() {
            String::new()
        } else {
            format!(": {}", i.reason)
        }
    );
    s.push_str(&super::rollout::verdict_lines(&i.verdicts));
    let rows: Vec<Vec<String>> = i
        .agents
        .iter()
        .map(|a| {
            vec![
                a.id.clone(),
                super::rollout::cohort_cell(a.stage, a.skipped),
                a.agent_version.clone(),
                a.arch.clone(),
                if a.connected { "yes" } else { "no" }.into(),
                update_text(a.update.as_ref()),
            ]
        })
        .collect();
    s.push_str(&table(
        &["AGENT", "COHORT", "VERSION", "ARCH", "CONNECTED", "UPDATE"],
        &rows,
    ));
    s
}

fn list_text(rows: &[wire::AgentUpdateInfo]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|i| {
            vec![
                i.id.to_string(),
                i.version.clone(),
                i.state.clone(),
                format!("{}", i.stage + 1),
                format!("{}/{}", i.members, i.targets),
                format::instant(i.updated_ns),
                i.reason.clone(),
            ]
        })
        .collect();
    table(
        &[
            "ID", "VERSION", "STATE", "STAGE", "COHORT", "UPDATED", "REASON",
        ],
        &rows,
    )
}
