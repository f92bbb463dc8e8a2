//! The fleet's small certificate authority, as `baton-controller ca`
//! subcommands writing PEM files into one directory:
//!
//! ```text
//! DIR/ca.pem, DIR/ca-key.pem (0600)           ca init
//! DIR/server.pem, DIR/server-key.pem (0600)   ca init --host NAME...
//! DIR/agents/NAME.pem, NAME-key.pem           ca issue-agent NAME
//! DIR/operators/NAME.pem, NAME-key.pem        ca issue-operator NAME --tenant T --role R
//! DIR/revoked.txt                             ca revoke NAME
//! ```
//!
//! Identities are carried as described in [`crate::identity`]. Keys are
//! ECDSA P-256. `revoked.txt` lists one certificate per line,
//! `SERIAL KIND NAME` (serial in lowercase hex; `#` starts a comment); the
//! controller reads only the serial, so a re-issued certificate of a
//! revoked name is a new credential.

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use jiff::{SignedDuration, Timestamp};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType, SerialNumber,
};

use crate::identity::{self, Identity, IdentityError};

/// Default life of the CA certificate.
pub const CA_DAYS: i64 = 3650;
/// Default life of a server, agent or operator certificate.
pub const LEAF_DAYS: i64 = 365;

/// Why a `ca` command failed.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    /// A file that must not be overwritten exists.
    #[error("{0}: exists already; refusing to overwrite a CA (move it away to start a new one)")]
    Exists(PathBuf),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A certificate or key could not be made or read.
    #[error("{path}: {message}")]
    Cert {
        /// The file concerned (the CA's when issuing).
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// A name that is not a valid id.
    #[error("{0}")]
    Name(#[from] IdentityError),
    /// Nothing issued under that name.
    #[error("no certificate named `{name}` in {dir}/agents or {dir}/operators")]
    NotFound {
        /// The name.
        name: String,
        /// The CA directory.
        dir: String,
    },
    /// An agent and an operator share the name.
    #[error("`{0}` is both an agent and an operator: say which with --kind agent|operator")]
    Ambiguous(String),
    /// The name has a certificate in force: issuing over it would leave
    /// the old one (and its tokens) valid, unseen.
    #[error(
        "{kind} `{name}` has a certificate in force (serial {serial}): `--replace` issues a new one and revokes that one at once"
    )]
    InForce {
        /// agent or operator.
        kind: &'static str,
        /// The name.
        name: String,
        /// The serial in force.
        serial: String,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CaError + '_ {
    move |source| CaError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn cert_err(path: &Path) -> impl FnOnce(rcgen::Error) -> CaError + '_ {
    move |e| CaError::Cert {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// Which kind of certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `DIR/agents/`.
    Agent,
    /// `DIR/operators/`.
    Operator,
}

impl Kind {
    fn subdir(self) -> &'static str {
        match self {
            Kind::Agent => "agents",
            Kind::Operator => "operators",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Agent => "agent",
            Kind::Operator => "operator",
        }
    }
}

/// When a certificate is valid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Validity {
    /// From.
    pub not_before: Timestamp,
    /// Until.
    pub not_after: Timestamp,
}

const HOUR: i64 = 3600;
const DAY: i64 = 24 * HOUR;

impl Validity {
    /// `days` from `now` (valid from an hour before, for clocks a little
    /// behind).
    pub fn days(now: Timestamp, days: i64) -> Validity {
        Validity {
            not_before: shift(now, -HOUR),
            not_after: shift(now, days.saturating_mul(DAY)),
        }
    }

    /// Until `not_after` (tests make expired certificates with a past one).
    pub fn until(now: Timestamp, not_after: Timestamp) -> Validity {
        Validity {
            not_before: shift(now, -HOUR).min(shift(not_after, -DAY)),
            not_after,
        }
    }
}

/// `t` moved by `secs`, held to the range a `Timestamp` has (years -9999
/// to 9999), so no count of days overflows.
fn shift(t: Timestamp, secs: i64) -> Timestamp {
    t.checked_add(SignedDuration::from_secs(secs))
        .unwrap_or(if secs < 0 {
            Timestamp::MIN
        } else {
            Timestamp::MAX
        })
}

