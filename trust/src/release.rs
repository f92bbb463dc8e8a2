//! Agent releases: a release key named by the trust list signs a build's
//! manifest (its version, the architecture it runs on, its size and
//! SHA-256), so a box installs only a binary a release engineer signed,
//! whoever relayed it (the controller, its store or a replica's host hold
//! no release key).
//!
//! As with a trust list, what travels is the manifest's exact text and a
//! signature of it: the text is parsed only once the signature verifies.
//! The binary itself is checked against the manifest's size and digest as
//! it arrives, never trusted before.

use crate::keys::{KeyId, Signature, SigningKey};
use crate::list::{Trust, TrustError, TrustList};

/// What a release signature is over: a fixed prefix and the manifest's
/// text (the prefix keeps a release signature from ever reading as a
/// signature of anything else a key might sign).
fn message(body: &str) -> Vec<u8> {
    const PREFIX: &[u8] = b"baton release signature v1\0";
    let mut m = Vec::with_capacity(PREFIX.len() + body.len());
    m.extend_from_slice(PREFIX);
    m.extend_from_slice(body.as_bytes());
    m
}

/// The longest version a release may carry.
pub const MAX_VERSION_LEN: usize = 64;

/// An agent build as its release engineer signed it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseManifest {
    /// The version the build reports on its link (`0.2.0`); also the name
    /// of its directory on the box, hence [`check_version`].
    pub version: String,
    /// The architecture it runs on, as Rust names it (`aarch64`,
    /// `x86_64`, `arm`).
    pub arch: String,
    /// Its length in bytes.
    pub size: u64,
    /// Its SHA-256, lowercase hex.
    pub sha256: String,
}

/// A manifest as it travels and is kept: its exact text, and the release
/// key's signature of it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignedRelease {
    /// The manifest, as signed (JSON of [`ReleaseManifest`]).
    pub body: String,
    /// The signing release key's id.
    pub key: KeyId,
    /// Its signature of `body`.
    pub signature: Signature,
}

/// Why a release is not installed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReleaseError {
    /// The box has no trust list: it knows no release key.
    #[error("release: this box holds no trust list, so no release key: updates are refused")]
    NoList,
    /// The newest list cannot be used.
    #[error(transparent)]
    TrustList(#[from] TrustError),
    /// Signed by a key the list does not name as a release key.
    #[error(
        "release signed by key {0}, which the trust list does not name as a release key (unknown or revoked)"
    )]
    UnknownKey(KeyId),
    /// The signature does not match the manifest's text.
    #[error(
        "release: the signature does not match its manifest (altered, or signed over other bytes)"
    )]
    BadSignature,
    /// The manifest is not one, or names what a box cannot install.
    #[error("release manifest: {0}")]
    Malformed(String),
    /// Built for another architecture.
    #[error("release {version} is built for {arch}, this box runs {here}")]
    WrongArch {
        /// The release's version.
        version: String,
        /// Its architecture.
        arch: String,
        /// This box's.
        here: String,
    },
}

/// Whether `version` may name a release: 1 to [`MAX_VERSION_LEN`] ASCII
/// letters, digits and `.+-_`, starting with a letter or digit. It names a
/// directory on the box, so nothing that could climb out of it (`..`, `/`)
/// or hide in a listing.
pub fn check_version(version: &str) -> Result<(), String> {
    let ok_byte = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'+' | b'-' | b'_');
    if version.is_empty() || version.len() > MAX_VERSION_LEN {
        return Err(format!(
            "version {version:?}: 1 to {MAX_VERSION_LEN} characters"
        ));
    }
    if !version.bytes().all(ok_byte) || !version.as_bytes()[0].is_ascii_alphanumeric() {
        return Err(format!(
            "version {version:?}: letters, digits and .+-_ only, starting with a letter or digit"
        ));
    }
    Ok(())
}

