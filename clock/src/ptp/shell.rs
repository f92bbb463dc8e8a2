//! The Linux shell around statime's port: UDP/IPv4 sockets (event 319 with
//! software receive timestamps, general 320, and a blocking socket that
//! sends event messages, see [`super::txsock`]), five timers and the BMCA tick,
//! all on the `baton-ptp` thread's current-thread runtime. statime decides;
//! this performs its `PortAction`s and turns the servo's state into
//! [`Sample`]s.

use std::cell::RefCell;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use rand08::SeedableRng;
use rand08::rngs::StdRng;
use statime::PtpInstance;
use statime::config::{
    AcceptAnyMaster, ClockIdentity, DelayMechanism, InstanceConfig, PortConfig, PtpMinorVersion,
    SdoId, TimePropertiesDS, TimeSource,
};
use statime::filters::KalmanConfiguration;
use statime::port::{
    NoForwardedTLVs, Port, PortAction, PortActionIterator, Running, TimestampContext,
    is_message_buffer_compatible,
};
use statime::time::{Duration, Interval, Time};
use timestamped_socket::interface::InterfaceName;
use timestamped_socket::socket::{
    InterfaceTimestampMode, Open, Socket, Timestamp, open_interface_udp4,
};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::servo::{ObservedConfig, ObservedFilter, ServoObs};
use super::timescale::utc_correction_ns;
use super::txsock::TxSocket;
use super::virtual_clock::{MonoVirtualClock, VirtualClock, fixed_from_duration, time_from_fixed};
use super::{PtpError, PtpPortState};
use crate::MonoTime;
use crate::sample::{Sample, SampleSender, SourceKind};

const PRIMARY_MULTICAST: Ipv4Addr = Ipv4Addr::new(224, 0, 1, 129);
const PDELAY_MULTICAST: Ipv4Addr = Ipv4Addr::new(224, 0, 0, 107);
/// PTP event messages (Sync, Delay_Req): timestamped.
pub const EVENT_PORT: u16 = 319;
/// PTP general messages (Announce, Follow_Up, Delay_Resp).
pub const GENERAL_PORT: u16 = 320;

/// The port's two sockets.
pub struct Io {
    event: Socket<SocketAddrV4, Open>,
    general: Socket<SocketAddrV4, Open>,
    tx: TxSocket,
}

impl std::fmt::Debug for Io {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Io")
            .field("event", &self.event.local_addr())
            .field("general", &self.general.local_addr())
            .field("tx", &self.tx)
            .finish()
    }
}

/// Open and join the PTP sockets on `iface` (needs a tokio runtime
/// entered, not running).
pub fn open(iface: InterfaceName) -> Result<Io, PtpError> {
    let bind = |port: u16, mode: InterfaceTimestampMode| {
        let s = open_interface_udp4(iface, port, mode, None).map_err(|source| {
            if source.kind() == std::io::ErrorKind::PermissionDenied {
                PtpError::Privileged {
                    interface: iface.to_string(),
                    port,
                    source,
                }
            } else {
                PtpError::Socket {
                    interface: iface.to_string(),
                    port,
                    source,
                }
            }
        })?;
        for group in [PRIMARY_MULTICAST, PDELAY_MULTICAST] {
            s.join_multicast(SocketAddrV4::new(group, 0), iface)
                .map_err(|source| PtpError::Socket {
                    interface: iface.to_string(),
                    port,
                    source,
                })?;
        }
        Ok(s)
    };
    let tx = TxSocket::open(iface.as_str()).map_err(|source| PtpError::Socket {
        interface: iface.to_string(),
        port: EVENT_PORT,
        source,
    })?;
    Ok(Io {
        event: bind(EVENT_PORT, InterfaceTimestampMode::SoftwareRecv)?,
        general: bind(GENERAL_PORT, InterfaceTimestampMode::None)?,
        tx,
    })
}

/// `CLOCK_REALTIME − CLOCK_MONOTONIC` now, ns: the tightest of three
/// bracketed reads (software timestamps are on `CLOCK_REALTIME`).
pub fn realtime_minus_mono() -> i64 {
    crate::system::read_offset().1
}

