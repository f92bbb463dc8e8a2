//! Agent updates against the in-memory store: an upload checked against
//! its manifest, who may start an update and over which boxes, and the
//! driver's steps — offers stage by stage, a stage passed once its boxes
//! run the version with a locked clock, a rollback aborting the update
//! and withdrawing every offer.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use baton_model::identity::Role;
use baton_model::{Binding, ClockRow, RefTime, RolloutState, UpdatePhase, UpdateRow, time};
use baton_store::{HelloRow, StoreOps};
use baton_trust::{ReleaseManifest, SignedRelease, SigningKey};

use crate::app::{App, AppError, now};
use crate::rollouts::RolloutCommand;
use crate::tests::{app, op, open};

fn signed(version: &str, binary: &[u8]) -> SignedRelease {
    let key = SigningKey::generate().unwrap();
    let m = ReleaseManifest::of(version, "x86_64", binary).unwrap();
    SignedRelease::sign(&m, &key)
}

/// Agent `id` says hello running `version` on `arch`, with a certificate
/// of `tenants`, its clock locked (or not).
async fn hello(app: &App, id: &str, version: &str, arch: &str, tenants: &[&str], locked: bool) {
    hello_saying(app, id, version, arch, tenants, locked, None).await;
}

async fn hello_saying(
    app: &App,
    id: &str,
    version: &str,
    arch: &str,
    tenants: &[&str],
    locked: bool,
    update: Option<UpdateRow>,
) {
    let (a, _) = app
        .store
        .agent_hello(HelloRow {
            id: id.into(),
            labels: Default::default(),
            agent_version: version.into(),
            journal_id: format!("j-{id}"),
            cert_tenants: Some(tenants.iter().map(|t| t.to_string()).collect()),
            held: Vec::new(),
            session_gen_seen: 0,
            trust: None,
            arch: arch.into(),
            update,
            at: now(),
        })
        .await
        .unwrap();
    let clock = ClockRow {
        source: "link".into(),
        state: if locked { "locked" } else { "unlocked" }.into(),
        offset: time::span(1_000),
        jitter: time::span(0),
        uncertainty: time::span(100_000),
        frequency_ppm: 0.0,
        at: now(),
    };
    app.store
        .record_clock(id, a.session_gen, clock)
        .await
        .unwrap();
}

/// What a box says of release 2.0.0 (10 bytes).
fn word(phase: UpdatePhase, reason: &str) -> UpdateRow {
    UpdateRow {
        version: "2.0.0".into(),
        phase,
        held_bytes: 10,
        size: 10,
        reason: reason.into(),
        at: now(),
    }
}

async fn offered(app: &App, id: &str) -> Option<String> {
    app.store
        .release_offer(id)
        .await
        .unwrap()
        .map(|r| r.version)
}

#[tokio::test]
async fn an_upload_is_checked_against_its_manifest_and_stored_once() {
    let app = app(Binding::Open);
    let bytes = vec![7u8; 100_000];
    let s = signed("2.0.0", &bytes);
    let e = app
        .upload_release(&open(), &s, bytes[..99_999].to_vec())
        .await;
    assert!(
        matches!(&e, Err(AppError::Invalid(m)) if m.contains("the manifest says 100000 bytes, 99999 were uploaded")),
        "{e:?}"
    );
    let mut other = bytes.clone();
    other[5] = 8;
    let e = app.upload_release(&open(), &s, other).await;
    assert!(
        matches!(&e, Err(AppError::Invalid(m)) if m.contains("SHA-256")),
        "{e:?}"
    );
    let e = app
        .upload_release(&op("plant-a", Role::Operator), &s, bytes.clone())
        .await;
    assert!(matches!(e, Err(AppError::Denied(_))), "{e:?}");
    let (row, new) = app
        .upload_release(&open(), &s, bytes.clone())
        .await
        .unwrap();
    assert!(new);
    assert_eq!((row.size, row.pieces()), (100_000, 2));
    assert_eq!(row.manifest, s.body, "the manifest kept exactly as signed");
    let (_, new) = app
        .upload_release(&open(), &s, bytes.clone())
        .await
        .unwrap();
    assert!(!new, "the same release again changes nothing");
    let other = vec![9u8; 10];
    let e = app
        .upload_release(&open(), &signed("2.0.0", &other), other)
        .await;
    assert!(matches!(e, Err(AppError::Conflict(_))), "{e:?}");
    // Every attempt audited, refusals with their reason.
    let audit = app.audit(&open(), RefTime::from_nanos(0), 0).await.unwrap();
    let uploads: Vec<&str> = audit
        .iter()
        .filter(|a| a.action == "release.upload")
        .map(|a| a.result.as_str())
        .collect();
    assert_eq!(uploads.len(), 6, "{uploads:?}");
    assert_eq!(uploads.iter().filter(|r| **r == "ok").count(), 2);
}

