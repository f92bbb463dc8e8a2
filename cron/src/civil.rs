//! Proleptic Gregorian calendar arithmetic on plain integers.
//!
//! The civil search runs once per firing, so it must not call into jiff:
//! these are Howard Hinnant's branch-light `days_from_civil` /
//! `civil_from_days` algorithms, exact for every year in the range we use.
//! "Local seconds" are seconds since 1970-01-01T00:00:00 *local civil
//! time* — a count of wall-clock seconds, not an instant.

/// Seconds in a civil day (civil days ignore leap seconds, as jiff does).
pub(crate) const SECS_PER_DAY: i64 = 86_400;

/// True for Gregorian leap years.
pub(crate) const fn is_leap(year: i32) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

/// Number of days in `month` (1..=12) of `year`.
pub(crate) const fn days_in_month(year: i32, month: u32) -> u32 {
    match month {
        2 => {
            if is_leap(year) {
                29
            } else {
                28
            }
        }
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of the civil date `year-month-day`.
pub(crate) const fn days_from_civil(year: i32, month: u32, day: u32) -> i64 {
    let y = year as i64 - if month <= 2 { 1 } else { 0 };
    let era = y.div_euclid(400);
    let yoe = y - era * 400; // [0, 399]
    let mp = if month > 2 { month - 3 } else { month + 9 } as i64; // March = 0
    let doy = (153 * mp + 2) / 5 + day as i64 - 1; // [0, 365]
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy; // [0, 146096]
    era * 146_097 + doe - 719_468
}

/// Inverse of [`days_from_civil`]: `(year, month, day)`.
pub(crate) const fn civil_from_days(days: i64) -> (i32, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097; // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11], March = 0
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = (yoe + era * 400 + if month <= 2 { 1 } else { 0 }) as i32;
    (year, month, day)
}

/// Day of week of a day count, 0 = Sunday (1970-01-01 was a Thursday).
pub(crate) const fn weekday(days: i64) -> u32 {
    (days + 4).rem_euclid(7) as u32
}

/// A broken-down local civil time. Fields are kept as `u32` so the search
/// can push one past its range (hour 24, day 32, month 13) and let the next
/// bitset scan fail and carry into the field above.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Civil {
    pub(crate) year: i32,
    pub(crate) month: u32,
    pub(crate) day: u32,
    pub(crate) hour: u32,
    pub(crate) minute: u32,
    pub(crate) second: u32,
}

impl Civil {
    /// Breaks local seconds into civil fields.
    pub(crate) const fn from_local_seconds(secs: i64) -> Civil {
        let days = secs.div_euclid(SECS_PER_DAY);
        let sod = secs.rem_euclid(SECS_PER_DAY) as u32;
        let (year, month, day) = civil_from_days(days);
        Civil {
            year,
            month,
            day,
            hour: sod / 3600,
            minute: sod / 60 % 60,
            second: sod % 60,
        }
    }

    /// Local seconds of a *valid* civil time.
    pub(crate) const fn to_local_seconds(self) -> i64 {
        days_from_civil(self.year, self.month, self.day) * SECS_PER_DAY
            + (self.hour * 3600 + self.minute * 60 + self.second) as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_day_1900_to_2400() {
        let start = days_from_civil(1900, 1, 1);
        let end = days_from_civil(2400, 12, 31);
        let mut expect = (1900, 1, 1);
        for days in start..=end {
            let got = civil_from_days(days);
            assert_eq!(got, expect, "day {days}");
            assert_eq!(days_from_civil(got.0, got.1, got.2), days);
            // Advance the expected date by hand.
            let (y, m, d) = expect;
            expect = if d < days_in_month(y, m) {
                (y, m, d + 1)
            } else if m < 12 {
                (y, m + 1, 1)
            } else {
                (y + 1, 1, 1)
            };
        }
    }

    #[test]
    fn known_dates() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(weekday(0), 4); // Thursday
        assert_eq!(weekday(days_from_civil(2026, 3, 8)), 0); // a Sunday
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert!(is_leap(2000) && !is_leap(2100) && is_leap(2024) && !is_leap(2026));
        let c = Civil::from_local_seconds(1_772_936_100); // 2026-03-08T02:15:00
        assert_eq!(
            c,
            Civil {
                year: 2026,
                month: 3,
                day: 8,
                hour: 2,
                minute: 15,
                second: 0
            }
        );
        assert_eq!(c.to_local_seconds(), 1_772_936_100);
    }
}
