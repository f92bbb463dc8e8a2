//! Domain values in the words and forms operators read, the same in the
//! CLI's tables and the dashboard's pages.

/// ns since the epoch as RFC 3339 (UTC, ms), or `-` for 0.
pub fn instant(ns: i64) -> String {
    if ns == 0 {
        return "-".into();
    }
    match jiff::Timestamp::from_nanosecond(i128::from(ns)) {
        Ok(t) => t.strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(),
        Err(_) => ns.to_string(),
    }
}

/// A signed duration in ns, short (`1.2ms`, `-350µs`, `3.0s`).
pub fn span(ns: i64) -> String {
    let a = ns.unsigned_abs() as f64;
    let sign = if ns < 0 { "-" } else { "" };
    if a < 1_000.0 {
        format!("{ns}ns")
    } else if a < 1_000_000.0 {
        format!("{sign}{:.1}µs", a / 1e3)
    } else if a < 1_000_000_000.0 {
        format!("{sign}{:.1}ms", a / 1e6)
    } else {
        format!("{sign}{:.2}s", a / 1e9)
    }
}

/// The operator's word for an outcome.
pub fn outcome(o: i32) -> &'static str {
    baton_proto::feedback::Outcome::from_code(o).map_or("unspecified", |o| o.as_str())
}

/// The operator's word for a reason (`null` for none).
pub fn reason(r: i32) -> Option<&'static str> {
    baton_proto::feedback::Reason::from_code(r).map(|r| r.as_str())
}
