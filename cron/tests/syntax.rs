//! Parsing, error reporting, day-level semantics (Vixie rule, `L`, `nL`,
//! `#n`), the year field, exhaustion, and long-run monotonicity.

use baton_cron::{CronError, CronSchedule};
use jiff::Timestamp;
use jiff::tz::TimeZone;

fn ts(s: &str) -> Timestamp {
    s.parse().expect("test timestamp literal")
}

fn parse(expr: &str) -> CronSchedule {
    CronSchedule::parse(expr).unwrap_or_else(|e| panic!("{expr:?} should parse: {e}"))
}

fn parse_err(expr: &str) -> CronError {
    match CronSchedule::parse(expr) {
        Ok(s) => panic!("{expr:?} should not parse, got {s:?}"),
        Err(e) => e,
    }
}

/// Asserts the error's byte range covers exactly `token`, and that the
/// message mentions every string in `says`.
fn assert_err(expr: &str, token: &str, at: usize, says: &[&str]) {
    let e = parse_err(expr);
    assert_eq!(
        (e.offset, &expr[e.offset..e.offset + e.len]),
        (at, token),
        "{expr:?}: {e}"
    );
    for s in says {
        assert!(
            e.message.contains(s),
            "{expr:?}: {:?} lacks {s:?}",
            e.message
        );
    }
}

/// First `n` firings in UTC after `from`, as strings.
fn utc(expr: &str, from: &str, n: usize) -> Vec<String> {
    parse(expr)
        .iter_after(&TimeZone::UTC, ts(from))
        .take(n)
        .map(|t| t.to_string())
        .collect()
}

#[test]
fn macros_expand_to_their_six_field_forms() {
    assert_eq!(parse("@yearly"), parse("0 0 0 1 1 *"));
    assert_eq!(parse("@annually"), parse("0 0 0 1 1 *"));
    assert_eq!(parse("@monthly"), parse("0 0 0 1 * *"));
    assert_eq!(parse("@weekly"), parse("0 0 0 * * 0"));
    assert_eq!(parse("@daily"), parse("0 0 0 * * *"));
    assert_eq!(parse("@midnight"), parse("0 0 0 * * *"));
    assert_eq!(parse("@hourly"), parse("0 0 * * * *"));
    assert_eq!(parse("  @DAILY "), parse("0 0 0 * * *"));
    assert_eq!(
        utc("@weekly", "2026-01-01T00:00:00Z", 2),
        ["2026-01-04T00:00:00Z", "2026-01-11T00:00:00Z"]
    );
    let ny = TimeZone::get("America/New_York").expect("zone");
    assert_eq!(
        parse("@yearly").next_after(&ny, ts("2026-06-01T00:00:00Z")),
        Some(ts("2027-01-01T05:00:00Z"))
    );
}

#[test]
fn every_is_rejected_as_an_interval() {
    assert_err("@every 30s", "@every", 0, &["@every", "interval"]);
    assert_err("  @Every 1h", "@Every", 2, &["interval"]);
    assert_err("@fortnightly", "@fortnightly", 0, &["unknown macro"]);
    assert_err("@daily 5", "5", 7, &["after `@daily`"]);
}

#[test]
fn equivalent_spellings_compile_identically() {
    let same = [
        ("0 0 0 * Jan-Mar Mon-Fri", "0 0 0 * 1-3 1-5"),
        ("0 0 0 * jan,FEB,mAr * ", "0 0 0 * 1,2,3 *"),
        ("0 0 0 * * 7", "0 0 0 * * 0"),
        ("0 0 0 * * sun", "0 0 0 * * 0"),
        ("0 0 0 * * 5-7", "0 0 0 * * 0,5,6"),
        ("0 0 0 * * Fri-7", "0 0 0 * * 0,5,6"),
        ("*/15 * * * * *", "0,15,30,45 * * * * *"),
        ("0 10-20/5 * * * *", "0 10,15,20 * * * *"),
        ("0 50/3 * * * *", "0 50,53,56,59 * * * *"),
        ("0 0 0 * * 0-6/2", "0 0 0 * * 0,2,4,6"),
        ("0 0 0 * * 1/2", "0 0 0 * * 1,3,5"),
        ("0 0 0 ? * *", "0 0 0 * * *"),
        ("0 0 0 * * ?", "0 0 0 * * *"),
        ("0 0 0 * * MON#2", "0 0 0 * * 1#2"),
        ("0 0 0 * * FRIL", "0 0 0 * * 5L"),
        ("0 0 0 * * 7L", "0 0 0 * * 0L"),
        ("0 0 0 l * *", "0 0 0 L * *"),
        ("0 0 * * * * *", "0 0 * * * *"),
        ("0 0 0-23 * * *", "0 0 * * * *"),
        ("0 0 0 1 1 * 1970-2199", "0 0 0 1 1 *"),
        ("0\t0 0 1\n1 *", "0 0 0 1 1 *"),
    ];
    for (a, b) in same {
        assert_eq!(parse(a), parse(b), "{a:?} vs {b:?}");
    }
    // The Vixie flag is part of the schedule: `*` and `1-31` differ.
    assert_ne!(parse("0 0 0 * * Mon"), parse("0 0 0 1-31 * Mon"));
}

