//! Restarts, as an operator causes them (`kill -9`, SIGTERM, a new `--pack`,
//! a new config): the promises of docs/design.md "Time semantics" and principle
//! 4 hold across them. Real binaries, sim GPIO, real time; every assertion
//! reads the sim log (one JSON line per line change, with its execution id
//! `tenant/pack/vN/instruction/occurrence_ns/aK`) or what the agent printed.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use baton_e2e::{Running, bin, lines, run, signal, wait_exit, wait_until};

const T: Duration = Duration::from_secs(10);
const MS: i64 = 1_000_000;
const S: i64 = 1_000_000_000;

/// Reference time now, ns (the agent runs on the system clock).
fn now_ns() -> i64 {
    i64::try_from(jiff::Timestamp::now().as_nanosecond()).expect("ns fit i64")
}

/// `now + ms` as RFC 3339 with ns, for `at:` / `start_at:` / `until:`.
fn in_ms(ms: i64) -> String {
    format!(
        "{:.9}",
        jiff::Timestamp::now() + jiff::SignedDuration::from_millis(ms)
    )
}

/// One line of the sim log.
#[derive(Clone, Debug)]
struct Write {
    t: i64,
    line: i64,
    value: i64,
    id: String,
}

impl Write {
    /// The instruction of an attempt's id (`None` for safe state /
    /// on_failure writes, whose ids are `tenant/pack <what>@ns`).
    fn instruction(&self) -> Option<&str> {
        self.parts().map(|p| p.3)
    }

    /// The occurrence (ns) of an attempt's id.
    fn occurrence(&self) -> Option<i64> {
        self.parts().and_then(|p| p.4.parse().ok())
    }

    /// The version (`vN`) of an attempt's id.
    fn version(&self) -> Option<&str> {
        self.parts().map(|p| p.2)
    }

    fn parts(&self) -> Option<(&str, &str, &str, &str, &str, &str)> {
        let mut it = self.id.split('/');
        let p = (
            it.next()?,
            it.next()?,
            it.next()?,
            it.next()?,
            it.next()?,
            it.next()?,
        );
        it.next().is_none().then_some(p)
    }

    fn is(&self, instruction: &str) -> bool {
        self.instruction() == Some(instruction)
    }
}

fn writes(log: &Path) -> Vec<Write> {
    lines(log)
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|v| Write {
            t: v["t"].as_i64().expect("t"),
            line: v["line"].as_i64().unwrap_or(-1),
            value: v["value"].as_i64().expect("value"),
            id: v["execution_id"].as_str().expect("id").to_string(),
        })
        .collect()
}

fn count(log: &Path, instruction: &str) -> usize {
    writes(log).iter().filter(|w| w.is(instruction)).count()
}

/// A per-test directory: journal, sim log, pack files, and each run's
/// stdout / stderr in files (a pipe nobody reads could fill and stall the
/// agent).
struct Setup {
    dir: tempfile::TempDir,
    log: PathBuf,
    data: PathBuf,
    runs: std::cell::Cell<usize>,
}

/// A running agent (killed if the test ends early) and its output files.
struct Agent {
    child: Running,
    out: PathBuf,
    err: PathBuf,
}

impl Agent {
    fn stdout(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.err).unwrap_or_default()
    }

    /// `kill -9`, reaped.
    fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM; it must exit 0.
    fn term(&mut self) {
        signal(&self.child, libc::SIGTERM);
        let status = wait_exit(&mut self.child, T).expect("exits after SIGTERM");
        assert!(status.success(), "{status:?}\n{}", self.stderr());
    }

    fn assert_running(&mut self) {
        assert!(
            self.child.try_wait().expect("try_wait").is_none(),
            "the agent exited: {}",
            self.stderr()
        );
    }
}

impl Setup {
    fn new() -> Setup {
        // Built (or found current) before a test computes any instant.
        bin("baton-agent");
        let dir = tempfile::tempdir().expect("tempdir");
        Setup {
            log: dir.path().join("gpio.jsonl"),
            data: dir.path().join("data"),
            runs: std::cell::Cell::new(0),
            dir,
        }
    }

