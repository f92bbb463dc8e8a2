//! Property tests against an independent brute-force oracle.
//!
//! Expressions are generated from a grammar as a (text, meaning) pair: the
//! text goes to the parser, the meaning — plain sets of allowed values
//! computed here, without any library code — drives the oracle. The oracle
//! takes the contract literally: for each local second, does it match? If
//! so, map it to instants with jiff's own gap/fold classification (gap: the
//! offset before; fold: the earlier instant, or both when the hour field is
//! all 24 hours), then dedupe and sort. `iter_after` must reproduce that
//! list exactly, and `next_after` must agree with it point by point.
//!
//! All runs use a fixed seed, so failures reproduce.

use baton_cron::CronSchedule;
use jiff::Timestamp;
use jiff::civil::{Date, DateTime};
use jiff::tz::{AmbiguousOffset, TimeZone};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestRunner};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// Coverage counters, so the properties cannot pass vacuously.
#[derive(Default)]
struct Stats {
    cases: AtomicUsize,
    rejected: AtomicUsize,
    firing: AtomicUsize,
    gaps: AtomicUsize,
    folds: AtomicUsize,
}

/// Lord Howe shifts by 30 minutes; Santiago changes at midnight, so its
/// gap and fold straddle a date change.
const ZONES: [&str; 5] = [
    "America/New_York",
    "Europe/Berlin",
    "Australia/Lord_Howe",
    "America/Santiago",
    "UTC",
];
const MONTHS: [&str; 12] = [
    "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
];
const DAYS: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

// ---------------------------------------------------------------- grammar

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Sec,
    Min,
    Hour,
    Dom,
    Month,
    Dow,
    Year,
}

impl Kind {
    /// Values accepted in the text.
    fn bounds(self) -> (u32, u32) {
        match self {
            Kind::Sec | Kind::Min => (0, 59),
            Kind::Hour => (0, 23),
            Kind::Dom => (1, 31),
            Kind::Month => (1, 12),
            Kind::Dow => (0, 7),
            Kind::Year => (1970, 2199),
        }
    }
    /// Where `*` and `a/n` stop (the documented rule: day-of-week at 6).
    fn open_max(self) -> u32 {
        if self == Kind::Dow {
            6
        } else {
            self.bounds().1
        }
    }
}

/// One generated field: its text and what it means.
#[derive(Clone, Debug, Default)]
struct Field {
    text: String,
    /// Plain allowed values (day-of-week 7 already folded to 0).
    values: Vec<u32>,
    /// `L` in day-of-month.
    last: bool,
    /// Day-of-week `w#n` as (w, n).
    nth: Vec<(u32, u32)>,
    /// Day-of-week `wL`.
    last_dow: Vec<u32>,
}

fn fold(kind: Kind, v: u32) -> u32 {
    if kind == Kind::Dow { v % 7 } else { v }
}

/// Renders a value as a number or (month / day-of-week) a name in a
/// random case.
fn render(kind: Kind, v: u32, style: u8) -> String {
    let name = match kind {
        Kind::Month => MONTHS[(v - 1) as usize],
        Kind::Dow => DAYS[(v % 7) as usize],
        _ => return v.to_string(),
    };
    match style % 4 {
        0 => name.to_string(),
        1 => name.to_ascii_lowercase(),
        2 => format!("{}{}", &name[..1], name[1..].to_ascii_lowercase()),
        _ => v.to_string(),
    }
}

/// A value, biased toward `hot` (e.g. hours near DST transitions; for
/// hours also 22-23, where midnight transitions happen).
fn value(kind: Kind, hot: Option<(u32, u32)>) -> BoxedStrategy<u32> {
    let (lo, hi) = kind.bounds();
    match hot {
        Some((a, b)) if kind == Kind::Hour => prop_oneof![a..=b, 22..=23u32, lo..=hi].boxed(),
        Some((a, b)) => prop_oneof![a..=b, lo..=hi].boxed(),
        None => (lo..=hi).boxed(),
    }
}

