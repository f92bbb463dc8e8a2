//! Performing the core's outputs: firings armed (journalled, then queued
//! for the device or the exec pool), side actions, safe states, feedback.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use baton_journal::{Journal, JournalError, StopReason};
use baton_proto::RefTime;
use baton_proto::pack::Action;
use baton_sched::{
    AttemptResult, Event, ExecutionId, Firing, OnceKey, Output, PackKey, Reason, SafeReason,
    Withdrawal,
};

use super::admit::op_for;
use super::agent::{Agent, journal_once, journal_result, linger_until, panic_hook_test_point};
use super::arming::{PendingExec, Ticket};
use super::error::RuntimeError;
use super::feedback;
use super::record::{FiringRecord, FiringResult, Origin};
use crate::dispatcher::{Job, JobKind, NotRun, Op};
use crate::exec::ExecRequest;
use crate::ledger::Slot;

impl Agent {
    /// Perform the core's outputs in order, and what follows from them, as
    /// a loop over a work queue. Each batch's firings are journalled in one
    /// durable record before any of them reaches the device.
    pub(super) fn process(&mut self, mut first: Vec<Output>) -> Result<(), RuntimeError> {
        self.process_in(&mut first)?;
        self.firing.bufs.give_back(first);
        Ok(())
    }

    /// [`Agent::process`] on a buffer the caller keeps: it is left empty,
    /// with its capacity, so the loop's every pass does not grow a new one
    /// (a firing instant's outputs were a handful of reallocations).
    pub(super) fn process_in(&mut self, batch: &mut Vec<Output>) -> Result<(), RuntimeError> {
        let mut more = self.firing.bufs.take();
        // Each batch's ledger slots, in its firings' order. Out of `self`
        // while in use, and emptied on every way out: a batch that fails
        // part-way (the loop then ends) leaves no slot of its firings for
        // another firing to take.
        let mut slots = std::mem::take(&mut self.firing.batch.slots);
        slots.clear();
        let done = self.process_batches(batch, &mut more, &mut slots);
        slots.clear();
        self.firing.batch.slots = slots;
        // Left only by a batch that failed part-way (the loop then ends):
        // those reports are made again at the next start.
        self.firing.batch.keys.clear();
        done?;
        self.firing.bufs.give_back(more);
        Ok(())
    }

    fn process_batches(
        &mut self,
        batch: &mut Vec<Output>,
        more: &mut Vec<Output>,
        slots: &mut VecDeque<Slot>,
    ) -> Result<(), RuntimeError> {
        while !batch.is_empty() {
            // Each firing's id as text, made once by the core: journalled
            // here, then shared with the dispatcher, the feedback and the
            // result.
            let refs: Vec<(&str, i64)> = batch
                .iter()
                .filter_map(|o| match o {
                    Output::Fire(f) => Some((&*f.text, f.scheduled.as_nanos())),
                    _ => None,
                })
                .collect();
            if !refs.is_empty() {
                // Each attempt's ledger slot first: after a crash the slot
                // says whether an attempt whose start record is durable
                // ever touched the device.
                for (text, _) in &refs {
                    slots.push_back(self.firing.arming.arm_slot(text));
                }
                // If this fails nothing may fire: the error ends the loop,
                // whose way out drives the safe state.
                let started = self
                    .firing
                    .tally
                    .breakdown
                    .is_some()
                    .then(baton_clock::mono_now);
                self.journal.record_started(&refs)?;
                if let (Some(t), Some(b)) = (started, self.firing.tally.breakdown.as_mut()) {
                    let ns = baton_clock::mono_now().nanos_since(t);
                    b.journal.saturating_record(ns.max(0) as u64);
                }
            }
            drop(refs);
            // Consumed in place: a burst of thousands of outputs is never
            // copied.
            for o in batch.drain(..) {
                self.perform(o, slots, more)?;
            }
            self.journal_batch_keys()?;
            // The core asks answers before its next tick: all of this
            // batch's in one pass over what is armed.
            self.answer_withdrawals(more)?;
            std::mem::swap(batch, more);
        }
        Ok(())
    }

