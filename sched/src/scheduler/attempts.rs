//! The attempts of one instruction in flight, by occurrence.
//!
//! Almost always zero or one entry (two while a catch-up replay overlaps a
//! live occurrence). A `BTreeMap` allocated a ~1.4 KiB node for the first
//! one: 10 000 one-shots due at one instant cost 14 MB. A sorted `Vec`
//! costs one small allocation, given back when it empties.

use baton_proto::RefTime;

use super::Attempt;

/// Attempts by occurrence, in occurrence order.
#[derive(Clone, Debug, Default)]
pub(super) struct Attempts(Vec<(RefTime, Attempt)>);

impl Attempts {
    fn find(&self, occ: &RefTime) -> Result<usize, usize> {
        self.0.binary_search_by_key(occ, |(o, _)| *o)
    }

    pub(super) fn get(&self, occ: &RefTime) -> Option<&Attempt> {
        self.find(occ).ok().map(|i| &self.0[i].1)
    }

    pub(super) fn get_mut(&mut self, occ: &RefTime) -> Option<&mut Attempt> {
        self.find(occ).ok().map(|i| &mut self.0[i].1)
    }

    /// Insert or replace.
    pub(super) fn insert(&mut self, occ: RefTime, a: Attempt) {
        match self.find(&occ) {
            Ok(i) => self.0[i].1 = a,
            Err(i) => {
                if self.0.capacity() == 0 {
                    // One is the common case: no amortised growth to four.
                    self.0.reserve_exact(1);
                }
                self.0.insert(i, (occ, a))
            }
        }
    }

    /// Remove; an emptied map gives its buffer back.
    pub(super) fn remove(&mut self, occ: &RefTime) -> Option<Attempt> {
        let i = self.find(occ).ok()?;
        let (_, a) = self.0.remove(i);
        if self.0.is_empty() {
            self.0 = Vec::new();
        }
        Some(a)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(super) fn clear(&mut self) {
        self.0 = Vec::new();
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&RefTime, &Attempt)> {
        self.0.iter().map(|(o, a)| (o, a))
    }

    pub(super) fn iter_mut(&mut self) -> impl Iterator<Item = (&RefTime, &mut Attempt)> {
        self.0.iter_mut().map(|(o, a)| (&*o, a))
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &Attempt> {
        self.0.iter().map(|(_, a)| a)
    }

    pub(super) fn retain(&mut self, mut keep: impl FnMut(&RefTime, &mut Attempt) -> bool) {
        self.0.retain_mut(|(o, a)| keep(o, a));
        if self.0.is_empty() {
            self.0 = Vec::new();
        }
    }
}

impl<'a> IntoIterator for &'a Attempts {
    type Item = (&'a RefTime, &'a Attempt);
    type IntoIter = std::iter::Map<
        std::slice::Iter<'a, (RefTime, Attempt)>,
        fn(&'a (RefTime, Attempt)) -> (&'a RefTime, &'a Attempt),
    >;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|(o, a)| (o, a))
    }
}
