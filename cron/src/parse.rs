//! Parsing cron text into the bitsets of [`CronSchedule`].
//!
//! Every error carries the byte range of the offending token in the
//! caller's original string, so a pack validator can underline it.

use crate::matcher::{ALL_HOURS, MAX_YEAR, MIN_LOCAL, MIN_YEAR, YEAR_WORDS};
use crate::{CronError, CronSchedule};

const MONTH_NAMES: [&str; 12] = [
    "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
];
const DOW_NAMES: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

/// Which field is being parsed; decides ranges, names and special syntax.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Second,
    Minute,
    Hour,
    Dom,
    Month,
    Dow,
    Year,
}

impl Kind {
    const ORDER: [Kind; 7] = [
        Kind::Second,
        Kind::Minute,
        Kind::Hour,
        Kind::Dom,
        Kind::Month,
        Kind::Dow,
        Kind::Year,
    ];

    fn name(self) -> &'static str {
        match self {
            Kind::Second => "second",
            Kind::Minute => "minute",
            Kind::Hour => "hour",
            Kind::Dom => "day-of-month",
            Kind::Month => "month",
            Kind::Dow => "day-of-week",
            Kind::Year => "year",
        }
    }

    /// Inclusive range of accepted numbers (day-of-week accepts 7 = Sunday).
    fn bounds(self) -> (u32, u32) {
        match self {
            Kind::Second | Kind::Minute => (0, 59),
            Kind::Hour => (0, 23),
            Kind::Dom => (1, 31),
            Kind::Month => (1, 12),
            Kind::Dow => (0, 7),
            Kind::Year => (MIN_YEAR as u32, MAX_YEAR as u32),
        }
    }

    /// Upper end for `*` and `a/n`: day-of-week stops at Saturday so that
    /// `*/2` does not also hit Sunday a second time as 7.
    fn open_max(self) -> u32 {
        match self {
            Kind::Dow => 6,
            _ => self.bounds().1,
        }
    }

    fn names(self) -> &'static [&'static str] {
        match self {
            Kind::Month => &MONTH_NAMES,
            Kind::Dow => &DOW_NAMES,
            _ => &[],
        }
    }
}

/// A field's parsed content, before it is folded into the schedule.
#[derive(Default)]
struct FieldSet {
    /// Bit `v` set for every plain value `v` (day-of-week 7 folded to 0;
    /// years stored relative to `MIN_YEAR`).
    bits: [u64; YEAR_WORDS],
    /// `L` in day-of-month.
    last: bool,
    /// Day-of-week `w#n`: bit n of `nth[w]`.
    nth: [u8; 7],
    /// Day-of-week `wL`: bit w.
    last_dow: u8,
}

impl FieldSet {
    fn set(&mut self, kind: Kind, v: u32) {
        let i = match kind {
            Kind::Dow => v % 7,
            Kind::Year => v - MIN_YEAR as u32,
            _ => v,
        } as usize;
        self.bits[i / 64] |= 1 << (i % 64);
    }
}

/// Builds an error for `token`, which must be a subslice of `expr`.
fn err(expr: &str, token: &str, message: String) -> CronError {
    let offset = (token.as_ptr() as usize).saturating_sub(expr.as_ptr() as usize);
    CronError {
        message,
        offset,
        len: token.len(),
    }
}

/// Whitespace-separated tokens of `s` (subslices, so offsets survive).
fn tokens(s: &str) -> Vec<&str> {
    s.split_ascii_whitespace().collect()
}

pub(crate) fn parse(expr: &str) -> Result<CronSchedule, CronError> {
    let toks = tokens(expr);
    let Some(&first) = toks.first() else {
        return Err(CronError {
            message: "empty cron expression".into(),
            offset: 0,
            len: expr.len(),
        });
    };
    if first.starts_with('@') {
        return parse_macro(expr, &toks);
    }
    if toks.len() != 6 && toks.len() != 7 {
        let message = format!(
            "expected 6 fields (second minute hour day-of-month month day-of-week) or 7 \
             (+ year), found {}{}",
            toks.len(),
            if toks.len() == 5 {
                "; baton cron expressions start with a seconds field"
            } else {
                ""
            }
        );
        return Err(if toks.len() > 7 {
            // Underline the surplus fields.
            let start = toks[7].as_ptr() as usize - expr.as_ptr() as usize;
            let end = toks[toks.len() - 1].as_ptr() as usize - expr.as_ptr() as usize
                + toks[toks.len() - 1].len();
            CronError {
                message,
                offset: start,
                len: end - start,
            }
        } else {
            CronError {
                message,
                offset: 0,
                len: expr.len(),
            }
        });
    }
    build(expr, &toks)
}

