//! The clock statime steers by default: a virtual clock over
//! `CLOCK_MONOTONIC`, so PTP never touches the system clock and needs no
//! `CAP_SYS_TIME`.
//!
//! `virtual(m) = base_virt + (m − base_mono) · (1 + ppm·10⁻⁶)`. A step adds
//! to `base_virt`; a frequency change first re-bases the mapping at the
//! current instant, so the virtual time is continuous across it. The maths
//! ([`VirtualClock`]) takes the monotonic instant as an argument and is
//! tested on simulated values; [`MonoVirtualClock`] is the thin adapter
//! that reads the real monotonic clock for statime.
//!
//! Times are kept in statime's own fixed point (2⁻³² ns units), so a step
//! or a frequency from the servo is applied without rounding.

use std::cell::RefCell;
use std::rc::Rc;

use statime::Clock;
use statime::config::TimePropertiesDS;
use statime::time::{Duration, Time};

use crate::mono_now;

/// Fractional bits of statime's fixed-point nanoseconds.
const FRAC_BITS: u32 = 32;
const ONE_NS: i128 = 1 << FRAC_BITS;

/// The virtual clock's mapping from monotonic nanoseconds to virtual time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct VirtualClock {
    /// Monotonic instant of the last re-base, ns.
    base_mono: i64,
    /// Virtual time at `base_mono`, 2⁻³² ns.
    base_virt: i128,
    /// Frequency correction, parts per million.
    ppm: f64,
    /// Monotonic instant of the last step, ns.
    last_step: Option<i64>,
}

impl VirtualClock {
    /// A clock reading `virt_ns` at monotonic `mono_ns`, at nominal rate.
    pub fn new(mono_ns: i64, virt_ns: i64) -> Self {
        VirtualClock {
            base_mono: mono_ns,
            base_virt: i128::from(virt_ns) * ONE_NS,
            ppm: 0.0,
            last_step: None,
        }
    }

    /// Virtual time at monotonic `mono_ns`, 2⁻³² ns.
    pub fn at_fixed(&self, mono_ns: i64) -> i128 {
        let dt = i128::from(mono_ns) - i128::from(self.base_mono);
        // The correction is small (≤ max_freq_offset ppm of dt): an f64 keeps
        // it to well under a nanosecond for any realistic dt.
        let corr = (dt as f64 * self.ppm * 1e-6 * ONE_NS as f64).round() as i128;
        self.base_virt + dt * ONE_NS + corr
    }

    /// Virtual time at monotonic `mono_ns`, whole ns (rounded).
    pub fn at_ns(&self, mono_ns: i64) -> i128 {
        round_fixed(self.at_fixed(mono_ns))
    }

    /// `virtual − monotonic` at `mono_ns`, ns.
    pub fn offset_ns(&self, mono_ns: i64) -> i128 {
        self.at_ns(mono_ns) - i128::from(mono_ns)
    }

    /// The frequency correction in effect, ppm.
    pub fn ppm(&self) -> f64 {
        self.ppm
    }

    /// Re-base the mapping at `mono_ns` (virtual time unchanged there).
    fn rebase(&mut self, mono_ns: i64) {
        self.base_virt = self.at_fixed(mono_ns);
        self.base_mono = mono_ns;
    }

    /// Move the virtual time by `offset` (2⁻³² ns) at `mono_ns`.
    pub fn step(&mut self, mono_ns: i64, offset: i128) {
        self.rebase(mono_ns);
        self.base_virt += offset;
        self.last_step = Some(mono_ns);
    }

    /// Monotonic instant of the last step, ns.
    pub fn last_step(&self) -> Option<i64> {
        self.last_step
    }

    /// Run at `1 + ppm·10⁻⁶` of the monotonic rate from `mono_ns` on. Like
    /// statime's clocks, `ppm` is absolute (relative to the base rate), not
    /// an increment.
    pub fn set_frequency(&mut self, mono_ns: i64, ppm: f64) {
        self.rebase(mono_ns);
        self.ppm = ppm;
    }

    /// The monotonic instant at which the clock reads `virt` (2⁻³² ns), ns;
    /// the inverse of [`VirtualClock::at_fixed`] to within a nanosecond.
    pub fn mono_of(&self, virt: i128) -> i64 {
        let dv = (virt - self.base_virt) as f64 / ONE_NS as f64;
        let dt = dv / (1.0 + self.ppm * 1e-6);
        self.base_mono + dt.round() as i64
    }
}

/// Nearest whole nanosecond of a fixed-point value.
fn round_fixed(v: i128) -> i128 {
    (v + ONE_NS / 2) >> FRAC_BITS
}

/// statime `Time` from fixed-point ns; virtual time before 1970 is a broken
/// clock, clamped to 0.
pub fn time_from_fixed(v: i128) -> Time {
    let bits = v.max(0) as u128;
    Time::from_nanos_subnanos((bits >> FRAC_BITS) as u64, bits as u32)
}

/// Fixed-point ns of a statime `Time`.
pub fn fixed_from_time(t: Time) -> i128 {
    t.nanos().to_bits() as i128
}

/// Fixed-point ns of a statime `Duration`.
pub fn fixed_from_duration(d: Duration) -> i128 {
    d.nanos().to_bits()
}