    fn file(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).expect("write file");
        p
    }

    fn command(&self, extra: &[&str]) -> Command {
        let mut c = Command::new(bin("baton-agent"));
        c.args(["run", "--system-clock", "reference", "--no-rt", "--id", "t"])
            .arg("--data")
            .arg(&self.data)
            .arg("--gpio")
            .arg(format!("sim:{}", self.log.display()))
            .args(extra)
            .stdin(Stdio::null());
        c
    }

    /// Start `baton-agent run` on this setup's journal and sim log.
    fn start(&self, extra: &[&str]) -> Agent {
        let n = self.runs.get() + 1;
        self.runs.set(n);
        let out = self.dir.path().join(format!("out-{n}.txt"));
        let err = self.dir.path().join(format!("err-{n}.txt"));
        let child = self
            .command(extra)
            .stdout(std::fs::File::create(&out).expect("stdout file"))
            .stderr(std::fs::File::create(&err).expect("stderr file"))
            .spawn()
            .expect("spawn agent");
        Agent {
            child: Running(child),
            out,
            err,
        }
    }
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

/// A duration as the agent prints it: `850ns`, `-12.5us`, `3.2ms`,
/// `1s20ms934us837ns`, `1h672ms`. In ns.
fn parse_printed_duration(s: &str) -> Option<f64> {
    let (neg, mut rest) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s),
    };
    let mut total = 0.0;
    while !rest.is_empty() {
        let num_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        let n: f64 = rest[..num_end].parse().ok()?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "ns" => 1.0,
            "us" | "µs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        total += n * scale;
        rest = &rest[unit_end..];
    }
    Some(if neg { -total } else { total })
}

// ---------------------------------------------------------------------------
// 1. A short restart does not burst.

enum Stop {
    Kill9,
    Term,
}

fn short_restart_does_not_burst(stop: Stop) {
    let s = Setup::new();
    let pack = s.file(
        "p.yaml",
        "pack: b\nversion: 1\nsafe_state:\n  - {action: gpio.write, params: {line: 1, value: 0}}\n\
         instructions:\n  - {id: t, action: gpio.toggle, params: {line: 1}, every: 10ms}\n",
    );
    let mut a = s.start(&["--quiet", "--pack", path_str(&pack)]);
    assert!(
        wait_until(T, || count(&s.log, "t") >= 20),
        "never toggled: {}",
        a.stderr()
    );
    match stop {
        Stop::Kill9 => a.kill9(),
        Stop::Term => a.term(),
    }
    let before = writes(&s.log);
    let last_before = before
        .iter()
        .filter_map(Write::occurrence)
        .max()
        .expect("occurrences before the stop");
    // The downtime under test: shorter than the default max_lateness (1s),
    // so every occurrence in it would still be "in bound" if it were fired.
    std::thread::sleep(Duration::from_millis(600));
    let restart = now_ns();
    // After SIGTERM the pack file is offered again (unchanged, as a
    // config's `packs:` would be); after kill -9 the journal alone restores.
    let mut b = match stop {
        Stop::Kill9 => s.start(&["--quiet"]),
        Stop::Term => s.start(&["--quiet", "--pack", path_str(&pack)]),
    };
    assert!(
        wait_until(T, || writes(&s.log)[before.len()..]
            .iter()
            .filter(|w| w.is("t"))
            .count()
            >= 30),
        "did not resume: {}",
        b.stderr()
    );
    b.term();
    let after: Vec<Write> = writes(&s.log)[before.len()..]
        .iter()
        .filter(|w| w.is("t"))
        .cloned()
        .collect();
    // No catch-up (catch_up: none): no occurrence of the downtime fired.
    let in_downtime: Vec<&Write> = after
        .iter()
        .filter(|w| w.occurrence().is_some_and(|o| o < restart))
        .collect();
    assert!(
        in_downtime.is_empty(),
        "fired occurrences of the downtime ({} .. {restart}): {in_downtime:?}",
        last_before
    );
    // No burst: the first 50 ms after resuming hold at most the schedule's
    // own firings — 6 when the first one is on time; if a loaded machine
    // made it late, the occurrences between it and the window's end.
    let t0 = after[0].t;
    let first_occ = after[0].occurrence().expect("occurrence");
    let allowed = usize::try_from((t0 + 50 * MS - first_occ) / (10 * MS) + 1).expect("count");
    let burst = after.iter().filter(|w| w.t - t0 <= 50 * MS).count();
    assert!(
        burst <= allowed.max(6),
        "{burst} writes in the first 50 ms after the restart (schedule: {allowed}): {:?}",
        &after[..burst]
    );
    // None early.
    assert!(
        after
            .iter()
            .all(|w| w.occurrence().is_some_and(|o| w.t >= o)),
        "{after:?}"
    );
    // Each occurrence once, on the original 10 ms grid.
    let occ: Vec<i64> = after.iter().filter_map(Write::occurrence).collect();
    assert!(occ.windows(2).all(|w| w[1] > w[0]), "{occ:?}");
    assert!(
        occ.iter().all(|o| (o - last_before) % (10 * MS) == 0),
        "off the grid: {occ:?} vs {last_before}"
    );
}

