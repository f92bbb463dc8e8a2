//! The randomized equivalence test: random sequences against an oracle that re-plans every pair.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;

use baton_model::RefTime;
use baton_model::planner::{self};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::*;

use super::fixtures::*;

// ---------------------------------------------------------------------------
// The randomized equivalence test.

/// A fresh store of a backend, with what must outlive it (a directory).
pub type Opened = (Box<dyn Store>, Box<dyn std::any::Any>);

/// Sequences and steps per sequence (`BATON_STORE_SEQUENCES` to run more,
/// seeded from `BATON_STORE_SEED`, when hunting).
const SEQUENCES: u64 = 20;
const STEPS: usize = 60;

const AGENTS: [&str; 5] = ["a0", "a1", "a2", "a3", "a4"];
const TENANTS: [&str; 2] = ["t0", "t1"];
const PACKS: [&str; 3] = ["p0", "p1", "p2"];
const KEYS: [&str; 2] = ["k0", "k1"];
const VALUES: [&str; 2] = ["v0", "v1"];

/// Random sequences of hellos (labels, held sets, certificates), held
/// sets, label changes, grants, pushes (label and id targets, several
/// tenants; refused ones too), cancels, answers and reconciles, each run
/// against a fresh store and an oracle: after every step every agent's
/// rows must equal what [`planner::plan`] gives for every (known agent,
/// stored or held pack) pair, from the oracle's own history of held sets
/// and refusals; each command's result (its changed rows, its errors)
/// must equal the oracle's, and so must `packs` and `deliveries_of_pack`.
pub async fn random_equivalence(open: &dyn Fn(Binding) -> Opened, binding: Binding) {
    let sequences = std::env::var("BATON_STORE_SEQUENCES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(SEQUENCES);
    let first: u64 = std::env::var("BATON_STORE_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    for seed in first..first + sequences {
        let (store, guard) = open(binding);
        run_sequence(store.as_ref(), binding, seed).await;
        drop(store);
        drop(guard);
    }
}

#[derive(Clone, Debug)]
enum Step {
    Hello(HelloRow),
    Held(String, Vec<HeldPackRow>),
    Label(String, String, LabelOverrides, Vec<String>),
    Grant(String, String, bool),
    Push(PackVersionRow),
    Cancel(PackKey),
    Answer(AnswerRow),
    Reconcile(PackKey),
}

/// The oracle: the inputs as plain maps, and every row re-planned from
/// them after each step.
#[derive(Debug)]
struct Model {
    binding: Binding,
    agents: BTreeMap<String, AgentRow>,
    cert: BTreeMap<String, BTreeSet<String>>,
    grants: BTreeMap<String, BTreeSet<String>>,
    packs: BTreeMap<PackKey, PackTargets>,
    pushed: BTreeMap<PackKey, i64>,
    yaml: BTreeMap<(PackKey, u64), String>,
    rows: BTreeMap<(String, PackKey), DeliveryRow>,
}

/// What a put is expected to do.
#[derive(Debug, PartialEq)]
enum Put {
    Stored,
    Unchanged,
    Older(u64),
    Taken,
}

impl Model {
    fn new(binding: Binding) -> Model {
        Model {
            binding,
            agents: BTreeMap::new(),
            cert: BTreeMap::new(),
            grants: BTreeMap::new(),
            packs: BTreeMap::new(),
            pushed: BTreeMap::new(),
            yaml: BTreeMap::new(),
            rows: BTreeMap::new(),
        }
    }

    fn agent(&self, id: &str) -> Option<AgentRow> {
        let mut a = self.agents.get(id)?.clone();
        a.tenants = self.cert.get(id).cloned().unwrap_or_default();
        a.tenants
            .extend(self.grants.get(id).into_iter().flatten().cloned());
        Some(a)
    }

    fn rows_of(&self, id: &str) -> Vec<DeliveryRow> {
        self.rows
            .iter()
            .filter(|((a, _), _)| a == id)
            .map(|(_, r)| r.clone())
            .collect()
    }

    /// Every (known agent, pack) pair planned again; `held`: one agent's
    /// new held set. The rows that changed.
    fn replan(&mut self, held: Option<(&str, &[HeldPackRow])>, at_ns: i64) -> Vec<DeliveryRow> {
        let held: Option<(&str, BTreeMap<PackKey, Held>)> =
            held.map(|(id, h)| (id, h.iter().map(HeldPackRow::keyed).collect()));
        let mut changed = Vec::new();
        let ids: Vec<String> = self.agents.keys().cloned().collect();
        for id in ids {
            let agent = self.agent(&id).unwrap();
            let now = held.as_ref().filter(|(a, _)| *a == id).map(|(_, m)| m);
            let mut keys: BTreeSet<PackKey> = self.packs.keys().cloned().collect();
            keys.extend(
                self.rows
                    .keys()
                    .filter(|(a, _)| *a == id)
                    .map(|(_, k)| k.clone()),
            );
            if let Some(m) = now {
                keys.extend(m.keys().cloned());
            }
            for k in keys {
                let rk = (id.clone(), k.clone());
                let row = self.rows.get(&rk);
                let h = match now {
                    Some(m) => m.get(&k).copied(),
                    None => row.and_then(|r| r.held),
                };
                match planner::plan(
                    &agent,
                    &k,
                    self.packs.get(&k),
                    row,
                    h,
                    self.binding,
                    RefTime::from_nanos(at_ns),
                ) {
                    Some(next) => {
                        if row != Some(&next) {
                            changed.push(next.clone());
                            self.rows.insert(rk, next);
                        }
                    }
                    None => {
                        self.rows.remove(&rk);
                    }
                }
            }
        }
        changed
    }

    fn put(&mut self, p: &PackVersionRow) -> Put {
        let k = p.key();
        if let Some(rec) = self.packs.get(&k) {
            if rec.latest > p.version {
                return Put::Older(rec.latest);
            }
            if rec.latest == p.version {
                match self.yaml.get(&(k.clone(), p.version)) {
                    Some(y) if *y == p.yaml => return Put::Unchanged,
                    Some(_) => return Put::Taken,
                    None => {}
                }
            }
        }
        self.packs.insert(
            k.clone(),
            PackTargets {
                tenant: p.tenant.clone(),
                pack: p.pack.clone(),
                latest: p.version,
                targets: p.targets.clone(),
                cancelled: None,
                gate: None,
                stopped: Default::default(),
            },
        );
        self.pushed.insert(k.clone(), p.pushed.as_nanos());
        self.yaml.insert((k, p.version), p.yaml.clone());
        Put::Stored
    }

    /// `false`: nobody holds an unknown pack (`NoSuchPack`).
    fn cancel(&mut self, k: &PackKey, at_ns: i64) -> bool {
        if let Some(p) = self.packs.get_mut(k) {
            p.cancelled.get_or_insert(RefTime::from_nanos(at_ns));
            return true;
        }
        let newest = self
            .rows
            .iter()
            .filter(|((_, rk), _)| rk == k)
            .filter_map(|(_, r)| r.held.map(|h| h.version))
            .max();
        let Some(latest) = newest else {
            return false;
        };
        self.packs.insert(
            k.clone(),
            PackTargets {
                tenant: k.tenant.clone(),
                pack: k.pack.clone(),
                latest,
                targets: TargetsRow::Nobody,
                cancelled: Some(RefTime::from_nanos(at_ns)),
                gate: None,
                stopped: Default::default(),
            },
        );
        self.pushed.insert(k.clone(), at_ns);
        true
    }

    fn summaries(&self) -> Vec<PackSummaryRow> {
        self.packs
            .iter()
            .map(|(k, p)| {
                let mut s = PackSummaryRow {
                    tenant: k.tenant.clone(),
                    pack: k.pack.clone(),
                    latest: p.latest,
                    targets: p.targets.clone(),
                    pushed: RefTime::from_nanos(self.pushed[k]),
                    cancelled: p.cancelled,
                    acked: 0,
                    nacked: 0,
                    pending: 0,
                    ahead: 0,
                };
                for r in self.rows.values().filter(|r| r.key() == *k) {
                    if r.held.is_some_and(|h| h.version > p.latest) {
                        s.ahead += 1;
                    }
                    if r.version == p.latest {
                        match r.state {
                            Acked => s.acked += 1,
                            Nacked => s.nacked += 1,
                            Pending => s.pending += 1,
                            Cancelled | DeliveryState::Local => {}
                        }
                    }
                }
                s
            })
            .collect()
    }
}

/// Where a sequence is, for failure messages.
struct Trail {
    seed: u64,
    binding: Binding,
    steps: Vec<String>,
}

impl Trail {
    fn check<T: PartialEq + Debug>(&self, what: &str, got: &T, want: &T) {
        if got != want {
            let from = self.steps.len().saturating_sub(25);
            panic!(
                "{what} differs from the oracle (seed {}, {:?}, step {}; \
                 BATON_STORE_SEED={} BATON_STORE_SEQUENCES=1 reruns it)\n\
                 steps (last 25):\n  {}\n got: {got:#?}\nwant: {want:#?}",
                self.seed,
                self.binding,
                self.steps.len(),
                self.seed,
                self.steps[from..].join("\n  "),
            );
        }
    }
}

fn pick<'a>(rng: &mut StdRng, from: &[&'a str]) -> &'a str {
    from[rng.random_range(0..from.len())]
}

