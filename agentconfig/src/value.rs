//! Values as settings are written, read with the setting's name in the
//! error.

use std::time::Duration;

use baton_proto::time::parse_duration;

use super::ConfigError;

/// The duration setting `key` if given (an error names the key), else
/// `default`.
pub(super) fn duration_or(
    key: &str,
    value: Option<&str>,
    default: Duration,
) -> Result<Duration, ConfigError> {
    value.map_or(Ok(default), |t| {
        parse_duration(t).map_err(|e| ConfigError::Value(format!("{key}: {e}")))
    })
}
