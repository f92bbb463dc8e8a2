//! A release's binary assembled from chunks, checked against its signed
//! manifest as it grows: never longer than its size, complete only when
//! its SHA-256 is the manifest's. Sans-IO: chunks and their offsets come
//! in, the bytes to append go out; where they are kept is the caller's
//! ([`crate::versions`]).
//!
//! A chunk is placed by its offset, so a repeat (a resend after a lost
//! stream) is dropped and a gap is refused rather than filled with the
//! wrong bytes; the download resumes from [`Download::offset`], the length
//! already kept.

use baton_trust::ReleaseManifest;
use sha2::{Digest as _, Sha256};

/// Why a chunk or the whole download is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DownloadError {
    /// The manifest's digest is not 64 hex digits (a signed manifest is
    /// checked before; this is the assembler's own guard).
    #[error("release {version}: its manifest's sha256 is not a digest")]
    NoDigest {
        /// The release's version.
        version: String,
    },
    /// A chunk starts past the bytes held: the ones between were lost.
    #[error("chunk at byte {at}, but {held} bytes are held: the bytes between are missing")]
    Gap {
        /// Where the chunk starts.
        at: u64,
        /// The bytes held.
        held: u64,
    },
    /// A chunk ends past the release's size.
    #[error("chunk ends at byte {end}, past the release's size {size}")]
    PastEnd {
        /// Where the chunk ends.
        end: u64,
        /// The manifest's size.
        size: u64,
    },
    /// All bytes are in but their digest is not the signed one: altered on
    /// the way or in the store, or a file of another release.
    #[error(
        "release {version}: SHA-256 of the {size} bytes received is {got}, its signed manifest says {want}"
    )]
    DigestMismatch {
        /// The release's version.
        version: String,
        /// Its size.
        size: u64,
        /// The manifest's digest.
        want: String,
        /// The digest of what came.
        got: String,
    },
    /// Checked before all bytes came.
    #[error("release {version}: {held} of {size} bytes held")]
    Incomplete {
        /// The release's version.
        version: String,
        /// The bytes held.
        held: u64,
        /// Its size.
        size: u64,
    },
}

/// One release's download in progress.
#[derive(Clone, Debug)]
pub struct Download {
    version: String,
    size: u64,
    want: [u8; 32],
    hasher: Sha256,
    held: u64,
}

impl Download {
    /// A download of `manifest`'s binary, nothing held yet.
    pub fn new(manifest: &ReleaseManifest) -> Result<Download, DownloadError> {
        let want = manifest.digest().ok_or_else(|| DownloadError::NoDigest {
            version: manifest.version.clone(),
        })?;
        Ok(Download {
            version: manifest.version.clone(),
            size: manifest.size,
            want,
            hasher: Sha256::new(),
            held: 0,
        })
    }

    /// The bytes held: where the next chunk starts.
    pub fn offset(&self) -> u64 {
        self.held
    }

    /// The release's size.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Whether every byte is held (not yet whether they are the right
    /// ones: [`Download::verify`]).
    pub fn is_complete(&self) -> bool {
        self.held == self.size
    }

    /// Takes `chunk`, which starts at byte `at`, and returns its bytes
    /// that extend what is held (to append, in order): all of it, its
    /// tail when it overlaps what is held, nothing when it is a repeat.
    /// Nothing changes on a refusal.
    pub fn take<'a>(&mut self, at: u64, chunk: &'a [u8]) -> Result<&'a [u8], DownloadError> {
        let end = at.saturating_add(chunk.len() as u64);
        if end > self.size {
            return Err(DownloadError::PastEnd {
                end,
                size: self.size,
            });
        }
        if at > self.held {
            return Err(DownloadError::Gap {
                at,
                held: self.held,
            });
        }
        if end <= self.held {
            return Ok(&[]);
        }
        // `at <= held < end`, so the skip is within the chunk.
        let skip = usize::try_from(self.held - at).unwrap_or(chunk.len());
        let new = &chunk[skip..];
        self.hasher.update(new);
        self.held = end;
        Ok(new)
    }

    /// Whether the bytes held are the signed release: all of them, with
    /// its digest.
    pub fn verify(&self) -> Result<(), DownloadError> {
        if !self.is_complete() {
            return Err(DownloadError::Incomplete {
                version: self.version.clone(),
                held: self.held,
                size: self.size,
            });
        }
        let got: [u8; 32] = self.hasher.clone().finalize().into();
        if got != self.want {
            return Err(DownloadError::DigestMismatch {
                version: self.version.clone(),
                size: self.size,
                want: baton_trust::release::hex(&self.want),
                got: baton_trust::release::hex(&got),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn manifest(bin: &[u8]) -> ReleaseManifest {
        ReleaseManifest::of("0.2.0", "aarch64", bin).expect("manifest")
    }

    #[test]
    fn repeats_are_dropped_gaps_and_overruns_refused_and_the_digest_decides() {
        let bin: Vec<u8> = (0..100u8).collect();
        let mut d = Download::new(&manifest(&bin)).expect("download");
        let mut out = Vec::new();
        out.extend_from_slice(d.take(0, &bin[..40]).expect("first"));
        // A repeat, then an overlap: only the new tail.
        assert_eq!(d.take(0, &bin[..40]), Ok(&[][..]));
        out.extend_from_slice(d.take(30, &bin[30..60]).expect("overlap"));
        assert_eq!(d.offset(), 60);
        // A gap and an overrun change nothing.
        assert_eq!(
            d.take(70, &bin[70..80]),
            Err(DownloadError::Gap { at: 70, held: 60 })
        );
        assert_eq!(
            d.take(60, &[0; 41]),
            Err(DownloadError::PastEnd {
                end: 101,
                size: 100
            })
        );
        assert!(matches!(
            d.verify(),
            Err(DownloadError::Incomplete { held: 60, .. })
        ));
        out.extend_from_slice(d.take(60, &bin[60..]).expect("last"));
        assert!(d.is_complete());
        assert_eq!(d.verify(), Ok(()));
        assert_eq!(out, bin);

        // The same length, one byte other: refused whole.
        let mut d = Download::new(&manifest(&bin)).expect("download");
        let mut evil = bin.clone();
        evil[50] ^= 1;
        d.take(0, &evil).expect("all");
        let e = d.verify().expect_err("altered");
        assert!(e.to_string().contains("signed manifest says"), "{e}");
    }

    proptest! {
        /// However the bytes are cut, repeated and overlapped, what is
        /// appended is the binary, once.
        #[test]
        fn any_chunking_with_repeats_assembles_the_binary_once(
            bin in proptest::collection::vec(any::<u8>(), 1..2000),
            cuts in proptest::collection::vec((0usize..2000, 0usize..300), 1..60),
        ) {
            let mut d = Download::new(&manifest(&bin)).expect("download");
            let mut out = Vec::new();
            for (back, len) in cuts {
                let at = (d.offset() as usize).saturating_sub(back % 400);
                let end = (at + len).min(bin.len());
                out.extend_from_slice(d.take(at as u64, &bin[at..end]).expect("in order"));
            }
            let at = d.offset() as usize;
            out.extend_from_slice(d.take(at as u64, &bin[at..]).expect("rest"));
            prop_assert_eq!(&out, &bin);
            prop_assert_eq!(d.verify(), Ok(()));
        }
    }
}
