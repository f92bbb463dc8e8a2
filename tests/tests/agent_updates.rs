//! Agent updates end to end (issue 39 item 3), with the real binaries: a
//! controller; boxes each started by `baton-agent launch` from a
//! "packaged" copy of the agent, with a trust directory naming a release
//! key; a release uploaded with `release upload --sign` (the same build
//! stamped with another version, as a release pipeline does); and
//! `agent-update start` with a staged plan.
//!
//! Checked: the update moves stage by stage, each box restarting into
//! the new version in its own process and reporting it on its link, the
//! controller showing each box's word on the update; the packs keep
//! firing, nothing twice (feedback against each box's sim GPIO log); a
//! build that exits at start is rolled back by the box and the update
//! aborts at its first stage, the other boxes never offered it.
//!
//! Not here: an arm64 box (`tests/agent_update_aarch64.rs`, its `.deb`
//! under qemu, run by `cross/test-aarch64.sh`); a controller over
//! PostgreSQL replicas (`tests/replicas.rs` starts an update through one
//! replica; the store contract runs the same operations on PostgreSQL).

use std::time::Duration;

use baton_e2e::fleet::{json_lines, start_controller};
use baton_e2e::update_site::*;
use baton_e2e::{bin, output_text as text, running_image, wait_until};

const ARCH: &str = std::env::consts::ARCH;

#[test]
fn a_staged_update_reaches_every_box_each_in_its_own_process_with_nothing_twice() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let keys = keys(d);
    let c = start_controller(&d.join("ctl"), "127.0.0.1:0");
    let ids = ["b1", "b2", "b3"];
    let mut boxes: Vec<EdgeBox> = ids
        .iter()
        .map(|id| EdgeBox::new(d, id, &keys, &c.url, &bin("baton-agent")))
        .collect();
    for b in &boxes {
        assert!(wait_until(WAIT, || c.connected(&b.id)), "{}", b.log());
    }
    let pids: Vec<u32> = boxes.iter().map(EdgeBox::pid).collect();
    push_tick(&c, d, &ids);
    for id in ids {
        assert!(wait_until(WAIT, || fired(&c, id) >= 2));
    }

    let stamped =
        baton_trust::release::stamp(&std::fs::read(bin("baton-agent")).expect("agent"), "9.9.9")
            .expect("one version slot");
    upload(&c, d, &keys, "baton-agent-9.9.9", &stamped, ("9.9.9", ARCH));
    let o = c.ctl(&["release", "list", "--json"]);
    let listed = json_lines(&o.stdout);
    assert_eq!(listed.len(), 1, "{}", text(&o));
    assert_eq!(listed[0]["size"], stamped.len() as u64);

    // One box first, then the rest; each stage passes once its boxes run
    // the version, are back on their link with their clock locked, and
    // have fired on it.
    let o = start_update(
        &c,
        d,
        "9.9.9",
        "rollout:\n  stages: [{agents: 1}, {percent: 100}]\n  soak: 1s\n  min_firings: 1\n  stage_deadline: {after: 90s, then: abort}\n",
    );
    assert!(o.status.success(), "{}", text(&o));
    let done = wait_until(Duration::from_secs(240), || {
        update_status(&c)["state"] == "completed"
    });
    let st = update_status(&c);
    assert!(
        done,
        "{st}\n{}\n---\n{}",
        c.log(),
        boxes
            .iter()
            .map(EdgeBox::log)
            .collect::<Vec<_>>()
            .join("\n---\n")
    );
    let verdicts = st["verdicts"].as_array().expect("verdicts");
    assert_eq!(verdicts.len(), 2, "{st}");
    assert!(verdicts.iter().all(|v| v["verdict"] == "pass"), "{st}");

    let agents = c.agents();
    for (b, pid) in boxes.iter().zip(&pids) {
        let a = agent(&agents, &b.id);
        assert_eq!(a["version"], "9.9.9", "{a}");
        assert_eq!(a["update"]["phase"], "running", "{a}");
        assert_eq!(b.pid(), *pid);
        assert_eq!(
            running_image(*pid),
            b.dir.join("data/agent-versions/9.9.9/baton-agent"),
            "{}: the same process, now the installed build",
            b.id
        );
    }
    // Firing on after the restart, the journal carried over (the pack
    // held, not pushed again): nothing twice, the sim log against
    // feedback.
    let before: Vec<usize> = ids.iter().map(|id| fired(&c, id)).collect();
    for (id, n) in ids.iter().zip(&before) {
        assert!(wait_until(WAIT, || fired(&c, id) >= n + 2));
    }
    settle_and_compare(&c, &boxes);
    for b in &mut boxes {
        b.stop();
        assert!(
            b.log()
                .contains("a quiet moment; restarting into the new version"),
            "{}",
            b.log()
        );
    }
    // Audited: the upload, the start, each stage.
    let o = c.ctl(&["audit", "--json"]);
    let audit = String::from_utf8_lossy(&o.stdout);
    assert!(audit.contains("release.upload"), "{audit}");
    assert!(audit.contains("update.start"), "{audit}");
    assert!(audit.contains("completed: every stage passed"), "{audit}");
}

