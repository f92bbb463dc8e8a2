//! The fleet's trust on the box (issue 39): the root's public key
//! installed with the agent, and the chain of root-signed trust lists,
//! read from the trust directory at start and checked again
//! (`baton_trust::Trust::load`). The chain this box took is kept in its
//! data directory too, so a trust directory put back to an older chain (a
//! rollback) is refused and the newer one kept.
//!
//! So is the highest signed version of each pack the box took
//! ([`SIGNED_FILE`]): held packs' versions only go up, but a pack
//! cancelled (by whoever holds the controller) or a box restarted holds
//! nothing to compare with, and an old signed version offered then would
//! run again. The file is written before the pack is journalled.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use baton_control::admission::AdmissionError;
use baton_sched::PackKey;
use baton_trust::{PackVerdict, PublicKey, SignedList, Trust};

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

/// The highest signed version of each pack taken, in the data directory.
pub(super) const SIGNED_FILE: &str = "signed-versions.json";

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
    /// Lists were there but none could be taken: nothing runs (never
    /// "no list, nothing checked").
    unusable: Option<String>,
    /// The record of signed versions could not be read: nothing runs
    /// (a list taken later does not mend it).
    signed_unreadable: Option<String>,
    /// The highest signed version taken of each pack (`tenant/pack`).
    signed: BTreeMap<String, u64>,
    /// Where `signed` is kept.
    signed_path: PathBuf,
    /// The last list a controller relayed that was refused, and why.
    refused: Option<String>,
    /// How each pack running here was taken (its tenant, and its signer
    /// or its text), to judge it again when a newer list comes.
    taken: BTreeMap<PackKey, (String, Taken)>,
}

/// How a running pack was taken.
#[derive(Debug)]
pub(super) enum Taken {
    /// Checked against a list: what it said (the bytes were checked
    /// then; the signer is what a newer list may revoke).
    Checked(PackVerdict),
    /// Taken before any list: nothing was checked, not even its signature
    /// line, so a list that comes is asked of the text itself.
    Unchecked(String),
}

impl Taken {
    /// What a check that said `verdict` of `text` leaves to judge later.
    pub(super) fn of(verdict: PackVerdict, text: &str) -> Taken {
        match verdict {
            PackVerdict::Unchecked => Taken::Unchecked(text.to_owned()),
            v => Taken::Checked(v),
        }
    }
}

/// What the box checks packs against, as operators see it (the link's
/// `TrustState`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct TrustStatus {
    /// The newest list's version and expiry (0, 0: none).
    pub list_version: u64,
    pub list_expires_ns: i64,
    /// Tenants whose packs must be signed, in order.
    pub signed_tenants: Vec<String>,
    /// Why the box takes no pack (and restores none at a restart), if so.
    pub nothing_runs: Option<String>,
    /// The last list relayed and refused, and why.
    pub refused: Option<String>,
}

/// `signed`'s key for a pack.
fn signed_key(key: &PackKey) -> String {
    format!("{}/{}", key.tenant, key.pack)
}

impl BoxTrust {
    /// Why no pack may run on this box, if none may: lists there but none
    /// usable, or an unreadable record of signed versions.
    fn nothing_runs(&self) -> Option<&String> {
        self.unusable.as_ref().or(self.signed_unreadable.as_ref())
    }

    /// The box's trust at `now`: its list, and why nothing runs if
    /// nothing may (an expired newest list included, found here as
    /// `check_pack` would find it).
    pub(super) fn status(&self, now_ns: i64) -> TrustStatus {
        let list = self.trust.list();
        // Worded without `now`: the status changes when the list does, not
        // at every look (each change is a report and a store write).
        let nothing_runs = self
            .nothing_runs()
            .cloned()
            .or_else(|| match self.trust.current(now_ns) {
                Ok(_) => None,
                Err(baton_trust::TrustError::Expired {
                    version,
                    expires_ns,
                    ..
                }) => Some(format!(
                    "trust list version {version} expired at {expires_ns} ns since the epoch: no pack is taken or restored until a newer list comes"
                )),
                Err(e) => Some(e.to_string()),
            });
        TrustStatus {
            list_version: list.map_or(0, |l| l.version),
            list_expires_ns: list.map_or(0, |l| l.expires_ns),
            signed_tenants: list.map_or_else(Vec::new, |l| {
                l.tenants
                    .iter()
                    .filter(|(_, t)| t.require_signed)
                    .map(|(name, _)| name.clone())
                    .collect()
            }),
            nothing_runs,
            refused: self.refused.clone(),
        }
    }

