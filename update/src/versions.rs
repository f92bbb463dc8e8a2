//! The versions directory on a box (`<data-dir>/agent-versions`): one
//! directory per release with its binary and signed manifest, a download
//! in progress beside it (`baton-agent.part`), and the launcher's state
//! (`state.json`, replaced whole: the switch between versions).
//!
//! ```text
//! agent-versions/
//!   state.json
//!   0.2.0/baton-agent          installed: complete, digest checked, 0755
//!   0.2.0/release.json         the signed manifest it was checked against
//!   0.3.0/baton-agent.part     a download in progress (resumed from its length)
//! ```
//!
//! A binary is only ever renamed into place once all its bytes are synced
//! and their digest is the signed one, so `<version>/baton-agent` existing
//! means it is the release. A `.part` after a crash may end in bytes never
//! synced (zeros after a power cut); the digest check at the end catches
//! them, the part is removed, and the download starts again.

use std::fs::{File, OpenOptions};
use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use baton_trust::release::check_version;
use baton_trust::{ReleaseManifest, SignedRelease};

use crate::boot::BootState;
use crate::download::{Download, DownloadError};
use crate::files::{sync_parent, write_atomically};

/// The binary's name inside its version's directory.
pub const BINARY: &str = "baton-agent";

/// Why the versions directory could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum UpdateError {
    /// A file could not be read or written.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why it failed.
        source: std::io::Error,
    },
    /// The bytes are not the release's.
    #[error(transparent)]
    Download(#[from] DownloadError),
    /// The state file is not one.
    #[error("{path}: not the launcher's state ({why})")]
    State {
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// A version that cannot name a directory (a signed manifest is
    /// checked before; this is the directory's own guard).
    #[error("release manifest: {0}")]
    Version(String),
}

/// Whether `version` can name its directory here: a release version
/// (`check_version`) that is not one of the directory's own files.
fn dir_name(version: &str) -> Result<(), String> {
    check_version(version)?;
    if version == "state.json" || version.ends_with(".tmp") {
        return Err(format!(
            "version {version:?} names a file of the versions directory"
        ));
    }
    Ok(())
}

/// `file`'s bytes from where it stands, through `download` (its digest and
/// its bound), a block at a time: bounded memory whatever the size.
fn read_through(file: &mut File, path: &Path, download: &mut Download) -> Result<(), UpdateError> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = file.read(&mut buf).map_err(io("reading", path))?;
        if n == 0 {
            return Ok(());
        }
        download.take(download.offset(), &buf[..n])?;
    }
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> UpdateError + 'a {
    move |source| UpdateError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// A box's versions directory.
#[derive(Clone, Debug)]
pub struct Versions {
    dir: PathBuf,
}

/// A download in progress: its file, open for appending, and the bytes
/// checked so far.
#[derive(Debug)]
pub struct Partial {
    file: File,
    path: PathBuf,
    download: Download,
    dir: PathBuf,
}

impl Versions {
    /// The versions directory of the agent whose data directory is
    /// `data_dir`.
    pub fn of_data_dir(data_dir: &Path) -> Versions {
        Versions {
            dir: data_dir.join("agent-versions"),
        }
    }

    /// Its path.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where `version`'s binary is once installed.
    pub fn binary(&self, version: &str) -> PathBuf {
        self.dir.join(version).join(BINARY)
    }

    /// Whether `version`'s binary is installed (a file; what makes one is
    /// only [`Versions::install`]).
    pub fn is_installed(&self, version: &str) -> bool {
        dir_name(version).is_ok() && self.binary(version).is_file()
    }

    fn state_path(&self) -> PathBuf {
        self.dir.join("state.json")
    }

