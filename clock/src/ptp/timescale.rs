//! From PTP time to reference time (UTC, the `CLOCK_REALTIME` scale), and
//! the clock identity of our slave.
//!
//! # Timescale
//! A grandmaster announces either the PTP timescale (TAI, `ptpTimescale`
//! set) or an arbitrary one (ARB). On the PTP timescale, UTC = PTP time −
//! `currentUtcOffset`; we honour the announced offset when
//! `currentUtcOffsetValid` is set and otherwise assume
//! [`DEFAULT_UTC_OFFSET_S`] (37 s since 2017), which is also what ptp4l
//! does with its `utc_offset` default. On an ARB timescale the time is
//! taken as it is sent.
//!
//! linuxptp's ptp4l with software timestamping (`-S`) runs its grandmaster
//! on `CLOCK_REALTIME` (UTC) and does not convert it to TAI: it then
//! announces ARB (`ptpTimescale` clear, ptp4l's `utc_timescale` case), so
//! the time it sends is the system clock's value and comes out here
//! unchanged — reference time equals the grandmaster's `CLOCK_REALTIME`.
//! With hardware timestamping ptp4l's PHC runs on TAI and it announces
//! `ptpTimescale` with the offset, which the rule above turns back into
//! UTC. (The interop test checks the first case end to end.)

use statime::config::TimePropertiesDS;

/// TAI − UTC assumed when a PTP-timescale grandmaster does not mark its
/// offset valid (the value since 2017-01-01; ptp4l's default too).
pub const DEFAULT_UTC_OFFSET_S: i16 = 37;

/// What to subtract from PTP time to get reference (UTC) time, ns.
pub fn utc_correction_ns(tp: &TimePropertiesDS) -> i64 {
    if tp.is_ptp() {
        i64::from(tp.utc_offset().unwrap_or(DEFAULT_UTC_OFFSET_S)) * 1_000_000_000
    } else {
        0
    }
}

/// Our PTP clock identity: the interface's MAC as an EUI-64 (`ff:fe` in the
/// middle, IEEE 1588-2019 7.5.2.2.2), whatever its universal/local bit (a
/// veth's MAC is locally administered — statime-linux 0.4 refuses those and
/// panics); `fallback` (random bytes) when the interface has no MAC or an
/// all-zero one.
pub fn clock_identity(mac: Option<[u8; 6]>, fallback: impl FnOnce() -> [u8; 8]) -> [u8; 8] {
    match mac {
        Some(m) if m.iter().any(|b| *b != 0) => [m[0], m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]],
        _ => {
            let mut id = fallback();
            // Mark it locally assigned, never a (borrowed) vendor EUI.
            id[0] |= 0x02;
            id
        }
    }
}

#[cfg(test)]
mod tests {
    use statime::config::{LeapIndicator, TimeSource};

    use super::*;

    #[test]
    fn arbitrary_timescale_is_taken_as_sent() {
        let tp = TimePropertiesDS::new_arbitrary_time(false, false, TimeSource::InternalOscillator);
        assert_eq!(utc_correction_ns(&tp), 0);
    }

    #[test]
    fn ptp_timescale_subtracts_the_announced_or_default_utc_offset() {
        let tp = TimePropertiesDS::new_ptp_time(
            Some(37),
            LeapIndicator::NoLeap,
            true,
            true,
            TimeSource::Gnss,
        );
        assert_eq!(utc_correction_ns(&tp), 37_000_000_000);
        let tp = TimePropertiesDS::new_ptp_time(
            Some(38),
            LeapIndicator::NoLeap,
            true,
            true,
            TimeSource::Gnss,
        );
        assert_eq!(utc_correction_ns(&tp), 38_000_000_000);
        let tp = TimePropertiesDS::new_ptp_time(
            None,
            LeapIndicator::NoLeap,
            false,
            false,
            TimeSource::Gnss,
        );
        assert_eq!(utc_correction_ns(&tp), 37_000_000_000);
    }

    #[test]
    fn identity_is_eui64_of_the_mac_even_locally_administered() {
        let veth = [0x02, 0x42, 0xac, 0x11, 0x00, 0x02];
        assert_eq!(
            clock_identity(Some(veth), || unreachable!()),
            [0x02, 0x42, 0xac, 0xff, 0xfe, 0x11, 0x00, 0x02]
        );
    }

    #[test]
    fn identity_falls_back_without_a_usable_mac() {
        assert_eq!(
            clock_identity(None, || [0x10, 1, 2, 3, 4, 5, 6, 7])[0],
            0x12
        );
        assert_eq!(
            clock_identity(Some([0; 6]), || [0; 8]),
            [2, 0, 0, 0, 0, 0, 0, 0]
        );
    }
}
