//! The link's conversion of outbox records into `wire::Feedback`
//! (`baton_agent_link::link::convert`), tried on records made by the real
//! writers (`runtime::feedback`) into a real journal and read back, so
//! this table follows what is written. Here, beside the writers, because
//! the link's crate sits below the runtime and cannot import it.

use baton_agent::dispatcher::NotRun;
use baton_agent::link::convert::feedback;
use baton_agent::runtime::feedback::{ClockStamp, Tally, event, executed};
use baton_agent::runtime::record::{FiringRecord, FiringResult, Origin};
use baton_journal::{Journal, JournalConfig};
use baton_proto::RefTime;
use baton_proto::feedback::{ClockSource, ClockState, Reason};
use baton_proto::wire;
use baton_sched::{Event, EventKind, ExecutionId, PackKey, SafeReason};
use wire::Outcome as O;

const CLOCK: ClockStamp = ClockStamp {
    uncertainty_ns: 2_500,
    source: Some(ClockSource::Ntp),
    state: Some(ClockState::Locked),
};

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
    feedback(seq, &rec, 0)
}

fn executed_one(result: FiringResult, origin: Origin) -> wire::Feedback {
    let (_d, mut j) = journal();
    let k = key();
    let side = origin != Origin::Attempt;
    let exec = ExecutionId::parse(ID).expect("id");
    let rec = FiringRecord {
        execution: (!side).then_some(&exec),
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
        CLOCK,
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
        version: None,
        once: None,
    };
    let clock = ClockStamp {
        uncertainty_ns: 3_000,
        ..CLOCK
    };
    event(&mut j, &mut Tally::default(), &e, Some(7), clock).expect("push");
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
    assert_eq!(
        (f.clock_source(), f.clock_state()),
        (wire::ClockSource::Ntp, wire::ClockState::Locked)
    );
    assert_eq!(f.occurrence_ns, 1_796_000_000_000_000_000);
    assert_eq!(f.reason(), wire::Reason::Unspecified);

    let f = executed_one(FiringResult::Failed("EBUSY".into()), Origin::Attempt);
    assert_eq!(
        (f.outcome(), f.detail.as_str(), f.value),
        (O::Failed, "EBUSY", None)
    );

    // Not run: SKIPPED with a typed reason; no word folded into detail.
    for (why, reason) in [
        (NotRun::Late, wire::Reason::Late),
        (NotRun::Withdrawn, wire::Reason::Withdrawn),
        (NotRun::Stopped, wire::Reason::Shutdown),
        (NotRun::Replaced, wire::Reason::Replaced),
        (NotRun::TimedOut, wire::Reason::Timeout),
    ] {
        let f = executed_one(FiringResult::NotRun(why), Origin::Attempt);
        assert_eq!((f.outcome(), f.reason()), (O::Skipped, reason));
        assert_eq!(f.detail, FiringResult::NotRun(why).detail());
        assert_eq!(f.execution_id, ID);
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
    assert_eq!(f.pack.as_ref().map(|p| p.version), Some(7));
    assert_eq!(f.reason(), wire::Reason::Cancel, "what called for it");
    assert_eq!(f.occurrence_ns, 0);
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
                reason: Reason::Late,
                detail: "late by 3s".into(),
            },
            O::Skipped,
            "skip",
        ),
        (
            EventKind::Fail {
                reason: None,
                detail: "EIO".into(),
            },
            O::Failed,
            "fail",
        ),
        (
            EventKind::GiveUp {
                reason: Reason::Failed,
                detail: "3 attempts".into(),
            },
            O::GiveUp,
            "give_up",
        ),
        (EventKind::OnFailure, O::GiveUp, "on_failure"),
        (EventKind::OutcomeUnknown, O::Unknown, "outcome_unknown"),
    ];
    for (kind, outcome, name) in cases {
        let reason = kind.reason().map_or(0, Reason::code);
        let detail = match &kind {
            EventKind::Skip { detail, .. }
            | EventKind::Fail { detail, .. }
            | EventKind::GiveUp { detail, .. } => detail.clone(),
            _ => String::new(),
        };
        let f = event_one(kind, true);
        assert_eq!((f.outcome(), f.event.as_str()), (outcome, name));
        assert_eq!(f.reason, reason, "{name}: typed reason beside the detail");
        if !detail.is_empty() {
            assert_eq!(f.detail, detail, "{name}: the words, unprefixed");
        }
        assert_eq!(f.occurrence_ns, 1_796_000_000_000_000_000, "{name}");
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
        f.pack.clone().map(|p| (p.pack, p.version)),
        Some(("press".into(), 7))
    );
    assert_eq!(f.detail, "safe state (lease_lost)");
    assert_eq!(f.reason(), wire::Reason::Lease);
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
        let f = feedback(9, raw, 2);
        assert_eq!((f.seq, f.outcome()), (9, O::Unspecified));
        assert_eq!(
            f.dropped_before, 2,
            "a gap is reported even on an unreadable entry"
        );
        assert!(!f.detail.is_empty());
    }
    assert_eq!(feedback(1, b"not json", 0).detail, "not json");
    let f = feedback(2, b"{\"event\":\"executed\",\"result\":\"exploded\"}", 0);
    assert_eq!(f.outcome(), O::Unspecified);
    assert!(f.detail.contains("exploded"), "{}", f.detail);
}