/// `v` on `p`. The controller's instants are jiff's; rcgen takes `time`
/// values, so this is the one place this crate names `time`: each bound is
/// converted here, at the edge, and nothing else handles `time` types.
fn set_validity(p: &mut CertificateParams, v: Validity, path: &Path) -> Result<(), CaError> {
    let at = |t: Timestamp| {
        time::OffsetDateTime::from_unix_timestamp_nanos(t.as_nanosecond()).map_err(|e| {
            CaError::Cert {
                path: path.to_path_buf(),
                message: format!("validity bound {t}: {e}"),
            }
        })
    };
    p.not_before = at(v.not_before)?;
    p.not_after = at(v.not_after)?;
    Ok(())
}

/// The files of a CA directory.
#[derive(Clone, Debug)]
pub struct CaDir {
    /// The directory.
    pub dir: PathBuf,
}

impl CaDir {
    /// `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> CaDir {
        CaDir { dir: dir.into() }
    }
    /// `DIR/ca.pem`.
    pub fn ca_cert(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }
    /// `DIR/ca-key.pem`.
    pub fn ca_key(&self) -> PathBuf {
        self.dir.join("ca-key.pem")
    }
    /// `DIR/server.pem`.
    pub fn server_cert(&self) -> PathBuf {
        self.dir.join("server.pem")
    }
    /// `DIR/server-key.pem`.
    pub fn server_key(&self) -> PathBuf {
        self.dir.join("server-key.pem")
    }
    /// `DIR/revoked.txt`.
    pub fn revoked(&self) -> PathBuf {
        self.dir.join("revoked.txt")
    }
    /// `DIR/issued.txt`: every serial ever issued, with its kind and name
    /// (`SERIAL KIND NAME` a line), so `ca revoke NAME` reaches the
    /// certificates a re-issue replaced, not only the current one.
    pub fn issued(&self) -> PathBuf {
        self.dir.join("issued.txt")
    }
    /// `DIR/agents/NAME.pem` or `DIR/operators/NAME.pem`.
    pub fn leaf_cert(&self, kind: Kind, name: &str) -> PathBuf {
        self.dir.join(kind.subdir()).join(format!("{name}.pem"))
    }
    /// `DIR/agents/NAME-key.pem` or `DIR/operators/NAME-key.pem`.
    pub fn leaf_key(&self, kind: Kind, name: &str) -> PathBuf {
        self.dir.join(kind.subdir()).join(format!("{name}-key.pem"))
    }
}

fn random_serial() -> SerialNumber {
    let mut b: [u8; 16] = rand::random();
    // Positive, and 16 bytes long whatever the draw.
    b[0] = (b[0] & 0x7f) | 0x10;
    SerialNumber::from_slice(&b)
}

/// Write `text` to `path` through a temporary file; keys are 0600.
fn write_file(path: &Path, text: &str, secret: bool) -> Result<(), CaError> {
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io(parent))?;
    }
    let tmp = path.with_extension("pem.tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(if secret { 0o600 } else { 0o644 })
        .open(&tmp)
        .map_err(io(&tmp))?;
    f.write_all(text.as_bytes()).map_err(io(&tmp))?;
    f.sync_all().map_err(io(&tmp))?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(io(path))
}

fn read(path: &Path) -> Result<String, CaError> {
    std::fs::read_to_string(path).map_err(io(path))
}

