//! Admission: whether a pack may run on this agent, and what it holds.
//!
//! The agent's last line of defence (docs/design.md principle 2). A pack is
//! checked in full before anything of it takes effect:
//! 1. versions only go up; the same version must be the same text;
//! 2. every program is on the exec allowlist, with only the environment
//!    keys the allowlist grants it;
//! 3. every line it touches is requested from the backend (the backend
//!    enforces the line allowlist, and resolves names and offsets to one
//!    handle per physical line);
//! 4. no line it drives is driven by another pack, unless both declare it
//!    in `shared_lines`.
//!
//! Only then is it committed here (lines owned, safe state known). A refused
//! pack leaves no trace but lines the backend opened for it (opening never
//! moves a line; they are kept for a later pack).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};

use baton_proto::pack::{Action, LineRef, Pack};
use baton_sched::PackKey;

use crate::dispatcher::{DispatchError, Op};
use crate::runtime::ports::Device;
use baton_gpio::{Direction, LineHandle};

/// Why a pack was refused.
#[derive(Debug, thiserror::Error)]
pub enum AdmissionError {
    /// A lower version than the one held.
    #[error(
        "version {offered} is older than version {held} held by this agent (versions only go up; push version {} or higher to roll back)",
        held + 1
    )]
    Older {
        /// Offered.
        offered: u64,
        /// Held.
        held: u64,
    },
    /// The same version with other content.
    #[error(
        "version {version} is already held with different content: a changed pack needs a higher version"
    )]
    Conflict {
        /// The version.
        version: u64,
    },
    /// A program or its environment is not allowed.
    #[error("{place}: {reason}")]
    Exec {
        /// Instruction or safe_state.
        place: String,
        /// Why.
        reason: String,
    },
    /// A line could not be requested.
    #[error("{place}: {source}")]
    Line {
        /// Instruction or safe_state.
        place: String,
        /// Why.
        #[source]
        source: DispatchError,
    },
    /// A line is driven by another pack.
    #[error(
        "line {line} is driven by pack {other} too; a line is driven by one pack at a time unless both packs list it in `shared_lines`"
    )]
    LineTaken {
        /// The line, as this pack names it.
        line: String,
        /// The pack that holds it.
        other: PackKey,
    },
    /// A line another pack let go of (a newer version dropped it, or the
    /// pack was cancelled) while firings it had armed on the line have not
    /// all run or been withdrawn yet: free in a moment.
    #[error(
        "line {line} is still in use by pack {other}: firings it armed on the line have not all run or been withdrawn yet (free in a moment: retry)"
    )]
    LineReleasing {
        /// The line, as this pack names it.
        line: String,
        /// The pack that let go of it.
        other: PackKey,
    },
}

impl AdmissionError {
    /// Whether the same pack may be taken a moment later (the controller
    /// retries it: `RESOURCE_EXHAUSTED`).
    pub fn is_transient(&self) -> bool {
        matches!(self, AdmissionError::LineReleasing { .. })
    }
}

/// Whether a program may run with an environment (the exec allowlist).
pub type ExecCheck<'a> =
    dyn Fn(&str, &[String], &BTreeMap<String, String>) -> Result<(), String> + 'a;

/// What the version check decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Not held yet.
    New,
    /// A higher version replaces the held one.
    Replace {
        /// The held version.
        from: u64,
    },
    /// The same version and text: nothing to do.
    Unchanged,
}

/// A digest of a pack's text, to tell a re-push from an edit.
pub fn digest(yaml: &str) -> u64 {
    let mut h = DefaultHasher::new();
    yaml.hash(&mut h);
    h.finish()
}

/// Whether `action` drives its line (as opposed to reading it).
fn drives(action: &Action) -> bool {
    matches!(
        action,
        Action::GpioWrite { .. } | Action::GpioToggle { .. } | Action::GpioPulse { .. }
    )
}

/// A line as a pack names it (`gpiochip0:17`, `RELAY_MAIN`).
fn line_name(l: &LineRef) -> String {
    match &l.chip {
        Some(c) => format!("{c}:{}", l.line),
        None => l.line.to_string(),
    }
}

/// Where an action sits in its pack, for messages.
fn place(ins: Option<&baton_proto::pack::Instruction>) -> String {
    match ins {
        Some(i) => format!("instruction `{}`", i.id),
        None => "safe_state".to_string(),
    }
}

/// The lines a pack touches, resolved.
#[derive(Debug, Default)]
pub struct Resolved {
    handles: Vec<(LineRef, LineHandle)>,
    driven: BTreeMap<LineHandle, String>,
    shared: BTreeSet<LineHandle>,
}

