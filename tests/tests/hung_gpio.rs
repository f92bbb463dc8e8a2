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

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use baton_e2e::{Running, bin, lines, signal, wait_exit, wait_until};

const T: Duration = Duration::from_secs(30);
/// `safety::EXIT_GPIO_HUNG`.
const EXIT_GPIO_HUNG: i32 = 75;

fn sim_lines(path: &Path) -> Vec<serde_json::Value> {
    lines(path)
        .iter()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

struct Setup {
    _dir: tempfile::TempDir,
    pack: PathBuf,
    log: PathBuf,
    data: PathBuf,
}

/// Line 5 toggles every 20 ms; the safe state writes it 0.
fn setup() -> Setup {
    let dir = tempfile::tempdir().expect("tempdir");
    let pack = dir.path().join("pack.yaml");
    std::fs::write(
        &pack,
        "pack: p\nversion: 1\nsafe_state:\n  - {action: gpio.write, params: {line: 5, value: 0}}\n\
         instructions:\n  - {id: t, action: gpio.toggle, params: {line: 5}, every: 20ms}\n",
    )
    .expect("write pack");
    Setup {
        log: dir.path().join("gpio.jsonl"),
        data: dir.path().join("data"),
        pack,
        _dir: dir,
    }
}

fn agent(s: &Setup, extra: &[&str]) -> Command {
    let mut c = Command::new(bin("baton-agent"));
    c.args(["run", "--system-clock", "reference", "--no-rt", "--quiet"])
        .args(["--id", "t", "--data"])
        .arg(&s.data)
        .arg("--gpio")
        .arg(format!("sim:{}", s.log.display()))
        .arg("--pack")
        .arg(&s.pack)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    c
}

fn stderr_of(child: &mut Child) -> String {
    use std::io::Read;
    let mut s = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut s);
    }
    s
}

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
    let s = setup();
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
    let s = setup();
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
