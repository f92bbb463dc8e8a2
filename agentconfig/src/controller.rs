//! The controller link's settings: the controllers' URLs (one scheme, no
//! plaintext fallback), the certificate files, and the labels sent in the
//! hello, each checked with a message that names the setting.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::{ConfigError, MAX_LABEL_LEN};

/// A controller URL the link can dial: `https://HOST[:PORT]` (mTLS; the
/// certificate files are checked by [`check_tls`]), or `http://HOST[:PORT]`
/// with `insecure`. Returns it without a trailing `/`.
pub fn check_controller_url(
    url: &str,
    insecure: bool,
    insecure_any: bool,
) -> Result<String, ConfigError> {
    let bad = |why: &str| ConfigError::Value(format!("controller `{url}`: {why}"));
    let uri: tonic::transport::Uri = url
        .parse()
        .map_err(|e| bad(&format!("not a URL ({e}); write https://HOST:PORT")))?;
    let https = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        Some(other) => {
            return Err(bad(&format!(
                "unknown scheme `{other}`; write https://HOST:PORT"
            )));
        }
        None => return Err(bad("no scheme; write https://HOST:PORT")),
    };
    if uri.host().is_none_or(str::is_empty) {
        return Err(bad("no host; write https://HOST:PORT"));
    }
    if uri.path() != "/" && !uri.path().is_empty() || uri.query().is_some() {
        return Err(bad("a controller URL has no path; write https://HOST:PORT"));
    }
    if !https {
        use baton_link_client::plaintext::{
            NOT_LOOPBACK, NOT_LOOPBACK_REMEDY, Plaintext, PlaintextRefused, check_plaintext,
        };
        let allowed = Plaintext {
            insecure,
            insecure_any,
        };
        check_plaintext(uri.host(), allowed).map_err(|refused| match refused {
            PlaintextRefused::NotAllowed => bad(
                "plaintext link needs --insecure (or use https:// with --cert, --key and --ca)",
            ),
            PlaintextRefused::NotLoopback => bad(&format!(
                "{NOT_LOOPBACK}: anyone on the path could push to this agent or read its feedback; {NOT_LOOPBACK_REMEDY}"
            )),
        })?;
    }
    Ok(url.trim_end_matches('/').to_string())
}

/// Every controller URL checked ([`check_controller_url`]), none twice, all
/// of one scheme: a list mixing `https://` and `http://` would fall back
/// to plaintext when the TLS controllers are down (a downgrade an attacker
/// on the path could force).
pub fn check_controllers(
    urls: &[String],
    insecure: bool,
    insecure_any: bool,
) -> Result<Vec<String>, ConfigError> {
    let mut out: Vec<String> = Vec::with_capacity(urls.len());
    for url in urls {
        let u = check_controller_url(url, insecure, insecure_any)?;
        if out.contains(&u) {
            return Err(ConfigError::Value(format!(
                "controller `{u}` is listed twice"
            )));
        }
        if let Some(first) = out.first()
            && first.starts_with("https://") != u.starts_with("https://")
        {
            return Err(ConfigError::Value(format!(
                "controllers `{first}` and `{u}`: all https:// or all http://, never a plaintext fallback"
            )));
        }
        out.push(u);
    }
    Ok(out)
}

/// The certificate files of the link: all three for an `https://`
/// controller (each readable now; the link reads them again at every
/// connection, so a renewed certificate is used without a restart), none
/// for `http://` (never a silent downgrade of a configured certificate).
pub fn check_tls(
    controller: Option<&str>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    ca: Option<PathBuf>,
) -> Result<Option<baton_link_client::TlsFiles>, ConfigError> {
    let given = cert.is_some() || key.is_some() || ca.is_some();
    let Some(url) = controller.filter(|u| u.starts_with("https://")) else {
        return match (controller, given) {
            (Some(url), true) => Err(ConfigError::Value(format!(
                "cert, key and ca are for an https:// controller, not `{url}`"
            ))),
            (None, true) => Err(ConfigError::Value(
                "cert, key and ca given without a controller".into(),
            )),
            (_, false) => Ok(None),
        };
    };
    let (Some(cert), Some(key), Some(ca)) = (cert, key, ca) else {
        return Err(ConfigError::Value(format!(
            "controller `{url}`: mTLS needs cert, key and ca (--cert, --key, --ca or the config keys)"
        )));
    };
    for p in [&cert, &key, &ca] {
        std::fs::metadata(p).map_err(|e| ConfigError::Read {
            path: p.display().to_string(),
            cause: e,
        })?;
    }
    Ok(Some(baton_link_client::TlsFiles { cert, key, ca }))
}

/// A label as the controller will match it: key and value non-empty, at
/// most [`MAX_LABEL_LEN`] bytes, no control characters (they would corrupt
/// logs and the operators' listings).
pub fn check_label(key: &str, value: &str) -> Result<(), ConfigError> {
    for (what, text) in [("key", key), ("value", value)] {
        let why = if text.is_empty() {
            Some("is empty".to_string())
        } else if text.len() > MAX_LABEL_LEN {
            Some(format!("is longer than {MAX_LABEL_LEN} bytes"))
        } else if text.chars().any(char::is_control) {
            Some("contains a control character".to_string())
        } else {
            None
        };
        if let Some(why) = why {
            return Err(ConfigError::Value(format!(
                "label {key:?}: its {what} {why}"
            )));
        }
    }
    Ok(())
}

/// Parse a `--label KEY=VALUE` argument (checked again by [`resolve`]).
pub fn parse_label_arg(arg: &str) -> Result<(String, String), String> {
    let (k, v) = arg
        .split_once('=')
        .ok_or_else(|| format!("`{arg}`: write KEY=VALUE"))?;
    check_label(k, v).map_err(|e| e.to_string())?;
    Ok((k.to_string(), v.to_string()))
}

/// The controllers to dial: the `--controller` flags if any (they replace
/// the file's list), else the file's `controller` key; an empty list
/// written in the file is refused (leaving the key out means none).
pub(super) fn controller_urls(
    flags: Vec<String>,
    file: Option<Vec<String>>,
) -> Result<Vec<String>, ConfigError> {
    if !flags.is_empty() {
        return Ok(flags);
    }
    match file {
        Some(urls) if urls.is_empty() => Err(ConfigError::Value(
            "controller: an empty list; leave the key out for no controller".into(),
        )),
        urls => Ok(urls.unwrap_or_default()),
    }
}

/// The file's labels as text (numbers and booleans written unquoted kept
/// as they read), the `--label` flags over them, every one checked by
/// [`check_label`].
pub(super) fn labels(
    file: BTreeMap<String, serde_json::Value>,
    flags: Vec<(String, String)>,
) -> Result<BTreeMap<String, String>, ConfigError> {
    let mut labels = BTreeMap::new();
    for (k, v) in file {
        let v = match v {
            serde_json::Value::String(s) => s,
            serde_json::Value::Number(n) => n.to_string(),
            serde_json::Value::Bool(b) => b.to_string(),
            other => {
                return Err(ConfigError::Value(format!(
                    "labels.{k} must be a string, found {}",
                    match other {
                        serde_json::Value::Null => "nothing",
                        serde_json::Value::Array(_) => "a list",
                        _ => "a mapping",
                    }
                )));
            }
        };
        labels.insert(k, v);
    }
    labels.extend(flags);
    for (k, v) in &labels {
        check_label(k, v)?;
    }
    Ok(labels)
}