/// One list item of a field.
fn item(kind: Kind, hot: Option<(u32, u32)>, max_step: u32) -> BoxedStrategy<Field> {
    let (_, hi) = kind.bounds();
    let plain = prop_oneof![
        // a
        (value(kind, hot), any::<u8>()).prop_map(move |(v, st)| Field {
            text: render(kind, v, st),
            values: vec![fold(kind, v)],
            ..Field::default()
        }),
        // a-b
        (value(kind, hot), value(kind, hot), any::<u8>()).prop_map(move |(a, b, st)| {
            let (a, b) = (a.min(b), a.max(b));
            // Day-of-week 7 only means Sunday as a number: `Fri-Sun` would
            // be the reversed range 5-0.
            let r = |v: u32, st: u8| {
                if kind == Kind::Dow && v == 7 {
                    v.to_string()
                } else {
                    render(kind, v, st)
                }
            };
            Field {
                text: format!("{}-{}", r(a, st), r(b, st / 4)),
                values: (a..=b).map(|v| fold(kind, v)).collect(),
                ..Field::default()
            }
        }),
        // a-b/n
        (value(kind, hot), value(kind, hot), 1..=max_step).prop_map(move |(a, b, n)| {
            let (a, b) = (a.min(b), a.max(b));
            Field {
                text: format!("{a}-{b}/{n}"),
                values: (a..=b).step_by(n as usize).map(|v| fold(kind, v)).collect(),
                ..Field::default()
            }
        }),
        // */n
        (1..=max_step).prop_map(move |n| Field {
            text: format!("*/{n}"),
            values: (kind.bounds().0..=kind.open_max())
                .step_by(n as usize)
                .map(|v| fold(kind, v))
                .collect(),
            ..Field::default()
        }),
        // a/n
        (value(kind, hot), 1..=max_step).prop_map(move |(a, n)| Field {
            text: format!("{a}/{n}"),
            values: (a..=kind.open_max().max(a).min(hi))
                .step_by(n as usize)
                .map(|v| fold(kind, v))
                .collect(),
            ..Field::default()
        }),
    ];
    match kind {
        Kind::Dom => prop_oneof![
            4 => plain,
            1 => Just(Field { text: "L".into(), last: true, ..Field::default() }),
        ]
        .boxed(),
        Kind::Dow => prop_oneof![
            4 => plain,
            1 => (0..=7u32, any::<u8>()).prop_map(|(w, st)| Field {
                text: format!("{}L", render(Kind::Dow, w, st)),
                last_dow: vec![w % 7],
                ..Field::default()
            }),
            1 => (0..=7u32, 1..=5u32, any::<u8>()).prop_map(|(w, n, st)| Field {
                text: format!("{}#{n}", render(Kind::Dow, w, st)),
                nth: vec![(w % 7, n)],
                ..Field::default()
            }),
        ]
        .boxed(),
        _ => plain.boxed(),
    }
}

/// A whole field: `*`, `?` (day fields), or a list of 1-3 items, with the
/// given weights.
fn field(
    kind: Kind,
    star_weight: u32,
    hot: Option<(u32, u32)>,
    max_step: u32,
) -> BoxedStrategy<Field> {
    let (lo, hi) = kind.bounds();
    let all = move |text: &str| Field {
        text: text.into(),
        values: (lo..=hi.min(kind.open_max())).collect(),
        ..Field::default()
    };
    let list = prop::collection::vec(item(kind, hot, max_step), 1..=3).prop_map(|items| {
        let mut f = Field::default();
        let mut texts = Vec::new();
        for it in items {
            texts.push(it.text);
            f.values.extend(it.values);
            f.last |= it.last;
            f.nth.extend(it.nth);
            f.last_dow.extend(it.last_dow);
        }
        f.text = texts.join(",");
        f
    });
    let star = Just(all("*"));
    match kind {
        Kind::Dom | Kind::Dow => prop_oneof![
            star_weight => star,
            star_weight.div_ceil(2) => Just(all("?")),
            4 => list,
        ]
        .boxed(),
        _ => prop_oneof![star_weight => star, 4 => list].boxed(),
    }
}