#[tokio::test]
async fn an_update_is_started_only_over_boxes_that_can_take_it_and_the_caller_alone_serves() {
    let app = app(Binding::Tenants);
    let bytes = vec![1u8; 10];
    let e = app
        .start_agent_update(&open(), "2.0.0", "rollout:\n  stages: [{percent: 100}]\n")
        .await;
    assert!(matches!(e, Err(AppError::NotFound(_))), "no release: {e:?}");
    app.upload_release(&open(), &signed("2.0.0", &bytes), bytes)
        .await
        .unwrap();
    hello(&app, "a1", "1.0.0", "x86_64", &["plant-a"], true).await;
    hello(
        &app,
        "shared",
        "1.0.0",
        "x86_64",
        &["plant-a", "plant-b"],
        true,
    )
    .await;
    hello(&app, "old", "0.9.0", "", &["plant-a"], true).await;
    hello(&app, "arm", "1.0.0", "aarch64", &["plant-a"], true).await;
    hello(&app, "b1", "1.0.0", "x86_64", &["plant-b"], true).await;
    let plan = "rollout:\n  stages: [{percent: 100}]\n";
    let e = app
        .start_agent_update(&op("plant-a", Role::Operator), "2.0.0", plan)
        .await;
    assert!(matches!(e, Err(AppError::Denied(_))), "{e:?}");
    let e = app
        .start_agent_update(
            &open(),
            "2.0.0",
            "rollout:\n  stages: [{percent: 100}]\n  activate: together\n",
        )
        .await;
    assert!(
        matches!(&e, Err(AppError::Invalid(m)) if m.contains("together")),
        "{e:?}"
    );
    let (row, left_out) = app
        .start_agent_update(&op("plant-a", Role::Admin), "2.0.0", plan)
        .await
        .unwrap();
    assert_eq!(row.targets, ["a1"], "{left_out:?}");
    let said = left_out.join("\n");
    assert!(said.contains("shared: serves other tenants too"), "{said}");
    assert!(
        said.contains("old: its agent (0.9.0) is older than updates"),
        "{said}"
    );
    assert!(
        said.contains("arm: no build of 2.0.0 for aarch64"),
        "{said}"
    );
    assert!(
        !said.contains("b1"),
        "another tenant's box is not named: {said}"
    );
    // Targets by label, none matching: refused whole.
    let e = app
        .start_agent_update(
            &open(),
            "2.0.0",
            "targets: {labels: {site: nowhere}}\nrollout:\n  stages: [{percent: 100}]\n",
        )
        .await;
    assert!(matches!(e, Err(AppError::Invalid(_))), "{e:?}");
    // The other tenant's admin does not see plant-a's update.
    let e = app
        .agent_update_status(&op("plant-b", Role::Admin), Some(row.id))
        .await;
    assert!(matches!(e, Err(AppError::NotFound(_))), "{e:?}");
}

#[tokio::test]
async fn stages_offer_the_release_in_turn_and_a_rollback_aborts_and_withdraws() {
    let app = app(Binding::Open);
    let bytes = vec![1u8; 10];
    app.upload_release(&open(), &signed("2.0.0", &bytes), bytes)
        .await
        .unwrap();
    for id in ["a1", "a2", "a3"] {
        hello(&app, id, "1.0.0", "x86_64", &[], true).await;
    }
    let plan = "rollout:\n  stages: [{agents: 1}, {percent: 100}]\n  soak: 0s\n";
    let (row, _) = app
        .start_agent_update(&open(), "2.0.0", plan)
        .await
        .unwrap();
    assert_eq!(row.machine.state, RolloutState::WaitingWindow);
    super::step_agent_updates(&app).await.unwrap();
    assert_eq!(offered(&app, "a1").await.as_deref(), Some("2.0.0"));
    assert_eq!(offered(&app, "a2").await, None, "not admitted yet");

    // a1 comes back on the new version, its clock not yet locked: the
    // stage waits.
    hello(&app, "a1", "2.0.0", "x86_64", &[], false).await;
    super::step_agent_updates(&app).await.unwrap();
    let st = app.agent_update_status(&open(), None).await.unwrap();
    assert_eq!(
        (st.row.machine.stage, st.row.machine.state),
        (0, RolloutState::Running)
    );
    // Locked: the stage passes, the next admits the rest.
    hello(&app, "a1", "2.0.0", "x86_64", &[], true).await;
    super::step_agent_updates(&app).await.unwrap();
    let st = app.agent_update_status(&open(), None).await.unwrap();
    assert_eq!(st.row.machine.stage, 1, "{:?}", st.row.machine);
    assert_eq!(st.row.machine.verdicts[0].kind.as_str(), "pass");
    assert_eq!(offered(&app, "a2").await.as_deref(), Some("2.0.0"));

    // a2's new build never came up: it rolled back, and says so.
    hello_saying(
        &app,
        "a2",
        "1.0.0",
        "x86_64",
        &[],
        true,
        Some(word(UpdatePhase::RolledBack, "not welcomed within 5m")),
    )
    .await;
    super::step_agent_updates(&app).await.unwrap();
    let st = app.agent_update_status(&open(), None).await.unwrap();
    assert_eq!(st.row.machine.state, RolloutState::Aborted);
    assert!(
        st.row
            .machine
            .reason
            .contains("agent a2 refused the version: rolled_back: not welcomed within 5m"),
        "{}",
        st.row.machine.reason
    );
    assert_eq!(offered(&app, "a3").await, None, "offers withdrawn");
    assert_eq!(offered(&app, "a2").await, None);
    let e = app
        .agent_update_command(&open(), None, RolloutCommand::Resume, "")
        .await;
    assert!(
        matches!(e, Err(AppError::Conflict(_))),
        "an abort is final: {e:?}"
    );
    let audit = app.audit(&open(), RefTime::from_nanos(0), 0).await.unwrap();
    assert!(
        audit
            .iter()
            .any(|a| a.action == "update" && a.result.contains("offers of 2.0.0 withdrawn")),
        "{audit:?}"
    );
}

