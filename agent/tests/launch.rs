//! `baton-agent launch`, the real binary: which binary a start runs from
//! the versions directory's state, a trial run once then rolled back when
//! it ends unconfirmed, a version that cannot be started rolled back at
//! once, and the packaged agent as the floor. The installed "versions" are
//! shell scripts that say how they were started (their PID, arguments)
//! and exit with a status of their own, so each start is seen.

use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;
use std::process::{Command, Output};

const VERSION: &str = env!("CARGO_PKG_VERSION");
use baton_update::{BootState, Trial, Versions};

const AGENT: &str = env!("CARGO_BIN_EXE_baton-agent");

struct Device {
    _dir: tempfile::TempDir,
    data: PathBuf,
    gpio: PathBuf,
    trust: PathBuf,
    release_key: baton_trust::SigningKey,
    versions: Versions,
}

/// A box whose trust list names a release key.
fn a_device() -> Device {
    use baton_trust::{SignedList, SigningKey, TrustList};
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let trust = dir.path().join("trust");
    std::fs::create_dir_all(&trust).expect("mkdir");
    let root = SigningKey::generate().expect("root");
    let release_key = SigningKey::generate().expect("release key");
    std::fs::write(trust.join("root.pub"), root.public().to_base64()).expect("root.pub");
    let list = TrustList {
        version: 1,
        expires_ns: i64::MAX,
        next_root: None,
        tenants: Default::default(),
        release_keys: vec![release_key.public()],
    };
    std::fs::write(
        trust.join("trust.json"),
        serde_json::to_string(&[SignedList::sign(&list, &root)]).expect("json"),
    )
    .expect("trust.json");
    Device {
        gpio: dir.path().join("gpio.jsonl"),
        versions: Versions::of_data_dir(&data),
        data,
        trust,
        release_key,
        _dir: dir,
    }
}

impl Device {
    /// Installs a "version" whose binary appends `$$ $*` to `started`
    /// beside it and exits `status`, with its signed release as an update
    /// leaves it.
    fn install_script(&self, version: &str, status: u8) -> PathBuf {
        let bin = self.versions.binary(version);
        std::fs::create_dir_all(bin.parent().expect("dir")).expect("mkdir");
        let started = bin.with_file_name("started");
        let text = format!(
            "#!/bin/sh\necho \"$$ $*\" >> '{}'\nexit {status}\n",
            started.display()
        );
        std::fs::write(&bin, &text).expect("write");
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let m = baton_trust::ReleaseManifest::of(version, std::env::consts::ARCH, text.as_bytes())
            .expect("manifest");
        let signed = baton_trust::SignedRelease::sign(&m, &self.release_key);
        std::fs::write(
            bin.with_file_name("release.json"),
            serde_json::to_string(&signed).expect("json"),
        )
        .expect("release.json");
        bin
    }