    /// The manifest of a release this box may install (see
    /// `SignedRelease::check`); never while the box takes no pack for want
    /// of a usable list.
    pub(super) fn check_release(
        &self,
        signed: &baton_trust::SignedRelease,
        now_ns: i64,
        arch: &str,
    ) -> Result<baton_trust::ReleaseManifest, String> {
        if let Some(why) = self.nothing_runs() {
            return Err(why.clone());
        }
        signed
            .check(&self.trust, now_ns, arch)
            .map_err(|e| e.to_string())
    }

    /// Whether `tenant`'s pack `text` may run (see `Trust::check_pack`).
    pub(super) fn check_pack(
        &self,
        tenant: &str,
        text: &str,
        now_ns: i64,
    ) -> Result<baton_trust::PackVerdict, baton_trust::PackSignatureError> {
        if let Some(why) = self.nothing_runs() {
            return Err(baton_trust::PackSignatureError::Unusable(why.clone()));
        }
        self.trust.check_pack(tenant, text, now_ns)
    }

    /// Whether signed `version` of `key` may be taken: not below the
    /// highest signed version of it this box took.
    pub(super) fn check_signed_version(
        &self,
        key: &PackKey,
        version: u64,
    ) -> Result<(), AdmissionError> {
        match self.signed.get(&signed_key(key)) {
            Some(&highest) if version < highest => Err(AdmissionError::SignedOlder {
                offered: version,
                highest,
            }),
            _ => Ok(()),
        }
    }

    /// Signed `version` of `key` is about to be taken: kept on disk (fsync
    /// and rename) before it is journalled, when higher than the highest so
    /// far. A failure refuses the pack.
    pub(super) fn keep_signed_version(
        &mut self,
        key: &PackKey,
        version: u64,
    ) -> Result<(), AdmissionError> {
        let name = signed_key(key);
        if self.signed.get(&name).is_some_and(|&h| h >= version) {
            return Ok(());
        }
        let mut next = self.signed.clone();
        next.insert(name, version);
        let text = serde_json::to_string_pretty(&next).map_err(|e| self.not_kept(e))?;
        baton_update::files::write_atomically(&self.signed_path, text.as_bytes())
            .map_err(|e| self.not_kept(e))?;
        self.signed = next;
        Ok(())
    }

    /// `key` (of `tenant`) runs from now on as `verdict` said when it was
    /// taken.
    pub(super) fn taken(&mut self, key: &PackKey, tenant: &str, how: Taken) {
        self.taken.insert(key.clone(), (tenant.to_owned(), how));
    }

    /// `key` runs no more here.
    pub(super) fn dropped(&mut self, key: &PackKey) {
        self.taken.remove(key);
    }

    /// The packs taken here that the newest list no longer allows at `now`
    /// (a key revoked, a tenant that now requires signatures or is no
    /// longer named), each with why.
    pub(super) fn no_longer_allowed(&self, now_ns: i64) -> Vec<(PackKey, String)> {
        self.taken
            .iter()
            .filter_map(|(key, (tenant, how))| {
                let judged = match how {
                    Taken::Checked(verdict) => self.trust.still_allows(tenant, verdict, now_ns),
                    Taken::Unchecked(text) => {
                        self.trust.check_pack(tenant, text, now_ns).map(|_| ())
                    }
                };
                let why = judged.err()?;
                Some((key.clone(), why.to_string()))
            })
            .collect()
    }

    fn not_kept(&self, e: impl std::fmt::Display) -> AdmissionError {
        AdmissionError::SignedNotKept {
            path: self.signed_path.display().to_string(),
            cause: e.to_string(),
        }
    }

