//! `feedback --json` speaks the typed record: `outcome` from the fixed
//! set, `reason` its own field (never a word folded into `detail`), for a
//! pack whose one-shot was missed and whose periodic instruction runs.

use std::time::Duration;

use baton_e2e::fleet::{start_agent, start_controller};
use baton_e2e::wait_until;

const OUTCOMES: [&str; 7] = [
    "ok",
    "failed",
    "retry",
    "give_up",
    "skipped",
    "unknown",
    "safe_state",
];

#[test]
fn outcomes_come_from_the_fixed_set_and_reasons_are_their_own_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = start_controller(&dir.path().join("ctl"), "127.0.0.1:0");
    let a = start_agent(&dir.path().join("a1"), "a1", &c.url, &[]);
    assert!(
        wait_until(Duration::from_secs(30), || c.connected("a1")),
        "{}",
        a.log()
    );
    // A one-shot two seconds in the past: missed (later than its
    // max_lateness), reported with its reason; it gives up without
    // stopping the pack (`on_give_up: continue`), so `tick` runs on.
    let past = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(2);
    let pack = dir.path().join("p.yaml");
    std::fs::write(
        &pack,
        format!(
            "pack: p\nversion: 1\ntargets: {{agents: [a1]}}\n\
             safe_state:\n  - {{action: gpio.write, params: {{line: 2, value: 0}}}}\n\
             instructions:\n  - {{id: tick, action: gpio.toggle, params: {{line: 1}}, every: 100ms}}\n  \
             - {{id: once, action: gpio.write, params: {{line: 3, value: 1}}, at: {}, on_give_up: continue}}\n",
            past.strftime("%Y-%m-%dT%H:%M:%S%.3fZ")
        ),
    )
    .expect("pack");
    let o = c.ctl(&["push", pack.to_str().expect("utf-8")]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let with_reason = || {
        let rows = c.feedback("p");
        rows.iter()
            .any(|r| r["instruction"] == "once" && r["reason"].is_string())
            && rows
                .iter()
                .any(|r| r["instruction"] == "tick" && r["outcome"] == "ok")
    };
    assert!(
        wait_until(Duration::from_secs(30), with_reason),
        "no reasoned entry for the missed one-shot: {:?}",
        c.feedback("p")
    );
    let rows = c.feedback("p");
    for r in &rows {
        let outcome = r["outcome"].as_str().unwrap_or("?");
        assert!(OUTCOMES.contains(&outcome), "outcome {outcome:?} in {r}");
        if outcome == "skipped" {
            assert!(r["reason"].is_string(), "a skip without its reason: {r}");
        }
        let detail = r["detail"].as_str().unwrap_or("");
        for word in ["late:", "withdrawn:", "stopped:"] {
            assert!(
                !detail.starts_with(word),
                "a reason folded into detail: {r}"
            );
        }
    }
    let missed = rows
        .iter()
        .find(|r| r["instruction"] == "once" && r["reason"].is_string())
        .expect("the missed one-shot");
    assert_eq!(missed["reason"], "late", "{missed}");
    assert!(
        rows.iter()
            .any(|r| r["instruction"] == "tick" && r["outcome"] == "ok"),
        "{rows:?}"
    );
}