#[test]
fn hour_is_wildcard_is_about_the_set_of_hours() {
    for e in ["0 0 * * * *", "0 0 */1 * * *", "0 0 0-23 * * *", "@hourly"] {
        assert!(parse(e).hour_is_wildcard(), "{e}");
    }
    for e in ["0 0 */2 * * *", "0 0 0-22 * * *", "0 0 1 * * *", "@daily"] {
        assert!(!parse(e).hour_is_wildcard(), "{e}");
    }
}

#[test]
fn value_errors_name_field_and_token() {
    assert_err("60 * * * * *", "60", 0, &["second", "`60`", "0-59"]);
    assert_err("0 60 * * * *", "60", 2, &["minute", "0-59"]);
    assert_err("0 0 24 * * *", "24", 4, &["hour", "0-23"]);
    assert_err("0 0 0 0 * *", "0", 6, &["day-of-month", "1-31"]);
    assert_err("0 0 0 32 * *", "32", 6, &["day-of-month"]);
    assert_err("0 0 0 * 13 *", "13", 8, &["month", "1-12"]);
    assert_err("0 0 0 * * 8", "8", 10, &["day-of-week", "0-7"]);
    assert_err("0 0 0 1 1 * 1969", "1969", 12, &["year", "1970-2199"]);
    assert_err("0 0 0 1 1 * 2200", "2200", 12, &["year"]);
    assert_err("0 0 0 * Foo *", "Foo", 8, &["month", "JAN-DEC"]);
    assert_err(
        "0 0 0 * * Funday",
        "Funday",
        10,
        &["day-of-week", "SUN-SAT"],
    );
    assert_err("0 0 Mon * * *", "Mon", 4, &["hour", "invalid value"]);
    assert_err("0 0 0 1 1 * 99999999999", "99999999999", 12, &["year"]);
    assert_err("0 0 -1 * * *", "-1", 4, &["hour", "missing value"]);
}

#[test]
fn structural_errors() {
    assert_err("0 5-2 * * * *", "5-2", 2, &["minute", "reversed"]);
    assert_err(
        "0 0 0 * * Fri-Mon",
        "Fri-Mon",
        10,
        &["day-of-week", "reversed"],
    );
    assert_err("0 0 0 * Dec-Jan *", "Dec-Jan", 8, &["month", "reversed"]);
    assert_err("*/0 * * * * *", "0", 2, &["second", "at least 1"]);
    assert_err("0 1-5/0 * * * *", "0", 6, &["minute", "at least 1"]);
    assert_err("0 */ * * * *", "*/", 2, &["minute", "step"]);
    assert_err("0 */x * * * *", "x", 4, &["minute", "step"]);
    assert_err("0 1,,2 * * * *", ",", 4, &["minute", "empty"]);
    assert_err("0 1, * * * *", ",", 3, &["minute", "empty"]);
    assert_err("0 ,1 * * * *", ",", 2, &["minute", "empty"]);
    assert_err("0 0 ? * * *", "?", 4, &["hour", "`?`"]);
    assert_err("0 0 0 ?,1 * *", "?", 6, &["day-of-month", "alone"]);
    assert_err("0 0 0 1 1 * ?", "?", 12, &["year", "`?`"]);
    assert_err("0 0 0 * L *", "L", 8, &["month", "`L`"]);
    assert_err("0 0 0 * * L", "L", 10, &["day-of-week", "ambiguous"]);
    assert_err("0 0 0 L/2 * *", "L/2", 6, &["day-of-month", "step"]);
    assert_err(
        "0 0 0 15W * *",
        "15W",
        6,
        &["day-of-month", "not supported"],
    );
    assert_err("0 0 0 * * 1#6", "6", 12, &["day-of-week", "1-5"]);
    assert_err("0 0 0 * * 1#0", "0", 12, &["day-of-week", "1-5"]);
    assert_err("0 0 0 * * 8#1", "8", 10, &["day-of-week", "0-7"]);
    assert_err("0 0 0 1#2 * *", "1#2", 6, &["day-of-month", "`#`"]);
    assert_err("0 0 0 * * 1#2/2", "1#2/2", 10, &["day-of-week", "step"]);
    assert_err("0 0 0 * * 9L", "9", 10, &["day-of-week", "0-7"]);
}

