//! The controller processes the bench serves against, and what it reads
//! of them from `/proc`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};

use crate::{CONNECTING, Tls, common};

/// `cargo build --release -p baton-controller` into this bench's target
/// directory; the binary's path as cargo reports it.
pub fn build_controller() -> Result<PathBuf> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    // target/release/deps/fleet-HASH
    let me = std::env::current_exe()?;
    let target = me
        .parent()
        .and_then(Path::parent)
        .and_then(Path::parent)
        .context("bench executable not in TARGET/PROFILE/deps")?;
    let out = Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "build",
            "--release",
            "-p",
            "baton-controller",
            "--bin",
            "baton-controller",
            "--message-format=json-render-diagnostics",
        ])
        .arg("--target-dir")
        .arg(target)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .context("running cargo build --release")?;
    if !out.status.success() {
        bail!("cargo build --release -p baton-controller: {}", out.status);
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["reason"] == "compiler-artifact" && v["target"]["name"] == "baton-controller")
        .find_map(|v| v["executable"].as_str().map(PathBuf::from))
        .context("cargo reported no baton-controller executable")
}

/// How a controller is served, beyond its store.
#[derive(Clone, Debug, Default)]
pub struct Serve {
    /// `--store URL` (PostgreSQL); else the store is SQLite in its data
    /// directory.
    pub store: Option<String>,
    /// `--replica-id`: one of several replicas on `store`.
    pub replica: Option<String>,
    /// The serve defaults' admission bound (`--admit-rate 500
    /// --admit-burst 100`), which a failover meets; else `--admit-rate 0`.
    pub admit: bool,
    /// `--max-connections`: the fleet, with room.
    pub max_connections: usize,
}

/// The controller process, killed (and its data directory removed) when
/// dropped, whatever happened.
pub struct Controller {
    child: Child,
    pub pid: u32,
    data: tempfile::TempDir,
    pub url: String,
    serve: Serve,
    /// Killed on purpose (a failover), not started again.
    killed: bool,
    exe: PathBuf,
    tls_dir: Option<PathBuf>,
}

impl Controller {
    pub fn start(exe: &Path, base: &Path, tls: Option<&Tls>, serve: Serve) -> Result<Controller> {
        let data = tempfile::tempdir_in(base)?;
        let (child, url) = spawn(
            exe,
            data.path(),
            tls.map(|t| t.dir.as_path()),
            &serve,
            "127.0.0.1:0",
        )?;
        Ok(Controller {
            pid: child.id(),
            child,
            data,
            url,
            serve,
            killed: false,
            exe: exe.to_path_buf(),
            tls_dir: tls.map(|t| t.dir.clone()),
        })
    }

    /// `--store`: the PostgreSQL database, if the store is there.
    pub fn store(&self) -> Option<&str> {
        self.serve.store.as_deref()
    }

