//! Pack versions as the application uses them: the stored row with its
//! `rollout:` section parsed once per version and kept typed. The rollout
//! driver reads the spec on every tick, and every staged push carries the
//! rollout's clock bound: neither parses YAML again. The version that
//! stored a pack keeps what the push parsed; any other (a restart, another
//! replica) parses it once, on first use.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use baton_model::{PackKey, PackVersionRow, SignedDuration};
use baton_proto::pack::parse_pack;
use baton_proto::pack::rollout::Rollout;

/// A stored pack version and its parsed `rollout:` section.
#[derive(Debug)]
pub struct PackText {
    /// As stored.
    pub row: PackVersionRow,
    /// Its `rollout:` section (`None`: it has none).
    pub rollout: Option<Arc<Rollout>>,
}

/// Two are the same version when their rows are: the spec is read from the
/// row's text.
impl PartialEq for PackText {
    fn eq(&self, other: &PackText) -> bool {
        self.row == other.row
    }
}

impl PackText {
    /// The rollout's `max_uncertainty`, checked again by an agent at a
    /// staged version's switch (zero: none, the agent's own limit).
    pub fn max_uncertainty(&self) -> SignedDuration {
        self.rollout.as_ref().map_or(SignedDuration::ZERO, |r| {
            SignedDuration::try_from(r.max_uncertainty).unwrap_or(SignedDuration::MAX)
        })
    }
}

/// Specs kept at most: a spec is a few hundred bytes; versions with a
/// rollout open at once are far fewer.
const KEPT: usize = 4096;

/// The parsed `rollout:` sections of the versions seen, the oldest
/// forgotten first past [`KEPT`].
#[derive(Debug, Default)]
pub struct Specs {
    inner: Mutex<SpecMap>,
}

#[derive(Debug, Default)]
struct SpecMap {
    by_version: HashMap<(PackKey, u64), Option<Arc<Rollout>>>,
    order: VecDeque<(PackKey, u64)>,
}

impl Specs {
    /// Keep what a push parsed.
    pub fn keep(&self, key: &PackKey, version: u64, spec: Option<Rollout>) -> Option<Arc<Rollout>> {
        let spec = spec.map(Arc::new);
        let mut m = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let k = (key.clone(), version);
        if m.by_version.insert(k.clone(), spec.clone()).is_none() {
            m.order.push_back(k);
        }
        while m.order.len() > KEPT {
            if let Some(old) = m.order.pop_front() {
                m.by_version.remove(&old);
            }
        }
        spec
    }

    /// `row` with its spec: kept, or parsed now (once) and kept.
    pub fn text(&self, row: PackVersionRow) -> Arc<PackText> {
        let key = row.key();
        let kept = self
            .inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .by_version
            .get(&(key.clone(), row.version))
            .cloned();
        let rollout = match kept {
            Some(spec) => spec,
            // Only a version stored with a `rollout:` section has one to
            // parse; its text was validated when it was pushed.
            None if row.rollout => {
                let parsed = parse_pack(&row.yaml).ok().and_then(|p| p.rollout);
                if parsed.is_none() {
                    tracing::warn!(pack = %key, version = row.version, "stored rollout section does not parse");
                }
                self.keep(&key, row.version, parsed)
            }
            None => None,
        };
        Arc::new(PackText { row, rollout })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_model::{RefTime, TargetsRow};

    fn row(version: u64, yaml: &str) -> PackVersionRow {
        PackVersionRow {
            tenant: "t".into(),
            pack: "p".into(),
            version,
            yaml: yaml.into(),
            targets: TargetsRow::Nobody,
            pushed: RefTime::from_nanos(0),
            rollout: true,
        }
    }

    #[test]
    fn a_spec_is_parsed_once_per_version_and_kept_bounded() {
        let specs = Specs::default();
        let yaml = "pack: p\nversion: 1\nrollout:\n  stages: [{agents: 1}, {percent: 100}]\n  max_uncertainty: 3ms\ninstructions:\n  - {id: a, action: noop, every: 1s}\n";
        let first = specs.text(row(1, yaml));
        assert_eq!(first.max_uncertainty(), SignedDuration::from_millis(3));
        // Kept: the same spec again, not parsed from a text that no
        // longer matters.
        let again = specs.text(row(1, "not yaml at all: ["));
        let (a, b) = (first.rollout.as_ref(), again.rollout.as_ref());
        assert!(a.zip(b).is_some_and(|(a, b)| Arc::ptr_eq(a, b)));
        for v in 2..(KEPT as u64 + 10) {
            specs.keep(&PackKey::new("t", "p"), v, None);
        }
        let m = specs.inner.lock().expect("lock");
        assert_eq!(m.by_version.len(), KEPT);
        assert!(!m.by_version.contains_key(&(PackKey::new("t", "p"), 1)));
    }
}