#[tokio::test]
async fn a_new_update_supersedes_the_open_one_and_a_pause_holds_its_stage() {
    let app = app(Binding::Open);
    for v in ["2.0.0", "2.0.1"] {
        let bytes = v.as_bytes().to_vec();
        app.upload_release(&open(), &signed(v, &bytes), bytes)
            .await
            .unwrap();
    }
    for id in ["a1", "a2"] {
        hello(&app, id, "1.0.0", "x86_64", &[], true).await;
    }
    let plan = "rollout:\n  stages: [{agents: 1}, {percent: 100}]\n  soak: 0s\n";
    let (first, _) = app
        .start_agent_update(&open(), "2.0.0", plan)
        .await
        .unwrap();
    let paused = app
        .agent_update_command(
            &open(),
            Some(first.id),
            RolloutCommand::Pause,
            "a look first",
        )
        .await
        .unwrap();
    assert_eq!(paused.machine.state, RolloutState::Paused);
    assert!(paused.machine.reason.contains("a look first"));
    super::step_agent_updates(&app).await.unwrap();
    assert_eq!(offered(&app, "a1").await, None, "paused: nothing admitted");
    app.agent_update_command(&open(), Some(first.id), RolloutCommand::Resume, "")
        .await
        .unwrap();
    super::step_agent_updates(&app).await.unwrap();
    assert_eq!(offered(&app, "a1").await.as_deref(), Some("2.0.0"));

    let (second, _) = app
        .start_agent_update(&open(), "2.0.1", plan)
        .await
        .unwrap();
    let old = app
        .agent_update_status(&open(), Some(first.id))
        .await
        .unwrap();
    assert_eq!(old.row.machine.state, RolloutState::Superseded);
    assert_eq!(
        offered(&app, "a1").await,
        None,
        "the superseded offer withdrawn"
    );
    super::step_agent_updates(&app).await.unwrap();
    assert_eq!(offered(&app, "a1").await.as_deref(), Some("2.0.1"));
    let list = app.agent_update_list(&open()).await.unwrap();
    assert_eq!(
        list.iter().map(|u| u.id).collect::<Vec<_>>(),
        [second.id, first.id]
    );
}

#[tokio::test]
async fn a_refusal_for_now_leaves_the_box_missing_and_another_tenants_update_is_not_superseded() {
    let app = app(Binding::Tenants);
    let bytes = vec![1u8; 10];
    app.upload_release(&open(), &signed("2.0.0", &bytes), bytes)
        .await
        .unwrap();
    hello(&app, "a1", "1.0.0", "x86_64", &["plant-a"], true).await;
    hello(
        &app,
        "shared",
        "1.0.0",
        "x86_64",
        &["plant-a", "plant-b"],
        true,
    )
    .await;
    let plan = "rollout:\n  stages: [{percent: 100}]\n  soak: 0s\n";
    let (row, _) = app
        .start_agent_update(&open(), "2.0.0", plan)
        .await
        .unwrap();
    super::step_agent_updates(&app).await.unwrap();
    // a1 refuses for now (it was itself on trial): missing, not failed.
    hello_saying(
        &app,
        "a1",
        "1.0.0",
        "x86_64",
        &["plant-a"],
        true,
        Some(word(
            UpdatePhase::Refused,
            "this agent is itself a version on trial",
        )),
    )
    .await;
    super::step_agent_updates(&app).await.unwrap();
    let st = app
        .agent_update_status(&open(), Some(row.id))
        .await
        .unwrap();
    assert_eq!(
        st.row.machine.state,
        RolloutState::Running,
        "{:?}",
        st.row.machine
    );
    assert_eq!(
        offered(&app, "a1").await.as_deref(),
        Some("2.0.0"),
        "still offered"
    );

    // plant-a's admin neither supersedes nor aborts an update over a box
    // plant-b shares.
    let admin_a = op("plant-a", Role::Admin);
    let e = app.start_agent_update(&admin_a, "2.0.0", plan).await;
    assert!(matches!(e, Err(AppError::Denied(_))), "{e:?}");
    let e = app
        .agent_update_command(&admin_a, Some(row.id), RolloutCommand::Abort, "")
        .await;
    assert!(
        matches!(e, Err(AppError::Denied(_)) | Err(AppError::NotFound(_))),
        "{e:?}"
    );
    let st = app
        .agent_update_status(&open(), Some(row.id))
        .await
        .unwrap();
    assert_eq!(st.row.machine.state, RolloutState::Running);
}
