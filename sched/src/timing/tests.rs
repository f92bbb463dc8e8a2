use std::collections::{BTreeMap, HashMap, HashSet};

use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;

/// 2026-01-01T00:00:00Z, a realistic reference time.
const T0: Nanos = 1_767_225_600_000_000_000;
const MS: Nanos = 1_000_000;
const SEC: Nanos = 1_000_000_000;

fn wheel_at(origin: Nanos) -> TimingWheel<u32> {
    TimingWheel::with_config(WheelConfig {
        origin,
        ..WheelConfig::default()
    })
}

/// Pops everything due at `now`, as `(deadline, value)`.
fn drain<T>(w: &mut TimingWheel<T>, now: Nanos) -> Vec<(Nanos, T)> {
    std::iter::from_fn(|| w.pop_due(now))
        .map(|(d, _, v)| (d, v))
        .collect()
}

#[test]
fn pops_in_deadline_order() {
    let mut w = wheel_at(T0);
    for (i, d) in [5 * MS, 1, 3 * SEC, 2 * MS, 0, 7].into_iter().enumerate() {
        w.insert(T0 + d, i as u32);
    }
    assert_eq!(w.len(), 6);
    let got = drain(&mut w, T0 + 10 * SEC);
    let deadlines: Vec<_> = got.iter().map(|&(d, _)| d - T0).collect();
    assert_eq!(deadlines, [0, 1, 7, 2 * MS, 5 * MS, 3 * SEC]);
    assert_eq!(
        got.iter().map(|&(_, v)| v).collect::<Vec<_>>(),
        [4, 1, 5, 3, 0, 2]
    );
    assert!(w.is_empty());
    assert_eq!(w.pop_due(i64::MAX), None);
}

#[test]
fn equal_deadlines_fire_in_insertion_order() {
    let mut w = wheel_at(T0);
    // Spread the same deadline over near and far placement: some inserted
    // before the window reaches it, some after.
    let d = T0 + 2 * SEC;
    let marker = w.insert(d - SEC, 1000);
    for v in 0..50 {
        w.insert(d, v);
    }
    // Cancelling the earliest firing finds the next one: moves the window
    // to `d`, whose keys are now in the near run.
    assert_eq!(w.cancel(marker), Some(1000));
    assert_eq!(w.next_deadline(), Some(d));
    assert!(w.boundary > tick(w.tick_shift, d));
    for v in 50..100 {
        w.insert(d, v);
    }
    let values: Vec<_> = drain(&mut w, d).into_iter().map(|(_, v)| v).collect();
    assert_eq!(values, (0..100).collect::<Vec<_>>());
}

#[test]
fn tiebreak_orders_equal_deadlines_before_insertion_order() {
    let mut w = wheel_at(T0);
    let d = T0 + 40 * MS;
    // (tiebreak, value): lower tiebreak first, FIFO within a tiebreak.
    let inserts = [(5, 0), (1, 1), (5, 2), (0, 3), (1, 4), (9, 5)];
    for (tb, v) in inserts {
        w.insert_with_tiebreak(d, tb, v);
    }
    w.insert_with_tiebreak(d - 1, 100, 6); // an earlier deadline beats any tiebreak
    w.insert(d, 7); // plain insert = tiebreak 0, after the earlier tiebreak-0 one
    let values: Vec<_> = drain(&mut w, d).into_iter().map(|(_, v)| v).collect();
    assert_eq!(values, [6, 3, 7, 1, 4, 0, 2, 5]);
}

#[test]
fn ids_are_unique_and_ordered_among_equal_deadlines() {
    let mut w = wheel_at(T0);
    let mut ids = HashSet::new();
    let mut same = Vec::new();
    for i in 0..10_000i64 {
        let id = w.insert(T0 + (i % 97) * 7 * MS, 0);
        assert!(ids.insert(id), "id {id:?} issued twice");
        if i % 97 == 5 {
            same.push(id);
        }
    }
    assert!(
        same.windows(2).all(|p| p[0] < p[1]),
        "ids of one deadline must increase"
    );
    // A popped id is never issued again.
    let (_, first, _) = w.pop_due(T0).expect("due");
    for _ in 0..1000 {
        assert_ne!(w.insert(T0, 0), first);
    }
}