#[test]
fn a_short_restart_after_kill_9_does_not_burst() {
    short_restart_does_not_burst(Stop::Kill9);
}

#[test]
fn a_short_restart_after_sigterm_does_not_burst() {
    short_restart_does_not_burst(Stop::Term);
}

// ---------------------------------------------------------------------------
// 2. `until` is respected by catch-up.

#[test]
fn catch_up_last_never_fires_past_until() {
    let s = Setup::new();
    let now = jiff::Timestamp::now();
    let start = now - jiff::SignedDuration::from_hours(1);
    let until = now - jiff::SignedDuration::from_mins(30);
    let until_ns = i64::try_from(until.as_nanosecond()).expect("ns");
    let pack = s.file(
        "p.yaml",
        &format!(
            "pack: u\nversion: 1\ninstructions:\n  - {{id: t, action: gpio.toggle, params: {{line: 1}}, every: 1s, start_at: {start:.9}, until: {until:.9}, catch_up: last}}\n  - {{id: keep, action: gpio.toggle, params: {{line: 2}}, every: 50ms}}\n"
        ),
    );
    let mut a = s.start(&["--quiet", "--pack", path_str(&pack)]);
    assert!(
        wait_until(T, || count(&s.log, "keep") >= 10),
        "{}",
        a.stderr()
    );
    a.kill9();
    let mut b = s.start(&["--quiet"]);
    let n = count(&s.log, "keep");
    assert!(
        wait_until(T, || count(&s.log, "keep") >= n + 10),
        "{}",
        b.stderr()
    );
    b.term();
    let t: Vec<Write> = writes(&s.log).into_iter().filter(|w| w.is("t")).collect();
    // Nothing past `until`; `last` may replay the latest occurrence not
    // past it — once, whatever the restarts.
    assert!(
        t.iter()
            .all(|w| w.occurrence().is_some_and(|o| o <= until_ns)),
        "fired past until ({until}): {t:?}"
    );
    assert!(t.len() <= 1, "caught up more than once: {t:?}");
}

// ---------------------------------------------------------------------------
// 3. A dependent's lateness is true.

