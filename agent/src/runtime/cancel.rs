//! `baton-agent cancel PACK --data DIR`: remove a pack from an agent
//! locally, after its safe state, whether the agent runs or not.
//!
//! - **No agent running** (the journal's lock is free): the pack's
//!   `gpio.write` safe-state actions are driven through the configured
//!   backend, then the pack is removed from the journal (durably).
//! - **An agent running** (it holds the lock): a request file is dropped in
//!   `DIR/cancel/`; the agent picks it up within a heartbeat, cancels the
//!   pack through its core (safe state first, like any cancel), removes it
//!   from its journal, and answers in a `.done` file the command waits for.
//!
//! A file, not a socket: the agent has no local control socket to secure,
//! and the data directory's permissions already say who may touch the
//! agent's state.

use std::path::{Path, PathBuf};
use std::time::Duration;

use baton_proto::pack::{Action, is_ident, parse_pack};
use baton_sched::PackKey;

use super::error::{Chain, RuntimeError};
use crate::config::AgentConfig;
use baton_gpio::{GpioError, open_backend};
use baton_journal::{Journal, JournalConfig, JournalError};

/// Why `baton-agent cancel` did not cancel: each variant names what it
/// tried, so the command's message says where it stopped.
#[derive(Debug, thiserror::Error)]
pub enum CancelError {
    /// A tenant or pack id that cannot name a request file.
    #[error("{what} id {id:?} is not valid: ids are [a-z0-9][a-z0-9._-]*")]
    InvalidId {
        /// `tenant` or `pack`.
        what: &'static str,
        /// The id given.
        id: String,
    },
    /// The journal in the data directory could not be opened.
    #[error("opening the journal in {}", .dir.display())]
    OpenJournal {
        /// The data directory.
        dir: PathBuf,
        /// Why.
        #[source]
        source: JournalError,
    },
    /// No agent runs, and its journal does not hold the pack.
    #[error("pack {key} is not held by the agent in {}", .dir.display())]
    NotHeld {
        /// The pack.
        key: PackKey,
        /// The data directory.
        dir: PathBuf,
    },
    /// The GPIO backend could not be opened.
    #[error("opening the GPIO backend `{backend}`")]
    OpenGpio {
        /// The backend, as configured.
        backend: String,
        /// Why.
        #[source]
        source: GpioError,
    },
    /// A safe-state write failed: the pack stays in the journal.
    #[error("safe state of {key}")]
    SafeState {
        /// The pack.
        key: PackKey,
        /// Why.
        #[source]
        source: GpioError,
    },
    /// The pack could not be removed from the journal.
    #[error("removing {key} from the journal")]
    Remove {
        /// The pack.
        key: PackKey,
        /// Why.
        #[source]
        source: JournalError,
    },
    /// The request could not be dropped in the data directory (`doing`:
    /// creating the directory or writing the file).
    #[error("{doing} {}", .path.display())]
    Request {
        /// `creating` or `writing`.
        doing: &'static str,
        /// The directory or file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The running agent refused (its own words).
    #[error("{0}")]
    Refused(String),
    /// The running agent's answer could not be read.
    #[error("unreadable answer: {0}")]
    Unreadable(String),
    /// The running agent did not answer in time; the request is withdrawn.
    #[error("the running agent did not answer within {0:?} (request withdrawn)")]
    NoAnswer(Duration),
}

/// Where requests and answers live.
pub fn request_dir(data: &Path) -> PathBuf {
    data.join("cancel")
}

/// The request file's name for a pack (tenant and pack ids are
/// `[a-z0-9][a-z0-9._-]*`: safe in a file name).
fn file_name(key: &PackKey) -> String {
    format!("{}__{}", key.tenant, key.pack)
}

/// Parse a request file's name back into a pack key.
pub fn parse_request(name: &str) -> Option<PackKey> {
    let stem = name.strip_suffix(".req")?;
    let (tenant, pack) = stem.split_once("__")?;
    (is_ident(tenant) && is_ident(pack)).then(|| PackKey {
        tenant: tenant.to_string(),
        pack: pack.to_string(),
    })
}

/// Write the answer to a request (from the running agent).
pub fn answer(data: &Path, key: &PackKey, result: &Result<String, String>) {
    let dir = request_dir(data);
    let text = match result {
        Ok(m) => format!("ok {m}\n"),
        Err(e) => format!("error {e}\n"),
    };
    let tmp = dir.join(format!("{}.tmp", file_name(key)));
    let done = dir.join(format!("{}.done", file_name(key)));
    if std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, &done))
        .is_err()
    {
        tracing::error!(pack = %key, "could not answer the cancel request in {}", dir.display());
    }
    let _ = std::fs::remove_file(dir.join(format!("{}.req", file_name(key))));
}

/// Cancel `key` on the agent whose data directory `cfg.data_dir` is.
/// Returns what was done, in words.
pub fn cancel(cfg: &AgentConfig, key: &PackKey, wait: Duration) -> Result<String, CancelError> {
    // The ids name a request file: the pack language's rule keeps them one
    // plain file name (no `/`, no `..`).
    for (what, id) in [("tenant", &key.tenant), ("pack", &key.pack)] {
        if !is_ident(id) {
            return Err(CancelError::InvalidId {
                what,
                id: id.clone(),
            });
        }
    }
    let mut jcfg = JournalConfig::new(&cfg.data_dir);
    jcfg.outbox_cap = cfg.outbox_cap;
    match Journal::open(jcfg) {
        Ok((journal, rec)) => offline(cfg, journal, rec, key),
        Err(JournalError::Locked { .. }) => online(&cfg.data_dir, key, wait),
        Err(source) => Err(CancelError::OpenJournal {
            dir: cfg.data_dir.clone(),
            source,
        }),
    }
}