#[test]
fn past_deadlines_are_due_at_once_in_order() {
    let mut w = wheel_at(T0);
    w.insert(T0 + SEC, 0);
    assert_eq!(w.pop_due(T0), None);
    w.insert(T0 - SEC, 1);
    w.insert(T0 - 3 * SEC, 2);
    w.insert(i64::MIN, 3);
    assert_eq!(w.next_deadline(), Some(i64::MIN));
    assert_eq!(
        drain(&mut w, T0),
        [(i64::MIN, 3), (T0 - 3 * SEC, 2), (T0 - SEC, 1)]
    );
    assert_eq!(w.next_deadline(), Some(T0 + SEC));
}

#[test]
fn far_future_deadlines_cross_every_level() {
    // Deadlines from 1 ns to centuries ahead land on every level and must
    // come back in order, each when `now` reaches it and not before.
    let mut w = wheel_at(T0);
    let mut expected = Vec::new();
    for exp in 0..62 {
        for j in 0..3i64 {
            let Some(d) = T0.checked_add((1i64 << exp) + j * 977) else {
                continue;
            };
            let v = expected.len() as u32;
            w.insert(d, v);
            expected.push((d, v));
        }
    }
    expected.sort();
    let mut got = Vec::new();
    for &(d, _) in &expected {
        // Nothing is due a nanosecond early.
        if got.len() < expected.len() && d > T0 {
            while let Some((dd, _, v)) = w.pop_due(d - 1) {
                got.push((dd, v));
            }
        }
        assert_eq!(w.next_deadline(), expected.get(got.len()).map(|&(d, _)| d));
        while let Some((dd, _, v)) = w.pop_due(d) {
            got.push((dd, v));
        }
    }
    assert_eq!(got, expected);
    assert!(w.is_empty());
}

#[test]
fn extreme_deadlines() {
    for origin in [0, T0, i64::MIN, i64::MAX, -1] {
        let mut w = wheel_at(origin);
        let ds = [
            i64::MAX,
            i64::MIN,
            0,
            -1,
            1,
            i64::MAX - 1,
            i64::MIN + 1,
            T0,
            -T0,
        ];
        for (i, &d) in ds.iter().enumerate() {
            w.insert(d, i as u32);
        }
        let mut sorted = ds.to_vec();
        sorted.sort_unstable();
        assert_eq!(w.next_deadline(), Some(i64::MIN));
        let got: Vec<_> = drain(&mut w, i64::MAX)
            .into_iter()
            .map(|(d, _)| d)
            .collect();
        assert_eq!(got, sorted, "origin {origin}");
        // The window is now at the very end of time; inserts still work.
        w.insert(i64::MAX, 1);
        w.insert(i64::MIN, 2);
        assert_eq!(drain(&mut w, i64::MAX), [(i64::MIN, 2), (i64::MAX, 1)]);
    }
}

#[test]
fn extreme_deadlines_with_the_finest_tick() {
    // Regression: with 1 ns ticks the tick space was 2^64 and the boundary
    // after `i64::MAX` overflowed; the tick is now at least 2 ns.
    let mut w: TimingWheel<u32> = TimingWheel::with_config(WheelConfig {
        origin: T0,
        tick_shift: 0,
    });
    w.insert(i64::MAX, 0);
    w.insert(i64::MIN, 1);
    w.insert(T0 + 1, 2);
    assert_eq!(w.next_deadline(), Some(i64::MIN));
    assert_eq!(
        drain(&mut w, i64::MAX),
        [(i64::MIN, 1), (T0 + 1, 2), (i64::MAX, 0)]
    );
    w.insert(i64::MAX, 3);
    assert_eq!(
        w.pop_due(i64::MAX).map(|(d, _, v)| (d, v)),
        Some((i64::MAX, 3))
    );
}

#[test]
fn cancel_before_and_after_pop() {
    let mut w = wheel_at(T0);
    let near = w.insert(T0, 1);
    let far = w.insert(T0 + 3600 * SEC, 2);
    let mid = w.insert(T0 + 5 * MS, 3);
    assert_eq!(w.cancel(mid), Some(3));
    assert_eq!(w.cancel(mid), None, "second cancel");
    assert_eq!(w.len(), 2);
    assert_eq!(w.pop_due(T0), Some((T0, near, 1)));
    assert_eq!(w.cancel(near), None, "cancel after pop");
    assert_eq!(
        w.pop_due(T0 + 10 * MS),
        None,
        "cancelled firing must not fire"
    );
    assert_eq!(w.cancel(TimerId(999)), None, "unknown id");
    assert_eq!(w.cancel(far), Some(2));
    assert!(w.is_empty());
    assert_eq!(w.next_deadline(), None);
    assert_eq!(w.pop_due(i64::MAX), None);
}