impl ReleaseManifest {
    /// The manifest of `binary`, as `version` for `arch`.
    pub fn of(version: &str, arch: &str, binary: &[u8]) -> Result<ReleaseManifest, String> {
        check_version(version)?;
        check_arch(arch)?;
        Ok(ReleaseManifest {
            version: version.to_string(),
            arch: arch.to_string(),
            size: binary.len() as u64,
            sha256: hex(&sha256(binary)),
        })
    }

    /// The digest as bytes (checked by [`SignedRelease::check`]).
    pub fn digest(&self) -> Option<[u8; 32]> {
        let t = self.sha256.as_bytes();
        if t.len() != 64 {
            return None;
        }
        let mut d = [0u8; 32];
        for (i, b) in d.iter_mut().enumerate() {
            let pair = std::str::from_utf8(&t[2 * i..2 * i + 2]).ok()?;
            if !pair.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')) {
                return None;
            }
            *b = u8::from_str_radix(pair, 16).ok()?;
        }
        Some(d)
    }

    fn validate(&self) -> Result<(), String> {
        check_version(&self.version)?;
        check_arch(&self.arch)?;
        if self.size == 0 {
            return Err("size 0: no binary".into());
        }
        if self.digest().is_none() {
            return Err(format!("sha256 {:?}: 64 lowercase hex digits", self.sha256));
        }
        Ok(())
    }
}

