//! `baton-agent launch`: what systemd starts. It picks the binary this
//! start runs from the versions directory's state (`baton_update::boot`:
//! the settled version, a trial once, the packaged binary as the floor),
//! writes the state first (a trial is marked started before it runs, so
//! a build that cannot start runs once), and then the binary's `run`
//! replaces this process (`execv`: the same PID, so systemd's notify
//! socket, watchdog and stop signal reach the agent as before).

use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStringExt as _;
use std::path::{Path, PathBuf};

use baton_update::boot::{self, BootState, RolledBack};
use baton_update::{Launch, Versions};

use crate::version::version;

/// What a start runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// This process goes on as `run`.
    Packaged,
    /// An installed version's binary replaces this process.
    Installed {
        /// Its version.
        version: String,
        /// Its binary.
        binary: PathBuf,
    },
}

/// The launcher's decision for the agent whose data directory is
/// `data_dir`, with the state it needs written first. A state that cannot
/// be read or written runs the packaged binary: the floor, never a trial
/// that could not be recorded as started.
pub fn decide(data_dir: &Path) -> Target {
    let versions = Versions::of_data_dir(data_dir);
    let state = match versions.read_state() {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("launch: {e}; running the packaged agent {}", version());
            return Target::Packaged;
        }
    };
    let (next, launch) = boot::at_launch(state.as_ref(), version(), |v| versions.is_installed(v));
    if let Some(next) = next {
        if let Some(r) = next
            .rolled_back
            .as_ref()
            .filter(|r| state.as_ref().and_then(|s| s.rolled_back.as_ref()) != Some(*r))
        {
            tracing::error!("{}", rolled_back_line(r));
        }
        if let Err(e) = versions.write_state(&next) {
            tracing::error!("launch: {e}; running the packaged agent {}", version());
            return Target::Packaged;
        }
    }
    match launch {
        Launch::Packaged => Target::Packaged,
        Launch::Version(v) if v == version() => Target::Packaged,
        Launch::Version(version) => Target::Installed {
            binary: versions.binary(&version),
            version,
        },
    }
}

/// After `execv` of `version` failed: the state rolled back to the
/// packaged binary (never the same failure at every start), and the line
/// to log.
pub fn exec_failed(data_dir: &Path, version: &str, why: &str) -> String {
    let versions = Versions::of_data_dir(data_dir);
    let rolled = RolledBack {
        from: version.to_string(),
        to: None,
        why: format!("it could not be started ({why})"),
    };
    let line = rolled_back_line(&rolled);
    let state = BootState {
        packaged: crate::version::version().to_string(),
        settled: None,
        trial: None,
        rolled_back: Some(rolled),
    };
    match versions.write_state(&state) {
        Ok(()) => line,
        Err(e) => format!("{line}; and the launcher's state could not be written: {e}"),
    }
}

/// How a rollback reads in the log.
pub fn rolled_back_line(r: &RolledBack) -> String {
    format!(
        "agent update: version {} rolled back to {}: {}",
        r.from,
        r.to.as_deref()
            .unwrap_or(concat!("the packaged agent ", env!("CARGO_PKG_VERSION"))),
        r.why
    )
}

/// The argument vector that runs `binary` as `run` with the flags given to
/// `launch` (`launch_args`: what followed `launch` on its command line).
pub fn run_argv(binary: &Path, launch_args: Vec<OsString>) -> Result<Vec<CString>, String> {
    argv(binary, "run", launch_args)
}

/// The argument vector that runs the launcher with `run`'s flags
/// (`run_args`: what followed `run` on this process's command line).
pub fn launch_argv(launcher: &Path, run_args: Vec<OsString>) -> Result<Vec<CString>, String> {
    argv(launcher, "launch", run_args)
}

fn argv(binary: &Path, command: &str, args: Vec<OsString>) -> Result<Vec<CString>, String> {
    let mut argv = Vec::with_capacity(args.len() + 2);
    for a in [binary.as_os_str().to_owned(), OsString::from(command)]
        .into_iter()
        .chain(args)
    {
        argv.push(
            CString::new(a.into_vec()).map_err(|_| "an argument holds a NUL byte".to_string())?,
        );
    }
    Ok(argv)
}

/// The name of the environment variable through which the launcher tells
/// the version it starts where the launcher is.
pub const LAUNCHER_ENV: &str = "BATON_AGENT_LAUNCHER";

/// The launcher to hand over to for an update: the one that started this
/// process, as it said ([`LAUNCHER_ENV`]: an absolute path to a file),
/// else this binary (started as `run`, it is the packaged one).
pub fn launcher() -> PathBuf {
    let said = std::env::var_os(LAUNCHER_ENV)
        .map(PathBuf::from)
        .filter(|p| p.is_absolute() && p.is_file());
    said.or_else(|| std::env::current_exe().ok())
        .unwrap_or_else(|| PathBuf::from("/usr/bin/baton-agent"))
}

/// What followed `launch` on this process's command line.
pub fn launch_args() -> Vec<OsString> {
    let mut args = std::env::args_os().skip(1);
    // `launch` is the first argument (the binary has no global flags).
    let _ = args.next();
    args.collect()
}

/// Replaces this process with `binary` and `argv`, telling it that the
/// launcher is `launcher` ([`LAUNCHER_ENV`], replacing what this process
/// was told); returns only on failure, saying why.
pub fn exec(binary: &Path, argv: &[CString], launcher: &Path) -> String {
    let path = match CString::new(binary.as_os_str().to_owned().into_vec()) {
        Ok(p) => p,
        Err(_) => return "its path holds a NUL byte".to_string(),
    };
    let mut env: Vec<CString> = std::env::vars_os()
        .filter(|(k, _)| k != LAUNCHER_ENV)
        .filter_map(|(k, v)| {
            let mut kv = k.into_vec();
            kv.push(b'=');
            kv.extend(v.into_vec());
            CString::new(kv).ok()
        })
        .collect();
    let mut said = format!("{LAUNCHER_ENV}=").into_bytes();
    said.extend(launcher.as_os_str().to_owned().into_vec());
    if let Ok(s) = CString::new(said) {
        env.push(s);
    }
    match nix::unistd::execve(&path, argv, &env) {
        Ok(never) => match never {},
        Err(e) => e.to_string(),
    }
}
