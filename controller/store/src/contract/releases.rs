//! The contract on agent releases and updates: a release stored once and
//! served by piece, the release each agent is offered (its target, its
//! architecture), updates stepped by compare-and-set and superseded, and
//! each agent's word on an update, fenced to its stream.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use baton_model::{RELEASE_PIECE, RefTime};

use crate::*;

use super::fixtures::*;

fn release(version: &str, arch: &str, bytes: &[u8], at_ns: i64) -> (ReleaseRow, Vec<Vec<u8>>) {
    let row = ReleaseRow {
        version: version.into(),
        arch: arch.into(),
        manifest: format!("{{\"version\":\"{version}\"}}"),
        key: "00112233aabbccdd".into(),
        signature: "c2lnbmVk".into(),
        size: bytes.len() as u64,
        sha256: format!("sha-of-{version}-{}", bytes.len()),
        uploaded: RefTime::from_nanos(at_ns),
        by: "ann".into(),
    };
    let pieces = bytes
        .chunks(RELEASE_PIECE as usize)
        .map(<[u8]>::to_vec)
        .collect();
    (row, pieces)
}

/// Bytes no text column would keep: NULs, invalid UTF-8, every value.
fn binary(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 % 256) as u8).collect()
}

fn update(version: &str, targets: &[&str], at_ns: i64) -> AgentUpdateRow {
    AgentUpdateRow::new(
        version,
        "rollout:\n  stages: [{agents: 1}]\n",
        targets.iter().map(|t| (*t).to_owned()).collect(),
        "ann",
        RefTime::from_nanos(at_ns),
    )
}

