//! Prometheus metrics for the agent: the text exposition format (version
//! 0.0.4, what `promtool check metrics` and every Prometheus server read)
//! and the one HTTP request a scraper makes.
//!
//! Why by hand, when the controller's exposition is `prometheus-client`'s:
//! that crate's metric types are updated in place behind locks (a
//! histogram's `observe` takes a mutex; a label family's lookup takes a
//! read-write lock that its encoder holds while it renders the family, and
//! a new label set waits for it), and a firing's count must not wait on
//! the metrics thread: the dispatcher counts on its SCHED_FIFO thread, the
//! control thread must never wait on the metrics server (habit 13), and a
//! lock shared with a thread of normal priority is a priority inversion
//! waiting to happen. Here the owner of the values keeps them as it likes
//! (plain counters on its own thread, atomics) and hands a snapshot to the
//! metrics thread, which renders it with [`Encoder`]: HELP and TYPE lines,
//! samples with escaped labels, histograms with cumulative buckets. That
//! is all of the format a server needs, in a page of code without
//! dependencies; `tests/tests/metrics.rs` checks the real output with
//! `promtool check metrics`.
//!
//! HTTP: [`parse_request`] reads a request head (sans IO), [`response`]
//! writes the answer; [`serve_blocking`] is the small blocking server the
//! agent runs on its own thread (one connection at a time, read and write
//! timeouts, a bounded request).

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::Duration;

/// `Content-Type` of the text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// Largest request head read; a longer one is answered 431 and closed.
pub const MAX_REQUEST: usize = 8 * 1024;
/// How long one connection may take to send its request or read the
/// answer (a scraper that stalls holds the one-at-a-time server no longer).
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// A metric family's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (name ends in `_total`).
    Counter,
    /// Goes up and down.
    Gauge,
    /// Cumulative buckets, `_sum` and `_count`.
    Histogram,
}

impl Kind {
    fn word(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// Builds one exposition. Each family is written once (`family`), then its
/// samples; the caller keeps a family's samples together.
#[derive(Debug, Default)]
pub struct Encoder {
    out: String,
}

impl Encoder {
    /// An empty exposition.
    pub fn new() -> Encoder {
        Encoder::default()
    }

    /// `# HELP` and `# TYPE` of a family (`help`: one line; a backslash
    /// or a newline in it is escaped).
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) {
        debug_assert!(valid_name(name), "metric name {name:?}");
        debug_assert!(kind != Kind::Counter || name.ends_with("_total"));
        let _ = write!(self.out, "# HELP {name} ");
        for c in help.chars() {
            match c {
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                c => self.out.push(c),
            }
        }
        let _ = writeln!(self.out, "\n# TYPE {name} {}", kind.word());
    }

    /// One sample: `name{labels} value`.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                debug_assert!(valid_label(k), "label name {k:?}");
                if i > 0 {
                    self.out.push(',');
                }
                self.out.push_str(k);
                self.out.push_str("=\"");
                escape_label(&mut self.out, v);
                self.out.push('"');
            }
            self.out.push('}');
        }
        self.out.push(' ');
        push_value(&mut self.out, value);
        self.out.push('\n');
    }

    /// A family of one unlabelled sample.
    pub fn single(&mut self, name: &str, kind: Kind, help: &str, value: f64) {
        self.family(name, kind, help);
        self.sample(name, &[], value);
    }

    /// A histogram's samples (after its [`Encoder::family`]): `bounds` are
    /// the buckets' upper bounds, ascending; `counts[i]` the observations
    /// in bucket `i` alone (not cumulative; one more than `bounds` for
    /// `+Inf`). Written cumulative, then `_sum` and `_count`.
    pub fn histogram(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        bounds: &[f64],
        counts: &[u64],
        sum: f64,
    ) {
        debug_assert_eq!(counts.len(), bounds.len() + 1);
        let bucket = format!("{name}_bucket");
        let les: Vec<String> = bounds
            .iter()
            .map(|b| fmt_value(*b))
            .chain(std::iter::once("+Inf".to_string()))
            .collect();
        let mut cum = 0u64;
        for (c, le) in counts.iter().zip(&les) {
            cum = cum.saturating_add(*c);
            let mut l: Vec<(&str, &str)> = labels.to_vec();
            l.push(("le", le));
            self.sample(&bucket, &l, cum as f64);
        }
        self.sample(&format!("{name}_sum"), labels, sum);
        self.sample(&format!("{name}_count"), labels, cum as f64);
    }

    /// The exposition text.
    pub fn finish(self) -> String {
        self.out
    }
}

/// `[a-zA-Z_:][a-zA-Z0-9_:]*`.
pub fn valid_name(s: &str) -> bool {
    let mut c = s.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || f == '_' || f == ':')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_' || x == ':')
}