fn check_arch(arch: &str) -> Result<(), String> {
    if arch.is_empty()
        || arch.len() > 32
        || !arch.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
    {
        return Err(format!("architecture {arch:?}: a name such as aarch64"));
    }
    Ok(())
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    use sha2::Digest as _;
    sha2::Sha256::digest(bytes).into()
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

impl SignedRelease {
    /// `manifest` signed by the release key `key`.
    pub fn sign(manifest: &ReleaseManifest, key: &SigningKey) -> SignedRelease {
        // Serialising a struct of strings and a number cannot fail.
        let body = serde_json::to_string_pretty(manifest).unwrap_or_default();
        SignedRelease {
            signature: key.sign(&message(&body)),
            key: key.public().id(),
            body,
        }
    }

    /// The manifest, if the box may install it: signed by a release key
    /// of the newest trust list (not expired at `now_ns`), over exactly
    /// this text, naming a version that can be a directory, a digest, and
    /// the box's architecture `here`.
    pub fn check(
        &self,
        trust: &Trust,
        now_ns: i64,
        here: &str,
    ) -> Result<ReleaseManifest, ReleaseError> {
        let list = trust.current(now_ns)?.ok_or(ReleaseError::NoList)?;
        self.check_with(list, here)
    }

    /// The manifest as it reads, its signature **not** checked: what a
    /// controller, which relays releases and holds no trust list, keeps
    /// of one (its bytes are checked against it; the boxes check the
    /// signature).
    pub fn unverified_manifest(&self) -> Result<ReleaseManifest, String> {
        let manifest: ReleaseManifest =
            serde_json::from_str(&self.body).map_err(|e| format!("release manifest: {e}"))?;
        manifest.validate()?;
        Ok(manifest)
    }

    /// [`SignedRelease::check`] against `list` whatever its expiry: what
    /// the launcher asks of a binary installed under a list in force then
    /// (an expired list stops new releases, not the one running).
    pub fn check_with(
        &self,
        list: &TrustList,
        here: &str,
    ) -> Result<ReleaseManifest, ReleaseError> {
        let key = list
            .release_keys
            .iter()
            .find(|k| k.id() == self.key)
            .ok_or(ReleaseError::UnknownKey(self.key))?;
        if !key.verify(&message(&self.body), &self.signature) {
            return Err(ReleaseError::BadSignature);
        }
        let manifest: ReleaseManifest =
            serde_json::from_str(&self.body).map_err(|e| ReleaseError::Malformed(e.to_string()))?;
        manifest.validate().map_err(ReleaseError::Malformed)?;
        if manifest.arch != here {
            return Err(ReleaseError::WrongArch {
                version: manifest.version,
                arch: manifest.arch,
                here: here.to_string(),
            });
        }
        Ok(manifest)
    }
}

/// What an agent build's version slot starts with: the build reports the
/// version that follows (NUL-padded to [`SLOT_LEN`]), so a release
/// pipeline can stamp a build and a signer can check what it signs.
pub const SLOT_MARK: &[u8] = b"baton-agent-version=";

/// A version slot's length: the mark, the version, NUL padding (at
/// least one NUL: the mark followed by any 64 printable bytes is no slot).
pub const SLOT_LEN: usize = SLOT_MARK.len() + MAX_VERSION_LEN + 1;

/// The version a slot holds, if it reads as one: the mark, a version,
/// and NUL to the slot's end (the mark alone, as code that looks for it
/// carries it, is no slot).
pub fn read_slot(slot: &[u8]) -> Option<&str> {
    let rest = slot.get(..SLOT_LEN)?.strip_prefix(SLOT_MARK)?;
    let end = rest.iter().position(|&b| b == 0)?;
    if rest[end..].iter().any(|&b| b != 0) {
        return None;
    }
    let v = std::str::from_utf8(&rest[..end]).ok()?;
    check_version(v).ok().map(|()| v)
}

/// Where `binary`'s one version slot is (`None`: none, or more than one).
fn slot_at(binary: &[u8]) -> Option<usize> {
    let mut at = binary
        .windows(SLOT_MARK.len())
        .enumerate()
        .filter(|(_, w)| *w == SLOT_MARK)
        .map(|(i, _)| i)
        .filter(|&i| binary.get(i..).and_then(read_slot).is_some());
    let i = at.next()?;
    at.next().is_none().then_some(i)
}

/// The version `binary` reports, from its one version slot.
pub fn slot_version(binary: &[u8]) -> Option<&str> {
    slot_at(binary).and_then(|i| read_slot(&binary[i..]))
}

/// `binary` with its one slot stamped `version`.
pub fn stamp(binary: &[u8], version: &str) -> Option<Vec<u8>> {
    check_version(version).ok()?;
    let i = slot_at(binary)?;
    let mut out = binary.to_vec();
    let slot = &mut out[i + SLOT_MARK.len()..i + SLOT_LEN];
    slot.fill(0);
    slot[..version.len()].copy_from_slice(version.as_bytes());
    Some(out)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::list::{SignedList, TrustList};

    const DAY: i64 = 86_400 * 1_000_000_000;

    fn trust_with(root: &SigningKey, release_keys: Vec<crate::PublicKey>) -> Trust {
        let list = TrustList {
            version: 1,
            expires_ns: 10 * DAY,
            next_root: None,
            tenants: BTreeMap::new(),
            release_keys,
        };
        let mut t = Trust::new(root.public());
        t.accept(&SignedList::sign(&list, root), DAY).expect("list");
        t
    }

    fn key() -> SigningKey {
        SigningKey::generate().expect("key")
    }

    #[test]
    fn a_release_signed_by_a_named_release_key_is_installed_and_nothing_else() {
        let (root, rel, other) = (key(), key(), key());
        let trust = trust_with(&root, vec![rel.public()]);
        let m = ReleaseManifest::of("0.2.0", "aarch64", b"\x7fELF build").expect("manifest");
        let signed = SignedRelease::sign(&m, &rel);
        assert_eq!(signed.check(&trust, DAY, "aarch64"), Ok(m.clone()));

        // Another key: one the list does not name (an operator's, the
        // root itself).
        for k in [&other, &root] {
            let s = SignedRelease::sign(&m, k);
            assert_eq!(
                s.check(&trust, DAY, "aarch64"),
                Err(ReleaseError::UnknownKey(k.public().id()))
            );
        }
        // The text altered after signing (another digest).
        let mut altered = signed.clone();
        altered.body = altered.body.replace(&m.sha256, &"0".repeat(64));
        assert_eq!(
            altered.check(&trust, DAY, "aarch64"),
            Err(ReleaseError::BadSignature)
        );
        // Another architecture.
        assert!(matches!(
            signed.check(&trust, DAY, "x86_64"),
            Err(ReleaseError::WrongArch { .. })
        ));
        // The list expired; a box with no list.
        assert!(matches!(
            signed.check(&trust, 11 * DAY, "aarch64"),
            Err(ReleaseError::TrustList(TrustError::Expired { .. }))
        ));
        assert_eq!(
            signed.check(&Trust::new(root.public()), DAY, "aarch64"),
            Err(ReleaseError::NoList)
        );
    }

    #[test]
    fn a_signed_manifest_naming_what_a_box_cannot_install_is_refused() {
        let (root, rel) = (key(), key());
        let trust = trust_with(&root, vec![rel.public()]);
        let good = ReleaseManifest::of("1.0.0", "aarch64", b"bin").expect("manifest");
        let bad = [
            ReleaseManifest {
                version: "../../usr/bin".into(),
                ..good.clone()
            },
            ReleaseManifest {
                version: ".hidden".into(),
                ..good.clone()
            },
            ReleaseManifest {
                version: "x".repeat(65),
                ..good.clone()
            },
            ReleaseManifest {
                size: 0,
                ..good.clone()
            },
            ReleaseManifest {
                sha256: "AB".repeat(32),
                ..good.clone()
            },
            ReleaseManifest {
                sha256: "ab".into(),
                ..good.clone()
            },
        ];
        for m in bad {
            let r = SignedRelease::sign(&m, &rel).check(&trust, DAY, "aarch64");
            assert!(matches!(r, Err(ReleaseError::Malformed(_))), "{m:?}: {r:?}");
        }
        assert_eq!(good.digest().map(|d| hex(&d)), Some(good.sha256.clone()));
    }

    #[test]
    fn versions_that_are_safe_directory_names() {
        for ok in ["0.2.0", "1.0.0-rc.1+build_7", "v2"] {
            assert_eq!(check_version(ok), Ok(()), "{ok}");
        }
        for bad in ["", ".", "..", "-x", "a/b", "a b", "é"] {
            assert!(check_version(bad).is_err(), "{bad:?}");
        }
    }
}

#[cfg(test)]
mod slot_tests {
    use super::*;

    fn slot(v: &str) -> Vec<u8> {
        let mut s = SLOT_MARK.to_vec();
        s.extend_from_slice(v.as_bytes());
        s.resize(SLOT_LEN, 0);
        s
    }

    #[test]
    fn one_slot_is_read_and_stamped_the_mark_alone_is_none() {
        let mut bin = b"ELF...".to_vec();
        bin.extend_from_slice(SLOT_MARK);
        bin.extend_from_slice(b"code that looks for the mark");
        bin.extend_from_slice(&slot("0.1.0"));
        bin.extend_from_slice(b"...");
        assert_eq!(slot_version(&bin), Some("0.1.0"));
        let stamped = stamp(&bin, "9.9.9-rc.1").expect("one slot");
        assert_eq!(
            (slot_version(&stamped), stamped.len()),
            (Some("9.9.9-rc.1"), bin.len())
        );
        assert_eq!(stamp(&bin, "../x"), None, "not a version");
        let mut two = bin.clone();
        two.extend_from_slice(&slot("0.1.0"));
        assert_eq!((slot_version(&two), stamp(&two, "1.0.0")), (None, None));
        assert_eq!(slot_version(b"#!/bin/sh\nexit 1\n"), None);
        // The mark followed by text (code that names it), no NUL: no slot.
        let mut text = SLOT_MARK.to_vec();
        text.extend_from_slice(&[b'a'; SLOT_LEN]);
        assert_eq!(read_slot(&text), None);
    }
}
