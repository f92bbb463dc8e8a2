//! Time types shared by both ends.
//!
//! Packs are written on *reference time* (the controller's / grandmaster's
//! clock). Keeping it in its own type stops it being mixed up with the
//! agent's local monotonic clock, which only the clock estimator may convert
//! to and from (docs/design.md, principle 3).

use std::fmt;
use std::ops::{Add, Sub};
use std::time::Duration;

use jiff::Timestamp;

/// An instant on the reference time scale: nanoseconds since the Unix epoch.
///
/// `i64` nanoseconds reach from 1677 to 2262, which covers every pack; the
/// constructors refuse anything outside that range instead of wrapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct RefTime(i64);

impl RefTime {
    /// The earliest representable instant.
    pub const MIN: RefTime = RefTime(i64::MIN);
    /// The latest representable instant.
    pub const MAX: RefTime = RefTime(i64::MAX);

    /// From nanoseconds since the Unix epoch.
    pub const fn from_nanos(ns: i64) -> Self {
        RefTime(ns)
    }

    /// Nanoseconds since the Unix epoch.
    pub const fn as_nanos(self) -> i64 {
        self.0
    }

    /// From a `jiff` timestamp; `None` outside the `i64` nanosecond range.
    pub fn from_timestamp(ts: Timestamp) -> Option<Self> {
        i64::try_from(ts.as_nanosecond()).ok().map(RefTime)
    }

    /// As a `jiff` timestamp (always representable).
    pub fn to_timestamp(self) -> Timestamp {
        Timestamp::from_nanosecond(i128::from(self.0))
            .expect("every i64 nanosecond count is within jiff's range")
    }

    /// `self + d`, saturating at [`RefTime::MAX`].
    pub fn saturating_add(self, d: Duration) -> Self {
        let ns = i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
        RefTime(self.0.saturating_add(ns))
    }

    /// `self - d`, saturating at [`RefTime::MIN`].
    pub fn saturating_sub(self, d: Duration) -> Self {
        let ns = i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
        RefTime(self.0.saturating_sub(ns))
    }

    /// How far `self` is after `earlier` (zero if it is not after).
    pub fn since(self, earlier: RefTime) -> Duration {
        if self.0 <= earlier.0 {
            Duration::ZERO
        } else {
            Duration::from_nanos(self.0.abs_diff(earlier.0))
        }
    }

    /// RFC 3339 in UTC with nanoseconds, e.g. `2026-12-01T10:00:00.000000000Z`.
    pub fn to_rfc3339(self) -> String {
        format!("{:.9}", self.to_timestamp())
    }
}

impl Add<Duration> for RefTime {
    type Output = RefTime;
    fn add(self, d: Duration) -> RefTime {
        self.saturating_add(d)
    }
}

impl Sub<Duration> for RefTime {
    type Output = RefTime;
    fn sub(self, d: Duration) -> RefTime {
        self.saturating_sub(d)
    }
}

impl fmt::Display for RefTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_rfc3339())
    }
}

/// An RFC 3339 instant given on a command line as `flag`; the error names
/// the flag and shows the expected form.
pub fn parse_instant_arg(flag: &str, text: &str) -> Result<RefTime, String> {
    match text.parse::<Timestamp>() {
        Ok(ts) => RefTime::from_timestamp(ts).ok_or_else(|| {
            format!(
                "{flag} `{text}` is outside the supported range of instants: {} to {}",
                RefTime::MIN,
                RefTime::MAX
            )
        }),
        Err(_) => Err(format!(
            "{flag} `{text}` is not an RFC 3339 instant (e.g. 2026-12-01T10:00:00Z)"
        )),
    }
}

/// Why a duration literal was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// Nothing to parse.
    #[error("empty duration: write e.g. `250us`, `20ms`, `2s`, `1m30s`, `24h`")]
    Empty,
    /// A number without a unit, or an unknown unit.
    #[error(
        "invalid duration `{0}`: write a number with a unit (ns, us, ms, s, m, h, d), e.g. `250us`, `1m30s`"
    )]
    Syntax(String),
    /// Units must go from largest to smallest, each at most once.
    #[error("invalid duration `{0}`: units must appear once each, largest first (e.g. `1h30m`)")]
    Order(String),
    /// Too large to represent.
    #[error("duration `{0}` is too large")]
    Overflow(String),
}

