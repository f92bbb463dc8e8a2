//! The control loop's side of systemd (`Type=notify`): `READY=1` when the
//! loop is about to run (journal open, packs restored and loaded),
//! `WATCHDOG=1` every half `WATCHDOG_USEC` while the loop runs *and* the
//! dispatcher makes progress, `STOPPING=1` as the way out begins, and a
//! `STATUS=` line at each of those moments. All of it is a no-op without
//! `NOTIFY_SOCKET`, and nothing here blocks (see `baton_service::notify`).
//!
//! The pings come from the control loop, so a control loop stuck in a
//! journal write stops them too; they are withheld while the dispatcher's
//! heartbeat says it is stuck (`baton_service::watchdog` has the rule), so
//! systemd restarts an agent whose device thread hangs.

use std::time::Duration;

use baton_proto::RefTime;
use baton_service::notify::{Notifier, State};
use baton_service::watchdog::Watchdog;

use super::agent::Agent;
use super::upkeep::Systemd;

impl Agent {
    /// Report to systemd through `notifier`, pinging its watchdog every
    /// half `watchdog` (from `WATCHDOG_USEC`) once the loop runs. Without
    /// this call nothing is sent.
    pub fn notify_systemd(&mut self, notifier: Notifier, watchdog: Option<Duration>) {
        let now = baton_clock::mono_now().as_nanos();
        self.upkeep.systemd = Systemd {
            watchdog: watchdog
                .filter(|_| notifier.enabled())
                .map(|p| Watchdog::new(p, now)),
            notifier,
        };
    }

    /// The loop is about to run: ready.
    pub(super) fn systemd_ready(&mut self) {
        let status = format!("running: {} pack(s) held", self.plane.held.len());
        self.upkeep
            .systemd
            .notifier
            .notify(&[State::Ready, State::Status(&status)]);
        self.systemd_tick();
    }

    /// The way out has begun.
    pub(super) fn systemd_stopping(&mut self) {
        self.upkeep.systemd.watchdog = None;
        self.upkeep.systemd.notifier.notify(&[
            State::Stopping,
            State::Status("stopping: driving every held pack's safe state"),
        ]);
    }

    /// The way out before a restart into `version` in this process: a
    /// last ping (the new version pings within the watchdog's period) and
    /// a status; no more pings from this image.
    pub(super) fn systemd_restarting(&mut self, version: &str) {
        let status = format!(
            "restarting into agent version {version}: driving every held pack's safe state"
        );
        let n = &self.upkeep.systemd.notifier;
        if self.upkeep.systemd.watchdog.take().is_some() {
            n.notify(&[State::Watchdog, State::Status(&status)]);
        } else {
            n.notify(&[State::Status(&status)]);
        }
    }

    /// A watchdog ping if one is due and the dispatcher is alive.
    pub(super) fn systemd_tick(&mut self) {
        let Some(w) = self.upkeep.systemd.watchdog.as_mut() else {
            return;
        };
        let pulse = self.ports.device.stats().map(|s| s.heartbeat.pulse());
        let Some(d) = w.poll(baton_clock::mono_now().as_nanos(), pulse) else {
            return;
        };
        let n = &self.upkeep.systemd.notifier;
        match (d.ping, d.changed) {
            (true, false) => {
                n.notify(&[State::Watchdog]);
            }
            (true, true) => {
                tracing::warn!("the dispatcher thread is making progress again");
                n.notify(&[State::Watchdog, State::Status("running")]);
            }
            (false, true) => {
                tracing::error!(
                    "the dispatcher thread has made no progress for {:?}: systemd watchdog pings withheld, so systemd restarts the agent",
                    w.interval()
                );
                n.notify(&[State::Status("dispatcher stalled: watchdog pings withheld")]);
            }
            (false, false) => {}
        }
    }

    /// When the next watchdog decision is due, on the reference scale
    /// (for the loop's sleep).
    pub(super) fn systemd_wake(&self, now: RefTime) -> Option<RefTime> {
        let w = self.upkeep.systemd.watchdog.as_ref()?;
        let left = w
            .next_due()
            .saturating_sub(baton_clock::mono_now().as_nanos());
        Some(now + Duration::from_nanos(left.max(0).unsigned_abs()))
    }
}
