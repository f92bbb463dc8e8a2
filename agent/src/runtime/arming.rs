//! Arming: what is on its way to the device, and what may still reach it.
//!
//! Jobs wait here for dispatcher credits (a burst of thousands of firings
//! due at one instant queues here, never in a bounded queue that could
//! block), tickets map dispatcher results back to attempts, and exec
//! firings wait for their instant. Every attempt armed has its own slot in
//! the dispatch ledger (`crate::ledger`): the per-attempt flag the thread
//! that runs it claims at its instant, and that the control thread sets to
//! withdraw it — one attempt ([`Arming::take_back`]: a newer version, a
//! timeout) or all of a pack's ([`Arming::withdraw`]: a safe state).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use baton_proto::RefTime;
use baton_sched::{ExecutionId, PackKey, Withdrawal};

use crate::FastMap;
use crate::dispatcher::{DispatchError, Job, JobKind};
use crate::exec::ExecRequest;
use crate::ledger::{Slot, Slots};
use crate::runtime::ports::Device;
use crate::runtime::record::Origin;
use baton_gpio::LineHandle;

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
        /// Its ledger slot.
        slot: Slot,
        /// The line it touches, if any.
        line: Option<LineHandle>,
    },
    /// A safe-state or on_failure action: best effort, never retried.
    Side {
        /// The pack.
        pack: PackKey,
        /// The line it drives.
        line: Option<LineHandle>,
        /// Who asked.
        origin: Origin,
        /// Its label.
        text: Arc<str>,
        /// When it was asked for.
        scheduled: RefTime,
        /// Action name.
        action: &'static str,
    },
    /// An attempt the control thread withdrew and settled already: its
    /// job's result is awaited only to free its slot (and its line).
    Settled {
        /// The attempt.
        id: ExecutionId,
        /// Its slot.
        slot: Slot,
        /// Its line.
        line: Option<LineHandle>,
    },
    /// A pulse whose leading edge ran: its trailing edge is still to come.
    PulseEnd {
        /// The attempt.
        id: ExecutionId,
        /// Its slot (withdrawn: the pulse ends at once).
        slot: Slot,
        /// Its line.
        line: LineHandle,
    },
}

impl Ticket {
    /// The attempt's pack and line, for a ticket of an attempt.
    fn pack_line(&self) -> Option<(&PackKey, Option<LineHandle>)> {
        match self {
            Ticket::Attempt { id, line, .. } | Ticket::Settled { id, line, .. } => {
                Some((&id.pack, *line))
            }
            Ticket::PulseEnd { id, line, .. } => Some((&id.pack, Some(*line))),
            Ticket::Side { .. } => None,
        }
    }

    fn slot(&self) -> Option<&Slot> {
        match self {
            Ticket::Attempt { slot, .. }
            | Ticket::Settled { slot, .. }
            | Ticket::PulseEnd { slot, .. } => Some(slot),
            Ticket::Side { .. } => None,
        }
    }
}

/// An exec firing waiting for its instant.
#[derive(Debug)]
pub struct PendingExec {
    /// When.
    pub at: RefTime,
    /// The attempt.
    pub id: ExecutionId,
    /// What to run (`req.live`: its ledger slot).
    pub req: ExecRequest,
}

/// An exec attempt handed to the pool.
#[derive(Debug)]
pub struct RunningExec {
    /// The attempt.
    pub id: ExecutionId,
    /// When it was due.
    pub scheduled: RefTime,
    /// Its ledger slot.
    pub slot: Option<Slot>,
    /// Withdrawn and settled before a worker started it: its result (not
    /// started) only frees the slot.
    pub settled: bool,
}

/// An attempt [`Arming::take_back`] was asked for, and what became of it.
#[derive(Debug)]
pub struct TakenBack {
    /// The attempt.
    pub id: ExecutionId,
    /// Its id as text.
    pub text: Arc<str>,
    /// When it was due.
    pub scheduled: RefTime,
    /// Action name.
    pub action: &'static str,
    /// Withdrawn (it never touches the device) or too late.
    pub answer: Withdrawal,
}

/// The bookkeeping between the core and the device.
#[derive(Debug)]
pub struct Arming {
    tickets: FastMap<u64, Ticket>,
    next_ticket: u64,
    /// Safe-state and on_failure writes waiting for credit: served first.
    safe_backlog: VecDeque<Job>,
    /// Attempts waiting for credit, in firing order.
    backlog: VecDeque<Job>,
    /// Exec firings waiting for their instant.
    pub exec_pending: Vec<PendingExec>,
    /// Exec attempts handed to the pool, by execution id.
    pub exec_running: HashMap<String, RunningExec>,
    /// The ledger's slots.
    slots: Slots,
    /// Ids the dispatcher may still hold: released later so the real-time
    /// thread never frees memory.
    linger: VecDeque<(RefTime, Arc<str>)>,
}

impl Default for Arming {
    /// Over an anonymous ledger (tests, tools).
    fn default() -> Self {
        Arming::new(Slots::anonymous())
    }
}

