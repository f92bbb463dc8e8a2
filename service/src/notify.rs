//! The sd_notify(3) protocol: `KEY=VALUE` lines in one datagram to the Unix
//! socket named by `NOTIFY_SOCKET` (a path, or `@name` in the abstract
//! namespace).
//!
//! Why by hand and not a crate (checked against sd-notify 0.5.0, its
//! current release): sd-notify `connect`s to the variable's value as a
//! file path, so an abstract `@name` fails (ENOENT), and it sends on a
//! blocking socket: once the receiver's queue is full (systemd busy;
//! `net.unix.max_dgram_qlen`, 10 datagrams by default) the next call
//! waits, and the agent's control loop, which pings the watchdog, must
//! never wait. It also reads the environment and opens a socket on every
//! call. libsystemd handles `@` but sends blocking too, and brings nix
//! 0.29, nom, uuid and its own sha2 and hmac. Here the socket is opened
//! once, non-blocking: a notification that cannot go out at once is
//! dropped (the next watchdog ping follows within half the period,
//! `a_full_receiver_drops_and_never_blocks` checks), and the first
//! failure is logged at debug, the rest silently.

use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

/// One assignment in a notification.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State<'a> {
    /// `READY=1`: start-up is complete (for `Type=notify`).
    Ready,
    /// `STOPPING=1`: the service is on its way out.
    Stopping,
    /// `WATCHDOG=1`: the keep-alive ping.
    Watchdog,
    /// `STATUS=...`: one line shown by `systemctl status`.
    Status(&'a str),
}

/// The datagram for `states`, one assignment a line. A newline inside a
/// status would end the assignment: it becomes a space.
pub fn message(states: &[State<'_>]) -> String {
    let mut m = String::new();
    for s in states {
        match s {
            State::Ready => m.push_str("READY=1"),
            State::Stopping => m.push_str("STOPPING=1"),
            State::Watchdog => m.push_str("WATCHDOG=1"),
            State::Status(t) => {
                m.push_str("STATUS=");
                m.extend(t.chars().map(|c| if c == '\n' { ' ' } else { c }));
            }
        }
        m.push('\n');
    }
    m
}

/// Where `NOTIFY_SOCKET` points.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A socket file.
    Path(PathBuf),
    /// A name in the abstract namespace (`@name`; Linux).
    Abstract(Vec<u8>),
}

