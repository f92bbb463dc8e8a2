//! Switch fences (`Scheduler::switch_fence`): a pack staged to switch at
//! an instant releases nothing of its held version due after that instant
//! — neither armed ahead by `tick_ahead`, whatever the horizon, nor handed
//! out as due by `tick` — so an old-program stroke can never follow the switch,
//! however late the runtime gets to it. Lifted, the fence releases what it
//! held as any occurrence that comes due late: fired late or reported
//! skipped, each once.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use baton_proto::RefTime;
use baton_proto::pack::parse_pack;
use baton_sched::{
    AttemptResult, Config, EventKind, Output, PackKey, Reason, Scheduler, Withdrawal,
};
use proptest::prelude::*;

const BASE: i64 = 1_796_119_200_000_000_000; // 2026-12-01T10:00:00Z

fn ms(n: i64) -> RefTime {
    RefTime::from_nanos(BASE + n * 1_000_000)
}

fn dur(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Milliseconds from `BASE`.
fn at_ms(t: RefTime) -> i64 {
    (t.as_nanos() - BASE) / 1_000_000
}

/// Version `version` of pack `p`: one toggle every `period` ms from `BASE`.
fn pack(version: u64, period: u64, max_lateness: u64) -> baton_proto::Pack {
    parse_pack(&format!(
        "pack: p\nversion: {version}\ninstructions:\n  - {{id: t, action: gpio.toggle, params: {{line: {version}}}, every: {period}ms, start_at: 2026-12-01T10:00:00Z, max_lateness: {max_lateness}ms, catch_up: none}}\n"
    ))
    .expect("test pack")
}

fn key() -> PackKey {
    PackKey {
        tenant: "default".into(),
        pack: "p".into(),
    }
}

/// What a model runtime saw: firings (version, occurrence in ms), skips
/// (reason, occurrence in ms), withdrawals asked.
#[derive(Debug, Default)]
struct Seen {
    fired: Vec<(u64, i64)>,
    skipped: Vec<(Reason, Option<i64>)>,
    withdrawn: usize,
}

/// A model runtime around the core: each firing handed out runs at its
/// instant and succeeds; a withdrawal is granted if asked before the
/// instant, too late after it (as the agent's ledger answers).
struct Model {
    core: Scheduler,
    seen: Seen,
    out: Vec<Output>,
}

impl Model {
    fn new(v1: baton_proto::Pack) -> Self {
        let mut core = Scheduler::new(Config::default(), HashMap::new());
        let mut out = Vec::new();
        core.accept(v1, ms(0))
            .drain_into(&mut out)
            .expect("v1 accepted");
        let mut m = Model {
            core,
            seen: Seen::default(),
            out,
        };
        m.settle(ms(0));
        m
    }

    /// Act on what the core decided at `now`.
    fn settle(&mut self, now: RefTime) {
        while !self.out.is_empty() {
            for o in std::mem::take(&mut self.out) {
                match o {
                    Output::Fire(f) => {
                        self.seen.fired.push((f.id.version, at_ms(f.id.occurrence)));
                        let ok = AttemptResult::Ok { value: None };
                        self.core
                            .attempt_result(&f.id, ok, f.scheduled.max(now))
                            .drain_into(&mut self.out);
                    }
                    Output::Withdraw { id, .. } => {
                        self.seen.withdrawn += 1;
                        let answer = if id.occurrence > now {
                            Withdrawal::Withdrawn
                        } else {
                            Withdrawal::TooLate
                        };
                        self.core
                            .withdrawal(&id, answer, now)
                            .drain_into(&mut self.out);
                    }
                    Output::Event(e) => {
                        if let EventKind::Skip { reason, .. } = e.kind {
                            self.seen.skipped.push((reason, e.occurrence.map(at_ms)));
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    /// The control loop from `from` until `until`, arming `horizon`
    /// ahead, waking when the core asks (or every `step` at most).
    /// Returns how many passes it took.
    fn run(&mut self, from: RefTime, until: RefTime, horizon: Duration) -> usize {
        let mut now = from;
        let mut passes = 0;
        while now <= until {
            passes += 1;
            self.core.tick_ahead(now, horizon).drain_into(&mut self.out);
            self.settle(now);
            now = match self.core.next_wake() {
                Some(w) => w
                    .saturating_sub(horizon)
                    .max(now + Duration::from_micros(1)),
                None => break,
            };
        }
        passes
    }

    fn v1_after(&self, at: i64) -> Vec<(u64, i64)> {
        self.seen
            .fired
            .iter()
            .copied()
            .filter(|&(v, o)| v == 1 && o > at)
            .collect()
    }
}

#[test]
fn nothing_past_the_fence_is_armed_whatever_the_horizon() {
    for horizon in [0, 1, 5, 50, 500, 5_000] {
        let mut m = Model::new(pack(1, 10, 1_000));
        m.core.switch_fence(&key(), Some(ms(205)));
        assert_eq!(m.core.switch_fence_at(&key()), Some(ms(205)));
        let passes = m.run(ms(0), ms(10_000), dur(horizon));
        let v1: Vec<i64> = m.seen.fired.iter().map(|f| f.1).collect();
        let expected: Vec<i64> = (0..=20).map(|n| n * 10).collect();
        assert_eq!(v1, expected, "horizon {horizon} ms");
        // Held, not due: the loop is not woken for it again (no busy loop).
        assert_eq!(m.core.next_wake(), None, "horizon {horizon} ms");
        assert!(passes < 100, "{passes} passes");
        assert!(m.seen.skipped.is_empty(), "{:?}", m.seen.skipped);
    }
}

#[test]
fn tick_hands_out_nothing_past_the_fence_once_due() {
    let mut m = Model::new(pack(1, 10, 1_000));
    m.core.switch_fence(&key(), Some(ms(100)));
    // Without arming ahead, every millisecond, long past the instant: an
    // occurrence at the instant itself is the old version's.
    for n in 0..1_000 {
        m.core.tick(ms(n)).drain_into(&mut m.out);
        m.settle(ms(n));
    }
    let last = m.seen.fired.iter().map(|f| f.1).max();
    assert_eq!(last, Some(100));
    assert_eq!(m.seen.fired.len(), 11);
    assert_eq!(m.core.next_wake(), None);
}

/// The switch at the instant, on time or late (as of the instant, as the
/// agent makes it), and as of a later moment. The old version fires
/// nothing after the instant; what it held that fell before a late switch
/// is reported not run, once, under it; the new version's grid points
/// between the instant and a late switch are reported not run, once, in
/// one event under the new version (issue 37), never the same instant
/// twice; the new version fires from its own grid.
#[test]
fn a_switch_at_the_fence_leaves_the_old_version_nothing_after_it() {
    // (instant, switch, as of)
    let cases = [(255, 255, 255), (255, 290, 255), (255, 420, 420)];
    for (at, switch, as_of) in cases {
        let mut m = Model::new(pack(1, 10, 1_000));
        m.core.switch_fence(&key(), Some(ms(at)));
        m.run(ms(0), ms(switch - 1), dur(50));
        m.core
            .accept_at(pack(2, 10, 1_000), ms(as_of), ms(switch))
            .drain_into(&mut m.out)
            .expect("v2");
        m.settle(ms(switch));
        assert_eq!(
            m.core.switch_fence_at(&key()),
            None,
            "the fence went with v1"
        );
        m.run(ms(switch), ms(switch + 200), dur(50));
        assert!(m.v1_after(at).is_empty(), "{:?}", m.v1_after(at));
        assert_eq!(m.seen.withdrawn, 0, "nothing past the instant to ask back");
        let v2: Vec<i64> = m
            .seen
            .fired
            .iter()
            .filter(|f| f.0 == 2)
            .map(|f| f.1)
            .collect();
        assert!(v2.iter().all(|&o| o > switch), "{v2:?}");
        assert!(!v2.is_empty());
        // v1's held 260 ms, due before a late switch: reported, once.
        let replaced: Vec<Option<i64>> = m
            .seen
            .skipped
            .iter()
            .filter(|s| s.0 == Reason::Replaced)
            .map(|s| s.1)
            .collect();
        // v2's 270 and 280 (its 260 is v1's, reported) when it switched
        // late as of the instant.
        let expect = match (switch, as_of) {
            (s, a) if s >= 260 && a < s => vec![Some(260), Some(270)],
            (s, _) if s >= 260 => vec![Some(260)],
            _ => vec![],
        };
        assert_eq!(replaced, expect, "switch at {switch}");
        let mut once = m.seen.fired.clone();
        once.sort_unstable_by_key(|f| f.1);
        once.dedup_by_key(|f| f.1);
        assert_eq!(once.len(), m.seen.fired.len(), "{:?}", m.seen.fired);
    }
}

/// An unchanged instruction carries its held occurrence over: the new
/// version fires it (late, when the switch was late), never the old one.
/// Version `version` of an unchanged instruction: a toggle every 10 ms.
fn unchanged(version: u64) -> baton_proto::Pack {
    parse_pack(&format!(
        "pack: p\nversion: {version}\ninstructions:\n  - {{id: t, action: gpio.toggle, params: {{line: 1}}, every: 10ms, start_at: 2026-12-01T10:00:00Z, max_lateness: 1s}}\n"
    ))
    .expect("pack")
}

/// v1 fenced at 255 ms, v2 (the same instruction) switched in at
/// `switch`: what v2 fired, and what was skipped.
fn switch_unchanged(switch: i64) -> (Vec<i64>, Vec<(Reason, Option<i64>)>) {
    let mut m = Model::new(unchanged(1));
    m.core.switch_fence(&key(), Some(ms(255)));
    m.run(ms(0), ms(switch - 1), dur(50));
    m.core
        .accept_at(unchanged(2), ms(255), ms(switch))
        .drain_into(&mut m.out)
        .expect("v2");
    m.settle(ms(switch));
    m.run(ms(switch), ms(400), dur(50));
    assert!(m.v1_after(255).is_empty());
    let v2 = m
        .seen
        .fired
        .iter()
        .filter(|f| f.0 == 2)
        .map(|f| f.1)
        .collect();
    (v2, m.seen.skipped)
}

#[test]
fn an_unchanged_instruction_fires_its_held_occurrence_under_the_new_version() {
    // Switched 7 ms after the instant: the one occurrence held (260) is
    // not due yet, and fires on time under v2.
    let (v2, skipped) = switch_unchanged(262);
    assert_eq!(v2.first(), Some(&260), "{v2:?}");
    assert!(skipped.is_empty(), "{skipped:?}");
    // 3 ms after it: due already, it fires once, late.
    let (v2, skipped) = switch_unchanged(263);
    assert_eq!(&v2[..2], [260, 270], "{v2:?}");
    assert!(skipped.is_empty(), "{skipped:?}");
}

/// A switch 35 ms after the instant, with a 10 ms period: four of the
/// unchanged instruction's occurrences are due at once (260 to 290).
/// The latest fires, the three before it are reported in one event
/// (`replaced`), never a burst of four strokes in a row.
#[test]
fn a_late_switch_fires_an_unchanged_instruction_once_not_in_a_burst() {
    let (v2, skipped) = switch_unchanged(290);
    assert_eq!(&v2[..3], [290, 300, 310], "{v2:?}");
    assert_eq!(skipped, [(Reason::Replaced, Some(260))]);
}

#[test]
fn a_lifted_fence_releases_what_it_held_late_within_max_lateness() {
    let mut m = Model::new(pack(1, 10, 1_000));
    m.core.switch_fence(&key(), Some(ms(100)));
    m.run(ms(0), ms(149), dur(50));
    assert_eq!(m.seen.fired.len(), 11);
    // The switch was refused at 150 ms: the held 110 ms, then those after
    // it, fire late, once each; the schedule goes on.
    m.core.switch_fence(&key(), None);
    assert_eq!(m.core.switch_fence_at(&key()), None);
    assert_eq!(m.core.next_wake(), Some(ms(110)), "due at once");
    m.run(ms(150), ms(300), dur(50));
    let occ: Vec<i64> = m.seen.fired.iter().map(|f| f.1).collect();
    let expected: Vec<i64> = (0..=30).map(|n| n * 10).collect();
    assert_eq!(occ[..31], expected[..]);
    assert!(m.seen.skipped.is_empty(), "{:?}", m.seen.skipped);
}

#[test]
fn a_lifted_fence_reports_what_is_too_late_to_fire_once() {
    let mut m = Model::new(pack(1, 10, 5));
    m.core.switch_fence(&key(), Some(ms(100)));
    m.run(ms(0), ms(149), dur(50));
    m.core.switch_fence(&key(), None);
    m.run(ms(150), ms(300), dur(50));
    let occ: Vec<i64> = m.seen.fired.iter().map(|f| f.1).collect();
    // 110 to 140 ms are past max_lateness when released at 150 ms: one
    // report of the gap (catch_up: none); 150 ms on fire on time.
    assert!(occ.iter().all(|&o| o <= 100 || o >= 150), "{occ:?}");
    assert!(occ.contains(&150) && occ.contains(&300), "{occ:?}");
    assert_eq!(m.seen.skipped.len(), 1, "{:?}", m.seen.skipped);
    assert_eq!(m.seen.skipped[0], (Reason::Late, Some(110)));
}

#[test]
fn a_moved_fence_releases_what_is_now_before_it() {
    let mut m = Model::new(pack(1, 10, 1_000));
    m.core.switch_fence(&key(), Some(ms(100)));
    m.run(ms(0), ms(80), dur(50));
    // Staged again with a later instant before the first one came: the
    // held 110 ms goes out on time, and nothing past 200 ms.
    m.core.switch_fence(&key(), Some(ms(200)));
    m.run(ms(80), ms(1_000), dur(50));
    let occ: Vec<i64> = m.seen.fired.iter().map(|f| f.1).collect();
    let expected: Vec<i64> = (0..=20).map(|n| n * 10).collect();
    assert_eq!(occ, expected);
}

/// A version accepted to run now in place of the fenced one (a local
/// pack file) keeps the fence: nothing of it past the instant is armed
/// ahead, whatever the horizon, until the switch or a lift.
#[test]
fn a_version_replacing_the_fenced_one_to_run_now_keeps_the_fence() {
    let mut m = Model::new(pack(1, 10, 1_000));
    m.core.switch_fence(&key(), Some(ms(205)));
    m.run(ms(0), ms(100), dur(50));
    m.core
        .accept(pack(2, 10, 1_000), ms(100))
        .drain_into(&mut m.out)
        .expect("v2 accepted");
    m.settle(ms(100));
    assert_eq!(m.core.switch_fence_at(&key()), Some(ms(205)));
    m.run(ms(100), ms(10_000), dur(50));
    let v2: Vec<i64> = m
        .seen
        .fired
        .iter()
        .filter(|&&(v, _)| v == 2)
        .map(|&(_, o)| o)
        .collect();
    assert!(!v2.is_empty(), "v2 runs up to the instant");
    assert!(v2.iter().all(|&o| o <= 205), "past the fence: {v2:?}");
    // (v1 was armed 50 ms ahead of 100 before it was replaced.)
    assert!(m.v1_after(150).is_empty(), "v1 replaced at 100");
    // The staged version goes without switching: the fence is lifted and
    // v2 carries on from where it was held.
    m.core.switch_fence(&key(), None);
    m.run(ms(10_000), ms(10_100), dur(50));
    let last = m.seen.fired.iter().map(|&(_, o)| o).max();
    assert!(last.is_some_and(|o| o > 10_000), "{last:?}");
}

#[test]
fn a_cancelled_pack_reports_what_its_fence_held_as_skipped() {
    let mut m = Model::new(pack(1, 10, 1_000));
    m.core.switch_fence(&key(), Some(ms(100)));
    m.run(ms(0), ms(150), dur(50));
    let cancelled = m.core.cancel(&key(), ms(150)).drain_into(&mut m.out);
    assert!(cancelled);
    m.settle(ms(150));
    assert_eq!(m.seen.skipped, [(Reason::Cancel, Some(110))]);
    assert_eq!(m.core.switch_fence_at(&key()), None);
    m.run(ms(150), ms(300), dur(50));
    assert_eq!(m.seen.fired.len(), 11);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever the horizon, instant, lateness of the switch and whether
    /// it happens or is refused: the old version fires nothing after the
    /// instant while fenced, no occurrence fires twice, and after a refusal
    /// every occurrence up to the end is fired or reported.
    #[test]
    fn nothing_of_the_old_version_after_the_instant_and_nothing_twice(
        period in 3u64..40,
        horizon in 0u64..120,
        at in 50i64..400,
        late in 0i64..200,
        max_lateness in 1u64..150,
        switch in any::<bool>(),
    ) {
        let mut m = Model::new(pack(1, period, max_lateness));
        m.core.switch_fence(&key(), Some(ms(at)));
        let when = at + late;
        m.run(ms(0), ms(when - 1), dur(horizon));
        if switch {
            let as_of = if late <= 100 { at } else { when };
            m.core
                .accept_at(pack(2, period, max_lateness), ms(as_of), ms(when))
                .drain_into(&mut m.out)
                .expect("v2");
        } else {
            m.core.switch_fence(&key(), None);
        }
        m.settle(ms(when));
        let end = when + 500;
        m.run(ms(when), ms(end), dur(horizon));
        let mut seen = HashSet::new();
        for f in &m.seen.fired {
            prop_assert!(seen.insert(f.1), "fired twice: {:?}", m.seen.fired);
        }
        if switch {
            prop_assert!(m.v1_after(at).is_empty(), "{:?}", m.v1_after(at));
        } else {
            // Refused: every occurrence of the grid up to `end - horizon`
            // fired or is covered by a report (a gap's one report counts
            // its occurrences from the first).
            let grid = (0..).map(|n| n * period as i64).take_while(|&o| o <= end - 120);
            let reported: Vec<i64> = m.seen.skipped.iter().filter_map(|s| s.1).collect();
            for o in grid {
                let gap_from = reported.iter().any(|&r| r <= o);
                prop_assert!(seen.contains(&o) || gap_from, "{o} lost: {:?} {:?}", m.seen.fired, m.seen.skipped);
            }
        }
    }
}

/// A clock step moves an interval pack's schedule, its held occurrence
/// with it: the copy held at the old instant is stale and never goes out;
/// on a lift only the moved one does, once.
#[test]
fn a_clock_step_while_fenced_never_releases_an_occurrence_twice() {
    let yaml = "pack: p\nversion: 1\ninstructions:\n  - {id: t, action: gpio.toggle, params: {line: 1}, every: 10ms, max_lateness: 1s}\n";
    let mut m = Model::new(parse_pack(yaml).expect("pack"));
    m.core.switch_fence(&key(), Some(ms(100)));
    m.run(ms(0), ms(150), dur(50));
    assert_eq!(m.seen.fired.len(), 11);
    // The reference moved 3 ms ahead of the local clock: the schedule
    // follows it (110 ms becomes 113 ms), still past the fence.
    m.core
        .clock_stepped(3_000_000, ms(150))
        .drain_into(&mut m.out);
    m.settle(ms(150));
    m.run(ms(150), ms(160), dur(50));
    assert_eq!(m.seen.fired.len(), 11, "{:?}", m.seen.fired);
    m.core.switch_fence(&key(), None);
    m.run(ms(160), ms(300), dur(50));
    let occ: Vec<i64> = m.seen.fired.iter().map(|f| f.1).collect();
    let mut once = occ.clone();
    once.dedup();
    assert_eq!(occ, once, "{occ:?}");
    assert_eq!(occ[11], 113, "{occ:?}");
    assert!(m.seen.skipped.is_empty(), "{:?}", m.seen.skipped);
}

/// The core could not act for a while (`downtime`) while fenced: the held
/// occurrence is part of the gap, reported once; nothing is released past
/// the fence meanwhile.
#[test]
fn downtime_while_fenced_reports_the_held_occurrence_in_its_gap_once() {
    let mut m = Model::new(pack(1, 10, 1_000));
    m.core.switch_fence(&key(), Some(ms(100)));
    m.run(ms(0), ms(150), dur(50));
    m.core.downtime(ms(400)).drain_into(&mut m.out);
    m.settle(ms(400));
    m.run(ms(400), ms(600), dur(50));
    assert!(m.v1_after(100).is_empty(), "{:?}", m.v1_after(100));
    m.core.switch_fence(&key(), None);
    m.run(ms(600), ms(800), dur(50));
    let occ: Vec<i64> = m.seen.fired.iter().map(|f| f.1).collect();
    let mut once = occ.clone();
    once.dedup();
    assert_eq!(occ, once, "{occ:?}");
    assert!(occ.contains(&800), "{occ:?}");
    let gaps: Vec<&(Reason, Option<i64>)> = m.seen.skipped.iter().collect();
    assert_eq!(gaps.first(), Some(&&(Reason::Clock, Some(110))), "{gaps:?}");
}

/// The old version's occurrence a switch replaced is reported as the old
/// version's (it was its grid); what the new version missed, as the new
/// one's.
#[test]
fn a_replaced_held_occurrence_is_the_old_versions() {
    let mut m = Model::new(pack(1, 10, 1000));
    m.core.switch_fence(&key(), Some(ms(255)));
    m.run(ms(0), ms(289), dur(50));
    let mut out = Vec::new();
    m.core
        .accept_at(pack(2, 10, 1000), ms(255), ms(290))
        .drain_into(&mut out)
        .expect("v2");
    let replaced: Vec<(Option<u64>, bool)> = out
        .iter()
        .filter_map(|o| match o {
            Output::Event(e) => match &e.kind {
                EventKind::Skip {
                    reason: Reason::Replaced,
                    detail,
                } => Some((e.version, detail.contains("held past the switch instant"))),
                _ => None,
            },
            _ => None,
        })
        .collect();
    assert!(replaced.contains(&(Some(1), true)), "{replaced:?}");
    assert!(
        replaced.iter().all(|(v, held)| *held == (*v == Some(1))),
        "only the held occurrence is v1's: {replaced:?}"
    );
}
