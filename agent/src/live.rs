//! The terminal view of `baton-agent run`, as a `tracing` layer: it prints
//! each executed attempt (`baton::firing` events) with its scheduled
//! instant, lateness and result, and core events (`baton::event`), and keeps
//! its own lateness summary from those events. The runtime knows nothing of
//! it: what it shows is exactly what the runtime reports.
//!
//! On a terminal the summary is a status line redrawn in place under the
//! scrolling lines; otherwise everything is plain lines and nothing is
//! printed periodically. Output errors (a closed pipe) silence the view;
//! they never stop the agent.

use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::sync::Mutex;

use hdrhistogram::Histogram;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

use crate::runtime::feedback::{EVENT_TARGET, FIRING_TARGET};
use baton_proto::time::fmt_ns;

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

/// The fields of one event, as text.
#[derive(Default)]
struct Fields {
    pairs: Vec<(&'static str, String)>,
    message: String,
}

impl Fields {
    fn get(&self, k: &str) -> &str {
        self.pairs
            .iter()
            .find(|(n, _)| *n == k)
            .map_or("", |(_, v)| v.as_str())
    }
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let mut s = String::new();
        let _ = write!(s, "{value:?}");
        if field.name() == "message" {
            self.message = s;
        } else {
            self.pairs.push((field.name(), s));
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.pairs.push((field.name(), value.to_string()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.pairs.push((field.name(), value.to_string()));
    }
}

struct State {
    hist: Histogram<u64>,
    /// Stdout failed (closed pipe): stop writing.
    broken: bool,
}

/// The live view layer.
pub struct LiveView {
    tty: bool,
    quiet: bool,
    state: Mutex<State>,
}

impl std::fmt::Debug for LiveView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveView")
            .field("quiet", &self.quiet)
            .finish()
    }
}

impl LiveView {
    /// `quiet`: no line per firing (events and the final summary only).
    pub fn new(quiet: bool) -> Self {
        LiveView {
            tty: std::io::stdout().is_terminal(),
            quiet,
            state: Mutex::new(State {
                hist: crate::runtime::breakdown::lateness_histogram(),
                broken: false,
            }),
        }
    }

    fn line(&self, st: &mut State, text: &str, status: bool) {
        if st.broken {
            return;
        }
        let mut out = std::io::stdout().lock();
        let r = if self.tty {
            // Clear the status line, print, redraw the status line.
            write!(out, "\r\x1b[2K{text}\n").and_then(|()| {
                if status {
                    write!(out, "\x1b[7m {} \x1b[0m", summary(&st.hist))
                } else {
                    Ok(())
                }
            })
        } else {
            writeln!(out, "{text}")
        }
        .and_then(|()| out.flush());
        if r.is_err() {
            st.broken = true;
        }
    }

    /// Whether firings are left out.
    pub fn quiet(&self) -> bool {
        self.quiet
    }

    /// The summary line at exit, from the run's own lateness histogram.
    pub fn finish(&self, hist: &Histogram<u64>) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let text = format!("summary: {}", summary(hist));
        if self.tty {
            let _ = write!(std::io::stdout(), "\r\x1b[2K");
        }
        self.line(&mut st, &text, false);
    }
}

/// The layer handed to the subscriber; the caller keeps the view to print
/// the final summary.
#[derive(Debug, Clone)]
pub struct LiveLayer(pub std::sync::Arc<LiveView>);

impl<S: Subscriber> Layer<S> for LiveLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        self.0.on_event(event);
    }
}

impl LiveView {
    fn on_event(&self, event: &Event<'_>) {
        let target = event.metadata().target();
        if target != FIRING_TARGET && target != EVENT_TARGET {
            return;
        }
        let mut f = Fields::default();
        event.record(&mut f);
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if target == FIRING_TARGET {
            let late: i64 = f.get("lateness_ns").parse().unwrap_or(0);
            let result = f.get("result");
            let ran = !matches!(result, "late" | "withdrawn" | "stopped");
            if ran {
                st.hist.saturating_record(late.max(0) as u64);
            }
            if self.quiet {
                return;
            }
            let scheduled = f
                .get("scheduled_ns")
                .parse::<i64>()
                .map(|n| baton_proto::RefTime::from_nanos(n).to_string())
                .unwrap_or_default();
            let detail = f.get("detail");
            let text = format!(
                "{scheduled}  {:<16} {:<12} late {:>9}  {result}{}{detail}",
                f.get("instruction"),
                f.get("action"),
                fmt_ns(late),
                if detail.is_empty() { "" } else { " " },
            );
            self.line(&mut st, &text, true);
        } else {
            let ev = f.get("event");
            if ev == "ok" || (self.quiet && ev == "skip") {
                return;
            }
            let who = match f.get("instruction") {
                "" => f.get("pack").to_string(),
                i => i.to_string(),
            };
            let text = format!("{:<16} {:<12} {}", who, ev, f.get("detail"));
            self.line(&mut st, &text, true);
        }
    }
}
