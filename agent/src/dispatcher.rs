//! The dispatcher: one thread that drives GPIO at exact instants.
//!
//! It sleeps on a futex with an absolute `CLOCK_MONOTONIC` deadline until a
//! margin before the next job, then spins to the deadline. The margin adapts
//! to the wake-up latency it observes, so spinning stays short. An earlier
//! job arriving wakes it at once (futex wake — no polling).
//!
//! After start-up nothing here allocates or blocks on IO: jobs arrive and
//! results leave through pre-allocated lock-free queues, the local heap is
//! pre-sized, and execution ids are shared `Arc<str>` whose last reference
//! stays with the control thread (so no deallocation happens here either).
//! The one exception is the sim backend, whose log write is a syscall.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{JoinHandle, Thread};

use crossbeam_queue::ArrayQueue;

use crate::clock::{ClockEstimate, MonoTime, mono_now};
use crate::gpio::{Gpio, GpioError, LineHandle};
use crate::rt::{RtConfig, RtStatus, futex_wait, futex_wake};

/// What to do to a line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Drive to a level.
    Write(LineHandle, u8),
    /// Invert.
    Toggle(LineHandle),
    /// Drive to `value` for `width_ns`, then back (the end is its own
    /// timed job, never a sleep).
    Pulse {
        /// The line.
        line: LineHandle,
        /// Level during the pulse.
        value: u8,
        /// Length.
        width_ns: i64,
    },
    /// Sample.
    Read(LineHandle),
}

/// One timed action.
#[derive(Clone, Debug)]
pub struct Job {
    /// When (monotonic).
    pub deadline: MonoTime,
    /// If it cannot run by then, it must not run at all.
    pub not_after: MonoTime,
    /// The control thread's handle for the result.
    pub ticket: u64,
    /// What.
    pub op: Op,
    /// Execution id (for the sim log and messages).
    pub id: Arc<str>,
    /// The pack's "may still fire" flag: cleared by the control thread when
    /// the pack enters its safe state, so a job armed before that never runs
    /// after it. `None` for safe-state and on_failure actions themselves.
    pub live: Option<Arc<AtomicBool>>,
}

/// How a job ended.
#[derive(Debug)]
pub enum JobOutcome {
    /// Done; `Some(level)` for reads.
    Ok(Option<u8>),
    /// The backend refused or failed.
    Failed(GpioError),
    /// Reached after `not_after`: not run.
    Late,
    /// Its pack entered its safe state before it was due: not run.
    Withdrawn,
}

/// A finished job.
#[derive(Debug)]
pub struct Done {
    /// From the job.
    pub ticket: u64,
    /// When it was due.
    pub deadline: MonoTime,
    /// When the line changed (or the job was given up).
    pub actual: MonoTime,
    /// Result.
    pub outcome: JobOutcome,
}

/// Counters the dispatcher keeps for telemetry.
#[derive(Debug, Default)]
pub struct Stats {
    /// Nanoseconds spent spinning before deadlines.
    pub spin_ns: AtomicU64,
    /// Jobs run.
    pub jobs: AtomicU64,
    /// Current sleep margin, ns.
    pub margin_ns: AtomicU64,
    /// Jobs that reached this thread already past their deadline: lateness
    /// caused upstream (arming), not by the dispatcher.
    pub arrived_late: AtomicU64,
}

/// Queue sizes: the most jobs in flight between the threads. A full inbox
/// makes `submit` fail loudly instead of allocating.
pub const QUEUE_CAPACITY: usize = 1024;

struct Shared {
    inbox: ArrayQueue<Job>,
    done: ArrayQueue<Done>,
    word: AtomicU32,
    stop: AtomicBool,
    stats: Stats,
}

/// Handle to the running dispatcher thread.
#[derive(Debug)]
pub struct Dispatcher {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    rt: RtStatus,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("inbox", &self.inbox.len())
            .finish()
    }
}

/// Why a job could not be handed over.
#[derive(Debug, thiserror::Error)]
#[error("dispatcher queue full ({QUEUE_CAPACITY} jobs in flight): the job for {0} was not queued")]
pub struct QueueFull(pub Arc<str>);

