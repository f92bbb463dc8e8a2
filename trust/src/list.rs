//! The trust list: who may sign what, signed by the root.
//!
//! A box is installed with the root's public key (`/etc/baton/trust/`);
//! the root's private key stays offline. The root signs a list naming,
//! per tenant, the operator keys whose packs the box takes (and whether
//! the tenant requires signed packs at all, so a site can start without),
//! and the release keys of agent builds. A new list replaces the old one
//! only with a higher version and before its expiry; taking a key out of
//! a new list revokes it. A list may hand the root over (`next_root`): the
//! lists after it must be signed by the new root, and the old one signs
//! nothing more.
//!
//! A signed list is its body's exact text and a signature of those bytes,
//! so no canonical form is needed: the body is parsed only once its
//! signature verifies. A box keeps the chain of lists it took since its
//! installed root ([`Trust::load`] checks it again at start).

use std::collections::BTreeMap;

use crate::keys::{KeyId, PublicKey, Signature, SigningKey};

/// Why a list was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrustError {
    /// Signed by another key than the root in force.
    #[error(
        "trust list signed by key {signer}, but the root in force is {root}: not a list this box may take"
    )]
    WrongSigner {
        /// The key the list names as its signer.
        signer: KeyId,
        /// The root in force.
        root: KeyId,
    },
    /// The signature does not match the body.
    #[error(
        "trust list: the root's signature does not match its bytes (altered, or signed over other bytes)"
    )]
    BadSignature,
    /// The body is not a trust list.
    #[error("trust list: {0}")]
    Malformed(String),
    /// Not newer than the list held: a replay of an old list.
    #[error(
        "trust list version {offered} is not above version {held} held: an older list (a rollback) is refused"
    )]
    Rollback {
        /// The list's version.
        offered: u64,
        /// The version held.
        held: u64,
    },
    /// Past its expiry.
    #[error("trust list version {version} expired at {expires_ns} ns (now {now_ns} ns)")]
    Expired {
        /// The list's version.
        version: u64,
        /// Its expiry, ns since the epoch.
        expires_ns: i64,
        /// Now.
        now_ns: i64,
    },
}

/// One tenant's trust.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantTrust {
    /// Packs of this tenant must carry a signature of one of its keys
    /// (otherwise an unsigned pack is taken, a signed one still checked).
    #[serde(default)]
    pub require_signed: bool,
    /// The operator keys whose pack signatures this tenant's packs may
    /// carry.
    #[serde(default)]
    pub pack_keys: Vec<PublicKey>,
}

/// The list's body.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrustList {
    /// Only goes up.
    pub version: u64,
    /// After this instant (ns since the epoch) the list is not taken, and
    /// a box whose newest list expired refuses what it would check.
    pub expires_ns: i64,
    /// The root that signs the lists after this one (`None`: the same).
    #[serde(default)]
    pub next_root: Option<PublicKey>,
    /// Per tenant.
    #[serde(default)]
    pub tenants: BTreeMap<String, TenantTrust>,
    /// Keys that sign agent builds.
    #[serde(default)]
    pub release_keys: Vec<PublicKey>,
}

/// A list as it travels and is kept: its body's exact text, and the root's
/// signature of it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignedList {
    /// The body, as signed (JSON of [`TrustList`]).
    pub body: String,
    /// The signing root's id.
    pub key: KeyId,
    /// The root's signature of `body`'s bytes.
    pub signature: Signature,
}

impl SignedList {
    /// `list` signed by `root`.
    pub fn sign(list: &TrustList, root: &SigningKey) -> SignedList {
        // Serialising a struct of owned values and maps cannot fail.
        let body = serde_json::to_string_pretty(list).unwrap_or_default();
        SignedList {
            signature: root.sign(body.as_bytes()),
            key: root.public().id(),
            body,
        }
    }
}

/// What a box trusts: its installed root, and the newest list it took.
#[derive(Clone, Debug)]
pub struct Trust {
    /// The root that signs the next list: the installed one until a list
    /// hands it over.
    root: PublicKey,
    list: Option<TrustList>,
}

impl Trust {
    /// A box with `root` installed and no list yet.
    pub fn new(root: PublicKey) -> Trust {
        Trust { root, list: None }
    }