/// Everything the oracle needs, computed from the generated fields only.
#[derive(Clone, Debug)]
struct Model {
    text: String,
    sec: [bool; 60],
    min: [bool; 60],
    hour: [bool; 24],
    dom: [bool; 32],
    dom_last: bool,
    month: [bool; 13],
    dow: [bool; 7],
    nth: Vec<(u32, u32)>,
    last_dow: [bool; 7],
    /// Vixie: text starts with `*` or is `?`.
    dom_star: bool,
    dow_star: bool,
    /// `None` = no year field.
    years: Option<Vec<u32>>,
}

fn flags<const N: usize>(values: &[u32]) -> [bool; N] {
    let mut out = [false; N];
    for &v in values {
        out[v as usize] = true;
    }
    out
}

fn model(f: [Field; 6], year: Option<Field>) -> Model {
    let [sec, min, hour, dom, month, dow] = f;
    let mut text = [&sec, &min, &hour, &dom, &month, &dow]
        .map(|f| f.text.as_str())
        .join(" ");
    if let Some(y) = &year {
        text.push(' ');
        text.push_str(&y.text);
    }
    let star = |t: &str| t.starts_with('*') || t == "?";
    Model {
        sec: flags(&sec.values),
        min: flags(&min.values),
        hour: flags(&hour.values),
        dom: flags(&dom.values),
        dom_last: dom.last,
        month: flags(&month.values),
        dow: flags(&dow.values),
        nth: dow.nth.clone(),
        last_dow: flags(&dow.last_dow),
        dom_star: star(&dom.text),
        dow_star: star(&dow.text),
        years: year.map(|y| y.values),
        text,
    }
}

/// Expressions whose time-of-day fields are dense enough to fire inside a
/// few-hour window and biased toward the small hours where DST happens.
fn dense_expr() -> impl Strategy<Value = Model> {
    let fields = (
        field(Kind::Sec, 1, Some((0, 2)), 30),
        field(Kind::Min, 3, Some((0, 2)), 30),
        field(Kind::Hour, 4, Some((0, 4)), 4),
        field(Kind::Dom, 10, None, 10),
        field(Kind::Month, 12, None, 4),
        field(Kind::Dow, 10, None, 3),
    );
    let year = prop_oneof![
        6 => Just(None),
        1 => field(Kind::Year, 1, Some((2019, 2046)), 3).prop_map(Some),
    ];
    (fields, year).prop_map(|((s, mi, h, d, mo, w), y)| model([s, mi, h, d, mo, w], y))
}

/// Expressions with sparse times of day (a few firings per matching day)
/// but arbitrary day-level fields, for windows of months to years.
fn sparse_expr() -> impl Strategy<Value = Model> {
    let fields = (
        field(Kind::Sec, 0, None, 60),
        field(Kind::Min, 0, Some((0, 2)), 60),
        field(Kind::Hour, 0, Some((0, 4)), 24).prop_filter("few hours", |f| f.values.len() <= 6),
        field(Kind::Dom, 3, None, 16),
        field(Kind::Month, 3, None, 6),
        field(Kind::Dow, 3, None, 4),
    )
        .prop_filter("few firings per day", |(s, m, h, ..)| {
            s.values.len() * m.values.len() * h.values.len() <= 12
        });
    let year = prop_oneof![
        4 => Just(None),
        1 => field(Kind::Year, 1, None, 40).prop_map(Some),
    ];
    (fields, year).prop_map(|((s, mi, h, d, mo, w), y)| model([s, mi, h, d, mo, w], y))
}

// ----------------------------------------------------------------- oracle

impl Model {
    fn hour_wildcard(&self) -> bool {
        self.hour.iter().all(|&b| b)
    }

