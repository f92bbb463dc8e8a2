//! Taking packs: configured files, journalled packs restored at a start,
//! pushed packs; each through admission, made durable, then handed to the
//! core. Nothing of a refused pack takes effect.

use std::path::Path;
use std::sync::Arc;

use baton_journal::{Recovered, StopReason, StoredPack};
use baton_proto::RefTime;
use baton_proto::pack::{Pack, parse_pack, read_pack_file};
use baton_sched::{PackKey, SafeReason};

use baton_control::admission::{self, Admission, AdmissionError, LineToOpen, Verdict};

use super::admit::{exec_check, open_and_resolve, open_line};
use super::agent::Agent;
use super::clock_loss;
use super::error::{AcceptError, RuntimeError};
use super::record::Origin;
use baton_control::held::HeldPack;

/// A pack that passed admission, not yet committed.
#[derive(Debug)]
pub(super) struct Admitted {
    verdict: Verdict,
    digest: u64,
    resolved: Option<admission::Resolved>,
    /// What the trust list said of it (a box with a trust root).
    trusted: Option<super::trust::Taken>,
}

impl Agent {
    /// Load the packs the configuration names. On an error the caller must
    /// still take the way out ([`Agent::wind_down`]): restored packs may
    /// already be armed.
    pub fn load_configured(&mut self) -> Result<(), RuntimeError> {
        for path in self.cfg.packs.clone() {
            self.load_file(&path)?;
        }
        // Parsing a large pack builds a YAML tree that is freed right
        // after: give those pages back before memory is locked, so the
        // footprint is what the agent holds.
        if let Err(e) = crate::rt::return_free_heap() {
            tracing::warn!("returning freed memory after loading packs: {e}");
        }
        Ok(())
    }

    pub(super) fn restore(&mut self, rec: Recovered) -> Result<(), RuntimeError> {
        let now = self.clock.now();
        let (alive, forgotten) = (rec.last_alive_ns, rec.forgotten_before_ns);
        for sp in rec.packs {
            let label = format!("journalled pack {}/{} v{}", sp.tenant, sp.pack, sp.version);
            let pack = match parse_pack(&sp.yaml) {
                Ok(p) => p,
                Err(e) => {
                    tracing::error!(pack = %label, "no longer valid, not restored:\n{e}");
                    continue;
                }
            };
            let key = PackKey::of(&pack);
            let anchor = RefTime::from_nanos(sp.accepted_ns);
            let last_alive = alive_until(alive, forgotten, anchor, now);
            match self.admit_checks(&pack, &sp.yaml) {
                Ok(admitted) => self.commit_admission(&pack, admitted),
                Err(e) => {
                    tracing::error!(
                        pack = %label,
                        "refused by this agent's checks now ({e}); kept stopped, its safe state driven where its lines allow"
                    );
                    self.drive_refused_safe_state(&pack, now);
                    continue;
                }
            }
            self.hold(&pack, anchor);
            let mut out = Vec::new();
            let r = match sp.stopped {
                None => self
                    .core
                    .restore(pack, anchor, last_alive, now)
                    .drain_into(&mut out),
                Some(why) => {
                    let reason = match why {
                        StopReason::Cancel => SafeReason::Cancel,
                        StopReason::GiveUp => SafeReason::GiveUp,
                        StopReason::LeaseLost => SafeReason::LeaseLost,
                        StopReason::ClockLost => SafeReason::ClockLost,
                    };
                    self.core
                        .restore_stopped(pack, anchor, reason, now)
                        .drain_into(&mut out)
                }
            };
            if let Err(e) = r {
                tracing::error!(pack = %label, "not restored: {e}");
                continue;
            }
            match &sp.stopped {
                None => tracing::info!(pack = %key, version = sp.version, "restored"),
                Some(why) => tracing::info!(
                    pack = %key,
                    version = sp.version,
                    "restored in its safe state (stopped by {} before the restart; push a higher version to run it again)",
                    why.as_str()
                ),
            }
            self.process(out)?;
        }
        Ok(())
    }

    /// A journalled pack this agent now refuses: drive the `gpio.write`s
    /// of its safe state whose lines can still be opened (admission learns
    /// each handle, or the write would have no line to name and be
    /// dropped: a relay the pack left energised would stay so).
    fn drive_refused_safe_state(&mut self, pack: &Pack, now: RefTime) {
        let key = PackKey::of(pack);
        for a in &pack.safe_state {
            let Some(line) = a.line() else { continue };
            let to_open = LineToOpen {
                line: line.clone(),
                direction: baton_gpio::Direction::Output,
                place: "safe_state".into(),
            };
            let ok = self.plane.admission.handle(line).is_some()
                || match open_line(
                    &mut self.plane.admission,
                    &to_open,
                    self.ports.device.as_mut(),
                ) {
                    Ok(()) => self.plane.admission.handle(line).is_some(),
                    Err(e) => {
                        tracing::error!(pack = %key, "safe state of a refused pack: {e}");
                        false
                    }
                };
            if ok
                && let Err(e) =
                    self.side_action(&key, Origin::SafeState(SafeReason::GiveUp), a, now)
            {
                tracing::error!(pack = %key, "safe state of a refused pack: {e}");
            }
        }
    }