impl Dispatcher {
    /// Start the thread. `gpio` is shared with the control thread, which
    /// requests lines at pack acceptance; the dispatcher locks it only to
    /// act (uncontended in steady state). `notify` is unparked whenever a
    /// result is ready.
    pub fn start(
        gpio: Arc<Mutex<Box<dyn Gpio>>>,
        clock: Arc<ClockEstimate>,
        rt: RtConfig,
        notify: Thread,
    ) -> std::io::Result<Dispatcher> {
        let shared = Arc::new(Shared {
            inbox: ArrayQueue::new(QUEUE_CAPACITY),
            done: ArrayQueue::new(QUEUE_CAPACITY),
            word: AtomicU32::new(0),
            stop: AtomicBool::new(false),
            stats: Stats::default(),
        });
        let (tx, rx) = std::sync::mpsc::channel();
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("baton-dispatch".into())
            // Small and fixed: with mlockall every stack page is resident.
            .stack_size(256 * 1024)
            .spawn(move || {
                let status = crate::rt::apply_to_current_thread(&rt);
                crate::rt::prefault_stack(64 * 1024);
                let _ = tx.send(status);
                run(&s, &gpio, &clock, &notify);
            })?;
        let rt = rx.recv().unwrap_or_default();
        Ok(Dispatcher {
            shared,
            thread: Some(thread),
            rt,
        })
    }

    /// What real-time set-up was granted.
    pub fn rt_status(&self) -> &RtStatus {
        &self.rt
    }

    /// Hand a job over; wakes the thread if it is sleeping.
    pub fn submit(&self, job: Job) -> Result<(), QueueFull> {
        self.shared.inbox.push(job).map_err(|j| QueueFull(j.id))?;
        self.shared.word.fetch_add(1, Ordering::Release);
        futex_wake(&self.shared.word);
        Ok(())
    }

    /// Next finished job, if any.
    pub fn try_done(&self) -> Option<Done> {
        self.shared.done.pop()
    }

    /// Telemetry counters.
    pub fn stats(&self) -> &Stats {
        &self.shared.stats
    }

    /// Jobs queued and not yet taken by the thread.
    pub fn inbox_len(&self) -> usize {
        self.shared.inbox.len()
    }

