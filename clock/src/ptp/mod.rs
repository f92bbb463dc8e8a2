//! PTP slave clock source: statime's protocol core in a thin Linux shell.
//!
//! statime (0.4) decides — BMCA, the port state machine, the Kalman servo —
//! and returns actions; [`shell`] performs them on one thread, `baton-ptp`,
//! with its own current-thread tokio runtime for the two timestamped UDP
//! sockets. One ordinary clock, one port, slave only, UDP/IPv4, E2E delay.
//!
//! By default the servo steers a **virtual clock** over `CLOCK_MONOTONIC`
//! ([`virtual_clock`]): the system clock is never touched and the agent
//! needs no `CAP_SYS_TIME`. Each time the servo absorbs a measurement the
//! source sends a [`Sample`](crate::sample::Sample): the virtual
//! clock's mapping corrected by the servo's current offset estimate,
//! converted from PTP time to UTC ([`timescale`]), with `error_ns` = the
//! last measured offset plus the mean path delay.
//!
//! Timestamps are the kernel's software ones (`SO_TIMESTAMPING`, on
//! `CLOCK_REALTIME`, converted to monotonic when they arrive); event
//! messages leave from a plain socket, not tokio's, so no epoll wake-up
//! lands between their TX timestamp and the wire ([`txsock`]). Hardware
//! timestamps are not used yet: they are on the NIC's PHC, which would need
//! its own PHC↔monotonic mapping (`PTP_SYS_OFFSET_PRECISE`) — the gap to
//! close for sub-µs work. The system clock is never steered: the agent
//! fires on its own estimate of reference time, whatever `CLOCK_REALTIME`
//! says.
//!
//! Binding PTP's ports 319/320 needs root or `CAP_NET_BIND_SERVICE`.

pub mod servo;
pub mod shell;
pub mod timescale;
pub mod txsock;
pub mod virtual_clock;

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use timestamped_socket::interface::{InterfaceName, interfaces};
use tokio::sync::oneshot;

use crate::sample::SampleSender;
use crate::settings::PtpConfig;

/// How long dropping a [`PtpHandle`] waits for the thread to end before
/// leaving it behind (it is blocked nowhere but in its own runtime, so it
/// ends within a loop turn; the bound is for a wedged system).
pub const STOP_WAIT: Duration = Duration::from_secs(2);

/// Why the PTP source could not start.
#[derive(Debug, thiserror::Error)]
pub enum PtpError {
    /// The configured interface does not exist (in this network namespace).
    #[error("PTP interface {0:?} does not exist")]
    NoSuchInterface(String),
    /// PTP runs over UDP/IPv4 here; the interface needs an IPv4 address.
    #[error("PTP interface {0:?} has no IPv4 address (the PTP source uses UDP/IPv4)")]
    NoIpv4Address(String),
    /// Binding a privileged port (or to the device) was refused.
    #[error(
        "cannot bind UDP port {port} on {interface}: {source}; PTP's ports 319 and 320 are \
         privileged: run the agent as root or give it CAP_NET_BIND_SERVICE (and CAP_NET_RAW \
         on kernels before 5.7, for SO_BINDTODEVICE)"
    )]
    Privileged {
        /// Interface.
        interface: String,
        /// UDP port.
        port: u16,
        /// The OS error.
        source: std::io::Error,
    },
    /// Any other socket failure.
    #[error("cannot open the PTP socket on {interface} port {port}: {source}")]
    Socket {
        /// Interface.
        interface: String,
        /// UDP port.
        port: u16,
        /// The OS error.
        source: std::io::Error,
    },
    /// Listing the network interfaces failed.
    #[error("cannot list network interfaces: {0}")]
    Interfaces(std::io::Error),
    /// The runtime or the thread could not be created.
    #[error("cannot start the PTP thread: {0}")]
    Thread(std::io::Error),
}

/// The port's state, as reports show it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum PtpPortState {
    /// No master selected (yet, or it went away).
    Listening = 0,
    /// Following a master, the servo not yet settled.
    Uncalibrated = 1,
    /// Following a master, locked (a run of small measured offsets, see
    /// [`servo::LOCK_RUN`]).
    Slave = 2,
    /// The thread has ended.
    Stopped = 3,
}

impl PtpPortState {
    fn from_u8(v: u8) -> Self {
        match v {
            0 => PtpPortState::Listening,
            1 => PtpPortState::Uncalibrated,
            2 => PtpPortState::Slave,
            _ => PtpPortState::Stopped,
        }
    }

