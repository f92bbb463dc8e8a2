//! The operator commands as a user runs them.

use std::process::Command;
use std::time::Duration;

use baton_e2e::{bin, root, run};

const T: Duration = Duration::from_secs(30);

#[test]
fn every_example_pack_validates() {
    let examples: Vec<_> = std::fs::read_dir(root().join("examples/packs"))
        .expect("examples/packs")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    assert!(examples.len() >= 4, "{examples:?}");
    let out = run(
        Command::new(bin("baton-controller"))
            .arg("validate")
            .args(&examples),
        T,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // One `ok` line per file (a pack with a rollout adds a line of its
    // gates under it).
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        stdout.lines().filter(|l| l.contains(": ok (pack ")).count(),
        examples.len(),
        "{stdout}"
    );
}

#[test]
fn validate_reports_every_error_as_file_line_col_and_exits_1() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "pack: p\nversion: 1\ninstructions:\n  - {id: a, action: gpio.write, params: {line: 1}, every: 1s}\n  - {id: b, action: noop, after: [zz]}\n",
    )
    .expect("write");
    let good = root().join("examples/packs/blink.yaml");
    let out = run(
        Command::new(bin("baton-controller"))
            .arg("validate")
            .arg(&good)
            .arg(&bad),
        T,
    );
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    let b = bad.display().to_string();
    assert_eq!(lines.len(), 2, "{stderr}");
    assert!(
        lines[0].starts_with(&format!(
            "{b}:4:41: instruction `a`: params of gpio.write is missing required key `value`"
        )),
        "{stderr}"
    );
    assert!(
        lines[1].starts_with(&format!("{b}:5:35: instruction `b`: `after` names `zz`")),
        "{stderr}"
    );
    // A missing file is an error too, not a panic.
    let out = run(
        Command::new(bin("baton-controller")).args(["validate", "/nonexistent.yaml"]),
        T,
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .starts_with("/nonexistent.yaml:1:1: cannot read the file")
    );
}

#[test]
fn plan_json_lists_the_next_firings_merged_in_time_order() {
    let out = run(
        Command::new(bin("baton-controller"))
            .args(["plan"])
            .arg(root().join("examples/packs/press-sequence.yaml"))
            .args(["--from", "2026-12-01T00:00:00Z", "--count", "3", "--json"]),
        T,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(lines[0]["instruction"], "warmup");
    assert_eq!(lines[0]["at"], "2026-12-01T05:00:00.000000000Z");
    assert_eq!(lines[0]["local"], "2026-12-01T06:00:00.000000000+01:00");
    assert_eq!(lines[1]["instruction"], "clamp");
    assert_eq!(lines[2]["instruction"], "press");
    assert_eq!(lines[2]["at"], "2026-12-01T05:00:03.000000000Z");
    // Key order as documented.
    let first = String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string();
    assert!(
        first.starts_with("{\"instruction\":\"warmup\",\"at\":"),
        "{first}"
    );
}

#[test]
fn plan_refuses_a_bad_from() {
    let out = run(
        Command::new(bin("baton-controller"))
            .arg("plan")
            .arg(root().join("examples/packs/blink.yaml"))
            .args(["--from", "yesterday"]),
        T,
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("--from `yesterday` is not an RFC 3339 instant")
    );
}

#[test]
fn schema_is_json_with_every_top_level_key() {
    let out = run(Command::new(bin("baton-controller")).arg("schema"), T);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("schema is JSON");
    for key in ["pack", "version", "instructions", "safe_state", "timezone"] {
        assert!(v["properties"].get(key).is_some(), "schema lacks {key}");
    }
}

#[test]
fn simulate_json_shows_retries_give_up_and_safe_state() {
    let out = run(
        Command::new(bin("baton-agent"))
            .arg("simulate")
            .arg(root().join("examples/packs/press-sequence.yaml"))
            .args([
                "--from",
                "2026-12-01T04:59:00Z",
                "--until",
                "2026-12-01T05:01:00Z",
                "--fail",
                "press",
                "--seed",
                "3",
                "--json",
            ]),
        T,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ev: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    let press: Vec<&str> = ev
        .iter()
        .filter(|e| e["instruction"] == "press")
        .map(|e| e["event"].as_str().unwrap_or_default())
        .collect();
    // Five attempts (the instruction overrides max_attempts), then give-up.
    assert_eq!(
        press.iter().filter(|e| **e == "fire").count(),
        5,
        "{press:?}"
    );
    assert_eq!(press.iter().filter(|e| **e == "retry").count(), 4);
    assert!(press.ends_with(&["give_up", "on_failure"]), "{press:?}");
    let safe = ev
        .iter()
        .position(|e| e["event"] == "safe_state")
        .expect("safe_state");
    let give_up = ev
        .iter()
        .position(|e| e["event"] == "give_up")
        .expect("give_up");
    assert!(safe > give_up);
    for e in &ev {
        assert!(
            e["t"]
                .as_str()
                .is_some_and(|t| t.ends_with('Z') && t.len() == 30),
            "{e}"
        );
    }
    let retry = ev.iter().find(|e| e["event"] == "retry").expect("retry");
    assert!(retry["at"].as_str().is_some());
    // Unknown instruction in --fail: a clear error.
    let out = run(
        Command::new(bin("baton-agent"))
            .arg("simulate")
            .arg(root().join("examples/packs/blink.yaml"))
            .args([
                "--from",
                "2026-12-01T00:00:00Z",
                "--until",
                "2026-12-01T00:00:01Z",
                "--fail",
                "nope",
            ]),
        T,
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--fail names `nope`"));
}