impl Arming {
    /// Arming over the ledger's `slots`.
    pub fn new(slots: Slots) -> Self {
        Arming {
            tickets: FastMap::default(),
            next_ticket: 0,
            safe_backlog: VecDeque::new(),
            backlog: VecDeque::new(),
            exec_pending: Vec::new(),
            exec_running: HashMap::new(),
            slots,
            linger: VecDeque::new(),
        }
    }

    /// A ledger slot for the attempt `id`, armed (before its start record
    /// is made durable).
    pub fn arm_slot(&mut self, id: &str) -> Slot {
        self.slots.arm(id)
    }

    /// The attempt of `slot` is over (see `Slots::free`).
    pub fn free_slot(&mut self, slot: Slot) {
        self.slots.free(slot);
    }

    /// The journal wrote what was buffered: freed slots may be reused.
    pub fn journal_written(&mut self) {
        self.slots.journal_written();
    }

    /// After a clean stop whose journal was synced: if no attempt is left
    /// without a result, the ledger has nothing to tell a restart and its
    /// file goes (a tmpfs file is memory).
    pub fn remove_ledger_if_settled(&self) {
        let open = self.tickets.values().any(|t| t.slot().is_some())
            || !self.exec_running.is_empty()
            || !self.backlog.is_empty();
        if !open {
            self.slots.ledger().remove_file();
        }
    }

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

    /// Give up on the device attempt `text` whose call has not returned
    /// (the core ended it, outcome unknown): its ticket is settled, so its
    /// result, if the call ever returns, only frees its slot. Whether it
    /// was waiting.
    pub fn abandon(&mut self, text: &str) -> bool {
        let n = self.tickets.iter().find_map(|(n, t)| match t {
            Ticket::Attempt { text: t, .. } if &**t == text => Some(*n),
            _ => None,
        });
        let Some(n) = n else {
            return false;
        };
        if let Some(Ticket::Attempt { id, slot, line, .. }) = self.tickets.remove(&n) {
            self.tickets.insert(n, Ticket::Settled { id, slot, line });
        }
        true
    }

