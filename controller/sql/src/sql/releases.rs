//! Agent releases (their rows and pieces), agent updates (a rollout
//! machine's row as JSON, with its cohort) and the release each agent is
//! to be offered.

use std::collections::BTreeMap;

use super::codec::{from_json, instant_col, to_db, to_json, u64_from_db, with_row};
use super::db::{
    ByShape, Db, Param, Row, chunks, col, params, query_all, query_first, run, values_rows,
};
use baton_store::{
    AgentUpdateRow, MAX_PAGE, Member, ReleaseRow, RolloutRow, StoreError, StoreResult,
};

const RELEASE_COLUMNS: &str =
    "version, arch, manifest, key_id, signature, size, sha256, uploaded_ns, uploaded_by";

fn decode_release(row: &dyn Row) -> StoreResult<ReleaseRow> {
    let version: String = col(row, "version")?;
    let r = (|| {
        Ok(ReleaseRow {
            version: version.clone(),
            arch: col(row, "arch")?,
            manifest: col(row, "manifest")?,
            key: col(row, "key_id")?,
            signature: col(row, "signature")?,
            size: u64_from_db(col(row, "size")?, "release size")?,
            sha256: col(row, "sha256")?,
            uploaded: instant_col(row, "uploaded_ns")?,
            by: col(row, "uploaded_by")?,
        })
    })();
    with_row(format_args!("release {version}"), r)
}

/// One release.
pub(crate) fn release(conn: &dyn Db, version: &str, arch: &str) -> StoreResult<Option<ReleaseRow>> {
    let sql = format!("SELECT {RELEASE_COLUMNS} FROM releases WHERE version = ?1 AND arch = ?2");
    query_first(conn, &sql, params![version, arch], decode_release)
}

/// Every release, newest upload first.
pub(crate) fn releases(conn: &dyn Db) -> StoreResult<Vec<ReleaseRow>> {
    let sql =
        format!("SELECT {RELEASE_COLUMNS} FROM releases ORDER BY uploaded_ns DESC, version, arch");
    query_all(conn, &sql, &[], decode_release)
}

/// A release's row.
pub(crate) fn put_release(conn: &dyn Db, r: &ReleaseRow) -> StoreResult<()> {
    let size = to_db(r.size, "release size")?;
    run(
        conn,
        "store a release",
        "INSERT INTO releases (version, arch, manifest, key_id, signature, size, sha256, \
         uploaded_ns, uploaded_by) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        params![
            r.version,
            r.arch,
            r.manifest,
            r.key,
            r.signature,
            size,
            r.sha256,
            r.uploaded.as_nanos(),
            r.by
        ],
    )?;
    Ok(())
}

/// A piece of a release's binary.
pub(crate) fn put_piece(
    conn: &dyn Db,
    version: &str,
    arch: &str,
    index: u64,
    data: &[u8],
) -> StoreResult<()> {
    let idx = to_db(index, "piece index")?;
    run(
        conn,
        "store a piece of a release",
        "INSERT INTO release_pieces (version, arch, idx, data) VALUES (?1, ?2, ?3, ?4)",
        params![version, arch, idx, data],
    )?;
    Ok(())
}

/// A piece of a release's binary (`None`: not stored).
pub(crate) fn piece(
    conn: &dyn Db,
    version: &str,
    arch: &str,
    index: u64,
) -> StoreResult<Option<Vec<u8>>> {
    let idx = to_db(index, "piece index")?;
    query_first(
        conn,
        "SELECT data FROM release_pieces WHERE version = ?1 AND arch = ?2 AND idx = ?3",
        params![version, arch, idx],
        |r| col::<Vec<u8>>(r, "data"),
    )
}

/// The release an agent's target names, for the agent's architecture.
pub(crate) fn offer(conn: &dyn Db, agent: &str) -> StoreResult<Option<ReleaseRow>> {
    let columns = RELEASE_COLUMNS
        .split(", ")
        .map(|c| format!("r.{c}"))
        .collect::<Vec<_>>()
        .join(", ");
    let sql = format!(
        "SELECT {columns} FROM release_targets t \
         JOIN agents a ON a.id = t.agent_id \
         JOIN releases r ON r.version = t.version AND r.arch = a.arch \
         WHERE t.agent_id = ?1"
    );
    query_first(conn, &sql, params![agent], decode_release)
}

const UPDATE_COLUMNS: &str = "id, version, plan, targets, created_by, machine, members, rev";

fn decode_update(row: &dyn Row) -> StoreResult<AgentUpdateRow> {
    let id = u64_from_db(col(row, "id")?, "update id")?;
    let r = (|| {
        let mut machine: RolloutRow = from_json(&col::<String>(row, "machine")?, "machine")?;
        let members: BTreeMap<String, Member> =
            from_json(&col::<String>(row, "members")?, "members")?;
        machine.members = members;
        machine.rev = u64_from_db(col(row, "rev")?, "update rev")?;
        machine.version = id;
        Ok(AgentUpdateRow {
            id,
            version: col(row, "version")?,
            plan: col(row, "plan")?,
            targets: from_json(&col::<String>(row, "targets")?, "targets")?,
            by: col(row, "created_by")?,
            machine,
        })
    })();
    with_row(format_args!("agent update {id}"), r)
}

