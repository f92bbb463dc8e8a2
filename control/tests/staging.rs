//! The staging rules driven as the agent drives them, over any order of
//! staged pushes, pushes to run now, cancels, packs stopped (a lease, the
//! clock) and time passing: the core's switch fence is always where the
//! staged version says, a staged version switches only at or after its
//! instant and at most once, never after it was superseded or
//! cancelled, never over a pack stopped since it was staged, and a
//! version older than the one held is never staged.

use std::collections::{BTreeMap, BTreeSet};

use baton_control::staging::{
    self, StageVerdict, Staged, Staging, SwitchFence, SwitchVerdict, stage_verdict,
};
use baton_proto::RefTime;
use baton_sched::PackKey;
use proptest::prelude::*;

fn key(i: u8) -> PackKey {
    PackKey {
        tenant: "t".into(),
        pack: format!("p{i}"),
    }
}

#[derive(Clone, Debug)]
enum Step {
    /// A staged push of `version` for an instant `at` ms from now (`None`:
    /// not named yet).
    Stage {
        pack: u8,
        version: u64,
        at: Option<i64>,
    },
    /// A push to run now.
    Push {
        pack: u8,
        version: u64,
    },
    Cancel {
        pack: u8,
    },
    /// The pack stops in its safe state (its lease, the clock).
    Stop {
        pack: u8,
    },
    /// Time passes, and the loop switches what came due; the clock's
    /// uncertainty then.
    Pass {
        ms: i64,
        uncertainty_ns: i64,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0u8..2, 1u64..6, prop::option::weighted(0.8, 0i64..50)).prop_map(|(pack, version, at)| Step::Stage { pack, version, at }),
        2 => (0u8..2, 1u64..6).prop_map(|(pack, version)| Step::Push { pack, version }),
        1 => (0u8..2).prop_map(|pack| Step::Cancel { pack }),
        1 => (0u8..2).prop_map(|pack| Step::Stop { pack }),
        4 => (0i64..40, prop_oneof![3 => Just(10i64), 1 => Just(5_000_000i64)])
            .prop_map(|(ms, uncertainty_ns)| Step::Pass { ms, uncertainty_ns }),
    ]
}

/// The agent's side: the core's held versions and fences, and what the
/// staging rules are told.
#[derive(Default)]
struct World {
    now: i64,
    /// The core: version held, running.
    held: BTreeMap<PackKey, (u64, bool)>,
    /// The core's switch fences.
    fence: BTreeMap<PackKey, RefTime>,
    /// What is staged per pack, as the model sees it: id, instant.
    staged: BTreeMap<PackKey, (u64, Option<RefTime>)>,
    /// Ids that left without switching.
    gone: BTreeSet<u64>,
    /// Ids switched.
    switched: BTreeSet<u64>,
    next_id: u64,
}

const LIMIT_NS: i64 = 1_000_000;

fn ms(t: i64) -> RefTime {
    RefTime::from_nanos(t * 1_000_000)
}

impl World {
    fn set(&mut self, f: SwitchFence) {
        match f.at {
            Some(at) => self.fence.insert(f.key, at),
            None => self.fence.remove(&f.key),
        };
    }

    fn drop_staged(&mut self, s: &mut Staging<u64>, k: &PackKey) {
        if let Some(f) = s.drop(k) {
            self.set(f);
        }
        if let Some((id, _)) = self.staged.remove(k) {
            self.gone.insert(id);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn a_staged_version_switches_once_at_its_instant_and_never_after_it_went(
        steps in prop::collection::vec(step(), 1..60)
    ) {
        let mut s: Staging<u64> = Staging::default();
        let mut w = World::default();
        for st in steps {
            match st {
                Step::Stage { pack, version, at } => {
                    let k = key(pack);
                    // A new staging replaces the old one, refused or not.
                    w.drop_staged(&mut s, &k);
                    match stage_verdict(w.held.get(&k).copied(), version) {
                        StageVerdict::Running => {
                            prop_assert_eq!(w.held.get(&k), Some(&(version, true)));
                        }
                        StageVerdict::Older { held } => {
                            prop_assert!(held > version);
                        }
                        StageVerdict::Stage { replaces_running } => {
                            prop_assert!(w.held.get(&k).is_none_or(|(v, _)| *v <= version));
                            prop_assert_eq!(replaces_running, w.held.get(&k).is_some_and(|(_, r)| *r));
                            let id = w.next_id;
                            w.next_id += 1;
                            let at = at.map(|d| ms(w.now + d));
                            let f = s.keep(k.clone(), Staged {
                                version,
                                at,
                                max_uncertainty_ns: 0,
                                replaces_running,
                                body: id,
                            });
                            w.set(f);
                            w.staged.insert(k, (id, at));
                        }
                    }
                }
                Step::Push { pack, version } => {
                    let k = key(pack);
                    w.drop_staged(&mut s, &k);
                    if w.held.get(&k).is_none_or(|(v, _)| *v < version) {
                        w.held.insert(k, (version, true));
                    }
                }
                Step::Cancel { pack } => {
                    let k = key(pack);
                    w.drop_staged(&mut s, &k);
                    w.held.remove(&k);
                }
                Step::Stop { pack } => {
                    if let Some(h) = w.held.get_mut(&key(pack)) {
                        h.1 = false;
                    }
                }
                Step::Pass { ms: d, uncertainty_ns } => {
                    w.now += d;
                    let now = ms(w.now);
                    while let Some((k, st)) = s.take_next_due(now) {
                        let (id, at) = w.staged.remove(&k).expect("the model has it");
                        prop_assert_eq!(id, st.body);
                        let at = at.expect("only a named instant comes due");
                        prop_assert!(at <= now, "switched before its instant");
                        prop_assert!(!w.gone.contains(&id) && !w.switched.contains(&id));
                        // The fence held the old version until now.
                        prop_assert_eq!(w.fence.get(&k), Some(&at));
                        let active = w.held.get(&k).is_some_and(|(_, r)| *r);
                        match staging::switch_verdict(&st, now, active, uncertainty_ns, LIMIT_NS) {
                            SwitchVerdict::Switch { at: a } => {
                                prop_assert_eq!(a, at);
                                prop_assert!(uncertainty_ns <= LIMIT_NS);
                                prop_assert!(!st.replaces_running || active, "brought a stopped pack back");
                                w.held.insert(k.clone(), (st.version, true));
                                w.switched.insert(id);
                            }
                            SwitchVerdict::Stopped => {
                                prop_assert!(st.replaces_running && !active);
                                w.gone.insert(id);
                            }
                            SwitchVerdict::ClockUncertain { uncertainty_ns: u, bound_ns } => {
                                prop_assert!(u > bound_ns);
                                w.gone.insert(id);
                            }
                        }
                        w.set(staging::lift(&k));
                    }
                }
            }
            // The fence is where the staged version says, and nowhere else.
            for i in 0..2 {
                let k = key(i);
                let expect = w.staged.get(&k).and_then(|(_, at)| *at);
                prop_assert_eq!(w.fence.get(&k).copied(), expect);
                prop_assert_eq!(s.version(&k).is_some(), w.staged.contains_key(&k));
            }
            let next = w.staged.values().filter_map(|(_, at)| *at).min();
            prop_assert_eq!(s.next_switch(), next);
        }
    }
}
