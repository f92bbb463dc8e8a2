//! Next-fire throughput: iterate N successive firings from 2026-01-01 in
//! America/New_York, baton-cron side by side with croner 4 (chrono +
//! chrono-tz), one criterion group per expression.
//!
//! Both sides start from an already-parsed schedule and an already-loaded
//! zone, and both produce N instants; the elements/s figures are firings
//! per second.

use std::hint::black_box;
use std::time::Duration;

use baton_cron::CronSchedule;
use chrono::TimeZone as _;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use croner::parser::{CronParser, Seconds};

/// (expression, firings per iteration). The leap-day schedule only has ~44
/// firings left before the end of baton's supported range (2199).
const CASES: [(&str, usize); 4] = [
    ("*/5 * * * * *", 1_000),
    ("0 30 9 * * Mon-Fri", 1_000),
    ("0 0 0 29 2 *", 40),
    ("0 15 2 * * *", 1_000),
];

fn bench(c: &mut Criterion) {
    let tz = jiff::tz::TimeZone::get("America/New_York").expect("zone in bundled tzdb");
    let start: jiff::Timestamp = "2026-01-01T05:00:00Z".parse().expect("timestamp");
    let ctz = chrono_tz::America::New_York;
    let cstart = ctz
        .with_ymd_and_hms(2026, 1, 1, 0, 0, 0)
        .single()
        .expect("unambiguous start");
    let parser = CronParser::builder().seconds(Seconds::Required).build();

    for (expr, n) in CASES {
        let baton = CronSchedule::parse(expr).expect("baton parses");
        let croner = parser.parse(expr).expect("croner parses");

        // Make sure both sides do the same work: identical firings, except
        // on DST-gap days where croner's semantics differ from baton's.
        let ours: Vec<i64> = baton
            .iter_after(&tz, start)
            .take(n)
            .map(|t| t.as_second())
            .collect();
        let theirs: Vec<i64> = croner
            .iter_after(cstart)
            .take(n)
            .map(|t| t.timestamp())
            .collect();
        assert_eq!(ours.len(), n, "{expr}: baton ran out");
        if !expr.contains(" 2 * * *") {
            assert_eq!(ours, theirs, "{expr}: baton and croner disagree");
        }

        let mut group = c.benchmark_group(expr);
        group.throughput(Throughput::Elements(n as u64));
        group.bench_function("baton", |b| {
            b.iter(|| {
                let mut last = None;
                for t in baton.iter_after(&tz, black_box(start)).take(n) {
                    last = Some(t);
                }
                black_box(last)
            });
        });
        group.bench_function("croner", |b| {
            b.iter(|| {
                let mut last = None;
                for t in croner.iter_after(black_box(cstart)).take(n) {
                    last = Some(t);
                }
                black_box(last)
            });
        });
        group.finish();
    }

    // Why `iter_after` exists: it keeps the offset segment between firings,
    // where `next_after` looks it up in the zone on every call.
    let s = CronSchedule::parse("0 15 2 * * *").expect("baton parses");
    let n = 1_000;
    let mut group = c.benchmark_group("0 15 2 * * * (iter vs next_after)");
    group.throughput(Throughput::Elements(n as u64));
    group.bench_function("iter_after", |b| {
        b.iter(|| s.iter_after(&tz, black_box(start)).take(n).last());
    });
    group.bench_function("next_after_loop", |b| {
        b.iter(|| {
            let mut cur = black_box(start);
            for _ in 0..n {
                cur = s.next_after(&tz, cur).expect("fires daily");
            }
            cur
        });
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = bench
}
criterion_main!(benches);
