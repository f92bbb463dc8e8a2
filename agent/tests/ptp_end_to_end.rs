//! The PTP source end to end, with the real binaries: ptp4l as grandmaster
//! in one network namespace; a controller and an agent (`--ptp-interface`,
//! its system clock `untrusted`) in the other. `agents --json` must show
//! source `ptp`, state `locked` and an offset that is the error (one
//! physical clock on both ends). The controller binary is built next to
//! the agent's on demand (`baton_e2e::bin`), so a plain `cargo test
//! --workspace` on a fresh clone runs it.

#[path = "../../clock/tests/ptp_netns/mod.rs"]
mod ptp_netns;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Locked in ~7 s; reports every 5 s and on each change.
const WAIT: Duration = Duration::from_secs(45);

/// A process killed and reaped on drop (a failed assertion included).
struct Proc(Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn controller_bin() -> PathBuf {
    baton_e2e::bin("baton-controller")
}

fn in_ns(ns: &str, bin: &Path) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]).arg(bin);
    c
}

#[test]
fn agents_shows_ptp_locked_with_the_offset() {
    if let Some(why) = ptp_netns::unavailable() {
        baton_testenv::missing("ptp_end_to_end", None, &why);
        return;
    }
    let mut rig = match ptp_netns::Rig::new("e2") {
        Ok(r) => r,
        Err(e) => {
            baton_testenv::missing(
                "ptp_end_to_end",
                None,
                &format!("cannot create network namespaces: {e}"),
            );
            return;
        }
    };
    let gm_cfg = rig.config("gm.cfg", ptp_netns::GM_CONFIG);
    let (gm, gm_if) = (rig.gm.clone(), rig.gm_if.clone());
    let _gm = rig.ptp4l(
        &gm,
        &[
            "-f",
            gm_cfg.to_str().expect("utf-8"),
            "-i",
            &gm_if,
            "-S",
            "-4",
            "-E",
            "-q",
        ],
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let ctl_bin = controller_bin();
    let ctl_data = dir.path().join("ctl");
    let ctl_log = std::fs::File::create(dir.path().join("ctl.log")).expect("log");
    let _ctl = Proc(
        in_ns(&rig.slave, &ctl_bin)
            .args(["serve", "--insecure", "--listen", "127.0.0.1:0", "--data"])
            .arg(&ctl_data)
            .stdout(Stdio::null())
            .stderr(ctl_log)
            .spawn()
            .expect("controller"),
    );
    let addr_file = ctl_data.join("listen.addr");
    let t0 = Instant::now();
    while !addr_file.is_file() && t0.elapsed() < WAIT {
        std::thread::sleep(Duration::from_millis(20));
    }
    let url = format!(
        "http://{}",
        std::fs::read_to_string(&addr_file)
            .expect("the controller writes its address")
            .trim()
    );
    let agent_log = dir.path().join("agent.log");
    let _agent = Proc(
        in_ns(&rig.slave, Path::new(env!("CARGO_BIN_EXE_baton-agent")))
            .args(["run", "--no-rt", "--quiet", "--id", "p1", "--insecure"])
            .args(["--controller", &url, "--system-clock", "untrusted"])
            .args(["--ptp-interface", &rig.slave_if])
            .arg("--data")
            .arg(dir.path().join("agent"))
            .arg("--gpio")
            .arg(format!("sim:{}", dir.path().join("gpio.jsonl").display()))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&agent_log).expect("log"))
            .spawn()
            .expect("agent"),
    );
    let agents = || -> Option<serde_json::Value> {
        let o = in_ns(&rig.slave, &ctl_bin)
            .args(["agents", "--json", "--insecure", "--controller", &url])
            .output()
            .ok()?;
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|a| a["id"] == "p1")
    };
    let start = Instant::now();
    let mut last = None;
    while start.elapsed() < WAIT {
        last = agents();
        // Locked, and settled within the bounds below: the first locked
        // report on a loaded box may still carry a wide uncertainty.
        if last.as_ref().is_some_and(|a| {
            a["clock_source"] == "ptp"
                && a["clock_state"] == "locked"
                && a["clock_offset_ns"]
                    .as_i64()
                    .is_some_and(|o| o.abs() < 100_000)
                && a["clock_uncertainty_ns"]
                    .as_i64()
                    .is_some_and(|u| u > 0 && u < 1_000_000)
        }) {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let a = last.expect("the agent is listed");
    assert!(
        a["clock_source"] == "ptp" && a["clock_state"] == "locked",
        "not locked to PTP in {WAIT:?}: {a}\nagent log:\n{}",
        std::fs::read_to_string(&agent_log).unwrap_or_default()
    );
    let offset = a["clock_offset_ns"].as_i64().expect("offset");
    let uncertainty = a["clock_uncertainty_ns"].as_i64().expect("uncertainty");
    // One physical clock: the offset is the error (software timestamps on
    // a veth: about a microsecond; the bound leaves room for a loaded box).
    assert!(offset.abs() < 100_000, "offset {offset} ns: {a}");
    assert!(uncertainty > 0 && uncertainty < 1_000_000, "{a}");
}
