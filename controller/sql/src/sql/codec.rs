//! Between Rust values and columns: checked integer conversions, the JSON
//! of the few columns read and written whole (labels, targets, errors),
//! and the decoders of every row. Every failure names the row it came
//! from.

use std::collections::BTreeMap;
use std::fmt;

use baton_proto::wire;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

pub(crate) use super::db::with_row;
use super::db::{Row, col};
use baton_model::time::{self, RefTime, SignedDuration};
use baton_store::{
    Activation, ClockRow, DeliveryRow, DeliveryState, ErrorRow, FeedbackRow, Held, Intent,
    PackVersionRow, Refusal, StagedRow, StoreError, StoreResult, TargetsRow,
};

/// Stored `what` does not read back (or a value cannot be written as the
/// column's JSON).
pub(crate) fn corrupt(what: &str, e: impl fmt::Display) -> StoreError {
    StoreError::corrupt(what, e)
}

/// A u64 as BIGINT; values past `i64::MAX` are refused, never wrapped.
pub(crate) fn to_db(v: u64, what: &'static str) -> StoreResult<i64> {
    baton_store::fits(v, what)
}

pub(crate) fn u64_from_db(v: i64, what: &str) -> StoreResult<u64> {
    u64::try_from(v).map_err(|_| StoreError::corrupt(what, format!("negative: {v}")))
}

/// An instant column (integer nanoseconds since the epoch).
pub(crate) fn instant_col(row: &dyn Row, name: &str) -> StoreResult<RefTime> {
    col::<i64>(row, name).map(time::at)
}

/// A nullable instant column.
pub(crate) fn opt_instant_col(row: &dyn Row, name: &str) -> StoreResult<Option<RefTime>> {
    col::<Option<i64>>(row, name).map(|v| v.map(time::at))
}

/// A span column (integer nanoseconds).
pub(crate) fn span_col(row: &dyn Row, name: &str) -> StoreResult<SignedDuration> {
    col::<i64>(row, name).map(time::span)
}

pub(crate) fn u32_from_db(v: i64, what: &str) -> StoreResult<u32> {
    u32::try_from(v).map_err(|_| StoreError::corrupt(what, format!("not a u32: {v}")))
}

pub(crate) fn to_json<T: Serialize>(v: &T, what: &str) -> StoreResult<String> {
    serde_json::to_string(v).map_err(|e| corrupt(&format!("encode {what}"), e))
}

pub(crate) fn from_json<T: DeserializeOwned>(s: &str, what: &str) -> StoreResult<T> {
    serde_json::from_str(s).map_err(|e| corrupt(&format!("decode stored {what}"), e))
}

/// [`ErrorRow`] as stored in `deliveries.refused_errors`.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ErrorJson {
    line: u32,
    column: u32,
    instruction: String,
    message: String,
}

/// [`TargetsRow`] as stored in `packs.targets` and `pack_versions.targets`.
#[derive(Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
enum TargetsJson {
    Nobody,
    Agents { ids: Vec<String> },
    Labels { labels: BTreeMap<String, String> },
}

pub(crate) fn targets_json(t: &TargetsRow) -> StoreResult<String> {
    let v = match t {
        TargetsRow::Nobody => TargetsJson::Nobody,
        TargetsRow::Agents(ids) => TargetsJson::Agents { ids: ids.clone() },
        TargetsRow::Labels(labels) => TargetsJson::Labels {
            labels: labels.clone(),
        },
    };
    to_json(&v, "targets")
}

pub(crate) fn targets_from_json(s: &str) -> StoreResult<TargetsRow> {
    Ok(match from_json(s, "targets")? {
        TargetsJson::Nobody => TargetsRow::Nobody,
        TargetsJson::Agents { ids } => TargetsRow::Agents(ids),
        TargetsJson::Labels { labels } => TargetsRow::Labels(labels),
    })
}

