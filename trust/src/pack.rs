//! Pack signatures: an operator's key signs the tenant and the pack's
//! exact bytes (its name and version are inside them), so a signature
//! cannot be moved to another tenant, another pack or another version, and
//! a replayed old version is refused by the version rules already there.
//!
//! A signature travels with the pack as its text's last line, a YAML
//! comment ([`SIGNATURE_LINE`]): the controller stores and relays the text
//! as it is, validates it as YAML (a comment is nothing to it) and needs
//! no key; the box splits the line off ([`split`]) and checks the rest.

use crate::keys::{KeyId, PublicKey, Signature, SigningKey};
use crate::list::{Trust, TrustList};

/// What a signature is over: a fixed prefix, the tenant, and the pack's
/// text, separated by NUL (which neither a tenant nor YAML text holds).
fn message(tenant: &str, yaml: &str) -> Vec<u8> {
    const PREFIX: &[u8] = b"baton pack signature v1\0";
    let mut m = Vec::with_capacity(PREFIX.len() + tenant.len() + 1 + yaml.len());
    m.extend_from_slice(PREFIX);
    m.extend_from_slice(tenant.as_bytes());
    m.push(0);
    m.extend_from_slice(yaml.as_bytes());
    m
}

/// How a pack's last line starts when it carries a signature: then the
/// key's id and the signature, space-separated.
pub const SIGNATURE_LINE: &str = "# baton-signature: ";

/// A pack's text split into what was signed and its signature line, if
/// it ends with one; a line that starts like one but does not read as one
/// is an error (never taken as unsigned).
pub fn split(text: &str) -> Result<(&str, Option<PackSignature>), PackSignatureError> {
    let trimmed = text.strip_suffix('\n').unwrap_or(text);
    let (body, last) = match trimmed.rfind('\n') {
        Some(i) => (&text[..=i], &trimmed[i + 1..]),
        None => ("", trimmed),
    };
    let Some(rest) = last.strip_prefix(SIGNATURE_LINE) else {
        return Ok((text, None));
    };
    let malformed = || PackSignatureError::Malformed {
        line: last.to_string(),
    };
    // Exactly `KEYID SIGNATURE`: lowercase hex, one space, base64; no
    // other byte (a `\r` or a tab would give one signature many
    // spellings, and a `\r` is a line break to YAML).
    let base64 = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'=');
    if !rest.bytes().all(|b| b == b' ' || base64(b)) {
        return Err(malformed());
    }
    let mut words = rest.split(' ');
    let (Some(key), Some(sig), None) = (words.next(), words.next(), words.next()) else {
        return Err(malformed());
    };
    if key.len() != 16 || !key.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return Err(malformed());
    }
    let key = KeyId::from_hex(key).ok_or_else(malformed)?;
    let signature = Signature::from_base64(sig).map_err(|_| malformed())?;
    Ok((body, Some(PackSignature { key, signature })))
}

/// `text` with `sig`'s line appended (the text gets its final newline
/// first if it lacks one: what is signed is the text as it then is).
pub fn append(text: &str, sig: &PackSignature) -> String {
    format!(
        "{text}{SIGNATURE_LINE}{} {}\n",
        sig.key,
        sig.signature.to_base64()
    )
}

/// `tenant`'s pack `text` signed by `key`: its final newline, then its
/// signature line. `None`: it ends with a signature line already (one
/// signature per text; signing again would sign the first).
pub fn sign_text(key: &SigningKey, tenant: &str, text: &str) -> Option<String> {
    if split(text).is_ok_and(|(_, s)| s.is_some()) {
        return None;
    }
    let body = signable(text);
    let sig = PackSignature::sign(key, tenant, &body);
    Some(append(&body, &sig))
}

/// `text` as it will be signed: with its final newline.
pub fn signable(text: &str) -> String {
    if text.ends_with('\n') {
        text.to_string()
    } else {
        format!("{text}\n")
    }
}

/// A pack's signature and the key that made it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackSignature {
    /// The signing key's id.
    pub key: KeyId,
    /// Its signature of the tenant and the pack's bytes.
    pub signature: Signature,
}

impl PackSignature {
    /// `key`'s signature of `tenant`'s pack `yaml`.
    pub fn sign(key: &SigningKey, tenant: &str, yaml: &str) -> PackSignature {
        PackSignature {
            key: key.public().id(),
            signature: key.sign(&message(tenant, yaml)),
        }
    }
}