/// `ca init`: a new CA and the controller's server certificate for `hosts`
/// (DNS names or IP addresses; empty: `localhost` and `127.0.0.1`).
/// Refuses to overwrite an existing CA. Returns the files written.
pub fn init(ca: &CaDir, hosts: &[String], now: Timestamp) -> Result<Vec<PathBuf>, CaError> {
    for p in [ca.ca_cert(), ca.ca_key()] {
        if p.exists() {
            return Err(CaError::Exists(p));
        }
    }
    let hosts: Vec<String> = if hosts.is_empty() {
        vec!["localhost".into(), "127.0.0.1".into()]
    } else {
        hosts.to_vec()
    };
    std::fs::create_dir_all(&ca.dir).map_err(io(&ca.dir))?;
    let ca_path = ca.ca_cert();
    let key = KeyPair::generate().map_err(cert_err(&ca_path))?;
    let mut p = CertificateParams::default();
    p.distinguished_name = rcgen::DistinguishedName::new();
    // A CA of its own name: a certificate of another baton CA is then
    // refused as "unknown issuer", not as a bad signature.
    let tag: [u8; 4] = rand::random();
    p.distinguished_name.push(
        DnType::CommonName,
        format!("baton fleet CA {}", identity::hex(&tag)),
    );
    p.distinguished_name.push(DnType::OrganizationName, "baton");
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    set_validity(&mut p, Validity::days(now, CA_DAYS), &ca_path)?;
    p.serial_number = Some(random_serial());
    let cert = p.self_signed(&key).map_err(cert_err(&ca_path))?;
    write_file(&ca.ca_key(), &key.serialize_pem(), true)?;
    write_file(&ca_path, &cert.pem(), false)?;
    let issuer = Issuer::new(p, key);

    let server_path = ca.server_cert();
    let mut s = CertificateParams::new(hosts.clone()).map_err(cert_err(&server_path))?;
    s.distinguished_name = rcgen::DistinguishedName::new();
    s.distinguished_name
        .push(DnType::CommonName, hosts[0].as_str());
    s.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    s.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    set_validity(&mut s, Validity::days(now, LEAF_DAYS), &server_path)?;
    s.serial_number = Some(random_serial());
    s.use_authority_key_identifier_extension = true;
    let skey = KeyPair::generate().map_err(cert_err(&server_path))?;
    let scert = s
        .signed_by(&skey, &issuer)
        .map_err(cert_err(&server_path))?;
    write_file(&ca.server_key(), &skey.serialize_pem(), true)?;
    write_file(&server_path, &scert.pem(), false)?;
    Ok(vec![ca_path, ca.ca_key(), server_path, ca.server_key()])
}

/// What issuing does when the name has a certificate in force (one not
/// revoked).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Existing {
    /// Refuse ([`CaError::InForce`]): the old certificate and its tokens
    /// would stay valid beside the new one, and nothing would say so.
    Refuse,
    /// Issue, and revoke the one in force at once.
    Replace,
}

/// A certificate issued.
#[derive(Debug)]
pub struct Issued {
    /// Its certificate file.
    pub cert: PathBuf,
    /// Its key file.
    pub key: PathBuf,
    /// The serial of the certificate it replaced, now revoked.
    pub replaced: Option<String>,
}

