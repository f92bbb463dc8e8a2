//! Checks that need "now": run where a clock is read, never in the parser.
//!
//! # The rule
//!
//! A schedule that can never fire *by construction of its expression* is
//! refused. What the parser can see alone it refuses at parse time: a cron
//! that matches no date at all (`0 0 0 30 2 *`), or none between its own
//! `start_at` and `until`. What depends on the present is refused by
//! [`Pack::check_live`]: a cron whose calendar has no firing at or after
//! `now` (or after its `start_at`, if later), such as `* * * * * * 2020`,
//! whose year field lies wholly in the past.
//!
//! What only *happens* to be in the past is not an error: an `at` one-shot
//! before `now`, or an `until` before `now`, is a firing (or a schedule)
//! that was missed, and missed firings are reported at runtime as missed,
//! with the instruction's failure path (docs/design.md "Time semantics",
//! downtime). A pack can be delivered late; that is no reason to refuse it.

use std::time::Duration;

use super::error::{PackError, PackErrors};
use super::model::{Pack, Schedule};
use crate::time::RefTime;

impl Pack {
    /// Refuse the crons of this pack that can never fire at or after `now`
    /// (see the module docs for the rule and what is deliberately not
    /// refused). Every error carries the position of the `cron` value and
    /// the instruction id.
    ///
    /// Call it where the wall clock is read: the controller's `validate`
    /// and push (with the controller's clock), and the agent at acceptance
    /// (with its reference-time estimate). [`crate::pack::parse_pack`]
    /// stays pure and cannot do it.
    pub fn check_live(&self, now: RefTime) -> Result<(), PackErrors> {
        let mut errors = Vec::new();
        for ins in &self.instructions {
            let Schedule::Cron {
                cron,
                expr,
                start_at,
                ..
            } = &ins.schedule
            else {
                continue;
            };
            let from = start_at.map_or(now, |s| s.max(now));
            let next = cron.next_after(
                &self.timezone,
                (from - Duration::from_nanos(1)).to_timestamp(),
            );
            if next.is_none() {
                let since = if from > now {
                    format!("its start_at ({from})")
                } else {
                    format!("now ({now})")
                };
                errors.push(PackError {
                    pos: ins.schedule_pos,
                    instruction: Some(ins.id.clone()),
                    message: format!(
                        "cron `{expr}` can never fire again: it has no firing at or after {since}; check its year field"
                    ),
                });
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(PackErrors(errors))
        }
    }
}
