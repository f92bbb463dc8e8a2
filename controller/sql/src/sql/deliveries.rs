//! What the decisions read and write of packs and deliveries: a pack as
//! the planner reads it, the candidate queries (the live packs that may
//! target an agent, the agents a pack's targets may match: more than they
//! match, since only the first label is looked up in the index; the
//! planner decides exactly), and delivery rows by key, written several
//! per statement.

use super::codec::opt_instant_col;
use super::codec::{
    DELIVERY_COLUMNS, decode_delivery, errors_json, from_json, targets_from_json, to_db,
    u64_from_db, with_row,
};
use super::db::{Db, Param, Row, chunks, col, params, query_all, run, values_rows};
use super::members;
use baton_store::{
    AgentRow, Binding, DeliveryRow, Gate, PackKey, PackTargets, StoreResult, TargetsRow,
};

const PACK_TARGET_COLUMNS: &str =
    "tenant, pack, latest_version, targets, cancelled_ns, gate, stops";

fn decode_targets(row: &dyn Row) -> StoreResult<PackTargets> {
    let tenant: String = col(row, "tenant")?;
    let pack: String = col(row, "pack")?;
    let r = (|| {
        Ok(PackTargets {
            tenant: tenant.clone(),
            pack: pack.clone(),
            latest: u64_from_db(col(row, "latest_version")?, "latest version")?,
            targets: targets_from_json(&col::<String>(row, "targets")?)?,
            cancelled: opt_instant_col(row, "cancelled_ns")?,
            gate: col::<Option<String>>(row, "gate")?
                .map(|j| {
                    Ok::<_, baton_store::StoreError>(Gate {
                        row: from_json(&j, "gate")?,
                        admitted: Default::default(),
                    })
                })
                .transpose()?,
            stopped: col::<Option<String>>(row, "stops")?
                .map(|j| from_json(&j, "withdrawn agents"))
                .transpose()?
                .unwrap_or_default(),
        })
    })();
    with_row(format_args!("pack {tenant}/{pack}"), r)
}

/// Fills a loaded pack's gate with its cohort: all of it, or only
/// whether `agent` is in it (planning one agent never reads the others).
fn admit(conn: &dyn Db, p: &mut PackTargets, agent: Option<&str>) -> StoreResult<()> {
    if let Some(g) = &mut p.gate {
        let key = PackKey::new(&p.tenant, &p.pack);
        g.admitted = members::members(conn, &key, g.row.rollout, agent)?
            .into_keys()
            .collect();
    }
    Ok(())
}

/// A pack as the planner needs it, its cohort read for `agent` only
/// (`None`: all of it).
pub(crate) fn load_pack_targets(
    conn: &dyn Db,
    key: &PackKey,
    agent: Option<&str>,
) -> StoreResult<Option<PackTargets>> {
    let sql = format!("SELECT {PACK_TARGET_COLUMNS} FROM packs WHERE tenant = ?1 AND pack = ?2");
    let mut p = query_all(conn, &sql, params![key.tenant, key.pack], decode_targets)?.pop();
    if let Some(p) = &mut p {
        admit(conn, p, agent)?;
    }
    Ok(p)
}

/// Every live pack that may target an agent: all, or those of its
/// tenants. A cancelled pack is wanted by nobody: it concerns the agent
/// only through a row or a held copy, which the callers plan anyway.
pub(crate) fn packs_for(
    conn: &dyn Db,
    agent: &AgentRow,
    binding: Binding,
) -> StoreResult<Vec<PackTargets>> {
    let mut packs = packs_for_unadmitted(conn, agent, binding)?;
    for p in &mut packs {
        admit(conn, p, Some(&agent.id))?;
    }
    Ok(packs)
}

fn packs_for_unadmitted(
    conn: &dyn Db,
    agent: &AgentRow,
    binding: Binding,
) -> StoreResult<Vec<PackTargets>> {
    match binding {
        Binding::Open => {
            let sql = format!("SELECT {PACK_TARGET_COLUMNS} FROM packs WHERE cancelled_ns IS NULL");
            query_all(conn, &sql, &[], decode_targets)
        }
        Binding::Tenants => {
            let sql = format!(
                "SELECT {PACK_TARGET_COLUMNS} FROM packs WHERE tenant = ?1 AND cancelled_ns IS NULL"
            );
            let mut out = Vec::new();
            for t in &agent.tenants {
                out.extend(query_all(conn, &sql, params![t], decode_targets)?);
            }
            Ok(out)
        }
    }
}

pub(crate) fn rows_of_agent(conn: &dyn Db, id: &str) -> StoreResult<Vec<DeliveryRow>> {
    let sql = format!(
        "SELECT {DELIVERY_COLUMNS} FROM deliveries WHERE agent_id = ?1 ORDER BY tenant, pack"
    );
    query_all(conn, &sql, params![id], decode_delivery)
}

