//! What the runtime does with the clock's quality: the admission limit, the
//! packs' `on_clock_loss` policy when sync is lost past it (the verdict is
//! `baton_control::clock_watch`'s), and the description messages and
//! reports use.

use baton_clock::estimator::{ClockState, Estimate};
use baton_clock::sample::SourceKind;
use baton_control::clock_watch::Change;
use baton_sched::PackKey;

use super::agent::Agent;
use super::error::{AcceptError, RuntimeError};

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

impl Agent {
    /// The admission limit, ns.
    pub(super) fn clock_limit_ns(&self) -> i64 {
        i64::try_from(self.cfg.clock.limit.as_nanos()).unwrap_or(i64::MAX)
    }

    /// Local packs that waited for the clock: taken once it is known.
    pub(super) fn retry_clock_wait(&mut self) -> Result<(), RuntimeError> {
        if self.plane.clock_watch.nothing_waits()
            || self.clock.uncertainty_ns() > self.clock_limit_ns()
        {
            return Ok(());
        }
        for (name, yaml) in self.plane.clock_watch.take_waiting() {
            let pack = baton_proto::parse_pack(&yaml)
                .map_err(|e| RuntimeError::PackFile(e.render(&name)))?;
            let key = PackKey::of(&pack);
            match self.accept(yaml.clone(), pack) {
                Ok(_) => tracing::info!(pack = %key, file = %name, "clock known: pack taken"),
                Err(AcceptError::Clock { .. }) => self.plane.clock_watch.wait(name, yaml),
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

    /// Whether this agent has clock sources that take a moment to lock
    /// (the start's grace is for them).
    fn clock_sources_to_lock(&self) -> bool {
        let c = &self.cfg.clock;
        c.ptp.is_some() || !c.ntp_servers.is_empty() || (c.link && !self.cfg.controllers.is_empty())
    }

    /// Sync lost past the limit: packs that need absolute time and asked
    /// for it (`on_clock_loss: safe_state`) enter their safe state, for
    /// good (until a higher version). `continue` packs keep firing; their
    /// feedback carries the uncertainty of each firing.
    pub(super) fn check_clock_loss(&mut self) -> Result<(), RuntimeError> {
        let uncertainty = self.clock.uncertainty_ns();
        let limit = self.clock_limit_ns();
        let sources = self.clock_sources_to_lock();
        let checked = self
            .plane
            .clock_watch
            .check(self.mono_now(), uncertainty, limit, sources);
        match checked.change {
            Some(Change::Lost { was_good }) => {
                let what = if was_good {
                    "clock sync lost"
                } else {
                    "clock not synchronised"
                };
                tracing::warn!(
                    "{what}: uncertainty {} exceeds the limit {} ({}); packs that need absolute time are refused, running ones with on_clock_loss: safe_state stop, others continue with each firing's uncertainty in its feedback",
                    baton_proto::time::fmt_ns(uncertainty),
                    baton_proto::time::fmt_ns(limit),
                    describe(self.clock.status())
                );
            }
            Some(Change::Back) => tracing::info!(
                "clock back within the limit: uncertainty {}",
                baton_proto::time::fmt_ns(uncertainty)
            ),
            None => {}
        }
        if !checked.stop_packs {
            return Ok(());
        }
        let stop = self.plane.held.stop_on_clock_loss(|k| self.running(k));
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
