//! Arming: what is on its way to the device, and what may still reach it.
//!
//! Jobs wait here for dispatcher credits (a burst of thousands of firings
//! due at one instant queues here, never in a bounded queue that could
//! block), tickets map dispatcher results back to attempts, exec firings
//! wait for their instant, and each pack has "may still fire" flags that a
//! safe state clears (see [`Arming::withdraw`]).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use baton_proto::RefTime;
use baton_sched::{ExecutionId, PackKey};

use crate::FastMap;
use crate::dispatcher::{DispatchError, Job, JobKind};
use crate::exec::ExecRequest;
use crate::gpio::LineHandle;
use crate::runtime::ports::Device;
use crate::runtime::record::Origin;

/// What a dispatcher ticket belongs to.
#[derive(Debug, Clone)]
pub enum Ticket {
    /// An attempt of an instruction.
    Attempt {
        /// The attempt.
        id: ExecutionId,
        /// Its id as text (shared with the dispatcher).
        text: Arc<str>,
        /// When it was due.
        scheduled: RefTime,
        /// Action name.
        action: &'static str,
    },
    /// A safe-state or on_failure action: best effort, never retried.
    Side {
        /// The pack.
        pack: PackKey,
        /// Who asked.
        origin: Origin,
        /// Its label.
        text: Arc<str>,
        /// When it was asked for.
        scheduled: RefTime,
        /// Action name.
        action: &'static str,
    },
}

/// An exec firing waiting for its instant.
#[derive(Debug)]
pub struct PendingExec {
    /// When.
    pub at: RefTime,
    /// The attempt.
    pub id: ExecutionId,
    /// What to run.
    pub req: ExecRequest,
}

/// A pack's "may still fire" flags: its own (`None`), and one per shared
/// line it writes (withdrawn when any sharer enters its safe state). Looked
/// up per firing by reference: no key is built (a pack key is two strings).
type PackFlags = Vec<(Option<LineHandle>, Arc<AtomicBool>)>;

/// The bookkeeping between the core and the device.
#[derive(Debug, Default)]
pub struct Arming {
    tickets: FastMap<u64, Ticket>,
    next_ticket: u64,
    /// Safe-state and on_failure writes waiting for credit: served first.
    safe_backlog: VecDeque<Job>,
    /// Attempts waiting for credit, in firing order.
    backlog: VecDeque<Job>,
    /// Exec firings waiting for their instant.
    pub exec_pending: Vec<PendingExec>,
    /// Exec attempts running: execution id → (attempt, scheduled).
    pub exec_running: HashMap<String, (ExecutionId, RefTime)>,
    flags: FastMap<PackKey, PackFlags>,
    /// Ids the dispatcher may still hold: released later so the real-time
    /// thread never frees memory.
    linger: VecDeque<(RefTime, Arc<str>)>,
}

impl Arming {
    /// Register a ticket.
    pub fn ticket(&mut self, t: Ticket) -> u64 {
        self.next_ticket += 1;
        self.tickets.insert(self.next_ticket, t);
        self.next_ticket
    }

    /// Take a ticket back (its result arrived).
    pub fn take_ticket(&mut self, n: u64) -> Option<Ticket> {
        self.tickets.remove(&n)
    }

    /// Tickets whose result has not arrived.
    pub fn tickets(&self) -> impl Iterator<Item = &Ticket> {
        self.tickets.values()
    }

    /// Whether side actions (safe state, on_failure) are still in flight.
    pub fn side_in_flight(&self) -> bool {
        !self.safe_backlog.is_empty()
            || self
                .tickets
                .values()
                .any(|t| matches!(t, Ticket::Side { .. }))
    }

    /// Nothing waiting and nothing in flight.
    pub fn idle(&self) -> bool {
        self.tickets.is_empty()
            && self.backlog.is_empty()
            && self.safe_backlog.is_empty()
            && self.exec_pending.is_empty()
            && self.exec_running.is_empty()
    }

    /// The flag a job of `pack` on `line` carries (`shared`: the pack
    /// declared that line shared).
    pub fn flag(&mut self, pack: &PackKey, line: Option<LineHandle>) -> Arc<AtomicBool> {
        let flags = match self.flags.get_mut(pack) {
            Some(f) => f,
            None => self.flags.entry(pack.clone()).or_default(),
        };
        if let Some((_, f)) = flags.iter().find(|(l, _)| *l == line) {
            return f.clone();
        }
        let f = Arc::new(AtomicBool::new(true));
        flags.push((line, f.clone()));
        f
    }

