//! Scalars and small collections: strings, ids, numbers, durations,
//! instants. Each reports its own error and returns `None` on failure.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use jiff::civil::DateTime;
use jiff::tz::{Disambiguation, TimeZone};

use super::MAX_ID_LEN;
use super::fields::Ctx;
use crate::time::{RefTime, format_duration, parse_duration};
use crate::yaml::{Node, Pos, Value};

pub(super) fn string(cx: &mut Ctx, node: &Node, what: &str) -> Option<String> {
    match &node.value {
        Value::Scalar { text, .. } if !node.is_null() => Some(text.clone()),
        _ => {
            cx.err(
                node.pos,
                format!("{what} must be a string, found {}", node.kind()),
            );
            None
        }
    }
}

/// True for a pack, tenant or instruction id: `[a-z0-9][a-z0-9._-]*`, at
/// most [`MAX_ID_LEN`] bytes. Public so that tools naming a pack (the
/// agent's `cancel`) check ids by the same rule.
pub fn is_ident(s: &str) -> bool {
    let ok_first = s
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    let ok_rest = s
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-'));
    ok_first && ok_rest && s.len() <= MAX_ID_LEN
}

/// [`is_ident`] with the one message every part of baton gives for a bad
/// id (`what`: "pack id", "agent id", ...); a long `s` is cut in the
/// message.
pub fn check_ident(what: &str, s: &str) -> Result<(), String> {
    if is_ident(s) {
        return Ok(());
    }
    let shown: String = s.chars().take(80).collect();
    let more = if shown.len() < s.len() { "…" } else { "" };
    Err(format!(
        "invalid {what} `{shown}{more}`: use lowercase letters, digits, `.`, `_`, `-`, starting with a letter or digit, at most {MAX_ID_LEN} characters"
    ))
}

pub(super) fn ident(cx: &mut Ctx, node: &Node, what: &str) -> Option<String> {
    let s = string(cx, node, what)?;
    if let Err(m) = check_ident(what, &s) {
        cx.err(node.pos, m);
        return None;
    }
    Some(s)
}

pub(super) fn plain_scalar(node: &Node) -> Option<&str> {
    match &node.value {
        Value::Scalar { text, plain: true } => Some(text),
        _ => None,
    }
}

/// `` `text` `` for a scalar, its kind (`a list`) otherwise: for messages.
pub(super) fn found(node: &Node) -> String {
    node.as_scalar()
        .map_or(node.kind().to_string(), |t| format!("`{t}`"))
}

pub(super) fn uint(cx: &mut Ctx, node: &Node, what: &str, max: u64) -> Option<u64> {
    let parsed = plain_scalar(node)
        .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|t| t.parse::<u64>().ok());
    match parsed {
        Some(v) if v <= max => Some(v),
        Some(v) => {
            cx.err(node.pos, format!("{what} must be at most {max}, found {v}"));
            None
        }
        None => {
            let found = found(node);
            cx.err(
                node.pos,
                format!("{what} must be a whole number, found {found}"),
            );
            None
        }
    }
}

pub(super) fn float(cx: &mut Ctx, node: &Node, what: &str) -> Option<f64> {
    match plain_scalar(node).and_then(|t| t.parse::<f64>().ok()) {
        Some(v) if v.is_finite() => Some(v),
        _ => {
            let found = found(node);
            cx.err(node.pos, format!("{what} must be a number, found {found}"));
            None
        }
    }
}

pub(super) fn duration(cx: &mut Ctx, node: &Node, what: &str) -> Option<Duration> {
    let Some(text) = node.as_scalar().filter(|_| !node.is_null()) else {
        cx.err(
            node.pos,
            format!(
                "{what} must be a duration like `500ms`, found {}",
                node.kind()
            ),
        );
        return None;
    };
    match parse_duration(text) {
        Ok(d) => Some(d),
        Err(e) => {
            cx.err(node.pos, format!("{what}: {e}"));
            None
        }
    }
}

pub(super) fn positive_duration(cx: &mut Ctx, node: &Node, what: &str) -> Option<Duration> {
    let d = duration(cx, node, what)?;
    if d.is_zero() {
        cx.err(node.pos, format!("{what} must be greater than zero"));
        return None;
    }
    Some(d)
}

/// A duration of at least `min`; `why` ends the message when it is not.
pub(super) fn duration_at_least(
    cx: &mut Ctx,
    node: &Node,
    what: &str,
    min: Duration,
    why: &str,
) -> Option<Duration> {
    let d = duration(cx, node, what)?;
    if d < min {
        cx.err(
            node.pos,
            format!(
                "{what} must be at least {}, found {}{why}",
                format_duration(min),
                format_duration(d)
            ),
        );
        return None;
    }
    Some(d)
}

/// Why an instant was refused.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum InstantError {
    /// Neither RFC 3339 nor a local date-time.
    Syntax,
    /// A real date-time, outside what [`RefTime`] can hold.
    Range,
}