/// Records as agents before the binary outbox wrote them (the JSON of
/// `runtime/feedback.rs` at 8065a4c, byte for byte), pushed into a real
/// journal and drained by this code: an outbox survives the upgrade.
#[test]
fn json_records_of_older_agents_still_drain() {
    let old: [&[u8]; 5] = [
        br#"{"event":"executed","execution_id":"plant-a/press/v7/stamp/1796000000000000000/a2","pack":"plant-a/press","instruction":"stamp","action":"gpio.write","scheduled_ns":1796000000000000000,"actual_ns":1796000000000120000,"lateness_ns":120000,"result":"ok","value":1,"uncertainty_ns":2500}"#,
        br#"{"event":"executed","execution_id":"plant-a/press/v7/stamp/1796000000000000000/a1","pack":"plant-a/press","instruction":"stamp","action":"gpio.write","scheduled_ns":1796000000000000000,"actual_ns":1796000000900000000,"lateness_ns":900000000,"result":"late","detail":"reached after its max_lateness","value":null,"uncertainty_ns":2500}"#,
        br#"{"event":"executed","execution_id":"plant-a/press safe_state (cancel)@5","pack":"plant-a/press","version":7,"instruction":"safe_state","action":"gpio.write","scheduled_ns":5,"actual_ns":6,"lateness_ns":1,"result":"ok","value":null,"uncertainty_ns":0}"#,
        br#"{"event":"give_up","t_ns":1796000000500000000,"pack":"plant-a/press","version":7,"instruction":"stamp","execution_id":null,"occurrence_ns":1796000000000000000,"uncertainty_ns":3000,"detail":"missed: late by 500ms (max_lateness 50ms)"}"#,
        br#"{"event":"safe_state","t_ns":1796000000500000000,"pack":"plant-a/press","version":7,"instruction":null,"execution_id":null,"occurrence_ns":null,"uncertainty_ns":3000,"detail":"safe state (lease_lost)"}"#,
    ];
    let (_d, mut j) = journal();
    for r in old {
        j.push_feedback(r).expect("push");
    }
    let page = j.outbox_page(0, usize::MAX).expect("page");
    let got: Vec<wire::Feedback> = page.iter().map(|(s, r)| feedback(*s, r, 0)).collect();
    assert_eq!(got.len(), 5);
    assert!(got.iter().all(|f| f.outcome() != O::Unspecified), "{got:?}");

    let ok = &got[0];
    assert_eq!((ok.outcome(), ok.event.as_str()), (O::Ok, "executed"));
    assert_eq!(
        ok.execution_id,
        "plant-a/press/v7/stamp/1796000000000000000/a2"
    );
    assert_eq!(
        (ok.attempt, ok.value, ok.lateness_ns),
        (2, Some(1), 120_000)
    );
    assert_eq!(ok.occurrence_ns, 1_796_000_000_000_000_000);
    assert_eq!(ok.pack.as_ref().map(|p| p.version), Some(7));

    let late = &got[1];
    assert_eq!(
        (late.outcome(), late.reason()),
        (O::Skipped, wire::Reason::Late)
    );
    assert_eq!(
        late.detail, "reached after its max_lateness",
        "no word folded in"
    );

    let side = &got[2];
    assert_eq!((side.execution_id.as_str(), side.attempt), ("", 0));
    assert_eq!(side.pack.as_ref().map(|p| p.version), Some(7));

    let give_up = &got[3];
    assert_eq!(
        (give_up.outcome(), give_up.event.as_str()),
        (O::GiveUp, "give_up")
    );
    assert_eq!(give_up.scheduled_ns, 1_796_000_000_000_000_000);
    assert_eq!(give_up.occurrence_ns, 1_796_000_000_000_000_000);
    assert_eq!(give_up.actual_ns, 1_796_000_000_500_000_000);
    assert!(give_up.detail.starts_with("missed: late by"));

    let safe = &got[4];
    assert_eq!(
        (safe.outcome(), safe.reason()),
        (O::SafeState, wire::Reason::Lease)
    );
    assert_eq!(safe.instruction, "");

    // And the typed record reads back from the wire as the agent meant it.
    for f in &got {
        baton_proto::feedback::Record::from_wire(f).expect("typed");
    }
}
