//! A journal that cannot be written (a full disk, a size limit) ends the
//! control loop through its one way out: the safe state reaches the device
//! first, the agent reports a fault. The file-size limit is per process, so
//! this test has a binary of its own.

mod rig;

use std::time::Duration;

use baton_agent::runtime::{StopCause, StopFlag};
use nix::sys::resource::{Resource, getrlimit, setrlimit};
use nix::sys::signal::{SigHandler, Signal, signal};
use rig::*;

#[test]
fn a_journal_write_failure_drives_the_safe_state_and_is_a_fault() {
    let mut r = rig();
    // The pack's text is journalled: a comment keeps the journal larger
    // than the sim log (whose writes must still land) now that a firing's
    // records are a few bytes.
    let padding = format!("# {}\n", "x".repeat(1_000));
    r.accept(&pack(
        "p",
        1,
        &format!("{padding}safe_state:\n  - {{action: gpio.write, params: {{line: 5, value: 0}}}}\ninstructions:\n  - {{id: t, action: gpio.toggle, params: {{line: 5}}, every: 10ms}}\n"),
    ))
    .expect("accepted");
    r.run_until(t(25), Duration::from_millis(1));
    assert_eq!(r.level(5), Some(1), "three toggles: high");
    // From here no file of this process may grow past the journal's
    // current size: its next append fails (EFBIG), as on a full disk. The
    // sim log is smaller than the journal, so the device still works.
    let journal = std::fs::metadata(r.data.join("journal.log"))
        .expect("log")
        .len();
    let sim = std::fs::metadata(&r.log).expect("sim log").len();
    assert!(sim + 600 < journal, "sim log {sim} B, journal {journal} B");
    // SAFETY: ignoring SIGXFSZ installs no handler code; the failing write
    // then returns EFBIG instead of killing the test process.
    unsafe { signal(Signal::SIGXFSZ, SigHandler::SigIgn) }.expect("ignore SIGXFSZ");
    let (_, hard) = getrlimit(Resource::RLIMIT_FSIZE).expect("getrlimit");
    // `rlim_t` is 32 bits on armv7; the journal is a few KB.
    setrlimit(Resource::RLIMIT_FSIZE, journal as libc::rlim_t, hard).expect("setrlimit");
    // The next firing is due: its start record cannot be written.
    r.clock.advance(Duration::from_millis(10));
    let cause = r.agent.run(&StopFlag::default(), false);
    setrlimit(Resource::RLIMIT_FSIZE, hard, hard).expect("restore rlimit");
    match &cause {
        StopCause::Fault(e) => assert!(format!("{e:#}").contains("journal"), "{e:#}"),
        other => panic!("expected a fault, got {other:?}"),
    }
    assert_eq!(r.level(5), Some(0), "the safe state reached the device");
    let w = r.writes();
    let last = w.last().expect("writes");
    assert!(
        last["execution_id"]
            .as_str()
            .is_some_and(|s| s.contains("safe_state")),
        "{last}"
    );
}