    /// One attempt, its id (`f.text`) already journalled and its ledger
    /// slot armed.
    fn fire(&mut self, f: Firing, slot: Slot, more: &mut Vec<Output>) -> Result<(), RuntimeError> {
        let now = self.clock.now();
        let action = f.action.clone();
        match &*action {
            Action::Noop => {
                self.arm(f, Op::Noop, "noop", slot);
                Ok(())
            }
            Action::Exec { .. } => {
                self.queue_exec(&f, &f.text, slot);
                Ok(())
            }
            action => self.arm_gpio(f, action, now, slot, more),
        }
    }

    /// Answer the core's withdrawals asked in this batch: each attempt not
    /// yet started is withdrawn (reported not run, journalled), the others
    /// are too late (their results come as usual).
    fn answer_withdrawals(&mut self, more: &mut Vec<Output>) -> Result<(), RuntimeError> {
        if self.firing.batch.asked_back.is_empty() {
            return Ok(());
        }
        let asked = std::mem::take(&mut self.firing.batch.asked_back);
        let ids: HashMap<String, ExecutionId> = asked
            .iter()
            .map(|(id, _)| (id.to_string(), id.clone()))
            .collect();
        let why: HashMap<String, Reason> = asked
            .into_iter()
            .map(|(id, r)| (id.to_string(), r))
            .collect();
        let now = self.clock.now();
        for t in self.firing.arming.take_back(&ids) {
            if t.answer == Withdrawal::Withdrawn {
                let not_run = match why.get(&*t.text) {
                    Some(Reason::Timeout) => NotRun::TimedOut,
                    _ => NotRun::Replaced,
                };
                self.report(FiringRecord::attempt(
                    &t.id,
                    &t.text,
                    t.action,
                    t.scheduled,
                    now,
                    FiringResult::NotRun(not_run),
                ))?;
                let r = AttemptResult::Late { actual: now };
                journal_result(&mut self.journal, &t.text, &r)?;
            }
            self.core.withdrawal(&t.id, t.answer, now).drain_into(more);
        }
        Ok(())
    }

    /// One output (a firing's id is already journalled, and its ledger
    /// slot armed: the next of `slots`).
    fn perform(
        &mut self,
        o: Output,
        slots: &mut VecDeque<Slot>,
        more: &mut Vec<Output>,
    ) -> Result<(), RuntimeError> {
        let now = self.clock.now();
        match o {
            Output::Fire(f) => {
                let slot = match slots.pop_front() {
                    Some(s) => s,
                    None => self.firing.arming.arm_slot(&f.text),
                };
                self.fire(f, slot, more)?
            }
            Output::Abort(id) => {
                // Exec attempts are killed by the pool at the same timeout.
                // Its result, when it comes, is not reported (it only frees
                // the attempt's slot).
                let text = id.to_string();
                if let Some(r) = self.firing.arming.exec_running.get_mut(&text) {
                    r.settled = true;
                } else if self.firing.arming.abandon(&text) {
                    // A device call that has not returned one timeout past
                    // its own: the core reported it failed, outcome
                    // unknown. Journalled failed, so a restart neither
                    // fires it again nor reports it a second time.
                    let failed = AttemptResult::Failed("the device call did not return".into());
                    journal_result(&mut self.journal, &text, &failed)?;
                }
            }
            Output::Withdraw { id, reason } => self.firing.batch.asked_back.push((id, reason)),
            Output::OnFailure {
                pack, action, once, ..
            } => {
                // Once means once across restarts: journalled before it runs
                // (a program may not be idempotent).
                journal_once(&mut self.journal, &once)?;
                self.side_action(&pack, Origin::OnFailure, &action, now)?;
            }
            Output::SafeState {
                pack,
                actions,
                reason,
                once,
            } => {
                self.enter_safe_state(&pack, &actions, reason, now, more)?;
                // After the device: a safe state never waits on the disk
                // (driving it twice is harmless; late is not).
                if let Some(k) = once {
                    journal_once(&mut self.journal, &k)?;
                }
            }
            Output::Event(e) => {
                self.report_event(&e)?;
                if let Some(k) = e.once {
                    self.firing.batch.keys.push(k);
                }
            }
        }
        Ok(())
    }

