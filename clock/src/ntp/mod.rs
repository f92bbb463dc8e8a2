//! NTP client as a clock source (docs/design.md "Clock sources, best first":
//! second after PTP).
//!
//! The decisions live in a sans-IO core, [`client::NtpClient`] (poll
//! pacing, request nonces, reply validation, the four-timestamp offset and
//! delay, the clock filter and the choice among servers in [`filter`]);
//! this module is the thin shell around it: one thread, one connected UDP
//! socket per server, `CLOCK_MONOTONIC` read right before each send and
//! right after each receive, and [`Sample`](super::sample::Sample)s out to
//! the estimator.
//!
//! Samples: at most one per reply, and only when the combined choice moved
//! to a measurement not handed over before. So a few in the first seconds
//! (the burst), then at most one per poll interval per server (16 s growing
//! to 64 s by default), fewer when the new exchange queued more than an
//! older one still in the filter. Each carries the offset
//! `reference − monotonic` measured at the middle of its round trip and an
//! error bound of half the round trip plus the server's root distance.

pub mod client;
pub mod filter;
pub mod packet;

#[cfg(test)]
mod sim_tests;

use std::io;
use std::net::{SocketAddr, ToSocketAddrs, UdpSocket};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout};
use rand::SeedableRng;
use rand::rngs::StdRng;

pub use client::{Action, KissEffect, NtpClient, NtpConfig, Received, Reject};

use super::mono_now;
use super::sample::SampleSender;

/// The NTP port when a server is given without one.
pub const DEFAULT_PORT: u16 = 123;

/// The longest the thread waits in `poll(2)` before looking at the stop
/// flag again.
const STOP_CHECK: Duration = Duration::from_millis(100);

/// How long dropping the handle waits for the thread to end; past that it
/// is left to finish on its own (it may be inside a DNS lookup).
const STOP_WAIT: Duration = Duration::from_millis(500);

/// Larger than any reply we use (48 bytes plus extension fields or a MAC);
/// the rest of a longer datagram is cut off, which decoding tolerates.
const RECV_BUF: usize = 1024;

/// The running NTP source. Dropping it stops the thread (within about
/// 100 ms, its stop check; the drop waits at most 500 ms and never hangs).
#[derive(Debug)]
pub struct NtpHandle {
    stop: Arc<AtomicBool>,
    /// Disconnected once the thread has ended.
    done: mpsc::Receiver<()>,
    thread: Option<JoinHandle<()>>,
}

impl NtpHandle {
    /// Whether the thread has ended (the sink went away, or no server is
    /// left to poll).
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Wait up to `timeout` for the thread to end on its own; whether it
    /// has. For a caller that wants to know the source gave up (its sink
    /// closed, every server refused) without polling.
    pub fn wait_finished(&self, timeout: Duration) -> bool {
        match self.done.recv_timeout(timeout) {
            Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => true,
            Err(mpsc::RecvTimeoutError::Timeout) => false,
        }
    }
}

impl Drop for NtpHandle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        match self.done.recv_timeout(STOP_WAIT) {
            Err(mpsc::RecvTimeoutError::Timeout) => {
                tracing::debug!("ntp: thread still busy after {STOP_WAIT:?}; left to end alone");
            }
            // The thread has returned: joining cannot block.
            Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                if let Some(t) = self.thread.take() {
                    let _ = t.join();
                }
            }
        }
    }
}

/// Start polling `servers` (`HOST[:PORT]`, as `ClockConfig::ntp_servers`
/// holds them; port 123 by default) with the default pacing, sending
/// samples to `sink`. Fails only if the thread cannot be started or the
/// list is empty; unresolvable or silent servers are logged and retried.
pub fn spawn(servers: &[String], sink: SampleSender) -> io::Result<NtpHandle> {
    spawn_with(servers, NtpConfig::default(), sink)
}

/// [`spawn`] with explicit pacing (tests and benches poll faster).
pub fn spawn_with(
    servers: &[String],
    config: NtpConfig,
    sink: SampleSender,
) -> io::Result<NtpHandle> {
    if servers.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "ntp: no servers to poll",
        ));
    }
    let servers = servers.to_vec();
    let stop = Arc::new(AtomicBool::new(false));
    let (done_tx, done) = mpsc::channel::<()>();
    let flag = stop.clone();
    let thread = std::thread::Builder::new()
        .name("baton-ntp".into())
        .spawn(move || {
            let _done = done_tx;
            run(&servers, config, &sink, &flag);
        })?;
    Ok(NtpHandle {
        stop,
        done,
        thread: Some(thread),
    })
}

/// `HOST[:PORT]` or `[V6]:PORT` split into host and port.
fn split_host_port(s: &str) -> (&str, u16) {
    if let Some(rest) = s.strip_prefix('[') {
        let (host, tail) = rest.split_once(']').unwrap_or((rest, ""));
        let port = tail.strip_prefix(':').and_then(|p| p.parse().ok());
        return (host, port.unwrap_or(DEFAULT_PORT));
    }
    match s.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => (h, p.parse().unwrap_or(DEFAULT_PORT)),
        // A bare IPv6 address (the config rejects it; be lenient here).
        _ => (s, DEFAULT_PORT),
    }
}

/// One server as the shell sees it.
#[derive(Debug)]
struct Peer {
    name: String,
    socket: Option<UdpSocket>,
    /// Warned that it does not resolve or cannot be reached, until it
    /// resolves / answers again.
    warned_resolve: bool,
    warned_kiss: bool,
}

