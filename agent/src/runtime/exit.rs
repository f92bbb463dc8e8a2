//! The one way out of the control loop (see the module docs of `runtime`).

use std::sync::Arc;
use std::time::Duration;

use baton_journal::Recovered;
use baton_proto::RefTime;
use baton_proto::pack::{Action, parse_pack};
use baton_sched::{AttemptResult, Event, Output, PackKey, SafeReason};

use super::admit::open_and_resolve;
use super::agent::{Agent, DEVICE_STOP_WAIT, SAFE_STATE_WAIT, STALL_GRACE, journal_result};
use super::arming::Ticket;
use super::error::RuntimeError;
use super::record::Origin;
use super::safety;
use crate::dispatcher::Done;

impl Agent {
    /// The way out. Never fails and never returns early: every held pack's
    /// safe state reaches the device (first through the core, for its
    /// events; then, for any pack the core did not cover, from what
    /// admission kept), the writes are awaited (bounded), the dispatcher
    /// is stopped (bounded), the journal is flushed if it still can be, and
    /// the controller link's thread is stopped (bounded).
    pub fn wind_down(&mut self) {
        self.systemd_stopping();
        self.wind_down_quietly();
    }

    /// The way out before this process becomes agent `version` (the same
    /// PID): systemd is told a status and pinged, not told it stops (it
    /// would then kill the new version at its stop timeout); the new
    /// version says READY and pings on.
    pub(super) fn wind_down_to_restart(&mut self, version: &str) {
        self.systemd_restarting(version);
        self.wind_down_quietly();
    }

    fn wind_down_quietly(&mut self) {
        let now = self.clock.now();
        let events = self.drive_all_safe_states(now);
        if !self.await_safe_writes() {
            // Fenced first: whatever the dispatcher still holds (a pulse
            // end, an on_failure write) can no longer land after the
            // direct writes below.
            self.ports.device.fence();
            self.drive_safe_states_directly();
        }
        self.journal_unsent(now);
        if !self.ports.device.stop(DEVICE_STOP_WAIT) {
            tracing::error!("the dispatcher thread did not stop within {DEVICE_STOP_WAIT:?}");
        }
        while let Some(done) = self.ports.device.try_done() {
            self.wind_down_done(done);
        }
        self.close_journal(events);
        // Last and bounded (1 s): the device is safe and the journal
        // flushed whatever the link does; unsent feedback stays in the
        // outbox for the next run.
        self.stop_uplink();
    }

    /// Every held pack's safe state to the device: the core's shutdown
    /// first (its events are returned, journalled last), then any held pack
    /// the core did not cover (say, one it stopped while the loop failed).
    fn drive_all_safe_states(&mut self, now: RefTime) -> Vec<Event> {
        let mut out = Vec::new();
        self.core.shutdown(now).drain_into(&mut out);
        let mut events = Vec::new();
        for o in out {
            match o {
                Output::SafeState { pack, actions, .. } => {
                    self.drive_safe_state(&pack, &actions, now);
                }
                Output::Event(e) => events.push(e),
                _ => {}
            }
        }
        let rest: Vec<(PackKey, Arc<Vec<Action>>)> = self
            .plane
            .held
            .iter()
            .filter(|(k, _)| !self.safe.is_driven(k))
            .map(|(k, h)| (k.clone(), h.safe_state.clone()))
            .collect();
        for (k, actions) in rest {
            self.drive_safe_state(&k, &actions, now);
        }
        events
    }

    /// Wait (bounded) for the safe-state writes to land; whether they all
    /// did. Gives up early on a dispatcher that is stuck: busy with no
    /// progress for [`STALL_GRACE`] (starved of CPU by a higher real-time
    /// priority, say, or hung in the injected test stall).
    fn await_safe_writes(&mut self) -> bool {
        let start = baton_clock::mono_now().as_nanos();
        let end = start + SAFE_STATE_WAIT.as_nanos() as i64;
        let grace = STALL_GRACE.as_nanos() as i64;
        let mut last: Option<(u64, i64)> = None;
        while self.firing.arming.side_in_flight() && baton_clock::mono_now().as_nanos() < end {
            if let Err(e) = self.firing.arming.pump(self.ports.device.as_mut()) {
                tracing::error!("safe state: {e}");
                break;
            }
            while let Some(done) = self.ports.device.try_done() {
                self.wind_down_done(done);
            }
            if let Some(stats) = self.ports.device.stats() {
                let pulse = stats.heartbeat.pulse();
                let now = baton_clock::mono_now().as_nanos();
                match last {
                    Some((beat, since)) if beat == pulse.beat => {
                        if now - since > grace
                            && !baton_service::watchdog::alive(Some(beat), pulse, now, grace)
                        {
                            tracing::error!(
                                "the dispatcher thread has made no progress for {STALL_GRACE:?}: its safe-state writes cannot land"
                            );
                            break;
                        }
                    }
                    _ => last = Some((pulse.beat, now)),
                }
            }
            std::thread::park_timeout(Duration::from_millis(1));
        }
        if self.firing.arming.side_in_flight() {
            tracing::error!("safe-state writes did not all land within {SAFE_STATE_WAIT:?}");
            return false;
        }
        true
    }

