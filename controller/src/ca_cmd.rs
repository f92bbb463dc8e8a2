//! `baton-controller ca ...`: the fleet's certificate authority.

use std::io::Write;
use std::path::PathBuf;

use baton_pki::ca::{self, CaDir, Kind, Validity};
use baton_pki::identity::{Identity, Role};
use clap::Subcommand;

/// `ca` subcommands.
#[derive(Subcommand, Debug)]
pub enum CaCmd {
    /// A new CA (DIR/ca.pem, DIR/ca-key.pem) and the controller's
    /// certificate (DIR/server.pem, DIR/server-key.pem); never overwrites a
    /// CA.
    Init {
        /// The CA directory.
        #[arg(long)]
        dir: PathBuf,
        /// Host names or IP addresses the controller is reached by
        /// (repeatable; default localhost and 127.0.0.1).
        #[arg(long = "host")]
        hosts: Vec<String>,
    },
    /// An agent's certificate: DIR/agents/NAME.pem and NAME-key.pem; the
    /// agent's id on the link is NAME.
    IssueAgent {
        /// The agent id.
        name: String,
        /// A tenant the agent serves (repeatable; none: `default`): only
        /// these tenants' packs may target it and their operators see it.
        #[arg(long = "tenant", value_name = "TENANT")]
        tenants: Vec<String>,
        /// The CA directory.
        #[arg(long)]
        dir: PathBuf,
        /// Valid for this many days.
        #[arg(long, default_value_t = ca::LEAF_DAYS)]
        valid_days: i64,
        /// Valid until this RFC 3339 instant (tests: a past one makes an
        /// expired certificate).
        #[arg(long, hide = true)]
        not_after: Option<String>,
        /// The name has a certificate in force: issue a new one and revoke
        /// that one at once (without it, refused).
        #[arg(long)]
        replace: bool,
    },
    /// An operator's certificate: DIR/operators/NAME.pem and NAME-key.pem,
    /// carrying its tenant and role.
    IssueOperator {
        /// The operator's name.
        name: String,
        /// The tenant it acts in.
        #[arg(long)]
        tenant: String,
        /// viewer, operator or admin.
        #[arg(long)]
        role: String,
        /// The CA directory.
        #[arg(long)]
        dir: PathBuf,
        /// Valid for this many days.
        #[arg(long, default_value_t = ca::LEAF_DAYS)]
        valid_days: i64,
        /// Valid until this RFC 3339 instant.
        #[arg(long, hide = true)]
        not_after: Option<String>,
        /// The name has a certificate in force: issue a new one and revoke
        /// that one (and its tokens and sessions) at once (without it,
        /// refused).
        #[arg(long)]
        replace: bool,
        /// Also print a token for the web dashboard and scripts
        /// (`Authorization: Bearer`): bound to this certificate (revoked
        /// and expiring with it); only its digest is kept, in
        /// DIR/tokens.txt.
        #[arg(long)]
        token: bool,
    },
    /// Revoke every certificate issued to NAME, the current one and those
    /// re-issues replaced (listed in DIR/revoked.txt; a controller serving
    /// DIR refuses them within seconds, live streams, tokens and dashboard
    /// sessions included).
    Revoke {
        /// The agent or operator name.
        name: String,
        /// The CA directory.
        #[arg(long)]
        dir: PathBuf,
        /// Which, when an agent and an operator share the name.
        #[arg(long, value_enum)]
        kind: Option<KindArg>,
    },
}

/// `--kind` of `ca revoke`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum KindArg {
    /// An agent's certificate.
    Agent,
    /// An operator's certificate.
    Operator,
}

impl From<KindArg> for Kind {
    fn from(k: KindArg) -> Kind {
        match k {
            KindArg::Agent => Kind::Agent,
            KindArg::Operator => Kind::Operator,
        }
    }
}

fn validity(days: i64, not_after: Option<&str>) -> Result<Validity, String> {
    let now = jiff::Timestamp::now();
    match not_after {
        Some(t) => {
            let at: jiff::Timestamp = t
                .parse()
                .map_err(|e| format!("--not-after {t}: expected an RFC 3339 instant ({e})"))?;
            Ok(Validity::until(now, at))
        }
        None if (1..=36_500).contains(&days) => Ok(Validity::days(now, days)),
        None => Err(format!("--valid-days {days}: expected 1..=36500")),
    }
}

/// Run one `ca` command; exit code (1 refused, 2 usage).
pub fn run(cmd: CaCmd, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let result = match cmd {
        CaCmd::Init { dir, hosts } => ca::init(&CaDir::new(dir), &hosts, jiff::Timestamp::now())
            .map(|files| {
                for f in files {
                    let _ = writeln!(out, "wrote {}", f.display());
                }
            }),
        CaCmd::IssueAgent {
            name,
            tenants,
            dir,
            valid_days,
            not_after,
            replace,
        } => {
            let v = match validity(valid_days, not_after.as_deref()) {
                Ok(v) => v,
                Err(e) => {
                    let _ = writeln!(err, "error: {e}");
                    return 2;
                }
            };
            ca::issue(
                &CaDir::new(dir),
                &Identity::Agent { id: name, tenants },
                v,
                existing(replace),
            )
            .map(|i| said_issued(&i, out))
        }
        CaCmd::IssueOperator {
            name,
            tenant,
            role,
            dir,
            valid_days,
            not_after,
            replace,
            token,
        } => {
            let parsed = role
                .parse::<Role>()
                .map_err(|e| e.to_string())
                .and_then(|role| Ok((role, validity(valid_days, not_after.as_deref())?)));
            let (role, v) = match parsed {
                Ok(x) => x,
                Err(e) => {
                    let _ = writeln!(err, "error: {e}");
                    return 2;
                }
            };
            let who = Identity::Operator { name, tenant, role };
            let ca_dir = CaDir::new(dir);
            ca::issue(&ca_dir, &who, v, existing(replace)).and_then(|i| {
                said_issued(&i, out);
                if token {
                    let t = baton_pki::tokens::issue(&ca_dir, &i.cert)?;
                    let _ = writeln!(out, "token {t}");
                }
                Ok(())
            })
        }
        CaCmd::Revoke { name, dir, kind } => revoke(name, dir, kind, out),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            let _ = writeln!(err, "error: {e}");
            1
        }
    }
}

fn existing(replace: bool) -> ca::Existing {
    if replace {
        ca::Existing::Replace
    } else {
        ca::Existing::Refuse
    }
}

fn said_issued(i: &ca::Issued, out: &mut dyn Write) {
    let _ = writeln!(out, "wrote {}\nwrote {}", i.cert.display(), i.key.display());
    if let Some(old) = &i.replaced {
        let _ = writeln!(out, "revoked the certificate it replaces (serial {old})");
    }
}

/// `ca revoke`: every serial of the name added to `revoked.txt` (once).
fn revoke(
    name: String,
    dir: PathBuf,
    kind: Option<KindArg>,
    out: &mut dyn Write,
) -> Result<(), ca::CaError> {
    let ca = CaDir::new(dir);
    ca::revoke(&ca, &name, kind.map(Kind::from)).map(|r| {
        let _ = if r.already() {
            writeln!(
                out,
                "{} (serial {}) was revoked already, with every earlier certificate of the name",
                r.cert.display(),
                r.serial
            )
        } else {
            writeln!(
                out,
                "revoked {} (serial {}) in {}: {} certificate(s) of the name (serials {})",
                r.cert.display(),
                r.serial,
                ca.revoked().display(),
                r.listed.len(),
                r.listed.join(", ")
            )
        };
    })
}
