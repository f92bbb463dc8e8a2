//! Log output on stderr, in the form its reader stores best.
//!
//! - `text`: today's lines (timestamp, level, message, fields; colour on a
//!   terminal).
//! - `json`: one JSON object per line (tracing-subscriber's JSON format).
//! - `journald`: when stderr is connected to journald, journald adds its
//!   own timestamps and keeps a priority per line. So each line is plain —
//!   no timestamp, no level word — and starts with the `<N>` syslog
//!   priority prefix of sd-daemon(3) (`SD_ERR` = `<3>`, ...), which
//!   journald strips and stores as the entry's priority. A message of
//!   several lines gets the prefix on each (journald stores each line as an
//!   entry of its own).
//! - `auto` (the default): `journald` when stderr is the journal, as
//!   systemd.exec(5) says to detect it (`JOURNAL_STREAM` is `DEV:INO` of
//!   stderr), `text` otherwise.

use std::str::FromStr;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::fmt::format::{Format, Full, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The `log-format` setting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// `journald` when stderr is the journal, `text` otherwise.
    #[default]
    Auto,
    /// Human-readable lines with timestamps.
    Text,
    /// One JSON object per line.
    Json,
    /// `<N>`-prefixed plain lines for journald.
    Journald,
}

/// A `log-format` value that is none of the four.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("log format `{0}`: expected text, json, journald or auto")]
pub struct UnknownLogFormat(pub String);

impl FromStr for LogFormat {
    type Err = UnknownLogFormat;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(LogFormat::Auto),
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            "journald" => Ok(LogFormat::Journald),
            other => Err(UnknownLogFormat(other.to_string())),
        }
    }
}

/// What is actually written (`auto` decided).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// Human-readable lines.
    Text,
    /// JSON lines.
    Json,
    /// `<N>`-prefixed plain lines.
    Journald,
}

impl LogFormat {
    /// Decide `auto`, given whether stderr is the journal.
    pub fn resolve(self, stderr_is_journal: bool) -> Output {
        match self {
            LogFormat::Auto if stderr_is_journal => Output::Journald,
            LogFormat::Auto | LogFormat::Text => Output::Text,
            LogFormat::Json => Output::Json,
            LogFormat::Journald => Output::Journald,
        }
    }
}

/// Whether a `JOURNAL_STREAM` value (`DEV:INO`, decimal) names the file
/// stderr is (`stderr`: its device and inode). A mismatch means stderr was
/// redirected since systemd set the variable (`2>file` in a script): not
/// the journal any more.
pub fn journal_stream_matches(value: Option<&str>, stderr: Option<(u64, u64)>) -> bool {
    let (Some(v), Some((dev, ino))) = (value, stderr) else {
        return false;
    };
    let Some((d, i)) = v.trim().split_once(':') else {
        return false;
    };
    d.parse::<u64>() == Ok(dev) && i.parse::<u64>() == Ok(ino)
}

/// Device and inode of this process's stderr.
fn stderr_id() -> Option<(u64, u64)> {
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;
    let fd = std::io::stderr().as_fd().try_clone_to_owned().ok()?;
    let m = std::fs::File::from(fd).metadata().ok()?;
    Some((m.dev(), m.ino()))
}

/// Whether stderr is journald's stream for this service.
pub fn stderr_is_journal() -> bool {
    let v = std::env::var("JOURNAL_STREAM").ok();
    journal_stream_matches(v.as_deref(), stderr_id())
}

/// The syslog priority journald maps a level to (sd-daemon(3)): error 3
/// (`SD_ERR`), warn 4 (`SD_WARNING`), info 6 (`SD_INFO`), debug and trace
/// 7 (`SD_DEBUG`). Nothing of ours is `<5>` (notice).
pub fn priority(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        _ => 7,
    }
}

/// The event format of [`Output::Journald`]: the default format without
/// time, level or colour, each line prefixed with `<N>`.
#[derive(Debug)]
pub struct Journald {
    inner: Format<Full, ()>,
}

impl Default for Journald {
    fn default() -> Self {
        Journald {
            inner: tracing_subscriber::fmt::format()
                .without_time()
                .with_level(false)
                .with_target(false)
                .with_ansi(false),
        }
    }
}

