//! The NTP source's thread against an in-process fake server on a free
//! loopback port: garbage and spoofed datagrams around every genuine
//! reply, a server one second ahead, and how the thread ends.

use std::net::UdpSocket;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use baton_clock::clock_ns;
use baton_clock::ntp::packet::{Packet, unix_ns_to_timestamp};
use baton_clock::ntp::{NtpConfig, spawn_with};
use baton_clock::sample::sample_channel;
use nix::time::ClockId;

/// The fake server's clock is this far ahead of `CLOCK_REALTIME`.
const AHEAD_NS: i64 = 1_000_000_000;

fn fast() -> NtpConfig {
    NtpConfig {
        burst: u32::MAX,
        burst_spacing: Duration::from_millis(20),
        min_poll: Duration::from_secs(1),
        max_poll: Duration::from_secs(1),
    }
}

/// A fake NTP server that precedes each genuine reply with a datagram of
/// garbage, a short one, and a well-formed reply with the wrong origin.
struct FakeServer {
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FakeServer {
    fn start() -> Self {
        let sock = UdpSocket::bind("127.0.0.1:0").expect("bind");
        sock.set_read_timeout(Some(Duration::from_millis(50)))
            .expect("timeout");
        let port = sock.local_addr().expect("addr").port();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            let mut garbage = 0x9e37_79b9_7f4a_7c15u64;
            while !flag.load(Ordering::Acquire) {
                let Ok((n, from)) = sock.recv_from(&mut buf) else {
                    continue;
                };
                let Ok(q) = Packet::decode(&buf[..n]) else {
                    continue;
                };
                let t2 = clock_ns(ClockId::CLOCK_REALTIME) + AHEAD_NS;
                let noise: Vec<u8> = (0..48)
                    .map(|_| {
                        garbage ^= garbage << 13;
                        garbage ^= garbage >> 7;
                        garbage ^= garbage << 17;
                        garbage as u8
                    })
                    .collect();
                let _ = sock.send_to(&noise, from);
                let _ = sock.send_to(&noise[..7], from);
                let mut reply = Packet {
                    leap: 0,
                    version: 4,
                    mode: 4,
                    stratum: 1,
                    poll: q.poll,
                    precision: -20,
                    root_delay: 0,
                    root_dispersion: 0,
                    reference_id: *b"GPS\0",
                    reference_ts: unix_ns_to_timestamp(t2 - 1_000_000_000),
                    origin_ts: q.transmit_ts ^ 1,
                    receive_ts: unix_ns_to_timestamp(t2),
                    transmit_ts: 0,
                };
                reply.transmit_ts =
                    unix_ns_to_timestamp(clock_ns(ClockId::CLOCK_REALTIME) + AHEAD_NS);
                let _ = sock.send_to(&reply.encode(), from);
                reply.origin_ts = q.transmit_ts;
                let _ = sock.send_to(&reply.encode(), from);
            }
        });
        FakeServer {
            port,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn realtime_minus_monotonic() -> i64 {
    baton_clock::system::read_offset().1
}

#[test]
fn genuine_replies_are_found_among_garbage_and_spoofs() {
    let server = FakeServer::start();
    let (sink, rx) = sample_channel();
    // An unresolvable name next to it is logged and retried, not fatal.
    let servers = [
        "no-such-host.invalid".to_string(),
        format!("127.0.0.1:{}", server.port),
    ];
    let handle = spawn_with(&servers, fast(), sink).expect("spawn");
    let truth = realtime_minus_monotonic() + AHEAD_NS;
    for i in 0..5 {
        let s = rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("sample {i}: {e}"));
        let err = (s.offset_ns - truth).abs();
        // Loopback, a thread answering: well under a millisecond.
        assert!(err < 1_000_000, "sample {i} off by {err} ns: {s:?}");
        assert!(err <= s.error_ns + 10_000, "{err} beyond {s:?}");
    }
    assert!(!handle.is_finished());
    // Dropping the handle stops the thread, and never hangs.
    let t = Instant::now();
    drop(handle);
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    // The thread ended: its sender is gone.
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(_) => continue,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            Err(e) => panic!("the thread still runs: {e}"),
        }
    }
}

#[test]
fn the_thread_ends_when_the_estimator_is_gone() {
    let server = FakeServer::start();
    let (sink, rx) = sample_channel();
    let handle = spawn_with(&[format!("127.0.0.1:{}", server.port)], fast(), sink).expect("spawn");
    rx.recv_timeout(Duration::from_secs(20)).expect("a sample");
    drop(rx);
    assert!(
        handle.wait_finished(Duration::from_secs(10)),
        "still running without a sink"
    );
}

#[test]
fn an_empty_server_list_is_an_error() {
    let (sink, _rx) = sample_channel();
    let e = spawn_with(&[], fast(), sink).expect_err("no servers");
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
}