#[test]
fn cancel_in_the_drained_window() {
    let mut w = wheel_at(T0);
    w.insert(T0, 100);
    let ids: Vec<_> = (0..10).map(|i| w.insert(T0 + SEC + i, i as u32)).collect();
    // Popping the earlier firing draws the next tick into the sorted run.
    assert_eq!(w.pop_due(T0).map(|(_, _, v)| v), Some(100));
    assert_eq!(w.next_deadline(), Some(T0 + SEC));
    assert!(w.near.len() >= 9, "the tick is in the near window");
    assert_eq!(w.cancel(ids[0]), Some(0));
    assert_eq!(w.cancel(ids[5]), Some(5));
    assert_eq!(w.next_deadline(), Some(T0 + SEC + 1));
    let values: Vec<_> = drain(&mut w, T0 + 2 * SEC)
        .into_iter()
        .map(|(_, v)| v)
        .collect();
    assert_eq!(values, [1, 2, 3, 4, 6, 7, 8, 9]);
}

#[test]
fn next_deadline_is_exact_after_inserts_cancels_and_pops() {
    let mut w = wheel_at(T0);
    assert_eq!(w.next_deadline(), None);
    let a = w.insert(T0 + 10 * SEC + 3, 0);
    assert_eq!(w.next_deadline(), Some(T0 + 10 * SEC + 3));
    // The window has jumped to 10 s ahead; an earlier insert is seen at once.
    let b = w.insert(T0 + 7, 1);
    assert_eq!(w.next_deadline(), Some(T0 + 7));
    let c = w.insert(T0 + 10 * SEC + 2, 2);
    assert_eq!(w.next_deadline(), Some(T0 + 7));
    assert_eq!(w.cancel(b), Some(1));
    assert_eq!(w.next_deadline(), Some(T0 + 10 * SEC + 2));
    assert_eq!(w.cancel(c), Some(2));
    assert_eq!(w.next_deadline(), Some(T0 + 10 * SEC + 3));
    let d = w.insert(T0 + 20 * SEC, 3);
    assert_eq!(
        w.pop_due(T0 + 10 * SEC + 3),
        Some((T0 + 10 * SEC + 3, a, 0))
    );
    assert_eq!(w.next_deadline(), Some(T0 + 20 * SEC));
    assert_eq!(w.pop_due(T0 + 20 * SEC), Some((T0 + 20 * SEC, d, 3)));
    assert_eq!(w.next_deadline(), None);
}

#[test]
fn pop_due_respects_now_and_tolerates_time_going_backwards() {
    let mut w = wheel_at(T0);
    w.insert(T0 + 5 * MS, 0);
    w.insert(T0 + 9 * MS, 1);
    assert_eq!(w.pop_due(T0 + 5 * MS - 1), None);
    assert_eq!(
        w.pop_due(T0 + 5 * MS).map(|(d, _, v)| (d, v)),
        Some((T0 + 5 * MS, 0))
    );
    // The clock steps back: nothing is due, nothing is lost.
    assert_eq!(w.pop_due(T0 - SEC), None);
    w.insert(T0 - 2 * SEC, 2);
    assert_eq!(w.pop_due(T0 - SEC).map(|(_, _, v)| v), Some(2));
    assert_eq!(w.pop_due(T0 + 9 * MS).map(|(_, _, v)| v), Some(1));
    assert!(w.is_empty());
}

#[test]
fn small_ticks_and_origin_at_epoch() {
    for tick_shift in [0, 1, 6, 13, 40, 63] {
        let mut w: TimingWheel<u32> = TimingWheel::with_config(WheelConfig {
            origin: 0,
            tick_shift,
        });
        let mut rng = ChaCha8Rng::seed_from_u64(u64::from(tick_shift));
        let mut expected = Vec::new();
        for v in 0..2000 {
            let d = T0 + rng.random_range(-SEC..100 * SEC);
            w.insert(d, v);
            expected.push((d, v));
        }
        expected.sort();
        assert_eq!(drain(&mut w, i64::MAX), expected, "tick_shift {tick_shift}");
    }
}

