//! Fuzz the pack parser + validator: untrusted bytes from files and the wire.
//!
//! Run from the repository root (no nightly toolchain needed; about 6 min
//! to build from cold on 2 cores, under a minute after that):
//!
//! ```text
//! RUSTC_BOOTSTRAP=1 CARGO_BUILD_JOBS=1 CARGO_TARGET_DIR=/tmp/target-fuzz \
//!     cargo fuzz run pack_parse --sanitizer none -- -max_total_time=20
//! ```
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match baton_proto::pack::parse_pack_bytes(data) {
        // A refusal always names at least one positioned error.
        Err(e) => assert!(!e.0.is_empty()),
        // An accepted pack goes through what the agent does next: the live
        // check and the line-ownership helpers, which must not panic either.
        Ok(pack) => {
            let now = baton_proto::RefTime::from_nanos(1_796_119_200_000_000_000);
            if let Err(e) = pack.check_live(now) {
                assert!(!e.0.is_empty());
            }
            let driven = pack.driven_lines();
            for l in &pack.shared_lines {
                assert!(driven.contains(l), "shared line {l:?} is not driven");
            }
            let _ = pack.line_conflicts(&pack, Some("gpiochip0"));
        }
    }
});