#[test]
fn a_build_that_exits_at_start_is_rolled_back_and_the_update_aborts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let keys = keys(d);
    let c = start_controller(&d.join("ctl"), "127.0.0.1:0");
    let ids = ["b1", "b2"];
    let mut boxes: Vec<EdgeBox> = ids
        .iter()
        .map(|id| EdgeBox::new(d, id, &keys, &c.url, &bin("baton-agent")))
        .collect();
    for b in &boxes {
        assert!(wait_until(WAIT, || c.connected(&b.id)), "{}", b.log());
    }
    push_tick(&c, d, &ids);
    for id in ids {
        assert!(wait_until(WAIT, || fired(&c, id) >= 2));
    }
    // A script that reports 9.9.9 (its version slot after the exit).
    let mut broken = b"#!/bin/sh\necho 'this build cannot start' >&2\nexit 1\n# ".to_vec();
    let at = broken.len();
    broken.extend_from_slice(baton_trust::release::SLOT_MARK);
    broken.extend_from_slice(b"9.9.9");
    broken.resize(at + baton_trust::release::SLOT_LEN, 0);
    upload(&c, d, &keys, "broken", &broken, ("9.9.9", ARCH));

    let o = start_update(
        &c,
        d,
        "9.9.9",
        "rollout:\n  stages: [{agents: 1}, {percent: 100}]\n  soak: 1s\n  stage_deadline: {after: 90s, then: abort}\n",
    );
    assert!(o.status.success(), "{}", text(&o));
    // The first stage's box (b1, by id) runs the build once, in its own
    // process: it exits. systemd's Restart=on-failure starts it again,
    // and the launcher rolls it back to the packaged agent.
    let status = baton_e2e::wait_exit(boxes[0].child.as_mut().expect("b1"), WAIT)
        .unwrap_or_else(|| panic!("b1 never ran the broken build\n{}", boxes[0].log()));
    assert_eq!(status.code(), Some(1), "{}", boxes[0].log());
    boxes[0].launch();
    let aborted = wait_until(WAIT, || update_status(&c)["state"] == "aborted");
    let st = update_status(&c);
    assert!(aborted, "{st}\n{}", boxes[0].log());
    assert!(
        st["reason"]
            .as_str()
            .unwrap_or("")
            .contains("agent b1 refused the version: rolled_back"),
        "{st}"
    );
    let agents = c.agents();
    let b1 = agent(&agents, "b1");
    assert_eq!(b1["version"], env!("CARGO_PKG_VERSION"), "{b1}");
    assert_eq!(b1["update"]["phase"], "rolled_back", "{b1}");
    let b2 = agent(&agents, "b2");
    assert_eq!(b2["update"], serde_json::Value::Null, "never offered: {b2}");
    assert!(wait_until(WAIT, || c.connected("b1")));
    let n = fired(&c, "b1");
    assert!(wait_until(WAIT, || fired(&c, "b1") >= n + 2), "b1 fires on");
    settle_and_compare(&c, &boxes);
    for b in &mut boxes {
        b.stop();
    }
    let o = c.ctl(&["audit", "--json"]);
    let audit = String::from_utf8_lossy(&o.stdout);
    assert!(audit.contains("offers of 9.9.9 withdrawn"), "{audit}");
    // The command line: an abort names its update; an upload says how it
    // is signed; a resume of an aborted update is refused (final).
    let o = c.ctl(&["agent-update", "abort"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("name the update"), "{}", text(&o));
    let o = c.ctl(&["release", "upload", s(&d.join("broken"))]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("--manifest M.json, or --sign KEY"),
        "{}",
        text(&o)
    );
    let o = c.ctl(&["agent-update", "resume", "1"]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("only a paused rollout can be resumed"),
        "{}",
        text(&o)
    );
}

