//! Two network namespaces joined by a veth pair, with ptp4l (linuxptp) as
//! the grandmaster in one of them: the rig for the PTP interop test and the
//! PTP-vs-ptp4l figure. Everything is removed on drop, a panic included.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};

/// Why the rig cannot run here (the test then skips, saying so).
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root: network namespaces and PTP ports need it".into());
    }
    for tool in ["ip", "ptp4l"] {
        let found = std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
            || ["/usr/sbin", "/sbin"]
                .iter()
                .any(|d| std::path::Path::new(d).join(tool).is_file());
        if !found {
            return Some(format!(
                "{tool} not installed (scripts/test.sh installs it)"
            ));
        }
    }
    None
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {args:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// The rig: namespace `gm` (grandmaster side, `gm_if`, 10.x.0.1) and
/// namespace `slave` (`slave_if`, 10.x.0.2).
pub struct Rig {
    pub gm: String,
    pub slave: String,
    pub gm_if: String,
    pub slave_if: String,
    dir: PathBuf,
    children: Vec<Child>,
}

impl Rig {
    /// Create both namespaces and the link (names unique per process and
    /// `tag`). `Err` when namespaces cannot be made here.
    pub fn new(tag: &str) -> Result<Rig, String> {
        let pid = std::process::id();
        let base = format!("bt{tag}{pid}");
        let rig = Rig {
            gm: format!("{base}-gm"),
            slave: format!("{base}-sl"),
            gm_if: format!("{tag}{pid}g"),
            slave_if: format!("{tag}{pid}s"),
            dir: std::env::temp_dir().join(format!("{base}-ptp")),
            children: Vec::new(),
        };
        std::fs::create_dir_all(&rig.dir).map_err(|e| e.to_string())?;
        let net = 10 + (pid % 200);
        let gm_addr = format!("10.{net}.0.1/24");
        let sl_addr = format!("10.{net}.0.2/24");
        ip(&["netns", "add", &rig.gm])?;
        ip(&["netns", "add", &rig.slave])?;
        ip(&[
            "link",
            "add",
            &rig.gm_if,
            "type",
            "veth",
            "peer",
            "name",
            &rig.slave_if,
        ])?;
        ip(&["link", "set", &rig.gm_if, "netns", &rig.gm])?;
        ip(&["link", "set", &rig.slave_if, "netns", &rig.slave])?;
        for (ns, dev, addr) in [
            (&rig.gm, &rig.gm_if, &gm_addr),
            (&rig.slave, &rig.slave_if, &sl_addr),
        ] {
            ip(&["-n", ns, "addr", "add", addr, "dev", dev])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        // On an early return above, dropping the partial rig cleans up.
        Ok(rig)
    }

    /// Write a ptp4l config file.
    pub fn config(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.join(name);
        std::fs::write(&p, text).expect("write ptp4l config");
        p
    }

    /// Run ptp4l in namespace `ns` with `args`; its stdout lines arrive on
    /// the returned channel.
    pub fn ptp4l(&mut self, ns: &str, args: &[&str]) -> Receiver<String> {
        let mut child = Command::new("ip")
            .args(["netns", "exec", ns, "ptp4l"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start ptp4l");
        let out = child.stdout.take().expect("ptp4l stdout");
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        self.children.push(child);
        rx
    }

    /// Run `f` on a fresh thread that has entered the slave namespace (the
    /// threads it starts stay in it).
    pub fn in_slave<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = format!("/run/netns/{}", self.slave);
        std::thread::spawn(move || {
            let ns = std::fs::File::open(&path).expect("open netns");
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            f()
        })
        .join()
        .expect("thread in the slave namespace")
    }
}

impl Rig {
    /// Stop every ptp4l this rig started (only those, by their own pid).
    pub fn stop_ptp4l(&mut self) {
        for mut c in self.children.drain(..) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.stop_ptp4l();
        let _ = ip(&["netns", "del", &self.gm]);
        let _ = ip(&["netns", "del", &self.slave]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// ptp4l grandmaster config: wins any BMCA (priority1 1), 1 s announces,
/// 4 syncs a second, E2E, software timestamps.
pub const GM_CONFIG: &str = "[global]
priority1 1
priority2 1
domainNumber 0
logAnnounceInterval 0
logSyncInterval -2
logMinDelayReqInterval 0
delay_mechanism E2E
network_transport UDPv4
time_stamping software
masterOnly 1
";

/// `CLOCK_REALTIME − CLOCK_MONOTONIC` now, ns (bracketed): the truth the
/// PTP source's samples must match when both ends share one clock.
pub fn truth_ns() -> i64 {
    baton_clock::ptp::shell::realtime_minus_mono()
}
