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

use anyhow::Context;
use baton_proto::pack::{Action, is_ident, parse_pack};
use baton_sched::PackKey;

use crate::config::AgentConfig;
use baton_gpio::open_backend;
use baton_journal::{Journal, JournalConfig, JournalError};

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
pub fn cancel(cfg: &AgentConfig, key: &PackKey, wait: Duration) -> anyhow::Result<String> {
    // The ids name a request file: the pack language's rule keeps them one
    // plain file name (no `/`, no `..`).
    for (what, id) in [("tenant", &key.tenant), ("pack", &key.pack)] {
        if !is_ident(id) {
            anyhow::bail!("{what} id {id:?} is not valid: ids are [a-z0-9][a-z0-9._-]*");
        }
    }
    let mut jcfg = JournalConfig::new(&cfg.data_dir);
    jcfg.outbox_cap = cfg.outbox_cap;
    match Journal::open(jcfg) {
        Ok((journal, rec)) => offline(cfg, journal, rec, key),
        Err(JournalError::Locked { .. }) => online(&cfg.data_dir, key, wait),
        Err(e) => {
            Err(e).with_context(|| format!("opening the journal in {}", cfg.data_dir.display()))
        }
    }
}

fn offline(
    cfg: &AgentConfig,
    mut journal: Journal,
    rec: baton_journal::Recovered,
    key: &PackKey,
) -> anyhow::Result<String> {
    let Some(sp) = rec
        .packs
        .iter()
        .find(|p| p.tenant == key.tenant && p.pack == key.pack)
    else {
        anyhow::bail!(
            "pack {key} is not held by the agent in {}",
            cfg.data_dir.display()
        );
    };
    let mut driven = 0;
    if let Ok(pack) = parse_pack(&sp.yaml) {
        let mut gpio = open_backend(&cfg.gpio, cfg.allowed_lines.clone())
            .with_context(|| format!("opening the GPIO backend `{}`", cfg.gpio))?;
        let now = baton_clock::clock_ns(nix::time::ClockId::CLOCK_REALTIME);
        for a in &pack.safe_state {
            match a {
                Action::GpioWrite { line, value } => {
                    let h = gpio
                        .request(line)
                        .with_context(|| format!("safe state of {key}"))?;
                    gpio.write(h, *value, now, &format!("{key} safe_state (cancel)@{now}"))
                        .with_context(|| format!("safe state of {key}"))?;
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
        .with_context(|| format!("removing {key} from the journal"))?;
    Ok(format!(
        "pack {key} v{} removed (agent not running; {driven} safe-state write(s) driven)",
        sp.version
    ))
}

fn online(data: &Path, key: &PackKey, wait: Duration) -> anyhow::Result<String> {
    let dir = request_dir(data);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let done = dir.join(format!("{}.done", file_name(key)));
    let _ = std::fs::remove_file(&done);
    let tmp = dir.join(format!("{}.req.tmp", file_name(key)));
    let req = dir.join(format!("{}.req", file_name(key)));
    std::fs::write(&tmp, b"cancel\n")
        .and_then(|()| std::fs::rename(&tmp, &req))
        .with_context(|| format!("writing {}", req.display()))?;
    let end = std::time::Instant::now() + wait;
    loop {
        if let Ok(text) = std::fs::read_to_string(&done) {
            let _ = std::fs::remove_file(&done);
            return match text.trim_end().split_once(' ') {
                Some(("ok", m)) => Ok(m.to_string()),
                Some((_, e)) => Err(anyhow::anyhow!("{e}")),
                None => Err(anyhow::anyhow!("unreadable answer: {text}")),
            };
        }
        if std::time::Instant::now() > end {
            let _ = std::fs::remove_file(&req);
            anyhow::bail!("the running agent did not answer within {wait:?} (request withdrawn)");
        }
        // A command-line wait for a file another process writes; no event
        // to wait on short of inotify, and a few ms do not matter here.
        std::thread::sleep(Duration::from_millis(10));
    }
}

use super::Agent;

impl Agent {
    /// `baton-agent cancel` requests dropped in the data directory.
    pub(super) fn serve_cancel_requests(&mut self) -> anyhow::Result<()> {
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
            let reply = r.as_ref().map(String::clone).map_err(|e| format!("{e:#}"));
            answer(&self.cfg.data_dir, &key, &reply);
            // A journal failure is the loop's fault; a refusal is the
            // requester's answer.
            if let Err(e) = r
                && e.downcast_ref::<JournalError>().is_some()
            {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Cancel a held pack locally: its safe state first (as any cancel),
    /// then it is removed from the journal and frees its lines.
    pub fn cancel_local(&mut self, key: &PackKey) -> anyhow::Result<String> {
        let Some((version, _)) = self.core.held(key) else {
            anyhow::bail!("pack {key} is not held by this agent");
        };
        let now = self.clock.now();
        let mut out = Vec::new();
        self.core.cancel(key, now).drain_into(&mut out);
        self.process(out)?;
        self.pump()?;
        self.journal.remove_pack(&key.tenant, &key.pack)?;
        self.admission.release(key);
        self.held.remove(key);
        self.held_changed = true;
        self.safe_table
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
        tracing::info!(pack = %key, version, "cancelled locally and removed");
        Ok(format!(
            "pack {key} v{version} cancelled: safe state driven, removed from the journal"
        ))
    }
}
