//! The Admin service's release and agent-update calls: an upload taken
//! from its stream of parts (the manifest first, then the binary, bounded
//! before anything is held), the list, and the update rollouts' commands
//! in wire types.

use baton_proto::wire;
use tokio_stream::StreamExt;
use tonic::{Status, Streaming};

use super::convert::{self, status};
use super::rollouts::verdict;
use baton_app::rollouts::RolloutCommand;
use baton_app::updates::{MAX_MANIFEST_BYTES, MAX_RELEASE_BYTES, UpdateStatus};
use baton_app::{App, AppError, Caller};
use baton_model::{AgentUpdateRow, ReleaseRow};
use baton_trust::release::SignedRelease;
use baton_trust::{KeyId, Signature};

/// Most bytes one part of an upload carries.
const MAX_PART: usize = 1 << 20;

/// The longest silence between two parts of an upload.
const PART_PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);

/// A manifest as the wire carries it, read back into its signed form.
fn signed(o: &wire::ReleaseOffer) -> Result<SignedRelease, AppError> {
    let key = KeyId::from_hex(&o.key)
        .ok_or_else(|| AppError::Invalid(format!("release key id {:?}: 16 hex digits", o.key)))?;
    let signature = Signature::from_base64(&o.signature)
        .map_err(|e| AppError::Invalid(format!("release signature: {e}")))?;
    Ok(SignedRelease {
        body: o.manifest.clone(),
        key,
        signature,
    })
}

/// Reads an upload (see [`read_upload`]) and stores it. A refusal while
/// reading is audited as the application's are.
pub async fn upload(
    app: &App,
    caller: &Caller,
    mut parts: Streaming<wire::ReleaseUploadPart>,
) -> Result<wire::ReleaseInfo, Status> {
    // Who may, and one at a time, before a byte is held.
    let _permit = app.upload_permit(caller).map_err(status)?;
    let (signed, binary) = match read_upload(&mut parts).await {
        Ok(read) => read,
        Err((target, refused)) => {
            // Audited as the application's refusals are, in its words; the
            // caller gets the status as it was (a cancelled stream, a
            // deadline).
            let e = match refused.code() {
                tonic::Code::InvalidArgument => AppError::Invalid(refused.message().into()),
                tonic::Code::ResourceExhausted => AppError::Limit(refused.message().into()),
                _ => AppError::Unavailable(refused.message().into()),
            };
            let tenant = caller.audit_tenant("");
            app.audit_refusal(caller, &tenant, "release.upload", &target, &e)
                .await
                .map_err(status)?;
            return Err(refused);
        }
    };
    let (row, _new) = app
        .upload_release(caller, &signed, binary)
        .await
        .map_err(status)?;
    Ok(release_info(&row))
}

/// An upload's manifest, then its binary: never more than the manifest's
/// size, nor [`MAX_RELEASE_BYTES`]. A refusal names what it refused
/// (the release, once the manifest said which) for the audit.
async fn read_upload(
    parts: &mut Streaming<wire::ReleaseUploadPart>,
) -> Result<(SignedRelease, Vec<u8>), (String, Status)> {
    use wire::release_upload_part::Part;
    let mut target = "release".to_string();
    let invalid = |m: String| Status::invalid_argument(m);
    let first = match parts.next().await {
        None => return Err((target, invalid("release upload: no parts".into()))),
        Some(p) => p.map_err(|e| (target.clone(), e))?,
    };
    let Some(Part::Manifest(offer)) = first.part else {
        let m = "release upload: the first part must be the signed manifest";
        return Err((target, invalid(m.into())));
    };
    if offer.manifest.len() > MAX_MANIFEST_BYTES {
        let m = format!(
            "a release manifest of {} bytes; a box takes at most {MAX_MANIFEST_BYTES}",
            offer.manifest.len()
        );
        return Err((target, invalid(m)));
    }
    let signed = signed(&offer).map_err(|e| (target.clone(), status(e)))?;
    let manifest = signed
        .unverified_manifest()
        .map_err(|e| (target.clone(), invalid(e)))?;
    target = format!("release {} {}", manifest.version, manifest.arch);
    if manifest.size > MAX_RELEASE_BYTES {
        let e = AppError::Limit(format!(
            "release {} is {} bytes; the controller stores at most {MAX_RELEASE_BYTES}",
            manifest.version, manifest.size
        ));
        return Err((target, status(e)));
    }
    // Bounded above (the manifest's size, at most MAX_RELEASE_BYTES), and
    // the caller may store releases: held once, not grown by doubling.
    let mut binary = Vec::with_capacity(manifest.size as usize);
    loop {
        // A client that stops sending holds the one upload permit: it
        // is given up after a minute of silence.
        let part = match tokio::time::timeout(PART_PATIENCE, parts.next()).await {
            Ok(Some(p)) => p.map_err(|e| (target.clone(), e))?,
            Ok(None) => break,
            Err(_) => {
                let s = Status::deadline_exceeded(format!(
                    "release upload: no part for {PART_PATIENCE:?}; the upload is given up"
                ));
                return Err((target, s));
            }
        };
        match part.part {
            Some(Part::Data(d)) => {
                if d.len() > MAX_PART || (binary.len() + d.len()) as u64 > manifest.size {
                    let m = format!(
                        "release upload: more bytes than the manifest's {} (or a part over {MAX_PART})",
                        manifest.size
                    );
                    return Err((target, invalid(m)));
                }
                binary.extend_from_slice(&d);
            }
            _ => {
                let m = "release upload: a second manifest, or an empty part";
                return Err((target, invalid(m.into())));
            }
        }
    }
    Ok((signed, binary))
}