    /// Stop: jobs already due run, pending pulse ends run at once (no line
    /// is left mid-pulse), other future jobs are reported `Late` (not run).
    pub fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.word.fetch_add(1, Ordering::Release);
        futex_wake(&self.shared.word);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Dispatcher {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Heap entry: min-order by (deadline, arrival sequence).
struct Queued {
    key: Reverse<(i64, u64)>,
    job: Job,
    /// A pulse end: ignores `not_after` and runs even on stop.
    pulse_end: bool,
}

impl PartialEq for Queued {
    fn eq(&self, o: &Self) -> bool {
        self.key == o.key
    }
}
impl Eq for Queued {}
impl PartialOrd for Queued {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Queued {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.key.cmp(&o.key)
    }
}

const MIN_MARGIN_NS: i64 = 20_000;
const MAX_MARGIN_NS: i64 = 500_000;
/// One wake-up that came very late (a hypervisor hiccup) must not make the
/// thread spin for milliseconds afterwards: samples are capped here.
const MAX_SAMPLE_NS: i64 = 250_000;

fn run(s: &Shared, gpio: &Mutex<Box<dyn Gpio>>, clock: &ClockEstimate, notify: &Thread) {
    let mut heap: BinaryHeap<Queued> = BinaryHeap::with_capacity(QUEUE_CAPACITY * 2);
    let mut seq: u64 = 0;
    // Margin: start generous, then cover the worst of the recent wake-up
    // overshoots (a window of the last 32, each capped), plus a floor. A
    // quantile rather than a mean: the mean would leave every slower than
    // average wake-up late.
    let mut margin: i64 = 200_000;
    let mut recent = [MIN_MARGIN_NS; 32];
    let mut next_sample = 0usize;
    loop {
        let seen = s.word.load(Ordering::Acquire);
        while let Some(job) = s.inbox.pop() {
            if job.deadline.0 < mono_now().0 {
                s.stats.arrived_late.fetch_add(1, Ordering::Relaxed);
            }
            seq += 1;
            heap.push(Queued {
                key: Reverse((job.deadline.0, seq)),
                job,
                pulse_end: false,
            });
        }
        let stopping = s.stop.load(Ordering::Acquire);
        let now = mono_now();
        let Some(top) = heap.peek() else {
            if stopping {
                return;
            }
            futex_wait(&s.word, seen, None);
            continue;
        };
        let deadline = top.job.deadline.0;
        if stopping {
            // Run what is due and every pulse end; the rest is not run.
            let q = heap.pop().expect("peeked");
            if q.pulse_end || deadline <= now.0 {
                execute(s, gpio, clock, notify, &mut heap, &mut seq, q, now);
            } else {
                push_done(
                    s,
                    notify,
                    Done {
                        ticket: q.job.ticket,
                        deadline: q.job.deadline,
                        actual: now,
                        outcome: JobOutcome::Late,
                    },
                );
            }
            continue;
        }
        if deadline - now.0 > margin {
            let wake_at = deadline - margin;
            futex_wait(&s.word, seen, Some(wake_at));
            let woke = mono_now().0;
            if woke >= wake_at && s.word.load(Ordering::Acquire) == seen {
                // Timed wake: learn the latency.
                recent[next_sample] = (woke - wake_at).min(MAX_SAMPLE_NS);
                next_sample = (next_sample + 1) % recent.len();
                let worst = recent.iter().copied().max().unwrap_or(MIN_MARGIN_NS);
                margin = (worst + MIN_MARGIN_NS / 2).clamp(MIN_MARGIN_NS, MAX_MARGIN_NS);
                s.stats.margin_ns.store(margin as u64, Ordering::Relaxed);
            }
            continue;
        }
        // Spin to the deadline, still watching for an earlier job.
        let spin_start = now.0;
        let mut t = now.0;
        while t < deadline {
            if s.word.load(Ordering::Acquire) != seen {
                break;
            }
            std::hint::spin_loop();
            t = mono_now().0;
        }
        s.stats
            .spin_ns
            .fetch_add((t - spin_start).max(0) as u64, Ordering::Relaxed);
        if t < deadline {
            continue; // an earlier job may have arrived
        }
        let q = heap.pop().expect("peeked");
        execute(s, gpio, clock, notify, &mut heap, &mut seq, q, MonoTime(t));
    }
}

fn push_done(s: &Shared, notify: &Thread, mut d: Done) {
    // Never drop a result: if the control thread is behind, wait for room.
    loop {
        match s.done.push(d) {
            Ok(()) => break,
            Err(back) => {
                d = back;
                notify.unpark();
                std::thread::yield_now();
            }
        }
    }
    notify.unpark();
}

#[allow(clippy::too_many_arguments)]
fn execute(
    s: &Shared,
    gpio: &Mutex<Box<dyn Gpio>>,
    clock: &ClockEstimate,
    notify: &Thread,
    heap: &mut BinaryHeap<Queued>,
    seq: &mut u64,
    q: Queued,
    now: MonoTime,
) {
    let job = q.job;
    // Not run at all: its pack is in its safe state, or it is past the
    // instant after which it must not run. (A started pulse always ends.)
    let not_run = if q.pulse_end {
        None
    } else if job
        .live
        .as_ref()
        .is_some_and(|l| !l.load(Ordering::Acquire))
    {
        Some(JobOutcome::Withdrawn)
    } else if now > job.not_after {
        Some(JobOutcome::Late)
    } else {
        None
    };
    if let Some(outcome) = not_run {
        push_done(
            s,
            notify,
            Done {
                ticket: job.ticket,
                deadline: job.deadline,
                actual: now,
                outcome,
            },
        );
        return;
    }
    let t_ref = clock.to_ref(now).as_nanos();
    let mut g = match gpio.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    };
    let outcome = match job.op {
        Op::Write(h, v) => g.write(h, v, t_ref, &job.id).map(|()| None),
        Op::Toggle(h) => {
            let v = 1 - g.level(h).unwrap_or(0).min(1);
            g.write(h, v, t_ref, &job.id).map(|()| None)
        }
        Op::Read(h) => g.read(h).map(Some),
        Op::Pulse {
            line,
            value,
            width_ns,
        } => {
            let r = g.write(line, value, t_ref, &job.id);
            if r.is_ok() {
                *seq += 1;
                let end = job.deadline.0.saturating_add(width_ns);
                heap.push(Queued {
                    key: Reverse((end, *seq)),
                    job: Job {
                        deadline: MonoTime(end),
                        not_after: MonoTime(i64::MAX),
                        ticket: 0,
                        op: Op::Write(line, 1 - value.min(1)),
                        id: job.id.clone(),
                        // A started pulse always ends, safe state or not.
                        live: None,
                    },
                    pulse_end: true,
                });
            }
            r.map(|()| None)
        }
    };
    drop(g);
    let actual = mono_now();
    s.stats.jobs.fetch_add(1, Ordering::Relaxed);
    if q.pulse_end {
        // A pulse end has no ticket of its own; a failure is still reported
        // (ticket 0) so the agent logs it.
        if let Err(e) = outcome {
            push_done(
                s,
                notify,
                Done {
                    ticket: 0,
                    deadline: job.deadline,
                    actual,
                    outcome: JobOutcome::Failed(e),
                },
            );
        }
        return;
    }
    push_done(
        s,
        notify,
        Done {
            ticket: job.ticket,
            deadline: job.deadline,
            // The line changed at `now` (the write is a syscall or two after).
            actual: now,
            outcome: match outcome {
                Ok(v) => JobOutcome::Ok(v),
                Err(e) => JobOutcome::Failed(e),
            },
        },
    );
}