/// A release is stored once with its pieces (bytes kept exactly, the
/// last piece short); the same again is no change; other bytes under the
/// same version and architecture are refused, nothing written.
pub async fn releases_stored_once_and_served_by_piece(s: &dyn Store, _: Binding) {
    let bytes = binary(RELEASE_PIECE as usize * 2 + 5);
    let (row, pieces) = release("1.2.0", "x86_64", &bytes, 10);
    assert_eq!(row.pieces(), 3);
    let new = s.put_release(row.clone(), pieces.clone()).await.unwrap();
    assert!(new);
    assert_eq!(s.releases().await.unwrap(), vec![row.clone()]);
    let mut read = Vec::new();
    for i in 0..row.pieces() {
        read.extend(
            s.release_piece("1.2.0", "x86_64", i)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    assert_eq!(read, bytes, "the binary comes back byte for byte");
    assert_eq!(s.release_piece("1.2.0", "x86_64", 3).await.unwrap(), None);
    assert_eq!(s.release_piece("1.2.0", "aarch64", 0).await.unwrap(), None);

    let again = s.put_release(row.clone(), pieces).await.unwrap();
    assert!(!again, "the same release again changes nothing");

    let (other, other_pieces) = release("1.2.0", "x86_64", &binary(9), 12);
    let taken = s.put_release(other, other_pieces).await;
    assert!(
        matches!(taken, Err(StoreError::ReleaseTaken { .. })),
        "{taken:?}"
    );
    assert_eq!(s.releases().await.unwrap(), vec![row.clone()]);

    // Another architecture of the same version is another release; the
    // list is newest upload first.
    let (arm, arm_pieces) = release("1.2.0", "aarch64", &binary(3), 20);
    s.put_release(arm.clone(), arm_pieces).await.unwrap();
    assert_eq!(s.releases().await.unwrap(), vec![arm, row]);
}

/// An agent is offered the release its target names for the
/// architecture its hello said; none without a target, for another
/// architecture, once the target is withdrawn, or once it is forgotten.
pub async fn release_offered_by_target_and_arch(s: &dyn Store, _: Binding) {
    for (v, arch) in [("2.0.0", "x86_64"), ("2.0.0", "aarch64")] {
        let (row, pieces) = release(v, arch, &binary(10), 1);
        s.put_release(row, pieces).await.unwrap();
    }
    s.agent_hello(hello("a1", 1)).await.unwrap();
    let mut arm = hello("b2", 1);
    arm.arch = "aarch64".into();
    s.agent_hello(arm).await.unwrap();
    let mut riscv = hello("c3", 1);
    riscv.arch = "riscv64".into();
    s.agent_hello(riscv).await.unwrap();
    assert_eq!(s.agent("b2").await.unwrap().unwrap().arch, "aarch64");
    assert_eq!(s.release_offer("a1").await.unwrap(), None, "no target yet");

    let id = s
        .start_agent_update(update("2.0.0", &["a1", "b2", "c3"], 2), Vec::new())
        .await
        .unwrap();
    let mut u = s.agent_update(Some(id)).await.unwrap().unwrap();
    u.machine.state = RolloutState::Running;
    let admit = vec!["a1".to_owned(), "b2".to_owned(), "c3".to_owned()];
    assert!(
        s.advance_agent_update(u.clone(), admit, false)
            .await
            .unwrap()
    );
    let offered = |id: &'static str| async move {
        s.release_offer(id)
            .await
            .unwrap()
            .map(|r| (r.version, r.arch))
    };
    assert_eq!(offered("a1").await, Some(("2.0.0".into(), "x86_64".into())));
    assert_eq!(
        offered("b2").await,
        Some(("2.0.0".into(), "aarch64".into()))
    );
    assert_eq!(offered("c3").await, None, "no build for its architecture");
    assert_eq!(offered("zz").await, None, "never heard of");

    assert!(s.forget_agent("b2", None).await.unwrap());
    let mut back = hello("b2", 3);
    back.arch = "aarch64".into();
    s.agent_hello(back).await.unwrap();
    assert_eq!(
        offered("b2").await,
        None,
        "forgotten: its offer went with it"
    );

    // Withdrawn (an abort): nobody is offered it any more.
    let mut u = s.agent_update(Some(id)).await.unwrap().unwrap();
    u.machine.state = RolloutState::Aborted;
    assert!(s.advance_agent_update(u, Vec::new(), true).await.unwrap());
    assert_eq!(offered("a1").await, None);
}

/// A stage admitting more boxes than one statement takes (and naming one
/// twice) offers each of them the release, once.
pub async fn a_stage_of_many_boxes_offers_each_once(s: &dyn Store, _: Binding) {
    let (row, pieces) = release("2.0.0", "x86_64", &binary(10), 1);
    s.put_release(row, pieces).await.unwrap();
    let ids: Vec<String> = (0..150).map(|i| format!("m{i:03}")).collect();
    for id in &ids {
        s.agent_hello(hello(id, 1)).await.unwrap();
    }
    let names: Vec<&str> = ids.iter().map(String::as_str).collect();
    let id = s
        .start_agent_update(update("2.0.0", &names, 2), Vec::new())
        .await
        .unwrap();
    let mut u = s.agent_update(Some(id)).await.unwrap().unwrap();
    u.machine.state = RolloutState::Running;
    let mut admit = ids[..130].to_vec();
    admit.push(ids[7].clone());
    assert!(s.advance_agent_update(u, admit, false).await.unwrap());
    for (i, a) in ids.iter().enumerate() {
        let offer = s.release_offer(a).await.unwrap().map(|r| r.version);
        let want = (i < 130).then(|| "2.0.0".to_string());
        assert_eq!(offer, want, "{a}");
    }
}

/// Updates step by compare-and-set on their rev (a step computed from an
/// older rev changes nothing), keep their cohort, and a new one
/// supersedes every open one (their offers withdrawn); ids increase.
pub async fn agent_updates_step_once_and_supersede(s: &dyn Store, _: Binding) {
    let (row, pieces) = release("3.0.0", "x86_64", &binary(4), 1);
    s.put_release(row, pieces).await.unwrap();
    s.agent_hello(hello("a1", 1)).await.unwrap();
    let first = s
        .start_agent_update(update("3.0.0", &["a1"], 2), Vec::new())
        .await
        .unwrap();
    let stored = s.agent_update(None).await.unwrap().unwrap();
    assert_eq!(stored.id, first);
    assert_eq!(stored.machine.rev, 0);
    assert_eq!(stored.targets, vec!["a1".to_owned()]);
    assert_eq!(stored.machine.state, RolloutState::WaitingWindow);

    let mut step = stored.clone();
    step.machine.state = RolloutState::Running;
    step.machine.members.insert(
        "a1".into(),
        Member {
            stage: 0,
            skipped: false,
        },
    );
    assert!(
        s.advance_agent_update(step.clone(), vec!["a1".into()], false)
            .await
            .unwrap()
    );
    // The same step again (another replica computed it from rev 0).
    assert!(
        !s.advance_agent_update(step, vec!["a1".into()], false)
            .await
            .unwrap()
    );
    let now = s.agent_update(Some(first)).await.unwrap().unwrap();
    assert_eq!(now.machine.rev, 1);
    assert_eq!(now.machine.state, RolloutState::Running);
    assert!(now.members().contains_key("a1"));
    assert!(s.release_offer("a1").await.unwrap().is_some());

    // Started by a caller that checked no open update: refused, nothing
    // written (another replica started one meanwhile).
    let raced = s
        .start_agent_update(update("3.0.0", &["a1"], 4), Vec::new())
        .await;
    assert!(matches!(raced, Err(StoreError::Contended(_))), "{raced:?}");
    assert_eq!(s.agent_update(None).await.unwrap().unwrap().id, first);
    let second = s
        .start_agent_update(update("3.0.0", &["a1"], 4), vec![first])
        .await
        .unwrap();
    assert!(second > first);
    let old = s.agent_update(Some(first)).await.unwrap().unwrap();
    assert_eq!(old.machine.state, RolloutState::Superseded);
    assert_eq!(
        s.release_offer("a1").await.unwrap(),
        None,
        "the superseded update's offers are withdrawn"
    );
    let open: Vec<u64> = s
        .agent_updates(true)
        .await
        .unwrap()
        .iter()
        .map(|u| u.id)
        .collect();
    assert_eq!(open, vec![second]);
    let all: Vec<u64> = s
        .agent_updates(false)
        .await
        .unwrap()
        .iter()
        .map(|u| u.id)
        .collect();
    assert_eq!(all, vec![second, first], "newest first");
}

/// What an agent says of an update is kept on its record, from its
/// current stream only; an agent never heard of is refused.
pub async fn update_said_and_fenced(s: &dyn Store, _: Binding) {
    s.agent_hello(hello("a1", 1)).await.unwrap();
    let said = UpdateRow {
        version: "4.0.0".into(),
        phase: UpdatePhase::Downloading,
        held_bytes: 65_536,
        size: 1_000_000,
        reason: String::new(),
        at: RefTime::from_nanos(5),
    };
    s.record_update("a1", 1, said.clone()).await.unwrap();
    assert_eq!(
        s.agent("a1").await.unwrap().unwrap().update,
        Some(said.clone())
    );
    let a = s.agents(AgentFilter::default()).await.unwrap();
    assert_eq!(a[0].update, Some(said.clone()), "in lists too");

    s.agent_hello(hello("a1", 2)).await.unwrap();
    assert_eq!(
        s.agent("a1").await.unwrap().unwrap().update,
        Some(said.clone()),
        "a hello that says nothing of an update keeps the last word"
    );
    let rolled_back = UpdateRow {
        phase: UpdatePhase::RolledBack,
        reason: "not welcomed within 5m".into(),
        ..said.clone()
    };
    let mut h = hello("a1", 3);
    h.update = Some(rolled_back.clone());
    s.agent_hello(h).await.unwrap();
    assert_eq!(
        s.agent("a1").await.unwrap().unwrap().update,
        Some(rolled_back.clone()),
        "a hello's rollback is stored"
    );
    let said = rolled_back;
    let stale = s.record_update("a1", 1, said.clone()).await;
    assert!(matches!(stale, Err(StoreError::Fenced { .. })), "{stale:?}");
    assert_eq!(
        s.agent("a1").await.unwrap().unwrap().update,
        Some(said.clone())
    );
    let unknown = s.record_update("zz", 1, said).await;
    assert!(
        matches!(unknown, Err(StoreError::NoSuchAgent { .. })),
        "{unknown:?}"
    );
}
