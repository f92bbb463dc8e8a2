//! Ed25519 keys as baton names and writes them: a public key and a
//! signature as base64 text, a key's id as the hex of the first 8 bytes of
//! the public key's SHA-256 (what a message names, so the reader sees
//! which key signed without comparing keys), a signing key as its PKCS#8
//! document (what `ring` generates and reads back).

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair as _, UnparsedPublicKey};
use sha2::{Digest as _, Sha256};

/// Why a key or a signature could not be read or made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// Not base64, or not the length an Ed25519 key or signature has.
    #[error("{what}: {why}")]
    Malformed {
        /// What was read (`public key`, `signature`).
        what: &'static str,
        /// Why it is not one.
        why: String,
    },
    /// A signing key's PKCS#8 document was refused.
    #[error("signing key: not an Ed25519 PKCS#8 document ({0})")]
    Pkcs8(String),
    /// The system's random source failed.
    #[error("the system's random source failed while generating a key")]
    Random,
}

/// An Ed25519 public key.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PublicKey([u8; 32]);

/// A key's short name: the first 8 bytes of its public key's SHA-256.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KeyId([u8; 8]);

/// An Ed25519 signature.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Signature([u8; 64]);

/// A private key (its PKCS#8 document): only ever on an operator's or a
/// release engineer's machine, never in the controller's store.
pub struct SigningKey {
    pair: Ed25519KeyPair,
    pkcs8: Vec<u8>,
}

fn decode<const N: usize>(what: &'static str, text: &str) -> Result<[u8; N], KeyError> {
    let bytes = B64.decode(text.trim()).map_err(|e| KeyError::Malformed {
        what,
        why: format!("not base64 ({e})"),
    })?;
    <[u8; N]>::try_from(bytes.as_slice()).map_err(|_| KeyError::Malformed {
        what,
        why: format!("{} bytes, an Ed25519 {what} has {N}", bytes.len()),
    })
}

impl PublicKey {
    /// From its base64 text.
    pub fn from_base64(text: &str) -> Result<PublicKey, KeyError> {
        decode("public key", text).map(PublicKey)
    }

    /// As base64 text.
    pub fn to_base64(&self) -> String {
        B64.encode(self.0)
    }

    /// Its id.
    pub fn id(&self) -> KeyId {
        let d = Sha256::digest(self.0);
        let mut id = [0u8; 8];
        id.copy_from_slice(&d[..8]);
        KeyId(id)
    }

    /// Whether `sig` is this key's signature of `msg`.
    pub fn verify(&self, msg: &[u8], sig: &Signature) -> bool {
        UnparsedPublicKey::new(&ED25519, &self.0)
            .verify(msg, &sig.0)
            .is_ok()
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_base64())
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.id())
    }
}

impl serde::Serialize for PublicKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_base64())
    }
}

impl<'de> serde::Deserialize<'de> for PublicKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        PublicKey::from_base64(&text).map_err(serde::de::Error::custom)
    }
}

impl KeyId {
    /// From its hex text (16 digits).
    pub fn from_hex(text: &str) -> Option<KeyId> {
        let t = text.trim();
        if t.len() != 16 {
            return None;
        }
        let mut id = [0u8; 8];
        for (i, b) in id.iter_mut().enumerate() {
            *b = u8::from_str_radix(t.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(KeyId(id))
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyId({self})")
    }
}

impl serde::Serialize for KeyId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> serde::Deserialize<'de> for KeyId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        KeyId::from_hex(&text)
            .ok_or_else(|| serde::de::Error::custom(format!("key id {text:?}: 16 hex digits")))
    }
}

impl Signature {
    /// From its base64 text.
    pub fn from_base64(text: &str) -> Result<Signature, KeyError> {
        decode("signature", text).map(Signature)
    }

    /// As base64 text.
    pub fn to_base64(&self) -> String {
        B64.encode(self.0)
    }
}

impl fmt::Debug for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Signature({}…)", &self.to_base64()[..12])
    }
}

impl serde::Serialize for Signature {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_base64())
    }
}

impl<'de> serde::Deserialize<'de> for Signature {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Signature::from_base64(&text).map_err(serde::de::Error::custom)
    }
}

impl SigningKey {
    /// A new key from the system's random source.
    pub fn generate() -> Result<SigningKey, KeyError> {
        let rng = ring::rand::SystemRandom::new();
        let doc = Ed25519KeyPair::generate_pkcs8(&rng).map_err(|_| KeyError::Random)?;
        SigningKey::from_pkcs8(doc.as_ref())
    }

    /// From its PKCS#8 document.
    pub fn from_pkcs8(pkcs8: &[u8]) -> Result<SigningKey, KeyError> {
        let pair = Ed25519KeyPair::from_pkcs8(pkcs8).map_err(|e| KeyError::Pkcs8(e.to_string()))?;
        Ok(SigningKey {
            pair,
            pkcs8: pkcs8.to_vec(),
        })
    }

    /// Its PKCS#8 document, to keep (a file only its owner reads).
    pub fn pkcs8(&self) -> &[u8] {
        &self.pkcs8
    }

    /// Its public half.
    pub fn public(&self) -> PublicKey {
        let mut k = [0u8; 32];
        k.copy_from_slice(self.pair.public_key().as_ref());
        PublicKey(k)
    }

    /// Its signature of `msg`.
    pub fn sign(&self, msg: &[u8]) -> Signature {
        let mut s = [0u8; 64];
        s.copy_from_slice(self.pair.sign(msg).as_ref());
        Signature(s)
    }
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SigningKey({})", self.public().id())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_verifies_only_for_its_key_and_bytes() {
        let a = SigningKey::generate().expect("key");
        let b = SigningKey::generate().expect("key");
        let sig = a.sign(b"pack bytes");
        assert!(a.public().verify(b"pack bytes", &sig));
        assert!(!a.public().verify(b"pack bytez", &sig), "other bytes");
        assert!(!b.public().verify(b"pack bytes", &sig), "another key");
        // Text round trips, and the key survives its PKCS#8 document.
        let back = SigningKey::from_pkcs8(a.pkcs8()).expect("pkcs8");
        assert_eq!(back.public(), a.public());
        assert_eq!(
            PublicKey::from_base64(&a.public().to_base64()).expect("b64"),
            a.public()
        );
        assert_eq!(Signature::from_base64(&sig.to_base64()).expect("b64"), sig);
        let id = a.public().id();
        assert_eq!(KeyId::from_hex(&id.to_string()), Some(id));
    }

    #[test]
    fn malformed_text_says_what_is_wrong() {
        let e = PublicKey::from_base64("AAAA").expect_err("short");
        assert_eq!(
            e.to_string(),
            "public key: 3 bytes, an Ed25519 public key has 32"
        );
        let e = Signature::from_base64("not base64!").expect_err("bad");
        assert!(e.to_string().starts_with("signature: not base64"), "{e}");
        assert!(SigningKey::from_pkcs8(b"junk").is_err());
        assert_eq!(KeyId::from_hex("zz"), None);
    }
}