    /// Read, check and accept a pack file. A refusal names the file, the
    /// pack and the reason; nothing of a refused pack takes effect.
    pub fn load_file(&mut self, path: &Path) -> Result<(), RuntimeError> {
        let name = path.display().to_string();
        let (yaml, pack) = read_pack_file(path).map_err(RuntimeError::PackFile)?;
        let key = PackKey::of(&pack);
        match self.accept(yaml.clone(), pack) {
            Ok(Verdict::Unchanged) => {
                tracing::info!(pack = %key, file = %name, "already held with the same content: unchanged");
                Ok(())
            }
            Ok(_) => Ok(()),
            // A box that just booted has not locked its clock yet: the pack
            // waits for it (an exit would restart the agent before its
            // sources could ever lock).
            Err(e @ AcceptError::Clock { .. }) => {
                tracing::warn!(pack = %key, file = %name, "waiting for the clock: {e}");
                self.plane.clock_watch.wait(name, yaml);
                Ok(())
            }
            Err(error) => Err(RuntimeError::PackRefused {
                file: name,
                key,
                error: Box::new(error),
            }),
        }
    }

    /// Check and accept a pack (journalled before it takes effect). An
    /// error says who must act ([`AcceptError`]); one that
    /// [`AcceptError::is_fault`] must end the loop like any journal error.
    pub fn accept(&mut self, yaml: String, pack: Pack) -> Result<Verdict, AcceptError> {
        self.accept_as_of(yaml, pack, None)
    }

    /// [`Agent::accept`], as of the instant `at` when given: the switch of
    /// a staged version (`activate: together`), its schedule anchored at
    /// `at` ([`baton_sched::Scheduler::accept_at`]) so every agent switching at `at`
    /// fires it at the same instants.
    pub fn accept_as_of(
        &mut self,
        yaml: String,
        pack: Pack,
        at: Option<RefTime>,
    ) -> Result<Verdict, AcceptError> {
        // docs/design.md principle 3: no pack is taken while the agent does not
        // know reference time well enough to honour it.
        // Packs of plain intervals run on any clock.
        let uncertainty = self.clock.uncertainty_ns();
        let limit = self.clock_limit_ns();
        if pack.needs_absolute_time() && uncertainty > limit {
            return Err(AcceptError::Clock {
                uncertainty_ns: uncertainty,
                limit_ns: limit,
                clock: clock_loss::describe(self.clock.status()),
            });
        }
        let now = self.clock.now();
        // A cron of past years only, say: it could never fire again.
        pack.check_live(now).map_err(AcceptError::NotLive)?;
        let admitted = self.admit_checks(&pack, &yaml)?;
        let verdict = admitted.verdict;
        if verdict == Verdict::Unchanged {
            return Ok(verdict);
        }
        let key = PackKey::of(&pack);
        let anchor = at.unwrap_or_else(|| self.plane.held.get(&key).map_or(now, |h| h.anchor));
        // Durable before it takes effect: a crash right after acceptance
        // must not lose the pack. The anchor is the first acceptance, so a
        // restart keeps the phase exactly as a live replacement does.
        self.journal.put_pack(&StoredPack {
            tenant: key.tenant.clone(),
            pack: key.pack.clone(),
            version: pack.version,
            yaml,
            accepted_ns: anchor.as_nanos(),
            stopped: None,
        })?;
        let version = pack.version;
        self.commit_admission(&pack, admitted);
        self.hold(&pack, anchor);
        let mut out = Vec::new();
        match at {
            Some(at) => self.core.accept_at(pack, at, now).drain_into(&mut out)?,
            None => self.core.accept(pack, now).drain_into(&mut out)?,
        };
        // Accepted to run now over a version fenced for a staged switch:
        // the core keeps the fence for it, unless the staged version is
        // no newer (it can never switch in: its instant is refused as
        // older and said so), when this one must not wait for it.
        let staged = self
            .plane
            .uplink
            .as_ref()
            .and_then(|u| u.staged_version(&key));
        if at.is_none() && staged.is_some_and(|s| s <= version) {
            self.core.switch_fence(&key, None);
        }
        self.safe.owed_again(&key);
        tracing::info!(pack = %key, version, "accepted");
        self.process(out)
            .map_err(|e| AcceptError::Fault(Box::new(e)))?;
        Ok(verdict)
    }

