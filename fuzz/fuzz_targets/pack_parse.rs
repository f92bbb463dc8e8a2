//! Fuzz the pack parser + validator: untrusted bytes from files and the wire.
//! Run: `cargo +nightly fuzz run pack_parse` (from the repository root).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = baton_proto::pack::parse_pack_bytes(data) {
        // A refusal always names at least one positioned error.
        assert!(!e.0.is_empty());
    }
});
