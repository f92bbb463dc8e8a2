//! A rollout's cohort as stored (`rollout_members`): read by the planner
//! (is this agent admitted?) and by the rollouts themselves, so it sits
//! below both.

use std::collections::BTreeMap;

use super::codec::to_db;
use super::db::{Db, col, params, query_all};
use baton_store::{Member, PackKey, StoreResult};

/// The cohort of one rollout (or whether one agent is in it).
pub(crate) fn members(
    conn: &dyn Db,
    key: &PackKey,
    version: u64,
    agent: Option<&str>,
) -> StoreResult<BTreeMap<String, Member>> {
    let v = to_db(version, "rollout version")?;
    let rows = query_all(
        conn,
        "SELECT agent_id, stage, skipped FROM rollout_members \
         WHERE tenant = ?1 AND pack = ?2 AND version = ?3 \
         AND (CAST(?4 AS TEXT) IS NULL OR agent_id = ?4)",
        params![key.tenant, key.pack, v, agent],
        |r| {
            Ok((
                col::<String>(r, "agent_id")?,
                Member {
                    stage: u32::try_from(col::<i64>(r, "stage")?).unwrap_or(u32::MAX),
                    skipped: col::<i64>(r, "skipped")? != 0,
                },
            ))
        },
    )?;
    Ok(rows.into_iter().collect())
}
