//! The dashboard's pages and the JSON behind them: each handler takes the
//! caller ([`super::auth::Who`]) and asks the application layer, so the
//! tenant and role rules are the CLI's own.

pub mod agent;
pub mod audit;
pub mod fleet;
pub mod layout;
pub mod metrics;
pub mod pack;
pub mod push;

use crate::ops::format;

/// An instant (ns since the epoch) for a table cell.
pub fn instant(ns: i64) -> String {
    format::instant(ns)
}

/// A duration or offset (ns), short.
pub fn span(ns: i64) -> String {
    format::span(ns)
}

/// How long ago `ns` was, from `now_ns`, in words (`-` for never).
pub fn ago(ns: i64, now_ns: i64) -> String {
    if ns <= 0 {
        return "never".into();
    }
    let s = (now_ns - ns).max(0) / 1_000_000_000;
    match s {
        0..=59 => format!("{s} s ago"),
        60..=3599 => format!("{} min ago", s / 60),
        3600..=86_399 => format!("{} h ago", s / 3600),
        _ => format!("{} d ago", s / 86_400),
    }
}