/// Issue a client certificate for `identity` (an agent or an operator).
/// A name whose certificate is in force is refused, or that certificate
/// revoked, as `existing` says; a revoked or expired one's files are
/// simply replaced. Every serial issued is recorded in `issued.txt`
/// (before the files are written) for `ca revoke`.
pub fn issue(
    ca: &CaDir,
    identity: &Identity,
    validity: Validity,
    existing: Existing,
) -> Result<Issued, CaError> {
    let (kind, name) = match identity {
        Identity::Agent { id, tenants } => {
            identity::check_name("agent", id)?;
            for t in tenants {
                identity::check_name("tenant", t)?;
            }
            (Kind::Agent, id)
        }
        Identity::Operator { name, tenant, .. } => {
            identity::check_name("operator", name)?;
            identity::check_name("tenant", tenant)?;
            (Kind::Operator, name)
        }
        Identity::Insecure => {
            return Err(CaError::Name(IdentityError(
                "no certificate for an insecure peer".into(),
            )));
        }
    };
    let in_force = in_force(ca, kind, name)?;
    if let (Some(serial), Existing::Refuse) = (&in_force, existing) {
        return Err(CaError::InForce {
            kind: kind.name(),
            name: name.clone(),
            serial: serial.clone(),
        });
    }
    let uri = identity.to_uri().unwrap_or_default();
    let ca_path = ca.ca_cert();
    let ca_key_path = ca.ca_key();
    let ca_key = KeyPair::from_pem(&read(&ca_key_path)?).map_err(cert_err(&ca_key_path))?;
    let issuer = Issuer::from_ca_cert_pem(&read(&ca_path)?, ca_key).map_err(cert_err(&ca_path))?;

    let cert_path = ca.leaf_cert(kind, name);
    let mut p = CertificateParams::default();
    p.distinguished_name = rcgen::DistinguishedName::new();
    p.distinguished_name.push(DnType::CommonName, name.as_str());
    p.distinguished_name.push(
        DnType::OrganizationalUnitName,
        match identity {
            Identity::Operator { tenant, role, .. } => format!("baton operator {tenant} {role}"),
            _ => "baton agent".to_string(),
        },
    );
    p.subject_alt_names = vec![SanType::URI(
        uri.as_str().try_into().map_err(cert_err(&cert_path))?,
    )];
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    set_validity(&mut p, validity, &cert_path)?;
    p.serial_number = Some(random_serial());
    p.use_authority_key_identifier_extension = true;
    let key = KeyPair::generate().map_err(cert_err(&cert_path))?;
    let cert = p.signed_by(&key, &issuer).map_err(cert_err(&cert_path))?;
    // The serial as TLS will read it (what `revoked.txt` lists).
    let serial = identity::from_cert_der(cert.der())
        .map_err(|e| CaError::Cert {
            path: cert_path.clone(),
            message: e.0,
        })?
        .serial;
    // Recorded before the files exist: no certificate goes out that
    // `ca revoke` cannot find.
    append_line(&ca.issued(), &format!("{serial} {} {name}", kind.name()))?;
    let key_path = ca.leaf_key(kind, name);
    write_file(&key_path, &key.serialize_pem(), true)?;
    write_file(&cert_path, &cert.pem(), false)?;
    let replaced = match in_force {
        Some(old) => {
            append_line(&ca.revoked(), &format!("{old} {} {name}", kind.name()))?;
            Some(old)
        }
        None => None,
    };
    Ok(Issued {
        cert: cert_path,
        key: key_path,
        replaced,
    })
}

/// The serial of NAME's current certificate, unless it is revoked (an
/// expired one counts as in force: replacing it says so).
fn in_force(ca: &CaDir, kind: Kind, name: &str) -> Result<Option<String>, CaError> {
    let path = ca.leaf_cert(kind, name);
    if !path.exists() {
        return Ok(None);
    }
    let serial = read_cert(&path)?.serial;
    let revoked = read_revoked(&ca.revoked())?.contains(&serial);
    Ok((!revoked).then_some(serial))
}

/// Appends `line` to `path` (made 0644 if new) and syncs it.
fn append_line(path: &Path, line: &str) -> Result<(), CaError> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o644)
        .open(path)
        .map_err(io(path))?;
    writeln!(f, "{line}").map_err(io(path))?;
    f.sync_all().map_err(io(path))
}

/// The identity and serial of a PEM certificate file.
pub fn read_cert(path: &Path) -> Result<identity::PeerCert, CaError> {
    let bytes = std::fs::read(path).map_err(io(path))?;
    let (_, pem) = x509_parser::pem::parse_x509_pem(&bytes).map_err(|e| CaError::Cert {
        path: path.to_path_buf(),
        message: format!("not a PEM certificate: {e}"),
    })?;
    identity::from_cert_der(&pem.contents).map_err(|e| CaError::Cert {
        path: path.to_path_buf(),
        message: e.0,
    })
}

/// What [`revoke`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Revoked {
    /// The current certificate of the name.
    pub cert: PathBuf,
    /// Its serial.
    pub serial: String,
    /// Serials listed by this call: the current one's and those of the
    /// certificates re-issues replaced (from `issued.txt`), oldest first.
    pub listed: Vec<String>,
}

impl Revoked {
    /// Every serial of the name was revoked before this call.
    pub fn already(&self) -> bool {
        self.listed.is_empty()
    }
}

