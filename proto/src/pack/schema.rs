//! JSON Schema of the pack language, for editors' autocompletion.
//!
//! The decoder works on a position-carrying tree (see `decode`), so these
//! document types exist only to generate the schema. A test checks that
//! their keys are exactly the keys the decoder accepts, so the two cannot
//! drift apart silently.

use std::collections::BTreeMap;

use schemars::{JsonSchema, schema_for};

/// A duration literal such as `250us`, `20ms`, `2s`, `1m30s`, `24h`.
#[derive(JsonSchema)]
#[allow(dead_code)]
struct DurationText(#[schemars(pattern(r"^([0-9]+(d|h|m|s|ms|us|µs|ns))+$"))] String);

/// An id: lowercase letters, digits, `.`, `_`, `-`.
#[derive(JsonSchema)]
#[allow(dead_code)]
struct Id(#[schemars(pattern(r"^[a-z0-9][a-z0-9._-]{0,127}$"))] String);

/// RFC 3339 (`2026-12-01T10:00:00Z`) or a local time without offset in the
/// pack's timezone (`2026-12-01T10:00:00`).
#[derive(JsonSchema)]
#[allow(dead_code)]
struct Instant(String);

/// An instruction pack.
#[derive(JsonSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct PackDoc {
    /// Pack id, unique within the tenant.
    pack: Id,
    /// A re-push of the same version is a no-op; a higher one replaces the pack atomically.
    version: u64,
    /// Tenant; default "default".
    tenant: Option<Id>,
    /// Which agents get the pack.
    targets: Option<TargetsDoc>,
    /// IANA time zone of wall times and cron fields; default UTC.
    timezone: Option<String>,
    /// Free text.
    description: Option<String>,
    /// How long the pack keeps running without contact with the
    /// controller (greater than zero). Past it the agent drives the pack's
    /// safe state (`lease_lost`) and keeps it stopped until a higher version
    /// arrives. Absent: the pack keeps running its schedule offline.
    lease: Option<DurationText>,
    /// What a pack that needs absolute time (`at`, `cron`, `every` with
    /// `start_at`/`until`) does when the agent loses clock sync past its
    /// limit: `continue` (default; feedback carries the uncertainty) or
    /// `safe_state` (stopped until a higher version).
    on_clock_loss: Option<ClockLossDoc>,
    /// Settings applied to every instruction.
    defaults: Option<DefaultsDoc>,
    /// Actions run on cancel, lease loss, shutdown and give-up.
    safe_state: Option<Vec<ActionDoc>>,
    /// Lines this pack agrees to share with other packs that list them too;
    /// each must be a line the pack drives (gpio.write/toggle/pulse).
    shared_lines: Option<Vec<SharedLineDoc>>,
    /// What to do, and when.
    instructions: Vec<InstructionDoc>,
    /// Give the version to the targets stage by stage (controller only;
    /// agents ignore it). Absent: to every target at once.
    rollout: Option<RolloutDoc>,
}

/// Stages, how each is watched, and what ends the rollout.
#[derive(JsonSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct RolloutDoc {
    /// Cumulative shares, canaries (label `canary=true`) first; the last
    /// must be `{percent: 100}`.
    stages: Vec<StageDoc>,
    /// How long each stage is watched after its last agent acked (default 5m).
    soak: Option<DurationText>,
    /// Settled firings a stage needs before it can pass (default 1).
    #[schemars(range(min = 1))]
    min_firings: Option<u64>,
    /// Thresholds that fail a stage (and abort the rollout) once crossed;
    /// by default any failed or unknown firing does, named keys or not.
    abort_if: Option<AbortIfDoc>,
    /// `absolute` (default) or `baseline`: lateness and offset against the
    /// agents still on the old version, same window.
    compare: Option<CompareDoc>,
    /// What a stage still undecided this long after its start does.
    stage_deadline: Option<StageDeadlineDoc>,
    /// Stages start only inside one of these windows.
    windows: Option<Vec<WindowDoc>>,
    /// `on_arrival` (default) or `together`: a stage's agents switch at one instant.
    activate: Option<ActivateDoc>,
    /// With `together`: agents whose clock uncertainty is above this at the
    /// instant are not switched (default 1ms).
    max_uncertainty: Option<DurationText>,
    /// `rollback` (default: the previous content again, as a higher
    /// version) or `safe_state` (the new version cancelled).
    on_abort: Option<OnAbortDoc>,
}

/// A stage's cumulative share: `{agents: N}` or `{percent: P}`.
#[derive(JsonSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct StageDoc {
    /// This many agents in all.
    #[schemars(range(min = 1))]
    agents: Option<u64>,
    /// This percentage of the targets, rounded up.
    #[schemars(range(min = 0.0, max = 100.0))]
    percent: Option<f64>,
}

