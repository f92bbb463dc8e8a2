//! The Link protocol from another language: a Python agent
//! (`tests/interop/agent.py`), whose client is generated at test time from
//! `proto/proto/baton/v1/link.proto` by grpc_tools.protoc, against the real
//! controller. It says hello with a label, is welcomed, receives a pushed
//! pack, acks it and reports holding it, sends three feedback entries and
//! gets them acked, and closes its stream cleanly; the operator's commands
//! see all of it (the agent and its label, the delivery acked, the pack
//! held, the feedback with its outcomes). So the .proto alone is enough to
//! write an agent.
//!
//! Needs a Python with grpcio and grpcio-tools: `BATON_TEST_PYTHON`, else
//! `target/pyenv/bin/python`, which `scripts/test.sh` (the README's test
//! command) makes, and it sets `BATON_REQUIRE_INTEROP=1`: there a missing
//! Python fails the test. A plain `cargo test --workspace` without one
//! skips it and says how to get it.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use baton_e2e::fleet::{start_controller, start_mtls};
use baton_e2e::{Running, root, run, wait_exit, wait_until};

const WAIT: Duration = Duration::from_secs(30);
const AGENT: &str = "py-agent";
const PACK: &str = "py-pack";

/// The Python interpreter with grpcio; `None` (having said how to get
/// one) where it is missing and not required.
fn python() -> Option<PathBuf> {
    match find_python() {
        Ok(py) => Some(py),
        Err(why) => {
            baton_testenv::missing("interop", Some("BATON_REQUIRE_INTEROP"), &why);
            None
        }
    }
}

/// The Python interpreter with grpcio, or what is missing and how to get it.
fn find_python() -> Result<PathBuf, String> {
    let py = std::env::var_os("BATON_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target/pyenv/bin/python"));
    let hint = "scripts/test.sh (the README's test command) makes a venv in target/pyenv \
                with grpcio and grpcio-tools; or set BATON_TEST_PYTHON to a Python that has them";
    if !py.exists() {
        return Err(format!(
            "no Python for the interop test at {}: {hint}",
            py.display()
        ));
    }
    let o = run(
        Command::new(&py).args(["-c", "import grpc, grpc_tools"]),
        WAIT,
    );
    if !o.status.success() {
        return Err(format!(
            "{} cannot import grpc / grpc_tools: {}\n{hint}",
            py.display(),
            String::from_utf8_lossy(&o.stderr).trim()
        ));
    }
    Ok(py)
}

#[test]
fn a_python_agent_generated_from_the_proto_speaks_the_link_protocol() {
    interop(false);
}

/// The same with mTLS: grpcio's own TLS stack, certificates from `ca`.
#[test]
fn a_python_agent_speaks_the_link_protocol_over_mtls() {
    interop(true);
}

