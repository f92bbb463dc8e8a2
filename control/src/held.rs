//! The packs this agent holds, as the runtime needs them beside the core:
//! what the way out, leases and clock loss need even if the core is gone
//! astray; whether the held set changed since the controller last heard
//! it (a `Held` message goes out then); and which of them a lease that ran
//! out or a lost clock stops.

use std::sync::Arc;
use std::time::Duration;

use baton_clock::MonoTime;
use baton_proto::RefTime;
use baton_proto::pack::{Action, ClockLoss};
use baton_sched::PackKey;

use crate::session::{Leased, Session};

/// Looked up per firing: hashed with foldhash, not SipHash (the keys come
/// from packs of signed-in operators or local files, not from strangers).
type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// A pack as held: what the way out needs even if the core is gone astray.
#[derive(Debug)]
pub struct HeldPack {
    pub safe_state: Arc<Vec<Action>>,
    /// First acceptance: the phase anchor kept across versions/restarts.
    pub anchor: RefTime,
    /// The pack's `lease` (enforced only with a controller configured).
    pub lease: Option<Duration>,
    /// What it does when the clock loses sync; `None` when it needs no
    /// absolute time (then a clock loss does not concern it).
    pub clock_loss: Option<ClockLoss>,
    /// When this version was taken in this run (a lease runs from here at
    /// the earliest).
    pub since: MonoTime,
    /// Some instruction waits on another (`after:`): its results are
    /// needed at once, never left for a later pass.
    pub chained: bool,
}

/// The held packs, and whether the set (or a pack's stopped flag) changed
/// since the last `Held` was sent.
#[derive(Debug, Default)]
pub struct HeldPacks {
    /// Looked up per firing.
    packs: FastMap<PackKey, HeldPack>,
    changed: bool,
}

impl HeldPacks {
    /// A pack taken (or restored): held from now on.
    pub fn insert(&mut self, key: PackKey, held: HeldPack) {
        self.packs.insert(key, held);
        self.changed = true;
    }

    /// A pack removed (cancelled).
    pub fn remove(&mut self, key: &PackKey) {
        self.packs.remove(key);
        self.changed = true;
    }

    /// The held pack `key`, if any.
    pub fn get(&self, key: &PackKey) -> Option<&HeldPack> {
        self.packs.get(key)
    }

    /// Whether `key` is held.
    pub fn contains(&self, key: &PackKey) -> bool {
        self.packs.contains_key(key)
    }

    /// How many packs are held.
    pub fn len(&self) -> usize {
        self.packs.len()
    }

    /// Whether no pack is held.
    pub fn is_empty(&self) -> bool {
        self.packs.is_empty()
    }

    /// Every held pack (in no order).
    pub fn iter(&self) -> impl Iterator<Item = (&PackKey, &HeldPack)> {
        self.packs.iter()
    }

    /// Every held pack's key (in no order).
    pub fn keys(&self) -> impl Iterator<Item = &PackKey> {
        self.packs.keys()
    }

    /// Something the controller sees in `Held` changed (a pack stopped in
    /// its safe state, a cancel that must be confirmed).
    pub fn mark_changed(&mut self) {
        self.changed = true;
    }

    /// A Hello went out: it says where things stand.
    pub fn told(&mut self) {
        self.changed = false;
    }

    /// Whether a `Held` is owed; it is sent now.
    pub fn take_changed(&mut self) -> bool {
        std::mem::take(&mut self.changed)
    }

    /// The running packs (`running`: the core's answer) whose lease ran
    /// out at `now`, with their lease: each enters its safe state.
    pub fn leases_out(
        &self,
        session: &Session,
        now: MonoTime,
        running: impl Fn(&PackKey) -> bool,
    ) -> Vec<(PackKey, Duration)> {
        let mut out: Vec<(PackKey, Duration)> = self
            .packs
            .iter()
            .filter_map(|(k, h)| {
                let lease = h.lease?;
                let p = Leased {
                    lease,
                    since: h.since,
                };
                (session.lease_expired(&p, now) && running(k)).then(|| (k.clone(), lease))
            })
            .collect();
        out.sort();
        out
    }

    /// When the first lease of a running pack runs out, if no contact
    /// comes first.
    pub fn next_lease_expiry(
        &self,
        session: &Session,
        running: impl Fn(&PackKey) -> bool,
    ) -> Option<MonoTime> {
        self.packs
            .iter()
            .filter_map(|(k, h)| {
                let lease = h.lease?;
                running(k).then(|| {
                    session.lease_expiry(&Leased {
                        lease,
                        since: h.since,
                    })
                })
            })
            .min()
    }

    /// The running packs that stop when the clock is lost
    /// (`on_clock_loss: safe_state`); the others keep firing.
    pub fn stop_on_clock_loss(&self, running: impl Fn(&PackKey) -> bool) -> Vec<PackKey> {
        let mut out: Vec<PackKey> = self
            .packs
            .iter()
            .filter(|(k, h)| h.clock_loss == Some(ClockLoss::SafeState) && running(k))
            .map(|(k, _)| k.clone())
            .collect();
        out.sort();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000_000;

    fn at(s: i64) -> MonoTime {
        MonoTime::from_nanos(s * S)
    }

    fn key(p: &str) -> PackKey {
        PackKey {
            tenant: "t".into(),
            pack: p.into(),
        }
    }

    fn pack(lease: Option<u64>, clock_loss: Option<ClockLoss>, since: i64) -> HeldPack {
        HeldPack {
            safe_state: Arc::new(Vec::new()),
            anchor: RefTime::from_nanos(0),
            lease: lease.map(Duration::from_secs),
            clock_loss,
            since: at(since),
            chained: false,
        }
    }

    /// Only running packs with a lease run out, each from the later of
    /// the last contact and its own taking; the stopped one is left alone
    /// (it is in its safe state already).
    #[test]
    fn leases_run_out_for_running_packs_from_contact_or_taking() {
        let mut held = HeldPacks::default();
        held.insert(key("short"), pack(Some(10), None, 0));
        held.insert(key("late"), pack(Some(10), None, 5));
        held.insert(key("none"), pack(None, None, 0));
        held.insert(key("stopped"), pack(Some(1), None, 0));
        let session = Session::new(at(0));
        let running = |k: &PackKey| k.pack != "stopped";
        assert_eq!(held.next_lease_expiry(&session, running), Some(at(10)));
        assert!(held.leases_out(&session, at(9), running).is_empty());
        assert_eq!(
            held.leases_out(&session, at(10), running),
            vec![(key("short"), Duration::from_secs(10))]
        );
        assert_eq!(
            held.leases_out(&session, at(15), running)
                .into_iter()
                .map(|(k, _)| k.pack)
                .collect::<Vec<_>>(),
            ["late", "short"]
        );
    }

    /// A lost clock stops only running packs that asked for it.
    #[test]
    fn a_lost_clock_stops_only_running_safe_state_packs() {
        let mut held = HeldPacks::default();
        held.insert(key("a"), pack(None, Some(ClockLoss::SafeState), 0));
        held.insert(key("b"), pack(None, Some(ClockLoss::Continue), 0));
        held.insert(key("c"), pack(None, None, 0));
        held.insert(key("d"), pack(None, Some(ClockLoss::SafeState), 0));
        assert_eq!(held.stop_on_clock_loss(|k| k.pack != "d"), vec![key("a")]);
        assert!(held.take_changed(), "inserts are owed in Held");
        held.told();
        assert!(!held.take_changed());
    }
}