#[derive(Debug)]
struct Held {
    version: u64,
    digest: u64,
    driven: Vec<LineHandle>,
    shared: BTreeSet<LineHandle>,
}

/// The packs this agent holds, and the lines they own.
#[derive(Debug, Default)]
pub struct Admission {
    /// Lines requested as outputs (a read of them reads the driven level).
    handles: HashMap<LineRef, LineHandle>,
    /// Lines requested as inputs only.
    inputs: HashMap<LineRef, LineHandle>,
    held: HashMap<PackKey, Held>,
    /// Lines a pack no longer drives (a newer version dropped them, or it
    /// was cancelled) that firings it armed may still touch: no other pack
    /// takes them until [`Admission::settle_lingering`] finds them free.
    lingering: HashMap<PackKey, BTreeSet<LineHandle>>,
}

impl Admission {
    /// Step 1: versions only go up; a re-push must be the same text.
    pub fn check_version(
        &self,
        key: &PackKey,
        version: u64,
        digest: u64,
    ) -> Result<Verdict, AdmissionError> {
        let Some(h) = self.held.get(key) else {
            return Ok(Verdict::New);
        };
        if version < h.version {
            return Err(AdmissionError::Older {
                offered: version,
                held: h.version,
            });
        }
        if version == h.version {
            return if digest == h.digest {
                Ok(Verdict::Unchanged)
            } else {
                Err(AdmissionError::Conflict { version })
            };
        }
        Ok(Verdict::Replace { from: h.version })
    }

    /// Step 2: every program (and its environment) passes `allowed`.
    pub fn check_exec(pack: &Pack, allowed: &ExecCheck<'_>) -> Result<(), AdmissionError> {
        for (ins, action) in pack.all_actions() {
            if let Action::Exec { program, args, env } = action {
                allowed(program, args, env).map_err(|reason| AdmissionError::Exec {
                    place: place(ins),
                    reason,
                })?;
            }
        }
        Ok(())
    }

    /// Step 3: request every line the pack touches.
    pub fn resolve(
        &mut self,
        pack: &Pack,
        shared_lines: &[LineRef],
        device: &mut dyn Device,
    ) -> Result<Resolved, AdmissionError> {
        let mut r = Resolved::default();
        for (ins, action) in pack.all_actions() {
            let Some(line) = action.line() else { continue };
            let dir = if drives(action) {
                Direction::Output
            } else {
                Direction::Input
            };
            let known = match dir {
                Direction::Output => self.handles.get(line),
                Direction::Input => self.handles.get(line).or(self.inputs.get(line)),
            };
            let h = match known {
                Some(h) => *h,
                None => {
                    let hs = device
                        .request_lines(&[(line.clone(), dir)])
                        .map_err(|source| AdmissionError::Line {
                            place: place(ins),
                            source,
                        })?;
                    let Some(&h) = hs.first() else { continue };
                    match dir {
                        Direction::Output => self.handles.insert(line.clone(), h),
                        Direction::Input => self.inputs.insert(line.clone(), h),
                    };
                    h
                }
            };
            r.handles.push((line.clone(), h));
            if drives(action) {
                r.driven.entry(h).or_insert_with(|| line_name(line));
            }
        }
        for line in shared_lines {
            // The backend gives one handle per physical line, however the
            // entry spells it (validation made sure the pack drives it).
            let h = match self.handles.get(line) {
                Some(h) => *h,
                None => {
                    let hs = device
                        .request_lines(&[(line.clone(), Direction::Output)])
                        .map_err(|source| AdmissionError::Line {
                            place: "shared_lines".into(),
                            source,
                        })?;
                    let Some(&h) = hs.first() else { continue };
                    h
                }
            };
            r.shared.insert(h);
        }
        Ok(r)
    }

    /// Step 4: no line is driven by two packs unless both share it.
    pub fn check_owners(&self, key: &PackKey, r: &Resolved) -> Result<(), AdmissionError> {
        for (h, name) in &r.driven {
            for (other, lines) in &self.lingering {
                if other != key && lines.contains(h) {
                    return Err(AdmissionError::LineReleasing {
                        line: name.clone(),
                        other: other.clone(),
                    });
                }
            }
            for (other, held) in &self.held {
                if other == key || !held.driven.contains(h) {
                    continue;
                }
                if !(r.shared.contains(h) && held.shared.contains(h)) {
                    return Err(AdmissionError::LineTaken {
                        line: name.clone(),
                        other: other.clone(),
                    });
                }
            }
        }
        Ok(())
    }