#[test]
fn churn_of_far_cancels_keeps_memory_bounded() {
    // A far firing re-inserted and cancelled over and over (a pack replaced
    // again and again) must not pile up tombstones.
    // An earlier firing stays pending, so the churn never cancels the first
    // one (which would move the window out): every cancel leaves a
    // tombstone in the levels.
    let mut w = wheel_at(T0);
    let soon = w.insert(T0 + MS, 0);
    let keep = w.insert(T0 + 3600 * SEC, u32::MAX);
    for i in 0..100_000u32 {
        let id = w.insert(T0 + 60 * SEC + i64::from(i) * MS, i);
        assert_eq!(w.cancel(id), Some(i));
        assert!(w.tombstones <= 2 + SWEEP_SLACK);
        assert!(w.levels.key_count() <= 4 + SWEEP_SLACK);
    }
    assert!(w.sweeps > 0, "the sweep never ran");
    assert_eq!(w.len(), 2);
    assert_eq!(w.next_deadline(), Some(T0 + MS));
    assert_eq!(w.pop_due(T0 + MS), Some((T0 + MS, soon, 0)));
    assert_eq!(w.next_deadline(), Some(T0 + 3600 * SEC));
    assert_eq!(w.pop_due(i64::MAX), Some((T0 + 3600 * SEC, keep, u32::MAX)));
}

#[test]
fn churn_of_near_cancels_keeps_memory_bounded() {
    let mut w = wheel_at(T0);
    // Move the window far ahead (cancelling the first firing finds the next
    // one), so everything below goes to the near heap.
    let gone = w.insert(T0, 0);
    w.insert(T0 + 3600 * SEC, 0);
    assert_eq!(w.cancel(gone), Some(0));
    assert_eq!(w.next_deadline(), Some(T0 + 3600 * SEC));
    // A live firing ahead of the churn, so no cancel is of the first one.
    let soon = w.insert(T0 + MS, 1);
    for i in 0..20_000u32 {
        let id = w.insert(T0 + SEC + i64::from(i), i);
        assert_eq!(w.cancel(id), Some(i));
        assert!(
            w.near.len() <= 4 + SWEEP_SLACK,
            "{} keys in the near window",
            w.near.len()
        );
    }
    assert!(w.sweeps > 0, "the sweep never ran");
    assert_eq!(w.levels.key_count(), 0);
    assert_eq!(w.pop_due(T0 + MS), Some((T0 + MS, soon, 1)));
    assert_eq!(w.next_deadline(), Some(T0 + 3600 * SEC));
}

#[test]
fn values_are_dropped_exactly_once() {
    use std::sync::Arc;
    let token = Arc::new(());
    {
        let w = wheel_at(T0);
        let mut w2: TimingWheel<Arc<()>> = TimingWheel::with_config(WheelConfig {
            origin: T0,
            ..Default::default()
        });
        drop(w);
        let a = w2.insert(T0 + SEC, Arc::clone(&token));
        w2.insert(T0 + 2 * SEC, Arc::clone(&token));
        w2.insert(T0 - SEC, Arc::clone(&token));
        assert_eq!(Arc::strong_count(&token), 4);
        drop(w2.cancel(a));
        drop(w2.pop_due(T0));
        assert_eq!(Arc::strong_count(&token), 2);
    }
    assert_eq!(Arc::strong_count(&token), 1, "pending value leaked on drop");
}

#[test]
fn wheel_is_send_and_sync() {
    // By construction: plain data, no `unsafe impl`.
    fn check<S: Send + Sync>() {}
    check::<TimingWheel<u32>>();
    check::<TimingWheel<std::sync::mpsc::Sender<u8>>>();
}

// ---------------------------------------------------------------------------
// Model test: random operations against a BTreeMap.

#[derive(Clone, Debug)]
enum Op {
    /// Deadline = now + offset (offset may be negative: in the past).
    Insert {
        offset: i64,
        tiebreak: u64,
    },
    /// Deadline at an extreme or fixed point of the time line.
    InsertAbsolute {
        deadline: i64,
    },
    /// Cancel the `n`-th id ever issued (modulo), popped or not.
    Cancel {
        n: usize,
    },
    /// Advance `now` (or step it back if negative), then pop once.
    Pop {
        step: i64,
    },
    /// Pop everything due at the current `now`.
    PopAll,
    NextDeadline,
}

/// Offsets across scales: sub-tick, ticks, seconds, hours, years, ages.
fn offset() -> impl Strategy<Value = i64> {
    (0u32..8, any::<i64>(), prop::bool::weighted(0.15)).prop_map(|(scale, raw, past)| {
        let bits = [4, 12, 20, 26, 32, 40, 50, 62][scale as usize];
        let magnitude = (raw & i64::MAX) >> (63 - bits);
        if past { -magnitude } else { magnitude }
    })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (offset(), 0u64..3).prop_map(|(offset, tiebreak)| Op::Insert { offset, tiebreak }),
        1 => prop::sample::select(vec![i64::MIN, i64::MAX, 0, -1, T0, T0 + 1])
            .prop_map(|deadline| Op::InsertAbsolute { deadline }),
        3 => any::<usize>().prop_map(|n| Op::Cancel { n }),
        4 => prop_oneof![offset(), Just(0), -1_000i64..1_000].prop_map(|step| Op::Pop { step }),
        1 => Just(Op::PopAll),
        2 => Just(Op::NextDeadline),
    ]
}

