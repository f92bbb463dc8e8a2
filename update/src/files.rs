//! Files written whole or not at all.

use std::path::{Path, PathBuf};

/// `bytes` in `path`, whole or not at all: written beside, synced, renamed
/// over it, and the directory synced (the rename itself durable).
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut tmp: PathBuf = path.to_path_buf();
    tmp.as_mut_os_string().push(".tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::File::open(&tmp)?.sync_all()?;
    std::fs::rename(&tmp, path)?;
    sync_parent(path)
}

/// Makes a creation or rename of `path` durable.
pub fn sync_parent(path: &Path) -> std::io::Result<()> {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => std::fs::File::open(dir)?.sync_all(),
        _ => std::fs::File::open(".")?.sync_all(),
    }
}
