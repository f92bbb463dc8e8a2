//! The systemd watchdog: whether it is on for this process, and when to
//! ping — only while the worker it vouches for makes progress.
//!
//! # Why a heartbeat and not "ping from the loop"
//!
//! A ping from the control loop proves the control loop runs. The agent's
//! device work is done by another thread (the dispatcher); if that thread
//! hangs inside a GPIO call, or spins without ever finishing a job, the
//! control loop goes on happily and would keep the service "alive". So the
//! worker keeps a [`Heartbeat`]: a counter it bumps on every completed job
//! and on every transition into and out of its idle wait, and a note of
//! whether it is waiting now (and until when). The ping decision
//! ([`alive`]) is then:
//!
//! - the counter moved since the last decision: it did something — alive;
//! - it is waiting now with no deadline (parked on its futex with nothing
//!   queued): idle legitimately — alive, however long that lasts;
//! - it is waiting now with a deadline not more than a grace past: alive
//!   (a wait overdue by more than that means the thread is not running);
//! - otherwise it has been busy since before the last decision without
//!   finishing anything or going idle: stuck in a call, or spinning without
//!   progress — withhold the ping, and systemd restarts the service once
//!   `WatchdogSec` passes.
//!
//! A thread woken from a long wait bumps the counter as it wakes, so one
//! that slept through a whole interval and is now busy for a moment is not
//! taken for stuck.
//!
//! What this does not see: a worker parked with no deadline that misses
//! its wake-up. The futex protocol rules that out (the word is changed
//! before the wake, and the wait refuses to sleep on a changed word), and
//! the jobs it would then never run come back as lateness in feedback.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

/// Why `WATCHDOG_USEC` / `WATCHDOG_PID` cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WatchdogEnvError {
    /// Not a positive, finite number of microseconds.
    #[error("WATCHDOG_USEC `{0}` is not a positive number of microseconds")]
    Usec(String),
    /// Not a process id.
    #[error("WATCHDOG_PID `{0}` is not a process id")]
    Pid(String),
}

/// The watchdog period the service manager expects from process `own_pid`,
/// as sd_watchdog_enabled(3) reads it: none when `WATCHDOG_USEC` is unset,
/// or when `WATCHDOG_PID` is set and names another process (the variables
/// were inherited, not meant for us).
pub fn period(
    usec: Option<&str>,
    pid: Option<&str>,
    own_pid: u32,
) -> Result<Option<Duration>, WatchdogEnvError> {
    let Some(usec) = usec else { return Ok(None) };
    let n: u64 = usec
        .trim()
        .parse()
        .map_err(|_| WatchdogEnvError::Usec(usec.to_string()))?;
    if n == 0 || n == u64::MAX {
        return Err(WatchdogEnvError::Usec(usec.to_string()));
    }
    if let Some(pid) = pid {
        let p: u32 = pid
            .trim()
            .parse()
            .map_err(|_| WatchdogEnvError::Pid(pid.to_string()))?;
        if p == 0 {
            return Err(WatchdogEnvError::Pid(pid.to_string()));
        }
        if p != own_pid {
            return Ok(None);
        }
    }
    Ok(Some(Duration::from_micros(n)))
}

/// [`period`] from this process's environment; an unusable value is
/// logged (warn: the unit asked for a watchdog it will not get) and means
/// no watchdog.
pub fn period_from_env() -> Option<Duration> {
    let usec = std::env::var("WATCHDOG_USEC").ok();
    let pid = std::env::var("WATCHDOG_PID").ok();
    period(usec.as_deref(), pid.as_deref(), std::process::id()).unwrap_or_else(|e| {
        tracing::warn!("systemd watchdog off: {e}");
        None
    })
}

/// `waiting_until` while the worker is not waiting.
const BUSY: i64 = i64::MIN;
/// `waiting_until` while it waits with no deadline.
const NO_DEADLINE: i64 = i64::MAX;

/// A worker's sign of life, shared with the thread that pings (lock-free:
/// the worker only does relaxed increments and stores).
#[derive(Debug)]
pub struct Heartbeat {
    beat: AtomicU64,
    waiting_until: AtomicI64,
}

impl Default for Heartbeat {
    fn default() -> Self {
        Heartbeat {
            beat: AtomicU64::new(0),
            waiting_until: AtomicI64::new(BUSY),
        }
    }
}

