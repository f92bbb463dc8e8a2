//! Rollouts: their rows, cohorts and the gate on the pack row.

use super::codec::{from_json, to_db, to_json, u64_from_db};
use super::db::{Db, Param, Row, chunks, col, params, query_all, run, values_rows};
use super::members::members;
use baton_store::{
    GateRow, MAX_PAGE, Member, PackHead, PackKey, RolloutRow, RolloutState, StoreResult,
};

const ROLLOUT_COLUMNS: &str = "tenant, pack, version, rev, state, doc";

fn decode_rollout(row: &dyn Row) -> StoreResult<RolloutRow> {
    let doc: String = col(row, "doc")?;
    let mut r: RolloutRow = from_json(&doc, "rollout")?;
    r.tenant = col(row, "tenant")?;
    r.pack = col(row, "pack")?;
    r.version = u64_from_db(col(row, "version")?, "rollout version")?;
    r.rev = u64_from_db(col(row, "rev")?, "rollout rev")?;
    let state: String = col(row, "state")?;
    r.state = RolloutState::parse(&state).ok_or_else(|| {
        baton_store::StoreError::corrupt("rollout state", format!("unknown: `{state}`"))
    })?;
    Ok(r)
}

/// One rollout with its cohort (`version` `None`: the pack's newest).
pub(crate) fn load(
    conn: &dyn Db,
    key: &PackKey,
    version: Option<u64>,
) -> StoreResult<Option<RolloutRow>> {
    let v = version.map(|v| to_db(v, "rollout version")).transpose()?;
    let sql = format!(
        "SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE tenant = ?1 AND pack = ?2 \
         AND (CAST(?3 AS BIGINT) IS NULL OR version = ?3) ORDER BY version DESC LIMIT 1"
    );
    let Some(mut r) =
        query_all(conn, &sql, params![key.tenant, key.pack, v], decode_rollout)?.pop()
    else {
        return Ok(None);
    };
    r.members = members(conn, key, r.version, None)?;
    Ok(Some(r))
}

/// Rollouts of one tenant (or all), newest version of each pack first
/// within the pack; only those not final when `open_only` (all of them:
/// the driver steps each), else the first [`MAX_PAGE`]. With cohorts.
pub(crate) fn list(
    conn: &dyn Db,
    tenant: Option<&str>,
    open_only: bool,
) -> StoreResult<Vec<RolloutRow>> {
    let sql = format!(
        "SELECT {ROLLOUT_COLUMNS} FROM rollouts \
         WHERE (CAST(?1 AS TEXT) IS NULL OR tenant = ?1) \
         AND (?2 = 0 OR state IN ('waiting_window', 'running', 'paused')) \
         ORDER BY tenant, pack, version DESC LIMIT ?3"
    );
    let limit = if open_only {
        i64::MAX
    } else {
        i64::from(MAX_PAGE)
    };
    let mut rows = query_all(
        conn,
        &sql,
        params![tenant, open_only, limit],
        decode_rollout,
    )?;
    for r in &mut rows {
        r.members = members(conn, &r.key(), r.version, None)?;
    }
    Ok(rows)
}

pub(crate) fn insert(conn: &dyn Db, r: &RolloutRow) -> StoreResult<()> {
    run(
        conn,
        "store a rollout",
        "INSERT INTO rollouts (tenant, pack, version, rev, state, doc, created_ns, updated_ns) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![
            r.tenant,
            r.pack,
            to_db(r.version, "rollout version")?,
            to_db(r.rev, "rollout rev")?,
            r.state.as_str(),
            to_json(r, "rollout")?,
            r.created.as_nanos(),
            r.updated.as_nanos()
        ],
    )?;
    Ok(())
}

