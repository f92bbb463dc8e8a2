//! Results back into the core: device results, exec results, and exec
//! firings started when due.

use baton_proto::RefTime;
use baton_sched::{AttemptResult, Output};

use super::agent::Agent;
use super::arming::{self, Ticket};
use super::error::RuntimeError;
use super::record::{FiringRecord, FiringResult, Origin};
use crate::dispatcher::{Done, JobKind, JobOutcome, NotRun};
use crate::exec::{ExecOutcome, ExecResult, NotStartedReason};

impl Agent {
    /// Results from the device and the exec pool, into the core.
    pub(super) fn collect(&mut self) -> Result<(), RuntimeError> {
        let mut more = self.firing.bufs.take();
        while let Some(done) = self.ports.device.try_done() {
            self.on_done(done, &mut more)?;
        }
        while let Ok(r) = self.ports.exec_rx.try_recv() {
            self.on_exec(r, &mut more)?;
        }
        if more.is_empty() {
            self.firing.bufs.give_back(more);
        } else {
            self.process(more)?;
            self.pump()?;
        }
        Ok(())
    }

    pub(super) fn on_exec(
        &mut self,
        r: ExecResult,
        more: &mut Vec<Output>,
    ) -> Result<(), RuntimeError> {
        let Some(run) = self.firing.arming.exec_running.remove(&r.execution_id) else {
            return Ok(());
        };
        if let Some(s) = run.slot {
            self.firing.arming.free_slot(s);
        }
        if run.settled {
            // Withdrawn or aborted: reported and settled already.
            return Ok(());
        }
        let (id, scheduled) = (run.id, run.scheduled);
        let (result, firing) = exec_result(&r.outcome);
        let started = self.clock.to_ref(r.started.unwrap_or(r.finished));
        self.report(FiringRecord::attempt(
            &id,
            &r.execution_id,
            "exec",
            scheduled,
            started,
            firing,
        ))?;
        let at = self.clock.to_ref(r.finished);
        let result = match result {
            AttemptResult::Late { .. } => AttemptResult::Late { actual: at },
            r => r,
        };
        self.settle(&id, &r.execution_id, result, at, more)
    }

    pub(super) fn on_done(
        &mut self,
        done: Done,
        more: &mut Vec<Output>,
    ) -> Result<(), RuntimeError> {
        if done.kind == JobKind::PulseEnd {
            self.on_pulse_end(&done);
            return Ok(());
        }
        let Some(ticket) = self.firing.arming.take_ticket(done.ticket) else {
            return Ok(());
        };
        let pulse_runs = matches!(done.outcome, JobOutcome::Ok(_));
        if let Some(b) = self.firing.tally.breakdown.as_mut()
            && done.kind == JobKind::Attempt
            && pulse_runs
        {
            b.record(&done.timing);
        }
        // Lateness on the dispatcher's own (monotonic) scale: immune to the
        // estimate moving between arming and firing.
        let lateness_ns = done.actual.nanos_since(done.deadline);
        let (result, firing) = done_results(done.outcome);
        match ticket {
            Ticket::Attempt {
                id,
                text,
                scheduled,
                action,
                slot,
                line,
            } => {
                let actual = RefTime::from_nanos(scheduled.as_nanos().saturating_add(lateness_ns));
                let result = match result {
                    AttemptResult::Late { .. } => AttemptResult::Late { actual },
                    r => r,
                };
                self.report(FiringRecord::attempt(
                    &id, &text, action, scheduled, actual, firing,
                ))?;
                self.settle(&id, &text, result, actual, more)?;
                match line {
                    // A pulse that started still holds its line (and its
                    // slot) until its end has run.
                    Some(line) if pulse_runs && action == "gpio.pulse" => {
                        self.firing
                            .arming
                            .keep_ticket(done.ticket, Ticket::PulseEnd { id, slot, line });
                    }
                    _ => self.firing.arming.free_slot(slot),
                }
            }
            Ticket::Settled { slot, .. } | Ticket::PulseEnd { slot, .. } => {
                self.firing.arming.free_slot(slot);
            }
            Ticket::Side {
                pack,
                origin,
                text,
                scheduled,
                action,
                ..
            } => {
                let actual = RefTime::from_nanos(scheduled.as_nanos().saturating_add(lateness_ns));
                self.report(FiringRecord {
                    id: &text,
                    execution: None,
                    pack: &pack,
                    instruction: match origin {
                        Origin::OnFailure => "on_failure",
                        _ => "safe_state",
                    },
                    origin,
                    action,
                    scheduled,
                    actual,
                    lateness_ns,
                    result: firing,
                })?;
            }
        }
        Ok(())
    }