pub(crate) fn errors_json(errors: &[ErrorRow]) -> StoreResult<String> {
    let v: Vec<ErrorJson> = errors
        .iter()
        .map(|e| ErrorJson {
            line: e.line,
            column: e.column,
            instruction: e.instruction.clone(),
            message: e.message.clone(),
        })
        .collect();
    to_json(&v, "errors")
}

fn errors_from_json(s: &str) -> StoreResult<Vec<ErrorRow>> {
    let v: Vec<ErrorJson> = from_json(s, "errors")?;
    Ok(v.into_iter()
        .map(|e| ErrorRow {
            line: e.line,
            column: e.column,
            instruction: e.instruction,
            message: e.message,
        })
        .collect())
}

pub(crate) const CLOCK_COLUMNS: &str =
    "source, state, offset_ns, jitter_ns, uncertainty_ns, frequency_ppm, at_ns";

pub(crate) fn decode_clock(row: &dyn Row) -> StoreResult<ClockRow> {
    Ok(ClockRow {
        source: col(row, "source")?,
        state: col(row, "state")?,
        offset: span_col(row, "offset_ns")?,
        jitter: span_col(row, "jitter_ns")?,
        uncertainty: span_col(row, "uncertainty_ns")?,
        frequency_ppm: col(row, "frequency_ppm")?,
        at: instant_col(row, "at_ns")?,
    })
}

pub(crate) fn decode_pack_version(row: &dyn Row) -> StoreResult<PackVersionRow> {
    let tenant: String = col(row, "tenant")?;
    let pack: String = col(row, "pack")?;
    let version: i64 = col(row, "version")?;
    let r = (|| {
        Ok(PackVersionRow {
            tenant: tenant.clone(),
            pack: pack.clone(),
            version: u64_from_db(version, "version")?,
            yaml: col(row, "yaml")?,
            targets: targets_from_json(&col::<String>(row, "targets")?)?,
            pushed: instant_col(row, "pushed_ns")?,
            rollout: col::<i64>(row, "rollout")? != 0,
        })
    })();
    with_row(format_args!("pack {tenant}/{pack} v{version}"), r)
}

pub(crate) const DELIVERY_COLUMNS: &str = "agent_id, tenant, pack, version, intent, held_version, \
     held_stopped, refused_version, refused_last, refused_message, refused_errors, state, reason, \
     attempts, updated_ns, activate_ns, staged_version, staged_at_ns";

pub(crate) fn decode_delivery(row: &dyn Row) -> StoreResult<DeliveryRow> {
    let agent_id: String = col(row, "agent_id")?;
    let tenant: String = col(row, "tenant")?;
    let pack: String = col(row, "pack")?;
    let r = (|| {
        let intent: String = col(row, "intent")?;
        let state: String = col(row, "state")?;
        let held = match col::<Option<i64>>(row, "held_version")? {
            Some(v) => Some(Held {
                version: u64_from_db(v, "held version")?,
                stopped: col::<Option<i64>>(row, "held_stopped")?.unwrap_or(0) != 0,
            }),
            None => None,
        };
        let refusal = match col::<Option<i64>>(row, "refused_version")? {
            Some(v) => Some(Refusal {
                version: u64_from_db(v, "refused version")?,
                last: col::<Option<i64>>(row, "refused_last")?.unwrap_or(0) != 0,
                message: col::<Option<String>>(row, "refused_message")?.unwrap_or_default(),
                errors: match col::<Option<String>>(row, "refused_errors")? {
                    Some(e) => errors_from_json(&e)?,
                    None => Vec::new(),
                },
            }),
            None => None,
        };
        Ok(DeliveryRow {
            agent_id: agent_id.clone(),
            tenant: tenant.clone(),
            pack: pack.clone(),
            version: u64_from_db(col(row, "version")?, "version")?,
            intent: Intent::parse(&intent)
                .ok_or_else(|| StoreError::corrupt("intent", format!("unknown: {intent:?}")))?,
            held,
            refusal,
            state: DeliveryState::parse(&state)
                .ok_or_else(|| StoreError::corrupt("state", format!("unknown: {state:?}")))?,
            reason: col(row, "reason")?,
            attempts: u32_from_db(col(row, "attempts")?, "attempts")?,
            updated: instant_col(row, "updated_ns")?,
            activate: Activation::from_db(col(row, "activate_ns")?),
            staged: match col::<Option<i64>>(row, "staged_version")? {
                Some(v) => Some(StagedRow {
                    version: u64_from_db(v, "staged version")?,
                    at: time::at(col::<Option<i64>>(row, "staged_at_ns")?.unwrap_or(0)),
                }),
                None => None,
            },
        })
    })();
    with_row(format_args!("delivery of {tenant}/{pack} to {agent_id}"), r)
}