    fn day_matches(&self, d: Date) -> bool {
        let year = i32::from(d.year());
        if !(1970..=2199).contains(&year) {
            return false;
        }
        if let Some(ys) = &self.years
            && !ys.contains(&(year as u32))
        {
            return false;
        }
        if !self.month[d.month() as usize] {
            return false;
        }
        let day = d.day() as u32;
        let dim = d.days_in_month() as u32;
        let wd = d.weekday().to_sunday_zero_offset() as u32;
        let dom = self.dom[day as usize] || (self.dom_last && day == dim);
        let dow = self.dow[wd as usize]
            || self.nth.contains(&(wd, (day - 1) / 7 + 1))
            || (self.last_dow[wd as usize] && day + 7 > dim);
        if self.dom_star || self.dow_star {
            dom && dow
        } else {
            dom || dow
        }
    }

    fn time_matches(&self, h: u32, m: u32, s: u32) -> bool {
        self.hour[h as usize] && self.min[m as usize] && self.sec[s as usize]
    }

    /// The instants a matching local time fires at, per the contract.
    fn map(&self, tz: &TimeZone, dt: DateTime, out: &mut Vec<i64>, stats: &Stats) {
        let local = TimeZone::UTC
            .to_timestamp(dt)
            .expect("civil time in range")
            .as_second();
        match tz.to_ambiguous_timestamp(dt).offset() {
            AmbiguousOffset::Unambiguous { offset } => {
                out.push(local - i64::from(offset.seconds()));
            }
            AmbiguousOffset::Gap { before, .. } => {
                stats.gaps.fetch_add(1, Relaxed);
                out.push(local - i64::from(before.seconds()));
            }
            AmbiguousOffset::Fold { before, after } => {
                stats.folds.fetch_add(1, Relaxed);
                out.push(local - i64::from(before.seconds()));
                if self.hour_wildcard() {
                    out.push(local - i64::from(after.seconds()));
                }
            }
        }
    }

    /// Brute force, one local second at a time: firings in `(after, end]`.
    fn walk_seconds(&self, tz: &TimeZone, after: i64, end: i64, stats: &Stats) -> Vec<i64> {
        let local_of = |t: i64| t + i64::from(tz.to_offset(ts(t)).seconds());
        let (from, to) = (local_of(after) - 3 * 3600, local_of(end) + 3 * 3600);
        let mut out = Vec::new();
        let mut day: Option<(i64, Date, bool)> = None;
        for l in from..=to {
            let dn = l.div_euclid(86_400);
            let (date, ok) = match day {
                Some((n, date, ok)) if n == dn => (date, ok),
                _ => {
                    let date = TimeZone::UTC.to_datetime(ts(dn * 86_400)).date();
                    let ok = self.day_matches(date);
                    day = Some((dn, date, ok));
                    (date, ok)
                }
            };
            if !ok {
                continue;
            }
            let sod = l.rem_euclid(86_400) as u32;
            let (h, m, s) = (sod / 3600, sod / 60 % 60, sod % 60);
            if self.time_matches(h, m, s) {
                self.map(tz, date.at(h as i8, m as i8, s as i8, 0), &mut out, stats);
            }
        }
        finish(out, after, end)
    }

    /// Brute force over days: enumerate every matching (h, m, s) of every
    /// matching local day, map, dedupe. Firings in `(after, end]`.
    fn walk_days(&self, tz: &TimeZone, after: i64, end: i64, stats: &Stats) -> Vec<i64> {
        let date_of = |t: i64| tz.to_datetime(ts(t)).date();
        let mut d = date_of(after).yesterday().expect("in range");
        let last = date_of(end).tomorrow().expect("in range");
        let set = |f: &[bool]| (0..f.len()).filter(|&i| f[i]).collect::<Vec<_>>();
        let (hours, minutes, seconds) = (set(&self.hour), set(&self.min), set(&self.sec));
        let mut out = Vec::new();
        while d <= last {
            if self.day_matches(d) {
                for &h in &hours {
                    for &m in &minutes {
                        for &s in &seconds {
                            self.map(tz, d.at(h as i8, m as i8, s as i8, 0), &mut out, stats);
                        }
                    }
                }
            }
            d = d.tomorrow().expect("in range");
        }
        finish(out, after, end)
    }