/// Writes `r` over the stored row if that is still at `r.rev`; the new
/// rev then is `r.rev + 1`. Whether it was.
pub(crate) fn compare_and_set(conn: &dyn Db, r: &RolloutRow) -> StoreResult<bool> {
    let n = run(
        conn,
        "change a rollout",
        "UPDATE rollouts SET rev = rev + 1, state = ?5, doc = ?6, updated_ns = ?7 \
         WHERE tenant = ?1 AND pack = ?2 AND version = ?3 AND rev = ?4",
        params![
            r.tenant,
            r.pack,
            to_db(r.version, "rollout version")?,
            to_db(r.rev, "rollout rev")?,
            r.state.as_str(),
            to_json(r, "rollout")?,
            r.updated.as_nanos()
        ],
    )?;
    Ok(n > 0)
}

pub(crate) fn set_gate(conn: &dyn Db, key: &PackKey, gate: Option<&GateRow>) -> StoreResult<()> {
    let json = gate.map(|g| to_json(g, "gate")).transpose()?;
    run(
        conn,
        "set a pack's gate",
        "UPDATE packs SET gate = ?3 WHERE tenant = ?1 AND pack = ?2",
        params![key.tenant, key.pack, json],
    )?;
    Ok(())
}

/// The pack's rollouts that are not final (cohorts left out).
pub(crate) fn open(conn: &dyn Db, key: &PackKey) -> StoreResult<Vec<RolloutRow>> {
    let sql = format!(
        "SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE tenant = ?1 AND pack = ?2 \
         AND state IN ('waiting_window', 'running', 'paused')"
    );
    query_all(conn, &sql, params![key.tenant, key.pack], decode_rollout)
}

/// Agents let into a rollout's cohort, several per statement (one in it
/// already is left as it is).
pub(crate) fn admit(
    conn: &dyn Db,
    key: &PackKey,
    version: u64,
    members: &[(String, Member)],
) -> StoreResult<()> {
    let version = to_db(version, "rollout version")?;
    for chunk in chunks(members) {
        let mut p: Vec<Param<'_>> = Vec::with_capacity(chunk.len() * 6);
        for (id, m) in chunk {
            p.extend([
                Param::Text(&key.tenant),
                Param::Text(&key.pack),
                Param::Int(version),
                Param::Text(id),
                Param::Int(i64::from(m.stage)),
                Param::Int(i64::from(m.skipped)),
            ]);
        }
        let sql = format!(
            "INSERT INTO rollout_members (tenant, pack, version, agent_id, stage, skipped) \
             VALUES {} ON CONFLICT (tenant, pack, version, agent_id) DO NOTHING",
            values_rows(chunk.len(), 6)
        );
        run(conn, "admit agents to a rollout", &sql, &p)?;
    }
    Ok(())
}

/// Members left out of a rollout's verdicts.
pub(crate) fn skip(conn: &dyn Db, key: &PackKey, version: u64, ids: &[String]) -> StoreResult<()> {
    let version = to_db(version, "rollout version")?;
    for id in ids {
        run(
            conn,
            "leave an agent out of a rollout's verdicts",
            "UPDATE rollout_members SET skipped = 1 \
             WHERE tenant = ?1 AND pack = ?2 AND version = ?3 AND agent_id = ?4",
            params![key.tenant, key.pack, version, id],
        )?;
    }
    Ok(())
}

/// The pack row's head (`None`: no row).
pub(crate) fn pack_head(conn: &dyn Db, key: &PackKey) -> StoreResult<Option<PackHead>> {
    let head = query_all(
        conn,
        "SELECT latest_version, cancelled_ns, gate FROM packs WHERE tenant = ?1 AND pack = ?2",
        params![key.tenant, key.pack],
        |r| {
            Ok((
                col::<i64>(r, "latest_version")?,
                col::<Option<i64>>(r, "cancelled_ns")?,
                col::<Option<String>>(r, "gate")?,
            ))
        },
    )?
    .pop();
    head.map(|(latest, cancelled, gate)| {
        Ok(PackHead {
            latest: u64_from_db(latest, "latest version")?,
            cancelled: cancelled.is_some(),
            gate: gate.map(|g| from_json::<GateRow>(&g, "gate")).transpose()?,
        })
    })
    .transpose()
}