    /// The last resort of the way out, as the panic hook does: the
    /// safe-state levels of every held pack written directly (`safety`),
    /// bypassing the dispatcher (fenced by then), whose writes did not
    /// land. The stop is then a fault (exit non-zero), whatever asked for
    /// it. If the direct writes do not complete either, the chip itself is
    /// hung: the marker is left and the agent exits with
    /// [`safety::EXIT_GPIO_HUNG`].
    fn drive_safe_states_directly(&mut self) {
        let Some(driver) = self.safe.driver() else {
            return;
        };
        let quiet = self.ports.device.quiet_within(safety::QUIET_WAIT);
        let label = "stuck-dispatcher-safe-state";
        match safety::last_resort(quiet, &driver, label, &self.cfg.data_dir) {
            safety::Driven::Done { ok, failed } => {
                tracing::error!(
                    writes = ok,
                    failures = ?failed,
                    "safe state driven directly (the dispatcher's writes did not land)"
                );
                self.safe.degraded(if failed.is_empty() {
                    "the dispatcher's safe-state writes did not land: the safe state was written directly"
                        .to_string()
                } else {
                    format!(
                        "the dispatcher's safe-state writes did not land and direct ones failed: {}",
                        failed.join("; ")
                    )
                });
            }
            safety::Driven::Hung => {
                tracing::error!(
                    "the GPIO chip is hung: neither the dispatcher's nor the direct safe-state writes completed (within {:?}); exiting {} so that the service restarts, and the next start drives every journalled pack's safe state first",
                    safety::DIRECT_WAIT,
                    safety::EXIT_GPIO_HUNG
                );
                self.safe.hung(
                    "the dispatcher's safe-state writes did not land, and the direct ones did not complete".into(),
                );
            }
        }
    }

    /// The previous run could not reach the lines (the chip was hung; it
    /// left the marker): before anything is restored and armed, every
    /// journalled pack's safe-state writes are driven and awaited. If they
    /// do not land, the chip is still hung: the start fails with
    /// [`safety::GpioHung`] (exit [`safety::EXIT_GPIO_HUNG`]; the marker
    /// stays).
    pub(super) fn drive_owed_safe_states(&mut self, rec: &Recovered) -> Result<(), RuntimeError> {
        tracing::warn!(
            "the previous run could not write the safe state (the GPIO chip was hung): driving every journalled pack's safe state before anything else"
        );
        let now = self.clock.now();
        for sp in &rec.packs {
            let Ok(pack) = parse_pack(&sp.yaml) else {
                continue;
            };
            let key = PackKey::of(&pack);
            if let Err(e) =
                open_and_resolve(&mut self.plane.admission, &pack, self.ports.device.as_mut())
            {
                tracing::error!(pack = %key, "owed safe state: {e}");
                return Err(RuntimeError::gpio_hung(e.to_string()));
            }
            for a in &pack.safe_state {
                self.side_action(&key, Origin::SafeState(SafeReason::Shutdown), a, now)?;
            }
        }
        self.pump()?;
        if !self.await_safe_writes() {
            return Err(RuntimeError::gpio_hung(
                "the safe-state writes owed since the last run did not land",
            ));
        }
        if let Err(e) = std::fs::remove_file(safety::marker(&self.cfg.data_dir)) {
            tracing::warn!("could not remove the safe-state marker: {e}");
        }
        tracing::info!("owed safe states driven; restoring the packs");
        Ok(())
    }

    /// What never reached the device provably did not run: journalled not
    /// run, it may fire after a restart (not "outcome unknown").
    fn journal_unsent(&mut self, now: RefTime) {
        let (tickets, execs) = self.firing.arming.drain_unsent();
        let ids = tickets
            .into_iter()
            .filter_map(|t| match t {
                Ticket::Attempt { text, .. } => Some(text.to_string()),
                Ticket::Side { .. } | Ticket::Settled { .. } | Ticket::PulseEnd { .. } => None,
            })
            .chain(execs.into_iter().map(|p| p.req.execution_id));
        for id in ids {
            if let Err(e) =
                journal_result(&mut self.journal, &id, &AttemptResult::Late { actual: now })
            {
                tracing::warn!("journal unavailable on the way out: {e}");
                break;
            }
        }
    }

    /// Best effort from here: the device is safe whatever the disk says.
    fn close_journal(&mut self, events: Vec<Event>) {
        // The last instant the agent was up: a restart counts what it missed
        // from here, so nothing reported on the way out is counted again.
        if let Err(e) = self.journal.heartbeat(self.clock.now().as_nanos()) {
            tracing::warn!("journal unavailable on the way out: {e}");
        }
        if let Err(err) = self.events(&events) {
            tracing::warn!("journal unavailable on the way out: {err}");
        }
        for t in self.firing.arming.tickets() {
            if let Ticket::Attempt { text, .. } = t {
                tracing::warn!(execution_id = %text, "no result from the dispatcher: its ledger slot says after a restart whether it ran");
            }
        }
        match self.journal.sync() {
            Ok(()) => {
                self.firing.arming.remove_ledger_if_settled();
                tracing::info!("safe state entered, journal flushed");
            }
            Err(e) => tracing::error!("safe state entered; the journal could not be flushed: {e}"),
        }
    }

    /// Safe-state actions on the way out: the device only.
    pub(super) fn drive_safe_state(&mut self, pack: &PackKey, actions: &[Action], now: RefTime) {
        if self.safe.is_driven(pack) {
            return;
        }
        self.firing.arming.withdraw(pack, &[]);
        for a in actions {
            if let Err(e) = self.side_action(pack, Origin::SafeState(SafeReason::Shutdown), a, now)
            {
                tracing::error!(pack = %pack, "safe state: {e}");
            }
        }
        self.safe.driven(pack);
    }

    /// A result during the way out: reported and journalled if the journal
    /// still works; attempts withdrawn are journalled not run, so they may
    /// fire after a restart.
    pub(super) fn wind_down_done(&mut self, done: Done) {
        let mut more = Vec::new();
        if let Err(e) = self.on_done(done, &mut more) {
            tracing::warn!("journal unavailable on the way out: {e}");
        }
    }
}