fn parse_macro(expr: &str, toks: &[&str]) -> Result<CronSchedule, CronError> {
    let name = toks[0];
    let lower = name.to_ascii_lowercase();
    let fields = match lower.as_str() {
        "@yearly" | "@annually" => "0 0 0 1 1 *",
        "@monthly" => "0 0 0 1 * *",
        "@weekly" => "0 0 0 * * 0",
        "@daily" | "@midnight" => "0 0 0 * * *",
        "@hourly" => "0 0 * * * *",
        "@every" => {
            return Err(err(
                expr,
                name,
                "`@every` is an interval, not a cron expression; it is scheduled by the \
                 pack layer, not by baton-cron"
                    .into(),
            ));
        }
        _ => {
            return Err(err(
                expr,
                name,
                format!(
                    "unknown macro `{name}`; expected one of @yearly, @annually, @monthly, \
                     @weekly, @daily, @midnight, @hourly"
                ),
            ));
        }
    };
    if let Some(extra) = toks.get(1) {
        return Err(err(
            expr,
            extra,
            format!("unexpected `{extra}` after `{name}`; a macro stands alone"),
        ));
    }
    // The expansion is a constant known to parse; errors (impossible) would
    // point into the expansion, so re-anchor them on the macro token.
    build(fields, &tokens(fields)).map_err(|e| err(expr, name, e.message))
}

/// Parses 6 or 7 field tokens (subslices of `expr`).
fn build(expr: &str, toks: &[&str]) -> Result<CronSchedule, CronError> {
    let mut sets: [FieldSet; 7] = Default::default();
    for (i, tok) in toks.iter().enumerate() {
        sets[i] = parse_field(expr, Kind::ORDER[i], tok)?;
    }
    if toks.len() == 6 {
        let y = &mut sets[6];
        for v in MIN_YEAR as u32..=MAX_YEAR as u32 {
            y.set(Kind::Year, v);
        }
    }

    // Vixie: a day field is "unrestricted" if its text starts with `*` (even
    // `*/2`) or is `?`; only then does the other day field alone decide.
    let star = |t: &str| t.starts_with('*') || t == "?";
    let [sec, min, hour, dom, month, dow, year] = sets;
    let sched = CronSchedule {
        seconds: sec.bits[0],
        minutes: min.bits[0],
        hours: hour.bits[0] as u32,
        dom: dom.bits[0] as u32,
        dom_last: dom.last,
        months: month.bits[0] as u16,
        dow: dow.bits[0] as u8,
        dow_nth: dow.nth,
        dow_last: dow.last_dow,
        dow_special: dow.last_dow != 0 || dow.nth.iter().any(|&n| n != 0),
        dom_star: star(toks[3]),
        dow_star: star(toks[5]),
        years: year.bits,
        hour_wildcard: hour.bits[0] as u32 == ALL_HOURS,
    };

    // Reject schedules that can never fire (February 30th, the fifth Monday
    // of a month that is the 1st, a non-leap year's February 29th, ...). The
    // real search over the whole supported range is exact and cheap: the
    // day-level scan costs one bitmask per allowed month.
    if sched.next_match(MIN_LOCAL).is_none() {
        let last = toks[toks.len() - 1];
        let start = toks[3].as_ptr() as usize - expr.as_ptr() as usize;
        let end = last.as_ptr() as usize - expr.as_ptr() as usize + last.len();
        return Err(CronError {
            message: format!(
                "the expression can never fire: no allowed month{} has a day matching \
                 day-of-month `{}` / day-of-week `{}` (e.g. February 30)",
                if toks.len() == 7 {
                    " of an allowed year"
                } else {
                    ""
                },
                toks[3],
                toks[5]
            ),
            offset: start,
            len: end - start,
        });
    }
    Ok(sched)
}