    /// A box's trust from its installed root and the chain of lists it
    /// took, each checked again in order (the expiry only of the newest:
    /// the ones before it were in force when taken).
    pub fn load(root: PublicKey, chain: &[SignedList], now_ns: i64) -> Result<Trust, TrustError> {
        let mut t = Trust::new(root);
        for (i, s) in chain.iter().enumerate() {
            let last = i + 1 == chain.len();
            t.take(s, last.then_some(now_ns))?;
        }
        Ok(t)
    }

    /// The root that signs the next list.
    pub fn root(&self) -> PublicKey {
        self.root
    }

    /// The newest list taken, if any.
    pub fn list(&self) -> Option<&TrustList> {
        self.list.as_ref()
    }

    /// The newest list, if one was taken and it has not expired at `now`.
    pub fn current(&self, now_ns: i64) -> Result<Option<&TrustList>, TrustError> {
        match &self.list {
            Some(l) if l.expires_ns <= now_ns => Err(TrustError::Expired {
                version: l.version,
                expires_ns: l.expires_ns,
                now_ns,
            }),
            l => Ok(l.as_ref()),
        }
    }

    /// Take the lists of `chain` newer than the one held, in order, each
    /// signed by the root in force then; only the newest taken must not
    /// have expired at `now` (the ones before it were in force when made,
    /// and a box that was away past one of them must still catch up).
    /// Nothing changes on a refusal; the lists taken otherwise, in order.
    pub fn accept_chain(
        &mut self,
        chain: &[SignedList],
        now_ns: i64,
    ) -> Result<Vec<SignedList>, TrustError> {
        let held = self.list.as_ref().map(|l| l.version);
        let newer: Vec<&SignedList> = chain
            .iter()
            .filter(|s| {
                let v = serde_json::from_str::<TrustList>(&s.body).map_or(u64::MAX, |l| l.version);
                held.is_none_or(|h| v > h)
            })
            .collect();
        let mut next = self.clone();
        for (i, s) in newer.iter().enumerate() {
            let last = i + 1 == newer.len();
            next.take(s, last.then_some(now_ns))?;
        }
        *self = next;
        Ok(newer.into_iter().cloned().collect())
    }

    /// Take a new list: signed by the root in force, newer than the list
    /// held, not expired at `now`. Nothing changes on a refusal.
    pub fn accept(&mut self, signed: &SignedList, now_ns: i64) -> Result<&TrustList, TrustError> {
        self.take(signed, Some(now_ns))
    }

