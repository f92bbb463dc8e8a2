//! What packs may touch: the GPIO backend, the lines packs may drive, and
//! the programs `exec` may run with the environment keys packs may set.

use baton_gpio::{Allowlist, BackendSpec};

use super::ConfigError;
use super::file::ExecAllowEntry;
use baton_exec::policy::ExecPolicy;

/// The GPIO backend named (default `cdev`).
pub(super) fn gpio_backend(name: Option<String>) -> Result<BackendSpec, ConfigError> {
    let gpio_text = name.unwrap_or_else(|| "cdev".into());
    gpio_text
        .parse()
        .map_err(|e| ConfigError::Value(format!("gpio `{gpio_text}`: {e}")))
}

/// The lines packs may touch; absent: every line.
pub(super) fn allowed_lines(list: Option<&[String]>) -> Result<Allowlist, ConfigError> {
    match list {
        None => Ok(Allowlist::all()),
        Some(list) => list
            .join(",")
            .parse()
            .map_err(|e| ConfigError::Value(format!("allowed-lines: {e}"))),
    }
}

/// The `exec-allowlist` entries as a policy (each program checked by
/// [`ExecPolicy::allow`]).
pub(super) fn exec_policy(entries: Vec<ExecAllowEntry>) -> Result<ExecPolicy, ConfigError> {
    let mut policy = ExecPolicy::new();
    for e in entries {
        policy
            .allow(e.program, e.env)
            .map_err(|e| ConfigError::Value(format!("exec-allowlist: {e}")))?;
    }
    Ok(policy)
}