fn offline(
    cfg: &AgentConfig,
    mut journal: Journal,
    rec: baton_journal::Recovered,
    key: &PackKey,
) -> Result<String, CancelError> {
    let Some(sp) = rec
        .packs
        .iter()
        .find(|p| p.tenant == key.tenant && p.pack == key.pack)
    else {
        return Err(CancelError::NotHeld {
            key: key.clone(),
            dir: cfg.data_dir.clone(),
        });
    };
    let mut driven = 0;
    if let Ok(pack) = parse_pack(&sp.yaml) {
        let mut gpio = open_backend(&cfg.gpio, cfg.allowed_lines.clone()).map_err(|source| {
            CancelError::OpenGpio {
                backend: cfg.gpio.to_string(),
                source,
            }
        })?;
        let now = baton_clock::clock_ns(nix::time::ClockId::CLOCK_REALTIME);
        for a in &pack.safe_state {
            match a {
                Action::GpioWrite { line, value } => {
                    let safe_state = |source| CancelError::SafeState {
                        key: key.clone(),
                        source,
                    };
                    let h = gpio.request(line).map_err(safe_state)?;
                    gpio.write(h, *value, now, &format!("{key} safe_state (cancel)@{now}"))
                        .map_err(safe_state)?;
                    driven += 1;
                }
                Action::Noop => {}
                other => tracing::warn!(
                    pack = %key,
                    "safe state: {} is not run by an offline cancel (only gpio.write)",
                    other.name()
                ),
            }
        }
    }
    journal
        .remove_pack(&key.tenant, &key.pack)
        .map_err(|source| CancelError::Remove {
            key: key.clone(),
            source,
        })?;
    Ok(format!(
        "pack {key} v{} removed (agent not running; {driven} safe-state write(s) driven)",
        sp.version
    ))
}

fn online(data: &Path, key: &PackKey, wait: Duration) -> Result<String, CancelError> {
    let dir = request_dir(data);
    std::fs::create_dir_all(&dir).map_err(|source| CancelError::Request {
        doing: "creating",
        path: dir.clone(),
        source,
    })?;
    let done = dir.join(format!("{}.done", file_name(key)));
    let _ = std::fs::remove_file(&done);
    let tmp = dir.join(format!("{}.req.tmp", file_name(key)));
    let req = dir.join(format!("{}.req", file_name(key)));
    std::fs::write(&tmp, b"cancel\n")
        .and_then(|()| std::fs::rename(&tmp, &req))
        .map_err(|source| CancelError::Request {
            doing: "writing",
            path: req.clone(),
            source,
        })?;
    let end = std::time::Instant::now() + wait;
    loop {
        if let Ok(text) = std::fs::read_to_string(&done) {
            let _ = std::fs::remove_file(&done);
            return match text.trim_end().split_once(' ') {
                Some(("ok", m)) => Ok(m.to_string()),
                Some((_, e)) => Err(CancelError::Refused(e.to_string())),
                None => Err(CancelError::Unreadable(text)),
            };
        }
        if std::time::Instant::now() > end {
            let _ = std::fs::remove_file(&req);
            return Err(CancelError::NoAnswer(wait));
        }
        // A command-line wait for a file another process writes; no event
        // to wait on short of inotify, and a few ms do not matter here.
        std::thread::sleep(Duration::from_millis(10));
    }
}

use super::agent::Agent;

impl Agent {
    /// `baton-agent cancel` requests dropped in the data directory.
    pub(super) fn serve_cancel_requests(&mut self) -> Result<(), RuntimeError> {
        let dir = request_dir(&self.cfg.data_dir);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Ok(());
        };
        let keys: Vec<PackKey> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| parse_request(&e.file_name().to_string_lossy()))
            .collect();
        for key in keys {
            let r = self.cancel_local(&key);
            let reply = r
                .as_ref()
                .map(String::clone)
                .map_err(|e| Chain(e).to_string());
            answer(&self.cfg.data_dir, &key, &reply);
            // A pack not held is the requester's answer. Anything else
            // (the journal, the dispatcher) failed half-way through a
            // cancel whose safe state may not have been handed over: the
            // loop's fault, so the way out drives every safe state.
            match r {
                Ok(_) | Err(RuntimeError::NotHeld(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Cancel a held pack locally: its safe state first (as any cancel),
    /// then it is removed from the journal and frees its lines.
    pub fn cancel_local(&mut self, key: &PackKey) -> Result<String, RuntimeError> {
        let Some((version, _)) = self.core.held(key) else {
            return Err(RuntimeError::NotHeld(key.clone()));
        };
        let now = self.clock.now();
        let mut out = Vec::new();
        self.core.cancel(key, now).drain_into(&mut out);
        self.process(out)?;
        self.pump()?;
        self.journal.remove_pack(&key.tenant, &key.pack)?;
        self.plane.admission.release(key);
        self.plane.held.remove(key);
        if let Some(t) = self.plane.trust.as_mut() {
            t.dropped(key);
        }
        self.safe.forget(key);
        tracing::info!(pack = %key, version, "cancelled locally and removed");
        Ok(format!(
            "pack {key} v{version} cancelled: safe state driven, removed from the journal"
        ))
    }
}
