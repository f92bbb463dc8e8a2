//! What the runtime does with the clock's quality: the admission limit, the
//! packs' `on_clock_loss` policy when sync is lost past it, and the
//! description messages and reports use.

use baton_proto::pack::ClockLoss;
use baton_sched::PackKey;

use super::{AcceptError, Agent, RuntimeError};
use baton_clock::MonoTime;

/// How long configured clock sources get to lock after a start before a
/// clock still past the limit counts as lost (NTP locks in ~10 s, PTP and
/// the link in a few).
pub const CLOCK_START_GRACE: std::time::Duration = std::time::Duration::from_secs(30);
use baton_clock::estimator::{ClockState, Estimate};
use baton_clock::sample::SourceKind;

/// "system clock, free-running": which source, in which state.
pub fn describe(status: Option<Estimate>) -> String {
    match status {
        None => "reference time by construction".into(),
        Some(e) => {
            let source = match e.source {
                SourceKind::Ptp => "PTP",
                SourceKind::Ntp => "NTP",
                SourceKind::Link => "time exchange with the controller",
                SourceKind::System => "system clock",
            };
            let hint = match (e.source, e.state) {
                (SourceKind::System, ClockState::FreeRunning) => {
                    ": nothing synchronises it; configure clock.ptp, clock.ntp-servers or a controller, or clock.system: reference"
                }
                _ => "",
            };
            format!("{source}, {}{hint}", e.state.name())
        }
    }
}

/// What the loop knows of the clock's health over this run, and the
/// local packs waiting for it.
#[derive(Debug)]
pub(super) struct ClockWatch {
    /// The clock's uncertainty was past the limit at the last check.
    lost: bool,
    /// It has been within the limit at some check of this run.
    was_good: bool,
    /// When this run started (the clock sources' grace runs from here).
    started: MonoTime,
    /// Local packs (file name, text) waiting for the clock to be known.
    waiting: Vec<(String, String)>,
}

impl ClockWatch {
    /// A run started at `started`: nothing known of the clock yet.
    pub(super) fn new(started: MonoTime) -> Self {
        ClockWatch {
            lost: false,
            was_good: false,
            started,
            waiting: Vec::new(),
        }
    }

    /// A local pack (`file`, its text) waits for the clock.
    pub(super) fn wait(&mut self, file: String, yaml: String) {
        self.waiting.push((file, yaml));
    }

    /// Whether no pack waits for the clock.
    pub(super) fn nothing_waits(&self) -> bool {
        self.waiting.is_empty()
    }

    /// The waiting packs, to try again (those still waiting come back
    /// through [`ClockWatch::wait`]).
    fn take_waiting(&mut self) -> Vec<(String, String)> {
        std::mem::take(&mut self.waiting)
    }

    /// This check's verdict; when it changed, whether the clock had been
    /// good before in this run (for the log line).
    fn note(&mut self, lost: bool) -> Option<bool> {
        let changed = (lost != self.lost).then_some(self.was_good);
        self.lost = lost;
        if !lost {
            self.was_good = true;
        }
        changed
    }
}

impl Agent {
    /// The admission limit, ns.
    pub(super) fn clock_limit_ns(&self) -> i64 {
        i64::try_from(self.cfg.clock.limit.as_nanos()).unwrap_or(i64::MAX)
    }

    /// Local packs that waited for the clock: taken once it is known.
    pub(super) fn retry_clock_wait(&mut self) -> Result<(), RuntimeError> {
        if self.clock_watch.nothing_waits() || self.clock.uncertainty_ns() > self.clock_limit_ns() {
            return Ok(());
        }
        for (name, yaml) in self.clock_watch.take_waiting() {
            let pack = baton_proto::parse_pack(&yaml)
                .map_err(|e| RuntimeError::PackFile(e.render(&name)))?;
            let key = PackKey::of(&pack);
            match self.accept(yaml.clone(), pack) {
                Ok(_) => tracing::info!(pack = %key, file = %name, "clock known: pack taken"),
                Err(AcceptError::Clock { .. }) => self.clock_watch.wait(name, yaml),
                Err(error) if error.is_fault() => {
                    return Err(RuntimeError::ClockWaitFault {
                        file: name,
                        error: Box::new(error),
                    });
                }
                // Refused for another reason now (a cron whose last firing
                // passed while waiting, say): said once, not fatal.
                Err(e) => tracing::error!(pack = %key, file = %name, "refused: {e:#}"),
            }
        }
        Ok(())
    }

    /// Whether this run is still within the grace its configured sources
    /// get to lock at start ([`CLOCK_START_GRACE`]).
    fn clock_grace_left(&self) -> bool {
        let c = &self.cfg.clock;
        let waiting_for_source = c.ptp.is_some()
            || !c.ntp_servers.is_empty()
            || (c.link && !self.cfg.controllers.is_empty());
        waiting_for_source && self.mono_now().since(self.clock_watch.started) < CLOCK_START_GRACE
    }

    /// Sync lost past the limit: packs that need absolute time and asked
    /// for it (`on_clock_loss: safe_state`) enter their safe state, for
    /// good (until a higher version). `continue` packs keep firing; their
    /// feedback carries the uncertainty of each firing.
    pub(super) fn check_clock_loss(&mut self) -> Result<(), RuntimeError> {
        let uncertainty = self.clock.uncertainty_ns();
        let limit = self.clock_limit_ns();
        let lost = uncertainty > limit;
        if let Some(was_good) = self.clock_watch.note(lost) {
            let what = if was_good {
                "clock sync lost"
            } else {
                "clock not synchronised"
            };
            if lost {
                tracing::warn!(
                    "{what}: uncertainty {} exceeds the limit {} ({}); packs that need absolute time are refused, running ones with on_clock_loss: safe_state stop, others continue with each firing's uncertainty in its feedback",
                    baton_proto::time::fmt_ns(uncertainty),
                    baton_proto::time::fmt_ns(limit),
                    describe(self.clock.status())
                );
            } else {
                tracing::info!(
                    "clock back within the limit: uncertainty {}",
                    baton_proto::time::fmt_ns(uncertainty)
                );
            }
        }
        if !lost {
            return Ok(());
        }
        // Just started with sources that need a moment to lock (NTP's
        // first polls, PTP's first syncs, the link's exchange): not a loss
        // yet. Without this grace a restart would stop, for good, every
        // `safe_state` pack before its clock had a chance.
        if !self.clock_watch.was_good && self.clock_grace_left() {
            return Ok(());
        }
        let stop: Vec<PackKey> = self
            .held
            .iter()
            .filter(|(_, h)| h.clock_loss == Some(ClockLoss::SafeState))
            .map(|(k, _)| k.clone())
            .filter(|k| self.core.held(k).is_some_and(|(_, active)| active))
            .collect();
        for key in stop {
            let mut out = Vec::new();
            if self
                .core
                .clock_lost_pack(&key, self.clock.now())
                .drain_into(&mut out)
            {
                tracing::warn!(
                    pack = %key,
                    "clock sync lost (on_clock_loss: safe_state): safe state driven; a higher version brings the pack back"
                );
                self.process(out)?;
            }
        }
        Ok(())
    }
}