    /// An `exec` waits here for its instant, then goes to the pool with a
    /// window: waiting for a worker past it is not a run.
    fn queue_exec(&mut self, f: &Firing, text: &str, live: Slot) {
        let Action::Exec { program, args, env } = &*f.action else {
            return;
        };
        self.firing.arming.exec_pending.push(PendingExec {
            at: f.scheduled,
            id: f.id.clone(),
            req: ExecRequest {
                execution_id: text.to_string(),
                idempotency_key: f.id.idempotency_key(),
                attempt: f.id.attempt,
                scheduled_at: f.scheduled.to_rfc3339(),
                program: program.clone(),
                args: args.clone(),
                env: env.clone(),
                timeout: f.timeout,
                not_after: Some(self.clock.to_mono(f.not_after)),
                live: Some(live),
            },
        });
    }

    /// A GPIO attempt becomes a dispatcher job carrying its pack's flag (or
    /// the pack's flag for that line, if the pack shares it).
    fn arm_gpio(
        &mut self,
        f: Firing,
        action: &Action,
        now: RefTime,
        slot: Slot,
        more: &mut Vec<Output>,
    ) -> Result<(), RuntimeError> {
        let Some(op) = op_for(&self.plane.admission, action) else {
            self.firing.arming.free_slot(slot);
            let r = AttemptResult::Failed(format!("line of {} was not requested", action.name()));
            return self.settle(&f.id, &f.text, r, now, more);
        };
        self.arm(f, op, action.name(), slot);
        Ok(())
    }

    /// An attempt becomes a dispatcher job carrying its ledger slot (its
    /// own flag: claimed at its instant, withdrawn by the control thread).
    fn arm(&mut self, f: Firing, op: Op, action: &'static str, live: Slot) {
        let prompt = self.plane.held.get(&f.id.pack).is_none_or(|h| h.chained);
        let Firing {
            id,
            text,
            scheduled,
            not_after,
            ..
        } = f;
        // The id moves into the ticket: no copy of its strings per firing.
        let ticket = self.firing.arming.ticket(Ticket::Attempt {
            id,
            text: text.clone(),
            scheduled,
            action,
            slot: live.clone(),
            line: op.line(),
        });
        let width = match op {
            Op::Pulse { width_ns, .. } => width_ns,
            _ => 0,
        };
        self.firing.arming.enqueue(
            Job {
                deadline: self.clock.to_mono(scheduled),
                not_after: self.clock.to_mono(not_after),
                ticket,
                kind: JobKind::Attempt,
                op,
                id: text,
                live: Some(live),
                prompt,
            },
            linger_until(scheduled, width),
        );
    }

