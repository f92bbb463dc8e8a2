//! The loop's upkeep beside the firings: when freed heap goes back to the
//! kernel, the journal's heartbeat, systemd's notifications, the
//! `/metrics` snapshots.

use std::sync::Arc;

use baton_proto::RefTime;
use baton_service::notify::Notifier;
use baton_service::watchdog::Watchdog;

use super::heap_trim::HeapTrim;

/// The loop's upkeep (see the module docs).
#[derive(Debug)]
pub(super) struct Upkeep {
    /// When freed heap goes back to the kernel.
    pub(super) heap_trim: HeapTrim,
    /// The journal's last heartbeat.
    pub(super) last_heartbeat: RefTime,
    /// READY / WATCHDOG / STOPPING to systemd (off unless
    /// `Agent::notify_systemd` is called).
    pub(super) systemd: Systemd,
    /// Where `/metrics` snapshots go (`None` without `--metrics`).
    pub(super) metrics: Option<Arc<crate::metrics::Published>>,
    /// This start is a new version on trial, until a controller welcomes
    /// it (`None`: it is not, or it was confirmed).
    pub(super) trial: Option<super::update::state::Trial>,
    /// The last update rolled back, said in each Hello until an offer.
    pub(super) rolled_back: Option<baton_update::RolledBack>,
}

/// The notifier and the watchdog schedule, if any.
#[derive(Debug)]
pub(super) struct Systemd {
    pub(super) notifier: Notifier,
    pub(super) watchdog: Option<Watchdog>,
}

impl Default for Systemd {
    fn default() -> Self {
        Systemd {
            notifier: Notifier::disabled(),
            watchdog: None,
        }
    }
}
