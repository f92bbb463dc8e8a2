//! Admission driven as the agent drives it (versions, lines opened by a
//! device double, resolution, owners, commit), over any order of packs
//! offered, cancelled and lines settling: a line is never driven by two
//! held packs unless both declare it shared, a line a pack let go of is
//! not taken while its firings may still touch it, versions only go up,
//! and the device is asked to open each line once.

use std::collections::{BTreeMap, BTreeSet};

use baton_control::admission::{Admission, AdmissionError, Verdict, digest};
use baton_gpio::{Direction, LineHandle};
use baton_sched::PackKey;
use proptest::prelude::*;

const LINES: u32 = 4;

#[derive(Clone, Debug)]
enum Step {
    Offer {
        pack: u8,
        version: u64,
        drives: u8,
        reads: u8,
        shared: u8,
    },
    Cancel {
        pack: u8,
    },
    /// The lines still busy (armed firings of a pack that let go).
    Settle {
        busy: u8,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0u8..3, 1u64..5, 0u8..16, 0u8..16, 0u8..16).prop_map(|(pack, version, drives, reads, shared)| Step::Offer {
            pack,
            version,
            drives,
            reads,
            shared: shared & drives,
        }),
        2 => (0u8..3).prop_map(|pack| Step::Cancel { pack }),
        2 => (0u8..16).prop_map(|busy| Step::Settle { busy }),
    ]
}

fn lines(mask: u8) -> Vec<u32> {
    (0..LINES).filter(|l| mask & (1 << l) != 0).collect()
}

fn yaml(pack: u8, version: u64, drives: u8, reads: u8, shared: u8) -> String {
    let mut y = format!("pack: p{pack}\nversion: {version}\n");
    if shared != 0 {
        let s: Vec<String> = lines(shared).iter().map(u32::to_string).collect();
        y += &format!("shared_lines: [{}]\n", s.join(", "));
    }
    y += "instructions:\n  - {id: n, action: noop, every: 1s}\n";
    for l in lines(drives) {
        y += &format!(
            "  - {{id: w{l}, action: gpio.write, params: {{line: {l}, value: 1}}, every: 1s}}\n"
        );
    }
    for l in lines(reads) {
        y += &format!("  - {{id: r{l}, action: gpio.read, params: {{line: {l}}}, every: 1s}}\n");
    }
    y
}

fn key(pack: u8) -> PackKey {
    PackKey {
        tenant: "default".into(),
        pack: format!("p{pack}"),
    }
}

