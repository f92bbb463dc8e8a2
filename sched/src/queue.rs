//! The core's pending-firing queue: exact (deadline, tiebreak, sequence)
//! order, cancel by id.
//!
//! Placeholder over a `BTreeMap` with the same interface as the timing wheel
//! in `crate::timing`, so the core does not depend on its internals.

use std::collections::{BTreeMap, HashMap};

/// Handle for cancelling an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TimerId(pub u64);

/// Pending entries in firing order.
#[derive(Debug)]
pub(crate) struct Queue<T> {
    map: BTreeMap<(i64, u64, u64), T>,
    keys: HashMap<u64, (i64, u64)>,
    seq: u64,
}

impl<T> Queue<T> {
    pub(crate) fn new() -> Self {
        Queue {
            map: BTreeMap::new(),
            keys: HashMap::new(),
            seq: 0,
        }
    }

    pub(crate) fn insert_with_tiebreak(
        &mut self,
        deadline: i64,
        tiebreak: u64,
        value: T,
    ) -> TimerId {
        self.seq += 1;
        self.map.insert((deadline, tiebreak, self.seq), value);
        self.keys.insert(self.seq, (deadline, tiebreak));
        TimerId(self.seq)
    }

    pub(crate) fn cancel(&mut self, id: TimerId) -> Option<T> {
        let (d, t) = self.keys.remove(&id.0)?;
        self.map.remove(&(d, t, id.0))
    }

    pub(crate) fn pop_due(&mut self, now: i64) -> Option<(i64, TimerId, T)> {
        let (&(d, _, s), _) = self.map.first_key_value()?;
        if d > now {
            return None;
        }
        let ((d, _, s2), v) = self.map.pop_first()?;
        debug_assert_eq!(s, s2);
        self.keys.remove(&s2);
        Some((d, TimerId(s2), v))
    }

    pub(crate) fn next_deadline(&self) -> Option<i64> {
        self.map.first_key_value().map(|((d, _, _), _)| *d)
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
}
