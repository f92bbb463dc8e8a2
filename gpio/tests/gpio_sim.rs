//! The sim backend's log survives `kill -9` of the process that wrote it:
//! what end-to-end tests rely on when they crash the agent on purpose.
//!
//! The test re-runs this test binary as a child (`writer_child`, inert
//! unless `BATON_SIM_CRASH_LOG` is set), waits for it to report "READY" on
//! stdout (an event: a pipe read), SIGKILLs it, and reads the log.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};

use baton_gpio::{Allowlist, BackendSpec, open_backend, parse_line_ref};

const ENV: &str = "BATON_SIM_CRASH_LOG";
const CHANGES: usize = 200;

#[test]
fn writer_child() {
    let Ok(path) = std::env::var(ENV) else {
        return; // only does something when run by `log_survives_sigkill`
    };
    let spec: BackendSpec = format!("sim:{path}").parse().expect("spec");
    let mut g = open_backend(&spec, Allowlist::all()).expect("open");
    let a = g
        .request(&parse_line_ref("12").expect("ref"))
        .expect("request");
    let b = g
        .request(&parse_line_ref("gpiochip1:RELAY").expect("ref"))
        .expect("request");
    for i in 0..CHANGES {
        let (h, v) = if i % 2 == 0 {
            (a, 1)
        } else {
            (b, (i / 2 % 2) as u8)
        };
        g.write(h, v, i as i64, &format!("exec-{i}"))
            .expect("write");
    }
    println!("READY");
    // Block until killed: stdin is a pipe the parent never writes to.
    let _ = std::io::stdin().read(&mut [0u8; 1]);
}

#[test]
fn log_survives_sigkill() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("gpio.log");
    let exe = std::env::current_exe().expect("test binary");
    let mut child = Command::new(exe)
        .args(["--exact", "writer_child", "--nocapture", "--test-threads=1"])
        .env(ENV, &log)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("piped");
    // Read on a helper thread so a child that never gets ready fails the
    // test after a deadline instead of hanging it.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let ready = BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            // libtest may print "test writer_child ... " on the same line.
            .any(|l| l.trim_end().ends_with("READY"));
        let _ = tx.send(ready);
    });
    let ready = rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .unwrap_or(false);
    // SIGKILL: no destructor, no flush, no atexit runs.
    child.kill().expect("kill -9");
    let status = child.wait().expect("reap");
    assert!(ready, "child never got ready ({status})");

    let text = std::fs::read_to_string(&log).expect("log");
    let recs: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("torn line {l:?}: {e}")))
        .collect();
    assert_eq!(recs.len(), CHANGES, "every change reached the file");
    assert_eq!(
        recs[0],
        serde_json::json!({"t": 0, "chip": "gpiochip0", "line": 12, "value": 1, "execution_id": "exec-0"})
    );
    assert_eq!(
        recs[CHANGES - 1],
        serde_json::json!({"t": CHANGES - 1, "chip": "gpiochip1", "line": "RELAY", "value": 1, "execution_id": format!("exec-{}", CHANGES - 1)})
    );
}