/// Parse a duration such as `250us`, `20ms`, `2s`, `1m30s`, `24h`, `1d`.
///
/// Hand-written because the crates we looked at either accept a different
/// grammar (`humantime` takes spaces and month/year units whose length
/// varies) or lose nanoseconds; ours is exact integer arithmetic.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    const UNITS: [(&str, u128); 7] = [
        ("d", 86_400_000_000_000),
        ("h", 3_600_000_000_000),
        ("m", 60_000_000_000),
        ("s", 1_000_000_000),
        ("ms", 1_000_000),
        ("us", 1_000),
        ("ns", 1),
    ];
    let s = text.trim();
    if s.is_empty() {
        return Err(DurationError::Empty);
    }
    let mut rest = s;
    let mut total: u128 = 0;
    let mut last_unit = None::<usize>;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(DurationError::Syntax(text.into()));
        }
        let (num, after) = rest.split_at(digits);
        let unit_len = after.bytes().take_while(u8::is_ascii_alphabetic).count();
        let (unit, after) = after.split_at(unit_len);
        // `µs` is common enough to accept as `us`.
        let (unit, after) = if unit.is_empty() && after.starts_with("µs") {
            ("us", &after["µs".len()..])
        } else {
            (unit, after)
        };
        let Some(idx) = UNITS.iter().position(|(u, _)| *u == unit) else {
            return Err(DurationError::Syntax(text.into()));
        };
        if last_unit.is_some_and(|l| idx <= l) {
            return Err(DurationError::Order(text.into()));
        }
        last_unit = Some(idx);
        let n: u128 = num
            .parse()
            .map_err(|_| DurationError::Overflow(text.into()))?;
        total = n
            .checked_mul(UNITS[idx].1)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(|| DurationError::Overflow(text.into()))?;
        rest = after;
    }
    // Keep durations within what RefTime arithmetic can add.
    if total > i64::MAX as u128 {
        return Err(DurationError::Overflow(text.into()));
    }
    Ok(Duration::from_nanos(total as u64))
}

/// Format a duration the way packs write them (`1m30s`, `250us`, `0s`).
pub fn format_duration(d: Duration) -> String {
    let mut ns = d.as_nanos();
    if ns == 0 {
        return "0s".into();
    }
    let mut out = String::new();
    for (unit, size) in [
        ("h", 3_600_000_000_000u128),
        ("m", 60_000_000_000),
        ("s", 1_000_000_000),
        ("ms", 1_000_000),
        ("us", 1_000),
        ("ns", 1),
    ] {
        if ns >= size {
            out.push_str(&format!("{}{unit}", ns / size));
            ns %= size;
        }
    }
    out
}

/// A signed duration in ns as people read it in logs and terminal views
/// (`850ns`, `-12.5us`, `3.2ms`, `16.0s`): one spelling for the agent's
/// clock, exec and runtime.
pub fn fmt_ns(ns: i64) -> String {
    let a = ns.unsigned_abs();
    let s = if a < 10_000 {
        format!("{a}ns")
    } else if a < 10_000_000 {
        format!("{:.1}us", a as f64 / 1e3)
    } else if a < 10_000_000_000 {
        format!("{:.1}ms", a as f64 / 1e6)
    } else {
        format!("{:.1}s", a as f64 / 1e9)
    };
    if ns < 0 { format!("-{s}") } else { s }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        let ok = [
            ("250us", 250_000),
            ("250µs", 250_000),
            ("20ms", 20_000_000),
            ("2s", 2_000_000_000),
            ("1m30s", 90_000_000_000),
            ("24h", 86_400_000_000_000),
            ("1d", 86_400_000_000_000),
            ("1h1ns", 3_600_000_000_001),
            ("0s", 0),
        ];
        for (text, ns) in ok {
            assert_eq!(parse_duration(text), Ok(Duration::from_nanos(ns)), "{text}");
        }
    }

    #[test]
    fn bad_durations_are_refused() {
        assert_eq!(parse_duration(""), Err(DurationError::Empty));
        for bad in ["10", "ms", "1.5s", "1 s", "5x", "-1s", "1s1"] {
            assert!(
                matches!(parse_duration(bad), Err(DurationError::Syntax(_))),
                "{bad}"
            );
        }
        for bad in ["30s1m", "1s1s"] {
            assert!(
                matches!(parse_duration(bad), Err(DurationError::Order(_))),
                "{bad}"
            );
        }
        assert!(matches!(
            parse_duration("99999999999999999999999d"),
            Err(DurationError::Overflow(_))
        ));
        assert!(matches!(
            parse_duration("300000d"),
            Err(DurationError::Overflow(_))
        ));
    }

    #[test]
    fn format_round_trips() {
        for text in ["1m30s", "250us", "24h", "1h1ns", "0s", "500ms"] {
            let d = parse_duration(text).expect("valid");
            assert_eq!(parse_duration(&format_duration(d)), Ok(d));
        }
        assert_eq!(format_duration(Duration::from_millis(90_000)), "1m30s");
    }

    #[test]
    fn instant_args_name_the_range() {
        let e = parse_instant_arg("--from", "2300-01-01T00:00:00Z").expect_err("range");
        assert!(
            e.contains("outside the supported range of instants: 1677-09-21"),
            "{e}"
        );
        let e = parse_instant_arg("--from", "soon").expect_err("syntax");
        assert!(e.contains("is not an RFC 3339 instant"), "{e}");
    }

    #[test]
    fn reftime_formats_with_nanoseconds() {
        let t = RefTime::from_nanos(1_796_119_200_000_000_001);
        assert_eq!(t.to_rfc3339(), "2026-12-01T10:00:00.000000001Z");
        assert_eq!(RefTime::from_timestamp(t.to_timestamp()), Some(t));
    }
}