/// What the model holds of a pack.
#[derive(Clone, Debug)]
struct HeldModel {
    version: u64,
    digest: u64,
    drives: BTreeSet<u32>,
    shared: BTreeSet<u32>,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn lines_are_owned_once_and_versions_only_go_up(steps in prop::collection::vec(step(), 1..40)) {
        let mut adm = Admission::default();
        let mut held: BTreeMap<u8, HeldModel> = BTreeMap::new();
        let mut lingering: BTreeMap<u8, BTreeSet<u32>> = BTreeMap::new();
        // (line, direction) the device was asked to open.
        let mut opened: BTreeSet<(u32, bool)> = BTreeSet::new();
        for st in steps {
            match st {
                Step::Offer { pack, version, drives, reads, shared } => {
                    let text = yaml(pack, version, drives, reads, shared);
                    let p = baton_proto::parse_pack(&text).expect("valid pack");
                    let d = digest(&text);
                    let k = key(pack);
                    // Step 1: versions.
                    let verdict = adm.check_version(&k, version, d);
                    match held.get(&pack) {
                        Some(h) if version < h.version => {
                            let older = matches!(verdict, Err(AdmissionError::Older { .. }));
                            prop_assert!(older, "{:?}", verdict);
                            continue;
                        }
                        Some(h) if version == h.version && d != h.digest => {
                            let conflict = matches!(verdict, Err(AdmissionError::Conflict { .. }));
                            prop_assert!(conflict, "{:?}", verdict);
                            continue;
                        }
                        Some(h) if version == h.version => {
                            prop_assert_eq!(verdict.ok(), Some(Verdict::Unchanged));
                            continue;
                        }
                        Some(h) => prop_assert_eq!(verdict.ok(), Some(Verdict::Replace { from: h.version })),
                        None => prop_assert_eq!(verdict.ok(), Some(Verdict::New)),
                    }
                    // Step 3: the device opens what was never opened, each
                    // once (a driven line also serves reads).
                    let asked = adm.lines_to_open(&p);
                    let mut this_call = BTreeSet::new();
                    for l in &asked {
                        let n = l.line.line.to_string().parse::<u32>().expect("a number");
                        let out = l.direction == Direction::Output;
                        prop_assert!(this_call.insert((n, out)), "asked twice: {:?}", asked);
                        prop_assert!(!opened.contains(&(n, true)), "already open as output: {:?}", l);
                        prop_assert!(out || !opened.contains(&(n, false)), "already open as input: {:?}", l);
                        opened.insert((n, out));
                        adm.opened(l, LineHandle(n));
                    }
                    let r = adm.resolve(&p);
                    // Step 4: owners, against the model.
                    let drives_set: BTreeSet<u32> = lines(drives).into_iter().collect();
                    let shared_set: BTreeSet<u32> = lines(shared).into_iter().collect();
                    // Line by line, in order: one another pack let go of
                    // is releasing, one another holds unshared is taken.
                    let verdict_of = |l: &u32| {
                        if lingering.iter().any(|(o, ls)| *o != pack && ls.contains(l)) {
                            Some(true)
                        } else if held.iter().any(|(o, h)| {
                            *o != pack && h.drives.contains(l)
                                && !(shared_set.contains(l) && h.shared.contains(l))
                        }) {
                            Some(false)
                        } else {
                            None
                        }
                    };
                    let first = drives_set.iter().find_map(verdict_of);
                    let releasing = first == Some(true);
                    let taken = first == Some(false);
                    let owners = adm.check_owners(&k, &r);
                    if releasing {
                        let e = matches!(owners, Err(AdmissionError::LineReleasing { .. }));
                        prop_assert!(e, "{:?}", owners);
                        prop_assert!(owners.as_ref().is_err_and(AdmissionError::is_transient));
                        continue;
                    }
                    if taken {
                        let e = matches!(owners, Err(AdmissionError::LineTaken { .. }));
                        prop_assert!(e, "{:?}", owners);
                        continue;
                    }
                    prop_assert!(owners.is_ok(), "{:?}", owners);
                    adm.commit(k, version, d, r);
                    if let Some(old) = held.get(&pack) {
                        let dropped: BTreeSet<u32> = old.drives.difference(&drives_set).copied().collect();
                        if !dropped.is_empty() {
                            lingering.entry(pack).or_default().extend(dropped);
                        }
                    }
                    // Lines it drives again are its own again.
                    if let Some(ls) = lingering.get_mut(&pack) {
                        ls.retain(|l| !drives_set.contains(l));
                        if ls.is_empty() {
                            lingering.remove(&pack);
                        }
                    }
                    held.insert(pack, HeldModel { version, digest: d, drives: drives_set, shared: shared_set });
                }
                Step::Cancel { pack } => {
                    adm.release(&key(pack));
                    if let Some(h) = held.remove(&pack)
                        && !h.drives.is_empty()
                    {
                        lingering.entry(pack).or_default().extend(h.drives);
                    }
                }
                Step::Settle { busy } => {
                    let b: Vec<LineHandle> = lines(busy).into_iter().map(LineHandle).collect();
                    adm.settle_lingering(|_| b.clone());
                    let bs: BTreeSet<u32> = lines(busy).into_iter().collect();
                    lingering.retain(|_, ls| {
                        ls.retain(|l| bs.contains(l));
                        !ls.is_empty()
                    });
                }
            }
            prop_assert_eq!(adm.has_lingering(), !lingering.is_empty());
            // No line driven by two held packs unless both share it.
            for (a, ha) in &held {
                for (b, hb) in &held {
                    if a >= b {
                        continue;
                    }
                    for l in ha.drives.intersection(&hb.drives) {
                        prop_assert!(ha.shared.contains(l) && hb.shared.contains(l));
                        let sharers = adm.sharers(&key(*a), LineHandle(*l));
                        prop_assert!(sharers.contains(&key(*b)));
                    }
                }
            }
        }
    }
}

/// A line the device cannot open refuses the pack, naming where the pack
/// names it; what it opened before stays open for a later pack.
#[test]
fn lines_to_open_name_their_place_in_order() {
    let adm = Admission::default();
    let p = baton_proto::parse_pack(&yaml(0, 1, 0b0010, 0b0101, 0)).expect("valid");
    let asked: Vec<(String, Direction, String)> = adm
        .lines_to_open(&p)
        .into_iter()
        .map(|l| (l.line.line.to_string(), l.direction, l.place))
        .collect();
    assert_eq!(
        asked,
        vec![
            ("1".into(), Direction::Output, "instruction `w1`".into()),
            ("0".into(), Direction::Input, "instruction `r0`".into()),
            ("2".into(), Direction::Input, "instruction `r2`".into()),
        ]
    );
}
