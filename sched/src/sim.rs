//! A pack run through the core on simulated time, with simulated actions
//! that succeed at once unless told to fail: the engine of
//! `baton-agent simulate` and of the core's black-box tests.

use std::collections::HashMap;

use baton_proto::RefTime;
use baton_proto::pack::Pack;

use crate::{AttemptResult, Config, Event, Output, Scheduler};

/// `--fail ID[:N]`: the first N attempts of instruction ID fail (every
/// attempt without `:N`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailSpec {
    /// Instruction id.
    pub instruction: String,
    /// How many attempts fail; `None`: all.
    pub count: Option<u32>,
}

impl std::str::FromStr for FailSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once(':') {
            None if !s.is_empty() => Ok(FailSpec {
                instruction: s.into(),
                count: None,
            }),
            Some((id, n)) if !id.is_empty() => n
                .parse()
                .map(|n| FailSpec {
                    instruction: id.into(),
                    count: Some(n),
                })
                .map_err(|_| format!("--fail `{s}`: N must be a whole number (ID:N)")),
            _ => Err(format!("--fail `{s}`: expected ID or ID:N")),
        }
    }
}

/// Options of one simulation run.
#[derive(Clone, Debug)]
pub struct SimOptions {
    /// Acceptance instant.
    pub from: RefTime,
    /// Last instant simulated (inclusive).
    pub until: RefTime,
    /// Injected failures.
    pub fail: Vec<FailSpec>,
    /// Jitter RNG seed.
    pub seed: u64,
    /// Stop after this many events (a runaway guard, reported).
    pub max_events: usize,
}

/// Run the simulation, calling `sink` with each event in time order.
/// Returns `false` if `max_events` cut it short.
pub fn simulate(
    pack: Pack,
    opts: &SimOptions,
    mut sink: impl FnMut(&Event),
) -> Result<bool, String> {
    let known: Vec<&str> = pack.instructions.iter().map(|i| i.id.as_str()).collect();
    for f in &opts.fail {
        if !known.contains(&f.instruction.as_str()) {
            return Err(format!(
                "--fail names `{}`, which is not an instruction of pack `{}` (it has: {})",
                f.instruction,
                pack.id,
                known.join(", ")
            ));
        }
    }
    let mut remaining: HashMap<String, Option<u32>> = opts
        .fail
        .iter()
        .map(|f| (f.instruction.clone(), f.count))
        .collect();
    let mut core = Scheduler::new(
        Config {
            seed: opts.seed,
            ..Config::default()
        },
        HashMap::new(),
    );
    let mut out = Vec::new();
    core.accept(pack, opts.from)
        .drain_into(&mut out)
        .map_err(|e| e.to_string())?;
    let mut events = 0usize;
    let mut now = opts.from;
    loop {
        // Drain outputs; simulated actions finish at the instant they fire.
        while !out.is_empty() {
            let batch = std::mem::take(&mut out);
            for o in batch {
                match o {
                    Output::Event(e) => {
                        events += 1;
                        if events > opts.max_events {
                            return Ok(false);
                        }
                        sink(&e);
                    }
                    Output::Fire(f) => {
                        let result = simulated_result(&f, &mut remaining);
                        core.attempt_result(&f.id, result, now).drain_into(&mut out);
                    }
                    // A simulated attempt has ended the instant it fired:
                    // anything asked back has run.
                    Output::Withdraw { id, .. } => {
                        core.withdrawal(&id, crate::Withdrawal::TooLate, now)
                            .drain_into(&mut out);
                    }
                    Output::Abort(_) | Output::OnFailure { .. } | Output::SafeState { .. } => {}
                }
            }
            // Zero-delay dependents released by results are due now.
            core.tick(now).drain_into(&mut out);
        }
        match core.next_wake() {
            Some(w) if w <= opts.until => {
                now = w.max(now);
                core.tick(now).drain_into(&mut out);
            }
            _ => return Ok(true),
        }
    }
}

/// A simulated action: it fails while its `--fail` budget lasts, else
/// succeeds at once (a read samples 0).
fn simulated_result(
    f: &crate::Firing,
    remaining: &mut HashMap<String, Option<u32>>,
) -> AttemptResult {
    let fail = match remaining.get_mut(&f.id.instruction) {
        Some(None) => true,
        Some(Some(n)) if *n > 0 => {
            *n -= 1;
            true
        }
        _ => false,
    };
    if fail {
        return AttemptResult::Failed("simulated failure (--fail)".into());
    }
    AttemptResult::Ok {
        value: matches!(*f.action, baton_proto::pack::Action::GpioRead { .. }).then_some(0),
    }
}