    /// The pack is accepted: it owns its lines now. Lines its previous
    /// version drove and this one does not linger (see
    /// [`Admission::settle_lingering`]).
    pub fn commit(&mut self, key: PackKey, version: u64, digest: u64, r: Resolved) {
        let driven: Vec<LineHandle> = r.driven.into_keys().collect();
        if let Some(old) = self.held.get(&key) {
            let dropped: Vec<LineHandle> = old
                .driven
                .iter()
                .filter(|h| !driven.contains(h))
                .copied()
                .collect();
            if !dropped.is_empty() {
                self.lingering
                    .entry(key.clone())
                    .or_default()
                    .extend(dropped);
            }
        }
        if let Some(l) = self.lingering.get_mut(&key) {
            l.retain(|h| !driven.contains(h));
            if l.is_empty() {
                self.lingering.remove(&key);
            }
        }
        self.held.insert(
            key,
            Held {
                version,
                digest,
                driven,
                shared: r.shared,
            },
        );
    }

    /// The pack is gone (cancelled locally): its lines are free once no
    /// firing it armed may touch them ([`Admission::settle_lingering`]).
    pub fn release(&mut self, key: &PackKey) {
        if let Some(h) = self.held.remove(key)
            && !h.driven.is_empty()
        {
            self.lingering
                .entry(key.clone())
                .or_default()
                .extend(h.driven);
        }
    }

    /// Whether some pack's lines linger.
    pub fn has_lingering(&self) -> bool {
        !self.lingering.is_empty()
    }

    /// Free the lingering lines no firing may touch any more (`busy`: the
    /// lines a pack's armed firings, pulse ends and safe writes may still
    /// drive).
    pub fn settle_lingering(&mut self, busy: impl Fn(&PackKey) -> Vec<LineHandle>) {
        self.lingering.retain(|pack, lines| {
            let b = busy(pack);
            lines.retain(|h| b.contains(h));
            !lines.is_empty()
        });
    }

    /// Other packs that share `line` with `key`.
    pub fn sharers(&self, key: &PackKey, line: LineHandle) -> Vec<PackKey> {
        self.held
            .iter()
            .filter(|(k, h)| *k != key && h.shared.contains(&line))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// The lines `key` declared shared.
    pub fn shared_of(&self, key: &PackKey) -> Vec<LineHandle> {
        self.held
            .get(key)
            .map(|h| h.shared.iter().copied().collect())
            .unwrap_or_default()
    }

    /// The handle of a line requested before.
    pub fn handle(&self, line: &LineRef) -> Option<LineHandle> {
        self.handles.get(line).copied()
    }

    /// The dispatcher op for a GPIO action (None: not GPIO, or its line
    /// was never requested).
    pub fn op_for(&self, action: &Action) -> Option<Op> {
        let h = |l: &LineRef| self.handles.get(l).copied();
        Some(match action {
            Action::GpioWrite { line, value } => Op::Write(h(line)?, *value),
            Action::GpioToggle { line } => Op::Toggle(h(line)?),
            Action::GpioRead { line } => Op::Read(self.read_handle(line)?),
            Action::GpioPulse { line, width, value } => Op::Pulse {
                line: h(line)?,
                value: *value,
                width_ns: i64::try_from(width.as_nanos()).unwrap_or(i64::MAX),
            },
            Action::Exec { .. } | Action::Noop => return None,
        })
    }

    fn read_handle(&self, line: &LineRef) -> Option<LineHandle> {
        self.handles
            .get(line)
            .or_else(|| self.inputs.get(line))
            .copied()
    }

    /// The levels a list of safe-state actions writes (for the panic hook).
    pub fn safe_writes(&self, actions: &[Action]) -> Vec<(LineHandle, u8)> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::GpioWrite { line, value } => {
                    Some((self.handles.get(line).copied()?, *value))
                }
                _ => None,
            })
            .collect()
    }
}

/// Lines a pack declares shared with other packs (`shared_lines`).
pub(super) fn shared_lines(pack: &Pack) -> &[LineRef] {
    &pack.shared_lines
}

/// Whether the exec allowlist lets `program` run with `args` and `env`.
pub(super) fn exec_check(
    exec: &crate::exec::ExecPool,
    program: &str,
    args: &[String],
    env: &std::collections::BTreeMap<String, String>,
) -> Result<(), String> {
    exec.policy()
        .check(program, args, env)
        .map_err(|e| e.to_string())
}