fn run_model(tick_shift: u32, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut w: TimingWheel<u64> = TimingWheel::with_config(WheelConfig {
        origin: T0,
        tick_shift,
    });
    let mut model: BTreeMap<(Nanos, u64, u64), u64> = BTreeMap::new();
    let mut keys: HashMap<u64, (Nanos, u64, u64)> = HashMap::new();
    let mut issued: Vec<TimerId> = Vec::new();
    let mut now = T0;
    let mut next_value = 0u64;
    for op in ops {
        match *op {
            Op::Insert { .. } | Op::InsertAbsolute { .. } => {
                let (deadline, tiebreak) = match *op {
                    Op::Insert { offset, tiebreak } => (now.saturating_add(offset), tiebreak),
                    Op::InsertAbsolute { deadline } => (deadline, 0),
                    _ => unreachable!(),
                };
                let value = next_value;
                next_value += 1;
                let id = w.insert_with_tiebreak(deadline, tiebreak, value);
                prop_assert!(!issued.contains(&id), "id reused");
                issued.push(id);
                let key = (deadline, tiebreak, id.0);
                model.insert(key, value);
                keys.insert(id.0, key);
            }
            Op::Cancel { n } => {
                if issued.is_empty() {
                    continue;
                }
                let id = issued[n % issued.len()];
                let expected = keys.remove(&id.0).and_then(|key| model.remove(&key));
                prop_assert_eq!(w.cancel(id), expected, "cancel {:?}", id);
            }
            Op::Pop { step } => {
                now = now.saturating_add(step);
                let expected = model
                    .first_key_value()
                    .filter(|((d, _, _), _)| *d <= now)
                    .map(|(&k, &v)| (k, v));
                if let Some((k, _)) = expected {
                    model.remove(&k);
                    keys.remove(&k.2);
                }
                let got = w.pop_due(now);
                prop_assert_eq!(
                    got,
                    expected.map(|((d, _, s), v)| (d, TimerId(s), v)),
                    "pop at {}",
                    now
                );
            }
            Op::PopAll => loop {
                let expected = model
                    .first_key_value()
                    .filter(|((d, _, _), _)| *d <= now)
                    .map(|(&k, &v)| (k, v));
                if let Some((k, _)) = expected {
                    model.remove(&k);
                    keys.remove(&k.2);
                }
                let got = w.pop_due(now);
                prop_assert_eq!(got, expected.map(|((d, _, s), v)| (d, TimerId(s), v)));
                if got.is_none() {
                    break;
                }
            },
            Op::NextDeadline => {
                let expected = model.keys().next().map(|k| k.0);
                prop_assert_eq!(w.next_deadline(), expected);
            }
        }
        prop_assert_eq!(w.len(), model.len());
        // Exact at every step, not only when asked.
        prop_assert_eq!(w.next_deadline(), model.keys().next().map(|k| k.0));
        // Every key is live or a counted tombstone, in the levels or the
        // near window, and the near window is below the boundary.
        prop_assert_eq!(w.levels.key_count() + w.near.len(), w.len() + w.tombstones);
        if let Some(head) = w.near.head() {
            prop_assert!(tick(w.tick_shift, head.deadline) < w.boundary);
        }
        // A clean near window has no tombstone (its head is taken as live).
        if w.near_clean {
            prop_assert!(w.near.keys().all(|key| keys.contains_key(&key.id)));
        }
    }
    // Finally everything comes out, in order.
    let rest: Vec<_> = std::iter::from_fn(|| w.pop_due(i64::MAX)).collect();
    let expected: Vec<_> = model
        .into_iter()
        .map(|((d, _, s), v)| (d, TimerId(s), v))
        .collect();
    prop_assert_eq!(rest, expected);
    prop_assert!(w.is_empty());
    Ok(())
}

proptest! {
    // 256 cases by default; PROPTEST_CASES=n for a longer soak.
    #[test]
    fn matches_btreemap_model(
        tick_shift in prop::sample::select(vec![0u32, 3, 10, 20, 30]),
        ops in prop::collection::vec(op(), 1..300),
    ) {
        run_model(tick_shift, &ops)?;
    }
}