/// `ca revoke NAME`: every certificate ever issued to NAME (agent or
/// operator; `kind` when both exist) listed in `revoked.txt`: the current
/// one, and those a re-issue replaced, which `issued.txt` remembers (a
/// token or a session of any of them ends with it). Certificates issued
/// before `issued.txt` existed are known only by the current file.
pub fn revoke(ca: &CaDir, name: &str, kind: Option<Kind>) -> Result<Revoked, CaError> {
    let kinds: Vec<Kind> = match kind {
        Some(k) => vec![k],
        None => [Kind::Agent, Kind::Operator]
            .into_iter()
            .filter(|k| ca.leaf_cert(*k, name).exists())
            .collect(),
    };
    let kind = match kinds.as_slice() {
        [k] => *k,
        [] => {
            return Err(CaError::NotFound {
                name: name.to_string(),
                dir: ca.dir.display().to_string(),
            });
        }
        _ => return Err(CaError::Ambiguous(name.to_string())),
    };
    let cert = ca.leaf_cert(kind, name);
    let serial = read_cert(&cert)?.serial;
    let mut serials = issued_to(ca, kind, name)?;
    if !serials.contains(&serial) {
        serials.push(serial.clone());
    }
    let revoked = read_revoked(&ca.revoked())?;
    let mut listed = Vec::new();
    for s in serials {
        if !revoked.contains(&s) && !listed.contains(&s) {
            append_line(&ca.revoked(), &format!("{s} {} {name}", kind.name()))?;
            listed.push(s);
        }
    }
    Ok(Revoked {
        cert,
        serial,
        listed,
    })
}

/// The serials `issued.txt` records for `kind` NAME, oldest first (none
/// if it does not exist). A line that does not read is an error naming
/// it: a revocation must not quietly miss a certificate.
fn issued_to(ca: &CaDir, kind: Kind, name: &str) -> Result<Vec<String>, CaError> {
    let path = ca.issued();
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(&path)(e)),
    };
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut f = line.split_whitespace();
        match (f.next(), f.next(), f.next(), f.next()) {
            (Some(s), Some(k), Some(n), None) if s.bytes().all(|b| b.is_ascii_hexdigit()) => {
                if k == kind.name() && n == name {
                    out.push(s.to_ascii_lowercase());
                }
            }
            _ => {
                return Err(CaError::Cert {
                    path: path.clone(),
                    message: format!("line {}: not `SERIAL KIND NAME`: {line}", i + 1),
                });
            }
        }
    }
    Ok(out)
}

pub use baton_model::RevokedEntry;

/// The lines of a `revoked.txt`, in file order (none if it does not
/// exist); a serial listed twice comes once.
pub fn read_revoked_entries(path: &Path) -> Result<Vec<RevokedEntry>, CaError> {
    let serials = read_revoked(path)?;
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for line in text.lines() {
        let mut w = line.split('#').next().unwrap_or("").split_whitespace();
        let Some(serial) = w.next().map(str::to_ascii_lowercase) else {
            continue;
        };
        if serials.contains(&serial) && seen.insert(serial.clone()) {
            out.push(RevokedEntry {
                serial,
                kind: w.next().unwrap_or("").to_string(),
                name: w.next().unwrap_or("").to_string(),
            });
        }
    }
    Ok(out)
}

