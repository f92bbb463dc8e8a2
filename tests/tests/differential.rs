//! `baton-agent simulate` predicts the device: the same pack run through
//! `simulate --json` over a window and through the live agent (sim GPIO,
//! real time) over the same window gives the same GPIO writes — the same
//! execution ids in the same order — and the same core events per
//! execution of each instruction (fire, ok, fail, retry, give_up, skip,
//! on_failure) and the same safe states. Every schedule is absolute (`at`, `start_at`), a
//! second or two ahead, so acceptance time does not matter.
//!
//! The live agent's core events are read from its log on stderr
//! (`RUST_LOG=info,baton::event=debug`), which carries their execution ids.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use baton_e2e::{bin, lines, run};

const T: Duration = Duration::from_secs(15);

/// One core event: its kind, instruction (empty for pack-level events) and
/// execution id (empty when it has none).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Ev {
    event: String,
    instruction: String,
    id: String,
}

/// What both runs are compared on.
#[derive(Debug)]
struct Runs {
    /// `simulate --json`, in order.
    sim: Vec<serde_json::Value>,
    /// The live agent's core events, in order.
    live: Vec<Ev>,
    /// The live agent's sim GPIO log, in order: (line, value, id).
    gpio: Vec<(i64, i64, String)>,
}

fn rfc(t: jiff::Timestamp) -> String {
    format!("{t:.9}")
}

/// Run `yaml` (built from T0, 1.5 s from now) through `simulate` from now
/// to T0 + `window_ms` with `fail`, and through the live agent with
/// `--exit-when-idle` and `config`.
fn both(
    make: impl Fn(&dyn Fn(i64) -> String) -> String,
    window_ms: i64,
    fail: &[&str],
    config: &str,
) -> Runs {
    // Built (or found current) before the instants are computed.
    let agent = bin("baton-agent");
    let dir = tempfile::tempdir().expect("tempdir");
    let from = jiff::Timestamp::now();
    let t0 = from + jiff::SignedDuration::from_millis(1500);
    let at = |ms: i64| rfc(t0 + jiff::SignedDuration::from_millis(ms));
    let pack = dir.path().join("p.yaml");
    std::fs::write(&pack, make(&at)).expect("write pack");
    let cfg = dir.path().join("agent.yaml");
    std::fs::write(&cfg, config).expect("write config");

    // The prediction.
    let mut sim = Command::new(&agent);
    sim.arg("simulate").arg(&pack).args([
        "--json",
        "--from",
        &rfc(from),
        "--until",
        &at(window_ms),
    ]);
    for f in fail {
        sim.args(["--fail", f]);
    }
    let out = run(&mut sim, T);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sim: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("simulate --json line"))
        .collect();

    // The device.
    let log = dir.path().join("gpio.jsonl");
    let mut live = Command::new(&agent);
    live.args([
        "run",
        "--system-clock",
        "reference",
        "--quiet",
        "--no-rt",
        "--exit-when-idle",
        "--id",
        "d",
    ]);
    if !config.is_empty() {
        live.arg("--config").arg(&cfg);
    }
    let out = run(
        live.arg("--data")
            .arg(dir.path().join("data"))
            .arg("--gpio")
            .arg(format!("sim:{}", log.display()))
            .arg("--pack")
            .arg(&pack)
            .env("RUST_LOG", "info,baton::event=debug"),
        T,
    );
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{stderr}");
    Runs {
        sim,
        live: live_events(&stderr),
        gpio: gpio_log(&log),
    }
}

/// `key="value"` of a log line (values are Debug-quoted strings).
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let start = line.find(&format!(" {key}=\""))? + key.len() + 3;
    let len = line[start..].find('"')?;
    Some(&line[start..start + len])
}

fn live_events(stderr: &str) -> Vec<Ev> {
    stderr
        .lines()
        .filter_map(|l| {
            let event = field(l, "event")?;
            let detail = field(l, "detail").unwrap_or("");
            // The way out of --exit-when-idle is not something simulate
            // models: the shutdown safe state and what it withdrew.
            if detail.contains("(shutdown)") {
                return None;
            }
            Some(Ev {
                event: event.to_string(),
                instruction: field(l, "instruction").unwrap_or("").to_string(),
                id: field(l, "execution_id").unwrap_or("").to_string(),
            })
        })
        .collect()
}

fn sim_events(sim: &[serde_json::Value]) -> Vec<Ev> {
    sim.iter()
        .map(|e| Ev {
            event: e["event"].as_str().expect("event").to_string(),
            instruction: e["instruction"].as_str().unwrap_or("").to_string(),
            id: e["execution_id"].as_str().unwrap_or("").to_string(),
        })
        .collect()
}

fn gpio_log(log: &Path) -> Vec<(i64, i64, String)> {
    lines(log)
        .iter()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("sim log line");
            (
                v["line"].as_i64().expect("line"),
                v["value"].as_i64().expect("value"),
                v["execution_id"].as_str().expect("id").to_string(),
            )
        })
        .collect()
}