#[test]
fn field_count_errors() {
    let e = parse_err("0 0 * * *");
    assert!(
        e.message.contains("found 5") && e.message.contains("seconds"),
        "{e}"
    );
    assert_eq!((e.offset, e.len), (0, 9));
    assert_err("0 0 0 * * * 2026 x y", "x y", 17, &["found 9"]);
    let e = parse_err("");
    assert!(e.message.contains("empty"), "{e}");
    assert_eq!(e.offset, 0);
    assert!(parse_err("   ").message.contains("empty"));
    // Display carries the position.
    assert_eq!(
        parse_err("0 0 24 * * *").to_string(),
        "hour: value `24` out of range 0-23 (at byte 4)"
    );
}

#[test]
fn never_firing_expressions_are_rejected_statically() {
    // Underlines day-of-month through the last field.
    assert_err("0 0 0 30 2 *", "30 2 *", 6, &["never fire", "February"]);
    assert_err("0 0 0 31 4,6,9,11 *", "31 4,6,9,11 *", 6, &["never fire"]);
    assert_err(
        "0 0 0 29 2 * 2027",
        "29 2 * 2027",
        6,
        &["never fire", "year"],
    );
    assert_err("0 0 0 29 2 * 2100", "29 2 * 2100", 6, &["never fire"]);
    // dom `*/31` = {1}, "unrestricted" by Vixie, so ANDed with the fifth
    // Monday, which is never the 1st.
    assert_err("0 0 0 */31 * 1#5", "*/31 * 1#5", 6, &["never fire"]);
    // ... but these can fire.
    parse("0 0 0 29 2 *");
    parse("0 0 0 29 2 * 2028");
    parse("0 0 0 30 2 Mon"); // both restricted: OR, Mondays in February
    parse("0 0 0 ? 2 5#5"); // a fifth Friday in February (leap years)
    parse("0 0 0 1 1 * 1999"); // in the past, but valid
}

#[test]
fn vixie_day_rule() {
    // Both restricted: OR. Jan 2026: the 1st (Thu) and every Monday.
    assert_eq!(
        utc("0 0 0 1 * Mon", "2025-12-31T00:00:00Z", 6),
        [
            "2026-01-01T00:00:00Z",
            "2026-01-05T00:00:00Z",
            "2026-01-12T00:00:00Z",
            "2026-01-19T00:00:00Z",
            "2026-01-26T00:00:00Z",
            "2026-02-01T00:00:00Z"
        ]
    );
    // dom starts with `*`: unrestricted for the rule, so AND (odd Mondays).
    assert_eq!(
        utc("0 0 0 */2 * Mon", "2025-12-31T00:00:00Z", 3),
        [
            "2026-01-05T00:00:00Z",
            "2026-01-19T00:00:00Z",
            "2026-02-09T00:00:00Z"
        ]
    );
    // `?` and `*` are unrestricted: only Mondays.
    for e in ["0 0 0 ? * Mon", "0 0 0 * * Mon"] {
        assert_eq!(
            utc(e, "2025-12-31T00:00:00Z", 2),
            ["2026-01-05T00:00:00Z", "2026-01-12T00:00:00Z"],
            "{e}"
        );
    }
    // `1-31` is restricted: OR with Monday = every day.
    assert_eq!(
        utc("0 0 0 1-31 * Mon", "2025-12-31T00:00:00Z", 3),
        [
            "2026-01-01T00:00:00Z",
            "2026-01-02T00:00:00Z",
            "2026-01-03T00:00:00Z"
        ]
    );
    // dow `*/2` starts with `*`: AND with dom 1..=7 gives Sun/Tue/Thu/Sat.
    assert_eq!(
        utc("0 0 0 1-7 * */2", "2025-12-31T00:00:00Z", 4),
        [
            "2026-01-01T00:00:00Z", // Thu
            "2026-01-03T00:00:00Z", // Sat
            "2026-01-04T00:00:00Z", // Sun
            "2026-01-06T00:00:00Z"  // Tue
        ]
    );
}