/// The stored rows of these (agent, pack) pairs (each once), a few dozen
/// pairs per statement.
pub(crate) fn rows_of_pairs(
    conn: &dyn Db,
    pairs: &[(String, PackKey)],
) -> StoreResult<Vec<DeliveryRow>> {
    let mut out = Vec::with_capacity(pairs.len());
    for chunk in chunks(pairs) {
        let p: Vec<Param<'_>> = chunk
            .iter()
            .flat_map(|(id, k)| {
                [
                    Param::Text(id),
                    Param::Text(&k.tenant),
                    Param::Text(&k.pack),
                ]
            })
            .collect();
        let sql = format!(
            "SELECT {DELIVERY_COLUMNS} FROM deliveries \
             WHERE (agent_id, tenant, pack) IN (VALUES {})",
            values_rows(chunk.len(), 3)
        );
        out.extend(query_all(conn, &sql, &p, decode_delivery)?);
    }
    Ok(out)
}

/// [`rows_of_pairs`] on PostgreSQL: one statement for a few thousand
/// pairs, passed as one JSON array of `[agent, tenant, pack]`, each
/// looked up by the key. The fleet bench's followers read the rows of a
/// push to 3 000 agents 64 pairs a statement, some 20–80 ms a replica
/// under load, while the pushed-through replica's agents were acking.
/// `OFFSET 0` keeps the lookup a subquery per pair: flattened into a
/// join, PostgreSQL hashes the whole pack's rows (all 100 000 of a big
/// fleet's pack, for one agent's row), and `IN (SELECT …)` of the array
/// was a nested loop over both (0.8 s for 1 000 of 3 000).
pub(crate) fn rows_of_pairs_as_array(
    conn: &dyn Db,
    pairs: &[(String, PackKey)],
) -> StoreResult<Vec<DeliveryRow>> {
    // Each pair once (a lookup per element: a pair named twice would
    // read its row twice).
    let mut triples: Vec<[&str; 3]> = pairs
        .iter()
        .map(|(id, k)| [id.as_str(), k.tenant.as_str(), k.pack.as_str()])
        .collect();
    triples.sort_unstable();
    triples.dedup();
    let sql = format!(
        "SELECT d.* FROM json_array_elements(CAST(?1 AS TEXT)::json) AS x(p) \
         CROSS JOIN LATERAL (SELECT {DELIVERY_COLUMNS} FROM deliveries \
         WHERE agent_id = x.p->>0 AND tenant = x.p->>1 AND pack = x.p->>2 OFFSET 0) d"
    );
    let mut out = Vec::with_capacity(triples.len());
    for chunk in triples.chunks(PAIRS_PER_ARRAY) {
        let list = serde_json::to_string(chunk)
            .map_err(|e| baton_store::StoreError::Invalid(format!("pairs as JSON: {e}")))?;
        out.extend(query_all(conn, &sql, params![list], decode_delivery)?);
    }
    Ok(out)
}

/// Pairs one [`rows_of_pairs_as_array`] statement takes at most (its
/// JSON some 150 KB, its lookups a few milliseconds).
const PAIRS_PER_ARRAY: usize = 4096;

pub(crate) fn load_row(conn: &dyn Db, id: &str, key: &PackKey) -> StoreResult<Option<DeliveryRow>> {
    let sql = format!(
        "SELECT {DELIVERY_COLUMNS} FROM deliveries WHERE agent_id = ?1 AND tenant = ?2 AND pack = ?3"
    );
    Ok(query_all(
        conn,
        &sql,
        params![id, key.tenant, key.pack],
        decode_delivery,
    )?
    .pop())
}

/// Columns of one delivery row in [`upsert_sql`].
const DELIVERY_UPSERT_COLUMNS: usize = 18;

/// `INSERT` of `rows` delivery rows, each replacing the stored row of its
/// (agent, pack).
fn upsert_sql(rows: usize) -> String {
    format!(
        "INSERT INTO deliveries (agent_id, tenant, pack, version, intent, held_version, \
         held_stopped, refused_version, refused_last, refused_message, refused_errors, state, \
         reason, attempts, updated_ns, activate_ns, staged_version, staged_at_ns) VALUES {} \
         ON CONFLICT (agent_id, tenant, pack) DO UPDATE SET version = excluded.version, \
         intent = excluded.intent, held_version = excluded.held_version, \
         held_stopped = excluded.held_stopped, refused_version = excluded.refused_version, \
         refused_last = excluded.refused_last, refused_message = excluded.refused_message, \
         refused_errors = excluded.refused_errors, state = excluded.state, \
         reason = excluded.reason, attempts = excluded.attempts, updated_ns = excluded.updated_ns, \
         activate_ns = excluded.activate_ns, staged_version = excluded.staged_version, \
         staged_at_ns = excluded.staged_at_ns",
        values_rows(rows, DELIVERY_UPSERT_COLUMNS)
    )
}