    /// Lower-case name for reports and logs.
    pub fn name(self) -> &'static str {
        match self {
            PtpPortState::Listening => "listening",
            PtpPortState::Uncalibrated => "uncalibrated",
            PtpPortState::Slave => "slave",
            PtpPortState::Stopped => "stopped",
        }
    }
}

/// The running PTP source. Dropping it stops the thread (bounded wait).
#[derive(Debug)]
pub struct PtpHandle {
    state: Arc<AtomicU8>,
    stop: Option<oneshot::Sender<()>>,
    done: std::sync::mpsc::Receiver<()>,
    thread: Option<JoinHandle<()>>,
}

impl PtpHandle {
    /// The port's state now.
    pub fn state(&self) -> PtpPortState {
        PtpPortState::from_u8(self.state.load(Ordering::Relaxed))
    }
}

impl Drop for PtpHandle {
    fn drop(&mut self) {
        drop(self.stop.take());
        // Join only once the thread has said it is ending: never a join
        // that can hang.
        match self.done.recv_timeout(STOP_WAIT) {
            Ok(()) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                if let Some(t) = self.thread.take() {
                    let _ = t.join();
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                tracing::warn!("ptp: thread did not stop within {STOP_WAIT:?}; left behind");
            }
        }
    }
}

/// Signals the end of the thread, however it ends (a panic included).
struct Done {
    tx: std::sync::mpsc::SyncSender<()>,
    state: Arc<AtomicU8>,
}

impl Drop for Done {
    fn drop(&mut self) {
        self.state
            .store(PtpPortState::Stopped as u8, Ordering::Relaxed);
        let _ = self.tx.try_send(());
    }
}

/// Knobs beyond the configuration, for tests and the figure.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpawnOptions {
    /// Start the virtual clock this far (ns) from the system clock instead
    /// of on it. On one machine the grandmaster *is* the system clock, so
    /// without it the servo would start already converged; with it a test
    /// sees the servo step and settle from a known error.
    pub start_error_ns: i64,
}

/// Start the PTP slave on `cfg.interface`, sending samples to `sink`.
///
/// Checks the interface and binds the sockets before returning, so a bad
/// interface or missing privilege is an error here, not a log line later.
/// The thread ends when the handle is dropped or `sink` is closed.
pub fn spawn(cfg: &PtpConfig, sink: SampleSender) -> Result<PtpHandle, PtpError> {
    spawn_with(cfg, sink, SpawnOptions::default())
}

/// [`spawn`] with [`SpawnOptions`].
pub fn spawn_with(
    cfg: &PtpConfig,
    sink: SampleSender,
    opts: SpawnOptions,
) -> Result<PtpHandle, PtpError> {
    let name: InterfaceName = cfg
        .interface
        .parse()
        .map_err(|()| PtpError::NoSuchInterface(cfg.interface.clone()))?;
    let all = interfaces().map_err(PtpError::Interfaces)?;
    let data = all
        .get(&name)
        .ok_or_else(|| PtpError::NoSuchInterface(cfg.interface.clone()))?;
    if !data.ips().any(|ip| ip.is_ipv4()) {
        return Err(PtpError::NoIpv4Address(cfg.interface.clone()));
    }
    let identity = timescale::clock_identity(data.mac(), rand::random);
    if name.lookup_phc().is_some() {
        tracing::info!(
            "ptp: {} has a hardware clock; using software timestamps (hardware ones are not \
             supported yet)",
            cfg.interface
        );
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(PtpError::Thread)?;
    let io = {
        let _enter = rt.enter();
        shell::open(name)?
    };
    let state = Arc::new(AtomicU8::new(PtpPortState::Listening as u8));
    let (stop_tx, stop_rx) = oneshot::channel();
    let (done_tx, done_rx) = std::sync::mpsc::sync_channel(1);
    let run = shell::Run {
        identity,
        domain: cfg.domain,
        start_error_ns: opts.start_error_ns,
        sink,
        state: state.clone(),
        stop: stop_rx,
    };
    let done = Done {
        tx: done_tx,
        state: state.clone(),
    };
    let interface = cfg.interface.clone();
    let thread = std::thread::Builder::new()
        .name("baton-ptp".into())
        .spawn(move || {
            let _done = done;
            tracing::info!(
                "ptp: slave on {interface}, clock identity {}",
                identity.map(|b| format!("{b:02x}")).concat()
            );
            let ended = rt.block_on(shell::run(io, run));
            tracing::info!("ptp: stopped ({ended:?})");
        })
        .map_err(PtpError::Thread)?;
    Ok(PtpHandle {
        state,
        stop: Some(stop_tx),
        done: done_rx,
        thread: Some(thread),
    })
}
