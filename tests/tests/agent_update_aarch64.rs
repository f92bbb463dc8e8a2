//! An arm64 box updated by a controller on this host, from its `.deb`
//! (issue 39: the update path under qemu for aarch64, where the host
//! cannot run it natively).
//!
//! The box is the agent of the arm64 package `cross/test-aarch64.sh`
//! builds with cargo-deb (the dev profile's binary, stripped, as the
//! package ships it), unpacked with `dpkg-deb -x` and started as the
//! package's unit starts it (`launch`); the kernel runs each aarch64
//! image through qemu-user (binfmt_misc, registered by the script), so
//! the launcher's `execve` of the installed build runs it too. Beside it
//! an x86-64 box (this host's build), which the update names and leaves
//! out: the release has no build for it.
//!
//! Checked: the box says it is aarch64; the release (the package's binary
//! stamped with another version, uploaded signed for `aarch64`) is
//! downloaded, verified and installed by the box, which restarts into it
//! in the same process at a quiet moment and reports the version; the
//! update completes; the pack keeps firing, nothing twice (the sim GPIO
//! log against feedback); the other box is never offered it.
//!
//! Not here: `dpkg -i` itself (its maintainer scripts make a user and
//! directories on the host; an arm64 package does not install on an
//! amd64 host) and a real board (qemu-user passes system calls to this
//! host's kernel: SCHED_FIFO, timers and the GPIO chip are the host's).
//! Needs `BATON_ARM64_DEB` (the package) and the `qemu-aarch64`
//! binfmt_misc entry: run by `cross/test-aarch64.sh`, which makes both
//! (`--features qemu-aarch64`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use baton_e2e::fleet::start_controller;
use baton_e2e::update_site::*;
use baton_e2e::{bin, output_text as text, run, running_image, wait_until};

const NAME: &str = "agent_update_aarch64";

/// The package named by `BATON_ARM64_DEB`, unpacked; `None` (a skip, or a
/// failure where required) when it or qemu's binfmt_misc entry is
/// missing.
fn unpacked_package(into: &Path) -> Option<PathBuf> {
    let Some(deb) = std::env::var_os("BATON_ARM64_DEB") else {
        baton_testenv::missing(
            NAME,
            None,
            "BATON_ARM64_DEB names no package (cross/test-aarch64.sh builds it)",
        );
        return None;
    };
    let binfmt = std::fs::read_to_string("/proc/sys/fs/binfmt_misc/qemu-aarch64");
    if !binfmt.is_ok_and(|e| e.lines().next() == Some("enabled")) {
        baton_testenv::missing(
            NAME,
            None,
            "no enabled qemu-aarch64 binfmt_misc entry (cross/test-aarch64.sh registers it)",
        );
        return None;
    }
    let o = run(
        Command::new("dpkg-deb")
            .arg("-f")
            .arg(&deb)
            .arg("Architecture"),
        Duration::from_secs(30),
    );
    assert_eq!(text(&o).trim(), "arm64", "{}", text(&o));
    let o = run(
        Command::new("dpkg-deb").arg("-x").arg(&deb).arg(into),
        Duration::from_secs(60),
    );
    assert!(o.status.success(), "dpkg-deb -x: {}", text(&o));
    // The unit the package ships starts the launcher: so does this test.
    let unit = std::fs::read_to_string(into.join("usr/lib/systemd/system/baton-agent.service"))
        .expect("the package's unit");
    assert!(
        unit.lines()
            .any(|l| l.starts_with("ExecStart=/usr/bin/baton-agent launch ")),
        "{unit}"
    );
    let agent = into.join("usr/bin/baton-agent");
    let elf = std::fs::read(&agent).expect("the package's agent");
    // e_machine (offset 18, little-endian): 183 is EM_AARCH64.
    assert_eq!(
        u16::from_le_bytes([elf[18], elf[19]]),
        183,
        "an aarch64 image"
    );
    Some(agent)
}

#[test]
fn an_arm64_box_from_its_deb_is_updated_under_qemu_and_the_other_architecture_left_out() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let Some(packaged) = unpacked_package(&d.join("deb")) else {
        return;
    };
    let keys = keys(d);
    let c = start_controller(&d.join("ctl"), "127.0.0.1:0");
    let mut boxes = vec![
        EdgeBox::new(d, "arm1", &keys, &c.url, &packaged),
        EdgeBox::new(d, "x1", &keys, &c.url, &bin("baton-agent")),
    ];
    for b in &boxes {
        assert!(wait_until(WAIT, || c.connected(&b.id)), "{}", b.log());
    }
    let agents = c.agents();
    let arm = agent(&agents, "arm1");
    assert_eq!(arm["arch"], "aarch64", "{arm}");
    assert_eq!(arm["version"], env!("CARGO_PKG_VERSION"), "{arm}");
    assert_eq!(agent(&agents, "x1")["arch"], std::env::consts::ARCH);
    let pid = boxes[0].pid();
    push_tick(&c, d, &["arm1", "x1"]);
    for b in &boxes {
        assert!(wait_until(WAIT, || fired(&c, &b.id) >= 2), "{}", b.log());
    }

    let stamped = baton_trust::release::stamp(&std::fs::read(&packaged).expect("agent"), "9.9.9")
        .expect("one version slot");
    upload(
        &c,
        d,
        &keys,
        "baton-agent-9.9.9-aarch64",
        &stamped,
        ("9.9.9", "aarch64"),
    );
    let o = start_update(
        &c,
        d,
        "9.9.9",
        // The emulated box's clock follows its link, on a host that runs
        // qemu, the controller and the test at once: its uncertainty is
        // a millisecond or more (the gate's 1 ms default is held on the
        // host, `tests/agent_updates.rs`).
        "targets: {agents: [arm1, x1]}\nrollout:\n  stages: [{percent: 100}]\n  soak: 1s\n  min_firings: 1\n  max_uncertainty: 50ms\n  stage_deadline: {after: 180s, then: abort}\n",
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains(&format!(
            "x1: no build of 9.9.9 for {}",
            std::env::consts::ARCH
        )),
        "{}",
        text(&o)
    );
    let done = wait_until(Duration::from_secs(300), || {
        update_status(&c)["state"] == "completed"
    });
    let st = update_status(&c);
    assert!(done, "{st}\n{}\n---\n{}", c.log(), boxes[0].log());

    let agents = c.agents();
    let arm = agent(&agents, "arm1");
    assert_eq!(arm["version"], "9.9.9", "{arm}");
    assert_eq!(arm["update"]["phase"], "running", "{arm}");
    assert_eq!(boxes[0].pid(), pid);
    assert_eq!(
        running_image(pid),
        boxes[0].dir.join("data/agent-versions/9.9.9/baton-agent"),
        "the same process, now the installed aarch64 build"
    );
    let x1 = agent(&agents, "x1");
    assert_eq!(x1["version"], env!("CARGO_PKG_VERSION"), "{x1}");
    assert_eq!(x1["update"], serde_json::Value::Null, "never offered: {x1}");

    let n = fired(&c, "arm1");
    assert!(
        wait_until(WAIT, || fired(&c, "arm1") >= n + 2),
        "arm1 fires on"
    );
    settle_and_compare(&c, &boxes);
    for b in &mut boxes {
        b.stop();
    }
    assert!(
        boxes[0]
            .log()
            .contains("a quiet moment; restarting into the new version"),
        "{}",
        boxes[0].log()
    );
}