    /// A pulse's end ran: its slot and line are free.
    fn on_pulse_end(&mut self, done: &Done) {
        if let JobOutcome::Failed(e) = &done.outcome {
            tracing::error!("pulse end failed: {e}");
        }
        if let Some(Ticket::PulseEnd { slot, .. }) = self.firing.arming.take_ticket(done.ticket) {
            self.firing.arming.free_slot(slot);
        }
    }

    /// Start the exec firings that are due. One still waiting for a worker
    /// when its window closes is not started (the pool reports it).
    pub(super) fn start_due_exec(&mut self) -> Result<(), RuntimeError> {
        let now = self.clock.now();
        let mut more = Vec::new();
        for p in self.firing.arming.due_exec(now) {
            let text = p.req.execution_id.clone();
            let slot = p.req.live.clone();
            match self.ports.exec.submit(p.req) {
                Ok(()) => {
                    let run = arming::RunningExec {
                        id: p.id,
                        scheduled: p.at,
                        slot,
                        settled: false,
                    };
                    self.firing.arming.exec_running.insert(text, run);
                }
                Err(e) => {
                    if let Some(s) = slot {
                        self.firing.arming.free_slot(s);
                    }
                    tracing::error!(execution_id = %text, "exec not started: {e}");
                    let r = AttemptResult::Failed(e.to_string());
                    self.settle(&p.id, &text, r, now, &mut more)?;
                }
            }
        }
        if more.is_empty() {
            Ok(())
        } else {
            self.process(more)
        }
    }
}

/// A device job's outcome as the core and the feedback say it (a job not
/// run is late at an instant the caller sets).
fn done_results(outcome: JobOutcome) -> (AttemptResult, FiringResult) {
    match outcome {
        JobOutcome::Ok(value) => (AttemptResult::Ok { value }, FiringResult::Ok { value }),
        JobOutcome::Failed(e) => {
            let m = e.to_string();
            (AttemptResult::Failed(m.clone()), FiringResult::Failed(m))
        }
        JobOutcome::NotRun(why) => (
            AttemptResult::Late {
                actual: RefTime::MIN,
            },
            FiringResult::NotRun(why),
        ),
    }
}

/// An exec outcome as the core and the feedback say it.
pub(super) fn exec_result(o: &ExecOutcome) -> (AttemptResult, FiringResult) {
    let failed = |m: String| (AttemptResult::Failed(m.clone()), FiringResult::Failed(m));
    match o {
        ExecOutcome::Ok => (
            AttemptResult::Ok { value: None },
            FiringResult::Ok { value: None },
        ),
        ExecOutcome::Failed { code, stderr_tail } => {
            let code = code.map_or("by signal".to_string(), |c| c.to_string());
            let tail = stderr_tail.trim();
            failed(if tail.is_empty() {
                format!("exit {code}")
            } else {
                format!("exit {code}: {tail}")
            })
        }
        ExecOutcome::TimedOut => failed("timed out (killed)".into()),
        ExecOutcome::NotStarted { reason } => {
            let why = match reason {
                NotStartedReason::Expired { .. } => NotRun::Late,
                NotStartedReason::Withdrawn => NotRun::Withdrawn,
                NotStartedReason::PoolStopped => NotRun::Stopped,
            };
            (
                AttemptResult::Late {
                    actual: RefTime::MIN,
                },
                FiringResult::NotRun(why),
            )
        }
        other => failed(other.to_string()),
    }
}