    /// True if no day in the supported range matches (the parser must then
    /// reject the expression).
    fn never_fires(&self) -> bool {
        let mut d = Date::constant(1970, 1, 1);
        let end = Date::constant(2199, 12, 31);
        while d <= end {
            if self.day_matches(d) {
                return false;
            }
            d = d.tomorrow().expect("in range");
        }
        true
    }
}

fn finish(mut out: Vec<i64>, after: i64, end: i64) -> Vec<i64> {
    out.retain(|&t| t > after && t <= end);
    out.sort_unstable();
    out.dedup();
    out
}

fn ts(s: i64) -> Timestamp {
    Timestamp::from_second(s).expect("timestamp in range")
}

// ------------------------------------------------------------------ check

/// Parses the model's text and compares the library with `expected`.
fn check(
    m: &Model,
    tz: &TimeZone,
    after: i64,
    end: i64,
    expected: &[i64],
    stats: &Stats,
) -> Result<(), TestCaseError> {
    stats.cases.fetch_add(1, Relaxed);
    if !expected.is_empty() {
        stats.firing.fetch_add(1, Relaxed);
    }
    let s = match CronSchedule::parse(&m.text) {
        Ok(s) => s,
        Err(e) => {
            stats.rejected.fetch_add(1, Relaxed);
            prop_assert!(m.never_fires(), "{:?} rejected but can fire: {e}", m.text);
            return Ok(());
        }
    };
    prop_assert_eq!(s.hour_is_wildcard(), m.hour_wildcard());
    let got: Vec<i64> = s
        .iter_after(tz, ts(after))
        .map(|t| t.as_second())
        .take_while(|&t| t <= end)
        .collect();
    prop_assert_eq!(
        &got,
        expected,
        "expr {:?} in {:?} after {} until {}",
        m.text,
        tz.iana_name(),
        ts(after),
        ts(end)
    );
    // The uncached path, from `after` and from each firing.
    let mut prev = after;
    for &t in expected.iter().take(40) {
        prop_assert_eq!(
            s.next_after(tz, ts(prev)),
            Some(ts(t)),
            "{:?} after {}",
            m.text,
            ts(prev)
        );
        // ... and from just before it.
        prop_assert_eq!(s.next_after(tz, ts(t - 1)), Some(ts(t)), "{:?}", m.text);
        prev = t;
    }
    Ok(())
}

impl Stats {
    /// Prints the counters and fails if the run exercised too little.
    fn assert_coverage(&self, what: &str, min_dst: usize) {
        let [cases, rejected, firing, gaps, folds] = [
            &self.cases,
            &self.rejected,
            &self.firing,
            &self.gaps,
            &self.folds,
        ]
        .map(|c| c.load(Relaxed));
        eprintln!(
            "{what}: {cases} cases, {firing} with firings, {rejected} rejected, \
             {gaps} gap and {folds} fold local times"
        );
        assert!(firing * 2 >= cases, "{what}: too few cases with firings");
        assert!(
            gaps >= min_dst && folds >= min_dst,
            "{what}: too few DST cases"
        );
    }
}

fn runner(cases: u32, seed: u64) -> TestRunner {
    TestRunner::new(Config {
        cases,
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: None,
        ..Config::default()
    })
}

/// The n-th transition of `tz` on or after January 1st of `year`.
fn transition(tz: &TimeZone, year: i16, n: usize) -> Option<i64> {
    let start = TimeZone::UTC
        .to_timestamp(Date::constant(year, 1, 1).at(0, 0, 0, 0))
        .ok()?;
    tz.following(start)
        .nth(n)
        .map(|t| t.timestamp().as_second())
}

