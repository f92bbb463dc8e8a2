//! The update worker (`baton-update`, a thread of its own): a release's
//! pieces written to its `.part` and hashed, the part read back at a
//! resume, the binary installed and put on trial — file IO and SHA-256
//! that the control thread must not wait on while it arms firings. It
//! hears jobs on a small bounded channel and answers on another, waking
//! the control thread; a piece that finds the channel full is dropped and
//! asked again (the fetch's patience), never waited for.

use std::sync::mpsc::{Receiver, SyncSender};
use std::thread::{JoinHandle, Thread};

use baton_trust::{ReleaseManifest, SignedRelease};
use baton_update::{Partial, UpdateError, Versions, boot};

/// What the control thread asks.
#[derive(Debug)]
pub(super) enum Job {
    /// Begin or resume `manifest`'s download (dropping any other in
    /// progress).
    Begin {
        signed: Box<SignedRelease>,
        manifest: ReleaseManifest,
    },
    /// A piece of the release being downloaded.
    Piece {
        version: String,
        offset: u64,
        data: Vec<u8>,
    },
    /// The running version, on trial, was welcomed: settle on it.
    Confirm { version: String },
    /// `version`, installed and not yet run, is withdrawn: undo its
    /// trial in the launcher's state.
    Withdraw { version: String },
}

/// What the worker answers.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Done {
    /// `held` bytes of `version` are kept (after a begin, and after each
    /// piece).
    Held { version: String, held: u64 },
    /// Installed and on trial: the next start runs it.
    Installed { version: String },
    /// Not installed, and why (a part whose bytes were wrong is removed:
    /// the next offer begins again).
    Failed { version: String, why: String },
    /// The trial of `version` confirmed (settled), or why not.
    Confirmed {
        version: String,
        result: Result<(), String>,
    },
    /// The trial of `version` undone (`Ok(true)`), not on trial any more
    /// (`Ok(false)`), or why not.
    Withdrawn {
        version: String,
        result: Result<bool, String>,
    },
}

/// The worker's handle.
#[derive(Debug)]
pub(super) struct Worker {
    jobs: SyncSender<Job>,
    done: Receiver<Done>,
    _thread: JoinHandle<()>,
}

impl Worker {
    /// The worker of the versions in `versions`, waking `control` with
    /// each answer.
    pub(super) fn start(versions: Versions, control: Thread) -> std::io::Result<Worker> {
        let (jobs, job_rx) = std::sync::mpsc::sync_channel(4);
        let (done_tx, done) = std::sync::mpsc::sync_channel(16);
        let thread = std::thread::Builder::new()
            .name("baton-update".into())
            .spawn(move || {
                let mut w = Work {
                    versions,
                    partial: None,
                };
                for job in job_rx {
                    let answer = w.job(job);
                    if done_tx.send(answer).is_err() {
                        break;
                    }
                    control.unpark();
                }
            })?;
        Ok(Worker {
            jobs,
            done,
            _thread: thread,
        })
    }

    /// Hands `job` over; `false` when the worker has no room (a piece is
    /// then asked again) or is gone.
    pub(super) fn give(&self, job: Job) -> bool {
        self.jobs.try_send(job).is_ok()
    }

    /// The next answer, if one came.
    pub(super) fn answer(&self) -> Option<Done> {
        self.done.try_recv().ok()
    }
}

struct Work {
    versions: Versions,
    partial: Option<(String, Partial)>,
}