#[test]
fn last_day_last_weekday_and_nth_weekday() {
    assert_eq!(
        utc("0 0 0 L * *", "2026-01-01T00:00:00Z", 3),
        [
            "2026-01-31T00:00:00Z",
            "2026-02-28T00:00:00Z",
            "2026-03-31T00:00:00Z"
        ]
    );
    assert_eq!(
        utc("0 0 0 L 2 *", "2027-03-01T00:00:00Z", 2),
        ["2028-02-29T00:00:00Z", "2029-02-28T00:00:00Z"]
    );
    assert_eq!(
        utc("0 0 12 * * 5L", "2026-01-01T00:00:00Z", 3),
        [
            "2026-01-30T12:00:00Z",
            "2026-02-27T12:00:00Z",
            "2026-03-27T12:00:00Z"
        ]
    );
    assert_eq!(
        utc("0 0 9 ? * MON#2", "2026-01-01T00:00:00Z", 3),
        [
            "2026-01-12T09:00:00Z",
            "2026-02-09T09:00:00Z",
            "2026-03-09T09:00:00Z"
        ]
    );
    // Fifth Sunday: only months that have one (2026: Mar, May, Aug, Nov).
    assert_eq!(
        utc("0 0 0 * * 0#5", "2026-01-01T00:00:00Z", 4),
        [
            "2026-03-29T00:00:00Z",
            "2026-05-31T00:00:00Z",
            "2026-08-30T00:00:00Z",
            "2026-11-29T00:00:00Z"
        ]
    );
    // L in a list, and L with the day-of-week restricted (OR).
    assert_eq!(
        utc("0 0 0 15,L * *", "2026-02-01T00:00:00Z", 3),
        [
            "2026-02-15T00:00:00Z",
            "2026-02-28T00:00:00Z",
            "2026-03-15T00:00:00Z"
        ]
    );
    assert_eq!(
        utc("0 0 0 L * 1#1", "2026-02-01T00:00:00Z", 3),
        [
            "2026-02-02T00:00:00Z",
            "2026-02-28T00:00:00Z",
            "2026-03-02T00:00:00Z"
        ]
    );
}

#[test]
fn leap_day_skips_centuries_that_are_not_leap() {
    assert_eq!(
        utc("0 0 0 29 2 *", "2026-01-01T00:00:00Z", 2),
        ["2028-02-29T00:00:00Z", "2032-02-29T00:00:00Z"]
    );
    assert_eq!(
        utc("0 0 0 29 Feb *", "2096-03-01T00:00:00Z", 1),
        ["2104-02-29T00:00:00Z"]
    );
    let ny = TimeZone::get("America/New_York").expect("zone");
    let s = parse("0 0 0 29 2 *");
    let got: Vec<Timestamp> = s
        .iter_after(&ny, ts("2026-01-01T00:00:00Z"))
        .take(3)
        .collect();
    assert_eq!(
        got,
        [
            ts("2028-02-29T05:00:00Z"),
            ts("2032-02-29T05:00:00Z"),
            ts("2036-02-29T05:00:00Z")
        ]
    );
}