/// An upload the server refuses while reading it (before the application
/// checks the release against its manifest), each with its reason, and
/// audited like the application's refusals; nothing stored.
#[test]
fn an_upload_refused_while_read_says_why_and_is_audited() {
    use baton_proto::wire;
    use wire::release_upload_part::Part;
    let dir = tempfile::tempdir().expect("tempdir");
    let c = start_controller(&dir.path().join("ctl"), "127.0.0.1:0");
    let key = baton_trust::SigningKey::generate().expect("key");
    let binary = vec![7u8; 1000];
    let m = baton_trust::ReleaseManifest::of("9.9.9", ARCH, &binary).expect("manifest");
    let signed = baton_trust::SignedRelease::sign(&m, &key);
    let offer = wire::ReleaseOffer {
        manifest: signed.body.clone(),
        key: signed.key.to_string(),
        signature: signed.signature.to_base64(),
    };
    let manifest = |o: &wire::ReleaseOffer| wire::ReleaseUploadPart {
        part: Some(Part::Manifest(o.clone())),
    };
    let data = |n: usize| wire::ReleaseUploadPart {
        part: Some(Part::Data(vec![7u8; n])),
    };
    let long = wire::ReleaseOffer {
        manifest: format!("{}{}", offer.manifest, " ".repeat(5000)),
        ..offer.clone()
    };
    let bad_key = wire::ReleaseOffer {
        key: "not hex".into(),
        ..offer.clone()
    };
    let cases: Vec<(Vec<wire::ReleaseUploadPart>, &str)> = vec![
        (vec![], "release upload: no parts"),
        (vec![data(10)], "the first part must be the signed manifest"),
        (vec![manifest(&long)], "a box takes at most 4096"),
        (vec![manifest(&bad_key)], "release key id \"not hex\""),
        (
            vec![manifest(&offer), data(600), data(600)],
            "more bytes than the manifest's 1000",
        ),
        (
            vec![manifest(&offer), data(10), manifest(&offer)],
            "a second manifest",
        ),
    ];
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let ch = tonic::transport::Endpoint::from_shared(c.url.clone())
            .expect("url")
            .connect()
            .await
            .expect("connect");
        let mut admin = wire::admin_client::AdminClient::new(ch);
        for (parts, why) in cases {
            let e = admin
                .upload_release(tokio_stream::iter(parts))
                .await
                .expect_err(why);
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{why}: {e:?}");
            assert!(e.message().contains(why), "{why}: {e:?}");
        }
    });
    let o = c.ctl(&["release", "list", "--json"]);
    assert!(
        json_lines(&o.stdout).is_empty(),
        "nothing stored: {}",
        text(&o)
    );
    let o = c.ctl(&["audit", "--json"]);
    let refused: Vec<serde_json::Value> = json_lines(&o.stdout)
        .into_iter()
        .filter(|a| a["action"] == "release.upload")
        .collect();
    assert_eq!(refused.len(), 6, "{}", text(&o));
    for a in &refused {
        assert!(
            a["result"]
                .as_str()
                .unwrap_or("")
                .starts_with("InvalidArgument: "),
            "{a}"
        );
    }
    // Once the manifest named it, the record names the release.
    assert!(
        refused
            .iter()
            .any(|a| a["target"] == format!("release 9.9.9 {ARCH}")),
        "{refused:?}"
    );
}
