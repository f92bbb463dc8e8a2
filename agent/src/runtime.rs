//! The agent's control thread: the thin IO shell around the scheduler core.
//!
//! It owns the core, the journal and the exec pool, and feeds the
//! dispatcher. Firings are *armed* a short horizon ahead: their start
//! records are made durable in one batch, then they go to the dispatcher,
//! which fires each at its exact instant. So the start record is always on
//! disk before the device is touched (DESIGN.md principle 4), and a crash
//! can leave at most the firings armed within the horizon `outcome unknown`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use baton_proto::RefTime;
use baton_proto::pack::{Action, LineRef, Pack, parse_pack, read_pack_file};
use baton_sched::{
    AttemptResult, Config as CoreConfig, Event, EventKind, ExecutionId, Output, PackKey,
    PriorOutcome, SafeReason, Scheduler,
};
use hdrhistogram::Histogram;

use crate::clock::{ClockEstimate, MonoTime, STEP_THRESHOLD_NS, mono_now};
use crate::config::AgentConfig;
use crate::dispatcher::{Dispatcher, Done, Job, JobOutcome, Op};
use crate::exec::{ExecOutcome, ExecPool, ExecRequest, ExecResult};
use crate::gpio::{Gpio, LineHandle, open_backend};
use crate::journal::{Journal, JournalConfig, Outcome, StopReason, StoredPack};
use crate::live::fmt_ns;

/// Packs are refused while the clock estimate is less certain than this.
pub const MAX_CLOCK_UNCERTAINTY_NS: i64 = 10_000_000;

/// One executed (or late-skipped) attempt, for the live view and feedback.
#[derive(Clone, Debug)]
pub struct FiringRecord {
    /// The attempt.
    pub id: String,
    /// Instruction id (or `safe_state` / `on_failure`).
    pub instruction: String,
    /// Action name.
    pub action: &'static str,
    /// When it was due (reference).
    pub scheduled: RefTime,
    /// When it happened (reference).
    pub actual: RefTime,
    /// `actual − scheduled`, ns (negative: early).
    pub lateness_ns: i64,
    /// `ok`, `failed: …`, `late`, or `ok value=1`.
    pub result: String,
    /// The sampled level, for `gpio.read`.
    pub value: Option<u8>,
}

/// Where the runtime reports what it does (the terminal live view, a log).
pub trait View {
    /// Startup notes and warnings.
    fn note(&mut self, msg: &str);
    /// An attempt ended.
    fn firing(&mut self, rec: &FiringRecord, hist: &Histogram<u64>);
    /// A core event (skip, retry, give-up, safe state…).
    fn event(&mut self, e: &Event);
    /// Called about once a second.
    fn tick(&mut self, _hist: &Histogram<u64>) {}
}

/// What a dispatcher ticket belongs to.
#[derive(Debug)]
enum Ticket {
    Attempt {
        id: ExecutionId,
        text: Arc<str>,
        scheduled: RefTime,
        action: &'static str,
    },
    /// Safe-state or on_failure writes: best effort, logged.
    Side {
        what: String,
        text: Arc<str>,
        scheduled: RefTime,
        action: &'static str,
    },
}

/// An exec firing waiting for its instant.
#[derive(Debug)]
struct PendingExec {
    at: RefTime,
    id: ExecutionId,
    req: ExecRequest,
}

/// The running agent (control side).
pub struct Agent {
    cfg: AgentConfig,
    clock: Arc<ClockEstimate>,
    core: Scheduler,
    journal: Journal,
    gpio: Arc<Mutex<Box<dyn Gpio>>>,
    handles: HashMap<LineRef, LineHandle>,
    dispatcher: Dispatcher,
    exec: ExecPool,
    exec_rx: Receiver<ExecResult>,
    exec_pending: Vec<PendingExec>,
    exec_running: HashMap<String, (ExecutionId, RefTime)>,
    tickets: HashMap<u64, Ticket>,
    next_ticket: u64,
    /// Per pack: may its armed jobs still fire (see `withdraw`).
    live: HashMap<PackKey, Arc<AtomicBool>>,
    /// Ids the dispatcher may still hold (pulse ends): released later so
    /// the real-time thread never frees memory.
    linger: VecDeque<(MonoTime, Arc<str>)>,
    hist: Histogram<u64>,
    out: Vec<Output>,
    last_heartbeat: MonoTime,
    last_view_tick: MonoTime,
    /// Outbox drops already reported (the journal keeps the count; the
    /// controller link will carry it in feedback).
    reported_dropped: u64,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent").field("id", &self.cfg.id).finish()
    }
}