    /// The launcher's state (`None`: there is none, the packaged binary
    /// runs).
    pub fn read_state(&self) -> Result<Option<BootState>, UpdateError> {
        let path = self.state_path();
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| UpdateError::State {
                    path,
                    why: e.to_string(),
                }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io("reading", &path)(e)),
        }
    }

    /// Replaces the launcher's state whole (the switch between versions).
    pub fn write_state(&self, state: &BootState) -> Result<(), UpdateError> {
        std::fs::create_dir_all(&self.dir).map_err(io("creating", &self.dir))?;
        let path = self.state_path();
        // Serialising strings and booleans cannot fail.
        let text = serde_json::to_vec_pretty(state).unwrap_or_default();
        write_atomically(&path, &text).map_err(io("writing", &path))
    }

    /// Begins `release`'s download, or resumes the one kept: the bytes
    /// already in its `.part` are read through the digest again, and the
    /// next chunk asked for starts after them. A part longer than the
    /// release is begun again.
    pub fn begin(
        &self,
        signed: &SignedRelease,
        manifest: &ReleaseManifest,
    ) -> Result<Partial, UpdateError> {
        dir_name(&manifest.version).map_err(UpdateError::Version)?;
        let dir = self.dir.join(&manifest.version);
        std::fs::create_dir_all(&dir).map_err(io("creating", &dir))?;
        let release = dir.join("release.json");
        // Serialising strings cannot fail.
        let text = serde_json::to_vec_pretty(signed).unwrap_or_default();
        write_atomically(&release, &text).map_err(io("writing", &release))?;
        let path = dir.join(format!("{BINARY}.part"));
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(io("opening", &path))?;
        let mut download = Download::new(manifest)?;
        let len = file.metadata().map_err(io("reading", &path))?.len();
        if len > download.size() {
            file.set_len(0).map_err(io("truncating", &path))?;
        } else {
            read_through(&mut file, &path, &mut download)?;
        }
        file.seek(SeekFrom::Start(download.offset()))
            .map_err(io("seeking", &path))?;
        Ok(Partial {
            file,
            path,
            download,
            dir,
        })
    }

    /// Puts a complete download in place as its version's binary: its
    /// bytes synced, their digest the signed one, executable, renamed into
    /// place and the rename synced. A digest that is not the signed one
    /// removes the part (the next download begins again) and says why.
    pub fn install(&self, partial: Partial) -> Result<PathBuf, UpdateError> {
        if let Err(e) = partial.download.verify() {
            if matches!(e, DownloadError::DigestMismatch { .. }) {
                let _ = std::fs::remove_file(&partial.path);
            }
            return Err(e.into());
        }
        let path = &partial.path;
        partial.file.sync_all().map_err(io("syncing", path))?;
        partial
            .file
            .set_permissions(std::fs::Permissions::from_mode(0o755))
            .map_err(io("making executable", path))?;
        let binary = partial.dir.join(BINARY);
        std::fs::rename(path, &binary).map_err(io("installing", &binary))?;
        sync_parent(&binary).map_err(io("syncing", &partial.dir))?;
        Ok(binary)
    }

    /// Whether `version`'s installed binary is still its signed release:
    /// its `release.json` passes `check` (the signature, against the box's
    /// trust), and the binary's size and SHA-256 are the manifest's (read a
    /// block at a time). What the launcher asks before it runs a version,
    /// so a binary put there by anything else is never run.
    pub fn verify_installed(
        &self,
        version: &str,
        check: impl FnOnce(&SignedRelease) -> Result<ReleaseManifest, String>,
    ) -> Result<(), String> {
        dir_name(version)?;
        let dir = self.dir.join(version);
        let release = dir.join("release.json");
        let text = std::fs::read(&release).map_err(|e| format!("{}: {e}", release.display()))?;
        let signed: SignedRelease = serde_json::from_slice(&text)
            .map_err(|e| format!("{}: not a signed release ({e})", release.display()))?;
        let manifest = check(&signed)?;
        if manifest.version != version {
            return Err(format!(
                "{} names version {}, its directory {version}",
                release.display(),
                manifest.version
            ));
        }
        let binary = dir.join(BINARY);
        let mut file = File::open(&binary).map_err(|e| format!("{}: {e}", binary.display()))?;
        let mut download = Download::new(&manifest).map_err(|e| e.to_string())?;
        read_through(&mut file, &binary, &mut download).map_err(|e| e.to_string())?;
        download.verify().map_err(|e| e.to_string())
    }

    /// The version `version`'s installed binary reports (its one version
    /// slot, `baton_trust::release::read_slot`), read a block at a time;
    /// `None`: no slot, or more than one.
    pub fn reported_version(&self, version: &str) -> Result<Option<String>, UpdateError> {
        use baton_trust::release::{SLOT_LEN, SLOT_MARK, read_slot};
        let path = self.binary(version);
        let mut file = File::open(&path).map_err(io("reading", &path))?;
        let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024 + SLOT_LEN);
        let mut block = vec![0u8; 64 * 1024];
        let mut found: Vec<String> = Vec::new();
        loop {
            let n = file.read(&mut block).map_err(io("reading", &path))?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&block[..n]);
            // Every start with a whole slot's bytes after it is looked at
            // now; the rest (fewer than a slot's bytes) with the next block.
            let whole = buf.len().saturating_sub(SLOT_LEN - 1);
            for i in 0..whole {
                if buf[i..].starts_with(SLOT_MARK)
                    && let Some(v) = read_slot(&buf[i..])
                {
                    found.push(v.to_string());
                }
            }
            buf.drain(..whole);
        }
        Ok((found.len() == 1).then(|| found.remove(0)))
    }

    /// Removes every version's directory but `keep` (what the state names,
    /// and a download in progress).
    pub fn prune(&self, keep: &[String]) -> Result<Vec<String>, UpdateError> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io("listing", &self.dir)(e)),
        };
        let mut removed = Vec::new();
        for entry in entries {
            let entry = entry.map_err(io("listing", &self.dir))?;
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            if !is_dir || dir_name(&name).is_err() || keep.contains(&name) {
                continue;
            }
            let path = entry.path();
            std::fs::remove_dir_all(&path).map_err(io("removing", &path))?;
            removed.push(name);
        }
        removed.sort();
        Ok(removed)
    }
}

impl Partial {
    /// The bytes held: where the next chunk should start.
    pub fn offset(&self) -> u64 {
        self.download.offset()
    }