    /// Queue a job; it reaches the device as credits allow ([`Self::pump`]).
    pub fn enqueue(&mut self, job: Job, scheduled_until: RefTime) {
        self.linger.push_back((scheduled_until, job.id.clone()));
        match job.kind {
            JobKind::Safe | JobKind::PulseEnd => self.safe_backlog.push_back(job),
            JobKind::Attempt => self.backlog.push_back(job),
        }
    }

    /// Hand over what credits allow: safe writes first. Attempts withdrawn
    /// while they waited come back as tickets to report not run.
    pub fn pump(&mut self, device: &mut dyn Device) -> Result<Vec<Ticket>, DispatchError> {
        let r = self.hand_over(device);
        // One wake-up for the whole batch, whichever way it ended.
        device.wake();
        r
    }

    fn hand_over(&mut self, device: &mut dyn Device) -> Result<Vec<Ticket>, DispatchError> {
        while let Some(job) = self.safe_backlog.front() {
            if !device.credits().available(job.kind, job.op.credits()) {
                break;
            }
            if let Some(job) = self.safe_backlog.pop_front() {
                device.submit(job)?;
            }
        }
        let mut withheld = Vec::new();
        while let Some(job) = self.backlog.front() {
            let withdrawn = job
                .live
                .as_ref()
                .is_some_and(|l| !l.load(Ordering::Acquire));
            if withdrawn {
                if let Some(job) = self.backlog.pop_front()
                    && let Some(t) = self.tickets.remove(&job.ticket)
                {
                    withheld.push(t);
                }
                continue;
            }
            if !device.credits().available(job.kind, job.op.credits()) {
                break;
            }
            if let Some(job) = self.backlog.pop_front() {
                device.submit(job)?;
            }
        }
        Ok(withheld)
    }

    /// On the way out: attempts that never reached the device (still
    /// waiting for credit, or exec firings not started), to journal as
    /// not run.
    pub fn drain_unsent(&mut self) -> (Vec<Ticket>, Vec<PendingExec>) {
        let tickets = std::mem::take(&mut self.backlog)
            .into_iter()
            .filter_map(|j| self.tickets.remove(&j.ticket))
            .collect();
        (tickets, std::mem::take(&mut self.exec_pending))
    }

    /// Jobs waiting for credit.
    pub fn backlog_len(&self) -> usize {
        self.backlog.len() + self.safe_backlog.len()
    }

    /// A pack enters its safe state: nothing of it may reach the device
    /// any more. Its flags are cleared (armed jobs report withdrawn), and
    /// so are other packs' flags for the lines it shares with them
    /// (`shared`: those lines; `sharers`: the packs that share them).
    /// Returns its exec firings not yet started.
    pub fn withdraw(
        &mut self,
        pack: &PackKey,
        shared: &[(LineHandle, Vec<PackKey>)],
    ) -> Vec<PendingExec> {
        // Removed, so the next job of a sharer gets a fresh flag.
        for (_, f) in self.flags.remove(pack).unwrap_or_default() {
            f.store(false, Ordering::Release);
        }
        for (line, sharers) in shared {
            for other in sharers {
                if let Some(flags) = self.flags.get_mut(other) {
                    flags.retain(|(l, f)| {
                        let keep = *l != Some(*line);
                        if !keep {
                            f.store(false, Ordering::Release);
                        }
                        keep
                    });
                }
            }
        }
        let (gone, keep) = std::mem::take(&mut self.exec_pending)
            .into_iter()
            .partition(|p| p.id.pack == *pack);
        self.exec_pending = keep;
        gone
    }

    /// Release ids the dispatcher can no longer hold.
    pub fn release_lingering(&mut self, now: RefTime) {
        while self.linger.front().is_some_and(|(t, _)| *t < now) {
            self.linger.pop_front();
        }
    }

    /// Exec firings due by `now`, in instant order.
    pub fn due_exec(&mut self, now: RefTime) -> Vec<PendingExec> {
        let (mut due, later): (Vec<PendingExec>, Vec<PendingExec>) =
            std::mem::take(&mut self.exec_pending)
                .into_iter()
                .partition(|p| p.at <= now);
        self.exec_pending = later;
        due.sort_by_key(|p| p.at);
        due
    }

    /// The earliest exec instant waiting.
    pub fn next_exec(&self) -> Option<RefTime> {
        self.exec_pending.iter().map(|p| p.at).min()
    }
}
