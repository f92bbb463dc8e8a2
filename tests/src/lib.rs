//! Helpers for the end-to-end tests: find the real binaries, run them with
//! a timeout, and wait on events (a line in a file, a process exit) with a
//! deadline — never a bare sleep.

pub mod fleet;
pub mod local;
pub mod relay;
pub mod update_site;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// Path of a workspace binary (`baton-agent`, `baton-controller`). Cargo
/// builds a package's binaries only for that package's own tests, so on a
/// fresh `cargo test --workspace` they may not exist yet, or be older than
/// the sources: `cargo build --bins` runs once per test process (a no-op
/// when they are current), with the same cargo and profile.
pub fn bin(name: &str) -> PathBuf {
    static BUILD: std::sync::Once = std::sync::Once::new();
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/<test>");
    let p = dir.join(name);
    BUILD.call_once(|| build_bins(dir));
    assert!(p.exists(), "{} could not be built", p.display());
    p
}

/// `cargo build --bins` for the workspace into the target directory the
/// tests run from (`dir` is `target/<profile>`).
fn build_bins(dir: &Path) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let target = dir.parent().expect("target/<profile>");
    let mut cmd = Command::new(cargo);
    // The variables cargo sets for this test process describe this
    // package; a build script that declares them `rerun-if-env-changed`
    // (ring's does: CARGO_PKG_NAME, CARGO_MANIFEST_DIR, ...) would be
    // re-run here and again by the next `cargo test`, rebuilding
    // everything above it each time. Build as from the shell.
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("CARGO_PKG_")
            || k.starts_with("CARGO_BIN_")
            || k.starts_with("CARGO_MANIFEST_")
            || matches!(
                &*k,
                "CARGO_CRATE_NAME" | "CARGO_PRIMARY_PACKAGE" | "CARGO_TARGET_TMPDIR"
            )
        {
            cmd.env_remove(&*k);
        }
    }
    cmd.current_dir(root())
        .args(["build", "--workspace", "--bins"])
        // The agent's hidden fault flags (`--inject-*`), which shipped
        // builds leave out; scripts/test.sh builds the same way, so this
        // build finds everything up to date.
        .args(["--features", "baton-agent/fault-injection"])
        .arg("--target-dir")
        .arg(target);
    if dir.file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    let status = cmd.status().expect("running cargo build for the binaries");
    assert!(status.success(), "building the binaries failed: {status}");
}

/// The workspace root (for `examples/packs`).
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the workspace")
        .to_path_buf()
}

/// Run to completion with a timeout; kill on timeout and panic. Output is
/// read while the child runs (a child writing more than a pipe holds would
/// otherwise block forever on a full pipe).
pub fn run(cmd: &mut Command, timeout: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let status = wait_exit(&mut child, timeout)
        .unwrap_or_else(|| panic!("{cmd:?} did not finish within {timeout:?}"));
    Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }
}

/// Wait for a child to exit, up to `timeout`; `None` (child killed) if it
/// did not. Polls `try_wait` every few ms: a process exit has no portable
/// blocking wait with a timeout.
pub fn wait_exit(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let end = Instant::now() + timeout;
    loop {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::park_timeout(Duration::from_millis(5));
    }
}

/// Wait until `cond` holds (checked every few ms), up to `timeout`.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::park_timeout(Duration::from_millis(5));
    }
    cond()
}

/// Lines of a file (empty if missing).
pub fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .map(|s| s.lines().map(str::to_string).collect())
        .unwrap_or_default()
}

/// Send a signal to a child.
pub fn signal(child: &Child, sig: i32) {
    // SAFETY: plain kill(2) on our own child's pid.
    unsafe {
        libc::kill(child.id() as i32, sig);
    }
}

/// A child process killed when dropped, so a failing test never leaves an
/// agent running.
#[derive(Debug)]
pub struct Running(pub Child);

impl std::ops::Deref for Running {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Running {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// A small deterministic generator: a test's random moments come from a
/// fixed seed, never from the environment.
#[derive(Debug)]
pub struct Lcg(pub u64);

impl Lcg {
    /// The next value in `0..n`.
    pub fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// A command's stdout then stderr, as text (for an assertion's message).
pub fn output_text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `baton-controller ARGS` that dials no controller (`keys`, `validate`).
pub fn controller_tool(args: &[&str]) -> Output {
    run(
        Command::new(bin("baton-controller")).args(args),
        Duration::from_secs(60),
    )
}

/// A new signing key `name` in `dir` (`keys new`); its public half's text.
pub fn new_key(dir: &std::path::Path, name: &str) -> String {
    let dir = dir.to_str().expect("utf-8");
    let o = controller_tool(&["keys", "new", name, "--dir", dir]);
    assert!(o.status.success(), "{}", output_text(&o));
    std::fs::read_to_string(std::path::Path::new(dir).join(format!("{name}.pub")))
        .expect("pub")
        .trim()
        .to_string()
}

/// The file process `pid` runs. Under qemu-user (an aarch64 build of the
/// agent on this host: `cross/test-aarch64.sh`) the kernel runs the
/// emulator for the image through binfmt_misc, so `/proc/PID/exe` names
/// qemu; the image is then the second word of the command line, where
/// binfmt_misc puts the file it was asked to execute (qemu's own
/// `/proc/self/exe` is emulated for the process itself only).
pub fn running_image(pid: u32) -> PathBuf {
    use std::os::unix::ffi::OsStrExt as _;
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).expect("exe");
    let emulated = exe
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("qemu-"));
    if !emulated {
        return exe;
    }
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("cmdline");
    let image = cmdline
        .split(|b| *b == 0)
        .nth(1)
        .expect("binfmt_misc names the image");
    PathBuf::from(std::ffi::OsStr::from_bytes(image))
}
