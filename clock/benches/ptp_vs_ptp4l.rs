//! The "Clock: PTP" figure: our PTP slave (statime, virtual clock) side by
//! side with linuxptp's ptp4l as a slave, both following one ptp4l
//! grandmaster over the same veth link, software timestamps, in one run.
//!
//! Grandmaster and slaves share one physical clock, so the true offset is
//! zero: our error is a sample's offset minus a bracketed `realtime −
//! monotonic` reading; ptp4l's (run with `free_running 1`, so it measures
//! without steering the shared clock) is its `master offset`. After both
//! have locked and then run locked for `PTP_SETTLE_SECS` (default 30),
//! `PTP_SECS` seconds (default 30) of each are summarised.
//!
//! Run as root: `cargo bench -p baton-clock --bench ptp_vs_ptp4l`.
//! `PTP_START_ERROR_NS` (default 25 ms) is where our virtual clock starts.

#[path = "../tests/ptp_netns/mod.rs"]
mod ptp_netns;

use std::time::{Duration, Instant};

use baton_clock::ptp::{self, PtpPortState};
use baton_clock::sample::sample_channel;
use baton_clock::settings::PtpConfig;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[derive(Debug)]
struct Stats {
    n: usize,
    mean: f64,
    sd: f64,
    rms: f64,
    max_abs: i64,
}

fn stats(v: &[i64]) -> Stats {
    let n = v.len().max(1) as f64;
    let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
    let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
    let rms = (v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>() / n).sqrt();
    Stats {
        n: v.len(),
        mean,
        sd: var.sqrt(),
        rms,
        max_abs: v.iter().map(|x| x.abs()).max().unwrap_or(0),
    }
}