/// A stored release on the wire.
pub fn release_info(r: &ReleaseRow) -> wire::ReleaseInfo {
    wire::ReleaseInfo {
        version: r.version.clone(),
        arch: r.arch.clone(),
        size: r.size,
        sha256: r.sha256.clone(),
        key: r.key.clone(),
        uploaded_ns: r.uploaded.as_nanos(),
        uploaded_by: r.by.clone(),
    }
}

/// Runs one `AgentUpdate` request for `caller`.
pub async fn agent_update(
    app: &App,
    caller: &Caller,
    req: wire::AgentUpdateRequest,
) -> Result<wire::AgentUpdateReply, Status> {
    use wire::AgentUpdateCommand as C;
    let id = (req.id != 0).then_some(req.id);
    let command = match C::try_from(req.command).unwrap_or(C::Unspecified) {
        C::Unspecified => {
            return Err(Status::invalid_argument(
                "agent-update: name a command (start, status, list, pause, resume, abort)",
            ));
        }
        C::Start => {
            let (row, left_out) = app
                .start_agent_update(caller, &req.version, &req.plan)
                .await
                .map_err(status)?;
            let mut info = info(&row);
            if !left_out.is_empty() {
                info.reason = format!("left out: {}", left_out.join("; "));
            }
            return Ok(wire::AgentUpdateReply {
                updates: vec![info],
            });
        }
        C::List => {
            let rows = app.agent_update_list(caller).await.map_err(status)?;
            return Ok(wire::AgentUpdateReply {
                updates: rows.iter().map(info).collect(),
            });
        }
        C::Status => {
            let s = app.agent_update_status(caller, id).await.map_err(status)?;
            return Ok(wire::AgentUpdateReply {
                updates: vec![status_info(&s)],
            });
        }
        C::Pause => RolloutCommand::Pause,
        C::Resume => RolloutCommand::Resume,
        C::Abort => RolloutCommand::Abort,
    };
    let row = app
        .agent_update_command(caller, id, command, &req.reason)
        .await
        .map_err(status)?;
    Ok(wire::AgentUpdateReply {
        updates: vec![info(&row)],
    })
}

fn info(r: &AgentUpdateRow) -> wire::AgentUpdateInfo {
    let m = &r.machine;
    wire::AgentUpdateInfo {
        id: r.id,
        version: r.version.clone(),
        state: m.state.as_str().into(),
        stage: m.stage,
        stages: 0,
        reason: m.reason.clone(),
        created_ns: m.created.as_nanos(),
        updated_ns: m.updated.as_nanos(),
        created_by: r.by.clone(),
        verdicts: m.verdicts.iter().map(verdict).collect(),
        targets: r.targets.len() as u64,
        members: m.members.len() as u64,
        agents: Vec::new(),
    }
}

fn status_info(s: &UpdateStatus) -> wire::AgentUpdateInfo {
    wire::AgentUpdateInfo {
        stages: u32::try_from(s.stages).unwrap_or(u32::MAX),
        agents: s
            .agents
            .iter()
            .map(|a| wire::AgentUpdateAgent {
                id: a.view.id.clone(),
                agent_version: a.agent.agent_version.clone(),
                arch: a.agent.arch.clone(),
                connected: a.view.connected,
                stage: a.stage,
                skipped: a.skipped,
                update: a.agent.update.as_ref().map(convert::update_to_wire),
            })
            .collect(),
        ..info(&s.row)
    }
}