/// Whether an id is an attempt's (`tenant/pack/vN/instruction/occ/aK`), not
/// a safe state's or an on_failure's (`tenant/pack <what>@ns`).
fn is_attempt(id: &str) -> bool {
    id.split('/').count() == 6
}

impl Runs {
    /// Attempt ids in the order they first touched a line (a pulse writes
    /// twice under one id).
    fn live_writes(&self) -> Vec<String> {
        let mut seen = std::collections::HashSet::new();
        self.gpio
            .iter()
            .map(|(_, _, id)| id)
            .filter(|id| is_attempt(id) && seen.insert(id.as_str()))
            .cloned()
            .collect()
    }

    /// The ids `simulate` fires for the given (GPIO) instructions, in order.
    fn predicted_writes(&self, gpio: &[&str]) -> Vec<String> {
        sim_events(&self.sim)
            .into_iter()
            .filter(|e| e.event == "fire" && gpio.contains(&e.instruction.as_str()))
            .map(|e| e.id)
            .collect()
    }

    /// Per instruction, its executions in the order they first appear,
    /// each with its events in order (simulate / live). Not one list per
    /// instruction: the live agent arms a horizon ahead (150 ms by
    /// default), so an occurrence's `fire` (handed to the device) may come
    /// before the previous occurrence's result, which `simulate` (no
    /// horizon) never shows; the device's writes themselves are compared
    /// in order, whole.
    fn per_instruction(evs: &[Ev]) -> BTreeMap<String, Vec<(String, Vec<String>)>> {
        let mut m: BTreeMap<String, Vec<(String, Vec<String>)>> = BTreeMap::new();
        for e in evs {
            let runs = m.entry(e.instruction.clone()).or_default();
            match runs.iter_mut().find(|(id, _)| *id == e.id) {
                Some((_, events)) => events.push(e.event.clone()),
                None => runs.push((e.id.clone(), vec![e.event.clone()])),
            }
        }
        m
    }

    /// The full comparison: GPIO writes (ids and order), every
    /// instruction's events, and pack-level events (safe states).
    fn assert_agree(&self, gpio: &[&str]) {
        let predicted = self.predicted_writes(gpio);
        assert!(!predicted.is_empty(), "nothing predicted: {:#?}", self.sim);
        assert_eq!(
            self.live_writes(),
            predicted,
            "GPIO writes differ (live sim log vs simulate)\nlive log: {:#?}",
            self.gpio
        );
        // Every predicted write succeeded in the prediction and live.
        let sim = sim_events(&self.sim);
        for id in &predicted {
            let ok = |evs: &[Ev]| evs.iter().any(|e| e.event == "ok" && &e.id == id);
            assert!(ok(&sim), "simulate: {id} not ok");
            assert!(ok(&self.live), "live: {id} not ok: {:#?}", self.live);
        }
        assert_eq!(
            Self::per_instruction(&self.live),
            Self::per_instruction(&sim),
            "events per instruction differ (left: live, right: simulate)"
        );
    }
}

#[test]
fn gpio_schedules_dependents_and_ties_fire_as_simulated() {
    let r = both(
        |at| {
            format!(
                "pack: mixed\nversion: 1\ndefaults: {{max_lateness: 500ms}}\nsafe_state:\n  - {{action: gpio.write, params: {{line: 1, value: 0}}}}\ninstructions:\n\
                 \x20 - {{id: w1, action: gpio.write, params: {{line: 1, value: 1}}, at: {}}}\n\
                 \x20 - {{id: tg, action: gpio.toggle, params: {{line: 2}}, every: 100ms, start_at: {}, until: {}}}\n\
                 \x20 - {{id: pl, action: gpio.pulse, params: {{line: 3, width: 30ms}}, after: [w1], delay: 200ms}}\n\
                 \x20 - {{id: w2, action: gpio.write, params: {{line: 1, value: 0}}, after: [pl], delay: 150ms}}\n\
                 \x20 - {{id: w3, action: gpio.write, params: {{line: 4, value: 1}}, at: {}}}\n",
                at(0),
                at(50),
                at(600),
                at(250),
            )
        },
        1500,
        &[],
        "",
    );
    r.assert_agree(&["w1", "tg", "pl", "w2", "w3"]);
    // The pulse drove both edges.
    let pulse = r
        .gpio
        .iter()
        .filter(|(_, _, id)| id.contains("/pl/"))
        .map(|(_, v, _)| *v)
        .collect::<Vec<_>>();
    assert_eq!(pulse, [1, 0]);
}

