//! The fleet's trust on the box (issue 39): the root's public key
//! installed with the agent, and the chain of root-signed trust lists,
//! read from the trust directory at start and checked again
//! (`baton_trust::Trust::load`). The chain this box took is kept in its
//! data directory too, so a trust directory put back to an older chain (a
//! rollback) is refused and the newer one kept.

use std::path::{Path, PathBuf};

use baton_trust::{PublicKey, SignedList, Trust};

use super::error::RuntimeError;

/// The root's public key, in the trust directory.
pub(super) const ROOT_FILE: &str = "root.pub";
/// The chain of trust lists, in the trust directory and in the data
/// directory.
pub(super) const CHAIN_FILE: &str = "trust.json";

fn start_error(
    what: String,
    cause: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> RuntimeError {
    RuntimeError::Start {
        what,
        cause: cause.into(),
    }
}

/// A chain file: `None` where there is none.
fn read_chain(path: &Path) -> Result<Option<Vec<SignedList>>, RuntimeError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(start_error(format!("reading {}", path.display()), e)),
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| start_error(format!("{}: not a chain of trust lists", path.display()), e))
}

/// The box's trust from `dir` (configured) and what `data_dir` kept; the
/// chain chosen is written back to `data_dir`. `now_ns`: the expiry
/// check's now.
pub(super) fn load(dir: &Path, data_dir: &Path, now_ns: i64) -> Result<Trust, RuntimeError> {
    let root_path = dir.join(ROOT_FILE);
    let root_text = std::fs::read_to_string(&root_path)
        .map_err(|e| start_error(format!("reading the trust root {}", root_path.display()), e))?;
    let root = PublicKey::from_base64(&root_text)
        .map_err(|e| start_error(format!("the trust root {}", root_path.display()), e))?;
    let kept_path = data_dir.join(CHAIN_FILE);
    let kept = match read_chain(&kept_path)? {
        Some(chain) => match Trust::load(root, &chain, now_ns) {
            Ok(t) => Some((t, chain)),
            Err(e) => {
                // Not this box's root any more (the root file was replaced)
                // or expired: the configured chain decides.
                tracing::warn!(
                    "the trust lists this box kept ({}): {e}",
                    kept_path.display()
                );
                None
            }
        },
        None => None,
    };
    let given_path = dir.join(CHAIN_FILE);
    let given = match read_chain(&given_path)? {
        Some(chain) => match Trust::load(root, &chain, now_ns) {
            Ok(t) => Some((t, chain)),
            Err(e) => {
                tracing::error!("trust lists in {} refused: {e}", given_path.display());
                None
            }
        },
        None => None,
    };
    let version = |t: &Option<(Trust, Vec<SignedList>)>| {
        t.as_ref().and_then(|(t, _)| t.list()).map(|l| l.version)
    };
    let chosen = match (version(&given), version(&kept)) {
        (Some(g), Some(k)) if g < k => {
            tracing::error!(
                "trust list version {g} in {} is older than version {k} this box holds: a rollback, refused; version {k} stays in force",
                given_path.display()
            );
            kept
        }
        (Some(_), _) => given,
        (None, _) => kept,
    };
    let Some((trust, chain)) = chosen else {
        tracing::info!(root = %root.id(), "trust: root installed, no trust list yet (packs are not checked until one is)");
        return Ok(Trust::new(root));
    };
    write_chain(&kept_path, &chain)?;
    if let Some(l) = trust.list() {
        tracing::info!(
            version = l.version,
            tenants = l.tenants.len(),
            "trust: trust list in force"
        );
    }
    Ok(trust)
}

/// The trust `dir` gives, read and checked without keeping anything (for
/// `check-config`); an error names the file and what is wrong.
pub(super) fn read(dir: &Path, now_ns: i64) -> Result<Trust, String> {
    let root_path = dir.join(ROOT_FILE);
    let root = std::fs::read_to_string(&root_path)
        .map_err(|e| format!("trust root {}: {e}", root_path.display()))
        .and_then(|t| {
            PublicKey::from_base64(&t)
                .map_err(|e| format!("trust root {}: {e}", root_path.display()))
        })?;
    let chain_path = dir.join(CHAIN_FILE);
    let chain = read_chain(&chain_path)
        .map_err(|e| super::error::Chain(&e).to_string())?
        .unwrap_or_default();
    Trust::load(root, &chain, now_ns)
        .map_err(|e| format!("trust lists {}: {e}", chain_path.display()))
}

/// Keep `chain` in `path`, replacing it whole (written beside, then
/// renamed).
fn write_chain(path: &Path, chain: &[SignedList]) -> Result<(), RuntimeError> {
    let tmp: PathBuf = path.with_extension("json.tmp");
    let text = serde_json::to_string_pretty(chain)
        .map_err(|e| start_error("writing the trust chain".into(), e))?;
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::File::open(&tmp)?.sync_all())
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| start_error(format!("keeping the trust chain in {}", path.display()), e))
}
