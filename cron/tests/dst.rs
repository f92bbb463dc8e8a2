//! Explicit DST-day tests: the contract's examples, checked instant by
//! instant in the zones baton cares about (tzdb dates verified below).

use baton_cron::CronSchedule;
use jiff::Timestamp;
use jiff::tz::{Offset, TimeZone};

fn ts(s: &str) -> Timestamp {
    s.parse().expect("test timestamp literal")
}

fn zone(name: &str) -> TimeZone {
    TimeZone::get(name).expect("zone in bundled tzdb")
}

/// Firings of `expr` in `name` within `(from, to]`, as RFC 3339 UTC
/// strings. Also checks that `next_after` agrees with the iterator at
/// every step (the uncached path against the cached one).
fn fires(expr: &str, name: &str, from: &str, to: &str) -> Vec<String> {
    let tz = zone(name);
    let s = CronSchedule::parse(expr).expect("valid expression");
    let (from, to) = (ts(from), ts(to));
    let mut out = Vec::new();
    let mut prev = from;
    for t in s.iter_after(&tz, from) {
        assert!(t > prev, "{expr}: not strictly increasing: {prev} then {t}");
        assert_eq!(
            s.next_after(&tz, prev),
            Some(t),
            "{expr}: next_after({prev})"
        );
        if t > to {
            break;
        }
        out.push(t.to_string());
        prev = t;
    }
    out
}

#[test]
fn tzdb_transition_dates_are_what_the_tests_assume() {
    let cases = [
        (
            "America/New_York",
            "2026-03-08T07:00:00Z",
            -5 * 3600,
            -4 * 3600,
        ),
        (
            "America/New_York",
            "2026-11-01T06:00:00Z",
            -4 * 3600,
            -5 * 3600,
        ),
        ("Europe/Berlin", "2026-03-29T01:00:00Z", 3600, 2 * 3600),
        ("Europe/Berlin", "2026-10-25T01:00:00Z", 2 * 3600, 3600),
        (
            "Australia/Lord_Howe",
            "2026-04-04T15:00:00Z",
            11 * 3600,
            37_800,
        ),
        (
            "Australia/Lord_Howe",
            "2026-10-03T15:30:00Z",
            37_800,
            11 * 3600,
        ),
    ];
    for (name, at, before, after) in cases {
        let tz = zone(name);
        let at = ts(at);
        let tr = tz
            .following(at - jiff::SignedDuration::from_secs(1))
            .next()
            .expect("a transition");
        assert_eq!(tr.timestamp(), at, "{name}");
        let off = |s: i32| Offset::from_seconds(s).expect("valid offset");
        assert_eq!(
            tz.to_offset(at - jiff::SignedDuration::from_secs(1)),
            off(before)
        );
        assert_eq!(tz.to_offset(at), off(after), "{name}");
    }
}

// ---- America/New_York, spring forward 2026-03-08: 02:00 EST -> 03:00 EDT.

#[test]
fn ny_spring_gap_time_fires_once_at_old_offset() {
    assert_eq!(
        fires(
            "0 15 2 * * *",
            "America/New_York",
            "2026-03-07T12:00:00Z",
            "2026-03-09T12:00:00Z"
        ),
        ["2026-03-08T07:15:00Z", "2026-03-09T06:15:00Z"]
    );
    assert_eq!(
        fires(
            "0 30 2 * * *",
            "America/New_York",
            "2026-03-08T00:00:00Z",
            "2026-03-08T23:00:00Z"
        ),
        ["2026-03-08T07:30:00Z"]
    );
}

#[test]
fn ny_spring_gap_and_its_image_collapse_to_one_firing() {
    // 02:30 (gap) and 03:30 EDT are the same instant: one firing.
    assert_eq!(
        fires(
            "0 30 2,3 * * *",
            "America/New_York",
            "2026-03-08T00:00:00Z",
            "2026-03-08T23:00:00Z"
        ),
        ["2026-03-08T07:30:00Z"]
    );
    // Every hour at :15 — 02:15 (gap) and 03:15 both map to 07:15Z.
    assert_eq!(
        fires(
            "0 15 * * * *",
            "America/New_York",
            "2026-03-08T05:00:00Z",
            "2026-03-08T09:00:00Z"
        ),
        [
            "2026-03-08T05:15:00Z",
            "2026-03-08T06:15:00Z",
            "2026-03-08T07:15:00Z",
            "2026-03-08T08:15:00Z"
        ]
    );
}