/// `[a-zA-Z_][a-zA-Z0-9_]*`.
fn valid_label(s: &str) -> bool {
    let mut c = s.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || f == '_')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_')
}

/// A label value: backslash, double quote and newline escaped.
fn escape_label(out: &mut String, v: &str) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// A sample value as the format spells it (`+Inf`, `-Inf`, `NaN`; Rust's
/// shortest round-trip decimal otherwise, which never uses an exponent the
/// format would refuse).
pub fn fmt_value(v: f64) -> String {
    let mut s = String::new();
    push_value(&mut s, v);
    s
}

fn push_value(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("NaN");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
    } else {
        let _ = write!(out, "{v}");
    }
}

/// Nanoseconds as seconds (the base unit).
pub fn secs(ns: i64) -> f64 {
    ns as f64 / 1e9
}

/// What a request head asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Request {
    /// Not all of the head yet.
    Incomplete,
    /// `GET` (or `HEAD`, `head: true`) of a path (query string removed).
    Get {
        /// The path, e.g. `/metrics`.
        path: String,
        /// A `HEAD` request: the answer has no body.
        head: bool,
    },
    /// Another method.
    Method,
    /// Not an HTTP/1.x request head, or too long.
    Bad,
}

/// Parse what was read of a request so far (sans IO).
pub fn parse_request(buf: &[u8]) -> Request {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return if buf.len() >= MAX_REQUEST {
            Request::Bad
        } else {
            Request::Incomplete
        };
    };
    if end > MAX_REQUEST {
        return Request::Bad;
    }
    let Ok(head) = std::str::from_utf8(&buf[..end]) else {
        return Request::Bad;
    };
    let line = head.lines().next().unwrap_or_default();
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Request::Bad;
    };
    if !version.starts_with("HTTP/1.") || !target.starts_with('/') {
        return Request::Bad;
    }
    let path = target.split('?').next().unwrap_or_default().to_string();
    match method {
        "GET" => Request::Get { path, head: false },
        "HEAD" => Request::Get { path, head: true },
        _ => Request::Method,
    }
}

/// The answer to `req`: the exposition (`render` is called only for a
/// `GET /metrics`), 404 for another path, 405 for another method, 400 for
/// a bad request. Always `Connection: close`.
pub fn response(req: &Request, render: impl FnOnce() -> String) -> Vec<u8> {
    let (status, ctype, body, head) = match req {
        Request::Get { path, head } if path == "/metrics" => {
            ("200 OK", CONTENT_TYPE, render(), *head)
        }
        Request::Get { head, .. } => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "not found: metrics are at /metrics\n".to_string(),
            *head,
        ),
        Request::Method => (
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            "only GET and HEAD\n".to_string(),
            false,
        ),
        Request::Incomplete | Request::Bad => (
            "400 Bad Request",
            "text/plain; charset=utf-8",
            "bad request\n".to_string(),
            false,
        ),
    };
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if matches!(req, Request::Method) {
        out.push_str("Allow: GET, HEAD\r\n");
    }
    out.push_str("\r\n");
    let mut out = out.into_bytes();
    if !head {
        out.extend_from_slice(body.as_bytes());
    }
    out
}

