//! This build's version: what its link reports in each Hello, what the
//! launcher compares a trial with, what `/metrics` labels.
//!
//! It is kept in a marked slot of the binary (`baton_trust::release`'s
//! `SLOT_MARK`) rather than only as a constant the compiler may fold into
//! each use, so the version of a built binary can be read and stamped
//! without a rebuild: a release pipeline stamps its own version into a
//! build, `keys sign-release` and the box check that a build reports the
//! version its manifest names, and the update tests make a second build of
//! another version from the first. A slot that does not read as a version
//! falls back to the crate's version.

use std::sync::OnceLock;

use baton_trust::release::{SLOT_LEN, SLOT_MARK, read_slot};

const fn slot() -> [u8; SLOT_LEN] {
    let v = env!("CARGO_PKG_VERSION").as_bytes();
    let mut out = [0u8; SLOT_LEN];
    let mut i = 0;
    while i < SLOT_MARK.len() {
        out[i] = SLOT_MARK[i];
        i += 1;
    }
    let mut j = 0;
    while j < v.len() {
        out[i + j] = v[j];
        j += 1;
    }
    out
}

/// The slot, as the binary carries it.
#[used]
static SLOT: [u8; SLOT_LEN] = slot();

/// This build's version.
pub fn version() -> &'static str {
    static READ: OnceLock<&'static str> = OnceLock::new();
    READ.get_or_init(|| {
        // Read through an opaque reference: the bytes in the file, not
        // the ones the compiler saw.
        let slot: &'static [u8; SLOT_LEN] = std::hint::black_box(&SLOT);
        read_slot(slot).unwrap_or(env!("CARGO_PKG_VERSION"))
    })
}

/// `binary` with its version slot stamped `version` (see
/// `baton_trust::release::stamp`).
pub fn stamp(binary: &[u8], version: &str) -> Option<Vec<u8>> {
    baton_trust::release::stamp(binary, version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slot_reads_as_the_crate_version() {
        assert_eq!(version(), env!("CARGO_PKG_VERSION"));
        assert_eq!(read_slot(&slot()), Some(env!("CARGO_PKG_VERSION")));
    }
}