/// Rebuild what the core must know of attempts from before a restart.
fn prior_outcomes(attempts: &HashMap<String, Option<Outcome>>) -> HashMap<String, PriorOutcome> {
    attempts
        .iter()
        .map(|(id, outcome)| {
            let outcome = match outcome {
                None => PriorOutcome::Unknown,
                Some(Outcome::Failed) => PriorOutcome::Failed,
                Some(Outcome::NotRun) => PriorOutcome::NotRun,
                Some(Outcome::Succeeded) => PriorOutcome::Succeeded,
            };
            (id.clone(), outcome)
        })
        .collect()
}

/// Parsing a large pack builds a YAML tree that is freed right after; give
/// those pages back to the kernel so the agent's footprint is what it holds,
/// not what it once parsed (glibc keeps freed heap otherwise).
fn release_free_memory() {
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

impl Agent {
    /// Open the journal, start the dispatcher, restore journalled packs and
    /// load the configured ones. Every refusal names the file and reason.
    pub fn start(cfg: AgentConfig, view: &mut dyn View) -> anyhow::Result<Agent> {
        let clock = Arc::new(ClockEstimate::from_system());
        let mut jcfg = JournalConfig::new(&cfg.data_dir);
        jcfg.outbox_cap = cfg.outbox_cap;
        let (journal, rec) = Journal::open(jcfg)
            .with_context(|| format!("opening the journal in {}", cfg.data_dir.display()))?;
        if rec.truncated_bytes > 0 {
            view.note(&format!(
                "journal: cut {} bytes of a torn record at the end (a crash mid-write); nothing acknowledged was in it",
                rec.truncated_bytes
            ));
        }
        let prior = prior_outcomes(&rec.attempts);
        let gpio = open_backend(&cfg.gpio, cfg.allowed_lines.clone())
            .with_context(|| format!("opening the GPIO backend `{}`", cfg.gpio))?;
        let gpio = Arc::new(Mutex::new(gpio));
        let dispatcher =
            Dispatcher::start(gpio.clone(), clock.clone(), cfg.rt, std::thread::current())
                .context("starting the dispatcher thread")?;
        // The dispatcher's CPU is its own: move this thread (and the exec
        // workers it spawns next) elsewhere.
        if let Some(cpu) = cfg.rt.cpu
            && let Err(e) = crate::rt::avoid_cpu(cpu)
        {
            view.note(&format!(
                "warning: could not keep the control thread off CPU {cpu}: {e}"
            ));
        }
        let (tx, exec_rx) = channel();
        let exec = ExecPool::new(cfg.exec_workers, cfg.exec_allowlist.clone(), tx);
        let seed = clock.now().as_nanos() as u64;
        let mut agent = Agent {
            core: Scheduler::new(
                CoreConfig {
                    seed,
                    ..CoreConfig::default()
                },
                prior,
            ),
            clock,
            journal,
            gpio,
            handles: HashMap::new(),
            dispatcher,
            exec,
            exec_rx,
            exec_pending: Vec::new(),
            exec_running: HashMap::new(),
            tickets: HashMap::new(),
            next_ticket: 1,
            live: HashMap::new(),
            linger: VecDeque::new(),
            hist: Histogram::new_with_bounds(1, 60_000_000_000, 2).context("histogram bounds")?,
            out: Vec::new(),
            last_heartbeat: mono_now(),
            last_view_tick: mono_now(),
            reported_dropped: 0,
            cfg,
        };
        let now = agent.clock.now();
        let last_alive = rec.last_alive_ns.map(RefTime::from_nanos).unwrap_or(now);
        for sp in rec.packs {
            let label = format!("journalled pack {}/{} v{}", sp.tenant, sp.pack, sp.version);
            let pack = parse_pack(&sp.yaml)
                .map_err(|e| anyhow::anyhow!("{label}: no longer valid:\n{e}"))?;
            agent.prepare(&pack).with_context(|| label.clone())?;
            let mut out = std::mem::take(&mut agent.out);
            let accepted = RefTime::from_nanos(sp.accepted_ns);
            match sp.stopped {
                None => agent
                    .core
                    .restore(pack, accepted, last_alive, now, &mut out),
                Some(why) => {
                    let reason = match why {
                        StopReason::Cancel => SafeReason::Cancel,
                        StopReason::GiveUp => SafeReason::GiveUp,
                    };
                    agent
                        .core
                        .restore_stopped(pack, accepted, reason, now, &mut out)
                }
            }
            .with_context(|| label.clone())?;
            agent.out = out;
            match &sp.stopped {
                None => view.note(&format!("restored {label}")),
                Some(why) => view.note(&format!(
                    "restored {label} in its safe state (stopped by {why} before the restart; push a higher version to run it again)"
                )),
            }
        }
        for path in agent.cfg.packs.clone() {
            agent.load_file(&path, view)?;
        }
        release_free_memory();
        let mut rt = agent.dispatcher.rt_status().clone();
        if agent.cfg.rt.mlockall {
            crate::rt::lock_memory(&mut rt);
        }
        // One warning naming everything that was refused; never fatal.
        if let Some(w) = rt.warning() {
            view.note(&format!("warning: {w}"));
        }
        Ok(agent)
    }

    /// Validate a pack file and accept it (journalled first).
    pub fn load_file(&mut self, path: &Path, view: &mut dyn View) -> anyhow::Result<()> {
        let name = path.display().to_string();
        // DESIGN.md principle 3: no pack is taken while the agent does not
        // know reference time well enough to honour it.
        let uncertainty = self.clock.uncertainty_ns();
        if uncertainty > MAX_CLOCK_UNCERTAINTY_NS {
            bail!(
                "{name}: refused: clock uncertainty {} exceeds the agent's limit {}",
                fmt_ns(uncertainty),
                fmt_ns(MAX_CLOCK_UNCERTAINTY_NS)
            );
        }
        let (yaml, pack) = read_pack_file(path).map_err(|e| anyhow::anyhow!("{e}"))?;
        self.prepare(&pack)
            .with_context(|| format!("{name}: pack `{}` refused", pack.id))?;
        let now = self.clock.now();
        let key = PackKey {
            tenant: pack.tenant.clone(),
            pack: pack.id.clone(),
        };
        let version = pack.version;
        if let Some((held, _)) = self.core.held(&key)
            && held >= version
        {
            view.note(&format!(
                "{name}: pack {key} v{version} already held (v{held}): unchanged"
            ));
            return Ok(());
        }
        // Durable before it takes effect: a crash right after acceptance
        // must not lose the pack.
        self.journal
            .put_pack(&StoredPack {
                tenant: key.tenant.clone(),
                pack: key.pack.clone(),
                version,
                yaml,
                accepted_ns: now.as_nanos(),
                stopped: None,
            })
            .context("journalling the pack")?;
        let mut out = std::mem::take(&mut self.out);
        let r = self.core.accept(pack, now, &mut out);
        self.out = out;
        r.with_context(|| format!("{name}: pack {key}"))?;
        view.note(&format!("accepted {name}: pack {key} v{version}"));
        Ok(())
    }

    /// The agent's own last line of defence (DESIGN.md principle 2): every
    /// line a pack touches is requested now (allowlist enforced by the
    /// backend) and every program must be on the exec allowlist. Nothing is
    /// accepted partially.
    fn prepare(&mut self, pack: &Pack) -> anyhow::Result<()> {
        let mut gpio = self.gpio.lock().unwrap_or_else(|p| p.into_inner());
        for (ins, action) in pack.all_actions() {
            let ctx = || match ins {
                Some(i) => format!("instruction `{}`", i.id),
                None => "safe_state".to_string(),
            };
            if let Some(line) = action.line() {
                if self.handles.contains_key(line) {
                    continue;
                }
                let h = if matches!(action, Action::GpioRead { .. }) {
                    gpio.request_input(line)
                } else {
                    gpio.request(line)
                }
                .with_context(ctx)?;
                self.handles.insert(line.clone(), h);
            }
            if let Action::Exec { program, .. } = action
                && !self.exec.is_allowed(program)
            {
                bail!(
                    "{}: program `{program}` is not on this agent's exec allowlist ({})",
                    ctx(),
                    if self.cfg.exec_allowlist.is_empty() {
                        "empty".to_string()
                    } else {
                        self.cfg
                            .exec_allowlist
                            .iter()
                            .map(|p| p.display().to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    }
                );
            }
        }
        Ok(())
    }

    /// Nothing pending, nothing in flight.
    pub fn idle(&self) -> bool {
        self.core.next_wake().is_none()
            && self.tickets.is_empty()
            && self.exec_pending.is_empty()
            && self.exec_running.is_empty()
            && self.out.is_empty()
    }

    /// Run until `stop` is set (SIGTERM/SIGINT) or, with `exit_when_idle`,
    /// until nothing is left to do; then enter the safe state, flush, return.
    pub fn run(
        &mut self,
        stop: &AtomicBool,
        exit_when_idle: bool,
        view: &mut dyn View,
    ) -> anyhow::Result<()> {
        loop {
            if stop.load(Ordering::Acquire) || (exit_when_idle && self.idle()) {
                break;
            }
            self.step(view)?;
            self.wait();
        }
        self.shutdown(view)
    }

    fn wait(&self) {
        let now = self.clock.now();
        let horizon = self.cfg.arm_horizon;
        let mut until = now + Duration::from_millis(100);
        if let Some(w) = self.core.next_wake() {
            // Arm when half the horizon is left: each arming then covers
            // about half a horizon of firings with one fsync (group commit),
            // instead of one fsync per firing.
            until = until.min(w.saturating_sub(horizon / 2));
        }
        if let Some(e) = self.exec_pending.iter().map(|p| p.at).min() {
            until = until.min(e);
        }
        let d = until.since(now);
        if !d.is_zero() && self.dispatcher.inbox_len() == 0 {
            // Unparked early by the dispatcher when a result is ready.
            std::thread::park_timeout(d);
        }
    }

    /// One pass: arm due firings, act on outputs, collect results.
    pub fn step(&mut self, view: &mut dyn View) -> anyhow::Result<()> {
        let step = self.clock.resample_system();
        if step.abs() > STEP_THRESHOLD_NS {
            view.note(&format!(
                "clock step of {} detected: schedules stay on reference time (treated as downtime / early wake)",
                fmt_ns(step)
            ));
        }
        let now = self.clock.now();
        let mut out = std::mem::take(&mut self.out);
        self.core.tick(now + self.cfg.arm_horizon, &mut out);
        self.act(out, now, view)?;
        self.collect(view)?;
        self.submit_due_exec(view)?;
        let m = mono_now();
        if m.0 - self.last_heartbeat.0 > 100_000_000 {
            let beat = self
                .journal
                .heartbeat(now.as_nanos())
                .context("journal heartbeat")?;
            if let Some(e) = beat.compaction_error {
                view.note(&format!("warning: journal compaction failed: {e}"));
            }
            self.last_heartbeat = m;
            while self.linger.front().is_some_and(|(t, _)| t.0 < m.0) {
                self.linger.pop_front();
            }
        }
        if m.0 - self.last_view_tick.0 > 1_000_000_000 {
            view.tick(&self.hist);
            self.last_view_tick = m;
            let dropped = self.journal.dropped();
            if dropped > self.reported_dropped {
                view.note(&format!(
                    "feedback outbox full (cap {}): {dropped} oldest record(s) dropped so far, unreported to any controller",
                    self.cfg.outbox_cap
                ));
                self.reported_dropped = dropped;
            }
        }
        Ok(())
    }

    fn ticket(&mut self, t: Ticket) -> u64 {
        let n = self.next_ticket;
        self.next_ticket += 1;
        self.tickets.insert(n, t);
        n
    }

    fn op_for(&self, action: &Action) -> Option<Op> {
        let h = |l: &LineRef| self.handles.get(l).copied();
        Some(match action {
            Action::GpioWrite { line, value } => Op::Write(h(line)?, *value),
            Action::GpioToggle { line } => Op::Toggle(h(line)?),
            Action::GpioRead { line } => Op::Read(h(line)?),
            Action::GpioPulse { line, width, value } => Op::Pulse {
                line: h(line)?,
                value: *value,
                width_ns: i64::try_from(width.as_nanos()).unwrap_or(i64::MAX),
            },
            Action::Exec { .. } | Action::Noop => return None,
        })
    }

    /// Perform the core's outputs, in order. Fires are journalled as one
    /// batch before any of them reaches the dispatcher.
    fn act(
        &mut self,
        outputs: Vec<Output>,
        now: RefTime,
        view: &mut dyn View,
    ) -> anyhow::Result<()> {
        let fires: Vec<(String, i64)> = outputs
            .iter()
            .filter_map(|o| match o {
                Output::Fire(f) => Some((f.id.to_string(), f.scheduled.as_nanos())),
                _ => None,
            })
            .collect();
        if !fires.is_empty() {
            let refs: Vec<(&str, i64)> = fires.iter().map(|(s, t)| (s.as_str(), *t)).collect();
            // If this fails nothing may fire: the error stops the agent,
            // which then enters the safe state.
            self.journal
                .record_started(&refs)
                .context("journalling start records")?;
        }
        let mut results = Vec::new();
        for o in outputs {
            match o {
                Output::Fire(f) => {
                    let text: Arc<str> = Arc::from(f.id.to_string());
                    match &*f.action {
                        Action::Noop => {
                            // Nothing touches the device: done when due.
                            results.push((
                                f.id.clone(),
                                AttemptResult::Ok { value: None },
                                f.scheduled,
                            ));
                            self.record(
                                view,
                                FiringRecord {
                                    id: text.to_string(),
                                    instruction: f.id.instruction.clone(),
                                    action: "noop",
                                    scheduled: f.scheduled,
                                    actual: f.scheduled.max(now),
                                    lateness_ns: now.as_nanos() - f.scheduled.as_nanos(),
                                    result: "ok".into(),
                                    value: None,
                                },
                            )?;
                        }
                        Action::Exec { program, args, env } => {
                            self.exec_pending.push(PendingExec {
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
                                },
                            });
                        }
                        action => {
                            let Some(op) = self.op_for(action) else {
                                results.push((
                                    f.id.clone(),
                                    AttemptResult::Failed(format!(
                                        "line of {} was not requested",
                                        action.name()
                                    )),
                                    now,
                                ));
                                continue;
                            };
                            let ticket = self.ticket(Ticket::Attempt {
                                id: f.id.clone(),
                                text: text.clone(),
                                scheduled: f.scheduled,
                                action: action.name(),
                            });
                            let live = self.live_flag(&f.id.pack);
                            self.submit(ticket, op, f.scheduled, f.not_after, text, Some(live))?;
                        }
                    }
                }
                Output::Abort(id) => {
                    // Exec attempts are killed by the pool at the same
                    // timeout; a GPIO action cannot hang. Nothing to do but
                    // forget the attempt so a late result is not reported.
                    self.exec_running.remove(&id.to_string());
                }
                Output::OnFailure {
                    pack,
                    instruction,
                    action,
                } => self.side_action(
                    &format!("{pack} {instruction} on_failure"),
                    &action,
                    now,
                    view,
                )?,
                Output::SafeState {
                    pack,
                    actions,
                    reason,
                } => {
                    // Nothing of this pack may fire after its safe state:
                    // withdraw what is already armed, before the safe-state
                    // writes are queued.
                    self.withdraw(&pack, now);
                    for a in actions.iter() {
                        self.side_action(
                            &format!("{pack} safe_state ({})", reason.as_str()),
                            a,
                            now,
                            view,
                        )?;
                    }
                    // A give-up or cancel is for good: the pack must not
                    // come back running after a restart. (Shutdown and lease
                    // loss are not: the pack resumes when the agent does.)
                    let stop = match reason {
                        SafeReason::GiveUp => Some(StopReason::GiveUp),
                        SafeReason::Cancel => Some(StopReason::Cancel),
                        _ => None,
                    };
                    if let Some(stop) = stop
                        && let Some((version, _)) = self.core.held(&pack)
                    {
                        self.journal
                            .stop_pack(&pack.tenant, &pack.pack, version, stop)
                            .context("journalling the stopped pack")?;
                    }
                }
                Output::Event(e) => self.feedback_event(&e, view)?,
            }
        }
        let mut out = std::mem::take(&mut self.out);
        for (id, r, at) in results {
            self.core.attempt_result(&id, r, at, &mut out);
        }
        if !out.is_empty() {
            return self.act(out, now, view);
        }
        self.out = out;
        Ok(())
    }

    fn submit(
        &mut self,
        ticket: u64,
        op: Op,
        scheduled: RefTime,
        not_after: RefTime,
        text: Arc<str>,
        live: Option<Arc<AtomicBool>>,
    ) -> anyhow::Result<()> {
        let width = match op {
            Op::Pulse { width_ns, .. } => width_ns,
            _ => 0,
        };
        let deadline = self.clock.to_mono(scheduled);
        self.linger.push_back((
            MonoTime(
                deadline
                    .0
                    .saturating_add(width)
                    .saturating_add(1_000_000_000),
            ),
            text.clone(),
        ));
        self.dispatcher
            .submit(Job {
                deadline,
                not_after: self.clock.to_mono(not_after),
                ticket,
                op,
                id: text,
                live,
            })
            .context("handing a job to the dispatcher")
    }

    /// The pack's "may still fire" flag for armed jobs.
    fn live_flag(&mut self, pack: &PackKey) -> Arc<AtomicBool> {
        self.live
            .entry(pack.clone())
            .or_insert_with(|| Arc::new(AtomicBool::new(true)))
            .clone()
    }

    /// The pack entered its safe state: armed GPIO jobs will not run (the
    /// dispatcher reports them withdrawn) and exec firings not yet started
    /// are dropped as not run. A later version gets a fresh flag.
    fn withdraw(&mut self, pack: &PackKey, now: RefTime) {
        if let Some(flag) = self.live.remove(pack) {
            flag.store(false, Ordering::Release);
        }
        let (gone, keep): (Vec<PendingExec>, Vec<PendingExec>) =
            std::mem::take(&mut self.exec_pending)
                .into_iter()
                .partition(|p| p.id.pack == *pack);
        self.exec_pending = keep;
        for p in gone {
            let _ = self.finish(&p.id, &AttemptResult::Late { actual: now });
            self.core.attempt_result(
                &p.id,
                AttemptResult::Late { actual: now },
                now,
                &mut self.out,
            );
        }
    }

    /// A safe-state or on_failure action: now, best effort, never retried.
    fn side_action(
        &mut self,
        what: &str,
        action: &Action,
        now: RefTime,
        view: &mut dyn View,
    ) -> anyhow::Result<()> {
        let text: Arc<str> = Arc::from(format!("{what}@{}", now.as_nanos()));
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
                };
                if let Err(e) = self.exec.submit(req) {
                    view.note(&format!("{what}: {e}"));
                }
            }
            Action::Noop => {}
            a => match self.op_for(a) {
                Some(op) => {
                    let ticket = self.ticket(Ticket::Side {
                        what: what.to_string(),
                        text: text.clone(),
                        scheduled: now,
                        action: a.name(),
                    });
                    self.submit(ticket, op, now, RefTime::MAX, text, None)?;
                }
                None => view.note(&format!("{what}: {} line was not requested", a.name())),
            },
        }
        Ok(())
    }

    fn feedback_event(&mut self, e: &Event, view: &mut dyn View) -> anyhow::Result<()> {
        if e.kind == EventKind::Fire {
            // The firing itself is reported when it has happened.
            return Ok(());
        }
        let mut rec = serde_json::json!({
            "t_ns": e.t.as_nanos(),
            "pack": e.pack.to_string(),
            "instruction": e.instruction,
            "event": e.kind.name(),
            "execution_id": e.id.as_ref().map(|i| i.to_string()),
        });
        if let EventKind::Skip { reason }
        | EventKind::GiveUp { reason }
        | EventKind::Fail { reason } = &e.kind
        {
            rec["detail"] = reason.clone().into();
        }
        self.journal
            .push_feedback(rec.to_string().as_bytes())
            .context("journalling feedback")?;
        if !matches!(e.kind, EventKind::Ok { .. }) {
            view.event(e);
        }
        Ok(())
    }

    fn record(&mut self, view: &mut dyn View, rec: FiringRecord) -> anyhow::Result<()> {
        // Only what touched the device counts towards lateness.
        if rec.result != "late" && !rec.result.starts_with("withdrawn") {
            let _ = self.hist.record(rec.lateness_ns.max(0) as u64);
        }
        let fb = serde_json::json!({
            "execution_id": rec.id,
            "instruction": rec.instruction,
            "event": "executed",
            "scheduled_ns": rec.scheduled.as_nanos(),
            "actual_ns": rec.actual.as_nanos(),
            "lateness_ns": rec.lateness_ns,
            "result": rec.result,
            "value": rec.value,
        });
        self.journal
            .push_feedback(fb.to_string().as_bytes())
            .context("journalling feedback")?;
        view.firing(&rec, &self.hist);
        Ok(())
    }

    /// Results from the dispatcher and the exec pool, into the core.
    fn collect(&mut self, view: &mut dyn View) -> anyhow::Result<()> {
        let mut out = std::mem::take(&mut self.out);
        while let Some(done) = self.dispatcher.try_done() {
            self.on_done(done, &mut out, view)?;
        }
        while let Ok(r) = self.exec_rx.try_recv() {
            let Some((id, scheduled)) = self.exec_running.remove(&r.execution_id) else {
                continue;
            };
            let now = self.clock.now();
            let (result, text) = match &r.outcome {
                ExecOutcome::Ok => (AttemptResult::Ok { value: None }, "ok".to_string()),
                ExecOutcome::Failed { code, stderr_tail } => {
                    let msg = format!(
                        "exit {}{}",
                        code.map_or("by signal".to_string(), |c| c.to_string()),
                        if stderr_tail.is_empty() {
                            String::new()
                        } else {
                            format!(": {}", stderr_tail.trim())
                        }
                    );
                    (AttemptResult::Failed(msg.clone()), format!("failed: {msg}"))
                }
                ExecOutcome::TimedOut => (
                    AttemptResult::Failed("timed out (killed)".into()),
                    "failed: timed out".into(),
                ),
                other => (
                    AttemptResult::Failed(format!("{other:?}")),
                    format!("failed: {other:?}"),
                ),
            };
            self.finish(&id, &result)?;
            let started = self.clock.to_ref(MonoTime(r.started_ns));
            self.record(
                view,
                FiringRecord {
                    id: id.to_string(),
                    instruction: id.instruction.clone(),
                    action: "exec",
                    scheduled,
                    actual: started,
                    lateness_ns: started.as_nanos() - scheduled.as_nanos(),
                    result: text,
                    value: None,
                },
            )?;
            self.core.attempt_result(&id, result, now, &mut out);
        }
        if out.is_empty() {
            self.out = out;
            Ok(())
        } else {
            let now = self.clock.now();
            self.act(out, now, view)
        }
    }

    fn finish(&mut self, id: &ExecutionId, result: &AttemptResult) -> anyhow::Result<()> {
        let outcome = match result {
            AttemptResult::Ok { .. } => Outcome::Succeeded,
            AttemptResult::Late { .. } => Outcome::NotRun,
            AttemptResult::Failed(_) => Outcome::Failed,
        };
        self.journal
            .record_finished(&id.to_string(), outcome)
            .context("journalling a result")
    }

    fn on_done(
        &mut self,
        done: Done,
        out: &mut Vec<Output>,
        view: &mut dyn View,
    ) -> anyhow::Result<()> {
        let Some(ticket) = self.tickets.remove(&done.ticket) else {
            if let JobOutcome::Failed(e) = &done.outcome {
                view.note(&format!("pulse end failed: {e}"));
            }
            return Ok(());
        };
        // Lateness on the dispatcher's own (monotonic) scale: immune to the
        // estimate moving between arming and firing.
        let lateness_ns = done.actual.0 - done.deadline.0;
        let actual_of = |scheduled: RefTime| {
            RefTime::from_nanos(scheduled.as_nanos().saturating_add(lateness_ns))
        };
        match ticket {
            Ticket::Attempt {
                id,
                text,
                scheduled,
                action,
            } => {
                let value = match done.outcome {
                    JobOutcome::Ok(v) => v,
                    _ => None,
                };
                let (result, label) = match done.outcome {
                    JobOutcome::Ok(v) => (
                        AttemptResult::Ok { value: v },
                        v.map_or("ok".to_string(), |v| format!("ok value={v}")),
                    ),
                    JobOutcome::Failed(e) => {
                        let m = e.to_string();
                        (AttemptResult::Failed(m.clone()), format!("failed: {m}"))
                    }
                    JobOutcome::Late => (
                        AttemptResult::Late {
                            actual: actual_of(scheduled),
                        },
                        "late".to_string(),
                    ),
                    JobOutcome::Withdrawn => (
                        AttemptResult::Late {
                            actual: actual_of(scheduled),
                        },
                        "withdrawn: the pack entered its safe state".to_string(),
                    ),
                };
                self.finish(&id, &result)?;
                self.record(
                    view,
                    FiringRecord {
                        id: text.to_string(),
                        instruction: id.instruction.clone(),
                        action,
                        scheduled,
                        actual: actual_of(scheduled),
                        lateness_ns,
                        result: label,
                        value,
                    },
                )?;
                self.core
                    .attempt_result(&id, result, actual_of(scheduled), out);
            }
            Ticket::Side {
                what,
                text,
                scheduled,
                action,
            } => {
                let label = match done.outcome {
                    JobOutcome::Ok(_) => "ok".to_string(),
                    JobOutcome::Failed(e) => format!("failed: {e}"),
                    JobOutcome::Late => "late".to_string(),
                    JobOutcome::Withdrawn => "withdrawn".to_string(),
                };
                self.record(
                    view,
                    FiringRecord {
                        id: text.to_string(),
                        instruction: what,
                        action,
                        scheduled,
                        actual: actual_of(scheduled),
                        lateness_ns,
                        result: label,
                        value: None,
                    },
                )?;
            }
        }
        Ok(())
    }

    fn submit_due_exec(&mut self, view: &mut dyn View) -> anyhow::Result<()> {
        let now = self.clock.now();
        let (due, later): (Vec<PendingExec>, Vec<PendingExec>) =
            std::mem::take(&mut self.exec_pending)
                .into_iter()
                .partition(|p| p.at <= now);
        self.exec_pending = later;
        let mut out = std::mem::take(&mut self.out);
        for p in due {
            let text = p.req.execution_id.clone();
            match self.exec.submit(p.req) {
                Ok(()) => {
                    self.exec_running.insert(text, (p.id, p.at));
                }
                Err(e) => {
                    let r = AttemptResult::Failed(e.to_string());
                    self.finish(&p.id, &r)?;
                    view.note(&format!("{}: {e}", p.id));
                    self.core.attempt_result(&p.id, r, now, &mut out);
                }
            }
        }
        if out.is_empty() {
            self.out = out;
            Ok(())
        } else {
            self.act(out, now, view)
        }
    }

    /// Safe state for every active pack, wait (bounded) for those writes,
    /// stop the threads, flush the journal.
    pub fn shutdown(&mut self, view: &mut dyn View) -> anyhow::Result<()> {
        let now = self.clock.now();
        let mut out = std::mem::take(&mut self.out);
        self.core.shutdown(now, &mut out);
        self.act(out, now, view)?;
        // Wait for the safe-state writes (and anything in flight) to land.
        let deadline = mono_now().0 + 2_000_000_000;
        while self
            .tickets
            .values()
            .any(|t| matches!(t, Ticket::Side { .. }))
            && mono_now().0 < deadline
        {
            self.collect(view)?;
            std::thread::park_timeout(Duration::from_millis(5));
        }
        self.dispatcher.stop();
        self.collect(view)?;
        let mut unfinished: BTreeMap<String, ()> = BTreeMap::new();
        for t in self.tickets.values() {
            if let Ticket::Attempt { text, .. } = t {
                unfinished.insert(text.to_string(), ());
            }
        }
        for id in unfinished.keys() {
            view.note(&format!("stopped before {id} ran: its start record stays (reported as outcome unknown after restart)"));
        }
        self.journal.sync().context("flushing the journal")?;
        view.note("safe state entered, journal flushed");
        Ok(())
    }

    /// Lateness histogram so far.
    pub fn histogram(&self) -> &Histogram<u64> {
        &self.hist
    }

    /// Dispatcher telemetry.
    pub fn dispatcher_stats(&self) -> &crate::dispatcher::Stats {
        self.dispatcher.stats()
    }

    /// Pending entries in the core.
    pub fn pending(&self) -> usize {
        self.core.pending()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prior_outcomes_never_read_a_missing_result_as_success() {
        let attempts: HashMap<String, Option<Outcome>> = [
            ("a", Some(Outcome::Succeeded)),
            ("b", Some(Outcome::Failed)),
            ("c", None),
            ("d", Some(Outcome::NotRun)),
        ]
        .into_iter()
        .map(|(id, o)| (id.to_string(), o))
        .collect();
        let p = prior_outcomes(&attempts);
        assert_eq!(p["a"], PriorOutcome::Succeeded);
        assert_eq!(p["b"], PriorOutcome::Failed);
        // Started, no result: unknown, never a success.
        assert_eq!(p["c"], PriorOutcome::Unknown);
        // Armed, never run: may fire again.
        assert_eq!(p["d"], PriorOutcome::NotRun);
    }
}