/// The serials listed in a `revoked.txt` (none if it does not exist).
pub fn read_revoked(path: &Path) -> Result<HashSet<String>, CaError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(HashSet::new()),
        Err(e) => return Err(io(path)(e)),
    };
    let mut out = HashSet::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        let Some(serial) = line.split_whitespace().next() else {
            continue;
        };
        if !serial.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(CaError::Cert {
                path: path.to_path_buf(),
                message: format!("line {}: `{serial}` is not a hex serial", i + 1),
            });
        }
        out.insert(serial.to_ascii_lowercase());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Role;

    fn now() -> Timestamp {
        Timestamp::now()
    }

    #[test]
    fn validity_is_held_to_the_range_of_an_instant() {
        let t = now();
        let v = Validity::days(t, 2);
        assert_eq!(
            v.not_after.duration_since(t),
            SignedDuration::from_hours(48)
        );
        assert_eq!(
            t.duration_since(v.not_before),
            SignedDuration::from_hours(1)
        );
        assert_eq!(Validity::days(t, i64::MAX).not_after, Timestamp::MAX);
        // A past end: it starts a day before it, so it is a valid (expired)
        // certificate.
        let past = Timestamp::from_second(86_400 * 365).expect("1971");
        let v = Validity::until(t, past);
        assert_eq!(
            v.not_before,
            Timestamp::from_second(86_400 * 364).expect("1970")
        );
    }

    #[test]
    fn init_issue_revoke_round_trip() {
        let tmp = tempfile::tempdir().expect("tmp");
        let ca = CaDir::new(tmp.path().join("ca"));
        let files = init(&ca, &[], now()).expect("init");
        assert_eq!(files.len(), 4);
        use std::os::unix::fs::PermissionsExt;
        for key in [ca.ca_key(), ca.server_key()] {
            let mode = std::fs::metadata(&key).expect("key").permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{}", key.display());
        }
        // A second init refuses and leaves the CA alone.
        let before = std::fs::read(ca.ca_cert()).expect("ca");
        let e = init(&ca, &[], now()).expect_err("exists");
        assert!(e.to_string().contains("ca.pem: exists already"), "{e}");
        assert_eq!(std::fs::read(ca.ca_cert()).expect("ca"), before);

        let agent = Identity::Agent {
            id: "press-01".into(),
            tenants: vec!["plant-a".into()],
        };
        let Issued { cert, key, .. } = issue(
            &ca,
            &agent,
            Validity::days(now(), LEAF_DAYS),
            Existing::Refuse,
        )
        .expect("agent");
        assert!(cert.ends_with("agents/press-01.pem"));
        assert!(key.ends_with("agents/press-01-key.pem"));
        let a = read_cert(&cert).expect("read");
        assert_eq!(a.identity, agent);

        let op = Identity::Operator {
            name: "ann".into(),
            tenant: "plant-a".into(),
            role: Role::Operator,
        };
        let ocert = issue(&ca, &op, Validity::days(now(), LEAF_DAYS), Existing::Refuse)
            .expect("operator")
            .cert;
        assert_eq!(read_cert(&ocert).expect("read").identity, op);

        // Bad names are refused before anything is written.
        let e = issue(
            &ca,
            &Identity::Agent {
                id: "Bad/Name".into(),
                tenants: Vec::new(),
            },
            Validity::days(now(), 1),
            Existing::Refuse,
        )
        .expect_err("bad");
        assert!(e.to_string().contains("agent `Bad/Name`"), "{e}");

        // Revoke: listed once, by serial.
        let r = revoke(&ca, "press-01", None).expect("revoke");
        assert_eq!(r.serial, a.serial);
        assert_eq!(r.listed, std::slice::from_ref(&a.serial));
        assert!(revoke(&ca, "press-01", None).expect("again").already());
        let listed = read_revoked(&ca.revoked()).expect("list");
        let entries = read_revoked_entries(&ca.revoked()).expect("entries");
        assert_eq!(entries.len(), 1);
        assert_eq!(
            (entries[0].kind.as_str(), entries[0].name.as_str()),
            ("agent", "press-01")
        );
        assert_eq!(listed.len(), 1);
        assert!(listed.contains(&a.serial));
        let e = revoke(&ca, "nobody", None).expect_err("unknown");
        assert!(
            e.to_string().contains("no certificate named `nobody`"),
            "{e}"
        );
        // An agent and an operator of the same name: say which.
        issue(
            &ca,
            &Identity::Agent {
                id: "ann".into(),
                tenants: Vec::new(),
            },
            Validity::days(now(), 1),
            Existing::Refuse,
        )
        .expect("agent ann");
        let e = revoke(&ca, "ann", None).expect_err("ambiguous");
        assert!(e.to_string().contains("--kind"), "{e}");
        let r = revoke(&ca, "ann", Some(Kind::Operator)).expect("operator ann");
        assert!(r.cert.ends_with("operators/ann.pem"));
    }

    /// Issue 36's hole: `issue-operator boss --role viewer` over an admin
    /// `boss` overwrote the files and left the admin certificate (and its
    /// token) valid, and `ca revoke boss` then revoked only the newest.
    #[test]
    fn a_certificate_in_force_is_not_issued_over_and_revoke_reaches_every_one_of_the_name() {
        let tmp = tempfile::tempdir().expect("tmp");
        let ca = CaDir::new(tmp.path().join("ca"));
        init(&ca, &[], now()).expect("init");
        let boss = |role| Identity::Operator {
            name: "boss".into(),
            tenant: "default".into(),
            role,
        };
        let valid = Validity::days(now(), 2);
        let first = issue(&ca, &boss(Role::Admin), valid, Existing::Refuse).expect("admin");
        let s1 = read_cert(&first.cert).expect("read").serial;
        // Over a certificate in force: refused, the files as they were.
        let e = issue(&ca, &boss(Role::Viewer), valid, Existing::Refuse).expect_err("in force");
        assert!(matches!(e, CaError::InForce { .. }), "{e}");
        assert!(
            e.to_string().contains(&s1) && e.to_string().contains("--replace"),
            "{e}"
        );
        assert_eq!(read_cert(&first.cert).expect("read").serial, s1);
        // Replaced: the old serial is revoked at once.
        let second = issue(&ca, &boss(Role::Viewer), valid, Existing::Replace).expect("replace");
        assert_eq!(second.replaced.as_deref(), Some(s1.as_str()));
        let s2 = read_cert(&second.cert).expect("read").serial;
        assert_ne!(s1, s2);
        let revoked = read_revoked(&ca.revoked()).expect("list");
        assert!(revoked.contains(&s1) && !revoked.contains(&s2));
        // A re-issue by a build without this check (or by hand) is in
        // issued.txt all the same: revoke reaches it.
        let third = {
            let mut text = std::fs::read_to_string(ca.issued()).expect("issued");
            let i = issue(&ca, &boss(Role::Admin), valid, Existing::Replace).expect("third");
            let s3 = read_cert(&i.cert).expect("read").serial;
            // Undo the automatic revocation of s2, as the old build did
            // not make one.
            let lines: Vec<String> = std::fs::read_to_string(ca.revoked())
                .expect("revoked")
                .lines()
                .filter(|l| !l.starts_with(&s2))
                .map(str::to_owned)
                .collect();
            std::fs::write(ca.revoked(), lines.join("\n") + "\n").expect("write");
            text.push_str(&format!("{s3} operator boss\n"));
            std::fs::write(ca.issued(), text).expect("write");
            s3
        };
        let r = revoke(&ca, "boss", None).expect("revoke");
        assert_eq!(r.serial, third);
        assert_eq!(
            r.listed,
            [s2.clone(), third.clone()],
            "oldest first, s1 listed already"
        );
        let revoked = read_revoked(&ca.revoked()).expect("list");
        assert!([&s1, &s2, &third].iter().all(|s| revoked.contains(*s)));
        assert!(revoke(&ca, "boss", None).expect("again").already());
        // Revoked, the name may be issued again without --replace.
        let fresh = issue(&ca, &boss(Role::Viewer), valid, Existing::Refuse).expect("after");
        assert_eq!(fresh.replaced, None);
        // A damaged issued.txt is an error naming its line, never a
        // revocation that quietly misses a certificate.
        std::fs::write(ca.issued(), "zz operator boss\n").expect("write");
        let e = revoke(&ca, "boss", None).expect_err("damaged");
        assert!(e.to_string().contains("line 1"), "{e}");
    }

    #[test]
    fn revoked_lists_are_read_strictly() {
        let tmp = tempfile::tempdir().expect("tmp");
        let p = tmp.path().join("revoked.txt");
        assert!(read_revoked(&p).expect("missing").is_empty());
        std::fs::write(&p, "# header\n\nABCD01 agent a\n  ff agent b # why\n").expect("w");
        let s = read_revoked(&p).expect("read");
        assert!(s.contains("abcd01") && s.contains("ff") && s.len() == 2);
        std::fs::write(&p, "press-01\n").expect("w");
        let e = read_revoked(&p).expect_err("bad");
        assert!(e.to_string().contains("revoked.txt: line 1"), "{e}");
    }
}