    /// A pack enters its safe state: withdraw everything of it first, then
    /// queue the safe-state writes (ahead of any attempt), and only then
    /// journal — the device never waits on the disk.
    pub(super) fn enter_safe_state(
        &mut self,
        pack: &PackKey,
        actions: &[Action],
        reason: SafeReason,
        now: RefTime,
        more: &mut Vec<Output>,
    ) -> Result<(), RuntimeError> {
        let shared: Vec<_> = self
            .plane
            .admission
            .shared_of(pack)
            .into_iter()
            .map(|l| (l, self.plane.admission.sharers(pack, l)))
            .collect();
        let gone = self.firing.arming.withdraw(pack, &shared);
        let mut first_err = None;
        for a in actions {
            if let Err(e) = self.side_action(pack, Origin::SafeState(reason), a, now) {
                first_err.get_or_insert(e);
            }
        }
        self.safe.driven(pack);
        if reason != SafeReason::Shutdown {
            // Stopped for good: the controller hears it in the next `Held`.
            self.plane.held.mark_changed();
        }
        // Every step below runs whatever failed before it, and the first
        // error is returned at the end: a firing withdrawn but never
        // settled stays open, and a stop never journalled brings a
        // cancelled pack back running after a restart.
        if let Err(e) = self.pump() {
            first_err.get_or_insert(e);
        }
        for p in gone {
            if let Some(s) = p.req.live.clone() {
                self.firing.arming.free_slot(s);
            }
            let late = AttemptResult::Late { actual: now };
            if let Err(e) = self.settle(&p.id, &p.req.execution_id, late, now, more) {
                first_err.get_or_insert(e);
            }
        }
        // A give-up, cancel or lease loss is for good: the pack must not
        // come back running after a restart (only a higher version brings
        // it back). A shutdown is not.
        let stop = match reason {
            SafeReason::GiveUp => Some(StopReason::GiveUp),
            SafeReason::Cancel => Some(StopReason::Cancel),
            SafeReason::LeaseLost => Some(StopReason::LeaseLost),
            SafeReason::ClockLost => Some(StopReason::ClockLost),
            SafeReason::Shutdown => None,
        };
        if let Some(stop) = stop
            && let Some((version, _)) = self.core.held(pack)
            && let Err(e) = self
                .journal
                .stop_pack(&pack.tenant, &pack.pack, version, stop)
        {
            first_err.get_or_insert(e.into());
        }
        first_err.map_or(Ok(()), Err)
    }

    /// A safe-state or on_failure action: now, best effort, never retried,
    /// never waiting on the journal.
    pub(super) fn side_action(
        &mut self,
        pack: &PackKey,
        origin: Origin,
        action: &Action,
        now: RefTime,
    ) -> Result<(), RuntimeError> {
        let what = match origin {
            Origin::OnFailure => "on_failure".to_string(),
            Origin::SafeState(r) => format!("safe_state ({})", r.as_str()),
            Origin::Attempt => "attempt".to_string(),
        };
        let text: Arc<str> = Arc::from(format!("{pack} {what}@{}", now.as_nanos()));
        match action {
            Action::Exec { program, args, env } => {
                let req = ExecRequest {
                    execution_id: text.to_string(),
                    idempotency_key: text.to_string(),
                    attempt: 1,
                    scheduled_at: now.to_rfc3339(),
                    program: program.clone(),
                    args: args.clone(),
                    env: env.clone(),
                    timeout: Duration::from_secs(30),
                    not_after: None,
                    live: None,
                };
                if let Err(e) = self.ports.exec.submit(req) {
                    tracing::error!(pack = %pack, "{what} exec {program}: {e}");
                }
            }
            Action::Noop => {}
            a => match op_for(&self.plane.admission, a) {
                Some(op) => {
                    let ticket = self.firing.arming.ticket(Ticket::Side {
                        pack: pack.clone(),
                        line: op.line(),
                        origin,
                        text: text.clone(),
                        scheduled: now,
                        action: a.name(),
                    });
                    let width = match op {
                        crate::dispatcher::Op::Pulse { width_ns, .. } => width_ns,
                        _ => 0,
                    };
                    self.firing.arming.enqueue(
                        Job {
                            deadline: self.clock.to_mono(now),
                            not_after: self.clock.to_mono(RefTime::MAX),
                            ticket,
                            kind: JobKind::Safe,
                            op,
                            id: text,
                            live: None,
                            prompt: true,
                        },
                        linger_until(now, width),
                    );
                }
                None => tracing::error!(
                    pack = %pack,
                    "{what}: the line of {} was never requested",
                    a.name()
                ),
            },
        }
        Ok(())
    }

    /// Hand jobs over as credits allow; attempts withdrawn while waiting
    /// are settled as not run.
    pub(super) fn pump(&mut self) -> Result<(), RuntimeError> {
        let withheld = self.firing.arming.pump(self.ports.device.as_mut())?;
        if withheld.is_empty() {
            return Ok(());
        }
        let now = self.clock.now();
        let mut more = Vec::new();
        for t in withheld {
            if let Ticket::Attempt {
                id,
                text,
                scheduled,
                action,
                slot,
                ..
            } = t
            {
                self.firing.arming.free_slot(slot);
                self.report(FiringRecord::attempt(
                    &id,
                    &text,
                    action,
                    scheduled,
                    now,
                    FiringResult::NotRun(NotRun::Withdrawn),
                ))?;
                self.settle(
                    &id,
                    &text,
                    AttemptResult::Late { actual: now },
                    now,
                    &mut more,
                )?;
            }
        }
        self.process(more)
    }