fn interop(tls: bool) {
    let started = Instant::now();
    let Some(py) = python() else {
        return; // missing and not required: `python` said so
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let mut tls_args: Vec<std::ffi::OsString> = Vec::new();
    let c = if tls {
        let (ca, c) = start_mtls(dir.path(), "ops", &[]);
        let (cert, key) = ca.agent(AGENT, &[]);
        for (flag, path) in [("--cert", cert), ("--key", key), ("--ca", ca.ca_pem())] {
            tls_args.push(flag.into());
            tls_args.push(path.into());
        }
        c
    } else {
        start_controller(&dir.path().join("ctl"), "127.0.0.1:0")
    };

    let summary = dir.path().join("summary.json");
    let log = dir.path().join("agent.log");
    let out = std::fs::File::create(&log).expect("agent log");
    let mut agent = Running(
        Command::new(&py)
            .arg(root().join("tests/interop/agent.py"))
            .arg(&c.addr)
            .arg(AGENT)
            .arg(&summary)
            .args(["--timeout", "30"])
            .args(&tls_args)
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("agent log"))
            .stderr(out)
            .spawn()
            .expect("spawn the Python agent"),
    );
    let agent_log = || std::fs::read_to_string(&log).unwrap_or_default();

    // Connected (its label is checked once a pack makes it visible to a
    // tenant's operator, below).
    let connected = wait_until(WAIT, || {
        matches!(agent.try_wait(), Ok(Some(_))) || c.connected(AGENT)
    });
    assert!(
        connected && matches!(agent.try_wait(), Ok(None)),
        "the Python agent never showed as connected with lang=python; agents: {:?}\nagent log:\n{}\ncontroller log:\n{}",
        c.agents(),
        agent_log(),
        c.log()
    );

    // A push targeting it: acked by the Python agent.
    let yaml = format!(
        "pack: {PACK}\nversion: 1\ntargets: {{agents: [{AGENT}]}}\n\
         description: pushed to an agent written in Python\n\
         instructions:\n  - id: tick\n    action: gpio.toggle\n    params: {{line: 7}}\n    every: 1s\n"
    );
    let file = dir.path().join("py-pack.yaml");
    std::fs::write(&file, &yaml).expect("write pack");
    let o = c.ctl(&["push", file.to_str().expect("utf-8")]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "push: {out}{}\nagent log:\n{}",
        String::from_utf8_lossy(&o.stderr),
        agent_log()
    );
    assert!(
        out.lines()
            .any(|l| l.contains(AGENT) && l.contains("acked")),
        "the Python agent did not ack: {out}"
    );

    // It sends its feedback, has it acked, closes, and exits 0.
    let status = wait_exit(&mut agent, WAIT);
    assert!(
        status.is_some_and(|s| s.success()),
        "the Python agent: {status:?}\nagent log:\n{}\ncontroller log:\n{}",
        agent_log(),
        c.log()
    );

    // The three entries are stored as sent.
    let fb = c.feedback(PACK);
    let got: Vec<(u64, &str, &str, &str, &str)> = fb
        .iter()
        .map(|f| {
            (
                f["seq"].as_u64().unwrap_or_default(),
                f["agent"].as_str().unwrap_or_default(),
                f["instruction"].as_str().unwrap_or_default(),
                f["outcome"].as_str().unwrap_or_default(),
                f["event"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (1, AGENT, "tick", "ok", "executed"),
            (2, AGENT, "tick", "failed", "executed"),
            (3, AGENT, "tick", "unknown", "outcome_unknown"),
        ],
        "{fb:#?}"
    );
    for f in &fb {
        let id = f["execution_id"].as_str().unwrap_or_default();
        assert!(
            id.starts_with(&format!("default/{PACK}/v1/tick/")) && id.ends_with("/a1"),
            "execution id {id:?} not derived from the pushed pack"
        );
        assert_eq!(
            (f["tenant"].as_str(), f["version"].as_u64()),
            (Some("default"), Some(1))
        );
    }

    // What the Python agent received: the welcome and the push's YAML.
    let s: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&summary).expect("the Python agent's summary"),
    )
    .expect("summary is JSON");
    assert_eq!(s["tls"], tls, "{s:#}");
    assert_eq!(s["welcome"]["agent_id"], AGENT, "{s:#}");
    assert_eq!(s["welcome"]["feedback_acked_seq"], 0, "{s:#}");
    assert_eq!(s["welcome"]["ping_interval_ms"], 1000, "{s:#}");
    assert!(
        s["welcome"]["controller_time_ns"]
            .as_i64()
            .unwrap_or_default()
            > 0,
        "{s:#}"
    );
    assert_eq!(
        s["push"]["pack"],
        serde_json::json!({"tenant": "default", "pack": PACK, "version": 1}),
        "{s:#}"
    );
    assert_eq!(s["push"]["yaml"], yaml.as_str(), "{s:#}");
    assert_eq!(s["feedback_ack"], 3, "{s:#}");
    assert_eq!(s["end"], "OK", "{s:#}");

    // With the label from its hello, and the pack it reported holding (Held
    // after the ack).
    let agents = c.agents();
    assert!(
        agents
            .iter()
            .any(|a| a["id"] == AGENT && a["labels"]["lang"] == "python"),
        "{agents:?}"
    );
    let held: Vec<serde_json::Value> = agents
        .iter()
        .filter(|a| a["id"] == AGENT)
        .flat_map(|a| a["packs"].as_array().cloned().unwrap_or_default())
        .collect();
    assert_eq!(
        held,
        [serde_json::json!({"tenant": "default", "pack": PACK, "version": 1, "stopped": false})]
    );

    // The controller saw a clean close, not an error.
    assert!(
        wait_until(WAIT, || !c.connected(AGENT)),
        "still connected after the Python agent exited"
    );
    assert!(
        wait_until(WAIT, || c.log().contains("closed by the agent")),
        "controller log:\n{}",
        c.log()
    );
    eprintln!("interop: {:?}", started.elapsed());
}
