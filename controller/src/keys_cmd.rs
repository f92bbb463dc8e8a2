//! `baton-controller keys ...`: the fleet's signing keys and trust lists
//! and agent releases (issue 39). Run on an operator's or a release engineer's machine, never
//! by the controller: a private key never passes through its store, which
//! only relays what was signed.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use baton_trust::{SignedList, SigningKey, TrustList};
use clap::Subcommand;

/// `keys` subcommands.
#[derive(Subcommand, Debug)]
pub enum KeysCmd {
    /// A new Ed25519 key: DIR/NAME.key (private, PKCS#8, readable by its
    /// owner only) and DIR/NAME.pub (the public key, base64); never
    /// overwrites a key.
    New {
        /// The key's name.
        name: String,
        /// Where to write it.
        #[arg(long)]
        dir: PathBuf,
    },
    /// Sign a trust list (JSON: version, expires_ns, next_root, tenants:
    /// {TENANT: {require_signed, pack_keys}}, release_keys) with the root
    /// key and append it to a chain file (the `trust.json` of an agent's
    /// trust directory); the chain's newest list must be older.
    SignList {
        /// The root's private key (NAME.key).
        #[arg(long)]
        root: PathBuf,
        /// The list's body.
        #[arg(long)]
        list: PathBuf,
        /// The chain to append to (made if missing).
        #[arg(long)]
        chain: PathBuf,
    },
    /// Sign a pack file for a box's own packs (`packs:` in its
    /// configuration; pushes sign with `push --sign`): the signature of
    /// its tenant and bytes goes as its last line, written to `--out`.
    SignPack {
        /// The operator's private key (NAME.key).
        #[arg(long)]
        key: PathBuf,
        /// The pack file.
        file: PathBuf,
        /// Where the signed pack goes (may be the file itself).
        #[arg(long)]
        out: PathBuf,
    },
    /// Sign an agent build with a release key (one the trust list names
    /// in `release_keys`): its version, architecture, size and SHA-256,
    /// written as a signed manifest to `--out` (what a box checks the
    /// binary against before it installs it).
    SignRelease {
        /// The release key (NAME.key).
        #[arg(long)]
        key: PathBuf,
        /// The agent binary.
        file: PathBuf,
        /// The version it reports on its link (`baton-agent --version`).
        #[arg(long)]
        version: String,
        /// The architecture it was built for, as Rust names it
        /// (`aarch64`, `x86_64`, `arm`).
        #[arg(long)]
        arch: String,
        /// Where the signed manifest goes (JSON).
        #[arg(long)]
        out: PathBuf,
    },
}

/// A signing key from its file (`NAME.key`).
pub(crate) fn read_key(path: &Path) -> Result<SigningKey, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
    SigningKey::from_pkcs8(&bytes).map_err(|e| format!("{}: {e}", path.display()))
}

fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<(), String> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn new_key(name: &str, dir: &Path) -> Result<Vec<PathBuf>, String> {
    if name.is_empty() || name.contains(['/', '\0']) || name.starts_with('.') {
        return Err(format!("key name {name:?}: a plain file name"));
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let key = SigningKey::generate().map_err(|e| e.to_string())?;
    let private = dir.join(format!("{name}.key"));
    let public = dir.join(format!("{name}.pub"));
    if public.exists() {
        return Err(format!(
            "{}: exists; a key is never overwritten",
            public.display()
        ));
    }
    write_new(&private, key.pkcs8(), 0o600)?;
    write_new(&public, format!("{}\n", key.public()).as_bytes(), 0o644)?;
    Ok(vec![private, public])
}

fn sign_list(root: &Path, list: &Path, chain: &Path) -> Result<u64, String> {
    let key = read_key(root)?;
    let text = std::fs::read_to_string(list)
        .map_err(|e| format!("{}: cannot read: {e}", list.display()))?;
    let body: TrustList = serde_json::from_str(&text)
        .map_err(|e| format!("{}: not a trust list: {e}", list.display()))?;
    // A pack's tenant is an id: a list naming anything else would sign a
    // tenant no pack can be of (a typo taken by every box).
    for tenant in body.tenants.keys() {
        baton_proto::pack::check_ident("tenant", tenant)
            .map_err(|e| format!("{}: {e}", list.display()))?;
    }
    let mut lists: Vec<SignedList> = match std::fs::read_to_string(chain) {
        Ok(t) => serde_json::from_str(&t)
            .map_err(|e| format!("{}: not a chain: {e}", chain.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(format!("{}: cannot read: {e}", chain.display())),
    };
    if let Some(last) = lists.last()
        && let Ok(prev) = serde_json::from_str::<TrustList>(&last.body)
        && prev.version >= body.version
    {
        return Err(format!(
            "version {} is not above the chain's newest, {}: a box would refuse it",
            body.version, prev.version
        ));
    }
    lists.push(SignedList::sign(&body, &key));
    let out = serde_json::to_string_pretty(&lists).map_err(|e| e.to_string())?;
    let tmp = chain.with_extension("json.tmp");
    std::fs::write(&tmp, out)
        .and_then(|()| std::fs::rename(&tmp, chain))
        .map_err(|e| format!("{}: {e}", chain.display()))?;
    Ok(body.version)
}

fn sign_pack(key: &Path, file: &Path, out: &Path) -> Result<String, String> {
    let key = read_key(key)?;
    let (yaml, pack) = baton_proto::pack::read_pack_file(file)?;
    let signed = baton_trust::pack::sign_text(&key, &pack.tenant, &yaml).ok_or_else(|| {
        format!(
            "{}: already signed (its last line is a signature)",
            file.display()
        )
    })?;
    let tmp = out.with_extension("signing.tmp");
    std::fs::write(&tmp, signed)
        .and_then(|()| std::fs::rename(&tmp, out))
        .map_err(|e| format!("{}: {e}", out.display()))?;
    Ok(format!("{}/{} v{}", pack.tenant, pack.id, pack.version))
}

fn sign_release(
    key: &Path,
    file: &Path,
    version: &str,
    arch: &str,
    out: &Path,
) -> Result<String, String> {
    let binary =
        std::fs::read(file).map_err(|e| format!("{}: cannot read: {e}", file.display()))?;
    let signed = signed_release(key, file, &binary, version, arch)?;
    let text = serde_json::to_string_pretty(&signed).map_err(|e| e.to_string())?;
    let tmp = out.with_extension("signing.tmp");
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, out))
        .map_err(|e| format!("{}: {e}", out.display()))?;
    let m = signed.unverified_manifest()?;
    Ok(format!(
        "{} for {} ({} bytes, sha256 {})",
        m.version, m.arch, m.size, m.sha256
    ))
}

/// `binary` (read from `file`) signed with the release key at `key` as
/// `version` for `arch`; refused when the build reports another version.
pub(crate) fn signed_release(
    key: &Path,
    file: &Path,
    binary: &[u8],
    version: &str,
    arch: &str,
) -> Result<baton_trust::SignedRelease, String> {
    let key = read_key(key)?;
    let manifest = baton_trust::ReleaseManifest::of(version, arch, binary)
        .map_err(|e| format!("{}: {e}", file.display()))?;
    // The box checks it too: a build that reports another version would
    // never confirm itself there.
    match baton_trust::release::slot_version(binary) {
        Some(v) if v == version => {}
        Some(v) => {
            return Err(format!(
                "{}: the build reports version {v}, not {version} (stamp it, or sign it as {v})",
                file.display()
            ));
        }
        None => {
            return Err(format!(
                "{}: not an agent build (no version slot, or more than one)",
                file.display()
            ));
        }
    }
    Ok(baton_trust::SignedRelease::sign(&manifest, &key))
}

/// Run a `keys` subcommand; the exit status.
pub fn run(cmd: KeysCmd, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let result = match cmd {
        KeysCmd::New { name, dir } => new_key(&name, &dir).map(|files| {
            for f in files {
                let _ = writeln!(out, "wrote {}", f.display());
            }
        }),
        KeysCmd::SignList { root, list, chain } => sign_list(&root, &list, &chain).map(|v| {
            let _ = writeln!(
                out,
                "signed trust list version {v} into {}",
                chain.display()
            );
        }),
        KeysCmd::SignPack { key, file, out: to } => sign_pack(&key, &file, &to).map(|p| {
            let _ = writeln!(out, "signed pack {p} into {}", to.display());
        }),
        KeysCmd::SignRelease {
            key,
            file,
            version,
            arch,
            out: to,
        } => sign_release(&key, &file, &version, &arch, &to).map(|r| {
            let _ = writeln!(out, "signed release {r} into {}", to.display());
        }),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            let _ = writeln!(err, "error: {e}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A list naming a tenant no pack can be of is not signed: every box
    /// would take the typo.
    #[test]
    fn a_list_naming_a_tenant_that_is_no_id_is_not_signed() {
        let dir = tempfile::tempdir().expect("tmp");
        let d = dir.path();
        new_key("root", d).expect("root");
        let list = d.join("list.json");
        std::fs::write(
            &list,
            r#"{"version": 1, "expires_ns": 9000000000000000000, "tenants": {"Plant A": {"require_signed": true}}}"#,
        )
        .expect("list");
        let chain = d.join("chain.json");
        let e = sign_list(&d.join("root.key"), &list, &chain).expect_err("refused");
        assert!(e.contains("Plant A"), "{e}");
        assert!(!chain.exists(), "nothing written");
    }

    /// A release signed here is what a box whose list names the key
    /// installs; a version that cannot name a directory is not signed.
    #[test]
    fn a_signed_release_passes_a_box_whose_list_names_its_key() {
        let dir = tempfile::tempdir().expect("tmp");
        let d = dir.path();
        new_key("root", d).expect("root");
        new_key("release", d).expect("release");
        let bin = d.join("baton-agent");
        let mut bytes = b"\x7fELF not really".to_vec();
        bytes.extend_from_slice(baton_trust::release::SLOT_MARK);
        bytes.extend_from_slice(b"0.2.0");
        bytes.resize(15 + baton_trust::release::SLOT_LEN, 0);
        std::fs::write(&bin, &bytes).expect("bin");
        let out = d.join("release.json");
        let said =
            sign_release(&d.join("release.key"), &bin, "0.2.0", "aarch64", &out).expect("signed");
        assert!(
            said.starts_with(&format!("0.2.0 for aarch64 ({} bytes", bytes.len())),
            "{said}"
        );
        let signed: baton_trust::SignedRelease =
            serde_json::from_str(&std::fs::read_to_string(&out).expect("read")).expect("json");
        let root = read_key(&d.join("root.key")).expect("root");
        let release = read_key(&d.join("release.key")).expect("release");
        let list = TrustList {
            version: 1,
            expires_ns: i64::MAX,
            next_root: None,
            tenants: Default::default(),
            release_keys: vec![release.public()],
        };
        let mut trust = baton_trust::Trust::new(root.public());
        trust
            .accept(&SignedList::sign(&list, &root), 0)
            .expect("list");
        let m = signed.check(&trust, 0, "aarch64").expect("installable");
        assert_eq!((m.version.as_str(), m.size), ("0.2.0", bytes.len() as u64));

        let e = sign_release(
            &d.join("release.key"),
            &bin,
            "../x",
            "aarch64",
            &d.join("x.json"),
        )
        .expect_err("refused");
        assert!(e.contains("version"), "{e}");
        assert!(!d.join("x.json").exists());
        // A build that reports another version than the one signed for.
        let e = sign_release(
            &d.join("release.key"),
            &bin,
            "0.3.0",
            "aarch64",
            &d.join("x.json"),
        )
        .expect_err("refused");
        assert!(e.contains("reports version 0.2.0"), "{e}");
        assert!(!d.join("x.json").exists());
    }
}