#[test]
fn same_instant_orders_by_priority_then_pack_order_as_simulated() {
    let r = both(
        |at| {
            format!(
                "pack: ties\nversion: 1\ndefaults: {{max_lateness: 500ms}}\ninstructions:\n\
                 \x20 - {{id: later, action: gpio.write, params: {{line: 0, value: 1}}, at: {t1}, priority: 99}}\n\
                 \x20 - {{id: low, action: gpio.write, params: {{line: 1, value: 1}}, at: {t0}, priority: 10}}\n\
                 \x20 - {{id: mid-a, action: gpio.write, params: {{line: 2, value: 1}}, at: {t0}, priority: 50}}\n\
                 \x20 - {{id: high, action: gpio.write, params: {{line: 3, value: 1}}, at: {t0}, priority: 90}}\n\
                 \x20 - {{id: mid-b, action: gpio.toggle, params: {{line: 4}}, every: 100ms, start_at: {t0}, until: {t1}, priority: 50}}\n\
                 \x20 - {{id: last, action: gpio.write, params: {{line: 5, value: 1}}, at: {t1}, priority: 10}}\n",
                t0 = at(0),
                t1 = at(100),
            )
        },
        1000,
        &[],
        "",
    );
    let gpio = ["later", "low", "mid-a", "high", "mid-b", "last"];
    r.assert_agree(&gpio);
    // And the order is the documented one: instant, then priority (higher
    // first), then pack order.
    let order: Vec<String> = r
        .live_writes()
        .iter()
        .map(|id| id.split('/').nth(3).unwrap_or("").to_string())
        .collect();
    assert_eq!(
        order,
        ["high", "mid-a", "mid-b", "low", "later", "mid-b", "last"],
        "{:#?}",
        r.gpio
    );
}

#[test]
fn an_exec_that_fails_retries_gives_up_and_fails_safe_as_simulated() {
    let r = both(
        |at| {
            format!(
                "pack: ex\nversion: 1\ndefaults: {{max_lateness: 500ms}}\nsafe_state:\n  - {{action: gpio.write, params: {{line: 9, value: 0}}}}\ninstructions:\n\
                 \x20 - {{id: pre, action: gpio.write, params: {{line: 6, value: 1}}, at: {}}}\n\
                 \x20 - {{id: job, action: exec, params: {{program: /bin/false}}, at: {}, retry: {{max_attempts: 2, backoff: 500ms}}}}\n\
                 \x20 - {{id: probe, action: gpio.write, params: {{line: 7, value: 1}}, at: {}}}\n",
                at(0),
                at(0),
                at(550),
            )
        },
        1500,
        &["job"],
        // Armed 50 ms ahead (the default), the probe is armed (a `fire`
        // event) before the give-up 48 ms earlier withdraws it (`skip`,
        // never on the device); simulate does not model arming. Arming
        // 5 ms ahead keeps the event sequences comparable.
        "exec-allowlist: [/bin/false]\narm-horizon: 5ms\n",
    );
    r.assert_agree(&["pre", "probe"]);
    let sim = sim_events(&r.sim);
    let job: Vec<&str> = sim
        .iter()
        .filter(|e| e.instruction == "job")
        .map(|e| e.event.as_str())
        .collect();
    assert_eq!(job, ["fire", "fail", "retry", "fire", "fail", "give_up"]);
    // The give-up's safe state, predicted and driven, before the probe's
    // instant: the probe never fires.
    let safe = |evs: &[Ev]| evs.iter().filter(|e| e.event == "safe_state").count();
    assert_eq!(safe(&sim), 1);
    assert_eq!(safe(&r.live), 1, "{:#?}", r.live);
    assert!(
        r.gpio
            .iter()
            .any(|(l, v, id)| *l == 9 && *v == 0 && id.contains("safe_state (give_up)")),
        "{:#?}",
        r.gpio
    );
    assert!(!r.gpio.iter().any(|(_, _, id)| id.contains("/probe/")));
}

#[test]
fn an_exec_that_gives_up_and_continues_lets_the_probe_fire_as_simulated() {
    let r = both(
        |at| {
            format!(
                "pack: ex2\nversion: 1\ndefaults: {{max_lateness: 500ms}}\nsafe_state:\n  - {{action: gpio.write, params: {{line: 9, value: 0}}}}\ninstructions:\n\
                 \x20 - {{id: job, action: exec, params: {{program: /bin/false}}, at: {}, retry: {{max_attempts: 2, backoff: 500ms}}, on_give_up: continue, on_failure: {{action: gpio.write, params: {{line: 8, value: 1}}}}}}\n\
                 \x20 - {{id: after-job, action: gpio.write, params: {{line: 6, value: 1}}, after: [job]}}\n\
                 \x20 - {{id: probe, action: gpio.write, params: {{line: 7, value: 1}}, at: {}}}\n",
                at(0),
                at(550),
            )
        },
        1500,
        &["job"],
        "exec-allowlist: [/bin/false]\n",
    );
    r.assert_agree(&["after-job", "probe"]);
    // on_failure once, predicted and driven; no give-up safe state.
    let sim = sim_events(&r.sim);
    let count = |evs: &[Ev], kind: &str| evs.iter().filter(|e| e.event == kind).count();
    assert_eq!(count(&sim, "on_failure"), 1);
    assert_eq!(count(&r.live, "on_failure"), 1, "{:#?}", r.live);
    assert_eq!(count(&sim, "safe_state"), 0);
    assert_eq!(count(&r.live, "safe_state"), 0, "{:#?}", r.live);
    let eight: Vec<_> = r.gpio.iter().filter(|(l, _, _)| *l == 8).collect();
    assert_eq!(eight.len(), 1, "{eight:?}");
    assert!(!r.gpio.iter().any(|(_, _, id)| id.contains("/after-job/")));
}
