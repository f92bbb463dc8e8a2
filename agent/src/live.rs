//! The terminal view of `baton-agent run`: each firing with its scheduled
//! instant, lateness and result, and a running lateness summary.
//!
//! On a terminal the summary is a status line redrawn in place under the
//! scrolling firings; otherwise everything is plain lines (for logs and
//! tests), with a summary line every few seconds.

use std::io::{IsTerminal, Write};

use baton_sched::Event;
use hdrhistogram::Histogram;

use crate::runtime::{FiringRecord, View};

/// Writes to stdout; notes go to stderr.
#[derive(Debug)]
pub struct LiveView {
    tty: bool,
    quiet: bool,
    firings: u64,
    ticks: u64,
}

/// A signed duration in ns, readably (`850ns`, `-12.5us`, `3.2ms`).
pub(crate) fn fmt_ns(ns: i64) -> String {
    let a = ns.unsigned_abs();
    let s = if a < 10_000 {
        format!("{a}ns")
    } else if a < 10_000_000 {
        format!("{:.1}us", a as f64 / 1e3)
    } else {
        format!("{:.1}ms", a as f64 / 1e6)
    };
    if ns < 0 { format!("-{s}") } else { s }
}

/// A histogram value (ns) for [`fmt_ns`]; values are bounded by 60 s.
fn hist_ns(v: u64) -> String {
    fmt_ns(i64::try_from(v).unwrap_or(i64::MAX))
}

/// `p50 … p99 … max …` of a lateness histogram.
pub fn summary(h: &Histogram<u64>) -> String {
    if h.is_empty() {
        return "no firings yet".into();
    }
    format!(
        "{} firings  lateness p50 {}  p99 {}  max {}",
        h.len(),
        hist_ns(h.value_at_quantile(0.5)),
        hist_ns(h.value_at_quantile(0.99)),
        hist_ns(h.max())
    )
}

impl LiveView {
    /// `quiet`: only notes and summaries (no line per firing).
    pub fn new(quiet: bool) -> Self {
        LiveView {
            tty: std::io::stdout().is_terminal(),
            quiet,
            firings: 0,
            ticks: 0,
        }
    }

    fn line(&mut self, text: &str, hist: Option<&Histogram<u64>>) {
        let mut out = std::io::stdout().lock();
        if self.tty {
            // Clear the status line, print, redraw the status line.
            let _ = write!(out, "\r\x1b[2K{text}\n");
            if let Some(h) = hist {
                let _ = write!(out, "\x1b[7m {} \x1b[0m", summary(h));
            }
        } else {
            let _ = writeln!(out, "{text}");
        }
        let _ = out.flush();
    }
}

impl View for LiveView {
    fn note(&mut self, msg: &str) {
        if self.tty {
            print!("\r\x1b[2K");
        }
        eprintln!("baton-agent: {msg}");
    }

    fn firing(&mut self, r: &FiringRecord, hist: &Histogram<u64>) {
        self.firings += 1;
        if self.quiet {
            return;
        }
        let late = fmt_ns(r.lateness_ns);
        let text = format!(
            "{}  {:<16} {:<12} late {:>9}  {}",
            r.scheduled, r.instruction, r.action, late, r.result
        );
        self.line(&text, Some(hist));
    }

    fn event(&mut self, e: &Event) {
        let detail = e.detail();
        let text = format!(
            "{}  {:<16} {:<12} {}",
            e.t,
            e.instruction.as_deref().unwrap_or(&e.pack.to_string()),
            e.kind.name(),
            detail
        );
        self.line(&text, None);
    }

    fn tick(&mut self, hist: &Histogram<u64>) {
        self.ticks += 1;
        if self.tty {
            let mut out = std::io::stdout().lock();
            let _ = write!(out, "\r\x1b[2K\x1b[7m {} \x1b[0m", summary(hist));
            let _ = out.flush();
        } else if self.ticks.is_multiple_of(5) || self.quiet {
            println!("summary: {}", summary(hist));
        }
    }
}
