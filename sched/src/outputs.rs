//! What one call into the core decided, handed back as a value the caller
//! must use: [`Outputs`], and [`WithOutputs`] for the entry points that
//! answer something besides.

use crate::output::Output;

/// Capacity the core keeps in its output buffer between calls: an
/// instant's firings and their events fit, and a burst (thousands of
/// one-shots due at one instant) does not stay allocated after it.
const KEEP: usize = 128;

/// The outputs of one call into the [`crate::Scheduler`], in the order the
/// runtime must act on them.
///
/// Returned, not pushed into a caller's vector, so that an ignored output is
/// a compile error: `scheduler.tick(now);` alone fails `cargo clippy -- -D
/// warnings` with `unused_must_use` (``unused `baton_sched::Outputs` that must be
/// used``). Dropping them on purpose is spelled `let _ = …`:
///
/// ```
/// # use std::collections::HashMap;
/// # use baton_proto::RefTime;
/// # use baton_sched::{Config, PriorOutcome, Scheduler};
/// # let mut core = Scheduler::new(Config::default(), HashMap::<String, PriorOutcome>::new());
/// let _ = core.tick(RefTime::from_nanos(0));
/// ```
///
/// and forgetting them does not build (the lint the workspace denies):
///
/// ```compile_fail
/// # #![deny(unused_must_use)]
/// # use std::collections::HashMap;
/// # use baton_proto::RefTime;
/// # use baton_sched::{Config, PriorOutcome, Scheduler};
/// # let mut core = Scheduler::new(Config::default(), HashMap::<String, PriorOutcome>::new());
/// core.tick(RefTime::from_nanos(0));
/// ```
///
/// It iterates over the core's own buffer and borrows the core while it
/// lives, so a call does not allocate in steady state: move the outputs
/// into the caller's vector ([`Outputs::drain_into`], or `extend`) before
/// calling the core again. Whatever is left when it drops is discarded,
/// and the buffer is kept for the next call (shrunk after a burst).
#[must_use = "the core's outputs are what it decided: perform them (or drop them with `let _ =`)"]
#[derive(Debug)]
pub struct Outputs<'a> {
    /// The core's buffer, its outputs in reverse order: the next one is
    /// popped from the end (moving out of a vector's front needs either a
    /// shift per item or unsafe code).
    reversed: &'a mut Vec<Output>,
}

impl<'a> Outputs<'a> {
    /// The outputs in `buf`, in order (`buf` is reversed in place).
    pub(crate) fn new(buf: &'a mut Vec<Output>) -> Self {
        buf.reverse();
        Outputs { reversed: buf }
    }

    /// How many outputs are left.
    pub fn len(&self) -> usize {
        self.reversed.len()
    }

    /// Whether there are none left.
    pub fn is_empty(&self) -> bool {
        self.reversed.is_empty()
    }

    /// Move the outputs, in order, to the end of `out` (a vector the caller
    /// reuses: neither side allocates in steady state).
    pub fn drain_into(self, out: &mut Vec<Output>) {
        out.extend(self);
    }
}

impl Iterator for Outputs<'_> {
    type Item = Output;

    fn next(&mut self) -> Option<Output> {
        self.reversed.pop()
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.len(), Some(self.len()))
    }
}

impl ExactSizeIterator for Outputs<'_> {}

impl Drop for Outputs<'_> {
    fn drop(&mut self) {
        self.reversed.clear();
        if self.reversed.capacity() > KEEP {
            self.reversed.shrink_to(KEEP);
        }
    }
}

/// An entry point's answer (`value`: whether a pack was held, how a pack
/// was taken…) together with the [`Outputs`] it decided: both come back as
/// one `#[must_use]` value, so that reading the answer cannot silently drop
/// the outputs.
#[must_use = "the core's outputs are what it decided: perform them (or drop them with `let _ =`)"]
#[derive(Debug)]
pub struct WithOutputs<'a, T> {
    /// The answer.
    pub value: T,
    /// What the call decided, in order.
    pub outputs: Outputs<'a>,
}

impl<T> WithOutputs<'_, T> {
    /// Move the outputs to the end of `out` (see [`Outputs::drain_into`])
    /// and return the answer.
    pub fn drain_into(self, out: &mut Vec<Output>) -> T {
        self.outputs.drain_into(out);
        self.value
    }
}
