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
//!
//! Sans IO: step 3 names the lines the device must open
//! ([`Admission::lines_to_open`]); the agent opens them, tells each handle
//! ([`Admission::opened`]), and only then is the pack resolved against
//! them ([`Admission::resolve`]).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};

use baton_proto::pack::{Action, LineRef, Pack};
use baton_sched::PackKey;

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
    /// A line could not be opened.
    #[error("{place}: {source}")]
    Line {
        /// Instruction or safe_state.
        place: String,
        /// Why (the device's error).
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The pack does not pass the trust list (unsigned where its tenant
    /// requires a signature, a key not the tenant's, other bytes, an
    /// expired list).
    #[error("{0}")]
    Signature(#[from] baton_trust::PackSignatureError),
    /// A signed version below the highest signed version of the pack this
    /// box ever took: the operator signed a newer one, so an older one
    /// offered now (after a cancel, or a restart, when nothing is held to
    /// compare with) is a replay.
    #[error(
        "version {offered} is older than signed version {highest} this agent took before (signed versions only go up, across cancels and restarts; push version {} or higher)",
        highest + 1
    )]
    SignedOlder {
        /// Offered.
        offered: u64,
        /// The highest signed version taken.
        highest: u64,
    },
    /// The highest signed version could not be kept on disk: refused, or
    /// after a restart an older one could no longer be refused.
    #[error("keeping the highest signed version in {path}: {cause}")]
    SignedNotKept {
        /// The file.
        path: String,
        /// Why.
        cause: String,
    },
    /// With a trust list, a pack that names the agents it is for runs only
    /// on those: a signed pack replayed to another box is refused there.
    #[error("the pack is for agents {targets} (its signed `targets`), not this agent ({agent})")]
    NotTargeted {
        /// This agent.
        agent: String,
        /// The agents the pack names.
        targets: String,
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

/// A line the device must open before a pack is resolved
/// ([`Admission::lines_to_open`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineToOpen {
    /// As the pack names it.
    pub line: LineRef,
    /// Driven, or only read.
    pub direction: Direction,
    /// Where the pack names it (`instruction `x``, `safe_state`,
    /// `shared_lines`), for messages.
    pub place: String,
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

    /// Step 3, first half: the lines `pack` touches (and declares
    /// shared) that the device has not opened yet, in the order the pack
    /// names them, each with the direction it needs and where the pack
    /// names it (for messages). The agent opens them in this order, tells
    /// each handle to [`Admission::opened`], and stops at the first that
    /// fails ([`AdmissionError::Line`]).
    pub fn lines_to_open(&self, pack: &Pack) -> Vec<LineToOpen> {
        let mut out: Vec<LineToOpen> = Vec::new();
        let mut outputs: HashSet<&LineRef> = HashSet::new();
        let mut inputs: HashSet<&LineRef> = HashSet::new();
        for (ins, action) in pack.all_actions() {
            let Some(line) = action.line() else { continue };
            let output = self.handles.contains_key(line) || outputs.contains(line);
            let (known, direction) = if drives(action) {
                (output, Direction::Output)
            } else {
                let input = self.inputs.contains_key(line) || inputs.contains(line);
                (output || input, Direction::Input)
            };
            if known {
                continue;
            }
            match direction {
                Direction::Output => outputs.insert(line),
                Direction::Input => inputs.insert(line),
            };
            out.push(LineToOpen {
                line: line.clone(),
                direction,
                place: place(ins),
            });
        }
        for line in &pack.shared_lines {
            // Validation made sure the pack drives it; the backend gives
            // one handle per physical line, however the entry spells it.
            if self.handles.contains_key(line) || !outputs.insert(line) {
                continue;
            }
            out.push(LineToOpen {
                line: line.clone(),
                direction: Direction::Output,
                place: "shared_lines".into(),
            });
        }
        out
    }

    /// The device opened `l` as handle `h`.
    pub fn opened(&mut self, l: &LineToOpen, h: LineHandle) {
        match l.direction {
            Direction::Output => self.handles.insert(l.line.clone(), h),
            Direction::Input => self.inputs.insert(l.line.clone(), h),
        };
    }

    /// Step 3, second half: the lines `pack` touches, resolved against
    /// those opened (a line the device gave no handle for is left out).
    pub fn resolve(&self, pack: &Pack) -> Resolved {
        let mut r = Resolved::default();
        for (_, action) in pack.all_actions() {
            let Some(line) = action.line() else { continue };
            let h = if drives(action) {
                self.handles.get(line)
            } else {
                self.handles.get(line).or_else(|| self.inputs.get(line))
            };
            let Some(&h) = h else { continue };
            r.handles.push((line.clone(), h));
            if drives(action) {
                r.driven.entry(h).or_insert_with(|| line_name(line));
            }
        }
        for line in &pack.shared_lines {
            if let Some(&h) = self.handles.get(line) {
                r.shared.insert(h);
            }
        }
        r
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

    /// The handle a read of `line` uses: the driven line's if it is
    /// driven, else the input's.
    pub fn read_handle(&self, line: &LineRef) -> Option<LineHandle> {
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
