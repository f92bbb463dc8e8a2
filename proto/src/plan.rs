//! The next firings of a pack, for `baton-controller plan`: what an operator
//! reads before pushing a pack.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::pack::{Pack, Schedule, dependents, upstream};
use crate::time::RefTime;

/// One planned firing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedFiring {
    /// Index of the instruction in the pack.
    pub index: usize,
    /// When it fires.
    pub at: RefTime,
}

/// The first `count` firings strictly after `from`, all instructions merged
/// in time order (equal instants: higher priority first, then pack order).
///
/// The pack counts as accepted at `from` (the anchor of an `every` without
/// `start_at`). `after` instructions are planned assuming each upstream
/// succeeds at its own planned instant; a one-shot upstream before `from`
/// still releases its dependents.
pub fn plan(pack: &Pack, from: RefTime, count: usize) -> Vec<PlannedFiring> {
    let tz = &pack.timezone;
    let ins = &pack.instructions;
    let deps = dependents(ins);
    // For each `after` instruction, which of its upstreams have succeeded
    // since it last ran.
    let mut satisfied: Vec<Vec<bool>> =
        ins.iter().map(|i| vec![false; upstream(i).len()]).collect();
    // Min-heap on (instant, higher priority first, pack order).
    let mut heap = BinaryHeap::new();
    let key = |at: RefTime, i: usize| Reverse((at, Reverse(ins[i].priority), i));
    for (i, instr) in ins.iter().enumerate() {
        let first = match instr.schedule {
            Schedule::At(t) => Some(t),
            _ => instr.schedule.next_after(tz, from, from),
        };
        if let Some(t) = first {
            heap.push(key(t, i));
        }
    }
    let mut out = Vec::with_capacity(count);
    // Each pop either emits a firing or releases a dependent; bound the
    // walk so a pack of past one-shots cannot spin.
    let mut budget = count
        .saturating_mul(ins.len().max(1))
        .saturating_add(ins.len() * 2);
    while out.len() < count && budget > 0 {
        budget -= 1;
        let Some(Reverse((at, _, i))) = heap.pop() else {
            break;
        };
        if at > from {
            out.push(PlannedFiring { index: i, at });
        }
        if let Some(next) = ins[i].schedule.next_after(tz, from, at) {
            heap.push(key(next, i));
        }
        for &d in &deps[i] {
            let ups = upstream(&ins[d]);
            for (k, up) in ups.iter().enumerate() {
                if *up == ins[i].id {
                    satisfied[d][k] = true;
                }
            }
            if satisfied[d].iter().all(|s| *s) {
                satisfied[d].iter_mut().for_each(|s| *s = false);
                if let Schedule::After { delay, .. } = ins[d].schedule {
                    heap.push(key(at + delay, d));
                }
            }
        }
    }
    out
}
