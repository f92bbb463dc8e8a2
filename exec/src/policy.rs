//! Which programs `exec` may run, and which environment keys a pack may set
//! for each: the agent's own rule (docs/design.md principle 2), checked when a
//! pack is accepted ([`ExecPolicy::check`]) and again at every submit.

use std::collections::{BTreeMap, BTreeSet};

use super::error::ExecError;

/// The agent's exec allowlist: program → environment keys a pack may set.
///
/// A program matches only if it is, byte for byte, an entry (absolute, no
/// `..` component; no canonicalisation, which would follow symlinks an
/// attacker may control). A pack may set no environment key that is not
/// listed for its program: keys such as `BASH_ENV`, `PATH`, `PYTHONPATH`,
/// `PERL5OPT` or `LD_PRELOAD` would let it run code other than the
/// allowlisted program. `BATON_*` keys are the agent's own (set on every
/// child, never forgeable) and `LD_*` keys cannot be allowed at all.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecPolicy {
    programs: BTreeMap<String, BTreeSet<String>>,
}

/// Why an allowlist entry was refused (at config load).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ExecPolicyError {
    /// Not an absolute path, or with a `..` component or a NUL byte.
    #[error("`{program}`: {reason}")]
    BadProgram {
        /// The entry.
        program: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// The same program twice.
    #[error("`{program}` is listed twice (give each program one entry)")]
    Duplicate {
        /// The entry.
        program: String,
    },
    /// An environment key that cannot or must not be allowed.
    #[error("`{program}`: environment key {key:?} {reason}")]
    BadKey {
        /// The entry.
        program: String,
        /// The key.
        key: String,
        /// What is wrong.
        reason: &'static str,
    },
}

/// Why `program` can never match an allowlist entry.
fn program_rule(program: &str) -> Result<(), &'static str> {
    if !program.starts_with('/') {
        return Err("not an absolute path");
    }
    if program.split('/').any(|c| c == "..") {
        return Err("path contains '..'");
    }
    if program.contains('\0') {
        return Err("path contains a NUL byte");
    }
    Ok(())
}

/// Why `key` can never be passed to a child, whatever the config says.
fn key_rule(key: &str) -> Option<&'static str> {
    if key.is_empty() {
        Some("has an empty name")
    } else if key.contains(['=', '\0']) {
        Some("has '=' or NUL in its name")
    } else if key.starts_with("BATON_") {
        Some("is reserved for the agent")
    } else {
        None
    }
}

impl ExecPolicy {
    /// The empty policy: no program may run.
    pub fn new() -> Self {
        Self::default()
    }

    /// Programs allowed with no environment keys (`exec-allowlist` entries
    /// written as plain paths).
    pub fn from_programs<I, P>(programs: I) -> Result<Self, ExecPolicyError>
    where
        I: IntoIterator<Item = P>,
        P: Into<String>,
    {
        let mut p = Self::new();
        for program in programs {
            p.allow(program, std::iter::empty::<String>())?;
        }
        Ok(p)
    }

    /// Allow `program`, with the environment keys a pack may set for it.
    pub fn allow<P, I, K>(&mut self, program: P, env_keys: I) -> Result<(), ExecPolicyError>
    where
        P: Into<String>,
        I: IntoIterator<Item = K>,
        K: Into<String>,
    {
        let program = program.into();
        if let Err(reason) = program_rule(&program) {
            return Err(ExecPolicyError::BadProgram { program, reason });
        }
        if self.programs.contains_key(&program) {
            return Err(ExecPolicyError::Duplicate { program });
        }
        let mut keys = BTreeSet::new();
        for key in env_keys {
            let key = key.into();
            let reason = key_rule(&key).or_else(|| {
                key.starts_with("LD_").then_some(
                    "is a dynamic-loader variable (it would let a pack run code other than the program)",
                )
            });
            if let Some(reason) = reason {
                return Err(ExecPolicyError::BadKey {
                    program,
                    key,
                    reason,
                });
            }
            keys.insert(key);
        }
        self.programs.insert(program, keys);
        Ok(())
    }

    /// No program may run.
    pub fn is_empty(&self) -> bool {
        self.programs.is_empty()
    }

    /// The allowed programs, each with the environment keys a pack may set.
    pub fn programs(&self) -> impl Iterator<Item = (&str, &BTreeSet<String>)> {
        self.programs.iter().map(|(p, k)| (p.as_str(), k))
    }

    /// Whether `program` may run at all (exactly an entry).
    pub fn is_allowed(&self, program: &str) -> bool {
        program_rule(program).is_ok() && self.programs.contains_key(program)
    }

    /// The environment keys a pack may set for `program` (`None`: the
    /// program is not allowed).
    pub fn allowed_env(&self, program: &str) -> Option<&BTreeSet<String>> {
        self.programs.get(program)
    }

