//! The settings of agent updates (`update:`): how fast a release is
//! downloaded, how quiet the box must be to restart into it, and how long
//! a new version has to be welcomed by a controller before it is rolled
//! back.

use std::time::Duration;

use serde::Deserialize;

use super::ConfigError;
use super::value::duration_or;

/// `update:` section.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct UpdateFile {
    /// Bytes per second a release is downloaded at, at most (default
    /// 262 144: a 16 MB agent in about a minute, leaving the link, the
    /// disk and the CPUs to the firings).
    pub download_rate: Option<u64>,
    /// The restart into a new version waits for a moment with no firing
    /// due within this (default 2s), and nothing armed or staged.
    pub quiet_margin: Option<String>,
    /// A new version not welcomed by a controller within this of its
    /// start stops, and the version before runs again (default 5m).
    pub confirm_within: Option<String>,
}

/// The effective update settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpdateConfig {
    /// See [`UpdateFile::download_rate`].
    pub download_rate: u64,
    /// See [`UpdateFile::quiet_margin`].
    pub quiet_margin: Duration,
    /// See [`UpdateFile::confirm_within`].
    pub confirm_within: Duration,
}

/// Default [`UpdateConfig::download_rate`].
pub const DEFAULT_DOWNLOAD_RATE: u64 = 256 * 1024;

impl Default for UpdateConfig {
    fn default() -> Self {
        UpdateConfig {
            download_rate: DEFAULT_DOWNLOAD_RATE,
            quiet_margin: Duration::from_secs(2),
            confirm_within: Duration::from_secs(300),
        }
    }
}

/// The section checked: a rate of at least 4 KiB/s (a release must
/// arrive), a margin of at most an hour, a deadline of 10 s to an hour.
pub(super) fn resolve_update(f: UpdateFile) -> Result<UpdateConfig, ConfigError> {
    let d = UpdateConfig::default();
    let download_rate = f.download_rate.unwrap_or(d.download_rate);
    if download_rate < 4096 {
        return Err(ConfigError::Value(format!(
            "update.download-rate: {download_rate} bytes/s; at least 4096"
        )));
    }
    let quiet_margin = duration_or(
        "update.quiet-margin",
        f.quiet_margin.as_deref(),
        d.quiet_margin,
    )?;
    if quiet_margin > Duration::from_secs(3600) {
        return Err(ConfigError::Value("update.quiet-margin: at most 1h".into()));
    }
    let confirm_within = duration_or(
        "update.confirm-within",
        f.confirm_within.as_deref(),
        d.confirm_within,
    )?;
    if !(Duration::from_secs(10)..=Duration::from_secs(3600)).contains(&confirm_within) {
        return Err(ConfigError::Value(
            "update.confirm-within: from 10s to 1h".into(),
        ));
    }
    Ok(UpdateConfig {
        download_rate,
        quiet_margin,
        confirm_within,
    })
}