/// Why `NOTIFY_SOCKET` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    /// Set but empty.
    #[error("NOTIFY_SOCKET is empty")]
    Empty,
    /// Neither a path nor an abstract name (a `vsock:` address, say).
    #[error("NOTIFY_SOCKET `{0}`: only a path (/...) or an abstract name (@...) is supported")]
    Unsupported(String),
    /// The address is not a valid Unix socket address (too long).
    #[error("NOTIFY_SOCKET `{addr}`: {source}")]
    Address {
        /// The variable's value.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// The local socket could not be made.
    #[error("notify socket: {0}")]
    Socket(#[from] std::io::Error),
}

/// Read a `NOTIFY_SOCKET` value.
pub fn parse_target(value: &str) -> Result<Target, NotifyError> {
    if value.is_empty() {
        return Err(NotifyError::Empty);
    }
    if let Some(name) = value.strip_prefix('@') {
        return Ok(Target::Abstract(name.as_bytes().to_vec()));
    }
    if value.starts_with('/') {
        return Ok(Target::Path(PathBuf::from(value)));
    }
    Err(NotifyError::Unsupported(value.to_string()))
}

fn socket_addr(t: &Target) -> std::io::Result<SocketAddr> {
    match t {
        Target::Path(p) => SocketAddr::from_pathname(p),
        Target::Abstract(name) => {
            use std::os::linux::net::SocketAddrExt;
            SocketAddr::from_abstract_name(name)
        }
    }
}

/// Sends notifications to the service manager; every method is a no-op
/// when it is disabled (no `NOTIFY_SOCKET`).
#[derive(Debug)]
pub struct Notifier {
    inner: Option<(UnixDatagram, SocketAddr)>,
    /// A send has failed (logged once).
    failed: AtomicBool,
}

impl Notifier {
    /// One that sends nothing.
    pub fn disabled() -> Notifier {
        Notifier {
            inner: None,
            failed: AtomicBool::new(false),
        }
    }

    /// From `NOTIFY_SOCKET`; disabled when it is unset, or unusable (said
    /// at debug: not being under systemd is the common case).
    pub fn from_env() -> Notifier {
        let Some(v) = std::env::var_os("NOTIFY_SOCKET") else {
            return Notifier::disabled();
        };
        let r = parse_target(&v.to_string_lossy()).and_then(|t| Notifier::connect(&t));
        r.unwrap_or_else(|e| {
            tracing::debug!("sd_notify disabled: {e}");
            Notifier::disabled()
        })
    }

    /// To `target`: an unbound, non-blocking datagram socket.
    pub fn connect(target: &Target) -> Result<Notifier, NotifyError> {
        let addr = socket_addr(target).map_err(|source| NotifyError::Address {
            addr: match target {
                Target::Path(p) => p.display().to_string(),
                Target::Abstract(n) => format!("@{}", String::from_utf8_lossy(n)),
            },
            source,
        })?;
        let sock = UnixDatagram::unbound()?;
        sock.set_nonblocking(true)?;
        Ok(Notifier {
            inner: Some((sock, addr)),
            failed: AtomicBool::new(false),
        })
    }

    /// Whether notifications go anywhere.
    pub fn enabled(&self) -> bool {
        self.inner.is_some()
    }

    /// Send `states` in one datagram; whether it went out. Never blocks;
    /// the first failure is logged at debug.
    pub fn notify(&self, states: &[State<'_>]) -> bool {
        let Some((sock, addr)) = &self.inner else {
            return false;
        };
        match sock.send_to_addr(message(states).as_bytes(), addr) {
            Ok(_) => true,
            Err(e) => {
                if !self.failed.swap(true, Ordering::Relaxed) {
                    tracing::debug!("sd_notify: send failed (further failures not logged): {e}");
                }
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_lines_of_assignments() {
        assert_eq!(message(&[State::Ready]), "READY=1\n");
        assert_eq!(
            message(&[State::Stopping, State::Status("driving\nsafe states")]),
            "STOPPING=1\nSTATUS=driving safe states\n"
        );
        assert_eq!(message(&[State::Watchdog]), "WATCHDOG=1\n");
    }

    #[test]
    fn targets_are_paths_or_abstract_names() {
        assert_eq!(
            parse_target("/run/systemd/notify").ok(),
            Some(Target::Path("/run/systemd/notify".into()))
        );
        assert_eq!(
            parse_target("@baton/test").ok(),
            Some(Target::Abstract(b"baton/test".to_vec()))
        );
        assert!(matches!(parse_target(""), Err(NotifyError::Empty)));
        assert!(matches!(
            parse_target("vsock:2:1234"),
            Err(NotifyError::Unsupported(_))
        ));
    }

    #[test]
    fn sends_to_a_path_and_to_an_abstract_name() {
        let dir = std::env::temp_dir().join(format!("baton-notify-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("notify.sock");
        let _ = std::fs::remove_file(&path);
        let rx = UnixDatagram::bind(&path).expect("bind");
        let n = Notifier::connect(&Target::Path(path.clone())).expect("connect");
        assert!(n.enabled());
        assert!(n.notify(&[State::Ready, State::Status("up")]));
        let mut buf = [0u8; 256];
        let len = rx.recv(&mut buf).expect("recv");
        assert_eq!(&buf[..len], b"READY=1\nSTATUS=up\n");

        use std::os::linux::net::SocketAddrExt;
        let name = format!("baton-notify-test-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).expect("abstract");
        let rx = UnixDatagram::bind_addr(&addr).expect("bind abstract");
        let n = Notifier::connect(&parse_target(&format!("@{name}")).expect("parse")).expect("c");
        assert!(n.notify(&[State::Watchdog]));
        let len = rx.recv(&mut buf).expect("recv");
        assert_eq!(&buf[..len], b"WATCHDOG=1\n");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_full_receiver_drops_and_never_blocks() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("baton-notify-full-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).expect("abstract");
        // Bound, never read: its queue fills after a few datagrams.
        let _rx = UnixDatagram::bind_addr(&addr).expect("bind abstract");
        let n = Notifier::connect(&parse_target(&format!("@{name}")).expect("parse")).expect("c");
        let (tx, done) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let sent = (0..10_000).filter(|_| n.notify(&[State::Watchdog])).count();
            let _ = tx.send(sent);
        });
        let sent = done
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("notify blocked on a full receiver");
        assert!(
            (1..10_000).contains(&sent),
            "{sent} of 10000 sent: the queue should fill, and the rest be dropped"
        );
    }

    /// `from_env` in child processes of this test binary: the variable is
    /// set or removed for the child only, so no test here runs in a
    /// changed environment.
    #[test]
    fn from_env_sends_to_notify_socket_and_is_disabled_without_it() {
        const ME: &str =
            "notify::tests::from_env_sends_to_notify_socket_and_is_disabled_without_it";
        if let Some(want) = std::env::var_os("BATON_NOTIFY_CHILD") {
            let n = Notifier::from_env();
            if want == "enabled" {
                assert!(n.enabled());
                assert!(n.notify(&[State::Ready, State::Status("child")]));
            } else {
                assert!(!n.enabled());
                assert!(!n.notify(&[State::Ready]));
            }
            return;
        }
        let child = |want: &str, socket: Option<&std::path::Path>| {
            let mut c = std::process::Command::new(std::env::current_exe().expect("test binary"));
            c.args(["--exact", ME]).env("BATON_NOTIFY_CHILD", want);
            match socket {
                Some(p) => c.env("NOTIFY_SOCKET", p),
                None => c.env_remove("NOTIFY_SOCKET"),
            };
            let o = c.output().expect("run the child");
            let out = String::from_utf8_lossy(&o.stdout);
            assert!(
                o.status.success() && out.contains("1 passed"),
                "child ({want}): {}\n{out}",
                o.status
            );
        };
        let dir = std::env::temp_dir().join(format!("baton-notify-env-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("notify.sock");
        let _ = std::fs::remove_file(&path);
        let rx = UnixDatagram::bind(&path).expect("bind");
        rx.set_nonblocking(true).expect("non-blocking");
        child("enabled", Some(&path));
        let mut buf = [0u8; 256];
        let len = rx.recv(&mut buf).expect("the child's datagram");
        assert_eq!(&buf[..len], b"READY=1\nSTATUS=child\n");
        child("disabled", None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_missing_receiver_or_no_socket_is_not_an_error() {
        let n = Notifier::connect(&Target::Path("/nonexistent/baton.sock".into())).expect("c");
        assert!(!n.notify(&[State::Ready]));
        assert!(!n.notify(&[State::Ready]));
        assert!(!Notifier::disabled().notify(&[State::Ready]));
    }
}
