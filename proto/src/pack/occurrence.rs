//! When a schedule fires next: the pure occurrence maths shared by the
//! planner and the agent's scheduler core.

use jiff::tz::TimeZone;

use super::model::Schedule;
use crate::time::RefTime;

impl Schedule {
    /// The first firing strictly after `after`, for the schedules that fire
    /// on their own (`at`, `every`, `cron`); `None` for `after` schedules
    /// (they follow their upstreams) and once a schedule is exhausted.
    ///
    /// `accepted` is when the agent accepted the pack: the anchor of an
    /// `every` without `start_at`.
    pub fn next_after(&self, tz: &TimeZone, accepted: RefTime, after: RefTime) -> Option<RefTime> {
        match self {
            Schedule::At(t) => (*t > after).then_some(*t),
            Schedule::Every {
                period,
                start_at,
                until,
            } => {
                let base = start_at.unwrap_or(accepted);
                let next = if after < base {
                    base
                } else {
                    let period = i64::try_from(period.as_nanos()).ok()?.max(1);
                    let elapsed = i128::from(after.as_nanos()) - i128::from(base.as_nanos());
                    let k = elapsed / i128::from(period) + 1;
                    let ns = i128::from(base.as_nanos()) + k * i128::from(period);
                    RefTime::from_nanos(i64::try_from(ns).ok()?)
                };
                until.is_none_or(|u| next <= u).then_some(next)
            }
            Schedule::Cron {
                cron,
                start_at,
                until,
                ..
            } => {
                let lower = match start_at {
                    Some(s) if after < *s => RefTime::from_nanos(s.as_nanos().saturating_sub(1)),
                    _ => after,
                };
                let next = RefTime::from_timestamp(cron.next_after(tz, lower.to_timestamp())?)?;
                until.is_none_or(|u| next <= u).then_some(next)
            }
            Schedule::After { .. } => None,
        }
    }

    /// The latest firing at or before `at_or_before` (and after `after`),
    /// for `catch_up: last` after downtime.
    pub fn last_in(
        &self,
        tz: &TimeZone,
        accepted: RefTime,
        after: RefTime,
        at_or_before: RefTime,
    ) -> Option<RefTime> {
        let mut cur = self.next_after(tz, accepted, after)?;
        if cur > at_or_before {
            return None;
        }
        if let Schedule::Every {
            period, start_at, ..
        } = self
        {
            // Closed form: no walk over every missed period.
            let base = start_at.unwrap_or(accepted);
            let period = i128::try_from(period.as_nanos()).ok()?.max(1);
            let k = (i128::from(at_or_before.as_nanos()) - i128::from(base.as_nanos())) / period;
            let ns = i128::from(base.as_nanos()) + k * period;
            return i64::try_from(ns).ok().map(RefTime::from_nanos);
        }
        while let Some(next) = self.next_after(tz, accepted, cur) {
            if next > at_or_before {
                break;
            }
            cur = next;
        }
        Some(cur)
    }
}