/// Each threshold fails a stage once crossed; a key left out keeps its
/// default, `off` turns it off.
#[derive(JsonSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct AbortIfDoc {
    /// Failed firings, percent of settled ones (default 0: any).
    failed_percent: Option<Threshold<Percent>>,
    /// Firings whose outcome is unknown (default 0: any).
    unknown: Option<Threshold<u64>>,
    /// Start lateness p99 (over the baseline's with `compare: baseline`; default off).
    lateness_p99: Option<Threshold<DurationText>>,
    /// Largest clock offset of the cohort (over the baseline's with `compare: baseline`; default off).
    offset: Option<Threshold<DurationText>>,
}

/// A threshold, or the word `off`.
#[derive(JsonSchema)]
#[serde(untagged)]
#[allow(dead_code)]
enum Threshold<T> {
    On(T),
    Off(OffWord),
}

/// `off`.
#[derive(JsonSchema)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)]
enum OffWord {
    Off,
}

/// A percentage.
#[derive(JsonSchema)]
#[allow(dead_code)]
struct Percent(#[schemars(range(min = 0.0, max = 100.0))] f64);

/// How thresholds on lateness and offset are read.
#[derive(JsonSchema)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)]
enum CompareDoc {
    Absolute,
    Baseline,
}

/// A stage's deadline.
#[derive(JsonSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct StageDeadlineDoc {
    /// From the stage's start.
    after: DurationText,
    /// `pause` (default), `abort` or `skip_offline`.
    then: Option<DeadlineDoc>,
}

/// What an undecided stage does at its deadline.
#[derive(JsonSchema)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)]
enum DeadlineDoc {
    Pause,
    Abort,
    SkipOffline,
}

/// A window: from each firing of `cron` (in `tz`) for `duration`.
#[derive(JsonSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct WindowDoc {
    /// Cron expression, seconds first.
    cron: String,
    /// How long each window stays open.
    duration: DurationText,
    /// IANA zone (default: the pack's `timezone`).
    tz: Option<String>,
}

/// When a stage's agents start the new version.
#[derive(JsonSchema)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)]
enum ActivateDoc {
    OnArrival,
    Together,
}

/// What an abort does to the agents that got the new version.
#[derive(JsonSchema)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)]
enum OnAbortDoc {
    Rollback,
    SafeState,
}

/// Agents by id, or by labels.
#[derive(JsonSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct TargetsDoc {
    /// Agent ids.
    agents: Option<Vec<String>>,
    /// Labels every target agent carries.
    labels: Option<BTreeMap<String, String>>,
}

/// Defaults for every instruction.
#[derive(JsonSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct DefaultsDoc {
    /// Retry policy.
    retry: Option<RetryDoc>,
    /// Per-attempt timeout (default 30s).
    timeout: Option<DurationText>,
    /// A firing later than this is skipped and reported (default 1s).
    max_lateness: Option<DurationText>,
}

/// Retry policy; an instruction's overrides the defaults field by field.
#[derive(JsonSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct RetryDoc {
    /// Attempts including the first (default 1: no retry).
    #[schemars(range(min = 1, max = 1000))]
    max_attempts: Option<u32>,
    /// Wait before the first retry (default 100ms).
    backoff: Option<DurationText>,
    /// Growth per retry (default 2.0).
    #[schemars(range(min = 1.0))]
    factor: Option<f64>,
    /// Cap on the wait (default 5s).
    max_backoff: Option<DurationText>,
    /// Random spread, fraction of the wait (default 0).
    #[schemars(range(min = 0.0, max = 1.0))]
    jitter: Option<f64>,
}

/// A line offset (`5`), a line name (`RELAY_MAIN`), or, without `chip`,
/// `"CHIP:LINE"` (`"gpiochip0:17"`) as in `allowed-lines`.
#[derive(JsonSchema)]
#[serde(untagged)]
#[allow(dead_code)]
enum LineDoc {
    Offset(u32),
    Name(String),
}

/// A line in `shared_lines`: an offset (`5`), a name (`RELAY_MAIN`),
/// `"CHIP:LINE"` (`"gpiochip1:7"`), or `{line, chip}` as in action params.
#[derive(JsonSchema)]
#[serde(untagged)]
#[allow(dead_code)]
enum SharedLineDoc {
    Offset(u32),
    Text(String),
    Params { line: LineDoc, chip: Option<String> },
}