/// An RFC 3339 instant, or a wall time without offset in `tz`.
///
/// A wall time that falls in a DST gap or fold resolves like cron does
/// (docs/design.md "Time semantics"): a gap time uses the offset in force before
/// the gap, a repeated time its first pass — jiff's `Compatible` rule.
pub(super) fn parse_instant(tz: &TimeZone, text: &str) -> Result<RefTime, InstantError> {
    let ts = match text.parse::<Timestamp>() {
        Ok(ts) => ts,
        Err(_) => match text.parse::<DateTime>() {
            Ok(dt) => tz
                .to_ambiguous_timestamp(dt)
                .disambiguate(Disambiguation::Compatible)
                .map_err(|_| InstantError::Range)?,
            Err(_) if well_formed_in_2000(text) => return Err(InstantError::Range),
            Err(_) => return Err(InstantError::Syntax),
        },
    };
    RefTime::from_timestamp(ts).ok_or(InstantError::Range)
}

/// True if `text` is a valid date-time once its year is replaced by 2000:
/// then only the year was wrong, e.g. `9999-12-31T23:59:59Z`, which is
/// past the end of jiff's timestamps and so never reaches the range check.
fn well_formed_in_2000(text: &str) -> bool {
    let b = text.as_bytes();
    if b.len() < 5 || !b[..4].iter().all(u8::is_ascii_digit) || b[4] != b'-' {
        return false;
    }
    let moved = format!("2000{}", &text[4..]);
    moved.parse::<Timestamp>().is_ok() || moved.parse::<DateTime>().is_ok()
}

/// The supported range of instants, for messages.
pub(super) fn instant_range() -> String {
    format!(
        "{} to {} (nanoseconds since 1970 in a signed 64-bit integer)",
        RefTime::MIN,
        RefTime::MAX
    )
}

pub(super) fn instant(cx: &mut Ctx, node: &Node, what: &str) -> Option<RefTime> {
    let Some(text) = node.as_scalar().filter(|_| !node.is_null()) else {
        cx.err(
            node.pos,
            format!("{what} must be a date-time, found {}", node.kind()),
        );
        return None;
    };
    match parse_instant(&cx.tz, text) {
        Ok(t) => Some(t),
        Err(InstantError::Syntax) => {
            cx.err(
                node.pos,
                format!(
                    "{what}: invalid date-time `{text}`: write RFC 3339 (`2026-12-01T10:00:00Z`, `2026-12-01T11:00:00+01:00`) or a local time without offset (`2026-12-01T10:00:00`) in the pack's timezone"
                ),
            );
            None
        }
        Err(InstantError::Range) => {
            cx.err(
                node.pos,
                format!(
                    "{what}: `{text}` is outside the supported range of instants: {}",
                    instant_range()
                ),
            );
            None
        }
    }
}

pub(super) fn string_list(cx: &mut Ctx, node: &Node, what: &str) -> Option<Vec<(String, Pos)>> {
    let Value::Seq(items) = &node.value else {
        cx.err(
            node.pos,
            format!("{what} must be a list, found {}", node.kind()),
        );
        return None;
    };
    let mut out = Vec::with_capacity(items.len());
    let mut ok = true;
    for item in items {
        match string(cx, item, &format!("each entry of {what}")) {
            Some(s) => out.push((s, item.pos)),
            None => ok = false,
        }
    }
    ok.then_some(out)
}

pub(super) fn string_map(
    cx: &mut Ctx,
    node: &Node,
    what: &str,
) -> Option<BTreeMap<String, String>> {
    let Value::Map(entries) = &node.value else {
        cx.err(
            node.pos,
            format!("{what} must be a mapping, found {}", node.kind()),
        );
        return None;
    };
    let mut out = BTreeMap::new();
    let mut ok = true;
    for (k, v) in entries {
        let key = k.as_scalar().unwrap_or_default().to_string();
        match string(cx, v, &format!("{what}.{key}")) {
            Some(s) => {
                out.insert(key, s);
            }
            None => ok = false,
        }
    }
    ok.then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_parse_in_the_zone_and_refuse_out_of_range() {
        let berlin = TimeZone::get("Europe/Berlin").expect("zone");
        let utc = parse_instant(&TimeZone::UTC, "2026-12-01T10:00:00Z");
        let local = parse_instant(&berlin, "2026-12-01T11:00:00");
        assert_eq!(utc, local);
        assert!(utc.is_ok());
        assert_eq!(
            parse_instant(&TimeZone::UTC, "9999-12-31T23:59:59Z"),
            Err(InstantError::Range)
        );
        assert_eq!(
            parse_instant(&TimeZone::UTC, "1600-01-01T00:00:00"),
            Err(InstantError::Range)
        );
        assert_eq!(
            parse_instant(&TimeZone::UTC, "tomorrow"),
            Err(InstantError::Syntax)
        );
        assert_eq!(
            parse_instant(&TimeZone::UTC, "9999-13-31T23:59:59Z"),
            Err(InstantError::Syntax)
        );
        assert!(instant_range().starts_with("1677-09-21T00:12:43.145224192Z to 2262-04-11"));
    }

    #[test]
    fn ids() {
        assert!(is_ident("line3-startup"));
        assert!(is_ident("0.a_b"));
        assert!(!is_ident("Line3"));
        assert!(!is_ident("-a"));
        assert!(!is_ident(""));
        assert!(!is_ident(&"a".repeat(MAX_ID_LEN + 1)));
    }
}