fn parse_field(expr: &str, kind: Kind, field: &str) -> Result<FieldSet, CronError> {
    let fname = kind.name();
    let mut set = FieldSet::default();
    if field == "?" {
        if matches!(kind, Kind::Dom | Kind::Dow) {
            let (lo, hi) = (kind.bounds().0, kind.open_max());
            for v in lo..=hi {
                set.set(kind, v);
            }
            return Ok(set);
        }
        return Err(err(
            expr,
            field,
            format!("{fname}: `?` is only allowed in day-of-month and day-of-week"),
        ));
    }

    let mut rest = field;
    loop {
        let (item, more) = match rest.find(',') {
            Some(i) => (&rest[..i], Some(&rest[i + 1..])),
            None => (rest, None),
        };
        if item.is_empty() {
            // Underline the comma next to the hole (a zero-length token is
            // invisible).
            let at = item.as_ptr() as usize - field.as_ptr() as usize;
            let comma = if more.is_some() {
                &field[at..at + 1]
            } else {
                &field[at - 1..at]
            };
            return Err(err(
                expr,
                comma,
                format!("{fname}: empty list item in `{field}`"),
            ));
        }
        parse_item(expr, kind, field, item, &mut set)?;
        match more {
            Some(m) => rest = m,
            None => break,
        }
    }
    Ok(set)
}

/// One comma-separated item of `field` (a value, range, step or special
/// day form) into `set`.
fn parse_item(
    expr: &str,
    kind: Kind,
    field: &str,
    item: &str,
    set: &mut FieldSet,
) -> Result<(), CronError> {
    refuse_unsupported(expr, kind, field, item)?;
    let (base, step) = match item.find('/') {
        Some(i) => (&item[..i], Some(&item[i + 1..])),
        None => (item, None),
    };
    let step = match step {
        None => None,
        Some(s) => Some(parse_step(expr, kind, item, s)?),
    };
    if special_day(expr, kind, item, base, step, set)? {
        return Ok(());
    }
    // Plain forms: `*`, `a`, `a-b`, each with an optional step.
    let (from, to) = plain_range(expr, kind, item, base, step)?;
    let step = step.unwrap_or(1);
    let mut v = from;
    while v <= to {
        set.set(kind, v);
        v += step;
    }
    Ok(())
}

/// Forms this parser refuses by name: `?` inside a list, `W`.
fn refuse_unsupported(expr: &str, kind: Kind, field: &str, item: &str) -> Result<(), CronError> {
    let fname = kind.name();
    if item == "?" {
        return Err(err(
            expr,
            item,
            format!("{fname}: `?` must stand alone, found in `{field}`"),
        ));
    }
    if kind == Kind::Dom && item.bytes().any(|b| b.eq_ignore_ascii_case(&b'W')) {
        return Err(err(
            expr,
            item,
            format!("{fname}: `W` (nearest weekday) is not supported, in `{item}`"),
        ));
    }
    Ok(())
}

/// The step `s` after the `/` of `item`: a positive number.
fn parse_step(expr: &str, kind: Kind, item: &str, s: &str) -> Result<u32, CronError> {
    let fname = kind.name();
    let n = parse_number(s).ok_or_else(|| {
        err(
            expr,
            if s.is_empty() { item } else { s },
            format!("{fname}: invalid step `{s}` in `{item}`; expected a positive number"),
        )
    })?;
    if n == 0 {
        return Err(err(
            expr,
            s,
            format!("{fname}: step must be at least 1, in `{item}`"),
        ));
    }
    Ok(n)
}