/// A kernel software timestamp (`CLOCK_REALTIME`) on the virtual clock: to
/// monotonic through the current realtime−monotonic offset (a step of the
/// system clock between the packet and now skews one measurement; the
/// servo's outlier handling absorbs it), then through the virtual mapping.
fn packet_time(clock: &RefCell<VirtualClock>, ts: Timestamp) -> Time {
    let real = ts.seconds * 1_000_000_000 + i64::from(ts.nanos);
    let mono = real - realtime_minus_mono();
    time_from_fixed(clock.borrow().at_fixed(mono))
}

/// The port's timers, as deadlines.
#[derive(Debug, Default)]
struct Timers {
    announce: Option<Instant>,
    sync: Option<Instant>,
    delay_request: Option<Instant>,
    announce_receipt: Option<Instant>,
    filter_update: Option<Instant>,
}

#[derive(Clone, Copy, Debug)]
enum TimerKind {
    Announce,
    Sync,
    DelayRequest,
    AnnounceReceipt,
    FilterUpdate,
}

impl Timers {
    fn slots(&mut self) -> [(TimerKind, &mut Option<Instant>); 5] {
        [
            (TimerKind::AnnounceReceipt, &mut self.announce_receipt),
            (TimerKind::DelayRequest, &mut self.delay_request),
            (TimerKind::FilterUpdate, &mut self.filter_update),
            (TimerKind::Announce, &mut self.announce),
            (TimerKind::Sync, &mut self.sync),
        ]
    }

    fn next(&mut self) -> Option<Instant> {
        self.slots().into_iter().filter_map(|(_, t)| *t).min()
    }

    /// Take one timer due at `now`.
    fn take_due(&mut self, now: Instant) -> Option<TimerKind> {
        for (kind, t) in self.slots() {
            if t.is_some_and(|d| d <= now) {
                *t = None;
                return Some(kind);
            }
        }
        None
    }
}

/// Perform statime's actions; returns the send timestamp statime must be
/// told about, if an event message went out.
async fn perform(
    actions: PortActionIterator<'_>,
    io: &mut Io,
    timers: &mut Timers,
    clock: &RefCell<VirtualClock>,
) -> Option<(TimestampContext, Time)> {
    let mut pending = None;
    for action in actions {
        let now = Instant::now();
        match action {
            PortAction::SendEvent { context, data, .. } => {
                // Blocks this thread ≤ TX_TIMESTAMP_WAIT (see txsock).
                let to = SocketAddrV4::new(PRIMARY_MULTICAST, EVENT_PORT);
                match io.tx.send(data, to) {
                    Ok(Some(ts)) => pending = Some((context, packet_time(clock, ts))),
                    Ok(None) => tracing::warn!("ptp: no send timestamp for an event message"),
                    Err(e) => tracing::warn!("ptp: sending an event message: {e}"),
                }
            }
            PortAction::SendGeneral { data, .. } => {
                let to = SocketAddrV4::new(PRIMARY_MULTICAST, GENERAL_PORT);
                if let Err(e) = io.general.send_to(data, to).await {
                    tracing::warn!("ptp: sending a general message: {e}");
                }
            }
            PortAction::ResetAnnounceTimer { duration } => timers.announce = Some(now + duration),
            PortAction::ResetSyncTimer { duration } => timers.sync = Some(now + duration),
            PortAction::ResetDelayRequestTimer { duration } => {
                timers.delay_request = Some(now + duration)
            }
            PortAction::ResetAnnounceReceiptTimer { duration } => {
                timers.announce_receipt = Some(now + duration)
            }
            PortAction::ResetFilterUpdateTimer { duration } => {
                timers.filter_update = Some(now + duration)
            }
            // One port, slave only: nothing to forward to.
            PortAction::ForwardTLV { .. } => {}
        }
    }
    pending
}

/// Everything the port loop needs besides its sockets.
#[derive(Debug)]
pub struct Run {
    /// Our clock identity.
    pub identity: [u8; 8],
    /// PTP domain.
    pub domain: u8,
    /// See [`super::SpawnOptions::start_error_ns`].
    pub start_error_ns: i64,
    /// Where samples go.
    pub sink: SampleSender,
    /// The published port state.
    pub state: Arc<AtomicU8>,
    /// Resolves (closed) when the handle is dropped.
    pub stop: oneshot::Receiver<()>,
}

/// Why the loop ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// The handle was dropped.
    Stopped,
    /// The sample receiver is gone.
    SinkClosed,
}

