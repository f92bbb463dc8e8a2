//! Interop: our PTP slave (statime) against linuxptp's ptp4l as grandmaster,
//! over a veth pair between two network namespaces, software timestamps.
//! Both ends share one physical clock, so reference time must come out
//! equal to `CLOCK_REALTIME`: every sample's offset is checked against a
//! bracketed `realtime − monotonic` reading.

mod ptp_netns;

use std::time::{Duration, Instant};

use baton_clock::ptp::{self, PtpPortState};
use baton_clock::sample::{SourceKind, sample_channel};
use baton_clock::settings::PtpConfig;

/// A sample this close to the truth is good, ns.
const GOOD_NS: i64 = 100_000;
/// Time allowed to the first good sample.
const FIRST_GOOD: Duration = Duration::from_secs(10);
/// The virtual clock starts this far off, so the servo has to converge
/// (the grandmaster shares our clock: without it we would start on time).
const START: ptp::SpawnOptions = ptp::SpawnOptions {
    start_error_ns: 25_000_000,
};
/// Samples checked after the first good one.
const CHECKED: usize = 12;

#[test]
fn slave_converges_on_a_ptp4l_grandmaster() {
    if let Some(why) = ptp_netns::unavailable() {
        baton_testenv::missing("ptp_linuxptp", None, &why);
        return;
    }
    let mut rig = match ptp_netns::Rig::new("it") {
        Ok(r) => r,
        Err(e) => {
            baton_testenv::missing(
                "ptp_linuxptp",
                None,
                &format!("cannot create network namespaces: {e}"),
            );
            return;
        }
    };
    let cfg = rig.config("gm.cfg", ptp_netns::GM_CONFIG);
    let gm_ns = rig.gm.clone();
    let gm_if = rig.gm_if.clone();
    let _gm_log = rig.ptp4l(
        &gm_ns,
        &[
            "-f",
            cfg.to_str().expect("utf-8 path"),
            "-i",
            &gm_if,
            "-S",
            "-4",
            "-E",
            "-m",
            "-q",
        ],
    );

    let (tx, rx) = sample_channel();
    let pcfg = PtpConfig {
        interface: rig.slave_if.clone(),
        domain: 0,
    };
    let start = Instant::now();
    let handle = rig
        .in_slave(move || ptp::spawn_with(&pcfg, tx, START))
        .expect("PTP source starts in the slave namespace");

    let mut first_good = None;
    let mut checked = Vec::new();
    let deadline = start + FIRST_GOOD + Duration::from_secs(20);
    while checked.len() < CHECKED {
        let left = deadline.saturating_duration_since(Instant::now());
        let s = match rx.recv_timeout(left) {
            Ok(s) => s,
            Err(e) => panic!(
                "no sample in time ({e:?}); first good after {first_good:?}, state {:?}",
                handle.state()
            ),
        };
        assert_eq!(s.source, SourceKind::Ptp);
        assert!(s.error_ns >= 0);
        let err = s.offset_ns - ptp_netns::truth_ns();
        match first_good {
            None if err.abs() < GOOD_NS => first_good = Some(start.elapsed()),
            None => {}
            Some(_) => checked.push((err, s.error_ns)),
        }
    }
    let first = first_good.expect("a good sample");
    eprintln!("first good sample after {first:?}; then (error, claimed) ns: {checked:?}");
    assert!(first < FIRST_GOOD, "first good sample after {first:?}");
    for (err, _) in &checked {
        assert!(
            err.abs() < GOOD_NS,
            "sample off by {err} ns after convergence: {checked:?}"
        );
    }
    // The published state has reached slave (locked) by now.
    let until = Instant::now() + Duration::from_secs(5);
    while handle.state() != PtpPortState::Slave && Instant::now() < until {
        let _ = rx.recv_timeout(Duration::from_millis(500));
    }
    assert_eq!(handle.state(), PtpPortState::Slave);

    // The grandmaster goes away: the port falls back to listening (a
    // slave-only instance never makes itself master), the thread lives on,
    // and no more samples come.
    rig.stop_ptp4l();
    let until = Instant::now() + Duration::from_secs(15);
    while handle.state() != PtpPortState::Listening && Instant::now() < until {
        let _ = rx.recv_timeout(Duration::from_millis(200));
    }
    assert_eq!(handle.state(), PtpPortState::Listening);
    while rx.try_recv().is_ok() {}
    assert!(rx.recv_timeout(Duration::from_secs(2)).is_err());
    assert_eq!(handle.state(), PtpPortState::Listening);
    let t = Instant::now();
    drop(handle);
    assert!(
        t.elapsed() < ptp::STOP_WAIT,
        "stopping took {:?}",
        t.elapsed()
    );
}

#[test]
fn a_missing_interface_is_a_clear_error() {
    let (tx, _rx) = sample_channel();
    let cfg = PtpConfig {
        interface: "nosuchif0".into(),
        domain: 0,
    };
    match ptp::spawn(&cfg, tx) {
        Err(ptp::PtpError::NoSuchInterface(i)) => assert_eq!(i, "nosuchif0"),
        other => panic!("expected NoSuchInterface, got {other:?}"),
    }
}
