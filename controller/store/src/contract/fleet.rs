//! The fleet's filters and counts ([`Store::agents`] with a label, a
//! state or a text; [`Store::agent_counts`]): every combination on a
//! random fleet against a naive filter written here from the documented
//! rules, a tenant that tries to see another's agents and labels, and
//! text with the characters SQL's `LIKE` would take for wildcards.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::collections::BTreeMap;

use baton_model::RefTime;
use baton_model::identity::DEFAULT_TENANT;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};

use crate::*;

use super::fixtures::*;

/// Keys and values the random fleet's labels are drawn from: cases that
/// differ, and the characters `LIKE` would read as wildcards.
const KEYS: [&str; 3] = ["line", "site", "Zone"];
const VALUES: [&str; 5] = ["3", "a_b", "x%y", "North", "north"];
const TENANTS: [&str; 2] = ["t", "u"];
/// Ids: a prefix each, so text finds some by id alone.
const STEMS: [&str; 4] = ["press-", "Press_", "a%b", "line"];

/// The random fleet: hellos with own labels and certificate tenants,
/// grants, operator labels of each tenant (set or hidden, `default`'s
/// too), some agents offline, clock reports in several states.
async fn random_fleet(s: &dyn Store, seed: u64, n: usize) {
    let mut rng = StdRng::seed_from_u64(seed);
    for i in 0..n {
        let id = format!("{}{i:02}", STEMS.choose(&mut rng).unwrap());
        let mut own: Vec<(&str, &str)> = Vec::new();
        for k in KEYS {
            if rng.random_bool(0.6) {
                own.push((k, *VALUES.choose(&mut rng).unwrap()));
            }
        }
        let tenants: Vec<&str> = TENANTS
            .iter()
            .copied()
            .filter(|_| rng.random_bool(0.5))
            .collect();
        let (agent, _) = s
            .agent_hello(hello_in(&id, &tenants, &own, 10))
            .await
            .unwrap();
        if rng.random_bool(0.2) {
            s.grant(
                &id,
                TENANTS.choose(&mut rng).unwrap(),
                true,
                RefTime::from_nanos(11),
            )
            .await
            .unwrap();
        }
        for tenant in ["t", "u", DEFAULT_TENANT] {
            if !rng.random_bool(0.3) {
                continue;
            }
            let mut set = LabelOverrides::new();
            for k in KEYS {
                match rng.random_range(0..4) {
                    0 => {
                        set.insert(k.into(), Some((*VALUES.choose(&mut rng).unwrap()).into()));
                    }
                    1 => {
                        set.insert(k.into(), None);
                    }
                    _ => {}
                }
            }
            s.label_agent(&id, tenant, set, Vec::new(), RefTime::from_nanos(12))
                .await
                .unwrap();
        }
        if rng.random_bool(0.4) {
            s.agent_seen(
                &id,
                agent.session_gen,
                SeenRow::ended(RefTime::from_nanos(13)),
            )
            .await
            .unwrap();
        }
        match rng.random_range(0..3) {
            0 => {}
            k => {
                let mut c = clock(14);
                if k == 2 {
                    c.state = "holdover".into();
                }
                s.record_clock(&id, agent.session_gen, c).await.unwrap();
            }
        }
    }
}

/// The labels `tenant`'s packs see on `a`: its own, with that tenant's
/// operator labels over them (a `None` hides the key).
fn seen_by(a: &AgentRow, tenant: &str) -> BTreeMap<String, String> {
    let mut l = a.labels.clone();
    for (k, v) in a.overrides.get(tenant).into_iter().flatten() {
        match v {
            Some(v) => {
                l.insert(k.clone(), v.clone());
            }
            None => {
                l.remove(k);
            }
        }
    }
    l
}

fn has_text(hay: &str, needle: &str) -> bool {
    hay.to_ascii_lowercase()
        .contains(&needle.to_ascii_lowercase())
}