/// Why a pack's signature does not let it run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PackSignatureError {
    /// The newest trust list cannot be used (expired).
    #[error(transparent)]
    TrustList(#[from] crate::list::TrustError),
    /// The list does not name the tenant: once a box has a trust list,
    /// only the tenants it names may run packs there (a site that starts
    /// without signatures names its tenants with `require_signed: false`).
    #[error(
        "tenant {tenant} is not in trust list version {list}: its packs do not run on this box"
    )]
    UnknownTenant {
        /// The tenant.
        tenant: String,
        /// The trust list's version.
        list: u64,
    },
    /// The box's trust could not be established (its kept lists do not
    /// load): nothing runs until it is mended.
    #[error("this box's trust lists are unusable ({0}): no pack runs until they are mended")]
    Unusable(String),
    /// A last line that starts like a signature but is not one.
    #[error("malformed signature line {line:?}: expected `{SIGNATURE_LINE}KEY-ID SIGNATURE`")]
    Malformed {
        /// The line.
        line: String,
    },
    /// The tenant requires signed packs and this one carries none.
    #[error(
        "unsigned: tenant {tenant} requires packs signed by one of its keys (trust list version {list})"
    )]
    Unsigned {
        /// The tenant.
        tenant: String,
        /// The trust list's version.
        list: u64,
    },
    /// Signed by a key the list does not name for the tenant: another
    /// tenant's key, a revoked one, or none of the site's.
    #[error(
        "signed by key {key}, which trust list version {list} does not name for tenant {tenant} (another tenant's key, a revoked key, or an unknown one)"
    )]
    UnknownKey {
        /// The key the signature names.
        key: KeyId,
        /// The tenant.
        tenant: String,
        /// The trust list's version.
        list: u64,
    },
    /// The key is the tenant's, but the signature is not over these bytes.
    #[error(
        "the signature by key {key} does not match this pack's bytes for tenant {tenant} (signed over other bytes, or altered)"
    )]
    BadSignature {
        /// The key.
        key: KeyId,
        /// The tenant.
        tenant: String,
    },
}

/// How a pack passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PackVerdict {
    /// Signed by this key of the tenant's.
    Signed(KeyId),
    /// Unsigned, and the tenant does not require signatures.
    Unsigned,
    /// No trust list yet: nothing checked.
    Unchecked,
}

impl Trust {
    /// Whether `tenant`'s pack `text` (its signature line, if any, last)
    /// may run under the newest list at `now`: without a list nothing is
    /// checked (a site starts without); with an expired one nothing
    /// passes. (Here, not beside the rest of `Trust`: the lists know
    /// nothing of packs.)
    pub fn check_pack(
        &self,
        tenant: &str,
        text: &str,
        now_ns: i64,
    ) -> Result<PackVerdict, PackSignatureError> {
        let Some(list) = self.current(now_ns)? else {
            return Ok(PackVerdict::Unchecked);
        };
        let (body, sig) = split(text)?;
        verify(list, tenant, body, sig.as_ref())
    }

    /// Whether a pack of `tenant` taken with `verdict` may go on running
    /// under the newest list at `now` ([`still_allowed`]; an expired list
    /// allows nothing, no list everything).
    pub fn still_allows(
        &self,
        tenant: &str,
        verdict: &PackVerdict,
        now_ns: i64,
    ) -> Result<(), PackSignatureError> {
        let Some(list) = self.current(now_ns)? else {
            return Ok(());
        };
        let signer = match verdict {
            PackVerdict::Signed(k) => Some(*k),
            PackVerdict::Unsigned | PackVerdict::Unchecked => None,
        };
        still_allowed(list, tenant, signer)
    }
}