/// Writes `rows` (each (agent, pack) at most once), several per
/// statement: a push planned for thousands of agents is a few dozen
/// statements, not one per agent.
pub(crate) fn store_rows(conn: &dyn Db, rows: &[DeliveryRow]) -> StoreResult<()> {
    // Every value checked and converted before anything is written.
    let mut owned = Vec::with_capacity(rows.len());
    for d in rows {
        let refused_errors = match &d.refusal {
            Some(r) => Some(errors_json(&r.errors)?),
            None => None,
        };
        let held_version = d
            .held
            .map(|h| to_db(h.version, "held version"))
            .transpose()?;
        let refused_version = d
            .refusal
            .as_ref()
            .map(|r| to_db(r.version, "refused version"))
            .transpose()?;
        let staged_version = d
            .staged
            .map(|st| to_db(st.version, "staged version"))
            .transpose()?;
        owned.push((
            to_db(d.version, "version")?,
            held_version,
            refused_version,
            refused_errors,
            staged_version,
        ));
    }
    let all: Vec<(&DeliveryRow, _)> = rows.iter().zip(owned).collect();
    for chunk in chunks(&all) {
        let mut values: Vec<Param<'_>> = Vec::with_capacity(chunk.len() * DELIVERY_UPSERT_COLUMNS);
        for (d, (version, held_version, refused_version, refused_errors, staged_version)) in chunk {
            values.extend([
                Param::Text(&d.agent_id),
                Param::Text(&d.tenant),
                Param::Text(&d.pack),
                Param::Int(*version),
                Param::Text(d.intent.as_str()),
                held_version.map_or(Param::Null, Param::Int),
                d.held
                    .map_or(Param::Null, |h| Param::Int(i64::from(h.stopped))),
                refused_version.map_or(Param::Null, Param::Int),
                d.refusal
                    .as_ref()
                    .map_or(Param::Null, |r| Param::Int(i64::from(r.last))),
                d.refusal
                    .as_ref()
                    .map_or(Param::Null, |r| Param::Text(&r.message)),
                refused_errors.as_deref().map_or(Param::Null, Param::Text),
                Param::Text(d.state.as_str()),
                Param::Text(&d.reason),
                Param::Int(i64::from(d.attempts)),
                Param::Int(d.updated.as_nanos()),
                d.activate.to_db().map_or(Param::Null, Param::Int),
                staged_version.map_or(Param::Null, Param::Int),
                d.staged
                    .map_or(Param::Null, |st| Param::Int(st.at.as_nanos())),
            ]);
        }
        run(conn, "store deliveries", &upsert_sql(chunk.len()), &values)?;
    }
    Ok(())
}

pub(crate) fn delete_row(conn: &dyn Db, id: &str, key: &PackKey) -> StoreResult<()> {
    run(
        conn,
        "delete a delivery",
        "DELETE FROM deliveries WHERE agent_id = ?1 AND tenant = ?2 AND pack = ?3",
        params![id, key.tenant, key.pack],
    )?;
    Ok(())
}

/// Agents a pack's targets may match (a superset; ids the store does not
/// know are skipped by the caller). With [`Binding::Tenants`] only agents
/// serving the pack's tenant, as the planner would keep no other.
pub(crate) fn candidates(
    conn: &dyn Db,
    key: &PackKey,
    targets: &TargetsRow,
    binding: Binding,
) -> StoreResult<Vec<String>> {
    let ids = |sql: &str, p: &[Param<'_>]| -> StoreResult<Vec<String>> {
        query_all(conn, sql, p, |r| col::<String>(r, "agent_id"))
    };
    let bound = binding == Binding::Tenants;
    match targets {
        TargetsRow::Nobody => Ok(Vec::new()),
        TargetsRow::Agents(want) => Ok(want.clone()),
        TargetsRow::Labels(labels) => match labels.iter().next() {
            None if bound => ids(
                "SELECT agent_id FROM agent_tenants WHERE tenant = ?1",
                params![key.tenant],
            ),
            None => ids("SELECT id AS agent_id FROM agents", &[]),
            Some((k, v)) => ids(
                "SELECT agent_id FROM ( \
                   SELECT agent_id FROM agent_own_labels WHERE key = ?1 AND value = ?2 \
                   UNION SELECT agent_id FROM agent_labels \
                   WHERE tenant = ?3 AND key = ?1 AND value = ?2) AS labelled \
                 WHERE ?4 = 0 OR agent_id IN (SELECT agent_id FROM agent_tenants WHERE tenant = ?3)",
                params![k, v, key.tenant, bound],
            ),
        },
    }
}

/// Every row of one pack.
pub(crate) fn rows_of_pack(conn: &dyn Db, key: &PackKey) -> StoreResult<Vec<DeliveryRow>> {
    let sql = format!("SELECT {DELIVERY_COLUMNS} FROM deliveries WHERE tenant = ?1 AND pack = ?2");
    query_all(conn, &sql, params![key.tenant, key.pack], decode_delivery)
}

/// Forgets what an agent staged (a restart dropped its staged copies).
pub(crate) fn clear_staged(conn: &dyn Db, id: &str) -> StoreResult<()> {
    run(
        conn,
        "forget what the agent staged",
        "UPDATE deliveries SET staged_version = NULL, staged_at_ns = NULL \
         WHERE agent_id = ?1 AND staged_version IS NOT NULL",
        params![id],
    )?;
    Ok(())
}