#[test]
fn ny_spring_every_quarter_hour_across_the_gap() {
    assert_eq!(
        fires(
            "0 */15 * * * *",
            "America/New_York",
            "2026-03-08T06:00:00Z",
            "2026-03-08T08:00:00Z"
        ),
        [
            "2026-03-08T06:15:00Z", // 01:15 EST
            "2026-03-08T06:30:00Z",
            "2026-03-08T06:45:00Z",
            "2026-03-08T07:00:00Z", // 02:00 (gap) == 03:00 EDT
            "2026-03-08T07:15:00Z",
            "2026-03-08T07:30:00Z",
            "2026-03-08T07:45:00Z",
            "2026-03-08T08:00:00Z", // 04:00 EDT
        ]
    );
}

#[test]
fn ny_spring_times_next_to_the_gap_are_untouched() {
    assert_eq!(
        fires(
            "59 59 1 * * *",
            "America/New_York",
            "2026-03-08T00:00:00Z",
            "2026-03-08T23:00:00Z"
        ),
        ["2026-03-08T06:59:59Z"]
    );
    assert_eq!(
        fires(
            "0 0 3 * * *",
            "America/New_York",
            "2026-03-08T00:00:00Z",
            "2026-03-08T23:00:00Z"
        ),
        ["2026-03-08T07:00:00Z"]
    );
}

#[test]
fn ny_spring_query_inside_the_gap_image() {
    // After 07:10Z (03:10 EDT): 02:15's image at 07:15Z is still ahead.
    let tz = zone("America/New_York");
    let s = CronSchedule::parse("0 15 2 * * *").expect("valid");
    assert_eq!(
        s.next_after(&tz, ts("2026-03-08T07:10:00Z")),
        Some(ts("2026-03-08T07:15:00Z"))
    );
    assert_eq!(
        s.next_after(&tz, ts("2026-03-08T07:15:00Z")),
        Some(ts("2026-03-09T06:15:00Z"))
    );
}

// ---- America/New_York, fall back 2026-11-01: 02:00 EDT -> 01:00 EST.

#[test]
fn ny_fall_pinned_hour_fires_once_on_first_pass() {
    assert_eq!(
        fires(
            "0 30 1 * * *",
            "America/New_York",
            "2026-10-31T12:00:00Z",
            "2026-11-02T12:00:00Z"
        ),
        ["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"]
    );
    assert_eq!(
        fires(
            "0 0 1 * * *",
            "America/New_York",
            "2026-11-01T00:00:00Z",
            "2026-11-01T23:00:00Z"
        ),
        ["2026-11-01T05:00:00Z"]
    );
    // Not every hour: 01:30 once (EDT), 02:30 EST.
    assert_eq!(
        fires(
            "0 30 1-2 * * *",
            "America/New_York",
            "2026-11-01T00:00:00Z",
            "2026-11-01T23:00:00Z"
        ),
        ["2026-11-01T05:30:00Z", "2026-11-01T07:30:00Z"]
    );
}

#[test]
fn ny_fall_wildcard_hour_fires_in_both_passes() {
    let want = [
        "2026-11-01T04:30:00Z", // 00:30 EDT
        "2026-11-01T05:30:00Z", // 01:30 EDT
        "2026-11-01T06:30:00Z", // 01:30 EST
        "2026-11-01T07:30:00Z", // 02:30 EST
    ];
    for expr in ["0 30 * * * *", "0 30 0-23 * * *", "0 30 */1 * * *"] {
        assert_eq!(
            fires(
                expr,
                "America/New_York",
                "2026-11-01T04:00:00Z",
                "2026-11-01T08:00:00Z"
            ),
            want,
            "{expr}"
        );
    }
    assert_eq!(
        fires(
            "@hourly",
            "America/New_York",
            "2026-11-01T04:00:00Z",
            "2026-11-01T08:00:00Z"
        ),
        [
            "2026-11-01T05:00:00Z",
            "2026-11-01T06:00:00Z",
            "2026-11-01T07:00:00Z",
            "2026-11-01T08:00:00Z"
        ]
    );
}

