//! A start after a stop: what the core must know of the previous run,
//! and the attempts it left armed, resolved from its dispatch ledger.

use std::path::Path;
use std::sync::Arc;

use baton_journal::{Journal, Outcome, Recovered};
use baton_proto::RefTime;
use baton_sched::{Config as CoreConfig, ExecutionId, Prior, PriorOutcome, Scheduler};

use crate::ledger::{Fate, Ledger, Slots};

use super::error::RuntimeError;
use super::feedback::{self, Tally};
use super::record::{FiringRecord, FiringResult};

/// Say what the journal recovered.
pub(super) fn log_opened(recovered: &Recovered) {
    tracing::info!(origin = ?recovered.origin, packs = recovered.packs.len(), "journal opened");
    if recovered.truncated_bytes > 0 {
        tracing::warn!(
            bytes = recovered.truncated_bytes,
            "journal: cut a torn record at the end (a crash mid-write); nothing acknowledged was in it"
        );
    }
}

/// The core, told what the previous run left (`recovered`).
pub(super) fn core_for(recovered: &Recovered, now: RefTime) -> Scheduler {
    Scheduler::new(
        CoreConfig {
            seed: now.as_nanos() as u64,
            // Fire and Ok events only feed the debug log here
            // (`feedback::announce`): the executed record says both.
            routine_events: tracing::enabled!(
                target: feedback::EVENT_TARGET,
                tracing::Level::DEBUG
            ),
            ..CoreConfig::default()
        },
        prior_of(recovered),
    )
}

/// Rebuild what the core must know from before a restart: each started
/// attempt's outcome (none recorded: unknown) and the once-only actions
/// already taken.
fn prior_of(rec: &Recovered) -> Prior {
    Prior {
        attempts: rec
            .attempts
            .iter()
            .map(|(id, o)| {
                let p = match o {
                    None => PriorOutcome::Unknown,
                    Some(Outcome::Succeeded) => PriorOutcome::Succeeded,
                    Some(Outcome::Failed) => PriorOutcome::Failed,
                    Some(Outcome::NotRun) => PriorOutcome::NotRun,
                };
                (id.clone(), p)
            })
            .collect(),
        done: rec.once.clone(),
    }
}

/// Before the core is built: every attempt the journal says started
/// without a result is resolved from the dispatch ledger the previous run
/// left at `path` (if it is trusted: same boot, same journal) — it ran (its
/// outcome is journalled and reported) or it never touched the device
/// (journalled not run: `catch_up` and `max_lateness` decide as for any
/// missed occurrence); one that was inside its device call when the
/// process died stays `outcome unknown`. The resolutions are written to the
/// kernel before a fresh ledger replaces the old one.
pub(super) fn resolve_armed(
    path: &Path,
    data_dir: &Path,
    journal: &mut Journal,
    recovered: &mut Recovered,
    tally: &mut Tally,
) -> Result<Slots, RuntimeError> {
    let prev = Ledger::previous(path, journal.id());
    let open: Vec<String> = recovered
        .attempts
        .iter()
        .filter(|(_, o)| o.is_none())
        .map(|(id, _)| id.clone())
        .collect();
    let (mut ran, mut not_run, mut unknown) = (0, 0, 0);
    for text in open {
        let fate = prev.fate(&text);
        match resolve_attempt(&text, fate, journal, recovered, tally)? {
            Resolution::Ran => ran += 1,
            Resolution::NotRun => not_run += 1,
            Resolution::Unknown => unknown += 1,
        }
    }
    if ran + not_run + unknown > 0 {
        match &prev.distrust {
            None => tracing::info!(
                ran,
                not_run,
                unknown,
                "attempts armed when the agent stopped, resolved from the dispatch ledger"
            ),
            Some(why) => tracing::warn!(
                unknown,
                "the dispatch ledger at {} is not used ({why}): attempts armed when the agent stopped are `outcome unknown`",
                path.display()
            ),
        }
    }
    // In the kernel before the old ledger is replaced.
    journal.flush()?;
    Ok(fresh_ledger(path, data_dir, journal))
}

/// What became of one attempt left open by the previous run.
enum Resolution {
    /// It ran: its outcome is journalled and reported.
    Ran,
    /// It never touched the device: journalled not run, a missed
    /// occurrence for the core.
    NotRun,
    /// Its outcome is unknown (left open).
    Unknown,
}

/// Resolve the open attempt `text` from its ledger `fate`.
fn resolve_attempt(
    text: &str,
    fate: Option<Fate>,
    journal: &mut Journal,
    recovered: &mut Recovered,
    tally: &mut Tally,
) -> Result<Resolution, RuntimeError> {
    let outcome = match fate {
        Some(Fate::NotRun) => Outcome::NotRun,
        Some(Fate::Succeeded) => Outcome::Succeeded,
        Some(Fate::Failed) => Outcome::Failed,
        Some(Fate::Interrupted) => {
            tracing::warn!(
                execution_id = %text,
                "it was inside its device call (or its program had started) when the agent died: outcome unknown"
            );
            return Ok(Resolution::Unknown);
        }
        None => return Ok(Resolution::Unknown),
    };
    let result = match outcome {
        Outcome::NotRun => {
            journal.record_finished(text, outcome)?;
            // For the core it never started: a missed occurrence like
            // any other (fired late within `max_lateness`, or per
            // `catch_up`), reported by the core.
            recovered.attempts.remove(text);
            return Ok(Resolution::NotRun);
        }
        Outcome::Succeeded => {
            recovered.attempts.insert(text.to_string(), Some(outcome));
            FiringResult::Ok { value: None }
        }
        Outcome::Failed => {
            recovered.attempts.insert(text.to_string(), Some(outcome));
            FiringResult::Failed(
                "the device call failed (found after a restart; its error was not kept)".into(),
            )
        }
    };
    if let Some(id) = ExecutionId::parse(text) {
        // Its time was not kept: reported at its instant.
        let rec = FiringRecord::attempt(&id, text, "", id.occurrence, id.occurrence, result);
        feedback::executed(journal, tally, &rec, None, feedback::ClockStamp::default())?;
    }
    // After its feedback (as `record_finished` asks): a crash between
    // the two leaves the attempt open, resolved again at the next
    // start, never a result whose report was lost.
    journal.record_finished(text, outcome)?;
    Ok(Resolution::Ran)
}

/// A fresh ledger replaces the old one at `path`; without one (it cannot
/// be created) firings go on with anonymous slots.
fn fresh_ledger(path: &Path, data_dir: &Path, journal: &Journal) -> Slots {
    let owner = std::path::absolute(data_dir).ok();
    match Ledger::create_for(
        path,
        journal.id(),
        crate::ledger::DEFAULT_SLOTS,
        owner.as_deref(),
    ) {
        Ok(ledger) => {
            if let Some(dir) = path.parent() {
                Ledger::collect_orphans(dir, path);
            }
            Slots::new(Arc::new(ledger))
        }
        Err(e) => {
            // Firing is not the ledger's to stop: without it a crash
            // leaves the journal's bound of unknowns, as a power cut does.
            tracing::error!(
                "the dispatch ledger {} cannot be created ({e}): firings armed when the agent dies will be `outcome unknown` (set `ledger:` to a writable tmpfs path)",
                path.display()
            );
            Slots::anonymous()
        }
    }
}
