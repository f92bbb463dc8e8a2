//! Issue 24's repro on the real binaries: a one-shot changed by a new
//! version pushed while the old version's firing is already armed (inside
//! the arming horizon, here `arm-horizon: 1s` with `arm-lead: 900ms`: the
//! pass that arms it comes 900 ms before its instant). Before, the sim GPIO log
//! showed `p/v1/x/T/a1` writing 1 and, 26 µs later, `p/v2/x/T/a1` writing
//! 0, both reported ok. Now the core asks the old attempt back, the agent
//! withdraws it from the dispatcher before its instant, and the instant
//! is written once, by v2; v1's occurrence is reported not run with its
//! reason (`replaced`).

use std::time::Duration;

use baton_e2e::fleet::{start_agent_clock, start_controller};
use baton_e2e::wait_until;

const WAIT: Duration = Duration::from_secs(30);

fn pack(version: u64, value: u8, at: &str) -> String {
    format!(
        "pack: p\nversion: {version}\ntargets: {{agents: [a1]}}\n\
         instructions:\n  - {{id: x, action: gpio.write, params: {{line: 1, value: {value}}}, at: {at}}}\n"
    )
}

#[test]
fn a_one_shot_changed_inside_the_arming_horizon_is_written_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("agent.yaml");
    std::fs::write(&config, "arm-horizon: 1s\narm-lead: 900ms\n").expect("config");
    let c = start_controller(&dir.path().join("ctl"), "127.0.0.1:0");
    let a = start_agent_clock(
        &dir.path().join("a1"),
        "a1",
        &c.url,
        &["--config", config.to_str().expect("utf-8")],
    );
    assert!(
        wait_until(WAIT, || c.connected("a1")),
        "agent never connected; agent log:\n{}",
        a.log()
    );
    // T far enough ahead for v1's push and ack, then v2 is pushed 400 ms
    // before T: by then v1's firing has been armed (the pass a lead before
    // it, 900 ms, arms what falls within the next second).
    let t = jiff::Timestamp::now() + jiff::SignedDuration::from_millis(3000);
    let at = format!("{t:.9}");
    let v1 = dir.path().join("v1.yaml");
    std::fs::write(&v1, pack(1, 1, &at)).expect("v1");
    let o = c.ctl(&["push", v1.to_str().expect("utf-8")]);
    assert!(o.status.success(), "push v1: {o:?}");
    let push_v2_at = t - jiff::SignedDuration::from_millis(400);
    let early = (push_v2_at - jiff::Timestamp::now()).as_millis();
    assert!(early > 0, "v1's push took too long to test the horizon");
    assert!(
        !wait_until(Duration::from_millis(early as u64), || !a
            .writes()
            .is_empty()),
        "nothing may be written before T"
    );
    let v2 = dir.path().join("v2.yaml");
    std::fs::write(&v2, pack(2, 0, &at)).expect("v2");
    let o = c.ctl(&["push", v2.to_str().expect("utf-8")]);
    assert!(o.status.success(), "push v2: {o:?}");
    let acked = jiff::Timestamp::now();
    assert!(
        acked < t,
        "v2 was acked after T ({acked} >= {t}): the machine was too slow to test this"
    );
    assert!(
        wait_until(WAIT, || !a.writes().is_empty()),
        "nothing written; agent log:\n{}",
        a.log()
    );
    // Feedback for both versions' occurrence.
    let fb = |c: &baton_e2e::fleet::Controller| -> Vec<serde_json::Value> {
        c.feedback("p")
            .into_iter()
            .filter(|f| f["instruction"] == "x")
            .collect()
    };
    assert!(
        wait_until(WAIT, || fb(&c).len() >= 2),
        "feedback: {:?}\nagent log:\n{}",
        fb(&c),
        a.log()
    );
    let writes = a.writes();
    let occ = t.as_nanosecond();
    let for_t: Vec<&serde_json::Value> = writes
        .iter()
        .filter(|w| {
            w["execution_id"]
                .as_str()
                .is_some_and(|id| id.contains(&format!("/x/{occ}/")))
        })
        .collect();
    assert_eq!(
        for_t.len(),
        1,
        "one write for the instant, not one per version: {writes:?}"
    );
    assert_eq!(
        for_t[0]["execution_id"],
        format!("default/p/v2/x/{occ}/a1"),
        "the newer version writes it"
    );
    assert_eq!(for_t[0]["value"], 0);
    let fb = fb(&c);
    let v1_fb: Vec<&serde_json::Value> = fb.iter().filter(|f| f["version"] == 1).collect();
    assert_eq!(v1_fb.len(), 1, "v1's occurrence reported once: {fb:?}");
    assert_eq!(v1_fb[0]["outcome"], "skipped", "{fb:?}");
    assert_eq!(v1_fb[0]["reason"], "replaced", "{fb:?}");
    let v2_ok = fb
        .iter()
        .filter(|f| f["version"] == 2 && f["outcome"] == "ok")
        .count();
    assert_eq!(v2_ok, 1, "{fb:?}");
}