/// Whether `tenant`'s pack `yaml` with `sig` may run under `list`. A
/// signature that is there is always checked, required or not: a bad one
/// means something is wrong on the way.
pub fn verify(
    list: &TrustList,
    tenant: &str,
    yaml: &str,
    sig: Option<&PackSignature>,
) -> Result<PackVerdict, PackSignatureError> {
    let Some(sig) = sig else {
        admitted(list, tenant, None)?;
        return Ok(PackVerdict::Unsigned);
    };
    let key = admitted(list, tenant, Some(sig.key))?.ok_or(PackSignatureError::UnknownKey {
        key: sig.key,
        tenant: tenant.to_string(),
        list: list.version,
    })?;
    if !key.verify(&message(tenant, yaml), &sig.signature) {
        return Err(PackSignatureError::BadSignature {
            key: sig.key,
            tenant: tenant.to_string(),
        });
    }
    Ok(PackVerdict::Signed(sig.key))
}

/// Whether a pack of `tenant` signed by `signer` (`None`: unsigned) may
/// run under `list`, its bytes already checked against the signer when
/// it was taken: the tenant named, the signer still one of its keys, an
/// unsigned pack only where none is required. What a box asks of the
/// packs it holds when a new list comes (a key revoked, a tenant that now
/// requires signatures).
pub fn still_allowed(
    list: &TrustList,
    tenant: &str,
    signer: Option<KeyId>,
) -> Result<(), PackSignatureError> {
    match signer {
        None => admitted(list, tenant, None).map(|_| ()),
        Some(key) => match admitted(list, tenant, Some(key))? {
            Some(_) => Ok(()),
            None => Err(PackSignatureError::UnknownKey {
                key,
                tenant: tenant.to_string(),
                list: list.version,
            }),
        },
    }
}

