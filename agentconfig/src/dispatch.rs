//! The settings of how firings are armed and dispatched: the arming
//! horizon and lead, and the dispatcher's real-time settings (SCHED_FIFO
//! priority, CPU, memory lock, spin budget).

use std::time::Duration;

use super::file::RealtimeFile;
use super::value::duration_or;
use super::{ConfigError, DEFAULT_ARM_HORIZON, DEFAULT_ARM_LEAD};
use baton_dispatch::rt::RtConfig;
use baton_proto::time::parse_duration;

/// The arming horizon and lead, checked: the horizon at most 1 s (what a
/// crash can leave `outcome unknown`), the lead at most the horizon.
pub(super) fn arming(
    horizon: Option<&str>,
    lead: Option<&str>,
) -> Result<(Duration, Duration), ConfigError> {
    let arm_horizon = duration_or("arm-horizon", horizon, DEFAULT_ARM_HORIZON)?;
    if arm_horizon > Duration::from_secs(1) {
        return Err(ConfigError::Value(
            "arm-horizon must be at most 1s: firings armed ahead are the ones a crash can leave `outcome unknown`".into(),
        ));
    }
    let arm_lead = duration_or("arm-lead", lead, DEFAULT_ARM_LEAD.min(arm_horizon / 2))?;
    if arm_lead > arm_horizon {
        return Err(ConfigError::Value(format!(
            "arm-lead ({arm_lead:?}) must be at most arm-horizon ({arm_horizon:?}): a pass arms what is due within the horizon"
        )));
    }
    Ok((arm_horizon, arm_lead))
}

/// The priority is a SCHED_FIFO one (0..=99) and the CPU one this machine
/// has. Checked before the other sections, so that with several mistakes
/// the same one is reported first as always.
pub(super) fn check_realtime(realtime: &RealtimeFile) -> Result<(), ConfigError> {
    let priority = realtime.priority;
    if priority > 99 {
        return Err(ConfigError::Value(format!(
            "realtime.priority must be 0..=99, found {priority}"
        )));
    }
    if let Some(cpu) = realtime.cpu {
        let n = std::thread::available_parallelism().map_or(1, usize::from);
        if cpu >= n {
            return Err(ConfigError::Value(format!(
                "realtime.cpu {cpu}: this machine has CPUs 0..={} only",
                n - 1
            )));
        }
    }
    Ok(())
}

/// The dispatcher's real-time settings from a section [`check_realtime`]
/// accepted, its spin budget parsed; `no_rt` (`--no-rt`) turns off
/// SCHED_FIFO and the memory lock.
pub(super) fn rt_config(realtime: &RealtimeFile, no_rt: bool) -> Result<RtConfig, ConfigError> {
    let spin_budget_ppm = match realtime.spin_budget.as_deref() {
        None => baton_dispatch::rt::DEFAULT_SPIN_BUDGET_PPM,
        Some(t) => parse_share(t).ok_or_else(|| {
            ConfigError::Value(format!(
                "realtime.spin-budget: {t:?} is not a share of a core between 0% and 50% (e.g. 1%)"
            ))
        })?,
    };
    let idle_latency_us = match realtime.idle_latency.as_deref().map(str::trim) {
        None => Some(0),
        Some("off") => None,
        Some(t) => {
            let d = parse_duration(t).map_err(|e| {
                ConfigError::Value(format!(
                    "realtime.idle-latency: {e} (a duration such as 0us or 50us, or off)"
                ))
            })?;
            Some(u32::try_from(d.as_micros()).map_err(|_| {
                ConfigError::Value(format!("realtime.idle-latency: {t:?} is too long"))
            })?)
        }
    };
    let priority = realtime.priority;
    Ok(RtConfig {
        priority: (priority > 0 && !no_rt).then_some(i32::from(priority)),
        cpu: realtime.cpu,
        mlockall: realtime.mlockall && !no_rt,
        spin_budget_ppm,
        // Like SCHED_FIFO, a request only root may make: --no-rt skips it.
        idle_latency_us: idle_latency_us.filter(|_| !no_rt),
    })
}

/// `1%`, `0.5%`: a share of a core in millionths (at most 50 %).
pub(super) fn parse_share(t: &str) -> Option<u32> {
    let v: f64 = t.trim().strip_suffix('%')?.trim().parse().ok()?;
    (0.0..=50.0)
        .contains(&v)
        .then(|| (v * 10_000.0).round() as u32)
}