fn random_labels(rng: &mut StdRng) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for k in KEYS {
        if rng.random_bool(0.6) {
            out.insert(k.to_owned(), pick(rng, &VALUES).to_owned());
        }
    }
    out
}

fn random_held(rng: &mut StdRng, m: &Model) -> Vec<HeldPackRow> {
    let mut out = Vec::new();
    for t in TENANTS {
        for p in PACKS {
            if !rng.random_bool(0.3) {
                continue;
            }
            let latest = m.packs.get(&key(t, p)).map_or(2, |p| p.latest);
            let version = match rng.random_range(0..4) {
                0 => latest.saturating_sub(1).max(1),
                1 | 2 => latest,
                _ => latest + 1,
            };
            out.push(HeldPackRow {
                stopped: rng.random_bool(0.2),
                ..held(t, p, version)
            });
        }
    }
    out
}

fn random_step(rng: &mut StdRng, m: &Model, at_ns: i64) -> Step {
    let known: Vec<&str> = AGENTS
        .iter()
        .copied()
        .filter(|a| m.agents.contains_key(*a))
        .collect();
    // Mostly agents it knows, sometimes any.
    let agent = |rng: &mut StdRng| -> String {
        if known.is_empty() || rng.random_bool(0.15) {
            pick(rng, &AGENTS).to_owned()
        } else {
            pick(rng, &known).to_owned()
        }
    };
    let any_key = |rng: &mut StdRng| key(pick(rng, &TENANTS), pick(rng, &PACKS));
    match rng.random_range(0..100) {
        0..15 => {
            let id = agent(rng);
            let cert_tenants = rng.random_bool(0.7).then(|| {
                TENANTS
                    .iter()
                    .filter(|_| rng.random_bool(0.6))
                    .map(|t| (*t).to_owned())
                    .collect()
            });
            Step::Hello(HelloRow {
                labels: random_labels(rng),
                cert_tenants,
                held: random_held(rng, m),
                ..hello(&id, at_ns)
            })
        }
        15..25 => Step::Held(agent(rng), random_held(rng, m)),
        25..37 => {
            let mut set = LabelOverrides::new();
            for k in KEYS {
                if rng.random_bool(0.5) {
                    let hide = rng.random_bool(0.3);
                    set.insert(k.to_owned(), (!hide).then(|| pick(rng, &VALUES).to_owned()));
                }
            }
            let reset = KEYS
                .iter()
                .filter(|_| rng.random_bool(0.25))
                .map(|k| (*k).to_owned())
                .collect();
            Step::Label(agent(rng), pick(rng, &TENANTS).to_owned(), set, reset)
        }
        37..45 => Step::Grant(
            agent(rng),
            pick(rng, &TENANTS).to_owned(),
            rng.random_bool(0.6),
        ),
        45..70 => {
            let k = any_key(rng);
            let version = match m.packs.get(&k) {
                Some(p) => match rng.random_range(0..10) {
                    0 => p.latest.saturating_sub(1).max(1),
                    1 | 2 => p.latest,
                    3..8 => p.latest + 1,
                    _ => p.latest + 2,
                },
                None => rng.random_range(1..4),
            };
            let targets = match rng.random_range(0..10) {
                0 => TargetsRow::Nobody,
                1..5 => {
                    let mut ids: Vec<String> = AGENTS
                        .iter()
                        .filter(|_| rng.random_bool(0.4))
                        .map(|a| (*a).to_owned())
                        .collect();
                    if rng.random_bool(0.1) {
                        ids.push("ghost".into());
                    }
                    TargetsRow::Agents(ids)
                }
                _ => TargetsRow::Labels(random_labels(rng)),
            };
            let mut p = PackVersionRow {
                targets,
                pushed: RefTime::from_nanos(at_ns),
                ..pack(&k.tenant, &k.pack, version, TargetsRow::Nobody)
            };
            if rng.random_bool(0.1) {
                p.yaml.push_str("# edited\n");
            }
            Step::Push(p)
        }
        70..78 => Step::Cancel(any_key(rng)),
        78..95 => {
            let id = agent(rng);
            let rows: Vec<&DeliveryRow> = m.rows.values().filter(|r| r.agent_id == id).collect();
            let (k, base) = if rows.is_empty() || rng.random_bool(0.1) {
                (any_key(rng), 1)
            } else {
                let r = rows[rng.random_range(0..rows.len())];
                (r.key(), r.version)
            };
            let version = match rng.random_range(0..6) {
                0 => base.saturating_sub(1).max(1),
                1 => base + 1,
                _ => base,
            };
            let answer = if rng.random_bool(0.5) {
                Answer::Acked
            } else {
                let mut r = refusal(
                    version,
                    rng.random_bool(0.5),
                    &format!("refused at {at_ns}"),
                );
                if rng.random_bool(0.5) {
                    r.errors.push(ErrorRow {
                        line: rng.random_range(0..9),
                        column: 1,
                        instruction: "i".into(),
                        message: "bad".into(),
                    });
                }
                Answer::Refused(r)
            };
            Step::Answer(AnswerRow {
                agent_id: id,
                key: k,
                version,
                answer,
                attempts: rng.random_range(0..4),
                session_gen: 0, // the agent's, when the step runs
                at: RefTime::from_nanos(at_ns),
            })
        }
        _ => Step::Reconcile(any_key(rng)),
    }
}

