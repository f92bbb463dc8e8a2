//! How the agent learns reference time, as its configuration says: here,
//! with the clock, so the clock's sources read their settings without
//! importing the agent's whole configuration (which parses them).

use std::time::Duration;

/// How the agent learns reference time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClockConfig {
    /// Admission limit: packs that need absolute time are refused while the
    /// uncertainty exceeds it.
    pub limit: Duration,
    /// What the system clock is.
    pub system: SystemClock,
    /// PTP slave, if configured.
    pub ptp: Option<PtpConfig>,
    /// NTP servers (`HOST[:PORT]`, checked for shape).
    pub ntp_servers: Vec<String>,
    /// Time exchange over the controller link.
    pub link: bool,
}

/// Default [`ClockConfig::limit`] (docs/design.md principle 3).
pub const DEFAULT_CLOCK_LIMIT: Duration = Duration::from_millis(10);

impl Default for ClockConfig {
    fn default() -> Self {
        ClockConfig {
            limit: DEFAULT_CLOCK_LIMIT,
            system: SystemClock::Kernel,
            ptp: None,
            ntp_servers: Vec::new(),
            link: true,
        }
    }
}

/// What the system clock (`CLOCK_REALTIME`) is worth as a source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SystemClock {
    /// As good as the kernel says (`adjtimex`).
    Kernel,
    /// Reference time by the operator's word.
    Reference,
    /// Never a source, whatever the kernel says: only PTP, NTP or the link
    /// count (a box whose clock another tenant sets; tests that must see
    /// the agent sync).
    Untrusted,
}

/// The PTP slave's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PtpConfig {
    /// Interface.
    pub interface: String,
    /// Domain.
    pub domain: u8,
}
