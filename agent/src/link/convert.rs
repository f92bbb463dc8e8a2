//! Outbox records (the JSON that `runtime::feedback` journals) into
//! `wire::Feedback`, on the link thread: the control thread only reads
//! pages of bytes from the journal, never encodes for the wire.
//!
//! | record | `outcome` |
//! |---|---|
//! | `executed`, result `ok` | `OK` |
//! | `executed`, result `failed` | `FAILED` |
//! | `executed`, result `late` / `withdrawn` / `stopped` (not run) | `SKIPPED` (the word leads `detail`) |
//! | `retry` | `RETRY` |
//! | `skip` | `SKIPPED` |
//! | `fail` | `FAILED` |
//! | `give_up` | `GIVE_UP` |
//! | `on_failure` (issued only on a give-up) | `GIVE_UP` |
//! | `safe_state` | `SAFE_STATE` |
//! | `outcome_unknown` | `UNKNOWN` |
//! | anything unreadable or unknown | `UNSPECIFIED`, `detail` = the raw record |
//!
//! `event` always carries the agent's own word, so a controller can tell
//! an `on_failure` from the `give_up` before it. The attempt and version
//! come from the execution id (`tenant/pack/vN/instr/occ_ns/aK`) when there
//! is one, else from the record's `version`. Nothing is ever dropped: a
//! record that cannot be read is still sent, with its text.

use baton_proto::wire;
use baton_sched::ExecutionId;
use serde_json::Value;

/// The wire form of outbox record `seq` (its JSON bytes as journalled).
pub fn feedback(seq: u64, record: &[u8]) -> wire::Feedback {
    match serde_json::from_slice::<Value>(record) {
        Ok(Value::Object(m)) if m.get("event").is_some_and(Value::is_string) => {
            from_fields(seq, &Value::Object(m))
        }
        _ => unreadable(seq, record),
    }
}

/// A record this code cannot read: still sent, its text in `detail`.
fn unreadable(seq: u64, record: &[u8]) -> wire::Feedback {
    wire::Feedback {
        seq,
        outcome: wire::Outcome::Unspecified as i32,
        detail: String::from_utf8_lossy(record).into_owned(),
        ..wire::Feedback::default()
    }
}

fn text<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or_default()
}

fn int(v: &Value, key: &str) -> i64 {
    v.get(key).and_then(Value::as_i64).unwrap_or_default()
}

