//! Packs and their versions.

use super::codec::{
    decode_pack_version, targets_from_json, targets_json, to_db, to_json, u32_from_db, u64_from_db,
    with_row,
};
use super::codec::{instant_col, opt_instant_col};
use super::db::{Db, col, params, query_all, query_first, run};
use std::collections::BTreeMap;

use baton_store::{PackKey, PackSummaryRow, PackVersionRow, PutPack, StoreError, StoreResult};

/// Stores a version: one conditional upsert of the pack row decides
/// whether it is the newest (and locks the pack row in engines that lock
/// rows); only then is its text compared with what is stored.
pub(crate) fn write_pack(conn: &dyn Db, p: &PackVersionRow) -> StoreResult<PutPack> {
    let version = to_db(p.version, "pack version")?;
    let targets = targets_json(&p.targets)?;
    let newest: Option<i64> = query_first(
        conn,
        "INSERT INTO packs (tenant, pack, latest_version, cancelled_ns, targets, pushed_ns) \
             VALUES (?1, ?2, ?3, NULL, ?4, ?5) \
             ON CONFLICT (tenant, pack) DO UPDATE SET latest_version = excluded.latest_version, \
             cancelled_ns = NULL, targets = excluded.targets, pushed_ns = excluded.pushed_ns \
             WHERE packs.latest_version < excluded.latest_version \
             RETURNING latest_version",
        params![p.tenant, p.pack, version, targets, p.pushed.as_nanos()],
        |r| col(r, "latest_version"),
    )?;
    let insert_version = || -> StoreResult<()> {
        run(
            conn,
            "store a pack version",
            "INSERT INTO pack_versions (tenant, pack, version, yaml, targets, pushed_ns, rollout) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![
                p.tenant,
                p.pack,
                version,
                p.yaml,
                targets,
                p.pushed.as_nanos(),
                p.rollout
            ],
        )?;
        Ok(())
    };
    if newest.is_some() {
        insert_version()?;
        return Ok(PutPack::Stored);
    }
    let latest: i64 = query_first(
        conn,
        "SELECT latest_version FROM packs WHERE tenant = ?1 AND pack = ?2",
        params![p.tenant, p.pack],
        |r| col(r, "latest_version"),
    )?
    .ok_or_else(|| {
        StoreError::corrupt(
            format!("pack {}/{}", p.tenant, p.pack),
            "its row vanished while a version was stored",
        )
    })?;
    if latest > version {
        return Err(StoreError::VersionOlder {
            tenant: p.tenant.clone(),
            pack: p.pack.clone(),
            version: p.version,
            latest: u64_from_db(latest, "latest version")?,
        });
    }
    let yaml: Option<String> = query_first(
        conn,
        "SELECT yaml FROM pack_versions WHERE tenant = ?1 AND pack = ?2 AND version = ?3",
        params![p.tenant, p.pack, version],
        |r| col(r, "yaml"),
    )?;
    match yaml {
        Some(y) if y == p.yaml => Ok(PutPack::Unchanged),
        Some(_) => Err(StoreError::VersionTaken {
            tenant: p.tenant.clone(),
            pack: p.pack.clone(),
            version: p.version,
        }),
        // A withdrawn pack the store had lost: its version can be stored.
        None => {
            run(
                conn,
                "store a pack",
                "UPDATE packs SET cancelled_ns = NULL, targets = ?3, pushed_ns = ?4 \
                 WHERE tenant = ?1 AND pack = ?2",
                params![p.tenant, p.pack, targets, p.pushed.as_nanos()],
            )?;
            insert_version()?;
            Ok(PutPack::Stored)
        }
    }
}

/// Marks a pack cancelled (the first instant stays). A pack the store
/// does not know but agents hold gets a row with no version, withdrawn
/// at the newest version held. `false`: neither known nor held.
pub(crate) fn write_cancel(conn: &dyn Db, key: &PackKey, at_ns: i64) -> StoreResult<bool> {
    let n = run(
        conn,
        "cancel a pack",
        "UPDATE packs SET cancelled_ns = COALESCE(cancelled_ns, ?3) \
         WHERE tenant = ?1 AND pack = ?2",
        params![key.tenant, key.pack, at_ns],
    )?;
    if n > 0 {
        return Ok(true);
    }
    let held: Option<i64> = query_first(
        conn,
        "SELECT MAX(held_version) AS held FROM deliveries WHERE tenant = ?1 AND pack = ?2",
        params![key.tenant, key.pack],
        |r| col(r, "held"),
    )?
    .flatten();
    let Some(held) = held else {
        return Ok(false);
    };
    let nobody = targets_json(&baton_store::TargetsRow::Nobody)?;
    run(
        conn,
        "withdraw a pack the store did not know",
        "INSERT INTO packs (tenant, pack, latest_version, cancelled_ns, targets, pushed_ns) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?4)",
        params![key.tenant, key.pack, held, at_ns, nobody],
    )?;
    Ok(true)
}

