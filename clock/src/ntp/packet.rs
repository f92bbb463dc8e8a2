//! The NTPv4 packet header (RFC 5905 §7.3), encoded and decoded by hand.
//!
//! Why not `ntp-proto` (ntpd-rs's protocol crate, 1.9.0, rust-version 1.88,
//! evaluated for this module): it builds its packets around NTS, so it
//! depends unconditionally on rustls, rustls-platform-verifier,
//! tokio-rustls, tokio and rand 0.8 (a second rand next to our 0.9), and its
//! `NtpTimestamp` keeps its raw bits crate-private, so reading a server
//! timestamp as Unix nanoseconds would go through `f64` seconds. A client
//! needs only the 48-byte header below; it is small enough to own.

/// Bytes in the header; extension fields and MACs after it are ignored.
pub const HEADER_LEN: usize = 48;

/// Seconds from the NTP epoch (1900-01-01) to the Unix epoch (1970-01-01).
const NTP_UNIX_OFFSET_S: i64 = 2_208_988_800;

/// NTP seconds wrap every 2³² s (era 1 starts in 2036). A timestamp is read
/// as the instant within ±2³¹ s (±68 years) of this pivot, 2024-01-01 UTC
/// (Unix s), so the decoding is right from 1956 to 2092 without needing a
/// wall clock that may itself be wrong.
const ERA_PIVOT_UNIX_S: i64 = 1_704_067_200;

/// The association mode (RFC 5905 §7.3, "Mode").
pub const MODE_CLIENT: u8 = 3;
/// A server's reply.
pub const MODE_SERVER: u8 = 4;

/// Leap indicator 3: the server's clock is not synchronised.
pub const LEAP_UNSYNCHRONISED: u8 = 3;

/// The decoded header, fields as on the wire (timestamps and short formats
/// raw; see the conversion functions).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packet {
    /// Leap indicator (2 bits).
    pub leap: u8,
    /// Version (3 bits).
    pub version: u8,
    /// Mode (3 bits).
    pub mode: u8,
    /// Stratum; 0 is a kiss-o'-death, 16 and above unsynchronised.
    pub stratum: u8,
    /// log2 of the poll interval, s.
    pub poll: i8,
    /// log2 of the sender's clock precision, s.
    pub precision: i8,
    /// Round trip to the server's reference, NTP short format (16.16 s).
    pub root_delay: u32,
    /// Dispersion to the reference, NTP short format.
    pub root_dispersion: u32,
    /// Reference id; the ASCII kiss code when stratum is 0.
    pub reference_id: [u8; 4],
    /// When the server's clock was last set (NTP timestamp, 32.32 s).
    pub reference_ts: u64,
    /// The client's transmit timestamp, echoed back.
    pub origin_ts: u64,
    /// When the request reached the server.
    pub receive_ts: u64,
    /// When the reply left the server (a client: any unique value).
    pub transmit_ts: u64,
}

/// A datagram that is not an NTP packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("ntp: a {0}-byte datagram is shorter than the {HEADER_LEN}-byte header")]
pub struct TooShort(pub usize);

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    (u64::from(u32_at(b, i)) << 32) | u64::from(u32_at(b, i + 4))
}

impl Packet {
    /// A client request (version 4, mode 3) whose transmit timestamp is
    /// `nonce`: servers echo it as the origin timestamp, and a random value
    /// (not our clock) both leaks nothing and lets the reply be matched.
    pub fn request(nonce: u64, poll: i8) -> Packet {
        Packet {
            leap: 0,
            version: 4,
            mode: MODE_CLIENT,
            stratum: 0,
            poll,
            precision: 0,
            root_delay: 0,
            root_dispersion: 0,
            reference_id: [0; 4],
            reference_ts: 0,
            origin_ts: 0,
            receive_ts: 0,
            transmit_ts: nonce,
        }
    }

    /// Read the header of a datagram (anything after it is ignored). Every
    /// bit pattern of 48 bytes decodes: checking the values is the caller's.
    pub fn decode(b: &[u8]) -> Result<Packet, TooShort> {
        if b.len() < HEADER_LEN {
            return Err(TooShort(b.len()));
        }
        Ok(Packet {
            leap: b[0] >> 6,
            version: (b[0] >> 3) & 0b111,
            mode: b[0] & 0b111,
            stratum: b[1],
            poll: b[2] as i8,
            precision: b[3] as i8,
            root_delay: u32_at(b, 4),
            root_dispersion: u32_at(b, 8),
            reference_id: [b[12], b[13], b[14], b[15]],
            reference_ts: u64_at(b, 16),
            origin_ts: u64_at(b, 24),
            receive_ts: u64_at(b, 32),
            transmit_ts: u64_at(b, 40),
        })
    }