/// Windows of a few hours, three quarters of them straddling (or right
/// next to) a DST transition in either direction; walked second by second.
#[test]
fn matches_per_second_brute_force_around_transitions() {
    let window = (
        0..ZONES.len(),
        2020i16..=2045,
        0..2usize,
        -5 * 3600i64..=3600,
        3600i64..=6 * 3600,
        // A random instant in 2020..2046.
        1_577_836_800i64..2_398_377_600,
    );
    let stats = Stats::default();
    runner(1_000, 0xC0FFEE)
        .run(
            &(dense_expr(), window, 0..4u32),
            |(m, (zi, year, n, delta, len, anywhere), k)| {
                let tz = TimeZone::get(ZONES[zi]).expect("zone");
                let near = if k == 0 {
                    None
                } else {
                    transition(&tz, year, n)
                };
                let after = near.map_or(anywhere, |t| t + delta);
                let end = after + len;
                let expected = m.walk_seconds(&tz, after, end, &stats);
                check(&m, &tz, after, end, &expected, &stats)
            },
        )
        .expect("property holds");
    stats.assert_coverage("per-second", 1_000);
}

/// Months-to-years windows in every zone, including the edges of the
/// supported range (1970, 2199) and historical tzdb rules; enumerated day
/// by day.
#[test]
fn matches_per_day_brute_force_over_long_windows() {
    let window = (
        0..ZONES.len(),
        // 1970-01-01 .. 2200-01-01, so some windows run past the end.
        0i64..7_258_118_400,
        86_400i64..=900 * 86_400,
    );
    let stats = Stats::default();
    runner(400, 0xBA7_0C12)
        .run(&(sparse_expr(), window), |(m, (zi, after, len))| {
            let tz = TimeZone::get(ZONES[zi]).expect("zone");
            let end = after + len;
            let expected = m.walk_days(&tz, after, end, &stats);
            check(&m, &tz, after, end, &expected, &stats)
        })
        .expect("property holds");
    stats.assert_coverage("per-day", 10);
}

/// Sanity check of the oracle itself on a hand-computed case, so a broken
/// oracle cannot make the properties vacuous.
#[test]
fn oracle_reproduces_the_contract_examples() {
    let f = |text: &str, values: Vec<u32>| Field {
        text: text.into(),
        values,
        ..Field::default()
    };
    let all = |text: &str, n: u32| f(text, (0..n).collect());
    let m = model(
        [
            f("0", vec![0]),
            f("30", vec![30]),
            all("*", 24),
            f("*", (1..=31).collect()),
            f("*", (1..=12).collect()),
            f("*", (0..=6).collect()),
        ],
        None,
    );
    let tz = TimeZone::get("America/New_York").expect("zone");
    let t = |s: &str| s.parse::<Timestamp>().expect("literal").as_second();
    let st = Stats::default();
    let got = m.walk_seconds(
        &tz,
        t("2026-11-01T04:00:00Z"),
        t("2026-11-01T08:00:00Z"),
        &st,
    );
    let want: Vec<i64> = [
        "2026-11-01T04:30:00Z",
        "2026-11-01T05:30:00Z",
        "2026-11-01T06:30:00Z",
        "2026-11-01T07:30:00Z",
    ]
    .map(t)
    .into();
    assert_eq!(got, want);
    assert_eq!(
        m.walk_days(
            &tz,
            t("2026-11-01T04:00:00Z"),
            t("2026-11-01T08:00:00Z"),
            &st
        ),
        want
    );
    // Gap: `0 30 2 * * *` fires once at 07:30Z on 2026-03-08.
    let mut g = m.clone();
    g.hour = flags(&[2]);
    assert_eq!(
        g.walk_seconds(
            &tz,
            t("2026-03-08T00:00:00Z"),
            t("2026-03-08T23:00:00Z"),
            &st
        ),
        vec![t("2026-03-08T07:30:00Z")]
    );
}
