//! A GPIO write that never returns (issue 24): the sim backend's test
//! fault `--inject-gpio-hang-after N` leaves the dispatcher thread inside
//! its Nth+1 device call for good, holding whatever that call holds.
//!
//! - The call hangs, the chip does not: on SIGTERM the safe-state levels
//!   are on the lines within 1 s, written without the dispatcher (each
//!   line's own handle on the kernel's line), and the agent exits non-zero.
//! - The chip hangs (`--inject-gpio-hang-all`: the direct writes hang
//!   too): the agent says so and exits with its distinct status (75); the
//!   next start drives every journalled pack's safe state before it arms
//!   anything.

use std::time::{Duration, Instant};

use baton_e2e::local::{Setup, TOGGLE, agent, setup, sim_lines, stderr_of};
use baton_e2e::{Running, signal, wait_exit, wait_until};

const T: Duration = Duration::from_secs(30);
/// `safety::EXIT_GPIO_HUNG`.
const EXIT_GPIO_HUNG: i32 = 75;

fn is_safe(l: &serde_json::Value) -> bool {
    l["execution_id"]
        .as_str()
        .is_some_and(|s| s.contains("safe_state") || s.contains("-safe-state"))
}

/// Start with the fault, let 3 toggles land (line 5 high), the 4th hangs.
fn hung_after_three(s: &Setup, all: bool) -> Running {
    let mut extra = vec!["--inject-gpio-hang-after", "3"];
    if all {
        extra.push("--inject-gpio-hang-all");
    }
    let child = Running(agent(s, &extra).spawn().expect("spawn"));
    assert!(
        wait_until(T, || sim_lines(&s.log).len() >= 3),
        "the pack never fired 3 times"
    );
    assert_eq!(
        sim_lines(&s.log).last().map(|l| l["value"].clone()),
        Some(1.into()),
        "hung with the line high"
    );
    child
}

#[test]
fn a_hung_gpio_call_still_gets_the_safe_state_on_the_lines_within_a_second() {
    let s = setup(TOGGLE);
    let mut child = hung_after_three(&s, false);
    let n = sim_lines(&s.log).len();
    let sent = Instant::now();
    signal(&child, libc::SIGTERM);
    let landed = wait_until(Duration::from_secs(1), || {
        sim_lines(&s.log)[n..]
            .iter()
            .any(|l| is_safe(l) && l["line"] == 5 && l["value"] == 0)
    });
    let took = sent.elapsed();
    let status = wait_exit(&mut child, T).expect("exits despite the hung call");
    let err = stderr_of(&mut child.0);
    assert!(
        landed,
        "safe state not on the line within 1 s ({took:?})\n{err}"
    );
    assert!(
        !status.success(),
        "a hung call is a fault: {status:?}\n{err}"
    );
    assert_ne!(
        status.code(),
        Some(EXIT_GPIO_HUNG),
        "the chip was not hung\n{err}"
    );
    let log = sim_lines(&s.log);
    let after: Vec<&serde_json::Value> = log[n..].iter().filter(|l| !is_safe(l)).collect();
    assert!(
        after.is_empty(),
        "writes after SIGTERM that are not the safe state: {after:?}"
    );
    assert_eq!(
        log.last().map(|l| l["value"].clone()),
        Some(0.into()),
        "{err}"
    );
    eprintln!("safe state on the line {took:?} after SIGTERM");
}

#[test]
fn a_hung_chip_exits_with_its_status_and_the_next_start_drives_the_safe_state_first() {
    let s = setup(TOGGLE);
    let mut child = hung_after_three(&s, true);
    let n = sim_lines(&s.log).len();
    signal(&child, libc::SIGTERM);
    let status = wait_exit(&mut child, T).expect("exits despite the hung chip");
    let err = stderr_of(&mut child.0);
    assert_eq!(status.code(), Some(EXIT_GPIO_HUNG), "{err}");
    assert!(err.contains("GPIO chip is hung"), "{err}");
    assert_eq!(sim_lines(&s.log).len(), n, "nothing could be written");
    assert!(
        s.data.join("safe-state-owed").exists(),
        "the marker is left"
    );

    // The next start (the chip works again): the safe state first, then
    // the pack runs.
    let mut next = Running(agent(&s, &[]).spawn().expect("spawn"));
    assert!(
        wait_until(T, || sim_lines(&s.log).len() >= n + 3),
        "the restarted agent never fired"
    );
    signal(&next, libc::SIGTERM);
    let status = wait_exit(&mut next, T).expect("stops");
    let err = stderr_of(&mut next.0);
    assert!(status.success(), "{status:?}\n{err}");
    let log = sim_lines(&s.log);
    let first = &log[n];
    assert!(
        is_safe(first) && first["line"] == 5 && first["value"] == 0,
        "the first write after the restart is the owed safe state: {:?}\n{err}",
        &log[n..]
    );
    assert!(
        !s.data.join("safe-state-owed").exists(),
        "the marker goes once the safe state is driven"
    );
}