    /// Put a ticket back under its number (a pulse's end still to come).
    pub fn keep_ticket(&mut self, n: u64, t: Ticket) {
        self.tickets.insert(n, t);
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

    /// Queue a job; it reaches the device as credits allow ([`Self::pump`]).
    pub fn enqueue(&mut self, job: Job, scheduled_until: RefTime) {
        self.linger.push_back((scheduled_until, job.id.clone()));
        match job.kind {
            JobKind::Safe | JobKind::PulseEnd => self.safe_backlog.push_back(job),
            JobKind::Attempt => self.backlog.push_back(job),
        }
    }

    /// Hand over what credits allow: safe writes first. Attempts withdrawn
    /// while they waited come back as tickets to report not run (those
    /// settled already are dropped, their slots freed).
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
            let withdrawn = job.live.as_ref().is_some_and(Slot::withdrawn);
            if withdrawn {
                if let Some(job) = self.backlog.pop_front()
                    && let Some(t) = self.tickets.remove(&job.ticket)
                {
                    match t {
                        Ticket::Settled { slot, .. } => self.slots.free(slot),
                        t => withheld.push(t),
                    }
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
    /// any more. Every attempt of it armed is withdrawn (armed jobs report
    /// withdrawn at their instant, a pulse in progress ends at once), and
    /// so are other packs' attempts on the lines it shares with them
    /// (`shared`: those lines; with the packs that share them). Returns its
    /// exec firings not yet started (their slots withdrawn).
    pub fn withdraw(
        &mut self,
        pack: &PackKey,
        shared: &[(LineHandle, Vec<PackKey>)],
    ) -> Vec<PendingExec> {
        for t in self.tickets.values() {
            let Some((p, line)) = t.pack_line() else {
                continue;
            };
            let sharer = line.is_some_and(|l| {
                shared
                    .iter()
                    .any(|(s, packs)| *s == l && packs.iter().any(|k| k == p))
            });
            if (p == pack || sharer)
                && let Some(s) = t.slot()
            {
                s.withdraw();
            }
        }
        for r in self.exec_running.values().filter(|r| r.id.pack == *pack) {
            if let Some(s) = &r.slot {
                // Not started yet: the pool will not start it.
                s.withdraw();
            }
        }
        let (gone, keep) = std::mem::take(&mut self.exec_pending)
            .into_iter()
            .partition(|p| p.id.pack == *pack);
        self.exec_pending = keep;
        for p in &gone {
            if let Some(s) = &p.req.live {
                s.withdraw();
            }
        }
        gone
    }

    /// The core asks these attempts back (`Output::Withdraw`): each one
    /// not yet started is withdrawn (it never touches the device) and
    /// settled here; one started is too late. An attempt not found had
    /// ended already (too late).
    pub fn take_back(&mut self, asked: &HashMap<String, ExecutionId>) -> Vec<TakenBack> {
        let mut out = Vec::new();
        if asked.is_empty() {
            return out;
        }
        self.take_back_armed(asked, &mut out);
        self.take_back_pending_exec(asked, &mut out);
        self.take_back_running_exec(asked, &mut out);
        let found: HashSet<Arc<str>> = out.iter().map(|t| t.text.clone()).collect();
        for (text, id) in asked {
            if !found.contains(text.as_str()) {
                out.push(TakenBack {
                    text: Arc::from(text.as_str()),
                    scheduled: id.occurrence,
                    id: id.clone(),
                    action: "",
                    answer: Withdrawal::TooLate,
                });
            }
        }
        out
    }

    /// [`Arming::take_back`] of the GPIO attempts armed: one withdrawn in
    /// time stays as a settled ticket (its job still comes back).
    fn take_back_armed(&mut self, asked: &HashMap<String, ExecutionId>, out: &mut Vec<TakenBack>) {
        let mut settled = Vec::new();
        for (n, t) in self.tickets.iter() {
            let Ticket::Attempt {
                id,
                text,
                scheduled,
                action,
                slot,
                ..
            } = t
            else {
                continue;
            };
            if !asked.contains_key(&**text) {
                continue;
            }
            let answer = if slot.withdraw() {
                settled.push(*n);
                Withdrawal::Withdrawn
            } else {
                Withdrawal::TooLate
            };
            out.push(TakenBack {
                id: id.clone(),
                text: text.clone(),
                scheduled: *scheduled,
                action,
                answer,
            });
        }
        for n in settled {
            if let Some(Ticket::Attempt { id, slot, line, .. }) = self.tickets.remove(&n) {
                self.tickets.insert(n, Ticket::Settled { id, slot, line });
            }
        }
    }

    /// [`Arming::take_back`] of the exec firings waiting for their instant.
    fn take_back_pending_exec(
        &mut self,
        asked: &HashMap<String, ExecutionId>,
        out: &mut Vec<TakenBack>,
    ) {
        let (gone, keep): (Vec<PendingExec>, Vec<PendingExec>) =
            std::mem::take(&mut self.exec_pending)
                .into_iter()
                .partition(|p| asked.contains_key(&p.req.execution_id));
        self.exec_pending = keep;
        for p in gone {
            let answer = match &p.req.live {
                Some(s) if !s.withdraw() => Withdrawal::TooLate,
                _ => Withdrawal::Withdrawn,
            };
            if let Some(s) = p.req.live {
                self.slots.free(s);
            }
            out.push(TakenBack {
                text: Arc::from(p.req.execution_id.as_str()),
                id: p.id,
                scheduled: p.at,
                action: "exec",
                answer,
            });
        }
    }

    /// [`Arming::take_back`] of the exec firings handed to the pool: one
    /// whose program has not started is withdrawn (its result, when it
    /// comes, is not reported).
    fn take_back_running_exec(
        &mut self,
        asked: &HashMap<String, ExecutionId>,
        out: &mut Vec<TakenBack>,
    ) {
        for (text, r) in self.exec_running.iter_mut() {
            if !asked.contains_key(text) || r.settled {
                continue;
            }
            let answer = match &r.slot {
                Some(s) if s.withdraw() => {
                    r.settled = true;
                    Withdrawal::Withdrawn
                }
                _ => Withdrawal::TooLate,
            };
            out.push(TakenBack {
                id: r.id.clone(),
                text: Arc::from(text.as_str()),
                scheduled: r.scheduled,
                action: "exec",
                answer,
            });
        }
    }

    /// Lines of `pack` that an armed attempt, a pulse's end or a safe
    /// write may still drive.
    pub fn busy_lines(&self, pack: &PackKey) -> Vec<LineHandle> {
        let mut lines: Vec<LineHandle> = self
            .tickets
            .values()
            .filter_map(|t| match t {
                Ticket::Side { pack, line, .. } => Some((pack, *line)),
                // Withdrawn: it never touches its line.
                Ticket::Settled { .. } => None,
                t => t.pack_line(),
            })
            .filter(|(p, _)| *p == pack)
            .filter_map(|(_, l)| l)
            .collect();
        lines.sort_unstable();
        lines.dedup();
        lines
    }

    /// Release ids the dispatcher can no longer hold, and the room a
    /// burst left in the queues and maps (a burst of 10 000 firings grew
    /// them to hold all of it at once: megabytes that a steady load never
    /// needs again).
    pub fn release_lingering(&mut self, now: RefTime) {
        while self.linger.front().is_some_and(|(t, _)| *t < now) {
            self.linger.pop_front();
        }
        fn roomy(len: usize, cap: usize) -> bool {
            cap > 4 * len.max(256)
        }
        if roomy(self.tickets.len(), self.tickets.capacity()) {
            self.tickets.shrink_to_fit();
        }
        if roomy(self.backlog.len(), self.backlog.capacity()) {
            self.backlog.shrink_to_fit();
        }
        if roomy(self.safe_backlog.len(), self.safe_backlog.capacity()) {
            self.safe_backlog.shrink_to_fit();
        }
        if roomy(self.linger.len(), self.linger.capacity()) {
            self.linger.shrink_to_fit();
        }
        if roomy(self.exec_pending.len(), self.exec_pending.capacity()) {
            self.exec_pending.shrink_to_fit();
        }
        self.slots.shrink();
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