fn from_fields(seq: u64, v: &Value) -> wire::Feedback {
    use wire::Outcome as O;
    let event = text(v, "event");
    let id_text = text(v, "execution_id");
    // Side actions carry a descriptive id that is not an execution id
    // (`tenant/pack safe_state (cancel)@ns`): only a real one is sent.
    let id = ExecutionId::parse(id_text);
    let (tenant, pack) = text(v, "pack").split_once('/').unwrap_or(("", ""));
    let version = id
        .as_ref()
        .map(|i| i.version)
        .or_else(|| v.get("version").and_then(Value::as_u64))
        .unwrap_or_default();
    let mut detail = text(v, "detail").to_string();
    let (outcome, scheduled_ns, actual_ns, lateness_ns) = if event == "executed" {
        let result = text(v, "result");
        let outcome = match result {
            "ok" => O::Ok,
            "failed" => O::Failed,
            "late" | "withdrawn" | "stopped" => {
                detail = if detail.is_empty() {
                    result.to_string()
                } else {
                    format!("{result}: {detail}")
                };
                O::Skipped
            }
            _ => O::Unspecified,
        };
        (
            outcome,
            int(v, "scheduled_ns"),
            int(v, "actual_ns"),
            int(v, "lateness_ns"),
        )
    } else {
        let outcome = match event {
            "retry" => O::Retry,
            "skip" => O::Skipped,
            "fail" => O::Failed,
            "give_up" | "on_failure" => O::GiveUp,
            "safe_state" => O::SafeState,
            "outcome_unknown" => O::Unknown,
            "ok" => O::Ok,
            _ => O::Unspecified,
        };
        // A core event: when it was decided, about which occurrence.
        (outcome, int(v, "occurrence_ns"), int(v, "t_ns"), 0)
    };
    if outcome == O::Unspecified {
        return unreadable(seq, v.to_string().as_bytes());
    }
    wire::Feedback {
        seq,
        execution_id: if id.is_some() {
            id_text.to_string()
        } else {
            String::new()
        },
        pack: Some(wire::PackRef {
            tenant: tenant.to_string(),
            pack: pack.to_string(),
            version,
        }),
        instruction: text(v, "instruction").to_string(),
        attempt: id.as_ref().map(|i| i.attempt).unwrap_or_default(),
        scheduled_ns,
        actual_ns,
        lateness_ns,
        outcome: outcome as i32,
        detail,
        value: v
            .get("value")
            .and_then(Value::as_u64)
            .and_then(|n| u32::try_from(n).ok()),
        dropped_before: 0,
        event: event.to_string(),
        action: text(v, "action").to_string(),
        uncertainty_ns: int(v, "uncertainty_ns"),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    //! Records are made by the real writers (`runtime::feedback`) into a
    //! real journal and read back, so this table follows what is written.

    use super::*;
    use crate::dispatcher::NotRun;
    use crate::journal::{Journal, JournalConfig};
    use crate::runtime::feedback::{Tally, event, executed};
    use crate::runtime::record::{FiringRecord, FiringResult, Origin};
    use baton_proto::RefTime;
    use baton_sched::{Event, EventKind, PackKey, SafeReason};
    use wire::Outcome as O;

    const ID: &str = "plant-a/press/v7/stamp/1796000000000000000/a2";

    fn key() -> PackKey {
        PackKey {
            tenant: "plant-a".into(),
            pack: "press".into(),
        }
    }

    fn journal() -> (tempfile::TempDir, Journal) {
        let dir = tempfile::tempdir().expect("tempdir");
        let (j, _) = Journal::open(JournalConfig::new(dir.path())).expect("journal");
        (dir, j)
    }

    fn last(j: &mut Journal) -> wire::Feedback {
        let (seq, rec) = j
            .outbox_page(0, usize::MAX)
            .expect("page")
            .pop()
            .expect("a record");
        feedback(seq, &rec)
    }

    fn executed_one(result: FiringResult, origin: Origin) -> wire::Feedback {
        let (_d, mut j) = journal();
        let k = key();
        let side = origin != Origin::Attempt;
        let rec = FiringRecord {
            id: if side {
                "plant-a/press safe_state (cancel)@5"
            } else {
                ID
            },
            pack: &k,
            instruction: if side { "safe_state" } else { "stamp" },
            origin,
            action: "gpio.write",
            scheduled: RefTime::from_nanos(1_796_000_000_000_000_000),
            actual: RefTime::from_nanos(1_796_000_000_000_120_000),
            lateness_ns: 120_000,
            result,
        };
        executed(
            &mut j,
            &mut Tally::default(),
            &rec,
            side.then_some(7),
            2_500,
        )
        .expect("push");
        last(&mut j)
    }

    fn event_one(kind: EventKind, with_id: bool) -> wire::Feedback {
        let (_d, mut j) = journal();
        let id = ExecutionId::parse(ID).expect("id");
        let e = Event {
            t: RefTime::from_nanos(1_796_000_000_500_000_000),
            pack: key(),
            instruction: with_id.then(|| "stamp".to_string()),
            occurrence: with_id.then_some(id.occurrence),
            id: with_id.then_some(id),
            kind,
            once: None,
        };
        event(&mut j, &mut Tally::default(), &e, Some(7), 3_000).expect("push");
        last(&mut j)
    }

    #[test]
    fn executed_records_carry_their_times_attempt_and_result() {
        let f = executed_one(FiringResult::Ok { value: Some(1) }, Origin::Attempt);
        assert_eq!(f.seq, 1);
        assert_eq!(f.outcome(), O::Ok);
        assert_eq!(f.event, "executed");
        assert_eq!(f.execution_id, ID);
        let p = f.pack.clone().expect("pack");
        assert_eq!(
            (p.tenant.as_str(), p.pack.as_str(), p.version),
            ("plant-a", "press", 7)
        );
        assert_eq!((f.instruction.as_str(), f.attempt), ("stamp", 2));
        assert_eq!(f.action, "gpio.write");
        assert_eq!(f.scheduled_ns, 1_796_000_000_000_000_000);
        assert_eq!(f.actual_ns, 1_796_000_000_000_120_000);
        assert_eq!(f.lateness_ns, 120_000);
        assert_eq!(f.value, Some(1));
        assert_eq!(f.detail, "");
        assert_eq!(f.uncertainty_ns, 2_500, "the clock's uncertainty at firing");

        let f = executed_one(FiringResult::Failed("EBUSY".into()), Origin::Attempt);
        assert_eq!(
            (f.outcome(), f.detail.as_str(), f.value),
            (O::Failed, "EBUSY", None)
        );

        for (why, word) in [
            (NotRun::Late, "late"),
            (NotRun::Withdrawn, "withdrawn"),
            (NotRun::Stopped, "stopped"),
        ] {
            let f = executed_one(FiringResult::NotRun(why), Origin::Attempt);
            assert_eq!(f.outcome(), O::Skipped, "{word}");
            assert!(f.detail.starts_with(&format!("{word}: ")), "{}", f.detail);
        }
    }

    #[test]
    fn a_side_action_has_no_execution_id_but_its_version() {
        let f = executed_one(
            FiringResult::Ok { value: None },
            Origin::SafeState(SafeReason::Cancel),
        );
        assert_eq!(f.outcome(), O::Ok);
        assert_eq!(f.execution_id, "");
        assert_eq!(f.attempt, 0);
        assert_eq!(f.instruction, "safe_state");
        assert_eq!(f.pack.map(|p| p.version), Some(7));
    }

    #[test]
    fn every_core_event_maps_to_its_outcome() {
        let cases = [
            (
                EventKind::Retry {
                    at: RefTime::from_nanos(1),
                },
                O::Retry,
                "retry",
            ),
            (
                EventKind::Skip {
                    reason: "late".into(),
                },
                O::Skipped,
                "skip",
            ),
            (
                EventKind::Fail {
                    reason: "EIO".into(),
                },
                O::Failed,
                "fail",
            ),
            (
                EventKind::GiveUp {
                    reason: "3 attempts".into(),
                },
                O::GiveUp,
                "give_up",
            ),
            (EventKind::OnFailure, O::GiveUp, "on_failure"),
            (EventKind::OutcomeUnknown, O::Unknown, "outcome_unknown"),
        ];
        for (kind, outcome, name) in cases {
            let f = event_one(kind, true);
            assert_eq!((f.outcome(), f.event.as_str()), (outcome, name));
            assert_eq!(f.execution_id, ID, "{name}");
            assert_eq!(f.attempt, 2, "{name}");
            assert_eq!(f.instruction, "stamp");
            assert_eq!(f.pack.map(|p| p.version), Some(7));
            assert_eq!(f.scheduled_ns, 1_796_000_000_000_000_000, "the occurrence");
            assert_eq!(f.actual_ns, 1_796_000_000_500_000_000, "when decided");
        }
        // Pack-wide: no id, no instruction; the version from the record.
        let f = event_one(
            EventKind::SafeState {
                reason: SafeReason::LeaseLost,
            },
            false,
        );
        assert_eq!(
            (f.outcome(), f.event.as_str()),
            (O::SafeState, "safe_state")
        );
        assert_eq!(f.uncertainty_ns, 3_000, "events carry the uncertainty too");
        assert_eq!((f.execution_id.as_str(), f.instruction.as_str()), ("", ""));
        assert_eq!(
            f.pack.map(|p| (p.pack, p.version)),
            Some(("press".into(), 7))
        );
        assert_eq!(f.detail, "safe state (lease_lost)");
    }

    #[test]
    fn an_unreadable_record_is_sent_with_its_text() {
        for raw in [
            &b"not json"[..],
            b"[1, 2]",
            b"{\"no_event\": 1}",
            b"{\"event\": \"dance\"}",
            b"\xff\xfe",
        ] {
            let f = feedback(9, raw);
            assert_eq!((f.seq, f.outcome()), (9, O::Unspecified));
            assert!(!f.detail.is_empty());
        }
        assert_eq!(feedback(1, b"not json").detail, "not json");
        let f = feedback(2, b"{\"event\":\"executed\",\"result\":\"exploded\"}");
        assert_eq!(f.outcome(), O::Unspecified);
        assert!(f.detail.contains("exploded"), "{}", f.detail);
    }
}
