//! One agent run on its own: a pack file, the sim GPIO backend's log and a
//! journal directory in a temp dir, and `baton-agent run` on them. The
//! fault, hang and systemd tests share this set-up.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::{bin, lines};

/// Line 5 toggles every 20 ms; the safe state writes it 0.
pub const TOGGLE: &str = "pack: p\nversion: 1\nsafe_state:\n  - {action: gpio.write, params: {line: 5, value: 0}}\n\
     instructions:\n  - {id: t, action: gpio.toggle, params: {line: 5}, every: 20ms}\n";

/// A temp dir with a pack file and paths for the sim log and journal.
#[derive(Debug)]
pub struct Setup {
    /// The temp dir (removed when dropped).
    pub dir: tempfile::TempDir,
    /// The pack file.
    pub pack: PathBuf,
    /// The sim GPIO backend's log (one JSON object per write).
    pub log: PathBuf,
    /// The agent's data directory (its journal).
    pub data: PathBuf,
}

/// A [`Setup`] holding `pack_yaml`.
pub fn setup(pack_yaml: &str) -> Setup {
    let dir = tempfile::tempdir().expect("tempdir");
    let pack = dir.path().join("pack.yaml");
    std::fs::write(&pack, pack_yaml).expect("write pack");
    Setup {
        log: dir.path().join("gpio.jsonl"),
        data: dir.path().join("data"),
        pack,
        dir,
    }
}

/// `baton-agent run` (id `t`, reference clock, no real-time) on the
/// setup's pack, sim log and journal.
pub fn base(s: &Setup) -> Command {
    let mut c = Command::new(bin("baton-agent"));
    c.args(["run", "--system-clock", "reference", "--no-rt", "--id", "t"])
        .arg("--data")
        .arg(&s.data)
        .arg("--gpio")
        .arg(format!("sim:{}", s.log.display()))
        .arg("--pack")
        .arg(&s.pack);
    c
}

/// [`base`] with `extra` flags, quiet, stderr kept for the assertions'
/// messages ([`stderr_of`]).
pub fn agent(s: &Setup, extra: &[&str]) -> Command {
    let mut c = base(s);
    c.arg("--quiet")
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    c
}

/// What an exited child wrote to its piped stderr.
pub fn stderr_of(child: &mut Child) -> String {
    use std::io::Read;
    let mut s = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut s);
    }
    s
}

/// The sim backend's writes so far, parsed; a line still being written
/// (not JSON yet) is left out.
pub fn sim_lines(path: &Path) -> Vec<serde_json::Value> {
    lines(path)
        .iter()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}
