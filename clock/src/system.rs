//! The system clock (`CLOCK_REALTIME`) as a source, as good as the kernel
//! says it is.
//!
//! Where chrony, ptp4l + phc2sys or systemd-timesyncd discipline the system
//! clock, they tell the kernel how well (`adjtimex`: the `STA_UNSYNC` flag,
//! estimated and maximum error — what node_exporter's timex collector
//! reads). The agent reads that instead of claiming zero uncertainty: a
//! clock nobody disciplines reports its maximum error (up to 16 s), which
//! keeps packs that need absolute time out until a real source is locked.

use nix::time::ClockId;

use super::sample::{Sample, SourceKind};
use super::{MonoTime, clock_ns};
use crate::settings::SystemClock;

/// What `adjtimex` says of the system clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelClock {
    /// Someone disciplines it and says it is synchronised.
    pub synced: bool,
    /// Estimated error, ns.
    pub esterror_ns: i64,
    /// Maximum error, ns.
    pub maxerror_ns: i64,
}

/// `STA_UNSYNC`, and the return value `TIME_ERROR`: not synchronised.
const STA_UNSYNC: i32 = 0x0040;
const TIME_ERROR: i32 = 5;
/// The kernel caps `maxerror` here (16 s, `NTP_PHASE_LIMIT`).
const KERNEL_MAX_ERROR_NS: i64 = 16_000_000_000;

/// Read the kernel's clock status (read-only: `modes = 0` needs no
/// privilege), through `baton_sys::timex`.
pub fn kernel_clock() -> std::io::Result<KernelClock> {
    let tx = baton_sys::timex::read()?;
    Ok(KernelClock {
        synced: tx.state != TIME_ERROR && tx.status & STA_UNSYNC == 0,
        esterror_ns: tx.esterror_us.saturating_mul(1000),
        maxerror_ns: tx.maxerror_us.saturating_mul(1000),
    })
}

/// How far a reading of the system clock may be from reference time.
pub fn error_ns(mode: SystemClock, kernel: Option<KernelClock>, bracket_ns: i64) -> i64 {
    let own = match (mode, kernel) {
        (SystemClock::Reference, _) => 0,
        (SystemClock::Untrusted, _) => KERNEL_MAX_ERROR_NS,
        (SystemClock::Kernel, Some(k)) if k.synced => k.esterror_ns.max(0),
        (SystemClock::Kernel, Some(k)) => k.maxerror_ns.clamp(0, KERNEL_MAX_ERROR_NS),
        (SystemClock::Kernel, None) => KERNEL_MAX_ERROR_NS,
    };
    own.saturating_add(bracket_ns.max(1))
}

/// Reads per sample; the one bracketed most tightly wins, so a thread
/// preempted between two reads does not look like a clock step.
const READS: usize = 3;

/// One reading of `realtime − monotonic` at a monotonic instant, and how
/// wide its bracket was.
pub fn read_offset() -> (MonoTime, i64, i64) {
    let mut best = (MonoTime::from_nanos(0), 0, i64::MAX);
    for _ in 0..READS {
        let m0 = clock_ns(ClockId::CLOCK_MONOTONIC);
        let r = clock_ns(ClockId::CLOCK_REALTIME);
        let m1 = clock_ns(ClockId::CLOCK_MONOTONIC);
        let width = (m1 - m0).max(1);
        if width < best.2 {
            let mid = m0 + (m1 - m0) / 2;
            best = (MonoTime::from_nanos(mid), r - mid, width);
        }
    }
    best
}

/// The system clock source: samples on demand, the kernel's status at most
/// once a second (it changes at the disciplining daemon's poll rate).
#[derive(Debug)]
pub struct SystemSource {
    mode: SystemClock,
    kernel: Option<(MonoTime, KernelClock)>,
}

const KERNEL_REREAD_NS: i64 = 1_000_000_000;

impl SystemSource {
    /// For this mode.
    pub fn new(mode: SystemClock) -> Self {
        SystemSource { mode, kernel: None }
    }

    /// A sample now.
    pub fn sample(&mut self) -> Sample {
        let (at, offset_ns, bracket) = read_offset();
        let kernel = match (self.mode, self.kernel) {
            (SystemClock::Reference | SystemClock::Untrusted, _) => None,
            (SystemClock::Kernel, Some((t, k))) if at.nanos_since(t) < KERNEL_REREAD_NS => Some(k),
            (SystemClock::Kernel, _) => match kernel_clock() {
                Ok(k) => {
                    self.kernel = Some((at, k));
                    Some(k)
                }
                Err(e) => {
                    tracing::debug!("adjtimex: {e}");
                    None
                }
            },
        };
        Sample {
            source: SourceKind::System,
            at,
            offset_ns,
            error_ns: error_ns(self.mode, kernel, bracket),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_says_how_good_the_system_clock_is() {
        let synced = KernelClock {
            synced: true,
            esterror_ns: 250_000,
            maxerror_ns: 900_000,
        };
        let unsynced = KernelClock {
            synced: false,
            esterror_ns: 16_000_000_000,
            maxerror_ns: 16_000_000_000,
        };
        assert_eq!(error_ns(SystemClock::Kernel, Some(synced), 100), 250_100);
        assert_eq!(
            error_ns(SystemClock::Kernel, Some(unsynced), 100),
            16_000_000_100
        );
        assert_eq!(error_ns(SystemClock::Kernel, None, 100), 16_000_000_100);
        // By the operator's word: only the reading's own bracket.
        assert_eq!(error_ns(SystemClock::Reference, Some(unsynced), 100), 100);
        assert_eq!(
            error_ns(SystemClock::Untrusted, Some(synced), 100),
            16_000_000_100
        );
    }

    #[test]
    fn adjtimex_reads_without_privilege_and_sanely() {
        let k = kernel_clock().expect("adjtimex(modes=0) works everywhere");
        assert!(k.maxerror_ns >= 0 && k.esterror_ns >= 0, "{k:?}");
        let s = SystemSource::new(SystemClock::Kernel).sample();
        assert_eq!(s.source, SourceKind::System);
        assert!(
            s.error_ns
                >= if k.synced {
                    1
                } else {
                    k.maxerror_ns.min(KERNEL_MAX_ERROR_NS)
                }
        );
    }
}
