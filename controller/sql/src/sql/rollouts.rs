//! Rollouts: their rows, cohorts and the gate on the pack row, changed in
//! the writer's transaction with the decisions they cause.

use super::codec::{from_json, to_db, to_json, u64_from_db};
use super::db::{Db, Param, Row, chunks, col, params, query_all, run, values_rows};
use super::members::members;
use super::packs::write_pack;
use super::plan::replan_pack;
use baton_model::time;
use baton_store::{
    Base, Binding, DeliveryRow, GateRow, MAX_PAGE, PackKey, PackVersionRow, PutPack, RolloutChange,
    RolloutRow, RolloutState, StoreResult,
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
        baton_store::StoreError::Backend(format!("unknown rollout state `{state}` stored"))
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

fn insert(conn: &dyn Db, r: &RolloutRow) -> StoreResult<()> {
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
fn compare_and_set(conn: &dyn Db, r: &RolloutRow) -> StoreResult<bool> {
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

fn set_gate(conn: &dyn Db, key: &PackKey, gate: Option<&GateRow>) -> StoreResult<()> {
    let json = gate.map(|g| to_json(g, "gate")).transpose()?;
    run(
        conn,
        "set a pack's gate",
        "UPDATE packs SET gate = ?3 WHERE tenant = ?1 AND pack = ?2",
        params![key.tenant, key.pack, json],
    )?;
    Ok(())
}

/// Ends every rollout of the pack that is not final, as superseded by
/// `why`.
fn supersede(conn: &dyn Db, key: &PackKey, why: &str, at_ns: i64) -> StoreResult<()> {
    let sql = format!(
        "SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE tenant = ?1 AND pack = ?2 \
         AND state IN ('waiting_window', 'running', 'paused')"
    );
    for mut r in query_all(conn, &sql, params![key.tenant, key.pack], decode_rollout)? {
        r.state = RolloutState::Superseded;
        r.reason = why.to_string();
        r.updated = time::at(at_ns);
        compare_and_set(conn, &r)?;
    }
    Ok(())
}

/// Stores a pack version (see `Store::put_pack`); a new version ends the
/// pack's open rollout and, with a `rollout:` section, starts its own:
/// the gate is set in the same transaction, so no decision ever sees the
/// new version ungated. What its outsiders keep comes from the pack as it
/// was ([`Base::of`]).
pub(crate) fn put_pack(conn: &dyn Db, p: &PackVersionRow) -> StoreResult<PutPack> {
    let key = p.key();
    let before = query_all(
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
    let put = write_pack(conn, p)?;
    if put == PutPack::Unchanged {
        return Ok(put);
    }
    // Read before `supersede` ends it: whether the gate's rollout aborted.
    let (latest, cancelled, gate) = match before {
        Some((latest, cancelled, gate)) => (
            Some(u64_from_db(latest, "latest version")?),
            cancelled.is_some(),
            gate.map(|g| from_json::<GateRow>(&g, "gate")).transpose()?,
        ),
        None => (None, false, None),
    };
    let aborted = match &gate {
        Some(g) => {
            load(conn, &key, Some(g.rollout))?.is_some_and(|r| r.state == RolloutState::Aborted)
        }
        None => false,
    };
    supersede(
        conn,
        &key,
        &format!("v{} pushed", p.version),
        p.pushed.as_nanos(),
    )?;
    if !p.rollout {
        set_gate(conn, &key, None)?;
        return Ok(put);
    }
    let base = Base::of(latest, cancelled, gate.as_ref(), aborted);
    let row = RolloutRow::new(&key, p.version, base, p.pushed);
    insert(conn, &row)?;
    set_gate(conn, &key, row.gate(false).as_ref())?;
    Ok(put)
}

/// A cancel ends the pack's open rollout (superseded, by the cancel).
pub(crate) fn on_cancel(conn: &dyn Db, key: &PackKey, at_ns: i64) -> StoreResult<()> {
    supersede(conn, key, "the pack was cancelled", at_ns)?;
    set_gate(conn, key, None)
}

/// Applies a change computed from `change.row.rev`, if that is still the
/// stored rev: the row, new members, skipped ones, a republished version,
/// the gate, and the decisions they cause. `None`: another writer
/// changed the rollout first (recompute from the store).
pub(crate) fn advance(
    conn: &dyn Db,
    change: &RolloutChange,
    binding: Binding,
    at_ns: i64,
) -> StoreResult<Option<Vec<DeliveryRow>>> {
    let r = &change.row;
    if !compare_and_set(conn, r)? {
        return Ok(None);
    }
    let key = r.key();
    let version = to_db(r.version, "rollout version")?;
    for chunk in chunks(&change.admit) {
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
    for id in &change.skip {
        run(
            conn,
            "leave an agent out of a rollout's verdicts",
            "UPDATE rollout_members SET skipped = 1 \
             WHERE tenant = ?1 AND pack = ?2 AND version = ?3 AND agent_id = ?4",
            params![key.tenant, key.pack, version, id],
        )?;
    }
    if let Some(p) = &change.republish {
        write_pack(conn, p)?;
    }
    set_gate(conn, &key, change.gate.as_ref())?;
    Ok(Some(replan_pack(conn, &key, binding, at_ns)?))
}