#[test]
fn ny_fall_queries_from_inside_the_repeated_hour() {
    let tz = zone("America/New_York");
    let pinned = CronSchedule::parse("0 50 1 * * *").expect("valid");
    let every = CronSchedule::parse("0 50 * * * *").expect("valid");
    // 01:45 EDT (first pass): 01:50 EDT is ahead.
    assert_eq!(
        pinned.next_after(&tz, ts("2026-11-01T05:45:00Z")),
        Some(ts("2026-11-01T05:50:00Z"))
    );
    // 01:10 EST (second pass): 01:50 already fired on the first pass.
    assert_eq!(
        pinned.next_after(&tz, ts("2026-11-01T06:10:00Z")),
        Some(ts("2026-11-02T06:50:00Z"))
    );
    // A wildcard hour still has the second 01:50 ahead.
    assert_eq!(
        every.next_after(&tz, ts("2026-11-01T06:10:00Z")),
        Some(ts("2026-11-01T06:50:00Z"))
    );
    // From just after the first-pass 01:50, the wildcard fires at 01:50 EST.
    assert_eq!(
        every.next_after(&tz, ts("2026-11-01T05:50:00Z")),
        Some(ts("2026-11-01T06:50:00Z"))
    );
}

// ---- Europe/Berlin: 2026-03-29 02:00 CET -> 03:00 CEST, 2026-10-25 03:00 CEST -> 02:00 CET.

#[test]
fn berlin_spring_forward() {
    assert_eq!(
        fires(
            "0 30 2 * * *",
            "Europe/Berlin",
            "2026-03-28T12:00:00Z",
            "2026-03-30T12:00:00Z"
        ),
        ["2026-03-29T01:30:00Z", "2026-03-30T00:30:00Z"]
    );
    assert_eq!(
        fires(
            "0 0 * * * *",
            "Europe/Berlin",
            "2026-03-28T23:30:00Z",
            "2026-03-29T02:30:00Z"
        ),
        [
            "2026-03-29T00:00:00Z", // 01:00 CET
            "2026-03-29T01:00:00Z", // 02:00 (gap) == 03:00 CEST
            "2026-03-29T02:00:00Z", // 04:00 CEST
        ]
    );
}

#[test]
fn berlin_fall_back() {
    assert_eq!(
        fires(
            "0 30 2 * * *",
            "Europe/Berlin",
            "2026-10-24T12:00:00Z",
            "2026-10-26T12:00:00Z"
        ),
        ["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"]
    );
    assert_eq!(
        fires(
            "0 30 * * * *",
            "Europe/Berlin",
            "2026-10-24T23:00:00Z",
            "2026-10-25T02:00:00Z"
        ),
        [
            "2026-10-24T23:30:00Z", // 01:30 CEST
            "2026-10-25T00:30:00Z", // 02:30 CEST
            "2026-10-25T01:30:00Z", // 02:30 CET
        ]
    );
}

// ---- Australia/Lord_Howe: 30-minute shifts.
// 2026-04-05 02:00 (+11) -> 01:30 (+10:30); 2026-10-04 02:00 (+10:30) -> 02:30 (+11).

#[test]
fn lord_howe_half_hour_fall_back() {
    // 01:45 is repeated: pinned hour fires once, at +11.
    assert_eq!(
        fires(
            "0 45 1 * * *",
            "Australia/Lord_Howe",
            "2026-04-04T00:00:00Z",
            "2026-04-05T23:00:00Z"
        ),
        ["2026-04-04T14:45:00Z", "2026-04-05T15:15:00Z"]
    );
    // 01:15 is not in the repeated half hour.
    assert_eq!(
        fires(
            "0 15 1 * * *",
            "Australia/Lord_Howe",
            "2026-04-04T12:00:00Z",
            "2026-04-04T18:00:00Z"
        ),
        ["2026-04-04T14:15:00Z"]
    );
    // Wildcard hour: both passes of 01:45.
    assert_eq!(
        fires(
            "0 45 * * * *",
            "Australia/Lord_Howe",
            "2026-04-04T14:00:00Z",
            "2026-04-04T16:30:00Z"
        ),
        [
            "2026-04-04T14:45:00Z", // 01:45 +11
            "2026-04-04T15:15:00Z", // 01:45 +10:30
            "2026-04-04T16:15:00Z"  // 02:45 +10:30
        ]
    );
    assert_eq!(
        fires(
            "0 0 2 * * *",
            "Australia/Lord_Howe",
            "2026-04-04T12:00:00Z",
            "2026-04-04T18:00:00Z"
        ),
        ["2026-04-04T15:30:00Z"]
    );
}