/// Every pack (of one tenant, or all) with its delivery counts: one query.
pub(crate) fn packs(conn: &dyn Db, tenant: Option<&str>) -> StoreResult<Vec<PackSummaryRow>> {
    query_all(
        conn,
        "SELECT p.tenant, p.pack, p.latest_version, p.targets, p.pushed_ns, p.cancelled_ns, \
         COALESCE(SUM(CASE WHEN d.version = p.latest_version AND d.state = 'acked' THEN 1 ELSE 0 END), 0) AS acked, \
         COALESCE(SUM(CASE WHEN d.version = p.latest_version AND d.state = 'nacked' THEN 1 ELSE 0 END), 0) AS nacked, \
         COALESCE(SUM(CASE WHEN d.version = p.latest_version AND d.state = 'pending' THEN 1 ELSE 0 END), 0) AS pending, \
         COALESCE(SUM(CASE WHEN d.held_version > p.latest_version THEN 1 ELSE 0 END), 0) AS ahead \
         FROM packs p LEFT JOIN deliveries d ON d.tenant = p.tenant AND d.pack = p.pack \
         WHERE CAST(?1 AS TEXT) IS NULL OR p.tenant = ?1 \
         GROUP BY p.tenant, p.pack, p.latest_version, p.targets, p.pushed_ns, p.cancelled_ns \
         ORDER BY p.tenant, p.pack",
        params![tenant],
        |row| {
            let tenant: String = col(row, "tenant")?;
            let pack: String = col(row, "pack")?;
            let r = (|| {
                Ok(PackSummaryRow {
                    tenant: tenant.clone(),
                    pack: pack.clone(),
                    latest: u64_from_db(col(row, "latest_version")?, "latest version")?,
                    targets: targets_from_json(&col::<String>(row, "targets")?)?,
                    pushed: instant_col(row, "pushed_ns")?,
                    cancelled: opt_instant_col(row, "cancelled_ns")?,
                    acked: u32_from_db(col(row, "acked")?, "count")?,
                    nacked: u32_from_db(col(row, "nacked")?, "count")?,
                    pending: u32_from_db(col(row, "pending")?, "count")?,
                    ahead: u32_from_db(col(row, "ahead")?, "count")?,
                })
            })();
            with_row(format_args!("pack {tenant}/{pack}"), r)
        },
    )
}

/// A pack's stored versions, newest first, at most `limit`, without
/// their YAML (a list, not the texts).
pub(crate) fn pack_versions(
    conn: &dyn Db,
    key: &PackKey,
    limit: u32,
) -> StoreResult<Vec<PackVersionRow>> {
    query_all(
        conn,
        "SELECT tenant, pack, version, '' AS yaml, targets, pushed_ns, rollout FROM pack_versions \
         WHERE tenant = ?1 AND pack = ?2 ORDER BY version DESC LIMIT ?3",
        params![key.tenant, key.pack, i64::from(limit)],
        decode_pack_version,
    )
}

pub(crate) fn pack_version(
    conn: &dyn Db,
    key: &PackKey,
    version: Option<i64>,
) -> StoreResult<Option<PackVersionRow>> {
    let rows = match version {
        Some(v) => query_all(
            conn,
            "SELECT tenant, pack, version, yaml, targets, pushed_ns, rollout FROM pack_versions \
             WHERE tenant = ?1 AND pack = ?2 AND version = ?3",
            params![key.tenant, key.pack, v],
            decode_pack_version,
        ),
        None => query_all(
            conn,
            "SELECT v.tenant, v.pack, v.version, v.yaml, v.targets, v.pushed_ns, v.rollout \
             FROM packs p JOIN pack_versions v \
             ON v.tenant = p.tenant AND v.pack = p.pack AND v.version = p.latest_version \
             WHERE p.tenant = ?1 AND p.pack = ?2",
            params![key.tenant, key.pack],
            decode_pack_version,
        ),
    };
    Ok(rows?.pop())
}

/// The pack's withdrawn agents, replaced (`NULL` when none).
pub(crate) fn write_stops(
    conn: &dyn Db,
    key: &PackKey,
    stops: &BTreeMap<String, u64>,
) -> StoreResult<()> {
    let json = (!stops.is_empty())
        .then(|| to_json(stops, "withdrawn agents"))
        .transpose()?;
    run(
        conn,
        "withdraw a pack from agents",
        "UPDATE packs SET stops = ?3 WHERE tenant = ?1 AND pack = ?2",
        params![key.tenant, key.pack, json],
    )?;
    Ok(())
}