/// `master offset` of a ptp4l log line, ns.
fn ptp4l_offset(line: &str) -> Option<i64> {
    let rest = line.split("master offset").nth(1)?;
    rest.split_whitespace().next()?.parse().ok()
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing
    // useful either: this only runs as a bench.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    if let Some(why) = ptp_netns::unavailable() {
        eprintln!("SKIP ptp_vs_ptp4l: {why}");
        return;
    }
    let secs = env_u64("PTP_SECS", 30);
    let settle = env_u64("PTP_SETTLE_SECS", 30);
    let debug = std::env::var_os("PTP_DEBUG").is_some();
    let start_error = env_u64("PTP_START_ERROR_NS", 25_000_000) as i64;
    let mut rig = ptp_netns::Rig::new("bn").expect("network namespaces");
    let gm_cfg = rig.config("gm.cfg", ptp_netns::GM_CONFIG);
    // ptp4l slave: its own clock identity (ours is the EUI-64 of the same
    // MAC), measures but never steers the shared clock, prints every offset.
    let sl_cfg = rig.config(
        "slave.cfg",
        "[global]
slaveOnly 1
clockIdentity 0a0b0c.fffe.0d0e0f
free_running 1
freq_est_interval 0
summary_interval -2
logSyncInterval -2
logMinDelayReqInterval 0
delay_mechanism E2E
network_transport UDPv4
time_stamping software
",
    );
    let (gm_ns, gm_if) = (rig.gm.clone(), rig.gm_if.clone());
    let (sl_ns, sl_if) = (rig.slave.clone(), rig.slave_if.clone());
    let _gm = rig.ptp4l(
        &gm_ns,
        &[
            "-f",
            gm_cfg.to_str().expect("path"),
            "-i",
            &gm_if,
            "-m",
            "-q",
        ],
    );
    let t0 = Instant::now();
    let theirs = if std::env::var_os("PTP_NO_PTP4L").is_some() {
        std::sync::mpsc::channel().1
    } else {
        rig.ptp4l(
            &sl_ns,
            &[
                "-f",
                sl_cfg.to_str().expect("path"),
                "-i",
                &sl_if,
                "-m",
                "-q",
            ],
        )
    };
    let (tx, rx) = sample_channel();
    let pcfg = PtpConfig {
        interface: sl_if.clone(),
        domain: 0,
    };
    let opts = ptp::SpawnOptions {
        start_error_ns: start_error,
    };
    let handle = rig
        .in_slave(move || ptp::spawn_with(&pcfg, tx, opts))
        .expect("PTP source");

    // Until both are locked: ours in state slave (servo settled after its
    // step from the start error); ptp4l free-running has no lock (its servo
    // stays s0), so its first measured offset counts.
    let mut our_lock = None;
    let mut their_lock = None;
    let lock_deadline = t0 + Duration::from_secs(30);
    let mut last_line = String::new();
    if std::env::var_os("PTP_NO_PTP4L").is_some() {
        their_lock = Some(Duration::ZERO);
    }
    while our_lock.is_none() || their_lock.is_none() {
        assert!(
            Instant::now() < lock_deadline,
            "not locked within 30 s: ours {our_lock:?} ({:?}), ptp4l {their_lock:?} (last line {last_line:?})",
            handle.state()
        );
        if our_lock.is_none() && handle.state() == PtpPortState::Slave {
            our_lock = Some(t0.elapsed());
        }
        let _ = rx.recv_timeout(Duration::from_millis(50));
        while let Ok(line) = theirs.try_recv() {
            if their_lock.is_none() && ptp4l_offset(&line).is_some() {
                their_lock = Some(t0.elapsed());
            }
            last_line = line;
        }
    }
    // Let both settle while locked, drain, then measure.
    let settle_end = Instant::now() + Duration::from_secs(settle);
    while Instant::now() < settle_end {
        let _ = rx.recv_timeout(Duration::from_millis(50));
        while theirs.try_recv().is_ok() {}
    }
    while rx.try_recv().is_ok() {}
    while theirs.try_recv().is_ok() {}
    let mut ours = Vec::new();
    let mut claimed = Vec::new();
    let mut them = Vec::new();
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        if let Ok(s) = rx.recv_timeout(Duration::from_millis(20)) {
            ours.push(s.offset_ns - ptp_netns::truth_ns());
            claimed.push(s.error_ns);
            if debug {
                eprintln!(
                    "{:?} ours {} claimed {}",
                    t0.elapsed(),
                    ours[ours.len() - 1],
                    s.error_ns
                );
            }
        }
        while let Ok(line) = theirs.try_recv() {
            if debug {
                eprintln!("{:?} {line}", t0.elapsed());
            }
            if let Some(o) = ptp4l_offset(&line) {
                them.push(o);
            }
        }
    }
    drop(handle);
    let (a, b) = (stats(&ours), stats(&them));
    let ours_ok = claimed
        .iter()
        .zip(&ours)
        .filter(|(c, e)| e.abs() <= **c)
        .count();
    println!(
        "PTP slave vs ptp4l slave, one ptp4l grandmaster, veth, software timestamps, {secs} s measured after {settle} s locked"
    );
    println!("| slave | samples | mean error | std dev | rms | max abs | time to locked¹ |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (name, s, lock) in [
        ("baton (statime, virtual clock)", &a, our_lock),
        ("ptp4l -s, free_running", &b, their_lock),
    ] {
        println!(
            "| {name} | {} | {:.0} ns | {:.0} ns | {:.0} ns | {} ns | {:.1} s |",
            s.n,
            s.mean,
            s.sd,
            s.rms,
            s.max_abs,
            lock.unwrap_or_default().as_secs_f64()
        );
    }
    println!(
        "¹ baton: start to port state slave, from a {} ms start error; ptp4l: start to first offset (free-running, no servo lock)",
        start_error / 1_000_000
    );
    println!(
        "rms ratio baton/ptp4l: {:.2}; our claimed error_ns covered the true error in {}/{} samples",
        a.rms / b.rms.max(1.0),
        ours_ok,
        ours.len()
    );
}
