//! An agent update end to end on the box, with the real binary: started
//! by `launch` from a "packaged" copy, linked to a fake controller (in
//! this process) that pushes a pack, offers a release and serves its
//! pieces. The release is the same build stamped with another version
//! (`baton_agent::version::stamp`: what a release pipeline does; a second
//! compile would cost the suite a full build), or a build that exits at
//! start.
//!
//! What is checked: the box downloads, installs and restarts into the new
//! version at a quiet moment in the same process (its PID, now running
//! the installed binary), whose Hello reports the new version and the
//! pack held, and which settles once welcomed; a build that exits at start
//! is rolled back at the next start and the Hello says so; across each
//! restart the pack's line is driven to its safe state, and no occurrence
//! fires twice (feedback, deduplicated by seq, against the sim GPIO log).
//! Not here: the controller's side (upload, rollout, gates) — a fake
//! stands in for it.

mod rig;

use std::time::Instant;

use baton_proto::wire::update_state::Phase;
use rig::update_site::*;

const AGENT: &str = env!("CARGO_BIN_EXE_baton-agent");
const UPDATE: &str = "{download-rate: 33554432, quiet-margin: 100ms}";

const TICK: &str = "pack: tick\nversion: 1\nsafe_state:\n  - {action: gpio.write, params: {line: 7, value: 0}}\ninstructions:\n  - {id: on, action: gpio.write, params: {line: 7, value: 1}, every: 400ms}\n";

/// The box restarts into a new version in the same process, at a quiet
/// moment, its pack held and still firing, nothing twice; the new version
/// is settled once welcomed.
#[test]
fn a_new_version_is_installed_and_restarted_into_with_its_pack_and_nothing_twice() {
    let site = Site::new(AGENT, UPDATE);
    let release = baton_agent::version::stamp(&std::fs::read(AGENT).expect("agent"), "9.9.9")
        .expect("one slot");
    let mut c = Controller::new(release.clone());
    // systemd's notify socket, as the unit has it (Type=notify).
    let notify_path = site.path("notify.sock");
    let notify = std::os::unix::net::UnixDatagram::bind(&notify_path).expect("notify socket");
    notify
        .set_read_timeout(Some(std::time::Duration::from_millis(1)))
        .expect("timeout");
    let child = site.launch_env(&["--no-rt"], &[("NOTIFY_SOCKET", notify_path.as_path())]);
    let pid = child.id();
    let hello = c.hello(&site.fake);
    assert_eq!(hello.agent_version, env!("CARGO_PKG_VERSION"));
    push(&c, "tick", 1, TICK);
    c.until_fired(&site.fake, 3);
    c.send(site.offer("9.9.9", &release));
    c.update(&site.fake, Phase::Installed);
    // The way out, then the launcher, then the new version's hello.
    let hello = c.hello(&site.fake);
    assert_eq!(hello.agent_version, "9.9.9");
    assert_eq!(held(&hello), vec![("tick".to_string(), 1)]);
    assert_eq!(
        baton_e2e::running_image(pid),
        site.path("data/agent-versions/9.9.9/baton-agent"),
        "the same process, now the installed binary"
    );
    // Settled once welcomed; firing on.
    let before = c.fired().len();
    c.until_fired(&site.fake, before + 3);
    let end = Instant::now() + PATIENCE;
    while site.state().and_then(|s| s.settled).as_deref() != Some("9.9.9") {
        assert!(Instant::now() < end, "not settled: {:?}", site.state());
        let _ = c.next(&site.fake);
    }
    // systemd was told READY by each image and never STOPPING (it would
    // kill the new version at its stop timeout).
    let mut said = String::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = notify.recv(&mut buf) {
        said.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert_eq!(said.matches("READY=1").count(), 2, "{said}");
    assert!(!said.contains("STOPPING=1"), "{said}");
    assert!(
        said.contains("STATUS=restarting into agent version 9.9.9"),
        "{said}"
    );
    child.stop();
    // The line was driven to its safe state at the restart (a 0 between
    // the two runs' firings), and the log holds one write of 1 per
    // firing the feedback reports.
    let writes = site.writes();
    let ones = writes.iter().filter(|&&v| v == 1).count();
    assert!(writes.windows(2).any(|w| w == [0, 1]), "{writes:?}");
    assert_eq!(ones, c.fired().len(), "sim log against feedback");
}

/// A build that exits at start runs once; the next start (systemd's)
/// rolls it back to the packaged agent, whose hello says so; the pack
/// runs on, nothing twice.
#[test]
fn a_build_that_exits_at_start_is_rolled_back_and_the_hello_says_so() {
    let site = Site::new(AGENT, UPDATE);
    // A script that reports 9.9.9 (its version slot after the exit).
    let mut broken = b"#!/bin/sh\necho 'this build cannot start' >&2\nexit 1\n# ".to_vec();
    let at = broken.len();
    broken.extend_from_slice(baton_trust::release::SLOT_MARK);
    broken.extend_from_slice(b"9.9.9");
    broken.resize(at + baton_trust::release::SLOT_LEN, 0);
    let mut c = Controller::new(broken.clone());
    let mut child = site.launch();
    c.hello(&site.fake);
    push(&c, "tick", 1, TICK);
    c.until_fired(&site.fake, 2);
    c.send(site.offer("9.9.9", &broken));
    c.update(&site.fake, Phase::Installed);
    let status = child.wait();
    assert_eq!(
        status.code(),
        Some(1),
        "the broken build ran, in the same process"
    );
    // systemd's Restart=on-failure: launch again.
    let child = site.launch();
    let hello = c.hello(&site.fake);
    assert_eq!(hello.agent_version, env!("CARGO_PKG_VERSION"));
    let u = hello.update.clone().expect("the rollback said");
    assert_eq!(
        (u.version.as_str(), u.phase),
        ("9.9.9", Phase::RolledBack as i32)
    );
    assert!(
        u.reason.contains("rolled back to the packaged agent"),
        "{}",
        u.reason
    );
    assert_eq!(held(&hello), vec![("tick".to_string(), 1)]);
    let before = c.fired().len();
    c.until_fired(&site.fake, before + 2);
    // Offered again: refused, never run again on this box.
    c.send(site.offer("9.9.9", &broken));
    let u = loop {
        if let Seen::Update(u) = c.next(&site.fake) {
            break u;
        }
    };
    assert_eq!(u.phase, Phase::Refused as i32, "{u:?}");
    assert!(
        u.reason.contains("was rolled back on this box"),
        "{}",
        u.reason
    );
    child.stop();
    let s = site.state().expect("state");
    assert_eq!((s.trial, s.settled), (None, None));
    let ones = site.writes().iter().filter(|&&v| v == 1).count();
    assert_eq!(ones, c.fired().len(), "sim log against feedback");
}