/// The naive filter: every condition of [`AgentFilter`] as its docs state
/// it, on whole agent rows.
fn naive(all: &[AgentRow], f: &AgentFilter, binding: Binding, with_state: bool) -> Vec<AgentRow> {
    let labels_of = f.tenant.as_deref().unwrap_or(DEFAULT_TENANT);
    all.iter()
        .filter(|a| match (&f.tenant, binding) {
            (None, _) | (_, Binding::Open) => true,
            (Some(t), Binding::Tenants) => a.tenants.contains(t),
        })
        .filter(|a| {
            let l = seen_by(a, labels_of);
            let label = f.label.as_ref().is_none_or(|m| match &m.value {
                None => l.contains_key(&m.key),
                Some(v) => l.get(&m.key) == Some(v),
            });
            let text = f
                .text
                .as_ref()
                .is_none_or(|t| has_text(&a.id, t) || l.values().any(|v| has_text(v, t)));
            // An offline agent's last report is not its clock now.
            let locked = a.connected && a.clock.as_ref().is_some_and(|c| c.state == "locked");
            let state = !with_state
                || f.state.is_none_or(|s| match s {
                    FleetState::Connected => a.connected,
                    FleetState::Offline => !a.connected,
                    // No delivery in these fleets: nothing refused.
                    FleetState::ClockNotLocked | FleetState::Unhealthy => !locked,
                });
            label && text && state
        })
        .cloned()
        .collect()
}

/// Every agent, whole, by id.
async fn everyone(s: &dyn Store) -> Vec<AgentRow> {
    let mut out = Vec::new();
    let mut after = None;
    loop {
        let page = s
            .agents(AgentFilter {
                after_id: after,
                ..AgentFilter::default()
            })
            .await
            .unwrap();
        let Some(last) = page.last() else {
            return out;
        };
        after = Some(last.id.clone());
        out.extend(page);
    }
}

fn label_conditions() -> Vec<Option<LabelMatch>> {
    let mut out = vec![None];
    for k in KEYS.iter().chain(&["absent"]) {
        out.push(Some(LabelMatch {
            key: (*k).into(),
            value: None,
        }));
    }
    for k in KEYS {
        for v in ["3", "a_b", "x%y", "north"] {
            out.push(Some(LabelMatch {
                key: k.into(),
                value: Some(v.into()),
            }));
        }
    }
    out
}

/// Every combination of tenant, label, state and text on a random fleet:
/// the page (whole, and walked two rows at a time for some) and the counts
/// equal the naive filter's.
pub async fn fleet_filters_equal_a_naive_filter(s: &dyn Store, binding: Binding) {
    random_fleet(s, 35, 28).await;
    let all = everyone(s).await;
    assert_eq!(all.len(), 28, "every agent stored");
    let tenants = [
        None,
        Some("t"),
        Some("u"),
        Some(DEFAULT_TENANT),
        Some("nobody"),
    ];
    let states = [
        None,
        Some(FleetState::Connected),
        Some(FleetState::Offline),
        Some(FleetState::ClockNotLocked),
        Some(FleetState::Unhealthy),
    ];
    let texts = [
        None,
        Some(""),
        Some("PRESS"),
        Some("a_b"),
        Some("%"),
        Some("_"),
        Some("orth"),
    ];
    let mut n = 0u64;
    let mut matched = 0usize;
    for tenant in tenants {
        for label in label_conditions() {
            for text in texts {
                let base = AgentFilter {
                    tenant: tenant.map(str::to_owned),
                    label: label.clone(),
                    text: text.map(str::to_owned),
                    ..AgentFilter::default()
                };
                let want = naive(&all, &base, binding, false);
                let counts = s.agent_counts(base.clone()).await.unwrap();
                let connected = want.iter().filter(|a| a.connected).count() as u64;
                let unlocked = want
                    .iter()
                    .filter(|a| {
                        !a.connected || a.clock.as_ref().is_none_or(|c| c.state != "locked")
                    })
                    .count() as u64;
                assert_eq!(
                    counts,
                    FleetCounts {
                        total: want.len() as u64,
                        connected,
                        offline: want.len() as u64 - connected,
                        clock_not_locked: unlocked,
                    },
                    "counts of {base:?}"
                );
                for state in states {
                    let f = AgentFilter {
                        state,
                        ..base.clone()
                    };
                    let want = naive(&all, &f, binding, true);
                    matched += want.len();
                    let got = s.agents(f.clone()).await.unwrap();
                    assert_eq!(got, want, "{f:?}");
                    n += 1;
                    if n.is_multiple_of(5) {
                        // Walked a page of two at a time.
                        let mut walked = Vec::new();
                        let mut after = None;
                        loop {
                            let page = ids(
                                s,
                                AgentFilter {
                                    after_id: after,
                                    limit: 2,
                                    ..f.clone()
                                },
                            )
                            .await;
                            assert!(page.len() <= 2);
                            let Some(last) = page.last().cloned() else {
                                break;
                            };
                            walked.extend(page);
                            after = Some(last);
                        }
                        let want: Vec<String> = want.iter().map(|a| a.id.clone()).collect();
                        assert_eq!(walked, want, "walked {f:?}");
                    }
                }
            }
        }
    }
    assert!(
        matched > 1000,
        "the fleet matched too little to test: {matched}"
    );
}

