//! Operator tokens for the web dashboard and scripts: `ca issue-operator
//! NAME --token` prints one beside the certificate, and the controller
//! takes it in exchange for a session (the login page) or as
//! `Authorization: Bearer`.
//!
//! A token is bound to the certificate it was issued with: it speaks for
//! that certificate's identity (tenant and role), ends when it expires,
//! and is refused as soon as its serial is revoked (`ca revoke NAME`), so
//! one revocation shuts both doors. `DIR/tokens.txt` (0600) keeps only
//! SHA-256 digests, one token a line:
//!
//! ```text
//! DIGEST SERIAL NOT_AFTER IDENTITY
//! ```
//!
//! (`DIGEST` lowercase hex; `SERIAL` as `revoked.txt` lists it;
//! `NOT_AFTER` in seconds since the epoch; `IDENTITY` the certificate's
//! `baton:operator:` URI). A token carries 256 random bits, so a plain
//! digest is enough: there is no password to guess offline.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::ca::{self, CaDir, CaError};
use crate::identity::Identity;

/// The prefix every token starts with (so a leaked one is recognisable by
/// secret scanners, and a certificate pasted by mistake is not a token).
pub const PREFIX: &str = "baton_";

/// `DIR/tokens.txt`.
pub fn path(ca: &CaDir) -> PathBuf {
    ca.dir.join("tokens.txt")
}

/// What a token speaks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenGrant {
    /// Its certificate's serial (revoking it revokes the token).
    pub serial: String,
    /// Seconds since the epoch after which it is refused.
    pub not_after: i64,
    /// Who it is (an operator).
    pub identity: Identity,
}

/// Lowercase hex SHA-256 of `token`.
pub fn digest(token: &str) -> String {
    let d = Sha256::digest(token.as_bytes());
    let mut out = String::with_capacity(64);
    for b in d.iter() {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// A new token for the operator certificate at `cert` (just issued):
/// its digest is appended to `DIR/tokens.txt`; the token itself is only
/// returned, never stored.
pub fn issue(ca_dir: &CaDir, cert: &Path) -> Result<String, CaError> {
    let peer = ca::read_cert(cert)?;
    let Some(uri) = peer.identity.to_uri() else {
        return Err(CaError::Cert {
            path: cert.to_path_buf(),
            message: "no identity to issue a token for".into(),
        });
    };
    let not_after = not_after_of(cert)?;
    let secret: [u8; 32] = rand::random();
    let mut token = String::from(PREFIX);
    for b in secret {
        token.push_str(&format!("{b:02x}"));
    }
    let file = path(ca_dir);
    let mut f = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(&file)
            .map_err(|e| io_err(&file, e))?
    };
    writeln!(f, "{} {} {not_after} {uri}", digest(&token), peer.serial)
        .and_then(|()| f.sync_all())
        .map_err(|e| io_err(&file, e))?;
    Ok(token)
}

fn not_after_of(cert: &Path) -> Result<i64, CaError> {
    let bytes = std::fs::read(cert).map_err(|e| io_err(cert, e))?;
    let bad = |m: String| CaError::Cert {
        path: cert.to_path_buf(),
        message: m,
    };
    let (_, pem) = x509_parser::pem::parse_x509_pem(&bytes).map_err(|e| bad(e.to_string()))?;
    let (_, c) =
        x509_parser::parse_x509_certificate(&pem.contents).map_err(|e| bad(e.to_string()))?;
    Ok(c.validity().not_after.timestamp())
}

fn io_err(path: &Path, source: std::io::Error) -> CaError {
    CaError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The tokens in `DIR/tokens.txt` by digest (none if it does not exist).
/// A line that does not read is an error naming it: a half-written file
/// must not silently drop every token after it.
pub fn read(file: &Path) -> Result<HashMap<String, TokenGrant>, CaError> {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(HashMap::new()),
        Err(e) => return Err(io_err(file, e)),
    };
    let mut out = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let bad = |what: &str| CaError::Cert {
            path: file.to_path_buf(),
            message: format!("line {}: {what}", i + 1),
        };
        let f: Vec<&str> = line.split_whitespace().collect();
        let [d, serial, not_after, uri] = f[..] else {
            return Err(bad("expected DIGEST SERIAL NOT_AFTER IDENTITY"));
        };
        if d.len() != 64 || !d.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad("the digest is not 64 hex digits"));
        }
        if !serial.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad("the serial is not hex"));
        }
        let not_after = not_after
            .parse()
            .map_err(|_| bad("NOT_AFTER is not seconds since the epoch"))?;
        let identity = Identity::from_uri(uri).map_err(|e| bad(&e.0))?;
        if !matches!(identity, Identity::Operator { .. }) {
            return Err(bad("a token speaks for an operator only"));
        }
        out.insert(
            d.to_ascii_lowercase(),
            TokenGrant {
                serial: serial.to_ascii_lowercase(),
                not_after,
                identity,
            },
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // a failed unwrap is a failed test
    use super::*;
    use crate::ca::Validity;
    use crate::identity::Role;

    #[test]
    fn a_token_is_stored_as_a_digest_bound_to_its_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let ca = CaDir::new(dir.path());
        let now = jiff::Timestamp::now();
        ca::init(&ca, &[], now).unwrap();
        let who = Identity::Operator {
            name: "ann".into(),
            tenant: "plant-a".into(),
            role: Role::Viewer,
        };
        let cert = ca::issue(&ca, &who, Validity::days(now, 2), ca::Existing::Refuse)
            .unwrap()
            .cert;
        let token = issue(&ca, &cert).unwrap();
        assert!(token.starts_with(PREFIX) && token.len() == PREFIX.len() + 64);
        let text = std::fs::read_to_string(path(&ca)).unwrap();
        assert!(!text.contains(&token), "the token itself is never stored");
        let tokens = read(&path(&ca)).unwrap();
        let grant = &tokens[&digest(&token)];
        assert_eq!(grant.identity, who);
        assert_eq!(grant.serial, ca::read_cert(&cert).unwrap().serial);
        let left = grant.not_after - now.as_second();
        assert!((86_400..=2 * 86_400 + 60).contains(&left), "{left}");
        // A second token for a re-issued certificate: both listed.
        let cert2 = ca::issue(&ca, &who, Validity::days(now, 2), ca::Existing::Replace)
            .unwrap()
            .cert;
        let token2 = issue(&ca, &cert2).unwrap();
        assert_eq!(read(&path(&ca)).unwrap().len(), 2);
        assert_ne!(token, token2);
    }

    #[test]
    fn a_damaged_tokens_file_is_an_error_naming_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("tokens.txt");
        std::fs::write(&f, format!("# ok\n{} 0a 1 baton:agent:x\n", "a".repeat(64))).unwrap();
        let e = read(&f).unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("operator only"), "{e}");
        std::fs::write(&f, "abc 0a 1\n").unwrap();
        assert!(read(&f).unwrap_err().to_string().contains("line 1"));
        assert!(read(&dir.path().join("none.txt")).unwrap().is_empty());
    }
}