/// The execution id a row spells without storing it: `None` when the row
/// has no occurrence to name.
pub(crate) fn canonical_execution_id(r: &FeedbackRow) -> Option<String> {
    let occ = r.occurrence?.as_nanos();
    Some(format!(
        "{}/{}/v{}/{}/{occ}/a{}",
        r.tenant, r.pack, r.version, r.instruction, r.attempt
    ))
}

/// Feedback columns, `f` the feedback table, `j` its journal.
pub(crate) const FEEDBACK_COLUMNS: &str = "f.id, j.agent_id, j.journal_id, f.seq, f.tenant, \
     f.pack, f.version, f.instruction, f.execution_id, f.occurrence_ns, f.attempt, \
     f.scheduled_ns, f.actual_ns, f.lateness_ns, f.outcome, f.reason, f.event, f.action, \
     f.detail, f.value, f.dropped_before, f.uncertainty_ns, f.clock_source, f.clock_state, \
     f.received_ns";

pub(crate) fn decode_feedback(row: &dyn Row) -> StoreResult<FeedbackRow> {
    let agent_id: String = col(row, "agent_id")?;
    let journal_id: String = col(row, "journal_id")?;
    let seq: i64 = col(row, "seq")?;
    let r = (|| {
        let mut r = FeedbackRow {
            id: u64_from_db(col(row, "id")?, "id")?,
            agent_id: agent_id.clone(),
            journal_id: journal_id.clone(),
            seq: u64_from_db(seq, "seq")?,
            execution_id: String::new(),
            tenant: col(row, "tenant")?,
            pack: col(row, "pack")?,
            version: u64_from_db(col(row, "version")?, "version")?,
            instruction: col(row, "instruction")?,
            occurrence: opt_instant_col(row, "occurrence_ns")?,
            attempt: u32_from_db(col(row, "attempt")?, "attempt")?,
            scheduled: instant_col(row, "scheduled_ns")?,
            actual: instant_col(row, "actual_ns")?,
            lateness: span_col(row, "lateness_ns")?,
            // Unknown numbers (a newer agent's) read as unspecified.
            outcome: wire::Outcome::try_from(col::<i32>(row, "outcome")?)
                .unwrap_or(wire::Outcome::Unspecified),
            reason: wire::Reason::try_from(col::<i32>(row, "reason")?)
                .unwrap_or(wire::Reason::Unspecified),
            event: col(row, "event")?,
            action: col(row, "action")?,
            detail: col(row, "detail")?,
            value: col::<Option<i64>>(row, "value")?
                .map(|v| u32_from_db(v, "value"))
                .transpose()?,
            dropped_before: u64_from_db(col(row, "dropped_before")?, "dropped_before")?,
            uncertainty: span_col(row, "uncertainty_ns")?,
            clock_source: wire::ClockSource::try_from(col::<i32>(row, "clock_source")?)
                .unwrap_or(wire::ClockSource::Unspecified),
            clock_state: wire::ClockState::try_from(col::<i32>(row, "clock_state")?)
                .unwrap_or(wire::ClockState::Unspecified),
            received: instant_col(row, "received_ns")?,
        };
        r.execution_id = match col::<Option<String>>(row, "execution_id")? {
            Some(id) => id,
            None => canonical_execution_id(&r).unwrap_or_default(),
        };
        Ok(r)
    })();
    with_row(format_args!("feedback {agent_id}/{journal_id}#{seq}"), r)
}