/// What the worker is doing, as seen by [`Heartbeat::pulse`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activity {
    /// Running (or stuck).
    Busy,
    /// Idle-waiting until this monotonic instant (ns), or with no deadline.
    Waiting(Option<i64>),
}

/// A snapshot of a [`Heartbeat`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pulse {
    /// The progress counter.
    pub beat: u64,
    /// What it is doing.
    pub activity: Activity,
}

impl Heartbeat {
    /// A job (or any unit of work) finished.
    pub fn progress(&self) {
        self.beat.fetch_add(1, Ordering::Relaxed);
    }

    /// About to wait idle until `until` (monotonic ns), or with no deadline.
    pub fn waiting(&self, until: Option<i64>) {
        self.waiting_until
            .store(until.unwrap_or(NO_DEADLINE), Ordering::Relaxed);
        self.beat.fetch_add(1, Ordering::Release);
    }

    /// Back from the wait.
    pub fn awake(&self) {
        self.waiting_until.store(BUSY, Ordering::Relaxed);
        self.beat.fetch_add(1, Ordering::Release);
    }

    /// What it looks like now.
    pub fn pulse(&self) -> Pulse {
        let beat = self.beat.load(Ordering::Acquire);
        let activity = match self.waiting_until.load(Ordering::Relaxed) {
            BUSY => Activity::Busy,
            NO_DEADLINE => Activity::Waiting(None),
            t => Activity::Waiting(Some(t)),
        };
        Pulse { beat, activity }
    }
}

/// Whether a worker whose counter was `last_beat` at the previous decision
/// is alive now (see the module docs for the rule and why).
pub fn alive(last_beat: Option<u64>, now: Pulse, now_ns: i64, grace_ns: i64) -> bool {
    if last_beat != Some(now.beat) {
        return true;
    }
    match now.activity {
        Activity::Waiting(None) => true,
        Activity::Waiting(Some(until)) => now_ns <= until.saturating_add(grace_ns),
        Activity::Busy => false,
    }
}

/// One watchdog decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub struct Decision {
    /// Send `WATCHDOG=1`.
    pub ping: bool,
    /// The verdict differs from the previous one (worth a log line and a
    /// `STATUS=`).
    pub changed: bool,
}

/// The ping schedule: every half period (as sd_watchdog_enabled(3)
/// advises), each ping subject to the worker's [`alive`] verdict. Sans IO:
/// times are monotonic ns passed in.
#[derive(Debug)]
pub struct Watchdog {
    interval_ns: i64,
    next_ns: i64,
    last_beat: Option<u64>,
    stalled: bool,
}

impl Watchdog {
    /// For a service-manager period of `period`; the first ping is due at
    /// `now_ns`.
    pub fn new(period: Duration, now_ns: i64) -> Watchdog {
        let interval_ns = i64::try_from(period.as_nanos() / 2)
            .unwrap_or(i64::MAX)
            .max(1);
        Watchdog {
            interval_ns,
            next_ns: now_ns,
            last_beat: None,
            stalled: false,
        }
    }

    /// The ping interval (half the period).
    pub fn interval(&self) -> Duration {
        Duration::from_nanos(self.interval_ns.unsigned_abs())
    }

    /// When the next decision is due (monotonic ns).
    pub fn next_due(&self) -> i64 {
        self.next_ns
    }

    /// Whether the worker was found stuck at the last decision.
    pub fn stalled(&self) -> bool {
        self.stalled
    }