#[test]
fn a_dependent_missed_in_downtime_is_reported_with_its_true_lateness() {
    let s = Setup::new();
    let pack = s.file(
        "p.yaml",
        &format!(
            "pack: d\nversion: 1\nsafe_state:\n  - {{action: gpio.write, params: {{line: 6, value: 0}}}}\ninstructions:\n  - {{id: up, action: gpio.write, params: {{line: 5, value: 1}}, at: {}}}\n  - {{id: down, action: gpio.write, params: {{line: 5, value: 0}}, after: [up], delay: 3s, max_lateness: 200ms}}\n  - {{id: mark, action: gpio.write, params: {{line: 7, value: 1}}, at: {}}}\n",
            in_ms(600),
            in_ms(700)
        ),
    );
    let mut a = s.start(&["--quiet", "--pack", path_str(&pack)]);
    // `mark` fires 100 ms after `up`: by then `up`'s result is in the
    // journal file (arming `mark` wrote the journal), so the restart knows
    // `up` succeeded. (Killed right after `up`, its outcome would be unknown
    // and `down` would never be released: not what this test is about.)
    assert!(
        wait_until(T, || count(&s.log, "mark") == 1),
        "{}",
        a.stderr()
    );
    a.kill9();
    let up_occ = writes(&s.log)
        .iter()
        .find(|w| w.is("up"))
        .and_then(Write::occurrence)
        .expect("up's occurrence");
    let due = up_occ + 3 * S;
    // Down for 4 s after `up`: `down` (due up + 3 s) is 1 s overdue, past
    // its max_lateness of 200 ms.
    let wake = up_occ + 4 * S - now_ns();
    if wake > 0 {
        std::thread::sleep(Duration::from_nanos(wake.unsigned_abs()));
    }
    let restart = now_ns();
    // Not quiet: the live view prints the skip / give-up. Idle once `down`
    // is settled: if it were rescheduled at restart + 3 s, it would fire
    // before the agent exits.
    let mut b = s.start(&["--exit-when-idle"]);
    let status = wait_exit(&mut b.child, T).expect("exits when idle");
    assert!(status.success(), "{status:?}\n{}", b.stderr());
    let out = b.stdout();
    // `mark` itself may be unknown (the kill can land between its firing
    // and its lazily written result); `up`, 100 ms earlier, may not.
    assert!(
        !out.lines()
            .any(|l| l.trim_start().starts_with("up ") && l.contains("outcome_unknown")),
        "`up`'s result was not journalled 100 ms after it ran:\n{out}"
    );
    let downs: Vec<Write> = writes(&s.log)
        .into_iter()
        .filter(|w| w.is("down"))
        .collect();
    for w in &downs {
        assert_eq!(w.occurrence(), Some(due), "down fired off its occurrence");
        assert!(
            w.t >= restart && w.t < restart + 5 * S,
            "down fired at {} though it was due at {due}",
            w.t
        );
    }
    assert!(
        downs.is_empty(),
        "down fired {} ms after its instant, past its max_lateness of 200 ms: {downs:?}",
        downs.first().map_or(0, |w| (w.t - due) / MS)
    );
    // Reported, with the lateness measured from its true instant.
    let report = out
        .lines()
        .find(|l| l.starts_with("down") && (l.contains("give_up") || l.contains("skip")))
        .unwrap_or_else(|| panic!("no report of `down`:\n{out}"));
    let late = report
        .split("late by ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(parse_printed_duration)
        .unwrap_or_else(|| panic!("no lateness in {report:?}"));
    let true_late = (restart - due) as f64;
    assert!(
        late >= true_late && late < true_late + 2e9,
        "reported late by {late} ns; restarted {true_late} ns after its instant: {report}"
    );
}

// ---------------------------------------------------------------------------
// 4. on_failure runs once.

#[test]
fn on_failure_runs_once_across_a_kill_9() {
    let s = Setup::new();
    let cfg = s.file("agent.yaml", "exec-allowlist: [/bin/false]\n");
    let pack = s.file(
        "p.yaml",
        &format!(
            "pack: of\nversion: 1\nsafe_state:\n  - {{action: gpio.write, params: {{line: 3, value: 0}}}}\ninstructions:\n  - {{id: blink, action: gpio.toggle, params: {{line: 3}}, every: 50ms}}\n  - {{id: check, action: exec, params: {{program: /bin/false}}, at: {}, on_give_up: continue, on_failure: {{action: gpio.write, params: {{line: 9, value: 1}}}}}}\n",
            in_ms(400)
        ),
    );
    let args = [
        "--quiet",
        "--config",
        path_str(&cfg),
        "--pack",
        path_str(&pack),
    ];
    let line9 = |log: &Path| writes(log).into_iter().filter(|w| w.line == 9).count();
    let mut a = s.start(&args);
    assert!(wait_until(T, || line9(&s.log) >= 1), "{}", a.stderr());
    a.kill9();
    let mut b = s.start(&args);
    let n = count(&s.log, "blink");
    assert!(
        wait_until(T, || count(&s.log, "blink") >= n + 20),
        "blink did not go on (on_give_up: continue): {}",
        b.stderr()
    );
    b.term();
    let nine: Vec<Write> = writes(&s.log).into_iter().filter(|w| w.line == 9).collect();
    assert_eq!(
        nine.len(),
        1,
        "on_failure ran {} times: {nine:?}",
        nine.len()
    );
    assert!(nine[0].id.contains("on_failure"), "{nine:?}");
    assert_eq!(nine[0].value, 1);
}

// ---------------------------------------------------------------------------
// 5. Phase survives a restart.

#[test]
fn the_phase_of_the_first_acceptance_survives_versions_and_restarts() {
    let s = Setup::new();
    let pack = |safe: i64| {
        format!(
            "pack: ph\nversion: {}\nsafe_state:\n  - {{action: gpio.write, params: {{line: 1, value: {safe}}}}}\ninstructions:\n  - {{id: beat, action: gpio.toggle, params: {{line: 1}}, every: 1s}}\n",
            safe + 1
        )
    };
    let v1 = s.file("v1.yaml", &pack(0));
    let v2 = s.file("v2.yaml", &pack(1));
    let mut a = s.start(&["--quiet", "--pack", path_str(&v1)]);
    assert!(
        wait_until(T, || count(&s.log, "beat") >= 2),
        "{}",
        a.stderr()
    );
    a.term();
    let first = writes(&s.log)
        .iter()
        .find(|w| w.is("beat"))
        .and_then(Write::occurrence)
        .expect("first beat");
    // Push v2 by a restart 310 ms into a period.
    let mut at = first + 310 * MS;
    while at < now_ns() + 20 * MS {
        at += S;
    }
    std::thread::sleep(Duration::from_nanos((at - now_ns()).unsigned_abs()));
    let mut b = s.start(&["--quiet", "--pack", path_str(&v2)]);
    let n = count(&s.log, "beat");
    assert!(
        wait_until(T, || count(&s.log, "beat") >= n + 2),
        "{}",
        b.stderr()
    );
    b.term();
    // A plain restart: the journal alone.
    let mut c = s.start(&["--quiet"]);
    let n = count(&s.log, "beat");
    assert!(
        wait_until(T, || count(&s.log, "beat") >= n + 2),
        "{}",
        c.stderr()
    );
    c.term();
    let beats: Vec<Write> = writes(&s.log)
        .into_iter()
        .filter(|w| w.is("beat"))
        .collect();
    assert!(
        beats.iter().any(|w| w.version() == Some("v2")),
        "v2 never ran: {beats:?}"
    );
    let phase = first.rem_euclid(S);
    let off: Vec<(&str, i64)> = beats
        .iter()
        .filter_map(|w| {
            let d = (w.occurrence()?.rem_euclid(S) - phase).abs();
            (d.min(S - d) > MS).then_some((w.id.as_str(), d))
        })
        .collect();
    assert!(
        off.is_empty(),
        "beats off the first acceptance's phase ({phase} ns): {off:?}"
    );
}

// ---------------------------------------------------------------------------
// 6. Versions only go up, across restarts too.

#[test]
fn a_restart_with_an_older_or_edited_version_is_refused() {
    let s = Setup::new();
    let pack = |version: u64, line: u64| {
        format!(
            "pack: ver\nversion: {version}\ninstructions:\n  - {{id: t, action: gpio.toggle, params: {{line: {line}}}, every: 100ms}}\n"
        )
    };
    let v2 = s.file("v2.yaml", &pack(2, 1));
    let v1 = s.file("v1.yaml", &pack(1, 1));
    let v2_edited = s.file("v2-edited.yaml", &pack(2, 2));
    let mut a = s.start(&["--quiet", "--pack", path_str(&v2)]);
    assert!(wait_until(T, || count(&s.log, "t") >= 1), "{}", a.stderr());
    a.term();

    let out = run(&mut s.command(&["--quiet", "--pack", path_str(&v1)]), T);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "older version taken:\n{err}");
    assert!(
        err.contains("version 1") && err.contains("version 2"),
        "the error names both versions:\n{err}"
    );

    let out = run(
        &mut s.command(&["--quiet", "--pack", path_str(&v2_edited)]),
        T,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "edited same version taken:\n{err}"
    );
    assert!(err.contains("different content"), "{err}");

    // v2 as it was is still what the agent holds.
    let n = writes(&s.log).len();
    let mut b = s.start(&["--quiet"]);
    assert!(
        wait_until(T, || writes(&s.log)[n..].iter().any(|w| w.is("t"))),
        "{}",
        b.stderr()
    );
    b.term();
    let after = writes(&s.log);
    let ran: Vec<&Write> = after[n..].iter().filter(|w| w.is("t")).collect();
    assert!(
        ran.iter().all(|w| w.version() == Some("v2") && w.line == 1),
        "{ran:?}"
    );
}