/// Drive statime's instance and its one port until stopped.
pub async fn run(mut io: Io, mut r: Run) -> Ended {
    let mono = crate::mono_now().as_nanos();
    // Start the virtual clock at the system clock (the best first guess; the
    // servo steps it onto the grandmaster within a few syncs).
    let vclock = Rc::new(RefCell::new(VirtualClock::new(
        mono,
        mono + realtime_minus_mono() + r.start_error_ns,
    )));
    let obs = Rc::new(RefCell::new(ServoObs::default()));
    let instance = slave_only_instance(&r);
    let mut bmca_port = instance.add_port(
        port_config(),
        ObservedConfig {
            kalman: KalmanConfiguration::default(),
            obs: obs.clone(),
            clock: vclock.clone(),
        },
        MonoVirtualClock(vclock.clone()),
        StdRng::seed_from_u64(rand::random()),
    );
    let mut timers = Timers::default();
    let mut utc_ns = 0i64;
    let mut seen = 0u64;
    let mut event_buf = [0u8; 2048];
    let mut general_buf = [0u8; 2048];
    loop {
        let (mut port, first) = bmca_port.end_bmca();
        let pending = perform(first, &mut io, &mut timers, &vclock).await;
        settle_send_timestamps(&mut port, pending, &mut io, &mut timers, &vclock).await;
        let bmca_at = Instant::now() + instance.bmca_interval();
        loop {
            let wake = timers.next().map_or(bmca_at, |t| t.min(bmca_at));
            let actions = tokio::select! {
                biased;
                _ = &mut r.stop => return Ended::Stopped,
                got = io.event.recv(&mut event_buf) => match got {
                    Ok(p) => {
                        let ts = p.timestamp_data.selected_timestamp();
                        on_event(&mut port, &event_buf[..p.bytes_read], ts, &vclock)
                    }
                    Err(e) => {
                        tracing::warn!("ptp: receiving on the event socket: {e}");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        PortActionIterator::empty()
                    }
                },
                got = io.general.recv(&mut general_buf) => match got {
                    Ok(p) => port.handle_general_receive(&general_buf[..p.bytes_read]),
                    Err(e) => {
                        tracing::warn!("ptp: receiving on the general socket: {e}");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        PortActionIterator::empty()
                    }
                },
                () = tokio::time::sleep_until(wake) => {
                    let now = Instant::now();
                    if now >= bmca_at {
                        break;
                    }
                    on_timer(&mut port, timers.take_due(now))
                }
            };
            let pending = perform(actions, &mut io, &mut timers, &vclock).await;
            settle_send_timestamps(&mut port, pending, &mut io, &mut timers, &vclock).await;
            let o = *obs.borrow();
            publish(&r.state, port.is_steering(), &o);
            if o.measurements != seen {
                seen = o.measurements;
                if let Some(sample) = sample_of(&port, &o, &vclock, utc_ns)
                    && !r.sink.send(sample)
                {
                    return Ended::SinkClosed;
                }
            }
        }
        bmca_port = port.start_bmca();
        instance.bmca(&mut [&mut bmca_port]);
        follow_timescale(&instance, &mut utc_ns);
    }
}

/// The port between two BMCA runs.
type RunningPort<'a> = Port<'a, Running, AcceptAnyMaster, StdRng, MonoVirtualClock, ObservedFilter>;

/// Slave only, and the worst possible candidate in any BMCA: this
/// instance must never be recommended master.
fn slave_only_instance(r: &Run) -> PtpInstance<ObservedFilter> {
    PtpInstance::<ObservedFilter>::new(
        InstanceConfig {
            clock_identity: ClockIdentity(r.identity),
            priority_1: 255,
            priority_2: 255,
            domain_number: r.domain,
            sdo_id: SdoId::default(),
            slave_only: true,
            path_trace: false,
        },
        TimePropertiesDS::new_arbitrary_time(false, false, TimeSource::InternalOscillator),
    )
}

/// The port's configuration: E2E delay, one-second intervals.
fn port_config() -> PortConfig<AcceptAnyMaster> {
    PortConfig {
        acceptable_master_list: AcceptAnyMaster,
        // E2E, one Delay_Req a second on average (the default
        // logMinDelayReqInterval of a grandmaster).
        delay_mechanism: DelayMechanism::E2E {
            interval: Interval::ONE_SECOND,
        },
        // Ours never go out (slave only); it sets the BMCA tick and the
        // announce-receipt timeout (3–6 s), which suits ptp4l's default 2 s
        // announces.
        announce_interval: Interval::ONE_SECOND,
        announce_receipt_timeout: 3,
        sync_interval: Interval::ONE_SECOND,
        master_only: false,
        delay_asymmetry: Duration::ZERO,
        minor_ptp_version: PtpMinorVersion::Zero,
    }
}