    /// The decision at `now_ns`, if one is due. `worker`: the heartbeat of
    /// the thread the pings vouch for, if there is one (without, the caller
    /// alone is vouched for: it pings when it runs).
    pub fn poll(&mut self, now_ns: i64, worker: Option<Pulse>) -> Option<Decision> {
        if now_ns < self.next_ns {
            return None;
        }
        // From now, not from the missed due time: a late pass must not
        // cause a burst of pings.
        self.next_ns = now_ns.saturating_add(self.interval_ns);
        let ok = match worker {
            None => true,
            Some(p) => {
                let ok = alive(self.last_beat, p, now_ns, self.interval_ns);
                self.last_beat = Some(p.beat);
                ok
            }
        };
        let changed = ok == self.stalled;
        self.stalled = !ok;
        Some(Decision { ping: ok, changed })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: i64 = 1_000_000;

    #[test]
    fn environment_as_sd_watchdog_enabled_reads_it() {
        assert_eq!(period(None, None, 7), Ok(None));
        assert_eq!(
            period(Some("400000"), None, 7),
            Ok(Some(Duration::from_millis(400)))
        );
        assert_eq!(
            period(Some("400000"), Some("7"), 7),
            Ok(Some(Duration::from_millis(400)))
        );
        // Inherited from a parent the watchdog was meant for.
        assert_eq!(period(Some("400000"), Some("8"), 7), Ok(None));
        assert!(period(Some("0"), None, 7).is_err());
        assert!(period(Some("-5"), None, 7).is_err());
        assert!(period(Some("soon"), None, 7).is_err());
        assert!(period(Some("1000"), Some("x"), 7).is_err());
    }

    #[test]
    fn heartbeat_snapshots() {
        let h = Heartbeat::default();
        assert_eq!(h.pulse().activity, Activity::Busy);
        h.waiting(None);
        assert_eq!(h.pulse().activity, Activity::Waiting(None));
        h.awake();
        h.waiting(Some(5));
        assert_eq!(h.pulse().activity, Activity::Waiting(Some(5)));
        assert_eq!(h.pulse().beat, 3);
        h.progress();
        assert_eq!(h.pulse().beat, 4);
    }

    #[test]
    fn the_alive_rule() {
        let busy = |beat| Pulse {
            beat,
            activity: Activity::Busy,
        };
        // Moved: alive, whatever it does now.
        assert!(alive(Some(1), busy(2), 0, 0));
        // Busy since the last look without finishing anything: stuck.
        assert!(!alive(Some(2), busy(2), 0, 0));
        // Parked with nothing to do: alive for ever.
        let parked = Pulse {
            beat: 2,
            activity: Activity::Waiting(None),
        };
        assert!(alive(Some(2), parked, i64::MAX, 0));
        // A timed wait: alive until it is overdue by more than the grace.
        let timed = Pulse {
            beat: 2,
            activity: Activity::Waiting(Some(100 * MS)),
        };
        assert!(alive(Some(2), timed, 150 * MS, 50 * MS));
        assert!(!alive(Some(2), timed, 151 * MS, 50 * MS));
    }

    #[test]
    fn pings_every_half_period_while_the_worker_moves() {
        let h = Heartbeat::default();
        let mut w = Watchdog::new(Duration::from_millis(400), 0);
        assert_eq!(w.interval(), Duration::from_millis(200));
        let d = w.poll(0, Some(h.pulse())).expect("first is due at once");
        assert!(d.ping && !d.changed);
        assert_eq!(w.poll(199 * MS, Some(h.pulse())), None);
        h.progress();
        let d = w.poll(200 * MS, Some(h.pulse())).expect("due");
        assert!(d.ping);
        assert_eq!(w.next_due(), 400 * MS);
    }

    #[test]
    fn a_stuck_worker_stops_the_pings_and_an_idle_one_does_not() {
        let h = Heartbeat::default();
        let mut w = Watchdog::new(Duration::from_millis(400), 0);
        assert!(w.poll(0, Some(h.pulse())).is_some_and(|d| d.ping));
        // Idle, parked: pings go on.
        h.waiting(None);
        for i in 1..5 {
            let d = w.poll(i * 200 * MS, Some(h.pulse())).expect("due");
            assert!(d.ping, "idle at {i}");
        }
        // Wakes for a job and hangs in it (say a GPIO call).
        h.awake();
        let d = w.poll(1000 * MS, Some(h.pulse())).expect("due");
        assert!(d.ping, "it woke since the last look: progress");
        let d = w.poll(1200 * MS, Some(h.pulse())).expect("due");
        assert!(!d.ping && d.changed && w.stalled());
        let d = w.poll(1400 * MS, Some(h.pulse())).expect("due");
        assert!(!d.ping && !d.changed);
        // It comes back.
        h.progress();
        let d = w.poll(1600 * MS, Some(h.pulse())).expect("due");
        assert!(d.ping && d.changed && !w.stalled());
    }

    #[test]
    fn without_a_worker_the_caller_alone_is_vouched_for() {
        let mut w = Watchdog::new(Duration::from_secs(10), 0);
        assert!(w.poll(0, None).is_some_and(|d| d.ping));
        // A late pass pings once, then the schedule runs from there.
        assert!(w.poll(60 * 1000 * MS, None).is_some_and(|d| d.ping));
        assert_eq!(w.poll(60 * 1000 * MS + 1, None), None);
    }
}