    /// Lists the controller relays (`chain`, JSON): those newer than the
    /// newest held are taken in order, each only if the root in force
    /// signed it (the newest not expired); the sender is not trusted, so
    /// anything else is refused, whole, and said. The grown chain is kept
    /// in the data directory (a failure to write it is said: the lists
    /// stay in force in this run, and the controller offers them again
    /// after a restart). Whether a list was taken.
    pub(super) fn offer(&mut self, chain: &str, now_ns: i64) -> bool {
        let lists: Vec<SignedList> = match serde_json::from_str(chain) {
            Ok(l) => l,
            Err(e) => {
                let why = format!("not a chain of signed lists: {e}");
                tracing::error!("trust lists from the controller refused: {why}");
                self.refused = Some(why);
                return false;
            }
        };
        match self.trust.accept_chain(&lists, now_ns) {
            Ok(taken) if taken.is_empty() => false,
            Ok(taken) => {
                self.unusable = None;
                self.refused = None;
                let n = taken.len();
                self.chain.extend(taken);
                if let Some(l) = self.trust.list() {
                    tracing::info!(
                        version = l.version,
                        taken = n,
                        "trust: trust list taken from the controller"
                    );
                }
                if let Err(e) = write_chain(&self.keep, &self.chain) {
                    tracing::error!("{}", super::error::Chain(&e));
                }
                true
            }
            Err(e) => {
                tracing::error!("trust list from the controller refused: {e}");
                self.refused = Some(e.to_string());
                false
            }
        }
    }
}

/// The root's public key in `dir` (the caller names the file in its
/// error).
fn read_root(dir: &Path) -> Result<PublicKey, Box<dyn std::error::Error + Send + Sync>> {
    let text = std::fs::read_to_string(dir.join(ROOT_FILE))?;
    Ok(PublicKey::from_base64(&text)?)
}

/// A chain file loaded against `root` (expiry aside: it is checked when a
/// pack is, so an expired newest list refuses everything rather than
/// letting an older one back); `None` where there is no file.
fn load_chain(root: PublicKey, path: &Path) -> Result<Option<(Trust, Vec<SignedList>)>, String> {
    let chain = read_chain(path).map_err(|e| super::error::Chain(&e).to_string())?;
    let Some(chain) = chain else {
        return Ok(None);
    };
    Trust::load(root, &chain, i64::MIN)
        .map(|t| Some((t, chain)))
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// The box's trust from `dir` (configured) and what `data_dir` kept: the
/// newer chain of the two that load against `root`; an older one put back
/// in `dir` is refused as a rollback. Lists that exist but none of which
/// loads leave the box unusable (nothing runs), never unchecked. Nothing
/// is written.
fn choose(root: PublicKey, dir: &Path, data_dir: &Path) -> BoxTrust {
    let kept_path = data_dir.join(CHAIN_FILE);
    let given_path = dir.join(CHAIN_FILE);
    let signed_path = data_dir.join(SIGNED_FILE);
    let mut problems = Vec::new();
    // Unreadable, it cannot say which versions are replays: nothing runs.
    let (signed, signed_problem) = match read_signed(&signed_path) {
        Ok(m) => (m, None),
        Err(e) => {
            tracing::error!("trust: {e}");
            (BTreeMap::new(), Some(e))
        }
    };
    let mut loaded = |path: &Path| match load_chain(root, path) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("trust lists refused: {e}");
            problems.push(e);
            None
        }
    };
    let kept = loaded(&kept_path);
    let given = loaded(&given_path);
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
    let (trust, chain, unusable) = match chosen {
        Some((trust, chain)) => (trust, chain, None),
        None => (
            Trust::new(root),
            Vec::new(),
            (!problems.is_empty()).then(|| problems.join("; ")),
        ),
    };
    BoxTrust {
        trust,
        chain,
        keep: kept_path,
        unusable,
        signed_unreadable: signed_problem,
        signed,
        signed_path,
        refused: None,
        taken: BTreeMap::new(),
    }
}

