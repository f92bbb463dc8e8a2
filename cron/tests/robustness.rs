//! Parsing untrusted text and searching from arbitrary instants must never
//! panic, hang, or produce out-of-order firings.

use baton_cron::CronSchedule;
use jiff::Timestamp;
use jiff::tz::TimeZone;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestRunner};

const ZONES: [&str; 6] = [
    "America/New_York",
    "Europe/Berlin",
    "Australia/Lord_Howe",
    "America/Santiago",
    "Asia/Kathmandu",
    "UTC",
];

fn runner(cases: u32, seed: u64) -> TestRunner {
    TestRunner::new(Config {
        cases,
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: None,
        ..Config::default()
    })
}

/// Cron-looking noise: mostly valid tokens glued by spaces, commas, dashes
/// and slashes, plus arbitrary Unicode now and then.
fn noise() -> impl Strategy<Value = String> {
    let tok = prop_oneof![
        "[0-9]{1,3}",
        Just("*".to_string()),
        Just("?".to_string()),
        Just("L".to_string()),
        "[0-7][Ll#][0-9]?",
        "(?i)(jan|feb|dec|mon|fri|sun)",
        "[0-9]{4}",
        "@[a-z]{0,9}",
        "\\PC{1,3}",
    ];
    let sep = prop_oneof![
        4 => Just(" "),
        1 => Just(","),
        1 => Just("-"),
        1 => Just("/"),
        1 => Just("  "),
    ];
    prop::collection::vec((tok, sep), 0..12).prop_map(|v| {
        v.into_iter()
            .map(|(t, s)| format!("{t}{s}"))
            .collect::<String>()
    })
}

#[test]
fn parse_never_panics_and_errors_point_inside_the_input() {
    runner(3_000, 7)
        .run(&noise(), |expr| {
            if let Err(e) = CronSchedule::parse(&expr) {
                prop_assert!(e.offset + e.len <= expr.len(), "{expr:?}: {e:?}");
                prop_assert!(expr.is_char_boundary(e.offset), "{expr:?}: {e:?}");
                prop_assert!(expr.is_char_boundary(e.offset + e.len), "{expr:?}: {e:?}");
                prop_assert!(!e.message.is_empty());
            }
            Ok(())
        })
        .expect("no panics");
}

#[test]
fn searches_from_anywhere_are_ordered_and_terminate() {
    let exprs = prop_oneof![
        Just("* * * * * *"),
        Just("0 0 0 29 2 *"),
        Just("0 30 1 * * *"),
        Just("0 */20 * * * *"),
        Just("0 0 0 1 1 * 2199"),
        Just("0 0 0 1 1 * 1970"),
        Just("59 59 23 L 12 5L"),
        Just("0 0 12 ? * 1#5"),
    ];
    // Anywhere in jiff's range, with extra weight on the supported range's
    // edges.
    let instant = prop_oneof![
        Timestamp::MIN.as_second()..=Timestamp::MAX.as_second(),
        -200_000i64..200_000,
        7_258_000_000i64..7_258_300_000,
    ];
    runner(400, 11)
        .run(
            &(exprs, instant, 0..ZONES.len(), any::<i32>()),
            |(expr, secs, zi, nanos)| {
                let tz = TimeZone::get(ZONES[zi]).expect("zone");
                let s = CronSchedule::parse(expr).expect("valid");
                let nanos = if secs == 0 { 0 } else { nanos % 1_000_000_000 };
                let nanos = if (secs < 0) != (nanos < 0) {
                    -nanos
                } else {
                    nanos
                };
                let after = Timestamp::new(secs, nanos)
                    .unwrap_or(Timestamp::from_second(secs).expect("in range"));
                let mut prev = after;
                for t in s.iter_after(&tz, after).take(50) {
                    prop_assert!(t > prev, "{expr} in {}: {prev} then {t}", ZONES[zi]);
                    prop_assert!(t.subsec_nanosecond() == 0);
                    prev = t;
                }
                Ok(())
            },
        )
        .expect("ordered");
}