    /// Whether every byte is held.
    pub fn is_complete(&self) -> bool {
        self.download.is_complete()
    }

    /// Appends what `chunk` (at byte `at`) adds; a repeat adds nothing, a
    /// gap or an overrun is refused with nothing written.
    pub fn append(&mut self, at: u64, chunk: &[u8]) -> Result<(), UpdateError> {
        let before = self.download.clone();
        let new = self.download.take(at, chunk)?;
        if let Err(e) = self.file.write_all(new) {
            // Not held: the next chunk asked for starts where the file
            // was before (a short write is overwritten).
            self.download = before;
            let _ = self.file.seek(SeekFrom::Start(self.download.offset()));
            return Err(io("writing", &self.path)(e));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_trust::SigningKey;

    fn release(bin: &[u8], version: &str) -> (SignedRelease, ReleaseManifest) {
        let m = ReleaseManifest::of(version, "aarch64", bin).expect("manifest");
        let key = SigningKey::generate().expect("key");
        (SignedRelease::sign(&m, &key), m)
    }

    #[test]
    fn a_download_cut_midway_resumes_from_what_was_kept_and_installs_the_release() {
        let tmp = tempfile::tempdir().expect("tmp");
        let v = Versions::of_data_dir(tmp.path());
        let bin: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let (signed, m) = release(&bin, "0.2.0");
        let mut p = v.begin(&signed, &m).expect("begin");
        p.append(0, &bin[..100_000]).expect("first");
        drop(p); // the agent restarts mid-download
        let mut p = v.begin(&signed, &m).expect("resume");
        assert_eq!(p.offset(), 100_000);
        assert!(!v.is_installed("0.2.0"));
        // The controller resends from before: the repeat adds nothing.
        p.append(90_000, &bin[90_000..200_000]).expect("overlap");
        p.append(200_000, &bin[200_000..]).expect("rest");
        assert!(p.is_complete());
        let path = v.install(p).expect("install");
        assert_eq!(std::fs::read(&path).expect("read"), bin);
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o755);
        assert!(v.is_installed("0.2.0"));
        assert!(!path.with_file_name("baton-agent.part").exists());
        let kept: SignedRelease = serde_json::from_slice(
            &std::fs::read(path.with_file_name("release.json")).expect("manifest"),
        )
        .expect("json");
        assert_eq!(kept, signed);
    }

    #[test]
    fn bytes_that_are_not_the_release_are_never_installed_and_the_download_begins_again() {
        let tmp = tempfile::tempdir().expect("tmp");
        let v = Versions::of_data_dir(tmp.path());
        let bin = vec![1u8; 5000];
        let (signed, m) = release(&bin, "0.2.0");
        let mut p = v.begin(&signed, &m).expect("begin");
        let mut evil = bin.clone();
        evil[4999] = 2;
        p.append(0, &evil).expect("all bytes");
        let e = v.install(p).expect_err("digest");
        assert!(
            matches!(
                e,
                UpdateError::Download(DownloadError::DigestMismatch { .. })
            ),
            "{e}"
        );
        assert!(!v.is_installed("0.2.0"));
        let p = v.begin(&signed, &m).expect("again");
        assert_eq!(p.offset(), 0, "the altered part was removed");
        // Incomplete: refused, the part kept to resume.
        let e = v.install(p).expect_err("incomplete");
        assert!(
            matches!(e, UpdateError::Download(DownloadError::Incomplete { .. })),
            "{e}"
        );
        // A part longer than the release (another file) is begun again.
        let part = v.dir().join("0.2.0").join("baton-agent.part");
        std::fs::write(&part, vec![0u8; 6000]).expect("write");
        assert_eq!(v.begin(&signed, &m).expect("begin").offset(), 0);
    }

    #[test]
    fn the_state_is_replaced_whole_and_pruning_keeps_what_it_names() {
        let tmp = tempfile::tempdir().expect("tmp");
        let v = Versions::of_data_dir(tmp.path());
        assert_eq!(v.read_state().expect("none"), None);
        let s = crate::boot::stage(None, "0.1.0", "0.3.0");
        v.write_state(&s).expect("write");
        assert_eq!(v.read_state().expect("read"), Some(s.clone()));
        for ver in ["0.2.0", "0.3.0", "0.4.0"] {
            let (signed, m) = release(b"x", ver);
            let p = v.begin(&signed, &m).expect("begin");
            drop(p);
        }
        let removed = v
            .prune(&["0.3.0".to_string(), "0.4.0".to_string()])
            .expect("prune");
        assert_eq!(removed, vec!["0.2.0".to_string()]);
        assert!(v.dir().join("0.3.0").is_dir() && v.dir().join("state.json").is_file());
        // A version named like the directory's own files is no directory.
        let (signed, m) = release(b"x", "state.json");
        assert!(matches!(v.begin(&signed, &m), Err(UpdateError::Version(_))));
        // A state file that is not one says so, never read as none.
        std::fs::write(v.dir().join("state.json"), b"{").expect("write");
        assert!(matches!(v.read_state(), Err(UpdateError::State { .. })));
    }
}