/// Serve `/metrics` on `listener` forever, one connection at a time (a
/// scraper every few seconds needs no more), each bounded by
/// [`IO_TIMEOUT`] and [`MAX_REQUEST`]; the answer is written before the
/// next connection is taken. For a thread of its own: nothing
/// else waits on it, and it ends with the process.
pub fn serve_blocking(listener: TcpListener, render: impl Fn() -> String) {
    for conn in listener.incoming() {
        let Ok(mut s) = conn else {
            // Out of descriptors, say: do not spin on it.
            std::thread::sleep(Duration::from_millis(100));
            continue;
        };
        let _ = s.set_read_timeout(Some(IO_TIMEOUT));
        let _ = s.set_write_timeout(Some(IO_TIMEOUT));
        let mut buf = Vec::with_capacity(1024);
        let mut chunk = [0u8; 1024];
        // The whole request within the timeout, not each read: a client
        // trickling a byte at a time cannot hold the server longer.
        let until = std::time::Instant::now() + IO_TIMEOUT;
        let req = loop {
            if std::time::Instant::now() > until {
                break None;
            }
            match s.read(&mut chunk) {
                Ok(0) | Err(_) => break None,
                Ok(n) => {
                    buf.extend_from_slice(&chunk[..n]);
                    match parse_request(&buf) {
                        Request::Incomplete => continue,
                        r => break Some(r),
                    }
                }
            }
        };
        if let Some(req) = req {
            let _ = s.write_all(&response(&req, &render));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_samples_and_escaping() {
        let mut e = Encoder::new();
        e.family("baton_x_total", Kind::Counter, "A \\ help\nline.");
        e.sample(
            "baton_x_total",
            &[("pack", "a\"b\\c\nd"), ("result", "ok")],
            3.0,
        );
        e.single("baton_y_seconds", Kind::Gauge, "Y.", -0.000_001_5);
        e.single("baton_z", Kind::Gauge, "Z.", f64::INFINITY);
        let t = e.finish();
        assert_eq!(
            t,
            "# HELP baton_x_total A \\\\ help\\nline.\n\
             # TYPE baton_x_total counter\n\
             baton_x_total{pack=\"a\\\"b\\\\c\\nd\",result=\"ok\"} 3\n\
             # HELP baton_y_seconds Y.\n\
             # TYPE baton_y_seconds gauge\n\
             baton_y_seconds -0.0000015\n\
             # HELP baton_z Z.\n\
             # TYPE baton_z gauge\n\
             baton_z +Inf\n"
        );
    }

    #[test]
    fn histograms_are_cumulative_with_inf_sum_and_count() {
        let mut e = Encoder::new();
        e.family("h_seconds", Kind::Histogram, "H.");
        e.histogram("h_seconds", &[("a", "b")], &[0.001, 0.5], &[2, 0, 3], 7.25);
        assert_eq!(
            e.finish(),
            "# HELP h_seconds H.\n# TYPE h_seconds histogram\n\
             h_seconds_bucket{a=\"b\",le=\"0.001\"} 2\n\
             h_seconds_bucket{a=\"b\",le=\"0.5\"} 2\n\
             h_seconds_bucket{a=\"b\",le=\"+Inf\"} 5\n\
             h_seconds_sum{a=\"b\"} 7.25\n\
             h_seconds_count{a=\"b\"} 5\n"
        );
    }

    #[test]
    fn values_and_names() {
        assert_eq!(fmt_value(f64::NAN), "NaN");
        assert_eq!(fmt_value(f64::NEG_INFINITY), "-Inf");
        assert_eq!(fmt_value(1e-9), "0.000000001");
        assert_eq!(fmt_value(12.0), "12");
        assert_eq!(secs(1_500_000), 0.0015);
        assert!(valid_name("baton_agent_clock_offset_seconds"));
        assert!(!valid_name("9x") && !valid_name("a-b") && !valid_name(""));
    }

    #[test]
    fn requests() {
        assert_eq!(
            parse_request(b"GET /metrics HTTP/1.1\r\nHost: x\r\n"),
            Request::Incomplete
        );
        assert_eq!(
            parse_request(b"GET /metrics?x=1 HTTP/1.1\r\nHost: x\r\n\r\n"),
            Request::Get {
                path: "/metrics".into(),
                head: false
            }
        );
        assert_eq!(
            parse_request(b"POST /metrics HTTP/1.1\r\n\r\n"),
            Request::Method
        );
        assert_eq!(parse_request(b"GET metrics\r\n\r\n"), Request::Bad);
        assert_eq!(parse_request(&vec![b'a'; MAX_REQUEST]), Request::Bad);
    }

    #[test]
    fn responses() {
        let ok = response(
            &Request::Get {
                path: "/metrics".into(),
                head: false,
            },
            || "a 1\n".into(),
        );
        let ok = String::from_utf8(ok).expect("utf-8");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(ok.contains(CONTENT_TYPE) && ok.contains("Content-Length: 4\r\n"));
        assert!(ok.ends_with("\r\n\r\na 1\n"));
        let head = response(
            &Request::Get {
                path: "/metrics".into(),
                head: true,
            },
            || "a 1\n".into(),
        );
        assert!(
            String::from_utf8_lossy(&head)
                .ends_with("Content-Length: 4\r\nConnection: close\r\n\r\n")
        );
        let nf = response(
            &Request::Get {
                path: "/".into(),
                head: false,
            },
            || unreachable!("not rendered for another path"),
        );
        assert!(nf.starts_with(b"HTTP/1.1 404 "));
        assert!(response(&Request::Method, String::new).starts_with(b"HTTP/1.1 405 "));
        assert!(response(&Request::Bad, String::new).starts_with(b"HTTP/1.1 400 "));
    }

    #[test]
    fn the_blocking_server_answers_and_goes_on() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        std::thread::spawn(move || serve_blocking(l, || "up 1\n".to_string()));
        for path in ["/metrics", "/nope", "/metrics"] {
            let mut s = std::net::TcpStream::connect(addr).expect("connect");
            s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
                .expect("write");
            let mut got = String::new();
            s.read_to_string(&mut got).expect("read");
            if path == "/metrics" {
                assert!(got.ends_with("\r\n\r\nup 1\n"), "{got}");
            } else {
                assert!(got.starts_with("HTTP/1.1 404"), "{got}");
            }
        }
    }
}