    fn take(&mut self, signed: &SignedList, now_ns: Option<i64>) -> Result<&TrustList, TrustError> {
        let root = self.root;
        if signed.key != root.id() {
            return Err(TrustError::WrongSigner {
                signer: signed.key,
                root: root.id(),
            });
        }
        if !root.verify(signed.body.as_bytes(), &signed.signature) {
            return Err(TrustError::BadSignature);
        }
        let list: TrustList =
            serde_json::from_str(&signed.body).map_err(|e| TrustError::Malformed(e.to_string()))?;
        if let Some(held) = &self.list
            && list.version <= held.version
        {
            return Err(TrustError::Rollback {
                offered: list.version,
                held: held.version,
            });
        }
        if let Some(now_ns) = now_ns
            && list.expires_ns <= now_ns
        {
            return Err(TrustError::Expired {
                version: list.version,
                expires_ns: list.expires_ns,
                now_ns,
            });
        }
        if let Some(next) = list.next_root {
            self.root = next;
        }
        Ok(self.list.insert(list))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: i64 = 86_400 * 1_000_000_000;

    fn list(version: u64, next_root: Option<PublicKey>) -> TrustList {
        TrustList {
            version,
            expires_ns: 10 * DAY,
            next_root,
            tenants: BTreeMap::new(),
            release_keys: Vec::new(),
        }
    }

    /// Versions only go up: the same or an older list is a rollback.
    #[test]
    fn an_older_list_is_refused_and_changes_nothing() {
        let root = SigningKey::generate().expect("key");
        let mut t = Trust::new(root.public());
        t.accept(&SignedList::sign(&list(2, None), &root), DAY)
            .expect("v2");
        for v in [1, 2] {
            let e = t
                .accept(&SignedList::sign(&list(v, None), &root), DAY)
                .expect_err("rollback");
            assert_eq!(
                e,
                TrustError::Rollback {
                    offered: v,
                    held: 2
                }
            );
        }
        assert_eq!(t.list().map(|l| l.version), Some(2));
        t.accept(&SignedList::sign(&list(3, None), &root), DAY)
            .expect("v3");
    }

    /// Signed by another key, altered after signing, expired: refused.
    #[test]
    fn only_the_roots_signature_over_these_bytes_before_expiry_is_taken() {
        let root = SigningKey::generate().expect("key");
        let other = SigningKey::generate().expect("key");
        let mut t = Trust::new(root.public());
        let e = t
            .accept(&SignedList::sign(&list(1, None), &other), DAY)
            .expect_err("wrong signer");
        assert!(matches!(e, TrustError::WrongSigner { .. }), "{e}");
        let mut altered = SignedList::sign(&list(1, None), &root);
        altered.body = altered.body.replace("\"version\": 1", "\"version\": 9");
        assert_eq!(t.accept(&altered, DAY), Err(TrustError::BadSignature));
        let e = t
            .accept(&SignedList::sign(&list(1, None), &root), 11 * DAY)
            .expect_err("expired");
        assert!(matches!(e, TrustError::Expired { version: 1, .. }), "{e}");
        assert!(t.list().is_none(), "nothing taken");
        t.accept(&SignedList::sign(&list(1, None), &root), DAY)
            .expect("v1");
        assert!(t.current(DAY).expect("current").is_some());
        assert!(matches!(
            t.current(10 * DAY),
            Err(TrustError::Expired { .. })
        ));
    }

    /// A list hands the root over: the next must be signed by the new
    /// root, and the old root's lists are refused from then on, after a
    /// restart too.
    #[test]
    fn a_root_rotation_holds_across_a_restart() {
        let old = SigningKey::generate().expect("key");
        let new = SigningKey::generate().expect("key");
        let mut t = Trust::new(old.public());
        let v1 = SignedList::sign(&list(1, Some(new.public())), &old);
        t.accept(&v1, DAY).expect("v1 hands over");
        assert_eq!(t.root(), new.public());
        let by_old = SignedList::sign(&list(2, None), &old);
        assert!(matches!(
            t.accept(&by_old, DAY),
            Err(TrustError::WrongSigner { .. })
        ));
        let v2 = SignedList::sign(&list(2, None), &new);
        t.accept(&v2, DAY).expect("v2 by the new root");
        assert_eq!(t.root(), new.public(), "stays handed over");
        // A restart: the installed root, then the chain.
        let again = Trust::load(old.public(), &[v1.clone(), v2.clone()], DAY).expect("chain");
        assert_eq!(again.list().map(|l| l.version), Some(2));
        assert!(Trust::load(old.public(), &[v1, by_old], DAY).is_err());
        // The chain survives its text form.
        let text = serde_json::to_string(&v2).expect("json");
        assert_eq!(serde_json::from_str::<SignedList>(&text).expect("back"), v2);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// Any order of lists (versions, signers among three keys, some
        /// handing the root over, some expired): one is taken exactly when
        /// the root in force signed it, its version is above the one held
        /// and it has not expired; the chain taken loads again to the same
        /// state.
        #[test]
        fn a_list_is_taken_exactly_when_the_rules_say(
            offers in proptest::collection::vec((0usize..3, 0u64..8, proptest::option::of(0usize..3), proptest::bool::weighted(0.1)), 1..20)
        ) {
            let keys: Vec<SigningKey> = (0..3).map(|_| SigningKey::generate().expect("key")).collect();
            let mut t = Trust::new(keys[0].public());
            let (mut root, mut held) = (0usize, None::<u64>);
            let mut chain = Vec::new();
            for (signer, version, hand_to, expired) in offers {
                let mut l = list(version, hand_to.map(|k| keys[k].public()));
                if expired {
                    l.expires_ns = DAY / 2;
                }
                let signed = SignedList::sign(&l, &keys[signer]);
                let ok = signer == root && held.is_none_or(|h| version > h) && !expired;
                let got = t.accept(&signed, DAY);
                proptest::prop_assert_eq!(got.is_ok(), ok, "{:?}", got);
                if ok {
                    held = Some(version);
                    if let Some(k) = hand_to {
                        root = k;
                    }
                    chain.push(signed);
                }
                proptest::prop_assert_eq!(t.root(), keys[root].public());
            }
            let again = Trust::load(keys[0].public(), &chain, DAY).expect("the chain loads");
            proptest::prop_assert_eq!(again.root(), t.root());
            proptest::prop_assert_eq!(again.list(), t.list());
        }
    }
}
