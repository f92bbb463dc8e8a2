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
/// `data_dir` (and trust, `trust_dir`), with the state it needs written
/// first. A state that cannot be read or written runs the packaged
/// binary: the floor, never a trial that could not be recorded as started.
/// An installed version runs only if its binary is still the release its
/// signed manifest names (checked against the box's newest trust list):
/// one that is not is given up as a binary that cannot be started is.
pub fn decide(data_dir: &Path, trust_dir: Option<&Path>) -> Target {
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
        say_rollback(state.as_ref(), &next);
        if let Err(e) = versions.write_state(&next) {
            tracing::error!("launch: {e}; running the packaged agent {}", version());
            return Target::Packaged;
        }
    }
    checked(&versions, trust_dir, data_dir, launch)
}

/// After `execve` of `version` failed (`why`): what this start runs
/// instead (`baton_update::boot::exec_failed`: a trial given up for the
/// version settled before it; a settled version kept, and the packaged
/// binary this once).
pub fn exec_failed(
    data_dir: &Path,
    trust_dir: Option<&Path>,
    version: &str,
    why: &ExecError,
) -> Target {
    let versions = Versions::of_data_dir(data_dir);
    let launch = give_up(
        &versions,
        version,
        &format!("it could not be started ({why})"),
        why.lasting(),
    );
    checked(&versions, trust_dir, data_dir, launch)
}

/// `launch` as a target, each installed version checked first (at most
/// two: a trial that fails its check falls back to the settled version,
/// and that one's failure to the packaged binary).
fn checked(
    versions: &Versions,
    trust_dir: Option<&Path>,
    data_dir: &Path,
    mut launch: Launch,
) -> Target {
    for _ in 0..2 {
        let v = match launch {
            Launch::Version(v) if v != version() => v,
            _ => return Target::Packaged,
        };
        let check = match trust_dir {
            None => Err("this box has no trust directory to check it against".to_string()),
            Some(dir) => crate::runtime::newest_list(dir, data_dir).and_then(|list| {
                versions.verify_installed(&v, |s| {
                    s.check_with(&list, std::env::consts::ARCH)
                        .map_err(|e| e.to_string())
                })
            }),
        };
        match check {
            Ok(()) => {
                return Target::Installed {
                    binary: versions.binary(&v),
                    version: v,
                };
            }
            Err(why) => {
                launch = give_up(
                    versions,
                    &v,
                    &format!("its binary is not its signed release: {why}"),
                    true,
                );
            }
        }
    }
    Target::Packaged
}

/// `version` not run this start (`why`): the state as
/// `boot::exec_failed` leaves it, written, and what to run instead.
fn give_up(versions: &Versions, version: &str, why: &str, lasting: bool) -> Launch {
    tracing::error!("launch: agent version {version} not run: {why}");
    let state = match versions.read_state() {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("launch: {e}");
            return Launch::Packaged;
        }
    };
    let (next, launch) = boot::exec_failed(state.as_ref(), version, why, lasting);
    if let Some(next) = next {
        say_rollback(state.as_ref(), &next);
        if let Err(e) = versions.write_state(&next) {
            tracing::error!(
                "launch: {e}; running the packaged agent {}",
                crate::version::version()
            );
            return Launch::Packaged;
        }
    }
    launch
}

/// Logs a rollback `next` records that `before` did not.
fn say_rollback(before: Option<&BootState>, next: &BootState) {
    if let Some(r) = next
        .rolled_back
        .as_ref()
        .filter(|r| before.and_then(|s| s.rolled_back.as_ref()) != Some(*r))
    {
        tracing::error!("{}", rolled_back_line(r));
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
/// process, as it said ([`LAUNCHER_ENV`]: an absolute path to a file);
/// else this binary when it is not an installed version (started as
/// `run`, it is the packaged one); else the packaged binary's path.
pub fn launcher() -> PathBuf {
    let said = std::env::var_os(LAUNCHER_ENV)
        .map(PathBuf::from)
        .filter(|p| p.is_absolute() && p.is_file());
    let me = std::env::current_exe()
        .ok()
        .filter(|p| !p.components().any(|c| c.as_os_str() == "agent-versions"));
    said.or(me)
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
pub fn exec(binary: &Path, argv: &[CString], launcher: &Path) -> ExecError {
    let path = match CString::new(binary.as_os_str().to_owned().into_vec()) {
        Ok(p) => p,
        Err(_) => {
            return ExecError {
                why: "its path holds a NUL byte".to_string(),
                errno: None,
            };
        }
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
        Err(e) => ExecError {
            why: e.to_string(),
            errno: Some(e),
        },
    }
}

/// Why `execve` failed.
#[derive(Debug)]
pub struct ExecError {
    /// In words.
    pub why: String,
    errno: Option<nix::errno::Errno>,
}

impl ExecError {
    /// A failure before any `execve` (lasting).
    pub fn new(why: impl Into<String>) -> ExecError {
        ExecError {
            why: why.into(),
            errno: None,
        }
    }

    /// Whether it will fail again (the kernel refuses the binary) rather
    /// than pass (memory, the process table).
    pub fn lasting(&self) -> bool {
        use nix::errno::Errno;
        !matches!(
            self.errno,
            Some(
                Errno::EAGAIN
                    | Errno::ENOMEM
                    | Errno::ENFILE
                    | Errno::EMFILE
                    | Errno::ETXTBSY
                    | Errno::EINTR
                    | Errno::EIO
            )
        )
    }
}

impl std::fmt::Display for ExecError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.why)
    }
}
