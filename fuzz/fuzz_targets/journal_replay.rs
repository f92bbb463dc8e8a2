//! Fuzz the journal's replay: arbitrary bytes as a `journal.log` are
//! refused (an error naming what is wrong) or recovered — never a panic.
//! Run: `cargo +nightly fuzz run journal_replay` (from the repository root).
//!
//! The first input byte picks the mode: even, the rest is the log image as
//! is (header and checksums must be guessed); odd, the rest is split into
//! records that are framed with valid checksums behind a valid header, so
//! the record decoder and the state fold see every kind of checksum-valid
//! nonsense.
#![no_main]

use baton_journal::{FORMAT_VERSION, check_log_bytes};
use libfuzzer_sys::fuzz_target;

fn framed(data: &[u8]) -> Vec<u8> {
    let (salt, mut rest) = match data {
        [a, b, c, d, rest @ ..] => (u32::from_le_bytes([*a, *b, *c, *d]), rest),
        _ => (0, data),
    };
    let mut log = b"BATONJNL".to_vec();
    log.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    log.extend_from_slice(&salt.to_le_bytes());
    let crc = crc32fast::hash(&log);
    log.extend_from_slice(&crc.to_le_bytes());
    // Each record: one length byte, then that many payload bytes.
    while let [n, tail @ ..] = rest {
        let n = usize::from(*n).min(tail.len());
        let (payload, next) = tail.split_at(n);
        rest = next;
        if payload.is_empty() {
            // A raw byte: lets the fuzzer build torn tails and damage.
            log.push(0);
            continue;
        }
        let len = (payload.len() as u32).to_le_bytes();
        let mut h = crc32fast::Hasher::new_with_initial(salt);
        h.update(&len);
        h.update(payload);
        log.extend_from_slice(&len);
        log.extend_from_slice(&h.finalize().to_le_bytes());
        log.extend_from_slice(payload);
    }
    log
}

fuzz_target!(|data: &[u8]| {
    let Some((mode, rest)) = data.split_first() else {
        let _ = check_log_bytes(data);
        return;
    };
    let log = if mode % 2 == 0 {
        rest.to_vec()
    } else {
        framed(rest)
    };
    if let Ok(s) = check_log_bytes(&log) {
        // Recovered: the intact part and the torn tail cover the image.
        assert_eq!(s.valid_bytes + s.truncated_bytes, log.len() as u64);
    }
});