    /// Whether an `exec {program, args, env}` action may run on this agent.
    /// Pure: the runtime calls it when a pack is accepted (so a pack that
    /// could not run is refused whole, with this message) and the pool again
    /// at every submit.
    pub fn check(
        &self,
        program: &str,
        args: &[String],
        env: &BTreeMap<String, String>,
    ) -> Result<(), ExecError> {
        if let Err(reason) = program_rule(program) {
            return Err(ExecError::NotAllowed {
                program: program.to_owned(),
                reason: reason.to_owned(),
            });
        }
        let Some(allowed) = self.programs.get(program) else {
            let list = if self.programs.is_empty() {
                "it is empty".to_owned()
            } else {
                let names: Vec<&str> = self.programs.keys().map(String::as_str).collect();
                format!("allowed: {}", names.join(", "))
            };
            return Err(ExecError::NotAllowed {
                program: program.to_owned(),
                reason: format!("not on the agent's exec allowlist ({list})"),
            });
        };
        let mut refused = Vec::new();
        for (key, value) in env {
            let reason = key_rule(key).or_else(|| {
                value
                    .contains('\0')
                    .then_some("has a NUL byte in its value")
            });
            if let Some(reason) = reason {
                return Err(ExecError::BadEnv {
                    program: program.to_owned(),
                    key: key.clone(),
                    reason,
                });
            }
            if !allowed.contains(key) {
                refused.push(key.clone());
            }
        }
        if !refused.is_empty() {
            return Err(ExecError::EnvNotAllowed {
                program: program.to_owned(),
                refused,
                allowed: allowed.iter().cloned().collect(),
            });
        }
        if let Some(index) = args.iter().position(|a| a.contains('\0')) {
            return Err(ExecError::BadArg {
                program: program.to_owned(),
                index,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(keys: &[&str]) -> BTreeMap<String, String> {
        keys.iter()
            .map(|k| (k.to_string(), "x".to_string()))
            .collect()
    }

    #[test]
    fn programs_are_exact_and_absolute() {
        let p = ExecPolicy::from_programs(["/bin/true", "/usr/bin/logrotate"]).expect("valid");
        assert!(p.is_allowed("/bin/true"));
        assert!(p.is_allowed("/usr/bin/logrotate"));
        assert!(!p.is_allowed("/bin/false"));
        assert!(!p.is_allowed("true"));
        assert!(!p.is_allowed("/usr/bin/../bin/logrotate"));
        assert!(!p.is_allowed("/usr/bin/./logrotate"), "no normalisation");
        assert!(!p.is_allowed("/usr//bin/logrotate"), "no normalisation");
        assert!(!p.is_allowed("/bin/true/"));
        let e = p
            .check("/bin/false", &[], &env(&[]))
            .map_err(|e| e.to_string());
        assert_eq!(
            e,
            Err(
                "exec of \"/bin/false\" refused: not on the agent's exec allowlist \
                 (allowed: /bin/true, /usr/bin/logrotate)"
                    .to_owned()
            )
        );
        let e = p
            .check("/usr/bin/../x", &[], &env(&[]))
            .map_err(|e| e.to_string());
        assert_eq!(
            e,
            Err("exec of \"/usr/bin/../x\" refused: path contains '..'".to_owned())
        );
        let e = ExecPolicy::new().check("/bin/true", &[], &env(&[]));
        assert!(e.is_err_and(|e| e.to_string().ends_with("(it is empty)")));
    }

    #[test]
    fn bad_entries_are_refused() {
        for (program, keys) in [
            ("bin/rel", vec![]),
            ("/usr/../bin/sh", vec![]),
            ("/bin/sh", vec!["LD_PRELOAD"]),
            ("/bin/sh", vec!["BATON_ATTEMPT"]),
            ("/bin/sh", vec!["A=B"]),
            ("/bin/sh", vec![""]),
        ] {
            let r = ExecPolicy::new().allow(program, keys.clone());
            assert!(r.is_err(), "{program} {keys:?}");
        }
        let mut p = ExecPolicy::new();
        assert!(p.allow("/bin/sh", ["MODE"]).is_ok());
        assert_eq!(
            p.allow("/bin/sh", ["LANG"]),
            Err(ExecPolicyError::Duplicate {
                program: "/bin/sh".into()
            })
        );
    }

    #[test]
    fn env_keys_must_be_allowed_for_the_program() {
        let mut p = ExecPolicy::new();
        p.allow("/bin/sh", ["MODE", "LANG"]).expect("valid");
        p.allow("/bin/true", std::iter::empty::<String>())
            .expect("valid");
        assert!(p.check("/bin/sh", &[], &env(&["MODE", "LANG"])).is_ok());
        assert!(p.check("/bin/true", &[], &env(&[])).is_ok());
        let e = p
            .check("/bin/sh", &[], &env(&["MODE", "PATH", "BASH_ENV"]))
            .map_err(|e| e.to_string());
        assert_eq!(
            e,
            Err(
                "exec of \"/bin/sh\" refused: environment variables BASH_ENV, PATH are not \
                 allowed for this program by the agent's exec-allowlist (allowed: LANG, MODE)"
                    .to_owned()
            )
        );
        let e = p
            .check("/bin/true", &[], &env(&["LD_PRELOAD"]))
            .map_err(|e| e.to_string());
        assert_eq!(
            e,
            Err(
                "exec of \"/bin/true\" refused: environment variable LD_PRELOAD is not \
                 allowed for this program by the agent's exec-allowlist (allowed: none)"
                    .to_owned()
            )
        );
        for key in ["BATON_ATTEMPT", "A=B", ""] {
            assert!(
                matches!(
                    p.check("/bin/sh", &[], &env(&[key])),
                    Err(ExecError::BadEnv { .. })
                ),
                "{key:?}"
            );
        }
        let mut nul = env(&["MODE"]);
        nul.insert("MODE".into(), "a\0b".into());
        assert!(matches!(
            p.check("/bin/sh", &[], &nul),
            Err(ExecError::BadEnv { .. })
        ));
        assert!(matches!(
            p.check("/bin/sh", &["ok".into(), "a\0b".into()], &env(&[])),
            Err(ExecError::BadArg { index: 1, .. })
        ));
    }
}