#[test]
fn year_field_and_exhaustion() {
    assert_eq!(
        utc("0 0 12 1 1 * 2030-2032", "2026-01-01T00:00:00Z", 5),
        [
            "2030-01-01T12:00:00Z",
            "2031-01-01T12:00:00Z",
            "2032-01-01T12:00:00Z"
        ]
    );
    assert_eq!(
        utc("0 0 0 1 1 * 2030/50", "2026-01-01T00:00:00Z", 9),
        [
            "2030-01-01T00:00:00Z",
            "2080-01-01T00:00:00Z",
            "2130-01-01T00:00:00Z",
            "2180-01-01T00:00:00Z"
        ]
    );
    // A year in the past parses but never fires again.
    let past = parse("0 0 0 1 1 * 2020");
    assert_eq!(
        past.next_after(&TimeZone::UTC, ts("2026-01-01T00:00:00Z")),
        None
    );
    assert_eq!(
        past.next_after(&TimeZone::UTC, ts("2019-06-01T00:00:00Z")),
        Some(ts("2020-01-01T00:00:00Z"))
    );
    // The end of the supported range.
    let every = parse("* * * * * *");
    let mut it = every.iter_after(&TimeZone::UTC, ts("2199-12-31T23:59:57Z"));
    assert_eq!(it.next(), Some(ts("2199-12-31T23:59:58Z")));
    assert_eq!(it.next(), Some(ts("2199-12-31T23:59:59Z")));
    assert_eq!(it.next(), None);
    assert_eq!(it.next(), None, "fused");
    let ny = TimeZone::get("America/New_York").expect("zone");
    // Local 2199-12-31T23:59:59 EST is 2200-01-01T04:59:59Z.
    assert_eq!(
        every.next_after(&ny, ts("2200-01-01T04:59:58Z")),
        Some(ts("2200-01-01T04:59:59Z"))
    );
    assert_eq!(every.next_after(&ny, ts("2200-01-01T04:59:59Z")), None);
    assert_eq!(every.next_after(&ny, Timestamp::MAX), None);
    assert_eq!(
        parse("@yearly").next_after(&ny, ts("2300-01-01T00:00:00Z")),
        None
    );
    // Before the range: the first firing is at its start, local time.
    assert_eq!(
        parse("@daily").next_after(&TimeZone::UTC, Timestamp::MIN),
        Some(ts("1970-01-01T00:00:00Z"))
    );
    assert_eq!(
        parse("@daily").next_after(&ny, ts("1900-01-01T00:00:00Z")),
        Some(ts("1970-01-01T05:00:00Z"))
    );
}

#[test]
fn sub_second_and_negative_after() {
    let every = parse("* * * * * *");
    let tz = TimeZone::UTC;
    assert_eq!(
        every.next_after(&tz, ts("2026-01-01T10:00:00.5Z")),
        Some(ts("2026-01-01T10:00:01Z"))
    );
    assert_eq!(
        every.next_after(&tz, ts("2026-01-01T10:00:00Z")),
        Some(ts("2026-01-01T10:00:01Z"))
    );
    // -0.5 s: the next whole second is the epoch, not 1 s after it.
    assert_eq!(
        every.next_after(&tz, ts("1969-12-31T23:59:59.5Z")),
        Some(ts("1970-01-01T00:00:00Z"))
    );
}

#[test]
fn long_iterations_are_strictly_increasing_and_match_next_after() {
    let zones = [
        "America/New_York",
        "Europe/Berlin",
        "Australia/Lord_Howe",
        "UTC",
    ];
    let exprs = [
        "*/7 * * * * *",
        "0 */13 * * * *",
        "0 30 1,2 * * *",
        "15 45 0-3 * * *",
        "0 0 0 L * *",
        "0 0 2 * * 0#1,0L",
        "0 0 0 29 2 *",
        "@hourly",
    ];
    for zone in zones {
        let tz = TimeZone::get(zone).expect("zone");
        for expr in exprs {
            let s = parse(expr);
            let start = ts("2020-01-01T00:00:00Z");
            let mut prev = start;
            let mut n = 0;
            for t in s.iter_after(&tz, start).take(5_000) {
                assert!(t > prev, "{zone} {expr}: {prev} then {t}");
                // Spot-check the uncached path.
                if n % 97 == 0 {
                    assert_eq!(s.next_after(&tz, prev), Some(t), "{zone} {expr}");
                }
                prev = t;
                n += 1;
            }
            // Either 5000 firings, or the schedule ran to the end of the
            // supported range (the last leap day is 2196-02-29).
            if n < 5_000 {
                assert!(
                    prev > ts("2196-01-01T00:00:00Z"),
                    "{zone} {expr} ended at {prev}"
                );
                assert_eq!(s.next_after(&tz, prev), None);
            }
        }
    }
}