/// Tells statime the send timestamp of each event message that went out,
/// performing what it answers, until no timestamp is pending.
async fn settle_send_timestamps(
    port: &mut RunningPort<'_>,
    mut pending: Option<(TimestampContext, Time)>,
    io: &mut Io,
    timers: &mut Timers,
    clock: &RefCell<VirtualClock>,
) {
    while let Some((context, t)) = pending {
        let actions = port.handle_send_timestamp(context, t);
        pending = perform(actions, io, timers, clock).await;
    }
}

/// An event message received with receive timestamp `ts` (ignored without
/// one, or if statime cannot parse it).
fn on_event<'p>(
    port: &'p mut RunningPort<'_>,
    data: &'p [u8],
    ts: Option<Timestamp>,
    clock: &RefCell<VirtualClock>,
) -> PortActionIterator<'p> {
    match ts {
        Some(ts) if is_message_buffer_compatible(data) => {
            port.handle_event_receive(data, packet_time(clock, ts))
        }
        Some(_) => PortActionIterator::empty(),
        None => {
            tracing::warn!("ptp: event message without a receive timestamp");
            PortActionIterator::empty()
        }
    }
}

/// The timer that fell due, handed to the port.
fn on_timer<'p>(port: &'p mut RunningPort<'_>, due: Option<TimerKind>) -> PortActionIterator<'p> {
    match due {
        Some(TimerKind::Announce) => port.handle_announce_timer(&mut NoForwardedTLVs),
        Some(TimerKind::Sync) => port.handle_sync_timer(),
        Some(TimerKind::DelayRequest) => port.handle_delay_request_timer(),
        Some(TimerKind::AnnounceReceipt) => port.handle_announce_receipt_timer(),
        Some(TimerKind::FilterUpdate) => port.handle_filter_update_timer(),
        None => PortActionIterator::empty(),
    }
}

/// The servo's latest measurement as a [`Sample`] of the reference's
/// offset from our monotonic clock, when the port steers and has an
/// estimate.
fn sample_of(
    port: &RunningPort<'_>,
    o: &ServoObs,
    clock: &RefCell<VirtualClock>,
    utc_ns: i64,
) -> Option<Sample> {
    let (true, Some(error_ns), Some(est)) = (
        port.is_steering(),
        o.error_ns(),
        port.port_current_ds_contribution(),
    ) else {
        return None;
    };
    let m = crate::mono_now().as_nanos();
    let ref_fixed = clock.borrow().at_fixed(m)
        - fixed_from_duration(est.offset_from_master)
        - i128::from(utc_ns) * (1 << 32);
    let offset_ns = ((ref_fixed + (1 << 31)) >> 32) - i128::from(m);
    Some(Sample {
        source: SourceKind::Ptp,
        at: MonoTime::from_nanos(m),
        offset_ns: offset_ns as i64,
        error_ns,
    })
}

/// After a BMCA run: follows the grandmaster's timescale (PTP/TAI or
/// arbitrary), updating the UTC correction `utc_ns` subtracted from its
/// time, with a log line when it changes.
fn follow_timescale(instance: &PtpInstance<ObservedFilter>, utc_ns: &mut i64) {
    let tp = instance.time_properties_ds();
    let u = utc_correction_ns(&tp);
    if u != *utc_ns {
        tracing::info!(
            "ptp: grandmaster timescale {} (UTC offset {:?} s): subtracting {} s",
            if tp.is_ptp() {
                "PTP (TAI)"
            } else {
                "arbitrary"
            },
            tp.utc_offset(),
            u / 1_000_000_000
        );
        *utc_ns = u;
    }
}

/// Publish the port state for reports.
fn publish(state: &AtomicU8, steering: bool, o: &ServoObs) {
    let s = match (steering, o.locked()) {
        (false, _) => PtpPortState::Listening,
        (true, false) => PtpPortState::Uncalibrated,
        (true, true) => PtpPortState::Slave,
    };
    state.store(s as u8, Ordering::Relaxed);
}