/// An action and its params.
#[derive(JsonSchema)]
#[serde(tag = "action", content = "params", deny_unknown_fields)]
#[allow(dead_code)]
enum ActionDoc {
    /// Drive a line to a level.
    #[serde(rename = "gpio.write")]
    GpioWrite {
        line: LineDoc,
        #[schemars(range(min = 0, max = 1))]
        value: u8,
        chip: Option<String>,
    },
    /// Invert a line.
    #[serde(rename = "gpio.toggle")]
    GpioToggle { line: LineDoc, chip: Option<String> },
    /// Drive a line for `width`, then back.
    #[serde(rename = "gpio.pulse")]
    GpioPulse {
        line: LineDoc,
        width: DurationText,
        #[schemars(range(min = 0, max = 1))]
        value: Option<u8>,
        chip: Option<String>,
    },
    /// Sample a line into feedback.
    #[serde(rename = "gpio.read")]
    GpioRead { line: LineDoc, chip: Option<String> },
    /// Run a program on the agent's allowlist.
    #[serde(rename = "exec")]
    Exec {
        program: String,
        args: Option<Vec<String>>,
        env: Option<BTreeMap<String, String>>,
    },
    /// Do nothing.
    #[serde(rename = "noop")]
    Noop,
}

/// `safe_state` (default) or `continue`.
#[derive(JsonSchema)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)]
enum OnGiveUpDoc {
    SafeState,
    Continue,
}

/// What a pack does when the agent loses clock sync.
#[derive(JsonSchema)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)]
enum ClockLossDoc {
    Continue,
    SafeState,
}

/// What to do with occurrences missed during downtime.
#[derive(JsonSchema)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)]
enum CatchUpDoc {
    None,
    Last,
    All,
}

/// One instruction: an action and exactly one of `at`, `every`, `cron`, `after`.
#[derive(JsonSchema)]
#[allow(dead_code)]
struct InstructionDoc {
    /// Unique within the pack.
    id: Id,
    /// Free text.
    description: Option<String>,
    #[serde(flatten)]
    action: ActionDoc,
    /// One-shot instant.
    at: Option<Instant>,
    /// Period of a repeating schedule.
    every: Option<DurationText>,
    /// Cron expression (seconds first) or `@hourly`.. `@yearly`, `@every 30s`.
    cron: Option<String>,
    /// Run when all of these succeed.
    after: Option<Vec<Id>>,
    /// Wait after the upstreams succeed.
    delay: Option<DurationText>,
    /// First firing of a repeating schedule.
    start_at: Option<Instant>,
    /// End of a repeating schedule (inclusive).
    until: Option<Instant>,
    /// Ties at the same instant: higher first.
    #[schemars(range(min = 0, max = 255))]
    priority: Option<u8>,
    /// Overrides the default retry policy field by field.
    retry: Option<RetryDoc>,
    /// Per-attempt timeout.
    timeout: Option<DurationText>,
    /// Skip a firing later than this.
    max_lateness: Option<DurationText>,
    /// Run when this instruction gives up.
    on_failure: Option<ActionDoc>,
    /// What giving up does to the rest of the pack.
    on_give_up: Option<OnGiveUpDoc>,
    /// Missed occurrences of a repeating schedule after downtime.
    catch_up: Option<CatchUpDoc>,
}

/// The schema as pretty JSON.
pub fn pack_schema_json() -> String {
    let schema = schema_for!(PackDoc);
    serde_json::to_string_pretty(&schema).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

/// The schema as a JSON value (for tests and tools).
pub fn pack_schema() -> serde_json::Value {
    serde_json::to_value(schema_for!(PackDoc)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(v: &serde_json::Value) -> Vec<String> {
        let mut k: Vec<String> = v["properties"]
            .as_object()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default();
        k.sort();
        k
    }

    fn sorted(keys: &[&str]) -> Vec<String> {
        let mut k: Vec<String> = keys.iter().map(|s| s.to_string()).collect();
        k.sort();
        k
    }

    #[test]
    fn schema_keys_match_the_decoder() {
        let s = pack_schema();
        assert_eq!(keys(&s), sorted(super::super::decode::PACK_KEYS));
        let defs = &s["$defs"];
        assert_eq!(
            keys(&defs["RetryDoc"]),
            sorted(super::super::decode::RETRY_KEYS)
        );
        assert_eq!(
            keys(&defs["DefaultsDoc"]),
            sorted(super::super::decode::DEFAULTS_KEYS)
        );
        assert_eq!(
            keys(&defs["RolloutDoc"]),
            sorted(super::super::decode::rollout::ROLLOUT_KEYS)
        );
        assert_eq!(
            keys(&defs["AbortIfDoc"]),
            sorted(super::super::decode::rollout::ABORT_IF_KEYS)
        );
        assert_eq!(
            keys(&defs["WindowDoc"]),
            sorted(super::super::decode::rollout::WINDOW_KEYS)
        );
        // The instruction's own keys plus the flattened action and params.
        let mut ins = keys(&defs["InstructionDoc"]);
        ins.extend(["action".to_string(), "params".to_string()]);
        ins.sort();
        assert_eq!(ins, sorted(super::super::decode::INSTRUCTION_KEYS));
        let text = pack_schema_json();
        for action in super::super::decode::ACTIONS {
            assert!(
                text.contains(&format!("\"{action}\"")),
                "schema lacks action {action}"
            );
        }
    }
}
