//! The Admin service's `Rollout` call: the application's rollout status,
//! list and commands in wire types.

use baton_proto::wire;
use tonic::Status;

use super::convert::status;
use baton_app::rollouts::{RolloutCommand, RolloutStatus};
use baton_app::{App, AppError, Caller};
use baton_model::{CohortFigures, RolloutRow, VerdictRow};
use baton_model::{RefTime, SpanNanos};

/// Runs one `Rollout` request for `caller`.
pub async fn rollout(
    app: &App,
    caller: &Caller,
    req: wire::RolloutRequest,
) -> Result<wire::RolloutReply, Status> {
    use wire::RolloutCommand as C;
    let command = match C::try_from(req.command).unwrap_or(C::Unspecified) {
        C::Unspecified => {
            return Err(Status::invalid_argument(
                "rollout: name a command (status, list, pause, resume, abort)",
            ));
        }
        C::List => {
            let rows = app.rollout_list(caller).await.map_err(status)?;
            return Ok(wire::RolloutReply {
                rollouts: rows.iter().map(info).collect(),
            });
        }
        C::Status => {
            let s = app
                .rollout_status(caller, &req.tenant, &req.pack)
                .await
                .map_err(status)?;
            return Ok(wire::RolloutReply {
                rollouts: vec![status_info(&s)],
            });
        }
        C::Pause => RolloutCommand::Pause,
        C::Resume => RolloutCommand::Resume,
        C::Abort => RolloutCommand::Abort,
    };
    if req.pack.is_empty() {
        return Err(status(AppError::Invalid("rollout: name the pack".into())));
    }
    let row = app
        .rollout_command(caller, &req.tenant, &req.pack, command)
        .await
        .map_err(status)?;
    Ok(wire::RolloutReply {
        rollouts: vec![info(&row)],
    })
}

fn figures(f: &CohortFigures) -> wire::RolloutFigures {
    wire::RolloutFigures {
        agents: f.agents,
        settled: f.settled,
        failed: f.failed,
        unknown: f.unknown,
        lateness_p99_ns: f.lateness_p99.map(SpanNanos::nanos),
        offset_max_ns: f.offset_max.map(SpanNanos::nanos),
    }
}

pub(crate) fn verdict(v: &VerdictRow) -> wire::RolloutVerdict {
    wire::RolloutVerdict {
        stage: v.stage,
        kind: v.kind.as_str().into(),
        reason: v.reason.clone(),
        cohort: Some(figures(&v.cohort)),
        baseline: v.baseline.as_ref().map(figures),
        missing: v.missing.clone(),
        since_ns: v.since.as_nanos(),
        at_ns: v.at.as_nanos(),
    }
}

fn info(r: &RolloutRow) -> wire::RolloutInfo {
    wire::RolloutInfo {
        tenant: r.tenant.clone(),
        pack: r.pack.clone(),
        version: r.version,
        from: r.from,
        state: r.state.as_str().into(),
        stage: r.stage,
        stages: 0,
        reason: r.reason.clone(),
        rollback: r.rollback,
        created_ns: r.created.as_nanos(),
        updated_ns: r.updated.as_nanos(),
        stage_started_ns: r.stage_started.map(RefTime::as_nanos),
        soak_from_ns: r.soak_from.map(RefTime::as_nanos),
        verdicts: r.verdicts.iter().map(verdict).collect(),
        members: r.members.len() as u64,
        agents: Vec::new(),
        cohort: None,
        baseline: None,
    }
}

fn status_info(s: &RolloutStatus) -> wire::RolloutInfo {
    wire::RolloutInfo {
        stages: u32::try_from(s.stages).unwrap_or(u32::MAX),
        agents: s
            .agents
            .iter()
            .map(|a| wire::RolloutAgentInfo {
                id: a.view.id.clone(),
                stage: a.stage,
                skipped: a.skipped,
                held: a.held,
                connected: a.view.connected,
                canary: a.view.canary,
                refused: a.view.refused.clone().unwrap_or_default(),
            })
            .collect(),
        cohort: Some(figures(&s.cohort)),
        baseline: s.baseline.as_ref().map(figures),
        ..info(&s.row)
    }
}