    fn starts(&self, version: &str) -> Vec<String> {
        let f = self.versions.binary(version).with_file_name("started");
        std::fs::read_to_string(f)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn state(&self) -> BootState {
        self.versions.read_state().expect("read").expect("a state")
    }

    /// `launch` with `run`'s flags: the packaged agent exits at once when
    /// idle (no packs, no controller).
    fn launch(&self) -> (Output, u32) {
        let child = Command::new(AGENT)
            .arg("launch")
            .arg("--data")
            .arg(&self.data)
            .arg("--gpio")
            .arg(format!("sim:{}", self.gpio.display()))
            .arg("--trust-dir")
            .arg(&self.trust)
            .args(["--no-rt", "--exit-when-idle", "--quiet"])
            .env("RUST_LOG", "info")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn");
        let pid = child.id();
        (child.wait_with_output().expect("wait"), pid)
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stage(b: &Device, version: &str) {
    let now = b.versions.read_state().expect("read");
    b.versions
        .write_state(&baton_update::boot::stage(now.as_ref(), VERSION, version))
        .expect("stage");
}

/// A new version runs once in the launcher's place (same PID, `run` and
/// the flags handed on); when it ends before confirming itself, the next
/// start rolls it back to what ran before and says so.
#[test]
fn a_trial_that_ends_unconfirmed_runs_once_then_the_version_before_runs() {
    let b = a_device();
    b.install_script("9.9.9", 3);
    stage(&b, "9.9.9");
    let (out, pid) = b.launch();
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let starts = b.starts("9.9.9");
    assert_eq!(starts.len(), 1);
    let data = b.data.display().to_string();
    assert_eq!(
        starts[0],
        format!(
            "{pid} run --data {data} --gpio sim:{} --trust-dir {} --no-rt --exit-when-idle --quiet",
            b.gpio.display(),
            b.trust.display()
        ),
        "execv: the launcher's PID, `run` and its flags"
    );
    assert_eq!(
        b.state().trial,
        Some(Trial {
            version: "9.9.9".into(),
            started: true
        })
    );

    // systemd starts it again: rolled back to the packaged agent.
    let (out, _) = b.launch();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(b.starts("9.9.9").len(), 1, "the trial never runs again");
    let s = b.state();
    assert_eq!(s.trial, None);
    let r = s.rolled_back.expect("rolled back");
    assert_eq!((r.from.as_str(), r.to.as_deref()), ("9.9.9", None));
    assert!(
        stderr(&out).contains("agent update: version 9.9.9 rolled back to the packaged agent"),
        "{}",
        stderr(&out)
    );
}

/// A settled version runs at every start; a new trial on top of it that
/// fails rolls back to it, not to the packaged binary.
#[test]
fn a_failed_trial_rolls_back_to_the_settled_version() {
    let b = a_device();
    b.install_script("9.9.8", 0);
    b.install_script("9.9.9", 1);
    b.versions
        .write_state(&BootState {
            packaged: VERSION.into(),
            settled: Some("9.9.8".into()),
            ..BootState::default()
        })
        .expect("state");
    assert!(b.launch().0.status.success());
    assert_eq!(b.starts("9.9.8").len(), 1);
    stage(&b, "9.9.9");
    assert_eq!(b.launch().0.status.code(), Some(1));
    assert!(b.launch().0.status.success());
    assert_eq!((b.starts("9.9.8").len(), b.starts("9.9.9").len()), (2, 1));
    assert_eq!(b.state().settled.as_deref(), Some("9.9.8"));
}

/// A version whose binary cannot be executed (not executable here; a
/// wrong architecture is the same `execve` refusal) is rolled back at
/// once, and this start runs the packaged agent.
#[test]
fn a_version_that_cannot_be_started_is_rolled_back_at_once() {
    let b = a_device();
    let bin = b.install_script("9.9.9", 0);
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    stage(&b, "9.9.9");
    let (out, _) = b.launch();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(b.starts("9.9.9").is_empty());
    let r = b.state().rolled_back.expect("rolled back");
    assert!(r.why.starts_with("it could not be started"), "{}", r.why);
    assert!(stderr(&out).contains("rolled back"), "{}", stderr(&out));
}

/// The packaged agent is the floor: no state; a state written by another
/// packaged version (a package installed by hand since) starts afresh.
#[test]
fn the_packaged_agent_runs_without_a_state_and_after_a_package_upgrade() {
    let b = a_device();
    assert!(b.launch().0.status.success());
    assert_eq!(b.versions.read_state().expect("read"), None);
    b.install_script("9.9.8", 7);
    b.versions
        .write_state(&BootState {
            packaged: "0.0.1".into(),
            settled: Some("9.9.8".into()),
            ..BootState::default()
        })
        .expect("state");
    assert!(b.launch().0.status.success());
    assert!(b.starts("9.9.8").is_empty());
    assert_eq!(
        b.state(),
        BootState {
            packaged: VERSION.into(),
            ..BootState::default()
        }
    );
}

/// The built binary holds one version slot, reading as its version, and
/// a copy stamped with another version reports that one.
#[test]
fn the_binary_carries_one_version_slot_that_a_copy_can_be_stamped_in() {
    let bin = std::fs::read(AGENT).expect("read the agent");
    let stamped = baton_agent::version::stamp(&bin, "9.9.9").expect("exactly one slot");
    let dir = tempfile::tempdir().expect("tmp");
    let copy = dir.path().join("baton-agent");
    std::fs::write(&copy, stamped).expect("write");
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let said = |bin: &std::path::Path| {
        let out = Command::new(bin).arg("--version").output().expect("run");
        assert!(out.status.success(), "{}", stderr(&out));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(
        said(std::path::Path::new(AGENT)),
        format!("baton-agent {VERSION}")
    );
    assert_eq!(said(&copy), "baton-agent 9.9.9");
}

/// A binary that is not its signed release any more (replaced after its
/// install, by anything that can write the data directory) is never run:
/// a trial is given up for the version before, a settled version is
/// dropped (said as a rollback) and the packaged agent runs.
#[test]
fn an_installed_binary_that_is_not_its_signed_release_is_never_run() {
    let b = a_device();
    b.install_script("9.9.8", 0);
    let trial = b.install_script("9.9.9", 0);
    b.versions
        .write_state(&BootState {
            packaged: VERSION.into(),
            settled: Some("9.9.8".into()),
            ..BootState::default()
        })
        .expect("state");
    stage(&b, "9.9.9");
    let planted = "#!/bin/sh\necho planted >> /dev/null\nexit 0\n";
    std::fs::write(&trial, planted).expect("plant");
    let (out, _) = b.launch();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(b.starts("9.9.9").is_empty(), "the planted binary ran");
    assert_eq!(b.starts("9.9.8").len(), 1, "the version before ran");
    let s = b.state();
    assert!(s.gave_up("9.9.9"));
    assert!(
        s.rolled_back
            .expect("said")
            .why
            .contains("not its signed release"),
        "{}",
        stderr(&out)
    );

    // The settled one tampered with: not run, dropped and said (not given
    // up: the same version signed again may come back).
    let settled = b.versions.binary("9.9.8");
    std::fs::write(&settled, planted).expect("plant");
    let (out, _) = b.launch();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(b.starts("9.9.8").len(), 1, "not run again");
    let s = b.state();
    assert_eq!(s.settled, None);
    assert!(!s.gave_up("9.9.8"));
    assert_eq!(s.rolled_back.map(|r| r.from).as_deref(), Some("9.9.8"));
}

/// A stop that comes while the agent replaces itself (an update's
/// restart) stays pending across the `execve`, blocked, and the new image
/// takes it: here the agent starts with SIGTERM blocked and pending, as it
/// would be then, and stops through its way out at once (a signal thread
/// with handlers alone would never see it, and the agent would run on).
#[test]
fn a_stop_pending_across_an_exec_stops_the_new_image() {
    use nix::sys::signal::{SigSet, Signal};
    use std::os::unix::process::CommandExt as _;
    let b = a_device();
    let mut cmd = Command::new(AGENT);
    cmd.arg("run")
        .arg("--data")
        .arg(&b.data)
        .arg("--gpio")
        .arg(format!("sim:{}", b.gpio.display()))
        .args(["--no-rt", "--quiet"])
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    // SAFETY: between fork and exec only async-signal-safe calls:
    // pthread_sigmask, getpid and kill (to the process, as systemd sends
    // it, not to the thread).
    unsafe {
        cmd.pre_exec(|| {
            let mut set = SigSet::empty();
            set.add(Signal::SIGTERM);
            set.thread_block().map_err(std::io::Error::from)?;
            nix::sys::signal::kill(nix::unistd::getpid(), Signal::SIGTERM)
                .map_err(std::io::Error::from)
        });
    }
    let child = cmd.spawn().expect("spawn");
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    // A bound: an agent that never sees the stop is killed, and fails.
    let guard = std::thread::spawn(move || {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let timed_out = rx.recv_timeout(std::time::Duration::from_secs(60)).is_err();
        drop(tx);
        if timed_out {
            let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
        }
    });
    let out = child.wait_with_output().expect("wait");
    drop(guard);
    assert!(out.status.success(), "{:?} {}", out.status, stderr(&out));
    assert!(
        stderr(&out).contains("stop requested by signal"),
        "{}",
        stderr(&out)
    );
}