/// The list's word on `tenant` and `signer`: the tenant must be named; an
/// unsigned pack (`None`) only where signatures are not required; a
/// signer's key as the tenant's (`None` when it is not one of them).
fn admitted<'l>(
    list: &'l TrustList,
    tenant: &str,
    signer: Option<KeyId>,
) -> Result<Option<&'l PublicKey>, PackSignatureError> {
    let Some(trust) = list.tenants.get(tenant) else {
        return Err(PackSignatureError::UnknownTenant {
            tenant: tenant.to_string(),
            list: list.version,
        });
    };
    match signer {
        None if trust.require_signed => Err(PackSignatureError::Unsigned {
            tenant: tenant.to_string(),
            list: list.version,
        }),
        None => Ok(None),
        Some(id) => Ok(trust.pack_keys.iter().find(|k| k.id() == id)),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::list::TenantTrust;

    const PACK: &str =
        "pack: press\nversion: 3\ninstructions:\n  - {id: n, action: noop, every: 1s}\n";

    fn list(version: u64, tenants: &[(&str, bool, &[&SigningKey])]) -> TrustList {
        TrustList {
            version,
            expires_ns: i64::MAX,
            next_root: None,
            tenants: tenants
                .iter()
                .map(|(t, require, keys)| {
                    (
                        (*t).to_string(),
                        TenantTrust {
                            require_signed: *require,
                            pack_keys: keys.iter().map(|k| k.public()).collect(),
                        },
                    )
                })
                .collect::<BTreeMap<_, _>>(),
            release_keys: Vec::new(),
        }
    }

    /// A held pack under a newer list: its signer still the tenant's
    /// key, or not (revoked); unsigned where the tenant now requires
    /// signatures; its tenant no longer named.
    #[test]
    fn a_held_pack_is_judged_again_by_its_signer() {
        let a = SigningKey::generate().expect("key");
        let b = SigningKey::generate().expect("key");
        let (ida, idb) = (a.public().id(), b.public().id());
        let l = list(5, &[("plant-a", true, &[&b]), ("plant-b", false, &[])]);
        assert_eq!(still_allowed(&l, "plant-a", Some(idb)), Ok(()));
        assert!(matches!(
            still_allowed(&l, "plant-a", Some(ida)),
            Err(PackSignatureError::UnknownKey { .. })
        ));
        assert!(matches!(
            still_allowed(&l, "plant-a", None),
            Err(PackSignatureError::Unsigned { .. })
        ));
        assert_eq!(still_allowed(&l, "plant-b", None), Ok(()));
        assert!(matches!(
            still_allowed(&l, "plant-c", Some(ida)),
            Err(PackSignatureError::UnknownTenant { .. })
        ));
    }

    /// The tenant's key over these bytes passes; unsigned, another
    /// tenant's key, other bytes, a key revoked by a newer list: refused,
    /// each saying why.
    #[test]
    fn only_the_tenants_key_over_these_bytes_passes() {
        let a = SigningKey::generate().expect("key");
        let b = SigningKey::generate().expect("key");
        let l = list(4, &[("plant-a", true, &[&a]), ("plant-b", true, &[&b])]);
        let good = PackSignature::sign(&a, "plant-a", PACK);
        assert_eq!(
            verify(&l, "plant-a", PACK, Some(&good)),
            Ok(PackVerdict::Signed(a.public().id()))
        );
        let e = verify(&l, "plant-a", PACK, None).expect_err("unsigned");
        assert_eq!(
            e.to_string(),
            "unsigned: tenant plant-a requires packs signed by one of its keys (trust list version 4)"
        );
        let theirs = PackSignature::sign(&b, "plant-a", PACK);
        assert!(matches!(
            verify(&l, "plant-a", PACK, Some(&theirs)),
            Err(PackSignatureError::UnknownKey { .. })
        ));
        let edited = PACK.replace("every: 1s", "every: 10ms");
        assert!(matches!(
            verify(&l, "plant-a", &edited, Some(&good)),
            Err(PackSignatureError::BadSignature { .. })
        ));
        // Moved to another tenant that trusts the same key: still refused,
        // the tenant is inside what was signed.
        let both = list(5, &[("plant-a", true, &[&a]), ("plant-c", true, &[&a])]);
        assert!(matches!(
            verify(&both, "plant-c", PACK, Some(&good)),
            Err(PackSignatureError::BadSignature { .. })
        ));
        // Revoked: a newer list without the key.
        let revoked = list(6, &[("plant-a", true, &[&b])]);
        assert!(matches!(
            verify(&revoked, "plant-a", PACK, Some(&good)),
            Err(PackSignatureError::UnknownKey { list: 6, .. })
        ));
    }

    /// A tenant that does not require signatures takes unsigned packs,
    /// but a signature it carries is still checked.
    #[test]
    fn without_the_requirement_unsigned_passes_and_a_bad_signature_does_not() {
        let a = SigningKey::generate().expect("key");
        let l = list(1, &[("plant-a", false, &[&a])]);
        assert_eq!(verify(&l, "plant-a", PACK, None), Ok(PackVerdict::Unsigned));
        // A tenant the list does not name runs nothing, signed or not.
        assert!(matches!(
            verify(&l, "nobody", PACK, None),
            Err(PackSignatureError::UnknownTenant { .. })
        ));
        let other = SigningKey::generate().expect("key");
        let sig = PackSignature::sign(&other, "plant-a", PACK);
        assert!(verify(&l, "plant-a", PACK, Some(&sig)).is_err());
    }

    /// A signed text splits back into what was signed and its signature;
    /// a text without the line is unsigned; a broken line is an error.
    #[test]
    fn the_signature_line_splits_off_and_round_trips() {
        let a = SigningKey::generate().expect("key");
        let body = signable(PACK.trim_end());
        assert_eq!(body, PACK);
        let sig = PackSignature::sign(&a, "plant-a", &body);
        let text = append(&body, &sig);
        let (got, got_sig) = split(&text).expect("split");
        assert_eq!(got, PACK);
        assert_eq!(got_sig.as_ref(), Some(&sig));
        assert_eq!(split(PACK).expect("plain"), (PACK, None));
        assert_eq!(
            sign_text(&a, "plant-a", PACK.trim_end()),
            Some(text.clone())
        );
        assert_eq!(sign_text(&a, "plant-a", &text), None, "signed once");
        let broken = format!("{PACK}{SIGNATURE_LINE}nothex AAAA\n");
        assert!(matches!(
            split(&broken),
            Err(PackSignatureError::Malformed { .. })
        ));
        // One spelling only: a CR, a tab, upper-case hex are refused.
        let line = text.lines().last().expect("line").to_string();
        for bad in [
            line.replacen(&format!("{} ", sig.key), &format!("{}\t", sig.key), 1),
            format!("{line}\r"),
            line.replace(&sig.key.to_string(), &sig.key.to_string().to_uppercase()),
        ] {
            let t = format!("{PACK}{bad}\n");
            assert!(split(&t).is_err(), "{bad:?}");
        }
        // Without its final newline too.
        let (got, s2) = split(text.trim_end()).expect("split");
        assert_eq!((got, s2.is_some()), (PACK, true));
    }
}