impl Peer {
    /// The connected socket, resolving and connecting first if needed.
    fn socket(&mut self) -> Option<&UdpSocket> {
        if self.socket.is_none() {
            match connect(&self.name) {
                Ok(s) => {
                    self.warned_resolve = false;
                    self.socket = Some(s);
                }
                Err(e) => {
                    if !self.warned_resolve {
                        tracing::warn!(server = %self.name, "ntp: {e}; retrying at each poll");
                        self.warned_resolve = true;
                    }
                }
            }
        }
        self.socket.as_ref()
    }
}

/// A non-blocking UDP socket connected to the first address `name`
/// resolves to: the kernel then drops datagrams from anyone else.
fn connect(name: &str) -> io::Result<UdpSocket> {
    let (host, port) = split_host_port(name);
    let addr = (host, port)
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no address"))?;
    let local: SocketAddr = if addr.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        ([0u16; 8], 0).into()
    };
    let s = UdpSocket::bind(local)?;
    s.connect(addr)?;
    s.set_nonblocking(true)?;
    Ok(s)
}

/// The thread: poll, send, wait, receive, until stopped.
fn run(servers: &[String], config: NtpConfig, sink: &SampleSender, stop: &AtomicBool) {
    let mut peers: Vec<Peer> = servers
        .iter()
        .map(|name| Peer {
            name: name.clone(),
            socket: None,
            warned_resolve: false,
            warned_kiss: false,
        })
        .collect();
    let mut core = NtpClient::new(peers.len(), config, mono_now(), StdRng::from_os_rng());
    let mut buf = [0u8; RECV_BUF];
    let mut ready: Vec<usize> = Vec::with_capacity(peers.len());
    while !stop.load(Ordering::Acquire) {
        let now = mono_now();
        while let Some(action) = core.poll(now) {
            match action {
                Action::Send { server, packet } => {
                    let Some(sock) = peers[server].socket() else {
                        continue;
                    };
                    let t1 = mono_now();
                    match sock.send(&packet) {
                        Ok(_) => core.sent(server, t1),
                        Err(e) => {
                            tracing::debug!(server = %peers[server].name, "ntp: send: {e}")
                        }
                    }
                }
                Action::Unreachable { server } => {
                    let p = &peers[server];
                    if p.socket.is_some() {
                        tracing::warn!(server = %p.name, "ntp: server not answering");
                    }
                }
            }
        }
        let Some(wake) = core.next_wake() else {
            tracing::warn!("ntp: no server left to poll; the NTP source stops");
            return;
        };
        let wait = wake.since(mono_now()).min(STOP_CHECK);
        if !wait_readable(&peers, wait, &mut ready) {
            continue;
        }
        for &i in &ready {
            let Peer {
                socket: Some(sock),
                name,
                warned_kiss,
                ..
            } = &mut peers[i]
            else {
                continue;
            };
            loop {
                let n = match sock.recv(&mut buf) {
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => {
                        // ICMP port unreachable and the like; the poll
                        // schedule counts the miss.
                        tracing::debug!(server = %name, "ntp: recv: {e}");
                        break;
                    }
                };
                let t4 = mono_now();
                if !handle(name, warned_kiss, core.receive(i, &buf[..n], t4), sink) {
                    return;
                }
            }
        }
    }
}

/// Log what a reply amounted to and pass a sample on. False when the sink
/// is gone.
fn handle(name: &str, warned_kiss: &mut bool, r: Received, sink: &SampleSender) -> bool {
    match r {
        Received::Measured {
            measurement: m,
            kept,
            sample,
        } => {
            *warned_kiss = false;
            tracing::trace!(
                server = %name, offset_ns = m.offset_ns, delay_ns = m.delay_ns, kept,
                "ntp: measurement"
            );
            if let Some(s) = sample {
                tracing::debug!(
                    server = %name, offset_ns = s.offset_ns, error_ns = s.error_ns,
                    "ntp: sample"
                );
                return sink.send(s);
            }
        }
        Received::Kiss { code, effect } => {
            if !*warned_kiss {
                *warned_kiss = true;
                tracing::warn!(
                    server = %name, code = %String::from_utf8_lossy(&code),
                    "ntp: kiss-o'-death: {effect:?}"
                );
            }
        }
        Received::Rejected(e) => {
            tracing::debug!(server = %name, "ntp: reply ignored: {e}");
        }
    }
    true
}

/// Wait up to `wait` for any connected socket to be readable; `ready`
/// gets their indices. False on timeout (or `EINTR`, or a poll error,
/// after which the loop simply goes round again).
fn wait_readable(peers: &[Peer], wait: Duration, ready: &mut Vec<usize>) -> bool {
    ready.clear();
    let ms = i32::try_from(wait.as_micros().div_ceil(1000)).unwrap_or(i32::MAX);
    let timeout = PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX);
    let idx: Vec<usize> = (0..peers.len())
        .filter(|&i| peers[i].socket.is_some())
        .collect();
    let mut fds: Vec<PollFd<'_>> = idx
        .iter()
        .filter_map(|&i| peers[i].socket.as_ref())
        .map(|s| PollFd::new(s.as_fd(), PollFlags::POLLIN))
        .collect();
    if fds.is_empty() {
        std::thread::sleep(wait);
        return false;
    }
    if nix::poll::poll(&mut fds, timeout).is_err() {
        return false;
    }
    let any = PollFlags::POLLIN | PollFlags::POLLERR;
    for (pfd, &i) in fds.iter().zip(&idx) {
        if pfd.revents().is_some_and(|r| r.intersects(any)) {
            ready.push(i);
        }
    }
    !ready.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_split_into_host_and_port() {
        assert_eq!(split_host_port("pool.ntp.org"), ("pool.ntp.org", 123));
        assert_eq!(split_host_port("10.0.0.1:1123"), ("10.0.0.1", 1123));
        assert_eq!(split_host_port("[::1]:124"), ("::1", 124));
        assert_eq!(split_host_port("[fe80::1]"), ("fe80::1", 123));
    }
}