#[test]
fn lord_howe_half_hour_spring_forward() {
    // 02:15 is in the gap: fires at 02:15 - 10:30 = 15:45Z, which is also
    // 02:45 +11, so `15,45` fires once.
    assert_eq!(
        fires(
            "0 15 2 * * *",
            "Australia/Lord_Howe",
            "2026-10-03T12:00:00Z",
            "2026-10-03T18:00:00Z"
        ),
        ["2026-10-03T15:45:00Z"]
    );
    assert_eq!(
        fires(
            "0 15,45 2 * * *",
            "Australia/Lord_Howe",
            "2026-10-03T12:00:00Z",
            "2026-10-03T18:00:00Z"
        ),
        ["2026-10-03T15:45:00Z"]
    );
    assert_eq!(
        fires(
            "0 */15 * * * *",
            "Australia/Lord_Howe",
            "2026-10-03T15:00:00Z",
            "2026-10-03T16:30:00Z"
        ),
        [
            "2026-10-03T15:15:00Z", // 01:45 +10:30
            "2026-10-03T15:30:00Z", // 02:00 (gap) == 02:30 +11
            "2026-10-03T15:45:00Z", // 02:15 (gap) == 02:45 +11
            "2026-10-03T16:00:00Z",
            "2026-10-03T16:15:00Z",
            "2026-10-03T16:30:00Z",
        ]
    );
}

// ---- America/Santiago: transitions at local midnight, so the repeated
// hour and the gap straddle a date change.
// 2026-04-05 00:00 (-03) -> 2026-04-04 23:00 (-04); 2026-09-06 00:00 (-04) -> 01:00 (-03).

#[test]
fn santiago_fold_at_midnight() {
    // Wildcard hour, only on April 4th: after the first-pass 23:45, the
    // second-pass 23:30 is still ahead even though the next *civil* match
    // after 23:45 is a year away.
    let tz = zone("America/Santiago");
    let s = CronSchedule::parse("0 30 * 4 4 *").expect("valid");
    assert_eq!(
        s.next_after(&tz, ts("2026-04-05T02:45:00Z")),
        Some(ts("2026-04-05T03:30:00Z"))
    );
    assert_eq!(
        s.next_after(&tz, ts("2026-04-05T03:30:00Z")),
        Some(ts("2027-04-04T04:30:00Z")) // 00:30 -04 (2027 falls back on the 3rd)
    );
    assert_eq!(
        fires(
            "0 30 23 4 4 *",
            "America/Santiago",
            "2026-04-04T12:00:00Z",
            "2026-04-06T00:00:00Z"
        ),
        ["2026-04-05T02:30:00Z"]
    );
}

#[test]
fn santiago_gap_at_midnight() {
    assert_eq!(
        fires(
            "0 30 0 * * *",
            "America/Santiago",
            "2026-09-05T12:00:00Z",
            "2026-09-07T12:00:00Z"
        ),
        [
            "2026-09-06T04:30:00Z", // 00:30 (gap) at -04 == 01:30 -03
            "2026-09-07T03:30:00Z"
        ]
    );
    assert_eq!(
        fires(
            "0 0 0 6 9 *",
            "America/Santiago",
            "2026-09-01T00:00:00Z",
            "2026-09-30T00:00:00Z"
        ),
        ["2026-09-06T04:00:00Z"]
    );
}

// ---- Zones without transitions.

#[test]
fn utc_and_fixed_offsets_have_one_segment() {
    assert_eq!(
        fires(
            "0 15 2 * * *",
            "UTC",
            "2026-03-07T12:00:00Z",
            "2026-03-09T12:00:00Z"
        ),
        ["2026-03-08T02:15:00Z", "2026-03-09T02:15:00Z"]
    );
    let tz = TimeZone::fixed(Offset::from_seconds(5 * 3600 + 45 * 60).expect("offset"));
    let s = CronSchedule::parse("0 0 0 * * *").expect("valid");
    let got: Vec<Timestamp> = s
        .iter_after(&tz, ts("2026-01-01T00:00:00Z"))
        .take(2)
        .collect();
    assert_eq!(
        got,
        [ts("2026-01-01T18:15:00Z"), ts("2026-01-02T18:15:00Z")]
    );
}

#[test]
fn every_second_across_both_ny_transitions_is_a_clean_timeline() {
    // `* * * * * *` must yield every second exactly once, gap or fold.
    let tz = zone("America/New_York");
    let s = CronSchedule::parse("* * * * * *").expect("valid");
    for start in ["2026-03-08T05:00:00Z", "2026-11-01T04:00:00Z"] {
        let start = ts(start).as_second();
        let got: Vec<i64> = s
            .iter_after(&tz, Timestamp::from_second(start).expect("in range"))
            .take(4 * 3600)
            .map(|t| t.as_second())
            .collect();
        let want: Vec<i64> = (start + 1..=start + 4 * 3600).collect();
        assert_eq!(got, want);
    }
}
