//! This build's version: what its link reports in each Hello, what the
//! launcher compares a trial with, what `/metrics` labels.
//!
//! It is kept in a marked slot of the binary rather than only as a
//! constant the compiler may fold into each use, so the version of a
//! built binary can be read and stamped without a rebuild: a release
//! pipeline stamps its own version into a build (and the update tests
//! make a second build of another version from the first). Whatever the
//! slot holds is checked as a release version is (`check_version`); a
//! slot that does not read as one falls back to the crate's version.

use std::sync::OnceLock;

/// What the slot starts with: how a stamping tool finds it.
pub const MARK: &[u8] = b"baton-agent-version=";

/// The slot's length: the mark, the version, NUL padding.
pub const SLOT_LEN: usize = MARK.len() + baton_trust::release::MAX_VERSION_LEN;

const fn slot() -> [u8; SLOT_LEN] {
    let v = env!("CARGO_PKG_VERSION").as_bytes();
    let mut out = [0u8; SLOT_LEN];
    let mut i = 0;
    while i < MARK.len() {
        out[i] = MARK[i];
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
        read(slot).unwrap_or(env!("CARGO_PKG_VERSION"))
    })
}

/// The version a slot holds, if it reads as one: the mark, a version,
/// and NUL to the slot's end (the mark alone, as the code that looks for
/// it carries it, is not a slot).
pub fn read(slot: &[u8]) -> Option<&str> {
    let rest = slot.get(..SLOT_LEN)?.strip_prefix(MARK)?;
    let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    if rest[end..].iter().any(|&b| b != 0) {
        return None;
    }
    let v = std::str::from_utf8(&rest[..end]).ok()?;
    baton_trust::release::check_version(v).ok().map(|()| v)
}

/// `binary` with its slot stamped `version`; `None` when it does not hold
/// exactly one slot or `version` cannot be one.
pub fn stamp(binary: &[u8], version: &str) -> Option<Vec<u8>> {
    baton_trust::release::check_version(version).ok()?;
    let mut at = binary
        .windows(MARK.len())
        .enumerate()
        .filter(|(_, w)| *w == MARK)
        .map(|(i, _)| i)
        .filter(|&i| binary.len() >= i + SLOT_LEN && read(&binary[i..i + SLOT_LEN]).is_some());
    let i = at.next()?;
    if at.next().is_some() {
        return None;
    }
    let mut out = binary.to_vec();
    let slot = &mut out[i + MARK.len()..i + SLOT_LEN];
    slot.fill(0);
    slot[..version.len()].copy_from_slice(version.as_bytes());
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slot_reads_as_the_crate_version_and_stamps_into_another() {
        assert_eq!(version(), env!("CARGO_PKG_VERSION"));
        let mut fake = b"ELF...".to_vec();
        fake.extend_from_slice(&slot());
        fake.extend_from_slice(b"...more");
        let stamped = stamp(&fake, "9.9.9-rc.1").expect("one slot");
        let i = 6;
        assert_eq!(read(&stamped[i..i + SLOT_LEN]), Some("9.9.9-rc.1"));
        assert_eq!(stamped.len(), fake.len());
        assert_eq!(stamp(&fake, "../x"), None, "not a version");
        let mut two = fake.clone();
        two.extend_from_slice(&slot());
        assert_eq!(stamp(&two, "1.0.0"), None, "two slots: which?");
    }
}