/// The virtual clock statime owns, shared with the shell (which converts
/// packet timestamps and emits samples from the same mapping). One thread
/// only: the PTP thread.
#[derive(Clone, Debug)]
pub struct MonoVirtualClock(pub Rc<RefCell<VirtualClock>>);

impl Clock for MonoVirtualClock {
    /// A virtual clock cannot fail.
    type Error = std::convert::Infallible;

    fn now(&self) -> Time {
        time_from_fixed(self.0.borrow().at_fixed(mono_now().as_nanos()))
    }

    fn step_clock(&mut self, offset: Duration) -> Result<Time, Self::Error> {
        let m = mono_now().as_nanos();
        let mut c = self.0.borrow_mut();
        c.step(m, fixed_from_duration(offset));
        Ok(time_from_fixed(c.at_fixed(m)))
    }

    fn set_frequency(&mut self, ppm: f64) -> Result<Time, Self::Error> {
        let m = mono_now().as_nanos();
        let mut c = self.0.borrow_mut();
        c.set_frequency(m, ppm);
        Ok(time_from_fixed(c.at_fixed(m)))
    }

    /// Timescale properties are applied where samples are made (the UTC
    /// offset, see `timescale`), not to the clock.
    fn set_properties(&mut self, _: &TimePropertiesDS) -> Result<(), Self::Error> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000_000;

    #[test]
    fn a_fresh_clock_follows_monotonic_one_to_one() {
        let c = VirtualClock::new(5 * S, 1_700_000_000 * S);
        assert_eq!(c.at_ns(5 * S), i128::from(1_700_000_000 * S));
        assert_eq!(c.at_ns(7 * S), i128::from(1_700_000_002 * S));
        assert_eq!(c.offset_ns(7 * S), i128::from(1_700_000_000 * S - 5 * S));
    }

    #[test]
    fn a_step_moves_the_mapping_and_nothing_else() {
        let mut c = VirtualClock::new(0, 1000 * S);
        c.set_frequency(0, 10.0);
        let before = c.at_ns(3 * S);
        c.step(3 * S, -250 * ONE_NS);
        assert_eq!(c.at_ns(3 * S), before - 250);
        assert_eq!(c.last_step(), Some(3 * S));
        // The frequency survives the step: +10 ppm over the next second.
        assert_eq!(c.at_ns(4 * S) - c.at_ns(3 * S), i128::from(S) + 10_000);
        // Sub-nanosecond steps are kept, not rounded away.
        let f = c.at_fixed(4 * S);
        c.step(4 * S, ONE_NS / 4);
        assert_eq!(c.at_fixed(4 * S), f + ONE_NS / 4);
    }

    #[test]
    fn frequency_scales_elapsed_time_from_the_change_on() {
        let mut c = VirtualClock::new(0, 0);
        c.set_frequency(10 * S, 100.0);
        // Continuous at the change.
        assert_eq!(c.at_ns(10 * S), i128::from(10 * S));
        // +100 ppm: 100 µs per second after it.
        assert_eq!(c.at_ns(20 * S), i128::from(20 * S) + 1_000_000);
        // Absolute, not cumulative: back to 0 ppm stops the drift.
        c.set_frequency(20 * S, 0.0);
        assert_eq!(c.at_ns(30 * S), i128::from(30 * S) + 1_000_000);
        // Negative frequency slows it.
        c.set_frequency(30 * S, -50.0);
        assert_eq!(c.at_ns(40 * S), i128::from(40 * S) + 1_000_000 - 500_000);
        assert_eq!(c.ppm(), -50.0);
    }

    #[test]
    fn the_mapping_is_monotonic_and_invertible() {
        let mut c = VirtualClock::new(123, 1_700_000_000 * S);
        c.set_frequency(123, -399.0);
        let mut last = c.at_fixed(123);
        for k in 1..1000 {
            let m = 123 + k * 7_777_777;
            let v = c.at_fixed(m);
            assert!(v > last, "virtual time must increase with monotonic time");
            last = v;
            assert!((c.mono_of(v) - m).abs() <= 1, "inverse off at {m}");
        }
    }

    #[test]
    fn statime_time_round_trips_through_fixed_point() {
        let v = i128::from(1_700_000_000 * S) * ONE_NS + 12345;
        assert_eq!(fixed_from_time(time_from_fixed(v)), v);
        let d = Duration::from_nanos(-1500);
        assert_eq!(fixed_from_duration(d), -1500 * ONE_NS);
        assert_eq!(time_from_fixed(-5), Time::from_nanos(0));
    }

    #[test]
    fn the_statime_clock_adapter_steps_and_steers_the_shared_mapping() {
        let shared = Rc::new(RefCell::new(VirtualClock::new(
            mono_now().as_nanos(),
            1_000 * S,
        )));
        let mut clock = MonoVirtualClock(shared.clone());
        let t0 = fixed_from_time(clock.now());
        let Ok(t1) = clock.step_clock(Duration::from_secs(5));
        let t1 = fixed_from_time(t1);
        assert!(t1 - t0 >= 5 * i128::from(S) * ONE_NS);
        assert!(t1 - t0 < (5 * i128::from(S) + 50_000_000) * ONE_NS);
        let Ok(_) = clock.set_frequency(12.5);
        assert_eq!(shared.borrow().ppm(), 12.5);
    }
}
