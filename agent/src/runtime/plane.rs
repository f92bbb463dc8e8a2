//! The control plane's state on the loop: what packs hold (admission's
//! lines, the held packs beside the core), the clock's watch, and the
//! controller link. Their rules are `baton_control`'s.

use baton_control::clock_watch::ClockWatch;
use baton_control::held::HeldPacks;

use super::link_state::Uplink;
use baton_control::admission::Admission;

/// The loop's control-plane state.
#[derive(Debug)]
pub(super) struct Plane {
    /// Whether a pack may run here, which lines it owns.
    pub(super) admission: Admission,
    /// The held packs beside the core (and whether `Held` is owed).
    pub(super) held: HeldPacks,
    /// The clock's health over this run, and the packs waiting for it.
    pub(super) clock_watch: ClockWatch,
    /// The controller link's control side; `None` without a controller.
    pub(super) uplink: Option<Uplink>,
    /// The fleet's trust (`trust-dir`); `None`: packs are not checked for
    /// signatures.
    pub(super) trust: Option<super::trust::BoxTrust>,
    /// Agent updates: the release being downloaded, the one installed.
    pub(super) update: super::update::state::Update,
}
