//! The operator's profile: where the controller is and which credentials
//! to use, so they are not repeated on every command.
//!
//! `BATON_PROFILE=FILE`, else `~/.config/baton/profile.yaml` if it exists.
//! A flat file of `key: value` lines (a YAML subset; `#` comments):
//!
//! ```yaml
//! controller: https://ctl.example:7411
//! cert: ann.pem          # relative paths are relative to the profile
//! key: ann-key.pem
//! ca: ca.pem
//! ```
//!
//! Flags and `BATON_*` variables win over the profile.

use std::path::{Path, PathBuf};

/// What a profile sets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Profile {
    /// Controller URL.
    pub controller: Option<String>,
    /// Operator certificate.
    pub cert: Option<PathBuf>,
    /// Its key.
    pub key: Option<PathBuf>,
    /// The fleet's CA.
    pub ca: Option<PathBuf>,
}

/// The profile file in use, if any: `BATON_PROFILE` (must exist), else
/// `$HOME/.config/baton/profile.yaml` when present.
pub fn locate() -> Option<(PathBuf, bool)> {
    if let Some(p) = std::env::var_os("BATON_PROFILE").filter(|p| !p.is_empty()) {
        return Some((PathBuf::from(p), true));
    }
    let home = std::env::var_os("HOME")?;
    let p = Path::new(&home).join(".config/baton/profile.yaml");
    p.exists().then_some((p, false))
}

/// Read the profile in use (none: the default, empty).
pub fn load() -> Result<Profile, String> {
    match locate() {
        None => Ok(Profile::default()),
        Some((path, _)) => {
            let text = std::fs::read_to_string(&path)
                .map_err(|e| format!("profile {}: {e}", path.display()))?;
            parse(&path, &text)
        }
    }
}

/// Parse a profile read from `path` (for messages and relative paths).
pub fn parse(path: &Path, text: &str) -> Result<Profile, String> {
    let base = path.parent().unwrap_or(Path::new("."));
    let mut p = Profile::default();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split(" #").next().unwrap_or("").trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = |m: &str| format!("{}:{}: {m}", path.display(), i + 1);
        let (k, v) = line
            .split_once(':')
            .ok_or_else(|| at("expected `key: value`"))?;
        let v = v.trim().trim_matches(|c| c == '"' || c == '\'');
        if v.is_empty() {
            return Err(at(&format!("`{}` has no value", k.trim())));
        }
        let slot_set = match k.trim() {
            "controller" => p.controller.replace(v.to_string()).is_some(),
            "cert" => p.cert.replace(base.join(v)).is_some(),
            "key" => p.key.replace(base.join(v)).is_some(),
            "ca" => p.ca.replace(base.join(v)).is_some(),
            other => {
                return Err(at(&format!(
                    "unknown key `{other}` (expected controller, cert, key, ca)"
                )));
            }
        };
        if slot_set {
            return Err(at(&format!("`{}` given twice", k.trim())));
        }
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_profile_is_flat_strict_and_relative_to_itself() {
        let path = Path::new("/home/ann/.config/baton/profile.yaml");
        let p = parse(
            path,
            "# ann at plant a\ncontroller: https://ctl:7411\ncert: ann.pem # mine\nkey: \"/etc/k.pem\"\nca: ../ca.pem\n",
        )
        .expect("valid");
        assert_eq!(p.controller.as_deref(), Some("https://ctl:7411"));
        assert_eq!(
            p.cert,
            Some(PathBuf::from("/home/ann/.config/baton/ann.pem"))
        );
        assert_eq!(p.key, Some(PathBuf::from("/etc/k.pem")));
        assert_eq!(
            p.ca,
            Some(PathBuf::from("/home/ann/.config/baton/../ca.pem"))
        );
        for (text, why) in [
            ("tenant: a\n", "profile.yaml:1: unknown key `tenant`"),
            ("cert: a\ncert: b\n", "profile.yaml:2: `cert` given twice"),
            ("ca:\n", "`ca` has no value"),
            ("just words\n", "expected `key: value`"),
        ] {
            let e = parse(path, text).expect_err(text);
            assert!(e.contains(why), "{text}: {e}");
        }
    }
}