/// A tenant sees, finds and counts only the agents that serve it, by the
/// labels it set or the agents' own: another tenant's operator labels are
/// neither matched nor searched, whatever it asks.
pub async fn fleet_a_tenant_sees_only_its_own(s: &dyn Store, binding: Binding) {
    s.agent_hello(hello_in("a1", &["t"], &[("line", "1")], 1))
        .await
        .unwrap();
    s.agent_hello(hello_in("a2", &["u"], &[("line", "1")], 1))
        .await
        .unwrap();
    s.agent_hello(hello_in("a3", &["t", "u"], &[("line", "1")], 1))
        .await
        .unwrap();
    // u's labels on a3 (which t also sees): a secret key, and line moved.
    s.label_agent(
        "a3",
        "u",
        [
            ("secret".into(), Some("u-only".into())),
            ("line".into(), Some("9".into())),
        ]
        .into(),
        Vec::new(),
        RefTime::from_nanos(2),
    )
    .await
    .unwrap();
    let f = |tenant: &str, label: Option<(&str, Option<&str>)>, text: Option<&str>| AgentFilter {
        tenant: Some(tenant.into()),
        label: label.map(|(k, v)| LabelMatch {
            key: k.into(),
            value: v.map(str::to_owned),
        }),
        text: text.map(str::to_owned),
        ..AgentFilter::default()
    };
    let none: &[&str] = &[];
    let (t_all, u_all): (&[&str], &[&str]) = match binding {
        Binding::Tenants => (&["a1", "a3"], &["a2", "a3"]),
        Binding::Open => (&["a1", "a2", "a3"], &["a1", "a2", "a3"]),
    };
    assert_eq!(ids(s, f("t", None, None)).await, t_all);
    assert_eq!(ids(s, f("t", Some(("secret", None)), None)).await, none);
    assert_eq!(
        ids(s, f("t", Some(("secret", Some("u-only"))), None)).await,
        none
    );
    assert_eq!(ids(s, f("t", None, Some("u-only"))).await, none);
    assert_eq!(ids(s, f("t", Some(("line", Some("9"))), None)).await, none);
    assert_eq!(ids(s, f("t", Some(("line", Some("1"))), None)).await, t_all);
    assert_eq!(ids(s, f("u", Some(("secret", None)), None)).await, ["a3"]);
    assert_eq!(ids(s, f("u", None, Some("U-ONLY"))).await, ["a3"]);
    assert_eq!(
        ids(s, f("u", Some(("line", Some("9"))), None)).await,
        ["a3"]
    );
    let u_line_1: Vec<&str> = u_all.iter().copied().filter(|a| *a != "a3").collect();
    assert_eq!(
        ids(s, f("u", Some(("line", Some("1"))), None)).await,
        u_line_1
    );
    // Counted alike: another tenant's agents are not in the total.
    let count = |t: &str| s.agent_counts(f(t, None, None));
    assert_eq!(count("t").await.unwrap().total, t_all.len() as u64);
    assert_eq!(count("u").await.unwrap().total, u_all.len() as u64);
    let nobody = s.agent_counts(f("nobody", None, None)).await.unwrap();
    let expect_nobody = if binding == Binding::Tenants { 0 } else { 3 };
    assert_eq!(nobody.total, expect_nobody);
    assert_eq!(
        s.agent_counts(f("t", None, Some("u-only")))
            .await
            .unwrap()
            .total,
        0
    );
}

