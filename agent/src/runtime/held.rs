//! The packs this agent holds, as the runtime needs them beside the core:
//! what the way out, leases and clock loss need even if the core is gone
//! astray; and whether the held set changed since the controller last
//! heard it (a `Held` message goes out then).

use std::sync::Arc;
use std::time::Duration;

use baton_clock::MonoTime;
use baton_proto::RefTime;
use baton_proto::pack::{Action, ClockLoss};
use baton_sched::PackKey;

/// A pack as held: what the way out needs even if the core is gone astray.
#[derive(Debug)]
pub(super) struct HeldPack {
    pub(super) safe_state: Arc<Vec<Action>>,
    /// First acceptance: the phase anchor kept across versions/restarts.
    pub(super) anchor: RefTime,
    /// The pack's `lease` (enforced only with a controller configured).
    pub(super) lease: Option<Duration>,
    /// What it does when the clock loses sync; `None` when it needs no
    /// absolute time (then a clock loss does not concern it).
    pub(super) clock_loss: Option<ClockLoss>,
    /// When this version was taken in this run (a lease runs from here at
    /// the earliest).
    pub(super) since: MonoTime,
    /// Some instruction waits on another (`after:`): its results are
    /// needed at once, never left for a later pass.
    pub(super) chained: bool,
}

/// The held packs, and whether the set (or a pack's stopped flag) changed
/// since the last `Held` was sent.
#[derive(Debug, Default)]
pub(super) struct HeldPacks {
    /// Looked up per firing.
    packs: crate::FastMap<PackKey, HeldPack>,
    changed: bool,
}

impl HeldPacks {
    /// A pack taken (or restored): held from now on.
    pub(super) fn insert(&mut self, key: PackKey, held: HeldPack) {
        self.packs.insert(key, held);
        self.changed = true;
    }

    /// A pack removed (cancelled).
    pub(super) fn remove(&mut self, key: &PackKey) {
        self.packs.remove(key);
        self.changed = true;
    }

    /// The held pack `key`, if any.
    pub(super) fn get(&self, key: &PackKey) -> Option<&HeldPack> {
        self.packs.get(key)
    }

    /// Whether `key` is held.
    pub(super) fn contains(&self, key: &PackKey) -> bool {
        self.packs.contains_key(key)
    }

    /// How many packs are held.
    pub(super) fn len(&self) -> usize {
        self.packs.len()
    }

    /// Every held pack (in no order).
    pub(super) fn iter(&self) -> impl Iterator<Item = (&PackKey, &HeldPack)> {
        self.packs.iter()
    }

    /// Every held pack's key (in no order).
    pub(super) fn keys(&self) -> impl Iterator<Item = &PackKey> {
        self.packs.keys()
    }

    /// Something the controller sees in `Held` changed (a pack stopped in
    /// its safe state, a cancel that must be confirmed).
    pub(super) fn mark_changed(&mut self) {
        self.changed = true;
    }

    /// A Hello went out: it says where things stand.
    pub(super) fn told(&mut self) {
        self.changed = false;
    }

    /// Whether a `Held` is owed; it is sent now.
    pub(super) fn take_changed(&mut self) -> bool {
        std::mem::take(&mut self.changed)
    }
}