    /// `kill -9`, and reaped.
    pub fn kill9(&mut self) -> Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        self.killed = true;
        Ok(())
    }

    /// Starts the controller again (after [`Controller::kill9`]) on the
    /// same address, data directory and store: what a supervisor does.
    pub fn start_again(&mut self) -> Result<()> {
        let addr = self
            .url
            .rsplit_once("//")
            .map_or(self.url.as_str(), |(_, a)| a)
            .to_owned();
        let (child, url) = spawn(
            &self.exe,
            self.data.path(),
            self.tls_dir.as_deref(),
            &self.serve,
            &addr,
        )?;
        self.pid = child.id();
        self.child = child;
        self.url = url;
        self.killed = false;
        Ok(())
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.data.path().join("controller.log")).unwrap_or_default()
    }

    /// Feedback rows the controller has stored, read from its store.
    pub async fn stored_feedback(&self) -> Result<i64> {
        let dir = self.data.path().to_path_buf();
        let store = self.serve.store.clone();
        // Both clients block (PostgreSQL's runs a runtime of its own).
        tokio::task::spawn_blocking(move || match store {
            None => common::count(&dir).map_err(|e| anyhow!(e)),
            Some(url) => {
                let mut c = postgres::Client::connect(&url, postgres::NoTls)?;
                Ok(c.query_one("SELECT COUNT(*) FROM feedback", &[])?
                    .try_get(0)?)
            }
        })
        .await?
    }

    /// SIGTERM, and how it ended (SIGKILL after 10 s).
    pub fn stop(mut self) -> Result<String> {
        if let Some(s) = self.child.try_wait()? {
            if self.killed {
                return Ok(format!("killed by the failover ({s})"));
            }
            bail!("controller had already exited: {s}");
        }
        // SAFETY: kill(2) on our own child, which has not been reaped
        // (try_wait just said it is running), so the pid is still ours.
        unsafe {
            libc::kill(self.pid as i32, libc::SIGTERM);
        }
        let end = Instant::now() + Duration::from_secs(10);
        let t0 = Instant::now();
        while Instant::now() < end {
            if let Some(s) = self.child.try_wait()? {
                return Ok(format!("stopped on SIGTERM in {:?} ({s})", t0.elapsed()));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.child.kill()?;
        self.child.wait()?;
        Ok("did not stop within 10 s of SIGTERM; killed".into())
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        // `data` is removed after this, with the process gone.
    }
}

/// Spawns `serve` over `data` listening on `listen`; returns once it
/// listens, with its URL.
fn spawn(
    exe: &Path,
    data: &Path,
    tls_dir: Option<&Path>,
    serve: &Serve,
    listen: &str,
) -> Result<(Child, String)> {
    let addr_file = data.join("listen.addr");
    // A restart's stale address must not be read as the new one's.
    let _ = std::fs::remove_file(&addr_file);
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(data.join("controller.log"))?;
    let mut cmd = Command::new(exe);
    cmd.arg("serve");
    match tls_dir {
        // Every simulated agent dials from 127.0.0.1, CONNECTING at
        // once: one source, where a real fleet is many.
        Some(dir) => cmd
            .arg("--tls-dir")
            .arg(dir)
            .args(["--max-handshakes-per-source", &CONNECTING.to_string()]),
        None => cmd.arg("--insecure"),
    };
    let scheme = if tls_dir.is_some() { "https" } else { "http" };
    if !serve.admit {
        // No admission bound: these agents come up as fast as the bench
        // dials them (the figures here are memory, push and ingest; a
        // storm against the bound is `benches/storm.rs`).
        cmd.args(["--admit-rate", "0"]);
    }
    cmd.args(["--max-connections", &serve.max_connections.to_string()]);
    cmd.args(["--listen", listen, "--data"])
        .arg(data)
        .args(serve.store.iter().flat_map(|url| ["--store", url.as_str()]))
        .args(
            serve
                .replica
                .iter()
                .flat_map(|id| ["--replica-id", id.as_str()]),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: between fork and exec the closure only calls prctl(2),
        // which is async-signal-safe and touches no memory of ours. It
        // makes the kernel kill the controller if this bench dies
        // without running its destructors (SIGKILL, abort).
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let mut child = cmd
        .spawn()
        .with_context(|| format!("spawn {}", exe.display()))?;
    let log = || std::fs::read_to_string(data.join("controller.log")).unwrap_or_default();
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(s) = std::fs::read_to_string(&addr_file)
            && !s.trim().is_empty()
        {
            return Ok((child, format!("{scheme}://{}", s.trim())));
        }
        if let Some(status) = child.try_wait()? {
            bail!("controller exited ({status}) before listening:\n{}", log());
        }
        if Instant::now() > end {
            let _ = child.kill();
            bail!("controller not listening after 30 s:\n{}", log());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// VmRSS, VmHWM (kB) and threads, summed over the live controllers.
pub fn status_of(ctls: &[Controller]) -> Result<(u64, u64, u64)> {
    let mut sum = (0, 0, 0);
    for c in ctls.iter().filter(|c| !c.killed) {
        let (rss, hwm, threads) = proc_status(c.pid)?;
        sum = (sum.0 + rss, sum.1 + hwm, sum.2 + threads);
    }
    Ok(sum)
}

/// VmRSS, VmHWM (kB) and threads of a process.
pub fn proc_status(pid: u32) -> Result<(u64, u64, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> Result<u64> {
        s.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("{name} in /proc/{pid}/status"))
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?, field("Threads:")?))
}

/// Where a process's resident memory is: anonymous (heap, stacks) and
/// file-backed (code, mapped files), from `/proc/PID/smaps_rollup`.
pub fn smaps(pid: u32) -> String {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")) else {
        return "no smaps_rollup".into();
    };
    let field = |name: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .unwrap_or("?")
            .to_string()
    };
    format!(
        "anonymous {} kB, file {} kB",
        field("Anonymous:"),
        field("Pss_File:")
    )
}

/// CPU time (user + system) of a process so far.
pub fn cpu_time(pid: u32) -> Result<Duration> {
    stat_ticks(pid, &[11, 12])
}

/// [`cpu_time`] with the children it has waited for (a server's ended
/// backends).
pub fn cpu_time_with_children(pid: u32) -> Result<Duration> {
    stat_ticks(pid, &[11, 12, 13, 14])
}

/// The parent of `pid` (`None`: gone).
pub fn parent_of(pid: u32) -> Option<u32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = s.rsplit_once(')')?.1;
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// The sum of the tick fields `at` of `/proc/PID/stat`, counted from the
/// field after the command name (the 3rd: utime is 11, stime 12, cutime
/// 13, cstime 14), as a duration.
fn stat_ticks(pid: u32, at: &[usize]) -> Result<Duration> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces): state is 3rd.
    let rest = s
        .rsplit_once(')')
        .map(|(_, r)| r)
        .context("/proc/PID/stat")?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let mut t = 0u64;
    for &i in at {
        t += f
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .context("CPU ticks in /proc/PID/stat")?;
    }
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Ok(Duration::from_secs_f64(t as f64 / hz as f64))
}

pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// CPU seconds of the live controllers and of this bench over a phase.
pub struct Cpu {
    ctls: Vec<(u32, Duration)>,
    me: Duration,
}

impl Cpu {
    pub fn start(ctls: &[Controller]) -> Result<Cpu> {
        Ok(Cpu {
            ctls: ctls
                .iter()
                .filter(|c| !c.killed)
                .map(|c| Ok((c.pid, cpu_time(c.pid)?)))
                .collect::<Result<_>>()?,
            me: cpu_time(std::process::id())?,
        })
    }

    pub fn done(&self) -> Result<(f64, f64)> {
        let mut ctl = 0.0;
        for (pid, t0) in &self.ctls {
            ctl += (cpu_time(*pid)? - *t0).as_secs_f64();
        }
        Ok((ctl, (cpu_time(std::process::id())? - self.me).as_secs_f64()))
    }
}
