//! The `clock:` settings and their flags resolved to a [`ClockConfig`]:
//! the admission limit, the system clock's standing, PTP and NTP.

use std::time::Duration;

use baton_clock::settings::{ClockConfig, DEFAULT_CLOCK_LIMIT, PtpConfig, SystemClock};
use baton_proto::time::parse_duration;

use super::ConfigError;
use super::file::ClockFile;

/// The clock flags, split out of [`Overrides`] for [`resolve_clock`].
pub(super) struct ClockOverrides {
    pub(super) ptp_interface: Option<String>,
    pub(super) ntp_servers: Vec<String>,
    pub(super) limit: Option<String>,
    pub(super) system: Option<String>,
}

/// Longest admission limit: beyond it "absolute time" means nothing.
const MAX_CLOCK_LIMIT: Duration = Duration::from_secs(3600);

/// The clock section and its flags, checked (a flag replaces its key).
pub(super) fn resolve_clock(
    file: ClockFile,
    o: ClockOverrides,
) -> Result<ClockConfig, ConfigError> {
    let limit = match o.limit.or(file.limit) {
        Some(t) => {
            let d =
                parse_duration(&t).map_err(|e| ConfigError::Value(format!("clock limit: {e}")))?;
            if d.is_zero() || d > MAX_CLOCK_LIMIT {
                return Err(ConfigError::Value(format!(
                    "clock limit `{t}` must be more than 0 and at most 1h"
                )));
            }
            d
        }
        None => DEFAULT_CLOCK_LIMIT,
    };
    let system = match o.system.or(file.system).as_deref() {
        None | Some("kernel") => SystemClock::Kernel,
        Some("reference") => SystemClock::Reference,
        Some("untrusted") => SystemClock::Untrusted,
        Some(other) => {
            return Err(ConfigError::Value(format!(
                "clock.system `{other}`: expected `kernel`, `reference` or `untrusted`"
            )));
        }
    };
    let mut ptp = file.ptp.map(|p| PtpConfig {
        interface: p.interface,
        domain: p.domain,
    });
    if let Some(iface) = o.ptp_interface {
        match &mut ptp {
            Some(p) => p.interface = iface,
            None => {
                ptp = Some(PtpConfig {
                    interface: iface,
                    domain: 0,
                })
            }
        }
    }
    if let Some(p) = &ptp {
        check_interface_name(&p.interface)?;
        if p.domain > 127 {
            return Err(ConfigError::Value(format!(
                "clock.ptp.domain {} : PTP domains are 0..=127",
                p.domain
            )));
        }
    }
    let ntp_servers = if o.ntp_servers.is_empty() {
        file.ntp_servers
    } else {
        o.ntp_servers
    };
    for s in &ntp_servers {
        check_host_port(s).map_err(|e| ConfigError::Value(format!("ntp server `{s}`: {e}")))?;
    }
    Ok(ClockConfig {
        limit,
        system,
        ptp,
        ntp_servers,
        link: file.link.unwrap_or(true),
    })
}

/// A Linux interface name: 1..=15 bytes, no `/`, no whitespace.
fn check_interface_name(name: &str) -> Result<(), ConfigError> {
    let ok = !name.is_empty()
        && name.len() <= 15
        && name != "."
        && name != ".."
        && !name
            .bytes()
            .any(|b| b == b'/' || b == b':' || b.is_ascii_whitespace() || b == 0);
    if ok {
        Ok(())
    } else {
        Err(ConfigError::Value(format!(
            "ptp interface `{name}` is not a network interface name (1 to 15 characters, no `/`, `:` or spaces)"
        )))
    }
}

/// `HOST[:PORT]` or `[V6]:PORT`, shape only (resolution happens at use).
fn check_host_port(s: &str) -> Result<(), String> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (h, tail) = rest.split_once(']').ok_or("missing `]`")?;
        let port = match tail {
            "" => None,
            t => Some(t.strip_prefix(':').ok_or("expected `:PORT` after `]`")?),
        };
        (h, port)
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => (h, Some(p)),
            Some(_) => return Err("an IPv6 address needs brackets: `[ADDR]:PORT`".into()),
            None => (s, None),
        }
    };
    if host.is_empty() || host.bytes().any(|b| b.is_ascii_whitespace() || b == b'/') {
        return Err("expected HOST[:PORT]".into());
    }
    if let Some(p) = port {
        match p.parse::<u16>() {
            Ok(0) | Err(_) => return Err(format!("port `{p}` must be 1..=65535")),
            Ok(_) => {}
        }
    }
    Ok(())
}
