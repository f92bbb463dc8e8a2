//! The socket our event messages (Delay_Req) leave from.
//!
//! The kernel takes a software TX timestamp, then queues it on the socket's
//! error queue and wakes the socket's waiters — all before the packet moves
//! on. A socket registered with epoll (every tokio socket is, for good) pays
//! that wake-up between the timestamp and the wire, which shows up as extra
//! slave→master delay: a bias of the offset. So event messages go out on
//! this plain blocking socket, which nobody waits on while it sends, and its
//! TX timestamp is read right after with a short `poll(2)`, as ptp4l does.
//! Receiving stays on the async socket.

use std::ffi::OsString;
use std::io::IoSliceMut;
use std::net::SocketAddrV4;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{
    AddressFamily, ControlMessageOwned, MsgFlags, SockFlag, SockType, SockaddrIn, TimestampingFlag,
    Timestamps, recvmsg, sendto, setsockopt, socket, sockopt,
};
use timestamped_socket::socket::Timestamp;

/// How long to wait for a TX timestamp (ptp4l's `tx_timestamp_timeout`
/// default is 10 ms too).
pub const TX_TIMESTAMP_WAIT: Duration = Duration::from_millis(10);

/// A UDP/IPv4 socket bound to one interface, software TX timestamps on.
#[derive(Debug)]
pub struct TxSocket {
    fd: OwnedFd,
}

impl TxSocket {
    /// Open it on `iface`.
    pub fn open(iface: &str) -> std::io::Result<Self> {
        let fd = socket(
            AddressFamily::Inet,
            SockType::Datagram,
            SockFlag::SOCK_CLOEXEC,
            None,
        )?;
        setsockopt(&fd, sockopt::BindToDevice, &OsString::from(iface))?;
        setsockopt(&fd, sockopt::IpMulticastLoop, &false)?;
        setsockopt(&fd, sockopt::IpMulticastTtl, &1u8)?;
        setsockopt(
            &fd,
            sockopt::Timestamping,
            &(TimestampingFlag::SOF_TIMESTAMPING_TX_SOFTWARE
                | TimestampingFlag::SOF_TIMESTAMPING_SOFTWARE),
        )?;
        Ok(TxSocket { fd })
    }

    /// Send `data` to `to`; the kernel's software TX timestamp
    /// (`CLOCK_REALTIME`), or `None` if none came within
    /// [`TX_TIMESTAMP_WAIT`]. Blocks the calling thread that long at most.
    pub fn send(&self, data: &[u8], to: SocketAddrV4) -> std::io::Result<Option<Timestamp>> {
        // A timestamp left from an earlier send that timed out is stale.
        while self.read_timestamp()?.is_some() {}
        sendto(
            self.fd.as_raw_fd(),
            data,
            &SockaddrIn::from(to),
            MsgFlags::empty(),
        )?;
        let deadline = Instant::now() + TX_TIMESTAMP_WAIT;
        loop {
            if let Some(ts) = self.read_timestamp()? {
                return Ok(Some(ts));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            // POLLERR is always reported: the error queue has something.
            let mut fds = [PollFd::new(self.fd.as_fd(), PollFlags::empty())];
            let ms = u16::try_from(left.as_millis().max(1)).unwrap_or(u16::MAX);
            match poll(&mut fds, PollTimeout::from(ms)) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// One TX timestamp from the error queue, without waiting.
    fn read_timestamp(&self) -> std::io::Result<Option<Timestamp>> {
        let mut data = [0u8; 512];
        let mut iov = [IoSliceMut::new(&mut data)];
        let mut cmsg = nix::cmsg_space!(Timestamps, [u8; 128]);
        let msg = match recvmsg::<SockaddrIn>(
            self.fd.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_ERRQUEUE | MsgFlags::MSG_DONTWAIT,
        ) {
            Ok(m) => m,
            Err(Errno::EAGAIN) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        for c in msg.cmsgs()? {
            if let ControlMessageOwned::ScmTimestampsns(t) = c {
                return Ok(Some(Timestamp {
                    seconds: t.system.tv_sec(),
                    nanos: t.system.tv_nsec() as u32,
                }));
            }
        }
        // An error-queue message without a timestamp (an ICMP error, say):
        // consumed, try the next.
        self.read_timestamp()
    }
}