async fn run_sequence(s: &dyn Store, binding: Binding, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed ^ ((binding as u64) << 32));
    let mut m = Model::new(binding);
    let mut trail = Trail {
        seed,
        binding,
        steps: Vec::new(),
    };
    for i in 0..STEPS {
        let at_ns = 1_000 + 10 * i64::try_from(i).unwrap();
        let step = random_step(&mut rng, &m, at_ns);
        trail.steps.push(format!("{step:?}"));
        apply(s, &mut m, &trail, step, at_ns).await;
        // Every agent's rows, and every pack's.
        for id in AGENTS {
            trail.check(
                &format!("rows of {id}"),
                &s.deliveries_of_agent(id).await.unwrap(),
                &m.rows_of(id),
            );
        }
        trail.check("packs", &s.packs(None).await.unwrap(), &m.summaries());
        for t in TENANTS {
            for p in PACKS {
                let k = key(t, p);
                let want: Vec<DeliveryRow> = m
                    .rows
                    .values()
                    .filter(|r| r.key() == k && r.state != DeliveryState::Local)
                    .cloned()
                    .collect();
                trail.check(
                    &format!("deliveries of {k}"),
                    &s.deliveries_of_pack(&k, None, None, 0).await.unwrap(),
                    &sorted(want),
                );
            }
        }
        let agents: Vec<AgentRow> = m.agents.keys().filter_map(|id| m.agent(id)).collect();
        trail.check(
            "agents",
            &s.agents(AgentFilter::default()).await.unwrap(),
            &agents,
        );
    }
}