impl Work {
    fn job(&mut self, job: Job) -> Done {
        match job {
            Job::Confirm { version } => {
                let result = self.confirm(&version);
                Done::Confirmed { version, result }
            }
            Job::Withdraw { version } => {
                let result = self.withdraw(&version);
                Done::Withdrawn { version, result }
            }
            Job::Begin { signed, manifest } => {
                let version = manifest.version.clone();
                // A version installed and waiting to run is not replaced
                // by a download begun after it.
                if let Ok(Some(s)) = self.versions.read_state()
                    && let Some(t) = s.trial.filter(|t| !t.started && t.version != version)
                {
                    return Done::Failed {
                        version,
                        why: format!(
                            "version {} is installed and waits to run; offer again after it runs",
                            t.version
                        ),
                    };
                }
                self.partial = None;
                // One download at a time on the disk: any other part (an
                // earlier offer's) goes; what the state names stays.
                self.prune(Some(&version));
                match self.versions.begin(&signed, &manifest) {
                    Ok(p) => self.progress(version, p),
                    Err(e) => Done::Failed {
                        version,
                        why: e.to_string(),
                    },
                }
            }
            Job::Piece {
                version,
                offset,
                data,
            } => match self.partial.take() {
                Some((v, mut p)) if v == version => match p.append(offset, &data) {
                    Ok(()) => self.progress(version, p),
                    Err(UpdateError::Download(e)) => {
                        // A gap or an overrun: nothing written, the
                        // download goes on from what is held.
                        let held = p.offset();
                        self.partial = Some((v, p));
                        tracing::debug!("agent update: piece at {offset} not taken: {e}");
                        Done::Held { version, held }
                    }
                    // The disk: said; the next offer resumes.
                    Err(e) => Done::Failed {
                        version,
                        why: e.to_string(),
                    },
                },
                other => {
                    self.partial = other;
                    Done::Failed {
                        version,
                        why: "a piece of a release not being downloaded".into(),
                    }
                }
            },
        }
    }

    /// What `p` holds: complete, it is installed and put on trial.
    fn progress(&mut self, version: String, p: Partial) -> Done {
        if !p.is_complete() {
            let held = p.offset();
            self.partial = Some((version.clone(), p));
            return Done::Held { version, held };
        }
        match self.install(&version, p) {
            Ok(()) => Done::Installed { version },
            Err(why) => Done::Failed { version, why },
        }
    }

    /// The trial of `version`, not yet started, undone (the launcher runs
    /// what it ran before) and its files removed; `Ok(false)` when the
    /// state names no such trial (nothing written).
    fn withdraw(&mut self, version: &str) -> Result<bool, String> {
        let state = self.versions.read_state().map_err(|e| e.to_string())?;
        let Some(next) = boot::unstage(state.as_ref(), version) else {
            return Ok(false);
        };
        self.versions
            .write_state(&next)
            .map_err(|e| e.to_string())?;
        if self.partial.as_ref().is_some_and(|(v, _)| v == version) {
            self.partial = None;
        }
        // Another version's download in progress stays.
        let downloading = self.partial.as_ref().map(|(v, _)| v.clone());
        self.prune(downloading.as_deref());
        Ok(true)
    }

    /// The trial of `version` settled, and what no longer needs keeping
    /// removed (never a download in progress).
    fn confirm(&self, version: &str) -> Result<(), String> {
        let state = self.versions.read_state().map_err(|e| e.to_string())?;
        match boot::confirm(state.as_ref(), version) {
            Some(next) => self
                .versions
                .write_state(&next)
                .map_err(|e| e.to_string())?,
            None if state.as_ref().and_then(|s| s.settled.as_deref()) == Some(version) => {}
            None => {
                return Err(format!(
                    "the launcher's state does not name version {version} on trial any more"
                ));
            }
        }
        let downloading = self.partial.as_ref().map(|(v, _)| v.as_str());
        self.prune(downloading);
        Ok(())
    }

    /// Removes the versions the state does not name, but `also`.
    fn prune(&self, also: Option<&str>) {
        let state = match self.versions.read_state() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("agent update: not removing old versions: {e}");
                return;
            }
        };
        let mut keep = boot::kept(state.as_ref());
        keep.extend(also.map(str::to_string));
        if let Err(e) = self.versions.prune(&keep) {
            tracing::warn!("agent update: removing versions no longer kept: {e}");
        }
    }

    fn install(&self, version: &str, p: Partial) -> Result<(), String> {
        self.versions.install(p).map_err(|e| e.to_string())?;
        // A build that reports another version than its manifest names
        // would never confirm itself (nor be told apart on the link).
        let reported = self
            .versions
            .reported_version(version)
            .map_err(|e| e.to_string())?;
        if reported.as_deref() != Some(version) {
            // Not in the state: removed with what it no longer names.
            self.prune(None);
            return Err(format!(
                "the build reports {}, its signed manifest names {version}: not installed",
                reported.map_or_else(|| "no version".to_string(), |v| format!("version {v}"))
            ));
        }
        let state = self.versions.read_state().map_err(|e| e.to_string())?;
        let next = boot::stage(state.as_ref(), crate::version::version(), version);
        self.versions
            .write_state(&next)
            .map_err(|e| e.to_string())?;
        // Only what the state names stays: the settled version (what a
        // rollback runs) and this one.
        self.prune(None);
        Ok(())
    }
}