/// Text is matched as written: `%`, `_` and `\` are characters, not
/// wildcards; ASCII letters match in either case.
pub async fn fleet_text_is_literal(s: &dyn Store, _binding: Binding) {
    for id in ["a%c", "abc", "a_c", "aXc", r"a\c", "été"] {
        s.agent_hello(hello_in(id, &["t"], &[], 1)).await.unwrap();
    }
    s.agent_hello(hello_in("z1", &["t"], &[("k", "50%_off")], 1))
        .await
        .unwrap();
    let find = |text: &str| {
        ids(
            s,
            AgentFilter {
                text: Some(text.into()),
                ..AgentFilter::default()
            },
        )
    };
    assert_eq!(find("%").await, ["a%c", "z1"]);
    assert_eq!(find("_").await, ["a_c", "z1"]);
    assert_eq!(find("a%c").await, ["a%c"]);
    assert_eq!(find("a_c").await, ["a_c"]);
    assert_eq!(find(r"\").await, [r"a\c"]);
    assert_eq!(find("%_").await, ["z1"]);
    assert_eq!(find("AXC").await, ["aXc"]);
    assert_eq!(find("été").await, ["été"]);
    assert_eq!(find("").await.len(), 7);
}

/// "Unhealthy": offline, clock not locked (an offline agent's is not, nor
/// is a report older than [`CLOCK_STALE_NS`] before the last-seen mark), an
/// outbox that only grows or a late firing as its stream measured them,
/// or a refused delivery of the asking tenant's (another tenant's refusal
/// is not its to see).
pub async fn fleet_unhealthy_is_offline_unlocked_or_refusing(s: &dyn Store, _: Binding) {
    let mut gens = BTreeMap::new();
    for id in ["a1", "a2", "a3", "a4", "a5", "a6", "a7"] {
        let (agent, _) = s
            .agent_hello(hello_in(id, &["t", "u"], &[], 10))
            .await
            .unwrap();
        if id != "a4" {
            s.record_clock(id, agent.session_gen, clock(11))
                .await
                .unwrap();
        }
        gens.insert(id, agent.session_gen);
    }
    s.agent_seen("a3", gens["a3"], SeenRow::ended(RefTime::from_nanos(12)))
        .await
        .unwrap();
    for (id, growing, late) in [("a5", true, false), ("a6", false, true)] {
        let health = StreamHealth {
            outbox_entries: 5_000,
            outbox_growing: growing,
            late_recently: late,
        };
        let seen = SeenRow {
            health: Some(health),
            ..seen_live(12)
        };
        s.agent_seen(id, gens[id], seen).await.unwrap();
    }
    // a7's reports stopped while its stream lives on: its last one is stale.
    let later = 11 + CLOCK_STALE_NS + 1;
    s.agent_seen("a7", gens["a7"], seen_live(later))
        .await
        .unwrap();
    // A healthy report clears what an earlier one said.
    let sick_then_well = [true, false].map(|sick| SeenRow {
        health: Some(StreamHealth {
            outbox_growing: sick,
            ..StreamHealth::default()
        }),
        ..seen_live(13)
    });
    for seen in sick_then_well {
        s.agent_seen("a1", gens["a1"], seen).await.unwrap();
    }
    let k = key("t", "p");
    push(s, pack("t", "p", 1, to_ids(&["a1", "a2"])), 20).await;
    s.answer(ack("a1", &k, 1, 21)).await.unwrap();
    s.answer(refuse("a2", &k, refusal(1, true, "no line 12"), 21))
        .await
        .unwrap();
    let of = |tenant: &str, state| AgentFilter {
        tenant: Some(tenant.into()),
        state: Some(state),
        ..AgentFilter::default()
    };
    assert_eq!(
        ids(s, of("t", FleetState::Unhealthy)).await,
        ["a2", "a3", "a4", "a5", "a6", "a7"]
    );
    assert_eq!(
        ids(s, of("u", FleetState::Unhealthy)).await,
        ["a3", "a4", "a5", "a6", "a7"]
    );
    assert_eq!(
        ids(s, of("t", FleetState::ClockNotLocked)).await,
        ["a3", "a4", "a7"],
        "offline a3's and stale a7's last reports said locked"
    );
    let counts = s
        .agent_counts(of("t", FleetState::Unhealthy))
        .await
        .unwrap();
    assert_eq!(counts.clock_not_locked, 3);
    assert_eq!(counts.offline, 1);
}