    /// Journal an attempt's result and tell the core.
    /// Journal an attempt's result (`text`: its id as journalled) and
    /// tell the core.
    pub(super) fn settle(
        &mut self,
        id: &ExecutionId,
        text: &str,
        r: AttemptResult,
        at: RefTime,
        more: &mut Vec<Output>,
    ) -> Result<(), RuntimeError> {
        journal_result(&mut self.journal, text, &r)?;
        self.core.attempt_result(id, r, at).drain_into(more);
        Ok(())
    }

    /// Core events to feedback, as one unit: every report first, then the
    /// once keys of the once-only ones. A key is the core's word that its
    /// report was made — and those that came with it, an `outcome
    /// unknown`'s dependents skipped — so a restart never makes them again.
    /// Its durable write carries the buffered reports ahead of it: no crash
    /// leaves a key without its unit's reports (which would then never be
    /// made); a crash before the keys leaves the reports to be made again
    /// at the next start (twice rather than never).
    pub(super) fn events(&mut self, events: &[Event]) -> Result<(), JournalError> {
        for e in events {
            self.report_event(e)?;
        }
        let keys: Vec<(String, i64)> = events
            .iter()
            .filter_map(|e| e.once.as_ref())
            .map(once_entry)
            .collect();
        record_keys(&mut self.journal, &keys)
    }

    /// The once keys of the batch's reports, after all of them (see
    /// [`Agent::events`]). The batch's actions journalled their own keys
    /// already (before an `on_failure`, after a safe state's device writes).
    fn journal_batch_keys(&mut self) -> Result<(), JournalError> {
        if self.firing.batch.keys.is_empty() {
            return Ok(());
        }
        let keys: Vec<(String, i64)> = self
            .firing
            .batch
            .keys
            .drain(..)
            .map(|k| once_entry(&k))
            .collect();
        record_keys(&mut self.journal, &keys)
    }

    /// A core event's report, its once key (if any) left to the caller.
    fn report_event(&mut self, e: &Event) -> Result<(), JournalError> {
        // Pack-wide events have no id to carry the version: look it up.
        let version = match e.id {
            Some(_) => None,
            None => self.core.held(&e.pack).map(|(v, _)| v),
        };
        let c = self.clock_stamp();
        feedback::event(&mut self.journal, &mut self.firing.tally, e, version, c)
    }

    pub(super) fn report(&mut self, rec: FiringRecord) -> Result<(), JournalError> {
        // An attempt's id carries its version; a side action's does not.
        let version = match rec.origin {
            Origin::Attempt => None,
            _ => self.core.held(rec.pack).map(|(v, _)| v),
        };
        let c = self.clock_stamp();
        let r = feedback::executed(&mut self.journal, &mut self.firing.tally, &rec, version, c);
        panic_hook_test_point();
        r
    }

    /// The clock as a feedback record states it.
    fn clock_stamp(&self) -> feedback::ClockStamp {
        let status = self.clock.status();
        feedback::ClockStamp {
            uncertainty_ns: self.clock.uncertainty_ns(),
            source: status.map(|e| e.source.into()),
            state: status.map(|e| e.state.into()),
        }
    }
}

/// A once key as the journal records it: its text and the occurrence it
/// dates from.
fn once_entry(k: &OnceKey) -> (String, i64) {
    (k.to_string(), k.occurrence.as_nanos())
}

/// Once keys of reports already pushed, durable together with one sync
/// (the reports before them in the log).
fn record_keys(journal: &mut Journal, keys: &[(String, i64)]) -> Result<(), JournalError> {
    journal
        .record_once_all(keys.iter().map(|(k, t)| (k.as_str(), *t)))
        .map(|_| ())
}