    /// Steps 1-4 of admission. Nothing is committed: the caller commits
    /// (the pack then owns its lines) once the pack is journalled, so a
    /// refusal or a failed journal write leaves no trace.
    pub(super) fn admit_checks(
        &mut self,
        pack: &Pack,
        yaml: &str,
    ) -> Result<Admitted, AdmissionError> {
        let key = PackKey::of(pack);
        let digest = admission::digest(yaml);
        let verdict = self
            .plane
            .admission
            .check_version(&key, pack.version, digest)?;
        if verdict == Verdict::Unchanged {
            return Ok(Admitted {
                verdict,
                digest,
                resolved: None,
                trusted: None,
            });
        }
        let mut signed = false;
        let mut trusted = None;
        if let Some(trust) = &self.plane.trust {
            let verdict = trust.check_pack(&pack.tenant, yaml, self.clock.now().as_nanos())?;
            tracing::debug!(pack = %key, ?verdict, "trust list passed");
            trusted = Some(super::trust::Taken::of(verdict, yaml));
            if matches!(verdict, baton_trust::PackVerdict::Signed(_)) {
                trust.check_signed_version(&key, pack.version)?;
                signed = true;
            }
            // Agent ids in `targets` are inside what was signed: a pack
            // replayed to a box it does not name is refused there. (Label
            // targets are not checked here: operators' labels on the
            // controller may differ from the box's own.)
            if let Some(baton_proto::pack::Targets::Agents(ids)) = &pack.targets
                && !ids.iter().any(|a| a == &self.cfg.id)
            {
                return Err(AdmissionError::NotTargeted {
                    agent: self.cfg.id.clone(),
                    targets: ids.join(", "),
                });
            }
        }
        let exec = &self.ports.exec;
        Admission::check_exec(pack, &|program, args, env| {
            exec_check(exec, program, args, env)
        })?;
        let resolved =
            open_and_resolve(&mut self.plane.admission, pack, self.ports.device.as_mut())?;
        self.plane.admission.check_owners(&key, &resolved)?;
        if signed && let Some(trust) = self.plane.trust.as_mut() {
            trust.keep_signed_version(&key, pack.version)?;
        }
        Ok(Admitted {
            verdict,
            digest,
            resolved: Some(resolved),
            trusted,
        })
    }

    /// The pack is journalled: it owns its lines now.
    fn commit_admission(&mut self, pack: &Pack, admitted: Admitted) {
        let key = PackKey::of(pack);
        if let (Some(trust), Some(verdict)) = (self.plane.trust.as_mut(), admitted.trusted) {
            trust.taken(&key, &pack.tenant, verdict);
        }
        if let Some(resolved) = admitted.resolved {
            self.plane
                .admission
                .commit(key, pack.version, admitted.digest, resolved);
        }
    }

    /// Remember what the way out needs of a held pack.
    fn hold(&mut self, pack: &Pack, anchor: RefTime) {
        let key = PackKey::of(pack);
        let writes = self.plane.admission.safe_writes(&pack.safe_state);
        self.safe.hold(key.clone(), writes);
        self.plane.held.insert(
            key,
            HeldPack {
                safe_state: Arc::new(pack.safe_state.clone()),
                anchor,
                lease: pack.lease,
                clock_loss: pack.needs_absolute_time().then_some(pack.on_clock_loss),
                since: self.clock.to_mono(self.clock.now()),
                chained: pack
                    .instructions
                    .iter()
                    .any(|i| matches!(i.schedule, baton_proto::pack::Schedule::After { .. })),
            },
        );
    }
}

/// Until when the previous runs surely handled the due occurrences of a
/// pack accepted at `anchor`: the core settles a one-shot due by then that
/// has no journal record as handled. The last heartbeat (`alive_ns`) says
/// so: it follows a pass that armed everything due by then. Without one
/// (every run died before its first) only the acceptance is known, not
/// `now`: that would settle, unfired and unreported, every one-shot that
/// came due since. Nor before the journal's `forgotten_before_ns`: a
/// one-shot there may have fired, and must not be taken for missed.
fn alive_until(
    alive_ns: Option<i64>,
    forgotten_before_ns: Option<i64>,
    anchor: RefTime,
    now: RefTime,
) -> RefTime {
    match alive_ns {
        Some(ns) => RefTime::from_nanos(ns),
        None => forgotten_before_ns
            .map_or(anchor, |ns| anchor.max(RefTime::from_nanos(ns)))
            .min(now),
    }
}