async fn apply(s: &dyn Store, m: &mut Model, trail: &Trail, step: Step, at_ns: i64) {
    match step {
        Step::Hello(h) => {
            let got = s.agent_hello(h.clone()).await.unwrap();
            let prev = m.agents.get(&h.id).cloned();
            let mut a = prev.unwrap_or_else(|| AgentRow::new(&h.id, &h.journal_id));
            a.labels = h.labels.clone();
            a.agent_version = h.agent_version.clone();
            a.trust = h.trust.clone();
            a.arch = h.arch.clone();
            if let Some(u) = &h.update {
                a.update = Some(u.clone());
            }
            a.journal_id = h.journal_id.clone();
            a.connected = true;
            a.last_seen = h.at;
            a.session_gen += 1;
            // Which replica took the hello is the engine's to say.
            a.owner = got.0.owner.clone();
            m.agents.insert(h.id.clone(), a);
            if let Some(t) = &h.cert_tenants {
                m.cert.insert(h.id.clone(), t.iter().cloned().collect());
            }
            m.replan(Some((&h.id, &h.held)), at_ns);
            let want = (m.agent(&h.id).unwrap(), m.rows_of(&h.id));
            trail.check("hello", &got, &want);
        }
        Step::Held(id, held) => {
            let session = m.agents.get(&id).map_or(0, |a| a.session_gen);
            let got = s
                .agent_held(&id, session, held.clone(), RefTime::from_nanos(at_ns))
                .await;
            if m.agents.contains_key(&id) {
                let want = m.replan(Some((&id, &held)), at_ns);
                trail.check("held", &sorted(got.unwrap()), &sorted(want));
            } else {
                trail.check("held of an unknown agent fails", &got.is_err(), &true);
            }
        }
        Step::Label(id, tenant, set, reset) => {
            let got = s
                .label_agent(
                    &id,
                    &tenant,
                    set.clone(),
                    reset.clone(),
                    RefTime::from_nanos(at_ns),
                )
                .await;
            match m.agents.get_mut(&id) {
                Some(a) => {
                    let o = a.overrides.entry(tenant.clone()).or_default();
                    o.extend(set);
                    for k in &reset {
                        o.remove(k);
                    }
                    if o.is_empty() {
                        a.overrides.remove(&tenant);
                    }
                    let changed = m.replan(None, at_ns);
                    let (agent, rows) = got.unwrap();
                    trail.check("labelled agent", &agent, &m.agent(&id).unwrap());
                    trail.check("label", &sorted(rows), &sorted(changed));
                }
                None => trail.check(
                    "label of an unknown agent",
                    &matches!(got, Err(StoreError::NoSuchAgent { .. })),
                    &true,
                ),
            }
        }
        Step::Grant(id, tenant, granted) => {
            let got = s
                .grant(&id, &tenant, granted, RefTime::from_nanos(at_ns))
                .await
                .unwrap();
            let g = m.grants.entry(id.clone()).or_default();
            if granted {
                g.insert(tenant);
            } else {
                g.remove(&tenant);
            }
            let changed = m.replan(None, at_ns);
            trail.check("grant", &sorted(got), &sorted(changed));
        }
        Step::Push(p) => {
            let k = p.key();
            let got = s.put_pack(p.clone()).await;
            let got = match got {
                Ok(PutPack::Stored) => Put::Stored,
                Ok(PutPack::Unchanged) => Put::Unchanged,
                Err(StoreError::VersionOlder { latest, .. }) => Put::Older(latest),
                Err(StoreError::VersionTaken { .. }) => Put::Taken,
                Err(e) => panic!("put_pack: {e}"),
            };
            trail.check("put_pack", &got, &m.put(&p));
            let got = s
                .reconcile_pack(&k, RefTime::from_nanos(at_ns))
                .await
                .unwrap();
            let changed = m.replan(None, at_ns);
            trail.check("reconcile after a put", &sorted(got), &sorted(changed));
        }
        Step::Cancel(k) => {
            let got = s.cancel_pack(&k, RefTime::from_nanos(at_ns)).await;
            if m.cancel(&k, at_ns) {
                let changed = m.replan(None, at_ns);
                trail.check("cancel", &sorted(got.unwrap()), &sorted(changed));
            } else {
                trail.check(
                    "cancel of a pack nobody has",
                    &matches!(got, Err(StoreError::NoSuchPack { .. })),
                    &true,
                );
            }
        }
        Step::Answer(mut a) => {
            a.session_gen = m.agents.get(&a.agent_id).map_or(0, |a| a.session_gen);
            let got = s.answer(a.clone()).await.unwrap();
            let rk = (a.agent_id.clone(), a.key.clone());
            let want = match (m.agent(&a.agent_id), m.rows.get(&rk)) {
                (Some(agent), Some(row)) => {
                    let next = planner::answered(
                        &agent,
                        m.packs.get(&a.key),
                        row,
                        a.version,
                        &a.answer,
                        a.attempts,
                        m.binding,
                        a.at,
                    );
                    match &next {
                        Some(n) => m.rows.insert(rk, n.clone()),
                        None => m.rows.remove(&rk),
                    };
                    next
                }
                _ => None,
            };
            trail.check("answer", &got, &want);
            let more = m.replan(None, at_ns);
            trail.check("re-planning after an answer", &more, &Vec::new());
        }
        Step::Reconcile(k) => {
            let got = s
                .reconcile_pack(&k, RefTime::from_nanos(at_ns))
                .await
                .unwrap();
            let changed = m.replan(None, at_ns);
            trail.check("reconcile", &sorted(got), &sorted(changed));
        }
    }
}