impl<S, N> FormatEvent<S, N> for Journald
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let mut text = String::new();
        self.inner
            .format_event(ctx, Writer::new(&mut text), event)?;
        let p = priority(event.metadata().level());
        for line in text.lines() {
            writeln!(writer, "<{p}>{line}")?;
        }
        Ok(())
    }
}

/// The stderr layer for `out`; `ansi`: colour (text only, and only on a
/// terminal — the caller knows).
pub fn layer<S>(out: Output, ansi: bool) -> Box<dyn Layer<S> + Send + Sync + 'static>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    layer_to(out, ansi, std::io::stderr)
}

/// [`layer`] writing to `w` (tests capture the output).
pub fn layer_to<S, W>(out: Output, ansi: bool, w: W) -> Box<dyn Layer<S> + Send + Sync + 'static>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let base = tracing_subscriber::fmt::layer().with_writer(w);
    match out {
        Output::Text => base.with_target(false).with_ansi(ansi).boxed(),
        Output::Json => base.json().with_ansi(false).boxed(),
        Output::Journald => base
            .with_ansi(false)
            .event_format(Journald::default())
            .boxed(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::layer::SubscriberExt;

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("buf").extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Buf {
        type Writer = Buf;
        fn make_writer(&'a self) -> Buf {
            self.clone()
        }
    }

    fn capture(out: Output, f: impl FnOnce()) -> String {
        let buf = Buf::default();
        let sub = tracing_subscriber::registry().with(layer_to(out, false, buf.clone()));
        tracing::subscriber::with_default(sub, f);
        let bytes = buf.0.lock().expect("buf").clone();
        String::from_utf8(bytes).expect("utf-8")
    }

    #[test]
    fn formats_by_name() {
        assert_eq!("auto".parse(), Ok(LogFormat::Auto));
        assert_eq!("json".parse(), Ok(LogFormat::Json));
        assert_eq!("journald".parse(), Ok(LogFormat::Journald));
        assert_eq!("text".parse(), Ok(LogFormat::Text));
        assert!("syslog".parse::<LogFormat>().is_err());
    }

    #[test]
    fn auto_is_journald_only_when_stderr_is_the_journal() {
        assert_eq!(LogFormat::Auto.resolve(true), Output::Journald);
        assert_eq!(LogFormat::Auto.resolve(false), Output::Text);
        assert_eq!(LogFormat::Text.resolve(true), Output::Text);
        assert_eq!(LogFormat::Json.resolve(true), Output::Json);
        assert_eq!(LogFormat::Journald.resolve(false), Output::Journald);
    }

    #[test]
    fn journal_stream_must_name_stderr() {
        assert!(journal_stream_matches(Some("8:1234"), Some((8, 1234))));
        assert!(!journal_stream_matches(Some("8:1234"), Some((8, 1235))));
        assert!(!journal_stream_matches(Some("8:1234"), None));
        assert!(!journal_stream_matches(None, Some((8, 1234))));
        assert!(!journal_stream_matches(Some("garbage"), Some((8, 1234))));
    }

    #[test]
    fn priorities_as_sd_daemon() {
        assert_eq!(priority(&Level::ERROR), 3);
        assert_eq!(priority(&Level::WARN), 4);
        assert_eq!(priority(&Level::INFO), 6);
        assert_eq!(priority(&Level::DEBUG), 7);
        assert_eq!(priority(&Level::TRACE), 7);
    }

    #[test]
    fn journald_lines_carry_a_priority_and_no_timestamp() {
        let s = capture(Output::Journald, || {
            tracing::info!(pack = "default/p", "restored");
            tracing::warn!("clock lost");
            tracing::error!("refused:\nline two");
        });
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(
            lines,
            [
                "<6>restored pack=\"default/p\"",
                "<4>clock lost",
                "<3>refused:",
                "<3>line two"
            ],
            "{s}"
        );
    }

    #[test]
    fn json_lines_parse() {
        let s = capture(Output::Json, || {
            tracing::info!(packs = 2, "journal opened");
            tracing::warn!("clock lost");
        });
        let v: Vec<serde_json::Value> = s
            .lines()
            .map(|l| serde_json::from_str(l).expect("json line"))
            .collect();
        assert_eq!(v.len(), 2);
        assert_eq!(v[0]["level"], "INFO");
        assert_eq!(v[0]["fields"]["message"], "journal opened");
        assert_eq!(v[0]["fields"]["packs"], 2);
        assert_eq!(v[1]["level"], "WARN");
    }
}