// ---------------------------------------------------------------------------
// 7. Exec lateness is on reference time.

#[test]
fn exec_lateness_in_the_live_view_is_on_reference_time() {
    let s = Setup::new();
    let script = s.file("ok.sh", "#!/bin/sh\nexit 0\n");
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let cfg = s.file(
        "agent.yaml",
        &format!("exec-allowlist: [{}]\n", script.display()),
    );
    let pack = s.file(
        "p.yaml",
        &format!(
            "pack: ex\nversion: 1\ninstructions:\n  - {{id: job1, action: exec, params: {{program: {p}}}, at: {}}}\n  - {{id: job2, action: exec, params: {{program: {p}}}, at: {}}}\n",
            in_ms(300),
            in_ms(600),
            p = script.display()
        ),
    );
    let out = run(
        &mut s.command(&[
            "--exit-when-idle",
            "--config",
            path_str(&cfg),
            "--pack",
            path_str(&pack),
        ]),
        T,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for job in ["job1", "job2"] {
        let line = stdout
            .lines()
            .find(|l| l.contains(&format!(" {job} ")) && l.contains(" late "))
            .unwrap_or_else(|| panic!("no line for {job}:\n{stdout}"));
        let late = line
            .split(" late ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(parse_printed_duration)
            .unwrap_or_else(|| panic!("no lateness in {line:?}"));
        assert!(late.abs() < 1e9, "{job}: lateness {late} ns: {line}");
        assert!(line.trim_end().ends_with("ok"), "{line}");
    }
}

// ---------------------------------------------------------------------------
// 8. Restart hygiene: a journalled pack the new config refuses.

#[test]
fn a_journalled_pack_the_new_config_refuses_is_reported_and_the_others_run() {
    let s = Setup::new();
    let both = s.file(
        "both.yaml",
        "allowed-lines: [\"gpiochip0:1\", \"gpiochip0:2\"]\n",
    );
    let only_b = s.file("only-b.yaml", "allowed-lines: [\"gpiochip0:2\"]\n");
    let pack = |name: &str, line: u32| {
        s.file(
            &format!("{name}.yaml"),
            &format!(
                "pack: {name}\nversion: 1\nsafe_state:\n  - {{action: gpio.write, params: {{line: {line}, value: 0}}}}\ninstructions:\n  - {{id: {name}-t, action: gpio.toggle, params: {{line: {line}}}, every: 50ms}}\n"
            ),
        )
    };
    let a_pack = pack("a", 1);
    let b_pack = pack("b", 2);
    let mut first = s.start(&[
        "--quiet",
        "--config",
        path_str(&both),
        "--pack",
        path_str(&a_pack),
        "--pack",
        path_str(&b_pack),
    ]);
    assert!(
        wait_until(T, || count(&s.log, "a-t") >= 3 && count(&s.log, "b-t") >= 3),
        "{}",
        first.stderr()
    );
    first.term();
    let n = writes(&s.log).len();
    let mut second = s.start(&["--quiet", "--config", path_str(&only_b)]);
    assert!(
        wait_until(T, || {
            writes(&s.log)[n..].iter().filter(|w| w.is("b-t")).count() >= 10
        }),
        "B did not run after the restart: {}",
        second.stderr()
    );
    second.assert_running();
    second.term();
    let after = writes(&s.log);
    let a_fired: Vec<&Write> = after[n..].iter().filter(|w| w.is("a-t")).collect();
    assert!(a_fired.is_empty(), "refused pack A fired: {a_fired:?}");
    let err = second.stderr();
    assert!(
        err.lines()
            .any(|l| l.contains("default/a") && l.contains("refused")),
        "A not reported refused:\n{err}"
    );
    assert!(
        !err.lines()
            .any(|l| l.contains("default/b") && l.contains("refused")),
        "B reported refused:\n{err}"
    );
}

// ---------------------------------------------------------------------------
// 9. Completed work is not re-reported; counts are exact.

#[test]
fn a_completed_one_shot_is_not_reported_again_after_a_restart() {
    let s = Setup::new();
    let pack = s.file(
        "p.yaml",
        &format!(
            "pack: os\nversion: 1\nsafe_state:\n  - {{action: gpio.write, params: {{line: 3, value: 0}}}}\ninstructions:\n  - {{id: blink, action: gpio.toggle, params: {{line: 3}}, every: 50ms}}\n  - {{id: shot, action: gpio.write, params: {{line: 4, value: 1}}, at: {}}}\n",
            in_ms(300)
        ),
    );
    let mut a = s.start(&["--pack", path_str(&pack)]);
    assert!(
        wait_until(T, || count(&s.log, "shot") == 1
            && a.stdout().lines().any(|l| l.contains(" shot "))),
        "{}",
        a.stderr()
    );
    a.term();
    let n = writes(&s.log).len();
    let mut b = s.start(&["--pack", path_str(&pack)]);
    assert!(
        wait_until(T, || writes(&s.log)[n..]
            .iter()
            .filter(|w| w.is("blink"))
            .count()
            >= 10),
        "{}",
        b.stderr()
    );
    b.term();
    assert_eq!(count(&s.log, "shot"), 1, "the one-shot fired again");
    let out = b.stdout();
    let again: Vec<&str> = out.lines().filter(|l| l.contains("shot")).collect();
    assert!(
        again.is_empty(),
        "the completed one-shot was reported again after the restart: {again:?}"
    );
    // The restarted run's count is its own firings: its blinks and the
    // safe-state write on the way out.
    let run2 = writes(&s.log).len() - n;
    let summary = out
        .lines()
        .find(|l| l.starts_with("summary:"))
        .unwrap_or_else(|| panic!("no summary:\n{out}"));
    assert!(
        summary.starts_with(&format!("summary: {run2} firings")),
        "{run2} writes in the second run: {summary}"
    );
}

#[test]
fn the_summary_counts_every_firing_even_one_later_than_a_minute() {
    // A catch-up that fires an occurrence of 30 minutes ago, plus five
    // on-time writes: six firings touched the device.
    let s = Setup::new();
    let now = jiff::Timestamp::now();
    let start = now - jiff::SignedDuration::from_hours(1);
    let until = now - jiff::SignedDuration::from_mins(30);
    let pack = s.file(
        "p.yaml",
        &format!(
            "pack: c\nversion: 1\ninstructions:\n  - {{id: old, action: gpio.toggle, params: {{line: 1}}, every: 1s, start_at: {start:.9}, until: {until:.9}, catch_up: last}}\n  - {{id: five, action: gpio.toggle, params: {{line: 2}}, every: 50ms, until: {}}}\n",
            in_ms(400)
        ),
    );
    let out = run(
        &mut s.command(&["--quiet", "--exit-when-idle", "--pack", path_str(&pack)]),
        T,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let fired = writes(&s.log)
        .iter()
        .filter(|w| w.occurrence().is_some())
        .count();
    assert!(fired >= 2, "{:?}", writes(&s.log));
    let summary = stdout
        .lines()
        .find(|l| l.starts_with("summary:"))
        .unwrap_or_else(|| panic!("no summary:\n{stdout}"));
    assert!(
        summary.starts_with(&format!("summary: {fired} firings")),
        "{fired} firings touched the device: {summary}"
    );
}

/// Every occurrence of a 10 ms toggle between the last firing before a stop
/// and the first after the restart is reported exactly once: skipped at
/// shutdown, `outcome unknown`, or counted in the restart's "missed N".
fn missed_occurrences_are_reported_once(stop: Stop) {
    let s = Setup::new();
    let pack = s.file(
        "p.yaml",
        "pack: m\nversion: 1\nsafe_state:\n  - {action: gpio.write, params: {line: 1, value: 0}}\n\
         instructions:\n  - {id: t, action: gpio.toggle, params: {line: 1}, every: 10ms}\n",
    );
    let mut a = s.start(&["--pack", path_str(&pack)]);
    assert!(wait_until(T, || count(&s.log, "t") >= 20), "{}", a.stderr());
    match stop {
        Stop::Kill9 => a.kill9(),
        Stop::Term => a.term(),
    }
    let n = writes(&s.log).len();
    std::thread::sleep(Duration::from_millis(300));
    let mut b = s.start(&[]);
    assert!(
        wait_until(T, || writes(&s.log)[n..].iter().any(|w| w.is("t"))),
        "{}",
        b.stderr()
    );
    b.term();
    let log = writes(&s.log);
    let last_before = log[..n]
        .iter()
        .filter_map(Write::occurrence)
        .max()
        .expect("fired before");
    let first_after = log[n..]
        .iter()
        .filter_map(Write::occurrence)
        .min()
        .expect("fired after");
    let gap = (first_after - last_before) / (10 * MS) - 1;
    // What run 1 reported not run on its way out (skipped, withdrawn,
    // stopped), and what run 2 reported of the gap.
    let first = a.stdout();
    let not_run_1 = first
        .lines()
        .filter(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            match w.as_slice() {
                ["t", "skip", ..] => true,
                [_, "t", "gpio.toggle", "late", _, result, ..] => {
                    ["late", "withdrawn", "stopped"].contains(result)
                }
                _ => false,
            }
        })
        .count();
    let second = b.stdout();
    let unknown_2 = second
        .lines()
        .filter(|l| l.contains("outcome_unknown"))
        .filter_map(|l| l.split_whitespace().find(|w| w.contains("/t/")))
        .filter_map(|id| id.split('/').nth(4)?.parse::<i64>().ok())
        // One that touched the device before the kill is not in the gap.
        .filter(|occ| *occ > last_before)
        .count();
    let missed_2: u64 = second
        .lines()
        .filter_map(|l| l.split("missed ").nth(1))
        .filter_map(|r| r.split_whitespace().next())
        .filter_map(|n| n.parse::<u64>().ok())
        .sum();
    let reported = not_run_1 as i64 + unknown_2 as i64 + missed_2 as i64;
    assert_eq!(
        reported,
        gap,
        "{gap} occurrences never fired, {reported} reports ({not_run_1} on the way out, \
         {unknown_2} outcome unknown, {missed_2} missed)\nrun 1:\n{}\nrun 2:\n{}",
        first
            .lines()
            .filter(|l| !l.contains("gpio.toggle  late") && !l.contains(" fire "))
            .collect::<Vec<_>>()
            .join("\n"),
        second
            .lines()
            .filter(|l| !l.contains("gpio.toggle  late") && !l.contains(" fire "))
            .collect::<Vec<_>>()
            .join("\n"),
    );
}

#[test]
fn missed_occurrences_are_reported_once_across_a_kill_9() {
    missed_occurrences_are_reported_once(Stop::Kill9);
}

#[test]
fn missed_occurrences_are_reported_once_across_a_sigterm() {
    missed_occurrences_are_reported_once(Stop::Term);
}
