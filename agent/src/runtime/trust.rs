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

/// The box's trust, and the chain behind it, kept in the data directory
/// as it grows.
#[derive(Debug)]
pub(super) struct BoxTrust {
    trust: Trust,
    chain: Vec<SignedList>,
    keep: PathBuf,
}

impl BoxTrust {
    /// Whether `tenant`'s pack `text` may run (see `Trust::check_pack`).
    pub(super) fn check_pack(
        &self,
        tenant: &str,
        text: &str,
        now_ns: i64,
    ) -> Result<baton_trust::PackVerdict, baton_trust::PackSignatureError> {
        self.trust.check_pack(tenant, text, now_ns)
    }

    /// Lists the controller relays (`chain`, JSON): those newer than the
    /// newest held are taken in order, each only if the root in force
    /// signed it; the sender is not trusted, so anything else is refused
    /// and said. The grown chain is kept in the data directory (a failure
    /// to write it is said: the lists stay in force in this run, and the
    /// controller offers them again after a restart).
    pub(super) fn offer(&mut self, chain: &str, now_ns: i64) {
        let lists: Vec<SignedList> = match serde_json::from_str(chain) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(
                    "trust lists from the controller are not a chain of signed lists: {e}"
                );
                return;
            }
        };
        let held = self.trust.list().map_or(0, |l| l.version);
        let mut taken = false;
        for s in lists {
            let version =
                serde_json::from_str::<baton_trust::TrustList>(&s.body).map_or(0, |l| l.version);
            if self.trust.list().is_some() && version <= held {
                continue;
            }
            match self.trust.accept(&s, now_ns) {
                Ok(l) => {
                    tracing::info!(
                        version = l.version,
                        "trust: trust list taken from the controller"
                    );
                    self.chain.push(s);
                    taken = true;
                }
                Err(e) => {
                    tracing::error!("trust list from the controller refused: {e}");
                    break;
                }
            }
        }
        if taken && let Err(e) = write_chain(&self.keep, &self.chain) {
            tracing::error!("{}", super::error::Chain(&e));
        }
    }
}

/// The box's trust from `dir` (configured) and what `data_dir` kept; the
/// chain chosen is written back to `data_dir`. `now_ns`: the expiry
/// check's now.
pub(super) fn load(dir: &Path, data_dir: &Path, now_ns: i64) -> Result<BoxTrust, RuntimeError> {
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
        return Ok(BoxTrust {
            trust: Trust::new(root),
            chain: Vec::new(),
            keep: kept_path,
        });
    };
    write_chain(&kept_path, &chain)?;
    if let Some(l) = trust.list() {
        tracing::info!(
            version = l.version,
            tenants = l.tenants.len(),
            "trust: trust list in force"
        );
    }
    Ok(BoxTrust {
        trust,
        chain,
        keep: kept_path,
    })
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