/// Updates, newest first: those not final with `open_only`, else the
/// newest [`MAX_PAGE`].
pub(crate) fn updates(conn: &dyn Db, open_only: bool) -> StoreResult<Vec<AgentUpdateRow>> {
    let sql = format!(
        "SELECT {UPDATE_COLUMNS} FROM agent_updates WHERE (?1 = 0 OR is_open = 1) \
         ORDER BY id DESC LIMIT ?2"
    );
    let limit = if open_only { i64::MAX } else { MAX_PAGE as i64 };
    query_all(
        conn,
        &sql,
        params![i64::from(open_only), limit],
        decode_update,
    )
}

/// One update (`None`: the newest).
pub(crate) fn update(conn: &dyn Db, id: Option<u64>) -> StoreResult<Option<AgentUpdateRow>> {
    let id = id.map(|i| to_db(i, "update id")).transpose()?;
    let sql = format!(
        "SELECT {UPDATE_COLUMNS} FROM agent_updates \
         WHERE (CAST(?1 AS BIGINT) IS NULL OR id = ?1) ORDER BY id DESC LIMIT 1"
    );
    query_first(conn, &sql, params![id], decode_update)
}

/// Oldest first.
pub(crate) fn open_updates(conn: &dyn Db) -> StoreResult<Vec<AgentUpdateRow>> {
    let mut v = updates(conn, true)?;
    v.reverse();
    Ok(v)
}

fn docs(row: &AgentUpdateRow) -> StoreResult<(String, String, String)> {
    Ok((
        to_json(&row.targets, "targets")?,
        to_json(&row.machine, "machine")?,
        to_json(&row.machine.members, "members")?,
    ))
}

/// A new update, its id above every stored one.
pub(crate) fn insert_update(conn: &dyn Db, row: &AgentUpdateRow) -> StoreResult<u64> {
    let next = query_first(
        conn,
        "SELECT COALESCE(MAX(id), 0) + 1 AS next FROM agent_updates",
        &[],
        |r| col::<i64>(r, "next"),
    )?
    .unwrap_or(1);
    let (targets, machine, members) = docs(row)?;
    run(
        conn,
        "store an agent update",
        "INSERT INTO agent_updates (id, version, plan, targets, created_by, machine, members, \
         rev, is_open) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 0, ?8)",
        params![
            next,
            row.version,
            row.plan,
            targets,
            row.by,
            machine,
            members,
            i64::from(!row.machine.state.is_final())
        ],
    )?;
    u64_from_db(next, "update id")
}

/// `row` over the stored one if that is still at its rev.
pub(crate) fn cas_update(conn: &dyn Db, row: &AgentUpdateRow) -> StoreResult<bool> {
    let id = to_db(row.id, "update id")?;
    let rev = to_db(row.machine.rev, "update rev")?;
    let (_, machine, members) = docs(row)?;
    let n = run(
        conn,
        "step an agent update",
        "UPDATE agent_updates SET machine = ?3, members = ?4, rev = rev + 1, is_open = ?5 \
         WHERE id = ?1 AND rev = ?2",
        params![
            id,
            rev,
            machine,
            members,
            i64::from(!row.machine.state.is_final())
        ],
    )?;
    if n == 0 && update(conn, Some(row.id))?.is_none() {
        return Err(StoreError::Invalid(format!("no agent update {}", row.id)));
    }
    Ok(n == 1)
}

/// These agents are offered `version` (of update `update`).
pub(crate) fn set_targets(
    conn: &dyn Db,
    update: u64,
    version: &str,
    ids: &[String],
) -> StoreResult<()> {
    /// Several offers a statement: a stage admitting thousands of boxes
    /// is a few dozen statements, not one per box.
    static SET: ByShape = ByShape::new(|n| {
        format!(
            "INSERT INTO release_targets (agent_id, version, update_id) VALUES {} \
             ON CONFLICT (agent_id) DO UPDATE SET version = excluded.version, \
             update_id = excluded.update_id",
            values_rows(n, 3)
        )
    });
    let update = to_db(update, "update id")?;
    // Each agent once (PostgreSQL refuses a statement that would update
    // one row twice), in one order for every writer.
    let mut ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    ids.sort_unstable();
    ids.dedup();
    for chunk in chunks(&ids) {
        let mut values = Vec::with_capacity(chunk.len() * 3);
        for id in chunk {
            values.extend([Param::Text(id), Param::Text(version), Param::Int(update)]);
        }
        run(
            conn,
            "offer agents a release",
            &SET.get(chunk.len()),
            &values,
        )?;
    }
    Ok(())
}

/// No agent is offered update `update`'s release any more.
pub(crate) fn clear_targets(conn: &dyn Db, update: u64) -> StoreResult<()> {
    let update = to_db(update, "update id")?;
    run(
        conn,
        "withdraw an update's offers",
        "DELETE FROM release_targets WHERE update_id = ?1",
        params![update],
    )?;
    Ok(())
}