/// The highest signed versions kept in `path` (none where there is no
/// file).
fn read_signed(path: &Path) -> Result<BTreeMap<String, u64>, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text).map_err(|e| {
            format!(
                "{}: not a record of signed versions ({e}): no pack runs until it is mended or removed",
                path.display()
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(BTreeMap::new()),
        Err(e) => Err(format!("reading {}: {e}", path.display())),
    }
}

/// The box's trust at start ([`choose`]), the chain chosen written back
/// to `data_dir`.
pub(super) fn load(dir: &Path, data_dir: &Path) -> Result<BoxTrust, RuntimeError> {
    let root = read_root(dir).map_err(|e| {
        start_error(
            format!("the trust root {}", dir.join(ROOT_FILE).display()),
            e,
        )
    })?;
    let t = choose(root, dir, data_dir);
    match (t.nothing_runs(), t.trust.list()) {
        (Some(why), _) => {
            tracing::error!("trust: no usable trust list ({why}): no pack runs until one is")
        }
        (None, None) => {
            tracing::info!(root = %root.id(), "trust: root installed, no trust list yet (packs are not checked until one is)")
        }
        (None, Some(l)) => {
            write_chain(&t.keep, &t.chain)?;
            tracing::info!(
                version = l.version,
                tenants = l.tenants.len(),
                "trust: trust list in force"
            );
        }
    }
    Ok(t)
}

/// The trust `run` would start with ([`choose`]: the trust directory and
/// the chain the box kept), for `check-config`: nothing written; an error
/// names what is wrong (no usable list, the newest expired at `now`).
pub(super) fn read(dir: &Path, data_dir: &Path, now_ns: i64) -> Result<BoxTrust, String> {
    let root =
        read_root(dir).map_err(|e| format!("trust root {}: {e}", dir.join(ROOT_FILE).display()))?;
    let t = choose(root, dir, data_dir);
    if let Some(why) = t.nothing_runs() {
        return Err(format!("trust lists unusable: {why}"));
    }
    t.trust.current(now_ns).map_err(|e| e.to_string())?;
    Ok(t)
}

/// The newest trust list this box took (whatever its expiry): what the
/// launcher checks an installed version's signed release against.
pub fn newest_list(dir: &Path, data_dir: &Path) -> Result<baton_trust::TrustList, String> {
    let root =
        read_root(dir).map_err(|e| format!("trust root {}: {e}", dir.join(ROOT_FILE).display()))?;
    let t = choose(root, dir, data_dir);
    if let Some(why) = &t.unusable {
        return Err(format!("trust lists unusable: {why}"));
    }
    t.trust
        .list()
        .cloned()
        .ok_or_else(|| "no trust list: no release key".to_string())
}

/// Keep `chain` in `path`, replacing it whole.
fn write_chain(path: &Path, chain: &[SignedList]) -> Result<(), RuntimeError> {
    let text = serde_json::to_string_pretty(chain)
        .map_err(|e| start_error("writing the trust chain".into(), e))?;
    baton_update::files::write_atomically(path, text.as_bytes())
        .map_err(|e| start_error(format!("keeping the trust chain in {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_trust::{PackSignatureError, SigningKey, TenantTrust, TrustList};

    const PACK: &str = "pack: p\nversion: 1\ninstructions:\n  - {id: n, action: noop, every: 1s}\n";

    fn list(version: u64, expires_ns: i64) -> TrustList {
        TrustList {
            version,
            expires_ns,
            next_root: None,
            tenants: [(
                "default".to_string(),
                TenantTrust {
                    require_signed: false,
                    pack_keys: Vec::new(),
                },
            )]
            .into_iter()
            .collect(),
            release_keys: Vec::new(),
        }
    }

    /// A trust directory with a new root installed, and a data directory.
    fn site() -> (tempfile::TempDir, PathBuf, PathBuf, SigningKey) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (dir, data) = (tmp.path().join("trust"), tmp.path().join("data"));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::create_dir_all(&data).expect("data");
        let root = SigningKey::generate().expect("key");
        std::fs::write(dir.join(ROOT_FILE), root.public().to_base64()).expect("root");
        (tmp, dir, data, root)
    }

    fn write(path: &Path, chain: &[SignedList]) {
        std::fs::write(path, serde_json::to_string(chain).expect("json")).expect("write");
    }

    /// The box kept list 2, now expired; the trust directory holds list 1,
    /// still valid: list 2 stays (an older list never comes back), and
    /// being expired it lets nothing run, before and after a restart.
    #[test]
    fn an_expired_newest_list_refuses_everything_and_an_older_one_does_not_come_back() {
        let (_tmp, dir, data, root) = site();
        let v1 = SignedList::sign(&list(1, i64::MAX), &root);
        let v2 = SignedList::sign(&list(2, 1_000), &root);
        write(&dir.join(CHAIN_FILE), std::slice::from_ref(&v1));
        write(&data.join(CHAIN_FILE), &[v1, v2]);
        for _restart in 0..2 {
            let t = load(&dir, &data).expect("load");
            assert_eq!(t.trust.list().map(|l| l.version), Some(2));
            let e = t.check_pack("default", PACK, 2_000).expect_err("expired");
            assert!(matches!(e, PackSignatureError::TrustList(_)), "{e}");
        }
        // check-config sees what run would: list 2, expired by then.
        let t = read(&dir, &data, 500).expect("in force at 500");
        assert_eq!(t.trust.list().map(|l| l.version), Some(2));
        let e = read(&dir, &data, 2_000).expect_err("expired");
        assert!(e.contains("version 2 expired"), "{e}");
    }

    /// Lists that are there but do not load leave the box unusable, never
    /// unchecked; no list at all is unchecked (a site starting).
    #[test]
    fn unusable_lists_run_nothing_and_no_lists_check_nothing() {
        let (_tmp, dir, data, _root) = site();
        let t = load(&dir, &data).expect("load");
        assert_eq!(
            t.check_pack("anyone", PACK, 0),
            Ok(baton_trust::PackVerdict::Unchecked)
        );
        let other = SigningKey::generate().expect("key");
        write(
            &data.join(CHAIN_FILE),
            &[SignedList::sign(&list(1, i64::MAX), &other)],
        );
        let t = load(&dir, &data).expect("load");
        let e = t.check_pack("default", PACK, 0).expect_err("unusable");
        assert!(matches!(e, PackSignatureError::Unusable(_)), "{e}");
    }

    /// A record of signed versions that cannot be read cannot say which
    /// versions are replays: nothing runs until it is mended or removed.
    #[test]
    fn an_unreadable_record_of_signed_versions_runs_nothing() {
        let (_tmp, dir, data, root) = site();
        let v1 = SignedList::sign(&list(1, i64::MAX), &root);
        write(&dir.join(CHAIN_FILE), &[v1]);
        std::fs::write(data.join(SIGNED_FILE), "{ torn").expect("torn");
        let mut t = load(&dir, &data).expect("load");
        let refused = |t: &BoxTrust| {
            let e = t.check_pack("default", PACK, 0).expect_err("unusable");
            assert!(
                matches!(&e, PackSignatureError::Unusable(w) if w.contains(SIGNED_FILE)),
                "{e}"
            );
        };
        refused(&t);
        // A newer list taken from the controller does not mend it.
        let v1 = SignedList::sign(&list(1, i64::MAX), &root);
        let v2 = SignedList::sign(&list(2, i64::MAX), &root);
        t.offer(&serde_json::to_string(&[v1, v2]).expect("json"), 0);
        assert_eq!(t.trust.list().map(|l| l.version), Some(2));
        refused(&t);
    }

    /// What operators are told of the box: the list and the tenants it
    /// requires signed; a list relayed and refused, and why; nothing
    /// running once the newest list expired (found at the time asked, as
    /// a pack's check would find it).
    #[test]
    fn the_status_says_the_list_its_refusals_and_when_nothing_runs() {
        let (_tmp, dir, data, root) = site();
        let mut signed = list(1, 5_000);
        signed.tenants.insert(
            "acme".into(),
            TenantTrust {
                require_signed: true,
                pack_keys: Vec::new(),
            },
        );
        write(&dir.join(CHAIN_FILE), &[SignedList::sign(&signed, &root)]);
        let mut t = load(&dir, &data).expect("load");
        let s = t.status(1_000);
        assert_eq!(
            s,
            TrustStatus {
                list_version: 1,
                list_expires_ns: 5_000,
                signed_tenants: vec!["acme".into()],
                nothing_runs: None,
                refused: None,
            }
        );

        let other = SigningKey::generate().expect("key");
        let forged = SignedList::sign(&list(2, i64::MAX), &other);
        t.offer(&serde_json::to_string(&[forged]).expect("json"), 1_000);
        let s = t.status(1_000);
        assert_eq!(s.list_version, 1, "the forged list is not taken");
        assert!(s.refused.as_ref().is_some_and(|r| !r.is_empty()), "{s:?}");
        t.offer("not json", 1_000);
        let s = t.status(1_000);
        assert!(
            s.refused
                .as_ref()
                .is_some_and(|r| r.contains("not a chain")),
            "{s:?}"
        );

        let s = t.status(6_000);
        assert!(
            s.nothing_runs
                .as_ref()
                .is_some_and(|w| w.contains("expired")),
            "{s:?}"
        );
        assert!(
            t.check_pack("acme", PACK, 6_000).is_err(),
            "as the check finds it"
        );
        // The same status asked again is the same (no report each look).
        assert_eq!(t.status(6_000), t.status(7_000));
        // A list taken clears the refusal shown.
        let v2 = SignedList::sign(&list(2, i64::MAX), &root);
        assert!(t.offer(&serde_json::to_string(&[v2]).expect("json"), 1_000));
        assert_eq!(t.status(1_000).refused, None);
    }

    /// A newer list that drops the key a running pack was signed by names
    /// that pack (with why); a pack no longer running is not named.
    #[test]
    fn a_newer_list_names_the_running_packs_it_no_longer_allows() {
        let (_tmp, dir, data, root) = site();
        let op = SigningKey::generate().expect("key");
        let with = |version, keys: Vec<PublicKey>| {
            let mut l = list(version, i64::MAX);
            l.tenants.insert(
                "acme".into(),
                TenantTrust {
                    require_signed: true,
                    pack_keys: keys,
                },
            );
            SignedList::sign(&l, &root)
        };
        let v1 = with(1, vec![op.public()]);
        write(&dir.join(CHAIN_FILE), std::slice::from_ref(&v1));
        let mut t = load(&dir, &data).expect("load");
        let key = |p: &str| PackKey {
            tenant: "acme".into(),
            pack: p.into(),
        };
        let signed = || Taken::Checked(PackVerdict::Signed(op.public().id()));
        t.taken(&key("press"), "acme", signed());
        t.taken(&key("valve"), "acme", signed());
        t.dropped(&key("valve"));
        assert!(t.no_longer_allowed(0).is_empty(), "list 1 names the key");
        let v2 = with(2, Vec::new());
        assert!(t.offer(&serde_json::to_string(&[v1, v2]).expect("json"), 0));
        let gone = t.no_longer_allowed(0);
        assert_eq!(gone.len(), 1, "{gone:?}");
        assert_eq!(gone[0].0, key("press"));
        assert!(gone[0].1.contains("does not name"), "{}", gone[0].1);
    }

    /// Packs taken before the box had any list are judged by their text
    /// when the first list comes: one signed by a key the list names runs
    /// on, an unsigned one where signatures are now required does not.
    #[test]
    fn packs_taken_before_any_list_are_judged_by_their_text() {
        let (_tmp, dir, data, root) = site();
        let op = SigningKey::generate().expect("key");
        let mut t = load(&dir, &data).expect("load");
        let key = |p: &str| PackKey {
            tenant: "acme".into(),
            pack: p.into(),
        };
        let signed = baton_trust::pack::sign_text(&op, "acme", PACK).expect("sign");
        for (name, text) in [("signed", signed.as_str()), ("unsigned", PACK)] {
            let verdict = t.check_pack("acme", text, 0).expect("no list: unchecked");
            assert_eq!(verdict, PackVerdict::Unchecked);
            t.taken(&key(name), "acme", Taken::of(verdict, text));
        }
        let mut l = list(1, i64::MAX);
        l.tenants.insert(
            "acme".into(),
            TenantTrust {
                require_signed: true,
                pack_keys: vec![op.public()],
            },
        );
        let v1 = SignedList::sign(&l, &root);
        assert!(t.offer(&serde_json::to_string(&[v1]).expect("json"), 0));
        let gone: Vec<PackKey> = t.no_longer_allowed(0).into_iter().map(|(k, _)| k).collect();
        assert_eq!(gone, [key("unsigned")]);
    }
}
