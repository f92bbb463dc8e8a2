//! Quantities as people read them in logs and the terminal view: here,
//! below everything that logs, so the clock, exec and the runtime need not
//! import the terminal view to say a duration.

/// A signed duration in ns, readably (`850ns`, `-12.5us`, `3.2ms`,
/// `16.0s`).
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