/// The special day forms (`L`, `w#n`, `wL`) into `set`: `Ok(true)` if
/// `base` was one, `Ok(false)` for a plain form.
fn special_day(
    expr: &str,
    kind: Kind,
    item: &str,
    base: &str,
    step: Option<u32>,
    set: &mut FieldSet,
) -> Result<bool, CronError> {
    let fname = kind.name();
    let no_step = |what: &str| -> Result<(), CronError> {
        match step {
            Some(_) => Err(err(
                expr,
                item,
                format!("{fname}: a step cannot follow {what}, in `{item}`"),
            )),
            None => Ok(()),
        }
    };
    if base.eq_ignore_ascii_case("L") {
        return match kind {
            Kind::Dom => {
                no_step("`L`")?;
                set.last = true;
                Ok(true)
            }
            Kind::Dow => Err(err(
                expr,
                base,
                format!(
                    "{fname}: bare `L` is ambiguous; write e.g. `5L` (last Friday) or use `L` \
                     in day-of-month"
                ),
            )),
            _ => Err(err(
                expr,
                base,
                format!("{fname}: `L` is only allowed in day-of-month and day-of-week"),
            )),
        };
    }
    if let Some(hash) = base.find('#') {
        if kind != Kind::Dow {
            return Err(err(
                expr,
                base,
                format!("{fname}: `#` is only allowed in day-of-week, in `{base}`"),
            ));
        }
        no_step("`#`")?;
        let (w_txt, n_txt) = (&base[..hash], &base[hash + 1..]);
        let w = parse_value(expr, kind, w_txt, item)?;
        let n = match parse_number(n_txt) {
            Some(n @ 1..=5) => n,
            _ => {
                return Err(err(
                    expr,
                    if n_txt.is_empty() { base } else { n_txt },
                    format!("{fname}: occurrence `{n_txt}` in `{base}` must be 1-5"),
                ));
            }
        };
        set.nth[(w % 7) as usize] |= 1 << n;
        return Ok(true);
    }
    if kind == Kind::Dow && base.len() > 1 && base.ends_with(['L', 'l']) {
        no_step("`L`")?;
        let w = parse_value(expr, kind, &base[..base.len() - 1], item)?;
        set.last_dow |= 1 << (w % 7);
        return Ok(true);
    }
    Ok(false)
}

/// The values `*`, `a`, `a-b` (with a step if any) cover, inclusive.
fn plain_range(
    expr: &str,
    kind: Kind,
    item: &str,
    base: &str,
    step: Option<u32>,
) -> Result<(u32, u32), CronError> {
    if base == "*" {
        return Ok((kind.bounds().0, kind.open_max()));
    }
    if let Some(dash) = base.find('-') {
        let (a_txt, b_txt) = (&base[..dash], &base[dash + 1..]);
        let a = parse_value(expr, kind, a_txt, item)?;
        let b = parse_value(expr, kind, b_txt, item)?;
        if a > b {
            return Err(err(
                expr,
                base,
                format!(
                    "{}: range `{base}` is reversed; ranges do not wrap around, \
                     write it as a list",
                    kind.name()
                ),
            ));
        }
        return Ok((a, b));
    }
    let a = parse_value(expr, kind, base, item)?;
    Ok(match step {
        // `a/n` runs to the end of the field.
        Some(_) => (a, kind.open_max().max(a)),
        None => (a, a),
    })
}

/// A decimal number of at most 9 digits (anything longer is out of every
/// range anyway).
fn parse_number(s: &str) -> Option<u32> {
    if s.is_empty() || s.len() > 9 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// One value: a number in the field's bounds or, for month / day-of-week,
/// a three-letter English name (any case).
fn parse_value(expr: &str, kind: Kind, txt: &str, item: &str) -> Result<u32, CronError> {
    let fname = kind.name();
    let (lo, hi) = kind.bounds();
    if txt.is_empty() {
        return Err(err(
            expr,
            item,
            format!("{fname}: missing value in `{item}`"),
        ));
    }
    if txt.bytes().all(|b| b.is_ascii_digit()) {
        return match parse_number(txt) {
            Some(v) if (lo..=hi).contains(&v) => Ok(v),
            _ => Err(err(
                expr,
                txt,
                format!("{fname}: value `{txt}` out of range {lo}-{hi}"),
            )),
        };
    }
    let names = kind.names();
    if let Some(i) = names.iter().position(|n| n.eq_ignore_ascii_case(txt)) {
        return Ok(if kind == Kind::Month {
            i as u32 + 1
        } else {
            i as u32
        });
    }
    Err(err(
        expr,
        txt,
        if names.is_empty() {
            format!("{fname}: invalid value `{txt}`; expected a number {lo}-{hi}")
        } else {
            format!(
                "{fname}: invalid value `{txt}`; expected a number {lo}-{hi} or a name \
                 ({}-{})",
                names[0],
                names[names.len() - 1]
            )
        },
    ))
}