    /// The 48 bytes on the wire.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0] = ((self.leap & 0b11) << 6) | ((self.version & 0b111) << 3) | (self.mode & 0b111);
        b[1] = self.stratum;
        b[2] = self.poll as u8;
        b[3] = self.precision as u8;
        b[4..8].copy_from_slice(&self.root_delay.to_be_bytes());
        b[8..12].copy_from_slice(&self.root_dispersion.to_be_bytes());
        b[12..16].copy_from_slice(&self.reference_id);
        b[16..24].copy_from_slice(&self.reference_ts.to_be_bytes());
        b[24..32].copy_from_slice(&self.origin_ts.to_be_bytes());
        b[32..40].copy_from_slice(&self.receive_ts.to_be_bytes());
        b[40..48].copy_from_slice(&self.transmit_ts.to_be_bytes());
        b
    }
}

/// An NTP timestamp (32.32 s since 1900, era resolved around the pivot) as
/// Unix nanoseconds, rounded to the nearest.
pub fn timestamp_to_unix_ns(ts: u64) -> i64 {
    let secs = (ts >> 32) as i64;
    let frac = ts & 0xffff_ffff;
    let nanos = ((u128::from(frac) * 1_000_000_000 + (1 << 31)) >> 32) as i64;
    // Unix seconds of era 0, then moved by whole eras next to the pivot.
    let unix = secs - NTP_UNIX_OFFSET_S;
    let era = 1i64 << 32;
    let shift = (ERA_PIVOT_UNIX_S - unix + era / 2).div_euclid(era);
    (unix + shift * era) * 1_000_000_000 + nanos
}

/// Unix nanoseconds as an NTP timestamp (the inverse of
/// [`timestamp_to_unix_ns`] to within a nanosecond; used by the tests' fake
/// servers).
pub fn unix_ns_to_timestamp(ns: i64) -> u64 {
    let secs = ns.div_euclid(1_000_000_000);
    let nanos = ns.rem_euclid(1_000_000_000) as u128;
    let ntp_secs = (secs + NTP_UNIX_OFFSET_S) as u64 & 0xffff_ffff;
    let frac = (((nanos << 32) + 500_000_000) / 1_000_000_000).min(0xffff_ffff) as u64;
    (ntp_secs << 32) | frac
}

/// An NTP short (16.16 s) as nanoseconds.
pub fn short_to_ns(v: u32) -> i64 {
    ((u64::from(v) * 1_000_000_000) >> 16) as i64
}

/// Nanoseconds as an NTP short (saturating).
pub fn ns_to_short(ns: i64) -> u32 {
    let v = (ns.max(0) as u128) << 16;
    (v / 1_000_000_000).min(u128::from(u32::MAX)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_request_is_version_4_client_mode_with_the_nonce_as_transmit_time() {
        let b = Packet::request(0x0123_4567_89ab_cdef, 6).encode();
        assert_eq!(b[0], 0b00_100_011);
        assert_eq!(b[2], 6);
        assert_eq!(&b[40..48], &0x0123_4567_89ab_cdefu64.to_be_bytes());
        assert!(b[..40].iter().enumerate().all(|(i, &x)| x == 0 || i < 3));
    }

    #[test]
    fn timestamps_convert_to_unix_time_in_this_era_and_the_next() {
        // 2026-11-30 00:00:00 UTC.
        let unix_s = 1_795_996_800i64;
        let ts = ((unix_s + NTP_UNIX_OFFSET_S) as u64) << 32 | (1u64 << 31);
        assert_eq!(
            timestamp_to_unix_ns(ts),
            unix_s * 1_000_000_000 + 500_000_000
        );
        // 2040 is in era 1: the 32-bit seconds have wrapped.
        let unix_2040 = 2_209_032_000i64;
        let ts = (((unix_2040 + NTP_UNIX_OFFSET_S) as u64) & 0xffff_ffff) << 32;
        assert_eq!(timestamp_to_unix_ns(ts), unix_2040 * 1_000_000_000);
        assert_eq!(short_to_ns(1 << 16), 1_000_000_000);
        assert_eq!(short_to_ns(ns_to_short(250_000_000)), 250_000_000);
    }

    proptest! {
        #[test]
        fn any_bytes_decode_without_panicking(b in proptest::collection::vec(any::<u8>(), 0..128)) {
            match Packet::decode(&b) {
                Ok(p) => {
                    prop_assert!(b.len() >= HEADER_LEN);
                    prop_assert_eq!(&p.encode()[..], &b[..HEADER_LEN]);
                    let _ = timestamp_to_unix_ns(p.transmit_ts);
                    let _ = short_to_ns(p.root_delay);
                }
                Err(TooShort(n)) => prop_assert!(n < HEADER_LEN),
            }
        }

        #[test]
        fn unix_ns_round_trip_through_ntp_timestamps(ns in 0i64..3_800_000_000_000_000_000) {
            let back = timestamp_to_unix_ns(unix_ns_to_timestamp(ns));
            prop_assert!((back - ns).abs() <= 1, "{ns} -> {back}");
        }
    }
}
